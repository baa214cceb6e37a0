#!/usr/bin/env bash
# The other paths of fault_tolerance: a transient fault (every rank alive) is retried on a fresh
# communicator; the step deadline ends a hang that the comm deadline does not; on_failure restart
# (with checkpoints: an emergency checkpoint, resumed on the survivors, ends where degrade ends)
# and abort; degrade falling back to restart (replicas off, a global batch that does not split);
# stage 0 needs no replicas; rank 0 lost (the new rank 0 writes the metrics); two faults in one
# run (4 -> 3 -> 2 ranks).
set -u
. "$(dirname "$0")/lib.sh"
STEPS=16
config "$T/z2.json" 2
run_ranks base 4 "$T/z2.json" $STEPS
check "fault-free run (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"

# Transient: rank 1 sleeps 3 s once, past the 2 s comm deadline, but lives: all 4 go on.
run_ranks tr 4 "$T/z2.json" $STEPS DSC_FT_INJECT=1:5:forward:sleep=3
check "transient: all 4 finish (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"
check "transient: retried on a fresh communicator of 4" -- \
  grep -q "resumed at step 5 from the state after step 4 on 4 ranks (was 4; transient" "$T/tr/log.0"
check "transient: one fault event in metrics" -- grep -q '"fault_events": 1, "world_size": 4' "$T/tr/metrics.jsonl"
check "transient: weights == the fault-free run, bit for bit" -- \
  same_weights "$T/tr/w.safetensors" "$T/base/w.safetensors" 0

# The step deadline: a 30 s comm deadline would wait, the 2 s step deadline does not.
COMM_S=30 STEP_S=2 config "$T/zw.json" 2
t0=$SECONDS
run_ranks wd 4 "$T/zw.json" $STEPS DSC_FT_INJECT=1:5:begin:sleep=4
check "step deadline: all 4 finish in $((SECONDS - t0)) s (codes ${CODES[*]})" -- \
  test "${CODES[*]}" = "0 0 0 0" -a $((SECONDS - t0)) -lt 20
check "step deadline: the watchdog fired" -- \
  grep -q "step 5 exceeded fault_tolerance.step_timeout_s = 2 s" "$T/wd/log.0"
check "step deadline: weights == the fault-free run" -- \
  same_weights "$T/wd/w.safetensors" "$T/base/w.safetensors" 0

# on_failure restart: the survivors restore the last complete step together, then exit 75.
config "$T/zr.json" 2 ', "on_failure": "restart"'
t0=$SECONDS
run_ranks rs 4 "$T/zr.json" $STEPS DSC_FT_INJECT=2:5:reduce
check "restart: survivors exit 75 within $((SECONDS - t0)) s (codes ${CODES[*]})" -- \
  test "${CODES[*]}" = "75 75 137 75" -a $((SECONDS - t0)) -le 8
check "restart: the reason names the dead rank" -- \
  grep -q "error: fault_tolerance.on_failure is restart: rank 2 (pid [0-9]*) died" "$T/rs/log.1"

# restart with checkpoints: the survivors save an emergency checkpoint of the last committed step
# (5, or 4 when rank 2 died before step 5's replica, sent during step 6, had arrived); resumed on
# 3 ranks it ends exactly where degrade ends from the same step.
config "$T/zrc.json" 2 ', "on_failure": "restart"' ', "checkpoint": {"interval_steps": 4}'
config "$T/zdc.json" 2 '' ', "checkpoint": {"interval_steps": 4}'
FLAGS=(--save-dir "$T/ck")
run_ranks rsc 4 "$T/zrc.json" $STEPS DSC_FT_INJECT=2:6:reduce
check "restart + checkpoints: survivors exit 75 (codes ${CODES[*]})" -- test "${CODES[*]}" = "75 75 137 75"
b=$(grep -ho "saved an emergency checkpoint of step [0-9]*" "$T/rsc/log.0" | awk '{print $NF}')
check "restart + checkpoints: emergency checkpoint of step $b (4 or 5)" -- \
  test "$b" = 4 -o "$b" = 5
FLAGS=(--save-dir "$T/ck" --resume)
run_ranks rsc2 3 "$T/zrc.json" $STEPS
check "restart + checkpoints: resumed on 3 ranks from step $b (codes ${CODES[*]})" -- \
  test "${CODES[*]}" = "0 0 0" -a -n "$(grep -l "global_step$b: continuing after step $b" "$T"/rsc2/log.0)"
FLAGS=(--save-dir "$T/ck2")
run_ranks dgc 4 "$T/zdc.json" $STEPS DSC_FT_INJECT=2:6:reduce
FLAGS=()
if [ "$(restored_step dgc)" = "$b" ]; then
  check "restart + resume == degrade (both continue on 3 ranks from step $b), bit for bit" -- \
    same_weights "$T/rsc2/w.safetensors" "$T/dgc/w.safetensors" 0
else # the two kills fell on different sides of the replica's arrival: each against its reference
  check "restart + resume == 3 ranks continuing from step $b, bit for bit" -- \
    same_weights "$T/rsc2/w.safetensors" "$(ref_weights 2 "$b" $STEPS)" 0
  check "degrade == 3 ranks continuing from step $(restored_step dgc), bit for bit" -- \
    same_weights "$T/dgc/w.safetensors" "$(ref_weights 2 "$(restored_step dgc)" $STEPS)" 0
fi

# on_failure abort after a kill.
config "$T/za.json" 2 ', "on_failure": "abort"'
run_ranks ab 4 "$T/za.json" $STEPS DSC_FT_INJECT=3:7:optimizer
check "abort: survivors exit 1 (codes ${CODES[*]})" -- test "${CODES[*]}" = "1 1 1 137"
check "abort: the error names the dead rank" -- \
  grep -q "error: fault_tolerance.on_failure is abort: rank 3 (pid [0-9]*) died" "$T/ab/log.0"

# Degrade without replicas at stage 2: the lost partition exists nowhere: restart.
config "$T/zn.json" 2 ', "replicate": false'
run_ranks norep 4 "$T/zn.json" $STEPS DSC_FT_INJECT=1:5:backward
check "replicate off: survivors exit 75 (codes ${CODES[*]})" -- test "${CODES[*]}" = "75 137 75 75"
check "replicate off: says why" -- grep -q "fault_tolerance.replicate is off" "$T/norep/log.0"

# A global batch of 16 does not split over 3 ranks: restart, after restoring the state.
sed 's/"train_batch_size": 12/"train_batch_size": 16/' "$T/z2.json" > "$T/z16.json"
run_ranks b16 4 "$T/z16.json" $STEPS DSC_FT_INJECT=2:5:reduce
check "batch 16 on 3 ranks: survivors exit 75 (codes ${CODES[*]})" -- test "${CODES[*]}" = "75 75 137 75"
check "batch 16 on 3 ranks: says why" -- \
  grep -q "train_batch_size 16 does not split over the 3 surviving ranks" "$T/b16/log.0"
check "batch 16 on 3 ranks: no checkpoints, said in words (no internal API name)" -- bash -c \
  "grep -q 'keeps no checkpoints (give --save-dir DIR): a restart begins again at step 1' '$T/b16/log.0' &&
   ! grep -q dsc_checkpointing_start '$T/b16/log.0'"

# Stage 0 holds everything on every rank: degrade works without replicas.
config "$T/z0.json" 0 ', "replicate": false'
run_ranks s0 4 "$T/z0.json" $STEPS DSC_FT_INJECT=1:6:reduce
check "stage 0: survivors finish (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 137 0 0"
b=$(restored_step s0)
cp "$T/z0.json" "$T/ref0.json"
ref_states 0 $STEPS > /dev/null
check "stage 0: weights == 3 ranks continuing from step $b" -- \
  same_weights "$T/s0/w.safetensors" "$(ref_weights 0 "$b" $STEPS)" 1e-6

# Rank 0 lost: the new rank 0 appends to metrics.jsonl.
run_ranks r0 4 "$T/z2.json" $STEPS DSC_FT_INJECT=0:9:backward
check "rank 0 lost: survivors finish (codes ${CODES[*]})" -- test "${CODES[*]}" = "137 0 0 0"
check "rank 0 lost: metrics hold every step" -- $PY -c "
import json; rows = [json.loads(l) for l in open('$T/r0/metrics.jsonl')]
assert sorted({r['step'] for r in rows}) == list(range(1, $STEPS + 1)), rows"
b=$(restored_step r0)
check "rank 0 lost: weights == 3 ranks continuing from step $b (7 or 8)" -- \
  same_weights "$T/r0/w.safetensors" "$(ref_weights 2 "$b" $STEPS)" 1e-6

# Two faults: 4 -> 3 -> 2 ranks, gradient accumulation 3 -> 4 -> 6.
run_ranks two 4 "$T/z2.json" $STEPS DSC_FT_INJECT=1:5:forward,3:10:reduce
check "two faults: the 2 survivors finish (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 137 0 137"
check "two faults: generation 2, accumulation 6" -- \
  grep -q "on 2 ranks (was 3; degraded; micro batch 1, gradient accumulation 6, generation 2)" "$T/two/log.0"
check "two faults: two fault events, last step on 2 ranks" -- \
  bash -c "tail -1 '$T/two/metrics.jsonl' | grep -q '\"step\": $STEPS.*\"fault_events\": 2, \"world_size\": 2'"
finish
