#!/usr/bin/env bash
# dsc train --dump-weights writes a file Hugging Face's loaders accept: safetensors metadata
# "format": "pt" (from_pretrained refuses any other value), the same metadata format and the same
# tensors, bit for bit, as `dsc ckpt export` of the checkpoint saved at the same step.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=/usr/bin/python3
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=2
small=(--model d2 --seq-len 32 --sample-tokens 0)

expect 0 "train loss" -- "$DSC" train "${small[@]}" --max-steps 2 --out "$T/r" \
  --dump-weights "$T/w.safetensors" --save-dir "$T/ck" --save-at-end
expect 0 "wrote" -- "$DSC" ckpt export "$T/ck" --out "$T/e.safetensors"

# The raw header: the u64 length, then JSON whose __metadata__ says format pt (no Python needed).
check "header bytes carry \"format\":\"pt\"" -- \
  grep -qF '"__metadata__":{"format":"pt","global_steps":"2"' <(head -c 4096 "$T/w.safetensors")
check "no dsc-private format name" -- \
  bash -c "! grep -qF 'dsc-weights' <(head -c 4096 '$T/w.safetensors')"

check "metadata and tensors match dsc ckpt export" -- $PY - "$T/w.safetensors" "$T/e.safetensors" <<'PYEOF'
import json, struct, sys

def read(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return h.pop("__metadata__"), h, raw[8 + n:]

wm, wh, wd = read(sys.argv[1])
em, eh, ed = read(sys.argv[2])
# What transformers' from_pretrained checks of a safetensors file's metadata.
assert wm.get("format") in ("pt", "tf", "flax", "mlx"), wm
assert wm["format"] == em["format"] == "pt", (wm, em)
assert wm["global_steps"] == em["dsc_step"] == "2", (wm, em)
assert sorted(wh) == sorted(eh), sorted(set(wh) ^ set(eh))
for name in wh:
    assert wh[name]["dtype"] == eh[name]["dtype"] == "F32", name
    assert wh[name]["shape"] == eh[name]["shape"], name
    wb, we = wh[name]["data_offsets"]
    eb, ee = eh[name]["data_offsets"]
    assert wd[wb:we] == ed[eb:ee], name
PYEOF

# The oracle, where a Python with transformers is at hand (DSC_HF_PYTHON, else the repository's
# .venv-hf): GPT2LMHeadModel.from_pretrained loads the file as model.safetensors next to a
# config.json made from its shapes, with the same weights.
SRC=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
HFPY=${DSC_HF_PYTHON:-$SRC/.venv-hf/bin/python}
if [ -x "$HFPY" ] && "$HFPY" -c 'import transformers, safetensors.torch' 2>/dev/null; then
  check "transformers from_pretrained loads the --dump-weights file" -- \
    "$HFPY" - "$T/w.safetensors" "$T/hf" <<'PYEOF'
import json, os, shutil, struct, sys
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel
path, folder = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
V, C = h["wte.weight"]["shape"]
L = 1 + max(int(k.split(".")[1]) for k in h if k.startswith("h."))
os.makedirs(folder, exist_ok=True)
shutil.copy(path, os.path.join(folder, "model.safetensors"))
GPT2Config(vocab_size=V, n_positions=h["wpe.weight"]["shape"][0], n_embd=C, n_layer=L,
           n_head=L).save_pretrained(folder)  # dN: N layers, N heads
m = GPT2LMHeadModel.from_pretrained(folder)
w = load_file(path)
state = m.state_dict()
for name, v in w.items():
    assert torch.equal(state["transformer." + name], v), name
PYEOF
else
  echo "note: no Python with transformers (set DSC_HF_PYTHON); checked the header bytes and JSON"
fi
finish
