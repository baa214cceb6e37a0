#!/usr/bin/env bash
# dsc train --device cuda: the GPU path against the CPU path on the same seed, data and config
# (bf16; the loss curves must agree within bf16 tolerance and fall), ZeRO-Offload against the
# GPU optimizer, the fp16 loss scaler on the GPU, a checkpoint resumed on the GPU continuing
# bit for bit, and the device errors. Exit 77 (skipped) when no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

# The errors come first: they hold on every machine.
expect 1 "--device gpu: expected cuda, cpu or auto" -- "$DSC" train --device gpu --max-steps 1 --out "$T/bad"
probe=$("$DSC" train --device cuda --model d1 --max-steps 1 --sample-tokens 20 --out "$T/probe" 2>&1)
if grep -qE "no CUDA device is usable|built without the CUDA kernels" <<<"$probe"; then
    grep -qF "or train with --device cpu" <<<"$probe" || { echo "FAIL: unclear error: $probe"; exit 1; }
    echo "SKIP: no CUDA device ($(grep -o 'error: .*' <<<"$probe" | head -1))"
    finish >/dev/null
    exit 77
fi

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, compare, falls
cfg "$T/bf16.json" ', "bf16": {"enabled": true}'
cfg "$T/offload.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
cfg "$T/fp16.json" ', "fp16": {"enabled": true, "initial_scale_power": 12, "loss_scale_window": 4, "hysteresis": 1}'
run() { run_one "$@"; }
run cpu cpu "$T/bf16.json" 40
run gpu cuda "$T/bf16.json" 40
DSC_GPU_GRAPH=0 run gpu_eager cuda "$T/bf16.json" 40 # every step's kernels launched one by one
DSC_SIMD=scalar run off cuda "$T/offload.json" 40 # the GPU step equals the scalar CPU step
DSC_SIMD=scalar DSC_OFFLOAD_STREAM=0 run off_whole cuda "$T/offload.json" 40
# Without clipping the streamed offload's optimizer runs as the groups land (during backward).
sed 's/"gradient_clipping": 1.0/"gradient_clipping": 0.0/' "$T/offload.json" >"$T/off_noclip.json"
run early cuda "$T/off_noclip.json" 20
DSC_OFFLOAD_STREAM=0 run early_whole cuda "$T/off_noclip.json" 20
# Parameter offload (stage 3): the layers' weights streamed from the host through two slots,
# their gradients down every micro-step; against ZeRO-Offload with the weights on the GPU.
cfg "$T/off3.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}'
cfg "$T/poff.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu", "pin_memory": true}}'
sed 's/"gradient_accumulation_steps": 2/"gradient_accumulation_steps": 1/' "$T/off3.json" >"$T/off3_g1.json"
sed 's/"gradient_accumulation_steps": 2/"gradient_accumulation_steps": 1/' "$T/poff.json" >"$T/poff_g1.json"
run off3 cuda "$T/off3.json" 40
run poff cuda "$T/poff.json" 40
run off3_g1 cuda "$T/off3_g1.json" 12
run poff_g1 cuda "$T/poff_g1.json" 12
# Without clipping at one micro-step parameter offload streams the step (no host accumulator).
sed 's/"gradient_clipping": 1.0/"gradient_clipping": 0.0/' "$T/off3_g1.json" >"$T/off3_lean.json"
sed 's/"gradient_clipping": 1.0/"gradient_clipping": 0.0/' "$T/poff_g1.json" >"$T/poff_lean.json"
run off3_lean cuda "$T/off3_lean.json" 12
run poff_lean cuda "$T/poff_lean.json" 12
# Streamed runs resumed from a checkpoint (the master comes up through the gradient buffer; with
# parameter offload into the host 16-bit copy and the resident groups).
run early_half cuda "$T/off_noclip.json" 10 --save-dir "$T/eck" --save-at-end
run early_rest cuda "$T/off_noclip.json" 20 --save-dir "$T/eck" --resume
run plean_half cuda "$T/poff_lean.json" 6 --save-dir "$T/lck" --save-at-end
run plean_rest cuda "$T/poff_lean.json" 12 --save-dir "$T/lck" --resume
run poff_samp cuda "$T/poff.json" 2 --sample-tokens 16
run poff_half cuda "$T/poff.json" 20 --save-dir "$T/pck" --save-at-end
run poff_rest cuda "$T/poff.json" 40 --save-dir "$T/pck" --resume
for m in off3 poff; do # a deeper model, where two layer slots are a small part of the layers
    "$DSC" train --device cuda --config "$T/$m.json" --model d8 --seq-len 64 --max-steps 3 \
        --seed 7 --eval-every 0 --eval-batches 1 --sample-tokens 0 --out "$T/mem_$m" \
        >"$T/mem_$m.log" 2>&1 || { echo "FAIL: run mem_$m"; cat "$T/mem_$m.log"; failed=$((failed+1)); }
done
cfg "$T/poff2.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}'
cfg "$T/poffgpu.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}'
run fp16 cuda "$T/fp16.json" 12
run bf16_sample cuda "$T/bf16.json" 2 --sample-tokens 16 # the engine keeps no bf16 host copy
DSC_INJECT_OVERFLOW=3 run inject cuda "$T/fp16.json" 6
run full cuda "$T/bf16.json" 20
run half cuda "$T/bf16.json" 10 --save-dir "$T/ck" --save-at-end
run rest cuda "$T/bf16.json" 20 --save-dir "$T/ck" --resume --dump-weights "$T/w.safetensors"

# compare A B FIRST MEAN MAX: two runs step by step. The same schedule (lr equal); step 1, where
# the weights are still equal, within FIRST; the per-step loss and validation loss within MAX and
# on average within MEAN (relative), since bf16 rounding makes the trajectories drift apart.
check "GPU and CPU loss curves agree (bf16)" -- compare cpu gpu 5e-3 0.02 0.06
check "GPU loss falls" -- falls gpu
check "the step replayed as a CUDA graph equals the eager step bit for bit" -- cmp <(cols "$T/gpu/metrics.jsonl") <(cols "$T/gpu_eager/metrics.jsonl")
check "the step was captured as a CUDA graph (no fallback warning)" -- bash -c "! grep -q 'captured as a CUDA graph' '$T/gpu.log'"
check "CPU loss falls" -- falls cpu
check "ZeRO-Offload agrees with the GPU optimizer" -- compare gpu off 1e-6 1e-4 1e-3
check "the GPU banner names the device and offload" -- grep -q "ZeRO-Offload" "$T/off.log"
check "the banner says the offload is streamed per layer group" -- grep -q "per layer group, overlapping the backward" "$T/off.log"
check "streamed ZeRO-Offload equals the whole-gradient offload step bit for bit (clipping on)" -- cmp <(cols "$T/off/metrics.jsonl") <(cols "$T/off_whole/metrics.jsonl")
check "streamed ZeRO-Offload without clipping (optimizer during backward) bit for bit" -- cmp <(cols "$T/early/metrics.jsonl") <(cols "$T/early_whole/metrics.jsonl")
check "parameter offload agrees with ZeRO-Offload (accumulation 2)" -- compare off3 poff 1e-6 1e-5 1e-4
check "parameter offload equals ZeRO-Offload bit for bit (accumulation 1)" -- cmp <(cols "$T/off3_g1/metrics.jsonl") <(cols "$T/poff_g1/metrics.jsonl")
check "parameter offload streamed (one micro-step, no clipping) equals ZeRO-Offload bit for bit" -- cmp <(cols "$T/off3_lean/metrics.jsonl") <(cols "$T/poff_lean/metrics.jsonl")
check "streamed parameter offload keeps no host accumulator (the plan's host gradients)" -- bash -c "grep 'memory plan' '$T/poff_lean.log' | grep -qv 'gradients' && grep 'memory plan' '$T/poff_g1.log' | grep -q 'gradients'"
check "parameter offload: the banner says so" -- grep -q "parameter offload" "$T/poff.log"
check "parameter offload: loss falls" -- falls poff
check "parameter offload: a checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/poff/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/poff_rest/metrics.jsonl')]
assert b[0]['step'] == 21 and [x['loss'] for x in a[20:]] == [x['loss'] for x in b], (a[20:], b)"
resumed() { # resumed WHOLE REST K: REST's losses are WHOLE's from step K + 1 on
    $PY -c "
import json
a = [json.loads(x) for x in open('$T/$1/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/$2/metrics.jsonl')]
assert b[0]['step'] == $3 + 1 and [x['loss'] for x in a[$3:]] == [x['loss'] for x in b], (a[$3:], b)"
}
check "streamed ZeRO-Offload: a checkpoint resumes bit for bit" -- resumed early early_rest 10
check "streamed parameter offload: a checkpoint resumes bit for bit" -- resumed poff_lean plean_rest 6
check "parameter offload: the GPU holds two layers, not eight (d8: the pool's bytes)" -- $PY -c "
import json
a = json.loads(open('$T/mem_off3/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/mem_poff/metrics.jsonl').readlines()[-1])['gpu_allocated']
layer = 12 * 512 * 512 + 13 * 512  # d8: 512 channels
print(f'  d8 device pool: {a / 2**20:.1f} MiB without, {b / 2**20:.1f} MiB with parameter offload')
assert a - b >= 6 * layer * 6 * 0.9, (a, b)"
expect 1 "offload_param needs ZeRO stage 3" -- "$DSC" train --device cuda --config "$T/poff2.json" --model d2 --max-steps 1 --out "$T/bad2"
expect 1 "set zero_optimization.offload_optimizer.device to \"cpu\" too" -- "$DSC" train --device cuda --config "$T/poffgpu.json" --model d2 --max-steps 1 --out "$T/bad3"
check "metrics.jsonl: offload host times; the optimizer overlaps the backward only without clipping" -- $PY -c "
import json
def rows(n): return [json.loads(x) for x in open('$T/' + n + '/metrics.jsonl')]
for r in rows('early'):
    assert r['offload_overlapped'] is True and r['offload_cpu_ms'] > 0 and r['offload_grad_wait_ms'] >= 0, r
for r in rows('off'):
    assert r['offload_overlapped'] is False and r['offload_cpu_ms'] > 0, r
assert all('offload_cpu_ms' not in r for r in rows('off_whole') + rows('gpu'))"
check "fp16 on the GPU: a loss scale, growing every 4 clean steps" -- $PY -c "
import json
s = [json.loads(x)['loss_scale'] for x in open('$T/fp16/metrics.jsonl')]
assert s[0] == 4096 and max(s) > 4096, s"
check "fp16 on the GPU: an injected overflow skips step 3 and halves the scale" -- $PY -c "
import json
m = [json.loads(x) for x in open('$T/inject/metrics.jsonl')]
assert m[2]['skipped'] and not m[1]['skipped'] and m[3]['loss_scale'] == m[2]['loss_scale'] / 2, m"
check "a GPU checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/full/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/rest/metrics.jsonl')]
assert b[0]['step'] == 11 and [x['loss'] for x in a[10:]] == [x['loss'] for x in b], (a[10:], b)"
check "--dump-weights after a GPU run" -- test -s "$T/w.safetensors"
check "a GPU run ends with a text sample (generated on the host from the trained weights)" -- grep -qF "sample (temperature" <<<"$probe"
check "a bf16 GPU run ends with a text sample (from the master weights, rounded)" -- grep -qF "sample (temperature" "$T/bf16_sample.log"
check "a parameter-offload run (stage 3) ends with a text sample" -- grep -qF "sample (temperature" "$T/poff_samp.log"
finish
