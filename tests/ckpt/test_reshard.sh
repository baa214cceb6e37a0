#!/usr/bin/env bash
# Resharding: a checkpoint written by N ranks at one ZeRO stage loads on M ranks at another.
# Loading and saving again is exact (weights and optimizer moments, bit for bit); training on
# after 4 -> 2 and 2 -> 3 ranks gives the losses of runs that used the new world size throughout
# (relative 1e-5: different world sizes add in a different order).
set -u
. "$(dirname "$0")/lib.sh"
K=8 M=16
for st in 0 1 2 3; do config "$T/z$st.json" $st ""; done

# Every parameter's master weights and moments, rebuilt from a checkpoint's shards with numpy
# from the manifest alone (an independent reading of the format), printed as one digest per
# tensor and kind.
digest() { $PY - "$1" <<'PYEOF'
import hashlib, json, struct, sys
import numpy as np
d = sys.argv[1]
tag = open(d + "/latest").read().strip()
m = json.load(open(f"{d}/{tag}/manifest.json"))
kinds = ["master"] + m["moments"]
flat = {k: np.zeros(m["flat_size"], np.float32) for k in kinds}
for f in m["files"]:
    raw = open(f"{d}/{tag}/{f['name']}", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    for g, grp in enumerate(m["groups"]):
        for k in kinds:
            a, b = h[f"{k}.g{g}"]["data_offsets"]
            lo = grp["off"] + f["rank"] * grp["slice"]
            flat[k][lo:lo + grp["slice"]] = np.frombuffer(raw[8 + n + a:8 + n + b], np.float32)
for p in m["params"]:
    numel = int(np.prod(p["shape"]))
    for k in kinds:
        x = flat[k][p["offset"]:p["offset"] + numel]
        print(p["name"], k, hashlib.sha256(x.tobytes()).hexdigest()[:16])
PYEOF
}

# rel1e5 A B STEP: losses of run A after STEP agree with run B's to 1e-5 relative
rel1e5() { $PY - "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" "$3" <<'PYEOF'
import json, sys
a = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2]))}
K = int(sys.argv[3])
steps = [s for s in a if s > K]
assert steps, "no steps after K"
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
print(f"  {len(steps)} steps, worst relative difference {worst:.2e}")
assert worst <= 1e-5, worst
PYEOF
}

check "4 ranks, stage 3, to step $K" -- run n4 4 "$T/z3.json" --max-steps $K --save-dir "$T/n4.ck" --save-at-end
for to in "2 1" "1 0" "3 2"; do
  set -- $to
  check "4 -> $1 ranks (stage $2): load and save again" -- run "re$1" $1 "$T/z$2.json" --max-steps $K --save-dir "$T/re$1.ck" --resume "$T/n4.ck" --save-at-end
  check "  ... weights and moments bit for bit" -- cmp -s <(digest "$T/n4.ck") <(digest "$T/re$1.ck")
done
check "  ... and the digests are not empty" -- test "$(digest "$T/n4.ck" | wc -l)" -eq 84

# 4 -> 2: resume on 2 ranks at stage 1, against 2 ranks (and 4 ranks) throughout.
check "4 -> 2: resume to $M" -- run r42 2 "$T/z1.json" --max-steps $M --save-dir "$T/r42.ck" --resume "$T/n4.ck"
check "2 ranks throughout" -- run ref2 2 "$T/z1.json" --max-steps $M
check "4 ranks throughout" -- run ref4 4 "$T/z3.json" --max-steps $M
check "4 -> 2: losses match 2 ranks throughout (1e-5)" -- rel1e5 r42 ref2 $K
check "4 -> 2: losses match 4 ranks throughout (1e-5)" -- rel1e5 r42 ref4 $K

# 2 -> 3: saved by 2 ranks at stage 2, resumed on 3 ranks at stage 0.
check "2 ranks, stage 2, to step $K" -- run n2 2 "$T/z2.json" --max-steps $K --save-dir "$T/n2.ck" --save-at-end
check "2 -> 3: resume to $M" -- run r23 3 "$T/z0.json" --max-steps $M --save-dir "$T/r23.ck" --resume "$T/n2.ck"
check "3 ranks throughout" -- run ref3 3 "$T/z0.json" --max-steps $M
check "2 -> 3: losses match 3 ranks throughout (1e-5)" -- rel1e5 r23 ref3 $K

# A model that does not match the checkpoint: a clear error naming the tensor.
expect 1 "parameter tensors, this model" -- "$DSC" train --config "$T/z0.json" --data "$T/data" \
  --model d3 --seq-len 32 --max-steps $M --out "$T/wrong" --resume "$T/n4.ck"
finish
