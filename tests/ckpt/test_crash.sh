#!/usr/bin/env bash
# Crash safety: 50 trials of SIGKILL at a random moment of a run that saves every step (async and
# synchronous saves, 1 and 2 ranks, keep_last pruning, validation). After every kill `latest`
# names a checkpoint that verifies, its step never goes back, and a final --resume succeeds.
set -u
. "$(dirname "$0")/lib.sh"
SEED=${CKPT_CRASH_SEED:-$RANDOM}
RANDOM=$SEED
echo "crash test seed $SEED (rerun with CKPT_CRASH_SEED=$SEED)"
config "$T/async.json" 1 "" '"interval_s": 0, "interval_steps": 1, "keep_last": 3, "async": true'
config "$T/sync.json" 2 "" '"interval_s": 0, "interval_steps": 1, "keep_last": 3, "async": false'
CK="$T/ck"
prev=-1 bad=0 verified=0 mid=0 trials=50
for ((i = 1; i <= trials; i++)); do
  cfg="$T/async.json"; ((i % 2)) && cfg="$T/sync.json"
  world=1; ((i % 5 == 0)) && world=2
  start "t$i" $world "$cfg" --max-steps 1000000 --save-dir "$CK" --resume
  # the random moment counts from the first finished step, not from the process start, so that a
  # loaded machine (slow start-up) does not turn most trials into kills before any save
  for ((w = 0; w < 600; w++)); do [ -s "$T/t$i/metrics.jsonl" ] && break; sleep 0.05; done
  delay=$((100 + RANDOM % 500))
  sleep "$(printf '0.%03d' "$delay")"
  kill -9 "${PIDS[@]}" 2>/dev/null
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null; done
  ls "$CK" 2>/dev/null | grep -q '\.tmp\.' && mid=$((mid + 1)) # killed inside a save
  [ -e "$CK/latest" ] || continue
  out=$("$DSC" ckpt verify "$CK" 2>&1)
  if [ $? -ne 0 ]; then
    echo "FAIL: trial $i (world $world, $(basename "$cfg"), killed after ${delay} ms): latest does not verify: $out"
    bad=$((bad + 1))
    continue
  fi
  verified=$((verified + 1))
  step=$(sed 's/global_step//' "$CK/latest")
  if [ "$step" -lt "$prev" ]; then
    echo "FAIL: trial $i: latest went back from step $prev to $step"
    bad=$((bad + 1))
  fi
  prev=$step
done
echo "$verified of $trials kills left a latest that verifies ($mid kills interrupted a save); it reached step $prev"
check "every kill left a verifying latest" -- test $bad -eq 0
check "checkpoints were made in most trials" -- test $verified -ge 40
check "some kills interrupted a save" -- test $mid -ge 5
check "training made progress across restarts" -- test "$prev" -gt 20
check "resume after the last kill" -- run final 1 "$T/async.json" --max-steps $((prev + 3)) --save-dir "$CK" --resume
check "  ... from the latest checkpoint" -- grep -q "continuing after step $prev" "$T/final.0.log"
check "  ... whose save completed" -- "$DSC" ckpt verify "$CK/global_step$((prev + 3))"
finish
