#!/bin/bash
# dsc ckpt ls/info/verify recognise DeepSpeed checkpoints (ZeRO-2 and ZeRO-3, 2 ranks, laid out
# as DeepSpeed 0.18 saves them: tests/unit/torchfile/ds_z*), and refuse a damaged one by name.
set -euo pipefail
DSC=${DSC:?} SRC=${DSC_SOURCE_DIR:?}
D="$SRC/tests/unit/torchfile"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$DSC" ckpt ls "$D/ds_z2" > "$T/ls"
grep -q "global_step10 *10  deepspeed  <- latest" "$T/ls" || { cat "$T/ls"; fail "ls state"; }
"$DSC" ckpt info "$D/ds_z3" > "$T/info"
grep -q "^DeepSpeed checkpoint .*global_step10" "$T/info" || fail "info header"
grep -q "world size 2, ZeRO stage 3, precision bf16" "$T/info" || { cat "$T/info"; fail "info"; }
"$DSC" ckpt verify "$D/ds_z2/global_step10" | grep -q "OK (DeepSpeed checkpoint, step 10" ||
    fail "verify"

# One rank's optimizer file cut short: verify names the file and fails.
cp -r "$D/ds_z2" "$T/bad"
f="$T/bad/global_step10/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
head -c 300 "$f" > "$f.cut" && mv "$f.cut" "$f"
if "$DSC" ckpt verify "$T/bad" > "$T/out"; then fail "a truncated file verified"; fi
grep -q "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt" "$T/out" || { cat "$T/out"; fail "msg"; }
# One rank's file missing: the partition count disagrees.
cp -r "$D/ds_z3" "$T/missing"
rm "$T/missing/global_step10/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"
if "$DSC" ckpt verify "$T/missing" > "$T/out"; then fail "a missing rank verified"; fi
grep -q "partition_count is 2 but 1 optimizer files" "$T/out" || { cat "$T/out"; fail "msg2"; }
echo "PASS"
