// engine/optim/lr_schedule.h - DeepSpeed's learning-rate schedules (config `scheduler`), as pure
// functions of the optimizer step.
//
// DeepSpeed builds the scheduler in deepspeed.initialize() with last_batch_iteration = -1; the
// constructor already writes an lr into the optimizer, and the engine calls scheduler.step() after
// every optimizer step that was applied (never after a step skipped for fp16 overflow). So applied
// optimizer step k (1-based) runs with the value the scheduler computed for
// last_batch_iteration = k - 2, and step 1 runs with the constructor's value:
//   WarmupLR, WarmupDecayLR: warmup_min_lr    WarmupCosineLR: 0 (its get_lr() before the start)
//   OneCycle: cycle_min_lr (and momentum cycle_min_mom)    LRRangeTest: lr_range_test_min_lr
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
// and use "log"; WarmupCosineLR fails on it (dsc_sched_validate reports both).
typedef enum { DSC_WARMUP_LOG, DSC_WARMUP_LINEAR, DSC_WARMUP_OTHER } dsc_warmup_type;

// A parameter DeepSpeed defaults to None, or that has no default and must be given.
#define DSC_SCHED_UNSET NAN

// One field per key of scheduler.params, named as DeepSpeed names it. Numbers are doubles because
// DeepSpeed treats them as Python numbers (a step count written 1e5 works there). Defaults are
// those of DeepSpeed 0.18.4's scheduler constructors (the command-line defaults in
// lr_schedules.py's argparse differ and are not what a JSON config gets).
typedef struct dsc_sched_params {
    dsc_sched_kind kind;

    // WarmupLR, WarmupDecayLR
    double warmup_min_lr;  // 0
    double warmup_max_lr;  // WarmupLR: UNSET = the optimizer's lr; WarmupDecayLR: 0.001
    // WarmupLR, WarmupDecayLR, WarmupCosineLR
    double warmup_num_steps;     // 1000; DeepSpeed uses max(2, warmup_num_steps)
    dsc_warmup_type warmup_type; // log
    // WarmupDecayLR, WarmupCosineLR
    double total_num_steps; // required (UNSET)

    // WarmupCosineLR: lr = optimizer lr * ratio
    double warmup_min_ratio; // 0
    double cos_min_ratio;    // 0.0001

    // OneCycle
    double cycle_min_lr;             // required (UNSET)
    double cycle_max_lr;             // required (UNSET)
    double decay_lr_rate;            // 0
    double cycle_first_step_size;    // 2000
    double cycle_second_step_size;   // UNSET = cycle_first_step_size
    double cycle_first_stair_count;  // 0; stored by DeepSpeed but never used
    double cycle_second_stair_count; // UNSET = cycle_first_stair_count; never used
    double decay_step_size;          // 0 = no post-cycle decay
    bool cycle_momentum;             // true
    double cycle_min_mom;            // 0.8
    double cycle_max_mom;            // 0.9
    double decay_mom_rate;           // 0

    // LRRangeTest
    double lr_range_test_min_lr;    // 0.001
    double lr_range_test_step_size; // 2000
    double lr_range_test_step_rate; // 1.0
    bool lr_range_test_staircase;   // false
} dsc_sched_params;

// OneCycle with cycle_momentum writes param_group['betas'] = (momentum, 0.99): beta2 becomes 0.99
// whatever the optimizer was configured with. DeepSpeed does this only for optimizers whose
// defaults have 'betas' (Adam, AdamW, Lion); for SGD it warns and leaves momentum alone.
#define DSC_SCHED_ONE_CYCLE_BETA2 0.99

// DeepSpeed's defaults for `kind` (every field set; the other kinds' fields get theirs too).
void dsc_sched_params_defaults(dsc_sched_kind kind, dsc_sched_params *p);

// "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"; anything else is
// DSC_ERR_CONFIG with a message listing them.
dsc_status dsc_sched_kind_parse(const char *name, dsc_sched_kind *out);
const char *dsc_sched_kind_name(dsc_sched_kind kind); // the config spelling; "none" for NONE

// "log" or "linear"; any other string is DSC_WARMUP_OTHER (see dsc_warmup_type).
dsc_warmup_type dsc_sched_warmup_type_parse(const char *name);

// DSC_ERR_CONFIG, naming the key as scheduler.params.<name>, where DeepSpeed would raise: a
// required parameter missing, a division by zero it would hit (LRRangeTest step size 0, OneCycle
// cycle length or first step size 0, WarmupCosineLR total_num_steps equal to the warmup length),
// WarmupCosineLR with an unknown warmup_type. Warns, as DeepSpeed does, about total_num_steps
// below warmup_num_steps and about an unknown warmup_type for WarmupLR/WarmupDecayLR.
dsc_status dsc_sched_validate(const dsc_sched_params *p);

// The lr (and, for OneCycle with cycle_momentum, the momentum = Adam's beta1; *mom is untouched
// otherwise) that DeepSpeed uses for applied optimizer step `step` (1-based; values below 1 count
// as 1). base_lr is the optimizer's configured lr (optimizer.params.lr): NONE returns it, WarmupLR
// uses it when warmup_max_lr is UNSET, WarmupCosineLR scales it. mom may be NULL.
void dsc_sched_lr_at(const dsc_sched_params *p, double base_lr, int64_t step, double *lr,
                     double *mom);

#endif
