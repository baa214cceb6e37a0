#!/usr/bin/env python3
"""Fault tolerance: the per-step cost of replication, and the time from a fault to training again.

Usage: bench_ft.py DSC_BINARY [--model d6] [--seq-len 64] [--micro 2] [--gas 3] [--steps 16]
                   [--rounds 3]

Four ranks of `dsc train` on this machine (shm backend), ZeRO stage 2, fp32, AdamW.
- Replication: runs with fault_tolerance.replicate on and off, interleaved (--rounds each); the
  median step time of each (first three steps excluded), and the engine's own account of the time
  its caller spends per step on the snapshot copy and on waiting for the buddy exchange
  (DSC_LOG=info).
- Kill: rank 2 SIGKILLs itself with a reduce-scatter in flight (DSC_FT_INJECT); the time from the
  kill to the survivors' "resumed" line, and the wall time the step around the fault took beyond
  a normal step (detection + agreement + rebuild + the redone part).
- Hang: rank 2 SIGSTOPs itself; the same times with comm_timeout_s = 2 (the deadline dominates).
Prints one table.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile

WORLD = 4


def config(path, a, replicate, comm_timeout=30.0):
    cfg = {
        "train_batch_size": WORLD * a.micro * a.gas, "train_micro_batch_size_per_gpu": a.micro,
        "steps_per_print": 1000, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 2},
        "fault_tolerance": {"replicate": replicate, "comm_timeout_s": comm_timeout,
                            "step_timeout_s": 2 * comm_timeout + 30},
    }
    with open(path, "w") as f:
        json.dump(cfg, f)


def run(a, tmp, name, cfg, env_extra=None):
    out = os.path.join(tmp, name)
    os.makedirs(out, exist_ok=True)
    port = 20000 + (os.getpid() * 7 + len(name) * 131 + hash(name)) % 20000
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", DSC_LOG="info", DSC_LOG_SUBSYS="ft",
                   DSC_DATA_HOME=os.path.join(tmp, "home"), **(env_extra or {}))
        log = open(os.path.join(out, "log.%d" % r), "w")
        procs.append(subprocess.Popen(
            [a.dsc, "train", "--config", cfg, "--data", os.path.join(tmp, "data"), "--model", a.model,
             "--seq-len", str(a.seq_len), "--sample-tokens", "0", "--eval-every", "0",
             "--eval-batches", "1", "--max-steps", str(a.steps), "--out", out],
            env=env, stdout=log, stderr=subprocess.STDOUT))
    for p in procs:
        try:
            p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
    for p in procs:  # a stopped rank outlives the others: end it
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            os.kill(p.pid, signal.SIGCONT)
            p.wait()
    logs = "".join(open(os.path.join(out, "log.%d" % r)).read() for r in range(WORLD))
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return rows, logs


def step_times(rows, tokens):
    return [tokens / r["tokens_per_s"] for r in rows[3:]]


def replication_ms(logs):
    """Median over ranks of the caller's time per step: total, snapshot copy, exchange wait."""
    rows = re.findall(r"commits of [0-9.]+ MiB, ([0-9.]+) ms per step \(copy ([0-9.]+) ms, "
                      r"waiting for the exchange ([0-9.]+) ms[;)]", logs)
    mib = re.findall(r"commits of ([0-9.]+) MiB", logs)
    med = [statistics.median(float(r[k]) for r in rows) if rows else float("nan") for k in range(3)]
    return med, (mib[0] if mib else "?")


def fault_times(rows, logs, median_step):
    t_fault = float(re.search(r"fault injection: .* unix time ([0-9.]+)", logs).group(1))
    t_res = min(float(x) for x in re.findall(r"resumed at step .* unix time ([0-9.]+)", logs))
    # wall time of the step that contained the fault, beyond a normal step: the gap between the
    # elapsed times of the last line before the fault and the first line after the recovery
    resumed = int(re.search(r"resumed at step (\d+)", logs).group(1))
    el = {}
    for r in rows:
        el.setdefault(r["step"], []).append(r["elapsed_s"])
    gap = el[resumed][-1] - el[resumed - 1][0] if resumed - 1 in el else float("nan")
    return t_res - t_fault, gap - median_step


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dsc")
    ap.add_argument("--model", default="d6")
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--gas", type=int, default=3)  # 4 x 2 x 3 = 24 splits over 3 ranks
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tokens = WORLD * a.micro * a.gas * a.seq_len
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([a.dsc, "data", "default", "--out", os.path.join(tmp, "data")], check=True,
                       stdout=subprocess.DEVNULL, env=dict(os.environ, DSC_DATA_HOME=os.path.join(tmp, "home")))
        on, off = os.path.join(tmp, "on.json"), os.path.join(tmp, "off.json")
        config(on, a, True)
        config(off, a, False)
        t_on, t_off, rep, copy, wait = [], [], [], [], []
        for i in range(a.rounds):
            rows, _ = run(a, tmp, "off%d" % i, off)
            t_off += step_times(rows, tokens)
            rows, logs = run(a, tmp, "on%d" % i, on)
            t_on += step_times(rows, tokens)
            (ms, c, w), mib = replication_ms(logs)
            rep.append(ms)
            copy.append(c)
            wait.append(w)
        m_on, m_off, m_rep = statistics.median(t_on), statistics.median(t_off), statistics.median(rep)
        m_copy, m_wait = statistics.median(copy), statistics.median(wait)
        kill_step = min(6, a.steps - 1)
        rows, logs = run(a, tmp, "kill", on, {"DSC_FT_INJECT": "2:%d:reduce" % kill_step})
        k_resume, k_lost = fault_times(rows, logs, m_on)
        hang = os.path.join(tmp, "hang.json")
        config(hang, a, True, comm_timeout=2.0)
        rows, logs = run(a, tmp, "hang", hang, {"DSC_FT_INJECT": "2:%d:reduce:stop" % kill_step})
        h_resume, h_lost = fault_times(rows, logs, m_on)
    print("fault tolerance, %s, T=%d, micro %d x accumulation %d x %d ranks (%d tokens per rank "
          "per step), ZeRO 2, fp32, %d steps x %d rounds" % (a.model, a.seq_len, a.micro, a.gas,
                                                           WORLD, tokens // WORLD, a.steps, a.rounds))
    print("| measure | value |")
    print("|---|---|")
    print("| median step, replicate off | %.1f ms |" % (m_off * 1e3))
    print("| median step, replicate on | %.1f ms (%+.1f%%) |" % (m_on * 1e3, 100 * (m_on / m_off - 1)))
    print("| replication on the caller's thread (snapshot copy + exchange wait, %s MiB per rank) "
          "| %.1f ms per step = %.1f%% of the step (copy %.1f ms, wait %.1f ms) |"
          % (mib, m_rep, 100 * m_rep / 1e3 / m_off, m_copy, m_wait))
    print("| SIGKILL -> survivors resumed (3 ranks) | %.0f ms |" % (k_resume * 1e3))
    print("| SIGKILL: step time lost (detect + regroup + rebuild + redo) | %.0f ms |" % (k_lost * 1e3))
    print("| SIGSTOP -> survivors resumed, comm_timeout_s 2 | %.0f ms |" % (h_resume * 1e3))
    print("| SIGSTOP: step time lost | %.0f ms |" % (h_lost * 1e3))


if __name__ == "__main__":
    sys.exit(main())
