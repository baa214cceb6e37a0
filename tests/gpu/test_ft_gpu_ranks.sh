#!/usr/bin/env bash
# Fault tolerance of `dsc train --device cuda` with several ranks on one GPU (host-staged: the
# engine's host state is the training state, the GPU computes forward and backward). A transient
# fault (a rank sleeps past comm_timeout_s, every rank alive) is retried on a fresh communicator
# at the same world: the device takes the restored weights and the run ends bit for bit where the
# fault-free run ends. A rank killed mid-step: the survivors restore the last committed step on
# 3 ranks, rebuild the GPU staging for the engine's new layout, and end bit for bit where 3 ranks
# continuing from that step's saved state end (also on the GPU). Exit 77 (skipped) without a
# usable CUDA device.
set -u
. "$DSC_SOURCE_DIR/tests/fault/lib.sh" # config, run_ranks, restored_step, ref_weights, same_weights

probe=$("$DSC" train --device cuda --model d1 --max-steps 1 --sample-tokens 0 --data "$T/data" \
    --out "$T/probe" 2>&1)
if grep -qE "no CUDA device is usable|built without the CUDA kernels" <<<"$probe"; then
    echo "SKIP: $(grep -o 'error: .*' <<<"$probe" | head -1)"
    exit 77
fi
FLAGS=(--device cuda)
STEPS=12
config "$T/z2.json" 2
run_ranks base 4 "$T/z2.json" $STEPS
check "4 ranks on one GPU, host-staged, fault-free (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"
check "  ... the banner says host-staged" -- grep -q "host-staged" "$T/base/log.0"

run_ranks tr 4 "$T/z2.json" $STEPS DSC_FT_INJECT=1:5:forward:sleep=3
check "transient fault: all 4 finish (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"
check "  ... retried at the same world" -- grep -q "on 4 ranks (was 4; transient" "$T/tr/log.0"
check "  ... weights == the fault-free run, bit for bit" -- \
    same_weights "$T/tr/w.safetensors" "$T/base/w.safetensors" 0

config "$T/z2m.json" 2 "" ", \"csv_monitor\": {\"enabled\": true, \"output_path\": \"$T/csv\", \"job_name\": \"kill\"}"
run_ranks kill 4 "$T/z2m.json" $STEPS DSC_FT_INJECT=2:6:reduce
check "rank 2 killed in step 6: survivors finish (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 137 0"
b=$(restored_step kill)
check "  ... restored step $b (4 or 5) on 3 ranks" -- test "$b" = 4 -o "$b" = 5
check "  ... weights == 3 ranks on the GPU continuing from step $b, bit for bit" -- \
    same_weights "$T/kill/w.safetensors" "$(ref_weights 2 "${b:-0}" $STEPS)" 0
# MFU counts each rank's share of the GPU: 4 ranks a quarter each, the 3 survivors a third each,
# so MFU per token/s (the whole device's peak in both) is the same before and after.
check "  ... MFU per token/s unchanged by the recovery (each survivor's share of the GPU grew)" -- \
    $PY - "$T/csv/kill" << 'PYEOF'
import csv, sys
rows = lambda f: [float(r[1]) for r in csv.reader(open(f"{sys.argv[1]}/{f}")) if r and r[0] != "step"]
mfu, tps = rows("Train_Samples_mfu.csv"), rows("Train_Samples_tokens_per_s.csv")
r = [m / t for m, t in zip(mfu, tps)]
print(f"  MFU per token/s: first {r[0]:.4g}, last {r[-1]:.4g}")
sys.exit(0 if len(r) >= 10 and abs(r[-1] / r[0] - 1) < 0.01 else 1)
PYEOF
finish
