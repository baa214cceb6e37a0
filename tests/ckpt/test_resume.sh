#!/usr/bin/env bash
# Resume: stop at step K (end of a run, or SIGUSR1 on one rank), resume, run to step M: the
# weights at M equal an uninterrupted run's byte for byte (exported checkpoints compared), and so
# do the per-step losses after K, for ZeRO stages 0-3 at world 1, 2 and 4; fp16 with a dynamic
# loss scale; a change of stage at resume; in-line saves (checkpoint.async false) write the same
# shards as the snapshot writer.
set -u
. "$(dirname "$0")/lib.sh"
K=8 M=16

# bitwise NAME WORLD CONFIG [resume world] [resume config]
bitwise() {
  local n=$1 w=$2 cfg=$3 w2=${4:-$2} cfg2=${5:-$3}
  check "$n: uninterrupted run to $M" -- run "$n.full" "$w2" "$cfg2" --max-steps $M --save-dir "$T/$n.full.ck" --save-at-end
  check "$n: run to $K" -- run "$n.a" "$w" "$cfg" --max-steps $K --save-dir "$T/$n.ck" --save-at-end
  check "$n: resume to $M" -- run "$n.b" "$w2" "$cfg2" --max-steps $M --save-dir "$T/$n.ck" --resume --save-at-end
  check "$n: resumed at step $K" -- grep -q "continuing after step $K" "$T/$n.b.0.log"
  export_latest "$T/$n.full.ck" "$T/$n.full.st"
  export_latest "$T/$n.ck" "$T/$n.b.st"
  check "$n: final weights identical" -- cmp -s "$T/$n.full.st" "$T/$n.b.st"
  check "$n: losses after step $K identical" -- cmp -s <(cols "$T/$n.full/metrics.jsonl" $K) <(cols "$T/$n.b/metrics.jsonl" $K)
}

for st in 0 1 2 3; do config "$T/z$st.json" $st ""; done
for w in 1 2 4; do
  for st in 0 1 2 3; do bitwise "w${w}s$st" $w "$T/z$st.json"; done
done

# fp16 with a dynamic loss scale that grows every 3 steps: the scaler state carries over.
config "$T/h2.json" 2 ', "fp16": {"enabled": true, "initial_scale_power": 8, "loss_scale_window": 3}'
bitwise fp16 2 "$T/h2.json"
check "fp16: the loss scale changed during the run" -- test "$(cols "$T/fp16.full/metrics.jsonl" | awk '{print $5}' | sort -u | wc -l)" -gt 1

# checkpoint.async false: the shard is written in line from the engine's own state (no snapshot
# copy): the same bytes as the snapshot's writer, and it resumes bitwise.
for st in 1 3; do
  config "$T/sync$st.json" $st "" '"interval_s": 0, "async": false'
  for w in 1 2; do
    bitwise "sync.w${w}s$st" $w "$T/sync$st.json"
    for r in $(seq 0 $((w - 1))); do
      f="global_step$M/shard_rank${r}_of_$w.safetensors"
      check "sync.w${w}s$st: rank $r's shard equals the snapshot writer's byte for byte" -- cmp -s "$T/sync.w${w}s$st.full.ck/$f" "$T/w${w}s$st.full.ck/$f"
    done
  done
done

# Saved at stage 1, resumed at stage 3 (stages agree bitwise at one world size).
bitwise stage1to3 2 "$T/z1.json" 2 "$T/z3.json"

# Preemption: SIGUSR1 to rank 1 only; both ranks save the same step and exit 0.
config "$T/p.json" 2 "" '"interval_s": 0, "interval_steps": 5'
start sig 2 "$T/p.json" --max-steps 400 --save-dir "$T/sig.ck"
for i in $(seq 1 200); do [ -s "$T/sig.ck/latest" ] && break; sleep 0.05; done
kill -USR1 "${PIDS[1]}"
check "SIGUSR1: both ranks exit 0" -- finish_ranks sig
check "SIGUSR1: the run says so" -- grep -q "stop requested: checkpoint global_step" "$T/sig.0.log"
S=$(cat "$T/sig.ck/latest" 2>/dev/null | sed 's/global_step//')
check "SIGUSR1: stopped early (step ${S:-?})" -- test "${S:-400}" -lt 400
check "SIGUSR1: metrics end at the saved step" -- test "$(tail -n 1 "$T/sig/metrics.jsonl" | $PY -c 'import json,sys; print(json.load(sys.stdin)["step"])')" = "$S"
M2=$((S + 6))
check "SIGUSR1: resume to $M2" -- run sig.b 2 "$T/p.json" --max-steps $M2 --save-dir "$T/sig.ck" --resume --save-at-end
check "SIGUSR1: uninterrupted run to $M2" -- run sig.full 2 "$T/p.json" --max-steps $M2 --save-dir "$T/sig.full.ck" --save-at-end
export_latest "$T/sig.ck" "$T/sig.b.st"
export_latest "$T/sig.full.ck" "$T/sig.full.st"
check "SIGUSR1: final weights identical" -- cmp -s "$T/sig.full.st" "$T/sig.b.st"
finish
