#!/usr/bin/env bash
# dsc train --device cuda in fp16: the GPU computes in IEEE fp16 (fp32 master weights, optimizer
# state and gradients) under the engine's loss scaler. Its loss curve must agree with the CPU's
# fp16 run and with the GPU's bf16 run (the tolerances of the bf16 CPU/GPU comparison in
# test_train_gpu.sh) and fall; ZeRO-Offload in fp16 must agree with the GPU optimizer; a loss
# scale of 2^32 must overflow, skip steps and halve the scale until training proceeds, as it does
# on the CPU; the banner and metrics.jsonl name the precision; an fp32 config still gets the note
# that the GPU computes in bf16. Exit 77 (skipped) when no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh" # cfg, run_one, compare, falls
gpu_or_skip

# A fixed scale of 2^12 (the window is longer than the run): no overflow, so the runs compare
# step for step.
cfg "$T/fp16.json" ', "fp16": {"enabled": true, "initial_scale_power": 12}'
cfg "$T/bf16.json" ', "bf16": {"enabled": true}'
cfg "$T/fp32.json" ''
cfg "$T/offload.json" ', "fp16": {"enabled": true, "initial_scale_power": 12}, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
# 2^32: every step overflows until the scale has come down (one halving per skipped step).
cfg "$T/forced.json" ', "fp16": {"enabled": true, "initial_scale_power": 32, "hysteresis": 1}'
run() { run_one "$@"; }
run cpu16 cpu "$T/fp16.json" 40
run gpu16 cuda "$T/fp16.json" 40
run gpu_bf16 cuda "$T/bf16.json" 40
DSC_SIMD=scalar run off16 cuda "$T/offload.json" 40 # the GPU step equals the scalar CPU step
DSC_SIMD=scalar DSC_OFFLOAD_STREAM=0 run off16_whole cuda "$T/offload.json" 40
cfg "$T/forced_off.json" ', "fp16": {"enabled": true, "initial_scale_power": 32, "hysteresis": 1}, "zero_optimization": {"stage": 1, "offload_optimizer": {"device": "cpu"}}'
run forced_off cuda "$T/forced_off.json" 24
DSC_OFFLOAD_STREAM=0 run forced_off_whole cuda "$T/forced_off.json" 24
sed 's/"stage": 1, "offload_optimizer": {"device": "cpu"}/"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}/' "$T/forced_off.json" >"$T/forced_poff.json"
run forced_poff cuda "$T/forced_poff.json" 24
run forced cuda "$T/forced.json" 40
run cpu_forced cpu "$T/forced.json" 40
run fp32 cuda "$T/fp32.json" 2

# compare A B FIRST MEAN MAX: two runs step by step (as in test_train_gpu.sh): the same lr every
# step; step 1 within FIRST; every loss and validation loss within MAX, their mean within MEAN.
clean() { # no step skipped and the scale stayed at 2^12: the runs are comparable step for step
    $PY -c "
import json
m = [json.loads(x) for x in open('$T/$1/metrics.jsonl')]
assert len(m) == 40 and not any(x['skipped'] for x in m), [x['step'] for x in m if x['skipped']]
assert all(x['loss_scale'] == 4096 for x in m), [x['loss_scale'] for x in m]"
}
# forced RUN: step 1 overflows; every skipped step halves the scale (hysteresis 1), a clean step
# keeps it (the window is longer than the run); the skips end once the scale is small enough, and
# the loss then falls.
forced() {
    $PY - "$T/$1/metrics.jsonl" <<'PYEOF'
import json, sys
m = [json.loads(x) for x in open(sys.argv[1])]
assert len(m) == 40 and m[0]["skipped"] and m[0]["loss_scale"] == 2.0**32, m[0]
for x, y in zip(m, m[1:]):
    want = x["loss_scale"] / 2 if x["skipped"] else x["loss_scale"]
    assert y["loss_scale"] == want, (x, y) # the window (1000) is longer than the run: no growth
    if x["skipped"]:
        assert x["grad_norm"] == -1.0, x # reported as not finite
skips = sum(x["skipped"] for x in m)
applied = [x for x in m if not x["skipped"]]
assert 3 <= skips <= 30 and len(applied) >= 10, skips
l0, l1 = m[0]["loss"], sum(x["loss"] for x in m[-5:]) / 5
print(f"  {sys.argv[1].split('/')[-2]}: {skips} steps skipped, scale 2^32 -> "
      f"{m[-1]['loss_scale']:g}, loss {l0:.4f} -> {l1:.4f}")
assert l1 < 0.9 * l0, (l0, l1)
PYEOF
}
skips_close() { # the GPU (fp16 activations) and the CPU (fp16 gradients) stop skipping close together
    $PY -c "
import json
g = sum(json.loads(x)['skipped'] for x in open('$T/forced/metrics.jsonl'))
c = sum(json.loads(x)['skipped'] for x in open('$T/cpu_forced/metrics.jsonl'))
print(f'  skipped steps: GPU {g}, CPU {c}')
assert abs(g - c) <= 4, (g, c)"
}
compute_is() { # compute_is RUN TYPE: every metrics line of a GPU run names the type it computed in
    $PY -c "
import json
m = [json.loads(x) for x in open('$T/$1/metrics.jsonl')]
assert m and all(x.get('gpu_compute') == '$2' for x in m), m[0]"
}

check "fp16 runs stay clean (no overflow at 2^12)" -- clean gpu16
check "fp16 CPU run stays clean" -- clean cpu16
check "fp16: GPU and CPU loss curves agree" -- compare cpu16 gpu16 5e-3 0.02 0.06
check "GPU fp16 and GPU bf16 loss curves agree" -- compare gpu_bf16 gpu16 5e-3 0.02 0.06
check "GPU fp16 loss falls" -- falls gpu16
check "fp16 ZeRO-Offload agrees with the GPU optimizer" -- compare gpu16 off16 1e-6 1e-4 1e-3
check "loss scale 2^32 on the GPU: skips, halvings, then training" -- forced forced
check "loss scale 2^32 on the CPU: the same pattern" -- forced cpu_forced
check "GPU and CPU skip about as many steps" -- skips_close
check "the overflow shows in the progress line" -- grep -qF "skipped (overflow)" "$T/forced.log"
check "the banner says fp16 compute" -- grep -qF "fp16 compute, fp16 config" "$T/gpu16.log"
check "no bf16 note for an fp16 config" -- bash -c "! grep -q 'computes in bf16' '$T/gpu16.log'"
check "metrics name fp16" -- compute_is gpu16 fp16
check "metrics name bf16" -- compute_is gpu_bf16 bf16
check "an fp32 config: the note and bf16 compute" -- bash -c "grep -qF 'computes in bf16' '$T/fp32.log' && grep -qF 'bf16 compute, fp32 config' '$T/fp32.log'"
check "streamed fp16 ZeRO-Offload equals the whole-gradient offload step bit for bit" -- cmp <(cols "$T/off16/metrics.jsonl") <(cols "$T/off16_whole/metrics.jsonl")
check "streamed fp16 ZeRO-Offload skips the same overflowing steps, bit for bit" -- cmp <(cols "$T/forced_off/metrics.jsonl") <(cols "$T/forced_off_whole/metrics.jsonl")
check "the forced offload run skipped steps" -- grep -q '"skipped": true' "$T/forced_off/metrics.jsonl"
check "fp16 parameter offload (stage 3) skips the same steps and follows the same losses" -- $PY -c "
import json
a = [json.loads(x) for x in open('$T/forced_off/metrics.jsonl')]
b = [json.loads(x) for x in open('$T/forced_poff/metrics.jsonl')]
assert [x['skipped'] for x in a] == [x['skipped'] for x in b], 'skips differ'
assert all(abs(x['loss'] - y['loss']) <= 1e-3 * abs(x['loss']) for x, y in zip(a, b)), 'losses differ'"
finish
