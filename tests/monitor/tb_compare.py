#!/usr/bin/env python3
"""Check dsc's TensorBoard events and CSV files against the run's metrics.jsonl.

The event files are read with TensorBoard's own reader (EventAccumulator): every scalar the
trainer logs must be there with the same steps (samples seen = step * train_batch_size, as
DeepSpeed indexes them) and the same values (TensorBoard keeps float32). The CSV files are read
as DeepSpeed's csv_monitor lays them out: <tag with '/' as '_'>.csv, header "step,<last part of
the tag>", rows "samples,value", CRLF line ends.

usage: tb_compare.py METRICS_JSONL TB_DIR CSV_DIR TRAIN_BATCH_SIZE
Prints one line per problem and exits 1 when there is any; exit 0 otherwise.
"""
import json
import math
import os
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# metrics.jsonl key -> (tag, relative tolerance of the jsonl text: %.9g, %.17g or %.6g)
FIELDS = {
    "loss": ("Train/Samples/train_loss", 1e-8),
    "val_loss": ("Train/Samples/eval_loss", 1e-8),
    "lr": ("Train/Samples/lr", 1e-15),
    "grad_norm": ("Train/Samples/grad_norm", 1e-8),
    "tokens_per_s": ("Train/Samples/tokens_per_s", 1e-5),
    "loss_scale": ("Train/Samples/loss_scale", 1e-15),
}
OPTIONAL = {"loss_scale"}  # logged with fp16 only, as DeepSpeed does

problems = []


def problem(msg):
    problems.append(msg)
    print("FAIL:", msg)


def close(a, b, rel):
    return abs(a - b) <= rel * max(abs(a), abs(b)) + 1e-30


def expected_series(lines, batch):
    """tag -> list of (samples, value) the trainer should have logged."""
    out = {}
    for rec in lines:
        x = rec["step"] * batch
        for key, (tag, _) in FIELDS.items():
            v = rec.get(key)
            if v is None or (key == "grad_norm" and v < 0):  # -1: not finite, not logged
                continue
            out.setdefault(tag, []).append((x, float(v)))
    return out


def check_tensorboard(tb_dir, want):
    files = [f for f in os.listdir(tb_dir) if f.startswith("events.out.tfevents.")]
    if len(files) != 1:
        problem(f"{tb_dir}: expected one event file, found {files}")
        return
    acc = EventAccumulator(tb_dir, size_guidance={"scalars": 0})
    acc.Reload()
    if acc.file_version != 2.0:
        problem(f"file_version {acc.file_version!r}, expected 2 (brain.Event:2)")
    tags = set(acc.Tags()["scalars"])
    for tag, series in want.items():
        key = next(k for k, (t, _) in FIELDS.items() if t == tag)
        if tag not in tags:
            if key not in OPTIONAL:
                problem(f"TensorBoard lacks tag {tag}; has {sorted(tags)}")
            continue
        events = acc.Scalars(tag)
        steps = [e.step for e in events]
        if steps != [x for x, _ in series]:
            problem(f"{tag}: steps {steps} != {[x for x, _ in series]}")
            continue
        for e, (x, v) in zip(events, series):
            # TensorBoard stores float32; the jsonl text is rounded: allow both roundings
            want32 = float(np.float32(v))
            if not close(e.value, want32, 2.5e-7 + FIELDS[key][1]):
                problem(f"{tag} at step {x}: TensorBoard {e.value!r}, metrics.jsonl {v!r}")
            if e.wall_time < 1.6e9:
                problem(f"{tag} at step {x}: wall_time {e.wall_time} is not a Unix time")
    print(f"tensorboard: {len(tags)} tags, {sum(len(acc.Scalars(t)) for t in tags)} scalars read")


def check_csv(csv_dir, want):
    for tag, series in want.items():
        key = next(k for k, (t, _) in FIELDS.items() if t == tag)
        path = os.path.join(csv_dir, tag.replace("/", "_").replace(" ", "_") + ".csv")
        if not os.path.exists(path):
            if key not in OPTIONAL:
                problem(f"missing CSV file {path}")
            continue
        raw = open(path, "rb").read()
        rows = raw.split(b"\r\n")
        if rows[-1] != b"" or any(b"\n" in r for r in rows):
            problem(f"{path}: rows must end in CRLF (Python's csv module)")
            continue
        rows = [r.decode() for r in rows[:-1]]
        if rows[0] != "step," + tag.split("/")[-1]:
            problem(f"{path}: header {rows[0]!r}")
        got = [(int(r.split(",")[0]), float(r.split(",")[1])) for r in rows[1:]]
        if [x for x, _ in got] != [x for x, _ in series]:
            problem(f"{path}: steps {[x for x, _ in got]} != {[x for x, _ in series]}")
            continue
        for (x, g), (_, v) in zip(got, series):
            if not close(g, v, FIELDS[key][1]):
                problem(f"{path} at step {x}: CSV {g!r}, metrics.jsonl {v!r}")
            text = [r for r in rows[1:] if r.startswith(f"{x},")][0].split(",")[1]
            if text != repr(g):  # DeepSpeed writes Python's repr of the float
                problem(f"{path}: value text {text!r} is not Python's repr {repr(g)!r}")
    print(f"csv: {len(os.listdir(csv_dir))} files checked in {csv_dir}")


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    jsonl, tb_dir, csv_dir, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    lines = [json.loads(l) for l in open(jsonl) if l.strip()]
    if not lines:
        problem(f"{jsonl} is empty")
    want = expected_series(lines, batch)
    if not any(math.isfinite(v) for _, v in want.get("Train/Samples/eval_loss", [])):
        problem("the run has no validation loss: use --eval-every so eval_loss is checked")
    check_tensorboard(tb_dir, want)
    check_csv(csv_dir, want)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
