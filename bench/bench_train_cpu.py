#!/usr/bin/env python3
"""CPU training throughput: dsc train vs PyTorch, same GPT-2, batch, sequence length and threads.

Usage: bench_train_cpu.py DSC_BINARY [--model d6] [--seq-len 256] [--batch 8] [--steps 10]
                          [--threads 2]

PyTorch side: Debian's torch (CPU), the hand-written GPT-2 of tests/model/gpt2_torch_ref.py
(the same math as dsc's model), torch.optim.AdamW, the same hyper-parameters. dsc side: `dsc train`
with an equivalent DeepSpeed config on random-order default data. Prints one table with the
median tokens/s of each (first two steps excluded) and the ratio.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "model"))


def torch_tokens_per_s(n_layer, vocab, T, B, steps, threads):
    import torch
    from gpt2_torch_ref import gpt2_loss, tensor_table
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    C = 64 * n_layer
    params = {}
    for name, shape in tensor_table(n_layer, C, vocab, T):
        t = torch.zeros(shape) if name.endswith("bias") else torch.randn(shape) * 0.02
        if "ln_" in name and name.endswith("weight"):
            t = torch.ones(shape)
        params[name] = t.requires_grad_()
    opt = torch.optim.AdamW(params.values(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    times = []
    for _ in range(steps + 2):
        x = torch.randint(0, vocab, (B, T))
        y = torch.randint(0, vocab, (B, T))
        t0 = time.perf_counter()
        loss, _ = gpt2_loss(params, n_layer, n_layer, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return B * T / statistics.median(times[2:])


def dsc_tokens_per_s(dsc, model, T, B, steps, threads):
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "ds.json")
        json.dump({"train_micro_batch_size_per_gpu": B, "steps_per_print": 1000,
                   "gradient_clipping": 1.0,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95],
                                                             "weight_decay": 0.01}}},
                  open(cfg, "w"))
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), DSC_DATA_HOME=os.path.join(d, "h"))
        subprocess.run([dsc, "train", "--config", cfg, "--model", model, "--seq-len", str(T),
                        "--max-steps", str(steps + 2), "--eval-every", "0", "--eval-batches", "1",
                        "--sample-tokens", "0", "--out", os.path.join(d, "run")],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        rows = [json.loads(l) for l in open(os.path.join(d, "run", "metrics.jsonl"))]
        return statistics.median(r["tokens_per_s"] for r in rows[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dsc")
    ap.add_argument("--model", default="d6")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    n_layer = int(a.model[1:])
    ours = dsc_tokens_per_s(a.dsc, a.model, a.seq_len, a.batch, a.steps, a.threads)
    theirs = torch_tokens_per_s(n_layer, 256, a.seq_len, a.batch, a.steps, a.threads)
    print(f"| model | T | B | threads | dsc tok/s | PyTorch tok/s | ratio |")
    print(f"|---|---|---|---|---|---|---|")
    print(f"| {a.model} | {a.seq_len} | {a.batch} | {a.threads} | {ours:.0f} | {theirs:.0f} | "
          f"{ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
