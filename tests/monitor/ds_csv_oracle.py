#!/usr/bin/env python3
"""DeepSpeed's own csv_monitor as the oracle of dsc's CSV files.

Reads the CSV files dsc wrote in DSC_DIR, replays the same (tag, value, samples) events through
DeepSpeed's csvMonitor.write_events into a fresh directory, and compares the two directories byte
for byte: file names, header rows, number text and line ends.

usage: ds_csv_oracle.py DSC_DIR WORK_DIR      (run with the DeepSpeed venv's python)
"""
import os
import sys
import types

# DeepSpeed's logger writes to stdout; keep it for our report only.
REPORT = sys.stdout
sys.stdout = sys.stderr

import deepspeed.comm as ds_comm  # noqa: E402
from deepspeed.monitor.csv_monitor import csvMonitor  # noqa: E402

ds_comm.get_rank = lambda group=None: 0
import deepspeed.monitor.csv_monitor as csv_mod  # noqa: E402

csv_mod.dist.get_rank = lambda group=None: 0

# The tags dsc logs (include/dsc/monitor.h); a file name maps back to one of them.
TAGS = [
    "Train/Samples/train_loss", "Train/Samples/eval_loss", "Train/Samples/lr",
    "Train/Samples/loss_scale", "Train/Samples/elapsed_time_ms_forward",
    "Train/Samples/elapsed_time_ms_backward", "Train/Samples/elapsed_time_ms_backward_inner",
    "Train/Samples/elapsed_time_ms_backward_allreduce", "Train/Samples/elapsed_time_ms_step",
    "Train/Samples/grad_norm", "Train/Samples/tokens_per_s", "Train/Samples/mfu",
    "Train/Samples/iteration_time_ms", "Memory/gpu_mem_fraction", "Memory/gpu_allocated_bytes",
    "Memory/gpu_reserved_bytes", "Memory/gpu_fragmentation", "Memory/host_mem_fraction",
    "Memory/host_rss_bytes", "Comm/bytes", "Comm/time_ms", "Checkpoint/save_s",
    "Checkpoint/load_s", "Fault/events",
]
BY_FILE = {t.replace("/", "_").replace(" ", "_") + ".csv": t for t in TAGS}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    dsc_dir, work = sys.argv[1], sys.argv[2]
    events = []
    for name in sorted(os.listdir(dsc_dir)):
        tag = BY_FILE.get(name)
        if tag is None:
            print(f"FAIL: {name}: not the file of any tag dsc logs", file=REPORT)
            return 1
        with open(os.path.join(dsc_dir, name), newline="") as f:
            rows = f.read().split("\r\n")[1:-1]  # header, rows, "" after the last CRLF
        events += [(tag, float(r.split(",")[1]), int(r.split(",")[0])) for r in rows]
    cfg = types.SimpleNamespace(enabled=True, output_path=work, job_name="oracle")
    mon = csvMonitor(cfg)
    mon.write_events(events)
    ds_dir = os.path.join(work, "oracle")
    ours, theirs = sorted(os.listdir(dsc_dir)), sorted(os.listdir(ds_dir))
    bad = 0
    if ours != theirs:
        print(f"FAIL: file names differ:\n  dsc:       {ours}\n  DeepSpeed: {theirs}", file=REPORT)
        bad += 1
    for name in set(ours) & set(theirs):
        a = open(os.path.join(dsc_dir, name), "rb").read()
        b = open(os.path.join(ds_dir, name), "rb").read()
        if a != b:
            print(f"FAIL: {name} differs:\n  dsc:       {a[:120]!r}\n  DeepSpeed: {b[:120]!r}",
                  file=REPORT)
            bad += 1
    print(f"{len(ours)} CSV files, {len(events)} rows compared with DeepSpeed's csvMonitor",
          file=REPORT)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
