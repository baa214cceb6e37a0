#!/usr/bin/env python3
"""Write two metrics.jsonl runs as `dsc train` writes them, plus memory and comm fields, a
non-finite loss written as nan, and skipped steps: the input of the `dsc plot` tests.

usage: make_runs.py DIR   (creates DIR/run-a and DIR/run-b)
"""
import json
import math
import os
import random
import sys

random.seed(7)
for name, lr, steps in (("run-a", 6e-4, 600), ("run-b", 1.2e-3, 450)):
    os.makedirs(os.path.join(sys.argv[1], name), exist_ok=True)
    with open(os.path.join(sys.argv[1], name, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            loss = 3 + 4 * math.exp(-s * lr * 8) + random.gauss(0, 0.08)
            rec = {"step": s, "loss": loss, "lr": lr * min(1, s / 50), "grad_norm": 1 + random.random(),
                   "loss_scale": 2.0 ** (16 - s // 200), "skipped": s % 200 == 0, "tokens": s * 4096,
                   "tokens_per_s": 150000 + random.gauss(0, 4000), "elapsed_s": s * 0.03,
                   "gpu_allocated_bytes": 3.1e9 + 5e7 * math.sin(s / 40), "comm_time_ms": 12 + random.random()}
            if s % 50 == 0:
                rec["val_loss"] = loss + 0.1
            line = json.dumps(rec)
            if s == 300:  # the trainer prints a non-finite loss as nan
                line = line.replace('"loss": ' + json.dumps(loss), '"loss": nan')
            f.write(line + "\n")
