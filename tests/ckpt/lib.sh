# Shared helpers of the checkpoint tests: data, configs, starting ranks by hand (torch-style
# variables, shm backend), waiting with a deadline, exports and metrics.
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=/usr/bin/python3
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1
"$DSC" data default --out "$T/data" >/dev/null

# config FILE STAGE [extra json] [checkpoint section]: 12 samples per step, so that 1, 2, 3 and 4
# ranks all divide the global batch (micro batch 1); no periodic saves unless asked for.
config() {
  cat > "$1" <<JSON
{"train_batch_size": 12, "train_micro_batch_size_per_gpu": 1, "steps_per_print": 1000,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $2},
 "checkpoint": {${4:-"interval_s": 0}} $3}
JSON
}

# start NAME WORLD CONFIG [flags...]: start WORLD ranks in the background; their pids in PIDS.
start() {
  local name=$1 world=$2 cfg=$3 r
  shift 3
  local port=$(free_port)
  PIDS=()
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port "$DSC" train --config "$cfg" --data "$T/data" --model d2 --seq-len 32 \
      --sample-tokens 0 --eval-every 0 --eval-batches 2 --out "$T/$name" "$@" \
      > "$T/$name.$r.log" 2>&1 &
    PIDS+=($!)
  done
}

# finish_ranks NAME [SECONDS]: wait for PIDS (killing them past the deadline); 0 if all exited 0.
finish_ranks() {
  local name=$1 limit=${2:-300} p rc=0 t0=$SECONDS
  for p in "${PIDS[@]}"; do
    while kill -0 "$p" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.05; done
    # only one still running at the limit: an ended rank's pid may be another process's by now
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
    wait "$p" || rc=1
  done
  [ $rc -eq 0 ] || { echo "run $name failed:"; tail -n 5 "$T/$name".*.log; }
  return $rc
}

# run NAME WORLD CONFIG [flags...]: start and wait.
run() { start "$@" && finish_ranks "$1"; }

# export_latest DIR FILE: the latest checkpoint of DIR as one fp32 safetensors file.
export_latest() { "$DSC" ckpt export "$1" --out "$2" >/dev/null; }

# the training record of each step that must agree bit for bit: everything but timing
cols() { $PY -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r['step'] > int(sys.argv[2]):
        print(r['step'], repr(r['loss']), repr(r['lr']), repr(r['grad_norm']), r['loss_scale'], r['skipped'])
" "$1" "${2:-0}"; }
