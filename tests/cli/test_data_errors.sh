#!/usr/bin/env bash
# Bad data set metadata gets a clear error: `dsc data prepare` of inputs without text writes
# nothing and fails; a dataset.json vocab_size outside 1..2^31-1 (or not a whole number) is refused
# by name instead of being narrowed to 32 bits (2^32 + 256 used to pass as 256).
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=2
small=(--model d2 --seq-len 32 --sample-tokens 0 --max-steps 1)

: > "$T/empty.txt"
expect 1 "holds no text" -- "$DSC" data prepare --input "$T/empty.txt" --out "$T/p0"
expect 1 "$T/empty.txt and the others" -- \
  "$DSC" data prepare --input "$T/empty.txt" "$T/empty.txt" --tokenizer byte --out "$T/p1"
check "nothing written for empty input" -- test ! -e "$T/p0/dataset.json" -a ! -e "$T/p0/train.bin"
# An empty document among others is fine (and its empty token list is not copied).
printf 'some text here\n' > "$T/a.txt"
expect 0 "2 document(s)" -- "$DSC" data prepare --input "$T/empty.txt" "$T/a.txt" --out "$T/p2"

# A byte-level data set; its dataset.json is then edited.
printf 'the quick brown fox jumps over the lazy dog %d\n' $(seq 1 400) > "$T/text.txt"
expect 0 "data prepare" -- "$DSC" data prepare --input "$T/text.txt" --out "$T/d"
expect 0 "train loss" -- "$DSC" train --data "$T/d" "${small[@]}" --out "$T/r0"
vocab() { # vocab VALUE: dataset.json with vocab_size VALUE, the rest as prepared
  /usr/bin/python3 - "$T/d/dataset.json" "$1" <<'PYEOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["vocab_size"] = json.loads(sys.argv[2])
json.dump(j, open(sys.argv[1], "w"))
PYEOF
}
for v in 1099511627776 4294967552 2147483648 0 -1 '"256"' 256.0; do
  vocab "$v"
  expect 1 "dataset.json: vocab_size" -- "$DSC" train --data "$T/d" "${small[@]}" --out "$T/r$v"
done
vocab 4294967552
expect 1 "vocab_size 4294967552 is out of range" -- "$DSC" train --data "$T/d" "${small[@]}" --out "$T/r1"
vocab 256
expect 0 "train loss" -- "$DSC" train --data "$T/d" "${small[@]}" --out "$T/r2"

# A UTF-8 byte-order mark before line 1 of a JSONL file is skipped (Python's utf-8-sig); one
# later in the file is still an error naming the line.
printf '\xef\xbb\xbf{"text": "one line of text"}\n{"text": "another line of text"}\n' > "$T/bom.jsonl"
expect 0 "2 example(s)" -- "$DSC" data prepare --input "$T/bom.jsonl" --out "$T/pb"
printf '{"text": "one"}\n\xef\xbb\xbf{"text": "two"}\n' > "$T/bom2.jsonl"
expect 1 "bom2.jsonl:2: not valid JSON" -- "$DSC" data prepare --input "$T/bom2.jsonl" --out "$T/pb2"
finish
