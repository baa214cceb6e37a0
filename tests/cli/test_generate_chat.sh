#!/usr/bin/env bash
# dsc generate --chat: a small model fine-tuned on ChatML conversations (byte tokens) is given a
# user message rendered with the template and its generation prompt; it answers and stops at the
# template's end of turn ("<|im_end|>"), which is left out of the printed reply. Also: a
# conversation line in --prompt-file, a template that refuses the conversation, the flag checks.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
source "$(dirname "$0")/lib.sh"
export OMP_NUM_THREADS=1 DSC_DATA_HOME="$T/home"

for i in $(seq 1 200); do
  echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}'
  echo '{"messages": [{"role": "user", "content": "bye"}, {"role": "assistant", "content": "see you"}]}'
done > "$T/chat.jsonl"
expect 0 "chat template chatml" -- "$DSC" data prepare --input "$T/chat.jsonl" --tokenizer byte \
  --chat-template chatml --seq-len 128 --out "$T/data"
check "train d2 on the conversations" -- "$DSC" train --data "$T/data" --model d2 --seq-len 128 \
  --max-steps 150 --eval-every 0 --save-dir "$T/ck" --save-at-end --out "$T/run" \
  > "$T/train.log" 2>&1
"$DSC" generate --checkpoint "$T/ck" --chat --chat-template chatml --prompt "hi" \
  --temperature 0 --max-new-tokens 60 > "$T/reply.txt" 2> "$T/reply.err"
check "stderr names the template and its end of turn" -- grep -q 'end of turn "<|im_end|>"' "$T/reply.err"
check "the reply is the assistant's answer" -- grep -qx "hello there" "$T/reply.txt"
check "generation stopped at the end of turn, not at --max-new-tokens" -- \
  grep -Eq "^generated ([0-9]|[1-5][0-9]) tokens" "$T/reply.err"
echo '[{"role": "user", "content": "bye"}]' > "$T/convs.jsonl"
"$DSC" generate --checkpoint "$T/ck" --chat --prompt-file "$T/convs.jsonl" --temperature 0 \
  --max-new-tokens 60 > "$T/reply2.txt" 2>/dev/null
check "--prompt-file: a conversation a line" -- grep -qx "see you" "$T/reply2.txt"
printf '%s' "{{ raise_exception('no chat here') }}" > "$T/refuse.jinja"
expect 1 "--chat: chat template $T/refuse.jinja: line 1: the template raised an error: no chat here" -- \
  "$DSC" generate --checkpoint "$T/ck" --chat --chat-template "$T/refuse.jinja" --prompt hi
expect 2 "--chat-template goes with --chat" -- \
  "$DSC" generate --checkpoint "$T/ck" --chat-template chatml --prompt hi
finish
