#!/usr/bin/env bash
# What a new user hit (issue 36, item 5), each checked as they met it:
#   - `--model DIR` (a Hugging Face folder without hf:) names the fix, in train as in generate;
#   - `dsc config keys --bogus` is a usage error (exit 2), not a silent success;
#   - docs/cli.md documents every flag `dsc train --help` lists (--save-dir, --resume,
#     --save-at-end, --restart-positions were missing);
#   - a missing tokenizer file says it cannot be opened, without "(line -1)";
#   - `--tokenizer DIR` of a folder holding a tokenizer suggests hf:DIR (or gpt2:DIR);
#   - "checkpoint ... validated: validation loss X" prints the number of the validation line just
#     before it, in fp32, bf16 and fp16.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$T"

# A folder with a config.json, given as --model without hf:.
mkdir -p folder
printf '{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4}\n' \
    >folder/config.json
expect 1 "give a Hugging Face model folder as hf:folder" -- "$DSC" train --model folder \
    --max-steps 1 --device cpu
expect 2 "hf:DIR" -- "$DSC" generate --model folder --prompt x
expect 1 "or hf:DIR (a Hugging Face model folder)" -- "$DSC" train --model nosuchmodel \
    --max-steps 1 --device cpu

# dsc config keys takes nothing.
expect 2 "unknown flag '--bogus'" -- "$DSC" config keys --bogus
expect 2 "unexpected argument 'x'" -- "$DSC" config keys x
expect 0 "train_micro_batch_size_per_gpu" -- "$DSC" config keys
expect 0 "usage: dsc config keys" -- "$DSC" config keys --help

# Every flag of dsc train --help is in docs/cli.md's table.
missing=""
for f in $("$DSC" train --help | grep -oE '^  --[a-z0-9-]+' | grep -v -- '--help'); do
    grep -q -- "| \`$f" "$src/docs/cli.md" || missing="$missing $f"
done
check "docs/cli.md documents every dsc train flag (missing:${missing:- none})" -- \
    test -z "$missing"

# Tokenizer files: missing, unparsable, and folders given without their prefix.
echo "some text to tokenize" >in.txt
expect 1 "cannot open nothere/tokenizer.json: No such file or directory" -- \
    "$DSC" data prepare --input in.txt --tokenizer hf:nothere --out d1
out=$("$DSC" data prepare --input in.txt --tokenizer hf:nothere --out d1 2>&1)
check "a missing tokenizer file is not reported at line -1" -- \
    bash -c "! grep -q 'line -1' <<<'$out'"
printf '{"model": ' >broken.json
expect 1 "broken.json:1:" -- "$DSC" data prepare --input in.txt --tokenizer broken.json --out d2
mkdir -p llama gpt && printf '{}' >llama/tokenizer.json && printf '{}' >gpt/vocab.json
expect 1 'tokenizer "llama" is a folder holding tokenizer.json: give it as "hf:llama"' -- \
    "$DSC" data prepare --input in.txt --tokenizer llama --out d3
expect 1 'give it as "gpt2:gpt"' -- "$DSC" data prepare --input in.txt --tokenizer gpt --out d4
expect 1 'tokenizer "nofolder": unknown' -- \
    "$DSC" data prepare --input in.txt --tokenizer nofolder --out d5

# The checkpoint's validation loss is the one printed for the same step just before it.
"$DSC" data prepare --input /usr/share/common-licenses/GPL-3 --tokenizer byte --out data \
    --val-fraction 0.1 >/dev/null
for prec in fp32 bf16 fp16; do
    extra=""
    [ $prec = bf16 ] && extra=', "bf16": {"enabled": true}'
    [ $prec = fp16 ] && extra=', "fp16": {"enabled": true}'
    printf '{"train_micro_batch_size_per_gpu": 2, "checkpoint": {"async": false}%s}\n' \
        "$extra" >$prec.json
    "$DSC" train --model d2 --data data --config $prec.json --seq-len 32 --device cpu \
        --max-steps 3 --save-dir ck.$prec --save-at-end --sample-tokens 0 >$prec.log 2>&1
    step=$(grep -oE 'step +3 \| validation loss [0-9.]+' $prec.log | grep -oE '[0-9.]+$')
    ckpt=$(grep -oE 'validated: validation loss [0-9.]+' $prec.log | grep -oE '[0-9.]+$')
    echo "$prec: step line ${step:-?}, checkpoint line ${ckpt:-?}"
    check "$prec: the checkpoint line's validation loss is the step line's" -- \
        test -n "$step" -a "$step" = "$ckpt"
done
finish
