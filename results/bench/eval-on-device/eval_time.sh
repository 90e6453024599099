#!/usr/bin/env bash
# The end-of-run evaluation's seconds on a CPU, before and after issue 30's change, interleaved (old, new, old, ...):
#   OLD=<a checkout of 9f6aa79> NEW=<this checkout> CKPT=<a trained tiny run's last.ckpt> bash eval_time.sh
# Each line: which gatelab ran, the seconds of gatelab.train.evaluate.evaluate, and four of its metrics.
here=$(cd "$(dirname "$0")" && pwd)
for i in 1 2 3; do
  for tree in "$OLD" "$NEW"; do
    PYTHONPATH=$tree OMP_NUM_THREADS=2 python "$here/eval_time.py" "$CKPT" 2>/dev/null | tail -1
  done
done
