#!/usr/bin/env bash
# `dsc train --model llama-d4` with everything GPT-2 has on the CPU, no oracle needed: ZeRO stages
# 0-3 on 2 ranks with gradient accumulation, clipping and emulated bf16 end on the same weights
# byte for byte (--dump-weights); communication_data_type takes effect; fp16 with the loss
# scaler trains; a run stopped and resumed from its checkpoint ends where an uninterrupted run
# does; the checkpoint carries the model's config.json, exports as a LlamaForCausalLM folder and
# generates (KV cache) the same tokens from the checkpoint and from the folder; --init-weights
# takes that folder; the flops profiler shows Llama's modules; --dump-grads names tensors as
# Hugging Face does.
set -u
. "$(dirname "$0")/lib.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
: "${DSC:?set DSC to the dsc binary}"
export OMP_NUM_THREADS=1
cd "$T"
"$DSC" data prepare --input /usr/share/common-licenses/GPL-3 --tokenizer byte --out data >/dev/null
config() { # FILE STAGE EXTRA
    cat >"$1" <<EOF
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}}, "zero_optimization": {"stage": $2},
 "checkpoint": {"async": false}$3}
EOF
}
common=(--model llama-d4 --data data --seq-len 32 --sample-tokens 0 --eval-every 0 --device cpu)

for st in 0 1 2 3; do
    config z$st.json $st ', "bf16": {"enabled": true}'
    expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$(free_port)" "$DSC" train \
        "${common[@]}" --config z$st.json --max-steps 4 --out r$st --dump-weights w$st.st
done
for st in 1 2 3; do
    check "ZeRO stage $st = stage 0, byte for byte (2 ranks, accumulation, clipping, bf16)" -- \
        cmp -s w0.st w$st.st
done
# communication_data_type at stage 2: with bf16 on, the gradients are reduced in bf16 unless the
# key says fp32 (as in DeepSpeed), so an fp32-reduced run ends near, but not on, the stage-2 run:
# Adam turns small gradient differences into updates of up to about lr each
config cdt.json 2 ', "bf16": {"enabled": true}, "communication_data_type": "fp32"'
expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$(free_port)" "$DSC" train \
    "${common[@]}" --config cdt.json --max-steps 4 --out rcdt --dump-weights wcdt.st
check "communication_data_type fp32 takes effect: weights differ from the bf16-reduced run" -- \
    bash -c '! cmp -s w2.st wcdt.st'
check "... by no more than the 4 Adam steps can move a weight (2 x 4 x lr)" -- \
    /usr/bin/python3 "$HERE/st_diff.py" w2.st wcdt.st --abs-min 0 --abs-max 0.016
config h.json 1 ', "fp16": {"enabled": true, "initial_scale_power": 8}'
expect 0 "fp16" -- "$DSC" train "${common[@]}" --config h.json --max-steps 3 --out rh

# Stopped at step 3 and resumed to 6 = 6 steps at once.
config c.json 2 ""
expect 0 "train loss" -- "$DSC" train "${common[@]}" --config c.json --max-steps 6 --out full \
    --save-dir full.ck --save-at-end --dump-weights full.st
expect 0 "train loss" -- "$DSC" train "${common[@]}" --config c.json --max-steps 3 --out a \
    --save-dir ck --save-at-end
expect 0 "continuing after step 3" -- "$DSC" train "${common[@]}" --config c.json --max-steps 6 \
    --out b --save-dir ck --resume --save-at-end --dump-weights resumed.st
check "resumed run ends on the uninterrupted run's weights" -- cmp -s full.st resumed.st

# The checkpoint's config.json, the export, generation from both.
expect 0 "attached    ds_config.json config.json generation_config.json" -- "$DSC" ckpt info ck
expect 0 "wrote out" -- "$DSC" ckpt export ck --hf out
check "the export is a LlamaForCausalLM with 2 kv heads" -- grep -q '"LlamaForCausalLM"' out/config.json
check "... and its config has num_key_value_heads 2" -- grep -q '"num_key_value_heads": 2' out/config.json
"$DSC" generate --checkpoint ck --prompt "The " --max-new-tokens 12 --temperature 0 >ck.txt 2>/dev/null
"$DSC" generate --model hf:out --prompt "The " --max-new-tokens 12 --temperature 0 >hf.txt 2>/dev/null
"$DSC" generate --model hf:out --prompt "The " --max-new-tokens 12 --temperature 0 --no-kv-cache \
    >nc.txt 2>/dev/null
check "generated text from the checkpoint and from the folder agree" -- cmp -s ck.txt hf.txt
check "the KV cache gives what recomputing gives" -- cmp -s hf.txt nc.txt
check "something was generated" -- test "$(wc -c <ck.txt)" -gt 6
expect 0 "train loss" -- "$DSC" train "${common[@]}" --config c.json --max-steps 1 --out init \
    --init-weights out
first() { head -n 1 "$1/metrics.jsonl" | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["loss"])'; }
check "--init-weights: the trained folder starts lower than a fresh model" -- \
    /usr/bin/python3 -c "import sys; sys.exit(not $(first init) < $(first full) - 0.1)"

# The flops profiler's module tree and --dump-grads' names are Hugging Face's.
config p.json 0 ', "flops_profiler": {"enabled": true, "profile_step": 2}'
expect 0 "'LlamaDecoderLayer'" -- "$DSC" train "${common[@]}" --config p.json --max-steps 2 \
    --out prof
expect 0 "train loss" -- "$DSC" train "${common[@]}" --config c.json --max-steps 1 --out g \
    --dump-grads g.st
check "--dump-grads: Hugging Face names" -- grep -aq '"model.layers.3.mlp.down_proj.weight"' g.st
finish
