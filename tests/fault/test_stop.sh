#!/usr/bin/env bash
# A hung rank (SIGSTOP): detected within the deadline. Policy degrade: the others continue
# without it and end with the weights of a 3-rank run from the state they restored. Policy abort:
# every other rank exits with an error naming the hung rank within comm_timeout_s + 5 s. The
# stopped process is killed afterwards.
set -u
. "$(dirname "$0")/lib.sh"
STEPS=16

# Degrade, the rank stopping itself while a reduce-scatter is in flight: compare the weights.
config "$T/z2.json" 2
run_ranks stop 4 "$T/z2.json" $STEPS DSC_FT_INJECT=2:6:reduce:stop
check "degrade: the 3 others finish, the stopped rank was still stopped (codes ${CODES[*]})" -- \
  test "${CODES[*]}" = "0 0 124 0"
check "degrade: the hang is named" -- grep -q "rank 2 (pid [0-9]*) hung (its process is stopped)" "$T/stop/log.0"
dt=$(ms_between "$(injected_time stop)" "$(resumed_time stop)")
check "degrade: resumed $dt ms after the stop (comm_timeout_s 2 s; limit step_timeout_s 4 s + 1 s)" -- \
  test "$dt" -le 5000
b=$(restored_step stop)
# 5, or 4 when the stop came before step 5's replica (sent during step 6) had reached the buddy
check "degrade: restored step $b, 4 or 5" -- test "$b" = 5 -o "$b" = 4
check "degrade: weights == 3 ranks continuing from step $b" -- \
  same_weights "$T/stop/w.safetensors" "$(ref_weights 2 "$b" $STEPS)" 1e-6

# Degrade, SIGSTOP sent from outside at an arbitrary moment (every rank takes 50 ms per step).
slow=DSC_FT_INJECT="0:*:begin:sleep=0.05,1:*:begin:sleep=0.05,2:*:begin:sleep=0.05,3:*:begin:sleep=0.05"
config "$T/z3.json" 3
start_ranks ext 4 "$T/z3.json" 200 "$slow"
for _ in $(seq 200); do [ "$(cat "$RUN_DIR/metrics.jsonl" 2> /dev/null | wc -l)" -ge 20 ] && break; sleep 0.05; done
kill -STOP "${PIDS[3]}"
t_stop=$($PY -c 'import time; print(time.time())')
wait_ranks 120
check "external stop, degrade: the others finish all 200 steps (codes ${CODES[*]})" -- \
  test "${CODES[*]}" = "0 0 0 124"
dt=$(ms_between "$t_stop" "$(resumed_time ext)")
check "external stop, degrade: resumed $dt ms after the stop (limit 5000)" -- test "$dt" -le 5000
check "external stop, degrade: 200 steps in metrics, the last on 3 ranks" -- $PY -c "
import json; rows = [json.loads(l) for l in open('$T/ext/metrics.jsonl')]
assert sorted({r['step'] for r in rows}) == list(range(1, 201)) and rows[-1]['world_size'] == 3"

# Abort: every other rank exits non-zero, naming the hung rank, within comm_timeout_s + 5 s.
config "$T/za.json" 2 ', "on_failure": "abort"'
start_ranks abort 4 "$T/za.json" 200 "$slow"
for _ in $(seq 200); do [ "$(cat "$RUN_DIR/metrics.jsonl" 2> /dev/null | wc -l)" -ge 10 ] && break; sleep 0.05; done
kill -STOP "${PIDS[2]}"
t0=$SECONDS
victim=${PIDS[2]}
wait_ranks 20 0 1 3
gone=$((SECONDS - t0))
codes="${CODES[*]}"
wait_ranks 1 2 # kills the stopped one
check "abort: the 3 others exit 1 (codes $codes)" -- test "$codes" = "1 1 1"
check "abort: they were gone within $gone s (limit 7)" -- test $gone -le 7
for r in 0 1 3; do
  check "abort: rank $r names the hung rank" -- \
    grep -q "error: fault_tolerance.on_failure is abort: rank 2 (pid $victim) hung" "$T/abort/log.$r"
done
finish
