#!/usr/bin/env bash
# Issue 31's acceptance on one H100 or H200, in one go, within 9 minutes. Not yet run on a GPU.
#   CHECK_S=540 bash .gpu/check.sh -- bash experiments/gpu-step-acceptance.sh
#                           on a lent machine, from ../shared/gpu/bundle.sh's bundle (check.sh installs first, about a
#                           minute, outside these 9 minutes: give the call a timeout_s of 600)
#   bash experiments/gpu-step-acceptance.sh     on a GPU machine where gatelab is installed
# It runs, in order:
#   1. pytest -m gpu on the tests of the step a GPU decides (SDPA's flash/cuDNN kernel alone for every variant, the
#      kernel profile, no host sync in a step eager, compiled and with CUDA graphs): at most 120 s
#   2. gatelab bench experiments/small.yaml --parts variants,compile,run with the GPU defaults (baseline, every G1
#      variant and one of each other gate position, compiled, with the CUDA kernel profiles; the Lightning step and
#      its kernels; eager, compiled and CUDA graphs side by side; the real runs for peak memory): what is left of 9
#      minutes, about 5.5 expected (the bench's docstring, less the loss curves, op profile and GEMM rate)
# and ends with one line per acceptance line of issue 31: PASS, FAIL or NOT RUN, with its figure, also in
# $OUT/acceptance.txt ($OUT: default ./gpu-acceptance). $OUT/bench/ holds bench.md and bench.json to commit under
# results/bench/<gpu name>/ with a README of where the time goes (bench.md's kernel tables); the logs are in
# $OUT/acceptance-logs.tgz. Exit status: 0 when every line that ran passed.
# BENCH_ARGS adds options to the bench, for a dry run on a CPU only (e.g. BENCH_ARGS="--variants baseline,g1_elem_sig").
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-acceptance}
LOGS=$(mktemp -d)/acceptance-logs
mkdir -p "$OUT" "$LOGS"
PRESET=${PRESET:-experiments/small.yaml}
export PYTHONUNBUFFERED=1
cd "$ROOT"
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
step() {  # step NAME LIMIT_S COMMAND...: output to $LOGS/NAME.log, status to $LOGS/NAME.status
  local name=$1 limit=$2; shift 2
  say "$name (limit $limit s): $*"
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local status=$?
  echo "$status" > "$LOGS/$name.status"
  say "$name: exit $status"; tail -6 "$LOGS/$name.log"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$LOGS/gpu.txt" \
  || echo "no nvidia-smi: the GPU lines will read NOT RUN"
step pytest 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/model/test_sdpa_path.py \
  tests/test_gpu_profile.py \
  tests/train/test_gpu.py::test_a_training_step_on_the_gpu_never_waits_for_the_gpu_between_logging_steps
step bench $(( 540 - ($(date +%s) - T0) > 60 ? 540 - ($(date +%s) - T0) : 60 )) \
  gatelab bench "$PRESET" --parts variants,compile,run ${BENCH_ARGS:-} --out "$OUT/bench"

python3 - "$LOGS" "$OUT" <<'EOF'
"""Each acceptance line of issue 31 from bench.json and the pytest log: PASS, FAIL or NOT RUN, with its figure."""
import json, sys
from pathlib import Path

logs, out = Path(sys.argv[1]), Path(sys.argv[2])
lines = []


def line(ok, what, figure):
    lines.append(f"{'NOT RUN' if ok is None else 'PASS' if ok else 'FAIL'}  {what}: {figure}")


bench_json = out / "bench" / "bench.json"
report = json.loads(bench_json.read_text()) if bench_json.exists() else {}
gpu = next(iter(report.get("gpu", {}).values()), {})
flops, peak = gpu.get("model_flops_per_step"), gpu.get("peak_flops")
mfu = gpu.get("mfu_lightning")
line(None if mfu is None else mfu >= 0.40,
     "compiled baseline small step (gatelab's Lightning step) at >= 40% MFU (goal 45%)",
     f"MFU {mfu and round(mfu, 3)} (plain loop {gpu.get('mfu_plain') and round(gpu['mfu_plain'], 3)}); "
     f"{flops and flops / 1e12:.4g} TFLOP a step (the plan's count), step {gpu.get('lightning_step_s')} s, "
     f"peak {peak and peak / 1e12:.0f} TFLOP/s ({gpu.get('gpu')})" if gpu else "no GPU figures in bench.json")
memory = gpu.get("peak_gpu_gb")
line(None if memory is None else memory <= 32.0, "peak GPU memory of a run <= 32 GB",
     f"{memory} GB (training alone {gpu.get('peak_gpu_train_gb')} GB)")
g1 = [s for s in report.get("steps", []) if s["label"].startswith("g1_") and s.get("flops_ratio")]
for row in g1:
    over = row["ratio"] / row["flops_ratio"]
    low, high = (bound / row["flops_ratio"] for bound in row["ratio_interval"]) if row.get("ratio_interval") \
        else (None, None)
    line(over <= 1.03, f"{row['label']}: step ratio within 3% of its FLOP ratio",
         f"step ratio {row['ratio']:.4f} against FLOP ratio {row['flops_ratio']:.4f}: {over - 1:+.2%}"
         + (f" (95% interval {low - 1:+.2%} to {high - 1:+.2%})" if low else ""))
if not g1:
    line(None, "each G1 variant's step within 3% of its FLOP ratio", "no G1 variant measured")
kernels = report.get("kernels", {})
for preset, by_variant in kernels.items():
    for variant, summary in by_variant.items():
        groups = ", ".join(f"{g['group'].split(' (')[0]} {g['share']:.0%}" for g in summary["groups"][:4])
        print(f"{preset} {variant}: {summary['window_ms_per_step']:.1f} ms a step, idle {summary['idle_share']:.1%};"
              f" {groups}")
closing = ((logs / "pytest.log").read_text().strip().splitlines() or [""])[-1] if (logs / "pytest.log").exists() \
    else ""
status = (logs / "pytest.status").read_text().strip() if (logs / "pytest.status").exists() else None
line(None if status is None else status == "0" and " passed" in closing and "skipped" not in closing,
     "pytest -m gpu: every variant on SDPA's flash/cuDNN kernel, the kernel profile, no host sync in a step", closing)
bench_status = (logs / "bench.status").read_text().strip() if (logs / "bench.status").exists() else None
line(None if bench_status is None else bench_status == "0" and report.get("complete"),
     "gatelab bench finished within the time left",
     f"exit {bench_status}" + ("" if report.get("complete") else "; bench.json holds the parts it finished"))
print("\n".join(["", "issue 31, GPU acceptance:", *lines]))
(out / "acceptance.txt").write_text("\n".join(lines) + "\n")
sys.exit(0 if all(not l.startswith("FAIL") for l in lines) else 1)
EOF
status=$?
tar -czf "$OUT/acceptance-logs.tgz" -C "$(dirname "$LOGS")" acceptance-logs
say "done: $OUT/acceptance.txt, $OUT/bench/, $OUT/acceptance-logs.tgz"
exit $status
