#!/usr/bin/env bash
# `dsc ckpt export DS_DIR --hf OUT` straight from DeepSpeed's ZeRO-2 and ZeRO-3 checkpoints
# (tests/unit/torchfile/ds_gpt2_z*): every tensor equals the fp32 master weights the fixture's
# partitions hold, bit for bit (SHA-256 against expect.txt, read back with numpy from the
# safetensors files, sharded or not); config.json comes from --hf-config (DeepSpeed saves none)
# with the export's dtype; the folder trains in dsc (`--model hf:OUT`) from the same weights as
# `--init-weights DS_DIR` gives.
set -u
. "$(dirname "$0")/lib.sh"
SRC=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
F="$SRC/tests/unit/torchfile"
"$DSC" data prepare --input "$SRC/docs/checkpoint-format.md" --tokenizer byte \
  --out "$T/bytes" >/dev/null

# Every tensor of a folder's safetensors files (or one file) as "name master sha16", sorted.
st_digest() { $PY - "$@" <<'PYEOF' | sort
import glob, hashlib, json, struct, sys
import numpy as np
files = sorted(glob.glob(sys.argv[1] + "/*.safetensors")) or [sys.argv[1]]
want = sys.argv[2] if len(sys.argv) > 2 else "F32"
for f in files:
    raw = open(f, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    assert h.pop("__metadata__")["format"] == "pt"
    for name, t in h.items():
        assert t["dtype"] == want, (name, t["dtype"])
        a, b = t["data_offsets"]
        x = raw[8 + n + a:8 + n + b]
        print(name, "master", hashlib.sha256(x).hexdigest()[:16])
PYEOF
}
expected() { grep ' master ' "$F/$1/expect.txt" | sort; }
sharded() {
  test -f "$T/$1.sh/model.safetensors.index.json" && test "$(ls "$T/$1.sh"/*.safetensors | wc -l)" -eq 3 &&
    cmp -s <(st_digest "$T/$1.sh") <(expected "$1")
}

for fx in ds_gpt2_z2 ds_gpt2_z3; do
  expect 0 "wrote $T/$fx.hf (fp32, from DeepSpeed checkpoint" -- "$DSC" ckpt export "$F/$fx" \
    --hf "$T/$fx.hf" --hf-config "$F/tiny_gpt2"
  check "$fx: the exported tensors are DeepSpeed's fp32 master weights, bit for bit" -- \
    cmp -s <(st_digest "$T/$fx.hf") <(expected $fx)
  check "  ... 28 tensors" -- test "$(st_digest "$T/$fx.hf" | wc -l)" -eq 28
  check "  ... with config.json" -- grep -q '"torch_dtype": "float32"' "$T/$fx.hf/config.json"
  expect 0 "wrote" -- "$DSC" ckpt export "$F/$fx/global_step10" --hf "$T/$fx.sh" \
    --hf-config "$F/tiny_gpt2" --shard-size 20KB
  check "  ... in shards of 20KB (an index and 3 files), the same tensors" -- sharded $fx
  expect 0 "wrote" -- "$DSC" ckpt export "$F/$fx" --out "$T/$fx.one.safetensors"
  check "  ... and as one file (--out), the same tensors" -- \
    cmp -s <(st_digest "$T/$fx.one.safetensors") <(expected $fx)
  expect 0 "wrote" -- "$DSC" ckpt export "$F/$fx" --hf "$T/$fx.bf16" --hf-config \
    "$F/tiny_gpt2" --dtype bf16
  check "  ... bf16: BF16 tensors, config.json says bfloat16" -- bash -c \
    "grep -q '\"torch_dtype\": \"bfloat16\"' '$T/$fx.bf16/config.json'"
  check "  ... bf16 tensors are BF16" -- st_digest "$T/$fx.bf16" BF16
  # dsc trains from the folder, from the same weights as --init-weights DS_DIR
  for how in "hf hf:$T/$fx.hf" "init hf:$F/tiny_gpt2 --init-weights $F/$fx"; do
    set -- $how
    name=$1
    shift
    check "$fx: dsc train --model ${1#hf:$T/} (${name})" -- "$DSC" train --data "$T/bytes" \
      --model "$@" --seq-len 32 --max-steps 1 --sample-tokens 0 --eval-every 0 \
      --out "$T/$fx.run.$name"
  done
  check "  ... the same first step from the export and from --init-weights DS_DIR" -- \
    cmp -s <(cols "$T/$fx.run.hf/metrics.jsonl") <(cols "$T/$fx.run.init/metrics.jsonl")
done

expect 1 "has no config.json: DeepSpeed saves none; give the model's Hugging Face folder with --hf-config DIR" -- \
  "$DSC" ckpt export "$F/ds_gpt2_z2" --hf "$T/noconfig"
finish
