#!/usr/bin/env bash
# The GPU check (issue 41): is this GPU machine's gatelab correct and fast? One command, at most 9 minutes from the
# start of the install to its last line on one H100 or H200.
#   export GPU_CHECK_T0=$(date +%s); CHECK_S=590 bash .gpu/check.sh -- bash experiments/scripts/gpu-check.sh
#                on a lent machine, from ../shared/gpu/bundle.sh's bundle (check.sh installs first: GPU_CHECK_T0 makes
#                that minute count against the 9; check.sh gives a step 420 s unless CHECK_S says more)
#   bash experiments/scripts/gpu-check.sh      on a GPU machine where gatelab is installed
# Steps, each given what is left of the 9 minutes (at most its own cap) and each printing its PASS/FAIL lines the
# moment it ends (gatelab/bench/gpu_check.py reads them off the step's logs); nvidia-smi sampled every second:
#   1. on the host's cores, `gatelab data prepare` of the small preset (timed apart from the sweep), then `gatelab
#      sweep plan` of the quick-start sweep on it; beside them, one after the other on the GPU: the numerics check of
#      every variant in bf16 against float64 with its positive control (python -m gatelab.model.numerics), then
#      `gatelab bench` of the compiled small step: baseline, g1_elem_sig, g1_head_sig (MFU at the plan's FLOP count,
#      graph count and breaks of a compiled block, the kernel profile, peak memory)
#   2. `gatelab sweep run sweeps/quickstart.yaml --experiment experiments/small.yaml` alone on the GPU: its time, each
#      run's evaluation seconds and the GPU's utilization during it, peak memory; then the plan against its time
#   3. `pytest -m gpu` with what is left (collects without lm-eval: what needs it skips, saying why)
# and ends with one table of every line, also in $OUT/gpu-check.txt; $OUT/bench.md and bench.json go under
# results/bench/<gpu name>/, the logs are $OUT/gpu-check-logs.tgz. Exit status: 0 when no line FAILs.
# What does not fit in one call (the whole bench, `gatelab eval` with lm-eval) is experiments/scripts/gpu-check-more.sh.
# A dry run on a CPU (the script's wiring, not its verdicts): DRY_RUN=1 bash experiments/scripts/gpu-check.sh
# SKIP_STEPS="sweep pytest" leaves those steps out (their lines say NOT RUN), BUDGET_S=N shortens the 540 s: for a call
# that must leave device time for other work.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
LOGS=$(mktemp -d)/gpu-check-logs
RUNS=$(mktemp -d)/runs
mkdir -p "$OUT" "$LOGS"
T0=${GPU_CHECK_T0:-$(date +%s)}
BUDGET_S=${BUDGET_S:-540}
PRESET=experiments/small.yaml
SWEEP_FILE=sweeps/quickstart.yaml
BENCH=(--variants baseline,g1_elem_sig,g1_head_sig --parts "" --steps 6 --warmup 1 --lightning-steps 6)
NUMERICS=(--device cuda)
if [ "${DRY_RUN:-0}" = 1 ]; then  # the wiring on a CPU: the tiny preset, a few steps, no GPU verdict to trust
  PRESET=experiments/tiny.yaml
  SWEEP_FILE=$(dirname "$RUNS")/quickstart-dry.yaml
  printf '%s\n' "name: gpu-check-dry" "experiment: $ROOT/experiments/tiny.yaml" \
    "grid: {variant: [baseline, g1_elem_sig, g1_head_sig], seed: [0]}" \
    "overrides: {train.max_steps: 6, train.compile: false, eval.blimp: false, eval.max_windows_per_domain: 2," \
    "            eval.long_context_multipliers: [1], eval.in_context_examples: 4, eval.probe_batches: 1}" \
    > "$SWEEP_FILE"
  BENCH=(--variants baseline,g1_head_sig --parts variants --steps 2 --warmup 0 --lightning-steps 2 --run-steps 1)
  NUMERICS=(--device cpu)
fi
SWEEP=("$SWEEP_FILE" --experiment "$PRESET" --runs-dir "$RUNS")
export PYTHONUNBUFFERED=1 GATELAB_PROGRESS_EVERY=${GATELAB_PROGRESS_EVERY:-10}
cd "$ROOT"
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
# step NAME CAP_S COMMAND...: output to $LOGS/NAME.log, exit status and wall seconds beside it; its limit is the
# smaller of CAP_S and what is left of the budget (a step with under 10 s left is not started: status stays unset)
step() {
  local name=$1 cap=$2; shift 2
  if [[ " ${SKIP_STEPS:-} " == *" $name "* ]]; then say "$name: not run, named in SKIP_STEPS"; return; fi
  local limit; limit=$(left); [ "$limit" -gt "$cap" ] && limit=$cap
  if [ "$limit" -lt 10 ]; then say "$name: not run, the budget is spent"; return; fi
  say "$name (limit $limit s): $*"
  local started; started=$(date +%s.%N)
  timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local status=$?
  python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$started" "$(date +%s.%N)" \
    > "$LOGS/$name.seconds"
  echo "$status" > "$LOGS/$name.status"
  say "$name: exit $status after $(cat "$LOGS/$name.seconds") s"
}
verdict() { python3 -m gatelab.bench.gpu_check "$1" --logs "$LOGS" --runs "$RUNS"; }

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"; } \
  | tee "$LOGS/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" \
  | tee -a "$LOGS/gpu.txt"

nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 1000 \
  > "$LOGS/gpu-util.csv" 2>/dev/null &
sampler=$!
trap 'kill $sampler 2>/dev/null' EXIT

# 1. the data and the plan on the host's cores, beside the numerics check and then the bench, one at a time on the GPU
( step data 150 gatelab data prepare "$PRESET"
  step plan 60 gatelab sweep plan "${SWEEP[@]}" --json ) &
prepare=$!
step numerics 90 python3 -m gatelab.model.numerics "${NUMERICS[@]}"
verdict numerics
step bench 200 gatelab bench "$PRESET" "${BENCH[@]}" --out "$LOGS/bench"
verdict bench
wait $prepare

# 2. the sweep, alone on the GPU (its evaluations' utilization is read off the 1-s samples)
step sweep 300 gatelab sweep run "${SWEEP[@]}"
verdict sweep

# 3. the gpu tests with what is left (the numerics test is step 1's check again)
step pytest 200 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 tests \
  --deselect "tests/model/test_numerics.py::test_on_a_gpu_every_variant_in_bf16_is_within_twice_baseline_s_error_and_the_control_fails"
verdict pytest
kill $sampler 2>/dev/null

verdict table | tee "$OUT/gpu-check.txt"
status=${PIPESTATUS[0]}
cp "$LOGS/bench/bench.md" "$LOGS/bench/bench.json" "$OUT/" 2>/dev/null
tar -czf "$OUT/gpu-check-logs.tgz" -C "$(dirname "$LOGS")" gpu-check-logs
say "done: $OUT/gpu-check.txt, $OUT/gpu-check-logs.tgz"
exit "$status"
