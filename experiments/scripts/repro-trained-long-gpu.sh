#!/usr/bin/env bash
# repro-trained-long's 48 runs on one lent H100 or H200, into the committed store (issue 34), in one call:
#   CHECK_S=570 bash .gpu/check.sh -- bash experiments/scripts/repro-trained-long-gpu.sh      (timeout_s 600 on the call)
# from ../shared/gpu/bundle.sh experiments/tiny.yaml's bundle, made after a run of the sweep's model had trained its
# 512-token tokenizer here (the bundle carries the data folder's tokenizers). It unpacks results/tiny/mlflow-store.tar.xz,
# runs the sweep with 12 workers on the one GPU (each a share of the 16 host cores: a model this small is launch-bound,
# so a dozen processes keep the GPU busy) for at most SWEEP_S seconds, then packs the store back into
# $OUT/mlflow-store.tar.xz with the sweep's log. The store is unpacked under /work/main, the path its artifact
# locations name, so the tarball replaces results/tiny/mlflow-store.tar.xz as it is. Seeds lead the sweep's grid: a
# sweep stopped by SWEEP_S leaves whole seeds, and `gatelab sweep run` finishes the rest anywhere.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}; mkdir -p "$OUT"
T0=$(date +%s); say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p /work && { [ -e /work/main ] || ln -s "$ROOT" /work/main; }
cd /work/main || exit 2
tar -xJf results/tiny/mlflow-store.tar.xz
say "store unpacked: $(du -sh runs | cut -f1)"
nproc; nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout -k 60 "${SWEEP_S:-450}" gatelab sweep run sweeps/repro-trained-long.yaml --workers "${WORKERS:-12}" \
  > "$OUT/sweep.log" 2>&1
say "sweep rc $?"
tail -40 "$OUT/sweep.log"
gatelab sweep status sweeps/repro-trained-long.yaml 2>&1 | tail -60 > "$OUT/status.txt"; tail -8 "$OUT/status.txt"
tar -cJf "$OUT/mlflow-store.tar.xz" runs/mlflow.db runs/mlartifacts runs/*/ledger.journal
say "packed: $(ls -la "$OUT/mlflow-store.tar.xz")"
