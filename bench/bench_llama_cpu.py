#!/usr/bin/env python3
"""Llama CPU forward + backward, model only: dsc vs PyTorch, same shape, batch and threads.

Usage: bench_llama_cpu.py BENCH_LLAMA_CPU [--model llama-d6] [--vocab 256] [--batch 8]
                          [--seq-len 256] [--passes 5] [--threads 2] [--rounds 2]

dsc side: the bench_llama_cpu program (build/bench/bench_llama_cpu). PyTorch side: Debian's torch
(CPU), a Llama written here with torch operators in float32 (RMSNorm, rotary embeddings with
rotate_half, grouped-query attention with repeated K/V as Hugging Face does it, SwiGLU, tied
lm_head, cross-entropy). The two alternate for --rounds rounds; each reports the median time of
its passes after one warm-up. Prints one table with tokens/s of each and the ratio.
"""
import argparse
import math
import re
import statistics
import subprocess
import time


def shape_of(spec):
    n = int(re.fullmatch(r"llama-d(\d+)", spec).group(1))
    C = 64 * n
    return dict(L=n, C=C, NH=n, NKV=n // 2 if n % 2 == 0 else n, hd=64,
                I=(8 * C // 3 + 63) // 64 * 64, theta=1e4, eps=1e-5)


def torch_ms(s, V, B, T, passes, threads):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    L, C, NH, NKV, hd, I = s["L"], s["C"], s["NH"], s["NKV"], s["hd"], s["I"]

    def w(*shape):
        return (torch.randn(*shape) * 0.02).requires_grad_()

    emb = w(V, C)
    layers = [dict(ln1=torch.ones(C, requires_grad=True), q=w(NH * hd, C), k=w(NKV * hd, C),
                   v=w(NKV * hd, C), o=w(C, NH * hd), ln2=torch.ones(C, requires_grad=True),
                   gate=w(I, C), up=w(I, C), down=w(C, I)) for _ in range(L)]
    norm = torch.ones(C, requires_grad=True)
    inv = 1.0 / (s["theta"] ** (torch.arange(0, hd, 2).float() / hd))
    ang = torch.arange(T).float()[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    mask = torch.full((T, T), float("-inf")).triu(1)

    def rms(x, g):
        return g * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s["eps"]))

    def rot(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def loss_of(ids, tg):
        x = emb[ids]
        for p in layers:
            h = rms(x, p["ln1"])
            q = rot((h @ p["q"].t()).view(B, T, NH, hd).transpose(1, 2))
            k = rot((h @ p["k"].t()).view(B, T, NKV, hd).transpose(1, 2))
            v = (h @ p["v"].t()).view(B, T, NKV, hd).transpose(1, 2)
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
            att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, -1)
            y = (att @ v).transpose(1, 2).reshape(B, T, NH * hd)
            x = x + y @ p["o"].t()
            h = rms(x, p["ln2"])
            x = x + (F.silu(h @ p["gate"].t()) * (h @ p["up"].t())) @ p["down"].t()
        logits = rms(x, norm) @ emb.t()
        return F.cross_entropy(logits.view(-1, V), tg.view(-1))

    times = []
    for _ in range(passes + 1):
        ids, tg = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
        t0 = time.perf_counter()
        loss_of(ids, tg).backward()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[1:])


def dsc_ms(binary, spec, V, B, T, passes, threads):
    env = {"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([binary, spec, str(V), str(B), str(T), str(passes)], env=env,
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r"median ([0-9.]+) ms", out).group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--model", default="llama-d6")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    s = shape_of(a.model)
    d, t = [], []
    for _ in range(a.rounds):
        d.append(dsc_ms(a.binary, a.model, a.vocab, a.batch, a.seq_len, a.passes, a.threads))
        t.append(torch_ms(s, a.vocab, a.batch, a.seq_len, a.passes, a.threads))
    tok = a.batch * a.seq_len
    dm, tm = min(d), min(t)
    print("| model | B | T | threads | dsc ms | PyTorch ms | dsc tok/s | PyTorch tok/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {a.model} | {a.batch} | {a.seq_len} | {a.threads} | {dm:.0f} | {tm:.0f} | "
          f"{tok / dm * 1e3:.0f} | {tok / tm * 1e3:.0f} | {tm / dm:.2f}x |")


if __name__ == "__main__":
    main()
