#!/usr/bin/env bash
# bench/gpu_llama.sh's own logic, on any machine: with a stand-in dsc (it checks each config it is
# given - valid JSON, no key twice - and writes metrics at a fixed rate per config) and stand-in
# PyTorch results, the table gets one row per shape with the fastest PyTorch variant and dsc
# against it; a shape's memory mode (m16ac) gives dsc the bf16 master keys, ZeRO stage 1 and
# activation checkpointing, and the PyTorch side its bf16-state variant; FP8=1 runs dsc again with
# the fp8 section and prints it beside torchao's; MODE lora gives dsc the lora section beside
# transformers + PEFT; a wrong mode is refused. Nothing here is timed.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=/usr/bin/python3 # the table reads the shapes from bench/torch_llama.py, which imports torch
$PY -c "import torch" 2>/dev/null || { echo "SKIP: $PY has no torch"; finish >/dev/null; exit 77; }

mkdir -p "$T/bin"
# dsc: tokens/s 30000 with the fp8 section, 20000 without; each config kept for the checks
cat >"$T/bin/dsc" <<EOF
#!/usr/bin/env bash
conf= out=
while [ \$# -gt 0 ]; do
    case \$1 in --config) conf=\$2; shift ;; --out) out=\$2; shift ;; esac
    shift
done
$PY - "\$conf" <<'PYEOF' || exit 1
import json, sys
def pairs(p):
    keys = [k for k, _ in p]
    assert len(keys) == len(set(keys)), f"a key twice: {keys}"
    return dict(p)
json.load(open(sys.argv[1]), object_pairs_hook=pairs)
PYEOF
cp "\$conf" "$T/configs.\$(ls "$T" | grep -c '^configs')"
rate=20000
grep -q '"fp8"' "\$conf" && rate=30000
mkdir -p "\$out"
for i in \$(seq 1 12); do echo "{\"step\": \$i, \"tokens_per_s\": \$rate}"; done >"\$out/metrics.jsonl"
EOF
# python: bench/torch_llama.py's results made up, every other script run for real
cat >"$T/bin/py" <<EOF
#!/usr/bin/env bash
case \$1 in
*torch_llama.py)
    case "\$*" in *"--variants hf-peft-eager"*) # LoRA: transformers + PEFT only
        echo "RESULT hf-peft-eager 10000.0 204.8 8072204288"; exit 0 ;; esac
    echo "RESULT plain-compiled 18000.0 100.0 3212749824"
    echo "RESULT plain-compiled-bf16 25000.0 80.0 3212749824"
    echo "RESULT plain-compiled-float8 24000.0 80.0 3212749824"
    exit 0 ;;
esac
exec $PY "\$@"
EOF
chmod +x "$T/bin/dsc" "$T/bin/py"

out=$(PYTHON=$T/bin/py FP8=1 SHAPES="llama-3.2-3B:2 llama-3.1-8B:1:m16ac" VARIANTS=plain-compiled \
    STEPS=4 WARMUP=2 bash "$DSC_SOURCE_DIR/bench/gpu_llama.sh" "$T/bin/dsc" 2>&1)
echo "$out" | sed 's/^/  /'
check "a row per shape with the fastest PyTorch variant and dsc against it" -- \
    grep -q "^| llama-3.2-3B | 2 | 2048 | 20.0k .* | plain-compiled-bf16 25.0k | 0.80x |$" <<<"$out"
check "the 8B row too" -- grep -q "^| llama-3.1-8B | 1 | 2048 | 20.0k .* | 0.80x |$" <<<"$out"
check "dsc against the plain compiled Llama" -- grep -q "| 1.11x | - | plain-compiled-bf16" <<<"$out"
check "FP8: dsc fp8 against its bf16 and torchao's float8" -- \
    grep -q "^fp8: llama-3.2-3B B 2: dsc fp8 30.0k tokens/s, 1.50x dsc bf16; torchao plain-compiled-float8 24.0k tokens/s, dsc fp8 / torchao 1.25x$" <<<"$out"
check "m16ac: the bf16 master keys, ZeRO stage 1 and activation checkpointing reach dsc" -- \
    $PY - "$T" <<'PYEOF'
import glob, json, sys
cs = [json.load(open(p)) for p in sorted(glob.glob(sys.argv[1] + "/configs.*"))]
assert len(cs) == 4, len(cs)
m16 = [c for c in cs if c["bf16"].get("bf16_optimizer_states")]
assert len(m16) == 2 and all(c["bf16"]["bf16_master_weights_and_grads"] and
                             c["zero_optimization"]["stage"] == 1 and
                             "activation_checkpointing" in c for c in m16), m16
assert sum("fp8" in c for c in cs) == 2 and sum("fp8" in c for c in m16) == 1, cs
PYEOF
rm -f "$T"/configs.*
out=$(PYTHON=$T/bin/py SHAPES="llama-3.1-8B:1:lora" STEPS=4 WARMUP=2 \
    bash "$DSC_SOURCE_DIR/bench/gpu_llama.sh" "$T/bin/dsc" 2>&1)
echo "$out" | sed 's/^/  /'
check "lora: dsc's LoRA row against transformers + PEFT, MFU at 4 FLOPs a parameter (6 would be 104%)" -- \
    grep -q "^| llama-3.1-8B LoRA | 1 | 2048 | 20.0k | 71.8% | .* | hf-peft-eager 10.0k | 2.00x |$" <<<"$out"
check "lora: the lora section reaches dsc (r 16, every linear module), nothing else added" -- \
    $PY - "$T" <<'PYEOF'
import glob, json, sys
cs = [json.load(open(p)) for p in sorted(glob.glob(sys.argv[1] + "/configs.*"))]
assert len(cs) == 1, len(cs)
c = cs[0]
assert c["lora"] == {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}, c
assert "zero_optimization" not in c and "bf16_master_weights_and_grads" not in c["bf16"], c
PYEOF
expect 2 "MODE is m16, m16ac or lora" -- env PYTHON="$T/bin/py" SHAPES="llama-3.1-8B:1:fast" \
    bash "$DSC_SOURCE_DIR/bench/gpu_llama.sh" "$T/bin/dsc"
finish
