#!/usr/bin/env python3
"""Compare DeepSpeed's verdicts and resolved values (ds_oracle.py output) with `dsc config check`.

usage: compare_configs.py DSC ORACLE_JSONL EXPECTED_DIFFERENCES

For each (file, world size) the oracle judged, runs `DSC config check FILE --world-size N --json`
and compares:
  - the verdict (DeepSpeed ok/error vs dsc exit 0/1), and
  - when both accept, every value DeepSpeed resolved that dsc also prints.
A verdict that differs must be listed in EXPECTED_DIFFERENCES (file name, kind, text):
  stricter  DeepSpeed accepts, dsc rejects at check time; dsc's error must contain the text
  warn      DeepSpeed rejects (an unknown key in a section, or an incomplete section of a feature
            dsc does not have); dsc accepts and its warnings must contain the text
Listed differences that no longer occur are reported too, so that the list stays true.
Exit status 0 when everything agrees or differs only as listed.
"""
import collections
import json
import math
import os
import subprocess
import sys

# Keys whose spelling differs by case only: dsc lower-cases optimizer names (DeepSpeed keeps
# torch.optim spellings such as "SGD"); DeepSpeed upper-cases tag_validation.
ANY_CASE = {"optimizer.type", "checkpoint.tag_validation"}


def load_expected(path):
    expected = {}
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, kind, text = line.split(None, 2)
        assert kind in ("stricter", "warn"), f"{path}: unknown kind {kind!r}"
        expected[name] = (kind, text)
    return expected


def leaves(d, prefix=""):
    for k, v in d.items():
        path = prefix + k
        if isinstance(v, dict):
            yield from leaves(v, path + ".")
        else:
            yield path, v


def lookup(d, path):
    for part in path.split("."):
        if not isinstance(d, dict) or part not in d:
            return KeyError
        d = d[part]
    return d


def same(path, ds, dsc):
    if isinstance(dsc, bool) and isinstance(ds, int) and not isinstance(ds, bool):
        return bool(ds) == dsc  # DeepSpeed keeps an integer given for a flag and uses its truth
    if isinstance(ds, bool) or isinstance(dsc, bool):
        return type(ds) is type(dsc) and ds == dsc
    if isinstance(ds, (int, float)) and isinstance(dsc, (int, float)):
        return ds == dsc or math.isclose(ds, dsc, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(ds, str) and isinstance(dsc, str):
        return ds.lower() == dsc.lower() if path in ANY_CASE else ds == dsc
    if isinstance(ds, list) and isinstance(dsc, list):
        return len(ds) == len(dsc) and all(same(path, a, b) for a, b in zip(ds, dsc))
    return False


def run_dsc(dsc, path, world):
    p = subprocess.run([dsc, "config", "check", path, "--world-size", str(world), "--json"],
                       capture_output=True, text=True, errors="replace")
    return p.returncode, p.stdout, p.stderr


def main():
    dsc, oracle_path, expected_path = sys.argv[1:4]
    expected = load_expected(expected_path)
    used = set()
    counts = collections.Counter()
    not_in_dsc = set()
    failures = []
    files = set()
    for line in open(oracle_path, encoding="utf-8"):
        o = json.loads(line)
        path, world, name = o["file"], o["world_size"], os.path.basename(o["file"])
        files.add(path)
        rc, out, err = run_dsc(dsc, path, world)
        where = f"{name} (world size {world})"
        if rc not in (0, 1):
            failures.append(f"{where}: dsc exited {rc}: {err.strip()[:300]}")
            continue
        ds_ok, dsc_ok = o["verdict"] == "ok", rc == 0
        if ds_ok != dsc_ok:
            kind, text = expected.get(name, (None, None))
            want = "stricter" if ds_ok else "warn"
            if kind == want and text in err:
                used.add(name)
                counts["documented difference"] += 1
                continue
            ds_says = "accepts" if ds_ok else "rejects: " + o.get("message", "")
            failures.append(f"{where}: DeepSpeed {ds_says}\n    dsc "
                            f"{'accepts' if dsc_ok else 'rejects'}: {err.strip()[:400]}")
            continue
        if not ds_ok:
            counts["both reject"] += 1
            continue
        mine = json.loads(out)
        bad = []
        for key, ds_value in leaves(o["config"]):
            v = lookup(mine, key)
            if v is KeyError:
                not_in_dsc.add(key)
            elif not same(key, ds_value, v):
                bad.append(f"{key}: DeepSpeed {ds_value!r}, dsc {v!r}")
        if bad:
            failures.append(f"{where}: values differ\n    " + "\n    ".join(bad))
        else:
            counts["both accept, same values"] += 1
    stale = sorted(set(expected) - used)
    for name in stale:
        failures.append(f"{name}: listed in {os.path.basename(expected_path)} but no such "
                        "difference occurred; remove the line")
    for f in failures:
        print("MISMATCH " + f)
    total = sum(counts.values()) + len(failures) - len(stale)
    print(f"configs: {len(files)} files, {total} (file, world size) checks")
    for k, v in sorted(counts.items()):
        print(f"  {k}: {v}")
    print(f"  mismatches: {len(failures)}")
    if not_in_dsc:
        print("DeepSpeed values dsc does not print (not compared): " + ", ".join(sorted(not_in_dsc)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
