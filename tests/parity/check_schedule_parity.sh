#!/usr/bin/env bash
# Parity of the learning-rate schedules with DeepSpeed 0.18.4: every scheduler type with several
# parameter sets, 300 optimizer steps each, DeepSpeed's lr per step (its lr_schedules classes built
# as its engine builds them) vs `dsc train`'s metrics.jsonl, including fp16 runs whose forced
# overflows must not advance the schedule. The cases are in ds_schedules.py. DeepSpeed is
# installed by scripts/install-deepspeed.sh; without it (no network) this test prints SKIP and
# passes.
set -uo pipefail
: "${DSC:?set DSC to the dsc binary}"
src=${DSC_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
here=$src/tests/parity
source "$src/tests/cli/lib.sh"
export DSC_DATA_HOME="$T/home"

install_log=$(bash "$src/scripts/install-deepspeed.sh" 2>&1)
py=$(tail -n 1 <<<"$install_log")
if [ ! -x "$py" ]; then
  echo "$install_log"
  echo "SKIP: *** LR schedule parity NOT TESTED: the DeepSpeed oracle could not be installed ***"
  finish
  exit 0
fi

mkdir -p "$T/work"
check "every schedule's lr at every step agrees with DeepSpeed" -- \
  "$py" "$here/ds_schedules.py" "$DSC" "$T/work"

# The oracle alone, for a person checking one config: WarmupLR's first steps, then a skipped step
# (step 3) that leaves the lr of step 4 where it was.
printf '{"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.2,
 "warmup_num_steps": 10, "warmup_type": "linear"}}}' >"$T/one.json"
check "the oracle prints DeepSpeed's lr per step" -- bash -c \
  "diff <('$py' '$here/ds_schedules.py' --oracle '$T/one.json' --steps 5 --skip 3 2>/dev/null) \
        <(printf '0.1\n0.1\n0.11000000000000001\n0.11000000000000001\n0.12000000000000001\n')"
finish
