#!/usr/bin/env bash
# LoRA on one GPU (the Llama family and GPT-2): adapters beside every adapted product of the
# device passes, the frozen base in 16 bits on the device with no gradient, master or moments,
# the optimizer over the adapters on the GPU (or, with ZeRO-Offload, on the host). The GPU run
# follows the CPU's LoRA run within bf16 tolerance (without and with lora_dropout: the same
# masks; with modules_to_save; with bf16 master weights; fp16; ZeRO-Offload, also with
# offload_param (the base's layers streamed); nccl; Qwen3's q/k norms frozen), the loss falls, a checkpoint resumes bit for bit and exports for PEFT and
# merged, the device pool holds no per-parameter state for the base, and the paths that cannot
# take a frozen base are refused by name. Exit 77 (skipped) without a CUDA device.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, compare, cols
gpu_or_skip
run() { run_one "$@"; }
cfg "$T/full.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}'
# the base: a few steps of llama-d2 exported as a Hugging Face folder (a merged export reads it)
MODEL=llama-d2 run base cuda "$T/full.json" 3 --save-dir "$T/base_ck" --save-at-end
"$DSC" ckpt export "$T/base_ck" --hf "$T/base_hf" >"$T/base_export.log" 2>&1 ||
    { echo "FAIL: export of the base"; cat "$T/base_export.log"; failed=$((failed+1)); }
export MODEL=hf:$T/base_hf
LORA='"lora": {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}'
DROP='"lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.1, "target_modules": "all-linear"}'
SAVE='"lora": {"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj", "down_proj"], "modules_to_save": ["embed_tokens"]}'
cfg "$T/lora.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, $LORA"
cfg "$T/drop.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}, $DROP"
cfg "$T/save.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, $SAVE"
cfg "$T/f16.json" ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 12}, \"zero_optimization\": {\"stage\": 1}, $LORA"
cfg "$T/ac.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, \"activation_checkpointing\": {\"partition_activations\": false, \"cpu_checkpointing\": true}, $DROP"
cfg "$T/drop1.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, $DROP"
cfg "$T/m16.json" ", \"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true, \"bf16_optimizer_states\": true}, \"zero_optimization\": {\"stage\": 1}, $LORA"

run lora cuda "$T/lora.json" 40
run lora_cpu cpu "$T/lora.json" 40
run drop cuda "$T/drop.json" 40
run drop_cpu cpu "$T/drop.json" 40
run save cuda "$T/save.json" 40
run save_cpu cpu "$T/save.json" 40
run m16 cuda "$T/m16.json" 40
run m16_cpu cpu "$T/m16.json" 40
MODEL=qwen3-d2 run qwen3 cuda "$T/lora.json" 40
MODEL=qwen3-d2 run qwen3_cpu cpu "$T/lora.json" 40
# GPT-2 (Conv1D weights, the fused c_attn one adapter, the GELU outside the products' epilogues)
G2='"lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.1, "target_modules": ["c_attn", "c_proj", "c_fc"]}'
G2S='"lora": {"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"], "modules_to_save": ["wte", "wpe", "ln_f"]}'
cfg "$T/g2.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, $G2"
cfg "$T/g2s.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, $G2S"
cfg "$T/g2ac.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 1}, \"activation_checkpointing\": {}, $G2"
MODEL=d2 run g2 cuda "$T/g2.json" 40
MODEL=d2 run g2_cpu cpu "$T/g2.json" 40
MODEL=d2 run g2s cuda "$T/g2s.json" 40
MODEL=d2 run g2s_cpu cpu "$T/g2s.json" 40
MODEL=d2 run g2ac cuda "$T/g2ac.json" 40
MODEL=d2 run g2_grads cuda "$T/g2.json" 1 --dump-grads "$T/g2_grads.safetensors"
MODEL=d2 run g2_grads_cpu cpu "$T/g2.json" 1 --dump-grads "$T/g2_grads_cpu.safetensors"
# ZeRO-Offload: the frozen base stays on the GPU, the adapters' gradients go down to the host's
# optimizer and their new 16-bit values come back up
OFF='"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
cfg "$T/off.json" ", \"bf16\": {\"enabled\": true}, $OFF, $LORA"
cfg "$T/saveoff.json" ", \"bf16\": {\"enabled\": true}, $OFF, $SAVE"
cfg "$T/dropoff.json" ", \"bf16\": {\"enabled\": true}, $OFF, $DROP"
run off cuda "$T/off.json" 40
run saveoff cuda "$T/saveoff.json" 40
run dropoff cuda "$T/dropoff.json" 40
# offload_param at stage 3: the layers' adapters and their frozen base stream from the host
cfg "$T/offp.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}, $LORA"
run offp cuda "$T/offp.json" 40
run offhalf cuda "$T/off.json" 20 --save-dir "$T/offck" --save-at-end
run offrest cuda "$T/off.json" 40 --save-dir "$T/offck" --resume --save-at-end
# nccl (DSC_COMM_BACKEND=nccl; one rank on one GPU, any number where there are more): the frozen
# base whole on every GPU, the collectives over the adapters only; at stage 3 the adapters'
# 16-bit weights pass through the layer slots
NCCL=$("$DSC" report | grep -c "^comm backends.*nccl")
cfg "$T/z3.json" ", \"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3}, $LORA"
if [ "$NCCL" -gt 0 ]; then
    DSC_COMM_BACKEND=nccl run nccl1 cuda "$T/lora.json" 40
    DSC_COMM_BACKEND=nccl run nccl3 cuda "$T/z3.json" 40
fi
run f16 cuda "$T/f16.json" 40
run f16_cpu cpu "$T/f16.json" 40
run ac cuda "$T/ac.json" 10
run drop1 cuda "$T/drop1.json" 10
run half cuda "$T/lora.json" 20 --save-dir "$T/ck" --save-at-end
run rest cuda "$T/lora.json" 40 --save-dir "$T/ck" --resume --save-at-end
run grads cuda "$T/lora.json" 1 --dump-grads "$T/grads.safetensors"
for m in full lora off offp; do
    "$DSC" train --device cuda --config "$T/$m.json" --model llama-d8 --seq-len 64 --max-steps 2 \
        --seed 7 --eval-every 0 --eval-batches 1 --sample-tokens 0 --out "$T/mem_$m" \
        >"$T/mem_$m.log" 2>&1 || { echo "FAIL: run mem_$m"; cat "$T/mem_$m.log"; failed=$((failed+1)); }
done

# fell RUN: the mean of the last 5 losses is below 95% of the first (adapters on a random base
# move it less than a full fine-tune does)
fell() { $PY -c "
import json
l = [json.loads(x)['loss'] for x in open('$T/$1/metrics.jsonl')]
print(f'  $1: loss {l[0]:.4f} -> {sum(l[-5:]) / 5:.4f}')
assert sum(l[-5:]) / 5 < 0.95 * l[0]"; }
check "LoRA on the GPU: the loss falls" -- fell lora
check "LoRA: the GPU follows the CPU within bf16 tolerance" -- compare lora_cpu lora 5e-3 0.03 0.08
check "lora_dropout: the GPU draws the CPU's masks (follows it within bf16 tolerance)" -- compare drop_cpu drop 5e-3 0.03 0.08
check "lora_dropout acts on the GPU (its losses differ from the run without)" -- $PY -c "
import json
a = [json.loads(x)['loss'] for x in open('$T/drop/metrics.jsonl')]
b = [json.loads(x)['loss'] for x in open('$T/lora/metrics.jsonl')]
assert a != b, a"
check "modules_to_save (the tied embeddings trained in full): the GPU follows the CPU" -- compare save_cpu save 5e-3 0.03 0.08
check "LoRA with bf16 master and moments: the GPU follows the CPU" -- compare m16_cpu m16 5e-3 0.03 0.08
check "Qwen3 (q/k norms frozen): the GPU follows the CPU" -- compare qwen3_cpu qwen3 5e-3 0.03 0.08
check "LoRA in fp16 (loss scaling): the GPU follows the CPU" -- compare f16_cpu f16 5e-3 0.03 0.08
check "LoRA with dropout, recomputed layers and their inputs on the host: bitwise the plain run" -- diff <(cols "$T/drop1/metrics.jsonl") <(cols "$T/ac/metrics.jsonl")
check "the banner counts the trainable parameters" -- grep -q "LoRA: r 8" "$T/lora.log"
check "a checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/lora/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/rest/metrics.jsonl')]
assert b[0]['step'] == 21 and [x['loss'] for x in a[20:]] == [x['loss'] for x in b], (a[20:], b)"
check "--dump-grads holds the adapters' gradients only" -- $PY -c "
import json, struct
b = open('$T/grads.safetensors', 'rb').read()
h = json.loads(b[8:8 + struct.unpack('<Q', b[:8])[0]])
k = [x for x in h if x not in ('__metadata__', 'inputs', 'targets')]
assert k and all('.lora_A.' in x or '.lora_B.' in x for x in k), k[:5]"
check "the checkpoint exports for PEFT" -- "$DSC" ckpt export "$T/ck" --peft "$T/peft"
check "the adapter file holds lora_A and lora_B" -- grep -q "lora_A" "$T/peft/adapter_model.safetensors"
check "the merged export checks the unchanged base" -- "$DSC" ckpt export "$T/ck" --hf "$T/merged"
check "the device pool keeps no state for the frozen base" -- $PY -c "
import json, re
a = json.loads(open('$T/mem_full/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/mem_lora/metrics.jsonl').readlines()[-1])['gpu_allocated']
n = float(re.search(r'\(([0-9.]+)M parameters', open('$T/mem_full.log').read()).group(1)) * 1e6
print(f'  llama-d8 device pool: {a / 2**20:.1f} MiB full, {b / 2**20:.1f} MiB LoRA, {n} parameters')
assert a - b >= 12 * n, (a, b, n)"
check "ZeRO-Offload: the GPU follows the CPU, the adapters' optimizer on the host" -- compare lora_cpu off 5e-3 0.03 0.08
check "ZeRO-Offload with modules_to_save (the embeddings' group trained in full) follows the CPU" -- compare save_cpu saveoff 5e-3 0.03 0.08
check "ZeRO-Offload with lora_dropout follows the CPU" -- compare drop_cpu dropoff 5e-3 0.03 0.08
check "the banner says ZeRO-Offload" -- grep -q "ZeRO-Offload" "$T/off.log"
check "ZeRO-Offload: a checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/off/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/offrest/metrics.jsonl')]
assert b[0]['step'] == 21 and [x['loss'] for x in a[20:]] == [x['loss'] for x in b], (a[20:], b)"
if [ "$NCCL" -gt 0 ]; then
    check "nccl with LoRA (one rank): follows the CPU" -- compare lora_cpu nccl1 5e-3 0.03 0.08
    check "nccl with LoRA at stage 3 (the adapters through the layer slots): follows the CPU" -- compare lora_cpu nccl3 5e-3 0.03 0.08
    check "the nccl path ran (its banner)" -- grep -q "nccl" "$T/nccl3.log"
else
    echo "SKIP: nccl with LoRA (this dsc was built without NCCL)"
fi
check "offload_param (the base's layers streamed beside the adapters): follows the CPU" -- compare lora_cpu offp 5e-3 0.03 0.08
check "offload_param: the same losses as ZeRO-Offload with the base resident" -- diff <(cols "$T/off/metrics.jsonl") <(cols "$T/offp/metrics.jsonl")
check "offload_param: the device keeps the end groups' base and two layers' of it" -- $PY -c "
import json, re
a = json.loads(open('$T/mem_off/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/mem_offp/metrics.jsonl').readlines()[-1])['gpu_allocated']
n = float(re.search(r'\(([0-9.]+)M parameters', open('$T/mem_off.log').read()).group(1)) * 1e6
print(f'  llama-d8 LoRA device pool: {a / 2**20:.1f} MiB ZeRO-Offload, {b / 2**20:.1f} MiB with offload_param')
assert a - b >= n, (a, b, n)"
check "GPT-2: LoRA with dropout on the GPU follows the CPU within bf16 tolerance" -- compare g2_cpu g2 5e-3 0.03 0.08
check "GPT-2: the loss falls" -- fell g2
check "GPT-2: modules_to_save (wte, wpe, ln_f trained in full) follows the CPU" -- compare g2s_cpu g2s 5e-3 0.03 0.08
check "GPT-2: recomputed layers (activation checkpointing) give the plain run's bits" -- diff <(cols "$T/g2/metrics.jsonl") <(cols "$T/g2ac/metrics.jsonl")
check "GPT-2: step-1 adapter gradients within 2e-2 (relative L2) of the CPU's, none of the base" -- $PY - "$T/g2_grads_cpu.safetensors" "$T/g2_grads.safetensors" <<'PYEOF'
import json, struct, sys
import numpy as np
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    h.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], dtype=np.float32).astype(np.float64)
            for k, v in h.items() if v["dtype"] == "F32"}
c, g = load(sys.argv[1]), load(sys.argv[2])
assert c.keys() == g.keys() and c, (sorted(c)[:4], sorted(g)[:4])
assert all(".lora_A." in k or ".lora_B." in k for k in c), sorted(c)[:4]
rel = {k: np.linalg.norm(c[k] - g[k]) / max(np.linalg.norm(c[k]), 1e-30) for k in c}
w = max(rel, key=rel.get)
print(f"  {len(rel)} adapter tensors, worst rel L2 {rel[w]:.2e} ({w})")
assert rel[w] <= 2e-2, rel[w]
PYEOF
cfg "$T/gpt2.json" ", \"bf16\": {\"enabled\": true}, \"lora\": {\"r\": 4, \"target_modules\": [\"c_attn\"], \"modules_to_save\": [\"wpe\"]}"
expect 1 "both train or neither" -- "$DSC" train --device cuda --config "$T/gpt2.json" --model d2 --max-steps 1 --out "$T/bad2"
finish
