# bench/lib_data.sh - sourced by the GPU benchmarks (PY names the interpreter).
#
# free_port: a free TCP port on loopback, for the store of ranks started by hand.
free_port() { $PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# random_shards DIR TRAIN VAL: random GPT-2 token shards in dsc's format (256 int32 header: magic,
# version 1, count; then uint16 tokens, uniform over V 50257, seed 1): DIR/train.bin with TRAIN
# tokens, DIR/val.bin with VAL, and DIR/dataset.json.
random_shards() {
    $PY - "$1" "$2" "$3" <<'PYEOF'
import array, json, os, random, struct, sys
d, ntrain, nval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d)
rng = random.Random(1)
for split, n in (("train", ntrain), ("val", nval)):
    with open(f"{d}/{split}.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        array.array("H", (rng.randrange(50257) for _ in range(n))).tofile(f)
json.dump({"vocab_size": 50257}, open(f"{d}/dataset.json", "w"))
PYEOF
}
