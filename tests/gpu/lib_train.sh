# tests/gpu/lib_train.sh - loss-curve checks shared by the GPU training tests (sourced after
# tests/cli/lib.sh, which sets T; PY names the interpreter).
#
# compare A B FIRST MEAN WORST: runs A and B (metrics.jsonl under $T) have the same steps and lr,
# and their losses (and validation losses) agree: step 1 within FIRST, the mean relative
# difference within MEAN, every step within WORST.
# falls RUN: the loss falls (mean of the last 5 steps below 80% of the first).
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
