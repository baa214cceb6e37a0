#!/usr/bin/env bash
# Every ```sh block of README.md runs as written, at tiny sizes.
#
# The blocks run in order, each as one bash script (set -e) in a scratch directory that holds
# `examples` (the repository's) and `build/dsc`. That `build/dsc` is a wrapper around the dsc under
# test which shrinks the work and changes nothing else:
#   train   --model becomes d2 (d1 and d2 stay), and --max-steps 3 --seq-len 32 --eval-every 0
#           --eval-batches 1 --sample-tokens 8 replace those flags when given and are added when not
#   bench   --maxsize 12 --trials 2 --warmups 1 are added (messages up to 4 KiB)
#   other   passed on unchanged
# Skipped, and said so: the set-up and build commands themselves (scripts/setup.sh, test.sh,
# deps.sh, cmake: they are what made this build), and blocks that need hardware absent here
# (--device cuda, DSC_COMM_BACKEND=nccl) unless a GPU is present. A block fails when a command in
# it exits non-zero; the files the README promises (runs/default, runs/zero2, curves.svg,
# data/book) are checked afterwards.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
SRC=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
README="$SRC/README.md"
W="$T/w"
mkdir -p "$W/build"
ln -s "$SRC/examples" "$W/examples"
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1

cat > "$W/build/dsc" <<EOF
#!/usr/bin/env bash
# README commands at tiny sizes (tests/cli/test_readme.sh says how).
real='$DSC'
if [ "\${1-}" = train ]; then
  shift
  args=()
  while [ \$# -gt 0 ]; do
    case \$1 in
      --max-steps|--seq-len|--eval-every|--eval-batches|--sample-tokens) shift 2; continue ;;
      --model) case \$2 in d1|d2) args+=(--model "\$2") ;; *) args+=(--model d2) ;; esac
               shift 2; continue ;;
    esac
    args+=("\$1"); shift
  done
  exec "\$real" train "\${args[@]}" --max-steps 3 --seq-len 32 --eval-every 0 --eval-batches 1 \\
    --sample-tokens 8
fi
[ "\${1-}" = bench ] && exec "\$real" "\$@" --maxsize 12 --trials 2 --warmups 1
exec "\$real" "\$@"
EOF
chmod +x "$W/build/dsc"

# The ```sh blocks, one file each: $T/block.N
awk -v dir="$T" '
  /^```sh[ \t]*$/ { n++; inside = 1; next }
  /^```/ && inside { inside = 0; next }
  inside { print > (dir "/block." n) }
' "$README"
nblocks=$(ls "$T"/block.* 2> /dev/null | wc -l)
check "README has command blocks" -- test "$nblocks" -ge 5
# The set-up lines stay the first commands of the README.
check "the set-up block comes first" -- grep -q '^bash scripts/setup.sh' "$T/block.1"

gpu=no
[ -e /dev/nvidia0 ] && gpu=yes
ran=0
for ((b = 1; b <= nblocks; b++)); do
  f="$T/block.$b"
  first=$(grep -m1 -v '^\s*\(#\|$\)' "$f")
  why=
  if grep -qE 'scripts/(setup|test|deps)\.sh|^cmake ' "$f"; then
    why="set-up and build commands"
  elif grep -qE -- '--device cuda|DSC_COMM_BACKEND=nccl' "$f" && [ $gpu = no ]; then
    why="needs a GPU (none here)"
  fi
  if [ -n "$why" ]; then
    echo "SKIP block $b ($why): $first"
    continue
  fi
  echo "RUN  block $b: $(grep -cv '^\s*\(#\|$\)' "$f") command(s), first: $first"
  (cd "$W" && timeout 120 bash -e "$f") > "$T/out.$b" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "block $b failed (exit $rc):"; cat "$f"; echo "--- output:"; tail -20 "$T/out.$b"
  fi
  check "README block $b runs as written" -- test $rc -eq 0
  ran=$((ran + 1))
done
check "at least 3 blocks ran" -- test $ran -ge 3
check "runs/default has metrics" -- test -s "$W/runs/default/metrics.jsonl"
check "runs/zero2 has metrics" -- test -s "$W/runs/zero2/metrics.jsonl"
check "dsc plot wrote curves.svg" -- grep -q '<svg' "$W/curves.svg"
check "data prepare wrote data/book" -- test -s "$W/data/book/train.bin"

# The example configs the README points to: valid without a warning, and each trains (one rank).
for cfg in "$SRC"/examples/configs/*.json; do
  name=$(basename "$cfg" .json)
  expect 0 "; 0 warnings" -- "$DSC" config check "$cfg" --world-size 2
  (cd "$W" && ./build/dsc train --config "$cfg" --out "runs/ex-$name") > "$T/ex.$name" 2>&1
  check "examples/configs/$name.json trains" -- test -s "$W/runs/ex-$name/metrics.jsonl"
done
finish
