#!/usr/bin/env bash
# Fault tolerance under `dsc launch`: the launcher follows the training config's
# fault_tolerance.on_failure. degrade (the default): a rank SIGKILLed mid-run is reported and the
# survivors are left running; they finish with the weights of a 3-rank run that continued from
# the restored step, and the launcher exits 0. A rank that stops itself (SIGSTOP) is left behind
# by the survivors and killed by the launcher once they have exited. restart: the survivors save
# an emergency checkpoint and exit 75, the launcher restarts the group (--max_restarts), which
# resumes from it and ends bitwise where the fault-free run ends. abort: the group is torn down.
set -u
. "$(dirname "$0")/lib.sh"
STEPS=16

# launch_run NAME CONFIG [VAR=value ...]: 4 ranks of `dsc train` under dsc launch (limit 120 s);
# launcher output in NAME/out and NAME/err, rank logs NAME/rankN.log, exit code in LRC. LFLAGS
# (an array) are more launcher flags, WRAP (an array) a command the program runs under.
LFLAGS=()
WRAP=()
launch_run() {
  local name=$1 cfg=$2 d="$T/$1"
  shift 2
  rm -rf "$d" && mkdir -p "$d"
  env "$@" timeout -s KILL 120 "$DSC" launch --num_procs 4 --no_local_rank \
    --master_port "$(free_port)" --log_dir "$d" "${LFLAGS[@]}" "${WRAP[@]}" "$DSC" train \
    --config "$cfg" --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 --eval-every 0 \
    --eval-batches 2 --max-steps $STEPS --out "$d" --dump-weights "$d/w.safetensors" \
    "${FLAGS[@]}" > "$d/out" 2> "$d/err"
  LRC=$?
}
restored() { grep -ho "from the state after step [0-9]*" "$T/$1"/rank*.log | head -1 | awk '{print $NF}'; }

config "$T/z2.json" 2

# ---- degrade: SIGKILL of rank 2 in step 6 ----
launch_run kill "$T/z2.json" DSC_FT_INJECT=2:6:backward
check "kill: launcher exits 0 (got $LRC)" -- test $LRC -eq 0
[ $LRC -eq 0 ] || tail -5 "$T/kill/err"
check "kill: the death is reported, the survivors left running" -- grep -qE \
  "^dsc launch: rank 2 \(pid [0-9]+\) was killed by signal 9; the other 3 ranks keep running \(fault_tolerance.on_failure is degrade \(default\)\)$" \
  "$T/kill/err"
check "kill: summary" -- \
  grep -qx "dsc launch: 3 of 4 ranks finished; lost: rank 2 (was killed by signal 9)" "$T/kill/err"
b=$(restored kill)
echo "kill: restored step $b"
check "kill: restored a step boundary before the kill (got '$b')" -- test "${b:-0}" -ge 4 -a "${b:-0}" -le 5
check "kill: final weights == 3 ranks continuing from step $b" -- \
  same_weights "$T/kill/w.safetensors" "$(ref_weights 2 "${b:-0}" $STEPS)" 0

# ---- degrade: rank 1 stops itself (hung); the survivors go on, the launcher ends it ----
launch_run stop "$T/z2.json" DSC_FT_INJECT=1:5:forward:stop
check "stop: launcher exits 0 (got $LRC)" -- test $LRC -eq 0
check "stop: the stopped rank is killed after the others exited" -- grep -qE \
  "^dsc launch: rank 1 \(pid [0-9]+\) was stopped \(SIGSTOP\) when every other rank had exited; killed it" \
  "$T/stop/err"
b=$(restored stop)
check "stop: final weights == 3 ranks continuing from step $b" -- \
  same_weights "$T/stop/w.safetensors" "$(ref_weights 2 "${b:-0}" $STEPS)" 0

# ---- restart: emergency checkpoint, exit 75, restarted by the launcher, resumed ----
config "$T/zr.json" 2 ', "on_failure": "restart"' ', "checkpoint": {"interval_steps": 4}'
FLAGS=(--save-dir "$T/ck" --resume)
LFLAGS=(--max_restarts 1)
WRAP=(sh -c '[ "$DSC_RESTART_COUNT" = 0 ] || unset DSC_FT_INJECT; exec "$@"' sh) # kill once
launch_run rs "$T/zr.json" DSC_FT_INJECT=2:6:reduce
FLAGS=()
LFLAGS=()
WRAP=()
check "restart: launcher exits 0 after one restart (got $LRC)" -- test $LRC -eq 0
check "restart: survivors asked for a restart" -- \
  grep -qE "^dsc launch: rank [0-9] \(pid [0-9]+\) asked for a restart \(exit code 75\)" "$T/rs/err"
check "restart: emergency checkpoint saved" -- grep -q "saved an emergency checkpoint" "$T/rs/rank0.log"
check "restart: the group was restarted" -- grep -qx "dsc launch: restart 1 of 1" "$T/rs/err"
check "restart: resumed from the checkpoint" -- grep -q "resumed from checkpoint" "$T/rs/rank0.log"
check "restart: weights == the fault-free run, bit for bit" -- \
  same_weights "$T/rs/w.safetensors" "$T/full2/w.safetensors" 0

# ---- abort: torn down at once, with the killed rank's code ----
config "$T/za.json" 2 ', "on_failure": "abort"'
t0=$SECONDS
launch_run ab "$T/za.json" DSC_FT_INJECT=3:5:optimizer
check "abort: launcher exits 137 within 10 s (got $LRC after $((SECONDS - t0)) s)" -- \
  test $LRC -eq 137 -a $((SECONDS - t0)) -lt 10
check "abort: the others were stopped" -- \
  grep -qE "^dsc launch: rank 3 \(pid [0-9]+\) was killed by signal 9; stopped the other 3 ranks$" "$T/ab/err"
[ $LRC -eq 137 ] || { tail -5 "$T/ab/err"; tail -n 3 "$T/ab"/rank*.log; }

# ---- --on_failure overrides the config; a bad value is a usage error ----
LFLAGS=(--on_failure abort)
launch_run ov "$T/z2.json" DSC_FT_INJECT=1:4:forward
LFLAGS=()
check "--on_failure abort over a degrade config: torn down (got $LRC)" -- test $LRC -eq 137
expect 2 "--on_failure 'later' is not one of degrade, restart, abort" -- \
  "$DSC" launch --on_failure later --num_procs 2 true
finish
