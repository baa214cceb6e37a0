#!/usr/bin/env bash
# dsc's SentencePiece-style tokenizer.json (Llama 2, Mistral, TinyLlama, Gemma) against Hugging
# Face's `tokenizers` library (0.19.1): one BPE vocabulary is trained here on the corpus of
# test_tokenizer_hf.sh (over 5 MB) as SentencePiece trains (pieces start at "▁"; Llama 2's id
# layout with <0x00>..<0xFF> at 3-258; a limited alphabet, so that CJK, emoji and rare letters
# need byte fallback), and written as each variant of hf_tokenizer.py's SP_VARIANTS: Prepend +
# Replace normalizers, the Metaspace pre-tokenizer with prepend_scheme first/always/never and
# split true/false, Gemma's Replace alone, unk_token with and without fuse_unk, and the decoders
# Replace, ByteFallback, Fuse, Strip and Metaspace. Short documents of edge cases join the corpus
# (leading and repeated spaces, newlines first, <s> and </s> in the text, "▁" and "<0x41>" as
# text, emoji, CJK, control bytes). `dsc data prepare` must write exactly the ids of
# `tokenizers`' encode_batch and `dsc data decode` exactly the text of its decode. The same
# vocabulary with merges written as pairs gives the same ids; other models are refused by name.
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
  echo "SKIP: *** SentencePiece-style tokenizer.json NOT TESTED: the tokenizers oracle could not be installed ***"
  finish
  exit 0
fi

check "corpus of at least 5 MB" -- "$py" "$oracle" corpus "$T/corpus" 5500000
check "SentencePiece-style variants trained" -- "$py" "$oracle" sp "$T/corpus" "$T/tok"
check "edge-case documents" -- "$py" "$oracle" edge-docs "$T/corpus"
docs=("$T"/corpus/doc-*.txt)
bytes=$(cat "${docs[@]}" | wc -c)
check "the corpus holds $bytes >= 5000000 bytes" -- test "$bytes" -ge 5000000

same_ids() { # same_ids NAME TOKDIR
  local name=$1 dir=$2
  expect 0 "tokenizer hf:$dir" -- "$DSC" data prepare --input "${docs[@]}" --tokenizer "hf:$dir" \
    --out "$T/out-$name" --val-fraction 0 --threads 2
  check "$name: ids equal tokenizers' on the corpus" -- \
    "$py" "$oracle" compare "$dir" "$T/corpus" "$T/out-$name/train.bin"
  "$DSC" data decode --tokenizer "hf:$dir" --shard "$T/out-$name/train.bin" >"$T/dec-$name.txt"
  check "$name: decoded text equals tokenizers' decode" -- \
    "$py" "$oracle" decode "$dir" "$T/out-$name/train.bin" "$T/dec-$name.txt"
}

for v in llama2 metaspace-first metaspace-split metaspace-never gemma unk-fused unk-unfused; do
  same_ids "$v" "$T/tok/$v"
done

# Merges as ["left", "right"] pairs (as tokenizers 0.20 and later write them): the same ids.
mkdir -p "$T/tok/pairs"
cp "$T/tok/llama2/tokenizer_config.json" "$T/tok/pairs/"
"$py" - "$T/tok/llama2/tokenizer.json" "$T/tok/pairs/tokenizer.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1], encoding="utf-8"))
j["model"]["merges"] = [m.split(" ") for m in j["model"]["merges"]]
json.dump(j, open(sys.argv[2], "w", encoding="utf-8"), ensure_ascii=False)
PY
expect 0 "" -- "$DSC" data prepare --input "${docs[@]}" --tokenizer "hf:$T/tok/pairs" \
  --out "$T/out-pairs" --val-fraction 0 --threads 2
check "merges as pairs: the same shard as merges as strings" -- \
  cmp "$T/out-pairs/train.bin" "$T/out-llama2/train.bin"

# What is not read is refused, naming the component and what works.
sed 's/"type": "BPE"/"type": "Unigram"/' "$T/tok/llama2/tokenizer.json" >"$T/unigram.json"
expect 1 'model.type "Unigram" is not supported; dsc reads BPE models' -- "$DSC" data prepare \
  --input "${docs[0]}" --tokenizer "$T/unigram.json" --out "$T/out-bad"
sed 's/"type": "Fuse"/"type": "CTC"/' "$T/tok/llama2/tokenizer.json" >"$T/ctc.json"
expect 1 'decoder "CTC" is not supported' -- "$DSC" data prepare \
  --input "${docs[0]}" --tokenizer "$T/ctc.json" --out "$T/out-bad"
finish
