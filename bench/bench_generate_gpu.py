#!/usr/bin/env python3
"""GPT-2 generation on one GPU: `dsc generate --device cuda` against Hugging Face transformers'
GPT2LMHeadModel.generate (bf16 and fp32) in the same run, greedy, KV cache on both sides.

Usage (from the repository root, on a machine with a CUDA device, torch and transformers):
    python3 bench/bench_generate_gpu.py [--dsc build/dsc] [--out DIR]

The model: a GPT-2 124M shape (12 layers, 12 heads, 768 channels, vocabulary 50257, context
1024), trained by `dsc train --device cuda` for --train-steps steps on a synthetic token corpus
(a few hundred fixed "sentences" of token ids repeated in random order), so that greedy choices
have clear margins; its weights come out of `--dump-weights` as safetensors with Hugging Face
names, which both sides load. No network is needed.

Timing. Both sides generate --new-tokens tokens after a --prompt-len token prompt for batch 1 and
8 (equal prompt lengths, so no padding), median of --reps runs after a warm-up run:
  - dsc: its own timing from the summary line on stderr (prefill + steps; the process start, the
    weights' load and upload, and dsc's warm-up pass are not in it), and the process's wall time.
  - Hugging Face: model.generate(do_sample=False, use_cache=True, min_new_tokens = max_new_tokens)
    between two torch.cuda.synchronize() calls, with the model already on the device.
tokens/s = batch x new tokens / time; the ratio column is dsc over Hugging Face.

Agreement: dsc's greedy tokens against each Hugging Face run's, per sequence: how many sequences
are identical and the mean length of the common prefix. bf16 (dsc, HF bf16) and fp32 (HF fp32)
round differently, so a near-tie can send two greedy runs apart; the margins of the trained model
make that rare.

Everything is printed as one table; with --out (default $OUT when set) the table, the raw
numbers (JSON) and the logs are written there too.
"""
import argparse
import array
import json
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

V = 50257


def write_corpus(d, n_tokens, seed=1):
    """Token shards in dsc's format: 256 int32 header (magic, version 1, count), uint16 tokens."""
    rng = random.Random(seed)
    vocab = rng.sample(range(V - 1), 4000)  # never the end-of-text id 50256
    sentences = [[rng.choice(vocab) for _ in range(rng.randint(8, 24))] for _ in range(400)]
    os.makedirs(d, exist_ok=True)
    stream = []
    while len(stream) < n_tokens + 200_000:
        stream += rng.choice(sentences)
    for split, part in (("train", stream[:n_tokens]), ("val", stream[n_tokens:])):
        with open(f"{d}/{split}.bin", "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, len(part), *([0] * 253)))
            array.array("H", part).tofile(f)
    json.dump({"vocab_size": V}, open(f"{d}/dataset.json", "w"))
    return stream


def train(a, work, log):
    data = f"{work}/data"
    stream = write_corpus(data, 2_000_000)
    cfg = f"{work}/train.json"
    json.dump({"train_micro_batch_size_per_gpu": a.train_batch, "gradient_accumulation_steps": 1,
               "steps_per_print": 50, "gradient_clipping": 1.0, "bf16": {"enabled": True},
               "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.0}}},
              open(cfg, "w"))
    weights = f"{work}/gpt2.safetensors"
    cmd = [a.dsc, "train", "--device", a.train_device, "--config", cfg, "--model", a.model,
           "--seq-len", str(a.seq_len), "--data", data, "--max-steps", str(a.train_steps),
           "--eval-every", "0", "--sample-tokens", "0", "--out", f"{work}/run",
           "--dump-weights", weights]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    log.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    if r.returncode != 0:
        sys.exit(f"bench: dsc train failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    losses = [json.loads(x)["loss"] for x in open(f"{work}/run/metrics.jsonl")]
    print(f"model: {a.model}, trained {a.train_steps} steps in {time.time() - t0:.1f} s, loss "
          f"{losses[0]:.3f} -> {losses[-1]:.3f}")
    return weights, stream, losses


def prompts_for(stream, batch, plen, seed):
    rng = random.Random(seed)
    starts = [rng.randrange(0, len(stream) // 2) for _ in range(batch)]
    return [stream[s:s + plen] for s in starts]


def parse_dsc_output(text, prompts):
    """Generated ids per prompt from dsc's stdout (--tokenizer ids: prompt ids then new ids)."""
    blocks = re.split(r"^=== prompt \d+ ===\n", text, flags=re.M) if len(prompts) > 1 else [text]
    blocks = [b for b in blocks if b.strip()]
    assert len(blocks) == len(prompts), (len(blocks), len(prompts))
    out = []
    for b, p in zip(blocks, prompts):
        ids = [int(x) for x in b.split()]
        assert ids[:len(p)] == p, "dsc echoed another prompt"
        out.append(ids[len(p):])
    return out


SUMMARY = re.compile(r"generated (\d+) tokens for (\d+) prompt\(s\) in ([0-9.]+) s \(([0-9.]+) "
                     r"tokens/s; prompts ([0-9.]+) s, then ([0-9.]+) tokens/s")


def run_dsc(a, weights, prompts, work, log):
    pf = f"{work}/prompts_{len(prompts)}.txt"
    with open(pf, "w") as f:
        for p in prompts:
            f.write(" ".join(map(str, p)) + "\n")
    cmd = [a.dsc, "generate", "--device", a.device, "--weights", weights, "--tokenizer", "ids",
           "--prompt-file", pf, "--max-new-tokens", str(a.new_tokens), "--temperature", "0"]
    runs, tokens = [], None
    for rep in range(a.reps + 1):  # the first is a warm-up (file cache, driver)
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.time() - t0
        log.write(" ".join(cmd) + "\n" + r.stderr)
        if r.returncode != 0:
            sys.exit(f"bench: dsc generate failed:\n{r.stderr[-2000:]}")
        m = SUMMARY.search(r.stderr)
        assert m, r.stderr
        n, _, total_s, tps, prefill_s, decode_tps = m.groups()
        assert int(n) == len(prompts) * a.new_tokens, f"dsc generated {n} tokens"
        tokens = parse_dsc_output(r.stdout, prompts)
        if rep > 0:
            runs.append({"tok_s": float(tps), "prefill_ms": 1e3 * float(prefill_s),
                         "decode_tok_s": float(decode_tps), "gen_s": float(total_s),
                         "wall_s": wall})
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    med["wall_tok_s"] = len(prompts) * a.new_tokens / med["wall_s"]
    return med, tokens


def load_hf(weights, dtype):
    import torch
    from safetensors.torch import load_file
    from transformers import GPT2Config, GPT2LMHeadModel
    sd = load_file(weights)
    sd = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}
    C, T = sd["wte.weight"].shape[1], sd["wpe.weight"].shape[0]
    L = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("h."))
    cfg = GPT2Config(vocab_size=sd["wte.weight"].shape[0], n_positions=T, n_embd=C, n_layer=L,
                     n_head=C // 64, activation_function="gelu_new", resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5)
    model = GPT2LMHeadModel(cfg)
    missing, unexpected = model.transformer.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not k.endswith(("attn.bias", "attn.masked_bias"))]
    assert not missing and not unexpected, (missing, unexpected)
    model.tie_weights()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.to(device="cuda", dtype=dtype).eval()


def run_hf(a, model, prompts):
    import torch
    ids = torch.tensor(prompts, dtype=torch.long, device="cuda")
    mask = torch.ones_like(ids)
    kw = dict(max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, do_sample=False,
              use_cache=True, attention_mask=mask, pad_token_id=0)
    times, out = [], None
    with torch.inference_mode():
        for rep in range(a.reps + 1):  # the first is a warm-up
            torch.cuda.synchronize()
            t0 = time.time()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            if rep > 0:
                times.append(time.time() - t0)
    toks = out[:, ids.shape[1]:].tolist()
    assert all(len(t) == a.new_tokens for t in toks)
    s = statistics.median(times)
    return {"gen_s": s, "tok_s": len(prompts) * a.new_tokens / s}, toks


def agreement(x, y):
    same = sum(p == q for p, q in zip(x, y))
    prefix = []
    for p, q in zip(x, y):
        k = 0
        while k < min(len(p), len(q)) and p[k] == q[k]:
            k += 1
        prefix.append(k)
    return {"identical": same, "of": len(x), "mean_prefix": statistics.mean(prefix)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dsc", default=os.environ.get("DSC", "build/dsc"))
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    ap.add_argument("--model", default="gpt2-124M")
    ap.add_argument("--seq-len", type=int, default=1024, help="context of the trained model")
    ap.add_argument("--train-steps", type=int, default=150)
    ap.add_argument("--train-batch", type=int, default=4)
    ap.add_argument("--train-device", default="cuda")
    ap.add_argument("--device", default="cuda", help="dsc generate's device")
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--no-hf", action="store_true", help="dsc only (e.g. to check this script)")
    a = ap.parse_args()
    if not os.access(a.dsc, os.X_OK):
        sys.exit(f"bench: {a.dsc} is not an executable dsc; pass --dsc PATH")
    work = tempfile.mkdtemp(prefix="dsc_bench_gen_")
    out_dir = a.out or work
    os.makedirs(out_dir, exist_ok=True)
    log = open(f"{out_dir}/bench_generate_gpu.log", "w")
    gpu = ""
    if a.device == "cuda":
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                           capture_output=True, text=True)
        gpu = r.stdout.strip().split("\n")[0] if r.returncode == 0 else "?"
    weights, stream, losses = train(a, work, log)
    hf = {}
    if not a.no_hf:
        import torch
        import transformers
        print(f"torch {torch.__version__}, transformers {transformers.__version__}, GPU {gpu}")
        for name, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            hf[name] = load_hf(weights, dt)
    rows = []
    for B in [int(x) for x in a.batches.split(",")]:
        prompts = prompts_for(stream, B, a.prompt_len, seed=B)
        d, dtoks = run_dsc(a, weights, prompts, work, log)
        row = {"batch": B, "dsc": d}
        for name, model in hf.items():
            h, htoks = run_hf(a, model, prompts)
            row["hf_" + name] = h
            row["agree_" + name] = agreement(dtoks, htoks)
        rows.append(row)
    lines = [f"GPT-2 generation, {a.model} trained {a.train_steps} steps (loss {losses[0]:.2f} -> "
             f"{losses[-1]:.2f}), prompt {a.prompt_len} + {a.new_tokens} new tokens, greedy, "
             f"median of {a.reps}; dsc --device {a.device}{', GPU ' + gpu if gpu else ''}", "",
             "| batch | dsc tok/s | dsc prefill ms | dsc decode tok/s | dsc tok/s incl. process |"
             " HF bf16 tok/s | HF fp32 tok/s | dsc / HF bf16 | dsc / HF fp32 |"
             " same as HF bf16 | same as HF fp32 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["dsc"]
        cells = [str(r["batch"]), f"{d['tok_s']:.0f}", f"{d['prefill_ms']:.2f}",
                 f"{d['decode_tok_s']:.0f}", f"{d['wall_tok_s']:.0f}"]
        for name in ("bf16", "fp32"):
            cells.append(f"{r['hf_' + name]['tok_s']:.0f}" if "hf_" + name in r else "-")
        for name in ("bf16", "fp32"):
            cells.append(f"{d['tok_s'] / r['hf_' + name]['tok_s']:.2f}x"
                         if "hf_" + name in r else "-")
        for name in ("bf16", "fp32"):
            g = r.get("agree_" + name)
            cells.append(f"{g['identical']}/{g['of']} (prefix {g['mean_prefix']:.1f})"
                         if g else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "dsc tok/s: batch x new tokens over dsc's own prefill + steps time (stderr "
              "summary; no process start, weight load or warm-up); incl. process: over the "
              "process's wall time. HF: model.generate between two synchronizes. same as: "
              "sequences whose greedy tokens are identical (mean common prefix in tokens)."]
    text = "\n".join(lines)
    print(text)
    with open(f"{out_dir}/bench_generate_gpu.md", "w") as f:
        f.write(text + "\n")
    json.dump(rows, open(f"{out_dir}/bench_generate_gpu.json", "w"), indent=1)
    print(f"(table, numbers and logs in {out_dir})")


if __name__ == "__main__":
    main()
