#!/usr/bin/env bash
# config.json in the transformers 4.x and 5.x spellings (issue 36, item 1): the same model either
# way. For each family and rope type (GPT-2; Llama with the default, linear and llama3 rotary
# embeddings; Qwen2 and Mistral with a RoPE base of 1e6, which a reader that missed
# rope_parameters would replace by 10000), transformers makes a tiny folder in its own spelling
# and tests/model/hf_spelling.py rewrites its config.json in the other one. Then:
#   - `dsc train --dump-grads`: the first step's loss and every gradient are the same in both
#     spellings (bitwise), and equal transformers' (loss 1e-5, gradients 1e-4);
#   - `dsc generate --trace`: the same greedy tokens and logits in both spellings, and
#     transformers' logits within 1e-5;
#   - `dsc ckpt export --hf` (fp32 and bf16): the config.json holds both spellings, says the
#     exported dtype in torch_dtype and dtype, and transformers loads it with dsc's logits;
#   - a file whose spellings disagree, and 5.x fields with values dsc does not compute, are
#     refused naming the field.
# The oracle is the suite's venv (transformers 4.44.2, scripts/install-hf.sh; SKIP when it cannot
# be made). DSC_HF_PYTHON=python runs the same checks with another transformers, e.g. 5.x, whose
# folders are then the 5.x spelling and the 4.x one is the rewrite.
set -uo pipefail
src=${DSC_SOURCE_DIR:?}
source "$src/tests/cli/lib.sh"
if [ -n "${DSC_HF_PYTHON:-}" ]; then
    py=$DSC_HF_PYTHON
else
    py=$(bash "$src/scripts/install-hf.sh" | tail -1) || exit 77
fi
[ -x "$(command -v "$py")" ] || exit 77
ref() { "$py" "$src/tests/model/hf_ref.py" "$@" 2>/dev/null; }
within() { "$py" -c "import sys; sys.exit(not float('$1') <= $2)"; }
major=$("$py" -c 'import transformers; print(transformers.__version__.split(".")[0])')
native=v4 other=v5
[ "$major" -ge 5 ] && native=v5 other=v4
echo "transformers $("$py" -c 'import transformers; print(transformers.__version__)'): its own" \
     "folders are the $native spelling, the rewrites $other"

# Two dumps of --dump-grads hold the same tensors and loss, bit for bit.
same_dump() {
    "$py" - "$1" "$2" <<'PYEOF'
import sys
from safetensors import safe_open
def read(p):
    with safe_open(p, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, (f.metadata() or {}).get("loss")
(a, la), (b, lb) = read(sys.argv[1]), read(sys.argv[2])
bad = [k for k in a if k not in b or not a[k].equal(b[k])]
sys.exit(1 if bad or la != lb or set(a) != set(b) else 0)
PYEOF
}

cd "$T"
"$DSC" data prepare --input /usr/share/common-licenses/GPL-3 --tokenizer byte --out data >/dev/null
cat >cfg.json <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "checkpoint": {"async": false}}
JSON
common=(--config cfg.json --seq-len 32 --sample-tokens 0 --eval-every 0 --device cpu)
prompt="84 104 101 32 112 114 111 103"

llama3='"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 16}'
ref make gpt2 gpt2.$native --seed 1
ref make llama llama.$native --seed 2 --config '{"rope_theta": 500000.0}'
ref make llama linear.$native --seed 3 --config \
    '{"rope_scaling": {"rope_type": "linear", "factor": 4.0}}'
ref make llama llama3.$native --seed 4 --config "{\"rope_theta\": 500000.0, $llama3}"
ref make qwen2 qwen2.$native --seed 5 --config '{"rope_theta": 1000000.0}'
ref make mistral mistral.$native --seed 6 --config '{"rope_theta": 1000000.0}'
models=(gpt2 llama linear llama3 qwen2 mistral)
for m in "${models[@]}"; do
    "$py" "$src/tests/model/hf_spelling.py" $other $m.$native $m.$other
done
check "transformers wrote the folders" -- test -f mistral.$native/model.safetensors
check "the 5.x spelling has rope_parameters and dtype, not rope_theta" -- "$py" -c "
import json, sys
c = json.load(open('qwen2.v5/config.json'))
sys.exit(not ('rope_parameters' in c and 'dtype' in c and 'layer_types' in c
              and 'rope_theta' not in c and 'torch_dtype' not in c))"
check "the 4.x spelling has rope_theta and torch_dtype, not rope_parameters" -- "$py" -c "
import json, sys
c = json.load(open('qwen2.v4/config.json'))
sys.exit(not ('rope_theta' in c and 'torch_dtype' in c and 'rope_parameters' not in c))"

for m in "${models[@]}"; do
    for s in v4 v5; do
        expect 0 "train loss" -- "$DSC" train --model hf:$m.$s --data data "${common[@]}" \
            --max-steps 1 --out $m.$s.run --dump-grads $m.$s.st
        "$DSC" generate --model hf:$m.$s --tokenizer ids --prompt "$prompt" --max-new-tokens 6 \
            --temperature 0 --trace $m.$s.trace >/dev/null 2>&1
    done
    check "$m: first step (loss, every gradient) the same in both spellings" -- \
        same_dump $m.v4.st $m.v5.st
    check "$m: generation (tokens, logits) the same in both spellings" -- \
        cmp -s $m.v4.trace $m.v5.trace
    ref grads $m.$native $m.$native.st >$m.cmp
    read -r _ dl hl lrel < <(grep '^loss' $m.cmp)
    read -r _ gworst gwhere < <(grep '^grads' $m.cmp)
    read -r _ same worst < <(ref trace $m.$native $m.$native.trace "$prompt")
    echo "$m: loss dsc ${dl:-?} transformers ${hl:-?} (rel ${lrel:-?}); worst gradient" \
         "${gworst:-?} (${gwhere:-?}); greedy tokens equal ${same:-?}, worst logit ${worst:-?}"
    check "$m: loss within 1e-5 of transformers'" -- within "${lrel:-inf}" 1e-5
    check "$m: gradients within 1e-4 of transformers'" -- within "${gworst:-inf}" 1e-4
    check "$m: transformers' greedy tokens equal dsc's" -- test "${same:-0}" = 1
    check "$m: logits within 1e-5 of transformers'" -- within "${worst:-inf}" 1e-5
done

# The fixtures can tell the RoPE base: without rope_parameters' 1e6, Qwen2 is another model.
mkdir -p qwen2.base && cp qwen2.v5/model.safetensors qwen2.base/
"$py" -c "
import json
c = json.load(open('qwen2.v5/config.json'))
del c['rope_parameters']['rope_theta']
json.dump(c, open('qwen2.base/config.json', 'w'))"
expect 0 "train loss" -- "$DSC" train --model hf:qwen2.base --data data "${common[@]}" \
    --max-steps 1 --out base.run --dump-grads base.st
if same_dump qwen2.v5.st base.st; then
    echo "FAIL: qwen2 with the default RoPE base trains the same step"; failed=$((failed + 1))
else
    pass=$((pass + 1))
fi

# Export: both spellings in the config.json, the dtype said in both, loaded by transformers.
for m in llama3 qwen2; do
    expect 0 "train loss" -- "$DSC" train --model hf:$m.$other --data data "${common[@]}" \
        --max-steps 2 --out $m.ex.run --save-dir $m.ck --save-at-end
    expect 0 "wrote $m.f32" -- "$DSC" ckpt export $m.ck --hf $m.f32
    expect 0 "wrote $m.b16" -- "$DSC" ckpt export $m.ck --hf $m.b16 --dtype bf16
    check "$m: the exported config.json has both spellings" -- "$py" -c "
import json, sys
c = json.load(open('$m.f32/config.json'))
need = ['rope_theta', 'rope_scaling', 'rope_parameters', 'torch_dtype', 'dtype']
sys.exit(not (all(k in c for k in need) and c['dtype'] == c['torch_dtype'] == 'float32'
              and c['rope_parameters']['rope_theta'] == c['rope_theta']))"
    check "$m: a bf16 export says bfloat16 (torch_dtype and dtype)" -- "$py" -c "
import json, sys
c = json.load(open('$m.b16/config.json'))
sys.exit(not c['dtype'] == c['torch_dtype'] == 'bfloat16')"
    read -r info < <(ref info $m.b16)
    echo "$m bf16 export in transformers: $info"
    check "$m: transformers reads the bf16 export's dtype" -- grep -q "dtype bfloat16" <<<"$info"
    "$DSC" generate --checkpoint $m.ck --tokenizer ids --prompt "$prompt" --max-new-tokens 6 \
        --temperature 0 --trace $m.ck.trace >/dev/null 2>&1
    read -r _ same worst < <(ref trace $m.f32 $m.ck.trace "$prompt")
    echo "$m fp32 export in transformers: greedy tokens equal ${same:-?}, worst logit ${worst:-?}"
    check "$m: transformers loads the fp32 export with dsc's logits (1e-5)" -- \
        within "${worst:-inf}" 1e-5
    "$DSC" generate --model hf:$m.b16 --tokenizer ids --prompt "$prompt" --max-new-tokens 6 \
        --temperature 0 --trace $m.b16.trace >/dev/null 2>&1
    read -r _ same worst < <(ref trace $m.b16 $m.b16.trace "$prompt")
    echo "$m bf16 export in transformers: greedy tokens equal ${same:-?}, worst logit ${worst:-?}"
    check "$m: transformers loads the bf16 export with dsc's logits (1e-5)" -- \
        within "${worst:-inf}" 1e-5
done

# Refusals, naming the field: disagreeing spellings, and 5.x values dsc does not compute.
refused() { # name, base folder, field edit (python on dict c), expected text
    mkdir -p "bad.$1" && cp "$2"/model.safetensors "bad.$1/"
    "$py" -c "import json; c = json.load(open('$2/config.json')); $3;
json.dump(c, open('bad.$1/config.json', 'w'))"
    expect 1 "$4" -- "$DSC" train --model hf:bad.$1 --data data "${common[@]}" --max-steps 1 \
        --out bad.$1.r
}
refused theta qwen2.v5 "c['rope_theta'] = 10000.0" "rope_parameters.rope_theta is 1e+06"
refused scaling linear.v5 "c['rope_scaling'] = {'rope_type': 'linear', 'factor': 2.0}" \
    'rope_parameters says rope_type "linear" factor 4'
refused dtype qwen2.v5 "c['dtype'] = 'bfloat16'; c['torch_dtype'] = 'float32'" \
    'torch_dtype is "float32" but dtype is "bfloat16"'
refused yarn llama.v5 "c['rope_parameters'] = {'rope_type': 'yarn', 'factor': 4.0,
'rope_theta': 500000.0, 'original_max_position_embeddings': 16}" 'rope_type "yarn"'
refused dynamic llama.v5 "c['rope_parameters'] = {'rope_type': 'dynamic', 'factor': 2.0,
'rope_theta': 500000.0}" 'rope_type "dynamic"'
refused partial llama.v5 "c['rope_parameters']['partial_rotary_factor'] = 0.5" \
    "partial_rotary_factor 0.5"
win="c['use_sliding_window'] = True; c['sliding_window'] = 16"
refused window qwen2.v5 "$win; c['max_window_layers'] = 1;
c['layer_types'] = ['full_attention', 'sliding_attention']" \
    "sliding_window 16 (context 64, on 1 of 2 layers)"
refused types qwen2.v5 "$win; c['max_window_layers'] = 2;
c['layer_types'] = ['full_attention', 'sliding_attention']" \
    "max_window_layers 2 makes layer 1 attend to everything"
refused mwindow mistral.v5 "c['sliding_window'] = 16" "sliding_window 16"
refused chunked llama.v5 "c['layer_types'] = ['full_attention', 'chunked_attention']" \
    'layer_types[1] is "chunked_attention"'
refused dropout mistral.v5 "c['attention_dropout'] = 0.1" "attention_dropout 0.1"
finish
