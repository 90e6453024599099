"""Issue 31's CPU line: is tiny's training step any slower after the change? Two checkouts of gatelab, each step timed
in gatelab's real Lightning training (`gatelab.bench.lightning_steps`: its Trainer settings, callbacks and MLflow
logger), in child processes that alternate between the two, so that a machine that slows down midway slows both.

    python results/bench/cpu-step-issue31/compare.py BEFORE_CHECKOUT AFTER_CHECKOUT [--rounds 6] [--steps 15]

Prints each round's median step and the ratio after / before of the medians over all steps, with a 95% bootstrap
interval (steps resampled within each checkout), and writes compare.json beside this file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy import stats

CHILD = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from gatelab import bench
try:
    from gatelab.data.resolve import load_experiment  # where it lives since issue 32
except ImportError:
    from gatelab.config import load_experiment
try:
    from gatelab.host import resolve_precision  # where it lives since issue 32
except ImportError:
    from gatelab.train.module import resolve_precision
experiment = load_experiment(Path(sys.argv[1]) / "experiments" / "tiny.yaml")
precision = resolve_precision(experiment.train.precision, experiment.train.accelerator)
with tempfile.TemporaryDirectory() as folder:
    times = bench.lightning_steps(experiment, precision, int(sys.argv[2]), Path(folder))
print(json.dumps({"precision": precision, "times": times[3:]}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"before": [], "after": []}
    caches = {name: tempfile.mkdtemp(prefix=f"inductor-{name}-") for name in times}
    for round_index in range(args.rounds):
        for name in (("before", "after") if round_index % 2 == 0 else ("after", "before")):
            checkout = getattr(args, name).resolve()
            result = subprocess.run([sys.executable, "-c", CHILD, str(checkout), str(args.steps)], capture_output=True,
                                    text=True, check=True, env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "2",
                                                                "TORCHINDUCTOR_CACHE_DIR": caches[name]})
            child = json.loads(result.stdout.strip().splitlines()[-1])
            times[name] += child["times"]
            print(f"round {round_index + 1} {name:6s} {child['precision']}: median "
                  f"{statistics.median(child['times']) * 1e3:.0f} ms of {len(child['times'])} steps", flush=True)

    def ratio_of_medians(a, b, axis=-1):
        return np.median(a, axis=axis) / np.median(b, axis=axis)

    ratio = statistics.median(times["after"]) / statistics.median(times["before"])
    interval = stats.bootstrap((np.asarray(times["after"]), np.asarray(times["before"])), ratio_of_medians,
                               paired=False, vectorized=True, n_resamples=4000, method="percentile",
                               rng=np.random.default_rng(0)).confidence_interval
    summary = {"before": str(args.before), "after": str(args.after), "rounds": args.rounds, "steps": args.steps,
               "median_ms": {name: statistics.median(t) * 1e3 for name, t in times.items()},
               "ratio_after_to_before": ratio, "interval_95": [interval.low, interval.high], "times": times}
    print(f"after / before: {ratio:.3f} (95% interval {interval.low:.3f}-{interval.high:.3f}); medians "
          f"{summary['median_ms']['before']:.0f} ms before, {summary['median_ms']['after']:.0f} ms after")
    (Path(__file__).parent / "compare.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
