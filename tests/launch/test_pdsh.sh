#!/usr/bin/env bash
# Multi-node on one machine: 2 "nodes" (localhost and 127.0.0.1) x 2 ranks through pdsh's exec
# module (pdsh -R exec runs each node's command locally), and through the ssh launcher with a
# stand-in ssh (DSC_SSH) that runs the remote command in a local shell. Each node runs a node
# agent (dsc launch again) in our directory with our exported environment.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
MARK="dsclaunchpdsh$$x$RANDOM"
LPID=
cleanup() {
  [ -n "$LPID" ] && kill -9 "$LPID" 2>/dev/null
  pkill -9 -f "$MARK" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
no_leftovers() { ! pgrep -f "$MARK" > /dev/null; }
gone_within() {
  for _ in $(seq $(($1 * 20))); do no_leftovers && return 0; sleep 0.05; done
  echo "still running:"; pgrep -af "$MARK"; return 1
}

HAVE_PDSH=1
if ! command -v pdsh > /dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get > /dev/null; then
    echo "installing pdsh with apt-get"
    apt_pdsh() { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pdsh; }
    apt_pdsh > "$T/apt.log" 2>&1 ||
      { apt-get update > /dev/null 2>&1 && apt_pdsh >> "$T/apt.log" 2>&1; }
  fi
  command -v pdsh > /dev/null || HAVE_PDSH=0
fi
if [ $HAVE_PDSH -eq 1 ] && ! pdsh -V 2>&1 | grep -q 'exec'; then HAVE_PDSH=0; fi
cd "$T" || exit 1
PORT=$((36000 + $$ % 5000))
printf '# two nodes on this machine\nlocalhost slots=2\n127.0.0.1 slots=2\n' > "$T/hostfile"
printf 'FROM_ENVFILE=envfile value\n' > "$T/.deepspeed_env"

cat > "$T/env.sh" <<'EOF'
#!/bin/sh
echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE M=$MASTER_ADDR:$MASTER_PORT" \
  "DIR=$PWD E=$FROM_ENVFILE N=$NCCL_TEST_VAR ARGS=$*"
EOF
chmod +x "$T/env.sh"
check_2x2() { # check_2x2 FILE
  local f=$1 r
  if [ "$(grep -c '^\[rank [0-9]*\] R=' "$f")" -ne 4 ]; then
    echo "want 4 rank lines:"; cat "$f"; return 1
  fi
  for r in 0 1 2 3; do
    local l=$((r % 2))
    local want="[rank $r] R=$r W=4 L=$l LW=2 M=localhost:$PORT DIR=$T E=envfile value"
    want="$want N=nccl 50% ARGS=a'b %h --local_rank=$l"
    grep -qxF "$want" "$f" || { echo "missing: $want"; cat "$f"; return 1; }
  done
}

# 2 nodes x 2 ranks through launcher $1 (extra flags after it)
run_2x2() {
  local how=$1
  shift
  NCCL_TEST_VAR="nccl 50%" "$DSC" launch --hostfile "$T/hostfile" --master_port $PORT \
    --log_dir "$T/logs-$how" "$@" "$T/env.sh" "a'b" "%h" > "$T/out-$how" 2> "$T/err-$how"
  local rc=$?
  check "$how 2x2: exit 0 (got $rc)" -- test $rc -eq 0
  [ $rc -eq 0 ] || cat "$T/err-$how"
  check "$how 2x2: ranks, local ranks, master, directory, exported variables" -- \
    check_2x2 "$T/out-$how"
  check "$how 2x2: rank 3 wrote its log" -- grep -q '^R=3 ' "$T/logs-$how/rank3.log"
}

# a rank on the second node fails: its node stops, the first node is torn down too
fail_2x2() {
  local how=$1
  shift
  local t0=$(($(date +%s%N) / 1000000))
  "$DSC" launch --hostfile "$T/hostfile" --no_local_rank "$@" sh -c \
    'if [ $RANK = 3 ]; then sleep 0.5; exit 3; fi; while :; do sleep 0.1; done' "$MARK" \
    > "$T/fout-$how" 2> "$T/ferr-$how"
  local rc=$?
  local dt=$(($(date +%s%N) / 1000000 - t0))
  check "$how failure: exit code 3 (got $rc)" -- test $rc -eq 3
  check "$how failure: the node agent's reason relayed" -- \
    grep -q 'dsc launch: node 127.0.0.1: rank 3 (pid [0-9]*) exited with code 3' "$T/ferr-$how"
  check "$how failure: done in ${dt} ms" -- test $dt -lt 6000
  check "$how failure: no orphans on any node" -- gone_within 2
}

# the launcher SIGKILLed: agents and ranks on every node go
kill_head() {
  local how=$1
  shift
  rm -rf "$T/run" && mkdir -p "$T/run"
  "$DSC" launch --hostfile "$T/hostfile" --no_local_rank "$@" sh -c \
    'touch "$1/ready$RANK"; while :; do sleep 0.1; done' "$MARK" "$T/run" > /dev/null 2>&1 &
  LPID=$!
  for _ in $(seq 200); do [ "$(ls "$T/run" | wc -l)" -eq 4 ] && break; sleep 0.05; done
  check "$how kill: 4 ranks were running" -- test "$(ls "$T/run" | wc -l)" -eq 4
  { kill -9 $LPID; wait $LPID; } 2>/dev/null
  LPID=
  check "$how kill: no orphans within 3 s" -- gone_within 3
}

if [ $HAVE_PDSH -eq 1 ]; then
  run_2x2 pdsh --launcher_args "-R exec"
  fail_2x2 pdsh --launcher_args "-R exec"
  kill_head pdsh --launcher_args "-R exec"
  # --include picks one slot per node; the default launcher for several hosts is pdsh
  PDSH_RCMD_TYPE=exec "$DSC" launch --hostfile "$T/hostfile" --include "localhost:1@127.0.0.1:0" \
    --no_local_rank sh -c 'echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK/$LOCAL_WORLD_SIZE"' "$MARK" \
    > "$T/inc" 2>&1
  check "pdsh --include: one rank per node" -- bash -c \
    "grep -qx '\[rank 0\] R=0 W=2 L=0/1' '$T/inc' && grep -qx '\[rank 1\] R=1 W=2 L=0/1' '$T/inc'"
  # torch over the two nodes
  if /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null; then
    cat > "$T/ar.py" <<'EOF'
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"sum={t.item():g}", flush=True)
dist.destroy_process_group()
EOF
    "$DSC" launch --hostfile "$T/hostfile" --launcher_args "-R exec" --master_port $((PORT + 1)) \
      /usr/bin/python3 "$T/ar.py" "$MARK" > "$T/torch" 2>&1
    check "pdsh 2x2 torch all_reduce: every rank has sum 10" -- \
      test "$(grep -c 'sum=10$' "$T/torch")" -eq 4
  fi
else
  echo "SKIP (pdsh part): pdsh with the exec module is not installed and could not be installed"
fi

# The ssh launcher with a stand-in ssh: drops the options and the host, runs the command in sh.
cat > "$T/fake-ssh" <<'EOF'
#!/bin/sh
while [ $# -gt 1 ]; do shift; done
exec sh -c "$1"
EOF
chmod +x "$T/fake-ssh"
export DSC_SSH="$T/fake-ssh -o BatchMode=yes"
run_2x2 ssh --launcher ssh
fail_2x2 ssh --launcher ssh
kill_head ssh --launcher ssh
unset DSC_SSH

finish
