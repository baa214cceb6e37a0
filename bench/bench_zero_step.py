#!/usr/bin/env python3
"""ZeRO step time: stages 1, 2 and 3 against stage 0 at the same world size.

Usage: bench_zero_step.py DSC_BINARY [--world 2] [--model d6] [--seq-len 128] [--micro 4]
                          [--gas 2] [--steps 20] [--rounds 3] [--stages 0,1,2,3]

WORLD ranks of `dsc train` on this machine (shm backend), fp32, AdamW, the same seed and global
batch for every stage (the stages are bitwise equal, tests/dist/test_zero.sh, so only the time
differs). Rounds are interleaved (0,1,2,3, 0,1,2,3, ...) so that drift of a shared machine hits
every stage alike. The step time of a row is tokens per step / tokens_per_s of metrics.jsonl,
the first three steps excluded; the table gives the median over all rounds and the ratio to
stage 0.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def config(path, a, stage):
    cfg = {
        "train_batch_size": a.world * a.micro * a.gas, "train_micro_batch_size_per_gpu": a.micro,
        "steps_per_print": 1000, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": stage, "overlap_comm": True},
    }
    with open(path, "w") as f:
        json.dump(cfg, f)


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(a, tmp, name, cfg):
    out = os.path.join(tmp, name)
    os.makedirs(out, exist_ok=True)
    port = free_port()
    procs = []
    for r in range(a.world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(a.world), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=str(a.threads), DSC_DATA_HOME=os.path.join(tmp, "home"))
        log = open(os.path.join(out, "log.%d" % r), "w")
        procs.append(subprocess.Popen(
            [a.dsc, "train", "--config", cfg, "--data", os.path.join(tmp, "data"), "--model",
             a.model, "--seq-len", str(a.seq_len), "--sample-tokens", "0", "--eval-every", "0",
             "--max-steps", str(a.steps), "--out", out],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    rc = [p.wait(timeout=900) for p in procs]
    if any(rc):
        sys.exit("run %s failed (exit codes %s); logs in %s" % (name, rc, out))
    return [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dsc")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--model", default="d6")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--gas", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="OpenMP threads per rank")
    ap.add_argument("--stages", default="0,1,2,3")
    a = ap.parse_args()
    stages = [int(s) for s in a.stages.split(",")]
    if 0 not in stages:
        sys.exit("--stages must include 0: it is the baseline")
    tokens = a.world * a.micro * a.gas * a.seq_len
    times = {s: [] for s in stages}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([a.dsc, "data", "default", "--out", os.path.join(tmp, "data")], check=True,
                       stdout=subprocess.DEVNULL,
                       env=dict(os.environ, DSC_DATA_HOME=os.path.join(tmp, "home")))
        for s in stages:
            config(os.path.join(tmp, "z%d.json" % s), a, s)
        for i in range(a.rounds):
            for s in stages:
                rows = run(a, tmp, "s%d_%d" % (s, i), os.path.join(tmp, "z%d.json" % s))
                times[s] += [tokens / r["tokens_per_s"] for r in rows[3:]]
    base = statistics.median(times[0])
    print("ZeRO step time, world %d, %s, T=%d, micro %d x accumulation %d (%d tokens per step), "
          "fp32 AdamW, %d steps x %d rounds, %d OpenMP thread(s) per rank"
          % (a.world, a.model, a.seq_len, a.micro, a.gas, tokens, a.steps, a.rounds, a.threads))
    print("| stage | median step | vs stage 0 |")
    print("|---|---|---|")
    for s in stages:
        m = statistics.median(times[s])
        print("| %d | %.1f ms | %.3fx |" % (s, m * 1e3, m / base))


if __name__ == "__main__":
    main()
