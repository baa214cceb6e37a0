#!/usr/bin/env bash
# The library's layering, checked on the sources (docs/architecture.md, "Layers"):
#   - the GPU kernels (src/cuda) sit below the engine and the models: no src/cuda file includes
#     an engine/ or model/ header;
#   - a family is one folder: its device code (passes, decoder, kernels) is in src/model/<family>/
#     beside its host code, not in src/cuda/ (no src/cuda/<family>_* file); the GPU trainer's
#     own device files are in src/engine/gpu/;
#   - the command-line tool (src/cli) is wiring over the public API: its files include
#     include/dsc/ headers, its own (cli/) and the generated build info, and nothing else;
#   - in particular no src/cli file includes an engine/, comm/ or cuda/ header;
#   - the GPU training runtime is in the library (src/engine/gpu/, behind dsc/device.h): no
#     src/cli file is part of it or includes it.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC_SOURCE_DIR:?set DSC_SOURCE_DIR to the source tree}"
cd "$DSC_SOURCE_DIR" || exit 1

# includes DIR: "file header" for every quoted include of the files under DIR, sorted
includes() {
  grep -rHoE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "$1" \
    | sed -E 's/:[[:space:]]*#[[:space:]]*include[[:space:]]*"(.*)"/ \1/' | LC_ALL=C sort -u
}

# cuda_violations: src/cuda includes of engine/ or model/ headers
cuda_violations() {
  includes src/cuda | grep -E ' (engine|model)/'
}

# family_files_in_cuda: src/cuda files named after a family (a folder of src/model/)
family_files_in_cuda() {
  local fam
  for fam in $(find src/model -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | LC_ALL=C sort); do
    find src/cuda -maxdepth 1 -name "${fam}_*" | LC_ALL=C sort
  done
}

# cli_internal: the internal headers src/cli includes
cli_internal() {
  includes src/cli | grep -vE ' (dsc/|cli/|dsc_build_info\.h$)'
}

# cli_engine: the engine, comm and cuda headers src/cli includes (none may be left)
cli_engine() {
  cli_internal | grep -E ' (engine|comm|cuda)/'
}

out=$(cuda_violations)
check "src/cuda includes no engine/ or model/ header" -- test -z "$out"
[ -z "$out" ] || echo "$out"
out=$(family_files_in_cuda)
check "a family's device code is in its folder (src/model/<family>/), none in src/cuda" -- \
  test -z "$out"
[ -z "$out" ] || echo "$out"

now=$(cli_internal)
check "src/cli includes only dsc/, cli/ and the build info (no internal header of the library)" \
  -- test -z "$now"
[ -z "$now" ] || printf "internal includes (use include/dsc/, or a cli/ helper):\n%s\n" "$now"

# no engine, comm or GPU internals at all: the checkpoint, safetensors and Hugging Face folder
# calls the CLI uses are public (dsc/checkpoint.h, dsc/safetensors.h)
engine_inc=$(cli_engine)
check "src/cli includes no engine/, comm/ or cuda/ header" -- test -z "$engine_inc"
[ -z "$engine_inc" ] || printf "engine, comm or cuda internals (use include/dsc/ instead):\n%s\n" \
  "$engine_inc"

check "the GPU trainer is not in src/cli" -- \
  test -z "$(ls src/cli | grep -E '^train_gpu' || true)"
check "  ... and no src/cli file includes the runtime's internals (engine/gpu/, engine/device.h)" \
  -- test -z "$(echo "$now" | grep -E ' engine/(gpu/|device\.h)' || true)"
check "the runtime is in the library: src/engine/gpu/train_gpu.c behind include/dsc/device.h" -- \
  test -f src/engine/gpu/train_gpu.c -a -f include/dsc/device.h

# the checks see violations: a scratch tree with planted includes
mkdir -p "$T/src/cli" "$T/src/cuda" "$T/src/model/gpt2" "$T/src/model/llama"
printf '#include "dsc/engine.h"\n#include "engine/device.h"\n' > "$T/src/cli/x.c"
printf '#include "engine/engine_impl.h"\n#include "cuda/kernels.h"\n' > "$T/src/cuda/y.cu"
printf '#include "model/gpt2/gpt2.h"\n' > "$T/src/cuda/gpt2_z.cu"
touch "$T/src/cuda/llama_decode.h" "$T/src/cuda/kernels.cu"
planted_cli=$(cd "$T" && cli_internal)
planted_cuda=$(cd "$T" && cuda_violations)
planted_family=$(cd "$T" && family_files_in_cuda | tr '\n' ' ')
check "the cli check finds an internal include planted in src/cli" -- \
  test "$planted_cli" = "src/cli/x.c engine/device.h"
check "the cuda check finds an engine include and a family's include planted in src/cuda" \
  -- test "$planted_cuda" = "$(printf 'src/cuda/gpt2_z.cu model/gpt2/gpt2.h\nsrc/cuda/y.cu engine/engine_impl.h')"
check "the folder check finds family files planted in src/cuda (and only those)" -- \
  test "$planted_family" = "src/cuda/gpt2_z.cu src/cuda/llama_decode.h "
mkdir -p "$T/b/src/cli"
printf '#include "dsc/safetensors.h"\n#include "comm/comm.h"\n' > "$T/b/src/cli/a.c"
printf '#include "base/io.h"\n#include "engine/ckpt/hf_weights.h"\n' > "$T/b/src/cli/b.c"
printf '#include "cuda/kernels.h"\n#include "data/loader.h"\n' > "$T/b/src/cli/c.h"
planted_all=$(cd "$T/b" && cli_internal)
check "the cli check finds every internal include planted in src/cli (base/, data/ too), no dsc/" \
  -- test "$planted_all" = "$(printf 'src/cli/a.c comm/comm.h\nsrc/cli/b.c base/io.h\nsrc/cli/b.c engine/ckpt/hf_weights.h\nsrc/cli/c.h cuda/kernels.h\nsrc/cli/c.h data/loader.h')"
planted_engine=$(cd "$T/b" && cli_engine)
check "the no-engine check finds comm/, engine/ and cuda/ includes planted in src/cli (no others)" \
  -- test "$planted_engine" = "$(printf 'src/cli/a.c comm/comm.h\nsrc/cli/b.c engine/ckpt/hf_weights.h\nsrc/cli/c.h cuda/kernels.h')"
finish
