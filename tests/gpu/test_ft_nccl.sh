#!/usr/bin/env bash
# Fault tolerance of `dsc train --device cuda` with DSC_COMM_BACKEND=nccl: the training state lives
# on the GPUs, gradients are reduced by NCCL, and every step the device copies this rank's
# partition to the host for its snapshot and the buddy's replica. Four ranks, a GPU each where
# there are four; on a machine with fewer GPUs they share one, each rank under its own NCCL_HOSTID, which NCCL takes for a host of
# its own (its socket transport over loopback then connects them; it refuses two ranks of one
# host on one GPU). A transient fault (a rank sleeps past comm_timeout_s, every rank alive) is
# retried on fresh communicators at the same world and ends bit for bit where the fault-free run
# ends. A rank killed mid-step at ZeRO stages 0, 2 and 3: the survivors see the NCCL failure,
# agree on the last committed step, form a 3-rank host communicator and a new NCCL one, upload
# the restored partitions and end bit for bit where 3 ranks on nccl continuing from that step's
# saved state end. Exit 77 (skipped) without a usable CUDA device or NCCL.
set -u
. "$DSC_SOURCE_DIR/tests/fault/lib.sh" # config, run_ranks, restored_step, ref_weights, same_weights

# With 4 GPUs or more a GPU per rank (LOCAL_RANK = RANK); with fewer, every rank its own NCCL
# host id (a separate host to NCCL and to the trainer's one-GPU-per-rank check), so that the
# ranks may share a GPU.
REAL_DSC=$DSC
DSC="$T/dsc-rank"
NGPU=$("$REAL_DSC" report 2>/dev/null | sed -n 's/^CUDA devices *\([0-9]*\).*/\1/p')
if [ "${NGPU:-0}" -ge 4 ]; then
    printf '#!/bin/sh\nLOCAL_RANK="${RANK:-0}" exec "%s" "$@"\n' "$REAL_DSC" > "$DSC"
    echo "  $NGPU GPUs: a GPU per rank"
else
    printf '#!/bin/sh\nNCCL_HOSTID="dsc-test-host-${RANK:-0}" exec "%s" "$@"\n' "$REAL_DSC" > "$DSC"
    export NCCL_SOCKET_IFNAME=lo NCCL_NET=Socket
    echo "  ${NGPU:-0} GPU(s): the ranks share GPU 0, each under its own NCCL_HOSTID"
fi
chmod +x "$DSC"
export DSC_COMM_BACKEND=nccl NCCL_NVLS_ENABLE=0
# Bitwise comparisons need NCCL to sum in the same order in every run: rings only.
export NCCL_ALGO=Ring
unset DSC_HOST_COMM_BACKEND

FLAGS=(--device cuda)
STEPS=12
COMM_S=5 STEP_S=10 # NCCL's set-up over sockets takes a moment; a sleep of 6 s is then a fault

probe=$(DSC_COMM_BACKEND= "$REAL_DSC" train --device cuda --model d1 --max-steps 1 \
    --sample-tokens 0 --data "$T/data" --out "$T/probe" 2>&1)
if grep -qE "no CUDA device is usable|built without the CUDA kernels" <<<"$probe"; then
    echo "SKIP: $(grep -o 'error: .*' <<<"$probe" | head -1)"
    exit 77
fi
config "$T/z2.json" 2
run_ranks two 2 "$T/z2.json" 1
if ! grep -q "nccl data-parallel over 2 GPUs" "$T/two/log.0"; then
    echo "SKIP: two nccl ranks did not start: $(grep -h 'error' "$T/two"/log.* | head -1)"
    exit 77
fi

run_ranks base 4 "$T/z2.json" $STEPS
check "4 nccl ranks, stage 2, fault-free (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"
check "  ... the banner says nccl over 4 GPUs" -- grep -q "nccl data-parallel over 4 GPUs" "$T/base/log.0"

run_ranks tr 4 "$T/z2.json" $STEPS DSC_FT_INJECT=1:5:forward:sleep=6
check "transient fault: all 4 finish (codes ${CODES[*]})" -- test "${CODES[*]}" = "0 0 0 0"
check "  ... retried at the same world, a new nccl communicator over 4 GPUs" -- \
    eval 'grep -q "on 4 ranks (was 4; transient" "$T/tr/log.0" &&
          grep -q "new nccl communicator over 4 GPUs" "$T/tr/log.0"'
check "  ... weights == the fault-free run, bit for bit" -- \
    same_weights "$T/tr/w.safetensors" "$T/base/w.safetensors" 0

for st in 0 2 3; do
    config "$T/k$st.json" $st
    run_ranks kill$st 4 "$T/k$st.json" $STEPS DSC_FT_INJECT=2:6:forward
    check "stage $st: rank 2 killed in step 6, the survivors finish (codes ${CODES[*]})" -- \
        test "${CODES[*]}" = "0 0 137 0"
    check "  ... the survivors name the NCCL failure" -- grep -q "NCCL" "$T/kill$st/log.0"
    b=$(restored_step kill$st)
    check "  ... restored step $b (4 or 5) on 3 ranks" -- test "$b" = 4 -o "$b" = 5
    check "  ... regrouped on 3 ranks, a new nccl communicator over 3 GPUs" -- \
        eval 'grep -q "on 3 ranks (was 4" "$T/kill$st/log.0" &&
              grep -q "new nccl communicator over 3 GPUs" "$T/kill$st/log.0"' 
    a=$(injected_time kill$st) r=$(resumed_time kill$st)
    ms=$(ms_between "${a:-0}" "${r:-0}")
    check "  ... resumed ${ms} ms after the kill (within comm_timeout_s $COMM_S s + 5 s)" -- \
        test "$ms" -gt 0 -a "$ms" -lt $((COMM_S * 1000 + 5000))
    check "  ... weights == 3 nccl ranks continuing from step $b, bit for bit" -- \
        same_weights "$T/kill$st/w.safetensors" "$(ref_weights $st "${b:-0}" $STEPS)" 0
done
finish
