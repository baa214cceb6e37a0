#!/usr/bin/env bash
# The environment switches have one place (src/base/env.def, read through dsc__env, or by name
# through the public dsc_env of dsc/base.h, which src/cli uses): no source file reads a DSC_ or
# DS_ variable with getenv except base/env.c; every row of env.def is used; every name given to
# dsc_env is a row; the checks see a planted direct read and a planted unknown name.
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
  if ! grep -rlw "DSC_ENV_$id" src | grep -vq '^src/base/env\.' &&
     ! grep -rqF "dsc_env(\"$name\")" src; then
    unused="$unused $name"
  fi
done < <(sed -nE 's/^DSC_ENV\(([A-Z0-9_]+), "([A-Z0-9_]+)".*/\1 \2/p' src/base/env.def)
check "every row of src/base/env.def is read somewhere" -- test -z "$unused"
[ -z "$unused" ] || echo "unused:$unused"
check "  ... and the table has the switches (at least 20 rows)" -- \
  test "$(grep -c '^DSC_ENV(' src/base/env.def)" -ge 20

# by_name: the names src gives dsc_env that are not rows of env.def
by_name() {
  grep -rhoE 'dsc_env\("[A-Z0-9_]+"\)' src | sed -E 's/dsc_env\("(.*)"\)/\1/' | sort -u \
    | grep -vxF -f <(sed -nE 's/^DSC_ENV\([A-Z0-9_]+, "([A-Z0-9_]+)".*/\1/p' "$1")
}
out=$(by_name src/base/env.def)
check "every switch src reads by name (dsc_env) is a row of src/base/env.def" -- test -z "$out"
[ -z "$out" ] || echo "not in the table: $out"

mkdir -p "$T/src/engine"
printf 'const char *f(void) { return getenv("DSC_NEW_SWITCH"); }\n' > "$T/src/engine/x.c"
planted=$(cd "$T" && direct_reads)
check "the check finds a direct read planted in src/engine" -- test -n "$planted"
mkdir -p "$T/src/cli"
printf 'const char *g(void) { return dsc_env("DSC_PROGRES"); }\n' > "$T/src/cli/y.c"
planted=$(cd "$T" && by_name "$DSC_SOURCE_DIR/src/base/env.def")
check "the name check finds a misspelt switch planted in src/cli" -- test "$planted" = DSC_PROGRES
finish
