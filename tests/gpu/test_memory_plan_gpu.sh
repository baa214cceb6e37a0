#!/usr/bin/env bash
# The memory plan on a GPU: for llama-3.2-1B at T 2048 (DSC_PLAN_MODEL, DSC_PLAN_T to change),
# GPU-resident (without and with the host copy, DSC_DEVICE_STATE=0), ZeRO-Offload and ZeRO-3 with
# offload_param, the plan's device bytes (the banner) are within 10% of the device memory the run
# used (the largest gpu_device_used of metrics.jsonl less what the device used before the run),
# and its host bytes within 10% of the peak resident size. A run whose plan exceeds the device is
# refused before it allocates, naming both numbers and a setting that would fit. Exit 77
# (skipped) when no CUDA device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-python3}
MODEL=${DSC_PLAN_MODEL:-llama-3.2-1B}
SEQ=${DSC_PLAN_T:-2048}

. "$DSC_SOURCE_DIR/tests/gpu/lib_train.sh"
gpu_or_skip

cfg() { # cfg FILE EXTRA_JSON
    cat >"$1" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
 "bf16": {"enabled": true}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}} $2}
JSON
}
cfg "$T/resident.json" ''
cfg "$T/offload.json" ', "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}'
cfg "$T/param.json" ', "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
 "offload_param": {"device": "cpu"}}'

bytes_of() { # bytes_of "N MiB|GiB"
    awk '{ print ($2 == "GiB") ? $1 * 1073741824 : $1 * 1048576 }' <<<"$1"
}

within10() { # within10 WHAT PLAN MEASURED
    awk -v p="$2" -v m="$3" -v n="$1" 'BEGIN { d = (p - m) / m;
        printf "%s: plan %.2f GiB, measured %.2f GiB (%+.1f%%)\n", n, p / 2^30, m / 2^30, 100 * d;
        exit (d > 0.10 || d < -0.10) }'
}

run_mode() { # run_mode NAME CONFIG [FLAGS...]
    local used0 log="$T/$1.log" host dev rss peak name=$1 conf=$2
    shift 2
    used0=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | head -1)
    /usr/bin/time -f "maxrss_kb %M" -o "$T/$name.rss" "$DSC" train --device cuda --model "$MODEL" \
        --seq-len "$SEQ" --max-steps 4 --sample-tokens 0 --eval-every 0 --config "$conf" \
        --out "$T/$name" "$@" > "$log" 2>&1 || { tail -5 "$log"; return 1; }
    set -- "$name"
    host=$(sed -n 's/.*memory plan per rank.*: host \([0-9.]* [MG]iB\) of.*/\1/p' "$log")
    host=$(bytes_of "$host")
    dev=$(bytes_of "$(sed -n 's/^  device \([0-9.]* [MG]iB\) of.*/\1/p' "$log")")
    rss=$(( $(sed -n 's/^maxrss_kb //p' "$T/$1.rss") * 1024 ))
    peak=$($PY -c "import json
used = [json.loads(l).get('gpu_device_used', 0) for l in open('$T/$1/metrics.jsonl')]
print(max(used) - $used0 * 2**20)")
    grep "memory plan" -A1 "$log"
    within10 "$1 host" "$host" "$rss" && within10 "$1 device" "$dev" "$peak"
}

export DSC_DEVICE_STATE=0 # the host keeps a copy of master and moments
check "GPU-resident, DSC_DEVICE_STATE=0: plan within 10% of the peaks" -- run_mode resident "$T/resident.json"
unset DSC_DEVICE_STATE # the default: no host copy of master or moments, runtime and staging only
check "GPU-resident (no host copy): plan within 10% of the peaks" -- run_mode nohost "$T/resident.json"
# ... and so do a save at the end (validated: the shard read back and hashed piece by piece) and
# a resume from it (the checksums, then the state loaded into the device piece by piece)
sed 's/"gradient_clipping": 1.0/"gradient_clipping": 1.0, "checkpoint": {"async": false}/' \
    "$T/resident.json" > "$T/saving.json"
check "GPU-resident (no host copy), a validated save: plan within 10% of the peaks" -- \
    run_mode nohost_save "$T/saving.json" --save-dir "$T/ck" --save-at-end
check "GPU-resident (no host copy), a resume: plan within 10% of the peaks" -- \
    run_mode nohost_resume "$T/saving.json" --save-dir "$T/ck" --resume global_step4 --max-steps 6
check "ZeRO-Offload: plan within 10% of the peaks" -- run_mode offload "$T/offload.json"
check "ZeRO-3 + offload_param: plan within 10% of the peaks" -- run_mode param "$T/param.json"
sed 's/"gradient_clipping": 1.0/"gradient_clipping": 0.0/' "$T/param.json" >"$T/plean.json"
check "ZeRO-3 + offload_param streamed (no clipping, no host accumulator): plan within 10%" -- \
    run_mode plean "$T/plean.json"

# The closing sample's host decoder copies every weight (fp32): skipped, with a note, where the
# host memory left beside the plan is smaller (llama-3.2-1B: 0.4 GiB planned, 4.6 GiB of copy).
DSC_HOST_MEM_LIMIT=3G "$DSC" train --device cuda --model llama-3.2-1B --seq-len 256 \
    --max-steps 1 --sample-tokens 8 --eval-every 0 --config "$T/resident.json" \
    --out "$T/sample" > "$T/sample.log" 2>&1
check "no closing sample beyond the host memory the plan left, and a note says so" -- grep -q \
    "no text sample: the host memory left beside the run's plan is smaller" "$T/sample.log"

# llama-3.2-3B on the GPU with a micro batch of 16 x 2048 tokens needs ~150 GiB of device
# memory: refused at once, naming both numbers and what would fit (a smaller micro batch,
# ZeRO-Offload).
cfg "$T/big.json" ''
sed -i 's/"train_micro_batch_size_per_gpu": 2/"train_micro_batch_size_per_gpu": 16/' "$T/big.json"
expect 1 "of device memory" -- "$DSC" train --device cuda --model llama-3.2-3B --seq-len 2048 \
    --max-steps 1 --config "$T/big.json" --out "$T/big"
expect 1 "settings that would fit: " -- "$DSC" train --device cuda --model llama-3.2-3B \
    --seq-len 2048 --max-steps 1 --config "$T/big.json" --out "$T/big"
check "the refused run wrote no metrics" -- test ! -e "$T/big/metrics.jsonl"
finish
