#!/usr/bin/env bash
# Parity of fp16 loss scaling with DeepSpeed 0.18.4: its scaler as ZeRO builds it, driven with the
# same overflow patterns (none, isolated, bursts, down to the minimum; hysteresis 0-3 with and
# without consecutive_hysteresis; several windows and minimums; a static scale) that
# DSC_INJECT_OVERFLOW forces on `dsc train`. The scale and the skip of every step must be equal,
# and where DeepSpeed stops at the minimum scale, dsc must stop at the same step with an error.
# The cases are in ds_loss_scale.py. DeepSpeed is installed by scripts/install-deepspeed.sh;
# without it (no network) this test prints SKIP and passes.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
here=$src/tests/parity
source "$src/tests/cli/lib.sh"
export DSC_DATA_HOME="$T/home"

install_log=$(bash "$src/scripts/install-deepspeed.sh" 2>&1)
py=$(tail -n 1 <<<"$install_log")
if [ ! -x "$py" ]; then
  echo "$install_log"
  echo "SKIP: *** loss-scale parity NOT TESTED: the DeepSpeed oracle could not be installed ***"
  finish
  exit 0
fi

mkdir -p "$T/work"
check "every loss-scale sequence agrees with DeepSpeed, stops at the minimum included" -- \
  "$py" "$here/ds_loss_scale.py" "$DSC" "$T/work"

# dsc's error at the minimum, seen as a user sees it: exit 1, the key named.
printf '{"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
 "fp16": {"enabled": true, "initial_scale_power": 1, "hysteresis": 1}}' >"$T/min.json"
DSC_INJECT_OVERFLOW=1-5 expect 1 "fp16.min_loss_scale" -- "$DSC" train --config "$T/min.json" \
  --model d1 --seq-len 8 --max-steps 10 --sample-tokens 0 --eval-every 0 --threads 1 --out "$T/min"
check "DeepSpeed also stops there, at step 2" -- bash -c \
  "'$py' '$here/ds_loss_scale.py' --oracle '$T/min.json' --steps 10 --overflow 1-5 2>/dev/null |
   grep -q '^raises at step 2: '"
finish
