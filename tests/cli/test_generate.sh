#!/usr/bin/env bash
# dsc generate on a small trained checkpoint: the key/value cache gives the tokens recomputation
# gives, checkpoint and exported weights agree, batches equal single prompts, seeds reproduce,
# --stop cuts, bad input is a clear error, and tensor parallelism over 2 real ranks equals 1.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=/usr/bin/python3
export OMP_NUM_THREADS=1 DSC_DATA_HOME="$T/home"

# A small corpus with structure that a d2 model learns in a few dozen steps, so that greedy
# continuations are varied text rather than one repeated byte.
for i in $(seq 1 300); do
  echo "the cat sat on the mat. a dog ran to the park. birds sing in the tall green trees."
  echo "one two three four five six seven eight nine ten. red blue green yellow black white."
done > "$T/corpus.txt"
"$DSC" data prepare --input "$T/corpus.txt" --tokenizer byte --out "$T/data" > /dev/null
check "train d2 (2 heads) for the checkpoint" -- "$DSC" train --data "$T/data" --model d2 \
  --seq-len 48 --max-steps 80 --eval-every 0 --sample-tokens 24 --prompt "the cat" \
  --save-dir "$T/ck" --save-at-end --out "$T/run" > "$T/train.log" 2>&1
check "  ... its closing sample comes from dsc_generate" -- grep -q "^sample (" "$T/train.log"
expect 0 "wrote" -- "$DSC" ckpt export "$T/ck" --out "$T/w.safetensors"

G=("$DSC" generate --checkpoint "$T/ck" --temperature 0 --max-new-tokens 30)
printf 'the cat\none two three\nbirds sing\nred blue\n' > "$T/prompts.txt"
"${G[@]}" --prompt-file "$T/prompts.txt" > "$T/cached.txt" 2> "$T/cached.err"
"${G[@]}" --prompt-file "$T/prompts.txt" --no-kv-cache > "$T/nocache.txt" 2>/dev/null
check "greedy: 4 prompts, 120 tokens" -- grep -q "generated 120 tokens for 4 prompt(s)" "$T/cached.err"
check "greedy with the cache == without it, token for token" -- cmp -s "$T/cached.txt" "$T/nocache.txt"
check "  ... and the text is not one repeated byte" -- \
  $PY -c "import sys; t = open(sys.argv[1]).read(); assert len(set(t)) > 12, t" "$T/cached.txt"
"$DSC" generate --weights "$T/w.safetensors" --temperature 0 --max-new-tokens 30 \
  --prompt-file "$T/prompts.txt" > "$T/weights.txt" 2>/dev/null
check "--weights (exported) == --checkpoint" -- cmp -s "$T/cached.txt" "$T/weights.txt"
"${G[@]}" --prompt "one two three" > "$T/single.txt" 2>/dev/null
check "a prompt alone == the same prompt in the batch" -- \
  bash -c "sed -n '4p' '$T/cached.txt' | cmp -s - '$T/single.txt'"

# --tokenizer ids: the same model fed the bytes of "the cat" as numbers continues with the same
# bytes as numbers; --trace records each choice with the two most likely tokens
"${G[@]}" --prompt "the cat" --trace "$T/trace.jsonl" > "$T/text.txt" 2>/dev/null
"${G[@]}" --tokenizer ids --prompt "116 104 101 32 99 97 116" > "$T/ids.txt" 2>/dev/null
check "--tokenizer ids == the byte tokenizer, as numbers" -- $PY - "$T/text.txt" "$T/ids.txt" <<'PYEOF'
import sys
text = open(sys.argv[1], 'rb').read().rstrip(b'\n')
ids = [int(x) for x in open(sys.argv[2]).read().split()]
assert bytes(ids) == text, (bytes(ids), text)
PYEOF
check "--trace: one line per token, the greedy choice is the top logit" -- $PY - "$T/trace.jsonl" "$T/ids.txt" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ids = [int(x) for x in open(sys.argv[2]).read().split()][7:]
assert [r["token"] for r in rows] == ids and [r["step"] for r in rows] == list(range(30)), rows
assert all(r["top"][0][0] == r["token"] and r["top"][0][1] >= r["top"][1][1] for r in rows)
PYEOF
expect 1 "not a token id below 256" -- "${G[@]}" --tokenizer ids --prompt "116 300"

S=("$DSC" generate --checkpoint "$T/ck" --prompt "the " --max-new-tokens 60 --temperature 1.0 --top-k 0)
"${S[@]}" --seed 5 > "$T/s5a.txt" 2>/dev/null
"${S[@]}" --seed 5 > "$T/s5b.txt" 2>/dev/null
"${S[@]}" --seed 6 > "$T/s6.txt" 2>/dev/null
check "sampling: the same seed gives the same text" -- cmp -s "$T/s5a.txt" "$T/s5b.txt"
check "  ... another seed another text" -- bash -c "! cmp -s '$T/s5a.txt' '$T/s6.txt'"
expect 0 "" -- "$DSC" generate --checkpoint "$T/ck" --prompt "the " --top-p 0.5 --top-k 5 --seed 3
"$DSC" generate --checkpoint "$T/ck" --prompt "the cat" --temperature 0 --max-new-tokens 200 \
  --stop "park" > "$T/stop.txt" 2>/dev/null
check "--stop ends the text before the stop string" -- \
  $PY -c "import sys; t = open(sys.argv[1]).read(); assert 'park' not in t and len(t) < 120, t" "$T/stop.txt"

# bad input
expect 2 "exactly one of --checkpoint" -- "$DSC" generate --prompt hi
expect 2 "exactly one of --prompt" -- "$DSC" generate --checkpoint "$T/ck"
# --device cuda: generates where a GPU is usable (tests/gpu/test_generate_gpu.sh compares it),
# else a clear error naming the flag and the way out
cuda_or_clear_error() {
  local out rc=0
  out=$("$DSC" generate --checkpoint "$T/ck" --prompt hi --device cuda --max-new-tokens 4 2>&1) || rc=$?
  [ $rc -eq 0 ] && return 0
  [ $rc -eq 1 ] && grep -qF -- "--device cuda:" <<<"$out" && grep -qF -- "--device cpu" <<<"$out" && return 0
  echo "$out"; return 1
}
check "--device cuda runs, or says why not" -- cuda_or_clear_error
expect 2 "--tp splits the model" -- "$DSC" generate --checkpoint "$T/ck" --prompt hi --device cuda --tp 2
expect 2 "--top-p must be" -- "$DSC" generate --checkpoint "$T/ck" --prompt hi --top-p 0
expect 1 "cannot open" -- "$DSC" generate --checkpoint "$T/ck" --prompt-file "$T/none.txt"
expect 1 "" -- "$DSC" generate --weights "$T/none.safetensors" --prompt hi
expect 1 "shorten the prompt" -- "$DSC" generate --checkpoint "$T/ck" \
  --prompt "$(printf 'x%.0s' $(seq 1 60))"
# past the context (seq-len 48): it stops there, and says so
expect 0 "the model's context of 48 tokens is full (prompt 7 + 41)" -- "$DSC" generate \
  --checkpoint "$T/ck" --prompt "the cat" --temperature 0 --max-new-tokens 100
expect 1 "\"byte\" or \"gpt2:DIR\"" -- "$DSC" generate --checkpoint "$T/ck" --prompt hi --tokenizer nope
$PY - "$T/w.safetensors" "$T/bad.safetensors" <<'PYEOF'
# the exported weights with h.1.mlp.c_fc.weight cut to the wrong shape
import json, struct, sys
raw = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
head = json.loads(raw[8:8 + n]); data = raw[8 + n:]
t = head['h.1.mlp.c_fc.weight']; b, e = t['data_offsets']; cut = (e - b) // 2
t['shape'] = [t['shape'][0], t['shape'][1] // 2]; t['data_offsets'] = [b, b + cut]
data = data[:b + cut] + data[e:]  # a well-formed file whose tensor has the wrong shape
for k, v in head.items():
    if k != '__metadata__' and v['data_offsets'][0] >= e:
        v['data_offsets'] = [v['data_offsets'][0] - cut, v['data_offsets'][1] - cut]
out = json.dumps(head).encode(); out += b' ' * (-len(out) % 8)
open(sys.argv[2], 'wb').write(struct.pack('<Q', len(out)) + out + data)
PYEOF
expect 1 "h.1.mlp.c_fc.weight has shape (128, 256)" -- "$DSC" generate --weights "$T/bad.safetensors" --prompt hi
expect 1 "split evenly" -- "$DSC" generate --checkpoint "$T/ck" --prompt hi --tp 3

# tensor parallelism: 2 ranks (1 head each), greedy, equal to 1 rank token for token
port=$(free_port)
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 "${G[@]}" --prompt-file "$T/prompts.txt" --tp 2 > "$T/tp.$r.txt" 2> "$T/tp.$r.err" &
done
wait
check "TP=2 on 2 ranks == TP=1, greedy, token for token" -- cmp -s "$T/cached.txt" "$T/tp.0.txt"
check "  ... only rank 0 prints" -- test ! -s "$T/tp.1.txt"

# dsc_generate inside `dsc train` on 2 ranks at ZeRO-3 (partitions gathered), once with
# hybrid_engine.inference_tp_size 2 (each rank's prompt gathered, heads split): the same sample
two_ranks() { # NAME TP
  cat > "$T/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}, "zero_optimization": {"stage": 3},
 "hybrid_engine": {"enabled": true, "inference_tp_size": $2, "max_out_tokens": 40}}
JSON
  local port pids=() r rc=0
  port=$(free_port)
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 120 "$DSC" train --config "$T/$1.json" --data "$T/data" --model d2 --seq-len 48 \
      --max-steps 20 --eval-every 0 --sample-tokens 30 --prompt "the cat" --out "$T/$1" \
      > "$T/$1.$r.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  grep -A2 '^sample (' "$T/$1.0.log" | sed -n '3p' > "$T/$1.sample"
  [ $rc -eq 0 ] && [ -s "$T/$1.sample" ] && ! grep -q "no text sample" "$T/$1".*.log && return 0
  tail -n 3 "$T/$1".*.log; return 1
}
check "train on 2 ranks, ZeRO-3, sample through the gathered partitions" -- two_ranks z3 1
check "  ... and with inference_tp_size 2" -- two_ranks z3tp 2
check "  ... the same sample" -- cmp -s "$T/z3.sample" "$T/z3tp.sample"

# A LoRA run's closing sample runs the adapters beside the base (the host decoder, unmerged): the
# text dsc generate --model hf:BASE --adapter of its PEFT export makes with the same sampling.
lora_sample() {
  cat > "$T/lbase.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}}
JSON
  sed 's/3e-3}}/5e-2}}, "lora": {"r": 4, "lora_alpha": 8, "target_modules": "all-linear"}/' \
    "$T/lbase.json" > "$T/lora.json"
  "$DSC" train --config "$T/lbase.json" --data "$T/data" --model llama-d2 --seq-len 32 \
    --max-steps 2 --eval-every 0 --sample-tokens 0 --out "$T/lb" --save-dir "$T/lb/ck" \
    --save-at-end > "$T/lb.log" 2>&1 && "$DSC" ckpt export "$T/lb/ck" --hf "$T/base" > /dev/null &&
  "$DSC" train --config "$T/lora.json" --data "$T/data" --model "hf:$T/base" --seq-len 32 \
    --max-steps 20 --eval-every 0 --sample-tokens 24 --prompt "the " --seed 3 --out "$T/lr" \
    --save-dir "$T/lr/ck" --save-at-end > "$T/lr.log" 2>&1 &&
  "$DSC" ckpt export "$T/lr/ck" --peft "$T/peft" > /dev/null || { tail -3 "$T"/l*.log; return 1; }
  grep -A2 '^sample (' "$T/lr.log" | sed -n '3p' > "$T/lr.sample"
  local gen=(--prompt "the " --max-new-tokens 24 --temperature 0.8 --top-k 40 --seed 3)
  "$DSC" generate --model "hf:$T/base" --adapter "$T/peft" "${gen[@]}" 2> /dev/null | head -1 \
    > "$T/g.adapter"
  "$DSC" generate --model "hf:$T/base" "${gen[@]}" 2> /dev/null | head -1 > "$T/g.base"
  cmp -s "$T/lr.sample" "$T/g.adapter" && ! cmp -s "$T/lr.sample" "$T/g.base"
}
check "a LoRA run's closing sample = dsc generate --adapter of its export (not the base alone)" -- lora_sample

# A LoRA run on a built-in model stores no base: generation and the merged export say so and what
# to do instead (the adapters' export works)
"$DSC" train --config "$T/lora.json" --data "$T/data" --model llama-d2 --seq-len 32 --max-steps 2 \
  --eval-every 0 --sample-tokens 0 --out "$T/lspec" --save-dir "$T/lspec/ck" --save-at-end \
  > "$T/lspec.log" 2>&1
expect 1 'names "llama-d2": cannot open llama-d2' -- "$DSC" generate --checkpoint "$T/lspec/ck" \
  --prompt "the " --max-new-tokens 2
expect 1 "a run on a built-in model (random initial weights) stores no base" -- "$DSC" ckpt export \
  "$T/lspec/ck" --hf "$T/lspec.merged"
expect 0 "wrote" -- "$DSC" ckpt export "$T/lspec/ck" --peft "$T/lspec.peft"

# the RLHF-style example: generate, score, train on the best, repeat; the reward rises
if [ -x "${DSC_BINARY_DIR:-}/examples/rlhf" ]; then
  "$DSC_BINARY_DIR/examples/rlhf" 15 > "$T/rlhf.txt" 2>&1
  check "examples/rlhf: the mean reward at least triples over 15 iterations" -- $PY -c "
import re, sys
a, b = map(float, re.search(r'reward ([0-9.]+) -> ([0-9.]+)', open(sys.argv[1]).read()).groups())
assert b >= 3 * a and b > 0.1, (a, b)" "$T/rlhf.txt"
fi
finish
