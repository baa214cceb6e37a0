#!/usr/bin/env bash
# Fault tolerance with a Llama-family model (llama-d2: grouped-query attention, RMSNorm, SwiGLU):
# SIGKILL one of 4 ranks in the backward of step 5 at ZeRO stages 1 and 3 (policy degrade). The
# survivors must finish every step and end with the weights of a reference run that continued on
# 3 ranks from the restored step's state, as test_kill.sh checks for GPT-2.
set -u
. "$(dirname "$0")/lib.sh"
export MODEL=llama-d2
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

for st in 1 3; do
  config "$T/z$st.json" $st
  what="llama-d2, stage $st, rank 2 killed in step 5 (backward)"
  run_ranks kill$st 4 "$T/z$st.json" $STEPS DSC_FT_INJECT=2:5:backward
  check "$what: survivors finish, victim killed (exit codes ${CODES[*]})" -- \
    test "${CODES[*]}" = "0 0 137 0"
  b=$(restored_step kill$st)
  check "$what: restored step $b (3 or 4)" -- test "${b:-0}" -ge 3 -a "${b:-0}" -le 4
  check "$what: every step ran" -- every_step "$T/kill$st/metrics.jsonl"
  check "$what: the survivors trained the Llama model" -- grep -q "llama-d2" "$T/kill$st/log.0"
  ref=$(ref_weights $st "${b:-0}" $STEPS)
  check "$what: final weights == 3 ranks continuing from step $b" -- \
    same_weights "$T/kill$st/w.safetensors" "$ref" 1e-6
done
finish
