#!/usr/bin/env bash
# Compile every GPU source (the .cu files of src/cuda, src/model/*, src/engine/gpu) with Debian's
# hipcc for AMD gfx90a, compile only: the ROCm half of the one-source GPU tree (DS_BUILD_HIP=1).
# AMD hardware is not available here, so this checks that the portability header and the kernels
# build, not that they run.
# Installs hipcc, libamdhip64-dev and rocm-device-libs when missing (root needed).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(hipcc libamdhip64-dev rocm-device-libs)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "hip check: need root to install ${missing[*]}" >&2
    exit 1
  fi
  echo "dsc: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
DS_BUILD_HIP=1 cmake -S . -B build-hip -DCMAKE_BUILD_TYPE=Release -DDSC_WERROR=ON \
  -DDSC_BUILD_TESTS=OFF -DDSC_BUILD_BENCH=OFF >/dev/null
cmake --build build-hip --target dsc_gpu_objects -j"$(nproc)"
echo "hip check: every GPU source compiles for $(grep -o 'DSC_HIP_ARCH:STRING=.*' build-hip/CMakeCache.txt | cut -d= -f2)"
