#!/usr/bin/env bash
# Fine-tuning data end to end: `dsc data prepare` on instruction JSONL (prompt/completion and chat
# messages, packed rows), bad lines, and a training step whose loss and gradients leave the masked
# prompt tokens out: the same as PyTorch's cross-entropy with labels -100 on the prompt tokens.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
: "${DSC_SOURCE_DIR:?set DSC_SOURCE_DIR to the source tree}"
PY=/usr/bin/python3
export OMP_NUM_THREADS=2
model=(--model d2 --seq-len 64 --sample-tokens 0)

# Instruction data: arithmetic questions (prompt) and their answers (completion), and chats.
$PY - "$T/sft.jsonl" "$T/chat.jsonl" <<'PYEOF'
import json, random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for i in range(40):
        a, b = random.randint(1, 50), random.randint(1, 50)
        f.write(json.dumps({"prompt": f"What is {a} plus {b}? ", "completion": f"{a + b}."}) + "\n")
with open(sys.argv[2], "w") as f:
    for i in range(8):
        f.write(json.dumps({"messages": [{"role": "user", "content": f"say {i}"},
                                         {"role": "assistant", "content": f"{i}!"}]}) + "\n")
PYEOF
expect 0 "packed in" -- "$DSC" data prepare --input "$T/sft.jsonl" "$T/chat.jsonl" --out "$T/sd" \
    --seq-len 64 --val-fraction 0.1
check "dataset.json: version 3, loss mask counts, packing, chat template" -- $PY - "$T/sd/dataset.json" <<'PYEOF'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["shard_version"] == 3 and d["packed_seq_len"] == 64, d
assert d["documents"] == 48 and 0 < d["target_tokens"] < d["tokens"] // 3, d
assert d["chat_template"] == "chatml (default)" and d["skipped_lines"] == 0, d
assert d["tokens"] % 65 == 0 and d["train_tokens"] % 65 == 0, d
PYEOF

# Bad lines: the run fails naming file:line and nothing already written changes; skip goes on.
cp "$T/sft.jsonl" "$T/bad.jsonl"
echo '{"prompt": "half a line"' >> "$T/bad.jsonl"
echo '{"prompt": "p", "completion": "c"}' >> "$T/bad.jsonl"
before=$(cksum < "$T/sd/train.bin")
expect 1 "bad.jsonl:41: not valid JSON" -- "$DSC" data prepare --input "$T/bad.jsonl" --out "$T/sd" --seq-len 64
check "a failed prepare leaves the earlier shards" -- test "$before" = "$(cksum < "$T/sd/train.bin")"
expect 0 "1 bad line(s) skipped" -- "$DSC" data prepare --input "$T/bad.jsonl" --out "$T/skip" \
    --seq-len 64 --on-bad-line skip
expect 2 "--on-bad-line" -- "$DSC" data prepare --input "$T/bad.jsonl" --out "$T/skip" --on-bad-line maybe
expect 1 "--seq-len 64" -- "$DSC" train --model d2 --seq-len 32 --data "$T/sd" --max-steps 1 --out "$T/r0"

# One step on the masked data: dump the starting weights (0 steps), then step 1's loss, gradients
# and tokens; PyTorch recomputes both from the weights with labels -100 where dsc's target is -1.
expect 0 "" -- "$DSC" train "${model[@]}" --data "$T/sd" --max-steps 0 --dump-weights "$T/w0.safetensors" --out "$T/r1"
expect 0 "loss mask" -- "$DSC" train "${model[@]}" --data "$T/sd" --max-steps 1 --dump-grads "$T/g.safetensors" --out "$T/r2"
check "masked loss and gradients equal PyTorch's with labels -100 on the prompt tokens" -- \
    $PY - "$T/w0.safetensors" "$T/g.safetensors" "$T/r2/metrics.jsonl" "$DSC_SOURCE_DIR/tests/model" <<'PYEOF'
import json, struct, sys
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[4])
from gpt2_torch_ref import gpt2_loss

def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    meta = h.pop("__metadata__", {})
    out = {}
    for k, v in h.items():
        b, e = v["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32}[v["dtype"]]
        out[k] = np.frombuffer(data[b:e], dtype=dt).reshape(v["shape"]).copy()
    return out, meta

w, _ = load(sys.argv[1])
g, meta = load(sys.argv[2])
inputs, targets = torch.tensor(g.pop("inputs")).long(), torch.tensor(g.pop("targets")).long()
assert (targets == -1).sum() > targets.numel() // 2, "most targets should be masked prompt tokens"
assert ((targets >= 0) | (targets == -1)).all()
P = {k: torch.tensor(v, requires_grad=True) for k, v in w.items()}
_, logits = gpt2_loss(P, 2, 2, inputs, targets.clamp(min=0))
V = logits.shape[-1]
labels = targets.clone()
labels[labels < 0] = -100
loss = F.cross_entropy(logits.view(-1, V), labels.view(-1))  # ignore_index -100, mean
loss.backward()
ours = float(meta["loss"])
assert abs(ours - loss.item()) <= 1e-5 * abs(loss.item()), (ours, loss.item())
row = json.loads(open(sys.argv[3]).readline())
assert abs(row["loss"] - ours) <= 1e-6 * abs(ours), (row["loss"], ours)
assert row["target_tokens"] == int((targets >= 0).sum()), (row["target_tokens"], (targets >= 0).sum())
assert row["tokens"] == targets.numel(), row
unmasked = F.cross_entropy(logits.view(-1, V), inputs.roll(-1, 1).reshape(-1)).item()
assert abs(unmasked - ours) > 1e-3, "the masked loss must differ from the loss over every token"
worst = 0.0
for k, gv in g.items():
    ref = P[k].grad.numpy()
    err = np.abs(gv - ref).max() / max(np.abs(ref).max(), 1e-12)
    worst = max(worst, err)
    assert err < 1e-3, (k, err)
print(f"masked loss {ours:.7f}, PyTorch {loss.item():.7f}, unmasked {unmasked:.4f}, "
      f"worst gradient rel err {worst:.2e}")
PYEOF

# --restart-positions: position ids restart at each example of a packed row; PyTorch agrees with
# positions restarting after each end-of-text (byte tokens: id 0, which text never holds).
echo "plain text without document starts (plain shards)" > "$T/plain.txt"
expect 0 "" -- "$DSC" data prepare --input "$T/plain.txt" --out "$T/cd0"
expect 1 "document starts" -- "$DSC" train "${model[@]}" --data "$T/cd0" --restart-positions --max-steps 1 --out "$T/r4"
expect 0 "train loss" -- "$DSC" train "${model[@]}" --data "$T/sd" --restart-positions --max-steps 1 --dump-grads "$T/gp.safetensors" --out "$T/r5"
check "restarted positions: loss and gradients equal PyTorch's" -- \
    $PY - "$T/w0.safetensors" "$T/gp.safetensors" "$T/g.safetensors" "$DSC_SOURCE_DIR/tests/model" <<'PYEOF'
import json, struct, sys
import numpy as np
import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[4])
from gpt2_torch_ref import gpt2_loss

def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
    meta = h.pop("__metadata__", {})
    out = {}
    for k, v in h.items():
        b, e = v["data_offsets"]
        out[k] = np.frombuffer(data[b:e], dtype={"F32": np.float32, "I32": np.int32}[v["dtype"]]).reshape(v["shape"]).copy()
    return out, meta

w, _ = load(sys.argv[1])
g, meta = load(sys.argv[2])
_, plain = load(sys.argv[3])
inputs, targets = torch.tensor(g.pop("inputs")).long(), torch.tensor(g.pop("targets")).long()
pos = torch.zeros_like(inputs)
for t in range(1, inputs.shape[1]):
    pos[:, t] = torch.where(inputs[:, t - 1] == 0, torch.zeros_like(pos[:, t]), pos[:, t - 1] + 1)
assert (pos[:, -1] < inputs.shape[1] - 1).any(), "some row must hold two examples"
P = {k: torch.tensor(v, requires_grad=True) for k, v in w.items()}
_, logits = gpt2_loss(P, 2, 2, inputs, targets.clamp(min=0), positions=pos)
labels = targets.clone()
labels[labels < 0] = -100
loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
loss.backward()
ours = float(meta["loss"])
assert abs(ours - loss.item()) <= 1e-5 * abs(loss.item()), (ours, loss.item())
assert abs(ours - float(plain["loss"])) > 1e-4, "restarted positions must change the loss"
for k, gv in g.items():
    ref = P[k].grad.numpy()
    err = np.abs(gv - ref).max() / max(np.abs(ref).max(), 1e-12)
    assert err < 1e-3, (k, err)
print(f"restarted positions: loss {ours:.7f}, PyTorch {loss.item():.7f}, plain positions {float(plain['loss']):.7f}")
PYEOF

# A few steps on the chat data alone: the loss falls.
expect 0 "" -- "$DSC" data prepare --input "$T/chat.jsonl" "$T/sft.jsonl" --out "$T/cd" --val-fraction 0
expect 0 "train loss" -- "$DSC" train --model d2 --seq-len 32 --sample-tokens 0 --data "$T/cd" --max-steps 20 --out "$T/r3"
check "the masked training loss falls" -- $PY - "$T/r3/metrics.jsonl" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 20 and rows[-1]["loss"] < rows[0]["loss"] - 0.5, (rows[0]["loss"], rows[-1]["loss"])
assert rows[-1]["target_tokens"] < rows[-1]["tokens"], rows[-1]
PYEOF
finish
