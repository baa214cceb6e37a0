#!/usr/bin/env bash
# Activation checkpointing (DeepSpeed's activation_checkpointing section): each transformer layer
# is recomputed in the backward from its saved input. The gradients (--dump-grads) and the weights
# after several steps (--dump-weights) equal a run without it bit for bit, for GPT-2, Llama and
# Qwen3 shapes, at ZeRO 0 and 3 on 1 and 2 ranks; the memory plan counts the smaller activations.
set -u
. "$(dirname "$0")/../cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=/usr/bin/python3
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1
"$DSC" data default --out "$T/data" >/dev/null

# run NAME WORLD CONFIG MODEL [extra flags...]: WORLD ranks by hand (torch-style variables).
run() {
  local name=$1 world=$2 cfg=$3 model=$4
  shift 4
  local port pids=() r rc=0
  port=$(free_port)
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port timeout 300 "$DSC" train --config "$cfg" --data "$T/data" \
      --model "$model" --seq-len 32 --sample-tokens 0 --eval-every 0 --out "$T/$name" \
      --device cpu "$@" > "$T/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ $rc -eq 0 ] || { echo "run $name failed:"; tail -n 5 "$T/$name".*.log; }
  return $rc
}

config() { # config FILE STAGE [extra json]
  cat > "$1" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1000,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.01}},
 "gradient_clipping": 1.0, "zero_optimization": {"stage": $2} ${3:-}}
JSON
}

# same A B: two safetensors files hold the same tensors bit for bit (names, shapes, bytes).
same() {
  $PY - "$1" "$2" <<'PYEOF'
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
bad = [k for k in a if k not in b or a[k] != b[k]] + [k for k in b if k not in a]
if bad or not a:
    print("differ:", bad[:5], "tensors:", len(a)); sys.exit(1)
PYEOF
}

ac=', "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false}'
for model in d2 llama-d2 qwen3-d2; do
  for stage in 0 3; do
    for world in 1 2; do
      [ $stage -eq 3 ] && [ $world -eq 1 ] && continue
      config "$T/c$stage.json" $stage
      config "$T/a$stage.json" $stage "$ac"
      n="$model.z$stage.w$world"
      run "$n.base" $world "$T/c$stage.json" $model --max-steps 3 \
        --dump-grads "$T/$n.base.g.st" --dump-weights "$T/$n.base.w.st" || { failed=$((failed+1)); continue; }
      run "$n.ac" $world "$T/a$stage.json" $model --max-steps 3 \
        --dump-grads "$T/$n.ac.g.st" --dump-weights "$T/$n.ac.w.st" || { failed=$((failed+1)); continue; }
      check "$n: gradients bitwise equal with recompute" -- same "$T/$n.base.g.st" "$T/$n.ac.g.st"
      check "$n: weights after 3 steps bitwise equal" -- same "$T/$n.base.w.st" "$T/$n.ac.w.st"
    done
  done
done
check "the run says it recomputes" -- grep -q "activation checkpointing" "$T/d2.z0.w1.ac.0.log"

# The memory plan counts one layer's activations instead of all of them.
config "$T/c.json" 0
config "$T/a.json" 0 "$ac"
act() { "$DSC" config check "$1" --model llama-d8 --vocab-size 256 --seq-len 256 --json |
  $PY -c 'import json,sys; p = json.load(sys.stdin)["memory_plan"]; print(p["host"]["activations"])'; }
full=$(act "$T/c.json") less=$(act "$T/a.json")
echo "llama-d8, T 256, micro-batch 2: host activations $full bytes, with recompute $less"
check "the plan counts fewer activations with recompute ($less < $full / 2)" -- \
  test "$less" -lt $((full / 2))
# On a GPU the device passes recompute too (the plan, computed here without a GPU, says so).
dact() { "$DSC" config check "$1" --model "$2" --vocab-size 256 --seq-len 256 --device cuda --json |
  $PY -c 'import json,sys; print(json.load(sys.stdin)["memory_plan"]["device"]["activations"])'; }
full=$(dact "$T/c.json" llama-d8) less=$(dact "$T/a.json" llama-d8)
echo "llama-d8 on a GPU: device activations $full bytes, with recompute $less"
check "the GPU plan of llama-d8 counts fewer activations ($less < $full / 2)" -- \
  test "$less" -lt $((full / 2))
full=$(dact "$T/c.json" d8) less=$(dact "$T/a.json" d8)
check "the GPU plan of GPT-2 d8 counts fewer activations ($less < $full / 2)" -- \
  test "$less" -lt $((full / 2))

# number_checkpoints other than the layer count is said.
config "$T/n.json" 0 ', "activation_checkpointing": {"number_checkpoints": 4}'
expect 0 "keeps one checkpoint per transformer layer (2 here)" -- "$DSC" train --config "$T/n.json" \
  --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 --max-steps 1 --device cpu --out "$T/n"
finish
