# Helpers of the fault tests: start ranks of `dsc train` by hand (torch-style variables), wait for
# them with a limit, read the fault-tolerance log lines, and build reference runs that continue
# from a saved state on fewer ranks (DSC_FT_SAVE_STATE / DSC_FT_LOAD_STATE). Every process is
# started here and ended by its pid; the test never hangs (each wait has a limit).
. "$(dirname "${BASH_SOURCE[0]}")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=/usr/bin/python3
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1
"$DSC" data default --out "$T/data" > /dev/null

PIDS=()  # pids of the ranks of the last start_ranks
CODES=() # their exit codes after wait_ranks (124: still running at the limit, then killed)
ALL_PIDS=() # "RC_FILE:PID" of every rank started: RC_FILE appears once that rank has ended
# At exit, ranks still running are killed: only those (a pid whose rank ended may have been given
# to another process since, e.g. another test's, where pids wrap at 32768).
cleanup_ranks() {
  local e p
  for e in "${ALL_PIDS[@]}"; do
    p=${e##*:}
    [ -e "${e%:*}" ] && continue
    kill -9 "$p" 2> /dev/null
    kill -CONT "$p" 2> /dev/null
  done
  rm -rf "$T"
}
trap cleanup_ranks EXIT

# config FILE STAGE [extra fault_tolerance json] [extra top-level json]; without the fourth,
# $CONFIG_EXTRA (e.g. a LoRA section for every run of a test, references included).
config() {
  cat > "$1" << JSON
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $2} ${4:-${CONFIG_EXTRA:-}},
 "fault_tolerance": {"comm_timeout_s": ${COMM_S:-2}, "step_timeout_s": ${STEP_S:-4} ${3:-}}}
JSON
}

# start_ranks NAME WORLD CONFIG STEPS [VAR=value ...]: ranks in the background; logs NAME/log.R,
# final weights NAME/w.safetensors. The variables go to every rank; FLAGS (an array) are more
# flags of `dsc train`; MODEL (default d2) the model. Each rank runs under a small
# subshell that records its pid and exit code (and keeps bash's notices of killed jobs quiet).
SUBS=()
FLAGS=()
start_ranks() {
  local name=$1 world=$2 cfg=$3 steps=$4 r d
  shift 4
  local port=$(free_port)
  d="$T/$name"
  local kept=() e
  for e in "${ALL_PIDS[@]}"; do [[ $e == "$d/"* ]] || kept+=("$e"); done # a run of the same name
  ALL_PIDS=("${kept[@]}")                                                 # ended: its entries go
  rm -rf "$d" && mkdir -p "$d"
  PIDS=()
  SUBS=()
  for ((r = 0; r < world; r++)); do
    (
      env "$@" RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
        "$DSC" train --config "$cfg" --data "$T/data" --model "${MODEL:-d2}" --seq-len 32 --sample-tokens 0 \
        --eval-every 0 --eval-batches 2 --max-steps "$steps" --out "$d" \
        --dump-weights "$d/w.safetensors" "${FLAGS[@]}" > "$d/log.$r" 2>&1 &
      echo $! > "$d/pid.$r"
      wait $!
      echo $? > "$d/rc.tmp.$r" && mv "$d/rc.tmp.$r" "$d/rc.$r"
    ) 2> /dev/null &
    SUBS+=($!)
  done
  for ((r = 0; r < world; r++)); do
    while [ ! -s "$d/pid.$r" ]; do sleep 0.01; done
    PIDS+=("$(cat "$d/pid.$r")")
    ALL_PIDS+=("$d/rc.$r:${PIDS[$r]}")
  done
  RUN_DIR=$d
}

stopped() { ps -o stat= -p "$1" 2> /dev/null | grep -q '^T'; }

# wait_ranks LIMIT_S [RANK...]: wait for the ranks (default all) of the last start_ranks; one
# still running at the limit, or stopped, is killed and gets code 124.
wait_ranks() {
  local deadline=$((SECONDS + $1)) r
  shift
  local ranks=("$@")
  [ ${#ranks[@]} -gt 0 ] || ranks=("${!PIDS[@]}")
  CODES=()
  for r in "${ranks[@]}"; do
    while [ ! -e "$RUN_DIR/rc.$r" ] && ! stopped "${PIDS[$r]}" && [ $SECONDS -lt $deadline ]; do
      sleep 0.05
    done
    if [ ! -e "$RUN_DIR/rc.$r" ]; then
      kill -9 "${PIDS[$r]}" 2> /dev/null
      kill -CONT "${PIDS[$r]}" 2> /dev/null
      wait "${SUBS[$r]}"
      CODES+=(124)
    else
      wait "${SUBS[$r]}"
      CODES+=("$(cat "$RUN_DIR/rc.$r")")
    fi
  done
}

# run_ranks NAME WORLD CONFIG STEPS [VAR=value ...]: start and wait (limit 120 s).
run_ranks() {
  start_ranks "$@"
  wait_ranks 120
}

# The first value of the fault-tolerance field of the survivors' logs of run NAME.
restored_step() { grep -ho "from the state after step [0-9]*" "$T/$1"/log.* | head -1 | awk '{print $NF}'; }
resumed_time() { grep -ho "resumed at step .* unix time [0-9.]*" "$T/$1"/log.* | awk '{print $NF}' | sort -n | head -1; }
injected_time() { grep -ho "fault injection: .* unix time [0-9.]*" "$T/$1"/log.* | awk '{print $NF}' | head -1; }
# seconds from a to b (floats) as an integer number of milliseconds
ms_between() { $PY -c "print(int(round((float('$2') - float('$1')) * 1000)))"; }

# Fault-free reference of STAGE on 4 ranks with the state of every step saved (once per stage).
ref_states() {
  local st=$1 steps=$2
  [ -d "$T/states$st" ] && return 0
  mkdir -p "$T/states$st"
  config "$T/ref$st.json" "$st"
  run_ranks "full$st" 4 "$T/ref$st.json" "$steps" DSC_FT_SAVE_STATE="$T/states$st"
  [ "${CODES[*]}" = "0 0 0 0" ] || { echo "reference run of stage $st failed"; tail -3 "$T/full$st"/log.*; return 1; }
}

# ref_weights STAGE B STEPS: the weights of a 3-rank run that continued from step B's state
# (cached); prints the path.
ref_weights() {
  local st=$1 b=$2 steps=$3 name="cont$1-$2"
  if [ ! -s "$T/$name/w.safetensors" ]; then
    ref_states "$st" "$steps" > /dev/null || return 1
    run_ranks "$name" 3 "$T/ref$st.json" "$steps" DSC_FT_LOAD_STATE="$T/states$st/step$b.safetensors" > /dev/null
  fi
  echo "$T/$name/w.safetensors"
}

# same_weights A B TOL: every tensor of A equals B's within TOL relative to B's largest value;
# and both ran the same number of steps.
ST_DIFF=$(cd "$(dirname "${BASH_SOURCE[0]}")/../cli" && pwd)/st_diff.py
same_weights() {
  $PY "$ST_DIFF" "$1" "$2" --rel-max "$3" --same-steps > /dev/null
}

# kill_in_backward LABEL STEPS: at ZeRO stages 1 and 3, SIGKILL rank 2 of 4 in the backward of
# step 5 (policy degrade): the survivors finish every step on 3 ranks and end with the weights of
# a reference that continued on 3 ranks from the restored step's state. extra_checks STAGE WHAT,
# when the test defines it, adds its own checks of run kill<STAGE>.
kill_in_backward() {
  local label=$1 steps=$2 st what b ref
  for st in 1 3; do
    config "$T/z$st.json" $st
    what="$label, stage $st, rank 2 killed in step 5 (backward)"
    run_ranks kill$st 4 "$T/z$st.json" "$steps" DSC_FT_INJECT=2:5:backward
    check "$what: survivors finish, victim killed (exit codes ${CODES[*]})" -- \
      test "${CODES[*]}" = "0 0 137 0"
    b=$(restored_step kill$st)
    check "$what: restored step $b (3 or 4)" -- test "${b:-0}" -ge 3 -a "${b:-0}" -le 4
    check "$what: every step ran" -- $PY - "$T/kill$st/metrics.jsonl" "$steps" << 'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = sorted({r["step"] for r in rows})
assert steps == list(range(1, int(sys.argv[2]) + 1)), steps
assert rows[-1].get("world_size") == 3 and rows[-1].get("fault_events") == 1, rows[-1]
PYEOF
    declare -F extra_checks > /dev/null && extra_checks $st "$what"
    ref=$(ref_weights $st "${b:-0}" "$steps")
    check "$what: final weights == 3 ranks continuing from step $b" -- \
      same_weights "$T/kill$st/w.safetensors" "$ref" 1e-6
  done
}
