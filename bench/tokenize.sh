#!/usr/bin/env bash
# tokenize.sh - `dsc data prepare` throughput against Hugging Face `tokenizers` (0.19.1)
# encode_batch, same corpus, same tokenizer.json, same thread count, in one run.
#
#   bench/tokenize.sh [DSC_BINARY] [THREADS...]
#   FAMILIES="sp-llama2 gpt2" bench/tokenize.sh ...   only those tokenizers
#
# The corpus (5.5 MB: texts Debian ships plus generated numbers, whitespace, non-Latin scripts)
# and the tokenizer.json files (GPT-2, Llama 3, Qwen2, SmolLM2 formats, trained on it; GPT-2's
# published vocabulary when ../shared/data has it; the SentencePiece-style variants llama2,
# metaspace-first and gemma as sp-*) are made as tests/model/test_tokenizer_hf.sh and
# test_tokenizer_sp.sh make them. THREADS defaults to "1 N", N the number of cores. dsc: the
# whole command - reading the files, loading tokenizer.json, tokenizing, writing train.bin and
# dataset.json - timed from outside; tokenizers: encode_batch alone (RAYON_NUM_THREADS = the
# thread count), the tokenizer already loaded and the text already in memory. Best of $REPEAT
# (default 3) each. MB/s are of the corpus' bytes.
set -eu
DSC=${1:-${DSC:-build/dsc}}
shift || true
here=$(cd "$(dirname "$0")/.." && pwd)
REPEAT=${REPEAT:-3}
THREADS=${*:-1 $(nproc)}
[ -x "$DSC" ] || { echo "tokenize.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
py=$(bash "$here/scripts/install-hf.sh" | tail -n 1)
oracle=$here/tests/model/hf_tokenizer.py
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
"$py" "$oracle" corpus "$W/corpus" 5500000 >/dev/null
docs=("$W"/corpus/doc-*.txt)
bytes=$(cat "${docs[@]}" | wc -c)
fams="gpt2 llama3 qwen2 smollm2"
for f in $fams; do "$py" "$oracle" train "$f" "$W/corpus" "$W/tok-$f" >/dev/null; done
gpt2=$here/../shared/data/gpt2-tokenizer
if [ -f "$gpt2/vocab.json" ]; then
    "$py" "$oracle" gpt2-files "$gpt2" "$W/tok-gpt2-50k" >/dev/null
    fams="$fams gpt2-50k"
fi
"$py" "$oracle" sp "$W/corpus" "$W/sp" >/dev/null
for v in llama2 metaspace-first gemma; do ln -s "$W/sp/$v" "$W/tok-sp-$v"; done
fams=${FAMILIES:-"$fams sp-llama2 sp-metaspace-first sp-gemma"}

dsc_best() { # dsc_best FAMILY THREADS -> seconds
    local best="" t0 t1 s
    for _ in $(seq "$REPEAT"); do
        t0=$(date +%s.%N)
        "$DSC" data prepare --input "${docs[@]}" --tokenizer "hf:$W/tok-$1" --out "$W/out" \
            --val-fraction 0 --threads "$2" >/dev/null
        t1=$(date +%s.%N)
        s=$(echo "$t1 - $t0" | bc -l)
        if [ -z "$best" ] || [ "$(echo "$s < $best" | bc -l)" = 1 ]; then best=$s; fi
    done
    echo "$best"
}

echo "corpus: ${#docs[@]} documents, $bytes bytes; $(nproc) cores"
printf '%-10s %7s %14s %18s %7s\n' tokenizer threads "dsc MB/s" "tokenizers MB/s" ratio
for f in $fams; do
    for n in $THREADS; do
        s=$(dsc_best "$f" "$n")
        dmb=$(echo "$bytes / $s / 1000000" | bc -l)
        hmb=$(RAYON_NUM_THREADS=$n "$py" "$oracle" bench "$W/tok-$f" "$W/corpus" "$n" |
              cut -d' ' -f1)
        printf '%-10s %7d %14.2f %18.2f %6.2fx\n' "$f" "$n" "$dmb" "$hmb" \
            "$(echo "$dmb / $hmb" | bc -l)"
    done
done
