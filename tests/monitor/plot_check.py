#!/usr/bin/env python3
"""Check a `dsc plot` picture the way a reader would look at it.

  plot_check.py svg FILE.svg RUN_NAME... : well-formed SVG; the expected panel titles and axis
      labels; every run in the legend; one colour per run in the curves; every curve point inside
      the picture.
  plot_check.py png FILE.png N_RUNS      : a PNG of the SVG's size, mostly white background with
      drawn lines, and the first N_RUNS palette colours present (decoded here with zlib only).
"""
import re
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e"]
SVG = "{http://www.w3.org/2000/svg}"
PANELS = ["Loss (train and validation)", "Learning rate", "Throughput",
          "Gradient norm (before clipping)", "Loss scale", "GPU allocated", "Comm time"]


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def check_svg(path, runs):
    root = ET.parse(path).getroot()
    width, height = float(root.get("width")), float(root.get("height"))
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    for title in PANELS:
        if title not in texts:
            fail(f"panel '{title}' missing; titles: {[t for t in texts if len(t) > 8]}")
    for label in ["step", "cross-entropy (nats)", "tokens / s", "learning rate"]:
        if label not in texts:
            fail(f"axis label '{label}' missing")
    if not any(re.fullmatch(r"\d+(\.\d+)? GiB", t) for t in texts):
        fail("no GiB tick labels on the bytes panel")
    if not any(re.fullmatch(r"\d+(\.\d+)?e-\d+", t) for t in texts):
        fail("no short exponent tick labels (like 5e-4) on the learning-rate panel")
    for name in runs:
        if not any(t.startswith(name + ":") for t in texts):
            fail(f"run '{name}' not in the legend")
    colours = {}
    for pl in root.iter(SVG + "polyline"):
        colours[pl.get("stroke")] = colours.get(pl.get("stroke"), 0) + 1
        pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
        if not pts:
            fail("an empty polyline")
        for x, y in pts:
            if not (0 <= x <= width and 0 <= y <= height):
                fail(f"point {x},{y} outside the {width}x{height} picture")
    for c in PALETTE[:len(runs)]:
        if colours.get(c, 0) < 6:
            fail(f"colour {c} used by {colours.get(c, 0)} curves; expected one per panel")
    dashed = [pl for pl in root.iter(SVG + "polyline") if pl.get("stroke-dasharray")]
    if len(dashed) != len(runs):
        fail(f"{len(dashed)} dashed validation curves for {len(runs)} runs")
    print(f"svg: {len(texts)} texts, {sum(colours.values())} curves, {width:.0f}x{height:.0f}")


def png_pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("not a PNG file")
    pos, idat, hdr = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            hdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = hdr
    if depth != 8 or ctype not in (2, 6) or interlace:
        fail(f"unexpected PNG format depth {depth} colour type {ctype}")
    bpp = 4 if ctype == 6 else 3
    raw, stride, rows, prev = zlib.decompress(idat), w * bpp, [], bytearray(w * bpp)
    for r in range(h):
        f, line = raw[r * (stride + 1)], bytearray(raw[r * (stride + 1) + 1:(r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def check_png(path, nruns):
    w, h, bpp, rows = png_pixels(path)
    if w != 1280 or h < 600:
        fail(f"PNG is {w}x{h}, expected 1280 wide")
    counts, white, total = {}, 0, 0
    for line in rows[::2]:
        for i in range(0, len(line), bpp * 2):
            rgb = "#%02x%02x%02x" % tuple(line[i:i + 3])
            total += 1
            white += rgb in ("#ffffff", "#fbfbfb")
            counts[rgb] = counts.get(rgb, 0) + 1
    if not 0.6 < white / total < 0.99:
        fail(f"{100 * white / total:.1f}% of the picture is background: blank or cluttered")
    for c in PALETTE[:nruns]:
        if counts.get(c, 0) < 50:
            fail(f"run colour {c} barely visible ({counts.get(c, 0)} pixels sampled)")
    print(f"png: {w}x{h}, {100 * white / total:.0f}% background, run colours visible")


if __name__ == "__main__":
    if sys.argv[1] == "svg":
        check_svg(sys.argv[2], sys.argv[3:])
    else:
        check_png(sys.argv[2], int(sys.argv[3]))
