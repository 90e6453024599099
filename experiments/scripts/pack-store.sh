#!/usr/bin/env bash
# Pack runs/ into results/tiny/mlflow-store.tar.xz as results/tiny/README.md describes: the MLflow database compacted
# by SQLite's VACUUM, then the database, every sweep's ledger and every artifact but PNG and HTML files (`gatelab
# table` remakes them), in sorted order, through xz -9e. From the repository root, once no worker holds the store:
#   tar -xJf results/tiny/mlflow-store.tar.xz    (the committed runs)
#   gatelab sweep run sweeps/... --timeout ...    (new runs join them)
#   bash experiments/scripts/pack-store.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -f runs/mlflow.db ] || { echo "no runs/mlflow.db here: extract the store first (tar -xJf results/tiny/mlflow-store.tar.xz)" >&2; exit 2; }
python3 -c "import sqlite3; db = sqlite3.connect('runs/mlflow.db'); db.execute('VACUUM'); db.close()"
list=$(mktemp)
trap 'rm -f "$list" results/tiny/mlflow-store.tar.xz.part' EXIT
{ echo runs/mlflow.db; ls runs/*/*.journal; find runs/mlartifacts -type f ! -name '*.png' ! -name '*.html'; } \
  | LC_ALL=C sort > "$list"
tar --no-recursion -cf - -T "$list" | xz -9e > results/tiny/mlflow-store.tar.xz.part
mv results/tiny/mlflow-store.tar.xz.part results/tiny/mlflow-store.tar.xz
echo "results/tiny/mlflow-store.tar.xz: $(wc -l < "$list") files, $(du -h results/tiny/mlflow-store.tar.xz | cut -f1)"
