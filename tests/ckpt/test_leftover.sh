#!/usr/bin/env bash
# A job killed during its first save leaves only <tag>.tmp.<nonce>/ (no `latest`): that is no
# checkpoint, so --resume starts from step 0 (saying so once) on 1 and 2 ranks instead of failing
# on every rank, and the next save removes the leftover. A directory with a complete checkpoint
# besides such leftovers still resumes from it.
set -u
. "$(dirname "$0")/lib.sh"
config "$T/z2.json" 2 ""

# The issue's reproducer, with the built-in config.
S="$T/S"
mkdir -p "$S/global_step1.tmp.0000000000000001"
expect 0 "no checkpoint in $S yet; starting from step 0" -- "$DSC" train --data "$T/data" \
  --model d2 --seq-len 32 --sample-tokens 0 --max-steps 2 --save-dir "$S" --resume --out "$T/r"
check "the leftover is reported once" -- \
  test "$("$DSC" train --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 --max-steps 1 \
    --save-dir "$S" --resume --out "$T/r1" 2>&1 | grep -c "only 1 leftover of an interrupted save")" = 1

# Two ranks, leftovers of a save and of a removal: both start from step 0 and save at the end.
S="$T/S2"
mkdir -p "$S/global_step3.tmp.00000000000000aa" "$S/global_step1.del.00000000000000bb"
check "2 ranks resume from leftovers only" -- \
  run two 2 "$T/z2.json" --max-steps 3 --save-dir "$S" --resume --save-at-end
check "2 ranks: started from step 0" -- grep -q "no checkpoint in $S yet; starting from step 0" "$T/two.0.log"
check "2 ranks: saved global_step3, latest names it" -- test "$(cat "$S/latest")" = global_step3
check "2 ranks: the save removed the leftovers" -- \
  bash -c "! ls '$S' | grep -qE '\\.(tmp|del)\\.'"
check "2 ranks: the checkpoint verifies" -- "$DSC" ckpt verify "$S"

# A complete checkpoint next to a leftover: resumed from it.
mkdir -p "$S/global_step4.tmp.00000000000000cc"
check "resume past a leftover" -- run three 2 "$T/z2.json" --max-steps 4 --save-dir "$S" --resume
check "resumed from global_step3" -- grep -q "global_step3: continuing after step 3" "$T/three.0.log"
finish
