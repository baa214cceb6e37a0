// engine/hybrid.c - read-only views of the engine for the hybrid engine's generation.
#include "engine/hybrid.h"

#include <string.h> // memcpy

#include "base/status.h"        // DSC_TRY
#include "engine/engine_impl.h" // struct dsc_engine, dsc__zero_round_compute

static const param *tensor(const dsc_engine *e, int i) { return dsc__engine_tensor(e, i); }

const char *dsc__engine_param_name(const dsc_engine *e, int i) { return tensor(e, i)->name; }

int dsc__engine_param_shape(const dsc_engine *e, int i, int64_t shape[DSC_PARAM_MAX_DIMS]) {
    memcpy(shape, tensor(e, i)->shape, sizeof tensor(e, i)->shape);
    return tensor(e, i)->ndim;
}

int dsc__engine_param_group(const dsc_engine *e, int i) { return tensor(e, i)->group; }
int dsc__engine_num_groups(const dsc_engine *e) { return e->ngroups; }
int dsc__engine_stage(const dsc_engine *e) { return e->stage; }
dsc_comm *dsc__engine_comm(dsc_engine *e) { return e->comm; }

bool dsc__engine_has_compute_copy(const dsc_engine *e) {
    return e->stage < 3 ? e->work != NULL : e->work_part != NULL;
}

dsc_status dsc__engine_compute_copy(dsc_engine *e, int i, float *out) {
    DSC_TRY(dsc_engine_full_param(e, i, out));
    dsc__zero_round_compute(e, out, (size_t)tensor(e, i)->numel);
    return DSC_OK;
}
