#!/usr/bin/env bash
# An error before the first step stops every rank promptly with that error and a non-zero exit,
# whatever fault_tolerance.on_failure says (degrade is for faults during training). Rank 0
# refusing its config (tensorboard.output_path under a file, prometheus.port in use) used to be
# taken for a rank fault: 30 s later rank 1 trained on alone and `dsc launch` exited 0; a squatted
# MASTER_PORT left rank 1 waiting 30 s. Checked under `dsc launch` (the default degrade, and
# --max_restarts: nothing is restarted) and with ranks started by hand (the others hear it
# through the communicator). `dsc config check` catches the output path before any run.
set -u
. "$(dirname "$0")/lib.sh"
LIMIT=12 # seconds a start-up failure may take to end the job on this busy 2-core machine

: > "$T/afile"
cat > "$T/tb.json" << JSON
{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "tensorboard": {"enabled": true, "output_path": "$T/afile/tb", "job_name": "j"}}
JSON
expect 1 "tensorboard.output_path (choose another): $T/afile exists and is not a directory" -- \
  "$DSC" config check "$T/tb.json"

# A process that holds a loopback port (listening, never answering) for 60 s at most; its pid in
# HOLDER. Ended by its pid below.
hold_port() {
  $PY -c 'import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64); print("up", flush=True)
time.sleep(60)' "$1" > "$T/holder.out" &
  HOLDER=$!
  for _ in $(seq 100); do grep -q up "$T/holder.out" 2> /dev/null && return 0; sleep 0.05; done
  return 1
}

# launch_fail NAME PORT CONFIG [launcher flags]: 2 ranks of dsc train under dsc launch; exit code
# in LRC, seconds taken in TOOK.
launch_fail() {
  local name=$1 port=$2 cfg=$3 d="$T/$1" t0=$SECONDS
  shift 3
  mkdir -p "$d"
  local c=()
  [ -n "$cfg" ] && c=(--config "$cfg")
  timeout -s KILL 60 "$DSC" launch --num_procs 2 --no_local_rank --master_port "$port" "$@" \
    "$DSC" train "${c[@]}" --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 \
    --max-steps 5 --out "$d/run" > "$d/out" 2> "$d/err"
  LRC=$?
  TOOK=$((SECONDS - t0))
}

# ---- under dsc launch (degrade, the default) ----
launch_fail tb "$(free_port)" "$T/tb.json"
check "output path: launcher exits 78 (got $LRC)" -- test $LRC -eq 78
check "output path: within $LIMIT s (took $TOOK s)" -- test $TOOK -le $LIMIT
check "output path: rank 0's error is shown" -- \
  grep -q "\[rank 0\] dsc train: error: tensorboard.output_path (choose another)" "$T/tb/out" "$T/tb/err"
check "output path: the launcher says rank 0 could not start" -- \
  grep -q "rank 0 (pid [0-9]*) could not start (exit code 78" "$T/tb/err"
check "output path: nobody trained on" -- bash -c "! grep -q 'step .*5/5\|train loss' '$T/tb/out' '$T/tb/err'"
[ $LRC -eq 78 ] || tail -5 "$T/tb/out" "$T/tb/err"

pport=$(free_port)
hold_port "$pport"
cat > "$T/prom.json" << JSON
{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "prometheus": {"enabled": true, "port": $pport}}
JSON
expect 0 "prometheus.port $pport is in use" -- "$DSC" config check "$T/prom.json"
launch_fail prom "$(free_port)" "$T/prom.json"
check "prometheus port in use: launcher exits 78 (got $LRC) within $LIMIT s (took $TOOK s)" -- \
  test $LRC -eq 78 -a $TOOK -le $LIMIT
check "prometheus port in use: the error names prometheus.port" -- grep -q "prometheus.port" "$T/prom/out" "$T/prom/err"
kill "$HOLDER" 2> /dev/null; wait "$HOLDER" 2> /dev/null

mport=$(free_port)
hold_port "$mport"
launch_fail squat "$mport" ""
check "squatted MASTER_PORT: launcher exits 78 (got $LRC) within $LIMIT s (took $TOOK s)" -- \
  test $LRC -eq 78 -a $TOOK -le $LIMIT
check "squatted MASTER_PORT: the error names MASTER_PORT" -- grep -q "MASTER_PORT" "$T/squat/out" "$T/squat/err"
kill "$HOLDER" 2> /dev/null; wait "$HOLDER" 2> /dev/null

launch_fail again "$(free_port)" "$T/tb.json" --max_restarts 2
check "--max_restarts: a start-up error is not restarted (exit $LRC)" -- \
  bash -c "[ $LRC -eq 78 ] && grep -q 'not restarting' '$T/again/err' && ! grep -q 'restart 1 of' '$T/again/err'"

# ---- ranks started by hand: rank 1 hears rank 0's error through the communicator ----
t0=$SECONDS
start_ranks hand 2 "$T/tb.json" 5
wait_ranks 60
took=$((SECONDS - t0))
check "by hand: both ranks exit 78 (got ${CODES[*]}) within $LIMIT s (took $took s)" -- \
  test "${CODES[*]}" = "78 78" -a $took -le $LIMIT
check "by hand: rank 1 names rank 0's error" -- \
  grep -q "rank 0 stopped: tensorboard.output_path (choose another)" "$T/hand/log.1"
check "by hand: rank 1 did not recover or train on" -- \
  bash -c "! grep -q 'resumed at step\|train loss' '$T/hand/log.1'"
[ "${CODES[*]}" = "78 78" ] || tail -3 "$T/hand"/log.*
finish
