#!/usr/bin/env bash
# bench/gpu_zero3.sh [DSC] - ZeRO stage 3 on the GPU (DSC_COMM_BACKEND=nccl, stage 3's default
# DSC_GPU_STAGE3_PARTITION=1: the layers' 16-bit weights partitioned and gathered one layer ahead
# through two slots, their gradients reduce-scattered every micro-step) against stage 2 (whole 16-bit weights on every GPU, one
# reduction per step), on the same GPUs in the same call: tokens/s (median after WARMUP steps),
# the ratio, and the device pool's allocated bytes per rank.
#
# WORLD ranks (default 1: one GPU, where the gathers and reductions are one-rank copies, so the
# ratio is stage 3's own overhead: the extra kernels, events and the per-micro-step reductions),
# one GPU each; MODEL (gpt2-124M), B (micro-batch, 16), GAS (gradient accumulation, 1), STEPS
# (12), WARMUP (4). Random tokens (bench/lib_data.sh), T 1024, bf16, AdamW, clipping 1.0.
set -eu
DSC=${1:-${DSC:-build/dsc}}
PY=${PYTHON:-python3}
WORLD=${WORLD:-1}
MODEL=${MODEL:-gpt2-124M}
B=${B:-16}
GAS=${GAS:-1}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-4}
[ -x "$DSC" ] || { echo "gpu_zero3.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/lib_data.sh" # random_shards
random_shards "$W/data" 4000000 200000
export NCCL_NVLS_ENABLE=0

run() { # run STAGE: WORLD ranks, one per GPU; logs in $W/zSTAGE.RANK.log
    local st=$1 pids=() r rc=0
    cat >"$W/z$st.json" <<JSON
{"train_micro_batch_size_per_gpu": $B, "gradient_accumulation_steps": $GAS, "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.999], "weight_decay": 0.1}},
 "zero_optimization": {"stage": $st}}
JSON
    for ((r = 0; r < WORLD; r++)); do
        RANK=$r WORLD_SIZE=$WORLD LOCAL_RANK=$r LOCAL_WORLD_SIZE=$WORLD MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$((29700 + st)) DSC_COMM_BACKEND=nccl DSC_GPU_STAGE3_PARTITION=1 "$DSC" train --device cuda \
            --config "$W/z$st.json" --model "$MODEL" --seq-len 1024 --data "$W/data" \
            --max-steps "$STEPS" --eval-every 0 --eval-batches 1 --sample-tokens 0 \
            --out "$W/z$st" >"$W/z$st.$r.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    [ $rc -eq 0 ] || { echo "gpu_zero3.sh: stage $st failed:" >&2; tail -5 "$W/z$st".*.log >&2; exit 1; }
}
run 2
run 3
grep -m1 "^device" "$W/z3.0.log" || true
$PY - "$W" "$WARMUP" "$MODEL" "$B" "$GAS" "$WORLD" <<'PYEOF'
import json, statistics, sys
w, warm, model, b, gas, world = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
def stats(st):
    m = [json.loads(l) for l in open(f"{w}/z{st}/metrics.jsonl")]
    return statistics.median(x["tokens_per_s"] for x in m[warm:]), m[-1]["gpu_allocated"]
t2, a2 = stats(2)
t3, a3 = stats(3)
print(f"\n| model | B x GAS | GPUs | stage 2 tokens/s | stage 3 tokens/s | 3 / 2 | "
      f"pool allocated, stage 2 | stage 3 |")
print("|---|---|---|---|---|---|---|---|")
print(f"| {model} | {b} x {gas} | {world} | {t2 / 1e3:.1f}k | {t3 / 1e3:.1f}k | {t3 / t2:.3f}x | "
      f"{a2 / 2**30:.2f} GiB | {a3 / 2**30:.2f} GiB |")
PYEOF
