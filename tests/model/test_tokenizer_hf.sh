#!/usr/bin/env bash
# dsc's tokenizer.json tokenizer against Hugging Face's `tokenizers` library (0.19.1): for each of
# the byte-level BPE families GPT-2, Llama 3, Qwen2 and SmolLM2 (and GPT-2's with ByteLevel
# add_prefix_space true), a small tokenizer.json is trained here with that family's
# pre-tokenizer, normalizer, post-processor and special tokens
# (hf_tokenizer.py says how each is set), and on a corpus of over 5 MB (texts Debian ships: license
# texts, copyright files, Python sources; plus generated numbers, whitespace runs, CJK, Cyrillic,
# Arabic, Devanagari, Hangul, emoji, combining marks, contractions in all cases, special-token
# text) `dsc data prepare` must write exactly the ids of `tokenizers`' encode_batch, and
# `dsc data decode` exactly the text of its decode. GPT-2's published vocabulary in
# ../shared/data, converted to a tokenizer.json, is checked the same way when present.
# The oracle is installed by scripts/install-hf.sh; without it (no network) this test prints
# SKIP and passes.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
oracle=$src/tests/model/hf_tokenizer.py
source "$src/tests/cli/lib.sh"

install_log=$(bash "$src/scripts/install-hf.sh" 2>&1)
py=$(tail -n 1 <<<"$install_log")
if [ ! -x "$py" ]; then
  echo "$install_log"
  echo "SKIP: *** tokenizer.json exactness NOT TESTED: the tokenizers oracle could not be installed ***"
  finish
  exit 0
fi

check "corpus of at least 5 MB" -- "$py" "$oracle" corpus "$T/corpus" 5500000
docs=("$T"/corpus/doc-*.txt)
bytes=$(cat "${docs[@]}" | wc -c)
check "the corpus holds $bytes >= 5000000 bytes" -- test "$bytes" -ge 5000000

# family -> how dsc is told where the tokenizer is (folder or file).
same_ids() { # same_ids NAME TOKDIR SPEC
  local name=$1 dir=$2 spec=$3
  expect 0 "tokenizer $spec" -- "$DSC" data prepare --input "${docs[@]}" --tokenizer "$spec" \
    --out "$T/out-$name" --val-fraction 0 --threads 2
  check "$name: ids equal tokenizers' on the corpus" -- \
    "$py" "$oracle" compare "$dir" "$T/corpus" "$T/out-$name/train.bin"
  "$DSC" data decode --tokenizer "$spec" --shard "$T/out-$name/train.bin" >"$T/dec-$name.txt"
  check "$name: decoded text equals tokenizers' decode" -- \
    "$py" "$oracle" decode "$dir" "$T/out-$name/train.bin" "$T/dec-$name.txt"
}

for fam in gpt2 llama3 qwen2 smollm2 gpt2-prefix; do
  check "$fam: trained" -- "$py" "$oracle" train "$fam" "$T/corpus" "$T/tok-$fam"
  if [ "$fam" = qwen2 ]; then spec=$T/tok-$fam/tokenizer.json; else spec=hf:$T/tok-$fam; fi
  same_ids "$fam" "$T/tok-$fam" "$spec"
done
# Added tokens that take in the white space before (lstrip) or after (rstrip) them, as some
# models' special tokens do: Qwen2's tokenizer with <|im_start|> lstrip, <|im_end|> rstrip and
# <|endoftext|> both (the corpus has them between spaces, newlines and Unicode white space).
mkdir -p "$T/tok-qwen2-strip"
"$py" - "$T/tok-qwen2" "$T/tok-qwen2-strip" <<'PY'
import json, os, shutil, sys
src, dst = sys.argv[1], sys.argv[2]
shutil.copy(os.path.join(src, "tokenizer_config.json"), dst)
j = json.load(open(os.path.join(src, "tokenizer.json"), encoding="utf-8"))
for a in j["added_tokens"]:
    a["lstrip"] = a["content"] in ("<|im_start|>", "<|endoftext|>")
    a["rstrip"] = a["content"] in ("<|im_end|>", "<|endoftext|>")
json.dump(j, open(os.path.join(dst, "tokenizer.json"), "w", encoding="utf-8"), ensure_ascii=False)
PY
same_ids qwen2-strip "$T/tok-qwen2-strip" "hf:$T/tok-qwen2-strip"
# Llama 3's ids reach 128255: the shard must hold 32-bit tokens.
check "llama3: shard of 32-bit tokens (version 2)" -- \
  grep -q '"shard_version": 2' "$T/out-llama3/dataset.json"
# The thread count does not change the output.
expect 0 "" -- "$DSC" data prepare --input "${docs[@]}" --tokenizer "hf:$T/tok-qwen2" \
  --out "$T/out-qwen2-1" --val-fraction 0 --threads 1
check "qwen2: one thread writes the same shard as two" -- \
  cmp "$T/out-qwen2-1/train.bin" "$T/out-qwen2/train.bin"

gpt2=$src/../shared/data/gpt2-tokenizer
if [ -f "$gpt2/vocab.json" ]; then
  check "GPT-2's published vocabulary as tokenizer.json" -- \
    "$py" "$oracle" gpt2-files "$gpt2" "$T/tok-gpt2-real"
  same_ids gpt2-real "$T/tok-gpt2-real" "hf:$T/tok-gpt2-real"
else
  echo "note: $gpt2 absent; GPT-2's published vocabulary not checked"
fi

# A pattern outside the families' building blocks is refused, naming the alternative.
sed 's/\\\\p{N}{1,3}/\\\\p{Lu}+/' "$T/tok-llama3/tokenizer.json" >"$T/bad.json"
expect 1 'the alternative "\p{Lu}+" is not supported' -- "$DSC" data prepare \
  --input "${docs[0]}" --tokenizer "$T/bad.json" --out "$T/out-bad"
expect 1 "tokenizer.json" -- "$DSC" data prepare --input "${docs[0]}" \
  --tokenizer "hf:$T/nowhere" --out "$T/out-bad"
finish
