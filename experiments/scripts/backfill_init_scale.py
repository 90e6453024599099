"""Log `init/attn_output_rms` into the runs a store recorded before runs logged it themselves (issue 34).

    python experiments/scripts/backfill_init_scale.py sweeps/repro-*.yaml [--tracking-uri URI]

For every finished run of each sweep that lacks the metric: its seeded initialisation and first training batch are
made again (gatelab.train.run.initial_attention_scale, fp32 on the CPU) and the attention output's RMS is logged at
step 0, with the tag gatelab.init_scale_backfilled=true, so a reader can tell it from a logged one. Runs that have
the metric are left as they are: running it twice changes nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import mlflow

from gatelab.errors import GatelabError
from gatelab.eval import INIT_SCALE_METRIC
from gatelab.store_checks import check_store
from gatelab.store_uris import default_tracking_uri
from gatelab.sweep.spec import expand, load_sweep
from gatelab.tracking import RunStore
from gatelab.train.run import initial_attention_scale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweeps", nargs="+")
    parser.add_argument("--tracking-uri", default=None)
    args = parser.parse_args()
    uri = args.tracking_uri or default_tracking_uri(Path("runs"))
    check_store(uri)  # a dead server or a bad URI in seconds, quietly, before MLflow's own retries
    store, client = RunStore(uri), mlflow.MlflowClient(uri)
    for path in args.sweeps:
        sweep = load_sweep(path)
        for spec in expand(sweep):
            run_id = store.find_run(sweep.name, spec.hash)
            if run_id is None or INIT_SCALE_METRIC in client.get_run(run_id).data.metrics:
                continue
            value = initial_attention_scale(spec.experiment)
            client.log_metric(run_id, INIT_SCALE_METRIC, value, step=0)
            client.set_tag(run_id, "gatelab.init_scale_backfilled", "true")
            print(f"{sweep.name} {spec.label()}: {INIT_SCALE_METRIC} {value:.5f}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except GatelabError as error:  # bad input or a dead store: one message, as gatelab's commands give it
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
