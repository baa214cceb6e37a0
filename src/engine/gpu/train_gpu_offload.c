// engine/gpu/train_gpu_offload.c - streamed ZeRO-Offload on one GPU (see train_gpu_offload.h).
#include "engine/gpu/train_gpu_offload.h"

#ifdef DSC_WITH_CUDA

#include <math.h>   // isfinite
#include <stdint.h> // SIZE_MAX
#include <stdlib.h> // calloc, free, aligned_alloc
#include <string.h> // memset

#include "base/status.h"        // dsc__fail, DSC_TRY
#include "base/time.h"          // dsc_now
#include "engine/gpu/layer_slots.h"    // dsc__slots_*
#include "cuda/convert.h"       // dsc__cuda_to_device
#include "cuda/offload.h"       // dsc__cuda_offload_*
#include "dsc/half.h"           // dsc_fp32_to_fp16_n, dsc_fp32_to_bf16_n
#include "engine/optim/optim.h" // dsc_opt_step, dsc_opt_sumsq

struct train_off {
    dsc_engine *eng;
    dsc_cuda_state *st;
    dsc_model_device *dev;
    dsc_cuda_offload *bus;
    dsc__engine_flat host;   // master, m, v: the optimizer's; acc: gradients land here
                             // (parameter offload with accumulation or clipping; NULL in the
                             // lean mode below)
    dsc__engine_span *spans; // (ngroups) each group's range of the flat layout
    uint16_t *h16;           // (total) page-locked, parameter offload only: every weight's
                             // 16-bit copy, where the layers live and the optimizer writes
    bool acc_pinned, h16_pinned;
    // Lean mode (the engine keeps no gradients): two page-locked gradient slots and two 16-bit
    // weight slots of the largest device-resident group carry those groups, so the host holds
    // the master and the moments only (12 bytes per parameter with Adam) plus the slots; with
    // parameter offload (one micro-step per step, no clipping, no fp16) the layers' gradients
    // land in tmp and the CPU updates each layer from there as the backward goes on (the host
    // then adds only the 16-bit copy of the weights, h16).
    bool lean;
    int *res, nres;        // the device-resident groups, ascending (every group without
                           // parameter offload)
    float *dump;           // --dump-grads in the lean mode: the step's gradients, group by group
    size_t slot_len;       // the largest resident group's padded length
    float *gslot[2];       // a group's gradients, landed from the device
    uint16_t *wslot[2];    // a group's new 16-bit weights, on their way up
    bool gslot_pinned[2], wslot_pinned[2];
    int wslot_group[2];    // the group whose upload last read wslot[k] (-1: none)
    int wnext;             // the weight slot the next update writes
    int ngroups;
    bool fp16; // the model computes in fp16 (the 16-bit weights are fp16)
    // this step
    double *part; // (ngroups) each group's sum of squares, added in group order
    bool nonfinite;
    bool early;            // the optimizer ran group by group as the gradients landed
    bool last;             // the micro-step running is the step's last
    dsc__device_step plan; // early: made before the norm was known (nothing depends on it)
    dsc_step_info early_info;
    dsc__device_divisor early_div; // early: unused (no clipping, no loss scale)
    train_off_times t;
    // offload_param: the layers' 16-bit weights live in h16 only and pass through two device
    // slots (engine/gpu/layer_slots.h; the embeddings and ln_f stay on the device); the layers'
    // gradients pass through two gradient slots and go to the host every micro-step (later
    // micro-steps through tmp, added into the accumulator on the host).
    bool params;
    dsc__slots sl;
    // LoRA's frozen base with offload_param: the layers' frozen ranges (from the first layer's to
    // the last's in the frozen store's layout, fbase on) in 16 bits, page-locked, fetched beside
    // each layer's weights (dsc__slots_frozen); the end groups' frozen tensors stay on the device
    uint16_t *hf16;
    size_t fbase;
    bool hf16_pinned;
    float *tmp[2]; // page-locked host: a later micro-step's gradients of a layer
    bool tmp_pinned[2];
    int tmp_group[2]; // the group landing in tmp[k], not yet added (-1: none)
};

static bool ring_group(const train_off *o, int g) {
    return o->params && dsc__slots_layer_group(&o->sl, g);
}

// ---- create / destroy ----

// The backward's groups are the engine's: trained tensor i of model group k lies inside engine
// group k (a frozen tensor, LoRA's base, is in no group: it stays on the device), and at one rank
// every group's optimizer state is its whole range.
static dsc_status check_groups(train_off *o, const dsc_model *model) {
    for (int i = 0; i < dsc_model_describe(model)->num_tensors; i++) {
        const dsc_model_param *info = dsc_model_param_get(model, i);
        size_t off = dsc__engine_param_offset(o->eng, i);
        if (off == SIZE_MAX) continue;
        const dsc__engine_span *sp = info->group < o->ngroups ? &o->spans[info->group] : NULL;
        if (!sp || off < sp->off || off + (size_t)info->numel > sp->off + sp->padded)
            return dsc__fail(DSC_ERR_INTERNAL,
                             "ZeRO-Offload: tensor %s is not inside the "
                             "engine's parameter group %d",
                             info->name, info->group);
    }
    for (int g = 0; g < o->ngroups; g++)
        if (o->spans[g].state_off != o->spans[g].off || o->spans[g].state_len != o->spans[g].padded)
            return dsc__fail(DSC_ERR_INTERNAL,
                             "ZeRO-Offload on one GPU: group %d's optimizer "
                             "state is a partition (%zu of %zu elements)",
                             g, o->spans[g].state_len, o->spans[g].padded);
    return DSC_OK;
}

static void pin(void *p, size_t bytes, bool *ok, bool *all, char *why, size_t cap) {
    if (!*all) { // keep the first reason
        char ignored[64];
        *ok = dsc__cuda_host_pin(p, bytes, ignored, sizeof ignored);
        return;
    }
    *ok = dsc__cuda_host_pin(p, bytes, why, cap);
    if (!*ok) *all = false;
}

size_t dsc__train_off_device_len(dsc_engine *eng, const dsc_model *model) {
    return dsc__slots_layout(eng, dsc_model_describe(model)->n_layer, NULL, NULL);
}

static const dsc__slots_ops slot_ops; // below

static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

// The layers' frozen ranges to the host in 16 bits (the store holds them rounded to the compute
// type already: exact), and the slots told to stream them.
static dsc_status frozen_stream_init(train_off *o, bool *pinned, char *why, size_t cap) {
    size_t n, lo, hi, pad;
    const float *store = dsc__engine_frozen_store(o->eng, &n);
    if (!n) return DSC_OK;
    if (!store)
        return dsc__fail(DSC_ERR_INTERNAL, "parameter offload: no host store of the frozen "
                         "tensors to stream (a bug: report it)");
    dsc__engine_frozen_span(o->eng, 1, &lo, &pad);
    dsc__engine_frozen_span(o->eng, o->sl.L, &hi, &pad);
    hi += pad;
    o->fbase = lo;
    if (hi > lo) {
        size_t bytes = round64((hi - lo) * sizeof(uint16_t));
        o->hf16 = aligned_alloc(64, bytes);
        if (!o->hf16)
            return dsc__fail(DSC_ERR_OOM, "parameter offload: out of memory for the host copy "
                             "of %zu frozen 16-bit weights", hi - lo);
        if (o->fp16) dsc_fp32_to_fp16_n(o->hf16, store + lo, hi - lo);
        else dsc_fp32_to_bf16_n(o->hf16, store + lo, hi - lo);
        pin(o->hf16, bytes, &o->hf16_pinned, pinned, why, cap);
    }
    return dsc__slots_frozen(&o->sl, o->eng, o->st->frozen16, o->st->nfrozen);
}

static dsc_status param_init(train_off *o, const dsc_model *model, bool *pinned, char *why,
                             size_t cap) {
    DSC_TRY(dsc__slots_init(&o->sl, o->eng, model, o->st->p16, o->st->grad, o->st->n, &slot_ops,
                            o));
    DSC_TRY(frozen_stream_init(o, pinned, why, cap));
    for (int k = 0; k < 2; k++) {
        o->tmp[k] = aligned_alloc(64, (o->sl.slot_len * sizeof(float) + 63) / 64 * 64);
        if (!o->tmp[k]) return dsc__fail(DSC_ERR_OOM, "parameter offload: out of memory");
        pin(o->tmp[k], o->sl.slot_len * sizeof(float), &o->tmp_pinned[k], pinned, why, cap);
    }
    return DSC_OK;
}

static bool ring_group(const train_off *o, int g);

// Lean mode: the resident groups and the four slots of the largest.
static dsc_status lean_init(train_off *o, bool *pinned, char *why, size_t cap) {
    o->res = calloc((size_t)o->ngroups, sizeof *o->res);
    if (!o->res) return dsc__fail(DSC_ERR_OOM, "out of memory");
    for (int g = 0; g < o->ngroups; g++) {
        if (ring_group(o, g)) continue;
        o->res[o->nres++] = g;
        if (o->spans[g].padded > o->slot_len) o->slot_len = o->spans[g].padded;
    }
    size_t gb = round64(o->slot_len * sizeof(float)), wb = round64(o->slot_len * sizeof(uint16_t));
    for (int k = 0; k < 2; k++) {
        o->gslot[k] = aligned_alloc(64, gb);
        o->wslot[k] = aligned_alloc(64, wb);
        o->wslot_group[k] = -1;
        if (!o->gslot[k] || !o->wslot[k])
            return dsc__fail(DSC_ERR_OOM, "ZeRO-Offload: out of memory for the host slots of "
                             "%zu parameters (the largest group)", o->slot_len);
        pin(o->gslot[k], gb, &o->gslot_pinned[k], pinned, why, cap);
        pin(o->wslot[k], wb, &o->wslot_pinned[k], pinned, why, cap);
    }
    return DSC_OK;
}

static dsc_status init(train_off *o, const dsc_model *model, bool *pinned, char *why,
                       size_t cap) {
    dsc__engine_dp L;
    DSC_TRY(dsc__engine_dp_layout(o->eng, &L));
    o->ngroups = L.ngroups;
    o->spans = calloc((size_t)o->ngroups, sizeof *o->spans);
    o->part = calloc((size_t)o->ngroups, sizeof *o->part);
    if (!o->spans || !o->part) return dsc__fail(DSC_ERR_OOM, "out of memory");
    for (int g = 0; g < o->ngroups; g++)
        dsc__engine_span_of(o->eng, g, &o->spans[g]);
    DSC_TRY(check_groups(o, model));
    DSC_TRY(dsc__cuda_offload_create(&o->bus, o->ngroups, o->params ? 2 : 0, o->st->stream));
    *pinned = true;
    if (o->params) {
        bool one_micro = dsc_engine_config(o->eng)->gradient_accumulation_steps == 1;
        if (o->lean && !(one_micro && dsc__engine_norm_free(o->eng)))
            return dsc__fail(DSC_ERR_INTERNAL, "parameter offload without a gradient "
                             "accumulator needs one micro-step per step and no clipping or fp16 "
                             "(dsc__engine_grads_streamed; a bug: report it)");
        size_t bytes = round64(o->host.total * sizeof(uint16_t));
        o->h16 = aligned_alloc(64, bytes);
        if (!o->h16)
            return dsc__fail(DSC_ERR_OOM, "parameter offload: out of memory for the host copy "
                             "of %zu 16-bit weights", o->host.total);
        if (o->host.acc)
            pin(o->host.acc, o->host.total * sizeof(float), &o->acc_pinned, pinned, why, cap);
        pin(o->h16, bytes, &o->h16_pinned, pinned, why, cap);
        DSC_TRY(param_init(o, model, pinned, why, cap));
    }
    return o->lean ? lean_init(o, pinned, why, cap) : DSC_OK;
}

dsc_status dsc__train_off_create(train_off **out, dsc_engine *eng, dsc_cuda_state *st,
                                 const dsc__engine_flat *host, dsc_model_device *dev,
                                 const dsc_model *model, bool fp16, bool params, bool *pinned,
                                 char *why, size_t cap) {
    *out = NULL;
    train_off *o = calloc(1, sizeof *o);
    if (!o) return dsc__fail(DSC_ERR_OOM, "out of memory");
    *o = (train_off){.eng = eng,
                     .st = st,
                     .dev = dev,
                     .host = *host,
                     .fp16 = fp16,
                     .params = params,
                     .lean = !host->acc,
                     .tmp_group = {-1, -1}};
    dsc_status s = init(o, model, pinned, why, cap);
    if (s != DSC_OK) {
        dsc__train_off_destroy(o);
        return s;
    }
    *out = o;
    return DSC_OK;
}

void dsc__train_off_destroy(train_off *o) {
    if (!o) return;
    dsc__cuda_offload_destroy(o->bus); // its copies end before the buffers are unpinned
    if (o->acc_pinned) dsc__cuda_host_unpin(o->host.acc);
    if (o->h16_pinned) dsc__cuda_host_unpin(o->h16);
    if (o->hf16_pinned) dsc__cuda_host_unpin(o->hf16);
    for (int k = 0; k < 2; k++) {
        if (o->tmp_pinned[k]) dsc__cuda_host_unpin(o->tmp[k]);
        if (o->gslot_pinned[k]) dsc__cuda_host_unpin(o->gslot[k]);
        if (o->wslot_pinned[k]) dsc__cuda_host_unpin(o->wslot[k]);
        free(o->tmp[k]);
        free(o->gslot[k]);
        free(o->wslot[k]);
    }
    dsc__slots_free(&o->sl);
    free(o->res);
    free(o->dump);
    free(o->h16);
    free(o->hf16);
    free(o->spans);
    free(o->part);
    free(o);
}

// ---- parameter offload: the layers through the slots (engine/gpu/layer_slots.h) ----

static dsc_status slot_fetch(void *user, int k, int layer) {
    train_off *o = user;
    const dsc__engine_span *sp = &o->spans[layer + 1];
    size_t foff = 0, fn = 0;
    if (o->sl.fdev) dsc__engine_frozen_span(o->eng, layer + 1, &foff, &fn);
    return dsc__cuda_offload_fetch(o->bus, k, o->sl.w[k], o->h16 + sp->off, sp->padded,
                                   o->sl.fw[k], fn ? o->hf16 + (foff - o->fbase) : NULL, fn);
}

static dsc_status slot_use(void *user, int k) {
    return dsc__cuda_offload_use(((train_off *)user)->bus, k);
}

static dsc_status slot_release(void *user, int k) {
    return dsc__cuda_offload_release(((train_off *)user)->bus, k);
}

// A gradient slot is free once the gradients that used it last have left for the host.
static dsc_status slot_reuse(void *user, int j, int before, int g) {
    train_off *o = user;
    return dsc__cuda_offload_reuse_grads(o->bus, before >= 0 ? before : g, o->sl.g[j],
                                         o->sl.slot_len);
}

static const dsc__slots_ops slot_ops = {slot_fetch, slot_use, slot_release, slot_reuse};

// ---- the step ----

// Where group g's gradients and 16-bit weights are on the device.
static size_t dev_off(const train_off *o, int g) {
    return o->params ? o->sl.dev_off[g] : o->spans[g].off;
}

// The CPU optimizer over group g (its gradients in grads), its 16-bit result up to the GPU (with
// parameter offload, a layer's result stays in h16, where the next fetch reads it; in the lean
// mode it goes through a weight slot, once the slot's previous upload has read it).
static dsc_status update_group(train_off *o, int g, const float *grads) {
    const dsc__engine_span *sp = &o->spans[g];
    size_t off = sp->off, n = sp->padded;
    uint16_t *out = o->h16 ? o->h16 + off : NULL;
    if (o->lean && !ring_group(o, g)) {
        int k = o->wnext;
        o->wnext ^= 1;
        if (o->wslot_group[k] >= 0)
            DSC_TRY(dsc__cuda_offload_weights_wait(o->bus, o->wslot_group[k]));
        o->wslot_group[k] = g;
        out = o->wslot[k];
    }
    const dsc__device_step *p = &o->plan;
    dsc_opt_step(&p->hp, p->opt_step, o->host.master + off, grads, o->host.m + off,
                 o->host.v ? o->host.v + off : NULL, n, p->grad_scale, out,
                 o->fp16 ? DSC_OPT_OUT_FP16 : DSC_OPT_OUT_BF16);
    if (ring_group(o, g)) return DSC_OK;
    return dsc__cuda_offload_weights_in(o->bus, g, o->st->p16 + dev_off(o, g), out, n);
}

// tmp[k]'s gradients, once landed, added into the accumulator.
static dsc_status drain_tmp(train_off *o, int k) {
    int g = o->tmp_group[k];
    if (g < 0) return DSC_OK;
    DSC_TRY(dsc__cuda_offload_grads_wait(o->bus, g));
    const dsc__engine_span *sp = &o->spans[g];
    float *acc = o->host.acc + sp->off;
    const float *t = o->tmp[k];
#pragma omp parallel for schedule(static) if (sp->padded > 65536)
    for (size_t i = 0; i < sp->padded; i++)
        acc[i] += t[i];
    o->tmp_group[k] = -1;
    return DSC_OK;
}

static dsc_status lean_grads_out(train_off *o, int g); // below

// The backward's hook: group g's gradients are complete on the GPU. The step's last micro-step
// sends every group; with parameter offload the layers go every micro-step (their gradient slots
// are reused), straight into the accumulator at the step's first micro-step, later through tmp.
static dsc_status grads_out(void *user, int g) {
    train_off *o = user;
    if (g < 0 || g >= o->ngroups)
        return dsc__fail(DSC_ERR_INTERNAL, "ZeRO-Offload: the backward finished group %d of %d", g,
                         o->ngroups);
    if (o->lean) return o->last ? lean_grads_out(o, g) : DSC_OK;
    const dsc__engine_span *sp = &o->spans[g];
    float *dst = o->host.acc + sp->off;
    const float *src = o->st->grad + dev_off(o, g);
    if (ring_group(o, g)) {
        int k = (g - 1) & 1;
        src = o->sl.g[k];
        if (dsc__engine_micro(o->eng) > 0) {
            DSC_TRY(drain_tmp(o, k));
            dst = o->tmp[k];
            o->tmp_group[k] = g;
        }
    } else if (!o->last) {
        return DSC_OK; // stays on the device, accumulating
    }
    return dsc__cuda_offload_grads_out(o->bus, g, dst, src, sp->padded);
}

// Group g landed: a later micro-step's layer gradients added; on the step's last micro-step fp16
// rounding as dsc_step's, its part of the norm as dsc__zero_norm computes it, and early, the
// update.
static dsc_status take_group(train_off *o, int g, float inv_scale) {
    double t0 = dsc_now();
    DSC_TRY(dsc__cuda_offload_grads_wait(o->bus, g));
    for (int k = 0; k < 2; k++)
        if (o->tmp_group[k] == g) DSC_TRY(drain_tmp(o, k));
    double t1 = dsc_now();
    o->t.grad_wait += t1 - t0;
    if (!o->last) return DSC_OK;
    const dsc__engine_span *sp = &o->spans[g];
    float *a = o->host.acc + sp->off;
    if (dsc__engine_fp16(o->eng)) dsc__round_fp16(a, a, sp->padded); // as dsc_step's
    o->part[g] = dsc_opt_sumsq(a, sp->padded, inv_scale, &o->nonfinite);
    if (o->early && o->plan.apply) DSC_TRY(update_group(o, g, a));
    o->t.cpu += dsc_now() - t1;
    return DSC_OK;
}

// ---- lean mode: the groups through two gradient slots ----

typedef dsc_status (*lean_fn)(train_off *o, int g, float *grads, float inv_scale);

// Resident group i of a pass: backward order (ln_f's group, the layers from the last, the
// embeddings: the order the backward completes them in) or the groups' order.
static int pass_group(const train_off *o, bool backward, int i) {
    return o->res[backward ? o->nres - 1 - i : i];
}

static dsc_status lean_copy(train_off *o, int k, int g) {
    return dsc__cuda_offload_grads_copy(o->bus, g, o->gslot[k], o->st->grad + dev_off(o, g),
                                        o->spans[g].padded);
}

// Every group's gradients (complete on the device: the backward marked them) land in the two
// slots in turn; fn takes each; the copy of the group two ahead starts into a slot as soon as fn
// is done with it, so one copy is always on the way while the CPU works. The backward's pass
// adds its waits and its work to the step's times; the second pass runs inside
// dsc__train_off_step, which times itself.
static dsc_status lean_pass(train_off *o, bool backward, lean_fn fn, float inv_scale) {
    int G = o->nres;
    for (int i = 0; i < 2 && i < G; i++)
        DSC_TRY(lean_copy(o, i, pass_group(o, backward, i)));
    for (int i = 0; i < G; i++) {
        int k = i & 1, g = pass_group(o, backward, i);
        double t0 = dsc_now();
        DSC_TRY(dsc__cuda_offload_grads_wait(o->bus, g));
        double t1 = dsc_now();
        DSC_TRY(fn(o, g, o->gslot[k], inv_scale));
        if (backward) {
            o->t.grad_wait += t1 - t0;
            o->t.cpu += dsc_now() - t1;
        }
        if (i + 2 < G) DSC_TRY(lean_copy(o, k, pass_group(o, backward, i + 2)));
    }
    return DSC_OK;
}

// The step's first pass, as take_group: fp16 rounding, the group's part of the norm and, early,
// the update.
static dsc_status lean_take(train_off *o, int g, float *a, float inv_scale) {
    size_t n = o->spans[g].padded;
    if (dsc__engine_fp16(o->eng)) dsc__round_fp16(a, a, n); // as dsc_step's
    o->part[g] = dsc_opt_sumsq(a, n, inv_scale, &o->nonfinite);
    if (o->dump) memcpy(o->dump + o->spans[g].off, a, n * sizeof *a);
    return o->early && o->plan.apply ? update_group(o, g, a) : DSC_OK;
}

// Parameter offload, lean: the layer in tmp[k], once landed, taken as lean_take takes a group.
static dsc_status take_tmp(train_off *o, int k) {
    int g = o->tmp_group[k];
    if (g < 0) return DSC_OK;
    double t0 = dsc_now();
    DSC_TRY(dsc__cuda_offload_grads_wait(o->bus, g));
    double t1 = dsc_now();
    DSC_TRY(lean_take(o, g, o->tmp[k], (float)(1.0 / dsc__engine_loss_scale(o->eng))));
    o->tmp_group[k] = -1;
    o->t.grad_wait += t1 - t0;
    o->t.cpu += dsc_now() - t1;
    return DSC_OK;
}

// The lean mode's hook (the step's micro-step): a resident group is marked complete (it comes
// down in take_all's pass); with parameter offload a layer goes down at once into tmp, whose
// previous layer (two back) the CPU takes first: the host keeps pace with the backward, which
// reuses the layers' gradient slots.
static dsc_status lean_grads_out(train_off *o, int g) {
    if (!ring_group(o, g)) return dsc__cuda_offload_grads_done(o->bus, g);
    int k = (g - 1) & 1;
    DSC_TRY(take_tmp(o, k));
    o->tmp_group[k] = g;
    return dsc__cuda_offload_grads_out(o->bus, g, o->tmp[k], o->sl.g[k], o->spans[g].padded);
}

// The second pass of a step that needed the norm first: the gradients once more (the device
// still holds them), rounded the same way, and the update.
static dsc_status lean_update(train_off *o, int g, float *a, float inv_scale) {
    (void)inv_scale;
    if (dsc__engine_fp16(o->eng)) dsc__round_fp16(a, a, o->spans[g].padded);
    return update_group(o, g, a);
}

// --dump-grads in the lean mode: lean_take copied every group into dump when the observer was
// there as the step's last micro-step began; otherwise (without parameter offload) the device
// still holds the step's gradients: they come into a temporary buffer, rounded as the slots' are.
static dsc_status lean_observe(train_off *o) {
    if (!o->dump && o->params)
        return dsc__fail(DSC_ERR_INVALID_ARG, "gradient observer: with streamed parameter "
                         "offload the layers' gradients leave the GPU during the backward; set "
                         "the observer (dsc_engine_observe_grads) before the step's last "
                         "micro-step");
    if (!o->dump) {
        o->dump = malloc(o->st->n * sizeof *o->dump);
        if (!o->dump)
            return dsc__fail(DSC_ERR_OOM, "--dump-grads: out of memory for %zu gradients on "
                             "the host", o->st->n);
        dsc_status s = dsc__cuda_state_grads_to_host(o->st, o->dump);
        if (s == DSC_OK && dsc__engine_fp16(o->eng)) dsc__round_fp16(o->dump, o->dump, o->st->n);
        if (s != DSC_OK) return s;
    }
    dsc_status s = dsc__engine_observe_grads_in(o->eng, o->dump);
    free(o->dump);
    o->dump = NULL;
    return s;
}

// The optimizer may run before the norm is known when nothing it does depends on the norm: no
// clipping and no fp16 loss scaling (bf16 and fp32 runs never skip a step); the step's first
// half then, its second (the norm, inf/NaN) in dsc__train_off_step.
static dsc_status start_step(train_off *o) {
    memset(&o->t, 0, sizeof o->t);
    o->nonfinite = false;
    free(o->dump);
    o->dump = NULL;
    if (o->lean && dsc__engine_grads_observed(o->eng)) {
        o->dump = calloc(o->host.total, sizeof *o->dump);
        if (!o->dump)
            return dsc__fail(DSC_ERR_OOM, "--dump-grads: out of memory for %zu gradients on the "
                             "host", o->host.total);
    }
    o->early = dsc__engine_norm_free(o->eng);
    if (!o->early) return DSC_OK;
    o->t.overlapped = true;
    return dsc__engine_device_step_begin(o->eng, &o->plan, &o->early_info, &o->early_div);
}

// Backward order: ln_f's group, the layers from the last, the embeddings. Before the last
// micro-step only the layers (parameter offload) are on their way.
static dsc_status take_all(train_off *o) {
    float inv = (float)(1.0 / dsc__engine_loss_scale(o->eng));
    if (o->lean) {
        if (!o->last) return DSC_OK;
        DSC_TRY(lean_pass(o, true, lean_take, inv)); // the resident groups
        for (int k = 0; k < 2; k++)
            DSC_TRY(take_tmp(o, k)); // parameter offload: the first two layers
        return DSC_OK;
    }
    if (o->last) DSC_TRY(take_group(o, o->ngroups - 1, inv));
    for (int g = o->ngroups - 2; g >= 1; g--)
        if (o->last || ring_group(o, g)) DSC_TRY(take_group(o, g, inv));
    return o->last ? take_group(o, 0, inv) : DSC_OK;
}

dsc_status dsc__train_off_micro(train_off *o, const uint16_t *const *p16, float *const *grad,
                                const int32_t *in, const int32_t *tg, int B, int T, float scale,
                                bool timed, float *loss, double *fwd_s, double *bwd_s) {
    o->last = dsc__engine_micro_last(o->eng);
    bool hook = o->last || o->params;
    dsc_model_device_set_grad_hook(o->dev, hook ? grads_out : NULL, o);
    if (o->last) DSC_TRY(start_step(o));
    double t0 = dsc_now(), t1 = t0;
    if (timed) {
        DSC_TRY(dsc_model_device_forward(o->dev, p16, in, tg, B, T, loss));
        t1 = dsc_now();
        dsc__engine_phase(o->eng, "backward");
        DSC_TRY(dsc_model_device_backward(o->dev, p16, grad, scale));
    } else {
        DSC_TRY(dsc_model_device_train_step(o->dev, p16, grad, in, tg, B, T, scale, NULL));
        dsc__engine_phase(o->eng, "backward"); // enqueued; the gradients come in take_all
    }
    if (hook) DSC_TRY(take_all(o)); // while the GPU finishes the backward
    if (timed) {
        DSC_TRY(dsc__cuda_stream_wait(o->st->stream));
        *fwd_s += t1 - t0;
        *bwd_s += dsc_now() - t1;
        return DSC_OK;
    }
    return dsc_model_device_read_loss(o->dev, loss);
}

dsc_status dsc__train_off_step(train_off *o, dsc_step_info *info) {
    if (!dsc__engine_micro_done(o->eng, info)) return DSC_OK;
    double t0 = dsc_now();
    // --dump-grads: the accumulator holds the whole step's gradients (the optimizer reads them
    // and leaves them as they are, so an early update does not disturb them).
    if (dsc__engine_grads_observed(o->eng))
        DSC_TRY(o->lean ? lean_observe(o) : dsc__engine_observe_host_grads(o->eng));
    double sumsq = 0;
    for (int g = 0; g < o->ngroups; g++)
        sumsq += o->part[g]; // dsc__zero_norm's order
    bool nonfinite = o->nonfinite || !isfinite(sumsq);
    if (o->early) {
        *info = o->early_info;
        dsc__engine_device_step_end(o->eng, sumsq, nonfinite, info);
    } else {
        DSC_TRY(dsc__engine_device_step(o->eng, sumsq, nonfinite, &o->plan, info));
        if (o->plan.apply && o->lean) DSC_TRY(lean_pass(o, false, lean_update, 0));
        for (int g = 0; o->plan.apply && !o->lean && g < o->ngroups; g++)
            DSC_TRY(update_group(o, g, o->host.acc + o->spans[g].off));
    }
    o->t.cpu += dsc_now() - t0;
    if (o->plan.apply) dsc__slots_forget(&o->sl); // the layers' weights changed
    DSC_TRY(dsc__cuda_offload_fence(o->bus)); // the next kernels read the new weights
    return dsc__cuda_state_zero_grads(o->st);
}

void dsc__train_off_views(train_off *o, const uint16_t **p16, float **grad) {
    dsc__slots_views(&o->sl, o->dev, p16, grad);
}

dsc_status dsc__train_off_load(train_off *o) {
    if (!o->params)
        return dsc__fail(DSC_ERR_INTERNAL, "ZeRO-Offload: the host 16-bit copy exists with "
                         "parameter offload only (a bug: report it)");
    size_t n = o->host.total;
    if (o->fp16)
        dsc_fp32_to_fp16_n(o->h16, o->host.master, n);
    else
        dsc_fp32_to_bf16_n(o->h16, o->host.master, n);
    dsc__slots_forget(&o->sl);
    for (int g = 0; g < o->ngroups; g++) {
        if (ring_group(o, g)) continue;
        const dsc__engine_span *sp = &o->spans[g];
        DSC_TRY(dsc__cuda_to_device(o->st->p16 + o->sl.dev_off[g], o->h16 + sp->off,
                                    sp->padded * sizeof(uint16_t), o->st->stream));
    }
    return DSC_OK;
}

void dsc__train_off_times(const train_off *o, train_off_times *out) {
    *out = o->t;
}

#endif // DSC_WITH_CUDA
