#!/usr/bin/env bash
# gpu_ranks.sh - throughput of `dsc train --device cuda` with several ranks sharing one GPU
# (host-staged: GPU forward/backward per rank, ZeRO reduction and CPU optimizer on the host)
# against one rank on the same GPU, at the same global batch.
#
#   bench/gpu_ranks.sh [DSC_BINARY] [MODEL]
#
# MODEL defaults to gpt2-124M; T 1024, global batch 16 sequences, random tokens (V 50257), bf16,
# AdamW, clipping 1.0. Rows: one rank with the GPU optimizer, one rank with ZeRO-Offload, two
# ranks at stages 0 and 2 (micro batch 8 each). Tokens/s: median over the steps after $WARMUP
# (default 4) of $STEPS (default 12), from rank 0's metrics.jsonl (whole steps). Each rank gets
# nproc / ranks OpenMP threads.
set -eu
DSC=${1:-${DSC:-build/dsc}}
MODEL=${2:-gpt2-124M}
PY=${PYTHON:-python3}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-4}
[ -x "$DSC" ] || { echo "gpu_ranks.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

. "$(dirname "$0")/lib_data.sh" # random_shards, free_port
random_shards "$W/data" 1000000 50000


bench() { # bench NAME WORLD STAGE OFFLOAD
    local name=$1 world=$2 p pids=() r rc=0 threads
    threads=$(($(nproc) / world))
    cat >"$W/$name.json" <<JSON
{"train_batch_size": 16, "train_micro_batch_size_per_gpu": $((16 / world)), "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.999], "weight_decay": 0.1}},
 "zero_optimization": {"stage": $3, "offload_optimizer": {"device": "$4"}}}
JSON
    p=$(free_port)
    for ((r = 0; r < world; r++)); do
        RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$p OMP_NUM_THREADS=$threads "$DSC" train --device cuda \
            --config "$W/$name.json" --model "$MODEL" --seq-len 1024 --data "$W/data" \
            --max-steps "$STEPS" --eval-every 0 --eval-batches 1 --sample-tokens 0 \
            --out "$W/$name" >"$W/$name.$r.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    [ $rc -eq 0 ] || { echo "gpu_ranks.sh: run $name failed:" >&2; tail -5 "$W/$name".*.log >&2; exit 1; }
    grep -m1 "^run dir" "$W/$name.0.log" | sed 's/^run dir [^|]*| /  /'
    $PY - "$W/$name/metrics.jsonl" "$name" "$WARMUP" <<'PYEOF'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[3]):]
tok = statistics.median(x["tokens_per_s"] for x in m)
print(f"{sys.argv[2]:<24} {tok / 1e3:8.1f}k tokens/s  step {16 * 1024 / tok * 1e3:7.1f} ms  "
      f"loss {m[0]['loss']:.4f} -> {m[-1]['loss']:.4f}")
PYEOF
}
echo "model $MODEL, T 1024, global batch 16, $(nproc) CPU cores"
bench "w1-gpu-optimizer" 1 0 none
bench "w1-offload-stage2" 1 2 cpu
bench "w2-staged-stage0" 2 0 none
bench "w2-staged-stage2" 2 2 none
