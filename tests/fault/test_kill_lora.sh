#!/usr/bin/env bash
# Fault tolerance of a LoRA run (llama-d2, adapters on every linear layer, the base frozen):
# SIGKILL one of 4 ranks in the backward of step 5 at ZeRO stages 1 and 3 (policy degrade). The
# survivors must finish every step and end with the adapters of a reference run that continued on
# 3 ranks from the restored step's state, as test_kill_llama.sh checks for full training. The
# frozen base is in no snapshot: whole on every rank at stage 1; partitioned at stage 3, where the
# lost rank's slices come back from its buddy's replica (a wrong slice would change the adapters).
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
finish
