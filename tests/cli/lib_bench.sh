# tests/cli/lib_bench.sh - checks of `dsc bench --json` output, shared by the CPU and GPU tests
# (sourced; PY names the interpreter).
#
# json_ok FILE WORLD OPS SIZES: the --json lines hold every (op, size) once, every result checked,
# the world and the bandwidths DeepSpeed's formulas give for the duration.
json_ok() {
    $PY - "$@" <<'PYEOF'
import json, sys
path, world, ops, sizes = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4]
sizes = [int(x) for x in sizes.split(",")]
rows = [json.loads(l) for l in open(path)]
seen = sorted((r["op"], r["bytes"]) for r in rows)
want = sorted((o, s) for o in ops for s in sizes)
assert seen == want, (seen, want)
for r in rows:
    assert r["checked"] is True, r
    n = 2 if r["op"] == "pt2pt" else world
    assert r["world"] == n, r
    rate = r["bytes"] / r["seconds"] * 8 / 1e9
    alg, bus = {"all_reduce": (2 * rate, rate * 2 * (n - 1) / n),
                "all_gather": (n * rate, rate * (n - 1)),
                "reduce_scatter": (n * rate, rate * (n - 1))}.get(r["op"], (rate, rate))
    for got, exp in ((r["algbw_gbps"], alg), (r["busbw_gbps"], bus)):
        assert abs(got - exp) <= 1e-4 * abs(exp) + 1e-9, (r, alg, bus)
    assert r["seconds"] > 0 and r["count"] * (4 if r["dtype"] == "f32" else 2) == r["bytes"], r
print(f"  {len(rows)} measurements, world {world}: ok")
PYEOF
}
