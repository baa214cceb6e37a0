#!/usr/bin/env bash
# A slow rank inside the deadlines is no fault: rank 1 sleeps 0.4 s in every step (half the
# 0.8 s comm deadline, a quarter of the 1.6 s step deadline) for 200 steps (FT_SLOW_STEPS). No
# fault may be reported, and the weights equal those of the same run without the sleeps.
set -u
. "$(dirname "$0")/lib.sh"
STEPS=${FT_SLOW_STEPS:-200}
COMM_S=0.8 STEP_S=1.6 config "$T/z.json" 2
run_ranks fast 4 "$T/z.json" "$STEPS"
check "without sleeps: runs (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"
t0=$SECONDS
run_ranks slow 4 "$T/z.json" "$STEPS" DSC_FT_INJECT="1:*:forward:sleep=0.4"
echo "slow run: $((SECONDS - t0)) s for $STEPS steps"
check "slow rank: every rank finishes (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"
check "slow rank: no fault reported" -- bash -c "! grep -h 'dsc warning (ft)\|fault_events' '$T'/slow/log.* '$T/slow/metrics.jsonl'"
check "slow rank: $STEPS steps on 4 ranks" -- test "$(wc -l < "$T/slow/metrics.jsonl")" = "$STEPS"
check "slow rank: weights == the run without sleeps, bit for bit" -- \
  same_weights "$T/slow/w.safetensors" "$T/fast/w.safetensors" 0
finish
