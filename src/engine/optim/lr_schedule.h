// engine/optim/lr_schedule.h - DeepSpeed's learning-rate schedules (config `scheduler`), as pure
// functions of the optimizer step.
//
// DeepSpeed builds the scheduler in deepspeed.initialize() with scheduler.params as keyword
// arguments, last_batch_iteration L among them (default -1). Its constructor writes an lr (and,
// OneCycle, a momentum) into the optimizer only when L == -1; it never calls step(). The engine
// calls scheduler.step() after every optimizer step that was applied (never after a step skipped
// for fp16 overflow), and step() adds 1 to last_batch_iteration before it computes the lr. So
// applied optimizer step k (1-based) runs with
//   k == 1, L == -1: the constructor's values:
//       WarmupLR, WarmupDecayLR: warmup_min_lr    WarmupCosineLR: 0 (its get_lr() before the start)
//       OneCycle: cycle_min_lr (and momentum cycle_min_mom)    LRRangeTest: lr_range_test_min_lr
//   k == 1, L != -1: the optimizer's own lr (optimizer.params.lr) and betas, untouched;
//   k >= 2: the schedule at last_batch_iteration = L + 1 + ... + 1 (k - 1 ones, added one at a
//       time as Python does: exact for a whole L, rounded at each sum for a fractional one).
// dsc_sched_lr_at() returns exactly that sequence; the caller passes the count of applied steps.
#ifndef DSC_ENGINE_OPTIM_LR_SCHEDULE_H
#define DSC_ENGINE_OPTIM_LR_SCHEDULE_H

#include <math.h>    // NAN
#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/status.h" // dsc_status

typedef enum {
    DSC_SCHED_NONE,
    DSC_SCHED_WARMUP_LR,
    DSC_SCHED_WARMUP_DECAY_LR,
    DSC_SCHED_WARMUP_COSINE_LR,
    DSC_SCHED_ONE_CYCLE,
    DSC_SCHED_LR_RANGE_TEST
} dsc_sched_kind;

// scheduler.params.warmup_type. DeepSpeed's WarmupLR and WarmupDecayLR warn about any other string
// (and null) and use "log"; WarmupCosineLR fails on it once a step falls in its warm-up
// (dsc_sched_validate reports both).
typedef enum { DSC_WARMUP_LOG, DSC_WARMUP_LINEAR, DSC_WARMUP_OTHER } dsc_warmup_type;

// Python's None: a parameter DeepSpeed defaults to None, or that was given as null (a required
// parameter left out is refused earlier, by the config layer: engine/sched_config.c).
#define DSC_SCHED_UNSET NAN

// One field per key of scheduler.params, named as DeepSpeed names it. Numbers are doubles because
// DeepSpeed computes with whatever number it is given: step counts may be fractional (a cycle of
// 37.5 steps), zero or negative, and so may last_batch_iteration. Defaults are those of DeepSpeed
// 0.18.4's scheduler constructors (the command-line defaults in lr_schedules.py's argparse differ
// and are not what a JSON config gets).
typedef struct dsc_sched_params {
    dsc_sched_kind kind;

    // WarmupLR, WarmupDecayLR
    double warmup_min_lr;  // 0
    double warmup_max_lr;  // WarmupLR: UNSET = the optimizer's lr; WarmupDecayLR: 0.001 (null:
                           // the optimizer's lr there too)
    // WarmupLR, WarmupDecayLR, WarmupCosineLR
    double warmup_num_steps;     // 1000; DeepSpeed uses max(2, warmup_num_steps)
    dsc_warmup_type warmup_type; // log
    // WarmupDecayLR, WarmupCosineLR
    double total_num_steps; // required

    // WarmupCosineLR: lr = optimizer lr * ratio
    double warmup_min_ratio; // 0 (UNSET: fails during warm-up)
    double cos_min_ratio;    // 0.0001 (UNSET: fails after warm-up)

    // OneCycle
    double cycle_min_lr;             // required
    double cycle_max_lr;             // required (UNSET: fails within the cycle)
    double decay_lr_rate;            // 0
    double cycle_first_step_size;    // 2000
    double cycle_second_step_size;   // UNSET = cycle_first_step_size
    double cycle_first_stair_count;  // 0; stored by DeepSpeed but never used
    double cycle_second_stair_count; // UNSET = cycle_first_stair_count; never used
    double decay_step_size;          // 0 = no post-cycle decay
    bool cycle_momentum;             // true; false for an optimizer without betas (SGD)
    double cycle_min_mom;            // 0.8
    double cycle_max_mom;            // 0.9
    double decay_mom_rate;           // 0

    // LRRangeTest
    double lr_range_test_min_lr;    // 0.001
    double lr_range_test_step_size; // 2000
    double lr_range_test_step_rate; // 1.0
    bool lr_range_test_staircase;   // false

    // every schedule: the iteration the schedule resumes after (-1: it starts from scratch)
    double last_batch_iteration;
} dsc_sched_params;

// OneCycle with cycle_momentum writes param_group['betas'] = (momentum, 0.99): beta2 becomes 0.99
// whatever the optimizer was configured with. DeepSpeed does this only for optimizers whose
// defaults have 'betas' (Adam, AdamW, Lion); for SGD it warns and turns cycle_momentum off.
#define DSC_SCHED_ONE_CYCLE_BETA2 0.99

// DeepSpeed's defaults for `kind` (every field set; the other kinds' fields get theirs too).
void dsc_sched_params_defaults(dsc_sched_kind kind, dsc_sched_params *p);

// "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"; anything else is
// DSC_ERR_CONFIG with a message listing them.
dsc_status dsc_sched_kind_parse(const char *name, dsc_sched_kind *out);
const char *dsc_sched_kind_name(dsc_sched_kind kind); // the config spelling; "none" for NONE

// "log" or "linear"; any other string (and NULL, for null) is DSC_WARMUP_OTHER.
dsc_warmup_type dsc_sched_warmup_type_parse(const char *name);

// DeepSpeed's last_batch_iteration after n calls of scheduler.step() from `from`: Python adds 1
// at a time, so a fractional value is rounded at every sum (whole values add exactly).
double dsc_sched_iteration_after(double from, int64_t n);

// DSC_ERR_CONFIG, naming the key as scheduler.params.<name>, where DeepSpeed's scheduler fails in
// every run long enough: at construction (OneCycle's cycle_first_step_size +
// cycle_second_step_size == 0), at every step() (LRRangeTest's step size 0), once the run reaches
// a phase that divides by zero or uses a None (WarmupCosineLR with total_num_steps equal to the
// warm-up length; its warm-up with an unknown warmup_type or a null warmup_min_ratio; a null
// cos_min_ratio; OneCycle's null cycle_max_lr or cycle_min_mom within the cycle), or a null where
// DeepSpeed computes with it at once (total_num_steps, cycle_min_lr, the cycled momentum's
// parameters). Phases the run never reaches from last_batch_iteration do not count. Warns, as
// DeepSpeed does, about total_num_steps below warmup_num_steps and about an unknown warmup_type
// for WarmupLR/WarmupDecayLR. Failures that occur only at particular steps are reported by
// dsc_sched_lr_at at that step.
dsc_status dsc_sched_validate(const dsc_sched_params *p);

// The lr (and, for OneCycle with cycle_momentum, the momentum = Adam's beta1; *mom is untouched
// otherwise, and at step 1 when last_batch_iteration != -1) that DeepSpeed uses for applied
// optimizer step `step` (1-based; values below 1 count as 1). base_lr is the optimizer's
// configured lr (optimizer.params.lr): NONE returns it, WarmupLR uses it when warmup_max_lr is
// UNSET, WarmupCosineLR scales it, and every schedule returns it at step 1 when
// last_batch_iteration != -1. mom may be NULL.
// DSC_ERR_CONFIG (*lr, *mom unspecified) where DeepSpeed's step() raises computing that step's lr:
// OneCycle's division by zero at the cycle's ends when cycle_first_step_size is 0, and its decay
// when 1 + decay_lr_rate * interval reaches exactly 0.
dsc_status dsc_sched_lr_at(const dsc_sched_params *p, double base_lr, int64_t step, double *lr,
                           double *mom);

#endif
