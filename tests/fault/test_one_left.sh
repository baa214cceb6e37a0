#!/usr/bin/env bash
# Two ranks becoming one: under degrade the lone survivor keeps training by itself (a world of one
# has no buddy to exchange replicas with; it rebuilt the lost rank's partition from the replica it
# held) and ends with the weights of one rank continuing from the restored step; at stage 0 too.
# A save in flight when the world shrinks is dropped, not the run. Under dsc launch with the
# built-in config the launcher says the policy is the default and exits 0; a config without
# on_failure is reported as the default too, not as the file's choice.
set -u
. "$(dirname "$0")/lib.sh"
STEPS=10

# ref1 STAGE B: the weights of one rank continuing from step B of a fault-free 2-rank run.
ref1() {
  local st=$1 b=$2
  if [ ! -d "$T/st$st" ]; then
    mkdir -p "$T/st$st"
    run_ranks "full$st" 2 "$T/z$st.json" $STEPS DSC_FT_SAVE_STATE="$T/st$st" > /dev/null
  fi
  run_ranks "one$st-$b" 1 "$T/z$st.json" $STEPS DSC_FT_LOAD_STATE="$T/st$st/step$b.safetensors" > /dev/null
  echo "$T/one$st-$b/w.safetensors"
}

for st in 2 0; do
  config "$T/z$st.json" $st
  run_ranks kill$st 2 "$T/z$st.json" $STEPS DSC_FT_INJECT=1:5:reduce
  check "stage $st: the survivor finishes alone (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 137"
  [ "${CODES[0]}" = 0 ] || tail -3 "$T/kill$st/log.0"
  check "stage $st: resumed on 1 rank" -- grep -q "on 1 rank (was 2; degraded" "$T/kill$st/log.0"
  check "stage $st: no internal error leaks" -- \
    bash -c "! grep -qE 'cannot message itself|falling back to a restart' '$T/kill$st/log.0'"
  check "stage $st: metrics reach step $STEPS on a world of 1" -- \
    bash -c "tail -1 '$T/kill$st/metrics.jsonl' | grep -q '\"step\": $STEPS,.*\"world_size\": 1'"
  b=$(restored_step kill$st)
  check "stage $st: weights == one rank continuing from step $b" -- \
    same_weights "$T/kill$st/w.safetensors" "$(ref1 $st "${b:-0}")" 1e-6
done

# A save still being written when the world shrinks: the save of step 4 (async, its writer held
# back 0.5 s) is in flight when rank 1 dies in step 6, and done writing when the survivor, having
# slept 1 s in step 7, completes it. It is dropped with a warning and the survivor goes on; its
# next save is complete and verifies.
config "$T/zc.json" 2 '' ', "checkpoint": {"interval_steps": 4, "async": true}'
FLAGS=(--save-dir "$T/ckc")
run_ranks ckc 2 "$T/zc.json" $STEPS DSC_FT_INJECT=1:6:reduce,0:7:forward:sleep=1 \
  DSC_CKPT_TEST_WRITE_DELAY_S=0.5
FLAGS=()
check "save in flight: the survivor finishes alone (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 137"
[ "${CODES[0]}" = 0 ] || tail -3 "$T/ckc/log.0"
check "save in flight: dropped with a warning" -- \
  grep -q "checkpoint global_step4: the world changed from 2 to 1 ranks during the save; it is dropped and training continues" "$T/ckc/log.0"
check "save in flight: the next save is latest and verifies" -- \
  bash -c "test \"\$(cat '$T/ckc/latest')\" = global_step8 && '$DSC' ckpt verify '$T/ckc' > /dev/null"
b=$(restored_step ckc)
check "save in flight: weights == one rank continuing from step $b" -- \
  same_weights "$T/ckc/w.safetensors" "$(ref1 2 "${b:-0}")" 1e-6

# Under dsc launch with the built-in config: degrade by default, said so; the launcher exits 0.
d="$T/launch"
mkdir -p "$d"
DSC_FT_INJECT=1:5:reduce timeout -s KILL 120 "$DSC" launch --num_procs 2 --no_local_rank \
  --master_port "$(free_port)" --log_dir "$d" "$DSC" train --data "$T/data" --model d2 \
  --seq-len 32 --sample-tokens 0 --eval-every 0 --max-steps $STEPS --out "$d" > "$d/out" 2> "$d/err"
LRC=$?
check "launch, built-in config: exits 0 (got $LRC)" -- test $LRC -eq 0
[ $LRC -eq 0 ] || tail -5 "$d/err" "$d"/rank*.log
check "launch, built-in config: the policy is named as the default" -- grep -qE \
  "^dsc launch: rank 1 \(pid [0-9]+\) was killed by signal 9; the other rank keeps running \(fault_tolerance.on_failure is degrade \(default\)\)$" \
  "$d/err"

# A config file with no on_failure: the launcher does not say the file chose degrade.
d="$T/launch2"
mkdir -p "$d"
DSC_FT_INJECT=1:5:reduce timeout -s KILL 120 "$DSC" launch --num_procs 2 --no_local_rank \
  --master_port "$(free_port)" --log_dir "$d" "$DSC" train --config "$T/z2.json" \
  --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 --eval-every 0 --max-steps $STEPS \
  --out "$d" > "$d/out" 2> "$d/err"
LRC=$?
check "launch, config without on_failure: exits 0 (got $LRC)" -- test $LRC -eq 0
check "launch, config without on_failure: named as the default" -- \
  grep -q "keeps running (fault_tolerance.on_failure is degrade (default))$" "$d/err"
finish
