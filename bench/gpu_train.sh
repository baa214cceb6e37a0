#!/usr/bin/env bash
# gpu_train.sh - GPT-2 training throughput on one GPU: dsc train --device cuda against the PyTorch
# baseline (eager and torch.compile) in the same call, plus dsc's step-time breakdown.
#
#   bench/gpu_train.sh [DSC_BINARY] [TORCH_GPT2_PY]      (LLMC=train_gpt2cu adds llm.c)
#
# DSC_BINARY (or $DSC; default build/dsc) is the dsc to measure. TORCH_GPT2_PY (or $TORCH_GPT2)
# is the PyTorch baseline script (bf16 autocast, fused AdamW, SDPA flash attention, clipping 1.0,
# random tokens, V 50257, T 1024, median of 30 steps after 8 warm-ups; its run() is called here for
# each shape); without it only dsc is measured. $PYTHON names the interpreter (python3).
# SHAPES (default "gpt2-124M:16 gpt2-350M:8"): MODEL:BATCH pairs, models gpt2-124M and gpt2-350M;
# BREAKDOWN=0 skips the breakdown runs.
#
# dsc runs the same models and batch sizes on random tokens (V 50257) with the baseline's
# hyper-parameters: bf16, AdamW lr 6e-4, betas (0.9, 0.999), weight decay 0.1, clipping 1.0,
# constant lr. Tokens/s: median over the steps after $WARMUP (default 5) of $STEPS (default 15),
# from metrics.jsonl (whole steps: data loading and the loss read included). A second run with
# wall_clock_breakdown gives forward / backward / optimizer step medians; that run waits for the
# device after each phase (docs/gpu.md), so its step time is not the throughput run's.
# MFU for every row: the baseline's formula, (6 N + 6 L T C) FLOPs per token against 989 TFLOP/s
# (N: all parameters, the tied embedding once).
# LLMC (optional): the path of an llm.c `train_gpt2cu` binary that the user built (with cuDNN
# attention, for the reference numbers); it trains the same shapes from scratch (-e d12 / d24) on
# the same token file with the same hyper-parameters (its default recompute and fused GELU
# settings), and its table column is the median of its printed step times after $WARMUP steps.
set -eu
DSC=${1:-${DSC:-build/dsc}}
TORCH_GPT2=${2:-${TORCH_GPT2:-}}
PY=${PYTHON:-python3}
LLMC=${LLMC:-}
STEPS=${STEPS:-15}
SHAPES=${SHAPES:-gpt2-124M:16 gpt2-350M:8}
BREAKDOWN=${BREAKDOWN:-1}
WARMUP=${WARMUP:-5}
[ -x "$DSC" ] || { echo "gpu_train.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
if [ -n "$LLMC" ] && [ ! -x "$LLMC" ]; then
    echo "gpu_train.sh: LLMC=$LLMC is not an executable llm.c train_gpt2cu; build it or" \
        "leave it out" >&2
    exit 2
fi
if [ -n "$TORCH_GPT2" ] && [ ! -f "$TORCH_GPT2" ]; then
    echo "gpu_train.sh: baseline script $TORCH_GPT2 not found; pass its path or leave it out" >&2
    exit 2
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

. "$(dirname "$0")/lib_data.sh" # random_shards
random_shards "$W/data" 4000000 200000

dsc_run() { # dsc_run NAME MODEL B BREAKDOWN
    cat >"$W/$1.json" <<JSON
{"train_micro_batch_size_per_gpu": $3, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true}, "wall_clock_breakdown": $4,
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "betas": [0.9, 0.999], "weight_decay": 0.1}}}
JSON
    "$DSC" train --device cuda --config "$W/$1.json" --model "$2" --seq-len 1024 --data "$W/data" \
        --max-steps "$STEPS" --eval-every 0 --eval-batches 1 --sample-tokens 0 --out "$W/$1" \
        >"$W/$1.log" 2>&1 ||
        { echo "gpu_train.sh: dsc run $1 failed:" >&2; cat "$W/$1.log" >&2; exit 1; }
}
first=
for shape in $SHAPES; do
    model=${shape%%:*} b=${shape##*:}
    case $model in gpt2-124M | gpt2-350M) ;; *)
        echo "gpu_train.sh: SHAPES: $shape: the model must be gpt2-124M or gpt2-350M" >&2; exit 2 ;;
    esac
    dsc_run "dsc_$shape" "$model" "$b" false
    [ "$BREAKDOWN" = 0 ] || dsc_run "brk_$shape" "$model" "$b" true
    first=${first:-$shape}
done
grep -m1 "^run dir" "$W/dsc_$first.log" | sed 's/^run dir [^|]*| //' || true

if [ -n "$LLMC" ]; then
    for shape in $SHAPES; do
        model=${shape%%:*} b=${shape##*:}
        depth=12
        [ "$model" = gpt2-350M ] && depth=24
        # -v above the step count: validation only at the first and last step, outside the
        # medians; -s 0 -h 0: no sampling, no HellaSwag.
        (cd "$W" && "$LLMC" -i "$W/data/train.bin" -j "$W/data/val.bin" -e "d$depth" -b "$b" \
            -t 1024 -d $((b * 1024)) -x "$STEPS" -v 100000 -s 0 -h 0 -l 6e-4 -u 0 -c 0.1 \
            >"$W/llmc_$shape.log" 2>&1) ||
            { echo "gpu_train.sh: llm.c run $shape failed:" >&2; tail -20 "$W/llmc_$shape.log" >&2
              exit 1; }
    done
fi

if [ -n "$TORCH_GPT2" ]; then
    mkdir -p "$W/torch"
    $PY - "$TORCH_GPT2" "$W/torch" $SHAPES >"$W/torch.log" 2>&1 <<'PYEOF' ||
import importlib.util, json, sys
import torch
spec = importlib.util.spec_from_file_location("baseline", sys.argv[1])
base = importlib.util.module_from_spec(spec)
spec.loader.exec_module(base)
dims = {"gpt2-124M": (12, 12, 768), "gpt2-350M": (24, 16, 1024)}
out = []
for shape in sys.argv[3:]:
    model, b = shape.split(":")
    L, H, C = dims[model]
    for compiled in (False, True):
        r = base.run((50257, 1024, L, H, C, int(b)), compiled)
        r["model"] = model
        out.append(r)
        print(json.dumps(r), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
json.dump(out, open(sys.argv[2] + "/torch_gpt2.json", "w"), indent=1)
PYEOF
        { echo "gpu_train.sh: the baseline failed:" >&2; tail -20 "$W/torch.log" >&2; exit 1; }
fi

$PY - "$W" "$WARMUP" "$BREAKDOWN" $SHAPES <<'PYEOF'
import json, os, re, statistics, sys
w, warm, brk = sys.argv[1], int(sys.argv[2]), sys.argv[3] != "0"
runs = [(s.split(":")[0], int(s.split(":")[1])) for s in sys.argv[4:]]
shapes = {"gpt2-124M": (50257, 1024, 12, 768), "gpt2-350M": (50257, 1024, 24, 1024)}

def mfu(model, tok_s):
    V, T, L, C = shapes[model]
    n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return tok_s * (6 * n + 6 * L * T * C) / 989e12

def dsc_tok_s(name):
    m = [json.loads(l) for l in open(f"{w}/{name}/metrics.jsonl")]
    return statistics.median(x["tokens_per_s"] for x in m[warm:])

def breakdown(name):
    rows = re.findall(r"fwd: ([\d.]+) \| bwd: ([\d.]+) \| bwd_inner: [\d.]+ \| bwd_allreduce: "
                      r"[\d.]+ \| step: ([\d.]+)", open(f"{w}/{name}.log").read())
    rows = [tuple(map(float, r)) for r in rows[warm:]]
    return [statistics.median(r[k] for r in rows) for k in range(3)]

def llmc_tok_s(model, b):
    path = f"{w}/llmc_{model}:{b}.log"
    if not os.path.exists(path):
        return None
    step = re.compile(r"^step\s+\d+/\d+ \|.*\| ([\d.]+) ms \|", re.M)
    ms = [float(x) for x in step.findall(open(path).read())]
    return b * 1024 / (statistics.median(ms[warm:]) / 1e3) if len(ms) > warm else None

torch = {}
if os.path.exists(f"{w}/torch/torch_gpt2.json"):
    for r in json.load(open(f"{w}/torch/torch_gpt2.json")):
        torch[(r["model"], r["B"], r["compile"])] = r["tok_s"]

print("\n| model | B | dsc tokens/s | dsc MFU | PyTorch eager | MFU | torch.compile | MFU | "
      "llm.c | MFU | dsc / eager | dsc / compiled | dsc / llm.c |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for model, b in runs:
    d = dsc_tok_s(f"dsc_{model}:{b}")
    e, c = torch.get((model, b, False)), torch.get((model, b, True))
    l = llmc_tok_s(model, b)
    cell = lambda t: f"{t / 1e3:.1f}k | {100 * mfu(model, t):.1f}%" if t else "- | -"
    ratio = lambda t: f"{d / t:.2f}x" if t else "-"
    print(f"| {model} | {b} | {d / 1e3:.1f}k | {100 * mfu(model, d):.1f}% | "
          f"{cell(e)} | {cell(c)} | {cell(l)} | {ratio(e)} | {ratio(c)} | {ratio(l)} |")
if not brk:
    sys.exit(0)
print("\ndsc step-time breakdown (wall_clock_breakdown on: the host waits after each phase), "
      "median ms per step")
print("| model | forward | backward | optimizer step | sum |")
print("|---|---|---|---|---|")
for model, b in runs:
    f, bw, s = breakdown(f"brk_{model}:{b}")
    print(f"| {model} B {b} | {f:.2f} | {bw:.2f} | {s:.2f} | {f + bw + s:.2f} |")
PYEOF
