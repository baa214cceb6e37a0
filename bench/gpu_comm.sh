#!/usr/bin/env bash
# gpu_comm.sh - bus bandwidth of dsc's nccl backend against NCCL's own nccl-tests on the same GPUs,
# in one run: all_reduce, all_gather and reduce_scatter, f32, out of place, 1 MiB .. 4 GiB.
#
#   NCCL_TESTS=DIR bench/gpu_comm.sh [DSC_BINARY] [NGPU]
#
# DIR holds nccl-tests' all_reduce_perf, all_gather_perf and reduce_scatter_perf, built beside
# this repository from NCCL's sources (not part of dsc). NGPU defaults to every visible GPU (at
# least 2). dsc: `dsc launch --num_gpus N dsc bench --scan` with DSC_COMM_BACKEND=nccl (one
# process per GPU); nccl-tests: one process driving N GPUs (-g N). Both use nccl-tests' bus
# bandwidth (all_reduce: S/t x 2(N-1)/N; all_gather, reduce_scatter: NS/t x (N-1)/N, S a rank's
# share), matched by the total bytes nccl-tests names. MAXP (default 32: 4 GiB) and MINP
# (default 20: 1 MiB) bound the sizes in powers of two. NCCL_NVLS_ENABLE=0 for both.
set -eu
DSC=${1:-${DSC:-build/dsc}}
PY=${PYTHON:-python3}
MINP=${MINP:-20}
MAXP=${MAXP:-32}
: "${NCCL_TESTS:?set NCCL_TESTS to the directory of the nccl-tests binaries}"
[ -x "$DSC" ] || { echo "gpu_comm.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
for t in all_reduce all_gather reduce_scatter; do
    [ -x "$NCCL_TESTS/${t}_perf" ] || { echo "gpu_comm.sh: $NCCL_TESTS/${t}_perf is missing" >&2; exit 2; }
done
NGPU=${2:-$("$DSC" report | sed -n 's/^CUDA devices *\([0-9]*\).*/\1/p')}
[ "${NGPU:-0}" -ge 2 ] || { echo "gpu_comm.sh: needs 2 or more GPUs (found ${NGPU:-0})" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

DSC_COMM_BACKEND=nccl "$DSC" launch --num_gpus "$NGPU" "$DSC" bench --all-reduce --all-gather \
    --reduce-scatter --scan --minsize "$MINP" --maxsize "$MAXP" --trials 20 --warmups 5 \
    --json "$W/dsc.jsonl" >"$W/dsc.log" 2>&1 ||
    { echo "gpu_comm.sh: dsc bench failed:" >&2; tail -20 "$W/dsc.log" >&2; exit 1; }
for t in all_reduce all_gather reduce_scatter; do
    "$NCCL_TESTS/${t}_perf" -b $((1 << MINP)) -e $((1 << MAXP)) -f 2 -g "$NGPU" -d float \
        -n 20 -w 5 >"$W/$t.log" 2>&1 ||
        { echo "gpu_comm.sh: ${t}_perf failed:" >&2; tail -20 "$W/$t.log" >&2; exit 1; }
done
echo "bus bandwidth, GB/s: dsc nccl backend (dsc bench) vs nccl-tests, $NGPU GPUs, f32, out of place"
$PY - "$W" "$NGPU" <<'PYEOF'
import json, sys
d, n = sys.argv[1], int(sys.argv[2])
ours = {}
for line in open(f"{d}/dsc.jsonl"):
    r = json.loads(line)
    total = r["bytes"] * (n if r["op"] in ("all_gather", "reduce_scatter") else 1)
    ours[(r["op"], total)] = r["busbw_gbps"] / 8  # dsc bench reports gigabits per second
worst = None
for op in ("all_reduce", "all_gather", "reduce_scatter"):
    print(f"\n{op}\n{'bytes':>12} {'dsc':>9} {'nccl-tests':>11} {'ratio':>7}")
    for line in open(f"{d}/{op}.log"):
        f = line.split()
        if len(f) < 8 or not f[0].isdigit():
            continue
        size, busbw = int(f[0]), float(f[7])  # out-of-place busbw is the 8th column
        mine = ours.get((op, size))
        if mine is None or busbw <= 0:
            continue
        ratio = mine / busbw
        if size >= 1 << 26:  # 64 MiB and up: where bandwidth, not latency, is measured
            worst = ratio if worst is None else min(worst, ratio)
        print(f"{size:>12} {mine:>9.1f} {busbw:>11.1f} {ratio:>6.2f}x")
print(f"\nworst ratio at 64 MiB and above: {worst:.3f} (goal >= 0.95)" if worst else "")
PYEOF
