#!/usr/bin/env bash
# The tokenizer travels with the run: `dsc train` on data prepared with a tokenizer.json attaches
# that tokenizer to its checkpoints, and `dsc generate --checkpoint DIR` finds it there
# (the original files removed), without --tokenizer. The tokenizer.json is a small byte-level BPE
# written here (GPT-2's byte alphabet, a few merges, <|endoftext|>), so no oracle is needed.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
source "$(dirname "$0")/lib.sh"

/usr/bin/python3 - "$T/tok" <<'PY'
import json, os, sys
out = sys.argv[1]
os.makedirs(out)
keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
cp = {b: (b if b in keep else 256 + sum(1 for x in range(b) if x not in keep)) for b in range(256)}
vocab = {chr(cp[b]): b for b in range(256)}
merges = ["t h", "th e", "Ġ th", "Ġth e", "a n", "Ġ a", "i n", "e r", "o n", "r e"]
for m in merges:
    vocab.setdefault(m.replace(" ", ""), len(vocab))
eot = len(vocab)
tok = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [{"id": eot, "content": "<|endoftext|>", "single_word": False,
                         "lstrip": False, "rstrip": False, "normalized": False, "special": True}],
       "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                         "use_regex": True},
       "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                          "use_regex": True},
       "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                   "use_regex": True},
       "model": {"type": "BPE", "dropout": None, "unk_token": None,
                 "continuing_subword_prefix": None, "end_of_word_suffix": None,
                 "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": merges}}
json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
json.dump({"eos_token": "<|endoftext|>"}, open(os.path.join(out, "tokenizer_config.json"), "w"))
PY
for i in $(seq 200); do
  echo "the cat sat on the mat. a dog ran in the park and there the birds sing."
done > "$T/corpus.txt"
expect 0 "vocab 267" -- "$DSC" data prepare --input "$T/corpus.txt" --tokenizer "hf:$T/tok" \
  --out "$T/data"
check "train d1 on it, saving checkpoints" -- "$DSC" train --data "$T/data" --model d1 \
  --seq-len 32 --max-steps 4 --eval-every 0 --sample-tokens 0 --threads 1 \
  --save-dir "$T/ck" --save-at-end --out "$T/run"
tag=$(cat "$T/ck/latest")
check "the checkpoint holds the tokenizer" -- \
  cmp "$T/tok/tokenizer.json" "$T/ck/$tag/tokenizer.json"
check "... and its tokenizer_config.json" -- \
  cmp "$T/tok/tokenizer_config.json" "$T/ck/$tag/tokenizer_config.json"
expect 0 "tokenizer.json tokenizer_config.json" -- "$DSC" ckpt info "$T/ck"
mv "$T/tok" "$T/tok-gone"
expect 0 "the" -- "$DSC" generate --checkpoint "$T/ck" --prompt "the" --max-new-tokens 4 \
  --temperature 0
expect 0 "the" -- "$DSC" generate --checkpoint "$T/ck/$tag" --prompt "the" --max-new-tokens 4 \
  --temperature 0
# The weights alone (an export to one file) carry no tokenizer: generate says what to give.
expect 0 "wrote" -- "$DSC" ckpt export "$T/ck" --out "$T/w.safetensors"
expect 1 "holds no tokenizer" -- "$DSC" generate --weights "$T/w.safetensors" \
  --prompt "the" --max-new-tokens 4

# GPT-2's vocab.json + merges.txt travel the same way (when ../shared/data has them).
gpt2=${DSC_SOURCE_DIR:-$(dirname "$0")/../..}/../shared/data/gpt2-tokenizer
if [ -f "$gpt2/vocab.json" ]; then
  cp -r "$gpt2" "$T/g2"
  expect 0 "tokenizer gpt2:" -- "$DSC" data prepare --input "$T/corpus.txt" \
    --tokenizer "gpt2:$T/g2" --out "$T/data-g2"
  check "train d1 on GPT-2 tokens" -- "$DSC" train --data "$T/data-g2" --model d1 --seq-len 32 \
    --max-steps 2 --eval-every 0 --sample-tokens 0 --threads 1 --save-dir "$T/ck-g2" \
    --save-at-end --out "$T/run-g2"
  check "the checkpoint holds GPT-2's merges.txt" -- \
    cmp "$T/g2/merges.txt" "$T/ck-g2/$(cat "$T/ck-g2/latest")/merges.txt"
  rm -r "$T/g2"
  expect 0 "the" -- "$DSC" generate --checkpoint "$T/ck-g2" --prompt "the" --max-new-tokens 3
else
  echo "note: $gpt2 absent; GPT-2's files in a checkpoint not checked"
fi
finish
