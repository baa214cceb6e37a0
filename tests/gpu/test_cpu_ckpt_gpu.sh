#!/usr/bin/env bash
# activation_checkpointing.cpu_checkpointing on the GPU (every family, the device layer driver): the
# layers' inputs go to page-locked host memory on a side stream during the forward and come back
# one layer ahead of the backward; the device keeps three residual blocks instead of one per
# layer. Gradients (--dump-grads) and 10 steps of metrics (accumulation 2, clipping) are bitwise
# those of plain activation checkpointing, for GPT-2, Llama and Qwen3 shapes; the device pool
# shrinks by the residual blocks it no longer keeps (the plan's side: tests/cli/test_memory_plan.sh).
# Exit 77 (skipped) when no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, cols
gpu_or_skip
AC='"activation_checkpointing": {"partition_activations": false'
cfg "$T/ac.json" ", \"bf16\": {\"enabled\": true}, $AC}"
cfg "$T/host.json" ", \"bf16\": {\"enabled\": true}, $AC, \"cpu_checkpointing\": true}"
for m in d2 llama-d2 qwen3-d2; do
    for c in ac host; do
        MODEL=$m run_one "${m}_$c" cuda "$T/$c.json" 10
        MODEL=$m run_one "${m}_${c}_g" cuda "$T/$c.json" 1 --dump-grads "$T/${m}_$c.safetensors"
    done
    check "$m: gradients with the inputs on the host are bitwise those without" -- cmp "$T/${m}_ac.safetensors" "$T/${m}_host.safetensors"
    check "$m: 10 steps bitwise equal" -- diff <(cols "$T/${m}_ac/metrics.jsonl") <(cols "$T/${m}_host/metrics.jsonl")
done
for c in ac host; do
    MODEL=llama-d8 run_one "mem_$c" cuda "$T/$c.json" 2
done
check "the device pool no longer holds 6 of llama-d8's 9 residual blocks (4 x 64 tokens x 512 channels, bf16)" -- $PY -c "
import json
a = json.loads(open('$T/mem_ac/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/mem_host/metrics.jsonl').readlines()[-1])['gpu_allocated']
print(f'  llama-d8 device pool: {a} bytes, {b} with cpu_checkpointing')
assert a - b == 6 * 4 * 64 * 512 * 2, (a, b)"
finish
