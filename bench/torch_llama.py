#!/usr/bin/env python3
"""PyTorch baselines of Llama-family training on one GPU, for bench/gpu_llama.sh.

  torch_llama.py SHAPE BATCH [--seq T] [--steps N] [--warmup W] [--variants LIST]

SHAPE is one of dsc's published Llama-family shapes (the numbers of docs/models.md, from the
published config.json files); LIST is a comma-separated subset of
  plain-eager, plain-compiled   a Llama written here with torch operators: RMSNorm, rotary
                                embeddings, SDPA with enable_gqa (no repeated K/V), SwiGLU; for
                                the Qwen3 shapes each head's q and k RMSNorm before the rotation
  hf-eager, hf-compiled         transformers' LlamaForCausalLM / Qwen2ForCausalLM /
                                Qwen3ForCausalLM with sdpa attention (what a DeepSpeed + Hugging
                                Face Trainer user runs)
  hf-peft-eager,                LoRA with PEFT on transformers' model: the base in bf16 (frozen),
  hf-peft-compiled              adapters r 16 (lora_alpha 32, no dropout) on every linear module
                                ("all-linear"), bf16 autocast, AdamW over the adapters (what a
                                Hugging Face user fine-tuning with PEFT runs)
  plain-eager-bf16,             the plain Llama with bf16 parameters, gradients and AdamW states
  plain-compiled-bf16           (no fp32 master: the PyTorch setup in which an 8B model fits one
                                GPU; dsc's bf16.bf16_master_weights_and_grads and
                                bf16_optimizer_states)
  plain-compiled-float8,        plain-compiled / plain-compiled-bf16 with torchao's float8
  plain-compiled-bf16-float8    training (convert_to_float8_training, its default config:
                                tensorwise dynamic scaling, E4M3 forward, E5M2 gradients) on
                                the layers' linear modules; the output head stays in bf16, as
                                with dsc's fp8 section (SKIP where torchao is not installed)
All train with random tokens, fp32 weights and bf16 autocast (the -bf16 variants: bf16 weights),
fused AdamW (lr 3e-4, betas (0.9, 0.95), weight decay 0.1), gradient clipping 1.0: the step dsc
trains. Tokens/s is B*T over
the median step time of STEPS steps after WARMUP warm-up steps, each step timed with CUDA events.
Prints one line per variant: "RESULT variant tokens_per_s step_ms params" (or "SKIP variant why").
"""
import argparse
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# layers, hidden, heads, kv heads, head_dim, intermediate, vocab, tied, qkv bias, theta, eps
SHAPES = {
    "smollm2-135M": (30, 576, 9, 3, 64, 1536, 49152, True, False, 1e5, 1e-5),
    "smollm2-360M": (32, 960, 15, 5, 64, 2560, 49152, True, False, 1e5, 1e-5),
    "llama-3.2-1B": (16, 2048, 32, 8, 64, 8192, 128256, True, False, 5e5, 1e-5),
    "llama-3.2-3B": (28, 3072, 24, 8, 128, 8192, 128256, True, False, 5e5, 1e-5),
    "llama-3.1-8B": (32, 4096, 32, 8, 128, 14336, 128256, False, False, 5e5, 1e-5),
    "qwen2.5-0.5B": (24, 896, 14, 2, 64, 4864, 151936, True, True, 1e6, 1e-6),
    "qwen3-0.6B": (28, 1024, 16, 8, 128, 3072, 151936, True, False, 1e6, 1e-6),
    "qwen3-1.7B": (28, 2048, 16, 8, 128, 6144, 151936, True, False, 1e6, 1e-6),
}
QK_NORM = {"qwen3-0.6B", "qwen3-1.7B"}  # Qwen3: per-head RMSNorm of q and k


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (h * self.weight).to(x.dtype)


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Attention(nn.Module):
    def __init__(self, C, nh, nkv, hd, bias, eps, qk_norm):
        super().__init__()
        self.nh, self.nkv, self.hd = nh, nkv, hd
        self.q_norm = RMSNorm(hd, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(hd, eps) if qk_norm else nn.Identity()
        self.q = nn.Linear(C, nh * hd, bias=bias)
        self.k = nn.Linear(C, nkv * hd, bias=bias)
        self.v = nn.Linear(C, nkv * hd, bias=bias)
        self.o = nn.Linear(nh * hd, C, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_norm(self.q(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(B, T, self.nh * self.hd))


class Block(nn.Module):
    def __init__(self, C, nh, nkv, hd, inter, bias, eps, qk_norm):
        super().__init__()
        self.ln1, self.ln2 = RMSNorm(C, eps), RMSNorm(C, eps)
        self.attn = Attention(C, nh, nkv, hd, bias, eps, qk_norm)
        self.gate = nn.Linear(C, inter, bias=False)
        self.up = nn.Linear(C, inter, bias=False)
        self.down = nn.Linear(inter, C, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        h = self.ln2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class PlainLlama(nn.Module):
    def __init__(self, shape, T, qk_norm=False):
        super().__init__()
        L, C, nh, nkv, hd, inter, V, tied, bias, theta, eps = shape
        self.embed = nn.Embedding(V, C)
        self.layers = nn.ModuleList(Block(C, nh, nkv, hd, inter, bias, eps, qk_norm)
                                    for _ in range(L))
        self.norm = RMSNorm(C, eps)
        self.head = nn.Linear(C, V, bias=False)
        if tied:
            self.head.weight = self.embed.weight
        inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos()[None, None], persistent=False)
        self.register_buffer("sin", ang.sin()[None, None], persistent=False)

    def forward(self, idx, targets):
        x = self.embed(idx)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class HFWrap(nn.Module):
    def __init__(self, shape, T, qk_norm=False):
        super().__init__()
        import transformers
        L, C, nh, nkv, hd, inter, V, tied, bias, theta, eps = shape
        kw = dict(vocab_size=V, hidden_size=C, intermediate_size=inter, num_hidden_layers=L,
                  num_attention_heads=nh, num_key_value_heads=nkv, max_position_embeddings=T,
                  rms_norm_eps=eps, rope_theta=theta, tie_word_embeddings=tied)
        if qk_norm:
            cfg = transformers.Qwen3Config(head_dim=hd, **kw)
            self.m = transformers.Qwen3ForCausalLM._from_config(cfg, attn_implementation="sdpa")
        elif bias:
            cfg = transformers.Qwen2Config(**kw)
            self.m = transformers.Qwen2ForCausalLM._from_config(cfg, attn_implementation="sdpa")
        else:
            cfg = transformers.LlamaConfig(**kw)
            self.m = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")

    def forward(self, idx, targets):
        logits = self.m(input_ids=idx).logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


class PeftWrap(HFWrap):
    """transformers' model in bf16 with PEFT's LoRA adapters on every linear module."""

    def __init__(self, shape, T, qk_norm=False):
        import peft
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # the base made in bf16, on the GPU
        try:
            with torch.device("cuda"):
                super().__init__(shape, T, qk_norm)
        finally:
            torch.set_default_dtype(old)
        cfg = peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear")
        self.m = peft.get_peft_model(self.m, cfg)


def count_params(model):
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def run(variant, shape, B, T, steps, warmup, qk_norm=False):
    torch.manual_seed(0)
    dev = "cuda"
    bf16 = "-bf16" in variant
    kind = PeftWrap if variant.startswith("hf-peft") else HFWrap if variant.startswith("hf") \
        else PlainLlama
    model = kind(shape, T, qk_norm).to(dev)
    if bf16:
        model = model.to(torch.bfloat16)
    if variant.endswith("-float8"):
        from torchao.float8 import convert_to_float8_training
        convert_to_float8_training(model, module_filter_fn=lambda m, name: name != "head" and
                                   m.in_features % 16 == 0 and m.out_features % 16 == 0)
    n = count_params(model)
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trained, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if "compiled" in variant else model
    V = shape[6]
    idx = torch.randint(0, V, (B, T), device=dev)
    tgt = torch.randint(0, V, (B, T), device=dev)
    times = []
    for s in range(warmup + steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=not bf16):
            loss = fwd(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
        if s >= warmup:
            times.append(start.elapsed_time(end))
        if not math.isfinite(loss.item()):
            raise RuntimeError("loss is not finite")
    ms = statistics.median(times)
    del model, opt, fwd
    torch.cuda.empty_cache()
    return B * T / (ms / 1e3), ms, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("batch", type=int)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=6)
    ap.add_argument("--variants", default="plain-eager,plain-compiled,hf-eager,hf-compiled")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("torch_llama.py: no CUDA device")
    for v in a.variants.split(","):
        try:
            tok_s, ms, n = run(v, SHAPES[a.shape], a.batch, a.seq, a.steps, a.warmup,
                               a.shape in QK_NORM)
            print(f"RESULT {v} {tok_s:.1f} {ms:.3f} {n}", flush=True)
        except Exception as e:  # a variant that cannot run here is reported, the others go on
            print(f"SKIP {v} {type(e).__name__}: {str(e).splitlines()[0][:200]}", flush=True)


if __name__ == "__main__":
    main()
