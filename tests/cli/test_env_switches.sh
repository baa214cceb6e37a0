#!/usr/bin/env bash
# The environment switches have one place (src/base/env.def, read through dsc__env): no source
# file reads a DSC_ or DS_ variable with getenv except base/env.c; every row of env.def is used;
# the check sees a planted direct read.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC_SOURCE_DIR:?set DSC_SOURCE_DIR to the source tree}"
cd "$DSC_SOURCE_DIR" || exit 1

allowed='^src/base/env\.c:'

direct_reads() {
  grep -rnE 'getenv\("DSC?_' src --include='*.c' --include='*.h' --include='*.cu' \
    --include='*.cuh' | grep -vE "$allowed"
}
out=$(direct_reads)
check "no direct getenv of a DSC_/DS_ switch outside src/base/env.c" -- \
  test -z "$out"
[ -z "$out" ] || echo "$out"

unused=""
while read -r id name; do
  if ! grep -rlw "DSC_ENV_$id" src | grep -vq '^src/base/env\.'; then
    unused="$unused $name"
  fi
done < <(sed -nE 's/^DSC_ENV\(([A-Z0-9_]+), "([A-Z0-9_]+)".*/\1 \2/p' src/base/env.def)
check "every row of src/base/env.def is read somewhere" -- test -z "$unused"
[ -z "$unused" ] || echo "unused:$unused"
check "  ... and the table has the switches (at least 20 rows)" -- \
  test "$(grep -c '^DSC_ENV(' src/base/env.def)" -ge 20

mkdir -p "$T/src/engine"
printf 'const char *f(void) { return getenv("DSC_NEW_SWITCH"); }\n' > "$T/src/engine/x.c"
planted=$(cd "$T" && direct_reads)
check "the check finds a direct read planted in src/engine" -- test -n "$planted"
finish
