#!/usr/bin/env bash
# SIGKILL one of 4 ranks inside a step - in forward, in backward, with a reduce-scatter in flight,
# at the step boundary, half-way through the optimizer, during the state snapshot, during the
# replica exchange, or at a random moment - at ZeRO stages 1, 2 and 3 (policy degrade). The
# survivors must resume within comm_timeout_s + 5 s, run every step, restore the last committed
# step (the one before the killed step, or the one before that when the victim died before its
# previous step's replica had reached its buddy), and end with the weights of a reference run
# that continued on 3 ranks from that step's state (relative 1e-6; in practice bit for bit).
# FT_TRIALS trials per stage (default 3; the acceptance run is FT_TRIALS=20), drawn from FT_SEED.
set -u
. "$(dirname "$0")/lib.sh"
TRIALS=${FT_TRIALS:-3}
SEED=${FT_SEED:-$RANDOM}
echo "seed $SEED (FT_SEED), $TRIALS trials per stage (FT_TRIALS)"
RANDOM=$SEED
STEPS=16
POINTS=(forward backward reduce step optimizer snapshot ring random)
declare -A WORST_MS

every_step() { # the run's metrics hold every step once or more (a redone step may repeat)
  $PY - "$1" "$STEPS" << 'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = sorted({r["step"] for r in rows})
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
assert rows[-1].get("world_size") == 3 and rows[-1].get("fault_events") == 1, rows[-1]
PYEOF
}

for st in 1 2 3; do
  config "$T/z$st.json" $st
  WORST_MS[$st]=0
  for ((i = 0; i < TRIALS; i++)); do
    victim=$((RANDOM % 4)) step=$((3 + RANDOM % 10)) point=${POINTS[$((RANDOM % ${#POINTS[@]}))]}
    what="stage $st, rank $victim killed in step $step ($point)"
    run_ranks kill 4 "$T/z$st.json" $STEPS DSC_FT_INJECT=$victim:$step:$point
    ok=1
    for r in 0 1 2 3; do
      want=0
      [ $r = $victim ] && want=137
      [ "${CODES[$r]}" = $want ] || ok=0
    done
    check "$what: survivors finish, victim killed (exit codes ${CODES[*]})" -- test $ok = 1
    [ $ok = 1 ] || { tail -n 4 "$T"/kill/log.*; continue; }
    b=$(restored_step kill)
    hi=$step
    [ $point = random ] && hi=$((step + 1)) # the random moment may fall into the next step
    check "$what: restored step $b, the last committed one" -- test "$b" -ge $((step - 2)) -a "$b" -le $hi
    dt=$(ms_between "$(injected_time kill)" "$(resumed_time kill)")
    [ "$dt" -gt "${WORST_MS[$st]}" ] && WORST_MS[$st]=$dt
    echo "$what: restored step $b, resumed $dt ms after the kill"
    check "$what: resumed $dt ms after the kill (limit comm_timeout_s + 5 s)" -- test "$dt" -le 7000
    check "$what: every step ran" -- every_step "$T/kill/metrics.jsonl"
    ref=$(ref_weights $st "$b" $STEPS)
    check "$what: final weights == 3 ranks continuing from step $b" -- \
      same_weights "$T/kill/w.safetensors" "$ref" 1e-6
  done
done
echo "slowest resume after a kill: stage 1 ${WORST_MS[1]} ms, stage 2 ${WORST_MS[2]} ms, stage 3 ${WORST_MS[3]} ms"
finish
