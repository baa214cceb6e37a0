#!/usr/bin/env bash
# gpu_ft_nccl.sh - what in-place fault tolerance costs `dsc train --device cuda` over nccl: the
# same run with fault_tolerance.on_failure "degrade" (every step each rank copies its partition
# of the master and moments from its GPU to the host, snapshots it and sends the replica to its
# buddy) and "abort" (none of that), side by side. No competitor: DeepSpeed recovers by restart.
#
#   bench/gpu_ft_nccl.sh [DSC_BINARY] [MODEL] [WORLD]
#
# MODEL defaults to gpt2-124M, WORLD to 2; T 1024, global batch 16 sequences, random tokens,
# bf16, AdamW, ZeRO stage $STAGE (default 2). With fewer GPUs than WORLD the ranks share them, each
# under its own NCCL_HOSTID (NCCL then joins them through its socket transport: the step is then
# slower, the copy's cost the same). Tokens/s: median over the steps after $WARMUP (default 4) of
# $STEPS (default 12), from rank 0's metrics.jsonl.
set -eu
DSC=${1:-${DSC:-build/dsc}}
MODEL=${2:-gpt2-124M}
WORLD=${3:-2}
STAGE=${STAGE:-2}
PY=${PYTHON:-python3}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-4}
[ -x "$DSC" ] || { echo "gpu_ft_nccl.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
. "$(dirname "$0")/lib_data.sh" # random_shards, free_port
random_shards "$W/data" 1000000 50000
NGPU=$("$DSC" report | sed -n 's/^CUDA devices *\([0-9]*\).*/\1/p')
if [ "${NGPU:-0}" -lt "$WORLD" ]; then
    printf '#!/bin/sh\nNCCL_HOSTID="dsc-bench-host-${RANK:-0}" exec "%s" "$@"\n' "$(realpath "$DSC")" >"$W/dsc"
    chmod +x "$W/dsc"
    DSC="$W/dsc"
    export NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket
fi
export DSC_COMM_BACKEND=nccl NCCL_NVLS_ENABLE=0


bench() { # bench POLICY: tokens/s on stdout
    local name=$1 p pids=() r rc=0
    cat >"$W/$name.json" <<JSON
{"train_batch_size": 16, "train_micro_batch_size_per_gpu": $((16 / WORLD)), "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.999], "weight_decay": 0.1}},
 "zero_optimization": {"stage": $STAGE}, "fault_tolerance": {"on_failure": "$1"}}
JSON
    p=$(free_port)
    for ((r = 0; r < WORLD; r++)); do
        RANK=$r WORLD_SIZE=$WORLD LOCAL_RANK=$r LOCAL_WORLD_SIZE=$WORLD MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$p OMP_NUM_THREADS=$(($(nproc) / WORLD)) "$DSC" train --device cuda \
            --config "$W/$name.json" --model "$MODEL" --seq-len 1024 --data "$W/data" \
            --max-steps "$STEPS" --eval-every 0 --eval-batches 1 --sample-tokens 0 \
            --out "$W/$name" >"$W/$name.$r.log" 2>&1 &
        pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    [ $rc -eq 0 ] || { echo "gpu_ft_nccl.sh: run $name failed:" >&2; tail -5 "$W/$name".*.log >&2; exit 1; }
    # with DSC_LOG=info the engine reports where the snapshots' time went
    grep -h "snapshots and replicas" "$W/$name".*.log | sed 's/^dsc info (ft): /  /' >&2 || true
    $PY - "$W/$name/metrics.jsonl" "$WARMUP" <<'PYEOF'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
print(statistics.median(x["tokens_per_s"] for x in m))
PYEOF
}
echo "model $MODEL, world $WORLD on $NGPU GPU(s), ZeRO stage $STAGE, T 1024, global batch 16"
a=$(bench abort)
grep -m1 "^run dir" "$W/abort.0.log" | sed 's/^run dir [^|]*| /  /'
d=$(bench degrade)
$PY -c "
a, d = $a, $d
print(f'on_failure abort   (no snapshots): {a / 1e3:8.1f}k tokens/s, step {16384 / a * 1e3:7.1f} ms')
print(f'on_failure degrade (snapshots)   : {d / 1e3:8.1f}k tokens/s, step {16384 / d * 1e3:7.1f} ms')
print(f'cost of the snapshots: {(16384 / d - 16384 / a) * 1e3:.1f} ms a step ({(a / d - 1) * 100:.1f}%)')"
