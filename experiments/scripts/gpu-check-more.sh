#!/usr/bin/env bash
# What the GPU check (experiments/scripts/gpu-check.sh) leaves out to fit one call of 10 minutes, in two more calls of the
# same kind, each at most 9 minutes from the start of the install (GPU_CHECK_T0, as there):
#   export GPU_CHECK_T0=$(date +%s); CHECK_S=590 bash .gpu/check.sh -- bash experiments/scripts/gpu-check-more.sh bench
#       the whole `gatelab bench experiments/small.yaml` with its GPU defaults (15 variants compiled, the Lightning
#       step, eager against compiled and CUDA graphs, fp32 against bf16, the op profile and GEMM rate, the real runs)
#   EVAL=1 ../shared/gpu/bundle.sh; export GPU_CHECK_T0=$(date +%s); CHECK_S=590 bash .gpu/check.sh -- \
#       env PYTHONPATH=.gpu/evalsite bash experiments/scripts/gpu-check-more.sh eval
#       the quick-start sweep on small, then `gatelab eval` of its runs with lm-eval's offline BLiMP task, on the GPU
# Output: $OUT/more-<part>.txt (the last lines of each step), $OUT/bench.md and bench.json, $OUT/more-logs.tgz.
# Exit status: that of the last step.
set -u
part=${1:?"usage: gpu-check-more.sh bench | eval"}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
LOGS=$(mktemp -d)/more-logs
RUNS=$(mktemp -d)/runs
mkdir -p "$OUT" "$LOGS"
T0=${GPU_CHECK_T0:-$(date +%s)}
BUDGET_S=${BUDGET_S:-540}
SWEEP=(sweeps/quickstart.yaml --experiment experiments/small.yaml --runs-dir "$RUNS")
export PYTHONUNBUFFERED=1 GATELAB_PROGRESS_EVERY=${GATELAB_PROGRESS_EVERY:-10}
cd "$ROOT"
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
step() {  # step NAME COMMAND...: what is left of the budget as its limit; its last lines into the summary
  local name=$1; shift
  local limit=$(( BUDGET_S - ($(date +%s) - T0) ))
  if [ "$limit" -lt 10 ]; then say "$name: not run, the budget is spent" | tee -a "$OUT/more-$part.txt"; return 1; fi
  say "$name (limit $limit s): $*"
  timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local status=$?
  { say "$name: exit $status"; tail -15 "$LOGS/$name.log"; } | tee -a "$OUT/more-$part.txt"
  return $status
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/more-$part.txt"
case "$part" in
  bench)
    step bench gatelab bench experiments/small.yaml --out "$LOGS/bench"
    status=$?
    cp "$LOGS/bench/bench.md" "$LOGS/bench/bench.json" "$OUT/" 2>/dev/null ;;
  eval)
    python3 -c "import lm_eval" 2>/dev/null \
      || { echo "lm-eval is not importable: bundle with EVAL=1 and set PYTHONPATH=.gpu/evalsite"; exit 2; }
    step data gatelab data prepare experiments/small.yaml
    step sweep gatelab sweep run "${SWEEP[@]}"
    step eval gatelab eval "${SWEEP[@]}" --tasks gatelab_blimp
    status=$? ;;
  *) echo "usage: gpu-check-more.sh bench | eval"; exit 2 ;;
esac
tar -czf "$OUT/more-logs.tgz" -C "$(dirname "$LOGS")" more-logs
say "done: $OUT/more-$part.txt"
exit "$status"
