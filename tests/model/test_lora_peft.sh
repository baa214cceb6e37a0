#!/usr/bin/env bash
# LoRA against PEFT (scripts/install-hf.sh's pinned venv: transformers 4.44.2 + PEFT 0.12.0;
# SKIP when it cannot be made). Two folders made by transformers (vocabulary 300):
#   llama  LlamaForCausalLM, untied: adapters on every linear module ("all-linear") and lm_head
#          trained in full (modules_to_save)
#   qwen2  Qwen2ForCausalLM, tied, q/k/v biases (frozen): q/k/v/o_proj with rank-stabilised
#          scaling (use_rslora)
#   gpt2   GPT2LMHeadModel: c_attn (fused q/k/v, one adapter as PEFT has it), c_proj, c_fc
#          (Conv1D weights, stored (in, out))
# Each starts from an adapter PEFT made (B random, so that A's gradients are not zero; dsc
# --init-adapter). The data is one batch (B 2, T 32), so every step sees the same tokens.
#  1. `dsc train --dump-grads`: the first step's loss within 1e-5 and every trainable gradient
#     (PEFT's adapter-file names, nothing else) within 1e-5 (relative L2) of PEFT's.
#  2. 20 AdamW steps with clipping: `--dump-weights` (the trained tensors, PEFT's names) within
#     1e-5 of PEFT + torch.optim.AdamW's; the same on 2 ranks at ZeRO stages 2 and 3.
#  3. llama: a checkpoint at step 10 is the adapters and their state only (kilobytes), and a
#     resume from it ends bitwise where the 20 uninterrupted steps did; a base with other values
#     is refused on resume (the checkpoint carries the base's checksums).
#  4. Exports (llama, and gpt2 for the Conv1D merge): `dsc ckpt export --peft` loads in PEFT with
#     exactly the keys it expects and the trained values; `--hf` (merged) loads in transformers
#     with logits within 1e-5 of PEFT's unmerged model and of its merge_and_unload().
#     `dsc generate --model hf:BASE --adapter PEFT_DIR` (the adapters beside the products, as
#     PEFT runs them) gives the merged folder's tokens with logits within 1e-5, and
#     transformers' greedy tokens and logits (1e-5); `dsc generate --checkpoint CKPT` gives the
#     same trace bit for bit; with --merge-adapter both give the merged folder's bit for bit.
#  5. lora_dropout (no oracle for the masks): the loss changes, two runs are bitwise the same,
#     activation checkpointing recomputes the same masks (bitwise), and evaluation has none (at
#     lr 0 the validation loss equals the run's without dropout).
#  6. What dsc refuses names the key or module.
set -uo pipefail
src=${DSC_SOURCE_DIR:?}
source "$src/tests/cli/lib.sh"
py=$(bash "$src/scripts/install-hf.sh" | tail -1) || exit 77
[ -x "$py" ] || exit 77
"$py" -c 'import peft' 2>/dev/null || { echo "SKIP: PEFT is not in the oracle venv"; exit 77; }
hf() { "$py" "$src/tests/model/hf_ref.py" "$@" 2>/dev/null; }
peft() { "$py" "$src/tests/model/peft_ref.py" "$@" 2>/dev/null; }
within() { "$py" -c "import sys; sys.exit(not float('$1') <= $2)"; }
# same_trace A B TOL: two --trace files chose the same tokens, their top logits within TOL
same_trace() { "$py" - "$1" "$2" "$3" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
worst = max(abs(p[1] - q[1]) for x, y in zip(a, b) for p, q in zip(x["top"], y["top"]))
print(f"  unmerged vs merged: worst logit difference {worst:.1e}")
sys.exit(not (a and [x["token"] for x in a] == [x["token"] for x in b] and worst <= float(sys.argv[3])))
PY
}

cd "$T"
hf make llama llama --seed 3 --config '{"vocab_size": 300}'
hf make qwen2 qwen2 --seed 4 --config '{"vocab_size": 300}'
hf make gpt2 gpt2 --seed 5 --config '{"vocab_size": 300}'
peft adapter llama llama.ad --r 4 --alpha 8 --targets all-linear --save lm_head --seed 1
peft adapter qwen2 qwen2.ad --r 4 --alpha 16 --targets q_proj,k_proj,v_proj,o_proj --rslora --seed 2
peft adapter gpt2 gpt2.ad --r 4 --alpha 8 --targets c_attn,c_proj,c_fc --seed 3
check "PEFT wrote both adapters" -- test -f llama.ad/adapter_model.safetensors -a \
    -f qwen2.ad/adapter_config.json
head -c 70 /usr/share/common-licenses/GPL-3 >one.txt
"$DSC" data prepare --input one.txt --tokenizer byte --out data --val-fraction 0 >/dev/null
opt='"optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
     "weight_decay": 0.01}}, "gradient_clipping": 1.0, "checkpoint": {"async": false}'
cat >llama.json <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, $opt,
 "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "modules_to_save": ["lm_head"]}}
JSON
cat >qwen2.json <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, $opt,
 "lora": {"r": 4, "lora_alpha": 16, "use_rslora": true,
          "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}}
JSON
cat >gpt2.json <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, $opt,
 "lora": {"r": 4, "lora_alpha": 8, "target_modules": ["c_attn", "c_proj", "c_fc"]}}
JSON
common=(--data data --seq-len 32 --sample-tokens 0 --eval-every 0 --device cpu)

for m in llama qwen2 gpt2; do
    expect 0 "" -- "$DSC" train --model hf:$m --config $m.json "${common[@]}" \
        --max-steps 1 --out $m.r1 --dump-grads $m.g.st --init-adapter $m.ad
    peft grads $m $m.ad $m.g.st >$m.cmp
    read -r _ dl pl lrel < <(grep '^loss' $m.cmp)
    read -r _ gworst gwhere < <(grep '^grads' $m.cmp)
    echo "$m first step: loss dsc $dl PEFT $pl (rel $lrel); worst gradient $gworst ($gwhere)"
    check "$m: loss within 1e-5 of PEFT's" -- within "$lrel" 1e-5
    check "$m: adapter gradients within 1e-5 of PEFT's" -- within "$gworst" 1e-5

    expect 0 "" -- "$DSC" train --model hf:$m --config $m.json "${common[@]}" \
        --max-steps 20 --out $m.r20 --dump-weights $m.w20.st --init-adapter $m.ad
    peft train $m $m.ad $m.g.st 20 $m.w20.st --lr 1e-3 --wd 0.01 --clip 1.0 >$m.cmp20
    read -r _ worst where < <(grep '^weights' $m.cmp20)
    echo "$m 20 steps: worst tensor $worst ($where); PEFT's losses $(grep '^loss' $m.cmp20)"
    check "$m: 20 steps within 1e-5 of PEFT + AdamW" -- within "$worst" 1e-5
done

# ZeRO 2 and 3 on 2 ranks, one sequence each: the same global batch.
sed 's/"train_micro_batch_size_per_gpu": 2/"train_micro_batch_size_per_gpu": 1/' llama.json >z.json
for stage in 2 3; do
    "$py" -c "import json; c = json.load(open('z.json')); c['zero_optimization'] = {'stage': $stage}
json.dump(c, open('z$stage.json', 'w'))"
    expect 0 "" -- "$DSC" launch --num_procs 2 \
        --master_port "$(free_port)" "$DSC" train --model hf:llama --config z$stage.json \
        "${common[@]}" --max-steps 20 --out z$stage.r --dump-weights z$stage.st --init-adapter llama.ad
    peft train llama llama.ad llama.g.st 20 z$stage.st --lr 1e-3 --wd 0.01 --clip 1.0 >z$stage.cmp
    read -r _ worst where < <(grep '^weights' z$stage.cmp)
    check "llama ZeRO-$stage, 2 ranks: within 1e-5 of PEFT ($worst)" -- within "$worst" 1e-5
done

# Checkpoints hold the adapters only, and resume bitwise.
expect 0 "" -- "$DSC" train --model hf:llama --config llama.json \
    "${common[@]}" --max-steps 10 --out ck.r --save-dir ck --save-at-end --init-adapter llama.ad
kb=$(du -sk ck/global_step10 | cut -f1)
echo "LoRA checkpoint: ${kb} KiB (the base model: $(du -sk llama | cut -f1) KiB)"
# A full fine-tune's checkpoint holds masters and two moments: about three times the model.
check "the checkpoint is the adapters' state, less than the model itself" -- \
    test "$kb" -lt "$(du -sk llama | cut -f1)"
expect 0 "" -- "$DSC" train --model hf:llama --config llama.json \
    "${common[@]}" --max-steps 20 --out ck.r --save-dir ck --resume "" --dump-weights ck.w20.st \
    --save-at-end
check "resumed LoRA run = uninterrupted (bitwise)" -- cmp ck.w20.st llama.w20.st
# The checkpoint knows its base: the same shapes with other values are refused on resume.
hf make llama llama_other --seed 11 --config '{"vocab_size": 300}'
expect 1 "trained on another base model" -- "$DSC" train --model hf:llama_other \
    --config llama.json "${common[@]}" --max-steps 12 --out other.r --save-dir ck --resume ""

# Exports: the adapters for PEFT, the merged model for transformers.
expect 0 "" -- "$DSC" train --model hf:gpt2 --config gpt2.json "${common[@]}" --max-steps 5 \
    --out g5.r --save-dir gck --save-at-end --init-adapter gpt2.ad --dump-weights gpt2.w5.st
for m in llama:ck:ck.w20.st gpt2:gck:gpt2.w5.st; do
    IFS=: read -r name ck w <<<"$m"
    expect 0 "wrote $name.peft" -- "$DSC" ckpt export $ck --peft $name.peft
    expect 0 "wrote $name.merged" -- "$DSC" ckpt export $ck --hf $name.merged
    peft export $name $name.peft $name.merged $w >$name.exp
    read -r _ keys < <(grep '^keys' $name.exp)
    read -r _ tens < <(grep '^tensors' $name.exp)
    read -r _ lu lm < <(grep '^logits' $name.exp)
    echo "$name exports: PEFT keys exact $keys, tensors $tens, merged logits vs PEFT $lu (unmerged) $lm (merge_and_unload)"
    check "$name: PEFT loads the adapter with exactly its keys" -- test "$keys" = 1
    check "$name: the exported adapter is the trained state" -- within "$tens" 0
    check "$name: merged logits = PEFT's unmerged (1e-5)" -- within "$lu" 1e-5
    check "$name: merged logits = PEFT's merge_and_unload (1e-5)" -- within "$lm" 1e-5

    gen=(--tokenizer ids --prompt "84 104 101 32 112 114 111 103" --max-new-tokens 8
         --temperature 0)
    "$DSC" generate --model hf:$name.merged "${gen[@]}" --trace $name.m.trace >/dev/null 2>&1
    "$DSC" generate --model hf:$name --adapter $name.peft "${gen[@]}" --trace $name.a.trace \
        >/dev/null 2>&1
    "$DSC" generate --model hf:$name --adapter $name.peft --merge-adapter "${gen[@]}" \
        --trace $name.am.trace >/dev/null 2>&1
    "$DSC" generate --checkpoint $ck "${gen[@]}" --trace $name.c.trace >/dev/null 2>&1
    "$DSC" generate --checkpoint $ck --merge-adapter "${gen[@]}" --trace $name.cm.trace \
        >/dev/null 2>&1
    check "$name: generate --adapter --merge-adapter = the merged folder (bitwise)" -- cmp -s $name.am.trace $name.m.trace
    check "$name: generate --adapter (unmerged) = the merged folder: tokens, logits within 1e-5" -- \
        same_trace $name.a.trace $name.m.trace 1e-5
    check "$name: generate from the LoRA checkpoint = --adapter of its export (bitwise)" -- cmp -s $name.c.trace $name.a.trace
    check "$name: generate from the LoRA checkpoint, merged = the merged folder (bitwise)" -- cmp -s $name.cm.trace $name.m.trace
    read -r _ same worst < <(hf trace $name.merged $name.a.trace "84 104 101 32 112 114 111 103")
    echo "$name generate --adapter in transformers: greedy tokens equal ${same:-?}, worst logit error ${worst:-?}"
    check "$name: transformers' greedy tokens equal dsc's" -- test "${same:-0}" = 1
    check "$name: transformers' logits within 1e-5 of dsc's" -- within "${worst:-inf}" 1e-5
done

# The merged export and generation from a LoRA checkpoint read the base folder its
# adapter_config.json names: another base there (the same shapes, other values) is refused, naming
# the tensor, before anything is written.
mv llama llama.keep && cp -r llama_other llama
expect 1 "trained on another base model" -- "$DSC" ckpt export ck --hf swapped.merged
check "a refused merged export writes nothing" -- test ! -e swapped.merged/config.json -a \
    ! -e swapped.merged/model.safetensors
expect 1 "trained on another base model" -- "$DSC" generate --checkpoint ck --tokenizer ids \
    --prompt "84 104" --max-new-tokens 2 --temperature 0
rm -rf llama && mv llama.keep llama
expect 0 "wrote" -- "$DSC" ckpt export ck --hf restored.merged
check "the base back in place: the same merged folder as before" -- \
    cmp restored.merged/model.safetensors llama.merged/model.safetensors

# Dropout on the adapters' input.
head -c 4000 /usr/share/common-licenses/GPL-3 >val.txt
"$DSC" data prepare --input val.txt --tokenizer byte --out vdata --val-fraction 0.2 >/dev/null
drop() { # drop NAME P EXTRA-JSON LR
    "$py" -c "import json; c = json.load(open('llama.json')); c['lora']['lora_dropout'] = $2
c['optimizer']['params']['lr'] = $4; c.update(json.loads('{$3}')); json.dump(c, open('$1.json', 'w'))"
    "$DSC" train --model hf:llama --config $1.json --data vdata --seq-len 32 --sample-tokens 0 \
        --eval-every 3 --eval-batches 2 --device cpu --max-steps 3 --out $1.r \
        --dump-weights $1.st --init-adapter llama.ad >$1.log 2>&1
}
drop p0 0.0 "" 1e-3; drop p1 0.1 "" 1e-3; drop p1b 0.1 "" 1e-3
drop p1ac 0.1 '"activation_checkpointing": {}' 1e-3
drop z0 0.0 "" 0.0; drop z1 0.1 "" 0.0
first() { sed -n 's/^step *1\/[0-9]* | loss \([0-9.]*\) .*/\1/p' $1.log | head -1; }
vloss() { grep -m1 'validation loss' $1.log | sed 's/.*validation loss //'; }
echo "dropout: first loss $(first p0) (p 0) $(first p1) (p 0.1); validation at lr 0: $(vloss z0) $(vloss z1)"
check "dropout changes the training loss" -- test "$(first p0)" != "$(first p1)"
check "dropout: two runs bitwise the same" -- cmp -s p1.st p1b.st
check "dropout + activation checkpointing: the same masks (bitwise)" -- cmp -s p1.st p1ac.st
check "no dropout in evaluation" -- test -n "$(vloss z0)" -a "$(vloss z0)" = "$(vloss z1)"

# bf16 (the frozen base rounded to bf16 as the trainable weights are), ZeRO-2, accumulation, and
# fp16 with its loss scaler: the loss falls, the files hold the adapters only.
for prec in bf16 fp16; do
    "$py" -c "import json; c = json.load(open('llama.json')); c['$prec'] = {'enabled': True}
c['zero_optimization'] = {'stage': 2}; c['gradient_accumulation_steps'] = 2
c['train_micro_batch_size_per_gpu'] = 1; json.dump(c, open('$prec.json', 'w'))"
    "$DSC" train --model hf:llama --config $prec.json "${common[@]}" --max-steps 10 --out $prec.r \
        --init-adapter llama.ad --dump-weights $prec.st --save-dir $prec.ck --save-at-end \
        >$prec.log 2>&1
    l1=$(sed -n 's/^step *1\/[0-9]* | loss \([0-9.]*\) .*/\1/p' $prec.log)
    l10=$(sed -n 's/^step *10\/[0-9]* | loss \([0-9.]*\) .*/\1/p' $prec.log)
    echo "LoRA $prec, ZeRO-2, accumulation 2: loss $l1 -> $l10"
    check "LoRA in $prec: the loss falls" -- "$py" -c "import sys; sys.exit(not $l10 < $l1 - 0.1)"
    # the checksums were taken of the base as 16-bit training keeps it (rounded); the export
    # reads the fp32 folder and still knows it
    expect 0 "wrote $prec.merged" -- "$DSC" ckpt export $prec.ck --hf $prec.merged
done

# Refusals name what is wrong.
sed 's/"all-linear"/["q_prj"]/' llama.json >bad1.json
expect_fail_msg() { # name, message regex, command...
    local name=$1 re=$2
    shift 2
    "$@" >out.txt 2>&1
    local rc=$?
    check "$name: exit non-zero" -- test $rc -ne 0
    check "$name: says /$re/" -- grep -Eq "$re" out.txt
}
expect_fail_msg "unknown target module" 'q_prj.*q_proj' "$DSC" train --model hf:llama \
    --config bad1.json "${common[@]}" --max-steps 1 --out bad1.r
sed 's/"all-linear"/[]/' llama.json >bad6.json
expect_fail_msg "an empty target_modules (PEFT refuses it too)" 'lora\.target_modules is an empty list' \
    "$DSC" train --model hf:llama --config bad6.json "${common[@]}" --max-steps 1 --out bad6.r
sed 's/"r": 4,/"r": 4, "bias": "all",/' llama.json >bad2.json
expect_fail_msg "lora.bias all" 'lora\.bias' "$DSC" train --model hf:llama --config bad2.json \
    "${common[@]}" --max-steps 1 --out bad2.r
sed 's/"r": 4,/"r": 4, "use_dora": true,/' llama.json >bad3.json
expect_fail_msg "a PEFT option dsc lacks" 'lora\.use_dora' "$DSC" train --model hf:llama \
    --config bad3.json "${common[@]}" --max-steps 1 --out bad3.r
sed 's/"r": 4,/"r": 8,/' llama.json >bad4.json
expect_fail_msg "adapter of another rank" 'init-adapter.*r 4.*r 8' "$DSC" train --model hf:llama \
    --config bad4.json "${common[@]}" --max-steps 1 --out bad4.r --init-adapter llama.ad
sed 's/"target_modules": "all-linear", "modules_to_save": \["lm_head"\]/"target_modules": ["q_proj"]/' \
    llama.json >bad5.json
expect_fail_msg "adapter of other modules: both lists named" \
    'target_modules \[.*o_proj.*\] against the config.s \[q_proj\]; modules_to_save \[lm_head\] against the config.s \[\]' \
    "$DSC" train --model hf:llama --config bad5.json "${common[@]}" --max-steps 1 --out bad5.r \
    --init-adapter llama.ad
finish
