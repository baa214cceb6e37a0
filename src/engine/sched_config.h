// engine/sched_config.h - fill the LR schedule's parameters from the config's scheduler.params.
#ifndef DSC_ENGINE_SCHED_CONFIG_H
#define DSC_ENGINE_SCHED_CONFIG_H

#include "dsc/config.h"               // dsc_config
#include "engine/optim/lr_schedule.h" // dsc_sched_params

// Overrides the schedule's defaults (already in *p) with every scheduler.params key that the
// config file gave; keys it did not give keep the schedule type's own DeepSpeed default.
void dsc__sched_params_from_config(dsc_sched_params *p, const dsc_config *c);

#endif
