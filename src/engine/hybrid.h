// engine/hybrid.h - what the hybrid engine's generation (infer/hybrid.c) reads of an engine
// beyond the public API: the parameter table, the ZeRO stage and the communicator.
#ifndef DSC_ENGINE_HYBRID_H
#define DSC_ENGINE_HYBRID_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/comm.h"   // dsc_comm
#include "dsc/engine.h" // dsc_engine

// Name (borrowed for the engine's life), ndim and shape of parameter i (the caller's index, as
// dsc_param_data takes it; a frozen tensor too).
const char *dsc__engine_param_name(const dsc_engine *eng, int i);
int dsc__engine_param_shape(const dsc_engine *eng, int i, int64_t shape[DSC_PARAM_MAX_DIMS]);
int dsc__engine_param_group(const dsc_engine *eng, int i);
int dsc__engine_num_groups(const dsc_engine *eng);
int dsc__engine_stage(const dsc_engine *eng);
// The communicator of all ranks (borrowed); NULL on one rank.
dsc_comm *dsc__engine_comm(dsc_engine *eng);
// Whether the engine keeps a host compute copy of the weights (dsc_param_data); false under
// dsc_engine_opts.no_compute_copy (one rank whose model computes on a GPU).
bool dsc__engine_has_compute_copy(const dsc_engine *eng);
// Parameter i as the model computes with it, into out (numel floats): the master weights rounded
// to the training type, i.e. what dsc_param_data shows, for an engine without a host compute copy.
// One rank only.
dsc_status dsc__engine_compute_copy(dsc_engine *eng, int i, float *out);

#endif
