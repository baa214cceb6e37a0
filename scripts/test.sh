#!/usr/bin/env bash
# README command 2 (and CI): install what is missing, build, run the whole test suite, then the
# unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer (CPU code only: the GPU
# kernels have their own checks, compute-sanitizer in scripts/gpu-test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
(cd build && ctest --output-on-failure -j"$(nproc)" --timeout 900)

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DDSC_SANITIZE=ON -DDSC_WERROR=ON -DDSC_CUDA=OFF >/dev/null
cmake --build build-asan -j"$(nproc)"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j"$(nproc)" -L unit --timeout 900)

# The GPU sources, compiled for AMD with hipcc (compile only; CUDA is compiled by the main build).
bash scripts/hip-check.sh
