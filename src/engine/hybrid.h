// engine/hybrid.h - what the hybrid engine's generation (infer/hybrid.c) reads of an engine
// beyond the public API: the parameter table, the ZeRO stage and the communicator.
#ifndef DSC_ENGINE_HYBRID_H
#define DSC_ENGINE_HYBRID_H

#include <stdint.h> // int64_t

#include "dsc/comm.h"   // dsc_comm
#include "dsc/engine.h" // dsc_engine

// Name (borrowed for the engine's life), ndim and shape of parameter i.
const char *dsc__engine_param_name(const dsc_engine *eng, int i);
int dsc__engine_param_shape(const dsc_engine *eng, int i, int64_t shape[DSC_PARAM_MAX_DIMS]);
int dsc__engine_param_group(const dsc_engine *eng, int i);
int dsc__engine_num_groups(const dsc_engine *eng);
int dsc__engine_stage(const dsc_engine *eng);
// The communicator of all ranks (borrowed); NULL on one rank.
dsc_comm *dsc__engine_comm(dsc_engine *eng);

#endif
