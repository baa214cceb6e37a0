#!/usr/bin/env bash
# dsc bench over the nccl backend (buffers on the GPU): at world 1 on one GPU every collective
# from 1 KiB to 16 MiB in f32 and bf16, each result checked, DeepSpeed's bandwidths; with W =
# min(GPUs, 8) GPUs, the same under `dsc launch --num_gpus W`, and all_reduce's bus bandwidth at
# 256 MiB printed (--async-op: the calls back to back on the GPU; the figure to set beside
# nccl-tests'). Exit 77 (skipped) without a usable GPU
# or without the nccl backend.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=${PYTHON:-python3}
. "$DSC_SOURCE_DIR/tests/cli/lib_bench.sh" # json_ok
unset RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT
export DSC_COMM_BACKEND=nccl NCCL_NVLS_ENABLE=0

probe=$("$DSC" bench --all-reduce --maxsize 10 --trials 1 --warmups 0 2>&1)
if grep -qE "no CUDA device is usable|built without|unknown backend|not available" <<<"$probe"; then
    echo "SKIP: $(head -1 <<<"$probe")"
    finish >/dev/null
    exit 77
fi
NGPU=$("$DSC" report | sed -n 's/^CUDA devices *\([0-9]*\).*/\1/p')
SIZES=1024,2048,4096,8192,16384,32768,65536,131072,262144,524288,1048576,2097152,4194304,8388608,16777216
for dt in float bfloat16; do
    check "one GPU, nccl, $dt: every collective, 2^10..2^24 bytes" -- "$DSC" bench --dtype $dt \
        --scan --minsize 10 --maxsize 24 --trials 10 --json "$T/g1$dt.jsonl"
    check "  ... checked, DeepSpeed's bandwidths" -- json_ok "$T/g1$dt.jsonl" 1 \
        all_reduce,all_gather,reduce_scatter,broadcast "$SIZES"
done
if [ "${NGPU:-1}" -lt 2 ]; then
    echo "  several GPUs: $NGPU visible, the world-W part is left out"
    finish
    exit $?
fi
W=$((NGPU < 8 ? NGPU : 8))
check "$W GPUs, nccl: every operation, 2^10..2^24 bytes" -- "$DSC" launch --num_gpus $W "$DSC" \
    bench --scan --minsize 10 --maxsize 24 --trials 10 --json "$T/gw.jsonl"
check "  ... checked, DeepSpeed's bandwidths" -- json_ok "$T/gw.jsonl" $W \
    all_reduce,all_gather,reduce_scatter,broadcast,pt2pt "$SIZES"
"$DSC" launch --num_gpus $W "$DSC" bench --all-reduce --maxsize 28 --trials 20 --async-op 2>&1 |
    tail -2
finish
