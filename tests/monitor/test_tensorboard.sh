#!/usr/bin/env bash
# TensorBoard and CSV sinks of a real `dsc train` run, read back with TensorBoard's own reader
# (EventAccumulator) and checked against the run's metrics.jsonl: same tags, steps and values.
# The `tensorboard` Python package is installed with pip when missing (into a private venv when the
# Python refuses pip installs); if that fails the test prints SKIP and passes.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$src/tests/cli/lib.sh"
PY=${PYTHON:-python3}
venv=${DSC_TB_VENV:-$src/.venv-tensorboard} # git-ignored

has_tb() {
  "$1" -c "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator" 2>/dev/null
}
if ! has_tb "$PY" && [ -x "$venv/bin/python" ] && has_tb "$venv/bin/python"; then
  PY=$venv/bin/python
fi
if ! has_tb "$PY"; then
  echo "note: installing the tensorboard Python package (pip) to read the event files"
  if ! "$PY" -m pip install -q tensorboard >"$T/pip.log" 2>&1 || ! has_tb "$PY"; then
    # a system Python refuses pip outside a venv (PEP 668): use a private one
    echo "note: pip into $PY failed; trying a venv at $venv"
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv" >>"$T/pip.log" 2>&1
    "$venv/bin/python" -m pip install -q tensorboard >>"$T/pip.log" 2>&1
    PY=$venv/bin/python
  fi
fi
if ! has_tb "$PY"; then
  tail -5 "$T/pip.log"
  echo "SKIP: *** TensorBoard event files NOT CHECKED: the tensorboard package cannot be imported ***"
  finish
  exit 0
fi

# micro batch 4, accumulation 2, one rank: 8 samples per step
cat >"$T/ds.json" <<JSON
{ "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 1e-3}},
  "tensorboard": {"enabled": true, "output_path": "$T/tb", "job_name": "tiny"},
  "csv_monitor": {"enabled": true, "output_path": "$T/csv", "job_name": "tiny"} }
JSON
expect 0 "train loss" -- "$DSC" train --config "$T/ds.json" --model d1 --seq-len 16 --max-steps 12 \
  --eval-every 4 --eval-batches 1 --sample-tokens 0 --threads 1 --out "$T/run"
check "one TensorBoard event file named events.out.tfevents.<time>.<host>..." -- \
  bash -c "ls '$T/tb/tiny'/events.out.tfevents.* >/dev/null"
check "TensorBoard and CSV agree with metrics.jsonl" -- \
  "$PY" "$src/tests/monitor/tb_compare.py" "$T/run/metrics.jsonl" "$T/tb/tiny" "$T/csv/tiny" 8

# Empty output_path: DeepSpeed's default puts <job_name>/ under the current directory; dsc's
# trainer puts it under the run directory.
cat >"$T/ds2.json" <<JSON
{ "train_batch_size": 4, "tensorboard": {"enabled": true} }
JSON
expect 0 "train loss" -- "$DSC" train --config "$T/ds2.json" --model d1 --seq-len 16 --max-steps 2 \
  --eval-every 0 --eval-batches 1 --sample-tokens 0 --threads 1 --out "$T/run2"
check "default job directory DeepSpeedJobName under the run directory" -- \
  bash -c "ls '$T/run2/DeepSpeedJobName'/events.out.tfevents.* >/dev/null"
finish
