#!/usr/bin/env bash
# dsc train with the engine's pool compacted between steps: the run continues bit for bit as one
# without compaction (the trainer and the model re-read every moved address).
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1
small=(--model d2 --seq-len 32 --sample-tokens 0 --eval-every 0 --max-steps 6)
cfg() { # cfg FILE MEMORY-SECTION: ZeRO-3, gradient accumulation, AdamW
  cat > "$1" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": 3} $2}
JSON
}
cfg "$T/plain.json" ""
cfg "$T/defrag.json" ', "memory": {"defrag_interval_s": 0, "defrag_threshold": 0}'

expect 0 "train loss" -- "$DSC" train "${small[@]}" --config "$T/plain.json" --out "$T/plain"
# Interval 0, threshold 0: every boundary that finds a hole compacts. One rank leaves none (the
# initialiser writes the master in place), so nothing moves and the run is the same.
check "one rank with compaction on trains" -- bash -c "DSC_LOG=info '$DSC' train ${small[*]} \
  --config '$T/defrag.json' --out '$T/defrag' > '$T/defrag.log' 2>&1"
check "one rank: no hole, nothing compacted" -- bash -c "grep -q 'train loss' '$T/defrag.log' &&
  ! grep -q 'compacted engine host pool' '$T/defrag.log'"
check "same losses, norms and learning rates with compaction as without" -- \
  bash -c "diff <(cut -d, -f1-4 '$T/plain/metrics.jsonl') <(cut -d, -f1-4 '$T/defrag/metrics.jsonl')"
check "6 steps logged" -- test "$(wc -l < "$T/defrag/metrics.jsonl")" -eq 6

# Two ranks (shm): the freed staging of the initial weights lies below the model's activations,
# so the first compaction moves them; the fault-tolerance snapshots and replicas move too,
# between the ring's exchanges.
run2() { # run2 NAME CONFIG
  local port pids=() r rc=0
  port=$(free_port)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      DSC_LOG=info OMP_NUM_THREADS=1 timeout 300 "$DSC" train "${small[@]}" --config "$2" \
      --out "$T/$1" > "$T/$1.$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] || { echo "run $1 failed:"; tail -5 "$T/$1".*.log; }
  return $rc
}
check "two ranks without compaction" -- run2 plain2 "$T/plain.json"
check "two ranks with compaction" -- run2 defrag2 "$T/defrag.json"
check "both ranks compacted" -- bash -c "grep -q 'compacted engine host pool' '$T/defrag2.0.log' &&
  grep -q 'compacted engine host pool' '$T/defrag2.1.log'"
check "two ranks: same losses with compaction as without" -- \
  bash -c "diff <(cut -d, -f1-4 '$T/plain2/metrics.jsonl') <(cut -d, -f1-4 '$T/defrag2/metrics.jsonl')"
finish
