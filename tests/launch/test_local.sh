#!/usr/bin/env bash
# dsc launch on this host: 1, 2 and 4 ranks with their environment, --local_rank, output prefixes
# and logs, .deepspeed_env, hostfile include/exclude, Python scripts, and clear errors.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
MARK="dsclaunchlocal$$x$RANDOM" # in every command line we start, so that leftovers can be found
cleanup() {
  pkill -9 -f "$MARK" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
no_leftovers() { ! pgrep -f "$MARK" > /dev/null; }
cd "$T" || exit 1
PORT=$((21000 + $$ % 5000))

# Prints what a rank sees: R(ANK) W(ORLD_SIZE) L(OCAL_RANK) LW (LOCAL_WORLD_SIZE) M(ASTER).
cat > "$T/env.sh" <<'EOF'
#!/bin/sh
echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE" \
  "M=$MASTER_ADDR:$MASTER_PORT RESTART=$DSC_RESTART_COUNT ARGS=$*"
EOF
chmod +x "$T/env.sh"

# check_ranks N FILE: the line of every rank r < N, and no other rank line.
check_ranks() {
  local n=$1 f=$2 r
  if [ "$(grep -c '^\[rank [0-9]*\] R=' "$f")" -ne "$n" ]; then
    echo "want $n rank lines:"; cat "$f"; return 1
  fi
  for ((r = 0; r < n; r++)); do
    local want="[rank $r] R=$r W=$n L=$r LW=$n M=127.0.0.1:$PORT RESTART=0 ARGS=a b --local_rank=$r"
    grep -qxF "$want" "$f" || { echo "missing: $want"; cat "$f"; return 1; }
  done
}

for n in 1 2 4; do
  "$DSC" launch --num_procs $n --master_port $PORT "$T/env.sh" "a b" > "$T/out$n" 2> "$T/err$n"
  check "$n ranks exit 0" -- test $? -eq 0
  check "$n ranks: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*" -- check_ranks $n "$T/out$n"
done
# --num_gpus means processes on a machine without GPUs
"$DSC" launch --num_gpus 2 --master_port $PORT "$T/env.sh" "a b" > "$T/outg" 2>&1
check "--num_gpus 2 starts 2 ranks" -- check_ranks 2 "$T/outg"

expect 0 "[rank 1] ARGS=x --local_rank=1" -- \
  "$DSC" launch --num_procs 2 sh -c 'echo ARGS=$*' sh x
"$DSC" launch --num_procs 2 --no_local_rank sh -c 'echo ARGS=$*' sh x > "$T/nolr" 2>&1
check "--no_local_rank appends nothing" -- grep -qx '\[rank 0\] ARGS=x' "$T/nolr"

# stderr stays stderr (prefixed); a last line without newline still arrives whole
"$DSC" launch --num_procs 2 --no_local_rank \
  sh -c 'echo out$RANK; echo err$RANK >&2; printf tail$RANK' > "$T/so" 2> "$T/se"
check "stdout lines prefixed" -- grep -qx '\[rank 1\] out1' "$T/so"
check "stderr lines prefixed, on stderr" -- grep -qx '\[rank 0\] err0' "$T/se"
check "unterminated last line flushed" -- grep -qx '\[rank 1\] tail1' "$T/so"
check "stdout has no stderr line" -- bash -c "! grep -q err '$T/so'"

# Lines from several ranks never mix within a line.
A=$(printf 'a%.0s' $(seq 81))
"$DSC" launch --num_procs 4 --no_local_rank sh -c \
  'i=0; while [ $i -lt 300 ]; do echo "r$RANK-$1-$i"; i=$((i+1)); done' sh "$A" > "$T/many" 2>&1
check "1200 whole lines from 4 ranks" -- \
  test "$(grep -cE '^\[rank ([0-3])\] r\1-a{81}-[0-9]+$' "$T/many")" -eq 1200

# per-rank logs
"$DSC" launch --num_procs 2 --log_dir "$T/logs/run1" --no_local_rank \
  sh -c 'echo hello $RANK; echo oops >&2' > /dev/null 2>&1
check "rank1.log has the rank's lines, unprefixed" -- grep -qx 'hello 1' "$T/logs/run1/rank1.log"
check "rank0.log has its stderr too" -- grep -qx 'oops' "$T/logs/run1/rank0.log"

# .deepspeed_env in the current directory, NCCL_* passed through
printf 'FROM_ENVFILE=yes it is\n# comment\nNCCL_SOCKET_IFNAME=lo\n' > "$T/.deepspeed_env"
NCCL_DEBUG=INFO "$DSC" launch --num_procs 2 --no_local_rank \
  sh -c 'echo "E=$FROM_ENVFILE N=$NCCL_DEBUG S=$NCCL_SOCKET_IFNAME"' > "$T/envf" 2>&1
check ".deepspeed_env and NCCL_* reach every rank" -- \
  grep -qx '\[rank 1\] E=yes it is N=INFO S=lo' "$T/envf"
echo 'BROKEN LINE' > "$T/.deepspeed_env"
expect 2 ".deepspeed_env line 1: expected KEY=VALUE" -- "$DSC" launch --num_procs 1 true
rm -f "$T/.deepspeed_env"

# a Python script runs under python3 -u; its argparse sees --local_rank
cat > "$T/prog.py" <<'EOF'
import argparse, os
p = argparse.ArgumentParser()
p.add_argument("--local_rank", type=int)
p.add_argument("--tag")
a = p.parse_args()
print(f"py rank {os.environ['RANK']} local_rank {a.local_rank} tag {a.tag}")
EOF
expect 0 "[rank 1] py rank 1 local_rank 1 tag t" -- "$DSC" launch --num_procs 2 "$T/prog.py" --tag t

# hostfile with one host: slots, --include/--exclude, --num_gpus
printf '# one node\nlocalhost slots=4\n' > "$T/hostfile"
HF=(--hostfile "$T/hostfile" --master_port $PORT)
"$DSC" launch "${HF[@]}" --include localhost:1,3 "$T/env.sh" "a b" > "$T/inc" 2>&1
check "--include localhost:1,3 starts 2 ranks" -- check_ranks 2 "$T/inc"
"$DSC" launch "${HF[@]}" --exclude localhost:0 "$T/env.sh" "a b" > "$T/exc" 2>&1
check "--exclude localhost:0 starts 3 ranks" -- check_ranks 3 "$T/exc"
"$DSC" launch "${HF[@]}" --num_gpus 2 "$T/env.sh" "a b" > "$T/ng" 2>&1
check "hostfile + --num_gpus 2 starts 2 ranks" -- check_ranks 2 "$T/ng"

# clear errors, exit 2, nothing started
printf 'localhost slots=2\nworker slots\n' > "$T/bad"
expect 2 "hostfile $T/bad line 2: expected 'HOST slots=N'" -- "$DSC" launch --hostfile "$T/bad" true
expect 2 "--include: host 'nohost' is not among" -- "$DSC" launch "${HF[@]}" --include nohost true
expect 2 "host 'localhost' has no slot 7" -- "$DSC" launch "${HF[@]}" --exclude localhost:7 true
expect 2 "cannot be used together" -- "$DSC" launch --include localhost --exclude localhost:0 true
expect 2 "not found in PATH" -- "$DSC" launch --num_procs 2 "no-such-program-$MARK"
expect 2 "is not one of local, pdsh, ssh, slurm, openmpi" -- "$DSC" launch --launcher rsh true
expect 2 "--num_nodes 2 needs a hostfile" -- "$DSC" launch --num_nodes 2 true
expect 2 "missing PROGRAM" -- "$DSC" launch --num_procs 2
expect 2 "expected a whole number" -- "$DSC" launch --num_procs zero true
expect 0 "usage: dsc launch" -- "$DSC" launch --help
# flags after PROGRAM belong to the program
expect 0 "[rank 0] --num_procs 7" -- "$DSC" launch --no_local_rank echo --num_procs 7
expect 0 "[rank 1] -x" -- "$DSC" launch --num_procs 2 --no_local_rank -- echo -x

# Thread counts: several ranks on a host share its cores (cores / local ranks each), unless the
# user set them; the launcher says so once.
CORES=$(nproc)
threads_ok() { # N FILE: every rank of N shows OMP=OPENBLAS=max(1, CORES/N)
  local n=$1 f=$2 want=$((CORES / $1 > 0 ? CORES / $1 : 1))
  [ "$(grep -cx "\[rank [0-9]*\] O=$want B=$want" "$f")" -eq "$n" ] || { cat "$f"; return 1; }
}
for n in 2 4; do
  env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "$DSC" launch --num_procs $n --no_local_rank \
    sh -c 'echo O=$OMP_NUM_THREADS B=$OPENBLAS_NUM_THREADS' > "$T/thr$n" 2> "$T/thr$n.err"
  check "$n ranks: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS = cores / $n" -- threads_ok $n "$T/thr$n"
  check "$n ranks: said once" -- test "$(grep -c 'for each of the '$n' local ranks' "$T/thr$n.err")" -eq 1
done
env -u OPENBLAS_NUM_THREADS OMP_NUM_THREADS=3 "$DSC" launch --num_procs 2 --no_local_rank \
  sh -c 'echo O=$OMP_NUM_THREADS B=${OPENBLAS_NUM_THREADS-unset}' > "$T/thru" 2> "$T/thru.err"
check "a user's OMP_NUM_THREADS is kept (and OpenBLAS follows it)" -- \
  test "$(grep -cx '\[rank [01]\] O=3 B=unset' "$T/thru")" -eq 2
check "nothing said when the user chose" -- bash -c "! grep -q 'local ranks' '$T/thru.err'"
env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "$DSC" launch --num_procs 1 --no_local_rank \
  sh -c 'echo O=${OMP_NUM_THREADS-unset}' > "$T/thr1" 2>&1
check "one rank: every core, nothing set" -- grep -qx '\[rank 0\] O=unset' "$T/thr1"

check "no process of this test is left" -- no_leftovers
finish
