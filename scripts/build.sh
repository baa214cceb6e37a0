#!/usr/bin/env bash
# Configure and build dsc into build/ (Release, warnings are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDSC_WERROR=ON >/dev/null
cmake --build build -j"$(nproc)"
