#!/usr/bin/env bash
# What `dsc train` shows about itself: wall_clock_breakdown (printed lines and the
# elapsed_time_ms_* CSV files), the flops profile (tree, totals against the trainer's FLOP
# formula), the comms logger at world 2 with real ranks (ZeRO-2: reduce_scatter and all_gather
# rows, DeepSpeed's busbw), monitor_actions from the config, the progress line, bad input.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$src/tests/cli/lib.sh"
PY=/usr/bin/python3
export DSC_DATA_HOME="$T/home" OMP_NUM_THREADS=1
"$DSC" data default --out "$T/data" >/dev/null

train() { # train CONFIG OUT [flags...]
  local cfg=$1 out=$2
  shift 2
  "$DSC" train --config "$cfg" --data "$T/data" --model d2 --seq-len 32 --sample-tokens 0 \
    --eval-every 0 --out "$out" "$@"
}

cat >"$T/one.json" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 4,
 "wall_clock_breakdown": true, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
 "csv_monitor": {"enabled": true, "output_path": "$T/csv", "job_name": "j"},
 "flops_profiler": {"enabled": true, "profile_step": 3, "top_modules": 2,
                    "output_file": "$T/profile.txt"},
 "monitor_actions": [{"metric": "Train/Samples/train_loss", "above": 1.0, "action": "log"},
                     {"metric": "Memory/host_mem_fraction", "above": 0.0, "action": "defrag"}]}
JSON
DSC_PROGRESS=plain train "$T/one.json" "$T/one" --max-steps 8 >"$T/one.log" 2>&1
check "world 1 run with every observer on" -- test $? -eq 0
check "breakdown printed every steps_per_print, DeepSpeed's format" -- test "$(grep -cE \
  '^\[Rank 0\] time \(ms\) \| fwd: [0-9.]+ \| bwd: [0-9.]+ \| bwd_inner: [0-9.]+ \| bwd_allreduce: [0-9.]+ \| step: [0-9.]+$' \
  "$T/one.log")" -eq 2
for m in forward backward backward_inner backward_allreduce step; do
  check "CSV Train_Samples_elapsed_time_ms_$m: header and 8 rows" -- $PY - \
    "$T/csv/j/Train_Samples_elapsed_time_ms_$m.csv" "$m" <<'PY'
import sys
rows = open(sys.argv[1], newline="").read().split("\r\n")[:-1]
assert rows[0] == "step,elapsed_time_ms_" + sys.argv[2], rows[0]
assert [int(r.split(",")[0]) for r in rows[1:]] == [8 * k for k in range(1, 9)], rows
assert all(float(r.split(",")[1]) >= 0 for r in rows[1:])
PY
done
check "breakdown: bwd = bwd_inner + bwd_allreduce, every step" -- $PY - "$T/csv/j" <<'PY'
import sys
col = lambda n: [float(r.split(",")[1]) for r in open(f"{sys.argv[1]}/Train_Samples_elapsed_time_ms_{n}.csv", newline="").read().split("\r\n")[1:-1]]
assert len(col("backward")) == 8
for b, i, a in zip(col("backward"), col("backward_inner"), col("backward_allreduce")):
    assert abs(b - i - a) <= 1e-6 * b + 1e-9, (b, i, a)
PY
check "the profile was written to output_file" -- grep -q "flops profile of step 3 written to" "$T/one.log"
# d2 on the built-in (byte) data: C 128, L 2, V 256, T 32; 8 sequences of 32 tokens per step.
check "profile totals = the trainer's FLOP formula, the tree lists every module" -- $PY - \
  "$T/profile.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
C, L, V, T, maxT, tokens = 128, 2, 256, 32, 32, 8 * 32
N = V * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C
flops_per_token = 6 * (N - maxT * C) + 12 * L * C * T          # dsc_gpt2_flops_per_token
fwd = float(re.search(r"^fwd flops per GPU: +([0-9.]+) M$", text, re.M).group(1)) * 1e6
assert abs(3 * fwd - flops_per_token * tokens) <= 0.005e6 * 3, (fwd, flops_per_token * tokens)
params = float(re.search(r"^params per GPU: +([0-9.]+) K$", text, re.M).group(1)) * 1e3
assert abs(params - N) <= 5, (params, N)
assert "Profile Summary at step 3:" in text
for name in ["(transformer): GPT2Model(", "(wte+wpe): Embedding(", "(0): GPT2Block(",
             "(1): GPT2Block(", "(ln_1): LayerNorm(", "(attn): GPT2Attention(",
             "(mlp): GPT2MLP(", "(ln_f): LayerNorm(", "(lm_head): Linear (tied to wte)("]:
    assert name in text, name
lat = [float(x) for x in re.findall(r"([0-9.]+) (?:us|ms), [0-9.]+% latency", text)]
assert len(lat) == 5 + 5 * L + 1 and all(x > 0 for x in lat if x), lat
PY
check "monitor_actions: log fires once although the loss stays above 1" -- \
  test "$(grep -c 'monitor action log: Train/Samples/train_loss' "$T/one.log")" -eq 1
check "monitor_actions: defrag fires once on host memory" -- \
  test "$(grep -c 'monitor action defrag: Memory/host_mem_fraction = .* rose above 0 (.* bytes moved)' "$T/one.log")" -eq 1
check "plain output has no carriage returns" -- bash -c "! grep -q $'\r' '$T/one.log'"

# The progress line on a terminal: rewritten in place with step/total, loss, tokens/s, ETA.
DSC_PROGRESS=tty train "$T/one.json" "$T/tty" --max-steps 6 >"$T/tty.log" 2>&1
check "progress line rewritten in place on a terminal" -- test "$(grep -oE \
  $'\r\e\\[Kstep [0-9]+/6 \\| loss [0-9.]+ \\| [0-9]+ tok/s \\| ETA [0-9]+m[0-9]{2}s' \
  "$T/tty.log" | wc -l)" -eq 6

# World 2, real ranks, ZeRO-2: the comms logger's summary on rank 0.
cat >"$T/two.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "steps_per_print": 3,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2},
 "comms_logger": {"enabled": true, "verbose": true, "prof_all": false,
                  "prof_ops": ["reduce_scatter_tensor", "all_gather_into_tensor"]}}
JSON
port=$(free_port)
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout 120 "$DSC" train --config "$T/two.json" --data "$T/data" --model d2 --seq-len 32 \
    --sample-tokens 0 --eval-every 0 --max-steps 6 --out "$T/two" >"$T/two.$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
check "world 2 ZeRO-2 run with the comms logger" -- test $rc -eq 0
check "comms summary every steps_per_print (verbose) and at the end" -- \
  test "$(grep -c '^comms logger, rank 0, after step' "$T/two.0.log")" -eq 2
check "summary: only prof_ops, DeepSpeed's columns and busbw = algbw (n-1)/n" -- $PY - \
  "$T/two.0.log" <<'PY'
import sys
text = open(sys.argv[1]).read()
last = text[text.rindex("comms logger, rank 0, after step 6:"):]
lines = last.splitlines()[1:]
assert lines[0].split() == ["Comm.", "Op", "Message", "Size", "Count", "Total", "Latency(ms)",
                            "Avg", "Latency(ms)", "tput_avg", "(Gbps)", "busbw_avg", "(Gbps)"]
ops, op, rows = set(), None, 0
for l in lines[1:]:
    if not l.strip() or l.startswith("train loss"): break
    if not l.startswith(" "):
        op = l.strip(); ops.add(op); continue
    f = l.split()
    size, count, total, avg, alg, bus = f[0] + f[1], int(f[2]), float(f[3]), float(f[4]), float(f[5]), float(f[6])
    assert count > 0 and total >= 0 and avg >= 0
    if alg >= 0.1: assert abs(bus - alg / 2) <= 0.011, l   # n = 2: busbw = algbw * 1/2
    rows += 1
assert ops == {"reduce_scatter", "all_gather"}, ops
assert rows >= 2
PY

# configs are regular files (a pipe such as <(...) is refused: dsc reads no FIFO)
echo '{"train_batch_size": 4, "monitor_actions": [{"metric": "loss", "above": 1, "action": "explode"}]}' > "$T/bad.json"
echo '{"train_batch_size": 4, "comms_logger": {"enabled": true, "prof_all": false, "prof_ops": ["all_to_all"]}}' > "$T/bad2.json"
echo "{\"train_batch_size\": 4, \"flops_profiler\": {\"enabled\": true, \"output_file\": \"$T/nodir/p.txt\"}}" > "$T/bad3.json"
expect 1 '"monitor_actions"[0]: "action" "explode" is unknown' -- train "$T/bad.json" "$T/bad" \
  --max-steps 1
expect 1 "comms_logger.prof_ops[0]: comms logger: unknown operation 'all_to_all'" -- train \
  "$T/bad2.json" "$T/bad2" --max-steps 1
expect 1 "flops_profiler.output_file $T/nodir/p.txt: cannot write" -- train "$T/bad3.json" \
  "$T/bad3" --max-steps 2
expect 1 "is a FIFO (named pipe), not a regular file" -- train <(cat "$T/bad.json") "$T/bad4" \
  --max-steps 1
finish
