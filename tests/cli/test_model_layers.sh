#!/usr/bin/env bash
# The model interface's layering, checked on the sources: outside src/model/ nothing calls a
# model family's own functions or includes its headers (everything goes through dsc/model.h; the
# GPU trainer through the table's device passes, GPU generation through its decode slots; a
# family's device code is in its own folder); no file but GPT-2's own includes a GPT-2 header
# (the kernels every model shares are in cuda/kernels.h); the registry names each family once
# (families.def); the examples include public headers only.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC_SOURCE_DIR:?set DSC_SOURCE_DIR to the source tree}"
cd "$DSC_SOURCE_DIR" || exit 1

# family_uses: lines outside src/model/ that call a family's functions or include its headers
# (a comment that names them is not a use).
family_uses() {
  grep -rnE 'dsc_{1,2}gpt2_|model/gpt2/' src include examples --include='*.c' --include='*.h' \
    --include='*.cu' --include='*.cuh' | grep -v '^src/model/' | grep -vE '^[^:]+:[0-9]+:\s*//'
}
out=$(family_uses)
check "nothing outside src/model/ calls GPT-2's own functions or includes its headers" -- \
  test -z "$out"
[ -z "$out" ] || echo "$out" | head

# gpt2_includes: includes of GPT-2's headers (model/gpt2/...) by files that are not GPT-2's own
# (src/model/gpt2/): what every model and the trainer share on the GPU is in cuda/kernels.h, not
# in the GPT-2 kernels.
gpt2_includes() {
  grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]*gpt2' src include examples \
    | grep -vE '^src/model/gpt2/'
}
out=$(gpt2_includes)
check "no file but GPT-2's own includes a GPT-2 header (model/gpt2/)" -- \
  test -z "$out"
[ -z "$out" ] || echo "$out" | head

# (hf_config.* is the Hugging Face config.json reader: it knows every architecture's field names)
check "the registry names GPT-2 once: families.def" -- \
  test "$(grep -rn gpt2 src/model --include='*.c' --include='*.h' --include='*.def' \
          | grep -v '^src/model/gpt2/' | grep -v '^src/model/hf_config\.' | grep -c .)" = 1
check "  ... and that line is DSC_MODEL_FAMILY(gpt2)" -- \
  grep -qx 'DSC_MODEL_FAMILY(gpt2)' src/model/families.def

# includes of each example: public headers (dsc/...), system headers and the example's own
# headers (a file beside the one that includes it) only
example_includes() {
  grep -rnE '^#include "' examples | grep -v '#include "dsc/' | while IFS=: read -r f n line; do
    h=$(sed -E 's/^#include "([^"]*)".*/\1/' <<<"$line")
    [[ "$h" != */* && -f "$(dirname "$f")/$h" ]] || echo "$f:$n:$line"
  done
}
bad=$(example_includes)
check "examples include only public headers (dsc/*.h) and their own" -- test -z "$bad"
[ -z "$bad" ] || echo "$bad"

# the check sees a violation: a scratch tree with one added call
mkdir -p "$T/src/cli" "$T/src/model" "$T/include" "$T/examples"
printf '#include "model/gpt2/gpt2.h"\nvoid f(void) { dsc_gpt2_forward(0); }\n' > "$T/src/cli/x.c"
planted=$(cd "$T" && family_uses)
check "the check finds a use planted in src/cli" -- test -n "$planted"
mkdir -p "$T/src/cuda" "$T/src/engine/gpu" "$T/src/model/llama" "$T/src/model/gpt2"
printf '#include "model/gpt2/gpt2_kernels.h"\n' > "$T/src/engine/gpu/y.c"
printf '#include "cuda/kernels.h"\n#include "model/gpt2/gpt2_kernels.h"\n' \
  > "$T/src/model/llama/llama_z.cu"
printf '#include "model/gpt2/gpt2_kernels.h"\n' > "$T/src/model/gpt2/gpt2_z.cu"
planted=$(cd "$T" && gpt2_includes | cut -d: -f1 | LC_ALL=C sort | tr '\n' ' ')
check "the include check finds GPT-2 includes planted outside GPT-2's files (and only those)" -- \
  test "$planted" = "src/cli/x.c src/engine/gpu/y.c src/model/llama/llama_z.cu "
mkdir -p "$T/examples/x"
printf '#include "x.h"\n' > "$T/examples/x/x.c"
touch "$T/examples/x/x.h"
check "an example's own header passes the include check" -- test -z "$(cd "$T" && example_includes)"
printf '#include "x.h"\n#include "engine/engine.h"\n' > "$T/examples/x/x.c"
check "the include check finds a private header planted in an example" -- \
  test "$(cd "$T" && example_includes)" = 'examples/x/x.c:2:#include "engine/engine.h"'
finish
