#!/usr/bin/env bash
# gpu_scaling.sh - data-parallel scaling of `dsc train --device cuda` over nccl: tokens/s of each
# MODEL at 1, 2, 4 and 8 GPUs (as many as are visible) at ZeRO stages 1, 2 and 3, one process per
# GPU through `dsc launch --num_gpus N`, the micro-batch per GPU fixed (the global batch grows with
# the GPUs, as DeepSpeed's throughput figures do). Prints, per model and stage, the tokens/s at
# each world size, the efficiency of each doubling (tokens/s at 2N over twice that at N; the goal
# at stages 1 and 2 is >= 0.90) and stage 3's tokens/s relative to stage 2 at the same world.
#
#   bench/gpu_scaling.sh [DSC_BINARY]
#
# MODELS (default "gpt2-350M gpt2-1558M"), B (micro-batch per GPU, default 8), STAGES ("1 2 3"),
# WORLDS (default: 1 2 4 8 up to the visible GPUs), STEPS (12), WARMUP (4). T 1024, random tokens
# (bench/lib_data.sh), bf16, AdamW, clipping 1.0, gradients reduced in bf16 (the training dtype,
# DeepSpeed's default). NCCL_NVLS_ENABLE=0.
set -eu
DSC=${1:-${DSC:-build/dsc}}
PY=${PYTHON:-python3}
MODELS=${MODELS:-gpt2-350M gpt2-1558M}
B=${B:-8}
STAGES=${STAGES:-1 2 3}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-4}
[ -x "$DSC" ] || { echo "gpu_scaling.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
NGPU=$("$DSC" report | sed -n 's/^CUDA devices *\([0-9]*\).*/\1/p')
[ "${NGPU:-0}" -ge 1 ] || { echo "gpu_scaling.sh: no CUDA device is visible" >&2; exit 2; }
if [ -z "${WORLDS:-}" ]; then
    WORLDS=""
    for n in 1 2 4 8; do [ "$n" -le "$NGPU" ] && WORLDS="$WORLDS $n"; done
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/lib_data.sh" # random_shards
random_shards "$W/data" 8000000 200000
export NCCL_NVLS_ENABLE=0 DSC_COMM_BACKEND=nccl

run() { # run MODEL STAGE N: the run's metrics in $W/MODEL-sSTAGE-wN/metrics.jsonl
    local name="$1-s$2-w$3"
    cat >"$W/$name.json" <<JSON
{"train_micro_batch_size_per_gpu": $B, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "zero_optimization": {"stage": $2}}
JSON
    "$DSC" launch --num_gpus "$3" "$DSC" train --device cuda --config "$W/$name.json" \
        --model "$1" --seq-len 1024 --data "$W/data" --max-steps "$STEPS" --eval-every 0 \
        --eval-batches 1 --sample-tokens 0 --out "$W/$name" >"$W/$name.log" 2>&1 ||
        { echo "gpu_scaling.sh: $name failed:" >&2; tail -8 "$W/$name.log" >&2; exit 1; }
}
for m in $MODELS; do
    for st in $STAGES; do
        for n in $WORLDS; do run "$m" "$st" "$n"; done
    done
done
grep -m1 "device " "$W"/*.log | head -1 | sed 's/^[^|]*| /  /' || true
$PY - "$W" "$WARMUP" "$B" "$MODELS" "$STAGES" "$WORLDS" <<'PYEOF'
import json, os, statistics, sys
w, warm, b = sys.argv[1], int(sys.argv[2]), sys.argv[3]
models, stages, worlds = sys.argv[4].split(), sys.argv[5].split(), [int(x) for x in sys.argv[6].split()]
def tps(m, st, n):
    p = f"{w}/{m}-s{st}-w{n}/metrics.jsonl"
    rows = [json.loads(l) for l in open(p)][warm:]
    return statistics.median(r["tokens_per_s"] for r in rows)
head = " | ".join(f"{n} GPU{'s' if n > 1 else ''}" for n in worlds)
print(f"\nmicro-batch {b} per GPU, T 1024, tokens/s (efficiency of the doubling)\n")
print(f"| model | stage | {head} | stage 3 / stage 2 |")
print("|---|---|" + "---|" * len(worlds) + "---|")
worst = {}
for m in models:
    t = {(st, n): tps(m, st, n) for st in stages for n in worlds}
    for st in stages:
        cells = []
        for n in worlds:
            c = f"{t[st, n] / 1e3:.1f}k"
            if n // 2 in worlds and n > 1:
                eff = t[st, n] / (2 * t[st, n // 2])
                c += f" ({eff:.2f})"
                if st in ("1", "2"):
                    worst[m] = min(worst.get(m, 9), eff)
            cells.append(c)
        rel = ""
        if st == "3" and "2" in stages:
            rel = ", ".join(f"{t['3', n] / t['2', n]:.2f}x at {n}" for n in worlds)
        print(f"| {m} | {st} | " + " | ".join(cells) + f" | {rel} |")
for m, e in worst.items():
    print(f"{m}: worst doubling at stages 1-2: {e:.2f} (goal >= 0.90)")
PYEOF
