#!/usr/bin/env bash
# A model of the user's own (examples/own_model) built against an installed dsc, the way a user
# builds it: `cmake --install --prefix DIR`, then `cc own_model.c $(pkg-config --cflags --libs
# dsc)` with only DIR's headers and libraries (shared with an rpath, and static through
# Libs.private). dsc.pc is relocatable: two prefixes, and one of them moved, give their own
# paths. The program then trains on 2 ranks under the installed `dsc launch` at ZeRO stages 0-3
# with per-step losses, learning rates, gradient norms and the final weights' checksum bitwise
# equal across stages, and a run stopped at a checkpoint resumes (at the same and at another
# stage) bitwise.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC_SOURCE_DIR:?}" "${DSC_BINARY_DIR:?}"
SRC=$DSC_SOURCE_DIR/examples/own_model/own_model.c
CC=${CC:-cc}
export OMP_NUM_THREADS=1
unset PKG_CONFIG_PATH PKG_CONFIG_LIBDIR
# A sanitizer build's libdsc needs its runtime in the program too.
SAN=()
grep -q '^DSC_SANITIZE:BOOL=ON' "$DSC_BINARY_DIR/CMakeCache.txt" 2>/dev/null &&
  SAN=(-fsanitize=address,undefined)

pc() { PKG_CONFIG_PATH="$1/lib/pkgconfig" pkg-config "${@:2}" dsc; }

# ---- install, dsc.pc ----
for p in p1 p2; do
  check "install to prefix $p" -- cmake --install "$DSC_BINARY_DIR" --prefix "$T/$p" >/dev/null
done
for p in p1 p2; do
  check "$p: dsc.pc's include path is $p's" -- \
    test "$(cd "$(pc "$T/$p" --variable=includedir)" && pwd -P)" = "$(cd "$T/$p/include" && pwd -P)"
  check "$p: dsc.pc's library path is $p's" -- \
    test "$(cd "$(pc "$T/$p" --variable=libdir)" && pwd -P)" = "$(cd "$T/$p/lib" && pwd -P)"
done
check "dsc.pc names no fixed prefix" -- grep -q '^prefix=${pcfiledir}/' "$T/p1/lib/pkgconfig/dsc.pc"

# build NAME PREFIX shared|static|whole: the example against PREFIX's headers and libraries only
build() {
  local out=$T/$1 pre=$T/$2 how=$3 cflags
  cflags=$(pc "$pre" --cflags) || return 1
  if [ "$how" = shared ]; then
    # shellcheck disable=SC2046
    "$CC" -std=c11 -O2 -Wall -Wextra -Werror "${SAN[@]}" -o "$out" "$SRC" $cflags $(pc "$pre" --libs) -lm \
      -Wl,-rpath,"$(pc "$pre" --variable=libdir)"
  elif [ "$how" = static ]; then # the archive, then what it needs (Libs.private); --as-needed
    # drops -ldsc's shared copy
    # shellcheck disable=SC2046
    "$CC" -std=c11 -O2 -Wall -Wextra -Werror "${SAN[@]}" -o "$out" "$SRC" $cflags -Wl,--as-needed \
      "$(pc "$pre" --variable=libdir)/libdsc.a" $(pc "$pre" --static --libs) -lm
  else # every member of the archive: Libs.private must cover the whole library
    # shellcheck disable=SC2046
    "$CC" -std=c11 -O2 "${SAN[@]}" -o "$out" "$SRC" $cflags -Wl,--as-needed -Wl,--whole-archive \
      "$(pc "$pre" --variable=libdir)/libdsc.a" -Wl,--no-whole-archive $(pc "$pre" --static --libs) -lm
  fi
}
check "shared build against p1" -- build om p1 shared
[ -x "$T/om" ] || { finish; exit 1; }
mv "$T/p2" "$T/p2moved"
check "static build against p2, moved after its install" -- build om_static p2moved static
check "the whole static library links with Libs.private" -- build om_whole p2moved whole
check "the static build needs no libdsc.so" -- bash -c "! readelf -d '$T/om_static' | grep -q 'libdsc'"
check "the shared build needs libdsc.so.0" -- bash -c "readelf -d '$T/om' | grep -q 'libdsc.so.0'"
unset LD_LIBRARY_PATH
check "  ... and finds p1's through its rpath" -- bash -c "ldd '$T/om' | grep -q '$T/p1/.*libdsc.so.0'"
expect 2 "--stage 7: expected an integer from 0 to 3" -- "$T/om" --stage 7

# ---- training on 2 ranks ----
DSC_I=$T/p1/bin/dsc
launch() { # launch NAME BINARY ARGS...: 2 ranks under the installed launcher
  local name=$1 bin=$2
  shift 2
  timeout 300 "$DSC_I" launch --num_procs 2 --master_port "$(free_port)" "$bin" "$@" \
    >"$T/$name.log" 2>&1 || { echo "run $name failed:"; tail -5 "$T/$name.log"; return 1; }
}
# the lines that must agree bitwise: steps (from $2 on) and the weights' checksum
lines() { grep -E '^\[rank 0\] (step|weights)' "$1" | awk -v from="${2:-0}" '$3 != "step" || $4 > from'; }
S=30
for st in 0 1 2 3; do
  check "stage $st trains $S steps on 2 ranks" -- launch "s$st" "$T/om" --stage $st --steps $S
done
check "the run names its world and stage" -- grep -q "own_model: 2 ranks, ZeRO stage 0" "$T/s0.log"
check "$S step lines and a checksum" -- test "$(lines "$T/s0.log" | wc -l)" -eq $((S + 1))
for st in 1 2 3; do
  check "stage $st == stage 0, bitwise (losses, lr, grad norms, weights)" -- cmp -s <(lines "$T/s0.log") <(lines "$T/s$st.log")
done
check "the loss falls by a third or more" -- \
  awk -v s=$S '$3 == "step" {l[$4] = $7} END {exit !(l[s] < 0.67 * l[1])}' "$T/s0.log"
check "the static build trains the same (stage 2)" -- launch static "$T/om_static" --stage 2 --steps $S
check "  ... bitwise" -- cmp -s <(lines "$T/s0.log") <(lines "$T/static.log")

# ---- checkpoint at step K, resume to S ----
K=12
check "stage 1 run to step $K, saving" -- launch part "$T/om" --stage 1 --steps $K --save-dir "$T/ck" --save-every $K
check "  ... checkpoint global_step$K written" -- test "$(cat "$T/ck/latest")" = "global_step$K"
check "resume at stage 1 from the latest" -- launch r1 "$T/om" --stage 1 --steps $S --resume "$T/ck"
check "resume at stage 3 from global_step$K" -- launch r3 "$T/om" --stage 3 --steps $S --resume "$T/ck/global_step$K"
for r in r1 r3; do
  check "$r: resumed after step $K" -- grep -q "after step $K\$" "$T/$r.log"
  check "$r: steps $((K + 1))-$S and final weights equal the uninterrupted run's, bitwise" -- \
    cmp -s <(lines "$T/s1.log" $K) <(lines "$T/$r.log")
done
finish
