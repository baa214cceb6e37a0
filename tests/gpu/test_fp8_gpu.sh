#!/usr/bin/env bash
# The fp8 section on one GPU (docs/fp8.md): the Llama family's layer products with FP8 operands.
# Step-1 gradients of both formats against the CPU's fp32 passes within the tolerance 8-bit
# operands allow (worst tensor relative L2 <= 0.15; bf16's are printed beside), and measurably
# unlike bf16's (the section acts); the loss falls and follows the bf16 run; recomputed layers
# (activation checkpointing) give the same gradient bits; a checkpoint resumes bit for bit (the
# recipe keeps no state); LoRA (beside a bf16 LoRA run) and ZeRO-Offload train with it; the banner says so. Exit 77
# (skipped) without a CUDA device, or on a GPU without FP8 tensor cores.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, compare, falls
gpu_or_skip
export MODEL=llama-d2
FP8=', "bf16": {"enabled": true}, "zero_optimization": {"stage": 1}'
cfg "$T/bf16.json" "$FP8"
cfg "$T/hyb.json" "$FP8, \"fp8\": {\"enabled\": true}"
cfg "$T/e4.json" "$FP8, \"fp8\": {\"enabled\": true, \"fp8_format\": \"e4m3\"}"
cfg "$T/hyb_ac.json" "$FP8, \"fp8\": {\"enabled\": true}, \"activation_checkpointing\": {}"
cfg "$T/hyb_off.json" ', "bf16": {"enabled": true}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "fp8": {"enabled": true}'
LORA='"lora": {"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}'
cfg "$T/lora.json" "$FP8, $LORA"
cfg "$T/hyb_lora.json" "$FP8, \"fp8\": {\"enabled\": true}, $LORA"

probe=$("$DSC" train --device cuda --config "$T/hyb.json" --model llama-d2 --seq-len 64 --max-steps 1 \
    --sample-tokens 0 --eval-every 0 --out "$T/probe8" 2>&1)
if grep -q "no FP8 tensor cores" <<<"$probe"; then
    echo "SKIP: $(grep -o 'this GPU.*cores' <<<"$probe" | head -1)"
    exit 77
fi

for r in bf16 hyb e4 hyb_ac; do
    run_one "g_$r" cuda "$T/$r.json" 1 --dump-grads "$T/g_$r.st"
done
run_one g_cpu cpu "$T/bf16.json" 1 --dump-grads "$T/g_cpu.st"
run_one bf16 cuda "$T/bf16.json" 40
run_one hyb cuda "$T/hyb.json" 40
run_one e4 cuda "$T/e4.json" 40
run_one hyb_half cuda "$T/hyb.json" 20 --save-dir "$T/ck" --save-at-end
run_one hyb_rest cuda "$T/hyb.json" 40 --save-dir "$T/ck" --resume
run_one hyb_off cuda "$T/hyb_off.json" 40
run_one lora cuda "$T/lora.json" 40
run_one hyb_lora cuda "$T/hyb_lora.json" 40

check "step-1 gradients: FP8 (both formats) within 0.15 of the CPU's, and unlike bf16's" -- \
    $PY - "$T/g_cpu.st" "$T/g_bf16.st" "$T/g_hyb.st" "$T/g_e4.st" <<'PYEOF'
import json, struct, sys
import numpy as np
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    h.pop("__metadata__", None)
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]],
                             dtype={"F32": np.float32, "I32": np.int32}[v["dtype"]]).astype(np.float64)
            for k, v in h.items() if v["dtype"] == "F32"}
cpu, b16, hyb, e4 = (load(p) for p in sys.argv[1:5])
rel = lambda x, y: np.linalg.norm(x - y) / max(np.linalg.norm(x), 1e-30)
layer = [k for k in cpu if ".layers." in k and "norm" not in k]
worst = {n: max(rel(cpu[k], g[k]) for k in layer) for n, g in (("bf16", b16), ("hybrid", hyb), ("e4m3", e4))}
print("  step-1 gradients of the layers' linear weights, worst rel L2 against the CPU's: " +
      ", ".join(f"{n} {w:.2e}" for n, w in worst.items()))
allw = {n: max(rel(cpu[k], g[k]) for k in cpu) for n, g in (("bf16", b16), ("hybrid", hyb), ("e4m3", e4))}
print("  every tensor: " + ", ".join(f"{n} {w:.2e}" for n, w in allw.items()))
assert allw["hybrid"] <= 0.15 and allw["e4m3"] <= 0.15, allw
assert worst["hybrid"] > 2 * worst["bf16"] and worst["e4m3"] > 2 * worst["bf16"], worst
PYEOF
check "activation checkpointing with FP8: the same gradient bits" -- cmp -s "$T/g_hyb.st" "$T/g_hyb_ac.st"
check "FP8 hybrid: the loss falls" -- falls hyb
check "FP8 e4m3: the loss falls" -- falls e4
check "FP8 hybrid follows bf16 (losses within 5% on average, 12% at worst)" -- compare bf16 hyb 0.02 0.05 0.12
check "FP8: a checkpoint resumes bit for bit" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/hyb/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/hyb_rest/metrics.jsonl')]
assert b[0]['step'] == 21 and [x['loss'] for x in a[20:]] == [x['loss'] for x in b], (a[20:], b)"
check "FP8 with ZeRO-Offload: the loss falls" -- falls hyb_off
# LoRA's adapters learn more slowly than a full fine-tune in 40 steps: its loss falls, and the FP8
# run follows bf16's LoRA run
check "FP8 with LoRA: the loss falls and follows bf16 LoRA (within 5% on average, 12% at worst)" -- \
    $PY -c "
import json
l = [json.loads(x)['loss'] for x in open('$T/hyb_lora/metrics.jsonl')]
print(f'  hyb_lora: loss {l[0]:.4f} -> {sum(l[-5:]) / 5:.4f}')
assert sum(l[-5:]) / 5 < 0.95 * l[0], l" && compare lora hyb_lora 0.02 0.05 0.12
check "the banner names fp8" -- grep -q "fp8: the 2 layers' linear products with E4M3 (forward) and E5M2 (gradient) operands" "$T/hyb.log"
expect 1 "family gpt2" -- "$DSC" train --device cuda --config "$T/hyb.json" --model d2 --seq-len 64 --max-steps 1 --sample-tokens 0 --out "$T/gpt2"
finish
