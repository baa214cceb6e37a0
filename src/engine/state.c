// engine/state.c - the engine's state for checkpoints (see state.h).
#include "engine/state.h"

#include <stdlib.h> // malloc, free
#include <string.h> // memcpy

#include "dsc/half.h"           // dsc_fp32_to_bf16, dsc_bf16_to_fp32
#include "base/status.h"        // dsc__fail
#include "engine/engine_impl.h" // struct dsc_engine
#include "engine/ft/ft.h"       // dsc__ft_state_changed

void dsc__state_layout(const dsc_engine *e, dsc_state_layout *out) {
    static const char *const precs[] = {"fp32", "fp16", "bf16"};
    static const char *const opts[] = {"adam", "adamw", "sgd", "lion"};
    out->world = e->world;
    out->rank = e->rank;
    out->stage = e->stage;
    out->precision = precs[e->prec];
    out->optimizer = opts[e->hp.kind];
    out->master_precision = e->master_bf16 ? "bf16" : "fp32";
    out->moments_precision = e->states_bf16 ? "bf16" : "fp32";
    out->nmoments = e->nmoments;
    out->nparams = e->nparams;
    out->ngroups = e->ngroups;
    out->total = e->total;
}

void dsc__state_param(const dsc_engine *e, int i, dsc_state_param *out) {
    const param *p = &e->params[i];
    out->name = p->name;
    out->ndim = p->ndim;
    memcpy(out->shape, p->shape, sizeof out->shape);
    out->numel = p->numel;
    out->group = p->group;
    out->off = p->off;
}

void dsc__state_group(const dsc_engine *e, int g, dsc_state_group *out) {
    out->off = e->groups[g].off;
    out->padded = e->groups[g].padded;
    out->slice = e->groups[g].slice;
}

// Offset of this rank's slice of group g in the moment buffers (full at stage 0).
static size_t moment_off(const dsc_engine *e, int g) {
    const group *gr = &e->groups[g];
    return e->stage == 0 ? gr->off + (size_t)e->rank * gr->slice : gr->part_off;
}

const float *dsc__state_master_slice(dsc_engine *e, int g) {
    const float *m = dsc__zero_master_slice(e, g);
    if (!m) return NULL; // on the device
    return e->stage == 0 ? m + (size_t)e->rank * e->groups[g].slice : m;
}

const float *dsc__state_moment_slice(dsc_engine *e, int g, int k) {
    const float *buf = k == 0 ? e->m : e->v;
    return buf ? buf + moment_off(e, g) : NULL;
}

bool dsc__state_on_host(const dsc_engine *e) { return !e->dev_state; }

// Flat offset of element `begin` of this rank's slice of group g (the device's layout is the
// flat one: on one rank the slice is the group).
static size_t slice_flat(const dsc_engine *e, int g, size_t begin) {
    return e->groups[g].off + (size_t)e->rank * e->groups[g].slice + begin;
}

dsc_status dsc__state_read(dsc_engine *e, int kind, int g, size_t begin, size_t n, float *dst) {
    if (g < 0 || g >= e->ngroups || kind < 0 || kind > e->nmoments ||
        begin + n > e->groups[g].slice)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc__state_read: no range [%zu, +%zu) of kind %d "
                         "in group %d", begin, n, kind, g);
    if (e->dev_state) return dsc__engine_state_io(e, kind, slice_flat(e, g, begin), n, dst, false);
    const float *src = kind == 0 ? dsc__state_master_slice(e, g)
                                 : dsc__state_moment_slice(e, g, kind - 1);
    memcpy(dst, src + begin, n * sizeof(float));
    return DSC_OK;
}

void dsc__state_scalars_get(const dsc_engine *e, dsc_state_scalars *out) {
    out->global_steps = e->global_steps;
    out->applied_steps = e->applied_steps;
    out->skipped_steps = e->skipped_steps;
    out->cur_scale = e->scaler.cur_scale;
    out->cur_iter = e->scaler.cur_iter;
    out->last_overflow_iter = e->scaler.last_overflow_iter;
    out->cur_hysteresis = e->scaler.cur_hysteresis;
}

dsc_status dsc__state_scalars_set(dsc_engine *e, const dsc_state_scalars *in) {
    if (e->micro != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "loading a checkpoint in the middle of a gradient "
                         "accumulation (micro-step %lld)", (long long)e->micro);
    e->global_steps = in->global_steps;
    e->applied_steps = in->applied_steps;
    e->skipped_steps = in->skipped_steps;
    if (e->scaler.dynamic) {
        e->scaler.cur_scale = in->cur_scale;
        e->scaler.cur_iter = in->cur_iter;
        e->scaler.last_overflow_iter = in->last_overflow_iter;
        e->scaler.cur_hysteresis = in->cur_hysteresis;
    }
    return DSC_OK;
}

// n values into dst; rounded to nearest even bf16 where the engine keeps them in bf16.
static void copy_in(bool bf16, float *dst, const float *src, size_t n) {
    if (!bf16) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++) dst[i] = dsc_bf16_to_fp32(dsc_fp32_to_bf16(src[i]));
}

dsc_status dsc__state_load_range(dsc_engine *e, int g, size_t begin, size_t n,
                                 const float *master, const float *const *moments) {
    if (g < 0 || g >= e->ngroups || begin + n > e->groups[g].slice)
        return dsc__fail(DSC_ERR_INVALID_ARG, "no range [%zu, +%zu) in layer group %d", begin, n,
                         g);
    if (e->dev_state) { // the device rounds as copy_in does
        size_t at = slice_flat(e, g, begin);
        DSC_TRY(dsc__engine_state_io(e, 0, at, n, (float *)master, true));
        for (int k = 0; k < e->nmoments; k++)
            DSC_TRY(dsc__engine_state_io(e, 1 + k, at, n, (float *)moments[k], true));
        return DSC_OK;
    }
    float *dst = (float *)dsc__state_master_slice(e, g) + begin;
    size_t mo = moment_off(e, g) + begin;
    copy_in(e->master_bf16, dst, master, n);
    copy_in(e->states_bf16, e->m + mo, moments[0], n);
    if (e->v) copy_in(e->states_bf16, e->v + mo, moments[1], n);
    return DSC_OK;
}

dsc_status dsc__state_load_slice(dsc_engine *e, int g, const float *master,
                                 const float *const *moments) {
    if (g < 0 || g >= e->ngroups) return dsc__fail(DSC_ERR_INVALID_ARG, "no layer group %d", g);
    return dsc__state_load_range(e, g, 0, e->groups[g].slice, master, moments);
}

dsc_status dsc__state_load_pieces(dsc_engine *e, int nkinds, dsc__state_fill_fn fill,
                                  void *user) {
    enum { PIECE = 16 << 20, MAX_KINDS = 4 };
    if (nkinds < 1 + e->nmoments || nkinds > MAX_KINDS)
        return dsc__fail(DSC_ERR_INTERNAL, "dsc__state_load_pieces: %d kinds for %d moments",
                         nkinds, e->nmoments);
    size_t cap = 1;
    for (int g = 0; g < e->ngroups; g++)
        if (e->groups[g].slice > cap) cap = e->groups[g].slice;
    if (cap > PIECE) cap = PIECE;
    float *buf = malloc(cap * (size_t)nkinds * sizeof(float)), *dst[MAX_KINDS];
    if (!buf) return dsc__fail(DSC_ERR_OOM, "out of memory loading a checkpoint");
    for (int k = 0; k < nkinds; k++) dst[k] = buf + (size_t)k * cap;
    dsc_status st = DSC_OK;
    for (int g = 0; g < e->ngroups && st == DSC_OK; g++) {
        size_t slice = e->groups[g].slice;
        for (size_t b0 = 0; b0 < slice && st == DSC_OK; b0 += cap) {
            size_t b1 = b0 + cap < slice ? b0 + cap : slice;
            st = fill(user, g, b0, b1, dst);
            if (st == DSC_OK)
                st = dsc__state_load_range(e, g, b0, b1 - b0, dst[0],
                                           (const float *const *)(dst + 1));
        }
    }
    free(buf);
    return st;
}

// Stage 0 holds the full state on every rank: after each rank loaded its own slice, the other
// slices are all-gathered so that every rank has everything again.
static dsc_status stage0_gather(dsc_engine *e) {
    if (e->stage != 0 || !e->comm) return DSC_OK;
    float *bufs[3] = {e->master, e->m, e->v};
    for (int b = 0; b < 3; b++) {
        if (!bufs[b]) continue;
        for (int g = 0; g < e->ngroups; g++) {
            const group *gr = &e->groups[g];
            float *tmp = malloc(gr->slice * sizeof(float));
            if (!tmp) return dsc__fail(DSC_ERR_OOM, "out of memory loading a checkpoint");
            memcpy(tmp, bufs[b] + gr->off + (size_t)e->rank * gr->slice, gr->slice * sizeof(float));
            dsc_status st = dsc_comm_all_gather(e->comm, tmp, bufs[b] + gr->off, gr->slice, DSC_DT_F32, NULL);
            free(tmp);
            DSC_TRY(st);
        }
    }
    return DSC_OK;
}

dsc_status dsc__state_load_done(dsc_engine *e) {
    DSC_TRY(stage0_gather(e));
    dsc__zero_zero_acc(e);
    DSC_TRY(dsc__zero_sync_params(e));
    return dsc__ft_state_changed(e); // fault tolerance snapshots (and replicates) the new state
}

struct dsc_comm *dsc__state_comm(dsc_engine *e) { return e->comm; }
