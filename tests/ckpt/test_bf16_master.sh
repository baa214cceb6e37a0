#!/usr/bin/env bash
# bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states on the CPU engine: GPT-2 and
# Llama train at ZeRO 1-3 (DeepSpeed allows no other stage), the master weights and moments hold
# bf16 values only, resume after K steps equals an uninterrupted run byte for byte (1 and 2 ranks),
# export works in fp32 and bf16, an fp32-master checkpoint resumes into bf16 master with a log
# line, the memory plan has no fp32 master, and the refusals name the key and the fix.
set -u
. "$(dirname "$0")/lib.sh"
K=6 M=12
KEYS='"bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true}'

# low16 FILE: exit 0 when every F32 tensor of the safetensors FILE holds bf16 values only
low16() { $PY - "$1" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
bad = 0
for k, t in h.items():
    if k == '__metadata__' or t['dtype'] != 'F32': continue
    s, e = t['data_offsets']
    words = struct.unpack('<%dI' % ((e - s) // 4), b[8 + n + s:8 + n + e])
    bad += sum(1 for w in words if w & 0xffff)
sys.exit(1 if bad else 0)
PY
}

# losses_fall DIR: the last step's loss is below the first's
losses_fall() { $PY - "$1/metrics.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if r[-1]['loss'] < r[0]['loss'] - 0.5 else 1)
PY
}

for st in 1 2 3; do
  config "$T/b$st.json" $st ", $KEYS"
  for w in 1 2; do
    n="w${w}s$st"
    check "$n: uninterrupted run to $M" -- run "$n.full" $w "$T/b$st.json" --max-steps $M --save-dir "$T/$n.full.ck" --save-at-end
    check "$n: run to $K" -- run "$n.a" $w "$T/b$st.json" --max-steps $K --save-dir "$T/$n.ck" --save-at-end
    check "$n: resume to $M" -- run "$n.b" $w "$T/b$st.json" --max-steps $M --save-dir "$T/$n.ck" --resume --save-at-end
    check "$n: the loss falls" -- losses_fall "$T/$n.full"
    export_latest "$T/$n.full.ck" "$T/$n.full.st"
    export_latest "$T/$n.ck" "$T/$n.b.st"
    check "$n: final weights identical" -- cmp -s "$T/$n.full.st" "$T/$n.b.st"
    check "$n: losses after step $K identical" -- cmp -s <(cols "$T/$n.full/metrics.jsonl" $K) <(cols "$T/$n.b/metrics.jsonl" $K)
    check "$n: exported weights are bf16 values" -- low16 "$T/$n.full.st"
    check "$n: saved master and moments are bf16 values" -- low16 "$T/$n.full.ck/global_step$M/shard_rank0_of_$w.safetensors"
  done
done
# bf16_master_rounding "stochastic": the random bits hash the step and the flat index, so a resumed
# run equals the uninterrupted one byte for byte on 1 and 2 ranks, and the rounding acts.
sed 's/"bf16": {/"bf16_master_rounding": "stochastic", "bf16": {/' "$T/b2.json" >"$T/sr.json"
for w in 1 2; do
  check "sr w$w: uninterrupted run to $M" -- run "sr$w.full" $w "$T/sr.json" --max-steps $M --save-dir "$T/sr$w.full.ck" --save-at-end
  check "sr w$w: run to $K" -- run "sr$w.a" $w "$T/sr.json" --max-steps $K --save-dir "$T/sr$w.ck" --save-at-end
  check "sr w$w: resume to $M" -- run "sr$w.b" $w "$T/sr.json" --max-steps $M --save-dir "$T/sr$w.ck" --resume --save-at-end
  export_latest "$T/sr$w.full.ck" "$T/sr$w.full.st"
  export_latest "$T/sr$w.ck" "$T/sr$w.b.st"
  check "sr w$w: final weights identical" -- cmp -s "$T/sr$w.full.st" "$T/sr$w.b.st"
  check "sr w$w: the loss falls" -- losses_fall "$T/sr$w.full"
  check "sr w$w: weights are bf16 values" -- low16 "$T/sr$w.full.st"
  check "sr w$w: stochastic rounding gives other weights than nearest" -- bash -c "! cmp -s '$T/sr$w.full.st' '$T/w${w}s2.full.st'"
done
sed 's/"bf16": {"enabled": true, [^}]*}/"bf16": {"enabled": true}/; s/"bf16": {/"bf16_master_rounding": "stochastic", "bf16": {/' "$T/b2.json" >"$T/sr_nomaster.json"
check "stochastic rounding without bf16 master weights is warned about" -- bash -c "'$DSC' config check '$T/sr_nomaster.json' 2>&1 | grep -q 'bf16_master_rounding \"stochastic\" rounds bf16 master weights, and this config has none'"
check "manifest records the precisions" -- grep -q '"moments_precision": "bf16"' "$T/w1s2.full.ck/global_step$M/manifest.json"
check "manifest records the master precision" -- grep -q '"master_precision": "bf16"' "$T/w1s2.full.ck/global_step$M/manifest.json"

# export in bf16: the bf16 master exactly (no rounding left to do)
check "export --dtype bf16" -- "$DSC" ckpt export "$T/w1s2.full.ck" --out "$T/bf.st" --dtype bf16
check "bf16 export equals the fp32 export's upper halves" -- $PY - "$T/bf.st" "$T/w1s2.full.st" <<'PY'
import json, struct, sys
def load(p):
    b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8 + n])
    return {k: (t['dtype'], b[8 + n + t['data_offsets'][0]:8 + n + t['data_offsets'][1]])
            for k, t in h.items() if k != '__metadata__'}
a, f = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == f.keys()
for k in a:
    assert a[k][0] == 'BF16' and f[k][0] == 'F32'
    assert a[k][1] == b''.join(f[k][1][i + 2:i + 4] for i in range(0, len(f[k][1]), 4)), k
PY

# An fp32-master checkpoint (bf16 training) resumes into bf16 master, rounded, and says so.
config "$T/plain.json" 2 ', "bf16": {"enabled": true}'
check "fp32 master run to $K" -- run conv.a 1 "$T/plain.json" --max-steps $K --save-dir "$T/conv.ck" --save-at-end
check "resume it with bf16 master" -- run conv.b 1 "$T/b2.json" --max-steps $M --save-dir "$T/conv.ck" --resume --save-at-end
check "the resume says it rounds" -- grep -q "master weights saved in fp32 continue in bf16 (rounded to nearest even bf16" "$T/conv.b.0.log"
export_latest "$T/conv.ck" "$T/conv.st"
check "the converted run's weights are bf16 values" -- low16 "$T/conv.st"
# and back: a bf16-master checkpoint continues with an fp32 master, widened exactly
check "resume the bf16 checkpoint with an fp32 master" -- run back 1 "$T/plain.json" --max-steps $((M + 2)) --save-dir "$T/w1s2.full.ck" --resume
check "the resume says it widens" -- grep -q "master weights saved in bf16 continue in fp32 (widened exactly)" "$T/back.0.log"

# Llama at ZeRO 1-3 on 2 ranks: the loss falls.
for st in 1 2 3; do
  check "llama-d2 stage $st trains" -- run "ll$st" 2 "$T/b$st.json" --max-steps $M --model llama-d2
  check "llama-d2 stage $st: the loss falls" -- losses_fall "$T/ll$st"
done

# The memory plan: no fp32 master (the bf16 weights are the master); the banner says so.
plan() { "$DSC" config check "$1" --model d2 --json | $PY -c "import json,sys; print(json.load(sys.stdin)['memory_plan']['host']['$2'])"; }
check "plan: bf16 training keeps an fp32 master" -- test "$(plan "$T/plain.json" master)" -gt 0
check "plan: bf16 master keeps none" -- test "$(plan "$T/b2.json" master)" = 0
check "banner names the mode" -- grep -q "bf16 master, gradients and moments" "$T/w1s2.full.0.log"
# the banner's host total (MiB) of a run's log
hostmib() { sed -n 's/^memory plan per rank .*: host \([0-9]*\) MiB of.*/\1/p' "$1" | head -n 1; }
run pl1 1 "$T/plain.json" --max-steps 1
run bf1 1 "$T/b2.json" --max-steps 1
LIM=$(( ($(hostmib "$T/pl1.0.log") + $(hostmib "$T/bf1.0.log")) * 512 * 1024 ))
DSC_HOST_MEM_LIMIT=$LIM run sugg 1 "$T/plain.json" --max-steps 1
check "a run that does not fit is told the keys would" -- grep -q "would fit: bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states" "$T/sugg.0.log"

# Refusals: stage 0, states without master weights; bf16 not enabled: a warning (DeepSpeed
# accepts it, and the key then does nothing).
config "$T/r0.json" 0 ", $KEYS"
config "$T/r1.json" 2 ', "bf16": {"enabled": false, "bf16_master_weights_and_grads": true}'
config "$T/r2.json" 2 ', "bf16": {"enabled": true, "bf16_optimizer_states": true}'
check "stage 0 refused" -- bash -c "'$DSC' config check '$T/r0.json' 2>&1 | grep -q 'bf16.bf16_master_weights_and_grads needs ZeRO stage 1, 2 or 3'"
check "stage 0 exits non-zero" -- bash -c "! '$DSC' config check '$T/r0.json' >/dev/null 2>&1"
check "bf16.enabled false warned about" -- bash -c "'$DSC' config check '$T/r1.json' 2>&1 | grep -q 'has no effect without bf16.enabled true'"
check "states without master refused" -- bash -c "'$DSC' config check '$T/r2.json' 2>&1 | grep -q 'bf16_optimizer_states needs bf16.bf16_master_weights_and_grads'"
# On a GPU the keys keep master, gradients and moments on the device; with the optimizer
# offloaded from one GPU they are refused (its streamed CPU step keeps an fp32 master), while
# several host-staged ranks (the engine's own CPU step) take them.
check "--device cuda takes the keys" -- "$DSC" config check "$T/b2.json" --model d2 --device cuda
sed 's/"stage": 2/"stage": 2, "offload_optimizer": {"device": "cpu"}/' "$T/b2.json" >"$T/b2off.json"
check "--device cuda with offload_optimizer refused, naming the keys and the way out" -- bash -c "'$DSC' config check '$T/b2off.json' --model d2 --device cuda 2>&1 | grep -q 'bf16.bf16_master_weights_and_grads with zero_optimization.offload_optimizer \"cpu\" is not built.*offload_optimizer.device to \"none\"'"
check "--device cuda with offload_optimizer on 2 host-staged ranks takes the keys" -- "$DSC" config check "$T/b2off.json" --model d2 --device cuda --world-size 2
finish
