#!/usr/bin/env python3
"""Reference Llama / Qwen2 models from Hugging Face transformers, for test_llama_hf.c.

Usage: llama_hf_ref.py OUTDIR            (one forward + backward per case)
       llama_hf_ref.py --train OUTDIR    (20 AdamW steps per training case)

For every case in CASES this makes the model with transformers (random initialisation, fixed
seed; the weights are spread wider than the default 0.02 so that every layer matters), saves it
with save_pretrained (OUTDIR/<case>/model.safetensors), runs forward and backward in float32 on
the CPU with eager attention, and writes OUTDIR/<case>/ref.safetensors:
  input_ids, labels   int32 (B, T); labels of -100 are ignored positions
  logits              float32 (B, T, V)
  loss                float32 (1,): mean cross-entropy over the positions not ignored
  grad.<name>         float32, the loss's gradient for every parameter, Hugging Face names
with the configuration in the file's metadata (the C test builds its model from it). Labels are
aligned with the inputs (no shift), as dsc's targets are: the model is called without labels and
the loss is computed here from its logits.

With --train, for every case in TRAIN_CASES the model is saved the same way, then trained for
STEPS steps of torch.optim.AdamW (one group, every parameter decayed) on two random batches in
turn, and OUTDIR/<case>/train.safetensors holds input_ids and labels (STEPS, B, T), losses
(STEPS,) (each step's loss before its update) and final.<name> (every parameter after the last
step), with the optimizer's settings in the metadata; final64.<name> is the same training run in
float64 (stored as float32), the reference for how far float32 rounding alone moves each
parameter.
"""
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

# name, family, config, B, T. Sizes are small and partly odd on purpose.
CASES = [
    ("gqa_untied", "llama", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=96, num_hidden_layers=2, vocab_size=97,
                                 tie_word_embeddings=False, rope_theta=10000.0,
                                 rms_norm_eps=1e-5), 2, 19),
    ("mqa_tied", "llama", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
                               intermediate_size=80, num_hidden_layers=2, vocab_size=101,
                               tie_word_embeddings=True, rope_theta=500000.0,
                               rms_norm_eps=1e-6), 3, 13),
    ("llama3_scaling", "llama", dict(hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                                     intermediate_size=128, num_hidden_layers=2, vocab_size=89,
                                     tie_word_embeddings=True, rope_theta=500000.0,
                                     rms_norm_eps=1e-5,
                                     rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                   "low_freq_factor": 1.0,
                                                   "high_freq_factor": 4.0,
                                                   "original_max_position_embeddings": 16},
                                     max_position_embeddings=256), 2, 70),
    ("linear_scaling", "llama", dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=3,
                                     intermediate_size=70, num_hidden_layers=2, vocab_size=61,
                                     tie_word_embeddings=False, rope_theta=10000.0,
                                     rms_norm_eps=1e-5,
                                     rope_scaling={"rope_type": "linear", "factor": 4.0}), 2, 17),
    ("odd_sizes", "llama", dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
                                intermediate_size=70, num_hidden_layers=3, vocab_size=53,
                                tie_word_embeddings=True, rope_theta=10000.0,
                                rms_norm_eps=1e-5), 3, 11),
    ("qwen2_bias", "qwen2", dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=88, num_hidden_layers=2, vocab_size=83,
                                 tie_word_embeddings=True, rope_theta=1000000.0,
                                 rms_norm_eps=1e-6, use_sliding_window=False), 2, 21),
    ("qwen2_untied", "qwen2", dict(hidden_size=48, num_attention_heads=3, num_key_value_heads=1,
                                   intermediate_size=70, num_hidden_layers=2, vocab_size=59,
                                   tie_word_embeddings=False, rope_theta=1000000.0,
                                   rms_norm_eps=1e-6, use_sliding_window=False), 2, 15),
]


def config_meta(family, cfg, B, T):
    """The configuration as the C test reads it (safetensors metadata)."""
    V = cfg["vocab_size"]
    rs = cfg.get("rope_scaling") or {}
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    return {
        "n_layer": cfg["num_hidden_layers"], "hidden": cfg["hidden_size"],
        "n_head": cfg["num_attention_heads"], "n_kv_head": cfg["num_key_value_heads"],
        "head_dim": head_dim, "intermediate": cfg["intermediate_size"], "vocab": V,
        "rms_eps": repr(cfg["rms_norm_eps"]), "rope_theta": repr(cfg["rope_theta"]),
        "rope_type": {"": 0, "linear": 1, "llama3": 2}[rs.get("rope_type", "")],
        "factor": repr(rs.get("factor", 1.0)), "low": repr(rs.get("low_freq_factor", 0.0)),
        "high": repr(rs.get("high_freq_factor", 0.0)),
        "orig": rs.get("original_max_position_embeddings", 0),
        "tied": int(cfg["tie_word_embeddings"]), "qkv_bias": int(family == "qwen2"),
        "B": B, "T": T,
    }


def make_case(outdir, name, family, cfg, B, T, seed):
    model = make_model(family, cfg, seed)
    with torch.no_grad():  # wider than the default init so that every layer matters
        for pname, p in model.named_parameters():
            if pname.endswith("norm.weight"):
                p.add_(0.2 * torch.rand_like(p) - 0.1)
            elif pname.endswith(".bias"):
                p.copy_(0.2 * torch.rand_like(p) - 0.1)
            else:
                p.mul_(5.0)
    d = os.path.join(outdir, name)
    model.save_pretrained(d, safe_serialization=True)

    V = cfg["vocab_size"]
    ids = torch.randint(0, V, (B, T))
    labels = torch.randint(0, V, (B, T))
    labels[torch.rand(B, T) < 0.2] = -100
    labels[0, 0] = -100
    model.train()
    model.zero_grad()
    logits = model(input_ids=ids).logits
    loss = F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1), ignore_index=-100)
    loss.backward()

    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32),
           "logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
    for pname, p in model.named_parameters():
        out["grad." + pname] = p.grad.detach().contiguous()
    meta = config_meta(family, cfg, B, T)
    save_file(out, os.path.join(d, "ref.safetensors"),
              metadata={k: str(v) for k, v in meta.items()})


TRAIN_CASES = ["gqa_untied", "qwen2_bias"]
STEPS = 20
ADAMW = dict(lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def make_model(family, cfg, seed):
    torch.manual_seed(seed)
    cfg = dict(cfg)
    cfg.setdefault("max_position_embeddings", 128)
    cfg["attn_implementation"] = "eager"
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**cfg)).float()
    return Qwen2ForCausalLM(Qwen2Config(**cfg)).float()


def train_case(outdir, name, family, cfg, B, T, seed):
    model = make_model(family, cfg, seed)
    d = os.path.join(outdir, name)
    model.save_pretrained(d, safe_serialization=True)
    V = cfg["vocab_size"]
    # Two batches in turn, so that the loss falls visibly over the steps.
    ids = torch.randint(0, V, (2, B, T)).repeat(STEPS // 2, 1, 1)
    labels = torch.randint(0, V, (2, B, T))
    labels[torch.rand(2, B, T) < 0.2] = -100
    labels = labels.repeat(STEPS // 2, 1, 1)
    out = {"input_ids": ids.to(torch.int32), "labels": labels.to(torch.int32)}
    # The same training in float64 shows how far float32 rounding alone carries each parameter.
    for dtype, tag in ((torch.float32, "final"), (torch.float64, "final64")):
        m = make_model(family, cfg, seed).to(dtype)
        opt = torch.optim.AdamW(m.parameters(), **ADAMW)
        losses = torch.zeros(STEPS)
        m.train()
        for step in range(STEPS):
            opt.zero_grad()
            logits = m(input_ids=ids[step]).logits
            loss = F.cross_entropy(logits.reshape(-1, V), labels[step].reshape(-1),
                                   ignore_index=-100)
            loss.backward()
            opt.step()
            losses[step] = loss.detach()
        if dtype == torch.float32:
            out["losses"] = losses
        for pname, p in m.named_parameters():
            out[tag + "." + pname] = p.detach().float().contiguous()
    meta = config_meta(family, cfg, B, T)
    meta.update(lr=repr(ADAMW["lr"]), beta1=repr(ADAMW["betas"][0]),
                beta2=repr(ADAMW["betas"][1]), eps=repr(ADAMW["eps"]),
                weight_decay=repr(ADAMW["weight_decay"]), steps=STEPS)
    save_file(out, os.path.join(d, "train.safetensors"),
              metadata={k: str(v) for k, v in meta.items()})


def main():
    torch.set_num_threads(1)
    if sys.argv[1] == "--train":
        outdir = sys.argv[2]
        for i, (name, family, cfg, B, T) in enumerate(CASES):
            if name in TRAIN_CASES:
                train_case(outdir, name, family, cfg, B, T, 4321 + i)
        with open(os.path.join(outdir, "train_cases.txt"), "w") as f:
            f.write("".join(n + "\n" for n in TRAIN_CASES))
        return
    outdir = sys.argv[1]
    for i, (name, family, cfg, B, T) in enumerate(CASES):
        make_case(outdir, name, family, cfg, B, T, 1234 + i)
    with open(os.path.join(outdir, "cases.txt"), "w") as f:
        f.write("".join(c[0] + "\n" for c in CASES))


if __name__ == "__main__":
    main()
