# tests/gpu/lib_train.sh - loss-curve checks shared by the GPU training tests (sourced after
# tests/cli/lib.sh, which sets T; PY names the interpreter).
#
# compare A B FIRST MEAN WORST: runs A and B (metrics.jsonl under $T) have the same steps and lr,
# and their losses (and validation losses) agree: step 1 within FIRST, the mean relative
# difference within MEAN, every step within WORST.
# falls RUN: the loss falls (mean of the last 5 steps below 80% of the first).
# run_ranks, cols, cfg, run_one, gpu_or_skip: below.
compare() {
    $PY - "$T/$1/metrics.jsonl" "$T/$2/metrics.jsonl" "$3" "$4" "$5" <<'PYEOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
first, mean, most = map(float, sys.argv[3:6])
assert len(a) == len(b) and a, f"{len(a)} vs {len(b)} steps"
rel = lambda x, y: abs(x - y) / abs(x)
diffs = []
for x, y in zip(a, b):
    assert x["step"] == y["step"]
    assert rel(x["lr"], y["lr"]) <= 1e-12 if x["lr"] else y["lr"] == 0, f"lr at step {x['step']}"
    for k in ("loss", "val_loss"):
        if k in x or k in y:
            assert k in x and k in y, f"step {x['step']}: {k} in one run only"
            diffs.append(rel(x[k], y[k]))
            assert diffs[-1] <= most, f"step {x['step']} {k}: {x[k]} vs {y[k]} (> {most})"
d1 = rel(a[0]["loss"], b[0]["loss"])
avg = sum(diffs) / len(diffs)
print(f"  {sys.argv[1].split('/')[-2]} vs {sys.argv[2].split('/')[-2]}: step 1 {d1:.2e}, "
      f"mean {avg:.2e}, worst {max(diffs):.2e} over {len(a)} steps")
assert d1 <= first and avg <= mean, (d1, avg)
PYEOF
}
falls() {
    $PY -c "
import json, sys
l = [json.loads(x)['loss'] for x in open('$T/$1/metrics.jsonl')]
print(f'  $1: loss {l[0]:.4f} -> {sum(l[-5:]) / 5:.4f}')
sys.exit(0 if sum(l[-5:]) / 5 < 0.8 * l[0] else 1)"
}

# run_ranks NAME WORLD CONFIG [flags...]: WORLD ranks of `dsc train --device cuda` (d2, T 64, seed
# 7) with torch-style variables, rank r on GPU r (LOCAL_RANK % visible devices); the caller's
# environment (DSC_COMM_BACKEND) passes through. Logs in $T/NAME.RANK.log, the run in $T/NAME.
run_ranks() {
    local name=$1 world=$2 conf=$3 port pids=() r rc=0
    shift 3
    port=$(free_port)
    for ((r = 0; r < world; r++)); do
        RANK=$r WORLD_SIZE=$world LOCAL_RANK=$r LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port timeout 300 "$DSC" train --device cuda --config "$conf" \
            --data "$T/data" --model d2 --seq-len 64 --seed 7 --eval-every 10 --eval-batches 4 \
            --sample-tokens 0 --out "$T/$name" "$@" >"$T/$name.$r.log" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    [ $rc -eq 0 ] || { echo "run $name failed:"; tail -5 "$T/$name".*.log; }
    return $rc
}

# cols METRICS: step, loss, lr, grad norm, skipped and validation loss of every step, exactly.
cols() { $PY -c "
import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    print(r['step'], repr(r['loss']), repr(r['lr']), repr(r['grad_norm']), r['skipped'], repr(r.get('val_loss')))
" "$1"; }

# cfg FILE EXTRA_JSON: AdamW + warm-up/cosine + clipping + accumulation 2 (micro-batch 4), plus
# EXTRA_JSON (the precision, ZeRO sections), for the one-rank GPU training tests.
cfg() {
    cat >"$1" <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "steps_per_print": 100,
 "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.01}},
 "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 5, "total_num_steps": 40}}
 $2}
JSON
}

# run_one NAME DEVICE CONFIG STEPS [FLAGS...]: one rank of `dsc train` (the model $MODEL, d2 by
# default; T 64, seed 7, default data) into $T/NAME; a failure counts and shows the log.
run_one() {
    local name=$1 dev=$2 conf=$3 steps=$4
    shift 4
    "$DSC" train --device "$dev" --config "$conf" --model "${MODEL:-d2}" --seq-len 64 --max-steps "$steps" \
        --seed 7 --eval-every 10 --eval-batches 4 --sample-tokens 0 --out "$T/$name" "$@" \
        >"$T/$name.log" 2>&1 || { echo "FAIL: run $name"; cat "$T/$name.log"; failed=$((failed+1)); }
}

# gpu_or_skip: exit 77 (the suite's "skipped") when this dsc has no usable CUDA device.
gpu_or_skip() {
    local probe
    probe=$("$DSC" train --device cuda --model d1 --max-steps 1 --sample-tokens 0 --out "$T/probe" 2>&1)
    if grep -qE "no CUDA device is usable|built without the CUDA kernels" <<<"$probe"; then
        echo "SKIP: no CUDA device ($(grep -o 'error: .*' <<<"$probe" | head -1))"
        finish >/dev/null
        exit 77
    fi
}
