#!/usr/bin/env bash
# dsc launch when things go wrong: a rank killed mid-run, a rank failing while the others ignore
# SIGTERM, restarts (--max_restarts, exit code 75), SIGINT/SIGTERM/SIGUSR1 to the launcher, and
# the launcher itself SIGKILLed. Every case checks the exit code, the one-line reason, the time
# the teardown took, and that no process of ours is left.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
MARK="dsclaunchfault$$x$RANDOM" # in the command line of every rank (and of its helpers)
LPID=
cleanup() {
  [ -n "$LPID" ] && kill -9 "$LPID" 2>/dev/null
  pkill -9 -f "$MARK" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
cd "$T" || exit 1

ms() { echo $(($(date +%s%N) / 1000000)); }
no_leftovers() { ! pgrep -f "$MARK" > /dev/null; }
# Wait up to $1 seconds for no process of ours to be left.
gone_within() {
  local deadline=$(($(ms) + $1 * 1000))
  while [ "$(ms)" -lt $deadline ]; do
    no_leftovers && return 0
    sleep 0.05
  done
  echo "still running after $1 s:"; pgrep -af "$MARK"
  return 1
}
# Wait up to 10 s for files $1/ready0 .. ready$(($2-1)).
wait_ready() {
  local r
  for _ in $(seq 200); do
    for ((r = 0; r < $2; r++)); do [ -e "$1/ready$r" ] || break; done
    [ $r -eq $2 ] && return 0
    sleep 0.05
  done
  echo "ranks did not start"; return 1
}
fresh() { rm -rf "$T/run" && mkdir -p "$T/run"; }
# launch ARGS...: dsc launch without --local_rank, output to $T/out and $T/err
launch() { "$DSC" launch --no_local_rank "$@" > "$T/out" 2> "$T/err"; }
# The same in the background; LPID is the launcher's pid.
launch_bg() {
  "$DSC" launch --no_local_rank "$@" > "$T/out" 2> "$T/err" &
  LPID=$!
}
# Wait for the launcher (at most 20 s, then it is killed: the test must never hang); rc = its exit.
wait_launcher() {
  for _ in $(seq 400); do kill -0 "$LPID" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$LPID" 2>/dev/null && { echo "launcher still running after 20 s"; kill -9 "$LPID"; }
  wait "$LPID"
  rc=$?
  LPID=
}
LOOP='while :; do sleep 0.1; done'
CHILD='sh -c "while :; do sleep 0.1; done" "$0-child"' # a grandchild that carries the marker

# ---- a rank killed from outside mid-run: the group goes within 5 s, 137, one line ----
fresh
launch_bg --num_procs 4 sh -c 'echo $$ > "$1/pid$RANK"; touch "$1/ready$RANK"; '"$LOOP" \
  "$MARK" "$T/run"
wait_ready "$T/run" 4
victim=$(cat "$T/run/pid2")
t0=$(ms)
kill -9 "$victim"
wait_launcher
dt=$(($(ms) - t0))
check "killed rank: launcher exits 137 (got $rc)" -- test $rc -eq 137
check "killed rank: torn down in ${dt} ms (< 5000)" -- test $dt -lt 5000
want="dsc launch: rank 2 (pid $victim) was killed by signal 9; stopped the other 3 ranks"
check "killed rank: the reason names the rank, its pid and the signal" -- grep -qxF "$want" "$T/err"
check "killed rank: no orphans" -- gone_within 2

# ---- a rank killed while its peer's error exit is reaped first (the peer failing on it, the
# killed process still being torn down): the kill is named, and gives the exit code ----
fresh
launch --num_procs 2 sh -c 'echo $$ > "$1/pid$RANK"; trap "" TERM
  [ $RANK = 0 ] && { sleep 0.2; exit 1; }; sleep 0.6; kill -9 $$' "$MARK" "$T/run"
rc=$?
check "a kill found after its peer's error exit: launcher exits 137 (got $rc)" -- test $rc -eq 137
want="dsc launch: rank 1 (pid $(cat "$T/run/pid1")) was killed by signal 9; stopped the other rank"
check "  ... the reason names the killed rank" -- grep -qxF "$want" "$T/err"
check "  ... no orphans" -- gone_within 1

# ---- a rank exits 3 while the others ignore SIGTERM: SIGKILL follows, all within 5 s ----
t0=$(ms)
launch --num_procs 3 sh -c 'trap "" TERM; [ $RANK = 1 ] && { sleep 0.3; exit 3; }; '"$LOOP" "$MARK"
rc=$?
dt=$(($(ms) - t0))
check "failing rank: exit code 3 propagated (got $rc)" -- test $rc -eq 3
check "failing rank: stubborn ranks gone in ${dt} ms (< 5300)" -- test $dt -lt 5300
want='^dsc launch: rank 1 \(pid [0-9]+\) exited with code 3; stopped the other 2 ranks$'
check "failing rank: one-line reason" -- grep -qE "$want" "$T/err"
check "failing rank: no orphans" -- gone_within 1

# ---- --max_restarts 2: fails on its first run (marker file), succeeds on the second ----
fresh
launch --num_procs 2 --max_restarts 2 sh -c '
  echo "start restart=$DSC_RESTART_COUNT"
  if [ $RANK = 1 ] && [ ! -e "$1/once" ]; then touch "$1/once"; exit 1; fi
  sleep 0.3; echo done' "$MARK" "$T/run"
rc=$?
check "restart: exit 0 after one restart (got $rc)" -- test $rc -eq 0
check "restart: announced" -- grep -qx 'dsc launch: restart 1 of 2' "$T/err"
check "restart: DSC_RESTART_COUNT=1 in the second run" -- \
  grep -qx '\[rank 0\] start restart=1' "$T/out"
check "restart: each rank finished once" -- test "$(grep -c '\] done$' "$T/out")" -eq 2
check "restart: no third run" -- bash -c "! grep -q restart=2 '$T/out'"

# ---- restarts exhausted: 1 + 2 runs, then the failing code ----
launch --num_procs 2 --max_restarts 2 sh -c \
  'echo "start restart=$DSC_RESTART_COUNT"; [ $RANK = 0 ] && exit 4; sleep 5' "$MARK"
rc=$?
check "exhausted: exit 4 (got $rc)" -- test $rc -eq 4
check "exhausted: three runs of rank 0" -- test "$(grep -c '^\[rank 0\] start' "$T/out")" -eq 3
check "exhausted: restart 2 of 2 was the last" -- grep -qx 'dsc launch: restart 2 of 2' "$T/err"

# ---- exit code 75 ("restart requested") ----
fresh
launch --num_procs 2 --max_restarts 1 sh -c '
  if [ $RANK = 0 ] && [ ! -e "$1/once" ]; then touch "$1/once"; exit 75; fi
  echo ok' "$MARK" "$T/run"
rc=$?
check "exit 75: restarted and finished (got $rc)" -- test $rc -eq 0
check "exit 75: reason says restart requested" -- \
  grep -q 'rank 0 (pid [0-9]*) asked for a restart (exit code 75)' "$T/err"
expect 75 "asked for a restart" -- \
  "$DSC" launch --num_procs 2 --no_local_rank sh -c '[ $RANK = 1 ] && exit 75; sleep 2' "$MARK"

# ---- SIGINT to the launcher reaches every rank ----
fresh
launch_bg --num_procs 3 sh -c 'trap "echo got-INT; exit 0" INT; touch "$1/ready$RANK"; '"$LOOP" \
  "$MARK" "$T/run"
wait_ready "$T/run" 3
t0=$(ms)
kill -INT $LPID
wait_launcher
dt=$(($(ms) - t0))
check "SIGINT: launcher exits 130 (got $rc)" -- test $rc -eq 130
check "SIGINT: every rank got it" -- test "$(grep -c 'got-INT' "$T/out")" -eq 3
check "SIGINT: reason" -- grep -qx 'dsc launch: received SIGINT; stopped 3 ranks' "$T/err"
check "SIGINT: done in ${dt} ms" -- test $dt -lt 5000
check "SIGINT: no orphans" -- gone_within 1

# ---- SIGTERM to the launcher, with SIGUSR1 forwarded first ----
fresh
launch_bg --num_procs 2 sh -c '
  trap "echo got-USR1" USR1
  trap "echo got-TERM; exit 1" TERM
  touch "$1/ready$RANK"; '"$LOOP" "$MARK" "$T/run"
wait_ready "$T/run" 2
kill -USR1 $LPID
for _ in $(seq 100); do [ "$(grep -c got-USR1 "$T/out")" -eq 2 ] && break; sleep 0.05; done
check "SIGUSR1: forwarded to both ranks, which keep running" -- \
  test "$(grep -c got-USR1 "$T/out")" -eq 2
kill -TERM $LPID
wait_launcher
check "SIGTERM: launcher exits 143 (got $rc)" -- test $rc -eq 143
check "SIGTERM: every rank got it" -- test "$(grep -c 'got-TERM' "$T/out")" -eq 2
check "SIGTERM: no orphans" -- gone_within 1

# ---- launcher SIGKILLed: ranks and what they started are gone within a few seconds ----
fresh
launch_bg --num_procs 3 sh -c "$CHILD & "'touch "$1/ready$RANK"; '"$LOOP" "$MARK" "$T/run"
wait_ready "$T/run" 3
sleep 0.2
before=$(pgrep -f "$MARK-child" | wc -l)
check "SIGKILL: 3 grandchildren were running" -- test "$before" -eq 3
{ kill -9 $LPID; wait $LPID; } 2>/dev/null
LPID=
check "SIGKILL: ranks and grandchildren gone within 3 s" -- gone_within 3

# the same with ranks that ignore SIGTERM: the guardian's SIGKILL comes after the grace period
fresh
launch_bg --num_procs 2 sh -c 'trap "" TERM; '"$CHILD & "'touch "$1/ready$RANK"; '"$LOOP" \
  "$MARK" "$T/run"
wait_ready "$T/run" 2
{ kill -9 $LPID; wait $LPID; } 2>/dev/null
LPID=
check "SIGKILL, TERM ignored: gone within 5 s" -- gone_within 5

# ---- a rank's leftover background process is swept when the rank exits normally ----
launch --num_procs 2 sh -c "$CHILD > /dev/null 2>&1 & echo started" "$MARK"
rc=$?
check "leftovers: exit 0 (got $rc)" -- test $rc -eq 0
check "leftovers: swept" -- gone_within 2

finish
