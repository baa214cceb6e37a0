#!/usr/bin/env bash
# README command 1: install what is missing, build, and run the main job (dsc train on the
# built-in default data).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh
./build/dsc train --out runs/default
