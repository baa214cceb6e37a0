#!/usr/bin/env bash
# Continuing a DeepSpeed run: `dsc train --resume DS_DIR` of ZeRO-2 (bf16) and ZeRO-3 (fp16, a
# dynamic loss scaler that skipped one step) checkpoints of 2 ranks of a tiny GPT2LMHeadModel
# (tests/unit/torchfile/ds_gpt2_z*, laid out by make_ds_layout.py as DeepSpeed 0.18.4 saves
# them; DeepSpeed's engine does not run here, so no DeepSpeed losses are compared).
# - at 1 and 2 ranks, at the checkpoint's ZeRO stage and another, the state dsc saves right
#   after the resume holds the fixture's fp32 master weights, exp_avg and exp_avg_sq bit for bit
#   (SHA-256 of every tensor against the fixture's expect.txt);
# - steps continue from DeepSpeed's step with the learning rates its WarmupLR gives from its
#   lr_scheduler.last_batch_iteration, the loss scale carries over, and training goes on;
# - resuming DS_DIR equals resuming dsc's own checkpoint of the same state, step for step;
# - a model that does not match is refused naming the checkpoint and the parameter.
set -u
. "$(dirname "$0")/lib.sh"
SRC=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
F="$SRC/tests/unit/torchfile"
"$DSC" data prepare --input "$SRC/docs/checkpoint-format.md" "$SRC/docs/zero.md" \
  --tokenizer byte --out "$T/bytes" >/dev/null

# dsrun NAME WORLD CONFIG [flags...]: WORLD ranks of the tiny model on byte-level data.
dsrun() {
  local name=$1 world=$2 cfg=$3 r
  shift 3
  local port=$(free_port)
  PIDS=()
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port "$DSC" train --config "$cfg" --data "$T/bytes" \
      --model "hf:$F/tiny_gpt2" --init-weights none --seq-len 32 --sample-tokens 0 \
      --eval-every 0 --eval-batches 2 --out "$T/$name" "$@" > "$T/$name.$r.log" 2>&1 &
    PIDS+=($!)
  done
  finish_ranks "$name"
}

# Every tensor of a dsc checkpoint (master and moments) rebuilt from its shards with numpy, as
# "name kind sha16" (names as dsc has them: Hugging Face's, without the transformer. prefix).
digest() { $PY - "$1" <<'PYEOF' | sort
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
names = {"master": "master", "m": "exp_avg", "v": "exp_avg_sq", "exp_avg": "exp_avg",
         "exp_avg_sq": "exp_avg_sq"}
for p in m["params"]:
    numel = int(np.prod(p["shape"]))
    for k in kinds:
        x = flat[k][p["offset"]:p["offset"] + numel]
        print(p["name"], names.get(k, k), hashlib.sha256(x.tobytes()).hexdigest()[:16])
PYEOF
}
expected() { grep -v '^#' "$F/$1/expect.txt" | sed 's/^transformer\.//' | sort; }
same_state() { cmp -s <(digest "$1") <(expected "$2") && test "$(expected "$2" | wc -l)" -eq 84; }

# stage_config FIXTURE STAGE OUT: the fixture's ds_config.json at another ZeRO stage.
stage_config() {
  $PY -c 'import json, sys; c = json.load(open(sys.argv[1])); c["zero_optimization"]["stage"] = int(sys.argv[2]); json.dump(c, open(sys.argv[3], "w"))' \
    "$F/$1/ds_config.json" "$2" "$3"
}

# Steps 11.. continue DeepSpeed's: WarmupLR (linear, 20 steps to 1e-3) from its saved
# last_batch_iteration, finite losses, the fp16 loss scale carried over.
continues() { $PY - "$T/$1/metrics.jsonl" "$F/$2/expect.txt" "$3" <<'PYEOF'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
head = open(sys.argv[2]).readline().split()
last = int(head[head.index("last_batch_iteration") + 1])
assert [r["step"] for r in rows] == list(range(11, 11 + len(rows))) and len(rows) == 4, rows
for r in rows:
    it = last + r["step"] - 11          # the iteration DeepSpeed's step() left for this step
    want = 1e-3 * min(1.0, it / 20)
    assert abs(r["lr"] - want) <= 1e-12 * want, (r["step"], r["lr"], want)
    assert math.isfinite(r["loss"]) and r["loss"] < 6, r
if sys.argv[3] != "-":
    assert rows[0]["loss_scale"] == float(sys.argv[3]), rows[0]
print(f"  steps 11-14: lr {rows[0]['lr']:.3e} .. {rows[-1]['lr']:.3e}, loss {rows[0]['loss']:.4f} .. {rows[-1]['loss']:.4f}")
PYEOF
}

for fx in ds_gpt2_z2 ds_gpt2_z3; do
  own=${fx#ds_gpt2_z}
  other=$([ "$own" = 2 ] && echo 3 || echo 1)
  cfg="$F/$fx/ds_config.json"
  stage_config $fx $other "$T/$fx.other.json"
  scale=$([ "$own" = 3 ] && echo 2048 || echo -)
  for run in "1 $own $cfg" "2 $own $cfg" "2 $other $T/$fx.other.json"; do
    set -- $run
    n="$fx.w$1.z$2"
    check "$fx on $1 rank(s) at ZeRO-$2: resume and save at step 10" -- \
      dsrun "$n" $1 "$3" --max-steps 10 --resume "$F/$fx" --save-dir "$T/$n.ck" --save-at-end
    check "  ... master weights and Adam moments equal DeepSpeed's partitions, bit for bit" -- \
      same_state "$T/$n.ck" $fx
  done
  check "$fx on 2 ranks: train steps 11-14" -- dsrun "$fx.go" 2 "$cfg" --max-steps 14 \
    --resume "$F/$fx/global_step10"
  check "  ... step, learning rate and loss scale continue DeepSpeed's" -- continues "$fx.go" $fx $scale
  check "  ... the log says DeepSpeed keeps no data position" -- \
    grep -q "DeepSpeed saves no data position (global_samples 80)" "$T/$fx.go.0.log"
  check "$fx on 1 rank: steps 11-14 from DS_DIR" -- dsrun "$fx.a" 1 "$cfg" --max-steps 14 --resume "$F/$fx"
  check "$fx on 1 rank: steps 11-14 from dsc's checkpoint of the resumed state" -- \
    dsrun "$fx.b" 1 "$cfg" --max-steps 14 --resume "$T/$fx.w1.z$own.ck"
  check "  ... the same steps, bit for bit" -- cmp -s <(cols "$T/$fx.a/metrics.jsonl") <(cols "$T/$fx.b/metrics.jsonl")
done

# A model that does not match: refused, naming the checkpoint and the parameter.
expect 1 "ds_gpt2_z2/global_step10: parameter transformer.wte.weight has shape [256, 16, ...] there and [256, 128, ...]" -- "$DSC" train --config "$F/ds_gpt2_z2/ds_config.json" \
  --data "$T/bytes" --model d2 --seq-len 32 --max-steps 12 --out "$T/wrong" --resume "$F/ds_gpt2_z2/" \
  --init-weights none
expect 1 "parameter wte.weight has shape [5, 3, ...] there" -- "$DSC" train --config \
  "$F/ds_gpt2_z2/ds_config.json" --data "$T/bytes" --model "hf:$F/tiny_gpt2" --init-weights none \
  --seq-len 32 --max-steps 12 --out "$T/wrong2" --resume "$F/ds_z2"
finish
