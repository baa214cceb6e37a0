#!/usr/bin/env bash
# scripts/gpu-test.sh - build dsc's CUDA kernels and run the GPU tests on a machine with an NVIDIA
# GPU (Hopper by default): correctness against the CPU/float64 references, the nccl comm backend
# and the trainer's GPU paths, compute-sanitizer on the test kernels, and the GPT-2 training-step
# and decode benchmarks.
#
# Usage: scripts/gpu-test.sh [--no-sanitize] [--no-bench] [--build-only] [--only REGEX] [--log DIR]
#   --only REGEX runs only the steps whose name matches (e.g. --only 'decode|generate').
#   --log defaults to $OUT when that is set.
#   BUILD_DIR (default build-cuda), CUDA_ARCH (default sm_90a for the direct build),
#   DSC_DIRECT_BUILD=1 (skip CMake even when the dependencies are there).
#   --log DIR keeps each test's output in DIR/<name>.log (default: $OUT/gpu-test-logs when the
#   environment has OUT). --only RE runs only the tests and benchmarks whose name matches the
#   extended regular expression RE (e.g. 'nccl|dump_grads': the nccl backend's tests).
# Build: with CMake (-DDSC_CUDA=ON) when the CPU library's dependencies are installed (jansson,
# libmicrohttpd, cmocka, OpenBLAS, xxhash); otherwise the kernels, the tests and the few CPU
# sources the tests compare against are compiled directly with nvcc and gcc (OpenBLAS replaced by
# plain loops from tests/cuda/compat when it is missing). Exit status: 0 when every test passed
# or was skipped, 1 otherwise.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD_DIR:-$ROOT/build-cuda}
ARCH=${CUDA_ARCH:-sm_90a}
JOBS=$(nproc 2>/dev/null || echo 4)
SANITIZE=1 BENCH=1 BUILD_ONLY=0 LOG="${OUT:-}" ONLY=""
while [ $# -gt 0 ]; do
    case "$1" in
    --no-sanitize) SANITIZE=0 ;;
    --no-bench) BENCH=0 ;;
    --build-only) BUILD_ONLY=1 ;;
    --log) LOG=$2; shift ;;
    --only) ONLY=$2; shift ;;
    *) echo "usage: $0 [--no-sanitize] [--no-bench] [--build-only] [--only REGEX] [--log DIR]" >&2; exit 2 ;;
    esac
    shift
done
[ -z "$LOG" ] && [ -n "${OUT:-}" ] && LOG="$OUT/gpu-test-logs"
[ -n "$LOG" ] && mkdir -p "$LOG"
SUMMARY=()
FAILED=0

note() { echo "== $*"; }
record() { SUMMARY+=("$(printf '%-44s %s' "$1" "$2")"); }

# ---- what is here ----
note "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv 2>&1 | head -3
command -v nvcc >/dev/null || { echo "nvcc not found: install the CUDA toolkit"; exit 1; }
nvcc --version | tail -2
CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
SANITIZER=$(command -v compute-sanitizer || ls "$CUDA_HOME"/bin/compute-sanitizer \
    "$CUDA_HOME"/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1 || true)

have_cpu_deps() {
    command -v pkg-config >/dev/null && command -v cmake >/dev/null &&
        pkg-config --exists jansson libmicrohttpd cmocka openblas 2>/dev/null &&
        echo '#include <xxhash.h>' | cc -E -x c - >/dev/null 2>&1 # CPATH counts too
}

# ---- build ----
TESTS=(test_cuda_kernels test_cuda_llama_kernels test_cuda_attention test_cuda_optim
    test_cuda_gpt2 test_cuda_llama test_cuda_decode test_cuda_llama_decode test_cuda_nccl
    test_cuda_fp8)
# The direct build compiles only the CPU sources the kernel tests compare against; these need
# the whole library (the generation loop, the model interface, the comm layer and NCCL) and so
# the CMake build.
CMAKE_ONLY_TESTS=" test_cuda_decode test_cuda_llama_decode test_cuda_nccl "
build_cmake() {
    note "build: CMake in $BUILD (-DDSC_CUDA=ON)"
    cmake -S "$ROOT" -B "$BUILD" -DDSC_CUDA=ON -DDSC_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Release &&
        cmake --build "$BUILD" -j "$JOBS" --target dsc_static dsc "${TESTS[@]}" &&
        BIN="$BUILD/tests"
}

build_direct() {
    local out="$BUILD/direct" inc=(-I"$ROOT/include" -I"$ROOT/src") cblas=()
    note "build: direct nvcc/gcc in $out (no CMake: the CPU library's dependencies are not all here)"
    mkdir -p "$out"
    if ! echo '#include <cblas.h>' | gcc -E -x c - >/dev/null 2>&1 || ! ldconfig -p | grep libopenblas >/dev/null; then
        echo "OpenBLAS not found: the CPU reference uses tests/cuda/compat (plain loops)"
        inc+=(-I"$ROOT/tests/cuda/compat")
        cblas=("$ROOT/tests/cuda/compat/cblas_naive.c")
    else
        cblas=(-lopenblas)
    fi
    local nvflags=(-arch="$ARCH" -O3 -std=c++17 -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-fopenmp
        --Werror=all-warnings "${inc[@]}")
    local cflags=(-std=gnu11 -O2 -fopenmp -Wall -Wextra -Wno-unused-parameter "${inc[@]}")
    local pids=() objs=() f o
    for f in "$ROOT"/src/cuda/*.cu "$ROOT"/src/model/*/*.cu "$ROOT"/src/engine/gpu/*.cu; do
        o="$out/$(basename "$f" .cu).o"
        objs+=("$o")
        nvcc "${nvflags[@]}" -c "$f" -o "$o" & pids+=($!)
    done
    for f in base/status.c base/log.c base/half.c base/time.c model/blas.c model/common.c \
        model/gpt2/gpt2.c model/gpt2/kernels.c model/llama/llama.c model/llama/kernels.c \
        engine/optim/optim.c engine/optim/optim_avx2.c engine/optim/optim_avx512.c; do
        o="$out/$(echo "$f" | tr / _ | sed 's/\.c$/.o/')"
        objs+=("$o")
        gcc "${cflags[@]}" -c "$ROOT/src/$f" -o "$o" & pids+=($!)
    done
    if [ "${cblas[0]}" != "-lopenblas" ]; then
        gcc "${cflags[@]}" -c "${cblas[0]}" -o "$out/cblas_naive.o" & pids+=($!)
        objs+=("$out/cblas_naive.o")
        cblas=()
    fi
    # The memory pools (train_state and devbuf take device buffers from them): their CUDA back end
    # needs the runtime's headers.
    local cuinc
    cuinc="$(dirname "$(command -v nvcc)")/../include"
    for f in "$ROOT"/src/mem/*.c; do
        o="$out/mem_$(basename "$f" .c).o"
        objs+=("$o")
        gcc "${cflags[@]}" -DDSC_WITH_CUDA=1 -I"$cuinc" -c "$f" -o "$o" & pids+=($!)
    done
    local ok=1
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    [ $ok = 1 ] || return 1
    pids=()
    for t in "${TESTS[@]}"; do
        [[ "$CMAKE_ONLY_TESTS" == *" $t "* ]] && continue
        nvcc "${nvflags[@]}" -I"$ROOT/tests/cuda" "$ROOT/tests/cuda/$t.cu" "${objs[@]}" \
            "${cblas[@]}" -lcublasLt -lgomp -lpthread -lm -o "$out/$t" & pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    [ $ok = 1 ] && BIN="$out"
}

T0=$(date +%s)
BIN=""
if [ "${DSC_DIRECT_BUILD:-0}" != 1 ] && have_cpu_deps; then build_cmake; else build_direct; fi
if [ -z "$BIN" ]; then
    echo "BUILD FAILED"
    exit 1
fi
record "build ($(( $(date +%s) - T0 )) s)" "ok"
[ "$BUILD_ONLY" = 1 ] && { note "built into $BIN"; exit 0; }

# ---- tests ----
run() { # name, timeout, command...
    local name=$1 limit=$2 rc
    shift 2
    if [ -n "$ONLY" ] && ! [[ "$name" =~ $ONLY ]]; then return 0; fi
    local arg
    for arg in "$@"; do
        if [[ "$arg" == "$BIN"/* ]] && [ ! -e "$arg" ]; then
            record "$name" "not run (not built: the direct build lacks it)"
            return 0
        fi
    done
    note "$name"
    if [ -n "$LOG" ]; then
        timeout "$limit" "$@" 2>&1 | tee "$LOG/${name//[^A-Za-z0-9_.=-]/_}.log"
    else
        timeout "$limit" "$@" 2>&1
    fi
    rc=$?
    case $rc in
    0) record "$name" "PASS" ;;
    77) record "$name" "SKIP (no device)" ;;
    124) record "$name" "FAIL (timeout ${limit}s)"; FAILED=1 ;;
    *) record "$name" "FAIL (exit $rc)"; FAILED=1 ;;
    esac
}

for t in "${TESTS[@]}"; do run "$t" 300 "$BIN/$t"; done
# dsc train --device cuda against the CPU path, fp16, several ranks host-staged, the nccl path,
# --dump-grads on the GPU, generation, a model of the user's own (examples/own_model, built
# against an install of $BUILD) (need the dsc binary: CMake builds only)
for t in test_train_gpu test_train_gpu_fp16 test_train_gpu_ranks test_train_nccl \
    test_train_llama_gpu test_dump_grads_gpu test_generate_gpu test_generate_llama_gpu \
    test_own_model_gpu test_fp8_gpu; do
    if [ -x "$BUILD/dsc" ]; then
        run "$t" 900 env DSC="$BUILD/dsc" DSC_SOURCE_DIR="$ROOT" bash "$ROOT/tests/gpu/$t.sh"
    else
        record "$t" "not run (no dsc binary in the direct build)"
    fi
done

if [ "$BENCH" = 1 ]; then
    run "bench gpt2-124M B=16 T=1024" 120 "$BIN/test_cuda_gpt2" --bench gpt2-124M 16 1024 10
    run "bench gpt2-124M B=64 T=1024" 120 "$BIN/test_cuda_gpt2" --bench gpt2-124M 64 1024 5
    run "bench gpt2-350M B=8 T=1024" 120 "$BIN/test_cuda_gpt2" --bench gpt2-350M 8 1024 10
    run "bench decode gpt2-124M B=1" 120 "$BIN/test_cuda_decode" --bench gpt2-124M 1 64 128
    run "bench decode gpt2-124M B=8" 120 "$BIN/test_cuda_decode" --bench gpt2-124M 8 64 128
fi

if [ "$SANITIZE" = 1 ]; then
    if [ -n "$SANITIZER" ]; then
        export DSC_TEST_SMALL=1
        run "memcheck test_cuda_kernels" 150 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BIN/test_cuda_kernels"
        run "memcheck test_cuda_llama_kernels" 150 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BIN/test_cuda_llama_kernels"
        run "memcheck test_cuda_attention" 150 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BIN/test_cuda_attention"
        run "racecheck test_cuda_attention" 150 "$SANITIZER" --tool racecheck --error-exitcode 9 "$BIN/test_cuda_attention"
        run "initcheck test_cuda_attention" 150 "$SANITIZER" --tool initcheck --error-exitcode 9 "$BIN/test_cuda_attention"
        run "memcheck test_cuda_fp8" 150 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BIN/test_cuda_fp8"
        run "memcheck test_cuda_optim" 150 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BIN/test_cuda_optim"
        run "memcheck test_cuda_gpt2" 150 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BIN/test_cuda_gpt2"
        run "memcheck test_cuda_decode" 300 "$SANITIZER" --tool memcheck --error-exitcode 9 "$BIN/test_cuda_decode"
        run "racecheck test_cuda_decode" 300 "$SANITIZER" --tool racecheck --error-exitcode 9 "$BIN/test_cuda_decode"
        unset DSC_TEST_SMALL
    else
        record "compute-sanitizer" "not found, skipped"
    fi
fi

note "summary ($(( $(date +%s) - T0 )) s)"
printf '%s\n' "${SUMMARY[@]}"
exit $FAILED
