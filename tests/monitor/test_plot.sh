#!/usr/bin/env bash
# `dsc plot`: two hand-made runs drawn as SVG (checked as XML: panels, axes, legend, colours) and
# as PNG through rsvg-convert (decoded and looked at: background, visible run colours); errors.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
source "$src/tests/cli/lib.sh"
PY=${PYTHON:-python3}
here=$src/tests/monitor

"$PY" "$here/make_runs.py" "$T"
expect 0 "wrote $T/cmp.svg (2 runs)" -- "$DSC" plot "$T/run-a" "$T/run-b/" --out "$T/cmp.svg"
check "SVG: panels, axes, legend, one colour per run" -- "$PY" "$here/plot_check.py" svg "$T/cmp.svg" run-a run-b
expect 0 "wrote $T/run-a/metrics.svg" -- "$DSC" plot "$T/run-a"
expect 0 "(1 run)" -- "$DSC" plot "$T/run-b/metrics.jsonl" --out "$T/b.svg" --smooth 0

if command -v rsvg-convert >/dev/null; then
  expect 0 "wrote $T/cmp.png" -- "$DSC" plot "$T/run-a" "$T/run-b" --out "$T/cmp.png"
  check "PNG: right size, drawn, run colours visible" -- "$PY" "$here/plot_check.py" png "$T/cmp.png" 2
  check "no temporary SVG left beside the PNG" -- test ! -e "$T/cmp.png.tmp.svg"
else
  echo "note: rsvg-convert not installed (Debian package librsvg2-bin); PNG output not tested"
fi
expect 1 "librsvg2-bin" -- env PATH=/nonexistent "$DSC" plot "$T/run-a" --out "$T/x.png"

expect 1 "cannot open $T/nowhere: No such file or directory" -- "$DSC" plot "$T/nowhere"
expect 2 "must end in .svg or .png" -- "$DSC" plot "$T/run-a" --out "$T/x.pdf"
expect 2 "missing argument" -- "$DSC" plot
expect 2 "--smooth" -- "$DSC" plot "$T/run-a" --smooth 2
printf 'not json\n\n' >"$T/bad.jsonl"
expect 1 "no numeric metrics" -- "$DSC" plot "$T/bad.jsonl" --out "$T/bad.svg"
expect 0 "usage: dsc plot" -- "$DSC" plot --help
finish
