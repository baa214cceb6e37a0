#!/usr/bin/env python3
"""Monitoring overhead: the CPU reference run with every sink and observer on, against none.

Usage: bench_monitor.py DSC_BINARY [--model d4] [--seq-len 128] [--micro 8] [--steps 60]
                        [--rounds 4] [--threads 1]

One rank of `dsc train` on the built-in data. "on": `tensorboard`, `csv_monitor`, `prometheus`
(a free port), `wall_clock_breakdown`, `comms_logger` and one `monitor_actions` entry that never
fires; "off": none of them. Rounds alternate off/on so that drift of a shared machine hits both
alike. The step time of a row is tokens per step / tokens_per_s of metrics.jsonl, the first five
steps excluded; the table gives each round's median, the median over all rounds, and the
overhead of "on" (goal: < 1% of the step time).
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(path, a, on, out):
    cfg = {"train_batch_size": a.micro, "train_micro_batch_size_per_gpu": a.micro,
           "steps_per_print": 10, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    if on:
        cfg.update({
            "wall_clock_breakdown": True,
            "tensorboard": {"enabled": True, "output_path": out, "job_name": "tb"},
            "csv_monitor": {"enabled": True, "output_path": out, "job_name": "csv"},
            "prometheus": {"enabled": True, "port": free_port()},
            "comms_logger": {"enabled": True},
            "monitor_actions": [{"metric": "Memory/host_mem_fraction", "above": 0.999,
                                 "action": "log"}],
        })
    with open(path, "w") as f:
        json.dump(cfg, f)


def run(a, tmp, name, on):
    out = os.path.join(tmp, name)
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(tmp, name + ".json")
    config(cfg, a, on, out)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), DSC_DATA_HOME=os.path.join(tmp, "home"))
    with open(os.path.join(out, "log"), "w") as log:
        rc = subprocess.call(
            [a.dsc, "train", "--config", cfg, "--data", os.path.join(tmp, "data"), "--model",
             a.model, "--seq-len", str(a.seq_len), "--sample-tokens", "0", "--eval-every", "0",
             "--max-steps", str(a.steps), "--out", out], env=env, stdout=log,
            stderr=subprocess.STDOUT)
    if rc:
        sys.exit("run %s failed (exit %d); log in %s" % (name, rc, out))
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    tokens = a.micro * a.seq_len
    return [tokens / r["tokens_per_s"] for r in rows[5:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dsc")
    ap.add_argument("--model", default="d4")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    med = {False: [], True: []}
    every = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([a.dsc, "data", "default", "--out", os.path.join(tmp, "data")], check=True,
                       stdout=subprocess.DEVNULL,
                       env=dict(os.environ, DSC_DATA_HOME=os.path.join(tmp, "home")))
        for i in range(a.rounds):
            for on in (False, True):
                t = run(a, tmp, "%s%d" % ("on" if on else "off", i), on)
                med[on].append(statistics.median(t))
                every[on] += t
    print("monitoring overhead, %s, T=%d, micro batch %d, %d thread(s), %d steps x %d rounds"
          % (a.model, a.seq_len, a.micro, a.threads, a.steps, a.rounds))
    print("| | " + " | ".join("round %d" % (i + 1) for i in range(a.rounds)) + " | median |")
    print("|---|" + "---|" * (a.rounds + 1))
    for on in (False, True):
        print("| %s | " % ("on" if on else "off")
              + " | ".join("%.1f ms" % (x * 1e3) for x in med[on])
              + " | %.1f ms |" % (statistics.median(every[on]) * 1e3))
    ratio = statistics.median(every[True]) / statistics.median(every[False])
    paired = statistics.median(on / off for on, off in zip(med[True], med[False]))
    print("overhead: %+.2f%% (medians of all steps), %+.2f%% (median of the per-round ratios)"
          % (100 * (ratio - 1), 100 * (paired - 1)))


if __name__ == "__main__":
    main()
