#!/usr/bin/env python3
"""fp16 loss scaling: DeepSpeed 0.18.4's scaler, step by step, vs `dsc train`'s.

DeepSpeed's side is its scaler as ZeRO stages 1 and 2 build it (DeepSpeedZeroOptimizer):
CreateLossScaler(dtype=torch.float16, static_loss_scale=fp16.loss_scale, dynamic_scaling=
fp16.loss_scale == 0, dynamic_loss_args=the config's dynamic_loss_scale_args()), which leaves
raise_error_at_min_scale at its default (True). Each optimizer step k uses cur_scale, then the
optimizer calls update_scale(overflow) before anything else; an overflow skips the step. Where
update_scale raises (an overflow with the scale already at min_loss_scale), DeepSpeed's run stops
at that step.

dsc's side: `dsc train` with the same config and DSC_INJECT_OVERFLOW forcing the same overflow
pattern; metrics.jsonl's "loss_scale" (the scale step k used) and "skipped" per step must equal
DeepSpeed's exactly, and where DeepSpeed raises, dsc must exit 1 at the same step (metrics.jsonl
ends just before it) with an error that names the minimum loss scale.

dsc runs one scaler for every ZeRO stage, so the cases run at stages 0 to 3 against ZeRO's scaler.

usage (the venv's python):
  ds_loss_scale.py DSC WORKDIR              run every case, exit 1 on a mismatch
  ds_loss_scale.py --oracle CONFIG --steps N [--overflow 2,5-7]
                                            print DeepSpeed's scale per step (repr), one per line
"""
import argparse
import os
import sys

import parity_train as pt

# The tiny model's gradients, scaled, overflow fp16 by themselves from about 2^17: every case
# keeps its scale at or below this, so that only the forced overflows happen.
MAX_SCALE = 2.0 ** 16


def case(name, fp16, steps, overflow, stage=1, **extra):
    c = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
         "steps_per_print": 1000, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
         "fp16": dict({"enabled": True}, **fp16), "zero_optimization": {"stage": stage}}
    c.update(extra)
    return name, c, steps, overflow


CASES = [
    # no overflow: the scale doubles every window
    case("none_window5", {"initial_scale_power": 4, "loss_scale_window": 5}, 40, None),
    case("none_window20_stage2", {"initial_scale_power": 4, "loss_scale_window": 20}, 200, None,
         stage=2),
    # the defaults (2^16, window 1000, hysteresis 2), overflows from the first step
    case("defaults_first_steps", {}, 80, "1-3,50"),
    # isolated overflows, hysteresis 1/2, consecutive_hysteresis false/true
    case("isolated_hyst1", {"initial_scale_power": 8, "loss_scale_window": 10, "hysteresis": 1},
         150, "7,30,44,80,120"),
    case("isolated_hyst2", {"initial_scale_power": 6, "loss_scale_window": 20, "hysteresis": 2},
         120, "5,15,18,40,70,100"),
    case("isolated_hyst2_consecutive", {"initial_scale_power": 6, "loss_scale_window": 20,
                                        "hysteresis": 2, "consecutive_hysteresis": True},
         120, "5,15,18,40,70,100", stage=2),
    # bursts, hysteresis 3
    case("bursts_hyst3", {"initial_scale_power": 12, "loss_scale_window": 15, "hysteresis": 3},
         150, "10-12,30-31,50-55,57,90-91"),
    case("bursts_hyst3_consecutive", {"initial_scale_power": 12, "loss_scale_window": 15,
                                      "hysteresis": 3, "consecutive_hysteresis": True},
         150, "10-12,30-31,50-55,57,90-91", stage=0),
    case("bursts_hyst2_stage3", {"initial_scale_power": 11, "loss_scale_window": 12},
         120, "3-4,20-23,60,61,62,100-101", stage=3),
    # down to the minimum: DeepSpeed raises at the next overflow there
    case("down_to_min_hyst1", {"initial_scale_power": 4, "loss_scale_window": 20,
                               "hysteresis": 1}, 60, "10-30"),
    case("down_to_min_hyst2", {"initial_scale_power": 3, "loss_scale_window": 10,
                               "hysteresis": 2}, 80, "25-50", stage=2),
    case("down_to_min_hyst3_consecutive", {"initial_scale_power": 3, "loss_scale_window": 10,
                                           "hysteresis": 3, "consecutive_hysteresis": True},
         80, "5,7,9,11-40"),
    # reaching the minimum without another overflow there: the scale recovers
    case("min_8_reached_recovers", {"initial_scale_power": 5, "loss_scale_window": 10,
                                    "hysteresis": 1, "min_loss_scale": 8}, 80, "5,6,40"),
    # a minimum that is not a power of two: the scale is floored at it, then raises
    case("min_3", {"initial_scale_power": 4, "loss_scale_window": 50, "hysteresis": 1,
                   "min_loss_scale": 3}, 40, "10-20"),
    # a minimum above the initial scale: the first "decrease" raises the scale to the minimum
    case("min_above_initial", {"initial_scale_power": 2, "loss_scale_window": 50,
                               "hysteresis": 1, "min_loss_scale": 16}, 30, "5,9"),
    # starting at the minimum: hysteresis refilled after each clean step never lets it raise...
    case("at_min_consecutive", {"initial_scale_power": 0, "loss_scale_window": 20,
                                "hysteresis": 2, "consecutive_hysteresis": True},
         60, "5,7,9,11"),
    # ... but without consecutive_hysteresis the second overflow raises
    case("at_min_not_consecutive", {"initial_scale_power": 0, "loss_scale_window": 20,
                                    "hysteresis": 2}, 60, "5,7,9,11"),
    # hysteresis 0: the countdown goes negative and never reaches 1, so the scale never falls
    case("hysteresis_0", {"initial_scale_power": 6, "loss_scale_window": 10, "hysteresis": 0},
         60, "3-8,20"),
    # static scale: constant, overflowing steps skipped, never an error
    case("static_128", {"loss_scale": 128}, 60, "3,10-12,50"),
    case("static_128_long_burst", {"loss_scale": 128, "min_loss_scale": 128}, 50, "1-40",
         stage=2),
    # the scaler counts optimizer steps, not micro-batches
    case("accumulation_2", {"initial_scale_power": 6, "loss_scale_window": 5}, 50, "4-6,20",
         gradient_accumulation_steps=2),
]


def deepspeed_scales(path, steps, overflow):
    """[(scale step k used, skipped)] and, where DeepSpeed raises, (step, message)."""
    import torch
    from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
    fp16 = pt.ds_config(path).float16_config
    scaler = CreateLossScaler(dtype=torch.float16, static_loss_scale=fp16.loss_scale,
                              dynamic_scaling=fp16.loss_scale == 0,
                              dynamic_loss_args=fp16.dynamic_loss_scale_args())
    seq = []
    for k in range(1, steps + 1):
        used = scaler.cur_scale
        try:
            scaler.update_scale(k in overflow)
        except Exception as e:  # noqa: BLE001 - DeepSpeed raises a bare Exception here
            return seq, (k, str(e))
        seq.append((used, k in overflow))
    return seq, None


def compare_case(dsc, work, name, config, steps, inject):
    """Returns (problems, steps compared, DeepSpeed's raise step or None, its highest scale)."""
    path = pt.write_config(work, name, config)
    ref, raised = deepspeed_scales(path, steps, pt.step_set(inject))
    top = max((s for s, _ in ref), default=0)
    if top > MAX_SCALE:
        return [f"the case itself is wrong: its scale reaches {top:g} > {MAX_SCALE:g}, where "
                "the model overflows by itself"], 0, None, top
    run = pt.run_dsc(dsc, path, os.path.join(work, name), steps, inject)
    problems = []
    if raised is None and (run.rc != 0 or len(run.rows) != steps):
        problems.append(f"dsc train exited {run.rc} with {len(run.rows)} of {steps} steps:\n"
                        + pt.tail(run.output))
    if raised is not None:
        text = run.output.lower()
        if run.rc != 1 or len(run.rows) != raised[0] - 1:
            problems.append(f"DeepSpeed stops at step {raised[0]} ({raised[1]}); dsc exited "
                            f"{run.rc} after {len(run.rows)} logged steps:\n" + pt.tail(run.output))
        elif "minimum" not in text or "min_loss_scale" not in text:
            problems.append("dsc's error does not name the minimum loss scale:\n"
                            + pt.tail(run.output, 2))
    for k, (row, (scale, skipped)) in enumerate(zip(run.rows, ref), start=1):
        if row["step"] != k or row["loss_scale"] != scale or row["skipped"] != skipped:
            problems.append(f"step {k}: dsc loss_scale {row['loss_scale']!r} skipped "
                            f"{row['skipped']}; DeepSpeed {scale!r} skipped {skipped}")
            if len(problems) >= 6:
                break
    return problems, min(len(run.rows), len(ref)), raised, top


def run_all(dsc, work):
    failed = compared = raises = 0
    for name, config, steps, inject in CASES:
        problems, n, raised, top = compare_case(dsc, work, name, config, steps, inject)
        compared += n
        raises += raised is not None
        end = f", DeepSpeed and dsc stop at step {raised[0]}" if raised else ""
        print(f"  {name}: {n} steps compared (stage {config['zero_optimization']['stage']}"
              f", overflows {inject or 'none'}, scale up to {top:g}){end}")
        for p in problems:
            print(f"    MISMATCH {p}")
        failed += bool(problems)
    print(f"loss-scale parity: {len(CASES)} cases, {compared} steps compared exactly, {raises} "
          f"stops at the minimum scale; {failed} case(s) mismatched")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--oracle", metavar="CONFIG")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--overflow", default="", help="optimizer steps that overflow (2,5-7)")
    ap.add_argument("args", nargs="*", help="DSC WORKDIR")
    a = ap.parse_args()
    pt.import_deepspeed()
    if a.oracle:
        seq, raised = deepspeed_scales(a.oracle, a.steps, pt.step_set(a.overflow))
        for scale, _ in seq:
            print(repr(scale))
        if raised:
            print(f"raises at step {raised[0]}: {raised[1]}")
        return 0
    if len(a.args) != 2:
        ap.error("give DSC and WORKDIR, or --oracle CONFIG")
    return run_all(*a.args)


if __name__ == "__main__":
    sys.exit(main())
