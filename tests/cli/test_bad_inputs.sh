#!/usr/bin/env bash
# Hostile inputs stay errors (issue "Errors stay errors"): a dataset.json that is not valid JSON
# names the file and line instead of passing for an absent one (GPT-2's vocabulary, exit 0); a
# FIFO, socket or directory where a file is read is refused before it is opened (a FIFO named
# model.safetensors used to hang `train` and `generate` for ever; a directory said "No such
# device"); --eval-batches 0 is refused like the other zero values. Every command runs under
# `timeout`, so a hang fails the test (exit 124) instead of hanging it.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1
small=(--model d2 --seq-len 32 --sample-tokens 0 --max-steps 1 --eval-batches 1)
run() { timeout 20 "$DSC" "$@"; }

printf 'the quick brown fox jumps over the lazy dog %d\n' $(seq 1 400) > "$T/text.txt"
expect 0 "data prepare" -- run data prepare --input "$T/text.txt" --out "$T/d"
expect 0 "vocab 256" -- run train --data "$T/d" "${small[@]}" --out "$T/r0"

# ---- dataset.json that cannot be read ----
cp -r "$T/d" "$T/bad"
printf '{"tokenizer": "byte",\n "vocab_size": 256,,}\n' > "$T/bad/dataset.json"
expect 1 "$T/bad/dataset.json:2:" -- run train --data "$T/bad" "${small[@]}" --out "$T/r1"
expect 1 "not valid JSON" -- run train --data "$T/bad" "${small[@]}" --out "$T/r1"
printf '[256]\n' > "$T/bad/dataset.json"
expect 1 "expected a JSON object" -- run train --data "$T/bad" "${small[@]}" --out "$T/r1"
rm "$T/bad/dataset.json" && mkdir "$T/bad/dataset.json"
expect 1 "dataset.json is a directory" -- run train --data "$T/bad" "${small[@]}" --out "$T/r1"
rmdir "$T/bad/dataset.json" && mkfifo "$T/bad/dataset.json"
expect 1 "dataset.json is a FIFO" -- run train --data "$T/bad" "${small[@]}" --out "$T/r1"
# absent stays what it was: GPT-2 tokens
rm "$T/bad/dataset.json"
expect 0 "vocab 50257" -- run train --data "$T/bad" "${small[@]}" --out "$T/r1"

# ---- weights, prompts and configs that are not regular files ----
mkdir -p "$T/fifo" "$T/dir/model.safetensors"
mkfifo "$T/fifo/model.safetensors" "$T/fifo/prompts.txt" "$T/fifo/ds.json"
expect 1 "model.safetensors is a FIFO (named pipe), not a regular file" -- \
  run train --data "$T/d" "${small[@]}" --init-weights "$T/fifo/model.safetensors" --out "$T/r2"
expect 1 "model.safetensors is a FIFO" -- \
  run generate --weights "$T/fifo/model.safetensors" --prompt "The " --max-new-tokens 2
expect 1 "model.safetensors is a directory" -- \
  run train --data "$T/d" "${small[@]}" --init-weights "$T/dir" --out "$T/r2"
expect 1 "model.safetensors is a directory" -- \
  run generate --weights "$T/dir/model.safetensors" --prompt "The " --max-new-tokens 2
# a Hugging Face folder whose weights file is a FIFO
"$DSC" train --data "$T/d" "${small[@]}" --out "$T/r3" --save-dir "$T/ck" --save-at-end > /dev/null 2>&1
expect 0 "" -- run ckpt export "$T/ck" --hf "$T/hf"
check "export wrote model.safetensors" -- test -f "$T/hf/model.safetensors"
rm -f "$T/hf/model.safetensors" && mkfifo "$T/hf/model.safetensors"
expect 1 "model.safetensors is a FIFO" -- run train --data "$T/d" "${small[@]}" --model "hf:$T/hf" --out "$T/r4"
expect 1 "model.safetensors is a FIFO" -- run generate --model "hf:$T/hf" --prompt "The " --max-new-tokens 2
expect 1 "prompts.txt is a FIFO" -- \
  run generate --checkpoint "$T/ck" --prompt-file "$T/fifo/prompts.txt" --max-new-tokens 2
expect 1 "ds.json is a FIFO" -- run config check "$T/fifo/ds.json"
expect 1 "ds.json is a FIFO" -- run train --config "$T/fifo/ds.json" --data "$T/d" "${small[@]}" --out "$T/r5"
expect 1 "is a FIFO" -- run data prepare --input "$T/fifo/prompts.txt" --out "$T/p"

# ---- optimizer values out of their domain; a NaN loss in fp32 ----
printf '{"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [1.5, -0.2]}}}\n' > "$T/betas.json"
expect 1 "optimizer.params.betas [1.5, -0.2]: beta1 = 1.5 is outside [0, 1)" -- run config check "$T/betas.json"
expect 1 "optimizer.params.betas" -- run train --config "$T/betas.json" --data "$T/d" "${small[@]}" --out "$T/r7"
printf '{"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e6}}}\n' > "$T/lr.json"
expect 1 "the training loss is NaN; stopping" -- \
  run train --config "$T/lr.json" --data "$T/d" "${small[@]}" --max-steps 8 --out "$T/r8"
check "no step with a null loss in metrics.jsonl" -- bash -c "! grep -q '\"loss\": null' '$T/r8/metrics.jsonl'"

# ---- --eval-batches 0 ----
expect 2 "--eval-batches 0: expected a whole number in 1.." -- \
  run train --data "$T/d" --model d2 --seq-len 32 --max-steps 1 --eval-batches 0 --out "$T/r6"
finish
