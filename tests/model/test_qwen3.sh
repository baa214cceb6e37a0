#!/usr/bin/env bash
# Qwen3ForCausalLM (dense) folders through the CLI, against tests/model/qwen3_ref.py: a Qwen3
# written in plain torch and run in float64 (Debian's torch; no transformers release with Qwen3
# runs on it - the transformers comparison is test_qwen3_hf_fixtures.c's). Two folders with
# random weights (the q/k norm weights too, so that each one matters):
#   qa  untied, 4 heads over 2 kv heads, head_dim 16 on hidden 40 (q and k wider than the
#       hidden size, as qwen3-0.6B's), 2 layers
#   qb  tied, 2 heads over 1 kv head (MQA), head_dim 32 on hidden 64, 3 layers
# For each: `dsc train --model hf:DIR --dump-grads`: the first step's loss within 1e-5 and every
# gradient (q_norm and k_norm included, under their Hugging Face names) within 1e-4 relative L2;
# `dsc generate --model hf:DIR` (KV cache) = the reference's greedy tokens; ZeRO-3 on 2 ranks,
# `dsc ckpt export --hf` writes a Qwen3ForCausalLM config.json with head_dim and the norm weights,
# generation from the checkpoint = from the folder = the reference's tokens on the folder;
# `--init-weights` takes the exported folder (the first step's gradients against the reference
# on it). Then the tiny qwen3-dN spec trains and exports as Qwen3, and a Qwen3 config.json with
# attention_bias true is refused, naming the field.
set -uo pipefail
src=${DSC_SOURCE_DIR:?}
source "$src/tests/cli/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null ||
    { echo "SKIP: Debian's python3-torch and python3-numpy are needed for the reference"; exit 77; }
ref() { /usr/bin/python3 "$src/tests/model/qwen3_ref.py" "$@"; }
within() { /usr/bin/python3 -c "import sys; sys.exit(not float('$1') <= $2)"; }
export OMP_NUM_THREADS=1

cd "$T"
mkdir qa qb
ref make qa --seed 3 --config '{"vocab_size": 300, "hidden_size": 40, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 56, "num_hidden_layers": 2,
    "max_position_embeddings": 64, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": false}'
ref make qb --seed 4 --config '{"vocab_size": 300, "hidden_size": 64, "num_attention_heads": 2,
    "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 96, "num_hidden_layers": 3,
    "max_position_embeddings": 64, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": true}'
check "the reference wrote both folders" -- test -f qa/model.safetensors -a -f qb/model.safetensors
"$DSC" data prepare --input /usr/share/common-licenses/GPL-3 --tokenizer byte --out data >/dev/null
cat >cfg.json <<'EOF'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 3},
 "checkpoint": {"async": false}}
EOF
common=(--data data --config cfg.json --seq-len 32 --sample-tokens 0 --eval-every 0 --device cpu)
prompt="84 104 101 32 112 114 111 103"
echo "$prompt" >prompt.ids

first_step() { # DIR (the weights' folder) NAME extra-args...
    local dir=$1 name=$2
    shift 2
    expect 0 "train loss" -- "$DSC" train "${common[@]}" --max-steps 1 --out $name.r1 \
        --dump-grads $name.grads.st "$@"
    ref grads $dir $name.grads.st >$name.cmp
    read -r _ dl rl lrel < <(grep '^loss' $name.cmp)
    read -r _ gworst gwhere < <(grep '^grads' $name.cmp)
    echo "$name first step: loss dsc $dl float64 $rl (rel $lrel); worst gradient $gworst ($gwhere)"
    check "$name: loss within 1e-5 of the float64 reference" -- within "${lrel:-inf}" 1e-5
    check "$name: every gradient within 1e-4 of the float64 reference" -- within "${gworst:-inf}" 1e-4
}

greedy() { # ARGS... -> dsc's greedy tokens
    "$DSC" generate "$@" --tokenizer ids --prompt "$prompt" --max-new-tokens 10 --temperature 0 \
        2>/dev/null | tail -1 | cut -d' ' -f9-
}

for m in qa qb; do
    first_step $m $m --model hf:$m
    greedy --model hf:$m >$m.dsc.greedy
    ref greedy $m prompt.ids 10 >$m.ref.greedy
    echo "$m greedy: dsc [$(cat $m.dsc.greedy)] reference [$(cat $m.ref.greedy)]"
    check "$m: dsc generate's greedy tokens (KV cache) = the reference's" -- \
        cmp -s $m.dsc.greedy $m.ref.greedy

    expect 0 "train loss" -- "$DSC" launch --num_procs 2 --master_port "$(free_port)" "$DSC" train \
        --model hf:$m "${common[@]}" --max-steps 4 --out $m.r2 --save-dir $m.ck --save-at-end
    expect 0 "wrote $m.out" -- "$DSC" ckpt export $m.ck --hf $m.out
    check "$m: the export is a Qwen3ForCausalLM with its head_dim" -- /usr/bin/python3 -c "
import json, sys
c = json.load(open('$m.out/config.json')); o = json.load(open('$m/config.json'))
sys.exit(not (c['architectures'] == ['Qwen3ForCausalLM'] and c['model_type'] == 'qwen3' and
              c['head_dim'] == o['head_dim'] and c['attention_bias'] is False and
              c['tie_word_embeddings'] == o['tie_word_embeddings']))"
    check "$m: the export holds q_norm and k_norm under their Hugging Face names" -- \
        grep -aq '"model.layers.1.self_attn.k_norm.weight"' $m.out/model.safetensors
    greedy --checkpoint $m.ck >$m.ck.greedy
    greedy --model hf:$m.out >$m.out.greedy
    ref greedy $m.out prompt.ids 10 >$m.outref.greedy
    check "$m: generation from the checkpoint = from the exported folder" -- \
        cmp -s $m.ck.greedy $m.out.greedy
    check "$m: ... = the reference's greedy tokens on the exported weights" -- \
        cmp -s $m.out.greedy $m.outref.greedy
    first_step $m.out $m.init --model hf:$m --init-weights $m.out
done

# The tiny spec: Qwen3's layer with heads of 128 on hidden 128.
expect 0 "train loss" -- "$DSC" train --model qwen3-d2 "${common[@]}" --max-steps 2 --out d2.r \
    --save-dir d2.ck --save-at-end
expect 0 "wrote d2.out" -- "$DSC" ckpt export d2.ck --hf d2.out
check "qwen3-d2 exports as a Qwen3ForCausalLM with head_dim 128 and hidden 128" -- \
    /usr/bin/python3 -c "
import json, sys
c = json.load(open('d2.out/config.json'))
sys.exit(not (c['architectures'] == ['Qwen3ForCausalLM'] and c['head_dim'] == 128 and
              c['hidden_size'] == 128 and c['num_attention_heads'] == 2))"

# attention_bias biases o_proj too in Qwen3: refused, naming the field.
mkdir qbias && cp qa/model.safetensors qbias/
/usr/bin/python3 -c "
import json
c = json.load(open('qa/config.json')); c['attention_bias'] = True
json.dump(c, open('qbias/config.json', 'w'))"
expect 1 "attention_bias true" -- "$DSC" train --model hf:qbias "${common[@]}" --max-steps 1 \
    --out qbias.r
finish
