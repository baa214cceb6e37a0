#!/usr/bin/env python3
"""Reference GPT-2 loss, logits and gradients in PyTorch (float32, CPU) for test_gpt2_torch.c.

Usage: gpt2_torch_ref.py IN OUT

IN (little-endian), written by the C test:
  8 bytes  magic b"DSCGPT2I"
  8 int32  version (1), n_layer, n_head, n_embd, vocab_size, max_seq_len, B, T
  int32    inputs (B, T), then targets (B, T)
  float32  every parameter tensor in dsc's table order (Hugging Face names and shapes)
OUT:
  8 bytes  magic b"DSCGPT2O"
  float64  mean cross-entropy loss
  float32  logits (B, T, V)
  float32  the gradient of the loss for every tensor, in the same order

The model is written out here by hand (no transformers package) so that the comparison does not
depend on anything but torch's own operators.
"""
import math
import struct
import sys

import torch
import torch.nn.functional as F

LAYER_TENSORS = [  # name, shape in units of C (0: vector)
    ("ln_1.weight", (1, 0)), ("ln_1.bias", (1, 0)),
    ("attn.c_attn.weight", (1, 3)), ("attn.c_attn.bias", (3, 0)),
    ("attn.c_proj.weight", (1, 1)), ("attn.c_proj.bias", (1, 0)),
    ("ln_2.weight", (1, 0)), ("ln_2.bias", (1, 0)),
    ("mlp.c_fc.weight", (1, 4)), ("mlp.c_fc.bias", (4, 0)),
    ("mlp.c_proj.weight", (4, 1)), ("mlp.c_proj.bias", (1, 0)),
]


def tensor_table(n_layer, n_embd, vocab_size, max_seq_len):
    C = n_embd
    table = [("wte.weight", (vocab_size, C)), ("wpe.weight", (max_seq_len, C))]
    for i in range(n_layer):
        for name, (r, c) in LAYER_TENSORS:
            table.append((f"h.{i}.{name}", (r * C, c * C) if c else (r * C,)))
    table += [("ln_f.weight", (C,)), ("ln_f.bias", (C,))]
    return table


def gpt2_loss(P, n_layer, n_head, inputs, targets, positions=None):
    """positions: (B, T) position ids, or None for 0..T-1 in every row."""
    B, T = inputs.shape
    C = P["wte.weight"].shape[1]
    V = P["wte.weight"].shape[0]
    hs = C // n_head
    x = P["wte.weight"][inputs] + (P["wpe.weight"][:T] if positions is None else P["wpe.weight"][positions])
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(n_layer):
        p = lambda name: P[f"h.{i}.{name}"]
        h = F.layer_norm(x, (C,), p("ln_1.weight"), p("ln_1.bias"), eps=1e-5)
        qkv = h @ p("attn.c_attn.weight") + p("attn.c_attn.bias")
        q, k, v = (t.view(B, T, n_head, hs).transpose(1, 2) for t in qkv.split(C, dim=2))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ p("attn.c_proj.weight") + p("attn.c_proj.bias")
        h = F.layer_norm(x, (C,), p("ln_2.weight"), p("ln_2.bias"), eps=1e-5)
        h = F.gelu(h @ p("mlp.c_fc.weight") + p("mlp.c_fc.bias"), approximate="tanh")
        x = x + h @ p("mlp.c_proj.weight") + p("mlp.c_proj.bias")
    x = F.layer_norm(x, (C,), P["ln_f.weight"], P["ln_f.bias"], eps=1e-5)
    logits = x @ P["wte.weight"].t()  # tied lm_head
    loss = F.cross_entropy(logits.view(-1, V), targets.reshape(-1))
    return loss, logits


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gpt2_torch_ref.py IN OUT")
    if sys.byteorder != "little":
        sys.exit("gpt2_torch_ref.py: the exchange format is little-endian")
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    if data[:8] != b"DSCGPT2I":
        sys.exit(f"{sys.argv[1]}: not a dsc GPT-2 test input (bad magic)")
    version, n_layer, n_head, n_embd, V, maxT, B, T = struct.unpack_from("<8i", data, 8)
    if version != 1:
        sys.exit(f"{sys.argv[1]}: format version {version}, expected 1")
    off = 8 + 32
    buf = bytearray(data)

    def take(count, dtype):
        nonlocal off
        t = torch.frombuffer(buf, dtype=dtype, count=count, offset=off).clone()
        off += 4 * count
        return t

    inputs = take(B * T, torch.int32).long().view(B, T)
    targets = take(B * T, torch.int32).long().view(B, T)
    table = tensor_table(n_layer, n_embd, V, maxT)
    P = {}
    for name, shape in table:
        P[name] = take(math.prod(shape), torch.float32).view(shape).requires_grad_(True)
    if off != len(data):
        sys.exit(f"{sys.argv[1]}: {len(data) - off} bytes left over; header and data disagree")

    loss, logits = gpt2_loss(P, n_layer, n_head, inputs, targets)
    loss.backward()
    with open(sys.argv[2], "wb") as f:
        f.write(b"DSCGPT2O")
        f.write(struct.pack("<d", loss.item()))
        f.write(logits.detach().contiguous().numpy().tobytes())
        for name, _ in table:
            f.write(P[name].grad.contiguous().numpy().tobytes())


if __name__ == "__main__":
    main()
