# Seed corpus for fuzz_safetensors: a few small valid files (several dtypes, a scalar, an empty
# tensor, metadata, an empty header). Usage: /usr/bin/python3 make_st_seeds.py OUTDIR
import json
import os
import struct
import sys


def write(path, tensors, meta=None):
    header, blob = {}, b""
    if meta:
        header["__metadata__"] = meta
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + blob)


out = sys.argv[1]
os.makedirs(out, exist_ok=True)
write(os.path.join(out, "empty"), [])
write(os.path.join(out, "meta"), [], {"format": "pt"})
write(os.path.join(out, "three"), [
    ("h.0.w", "F32", [2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
    ("ids", "I32", [3], struct.pack("<3i", 7, -8, 9)),
    ("one", "F16", [], struct.pack("<H", 0x3c00)),
], {"format": "pt", "step": "1"})
write(os.path.join(out, "mixed"), [
    ("a", "BF16", [2, 1, 2], bytes(8)),
    ("b", "U8", [0, 5], b""),
    ("c", "I64", [1], struct.pack("<q", -1)),
    ("d", "BOOL", [3], b"\x01\x00\x01"),
])
