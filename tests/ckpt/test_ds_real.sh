#!/usr/bin/env bash
# DeepSpeed's own checkpoints (tests/ckpt/ds_real, written by DeepSpeed 0.18.4's engine on 2
# ranks: a tiny Llama and GPT-2, each at ZeRO 1, 2 and 3 in fp32 and in bf16, AdamW, WarmupLR;
# make_fixtures.py regenerates them) continued by dsc against what DeepSpeed itself got when it resumed them:
# - `dsc train --resume CKPT` at 1 and 3 ranks at the checkpoint's stage and at 2 ranks at
#   another stage: steps 11-20 have DeepSpeed's learning rates (to 1e-12) and losses (fp32 within
#   1e-5; bf16 within 3e-4: DeepSpeed runs the model in bf16 throughout, dsc keeps activations
#   in fp32, so their rounding differs);
# - the universal layout (ds_to_universal's output) resumes to DeepSpeed's universal resume;
# - `dsc ckpt export CKPT --hf OUT` (normal and universal) loads in transformers with the logits
#   DeepSpeed's zero_to_fp32 weights give (within 1e-5), and `--init-weights CKPT` starts from
#   exactly the exported weights;
# - the other way: dsc continues a fixture to step 20, `dsc ckpt export --deepspeed` writes a
#   universal checkpoint for ZeRO 1, 2 or 3, and dsc's steps 21-30 from it equal DeepSpeed's
#   steps 21-30 from the same files (expect.json's from_dsc_export, recorded by make_fixtures.py
#   --continue: DeepSpeed 0.18.4 on 2 ranks loading them with checkpoint.load_universal), to the
#   bounds above; the files load in torch (Debian's, when it is there) with the expected keys.
set -u
. "$(dirname "$0")/lib.sh"
SRC=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
F="$SRC/tests/ckpt/ds_real"

# dsrun NAME WORLD CONFIG FIXTURE_MODEL [flags...]
dsrun() {
  local name=$1 world=$2 cfg=$3 model=$4 r
  shift 4
  local port=$(free_port)
  PIDS=()
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port "$DSC" train --config "$cfg" --data "$F/data" --model "hf:$F/tiny_$model" \
      --seq-len 32 --seed 1234 --sample-tokens 0 --eval-every 0 --out "$T/$name" "$@" \
      > "$T/$name.$r.log" 2>&1 &
    PIDS+=($!)
  done
  finish_ranks "$name"
}

# compare NAME FIXTURE KEY...: the steps of run NAME against expect.json's KEY (a path of keys).
compare() {
  $PY - "$T/$1/metrics.jsonl" "$F/$2/expect.json" "$1" "${@:3}" <<'PYEOF'
import json, sys
rows = {r["step"]: r for r in map(json.loads, open(sys.argv[1])) if "loss" in r}
want = json.load(open(sys.argv[2]))
for key in sys.argv[4:]:
    want = want[key]
sys.argv[4] = sys.argv[3]
tol = 3e-4 if "bf16" in sys.argv[2] else 1e-5
dl = dr = 0.0
for w in want:
    got = rows.get(w["step"])
    assert got, f"{sys.argv[4]}: no step {w['step']}"
    dl = max(dl, abs(got["loss"] - w["loss"]))
    dr = max(dr, abs(got["lr"] - w["lr"]) / max(w["lr"], 1e-30))
    assert abs(got["lr"] - w["lr"]) <= 1e-12 * max(w["lr"], 1e-30), (sys.argv[4], got, w)
    assert abs(got["loss"] - w["loss"]) <= tol, (sys.argv[4], got["step"], got["loss"], w["loss"])
assert max(rows) == want[-1]["step"] and min(rows) == want[0]["step"], sorted(rows)
print(f"  {sys.argv[4]}: steps {want[0]['step']}-{want[-1]['step']} max |loss - DeepSpeed's| "
      f"{dl:.2e} (bound {tol:g}), lr rel {dr:.1e}")
PYEOF
}

fail=0
for fx in llama_z{1,2,3}_{fp32,bf16} gpt2_z{1,2,3}_{fp32,bf16}; do
  model=${fx%%_*}
  stage=${fx#*_z}; stage=${stage%%_*}
  other=$((stage % 3 + 1))
  $PY -c "import json,sys; c=json.load(open(sys.argv[1])); c['zero_optimization']['stage']=$other; \
json.dump(c, open(sys.argv[2], 'w'))" "$F/$fx/ds_config.json" "$T/$fx.z$other.json"
  for world in 1 3; do
    dsrun "$fx.w$world" $world "$F/$fx/ds_config.json" $model --max-steps 20 \
      --resume "$F/$fx/ckpt" && compare "$fx.w$world" $fx resumed || fail=1
  done
  dsrun "$fx.z$other" 2 "$T/$fx.z$other.json" $model --max-steps 20 --resume "$F/$fx/ckpt" &&
    compare "$fx.z$other" $fx resumed || fail=1
  grep -q "continuing after step 10" "$T/$fx.w1.0.log" || { echo "$fx: no resume line"; fail=1; }
done

echo "universal checkpoints (ds_to_universal)"
for fx in llama_z2_bf16 gpt2_z3_bf16; do
  model=${fx%%_*}
  "$DSC" ckpt info "$F/$fx/ckpt/global_step10_universal" | grep -q "layout      universal" ||
    { echo "$fx: ckpt info does not say universal"; fail=1; }
  for world in 1 3; do
    dsrun "$fx.u$world" $world "$F/$fx/ckpt/../ds_config.json" $model --max-steps 20 \
      --resume "$F/$fx/ckpt/global_step10_universal" &&
      compare "$fx.u$world" $fx resumed_universal || fail=1
  done
done

echo "export --hf and --init-weights against DeepSpeed's zero_to_fp32 weights"
hfpy=$(bash "$SRC/scripts/install-hf.sh" 2>/dev/null | tail -1) || hfpy=
for fx in llama_z1_fp32 llama_z2_bf16 llama_z3_fp32 gpt2_z1_bf16 gpt2_z2_fp32 gpt2_z3_bf16 \
          llama_z2_bf16/ckpt/global_step10_universal; do
  base=${fx%%/*}
  model=${base%%_*}
  ck="$F/$base/ckpt"
  [ "$fx" = "$base" ] || ck="$F/$fx"
  out="$T/hf.${fx//\//.}"
  "$DSC" ckpt export "$ck" --hf "$out" --hf-config "$F/tiny_$model" > "$T/export.log" 2>&1 ||
    { echo "$fx: export failed"; cat "$T/export.log"; fail=1; continue; }
  dsrun "iw.$base" 1 "$F/$base/ds_config.json" $model --max-steps 0 --init-weights "$ck" \
    --dump-weights "$T/iw.$base.safetensors" || { fail=1; continue; }
  # The same bits under the same names (DeepSpeed's GPT-2 names carry the "transformer." of
  # GPT2LMHeadModel, dsc's do not).
  "$DSC" ckpt export "$ck" --out "$T/ex.$base.safetensors" >/dev/null &&
    $PY - "$T/iw.$base.safetensors" "$T/ex.$base.safetensors" <<'PYEOF' ||
import json, struct, sys
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    return {k.removeprefix("transformer."): raw[8 + n + v["data_offsets"][0]:
            8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
assert all(a[k] == b[k] for k in a), [k for k in a if a[k] != b[k]]
PYEOF
    { echo "$fx: --init-weights differs from the export"; fail=1; }
  [ -n "$hfpy" ] || continue
  "$hfpy" - "$out" "$F/$base/expect.json" "$F/data/train_000000.bin" "$fx" <<'PYEOF' || fail=1
import json, struct, sys
import torch
from transformers import AutoModelForCausalLM
out, expect, shard, name = sys.argv[1:]
want = torch.tensor(json.load(open(expect))["logits"])
raw = open(shard, "rb").read()
toks = list(struct.unpack("<%dH" % want.shape[0], raw[1024:1024 + 2 * want.shape[0]]))
import transformers
transformers.logging.set_verbosity_error()
m = AutoModelForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
with torch.no_grad():
    got = m(input_ids=torch.tensor([toks])).logits[0]
d = (got - want).abs().max().item()
assert d <= 1e-5, (name, d)
print(f"  {name}: transformers on the export, max |logits - DeepSpeed's| {d:.1e}")
PYEOF
done
[ -n "$hfpy" ] || echo "  (transformers not installed: logits not compared)"

echo "export --deepspeed: DeepSpeed's continuation from dsc's files"
for c in llama_z1_fp32:1 llama_z2_bf16:2 gpt2_z3_bf16:3 gpt2_z2_fp32:3; do
  fx=${c%:*}
  stage=${c#*:}
  model=${fx%%_*}
  name="$fx.to$stage"
  dsrun "$name.run" 1 "$F/$fx/ds_config.json" $model --max-steps 20 --resume "$F/$fx/ckpt" \
    --save-dir "$T/$name.ck" --save-at-end || { fail=1; continue; }
  "$DSC" ckpt export "$T/$name.ck" --deepspeed "$T/$name.ds" --zero-stage $stage \
    > "$T/$name.log" 2>&1 || { echo "$name: export failed"; cat "$T/$name.log"; fail=1; continue; }
  [ "$(cat "$T/$name.ds/latest_universal")" = global_step20 ] ||
    { echo "$name: latest_universal"; fail=1; }
  # an existing tag is never overwritten
  "$DSC" ckpt export "$T/$name.ck" --deepspeed "$T/$name.ds" > "$T/$name.again" 2>&1 &&
    { echo "$name: a second export over the first succeeded"; fail=1; }
  grep -q "already exists" "$T/$name.again" || { echo "$name: no refusal"; fail=1; }
  "$DSC" ckpt export "$T/$name.ck" --deepspeed "$T/$name.z0" --zero-stage 0 > "$T/$name.z0.log" \
    2>&1 && { echo "$name: an export for stage 0 succeeded"; fail=1; }
  grep -q "ZeRO stages 1, 2 or 3 only" "$T/$name.z0.log" || { echo "$name: stage 0"; fail=1; }
  dsrun "$name.cont" 1 "$F/$fx/ds_config.json" $model --max-steps 30 --resume "$T/$name.ds" &&
    compare "$name.cont" $fx from_dsc_export z$stage || fail=1
  # the files as torch reads them (a stand-in for DeepSpeed's loss scaler classes)
  if $PY -c "import torch" 2>/dev/null; then
    mkdir -p "$T/stub/deepspeed/runtime/fp16"
    touch "$T/stub/deepspeed/__init__.py" "$T/stub/deepspeed/runtime/__init__.py" \
      "$T/stub/deepspeed/runtime/fp16/__init__.py"
    printf 'class LossScaler:\n    pass\nclass DynamicLossScaler:\n    pass\n' \
      > "$T/stub/deepspeed/runtime/fp16/loss_scaler.py"
    PYTHONPATH="$T/stub" $PY - "$T/$name.ds/global_step20" $stage <<'PYEOF' || fail=1
import glob, os, sys
import torch
d, stage = sys.argv[1], int(sys.argv[2])
ms = glob.glob(d + ("/zero_pp_rank_0_mp_rank_00" if stage == 3 else "/mp_rank_00") +
               "_model_states.pt")
assert len(ms) == 1, os.listdir(d)
sd = torch.load(ms[0])
for k in ("module", "param_shapes", "lr_scheduler", "global_steps", "dp_world_size",
          "ds_config", "ds_version"):
    assert k in sd, k
assert sd["global_steps"] == 20 and sd["lr_scheduler"]["last_batch_iteration"] == 19
names = list(sd["param_shapes"][0])
opt = torch.load(d + "/zero/optimizer_state.pt")
assert "param_groups" in opt and ("optimizer_state_dict" in opt) == (stage == 3)
for n in names:
    f = torch.load(f"{d}/zero/{n}/fp32.pt")
    t = f if stage == 3 else f["param"]
    assert tuple(t.shape) == tuple(sd["param_shapes"][0][n]), n
    assert os.path.exists(f"{d}/zero/{n}/step.pt") == (stage != 3), n
PYEOF
  fi
done
exit $fail
