#!/usr/bin/env bash
# Regenerate docs/config.md from its hand-written head and the key table (dsc config keys).
set -euo pipefail
cd "$(dirname "$0")/.."
{ cat docs/config.head.md; ./build/dsc config keys; } > docs/config.md
