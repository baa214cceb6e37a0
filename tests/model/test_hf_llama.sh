#!/usr/bin/env bash
# Hugging Face Llama-family folders in and out, against transformers itself (scripts/install-hf.sh's
# pinned venv; SKIP when it cannot be made). Three folders made by transformers (vocabulary 300,
# context 64, trained at --seq-len 32):
#   llama   LlamaForCausalLM, 4 heads over 2 kv heads (GQA), untied, llama3 rope scaling, sharded
#   qwen2   Qwen2ForCausalLM, tied, q/k/v biases
#   mistral MistralForCausalLM, 1 kv head (MQA), no sliding window
# For each: `dsc train --model hf:DIR --dump-grads`: the first step's loss within 1e-5 and every
# gradient within 1e-4 (relative L2) of transformers'; ZeRO stage 2 on 2 ranks, `dsc ckpt export
# --hf`, transformers loads the folder and its greedy tokens equal dsc generate's (from the
# checkpoint, KV cache) with logits within 1e-5; `dsc generate --model hf:DIR` = transformers'
# greedy tokens; the same with 2 tensor-parallel ranks (Llama; the MQA folder's single kv head is
# refused). Then fine-tuning: instruction JSONL packed at --seq-len, the masked first step's
# loss = transformers' with labels -100 on the prompt tokens, 30 steps of ZeRO-2 on 2 ranks,
# exported and loaded with the same logits. Last, the configurations dsc refuses say which field.
set -uo pipefail
src=${DSC_SOURCE_DIR:?}
source "$src/tests/cli/lib.sh"
py=$(bash "$src/scripts/install-hf.sh" | tail -1) || exit 77
[ -x "$py" ] || exit 77
ref() { "$py" "$src/tests/model/hf_ref.py" "$@" 2>/dev/null; }
within() { "$py" -c "import sys; sys.exit(not float('$1') <= $2)"; }

cd "$T"
ref make llama llama --seed 3 --shard-size 100KB --config '{"vocab_size": 300, "rope_theta":
    500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}}'
ref make qwen2 qwen2 --seed 4 --config '{"vocab_size": 300}'
ref make mistral mistral --seed 5 --config '{"vocab_size": 300}'
check "transformers wrote the three folders" -- test -f llama/model.safetensors.index.json \
    -a -f qwen2/model.safetensors -a -f mistral/model.safetensors
"$DSC" data prepare --input /usr/share/common-licenses/GPL-3 --tokenizer byte --out data >/dev/null
cat >cfg.json <<'EOF'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2},
 "checkpoint": {"async": false}}
EOF
common=(--config cfg.json --seq-len 32 --sample-tokens 0 --eval-every 0 --device cpu)
# One micro-batch per step where a masked loss is compared: with accumulation dsc averages the
# micro-batches' means (as DeepSpeed does), transformers takes one mean over all the targets.
sed 's/"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2/"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1/' cfg.json >cfg1.json
one=(--config cfg1.json --seq-len 32 --sample-tokens 0 --eval-every 0 --device cpu)
prompt="84 104 101 32 112 114 111 103"
echo "$prompt" >prompt.ids

for m in llama qwen2 mistral; do
    # First step against transformers.
    expect 0 "model hf:$m" -- "$DSC" train --model hf:$m --data data "${common[@]}" --max-steps 1 \
        --out $m.r1 --dump-grads $m.grads.st
    ref grads $m $m.grads.st >$m.cmp
    read -r _ dl hl lrel < <(grep '^loss' $m.cmp)
    read -r _ gworst gwhere < <(grep '^grads' $m.cmp)
    echo "$m first step: loss dsc $dl transformers $hl (rel $lrel); worst gradient $gworst ($gwhere)"
    check "$m: loss within 1e-5 of transformers'" -- within "$lrel" 1e-5
    check "$m: gradients within 1e-4 of transformers'" -- within "$gworst" 1e-4

    # ZeRO-2 on 2 ranks, exported as a folder, generated from.
    expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$(free_port)" "$DSC" train \
        --model hf:$m --data data "${common[@]}" --max-steps 4 --out $m.r2 --save-dir $m.ck \
        --save-at-end
    expect 0 "wrote $m.out" -- "$DSC" ckpt export $m.ck --hf $m.out
    "$DSC" generate --checkpoint $m.ck --tokenizer ids --prompt "$prompt" --max-new-tokens 8 \
        --temperature 0 --trace $m.ck.trace >/dev/null 2>&1
    "$DSC" generate --model hf:$m.out --tokenizer ids --prompt "$prompt" --max-new-tokens 8 \
        --temperature 0 --trace $m.hf.trace >/dev/null 2>&1
    check "$m: dsc generate from the checkpoint and from the exported folder agree" -- \
        cmp -s $m.ck.trace $m.hf.trace
    read -r _ same worst < <(ref trace $m.out $m.ck.trace "$prompt")
    echo "$m exported folder in transformers: greedy tokens equal ${same:-?}, worst logit error ${worst:-?}"
    check "$m: transformers' greedy tokens equal dsc's" -- test "${same:-0}" = 1
    check "$m: transformers' logits within 1e-5 of dsc's" -- within "${worst:-inf}" 1e-5

    # Greedy generation from the folder transformers wrote, token for token.
    "$DSC" generate --model hf:$m --tokenizer ids --prompt "$prompt" --max-new-tokens 12 \
        --temperature 0 2>/dev/null | tail -1 | cut -d' ' -f9- >$m.dsc.greedy
    ref greedy $m prompt.ids 12 >$m.hf.greedy
    echo "$m greedy: dsc [$(cat $m.dsc.greedy)] transformers [$(cat $m.hf.greedy)]"
    check "$m: dsc generate's greedy tokens = transformers'" -- cmp -s $m.dsc.greedy $m.hf.greedy
done

# Tensor-parallel generation: 2 ranks split the heads, the kv heads and the MLP rows.
"$DSC" launch --num_procs 2 --master_port "$(free_port)" "$DSC" generate --model hf:llama --tp 2 \
    --tokenizer ids --prompt "$prompt" --max-new-tokens 8 --temperature 0 --trace tp.trace \
    >/dev/null 2>&1
read -r _ same worst < <(ref trace llama tp.trace "$prompt")
echo "tensor-parallel (2 ranks) generation in transformers: greedy tokens equal ${same:-?}, worst logit error ${worst:-?}"
check "--tp 2: transformers' greedy tokens equal dsc's" -- test "${same:-0}" = 1
check "--tp 2: transformers' logits within 1e-5 of dsc's" -- within "${worst:-inf}" 1e-5
expect 1 "1 key/value heads" -- "$DSC" launch --num_procs 2 --master_port "$(free_port)" "$DSC" \
    generate --model hf:mistral --tp 2 --tokenizer ids --prompt "$prompt" --max-new-tokens 2

# Fine-tuning a Llama folder on instruction data (issue 26's acceptance).
/usr/bin/python3 - sft.jsonl <<'PYEOF'
import json, random, sys
random.seed(7)
with open(sys.argv[1], "w") as f:
    for i in range(60):
        a, b = random.randint(1, 50), random.randint(1, 50)
        f.write(json.dumps({"prompt": f"What is {a} plus {b}? ", "completion": f"{a + b}."}) + "\n")
PYEOF
expect 0 "packed in" -- "$DSC" data prepare --input sft.jsonl --tokenizer byte --out sd \
    --seq-len 32 --val-fraction 0.1
expect 0 "loss mask" -- "$DSC" train --model hf:llama --data sd "${one[@]}" --max-steps 1 \
    --out sft.r1 --dump-grads sft.grads.st
check "the masked step has ignored targets" -- /usr/bin/python3 -c "
import json, struct, sys
raw = open('sft.grads.st', 'rb').read(); n = struct.unpack('<Q', raw[:8])[0]
h = json.loads(raw[8:8 + n]); t = h['targets']; a, b = t['data_offsets']
import array; v = array.array('i', raw[8 + n + a:8 + n + b])
sys.exit(not (min(v) < 0 < max(v)))"
ref grads llama sft.grads.st >sft.cmp
read -r _ dl hl lrel < <(grep '^loss' sft.cmp)
read -r _ gworst gwhere < <(grep '^grads' sft.cmp)
echo "masked first step: loss dsc $dl transformers (labels -100) $hl (rel $lrel); worst gradient $gworst ($gwhere)"
check "masked loss within 1e-5 of transformers' with labels -100" -- within "$lrel" 1e-5
check "masked gradients within 1e-4 of transformers'" -- within "$gworst" 1e-4
# Position ids restarting at each packed example (byte tokens: after each end-of-text, id 0), on
# short examples that pack several to a row.
/usr/bin/python3 -c "
import json
with open('short.jsonl', 'w') as f:
    for i in range(40):
        f.write(json.dumps({'prompt': f'{i % 7}+{i % 5}=', 'completion': str(i % 7 + i % 5)}) + '\\n')"
expect 0 "packed in" -- "$DSC" data prepare --input short.jsonl --tokenizer byte --out sp \
    --seq-len 32 --val-fraction 0.1
expect 0 "train loss" -- "$DSC" train --model hf:llama --data sp "${one[@]}" --max-steps 1 \
    --out sft.rq --dump-grads sft.plain.st
expect 0 "train loss" -- "$DSC" train --model hf:llama --data sp "${one[@]}" --max-steps 1 \
    --out sft.rp --dump-grads sft.pos.st --restart-positions
ref grads llama sft.pos.st --restart-after 0 >pos.cmp
read -r _ dl hl lrel < <(grep '^loss' pos.cmp)
read -r _ gworst gwhere < <(grep '^grads' pos.cmp)
echo "restarted positions: loss dsc $dl transformers (position_ids) $hl (rel $lrel); worst gradient $gworst ($gwhere)"
check "restarted positions: loss within 1e-5 of transformers'" -- within "$lrel" 1e-5
check "restarted positions: gradients within 1e-4 of transformers'" -- within "$gworst" 1e-4
read -r _ plain _ < <(ref grads llama sft.plain.st | grep '^loss')
check "restarted positions change the loss" -- "$py" -c "import sys; sys.exit(not abs($dl - $plain) > 1e-6)"
expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$(free_port)" "$DSC" train \
    --model hf:llama --data sd "${common[@]}" --max-steps 30 --out sft.r2 --save-dir sft.ck \
    --save-at-end
expect 0 "wrote sft.out" -- "$DSC" ckpt export sft.ck --hf sft.out
sprompt=$(printf 'What is 3 plus 4? ' | od -An -tu1 | xargs)
"$DSC" generate --checkpoint sft.ck --tokenizer ids --prompt "$sprompt" --max-new-tokens 6 \
    --temperature 0 --trace sft.trace >/dev/null 2>&1
read -r _ same worst < <(ref trace sft.out sft.trace "$sprompt")
echo "fine-tuned folder in transformers: greedy tokens equal ${same:-?}, worst logit error ${worst:-?}"
check "fine-tuned: transformers' greedy tokens equal dsc's" -- test "${same:-0}" = 1
check "fine-tuned: transformers' logits within 1e-5 of dsc's" -- within "${worst:-inf}" 1e-5

# What dsc's Llama family does not compute is refused, naming the field.
refused() { # name, field edit (python on dict c), expected text
    mkdir -p "bad.$1" && cp mistral/model.safetensors "bad.$1/"
    /usr/bin/python3 -c "import json; c = json.load(open('mistral/config.json')); $2;
json.dump(c, open('bad.$1/config.json', 'w'))"
    expect 1 "$3" -- "$DSC" train --model hf:bad.$1 --data data "${common[@]}" --max-steps 1 \
        --out bad.$1.r
}
refused act "c['hidden_act'] = 'gelu'" 'hidden_act "gelu"'
refused window "c['sliding_window'] = 16" "sliding_window 16"
refused rope "c['rope_scaling'] = {'rope_type': 'dynamic', 'factor': 2.0}" 'rope_type "dynamic"'
refused obias "c['architectures'] = ['LlamaForCausalLM']; c['model_type'] = 'llama'; c['attention_bias'] = True" \
    "attention_bias true"
refused mlpbias "c['architectures'] = ['LlamaForCausalLM']; c['model_type'] = 'llama'; c['mlp_bias'] = True" \
    "mlp_bias true"
finish
