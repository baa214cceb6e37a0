"""Compare two fp32 safetensors files (e.g. --dump-weights) tensor by tensor.

    st_diff.py A B [--rel-max T] [--abs-max T] [--abs-min T] [--same-steps]

Prints the largest absolute difference and the largest difference relative to B's largest value
of its tensor; exits 1 naming the bound that fails: the tensor names differ, the relative or
absolute difference is above its maximum, the absolute one is not above --abs-min (the files
must differ), or (--same-steps) the metadata's global_steps differ.
"""
import argparse
import array
import json
import struct
import sys


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a = array.array("f")
        a.frombytes(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        out[k] = a
    return out, header.get("__metadata__", {})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rel-max", type=float)
    p.add_argument("--abs-max", type=float)
    p.add_argument("--abs-min", type=float)
    p.add_argument("--same-steps", action="store_true")
    o = p.parse_args()
    (a, ma), (b, mb) = load(o.a), load(o.b)
    if a.keys() != b.keys():
        sys.exit("different tensors: %s" % sorted(set(a) ^ set(b))[:8])
    if o.same_steps and ("global_steps" not in ma or "global_steps" not in mb):
        sys.exit("no global_steps in the files' metadata")
    if o.same_steps and ma["global_steps"] != mb["global_steps"]:
        sys.exit("different steps: %s vs %s" % (ma.get("global_steps"), mb.get("global_steps")))
    worst_abs = worst_rel = 0.0
    for k in a:
        d = max(abs(x - y) for x, y in zip(a[k], b[k]))
        worst_abs = max(worst_abs, d)
        worst_rel = max(worst_rel, d / max(max(abs(y) for y in b[k]), 1e-30))
    print("  largest difference %.3g (%.3g of its tensor's largest value)" % (worst_abs, worst_rel))
    if o.rel_max is not None and worst_rel > o.rel_max:
        sys.exit("weights differ: max relative difference %.3g > %g" % (worst_rel, o.rel_max))
    if o.abs_max is not None and worst_abs > o.abs_max:
        sys.exit("weights differ: max difference %.3g > %g" % (worst_abs, o.abs_max))
    if o.abs_min is not None and not worst_abs > o.abs_min:
        sys.exit("weights do not differ: max difference %.3g <= %g" % (worst_abs, o.abs_min))


main()
