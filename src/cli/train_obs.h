// cli/train_obs.h - what the trainer shows about itself: the wall-clock breakdown, the flops
// profile, the comms logger's summary and the progress line.
#ifndef DSC_CLI_TRAIN_OBS_H
#define DSC_CLI_TRAIN_OBS_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/config.h"  // dsc_config
#include "dsc/model.h"   // dsc_model
#include "dsc/monitor.h" // dsc_monitor

// Seconds of one optimizer step (or a sum of steps) in DeepSpeed's wall_clock_breakdown timers.
typedef struct train_times {
    double fwd, bwd, bwd_inner, bwd_allreduce, step;
} train_times;

// DeepSpeed's line: "[Rank 0] time (ms) | fwd: ... | bwd: ... | bwd_inner: ... |
// bwd_allreduce: ... | step: ..." (sums since the last print, as DeepSpeed's global timers).
void obs_breakdown_print(const train_times *sum);
// The step's times as Train/Samples/elapsed_time_ms_* at index samples.
dsc_status obs_breakdown_log(dsc_monitor *m, const train_times *step, int64_t samples);

// Configure the process-wide comms logger from comms_logger {enabled, prof_all, prof_ops}.
dsc_status obs_comms_setup(const dsc_config *cfg);
// The comms logger's table on stdout (when it is enabled), titled with the step.
void obs_comms_print(const dsc_config *cfg, int64_t step);

// What the flops profiler measured over one optimizer step.
typedef struct obs_profile {
    const dsc_model *model;
    int B, T, gas, world;
    int64_t step;
    const double *times; // dsc_model_timing_slots(model) forward seconds per leaf module
    train_times tt;      // the step's breakdown
    double iter_s;       // the whole step
} obs_profile;
// Write the profile to flops_profiler.output_file (or stdout when empty).
dsc_status obs_flops_report(const dsc_config *cfg, const obs_profile *p);

// The progress line: on a terminal one line rewritten in place (step/total, loss, tokens/s,
// ETA); obs_progress_clear erases it before other output. Elsewhere both do nothing.
void obs_progress_update(int64_t step, int64_t total, double loss, double tok_s, double eta_s);
void obs_progress_clear(void);
bool obs_progress_on(void);

#endif
