#!/usr/bin/env bash
# launch_threads.sh - `dsc launch` with 1, 2 and 4 local ranks of `dsc train` on the CPU, with the
# launcher's thread counts (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = cores / ranks) and without
# them (every rank with one thread per core: what each rank did before the launcher set them).
#
#   bench/launch_threads.sh [DSC_BINARY]
#
# Model $MODEL (default d4), T 64, global batch 8 sequences (micro batch 8 / ranks), AdamW, ZeRO
# stage 1, the built-in data. Tokens/s (global): median of metrics.jsonl's tokens_per_s over
# the steps after $WARMUP (default 3) of $STEPS (default 12). One rank sets nothing (it gets every
# core either way), so its two rows are one run. A last line gives one rank with one thread, for
# reference: on a machine busy with other work OpenMP's barriers across threads cost the most.
set -eu
DSC=${1:-${DSC:-build/dsc}}
MODEL=${MODEL:-d4}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-3}
PY=${PYTHON:-/usr/bin/python3}
[ -x "$DSC" ] || { echo "launch_threads.sh: $DSC is not an executable dsc; pass its path" >&2; exit 2; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
export DSC_DATA_HOME="$W/home" # the built-in data is prepared once, here
CORES=$(nproc)

median_tok_s() { # RUN_DIR
    $PY - "$1/metrics.jsonl" "$WARMUP" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "tokens_per_s" in r][int(sys.argv[2]):]
print(f"{statistics.median(r['tokens_per_s'] for r in rows):.0f}" if rows else "n/a")
PYEOF
}

run() { # RANKS MODE(set|unset) -> prints tokens/s and seconds
    local n=$1 mode=$2 out="$W/run-$1-$2" t0 t1
    cat > "$W/ds$n.json" <<JSON
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": $((8 / n)), "steps_per_print": 100,
 "optimizer": {"type": "AdamW", "params": {"lr": 6e-4, "weight_decay": 0.1}},
 "zero_optimization": {"stage": 1}}
JSON
    local envs=(env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS)
    [ "$mode" = unset ] && envs=(env OMP_NUM_THREADS="$CORES" OPENBLAS_NUM_THREADS="$CORES")
    [ "$mode" = one ] && envs=(env OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)
    t0=$(date +%s.%N)
    "${envs[@]}" "$DSC" launch --num_procs "$n" "$DSC" train --config "$W/ds$n.json" \
        --model "$MODEL" --seq-len 64 --max-steps "$STEPS" --eval-every 0 --sample-tokens 0 \
        --out "$out" > "$out.log" 2>&1 || { echo "run $n $mode failed:" >&2; tail -5 "$out.log" >&2; exit 1; }
    t1=$(date +%s.%N)
    printf '%s %s\n' "$(median_tok_s "$out")" "$($PY -c "print(f'{$t1 - $t0:.1f}')")"
}

"$DSC" train --max-steps 1 --eval-every 0 --sample-tokens 0 --out "$W/warm" > /dev/null 2>&1 # data
echo "dsc launch, $MODEL T 64, global batch 8, $STEPS steps, $CORES cores ($(date -u +%F))"
printf '%-6s  %-28s  %-28s  %s\n' ranks "threads per rank: cores/ranks" "threads per rank: all cores" \
    "speed-up"
for n in 1 2 4; do
    read -r tok_set s_set < <(run "$n" set)
    if [ "$n" -eq 1 ]; then tok_unset=$tok_set s_unset=$s_set
    else read -r tok_unset s_unset < <(run "$n" unset); fi
    ratio=$($PY -c "a, b = '$tok_set', '$tok_unset'; print(f'{float(a) / float(b):.1f}x' if 'n/a' not in (a, b) else 'n/a')")
    printf '%-6s  %-28s  %-28s  %s\n' "$n" "$tok_set tok/s ($s_set s)" "$tok_unset tok/s ($s_unset s)" "$ratio"
done
read -r tok_one s_one < <(run 1 one)
echo "reference: 1 rank with 1 thread: $tok_one tok/s ($s_one s)"
uptime
