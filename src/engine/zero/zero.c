// engine/zero/zero.c - ZeRO stages 0-3: layout, partitions, gathers, reductions, the partitioned
// optimizer step.
//
// Which buffers each stage keeps, per rank (P = parameter elements, N = ranks):
//   stage 0: master, m, v, gradients: full.
//   stage 1: compute params and gradients full; master, m, v: one slice per group (P/N).
//   stage 2: compute params full; gradients reduce-scattered into a partition; master, m, v P/N.
//   stage 3: everything partitioned; a group's parameters are all-gathered on dsc_gather and
//            freed on dsc_release, its gradients live only between backward's use of the group
//            and their reduce-scatter.
// Determinism: every stage reduces the same per-micro-step sums (the comm layer adds ranks in
// order, all-reduce == reduce-scatter + all-gather bitwise), accumulates them with the same code,
// and runs the optimizer elementwise on whole vectors, so stages 0-3 give bitwise equal weights.
#include <stdlib.h> // calloc, malloc, free
#include <string.h> // memset, memcpy

#include "base/status.h"        // dsc__fail, DSC_TRY
#include "dsc/half.h"           // dsc_fp32_to_fp16_n, ...
#include "engine/device.h"      // dsc__round_fp16
#include "engine/engine_impl.h" // dsc_engine, group
#include "engine/ft/ft.h"       // dsc__ft_point
#include "engine/hybrid.h"      // dsc__engine_has_compute_copy

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

// ---- buffers ----

// A zeroed transient buffer of n floats (a gathered group, a micro-step's gradients, a
// reduction's result): a block of the engine's pool, freed again within the step. Every step
// repeats the same requests, so the pool serves them from the same free space and a steady-state
// step takes nothing from the system.
static dsc_status take(dsc_engine *e, size_t n, dsc_mem_handle *h, float **p) {
    DSC_TRY(dsc__engine_alloc(e, n, "zero.buffers", h, p));
    e->bytes_buffers += n * sizeof(float);
    if (e->bytes_buffers > e->bytes_buffers_peak) e->bytes_buffers_peak = e->bytes_buffers;
    if (n * sizeof(float) > e->max_transient) e->max_transient = n * sizeof(float);
    return DSC_OK;
}

static void give(dsc_engine *e, dsc_mem_handle *h, size_t n) {
    if (!*h) return;
    e->bytes_buffers -= n * sizeof(float);
    dsc__engine_free(e, h);
}

dsc_status dsc__zero_take(dsc_engine *e, size_t n, dsc_mem_handle *h, float **p) {
    return take(e, n, h, p);
}
void dsc__zero_give(dsc_engine *e, dsc_mem_handle *h, size_t n) { give(e, h, n); }

// ---- layout ----

size_t dsc__zero_place(param *ps, int n, int g, size_t base, int64_t *numel) {
    size_t content = 0;
    *numel = 0;
    for (int i = 0; i < n; i++) {
        if (ps[i].group != g) continue;
        ps[i].off = base + content;
        content += round_up((size_t)ps[i].numel, DSC_ALIGN_ELEMS);
        *numel += ps[i].numel;
    }
    return content;
}

dsc_status dsc__zero_layout(dsc_engine *e) {
    e->groups = calloc((size_t)e->ngroups, sizeof *e->groups);
    if (!e->groups) return dsc__fail(DSC_ERR_OOM, "out of memory for the group table");
    size_t cursor = 0, part = 0, unit = (size_t)e->world * DSC_ALIGN_ELEMS;
    double persist = e->cfg.zero_optimization.param_persistence_threshold;
    for (int g = 0; g < e->ngroups; g++) {
        group *gr = &e->groups[g];
        gr->off = cursor;
        int64_t numel;
        size_t content = dsc__zero_place(e->params, e->nparams, g, cursor, &numel);
        gr->padded = round_up(content, unit);
        gr->slice = gr->padded / (size_t)e->world;
        gr->part_off = part;
        gr->persistent = e->stage == 3 && (double)numel < persist;
        cursor += gr->padded;
        part += gr->slice;
    }
    e->total = cursor;
    e->part = part;
    return DSC_OK;
}

// fp32 training at stages 1-2 keeps no separate master copy: the optimizer updates this rank's
// slice of the full parameter buffer in place (the ZeRO paper's fp32 accounting).
// bf16 master weights do the same: the bf16 compute copy is the master.
static bool master_in_work(const dsc_engine *e) {
    return (e->prec == PREC_FP32 || e->master_bf16) && (e->stage == 1 || e->stage == 2);
}

float *dsc__zero_master_slice(dsc_engine *e, int g) {
    const group *gr = &e->groups[g];
    if (e->dev_state) return NULL; // the device trainer holds it
    if (e->stage == 0) return e->master + gr->off;
    if (master_in_work(e)) return e->work + gr->off + (size_t)e->rank * gr->slice;
    return e->master + gr->part_off;
}

// One persistent buffer: model states are tagged by what the ZeRO paper counts them as, so that
// the pool's accounting per tag is the engine's memory report (dsc_engine_memory_get).
static dsc_status persistent(dsc_engine *e, size_t n, const char *tag, dsc_mem_handle *h) {
    float *p;
    return dsc__engine_alloc(e, n, tag, h, &p);
}

// Stages 0-1: the micro-step's full gradients and, with accumulation, their full accumulator;
// stages 2-3: the accumulated partition. None when the device trainer streams the gradients to
// the optimizer or keeps them on the device (no_grads: one GPU, dsc__engine_keeps_no_grads).
static dsc_status alloc_grads(dsc_engine *e) {
    if (e->no_grads) return DSC_OK;
    if (e->stage >= 2) return persistent(e, e->part, "zero.grads", &e->h_acc);
    DSC_TRY(persistent(e, e->total, "zero.grads", &e->h_gfull));
    if (e->cfg.gradient_accumulation_steps == 1) {
        e->h_acc = e->h_gfull;
        return DSC_OK;
    }
    return persistent(e, e->total, "zero.grads", &e->h_acc);
}

// The host buffers: master and moments (mlen elements each), the compute copy, the gradients and
// the persistent groups' gathered weights.
static dsc_status alloc_buffers(dsc_engine *e, size_t mlen, bool need_v) {
    bool fp32 = e->prec == PREC_FP32;
    size_t full = e->total, part = e->part;
    // The buffer the model computes from counts as parameters; a separate fp32 master as
    // optimizer state.
    bool master_is_params = (fp32 || e->master_bf16) && (e->stage == 0 || e->stage == 3);
    const char *master_tag = master_is_params ? "zero.params" : "zero.master";
    if (!master_in_work(e)) DSC_TRY(persistent(e, mlen, master_tag, &e->h_master));
    DSC_TRY(persistent(e, mlen, "zero.optim", &e->h_m));
    if (need_v) DSC_TRY(persistent(e, mlen, "zero.optim", &e->h_v));
    if (e->stage < 3) {
        if (e->stage == 0 && fp32) e->h_work = e->h_master;
        else if (!e->no_compute_copy || master_in_work(e))
            DSC_TRY(persistent(e, full, "zero.params", &e->h_work));
    } else {
        if (fp32 || e->master_bf16) e->h_work_part = e->h_master;
        else if (!e->no_compute_copy) DSC_TRY(persistent(e, part, "zero.params", &e->h_work_part));
    }
    DSC_TRY(alloc_grads(e));
    for (int g = 0; g < e->ngroups; g++) // (no compute copy at stage 3: nothing to keep gathered)
        if (e->groups[g].persistent && (e->stage < 3 || e->h_work_part))
            DSC_TRY(persistent(e, e->groups[g].padded, "zero.params", &e->groups[g].hp));
    return DSC_OK;
}

dsc_status dsc__zero_alloc(dsc_engine *e) {
    bool need_v = e->hp.kind == DSC_OPT_ADAM || e->hp.kind == DSC_OPT_ADAMW;
    e->nmoments = need_v ? 2 : 1;
    // With the state on the device (dev_state) the device trainer holds master and moments
    // (dsc__state_source), the gradients stay there and nothing computes on the host: no buffers.
    if (!e->dev_state) DSC_TRY(alloc_buffers(e, e->stage == 0 ? e->total : e->part, need_v));
    e->pdata = calloc((size_t)e->nparams, sizeof *e->pdata);
    e->pgrad = calloc((size_t)e->nparams, sizeof *e->pgrad);
    e->gathered = calloc((size_t)e->ngroups, 1);
    if (!e->pdata || !e->pgrad || !e->gathered)
        return dsc__fail(DSC_ERR_OOM, "out of memory for the parameter tables");
    dsc__engine_resolve(e);
    return DSC_OK;
}

static void free_group(dsc_engine *e, group *gr) {
    if (gr->preq) dsc_comm_wait(gr->preq);
    if (gr->greq) dsc_comm_wait(gr->greq);
    gr->preq = gr->greq = NULL;
    dsc__engine_free(e, &gr->hp);
    gr->pbuf = NULL;
    dsc__engine_free(e, &gr->hg);
    gr->gbuf = NULL;
    dsc__engine_free(e, &gr->hr);
    gr->rbuf = NULL;
    dsc__engine_free(e, &gr->h16);
    gr->stage16 = NULL;
}

void dsc__zero_free(dsc_engine *e) {
    // Aliases share a handle: clear them first so that each block is freed once.
    if (e->h_work == e->h_master) e->h_work = 0;
    if (e->h_work_part == e->h_master) e->h_work_part = 0;
    if (e->h_acc == e->h_gfull) e->h_acc = 0;
    dsc__engine_free(e, &e->h_work);
    e->work = NULL;
    dsc__engine_free(e, &e->h_work_part);
    e->work_part = NULL;
    dsc__engine_free(e, &e->h_acc);
    e->acc = NULL;
    dsc__engine_free(e, &e->h_gfull);
    e->gfull = NULL;
    dsc__engine_free(e, &e->h_master);
    e->master = NULL;
    dsc__engine_free(e, &e->h_m);
    e->m = NULL;
    dsc__engine_free(e, &e->h_v);
    e->v = NULL;
    for (int g = 0; e->groups && g < e->ngroups; g++) free_group(e, &e->groups[g]);
    free(e->groups);
    free(e->pdata);
    free(e->pgrad);
    free(e->gathered);
}

void dsc__zero_reset(dsc_engine *e) {
    dsc__zero_free(e);
    e->master = e->work = e->work_part = e->gfull = e->acc = e->m = e->v = NULL;
    e->groups = NULL;
    e->pdata = e->pgrad = NULL;
    e->gathered = NULL;
    e->bytes_buffers = 0;
}

// ---- collectives (one rank: the identity) ----

static dsc_status all_gather(dsc_engine *e, const float *send, float *recv, size_t count,
                             dsc_comm_req **req) {
    if (req) *req = NULL;
    if (!e->comm) {
        memcpy(recv, send, count * sizeof(float));
        return DSC_OK;
    }
    e->comm_bytes_sent += count * sizeof(float);
    return dsc_comm_all_gather(e->comm, send, recv, count, DSC_DT_F32, req);
}

dsc_status dsc__zero_all_gather(dsc_engine *e, const float *send, float *recv, size_t count,
                                dsc_comm_req **req) {
    return all_gather(e, send, recv, count, req);
}

// Round x to the training dtype's values (the compute copy of 16-bit training).
static void round_to(precision prec, float *dst, const float *src, size_t n) {
    if (prec == PREC_FP16) {
        dsc__round_fp16(dst, src, n);
    } else if (prec == PREC_BF16) {
#pragma omp parallel for schedule(static) if (n > 65536)
        for (size_t i = 0; i < n; i++) dst[i] = dsc_bf16_to_fp32(dsc_fp32_to_bf16(src[i]));
    } else if (dst != src) {
        memcpy(dst, src, n * sizeof(float));
    }
}

// ---- parameters ----

static void point_params(dsc_engine *e, int g) {
    const group *gr = &e->groups[g];
    for (int i = 0; i < e->nparams; i++) {
        if (e->params[i].group != g) continue;
        size_t off = e->params[i].off;
        if (e->stage < 3) e->pdata[i] = e->work ? e->work + off : NULL;
        else e->pdata[i] = gr->pbuf ? gr->pbuf + (off - gr->off) : NULL;
    }
}

static void point_grads(dsc_engine *e, int g) {
    const group *gr = &e->groups[g];
    for (int i = 0; i < e->nparams; i++) {
        if (e->params[i].group != g) continue;
        size_t off = e->params[i].off;
        if (e->stage < 2) e->pgrad[i] = e->gfull ? e->gfull + off : NULL;
        else e->pgrad[i] = gr->gbuf ? gr->gbuf + (off - gr->off) : NULL;
    }
}

static dsc_status wait_req(dsc_comm_req **req) {
    if (!*req) return DSC_OK;
    dsc_status st = dsc_comm_wait(*req);
    *req = NULL;
    return st;
}

// Stage 3: start gathering group g into a fresh buffer (asynchronously when req is given).
static dsc_status start_gather(dsc_engine *e, int g, bool async) {
    group *gr = &e->groups[g];
    if (!e->work_part)
        return dsc__fail(DSC_ERR_INVALID_ARG, "gathering layer group %d: this engine keeps no "
                         "compute copy of the weights (dsc_engine_opts.no_compute_copy: the model "
                         "computes on a device)", g);
    dsc_status st = take(e, gr->padded, &gr->hp, &gr->pbuf);
    if (st != DSC_OK) {
        dsc__error_prefix("gathering layer group %d: ", g);
        return st;
    }
    return all_gather(e, e->work_part + gr->part_off, gr->pbuf, gr->slice, async ? &gr->preq : NULL);
}

static dsc_status prefetch(dsc_engine *e, int g) {
    if (g < 0 || g >= e->ngroups) return DSC_OK;
    group *gr = &e->groups[g];
    if (gr->persistent || gr->pbuf || (double)gr->padded > e->cfg.zero_optimization.prefetch_bucket_size)
        return DSC_OK;
    return start_gather(e, g, true);
}

dsc_status dsc__zero_gather(dsc_engine *e, int g) {
    group *gr = &e->groups[g];
    if (e->stage == 3 && !gr->persistent) {
        if (!gr->pbuf) DSC_TRY(start_gather(e, g, false));
        DSC_TRY(wait_req(&gr->preq));
        DSC_TRY(prefetch(e, e->backward ? g - 1 : g + 1));
    }
    DSC_TRY(dsc__frozen_gather(e, g)); // (partitioned frozen tensors: LoRA's base at stage 3)
    point_params(e, g);
    if (e->backward && e->stage >= 2 && !gr->gbuf) {
        dsc_status st = take(e, gr->padded, &gr->hg, &gr->gbuf);
        if (st != DSC_OK) {
            dsc__error_prefix("gradients of layer group %d: ", g);
            return st;
        }
    }
    point_grads(e, g);
    return DSC_OK;
}

dsc_status dsc__zero_release(dsc_engine *e, int g) {
    group *gr = &e->groups[g];
    DSC_TRY(dsc__frozen_release(e, g));
    if (e->stage < 3 || gr->persistent) return DSC_OK;
    DSC_TRY(wait_req(&gr->preq));
    give(e, &gr->hp, gr->padded);
    gr->pbuf = NULL;
    point_params(e, g);
    return DSC_OK;
}

// Drop every gathered (non-persistent) group: their contents are stale after an optimizer step.
static dsc_status drop_gathered(dsc_engine *e) {
    for (int g = 0; g < e->ngroups; g++) {
        group *gr = &e->groups[g];
        if (gr->persistent || !gr->pbuf) continue;
        DSC_TRY(wait_req(&gr->preq));
        give(e, &gr->hp, gr->padded);
        gr->pbuf = NULL;
        point_params(e, g);
    }
    return DSC_OK;
}

dsc_status dsc__zero_sync_params(dsc_engine *e) {
    if (!dsc__engine_has_compute_copy(e)) { // no_compute_copy: the model has its own weights
        dsc__zero_repoint(e);
        return DSC_OK;
    }
    if (e->stage == 0) {
        round_to(e->prec, e->work, e->master, e->total);
    } else if (e->stage < 3) {
        for (int g = 0; g < e->ngroups; g++) {
            group *gr = &e->groups[g];
            float *tmp;
            dsc_mem_handle h = 0;
            DSC_TRY(take(e, gr->slice, &h, &tmp));
            round_to(e->prec, tmp, dsc__zero_master_slice(e, g), gr->slice);
            dsc_status st = all_gather(e, tmp, e->work + gr->off, gr->slice, NULL);
            give(e, &h, gr->slice);
            DSC_TRY(st);
        }
    } else {
        round_to(e->prec, e->work_part, e->master, e->part);
        DSC_TRY(drop_gathered(e));
        for (int g = 0; g < e->ngroups; g++) {
            group *gr = &e->groups[g];
            if (gr->persistent) DSC_TRY(all_gather(e, e->work_part + gr->part_off, gr->pbuf, gr->slice, NULL));
        }
    }
    dsc__zero_repoint(e);
    return DSC_OK;
}

void dsc__zero_repoint(dsc_engine *e) {
    for (int g = 0; g < e->ngroups; g++) {
        point_params(e, g);
        point_grads(e, g);
    }
}

// ---- gradients ----

static void scale_inplace(float *x, size_t n, float s) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

// acc += x * post. One out-of-line function for every stage, so the compiler's choices (vector
// width, contraction) are the same wherever gradients are accumulated.
__attribute__((noinline)) static void accumulate(float *acc, const float *x, size_t n, float post) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) {
        float t = x[i] * post;
        acc[i] = acc[i] + t;
    }
}

static void to16(dsc_dtype dt, uint16_t *dst, const float *src, size_t n) {
    if (dt == DSC_DT_F16) dsc_fp32_to_fp16_n(dst, src, n);
    else dsc_fp32_to_bf16_n(dst, src, n);
}

static void from16(dsc_dtype dt, float *dst, const uint16_t *src, size_t n) {
    if (dt == DSC_DT_F16) dsc_fp16_to_fp32_n(dst, src, n);
    else dsc_bf16_to_fp32_n(dst, src, n);
}

static double pre_factor(const dsc_engine *e) {
    return e->cfg.prescale_gradients ? e->world : e->cfg.gradient_predivide_factor;
}

// Whether gradients are reduced across ranks: not on one rank, whether it started alone (no
// communicator) or is what a recovery left (a communicator of one), so that neither rounds its
// gradients to communication_data_type and a degraded run continues as one started on the ranks
// that remain.
static bool reduces(const dsc_engine *e) { return e->comm && e->world > 1; }

// Start the data-parallel reduction of group g's gradients (asynchronous: it overlaps the rest
// of backward). DeepSpeed's pre-division: gradients are divided by gradient_predivide_factor
// (world size with prescale_gradients) before the sum and by world/that after.
dsc_status dsc__zero_grads_ready(dsc_engine *e, int g) {
    group *gr = &e->groups[g];
    float *src = e->stage < 2 ? e->gfull + gr->off : gr->gbuf;
    if (!src) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_grads_ready(%d): the group was not "
                               "gathered during backward (call dsc_backward_begin first)", g);
    double pre = pre_factor(e);
    if (pre != 1.0) scale_inplace(src, gr->padded, (float)(1.0 / pre));
    if (e->stage >= 2) {
        dsc_status st = take(e, gr->slice, &gr->hr, &gr->rbuf);
        if (st != DSC_OK) {
            dsc__error_prefix("reducing layer group %d: ", g);
            return st;
        }
    }
    if (!reduces(e)) {
        if (e->stage >= 2) memcpy(gr->rbuf, src, gr->slice * sizeof(float));
        return DSC_OK;
    }
    size_t count = e->stage < 2 ? gr->padded : gr->slice;
    if (e->comm_dt != DSC_DT_F32) { // reduce in 16 bits: stage, reduce, unstage in finish
        if (!gr->h16) { // kept for the engine's life: (padded + slice) 16-bit values
            float *p;
            dsc_status s16 = dsc__engine_alloc(e, (gr->padded + gr->slice + 1) / 2,
                                               "zero.comm_stage16", &gr->h16, &p);
            if (s16 != DSC_OK) {
                dsc__error_prefix("16-bit reduction of layer group %d: ", g);
                return s16;
            }
            gr->stage16 = (uint16_t *)p;
        }
        to16(e->comm_dt, gr->stage16, src, gr->padded);
        e->comm_bytes_sent += count * 2;
        dsc_status st16;
        if (e->stage < 2)
            st16 = dsc_comm_all_reduce(e->comm, gr->stage16, gr->stage16, count, e->comm_dt,
                                       DSC_OP_SUM, &gr->greq);
        else
            st16 = dsc_comm_reduce_scatter(e->comm, gr->stage16, gr->stage16 + gr->padded, count,
                                           e->comm_dt, DSC_OP_SUM, &gr->greq);
        dsc__ft_point(e, "reduce");
        return st16;
    }
    e->comm_bytes_sent += count * 4;
    dsc_status st;
    if (e->stage < 2)
        st = dsc_comm_all_reduce(e->comm, src, src, count, DSC_DT_F32, DSC_OP_SUM, &gr->greq);
    else
        st = dsc_comm_reduce_scatter(e->comm, src, gr->rbuf, count, DSC_DT_F32, DSC_OP_SUM,
                                     &gr->greq);
    dsc__ft_point(e, "reduce"); // the reduction is in flight on the progress thread
    return st;
}

// End of a micro-step: wait for every reduction, scale by world/predivide, add into the
// accumulators, release the micro-step's gradient buffers.
dsc_status dsc__zero_finish_micro(dsc_engine *e) {
    float post = (float)(pre_factor(e) / e->world);
    bool separate = e->stage < 2 && e->acc != e->gfull;
    dsc_status st = DSC_OK;
    for (int g = 0; g < e->ngroups; g++) {
        group *gr = &e->groups[g];
        dsc_status w = wait_req(&gr->greq);
        if (st == DSC_OK) st = w;
        if (reduces(e) && e->comm_dt != DSC_DT_F32 && st == DSC_OK) {
            if (e->stage < 2) from16(e->comm_dt, e->gfull + gr->off, gr->stage16, gr->padded);
            else if (gr->rbuf) from16(e->comm_dt, gr->rbuf, gr->stage16 + gr->padded, gr->slice);
        }
        if (e->stage < 2) {
            float *x = e->gfull + gr->off;
            if (separate) {
                accumulate(e->acc + gr->off, x, gr->padded, post);
                memset(x, 0, gr->padded * sizeof(float));
            } else if (post != 1.0f) {
                scale_inplace(x, gr->padded, post);
            }
            continue;
        }
        if (gr->rbuf) accumulate(e->acc + gr->part_off, gr->rbuf, gr->slice, post);
        give(e, &gr->hr, gr->slice);
        gr->rbuf = NULL;
        give(e, &gr->hg, gr->padded);
        gr->gbuf = NULL;
        point_grads(e, g);
    }
    return st;
}

// This rank's slice of the accumulated gradients of group g.
static float *own_grad(dsc_engine *e, const group *gr) {
    if (e->stage < 2) return e->acc + gr->off + (size_t)e->rank * gr->slice;
    return e->acc + gr->part_off;
}

// Global sum of squares of the gradients times inv_scale and the overflow flag, identical on
// every rank and for every stage: each rank sums its slices in group order, the partial sums are
// all-gathered and added in rank order.
dsc_status dsc__zero_norm(dsc_engine *e, double inv_scale, double *sumsq, bool *nonfinite) {
    double local = 0;
    bool bad = false;
    for (int g = 0; g < e->ngroups; g++) {
        const group *gr = &e->groups[g];
        local += dsc_opt_sumsq(own_grad(e, gr), gr->slice, (float)inv_scale, &bad);
    }
    double mine[2] = {local, bad ? 1.0 : 0.0};
    if (!e->comm) {
        dsc__step_global_norm(mine, 1, false, sumsq, nonfinite);
        return DSC_OK;
    }
    double *all = malloc(sizeof(double) * 2 * (size_t)e->world);
    if (!all) return dsc__fail(DSC_ERR_OOM, "out of memory");
    dsc_status st = dsc_comm_all_gather(e->comm, mine, all, 4, DSC_DT_F32, NULL); // 16 bytes each
    dsc__step_global_norm(all, st == DSC_OK ? e->world : 0, false, sumsq, nonfinite);
    free(all);
    return st;
}

void dsc__zero_round_compute(const dsc_engine *e, float *x, size_t n) {
    round_to(e->prec, x, x, n);
}

// fp16 emulation: gradients take half-precision values (overflow becomes inf).
void dsc__zero_round_fp16(dsc_engine *e) {
    size_t n = e->stage < 2 ? e->total : e->part;
    round_to(PREC_FP16, e->acc, e->acc, n);
}

void dsc__zero_round_bf16_grads(dsc_engine *e) {
    size_t n = e->stage < 2 ? e->total : e->part;
    round_to(PREC_BF16, e->acc, e->acc, n);
}

// One optimizer step over n elements; with bf16 master weights dsc_opt_step_bf16 (the new
// values rounded to bf16, the moments too with bf16 optimizer states).
// index: the flat layout's index of p[0] (stochastic rounding draws per element index).
static void step_range(dsc_engine *e, const dsc_opt_hparams *hp, int64_t step, float *p,
                       const float *g, size_t o, size_t index, size_t n, float grad_scale) {
    float *v = e->v ? e->v + o : NULL;
    if (e->master_bf16)
        dsc_opt_step_bf16(hp, step, p, g, e->m + o, v, n, grad_scale, e->states_bf16,
                          e->bf16_sr ? (uint64_t)index : UINT64_MAX);
    else
        dsc_opt_step(hp, step, p, g, e->m + o, v, n, grad_scale, NULL, DSC_OPT_OUT_NONE);
}

dsc_status dsc__zero_optimizer(dsc_engine *e, const dsc_opt_hparams *hp, int64_t step,
                               float grad_scale) {
    for (int g = 0; g < e->ngroups; g++) {
        group *gr = &e->groups[g];
        if (e->stage == 0) {
            size_t o = gr->off;
            step_range(e, hp, step, e->master + o, e->acc + o, o, o, gr->padded, grad_scale);
            continue;
        }
        size_t o = gr->part_off;
        step_range(e, hp, step, dsc__zero_master_slice(e, g), own_grad(e, gr), o,
                   gr->off + (size_t)e->rank * gr->slice, gr->slice, grad_scale);
        if (g == e->ngroups / 2) dsc__ft_point(e, "optimizer"); // half the groups updated
    }
    return DSC_OK;
}

void dsc__zero_zero_acc(dsc_engine *e) {
    size_t n = e->stage < 2 ? e->total : e->part;
    if (e->acc) memset(e->acc, 0, n * sizeof(float));
}

// The accumulated gradient of tensor i, whole, times inv_scale (all-gathers its group at 2-3).
dsc_status dsc__zero_full_grad(dsc_engine *e, int i, float *out, double inv_scale) {
    const param *p = &e->params[i];
    const group *gr = &e->groups[p->group];
    const float *src;
    float *tmp = NULL;
    dsc_mem_handle h = 0;
    if (e->stage < 2) {
        src = e->acc + p->off;
    } else {
        DSC_TRY(take(e, gr->padded, &h, &tmp));
        dsc_status st = all_gather(e, e->acc + gr->part_off, tmp, gr->slice, NULL);
        if (st != DSC_OK) {
            give(e, &h, gr->padded);
            return st;
        }
        src = tmp + (p->off - gr->off);
    }
    for (int64_t k = 0; k < p->numel; k++) out[k] = (float)(src[k] * inv_scale);
    give(e, &h, gr->padded);
    return DSC_OK;
}

dsc_status dsc__zero_full_master(dsc_engine *e, int i, float *out) {
    const param *p = &e->params[i];
    const group *gr = &e->groups[p->group];
    if (e->stage == 0) {
        memcpy(out, e->master + p->off, (size_t)p->numel * sizeof(float));
        return DSC_OK;
    }
    float *tmp;
    dsc_mem_handle h = 0;
    dsc_status st = take(e, gr->padded, &h, &tmp);
    if (st != DSC_OK) {
        dsc__error_prefix("gathering parameter %s: ", p->name);
        return st;
    }
    st = all_gather(e, dsc__zero_master_slice(e, p->group), tmp, gr->slice, NULL);
    if (st == DSC_OK) memcpy(out, tmp + (p->off - gr->off), (size_t)p->numel * sizeof(float));
    give(e, &h, gr->padded);
    return st;
}

// Rank r's slice of group g sits at g's offset + r * slice in the full layout, so an all-gather
// of the slices lands every group in place: one collective per group, nothing to rearrange.
dsc_status dsc__zero_gather_master(dsc_engine *e, float *out) {
    if (e->stage == 0) {
        memcpy(out, e->master, e->total * sizeof(float));
        return DSC_OK;
    }
    for (int g = 0; g < e->ngroups; g++) {
        const group *gr = &e->groups[g];
        DSC_TRY(all_gather(e, dsc__zero_master_slice(e, g), out + gr->off, gr->slice, NULL));
    }
    return DSC_OK;
}

void dsc__zero_abandon_step(dsc_engine *e) {
    for (int g = 0; g < e->ngroups; g++) {
        group *gr = &e->groups[g];
        if (gr->preq) dsc_comm_wait(gr->preq); // fails at once on a broken communicator
        if (gr->greq) dsc_comm_wait(gr->greq);
        gr->preq = gr->greq = NULL;
        give(e, &gr->hg, gr->padded);
        gr->gbuf = NULL;
        give(e, &gr->hr, gr->slice);
        gr->rbuf = NULL;
        if (!gr->persistent) {
            give(e, &gr->hp, gr->padded);
            gr->pbuf = NULL;
        }
        point_params(e, g);
        point_grads(e, g);
    }
    dsc__frozen_abandon(e);
    if (e->gfull && e->gfull != e->acc) memset(e->gfull, 0, e->total * sizeof(float));
    dsc__zero_zero_acc(e);
    memset(e->gathered, 0, (size_t)e->ngroups);
    e->micro = 0;
    e->backward = false;
    e->in_step = false;
}
