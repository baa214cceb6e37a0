#!/usr/bin/env bash
# Ecosystem: a checkpoint of 2 ranks at ZeRO-3, exported as one safetensors file (fp32 and bf16),
# opens with Python's `safetensors` into a PyTorch GPT-2 keyed by Hugging Face names, and gives
# the loss and gradients dsc computes from the same weights on the same tokens.
set -u
. "$(dirname "$0")/lib.sh"
SRC=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
config "$T/z3.json" 3 ""
check "2 ranks, stage 3, 10 steps" -- run src 2 "$T/z3.json" --max-steps 10 --save-dir "$T/ck" --save-at-end
expect 0 "wrote" -- "$DSC" ckpt export "$T/ck" --out "$T/w32.safetensors"
expect 0 "(bf16)" -- "$DSC" ckpt export "$T/ck/global_step10" --out "$T/w16.safetensors" --dtype bf16

# dsc's side: step 1 from the exported weights (one rank), with its loss, tokens and gradients.
for d in 32 16; do
  check "dsc from the fp$d export" -- run "from$d" 1 "$T/z3.json" --max-steps 1 \
    --init-weights "$T/w$d.safetensors" --dump-grads "$T/g$d.safetensors"
done

if ! $PY -c 'import torch' 2>/dev/null; then
  echo "SKIP: $PY cannot import torch (install python3-torch); the file checks above ran"
  finish; exit $?
fi
if ! $PY -c 'import safetensors' 2>/dev/null; then
  $PY -m pip install --quiet --disable-pip-version-check --break-system-packages safetensors >/dev/null 2>&1 ||
    $PY -m pip install --quiet --disable-pip-version-check --user safetensors >/dev/null 2>&1
fi
if ! $PY -c 'import safetensors.torch' 2>/dev/null; then
  echo "SKIP: Python's safetensors package is missing and could not be installed (pip install safetensors)"
  finish; exit $?
fi

for d in 32 16; do
  check "PyTorch GPT-2 from the fp$d export: same loss and gradients as dsc" -- \
    $PY - "$SRC/tests/model" "$T/w$d.safetensors" "$T/g$d.safetensors" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from gpt2_torch_ref import gpt2_loss, tensor_table

P = {k: v.float().requires_grad_() for k, v in load_file(sys.argv[2]).items()}
with safe_open(sys.argv[2], "pt") as f:
    meta = f.metadata()
assert meta["format"] == "pt", meta
C, V, T = P["wte.weight"].shape[1], P["wte.weight"].shape[0], P["wpe.weight"].shape[0]
L = 1 + max(int(k.split(".")[1]) for k in P if k.startswith("h."))
want = [name for name, _ in tensor_table(L, C, V, T)]
assert sorted(P) == sorted(want), sorted(set(P) ^ set(want))  # Hugging Face GPT-2 names, no more
dump = load_file(sys.argv[3])
with safe_open(sys.argv[3], "pt") as f:
    dsc_loss = float(f.metadata()["loss"])
inputs, targets = dump["inputs"].long(), dump["targets"].long()
loss, logits = gpt2_loss(P, L, L, inputs, targets)  # dN: N layers, N heads
loss.backward()
rel = abs(loss.item() - dsc_loss) / abs(dsc_loss)
worst = 0.0
for name in want:
    g, ref = dump[name], P[name].grad
    worst = max(worst, ((g - ref).abs().max() / ref.abs().max()).item())
print(f"  {len(want)} tensors, logits {tuple(logits.shape)}; loss torch {loss.item():.7f} dsc "
      f"{dsc_loss:.7f} (rel {rel:.1e}); gradients max rel {worst:.1e}")
assert rel < 1e-5 and worst < 1e-4
PYEOF
done
finish
