#!/usr/bin/env bash
# A Hugging Face GPT-2 folder in and out, against transformers itself (scripts/install-hf.sh's
# pinned venv; SKIP when it cannot be made):
# - `dsc train --model hf:DIR` on a sharded GPT2LMHeadModel made by transformers (4 heads, a
#   context of 64 trained at --seq-len 32, vocabulary 300): the first step's loss and every
#   gradient equal transformers' on the same tokens (loss 1e-5, gradients 1e-4 relative L2);
# - trained at ZeRO stage 2 on 2 ranks, then `dsc ckpt export --hf`: transformers loads the folder
#   and its logits equal those dsc generate computes from the checkpoint (1e-5), greedy tokens
#   equal; `dsc generate --model hf:OUT` gives the same;
# - instruction JSONL (the loss masked to the completions): the first step's masked loss equals
#   transformers' with labels -100 on the prompts; 30 steps at ZeRO stage 2 on 2 ranks, exported,
#   with dsc's logits in transformers;
# - what is not a folder dsc can train says what and why.
set -uo pipefail
src=${DSC_SOURCE_DIR:?}
source "$src/tests/cli/lib.sh"
py=$(bash "$src/scripts/install-hf.sh" | tail -1) || exit 77
[ -x "$py" ] || exit 77
ref() { "$py" "$src/tests/model/hf_ref.py" "$@" 2>/dev/null; }
le() { "$py" -c "import sys; sys.exit(not float('$1') <= float('$2'))"; } # le VALUE BOUND
same_le() { [ "$1" = 1 ] && le "$2" "$3"; } # same_le TOKENS_EQUAL WORST BOUND

cd "$T"
ref make gpt2 g --config '{"vocab_size": 300, "n_positions": 64, "n_embd": 64, "n_head": 4}' \
    --seed 3 --shard-size 100KB
check "transformers wrote a sharded folder" -- test -f g/model.safetensors.index.json
"$DSC" data prepare --input /usr/share/common-licenses/GPL-3 --tokenizer byte --out data >/dev/null
cat >cfg.json <<'EOF'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2},
 "checkpoint": {"async": false}}
EOF
common=(--data data --config cfg.json --seq-len 32 --sample-tokens 0 --eval-every 0)

# First step against transformers.
expect 0 "model hf:g" -- "$DSC" train --model hf:g "${common[@]}" --max-steps 1 --out r1 \
    --dump-grads grads.st --device cpu
read -r _ dl hl lrel < <(ref grads g grads.st | grep '^loss')
read -r _ gworst gwhere < <(ref grads g grads.st | grep '^grads')
echo "first step: loss dsc $dl transformers $hl (rel $lrel); worst gradient $gworst ($gwhere)"
check "loss within 1e-5 of transformers'" -- le "$lrel" 1e-5
check "gradients within 1e-4 of transformers'" -- le "$gworst" 1e-4

# ZeRO-2 on 2 ranks, exported as a folder.
port=$(free_port)
expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$port" "$DSC" train \
    --model hf:g "${common[@]}" --max-steps 6 --out r2 --save-dir ck --save-at-end --device cpu
expect 0 "attached    ds_config.json config.json generation_config.json" -- "$DSC" ckpt info ck
expect 0 "wrote out" -- "$DSC" ckpt export ck --hf out --shard-size 150KB
check "export wrote shards and the index" -- test -f out/model.safetensors.index.json -a -f out/config.json
prompt="84 104 101 32 112 114 111 103"
"$DSC" generate --checkpoint ck --tokenizer ids --prompt "$prompt" --max-new-tokens 8 \
    --temperature 0 --trace ck.trace >ck.out 2>/dev/null
"$DSC" generate --model hf:out --tokenizer ids --prompt "$prompt" --max-new-tokens 8 \
    --temperature 0 --trace hf.trace >hf.out 2>/dev/null
check "dsc generate: the checkpoint and the exported folder agree" -- cmp -s ck.trace hf.trace
read -r _ same worst < <(ref trace out ck.trace "$prompt")
echo "exported folder in transformers: greedy tokens equal $same, worst logit error $worst"
check "transformers' greedy tokens equal dsc's" -- test "$same" = 1
check "transformers' logits within 1e-5 of dsc's" -- le "$worst" 1e-5

# A named shape (d2, trained from scratch) exports with the config.json dsc writes for it.
expect 0 "train loss" -- "$DSC" train --model d2 --data data --seq-len 32 --max-steps 2 \
    --sample-tokens 0 --eval-every 0 --out d2 --save-dir d2ck --save-at-end --device cpu
expect 0 "wrote d2out" -- "$DSC" ckpt export d2ck --hf d2out
"$DSC" generate --checkpoint d2ck --tokenizer ids --prompt "$prompt" --max-new-tokens 6 \
    --temperature 0 --trace d2.trace >/dev/null 2>&1
read -r _ same worst < <(ref trace d2out d2.trace "$prompt")
echo "d2 exported with dsc's own config.json: greedy tokens equal $same, worst logit error $worst"
check "a named shape's export loads in transformers with dsc's logits" -- \
    same_le "$same" "$worst" 1e-5

# Loading in place (each rank reads its own partition of the folder's weights) gives the same
# training at every ZeRO stage on 2 ranks: final weights bitwise equal.
for stage in 0 3; do
  cat >z$stage.json <<EOF
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": $stage}}
EOF
  port=$(free_port)
  expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$port" "$DSC" train \
      --model hf:g --data data --config z$stage.json --seq-len 32 --sample-tokens 0 \
      --eval-every 0 --max-steps 3 --out z$stage --dump-weights z$stage.st --device cpu
done
check "hf:DIR loaded in place: stage 3 on 2 ranks ends bitwise as stage 0" -- cmp -s z0.st z3.st

# Fine-tuning on instruction data (prompt/completion JSONL, the loss masked to the completions,
# packed rows): the first step's masked loss equals transformers' with labels -100 on the prompt
# tokens; 30 steps at ZeRO stage 2 on 2 ranks, exported, load in transformers with dsc's logits.
/usr/bin/python3 - "$T/sft.jsonl" <<'PY'
import json, random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for _ in range(400):
        a, b = random.randint(0, 99), random.randint(0, 99)
        f.write(json.dumps({"prompt": f"What is {a} plus {b}? ", "completion": f"{a + b}."}) + "\n")
PY
expect 0 "" -- "$DSC" data prepare --input sft.jsonl --tokenizer byte --seq-len 32 --out sft
sft=(--data sft --config cfg.json --seq-len 32 --sample-tokens 0 --eval-every 0)
# One micro-batch a step here: transformers' mean runs over all the batch's targets, dsc's (as
# PyTorch's loop and the HF Trainer) over each micro-batch's own (docs/data.md).
cat >cfg1.json <<'EOF'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}}
EOF
expect 0 "" -- "$DSC" train --model hf:g --data sft --config cfg1.json --seq-len 32 \
    --sample-tokens 0 --eval-every 0 --max-steps 1 --out s1 --dump-grads sgrads.st --device cpu
read -r _ dl hl lrel < <(ref grads g sgrads.st | grep '^loss')
read -r _ gworst gwhere < <(ref grads g sgrads.st | grep '^grads')
echo "masked first step: loss dsc $dl transformers (labels -100) $hl (rel $lrel); worst gradient $gworst"
check "masked loss within 1e-5 of transformers' with labels -100" -- le "$lrel" 1e-5
check "masked gradients within 1e-4 of transformers'" -- le "$gworst" 1e-4
port=$(free_port)
expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$port" "$DSC" train \
    --model hf:g "${sft[@]}" --max-steps 30 --out s2 --save-dir sck --save-at-end --device cpu
expect 0 "wrote sout" -- "$DSC" ckpt export sck --hf sout
"$DSC" generate --checkpoint sck --tokenizer ids --prompt "$prompt" --max-new-tokens 8 \
    --temperature 0 --trace s.trace >/dev/null 2>&1
read -r _ same worst < <(ref trace sout s.trace "$prompt")
echo "fine-tuned and exported: greedy tokens equal $same, worst logit error $worst"
check "fine-tuned export: transformers' logits within 1e-5 of dsc's" -- \
    same_le "$same" "$worst" 1e-5

# Errors name the thing and the fix.
mkdir -p empty bert
echo '{"architectures": ["BertModel"], "model_type": "bert"}' >bert/config.json
expect 1 "empty/config.json" -- "$DSC" train --model hf:empty "${common[@]}" --max-steps 1 --device cpu
expect 1 "BertModel" -- "$DSC" train --model hf:bert "${common[@]}" --max-steps 1 --device cpu
mkdir -p arr && cp g/*.safetensors* arr/ && echo '[1, 2]' >arr/config.json
expect 1 "arr/config.json: the top level is an array" -- "$DSC" train --model hf:arr "${common[@]}" --max-steps 1 --device cpu
check "a JSON array as config.json names no line -1" -- bash -c "! '$DSC' train --model hf:arr --max-steps 1 --device cpu 2>&1 | grep -q -- -1:-1"
expect 1 "context (64 positions)" -- "$DSC" train --model hf:g --data data --seq-len 128 --max-steps 1 --device cpu
ref make gpt2 small --config '{"vocab_size": 200, "n_positions": 64, "n_embd": 32, "n_head": 2}'
expect 1 "vocabulary of 256 tokens but model hf:small has 200" -- "$DSC" train --model hf:small \
    "${common[@]}" --max-steps 1 --device cpu
mkdir -p relu && cp g/*.safetensors* relu/ && sed 's/"gelu_new"/"relu"/' g/config.json >relu/config.json
expect 1 'activation_function "relu"' -- "$DSC" train --model hf:relu "${common[@]}" --max-steps 1 --device cpu
cp -r g nolm && rm nolm/model-00001-of-*.safetensors
expect 1 "nolm" -- "$DSC" train --model hf:nolm "${common[@]}" --max-steps 1 --device cpu
finish
