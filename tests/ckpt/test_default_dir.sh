#!/usr/bin/env bash
# Nothing is lost silently. A config that asks for checkpoints (checkpoint.interval_steps or
# interval_s, or fault_tolerance.on_failure restart) without --save-dir saves into
# <--out>/checkpoints, or, without --out, refuses to start naming the flag to add. A restart by
# dsc launch (DSC_RESTART_COUNT > 0) resumes from the latest checkpoint there and appends to
# metrics.jsonl, marking its first line "resumed": true; the first attempt's lines stay.
set -u
. "$(dirname "$0")/lib.sh"
config "$T/z2.json" 2 "" '"interval_steps": 2'
TRAIN=("$DSC" train --config "$T/z2.json" --data "$T/data" --model d2 --seq-len 32
       --sample-tokens 0 --eval-every 0 --eval-batches 2)

expect 0 "# note: checkpoint.interval_steps asks for checkpoints: dsc train writes them into --save-dir DIR" -- \
  "$DSC" config check "$T/z2.json"
expect 1 "sets checkpoint.interval_steps, but nothing would be saved: add --save-dir DIR" -- \
  "${TRAIN[@]}" --max-steps 2
expect 0 "checkpoints go to $T/o/checkpoints" -- "${TRAIN[@]}" --max-steps 4 --out "$T/o"
check "saved into <--out>/checkpoints" -- test "$(cat "$T/o/checkpoints/latest" 2>&1)" = global_step4

# A restart: resumed from the latest checkpoint, metrics appended and marked.
expect 0 "resumed from checkpoint $T/o/checkpoints/global_step4: continuing after step 4" -- \
  env DSC_RESTART_COUNT=1 "${TRAIN[@]}" --max-steps 6 --out "$T/o"
check "metrics.jsonl: steps 1-6, the restart's first line marked" -- $PY -c "
import json; rows = [json.loads(l) for l in open('$T/o/metrics.jsonl')]
assert [r['step'] for r in rows] == [1, 2, 3, 4, 5, 6], rows
assert [r.get('resumed', False) for r in rows] == [False] * 4 + [True, False], rows"

# on_failure restart under dsc launch, without --save-dir or --resume: rank 1 is killed once in
# step 5; the survivor saves an emergency checkpoint into <--out>/checkpoints and exits 75, the
# restarted job resumes from it (not from step 1) and metrics.jsonl keeps every attempt's lines.
config "$T/zr.json" 2 ', "fault_tolerance": {"comm_timeout_s": 2, "step_timeout_s": 4, "on_failure": "restart"}'
d="$T/rs"
mkdir -p "$d"
DSC_FT_INJECT=1:5:reduce timeout -s KILL 120 "$DSC" launch --num_procs 2 --no_local_rank \
  --max_restarts 1 --master_port "$(free_port)" --log_dir "$d" \
  sh -c '[ "$DSC_RESTART_COUNT" = 0 ] || unset DSC_FT_INJECT; exec "$@"' sh \
  "$DSC" train --config "$T/zr.json" --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 \
  --eval-every 0 --eval-batches 2 --max-steps 8 --out "$d" > "$d/out" 2> "$d/err"
LRC=$?
check "restart policy: launcher exits 0 after one restart (got $LRC)" -- test $LRC -eq 0
[ $LRC -eq 0 ] || tail -5 "$d/err" "$d"/rank0.log
check "restart policy: emergency checkpoint in <--out>/checkpoints" -- \
  grep -q "saved an emergency checkpoint" "$d/rank0.log"
check "restart policy: no internal API name" -- bash -c "! grep -q dsc_checkpointing_start '$d'/rank*.log"
b=$(grep -ho "saved an emergency checkpoint of step [0-9]*" "$d/rank0.log" | awk '{print $NF}')
check "restart policy: the restart resumed after step $b" -- \
  grep -q "global_step$b: continuing after step $b" "$d/rank0.log"
check "restart policy: metrics.jsonl holds both attempts, the restart marked" -- $PY -c "
import json; rows = [json.loads(l) for l in open('$d/metrics.jsonl')]
steps = [r['step'] for r in rows]
assert steps[0] == 1 and steps[-1] == 8 and sorted(set(steps)) == list(range(1, 9)), steps
marked = [r['step'] for r in rows if r.get('resumed')]
assert marked == [int('$b') + 1], (marked, steps)"
finish
