#!/usr/bin/env bash
# The dsc command line: verbs, help, flag errors, config check, report.
set -u
. "$(dirname "$0")/lib.sh"
: "${DSC:?set DSC to the dsc binary}"
PY=/usr/bin/python3

expect 0 "usage: dsc <verb>" -- "$DSC" --help
expect 2 "unknown verb 'frobnicate'" -- "$DSC" frobnicate
expect 2 "usage: dsc <verb>" -- "$DSC"
expect 0 "dsc 0." -- "$DSC" --version
expect 0 "usage: dsc bench" -- "$DSC" bench --help
expect 0 "usage: dsc generate" -- "$DSC" generate --help
expect 2 "exactly one of --checkpoint" -- "$DSC" generate

# config check
cat > "$T/ok.json" <<'JSON'
{ "train_batch_size": 32, "gradient_accumulation_steps": 2,
  "optimizer": {"type": "AdamW", "params": {"lr": 6e-5, "weight_decay": 0.01}},
  "fp16": {"enabled": true, "min_loss_scale": 1},
  "zero_optimization": {"stage": 2}, "mystery": 1 }
JSON
expect 0 "train_micro_batch_size_per_gpu" -- "$DSC" config check "$T/ok.json" --world-size 4
expect 0 'unknown key "mystery"' -- "$DSC" config check "$T/ok.json" --world-size 4
expect 0 "1 warning" -- "$DSC" config check "$T/ok.json" --world-size=2
expect 0 "1 warning" -- "$DSC" config check "$T/ok.json" --local_rank=3 # as dsc launch appends it
expect 0 "1 warning" -- "$DSC" config check "$T/ok.json" --local_rank 3
expect 1 "world size (3)" -- "$DSC" config check "$T/ok.json" --world-size 3
expect 2 "unknown flag '--wrld-size'" -- "$DSC" config check "$T/ok.json" --wrld-size 2
expect 2 "expected a whole number" -- "$DSC" config check "$T/ok.json" --world-size two
expect 2 "needs a value" -- "$DSC" config check "$T/ok.json" --world-size
expect 2 "missing argument" -- "$DSC" config check
expect 0 "usage: dsc config check" -- "$DSC" config check --help
expect 1 "cannot open" -- "$DSC" config check "$T/none.json"
printf '{"train_batch_size": 8,\n "fp16": {"enabled": tru}}\n' > "$T/bad.json"
expect 1 "line 2, column" -- "$DSC" config check "$T/bad.json"

# --json is one nested object with the resolved values
"$DSC" config check "$T/ok.json" --world-size 4 --json > "$T/out.json" 2>/dev/null
check "--json output has the derived micro batch" -- $PY -c "
import json,sys
d = json.load(open('$T/out.json'))
assert d['train_micro_batch_size_per_gpu'] == 4, d['train_micro_batch_size_per_gpu']
assert d['zero_optimization']['stage'] == 2
assert d['optimizer']['params']['lr'] == 6e-5
assert d['fp16']['enabled'] is True
"
expect 0 "| \`zero_optimization.stage\` | int" -- "$DSC" config keys
"$DSC" config keys > "$T/keys.md"
check "docs/config.md ends with the table of dsc config keys (run scripts/gen-config-doc.sh)" -- \
  bash -c "tail -n $(wc -l < "$T/keys.md") '$DSC_SOURCE_DIR/docs/config.md' | cmp -s - '$T/keys.md'"

# report
expect 0 "CPU SIMD" -- "$DSC" report
expect 2 "unknown flag" -- "$DSC" report --bogus

finish
