#!/usr/bin/env bash
# Fault tolerance of a LoRA run (llama-d2, adapters on every linear layer, the base frozen):
# SIGKILL one of 4 ranks in the backward of step 5 at ZeRO stages 1 and 3 (policy degrade). The
# survivors must finish every step and end with the adapters of a reference run that continued on
# 3 ranks from the restored step's state, as test_kill_llama.sh checks for full training. The
# frozen base is in no snapshot: whole on every rank at stage 1; partitioned at stage 3, where the
# lost rank's slices come back from its buddy's replica (a wrong slice would change the adapters);
# and two ranks to one at stage 3, where the survivor takes the whole base back.
set -u
. "$(dirname "$0")/lib.sh"
export MODEL=llama-d2
export CONFIG_EXTRA=', "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}'

# adapters_only FILE: the dumped tensors are the adapters alone (PEFT's names)
adapters_only() {
  $PY - "$1" << 'PYEOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
names = [k for k in h if k != "__metadata__"]
assert names and all(".lora_A." in k or ".lora_B." in k for k in names), names[:4]
PYEOF
}

extra_checks() {
  check "$2: a LoRA run" -- grep -q "LoRA" "$T/kill$1/log.0"
  check "$2: the weights written are the adapters" -- adapters_only "$T/kill$1/w.safetensors"
}

kill_in_backward "LoRA on llama-d2" 10

# Two ranks to one at stage 3 (bf16, every layer's base gathered per use): the survivor takes the
# whole base back from its own slices and its buddy's replica, and ends with the weights of a
# one-rank run continued from the restored step's state, bit for bit (one rank left reduces
# nothing, so its gradients are not rounded to communication_data_type either).
config "$T/two.json" 3 "" ', "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}'
sed -i 's/"train_batch_size": 12/"train_batch_size": 4, "bf16": {"enabled": true}/; s/"stage": 3/"stage": 3, "stage3_param_persistence_threshold": 0/' "$T/two.json"
run_ranks two 2 "$T/two.json" 8 DSC_FT_INJECT=1:4:backward
check "LoRA, 2 ranks to 1 at stage 3: the survivor finishes (exit codes ${CODES[*]})" -- \
  test "${CODES[*]}" = "0 137"
b=$(restored_step two)
mkdir -p "$T/states_two"
run_ranks two_full 2 "$T/two.json" 8 DSC_FT_SAVE_STATE="$T/states_two"
run_ranks two_ref 1 "$T/two.json" 8 DSC_FT_LOAD_STATE="$T/states_two/step${b:-0}.safetensors"
check "LoRA, 2 ranks to 1: the adapters of a one-rank run from step ${b:-?}'s state, bit for bit" -- \
  cmp "$T/two/w.safetensors" "$T/two_ref/w.safetensors"
finish
