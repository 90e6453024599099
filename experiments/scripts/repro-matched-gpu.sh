#!/usr/bin/env bash
# On one lent GPU: the standing GPU check, shortened to leave room, then sweeps/repro-matched.yaml (issue 43):
#   ../shared/gpu/bundle.sh && tar -cJf .gpu/store-db.tar.xz runs/mlflow.db runs/*/*.journal
#   export GPU_CHECK_T0=$(date +%s); CHECK_S=590 bash .gpu/check.sh -- bash experiments/scripts/repro-matched-gpu.sh
# The check runs its numerics and bench steps (BUDGET_S, default 250 s from GPU_CHECK_T0; the quick-start sweep, which
# passed on an H100, is left out); then `pytest -m gpu` and the sweep run side by side, the sweep in the committed
# store's database (.gpu/store-db.tar.xz) so that its runs join the others, until SWEEP_END_S from GPU_CHECK_T0
# (default 510 s; no run starts in its last RUN_S, 120 s, so those under way finish; the same command goes on later).
# Back in $OUT: the check's files, matched-logs.tgz (the sweep's log and status, pytest's log) and matched-store.part*
# (the database, the ledgers and the new runs' artifacts: `cat matched-store.part* | tar -xz` in the repository root).
# SWEEP=sweeps/repro-matched-confirm.yaml runs the confirmatory sweep instead.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}; mkdir -p "$OUT"
T0=${GPU_CHECK_T0:-$(date +%s)}; export GPU_CHECK_T0=$T0
say() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
BUDGET_S=${BUDGET_S:-250} SKIP_STEPS="sweep pytest" bash "$ROOT/experiments/scripts/gpu-check.sh"
say "gpu check rc $?"
mkdir -p /work && { [ -e /work/main ] || ln -s "$ROOT" /work/main; }
cd /work/main || exit 2
tar -xJf .gpu/store-db.tar.xz
touch /tmp/before-matched
LOGS=$(mktemp -d)
python3 -m pytest -m gpu -q -p no:cacheprovider -n 4 tests > "$LOGS/pytest.log" 2>&1 &
pytest_pid=$!
sweep_s=$(( ${SWEEP_END_S:-510} - ($(date +%s) - T0) ))
say "sweep for at most $sweep_s s"
# No run starts in the last RUN_S seconds (--timeout), so the runs under way finish and travel back; the hard limit is
# the backstop for a run slower than that.
timeout -k 20 "$sweep_s" gatelab sweep run "${SWEEP:-sweeps/repro-matched.yaml}" --workers "${WORKERS:-12}" \
  --timeout $(( sweep_s > ${RUN_S:-120} ? sweep_s - ${RUN_S:-120} : 1 )) > "$LOGS/sweep.log" 2>&1
say "sweep rc $?"
kill -INT $pytest_pid 2>/dev/null; sleep 2; kill $pytest_pid 2>/dev/null; tail -3 "$LOGS/pytest.log"
gatelab sweep status "${SWEEP:-sweeps/repro-matched.yaml}" > "$LOGS/status.txt" 2>&1; tail -8 "$LOGS/status.txt"
tar -czf "$OUT/matched-logs.tgz" -C "$LOGS" .
find runs/mlartifacts -mindepth 1 -maxdepth 1 -newer /tmp/before-matched > /tmp/new-artifacts
# in parts of 12 MiB: a file that comes back is at most 16 MiB (the first call's 17.3 MB tarball did not)
tar -czf - runs/mlflow.db runs/*/*.journal -T /tmp/new-artifacts | split -b 12m -d - "$OUT/matched-store.part"
say "packed: $(ls -la "$OUT"/matched-*)"
