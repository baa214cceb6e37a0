#!/usr/bin/env bash
# dsc train --device cuda and device memory: every device buffer of the run comes from one dsc
# pool, so steps after warm-up make no device allocation at all. Over a long run of a tiny model
# (DSC_GPU_MEM_STEPS, default 3000) the pool's allocation and system-allocation counts, its
# reserved and allocated bytes, and the device's used memory (cudaMemGetInfo, which also sees
# allocations outside the pool) must stay exactly where they were at step 10. Also: the same for
# ZeRO-Offload, and wall_clock_breakdown giving device times on the GPU. Exit 77 (skipped) when
# no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}
STEPS=${DSC_GPU_MEM_STEPS:-3000}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh"
gpu_or_skip

cfg() { # cfg FILE EXTRA_JSON
    cat >"$1" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 5,
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}}
 $2}
JSON
}
cfg "$T/plain.json" ''
cfg "$T/offload.json" ', "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
cfg "$T/timed.json" ', "wall_clock_breakdown": true'
run() { # run NAME CONFIG STEPS
    "$DSC" train --device cuda --config "$2" --model d2 --seq-len 64 --max-steps "$3" --seed 3 \
        --eval-every 0 --eval-batches 2 --sample-tokens 0 --out "$T/$1" >"$T/$1.log" 2>&1 ||
        { echo "FAIL: run $1"; cat "$T/$1.log"; failed=$((failed+1)); }
}
run long "$T/plain.json" "$STEPS"
run off "$T/offload.json" 300
run timed "$T/timed.json" 20

flat() { # flat NAME: the device memory fields of every step from the 10th on equal the 10th's
    $PY - "$T/$1/metrics.jsonl" <<'PYEOF'
import json, sys
m = [json.loads(l) for l in open(sys.argv[1])]
keys = ("gpu_allocs", "gpu_system_allocs", "gpu_reserved", "gpu_allocated", "gpu_device_used")
assert len(m) > 10 and all(k in m[0] for k in keys), "metrics.jsonl lacks the device memory fields"
ref = m[9]
assert ref["gpu_allocs"] > 0 and ref["gpu_reserved"] >= ref["gpu_allocated"] > 0, ref
for x in m[10:]:
    for k in keys:
        assert x[k] == ref[k], f"step {x['step']}: {k} {x[k]} != {ref[k]} at step {ref['step']}"
mib = lambda b: b / 2**20
print(f"  {sys.argv[1].split('/')[-2]}: steps 10..{m[-1]['step']}: {ref['gpu_allocs']} pool "
      f"allocations, {ref['gpu_system_allocs']} system allocations, pool "
      f"{mib(ref['gpu_reserved']):.1f} MiB reserved / {mib(ref['gpu_allocated']):.1f} MiB "
      f"allocated, device "
      f"{mib(ref['gpu_device_used']):.1f} MiB used: unchanged")
PYEOF
}
breakdown() { # device times: forward, backward and step all above zero
    $PY - "$T/timed.log" <<'PYEOF'
import re, sys
rows = [tuple(map(float, r)) for r in re.findall(
    r"fwd: ([\d.]+) \| bwd: ([\d.]+) \| bwd_inner: [\d.]+ \| bwd_allreduce: [\d.]+ \| "
    r"step: ([\d.]+)",
    open(sys.argv[1]).read())]
assert len(rows) == 4, f"expected 4 breakdown lines, got {rows}"
assert all(f > 0 and b > 0 and s > 0 for f, b, s in rows), rows
print(f"  breakdown (ms per 5 steps): fwd {rows[-1][0]}, bwd {rows[-1][1]}, step {rows[-1][2]}")
PYEOF
}
check "no device allocation after step 10 over $STEPS steps" -- flat long
check "no device allocation after step 10 with ZeRO-Offload" -- flat off
check "the long run trained (loss falls)" -- $PY -c "
import json
l = [json.loads(x)['loss'] for x in open('$T/long/metrics.jsonl')]
assert sum(l[-10:]) / 10 < 0.8 * l[0], (l[0], l[-10:])"
check "wall_clock_breakdown times the device's forward, backward and step" -- breakdown
finish
