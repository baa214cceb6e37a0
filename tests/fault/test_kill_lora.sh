#!/usr/bin/env bash
# Fault tolerance of a LoRA run (llama-d2, adapters on every linear layer, the base frozen):
# SIGKILL one of 4 ranks in the backward of step 5 at ZeRO stages 1 and 3 (policy degrade). The
# survivors must finish every step and end with the adapters of a reference run that continued on
# 3 ranks from the restored step's state, as test_kill_llama.sh checks for full training; the
# frozen base, whole on every rank, is not part of the restored state and stays as it was.
set -u
. "$(dirname "$0")/lib.sh"
export MODEL=llama-d2
export CONFIG_EXTRA=', "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}'
STEPS=10

every_step() {
  $PY - "$1" "$STEPS" << 'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = sorted({r["step"] for r in rows})
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
assert rows[-1].get("world_size") == 3 and rows[-1].get("fault_events") == 1, rows[-1]
PYEOF
}

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

for st in 1 3; do
  config "$T/z$st.json" $st
  what="LoRA on llama-d2, stage $st, rank 2 killed in step 5 (backward)"
  run_ranks kill$st 4 "$T/z$st.json" $STEPS DSC_FT_INJECT=2:5:backward
  check "$what: survivors finish, victim killed (exit codes ${CODES[*]})" -- \
    test "${CODES[*]}" = "0 0 137 0"
  b=$(restored_step kill$st)
  check "$what: restored step $b (3 or 4)" -- test "${b:-0}" -ge 3 -a "${b:-0}" -le 4
  check "$what: every step ran" -- every_step "$T/kill$st/metrics.jsonl"
  check "$what: a LoRA run" -- grep -q "LoRA" "$T/kill$st/log.0"
  check "$what: the weights written are the adapters" -- adapters_only "$T/kill$st/w.safetensors"
  ref=$(ref_weights $st "${b:-0}" $STEPS)
  check "$what: final adapters == 3 ranks continuing from step $b" -- \
    same_weights "$T/kill$st/w.safetensors" "$ref" 1e-6
done
finish
