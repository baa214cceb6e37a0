#!/usr/bin/env bash
# gpu_llama.sh - Llama-family training throughput on one GPU: dsc train --device cuda against
# PyTorch in the same run (bench/torch_llama.py: a plain PyTorch Llama - with Qwen3's q/k norms
# for the Qwen3 shapes - and transformers' LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM
# with sdpa attention, each eager and with torch.compile).
#
#   bench/gpu_llama.sh [DSC_BINARY]
#
# SHAPES (default "smollm2-360M:8 llama-3.2-1B:4"): MODEL:BATCH[:MODE] of dsc's published
# Llama-family shapes (docs/models.md), Qwen3's too (e.g. SHAPES="qwen3-0.6B:8 qwen3-1.7B:4"); T (default 2048); STEPS (default 20) after WARMUP (6);
# MODE, for shapes whose fp32 master does not fit the GPU: m16 (bf16.bf16_master_weights_and_grads
# and bf16_optimizer_states, ZeRO stage 1) or m16ac (and activation checkpointing); such a shape's
# PyTorch variants are VARIANTS16 (default plain-compiled-bf16: bf16 weights and AdamW states, the
# PyTorch setup that fits); or lora (the lora section: r 16, lora_alpha 32, every linear module,
# beside transformers + PEFT with the same adapters: VARIANTSL, default hf-peft-eager; MFU then
# counts 4 FLOPs per token per parameter, the frozen base's forward and input gradient, e.g.
# SHAPES="llama-3.1-8B:1:lora"). The issue's whole table in one run:
#   SHAPES="smollm2-360M:8 llama-3.2-1B:4 llama-3.2-3B:2 qwen2.5-0.5B:8 llama-3.1-8B:1:m16ac"
# VARIANTS: the PyTorch variants to run (default all four); $PYTHON names the interpreter.
# The last columns: the fastest PyTorch variant that ran (the baseline to beat) and dsc against it.
# Every side trains with random tokens, bf16 compute and fp32 weights, AdamW, clipping 1.0.
# MFU for every column by one formula, 6 N + 12 L T C FLOPs per token (N: all parameters, a tied
# embedding once; C: heads x head_dim) against 989 TFLOP/s (dense bf16 of an H100/H200 SXM).
# dsc's column is "-" with its reason while dsc has no CUDA path for the family.
# FP8=1: dsc runs again with the fp8 section (docs/fp8.md), printed after the table as its tokens/s
# and the ratio to dsc's bf16 (the PyTorch columns stay bf16), beside the plain PyTorch Llama
# compiled with torchao's float8 training (variant plain-compiled-float8; FP8_TORCH names another,
# e.g. plain-compiled-bf16-float8 where fp32 weights do not fit) where torchao is installed.
set -u
DSC=${1:-${DSC:-build/dsc}}
PY=${PYTHON:-python3}
SHAPES=${SHAPES:-smollm2-360M:8 llama-3.2-1B:4}
T=${T:-2048}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-6}
VARIANTS=${VARIANTS:-plain-eager,plain-compiled,hf-eager,hf-compiled}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$DSC" ] || { echo "gpu_llama.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

dsc_run() { # dsc_run MODEL B BF16_KEYS [EXTRA_JSON] -> tokens/s on stdout, or "- reason"
    local tag=dsc$(printf %s "$3$4" | cksum | cut -c1-6)_$1
    cat >"$W/$tag.json" <<JSON
{"train_micro_batch_size_per_gpu": $2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true $3} ${4:-},
 "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}}}
JSON
    if ! "$DSC" train --device cuda --config "$W/$tag.json" --model "$1" --seq-len "$T" \
        --max-steps $((STEPS + WARMUP)) --eval-every 0 --eval-batches 1 --sample-tokens 0 \
        --out "$W/$tag" >"$W/$tag.log" 2>&1; then
        echo "- $(grep -m1 'error' "$W/$tag.log" | cut -c1-160)"
        return
    fi
    $PY -c "import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])][int(sys.argv[2]):]
print(statistics.median(x['tokens_per_s'] for x in m))" "$W/$tag/metrics.jsonl" "$WARMUP"
}

echo "| model | B | T | dsc tokens/s | MFU | plain eager | MFU | plain compiled | MFU | HF eager | MFU | HF compiled | MFU | dsc / plain compiled | dsc / HF eager | fastest PyTorch | dsc / fastest |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
notes=() fp8s=()
for shape in $SHAPES; do
    IFS=: read -r model b mode <<<"$shape"
    bk= mj= vars=$VARIANTS
    case ${mode:-} in
    "") ;;
    m16 | m16ac)
        bk=', "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true'
        mj=', "zero_optimization": {"stage": 1}'
        [ "$mode" = m16ac ] && mj="$mj, \"activation_checkpointing\": {}"
        vars=${VARIANTS16:-plain-compiled-bf16} ;;
    lora)
        mj=', "lora": {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}'
        vars=${VARIANTSL:-hf-peft-eager} ;;
    *) echo "gpu_llama.sh: $shape: MODE is m16, m16ac or lora" >&2; exit 2 ;;
    esac
    dsc=$(dsc_run "$model" "$b" "$bk" "$mj")
    case $dsc in "- "*) notes+=("$model: ${dsc#- }"); dsc=- ;; esac
    f8=
    if [ "${FP8:-0}" = 1 ]; then
        f8=$(dsc_run "$model" "$b" "$bk" "$mj, \"fp8\": {\"enabled\": true}")
        vars="$vars,${FP8_TORCH:-plain-compiled-float8}"
    fi
    $PY "$HERE/torch_llama.py" "$model" "$b" --seq "$T" --steps "$STEPS" --warmup "$WARMUP" \
        --variants "$vars" >"$W/torch_$model.log" 2>&1
    if [ -n "$f8" ]; then
        ao=$(awk -v v="${FP8_TORCH:-plain-compiled-float8}" '$1 == "RESULT" && $2 == v { print $3 }' "$W/torch_$model.log")
        case $f8 in
        "- "*) fp8s+=("$model: fp8: ${f8#- }") ;;
        *) fp8s+=("$model B $b: dsc fp8 $(awk -v a="$f8" -v b="$dsc" -v t="${ao:-0}" -v n="${FP8_TORCH:-plain-compiled-float8}" 'BEGIN {
            printf "%.1fk tokens/s, %.2fx dsc bf16", a / 1e3, (b > 0 ? a / b : 0)
            if (t > 0) printf "; torchao %s %.1fk tokens/s, dsc fp8 / torchao %.2fx", n, t / 1e3, a / t
            else printf "; torchao: did not run (see the notes)" }')") ;;
        esac
    fi
    grep '^SKIP' "$W/torch_$model.log" | sed "s/^/$model: /" >>"$W/skips"
    grep -q '^RESULT\|^SKIP' "$W/torch_$model.log" ||
        { echo "note: $model: the PyTorch baseline did not run:"; tail -3 "$W/torch_$model.log"; }
    $PY - "$model" "$b" "$T" "$dsc" "$W/torch_$model.log" "$HERE/torch_llama.py" "${mode:-}" <<'PYEOF'
import importlib.util, sys
model, b, T, dsc, log, script = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
per_param = 4 if sys.argv[7] == "lora" else 6 # LoRA: the base's forward and input gradient
spec = importlib.util.spec_from_file_location("tl", script)
tl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tl)
L, C, nh, nkv, hd, inter, V, tied, bias, theta, eps = tl.SHAPES[model]
res, n = {}, None
for line in open(log):
    p = line.split()
    if p and p[0] == "RESULT":
        res[p[1]] = float(p[2])
        n = int(p[4])
def mfu(tok_s):
    return f"{100 * tok_s * (per_param * n + 12 * L * T * nh * hd) / 989e12:.1f}%" if n and tok_s else "-"
def cell(v):
    return f"{v / 1e3:.1f}k" if v else "-"
d = float(dsc) if dsc != "-" else None
cols = [cell(d), mfu(d)]
for v in ("plain-eager", "plain-compiled", "hf-eager", "hf-compiled"):
    cols += [cell(res.get(v)), mfu(res.get(v))]
ratio = lambda ref: f"{d / res[ref]:.2f}x" if d and res.get(ref) else "-"
bf16 = {v: t for v, t in res.items() if "float8" not in v} # the baselines in dsc's precision
best = max(bf16, key=bf16.get) if bf16 else None
fast = f"{best} {bf16[best] / 1e3:.1f}k" if best else "-"
print(f"| {model}{' LoRA' if per_param == 4 else ''} | {b} | {T} | " + " | ".join(cols) + f" | {ratio('plain-compiled')} | {ratio('hf-eager')} | {fast} | {ratio(best) if best else '-'} |")
PYEOF
done
for n in "${notes[@]}"; do echo "note: $n"; done
for n in "${fp8s[@]}"; do echo "fp8: $n"; done
[ -f "$W/skips" ] && sed 's/^/note: /' "$W/skips"
exit 0
