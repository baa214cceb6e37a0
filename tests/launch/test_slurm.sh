#!/usr/bin/env bash
# dsc launch --launcher slurm against a real single-node SLURM that this test starts
# (scripts/start-slurm.sh: slurmctld + slurmd on loopback): 2- and 4-task jobs under salloc
# (dsc launch runs srun) and through sbatch, with RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* mapped
# from SLURM's variables; a failing task's exit code comes back.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
: "${DSC_SOURCE_DIR:?set DSC_SOURCE_DIR to the source tree}"
MARK="dsclaunchslurm$$x$RANDOM"
SLURM_DIR="$T/slurm"
cleanup() {
  if [ -f "$SLURM_DIR/slurm.conf" ]; then
    # Let the jobs' step daemons finish first; then stop the cluster.
    SLURM_CONF="$SLURM_DIR/slurm.conf" scancel --user "$(id -un)" > /dev/null 2>&1
    for _ in $(seq 50); do
      [ -z "$(SLURM_CONF="$SLURM_DIR/slurm.conf" squeue -h 2>/dev/null)" ] && break
      sleep 0.2
    done
    "$DSC_SOURCE_DIR/scripts/start-slurm.sh" --stop "$SLURM_DIR"
  fi
  pkill -9 -f "$MARK" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
no_leftovers() { ! pgrep -f "$MARK" > /dev/null; }

out=$("$DSC_SOURCE_DIR/scripts/start-slurm.sh" "$SLURM_DIR" 2>&1)
rc=$?
if [ $rc -ne 0 ]; then
  echo "$out" | tail -5
  [ $rc -eq 77 ] && exit 77
  echo "SKIP: SLURM could not be started here (start-slurm.sh exit $rc)"
  exit 77
fi
export SLURM_CONF="$SLURM_DIR/slurm.conf"
NODE=$(hostname -s)
cd "$T" || exit 1
PORT=$((41000 + $$ % 5000))

cat > "$T/env.sh" <<'EOF'
#!/bin/sh
echo "R=$RANK W=$WORLD_SIZE L=$LOCAL_RANK LW=$LOCAL_WORLD_SIZE M=$MASTER_ADDR:$MASTER_PORT" \
  "PROCID=$SLURM_PROCID ARGS=$*"
EOF
chmod +x "$T/env.sh"
check_ranks() { # check_ranks N FILE
  local n=$1 f=$2 r
  if [ "$(grep -c '^\[rank [0-9]*\] R=' "$f")" -ne "$n" ]; then
    echo "want $n rank lines:"; cat "$f"; return 1
  fi
  for ((r = 0; r < n; r++)); do
    local want="[rank $r] R=$r W=$n L=$r LW=$n M=$NODE:$PORT PROCID=$r ARGS=$MARK --local_rank=$r"
    grep -qxF "$want" "$f" || { echo "missing: $want"; cat "$f"; return 1; }
  done
}

# ---- salloc: dsc launch runs srun inside the allocation ----
for n in 2 4; do
  timeout 60 salloc -n $n "$DSC" launch --launcher slurm --master_port $PORT --log_dir "$T/logs$n" \
    "$T/env.sh" "$MARK" > "$T/out$n" 2> "$T/err$n"
  rc=$?
  check "srun, $n tasks: exit 0 (got $rc)" -- test $rc -eq 0
  [ $rc -eq 0 ] || cat "$T/err$n"
  check "srun, $n tasks: environment of every rank" -- check_ranks $n "$T/out$n"
  check "srun, $n tasks: per-rank log" -- grep -q "^R=$((n - 1)) " "$T/logs$n/rank$((n - 1)).log"
done
# fewer ranks than the allocation has tasks
timeout 60 salloc -n 4 "$DSC" launch --launcher slurm --num_procs 2 --master_port $PORT \
  "$T/env.sh" "$MARK" > "$T/outp" 2>&1
check "srun --num_procs 2 inside a 4-task allocation" -- check_ranks 2 "$T/outp"

# ---- sbatch: the batch script calls dsc launch; both jobs wait in parallel ----
cat > "$T/job.sh" <<EOF
#!/bin/sh
exec "$DSC" launch --launcher slurm --master_port $PORT "$T/env.sh" "$MARK"
EOF
chmod +x "$T/job.sh"
for n in 2 4; do
  timeout 90 sbatch --wait -n $n -o "$T/job$n.out" "$T/job.sh" > "$T/sb$n" 2>&1 &
  eval "SB$n=\$!"
done
wait $SB2
rc2=$?
wait $SB4
rc4=$?
for n in 2 4; do
  eval "rc=\$rc$n"
  check "sbatch, $n tasks: job succeeded (got $rc)" -- test $rc -eq 0
  [ $rc -eq 0 ] || { cat "$T/sb$n"; cat "$T/job$n.out"; }
  check "sbatch, $n tasks: environment of every rank" -- check_ranks $n "$T/job$n.out"
done

# ---- a failing task: srun stops the step; its exit code and rank come back ----
timeout 60 salloc -n 4 "$DSC" launch --launcher slurm --no_local_rank sh -c \
  'if [ $RANK = 2 ]; then sleep 0.3; exit 3; fi; sleep 30' "$MARK" > "$T/outf" 2> "$T/errf"
rc=$?
check "srun failure: exit code 3 (got $rc)" -- test $rc -eq 3
check "srun failure: reason names rank 2" -- \
  grep -qF 'dsc launch: rank 2 exited with code 3 (reported by srun)' "$T/errf"
for _ in $(seq 60); do no_leftovers && break; sleep 0.1; done
check "srun failure: no task left" -- no_leftovers

# ---- outside an allocation: a clear error ----
expect 2 "SLURM_JOB_ID is not set" -- env -u SLURM_JOB_ID "$DSC" launch --launcher slurm true
finish
