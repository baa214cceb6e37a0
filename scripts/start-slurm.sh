#!/usr/bin/env bash
# Start a throw-away single-node SLURM cluster on loopback, for tests and for trying `dsc launch
# --launcher slurm` on one machine.
#
#   scripts/start-slurm.sh DIR     write DIR/slurm.conf, start slurmctld + slurmd, wait until the
#                                  node is idle; prints SLURM_CONF=DIR/slurm.conf on success
#   scripts/start-slurm.sh --stop DIR    stop the daemons started for DIR
#
# Clients (srun, sbatch, salloc, sinfo) find the cluster through SLURM_CONF=DIR/slurm.conf.
# Installs the Debian packages (slurmctld, slurmd, slurm-client) with apt-get when they are missing
# and we are root. Authentication is auth/none, so no munge daemon is needed. Exits 77 with a line
# starting "SKIP:" when SLURM cannot be set up here.
set -u

skip() { echo "SKIP: $*"; exit 77; }

# A process still running (gone and zombie both count as stopped: an orphaned zombie may wait
# long for init to reap it).
running() {
  [ -r "/proc/$1/stat" ] && ! awk '{ exit ($3 == "Z") ? 0 : 1 }' "/proc/$1/stat" 2>/dev/null
}

# slurmstepd processes of this cluster: they carry our SLURM_CONF in their environment.
stepds() {
  local p
  for p in $(pgrep -x slurmstepd 2>/dev/null); do
    { tr '\0' '\n' < "/proc/$p/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$1/slurm.conf" &&
      echo "$p"
  done
}

stop() {
  local dir=$1 f pid pids=""
  for f in "$dir/slurmd.pid" "$dir/slurmctld.pid"; do
    [ -f "$f" ] && pid=$(cat "$f" 2>/dev/null) && [ -n "$pid" ] && pids="$pids $pid"
  done
  pids="$pids $(stepds "$dir")"
  for pid in $pids; do kill "$pid" 2>/dev/null; done
  for _ in $(seq 100); do
    local alive=0
    for pid in $pids; do running "$pid" && alive=1; done
    [ $alive -eq 0 ] && return 0
    sleep 0.1
  done
  for pid in $pids; do kill -9 "$pid" 2>/dev/null; done
  return 0
}

if [ "${1:-}" = "--stop" ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 --stop DIR" >&2; exit 2; }
  stop "$2"
  exit 0
fi
DIR=${1:-}
[ -n "$DIR" ] || { echo "usage: $0 DIR | --stop DIR" >&2; exit 2; }
mkdir -p "$DIR" || skip "cannot create $DIR"
DIR=$(cd "$DIR" && pwd)

# ---- the packages ----
have() { command -v "$1" > /dev/null; }
if ! have slurmctld || ! have slurmd || ! have srun || ! have sbatch; then
  [ "$(id -u)" -eq 0 ] || skip "SLURM is not installed and we are not root to install it"
  command -v apt-get >/dev/null || skip "SLURM is not installed and there is no apt-get"
  echo "installing SLURM (slurmctld slurmd slurm-client) with apt-get"
  # A policy-rc.d that forbids starting services keeps the packages' own daemons (with the
  # system-wide config) from starting; ours use DIR/slurm.conf.
  made_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d &&
      made_policy=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    slurmctld slurmd slurm-client > "$DIR/apt.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    apt-get update > /dev/null 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      slurmctld slurmd slurm-client >> "$DIR/apt.log" 2>&1
    rc=$?
  fi
  [ $made_policy -eq 1 ] && rm -f /usr/sbin/policy-rc.d
  [ $rc -eq 0 ] || skip "apt-get install slurmctld slurmd slurm-client failed (see $DIR/apt.log)"
fi

# ---- the configuration ----
HOST=$(hostname -s)
[ -n "$HOST" ] || skip "hostname -s is empty"
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
PORT=16817
while ! port_free $PORT || ! port_free $((PORT + 1)); do
  PORT=$((PORT + 2))
  [ $PORT -lt 16917 ] || skip "no free pair of ports in 16817..16917 on 127.0.0.1"
done
USER_NAME=$(id -un)
mkdir -p "$DIR/state" "$DIR/spool" "$DIR/log"
CPUS=${DSC_SLURM_CPUS:-8}
cat > "$DIR/slurm.conf" <<EOF
# single-node test cluster written by start-slurm.sh
ClusterName=dsctest
SlurmctldHost=$HOST(127.0.0.1)
AuthType=auth/none
CredType=cred/none
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF=$DIR/slurm.conf

# ---- the daemons ----
# -D keeps them in the foreground of a background job so that the pid files name them; their
# output goes to the log folder.
slurmctld -D -f "$SLURM_CONF" > "$DIR/log/slurmctld.out" 2>&1 &
echo $! > "$DIR/slurmctld.pid"
slurmd -D -f "$SLURM_CONF" -N "$HOST" > "$DIR/log/slurmd.out" 2>&1 &
echo $! > "$DIR/slurmd.pid"

for _ in $(seq 150); do
  state=$(sinfo -h -o %T 2>/dev/null | head -1)
  case "$state" in
    idle*) echo "SLURM_CONF=$SLURM_CONF"; exit 0 ;;
  esac
  for f in slurmctld slurmd; do
    if ! kill -0 "$(cat "$DIR/$f.pid")" 2>/dev/null; then
      tail -5 "$DIR/log/$f.out" "$DIR/log/$f.log" 2>/dev/null
      stop "$DIR"
      skip "$f did not stay up (logs in $DIR/log)"
    fi
  done
  sleep 0.2
done
stop "$DIR"
skip "the node did not become idle within 30 s (state '${state:-none}'; logs in $DIR/log)"
