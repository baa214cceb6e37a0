#!/usr/bin/env bash
# Damaged checkpoints: a flipped bit, a truncated shard, a deleted shard, a manifest from another
# checkpoint, an edited manifest, `latest` naming a missing tag, a BAD marker. Each is reported by
# `dsc ckpt verify` (exit 1, naming the file and the fault), and `dsc train --resume` says why
# and falls back to the newest checkpoint that verifies. Also the ckpt tool's other verbs.
set -u
. "$(dirname "$0")/lib.sh"
config "$T/c.json" 1 "" '"interval_s": 0, "interval_steps": 5'
check "2 ranks save steps 5, 10, 15" -- run base 2 "$T/c.json" --max-steps 15 --save-dir "$T/base"

expect 0 "global_step15" -- "$DSC" ckpt ls "$T/base"
expect 0 "<- latest" -- "$DSC" ckpt ls "$T/base"
expect 0 "world size 2, ZeRO stage 1, precision fp32" -- "$DSC" ckpt info "$T/base"
expect 0 '"world_size": 2' -- "$DSC" ckpt info "$T/base/global_step10" --json
expect 0 "global_step15: OK" -- "$DSC" ckpt verify "$T/base"
expect 0 "global_step5: OK" -- "$DSC" ckpt verify "$T/base" --all
expect 0 "checksums verified" -- "$DSC" ckpt ls "$T/base" --verify
expect 2 "unknown command" -- "$DSC" ckpt frobnicate "$T/base"
expect 2 "give --out FILE" -- "$DSC" ckpt export "$T/base"
expect 2 "use fp32 or bf16" -- "$DSC" ckpt export "$T/base" --out "$T/x.st" --dtype fp8
expect 1 "$T/missing: No such file or directory" -- "$DSC" ckpt ls "$T/missing"
expect 0 "wrote $T/new/sub/w.safetensors" -- "$DSC" ckpt export "$T/base" --out "$T/new/sub/w.safetensors"
check "export made --out's folders" -- test -s "$T/new/sub/w.safetensors"

S=shard_rank1_of_2.safetensors
flip() { $PY -c "
import sys; p, at = sys.argv[1], int(sys.argv[2])
b = bytearray(open(p, 'rb').read()); b[at] ^= 0x04; open(p, 'wb').write(b)" "$@"; }

# case NAME NEEDLE FALLBACK_TAG COMMAND...: damage a copy of the checkpoints with COMMAND (run in
# the copy), then verify it, and resume from it on one rank (which reshards from 2 ranks).
case_() {
  local name=$1 needle=$2 back=$3
  shift 3
  rm -rf "$T/$name"
  cp -r "$T/base" "$T/$name"
  (cd "$T/$name" && "$@")
  expect 1 "$needle" -- "$DSC" ckpt verify "$T/$name"
  "$DSC" train --config "$T/c.json" --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 \
    --eval-every 0 --out "$T/$name.run" --max-steps 17 --save-dir "$T/$name" --resume \
    > "$T/$name.log" 2>&1
  check "$name: resume exits 0" -- test $? -eq 0
  check "$name: resume says why" -- grep -qF "$needle" "$T/$name.log"
  check "$name: resume falls back to $back" -- grep -q "falling back to $back" "$T/$name.log"
  check "$name: and continues after step ${back#global_step}" -- grep -q "continuing after step ${back#global_step}" "$T/$name.log"
}

case_ bitflip "checksum mismatch" global_step10 flip global_step15/$S 5000
case_ truncated "truncated" global_step10 truncate -s 3000000 global_step15/$S
case_ deleted "$S (rank 1) is missing" global_step10 rm global_step15/$S
case_ othermanifest "belongs to tag global_step10" global_step10 cp global_step10/manifest.json global_step15/
case_ edited "manifest was edited or damaged" global_step10 sed -i 's/"zero_stage": 1/"zero_stage": 2/' global_step15/manifest.json
case_ badmark "marked bad after its save: bad test" global_step10 bash -c 'echo "bad test" > global_step15/BAD'
case_ dangling "global_step99 does not exist" global_step15 bash -c 'echo global_step99 > latest'

# Only the named checkpoint is damaged: the others still verify, `verify --all` names it.
rm -rf "$T/flip2" && cp -r "$T/base" "$T/flip2" && flip "$T/flip2/global_step15/$S" 100000
expect 1 "global_step15: FAILED" -- "$DSC" ckpt verify "$T/flip2" --all
expect 0 "global_step5: OK" -- "$DSC" ckpt verify "$T/flip2/global_step5"
expect 1 "checksum mismatch" -- "$DSC" ckpt export "$T/flip2/global_step15" --out "$T/x.st"
expect 1 "checksum mismatch" -- "$DSC" ckpt ls "$T/flip2" --verify
# An explicit tag does not fall back.
expect 1 "checksum mismatch" -- "$DSC" train --config "$T/c.json" --data "$T/data" --model d2 \
  --seq-len 32 --max-steps 17 --out "$T/explicit" --resume "$T/flip2/global_step15"
# A folder of other things is no list of partial checkpoints; beside checkpoints, they are left out.
mkdir -p "$T/other/logs" "$T/other/data" "$T/mixed/logs"
cp -r "$T/base/global_step5" "$T/mixed/"
expect 0 "no checkpoints in $T/other" -- "$DSC" ckpt ls "$T/other"
expect 0 "global_step5" -- "$DSC" ckpt ls "$T/mixed"
check "ckpt ls leaves an unrelated folder out" -- bash -c "! '$DSC' ckpt ls '$T/mixed' | grep -q logs"
# A folder whose manifest was lost still shows, as partial.
mkdir -p "$T/lost" && cp -r "$T/base/global_step5" "$T/lost/" && rm "$T/lost/global_step5/manifest.json"
expect 0 "partial" -- "$DSC" ckpt ls "$T/lost"
# An attached file (not a shard) is called so.
A=$(cd "$T/base/global_step15" && ls | grep -v -e '^shard_rank' -e '^manifest.json$' | head -1)
check "the checkpoint attaches a file beside its shards ($A)" -- test -n "$A"
rm -rf "$T/att" && cp -r "$T/base" "$T/att" && echo x >> "$T/att/global_step15/$A"
expect 1 "attached file $A is" -- "$DSC" ckpt verify "$T/att"
# The resumed runs above saved step 15 again over the damaged one: it verifies now.
expect 0 "global_step15: OK" -- "$DSC" ckpt verify "$T/bitflip"
finish
