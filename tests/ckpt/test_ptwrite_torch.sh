#!/usr/bin/env bash
# Real torch loads what dsc's writer of torch.save files (src/engine/ckpt/ptwrite.c) writes:
# ptwrite_emit writes files of tensors of every dtype, plain values, an OrderedDict, large
# containers, plain objects and a ZIP64 layout; ptwrite_check.py builds the same values and
# compares them with torch.load's (and weights_only=True's) bit for bit, the pickle with
# torch.save's opcode for opcode, and the zip layout with torch's.
# Exit 77 (skipped) when /usr/bin/python3 cannot import torch.
set -u
: "${DSC_SOURCE_DIR:?}" "${DSC_BINARY_DIR:?}"
PY=/usr/bin/python3
EMIT=${PTWRITE_EMIT:-$DSC_BINARY_DIR/tests/ptwrite_emit}
if ! $PY -c 'import torch' 2>/dev/null; then
  echo "SKIP: $PY cannot import torch (install python3-torch)"
  exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
if ! "$EMIT" "$T"; then
  echo "FAIL: $EMIT could not write the files"
  exit 1
fi
$PY "$DSC_SOURCE_DIR/tests/ckpt/ptwrite_check.py" "$T"
