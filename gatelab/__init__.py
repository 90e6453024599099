"""gatelab: the attention-gating ablations of Qiu et al. (2025), reproducible from a YAML file."""

import time as _time

__version__ = "0.1.0"
# When this program first imported gatelab: where `time/import_s` starts (gatelab.host.seconds_since_start). The
# process's own start would also count whatever ran in it before Python: under `bash -c '... && gatelab ...'` bash
# execs gatelab in its own process, so pip's minutes were counted as imports.
STARTED = _time.perf_counter()
