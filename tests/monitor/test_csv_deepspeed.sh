#!/usr/bin/env bash
# dsc's csv_monitor files against DeepSpeed 0.18.4's own csvMonitor: a `dsc train` run with fp16
# (so loss_scale is logged too) writes its CSV files, and ds_csv_oracle.py replays the same events
# through DeepSpeed and compares byte for byte. DeepSpeed comes from scripts/install-deepspeed.sh;
# without it (no network) this test prints SKIP and passes.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$src/tests/cli/lib.sh"

if ! py=$(bash "$src/scripts/install-deepspeed.sh" | tail -n 1) || [ ! -x "$py" ]; then
  echo "SKIP: *** CSV layout NOT COMPARED with DeepSpeed: the DeepSpeed oracle could not be installed ***"
  finish
  exit 0
fi

cat >"$T/ds.json" <<JSON
{ "train_batch_size": 4, "fp16": {"enabled": true, "initial_scale_power": 12},
  "csv_monitor": {"enabled": true, "output_path": "$T/csv", "job_name": "tiny"} }
JSON
expect 0 "train loss" -- "$DSC" train --config "$T/ds.json" --model d1 --seq-len 16 --max-steps 6 \
  --eval-every 3 --eval-batches 1 --sample-tokens 0 --threads 1 --out "$T/run"
check "loss_scale logged under fp16" -- test -s "$T/csv/tiny/Train_Samples_loss_scale.csv"
mkdir -p "$T/oracle"
check "CSV files byte-identical to DeepSpeed's csvMonitor output" -- \
  "$py" "$src/tests/monitor/ds_csv_oracle.py" "$T/csv/tiny" "$T/oracle"
finish
