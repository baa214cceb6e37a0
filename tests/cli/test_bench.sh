#!/usr/bin/env bash
# dsc bench: the communication benchmarks (DeepSpeed's ds_bench shape) over the shm backend on
# this machine (and the mpi backend under mpirun where Open MPI is installed). One rank without a launcher; two, three and four ranks under `dsc launch`: every
# operation and size appears once in the table and in the --json lines, each result was checked
# (a wrong one would exit 1), the bandwidths are DeepSpeed's formulas applied to the measured
# duration, bf16 and fp16 at an odd world size, --async-op, --raw and GBps; bad flags are usage
# errors naming the flag.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=/usr/bin/python3
unset DSC_COMM_BACKEND RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT

expect 0 "--reduce-scatter" -- "$DSC" bench --help
expect 2 "has no all-to-all" -- "$DSC" bench --all-to-all
expect 2 "--dtype int8: expected float" -- "$DSC" bench --dtype int8
expect 2 "--bw-unit MBps: expected Gbps or GBps" -- "$DSC" bench --bw-unit MBps
expect 2 "--maxsize" -- "$DSC" bench --maxsize 40
expect 2 "--minsize 12 is above --maxsize 10" -- "$DSC" bench --scan --minsize 12 --maxsize 10
expect 2 "unknown benchmark 'gemm'" -- "$DSC" bench gemm
expect 2 "expected a whole number" -- "$DSC" bench --trials many
expect 1 "comm backend 'tcp' is unknown" -- "$DSC" bench --backend tcp --maxsize 10

. "$(dirname "$0")/lib_bench.sh" # json_ok

# One rank, no launcher: pt2pt is left out with a note.
expect 0 "(pt2pt needs two ranks" -- "$DSC" bench --scan --minsize 8 --maxsize 12 --trials 3 \
    --warmups 1 --json "$T/w1.jsonl"
check "one rank: every collective at 2^8..2^12 bytes, checked, DeepSpeed's bandwidths" -- \
    json_ok "$T/w1.jsonl" 1 all_reduce,all_gather,reduce_scatter,broadcast 256,512,1024,2048,4096

# The table: ds_bench's header and columns, DeepSpeed's size names.
"$DSC" bench --all-reduce --maxsize 20 --trials 3 >"$T/table.txt" 2>&1
check "the table has ds_bench's header" -- \
    grep -q "^---- Performance of all_reduce on 1 devices ---" "$T/table.txt"
check "  ... and columns" -- grep -qE "^Size \(Bytes\) +Description +Duration +Throughput \(Gbps\) +BusBW \(Gbps\)" "$T/table.txt"
check "  ... one row: 1.0 MB, 262144x4, a duration with its unit" -- \
    grep -qE "^1\.0 MB +262144x4 +[0-9.]+ (us|ms) +[0-9.]+ +[0-9.]+ *$" "$T/table.txt"
"$DSC" bench --broadcast --maxsize 16 --trials 3 --raw --bw-unit GBps >"$T/raw.txt" 2>&1
check "--raw: bytes and microseconds without units; GBps in the header" -- eval \
    'grep -qE "^65536 +16384x4 +[0-9.]+ +[0-9.]+ +[0-9.]+ *$" "$T/raw.txt" &&
     grep -q "Duration (us) *Throughput (GBps)" "$T/raw.txt"'

# Several ranks under dsc launch.
for n in 2 4; do
    check "$n ranks: every operation at 2^10..2^16 bytes" -- \
        "$DSC" launch --num_procs $n --master_port "$(free_port)" "$DSC" bench --scan --minsize 10 --maxsize 16 --trials 5 \
        --warmups 2 --json "$T/w$n.jsonl" >"$T/w$n.out" 2>&1
    check "  ... checked, DeepSpeed's bandwidths" -- json_ok "$T/w$n.jsonl" $n \
        all_reduce,all_gather,reduce_scatter,broadcast,pt2pt 1024,2048,4096,8192,16384,32768,65536
done
check "the table names the world size" -- grep -q "Performance of all_gather on 4 devices" "$T/w4.out"
for dt in bfloat16 half; do
    check "3 ranks, $dt, --async-op" -- "$DSC" launch --num_procs 3 --master_port "$(free_port)" "$DSC" bench --dtype $dt \
        --async-op --scan --minsize 6 --maxsize 14 --trials 4 --json "$T/w3$dt.jsonl" \
        >"$T/w3$dt.out" 2>&1
    check "  ... checked (sums exact in 16 bits), DeepSpeed's bandwidths" -- json_ok \
        "$T/w3$dt.jsonl" 3 all_reduce,all_gather,reduce_scatter,broadcast,pt2pt \
        64,128,256,512,1024,2048,4096,8192,16384
done

# The mpi backend under mpirun (dsc launch --launcher openmpi), where Open MPI is installed.
if "$DSC" report | grep -q "^comm backends.*mpi" && command -v mpirun >/dev/null &&
    mpirun --version 2>&1 | grep -q "Open MPI"; then
    check "mpi backend (--backend mpi), 2 ranks under mpirun" -- "$DSC" launch --launcher openmpi \
        --num_procs 2 --master_port "$(free_port)" "$DSC" bench --backend mpi --scan \
        --minsize 10 --maxsize 14 --trials 5 --json "$T/mpi.jsonl" >"$T/mpi.out" 2>&1
    check "  ... checked, DeepSpeed's bandwidths, backend mpi" -- eval \
        'json_ok "$T/mpi.jsonl" 2 all_reduce,all_gather,reduce_scatter,broadcast,pt2pt \
         1024,2048,4096,8192,16384 && grep -q "\"backend\": \"mpi\"" "$T/mpi.jsonl"'
else
    echo "  mpi backend: not built or no Open MPI mpirun here; left out"
fi
finish
