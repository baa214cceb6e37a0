#!/usr/bin/env bash
# Parity of the learning-rate schedules with DeepSpeed 0.18.4: every scheduler type with several
# parameter sets, 300 optimizer steps each, DeepSpeed's lr per step (its lr_schedules classes built
# as its engine builds them) vs `dsc train`'s metrics.jsonl, bit for bit: last_batch_iteration
# (resumed, negative, fractional), fractional, zero and negative step sizes, null parameters, fp16
# runs whose forced overflows must not advance the schedule; and the configs DeepSpeed's scheduler
# fails on, which dsc must refuse (at the same step where DeepSpeed fails at one step). The cases
# are in ds_schedules.py. DeepSpeed is installed by scripts/install-deepspeed.sh; without it (no
# network) this test prints SKIP and passes.
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
check "every schedule's lr at every step agrees with DeepSpeed, and dsc fails where it fails" -- \
  "$py" "$here/ds_schedules.py" "$DSC" "$T/work"

# dsc's refusal of a key the schedule does not take, seen as a user sees it: exit 1, the key named.
printf '{"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10, "total_num_steps": 100}}}' \
  >"$T/extra.json"
expect 1 "scheduler.params.total_num_steps is not a parameter of WarmupLR" -- "$DSC" train \
  --config "$T/extra.json" --model d1 --seq-len 8 --max-steps 10 --sample-tokens 0 \
  --eval-every 0 --threads 1 --out "$T/extra"

# The oracle alone, for a person checking one config: a linear warm-up resumed after iteration 3
# (step 1 keeps the optimizer's lr, step 2 uses iteration 4), then a skipped step (step 3) that
# leaves the lr of step 4 where it was.
printf '{"train_batch_size": 1, "optimizer": {"type": "Adam", "params": {"lr": 0.001}},
 "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.2,
 "warmup_num_steps": 10, "warmup_type": "linear", "last_batch_iteration": 3}}}' >"$T/one.json"
check "the oracle prints DeepSpeed's lr per step" -- bash -c \
  "diff <('$py' '$here/ds_schedules.py' --oracle '$T/one.json' --steps 5 --skip 3 2>/dev/null) \
        <(printf '0.001\n0.14\n0.15000000000000002\n0.15000000000000002\n0.16\n')"
finish
