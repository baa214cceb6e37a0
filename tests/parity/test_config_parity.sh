#!/usr/bin/env bash
# Parity of `dsc config check` with DeepSpeed 0.18.4's DeepSpeedConfig: the same files accepted
# and rejected, the same resolved values, at world sizes 1, 2, 3 and 8. Configs: our corpus
# (tests/parity/configs) and the real-world ones in ../shared/data/ds-configs when present.
# DeepSpeed is installed by scripts/install-deepspeed.sh; without it (no network) this test
# prints SKIP and passes.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
here=$src/tests/parity
source "$src/tests/cli/lib.sh"

install_log=$(bash "$src/scripts/install-deepspeed.sh" 2>&1)
py=$(tail -n 1 <<<"$install_log")
if [ ! -x "$py" ]; then
  echo "$install_log"
  echo "SKIP: *** DeepSpeed parity NOT TESTED: the DeepSpeed oracle could not be installed ***"
  echo "SKIP: (scripts/install-deepspeed.sh needs network access once to fill its venv)"
  finish
  exit 0
fi

files=("$here"/configs/*)
shared=$src/../shared/data/ds-configs
if [ -d "$shared" ]; then
  files+=("$shared"/*.json)
else
  echo "note: $shared not present; comparing our corpus only"
fi

worlds=(--world-size 1 --world-size 2 --world-size 3 --world-size 8)
oracle=$T/oracle.jsonl
if ! "$py" "$here/ds_oracle.py" "${worlds[@]}" "${files[@]}" >"$oracle" 2>"$T/oracle.err"; then
  echo "FAIL: the DeepSpeed oracle crashed:"; tail -20 "$T/oracle.err"; failed=$((failed+1))
else
  check "dsc config check agrees with DeepSpeed (or differs only as documented)" -- \
    "$py" "$here/compare_configs.py" "$DSC" "$oracle" "$here/expected-differences.txt"
fi

# The oracle alone also answers for one file, as `dsc config check --json` does.
expect 0 '"verdict": "ok"' -- "$py" "$here/ds_oracle.py" --world-size 2 "$here/configs/batch_tb32_mb4.json"
expect 0 '"train_micro_batch_size_per_gpu": 4' -- "$DSC" config check "$here/configs/batch_tb32_mb4.json" --world-size 2 --json
finish
