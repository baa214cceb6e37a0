#!/usr/bin/env bash
# dsc train --device cuda with a Llama-family model (llama-d4: 4 layers, 4 heads sharing 2 kv
# heads, RMSNorm, rotary embeddings, SwiGLU, tied head): the GPU path against the CPU path on the
# same seed, data and config (bf16 loss curves within bf16 tolerance, falling), ZeRO-Offload and
# parameter offload against the GPU optimizer, the fp16 loss scaler, the one-rank nccl path at
# ZeRO stage 3 (partitioned 16-bit weights through the layer slots), a checkpoint resumed bit for
# bit, --dump-grads under the Hugging Face names, and the refusal of a head size the GPU kernels
# do not take. Then Qwen3 (qwen3-d2: per-head q/k norms, 2 heads of 128 on hidden 128): GPU
# against CPU loss curves (bf16), the fp16 scaler, and its q/k norm gradients dumped under their
# names. Exit 77 (skipped) when no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

probe=$("$DSC" train --device cuda --model llama-d2 --max-steps 1 --sample-tokens 0 --out "$T/probe" 2>&1)
if grep -qE "no CUDA device is usable|built without the CUDA kernels" <<<"$probe"; then
    echo "SKIP: no CUDA device ($(grep -o 'error: .*' <<<"$probe" | head -1))"
    finish >/dev/null
    exit 77
fi

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, compare, falls, cols
export MODEL=llama-d4
cfg "$T/bf16.json" ', "bf16": {"enabled": true}'
cfg "$T/offload.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
cfg "$T/fp16.json" ', "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 4, "hysteresis": 1}'
cfg "$T/off3.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}'
cfg "$T/poff.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}'
cfg "$T/z3.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 3}'
sed 's/"gradient_accumulation_steps": 2/"gradient_accumulation_steps": 1/' "$T/off3.json" >"$T/off3_g1.json"
sed 's/"gradient_accumulation_steps": 2/"gradient_accumulation_steps": 1/' "$T/poff.json" >"$T/poff_g1.json"
run() { run_one "$@"; }
run cpu cpu "$T/bf16.json" 40
run gpu cuda "$T/bf16.json" 40
DSC_SIMD=scalar run off cuda "$T/offload.json" 40
run off3_g1 cuda "$T/off3_g1.json" 12
run poff_g1 cuda "$T/poff_g1.json" 12
run fp16 cuda "$T/fp16.json" 12
DSC_COMM_BACKEND=nccl run nccl0 cuda "$T/bf16.json" 20
DSC_COMM_BACKEND=nccl run nccl3 cuda "$T/z3.json" 20
run full cuda "$T/bf16.json" 20
run half cuda "$T/bf16.json" 10 --save-dir "$T/ck" --save-at-end
run rest cuda "$T/bf16.json" 20 --save-dir "$T/ck" --resume
run dump cuda "$T/bf16.json" 1 --dump-grads "$T/grads.safetensors"
MODEL=qwen3-d2 run q3cpu cpu "$T/bf16.json" 40
MODEL=qwen3-d2 run q3gpu cuda "$T/bf16.json" 40
MODEL=qwen3-d2 run q3fp16 cuda "$T/fp16.json" 12
MODEL=qwen3-d2 run q3dump cuda "$T/bf16.json" 1 --dump-grads "$T/q3grads.safetensors"

check "the GPU run went through the Llama family" -- grep -q "llama" "$T/gpu.log"
check "Llama: GPU and CPU loss curves agree (bf16)" -- compare cpu gpu 5e-3 0.02 0.06
check "Llama: GPU loss falls" -- falls gpu
check "Llama: ZeRO-Offload agrees with the GPU optimizer" -- compare gpu off 1e-6 1e-4 1e-3
check "Llama: parameter offload equals ZeRO-Offload bit for bit (accumulation 1)" -- cmp <(cols "$T/off3_g1/metrics.jsonl") <(cols "$T/poff_g1/metrics.jsonl")
check "Llama: one-rank nccl at ZeRO stage 3 (weights through the layer slots) agrees with stage 0" -- compare nccl0 nccl3 1e-6 1e-4 1e-3
check "Llama: nccl stage 3 loss falls" -- falls nccl3
check "Llama fp16 on the GPU: a loss scale, growing every 4 clean steps" -- $PY -c "
import json
s = [json.loads(x)['loss_scale'] for x in open('$T/fp16/metrics.jsonl')]
assert s[0] == 4096 and max(s) > 4096, s"
check "Llama: a GPU checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/full/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/rest/metrics.jsonl')]
assert b[0]['step'] == 11 and [x['loss'] for x in a[10:]] == [x['loss'] for x in b], (a[10:], b)"
check "Llama --dump-grads on the GPU: Hugging Face names" -- $PY -c "
import json, struct
f = open('$T/grads.safetensors', 'rb')
n = struct.unpack('<Q', f.read(8))[0]
h = json.loads(f.read(n))
for k in ('model.embed_tokens.weight', 'model.layers.0.self_attn.q_proj.weight',
          'model.layers.3.mlp.down_proj.weight', 'model.norm.weight'):
    assert any(x.endswith(k) for x in h), (k, sorted(h)[:8])"
check "Qwen3: GPU and CPU loss curves agree (bf16)" -- compare q3cpu q3gpu 5e-3 0.02 0.06
check "Qwen3: GPU loss falls" -- falls q3gpu
check "Qwen3 fp16 on the GPU: a loss scale, growing every 4 clean steps" -- $PY -c "
import json
s = [json.loads(x)['loss_scale'] for x in open('$T/q3fp16/metrics.jsonl')]
assert s[0] == 4096 and max(s) > 4096, s"
check "Qwen3 --dump-grads on the GPU: q_norm and k_norm under their names, finite, not zero" -- \
    $PY -c "
import json, math, struct
f = open('$T/q3grads.safetensors', 'rb')
n = struct.unpack('<Q', f.read(8))[0]
h = json.loads(f.read(n))
data = f.read()
for k in ('model.layers.0.self_attn.q_norm.weight', 'model.layers.1.self_attn.k_norm.weight'):
    name = [x for x in h if x.endswith(k)]
    assert name, (k, sorted(h)[:8])
    a, b = h[name[0]]['data_offsets']
    v = struct.unpack('<%df' % ((b - a) // 4), data[a:b])
    assert len(v) == 128 and all(math.isfinite(x) for x in v) and any(v), (k, v[:4])"
finish
