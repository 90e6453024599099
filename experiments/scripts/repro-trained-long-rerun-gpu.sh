#!/usr/bin/env bash
# repro-trained-long again on one lent GPU, after the misaligned-V fix (gatelab.model.attention_kinds.sdpa_layout),
# once experiments/scripts/gpu_sdpa_layout_check.py has shown the kernel error it fixes (issue 34):
#   CHECK_S=570 bash .gpu/check.sh -- bash experiments/scripts/repro-trained-long-rerun-gpu.sh   (timeout_s 600 on the call)
# It reads .gpu/store-db.tar.gz: the committed store's database and ledgers (`tar -czf .gpu/store-db.tar.gz
# runs/mlflow.db runs/*/*.journal`, its artifacts left behind: the checkout and the bundle must stay under 64 MiB), in
# which the first attempt is moved aside: its MLflow experiment renamed "repro-trained-long (misaligned V,
# superseded)" and its ledger renamed, so every cell runs again under the sweep's own name. Packs the database (with
# the ledgers) and the new runs' artifacts as two files, each under the 16 MiB a file that comes back; unpack both
# over the store's runs/ here.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}; mkdir -p "$OUT"
T0=$(date +%s); say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
mkdir -p /work && { [ -e /work/main ] || ln -s "$ROOT" /work/main; }
cd /work/main || exit 2
python3 experiments/scripts/gpu_sdpa_layout_check.py 2>&1 | tee "$OUT/sdpa-layout-check.txt"
confirmed=${PIPESTATUS[0]}
say "layout check rc $confirmed"
if [ "$confirmed" != 0 ]; then
  say "no kernel error on the misaligned view: not re-running; training g1_head_sig in 32-true and bf16-mixed instead"
  for precision in 32-true bf16-mixed; do
    gatelab train experiments/tiny.yaml --variant g1_head_sig --runs-dir "/tmp/diag-$precision" \
      --set model.vocab_size=512 --set model.n_layers=3 --set model.d_model=64 --set model.head_dim=16 \
      --set model.ffn_hidden=192 --set data.seq_len=128 --set train.batch_size=32 --set train.max_steps=600 \
      --set train.warmup_steps=90 --set train.compile=false --set train.precision=$precision \
      --set eval.max_windows_per_domain=8 > "$OUT/diag-$precision.log" 2>&1 &
  done
  wait; tail -n 12 "$OUT"/diag-*.log; exit 0
fi
tar -xzf .gpu/store-db.tar.gz
touch /tmp/before-rerun
timeout -k 60 "${SWEEP_S:-400}" gatelab sweep run sweeps/repro-trained-long.yaml --workers "${WORKERS:-12}" \
  > "$OUT/sweep.log" 2>&1
say "sweep rc $?"
gatelab sweep status sweeps/repro-trained-long.yaml 2>&1 | tail -52 > "$OUT/status.txt"; tail -50 "$OUT/status.txt"
tar -czf "$OUT/store-db.tar.gz" runs/mlflow.db runs/*/*.journal
find runs/mlartifacts -mindepth 1 -maxdepth 1 -newer /tmp/before-rerun -print0 | tar -czf "$OUT/store-new-artifacts.tar.gz" --null -T -
say "packed: $(ls -la "$OUT"/store-*.tar.gz)"
