#!/usr/bin/env bash
# dsc generate --device cuda on a Llama-family model (the family's GPU decoder behind the model
# interface) against --device cpu: a llama-d2 (2 layers, 2 heads sharing 1 kv head: grouped-query
# cache, rotary embeddings, SwiGLU) trained briefly on the CPU over bytes, then greedy
# continuations of prompts of different lengths. The tokens must be equal, or differ first where
# the CPU's two best logits are a near-tie (within TIE_ABS + TIE_REL |best|, from --trace); the
# same for the GPU with the cache against the GPU without it. The smallest top-2 margin of the
# CPU's choices and the count of near-tie divergences are printed. The first token's two best
# logits on the GPU must be within bf16 tolerance of the CPU's. Exit 77 (skipped) when no CUDA
# device is usable.
set -u
. "$DSC_SOURCE_DIR/tests/cli/lib.sh"
PY=${PYTHON:-/usr/bin/python3}
export DSC_DATA_HOME="$T/home"
TIE_ABS=0.05
TIE_REL=0.05

probe=$("$DSC" generate --device cuda --checkpoint "$T/none" --prompt hi 2>&1)
if grep -qE "no CUDA device is usable|built without the CUDA kernels" <<<"$probe"; then
    grep -qF -- "--device cpu" <<<"$probe" || { echo "FAIL: unclear error: $probe"; exit 1; }
    echo "SKIP: no CUDA device ($(grep -o 'error: .*' <<<"$probe" | head -1))"
    exit 77
fi

for i in $(seq 1 300); do
    echo "the cat sat on the mat. a dog ran to the park. birds sing in the tall green trees."
    echo "one two three four five six seven eight nine ten. red blue green yellow black white."
done >"$T/corpus.txt"
"$DSC" data prepare --input "$T/corpus.txt" --tokenizer byte --out "$T/data" >/dev/null
check "train llama-d2 on the CPU for the checkpoint" -- "$DSC" train --device cpu \
    --data "$T/data" --model llama-d2 --seq-len 64 --max-steps 120 --eval-every 0 \
    --sample-tokens 0 --save-dir "$T/ck" --save-at-end --out "$T/run" >"$T/train.log" 2>&1
printf 'the cat\none two three four\nbirds sing in the\nred\na dog ran to the\n' \
    >"$T/prompts.txt"
G=("$DSC" generate --checkpoint "$T/ck" --prompt-file "$T/prompts.txt" --temperature 0
    --max-new-tokens 24)
"${G[@]}" --device cpu --trace "$T/cpu.jsonl" >"$T/cpu.txt" 2>"$T/cpu.err"
check "greedy on the GPU (grouped-query KV cache)" -- \
    "${G[@]}" --device cuda --trace "$T/gpu.jsonl" >"$T/gpu.txt" 2>"$T/gpu.err"
check "greedy on the GPU without the cache" -- \
    "${G[@]}" --device cuda --no-kv-cache --trace "$T/nc.jsonl" >"$T/nc.txt" 2>"$T/nc.err"
check "greedy on the GPU, no trace (the device's argmax)" -- \
    "${G[@]}" --device cuda >"$T/gpu_argmax.txt" 2>/dev/null
cat "$T/gpu.err"

# same_or_tie GOT REF NAME: equal token lists per sequence, or a near-tie of REF at the first
# difference; prints REF's smallest top-2 margin and the divergences.
same_or_tie() {
    $PY - "$1" "$2" "$3" "$TIE_ABS" "$TIE_REL" <<'PYEOF'
import json, sys
got, ref, name = sys.argv[1:4]
tabs, trel = float(sys.argv[4]), float(sys.argv[5])
def load(path):
    seqs = {}
    for line in open(path):
        r = json.loads(line)
        seqs.setdefault(r["seq"], {})[r["step"]] = r
    return {s: [v[k] for k in sorted(v)] for s, v in seqs.items()}
g, r = load(got), load(ref)
assert sorted(g) == sorted(r) and g, (sorted(g), sorted(r))
margins = [x["top"][0][1] - x["top"][1][1] for s in r for x in r[s]]
print(f"  {name}: reference top-2 margins: min {min(margins):.4f}, median "
      f"{sorted(margins)[len(margins) // 2]:.4f}")
ties = 0
for s in sorted(r):
    a, b = [x["token"] for x in g[s]], [x["token"] for x in r[s]]
    if a == b:
        continue
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    assert k < len(b), f"{name}: sequence {s}: the reference ends before the difference"
    (t1, v1), (t2, v2) = r[s][k]["top"]
    gap, tol = v1 - v2, tabs + trel * abs(v1)
    print(f"  {name}: sequence {s} diverges at token {k}, reference top-2 gap {gap:.4f}, "
          f"near-tie bound {tol:.4f}")
    assert gap <= tol, f"{name}: sequence {s}: not a near-tie"
    ties += 1
print(f"  {name}: {len(r)} sequences, {ties} near-tie divergence(s)")
PYEOF
}
check "GPU (cache) vs CPU: equal tokens, or a near-tie at the first difference" -- \
    same_or_tie "$T/gpu.jsonl" "$T/cpu.jsonl" "gpu vs cpu"
check "GPU cache vs GPU no cache: equal tokens, or a near-tie at the first difference" -- \
    same_or_tie "$T/gpu.jsonl" "$T/nc.jsonl" "cache vs no cache"
check "the first token's two best logits: GPU within bf16 tolerance of the CPU" -- $PY - \
    "$T/gpu.jsonl" "$T/cpu.jsonl" <<'PYEOF'
import json, sys
first = lambda p: {r["seq"]: r for r in map(json.loads, open(p)) if r["step"] == 0}
g, c = first(sys.argv[1]), first(sys.argv[2])
worst = 0.0
for s in c:
    assert g[s]["token"] == c[s]["token"] or abs(c[s]["top"][0][1] - c[s]["top"][1][1]) < 0.05
    for (_, a), (_, b) in zip(g[s]["top"], c[s]["top"]):
        worst = max(worst, abs(a - b) / max(1.0, abs(b)))
print(f"  first token: worst relative difference of the top-2 logits {worst:.2e}")
assert worst < 3e-2, worst
PYEOF
check "the device's argmax gives the traced (host) greedy text" -- \
    cmp -s "$T/gpu.txt" "$T/gpu_argmax.txt"
if cmp -s "$T/gpu.txt" "$T/cpu.txt"; then echo "  GPU text == CPU text"; fi
check "the GPU summary: 120 tokens, the device, the cache" -- \
    bash -c "grep -q 'generated 120 tokens for 5 prompt(s)' '$T/gpu.err' && grep -q '^device ' '$T/gpu.err'"
finish
