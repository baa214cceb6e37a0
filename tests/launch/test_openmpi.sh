#!/usr/bin/env bash
# dsc launch --launcher openmpi: mpirun starts 2 and 4 ranks; each gets RANK/WORLD_SIZE/LOCAL_RANK
# and MASTER_* (mapped from Open MPI's variables), the exported environment (-x), output lines
# relabelled "[rank N]", per-rank logs; a failing rank's exit code comes back.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
MARK="dsclaunchompi$$x$RANDOM"
cleanup() {
  pkill -9 -f "$MARK" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
no_leftovers() { ! pgrep -f "$MARK" > /dev/null; }

if ! command -v mpirun > /dev/null; then
  if [ "$(id -u)" -eq 0 ] && command -v apt-get > /dev/null; then
    echo "installing Open MPI (openmpi-bin) with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openmpi-bin \
      > "$T/apt.log" 2>&1 || { apt-get update > /dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openmpi-bin \
        >> "$T/apt.log" 2>&1; }
  fi
  if ! command -v mpirun > /dev/null; then
    echo "SKIP: mpirun is not installed and could not be installed"
    exit 77
  fi
fi
if ! mpirun --version 2>&1 | grep -q "Open MPI"; then
  echo "SKIP: mpirun is not Open MPI's ($(mpirun --version 2>&1 | head -1))"
  exit 77
fi
cd "$T" || exit 1
PORT=$((31000 + $$ % 5000))

cat > "$T/env.sh" <<'EOF'
#!/bin/sh
echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE" \
  "M=$MASTER_ADDR:$MASTER_PORT X=$NCCL_TEST_VAR ARGS=$*"
EOF
chmod +x "$T/env.sh"

check_ranks() { # check_ranks N FILE
  local n=$1 f=$2 r
  if [ "$(grep -c '^\[rank [0-9]*\] R=' "$f")" -ne "$n" ]; then
    echo "want $n rank lines:"; cat "$f"; return 1
  fi
  for ((r = 0; r < n; r++)); do
    local want="[rank $r] R=$r W=$n L=$r LW=$n M=127.0.0.1:$PORT X=exported"
    want="$want ARGS=$MARK --local_rank=$r"
    grep -qxF "$want" "$f" || { echo "missing: $want"; cat "$f"; return 1; }
  done
}

for n in 2 4; do
  NCCL_TEST_VAR=exported "$DSC" launch --launcher openmpi --num_procs $n --master_port $PORT \
    --log_dir "$T/logs$n" "$T/env.sh" "$MARK" > "$T/out$n" 2> "$T/err$n"
  rc=$?
  check "mpirun, $n ranks: exit 0 (got $rc)" -- test $rc -eq 0
  [ $rc -eq 0 ] || cat "$T/err$n"
  check "mpirun, $n ranks: environment of every rank" -- check_ranks $n "$T/out$n"
  last=$((n - 1))
  check "mpirun, $n ranks: rank $last log" -- grep -q "^R=$last " "$T/logs$n/rank$last.log"
done

# a failing rank: mpirun stops the job and its exit code comes back
"$DSC" launch --launcher openmpi --num_procs 4 --no_local_rank sh -c \
  'if [ $RANK = 2 ]; then sleep 0.3; exit 3; fi; sleep 30' "$MARK" > "$T/outf" 2> "$T/errf"
rc=$?
check "mpirun: failing rank's exit code 3 propagated (got $rc)" -- test $rc -eq 3
check "mpirun: reason printed" -- \
  grep -q '^dsc launch: mpirun (pid [0-9]*) exited with code 3' "$T/errf"
for _ in $(seq 40); do no_leftovers && break; sleep 0.1; done
check "mpirun: no orphans" -- no_leftovers

# thread counts as the local launcher sets them: at most each task's share of the cores, >= 1
env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "$DSC" launch --launcher openmpi --num_procs 2 \
  --no_local_rank sh -c 'echo O=$OMP_NUM_THREADS B=$OPENBLAS_NUM_THREADS' "$MARK" > "$T/thr" 2>&1
share=$(($(nproc) / 2 > 0 ? $(nproc) / 2 : 1))
threads_ok() {
  [ "$(grep -c '^\[rank [01]\] O=[1-9][0-9]* B=[1-9][0-9]*$' "$T/thr")" -eq 2 ] || { cat "$T/thr"; return 1; }
  local o
  for o in $(sed -n 's/^\[rank [01]\] O=\([0-9]*\) .*/\1/p' "$T/thr"); do [ "$o" -le "$share" ] || return 1; done
}
check "mpirun: OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set for 2 tasks (<= $share each)" -- threads_ok
check "mpirun: said once" -- test "$(grep -c 'for each of the 2 local ranks' "$T/thr")" -eq 1

# --launcher_args reach mpirun
expect 0 "[rank 1] ok" -- "$DSC" launch --launcher openmpi --num_procs 2 --no_local_rank \
  --launcher_args "--mca btl self,vader" sh -c 'echo ok' "$MARK"
finish
