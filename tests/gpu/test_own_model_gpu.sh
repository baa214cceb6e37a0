#!/usr/bin/env bash
# A model of the user's own on the GPU (examples/own_model with its device passes,
# own_model_cuda.cu): the example built against an installed dsc with -DOWN_MODEL_CUDA, trained
# by the engine's device trainer through the public headers. On one GPU (the optimizer on the
# device) its losses track the CPU run's (fp32) within bf16 tolerance and fall; a repeated run is
# bitwise equal; a run stopped at a checkpoint resumes bitwise; ZeRO stage 3 equals stage 0; with
# DSC_COMM_BACKEND=nccl (one rank: the device's reduce-scatter path, stage 3's hidden layer
# gathered through the layer slots) stages 0 and 3 are bitwise the run without nccl; fp16 with
# loss scaling trains too; two ranks on one GPU (host-staged) are bitwise equal at stages 0 and 3
# and track the one-rank GPU run.
# OWN_MODEL_GPU=path uses a program built already (e.g. on a machine without the compilers);
# otherwise it is built here from $DSC's build tree (cmake --install) with nvcc and cc.
# OWN_MODEL_KEEP=DIR copies the runs' logs into DIR.
# Exit 77 (skipped) when no CUDA device is usable or no CUDA build of the example can be made.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=${PYTHON:-/usr/bin/python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
unset DSC_COMM_BACKEND DSC_HOST_COMM_BACKEND RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
skip() { echo "SKIP: $*"; finish >/dev/null; exit 77; }

# ---- the program: given, or built against an install of $DSC's build tree ----
OM=${OWN_MODEL_GPU:-}
if [ -z "$OM" ]; then
    command -v nvcc >/dev/null || skip "nvcc not found: cannot build the example's device passes"
    BUILD=$(dirname "$DSC")
    cmake --install "$BUILD" --prefix "$T/p" >/dev/null || { echo "FAIL: install"; exit 1; }
    export PKG_CONFIG_PATH=$T/p/lib/pkgconfig
    pkg-config --static --libs dsc | grep -q -- -lcudart ||
        skip "$DSC was built without the CUDA kernels (its dsc.pc links no CUDA runtime)"
    E=$DSC_SOURCE_DIR/examples/own_model
    # shellcheck disable=SC2046
    nvcc -arch="${CUDA_ARCH:-sm_90a}" -O2 -c "$E/own_model_cuda.cu" $(pkg-config --cflags dsc) \
        -o "$T/own_model_cuda.o" &&
        cc -std=c11 -O2 -Wall -Wextra -Werror -DOWN_MODEL_CUDA -o "$T/own_model" "$E/own_model.c" \
            "$T/own_model_cuda.o" $(pkg-config --cflags dsc) -Wl,--as-needed \
            "$T/p/lib/libdsc.a" $(pkg-config --static --libs dsc) -lcublas -lm \
            -Wl,-rpath,"$T/p/lib" || # pkg-config's -ldsc may pick the install's shared library
        { echo "FAIL: the CUDA build of examples/own_model"; exit 1; }
    OM=$T/own_model
fi
probe=$("$OM" --device cuda --steps 0 2>&1)
if grep -qE "no CUDA device is usable|built without the CUDA kernels" <<<"$probe"; then
    skip "$(grep -o 'DSC_ERR_[A-Z_]*: .*' <<<"$probe" | head -1)"
fi

# ---- runs ----
S=30 K=12
om() { # om NAME FLAGS...: one rank
    timeout 300 "$OM" --steps $S "${@:2}" >"$T/$1.log" 2>&1 || { echo "run $1 failed:"; tail -5 "$T/$1.log"; return 1; }
}
launch() { # launch NAME FLAGS...: 2 ranks under dsc launch, both on the first GPU
    local v=${CUDA_VISIBLE_DEVICES:-0}
    CUDA_VISIBLE_DEVICES=${v%%,*} timeout 300 "$DSC" launch --num_procs 2 --master_port "$(free_port)" \
        "$OM" --steps $S "${@:2}" >"$T/$1.log" 2>&1 || { echo "run $1 failed:"; tail -5 "$T/$1.log"; return 1; }
}
# the lines that must agree bitwise: steps (after $2) and the final weights' checksum
lines() { grep -E '^(\[rank 0\] )?(step|weights)' "$1" | sed 's/^\[rank 0\] //' | awk -v from="${2:-0}" '$1 != "step" || $2 > from'; }
same() { cmp -s <(lines "$T/$1.log" "${3:-0}") <(lines "$T/$2.log" "${3:-0}"); }
# near A B FIRST MEAN: run B's losses against run A's: step 1 within FIRST (relative), their mean
# relative difference within MEAN, the same learning rates
near() {
    $PY - <(lines "$T/$1.log") <(lines "$T/$2.log") "$3" "$4" "$1" "$2" <<'PYEOF'
import sys
def steps(p):
    return {int(f[1]): (float(f[4]), float(f[7])) for f in (l.split() for l in open(p)) if f[0] == "step"}
a, b = steps(sys.argv[1]), steps(sys.argv[2])
first, mean = float(sys.argv[3]), float(sys.argv[4])
assert a and sorted(a) == sorted(b), f"steps {sorted(a)} vs {sorted(b)}"
rel = [abs(a[s][0] - b[s][0]) / abs(a[s][0]) for s in sorted(a)]
assert all(abs(a[s][1] - b[s][1]) <= 1e-12 * abs(a[s][1]) for s in a), "learning rates differ"
avg = sum(rel) / len(rel)
print(f"  {sys.argv[6]} vs {sys.argv[5]}: step 1 {rel[0]:.2e}, mean {avg:.2e}, worst {max(rel):.2e} over {len(rel)} steps")
sys.exit(0 if rel[0] <= first and avg <= mean else 1)
PYEOF
}
falls() { # the last step's loss below two thirds of the first's
    awk '$1 == "step" {l[$2] = $5} END {printf "  %s: loss %.4f -> %.4f\n", n, l[1], l[s]; exit !(l[s] < 0.67 * l[1])}' \
        n="$1" s=$S <(lines "$T/$1.log")
}
# config FILE STAGE [PRECISION]: the built-in config with bf16 (or the PRECISION section given)
# and gradients reduced in fp32, so that one rank's nccl reduction is the identity
config() {
    local prec='"bf16": {"enabled": true}'
    [ $# -ge 3 ] && prec=$3
    cat >"$1" <<JSON
{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 8, $prec,
 "communication_data_type": "fp32",
 "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}, "gradient_clipping": 1.0,
 "zero_optimization": {"stage": $2, "stage3_param_persistence_threshold": 0},
 "checkpoint": {"async": false, "interval_s": 0}}
JSON
}

check "CPU reference, $S steps" -- om cpu
check "GPU, stage 0, $S steps" -- om g0 --device cuda
check "the program names the GPU path" -- grep -q "own_model: 1 ranks, ZeRO stage 0, .*cuda kernels" "$T/g0.log"
check "  ... and the device trainer's mode (optimizer on the GPU)" -- grep -q "^device .*optimizer state on the GPU" "$T/g0.log"
check "$S step lines and a checksum" -- test "$(lines "$T/g0.log" | wc -l)" -eq $((S + 1))
check "GPU tracks the CPU (step 1 within 1e-2, mean within 3e-2)" -- near cpu g0 1e-2 3e-2
check "the GPU loss falls by a third or more" -- falls g0
check "GPU again: bitwise the same" -- om g0b --device cuda
check "  ... same lines" -- same g0 g0b
check "GPU, stage 3 (one rank)" -- om g3 --device cuda --stage 3
check "  ... bitwise stage 0" -- same g0 g3

# ---- checkpoint at step K on the GPU, resume to S ----
check "GPU run to step $K, saving" -- om part --device cuda --steps $K --save-dir "$T/ck" --save-every $K
check "  ... checkpoint global_step$K written" -- test "$(cat "$T/ck/latest" 2>/dev/null)" = "global_step$K"
check "GPU resume from global_step$K" -- om res --device cuda --resume "$T/ck"
check "  ... resumed after step $K" -- grep -q "after step $K\$" "$T/res.log"
check "  ... steps $((K + 1))-$S and the final weights bitwise the uninterrupted run's" -- same g0 res $K
check "GPU resume at stage 3" -- om res3 --device cuda --stage 3 --resume "$T/ck/global_step$K"
check "  ... bitwise too" -- same g0 res3 $K

# ---- device collectives on one rank: nccl stage 0 and 3 ----
config "$T/z0.json" 0
config "$T/z3.json" 3
check "config file, stage 0, without nccl" -- om f0 --device cuda --config "$T/z0.json"
check "  ... bitwise the built-in config's run" -- same g0 f0
check "DSC_COMM_BACKEND=nccl, stage 0" -- env DSC_COMM_BACKEND=nccl "$OM" --steps $S --device cuda --config "$T/z0.json" >"$T/n0.log" 2>&1
check "  ... the nccl path ran" -- grep -q "^device .*nccl data-parallel over 1 GPU, ZeRO stage 0" "$T/n0.log"
check "  ... bitwise the run without nccl" -- same f0 n0
check "DSC_COMM_BACKEND=nccl, stage 3 (the hidden layer through the layer slots)" -- \
    env DSC_COMM_BACKEND=nccl "$OM" --steps $S --device cuda --config "$T/z3.json" >"$T/n3.log" 2>&1
check "  ... the layers went through the slots" -- grep -q "ZeRO stage 3 (16-bit weights.*slots" "$T/n3.log"
check "  ... bitwise stage 0" -- same n0 n3

# ---- fp16 with loss scaling ----
config "$T/fp16.json" 0 '"fp16": {"enabled": true, "initial_scale_power": 12}'
check "fp16 on the GPU" -- om h0 --device cuda --config "$T/fp16.json"
check "  ... computes in fp16" -- grep -q "fp16 compute" "$T/h0.log"
check "  ... tracks the CPU (step 1 within 1e-2, mean within 3e-2)" -- near cpu h0 1e-2 3e-2
check "  ... the loss falls" -- falls h0

# ---- two ranks on one GPU (host-staged) ----
check "2 ranks, stage 0, host-staged" -- launch r0 --device cuda
check "2 ranks, stage 3, host-staged" -- launch r3 --device cuda --stage 3
check "  ... the host-staged path ran" -- grep -q "host-staged" "$T/r0.log"
check "  ... stage 3 bitwise stage 0" -- same r0 r3
check "  ... tracks the one-rank GPU run (step 1 within 1e-2, mean within 3e-2)" -- near g0 r0 1e-2 3e-2
[ -n "${OWN_MODEL_KEEP:-}" ] && cp "$T"/*.log "$OWN_MODEL_KEEP"/ # the runs' logs, for a look
finish
