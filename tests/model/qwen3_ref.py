#!/usr/bin/env python3
"""A Qwen3 decoder (Qwen3ForCausalLM, dense) in plain torch, float64: the oracle of
test_qwen3.sh, independent of transformers (Debian's torch 1.13 has no transformers release
with Qwen3 that runs on it). Written from the model's published definition: the Llama layer
(RMSNorm, grouped-query causal attention with rotate_half rotary embeddings, SwiGLU MLP) plus an
RMSNorm over each head's q and k vectors (weights q_norm, k_norm of head_dim, eps rms_norm_eps)
after the projections and before the rotation; no biases; head_dim from config.json.

Usage:
  qwen3_ref.py make DIR --seed S --config JSON   config.json + model.safetensors (random, F32)
  qwen3_ref.py grads DIR DUMP                    DUMP: dsc train --dump-grads; prints
                                                 "loss DSC REF REL" and "grads WORST NAME"
  qwen3_ref.py greedy DIR IDS N                  N greedy tokens after the ids in file IDS
Safetensors are read and written here (the format is a little-endian u64 header length, a JSON
header, then the raw tensors), so only torch and numpy are needed.
"""
import json
import struct
import sys

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def st_read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        arr = np.frombuffer(data[a:b], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out, meta


def st_write(path, tensors):
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def shapes(cfg):
    C, hd = cfg["hidden_size"], cfg["head_dim"]
    Q, KV = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    I, V = cfg["intermediate_size"], cfg["vocab_size"]
    out = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.update({p + "input_layernorm.weight": (C,), p + "self_attn.q_proj.weight": (Q, C),
                    p + "self_attn.k_proj.weight": (KV, C), p + "self_attn.v_proj.weight": (KV, C),
                    p + "self_attn.o_proj.weight": (C, Q), p + "self_attn.q_norm.weight": (hd,),
                    p + "self_attn.k_norm.weight": (hd,),
                    p + "post_attention_layernorm.weight": (C,), p + "mlp.gate_proj.weight": (I, C),
                    p + "mlp.up_proj.weight": (I, C), p + "mlp.down_proj.weight": (C, I)})
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (V, C)
    return out


def make(argv):
    out = argv[0]
    opts = dict(zip(argv[1::2], argv[2::2]))
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
           "attention_bias": False, "use_sliding_window": False, "sliding_window": None,
           "rope_scaling": None, "torch_dtype": "float32", "bos_token_id": None,
           "eos_token_id": None}
    cfg.update(json.loads(opts["--config"]))
    g = torch.Generator().manual_seed(int(opts["--seed"]))
    tensors = {}
    for name, shape in shapes(cfg).items():
        if len(shape) == 1:  # norms: around 1, different per channel so that each one matters
            tensors[name] = 1.0 + 0.3 * torch.randn(shape, generator=g)
        else:  # wider than the usual 0.02 so that every layer changes the logits
            tensors[name] = 0.08 * torch.randn(shape, generator=g)
    with open(f"{out}/config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    st_write(f"{out}/model.safetensors", tensors)


def load(d):
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    w, _ = st_read(f"{d}/model.safetensors")
    w = {k: v.to(torch.float64).requires_grad_(True) for k, v in w.items()}
    return cfg, w


def rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x, pos, theta, hd):
    # inv_freq and the angles in fp32 as the published implementation computes them, then
    # cos/sin applied in float64.
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    ang = (pos.float()[:, None] * inv[None, :])
    emb = torch.cat([ang, ang], -1)
    cos, sin = emb.cos().to(torch.float64), emb.sin().to(torch.float64)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def forward(cfg, w, ids):
    B, T = ids.shape
    C, hd, eps = cfg["hidden_size"], cfg["head_dim"], cfg["rms_norm_eps"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    theta = cfg.get("rope_theta", 10000.0)
    pos = torch.arange(T)
    x = w["model.embed_tokens.weight"][ids]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for l in range(cfg["num_hidden_layers"]):
        p = lambda n: w[f"model.layers.{l}.{n}"]  # noqa: E731
        h = rms(x, p("input_layernorm.weight"), eps)
        q = (h @ p("self_attn.q_proj.weight").T).view(B, T, NH, hd)
        k = (h @ p("self_attn.k_proj.weight").T).view(B, T, NKV, hd)
        v = (h @ p("self_attn.v_proj.weight").T).view(B, T, NKV, hd)
        q = rope(rms(q, p("self_attn.q_norm.weight"), eps).transpose(1, 2), pos, theta, hd)
        k = rope(rms(k, p("self_attn.k_norm.weight"), eps).transpose(1, 2), pos, theta, hd)
        v = v.transpose(1, 2)
        k = k.repeat_interleave(NH // NKV, 1)
        v = v.repeat_interleave(NH // NKV, 1)
        s = (q @ k.transpose(-1, -2)) / hd ** 0.5 + mask
        y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, NH * hd)
        x = x + y @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"), eps)
        m = torch.nn.functional.silu(h @ p("mlp.gate_proj.weight").T) * (h @ p("mlp.up_proj.weight").T)
        x = x + m @ p("mlp.down_proj.weight").T
    x = rms(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return x @ head.T


def grads(argv):
    cfg, w = load(argv[0])
    dump, meta = st_read(argv[1])
    ids, tg = dump["inputs"].long(), dump["targets"].long()
    logits = forward(cfg, w, ids)
    keep = tg.reshape(-1) >= 0  # dsc's ignored targets are any negative id
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1])[keep],
                                             tg.reshape(-1)[keep])
    loss.backward()
    dsc_loss = float(meta.get("loss", dump["loss"].item() if "loss" in dump else "nan"))
    ref = loss.item()
    print(f"loss {dsc_loss:.9g} {ref:.9g} {abs(dsc_loss - ref) / abs(ref):.3g}")
    worst, where = 0.0, ""
    for name, p in w.items():
        if name not in dump:
            worst, where = float("inf"), "missing " + name
            continue
        g = dump[name].to(torch.float64)
        err = ((g - p.grad).norm() / p.grad.norm().clamp_min(1e-30)).item()
        if err > worst:
            worst, where = err, name
    extra = [k for k in dump if k not in w and k not in ("inputs", "targets", "loss")]
    if extra:
        worst, where = float("inf"), "unexpected " + extra[0]
    print(f"grads {worst:.3g} {where}")


def greedy(argv):
    cfg, w = load(argv[0])
    with open(argv[1]) as f:
        ids = [int(x) for x in f.read().split()]
    out = []
    with torch.no_grad():
        for _ in range(int(argv[2])):
            nxt = int(forward(cfg, w, torch.tensor([ids + out]))[0, -1].argmax())
            out.append(nxt)
    print(" ".join(map(str, out)))


if __name__ == "__main__":
    cmds = {"make": make, "grads": grads, "greedy": greedy}
    if len(sys.argv) < 3 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
