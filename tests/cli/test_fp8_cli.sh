#!/usr/bin/env bash
# The fp8 section without a GPU: its keys are read and checked, the runs that cannot have FP8
# products are refused with the reason (the CPU passes, GPT-2's device passes, fp16, the delayed
# recipe, an unknown format), and the memory plan of a GPU run counts the products' FP8 scratch
# (the quantized operands of the largest product: for llama-3.1-8B at T 2048 a (2048, 28672)
# activation, its gradient's transpose and the (28672, 4096) gate|up weight, 235 MB). The GPU behaviour: tests/gpu.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-/usr/bin/python3}
base='"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 1}'
echo "{$base, \"bf16\": {\"enabled\": true}}" >"$T/bf16.json"
echo "{$base, \"bf16\": {\"enabled\": true}, \"fp8\": {\"enabled\": true}}" >"$T/fp8.json"
echo "{$base, \"bf16\": {\"enabled\": true}, \"fp8\": {\"enabled\": false}}" >"$T/off.json"
echo "{$base, \"fp16\": {\"enabled\": true}, \"fp8\": {\"enabled\": true}}" >"$T/fp16.json"
echo "{$base, \"fp8\": {\"enabled\": true, \"recipe\": \"delayed\"}}" >"$T/delayed.json"
echo "{$base, \"fp8\": {\"enabled\": true, \"fp8_format\": \"e5m2\"}}" >"$T/e5.json"
echo "{$base, \"fp8\": {\"enabled\": true, \"margin\": 64}}" >"$T/margin.json"
echo "{$base, \"fp8\": {\"enabled\": true, \"amax_history_len\": 16}}" >"$T/unknown.json"

expect 0 "fp8.fp8_format" -- "$DSC" config check "$T/fp8.json"
expect 1 "fp8.enabled: FP8 products run on a GPU" -- "$DSC" train --device cpu --config "$T/fp8.json" --model llama-d2 --seq-len 32 --max-steps 1 --sample-tokens 0 --out "$T/cpu"
expect 0 "" -- "$DSC" train --device cpu --config "$T/off.json" --model llama-d2 --seq-len 32 --max-steps 1 --sample-tokens 0 --eval-every 0 --out "$T/off"
expect 1 "fp8.enabled with fp16.enabled" -- "$DSC" config check "$T/fp16.json"
expect 1 "fp8.recipe \"delayed\"" -- "$DSC" config check "$T/delayed.json"
expect 1 "fp8.fp8_format" -- "$DSC" config check "$T/e5.json"
expect 1 "fp8.margin" -- "$DSC" config check "$T/margin.json"
expect 0 "fp8.amax_history_len" -- "$DSC" config check "$T/unknown.json"
expect 1 "the GPU passes of family gpt2 have no FP8 products" -- "$DSC" config check "$T/fp8.json" --model gpt2-124M --device cuda --seq-len 1024
for c in bf16 fp8; do
    "$DSC" config check "$T/$c.json" --model llama-3.1-8B --device cuda --seq-len 2048 --json >"$T/$c.plan.json" 2>"$T/$c.err" ||
        { echo "FAIL: config check $c"; cat "$T/$c.err"; failed=$((failed+1)); }
done
check "the plan counts the FP8 scratch of llama-3.1-8B at T 2048 (235 MB)" -- $PY -c "
import json, sys
a = json.load(open('$T/bf16.plan.json'))['memory_plan']['device_bytes']
b = json.load(open('$T/fp8.plan.json'))['memory_plan']['device_bytes']
want = 2048 + 2560 + 2 * 2048 * 28672 + 2 * 14336 * 4096  # scales, 291 slots, qa qc qb
print(f'  device plan {a} -> {b} bytes (+{b - a}, expected +{want})')
sys.exit(0 if b - a == want else 1)"
finish
