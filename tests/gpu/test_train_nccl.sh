#!/usr/bin/env bash
# dsc train --device cuda with DSC_COMM_BACKEND=nccl (gradients reduced among the GPUs, the
# optimizer on each GPU's ZeRO partition). One GPU: at world 1 the nccl path at ZeRO stages 0-3
# gives bitwise the losses, lr, norms, validation losses and final weights of the GPU path without
# it (communication_data_type fp32: a one-rank reduction is the identity); with bf16 or fp16
# communication (the 16-bit staging runs) step 1 is equal and the rest within bf16 tolerance; a
# checkpoint of the nccl path resumes bit for bit; stage 3 (layers gathered through two slots,
# gradients reduce-scattered every micro-step) on a six-layer model is bitwise the GPU path
# without nccl in bf16 and in fp16 training, resumes bit for bit and agrees with bf16 reduction;
# two ranks forced onto one GPU fall back to host-staged with a note. World W = min(GPUs, 4) (on
# one GPU W = 4, the ranks under NCCL host ids of their own): stages 0-3 at world W train,
# stages 1 and 2 are bitwise equal, stage 3 agrees closely and allocates less device memory, stage 0 and the host-staged path agree within bf16 tolerance, the
# loss falls; LoRA at stage 3 keeps a slice of the frozen base per GPU (less device memory than
# the base whole, the same losses within the reductions' rounding). Exit 77 (skipped) when no CUDA device is usable or this build has no nccl backend.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=${PYTHON:-python3}
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
unset DSC_COMM_BACKEND DSC_HOST_COMM_BACKEND

probe=$(DSC_COMM_BACKEND=nccl "$DSC" train --device cuda --model d1 --max-steps 1 \
    --sample-tokens 0 --out "$T/probe" 2>&1)
if grep -qE "no CUDA device is usable|built without the CUDA kernels|built without NCCL" <<<"$probe"; then
    echo "SKIP: $(grep -o 'error: .*' <<<"$probe" | head -1)"
    finish >/dev/null
    exit 77
fi
NGPU=$("$DSC" report | sed -n 's/^CUDA devices *\([0-9]*\).*/\1/p')
echo "  $NGPU GPU(s) visible"
"$DSC" data default --out "$T/data" >/dev/null

# config FILE STAGE [extra json]: bf16 AdamW, warm-up + cosine, clipping, global batch 48;
# gradients reduced in $COMM_DT (default fp32)
config() {
    cat >"$1" <<JSON
{"train_batch_size": 48, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
 "gradient_clipping": 1.0, "bf16": {"enabled": true}, "communication_data_type": "${COMM_DT:-fp32}",
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5, "total_num_steps": 20}},
 "zero_optimization": {"stage": $2} ${3:-}}
JSON
}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # run_ranks, cols, compare, falls
run() { run_ranks "$@"; }

# nrun: run with DSC_COMM_BACKEND=nccl; one_gpu_nrun: the same with every rank on the first GPU.
nrun() { DSC_COMM_BACKEND=nccl run "$@"; }
whole() { DSC_GPU_STAGE3_PARTITION=0 "$@"; } # stage 3 with the 16-bit weights whole
one_gpu_nrun() {
    local v=${CUDA_VISIBLE_DEVICES:-0}
    CUDA_VISIBLE_DEVICES=${v%%,*} DSC_COMM_BACKEND=nccl run "$@"
}


# near A B FIRST MEAN MAX: step 1 within FIRST, every loss and validation loss within MAX and
# their mean within MEAN (relative), the same lr every step.
near() {
    $PY - "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" "$3" "$4" "$5" <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
first, mean, most = map(float, sys.argv[3:6])
assert len(a) == len(b) and a, (len(a), len(b))
rel = lambda x, y: abs(x - y) / abs(x)
diffs = []
for x, y in zip(a, b):
    assert x["step"] == y["step"] and x["lr"] == y["lr"], (x, y)
    for k in ("loss", "val_loss"):
        if k in x or k in y:
            diffs.append(rel(x[k], y[k]))
            assert diffs[-1] <= most, f"step {x['step']} {k}: {x[k]} vs {y[k]}"
d1 = rel(a[0]["loss"], b[0]["loss"])
avg = sum(diffs) / len(diffs)
print(f"  {sys.argv[1].split('/')[-2]} vs {sys.argv[2].split('/')[-2]}: step 1 {d1:.2e}, "
      f"mean {avg:.2e}, worst {max(diffs):.2e}")
assert d1 <= first and avg <= mean, (d1, avg)
PYEOF
}

falls() { $PY -c "
import json, sys
l = [json.loads(x)['loss'] for x in open('$T/$1/metrics.jsonl')]
print(f'  $1: loss {l[0]:.4f} -> {sum(l[-5:]) / 5:.4f}')
sys.exit(0 if sum(l[-5:]) / 5 < 0.85 * l[0] else 1)"; }

# ---- one GPU, world 1 ----
for st in 0 1 2 3; do config "$T/z$st.json" $st ""; done
check "world 1 without nccl trains (the reference)" -- \
    run base 1 "$T/z0.json" --max-steps 20 --dump-weights "$T/base.safetensors"
for st in 0 1 2 3; do # stage 3 here with the weights whole (as stage 2)
    check "world 1, nccl, stage $st trains" -- \
        whole nrun n$st 1 "$T/z$st.json" --max-steps 20 \
        --dump-weights "$T/n$st.safetensors"
    check "world 1, nccl, stage $st: metrics bitwise equal to the GPU path without nccl" -- \
        cmp -s <(cols "$T/base/metrics.jsonl") <(cols "$T/n$st/metrics.jsonl")
    check "world 1, nccl, stage $st: final weights bitwise equal" -- \
        cmp -s "$T/base.safetensors" "$T/n$st.safetensors"
done
check "the banner names the nccl path" -- \
    grep -q "nccl data-parallel over 1 GPU, ZeRO stage 2 (optimizer state partitioned), gradients reduced in f32" "$T/n2.0.log"
check "DSC_GPU_STAGE3_PARTITION=0: the banner of stage 3 says it runs as stage 2 (weights whole)" -- \
    grep -q "run as stage 2" "$T/n3.0.log"
echo "  world 1: $(cols "$T/base/metrics.jsonl" | sed -n '1p;20p' | cut -d' ' -f1-4 | tr '\n' ' ')"

# Stage 3 (its default: the 16-bit weights partitioned) streams the layers through two slots: six
# layers, so that each slot is reused (gathers one layer ahead, gradient slots settled and zeroed on
# reuse), 12 micro-steps per step.
check "world 1, d6 without nccl (the reference)" -- \
    run d6base 1 "$T/z0.json" --model d6 --max-steps 8 --dump-weights "$T/d6base.safetensors"
check "world 1, d6, nccl, stage 3 trains" -- \
    nrun d6n3 1 "$T/z3.json" --model d6 --max-steps 8 --dump-weights "$T/d6n3.safetensors"
check "  ... metrics and final weights bitwise the GPU path without nccl" -- \
    eval 'cmp -s <(cols "$T/d6base/metrics.jsonl") <(cols "$T/d6n3/metrics.jsonl") &&
          cmp -s "$T/d6base.safetensors" "$T/d6n3.safetensors"'
$PY -c "
import json
a = json.loads(open('$T/d6base/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/d6n3/metrics.jsonl').readlines()[-1])['gpu_allocated']
print(f'  d6 device pool allocated: {a / 2**20:.1f} MiB without nccl, {b / 2**20:.1f} MiB at stage 3 (world 1)')"
check "world 1, d6, nccl, stage 3: 4 steps saved" -- \
    nrun d6half 1 "$T/z3.json" --model d6 --max-steps 4 --save-dir "$T/ck3" --save-at-end
check "  ... resumed to 8" -- \
    nrun d6rest 1 "$T/z3.json" --model d6 --max-steps 8 --save-dir "$T/ck3" --resume
check "  ... steps 5-8 bitwise equal to the run without a break" -- \
    cmp -s <(cols "$T/d6n3/metrics.jsonl" | sed -n '5,8p') <(cols "$T/d6rest/metrics.jsonl")
COMM_DT=bf16 config "$T/c3bf16.json" 3
check "world 1, d6, nccl, stage 3, gradients reduced in bf16, trains" -- \
    nrun d6c3 1 "$T/c3bf16.json" --model d6 --max-steps 8
check "  ... step 1 equal, the rest within bf16 tolerance of fp32 reduction" -- \
    near d6base d6c3 0 5e-3 2e-2
sed 's/"bf16": {"enabled": true}/"fp16": {"enabled": true, "initial_scale_power": 12}/' \
    "$T/z0.json" >"$T/f0.json"
sed 's/"bf16": {"enabled": true}/"fp16": {"enabled": true, "initial_scale_power": 12}/' \
    "$T/z3.json" >"$T/f3.json"
check "world 1, d6, fp16 training without nccl" -- run d6f 1 "$T/f0.json" --model d6 --max-steps 8
check "world 1, d6, fp16 training, nccl, stage 3" -- nrun d6f3 1 "$T/f3.json" --model d6 --max-steps 8
check "  ... bitwise equal (losses, loss scale, skipped steps)" -- \
    cmp -s <(cols "$T/d6f/metrics.jsonl") <(cols "$T/d6f3/metrics.jsonl")
check "the banner of stage 3 says the weights are partitioned" -- \
    grep -q "ZeRO stage 3 (16-bit weights, gradients and optimizer state partitioned" "$T/d6n3.0.log"
DSC_GPU_STAGE3_PARTITION=yes nrun bad 1 "$T/z3.json" --max-steps 1 >/dev/null 2>&1
check "DSC_GPU_STAGE3_PARTITION=yes is refused, naming the variable" -- \
    grep -q "DSC_GPU_STAGE3_PARTITION=yes: expected 1" "$T/bad.0.log"

for dt in bf16 fp16; do
    COMM_DT=$dt config "$T/c$dt.json" 2
    check "world 1, nccl, gradients reduced in $dt, trains" -- nrun c$dt 1 "$T/c$dt.json" --max-steps 20
    check "  ... the banner says $dt" -- grep -q "gradients reduced in ${dt/fp/f}" "$T/c$dt.0.log"
    check "  ... step 1 equal, the rest within bf16 tolerance of fp32 reduction" -- \
        near base "c$dt" 0 5e-3 2e-2
done

check "world 1, nccl, stage 2: 10 steps saved" -- \
    nrun half 1 "$T/z2.json" --max-steps 10 --save-dir "$T/ck" --save-at-end
check "  ... resumed to 20" -- nrun rest 1 "$T/z2.json" --max-steps 20 --save-dir "$T/ck" --resume
check "  ... steps 11-20 bitwise equal to the run without a break" -- \
    cmp -s <(cols "$T/n2/metrics.jsonl" | sed -n '11,20p') <(cols "$T/rest/metrics.jsonl")

# Two ranks forced onto one GPU: NCCL cannot take them, so the run is host-staged and says why.
config "$T/two.json" 2 ""
check "two ranks on one GPU with nccl selected: host-staged, trains" -- \
    one_gpu_nrun two 2 "$T/two.json" --max-steps 5
check "  ... the banner says why" -- grep -q "ranks 0 and 1 share one GPU.*host-staged instead" "$T/two.0.log"

# ---- several GPUs ----
if [ "${NGPU:-1}" -lt 2 ]; then
    # One GPU: 4 ranks share it, each under its own NCCL_HOSTID, which NCCL takes for a host of
    # its own (so it accepts them, and connects them through its socket transport over loopback).
    W=4
    printf '#!/bin/sh\nNCCL_HOSTID="dsc-test-host-${RANK:-0}" exec "%s" "$@"\n' "$DSC" > "$T/own-host"
    chmod +x "$T/own-host"
    DSC="$T/own-host"
    export NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket
    echo "  several GPUs: $NGPU visible, world $W on it (a NCCL host id per rank)"
else
    W=$((NGPU < 4 ? NGPU : 4))
fi
# Bitwise comparisons between runs need NCCL to pick the same algorithm each time; the ring's
# summation order is fixed (NVLS and tree choices would only add tolerance questions).
export NCCL_ALGO=${NCCL_ALGO:-Ring}
for st in 0 1 2 3; do
    check "world $W, nccl, stage $st trains" -- nrun w$st $W "$T/z$st.json" --max-steps 20
done
check "world $W: the banner names the nccl path" -- grep -q "nccl data-parallel over $W GPUs" "$T/w2.0.log"
check "world $W, nccl: stage 1 == stage 2, bitwise" -- \
    cmp -s <(cols "$T/w2/metrics.jsonl") <(cols "$T/w1/metrics.jsonl")
# Stage 3 reduces the layers every micro-step (stage 2 once per step): the same sum, rounded
# differently.
check "world $W, nccl: stage 3 agrees with stage 2" -- near w2 w3 1e-6 1e-3 5e-3
# Memory: six layers, so that two slots hold less than the whole model.
check "world $W, nccl, d6: stage 2 and stage 3 train" -- eval 'nrun w2d6 $W "$T/z2.json" --model d6 --max-steps 3 &&
    nrun w3d6 $W "$T/z3.json" --model d6 --max-steps 3'
check "world $W, nccl, d6: stage 3 allocates less device memory than stage 2" -- $PY -c "
import json, sys
a = json.loads(open('$T/w2d6/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/w3d6/metrics.jsonl').readlines()[-1])['gpu_allocated']
print(f'  device pool allocated per rank: stage 2 {a / 2**20:.1f} MiB, stage 3 {b / 2**20:.1f} MiB')
sys.exit(0 if b < a else 1)"
# LoRA: at stage 3 each GPU keeps its slice of every layer's frozen base and gathers it beside the
# layer's adapters (two frozen slots); with DSC_GPU_STAGE3_PARTITION=0 the base is whole on every
# GPU. The gathered base is the same bits, so the two differ only as stage 3 and stage 2 do.
LORA='"lora": {"r": 8, "lora_alpha": 16, "target_modules": ["c_attn", "c_proj", "c_fc"]}'
config "$T/l3.json" 3 ", $LORA"
check "world $W, nccl, LoRA d6 at stage 3: the base partitioned, and whole, train" -- eval \
    'nrun l3 $W "$T/l3.json" --model d6 --max-steps 10 &&
     whole nrun l3w $W "$T/l3.json" --model d6 --max-steps 10'
check "  ... the banner names the partitioned path" -- grep -q "16-bit weights, gradients and optimizer state partitioned" "$T/l3.0.log"
check "  ... the same losses within the reductions' rounding" -- near l3w l3 1e-6 1e-3 5e-3
check "  ... the loss falls" -- $PY -c "
import json, sys
l = [json.loads(x)['loss'] for x in open('$T/l3/metrics.jsonl')]
sys.exit(0 if l[-1] < l[0] else 1)"
# d6's layer base: 12 C^2 weights and 13 C biases and norms, C 384, in 16 bits. Partitioned, a GPU
# holds two slots and 6 / W layers of it instead of 6.
check "  ... the partitioned base saves at least 6 - 2 - 6/$W - 1/2 layers of it on each GPU" -- $PY -c "
import json, sys
a = json.loads(open('$T/l3w/metrics.jsonl').readlines()[-1])['gpu_allocated']
b = json.loads(open('$T/l3/metrics.jsonl').readlines()[-1])['gpu_allocated']
layer = 2 * (12 * 384 ** 2 + 13 * 384)
want = (6 - 2 - 6 / $W - 0.5) * layer
print(f'  device pool allocated per rank: base whole {a / 2**20:.2f} MiB, partitioned {b / 2**20:.2f} MiB '
      f'(saved {(a - b) / 2**20:.2f} MiB, at least {want / 2**20:.2f} expected)')
sys.exit(0 if a - b >= want else 1)"
check "world $W, nccl: stage 0 (all-reduce) agrees with stage 2 (reduce-scatter)" -- near w2 w0 1e-3 5e-3 1e-2
check "world $W host-staged (no nccl), stage 2, trains" -- run hs $W "$T/z2.json" --max-steps 20
check "world $W, nccl agrees with host-staged" -- near hs w2 1e-3 5e-3 1e-2
check "world $W, nccl agrees with world 1" -- near base w2 1e-3 5e-3 1e-2
check "world $W, nccl: the loss falls" -- falls w2
finish
