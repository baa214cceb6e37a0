#!/usr/bin/env bash
# bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states on one GPU with the optimizer
# on it: the bf16 weights are the master (no fp32 master on the device), gradients are rounded to
# bf16 before the norm and the step, the moments are bf16 with the second key. GPT-2 and Llama
# train (the loss falls, and follows the CPU engine's bf16-master run within bf16 tolerance), a
# checkpoint resumes bit for bit, saved master and moments and --dump-grads hold bf16 values only,
# the device pool shrinks by 8-10 bytes per parameter with both keys (fp32 master, gradients and
# moments 16 -> bf16 gradients and moments 6, plus an fp32 scratch of two layers), and the
# refusals name the keys. Exit 77 (skipped) when no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, compare, falls, cols
gpu_or_skip
run() { run_one "$@"; }
MASTER='"bf16_master_weights_and_grads": true'
cfg "$T/fp32m.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}'
cfg "$T/m16.json" ", \"bf16\": {\"enabled\": true, $MASTER}, \"zero_optimization\": {\"stage\": 1}"
cfg "$T/b16.json" ", \"bf16\": {\"enabled\": true, $MASTER, \"bf16_optimizer_states\": true}, \"zero_optimization\": {\"stage\": 2}"

run fp32m cuda "$T/fp32m.json" 40
run m16 cuda "$T/m16.json" 40
run b16 cuda "$T/b16.json" 40
run b16_cpu cpu "$T/b16.json" 40
run b16_half cuda "$T/b16.json" 20 --save-dir "$T/ck" --save-at-end
run b16_rest cuda "$T/b16.json" 40 --save-dir "$T/ck" --resume --save-at-end
run b16_grads cuda "$T/b16.json" 2 --dump-grads "$T/grads.safetensors"
MODEL=llama-d2 run llama cuda "$T/b16.json" 40
# bf16_master_rounding "stochastic": the same hash of step and index on both sides
sed 's/"gradient_clipping"/"bf16_master_rounding": "stochastic", "gradient_clipping"/' "$T/b16.json" >"$T/sr.json"
run sr cuda "$T/sr.json" 40
run sr_cpu cpu "$T/sr.json" 40
run sr_half cuda "$T/sr.json" 20 --save-dir "$T/srck" --save-at-end
run sr_rest cuda "$T/sr.json" 40 --save-dir "$T/srck" --resume
# d8 (512 channels): the pool's bytes with and without the keys
for m in fp32m b16; do
    "$DSC" train --device cuda --config "$T/$m.json" --model d8 --seq-len 64 --max-steps 2 \
        --seed 7 --eval-every 0 --eval-batches 1 --sample-tokens 0 --out "$T/mem_$m" \
        >"$T/mem_$m.log" 2>&1 || { echo "FAIL: run mem_$m"; cat "$T/mem_$m.log"; failed=$((failed+1)); }
done

check "bf16 master (fp32 moments): the loss falls" -- falls m16
check "bf16 master and moments: the loss falls" -- falls b16
check "Llama, bf16 master and moments: the loss falls" -- falls llama
check "the GPU's bf16-master run follows the CPU engine's within bf16 tolerance" -- compare b16_cpu b16 5e-3 0.03 0.08
check "bf16 master follows the fp32 master within bf16 tolerance" -- compare fp32m m16 5e-3 0.03 0.08
check "stochastic rounding: the loss falls" -- falls sr
check "stochastic rounding: the GPU follows the CPU engine within bf16 tolerance" -- compare sr_cpu sr 5e-3 0.03 0.08
check "stochastic rounding differs from nearest (the key acts)" -- $PY -c "
import json
a = [json.loads(x)['loss'] for x in open('$T/sr/metrics.jsonl')]
b = [json.loads(x)['loss'] for x in open('$T/b16/metrics.jsonl')]
assert len(a) == len(b) == 40 and a[0] == b[0] and a != b, (a, b)"
check "stochastic rounding: a checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/sr/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/sr_rest/metrics.jsonl')]
assert b[0]['step'] == 21 and [x['loss'] for x in a[20:]] == [x['loss'] for x in b], (a[20:], b)"
check "the banner names the mode" -- grep -q "bf16 master, bf16 gradients and bf16 optimizer state on the GPU" "$T/b16.log"
check "a checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/b16/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/b16_rest/metrics.jsonl')]
assert b[0]['step'] == 21 and [x['loss'] for x in a[20:]] == [x['loss'] for x in b], (a[20:], b)"
# low16 FILE: every F32 tensor of the safetensors FILE holds bf16 values only (and one exists)
low16() { $PY - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
bad = seen = 0
for k, t in h.items():
    if k == '__metadata__' or t['dtype'] != 'F32': continue
    s, e = t['data_offsets']
    words = struct.unpack('<%dI' % ((e - s) // 4), b[8 + n + s:8 + n + e])
    seen += len(words)
    bad += sum(1 for w in words if w & 0xffff)
sys.exit(1 if bad or not seen else 0)
PY
}
check "saved master and moments are bf16 values" -- low16 "$T/ck/global_step40/shard_rank0_of_1.safetensors"
check "the manifest records bf16 master and moments" -- grep -q '"moments_precision": "bf16"' "$T/ck/global_step40/manifest.json"
"$DSC" ckpt export "$T/ck" --out "$T/ck.st" >/dev/null 2>&1
check "the export holds bf16 values" -- low16 "$T/ck.st"
check "--dump-grads holds the bf16 gradients" -- low16 "$T/grads.safetensors"
check "the pool shrinks by 8-10 bytes per parameter (no fp32 master, bf16 gradients and moments)" -- $PY -c "
import json, re
a = json.loads(open('$T/mem_fp32m/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/mem_b16/metrics.jsonl').readlines()[-1])['gpu_allocated']
n = float(re.search(r'\(([0-9.]+)M parameters', open('$T/mem_b16.log').read()).group(1)) * 1e6
print(f'  d8 device pool: {a / 2**20:.1f} MiB fp32 master, {b / 2**20:.1f} MiB bf16 master and moments, {n} parameters')
assert 8 * n <= a - b <= 10 * n, (a, b, n)"
cfg "$T/off.json" ", \"bf16\": {\"enabled\": true, $MASTER}, \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\"}}"
expect 1 "bf16.bf16_master_weights_and_grads with zero_optimization.offload_optimizer \"cpu\" is not built" -- "$DSC" train --device cuda --config "$T/off.json" --model d2 --max-steps 1 --out "$T/bad"
finish
