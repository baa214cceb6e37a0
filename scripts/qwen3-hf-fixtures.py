#!/usr/bin/env python3
"""Make the Qwen3 fixtures of tests/model/test_qwen3_hf_fixtures.c with Hugging Face
transformers' own Qwen3ForCausalLM (transformers >= 4.51; the suite's venv pins 4.44.2, which
has no Qwen3, and no release with Qwen3 runs on Debian's torch 1.13, so this runs where a newer
torch and transformers are installed, offline, and its output is committed).

Usage: python3 scripts/qwen3-hf-fixtures.py [--old-torch] [OUTDIR]
       (default OUTDIR: tests/model/fixtures/qwen3)

--old-torch lets transformers 4.51.3 import on torch 1.13 (Debian's): its modeling code imports
three names that torch 1.13 lacks and that Qwen3's float32 eager CPU path never calls
(torch.distributed.tensor.DTensor, torch.compiler, the float8 dtypes); they are given stand-ins
before transformers is imported. Without the flag nothing is patched (a torch >= 2 machine).

For every case of CASES: a Qwen3ForCausalLM with random weights (fixed seed; weights spread wider
than the default 0.02 and the q/k norm weights away from 1, so that every one matters), saved with
save_pretrained (OUTDIR/<case>/config.json, model.safetensors), then one forward and backward in
float32 on the CPU with eager attention on a fixed batch, written to OUTDIR/<case>/ref.safetensors:
  input_ids, labels   int32 (B, T); labels aligned with the inputs (dsc's targets: no shift),
                      -100 where ignored
  logits              float32 (B, T, V)
  loss                float32 (1,): the mean cross-entropy over the labels not ignored
  grad.<name>         float32: the loss's gradient for every parameter, Hugging Face names
with the shape in the file's metadata (what the C test builds dsc's model from) and the versions
of torch and transformers. OUTDIR/cases.txt lists the cases. A few tens of kilobytes in all.
"""
import os
import sys
import types

import torch
import torch.nn.functional as F


def stand_ins_for_old_torch():
    if "torch.distributed.tensor" not in sys.modules:
        dt = types.ModuleType("torch.distributed.tensor")
        dt.DTensor = type("DTensor", (), {})  # isinstance checks only: nothing is one
        sys.modules["torch.distributed.tensor"] = dt
    if not hasattr(torch, "compiler"):
        c = types.ModuleType("torch.compiler")
        c.is_compiling = lambda: False
        c.disable = lambda fn=None, recursive=True: fn if fn is not None else (lambda f: f)
        torch.compiler = c
        sys.modules["torch.compiler"] = c
    for name in ("float8_e4m3fn", "float8_e5m2"):  # keys of dtype tables, never used here
        if not hasattr(torch, name):  # a distinct object: an alias of a real dtype would
            setattr(torch, name, type(name, (), {})())  # overwrite that dtype's table entries


if "--old-torch" in sys.argv:
    sys.argv.remove("--old-torch")
    stand_ins_for_old_torch()

import transformers  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

# name, config, B, T. q and k wider than the hidden size in the first, as qwen3-0.6B's.
CASES = [
    ("gqa_untied", dict(hidden_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=56, num_hidden_layers=2, vocab_size=97,
                        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
                        max_position_embeddings=64), 2, 13),
    ("mqa_tied", dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      intermediate_size=48, num_hidden_layers=2, vocab_size=101,
                      tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5,
                      max_position_embeddings=64), 3, 11),
]


def rope_theta(cfg):
    # transformers 5 keeps it in rope_parameters, 4.x as an attribute
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


def make_case(out, name, kw, B, T, seed):
    torch.manual_seed(seed)
    cfg = Qwen3Config(attention_bias=False, use_sliding_window=False, sliding_window=None, **kw)
    cfg._attn_implementation = "eager"
    model = Qwen3ForCausalLM(cfg).to(torch.float32)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.3 * torch.randn_like(p))
            else:
                p.copy_(0.08 * torch.randn_like(p))
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    g = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    labels = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    labels[torch.rand((B, T), generator=g) < 0.2] = -100
    model.train(False)
    logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                           ignore_index=-100)
    loss.backward()
    tensors = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
               "logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    for pname, p in model.named_parameters():
        tensors["grad." + pname] = p.grad.detach().contiguous()
    meta = {"n_layer": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
            "n_head": cfg.num_attention_heads, "n_kv_head": cfg.num_key_value_heads,
            "head_dim": cfg.head_dim, "intermediate": cfg.intermediate_size,
            "vocab": cfg.vocab_size, "B": B, "T": T, "rms_eps": repr(cfg.rms_norm_eps),
            "rope_theta": repr(rope_theta(cfg)), "tied": int(cfg.tie_word_embeddings),
            "torch": torch.__version__, "transformers": transformers.__version__}
    save_file(tensors, os.path.join(d, "ref.safetensors"), {k: str(v) for k, v in meta.items()})
    print(f"{name}: loss {loss.item():.6f} (torch {torch.__version__}, transformers "
          f"{transformers.__version__})")


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "model",
                                                               "fixtures", "qwen3")
    os.makedirs(out, exist_ok=True)
    for i, (name, kw, B, T) in enumerate(CASES):
        make_case(out, name, kw, B, T, 11 + 7 * i)
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("".join(name + "\n" for name, _, _, _ in CASES))


if __name__ == "__main__":
    main()
