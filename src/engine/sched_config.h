// engine/sched_config.h - the LR schedule's parameters from the config's scheduler.params.
#ifndef DSC_ENGINE_SCHED_CONFIG_H
#define DSC_ENGINE_SCHED_CONFIG_H

#include "dsc/config.h"               // dsc_config
#include "engine/optim/lr_schedule.h" // dsc_sched_params

// Overrides the schedule's defaults (already in *p, p->kind set) with every scheduler.params key
// that the config file gave, null as DeepSpeed reads None. DSC_ERR_CONFIG where DeepSpeed's
// constructor call fails on the keys themselves: scheduler.params missing or null, a key the
// schedule does not take, a required one missing. The values are judged by dsc_sched_validate.
dsc_status dsc__sched_params_from_config(dsc_sched_params *p, const dsc_config *c);

#endif
