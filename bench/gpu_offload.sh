#!/usr/bin/env bash
# gpu_offload.sh - ZeRO-Offload on one GPU at the host's memory limit: a GPT-2-shaped model of
# several billion parameters, fp32 master weights and AdamW moments on the host, trained with
# `dsc train --device cuda`, streamed (gradients down and 16-bit weights up per layer group,
# overlapping the backward) against the whole-gradient path (DSC_OFFLOAD_STREAM=0: one copy down
# after the backward, the engine's step, the fp32 master copied up) in the same call.
#
#   bench/gpu_offload.sh [DSC_BINARY]
#
# MODEL (default d47: 47 layers, 3008 channels, 5.25 B parameters), B (micro-batch, default 8),
# T 1024, STEPS (default 6), WARMUP (steps left out of the medians, default 2). Host memory:
# 16 bytes per parameter for master, moments and gradients plus 2 for the page-locked 16-bit
# staging (about 95 GB for d47). Runs: stream (clipping 1.0), noclip (stream, clipping off: the
# CPU optimizer runs while the backward is still running), whole (clipping 1.0, not streamed),
# param (stage 3 with offload_param: the layers' weights streamed from the host as well),
# and brk (stream with wall_clock_breakdown: forward / backward / step medians). RUNS (default
# "stream noclip whole brk") picks some. Each run's output lines carry the seconds since its
# start; with $OUT set, the logs and metrics are copied there.
set -eu
DSC=${1:-${DSC:-build/dsc}}
PY=${PYTHON:-python3}
MODEL=${MODEL:-d47}
B=${B:-8}
STEPS=${STEPS:-6}
RUNS=${RUNS:-stream noclip whole brk}
WARMUP=${WARMUP:-2}
[ -x "$DSC" ] || { echo "gpu_offload.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

. "$(dirname "$0")/lib_data.sh" # random_shards
random_shards "$W/data" 1000000 100000

run() { # run NAME CLIPPING BREAKDOWN ZERO [ENV...]
    local name=$1 clip=$2 brk=$3 zero=$4
    shift 4
    cat >"$W/$name.json" <<JSON
{"train_micro_batch_size_per_gpu": $B, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "gradient_clipping": $clip, "bf16": {"enabled": true}, "wall_clock_breakdown": $brk,
 "zero_optimization": $zero,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "betas": [0.9, 0.999], "weight_decay": 0.1}}}
JSON
    local t0=$SECONDS rc=0
    set +e
    (env "$@" "$DSC" train --device cuda --config "$W/$name.json" --model "$MODEL" --seq-len 1024 \
        --data "$W/data" --max-steps "$STEPS" --eval-every 0 --eval-batches 1 --sample-tokens 0 \
        --out "$W/$name" 2>&1; echo "exit $?") |
        while IFS= read -r line; do printf '%4ds %s\n' $((SECONDS - t0)) "$line"; done >"$W/$name.log"
    set -e
    grep -q "s exit 0$" "$W/$name.log" || rc=1
    [ -z "${OUT:-}" ] || { mkdir -p "$OUT/offload"; cp -r "$W/$name.log" "$W/$name" "$OUT/offload/"; }
    [ $rc -eq 0 ] || { echo "gpu_offload.sh: run $name failed:" >&2; tail -20 "$W/$name.log" >&2; exit 1; }
    $PY - "$W/$name" "$WARMUP" "$((SECONDS - t0))" "$(grep -m1 '^ *[0-9]*s run dir' "$W/$name.log" | awk '{print $1}')" <<'PYEOF'
import json, statistics, sys, os
m = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
r = m[int(sys.argv[2]):] or m
med = lambda k: statistics.median(x[k] for x in r) if all(k in x for x in r) else float("nan")
print(f"{os.path.basename(sys.argv[1])}: {sys.argv[3]} s in all, start-up {sys.argv[4]}, step "
      f"{[round(x['elapsed_s'], 1) for x in m]} s elapsed; median {med('tokens_per_s'):.0f} "
      f"tokens/s, grad wait {med('offload_grad_wait_ms'):.0f} ms, host CPU "
      f"{med('offload_cpu_ms'):.0f} ms; loss {m[0]['loss']:.3f} -> {m[-1]['loss']:.3f}", flush=True)
PYEOF
}
Z2='{"stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true}}'
Z3='{"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": true}, "offload_param": {"device": "cpu", "pin_memory": true}}'
for r in $RUNS; do
    case $r in
    stream) run stream 1.0 false "$Z2" ;;
    noclip) run noclip 0.0 false "$Z2" ;;
    whole) run whole 1.0 false "$Z2" DSC_OFFLOAD_STREAM=0 ;;
    brk) run brk 1.0 true "$Z2" ;;
    param) run param 1.0 false "$Z3" ;;
    *) echo "gpu_offload.sh: RUNS: unknown run $r (stream, noclip, whole, brk, param)" >&2; exit 2 ;;
    esac
done
first=${RUNS%% *}
grep -m1 "run dir" "$W/$first.log" | sed 's/^.*run dir [^|]*| //' || true

$PY - "$W" "$WARMUP" "$MODEL" "$B" $RUNS <<'PYEOF'
import json, re, statistics, sys
w, warm, model, B = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
done = sys.argv[5:]
n = int(model[1:])
C, L, V, T = 64 * n, n, 50257, 1024
params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
flops_tok = 6 * (params - T * C) + 12 * L * C * T

def rows(name):
    return [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")][warm:]

def med(name, key):
    v = [r[key] for r in rows(name) if key in r]
    return statistics.median(v) if v else float("nan")

print(f"\nmodel {model}: {params / 1e9:.2f} B parameters, B {B}, T {T}, "
      f"{B * T} tokens per step; medians after {warm} steps")
print("| run | tokens/s | step s | MFU | grad wait ms | host CPU ms | optimizer during backward | "
      "GPU used GiB | loss first -> last |")
print("|---|---|---|---|---|---|---|---|---|")
for name in [n for n in ("stream", "noclip", "whole", "param") if n in done]:
    r = rows(name)
    tok = med(name, "tokens_per_s")
    print(f"| {name} | {tok:.0f} | {B * T / tok:.3f} | {100 * tok * flops_tok / 989e12:.1f}% | "
          f"{med(name, 'offload_grad_wait_ms'):.0f} | {med(name, 'offload_cpu_ms'):.0f} | "
          f"{r[-1].get('offload_overlapped', '-')} | {med(name, 'gpu_device_used') / 2**30:.1f} | "
          f"{json.loads(open(f'{w}/{name}/metrics.jsonl').readline())['loss']:.3f} -> "
          f"{r[-1]['loss']:.3f} |")
if "whole" in done:
    h = med("whole", "tokens_per_s")
    for name in [n for n in ("stream", "noclip", "param") if n in done]:
        print(f"{name} / whole-gradient: {med(name, 'tokens_per_s') / h:.2f}x")
br = []
if "brk" in done:
    br = re.findall(r"fwd: ([\d.]+) \| bwd: ([\d.]+) \| bwd_inner: [\d.]+ \| bwd_allreduce: "
                    r"[\d.]+ \| step: ([\d.]+)", open(f"{w}/brk.log").read())[warm:]
if br:
    f, b, st = (statistics.median(float(x[k]) for x in br) for k in range(3))
    print(f"breakdown (stream, wall_clock_breakdown; the backward includes taking the gradients "
          f"as they land): forward {f:.0f} ms | backward {b:.0f} ms | step {st:.0f} ms")
PYEOF
