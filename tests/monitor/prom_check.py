#!/usr/bin/env python3
"""Parse two scrapes of dsc's Prometheus endpoint strictly (text exposition format 0.0.4).

Every family has one HELP line, one TYPE gauge line and one sample labelled with the rank; names
are valid Prometheus names; values parse as floats. The families a training run exports must be
there, and the second scrape (taken later) must show a later step.

usage: prom_check.py FIRST SECOND RANK
"""
import math
import re
import sys

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)\{rank="(\d+)"\} (\S+)$')
REQUIRED = ["dsc_step", "dsc_samples", "dsc_train_loss", "dsc_lr", "dsc_grad_norm",
            "dsc_tokens_per_second", "dsc_iteration_time_seconds", "dsc_memory_host_mem_fraction"]


def parse(path, rank):
    text = open(path).read()
    if not text.endswith("\n"):
        raise ValueError(f"{path}: the text must end with a newline")
    families, help_seen, type_seen = {}, set(), set()
    for n, line in enumerate(text.splitlines(), 1):
        where = f"{path}:{n}: {line!r}"
        if line.startswith("# HELP "):
            name = line.split(" ")[2]
            if not NAME.match(name) or name in help_seen:
                raise ValueError(f"{where}: bad or repeated HELP")
            help_seen.add(name)
        elif line.startswith("# TYPE "):
            parts = line.split(" ")
            if len(parts) != 4 or parts[3] != "gauge" or parts[2] in type_seen:
                raise ValueError(f"{where}: expected '# TYPE <name> gauge' once per family")
            type_seen.add(parts[2])
        else:
            m = SAMPLE.match(line)
            if not m:
                raise ValueError(f"{where}: not a sample line")
            name, r, value = m.groups()
            if name not in type_seen or name not in help_seen or name in families:
                raise ValueError(f"{where}: sample without HELP/TYPE first, or repeated")
            if int(r) != rank:
                raise ValueError(f"{where}: rank label {r}, expected {rank}")
            families[name] = float(value)  # accepts NaN, +Inf, -Inf as Prometheus spells them
    return families


def main():
    first, second, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        a, b = parse(first, rank), parse(second, rank)
    except ValueError as e:
        print("FAIL:", e)
        return 1
    missing = [f for f in REQUIRED if f not in b]
    if missing:
        print("FAIL: missing families", missing, "in", sorted(b))
        return 1
    bad = []
    if not b["dsc_step"] > a["dsc_step"] >= 1:
        bad.append(f"step did not advance between scrapes: {a['dsc_step']} -> {b['dsc_step']}")
    if not (math.isfinite(b["dsc_train_loss"]) and 0 < b["dsc_train_loss"] < 20):
        bad.append(f"implausible train loss {b['dsc_train_loss']}")
    if not 0 < b["dsc_memory_host_mem_fraction"] < 1:
        bad.append(f"host memory fraction {b['dsc_memory_host_mem_fraction']} outside (0, 1)")
    if not 0 < b["dsc_iteration_time_seconds"] < 60:
        bad.append(f"iteration time {b['dsc_iteration_time_seconds']} s is not in seconds")
    for msg in bad:
        print("FAIL:", msg)
    print(f"{len(b)} families parsed; step {a['dsc_step']:.0f} -> {b['dsc_step']:.0f}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
