// cli/train_gpu_offload.c - streamed ZeRO-Offload on one GPU (see train_gpu_offload.h).
#include "cli/train_gpu_offload.h"

#ifdef DSC_WITH_CUDA

#include <math.h>   // isfinite, sqrt
#include <stdlib.h> // calloc, free, aligned_alloc
#include <string.h> // memset

#include "base/log.h"           // DSC_WARN
#include "base/status.h"        // dsc__fail, DSC_TRY
#include "base/time.h"          // dsc_now
#include "cuda/convert.h"       // dsc__cuda_to_device
#include "cuda/offload.h"       // dsc__cuda_offload_*
#include "dsc/half.h"           // dsc_fp32_to_fp16_n, dsc_fp16_to_fp32_n
#include "engine/optim/optim.h" // dsc_opt_step, dsc_opt_sumsq

struct train_off {
    dsc_engine *eng;
    dsc_cuda_state *st;
    dsc_gpt2_cuda *model;
    dsc_cuda_offload *bus;
    dsc__engine_flat host;   // acc: gradients land here; master, m, v: the optimizer's
    dsc__engine_span *spans; // (ngroups) each group's range of the flat layout
    uint16_t *h16;           // (total) page-locked: the new 16-bit weights on their way up
    bool acc_pinned, h16_pinned;
    int ngroups, gas, micro;
    bool fp16, clipping;
    // this step
    double *part; // (ngroups) each group's sum of squares, added in group order
    bool nonfinite;
    bool early;            // the optimizer ran group by group as the gradients landed
    bool last;             // the micro-step running is the step's last
    dsc__device_step plan; // early: made before the norm was known (nothing depends on it)
    dsc_step_info early_info;
    train_off_times t;
    // offload_param: the layers' 16-bit weights live in h16 only and pass through two device
    // slots (the embeddings and ln_f stay on the device); the layers' gradients pass through two
    // gradient slots and go to the host every micro-step (later micro-steps through tmp, added
    // into the accumulator on the host).
    bool params;
    int L;              // layers: groups 1 .. L
    size_t *dev_off;    // (ngroups) resident groups' offset in the device arrays
    size_t slot_len;    // elements of a slot: the largest layer group
    uint16_t *wslot[2]; // device weight slots (views of st->p16)
    float *gslot[2];    // device gradient slots (views of st->grad)
    int wslot_layer[2]; // the layer whose current weights slot k holds (-1: none)
    int gslot_group[2]; // the group whose gradients last used gradient slot k (-1: none)
    float *tmp[2];      // page-locked host: a later micro-step's gradients of a layer
    bool tmp_pinned[2];
    int tmp_group[2];     // the group landing in tmp[k], not yet added (-1: none)
    const uint16_t **p16; // the trainer's view tables, repointed layer by layer
    float **grad;
    int ntensors;
    int *tgroup; // (ntensors) each tensor's group
    size_t *tin; // (ntensors) its offset inside the group
};

static bool ring_group(const train_off *o, int g) {
    return o->params && g >= 1 && g <= o->L;
}

// ---- create / destroy ----

// The backward's groups are the engine's: tensor i of model group k lies inside engine group k,
// and at one rank every group's optimizer state is its whole range.
static dsc_status check_groups(train_off *o, const dsc_gpt2_config *mc) {
    for (int i = 0; i < dsc_gpt2_num_tensors(mc); i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(mc, i, &info);
        size_t off = dsc__engine_param_offset(o->eng, i);
        const dsc__engine_span *sp = info.group < o->ngroups ? &o->spans[info.group] : NULL;
        if (!sp || off < sp->off || off + (size_t)info.numel > sp->off + sp->padded)
            return dsc__fail(DSC_ERR_INTERNAL,
                             "ZeRO-Offload: tensor %s is not inside the "
                             "engine's parameter group %d",
                             info.name, info.group);
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

// Parameter offload's device layout: the resident groups (0: embeddings, L + 1: ln_f) in group
// order, then two slots of the largest layer group; 16-bit weights and fp32 gradients alike.
static size_t device_layout(dsc_engine *eng, int L, size_t *dev_off, size_t *slot_len) {
    size_t at = 0, slot = 0;
    for (int g = 0; g <= L + 1; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(eng, g, &sp);
        if (g >= 1 && g <= L) {
            if (sp.padded > slot) slot = sp.padded;
            continue;
        }
        if (dev_off) dev_off[g] = at;
        at += sp.padded;
    }
    if (slot_len) *slot_len = slot;
    return at + 2 * slot;
}

size_t dsc__train_off_device_len(dsc_engine *eng, const dsc_gpt2_config *mc) {
    return device_layout(eng, mc->n_layer, NULL, NULL);
}

static dsc_status param_init(train_off *o, const dsc_gpt2_config *mc, bool *pinned, char *why,
                             size_t cap) {
    o->L = mc->n_layer;
    o->ntensors = dsc_gpt2_num_tensors(mc);
    o->dev_off = calloc((size_t)o->ngroups, sizeof *o->dev_off);
    o->tgroup = calloc((size_t)o->ntensors, sizeof *o->tgroup);
    o->tin = calloc((size_t)o->ntensors, sizeof *o->tin);
    if (!o->dev_off || !o->tgroup || !o->tin) return dsc__fail(DSC_ERR_OOM, "out of memory");
    size_t len = device_layout(o->eng, o->L, o->dev_off, &o->slot_len);
    if (len != o->st->n)
        return dsc__fail(DSC_ERR_INTERNAL,
                         "parameter offload: a device state of %zu elements "
                         "for a layout of %zu",
                         o->st->n, len);
    for (int k = 0; k < 2; k++) {
        o->wslot[k] = o->st->p16 + len - (size_t)(2 - k) * o->slot_len;
        o->gslot[k] = o->st->grad + len - (size_t)(2 - k) * o->slot_len;
        o->tmp[k] = aligned_alloc(64, (o->slot_len * sizeof(float) + 63) / 64 * 64);
        if (!o->tmp[k]) return dsc__fail(DSC_ERR_OOM, "parameter offload: out of memory");
        pin(o->tmp[k], o->slot_len * sizeof(float), &o->tmp_pinned[k], pinned, why, cap);
    }
    for (int i = 0; i < o->ntensors; i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(mc, i, &info);
        o->tgroup[i] = info.group;
        o->tin[i] = dsc__engine_param_offset(o->eng, i) - o->spans[info.group].off;
    }
    return DSC_OK;
}

static dsc_status init(train_off *o, const dsc_gpt2_config *mc, bool *pinned, char *why,
                       size_t cap) {
    dsc__engine_dp L;
    DSC_TRY(dsc__engine_dp_layout(o->eng, &L));
    o->ngroups = L.ngroups;
    o->gas = (int)dsc_engine_config(o->eng)->gradient_accumulation_steps;
    o->clipping = dsc_engine_config(o->eng)->gradient_clipping > 0;
    o->spans = calloc((size_t)o->ngroups, sizeof *o->spans);
    o->part = calloc((size_t)o->ngroups, sizeof *o->part);
    size_t bytes = (o->host.total * sizeof(uint16_t) + 63) / 64 * 64;
    o->h16 = aligned_alloc(64, bytes);
    if (!o->spans || !o->part || !o->h16)
        return dsc__fail(DSC_ERR_OOM,
                         "ZeRO-Offload: out of memory for the host staging of "
                         "%zu 16-bit weights",
                         o->host.total);
    for (int g = 0; g < o->ngroups; g++)
        dsc__engine_span_of(o->eng, g, &o->spans[g]);
    DSC_TRY(check_groups(o, mc));
    DSC_TRY(dsc__cuda_offload_create(&o->bus, o->ngroups, o->params ? 2 : 0, o->st->stream));
    *pinned = true;
    pin(o->host.acc, o->host.total * sizeof(float), &o->acc_pinned, pinned, why, cap);
    pin(o->h16, bytes, &o->h16_pinned, pinned, why, cap);
    return o->params ? param_init(o, mc, pinned, why, cap) : DSC_OK;
}

dsc_status dsc__train_off_create(train_off **out, dsc_engine *eng, dsc_cuda_state *st,
                                 const dsc__engine_flat *host, dsc_gpt2_cuda *model,
                                 const dsc_gpt2_config *mc, bool fp16, bool params, bool *pinned,
                                 char *why, size_t cap) {
    *out = NULL;
    train_off *o = calloc(1, sizeof *o);
    if (!o) return dsc__fail(DSC_ERR_OOM, "out of memory");
    *o = (train_off){.eng = eng,
                     .st = st,
                     .model = model,
                     .host = *host,
                     .fp16 = fp16,
                     .params = params,
                     .wslot_layer = {-1, -1},
                     .gslot_group = {-1, -1},
                     .tmp_group = {-1, -1}};
    dsc_status s = init(o, mc, pinned, why, cap);
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
    for (int k = 0; k < 2; k++) {
        if (o->tmp_pinned[k]) dsc__cuda_host_unpin(o->tmp[k]);
        free(o->tmp[k]);
    }
    free(o->dev_off);
    free(o->tgroup);
    free(o->tin);
    free(o->h16);
    free(o->spans);
    free(o->part);
    free(o);
}

// ---- parameter offload: the layers through the slots ----

static int wslot_of(const train_off *o, int layer) {
    for (int k = 0; k < 2; k++)
        if (o->wslot_layer[k] == layer) return k;
    return -1;
}

// Layer `layer`'s weights into a slot unless one holds them (not the slot of `keep`).
static dsc_status fetch_layer(train_off *o, int layer, int keep) {
    if (layer < 0 || layer >= o->L || wslot_of(o, layer) >= 0) return DSC_OK;
    int k = keep >= 0 && wslot_of(o, keep) == 0 ? 1 : 0;
    const dsc__engine_span *sp = &o->spans[layer + 1];
    DSC_TRY(dsc__cuda_offload_fetch(o->bus, k, o->wslot[k], o->h16 + sp->off, sp->padded));
    o->wslot_layer[k] = layer;
    return DSC_OK;
}

// Point the view tables' entries of `layer` at its slots (weights; in backward gradients too).
static void point_layer(train_off *o, int layer, const uint16_t *w, float *g) {
    int first = 2 + layer * ((o->ntensors - 4) / o->L);
    for (int i = first; i < o->ntensors && o->tgroup[i] == layer + 1; i++) {
        o->p16[i] = w + o->tin[i];
        if (g) o->grad[i] = g + o->tin[i];
    }
}

// The model's layer hook (cuda/gpt2_cuda.h): the layer just enqueued gives its slot back; this
// layer's weights are waited for (fetched now if no slot holds them) and the next layer's are
// fetched into the other slot while this one computes. In backward the layer also gets a zeroed
// gradient slot, once the gradients that used it before have left for the host.
static dsc_status on_layer(void *user, int pass, int layer) {
    train_off *o = user;
    int prev = pass == 0 ? layer - 1 : layer + 1, next = pass == 0 ? layer + 1 : layer - 1;
    int k = prev >= 0 && prev < o->L ? wslot_of(o, prev) : -1;
    if (k >= 0) DSC_TRY(dsc__cuda_offload_release(o->bus, k));
    if (layer < 0 || layer >= o->L) return DSC_OK;
    DSC_TRY(fetch_layer(o, layer, prev));
    k = wslot_of(o, layer);
    DSC_TRY(dsc__cuda_offload_use(o->bus, k));
    DSC_TRY(fetch_layer(o, next, layer));
    float *g = NULL;
    if (pass == 1) {
        int j = layer & 1, before = o->gslot_group[j];
        DSC_TRY(dsc__cuda_offload_reuse_grads(o->bus, before >= 0 ? before : layer + 1, o->gslot[j],
                                              o->slot_len));
        o->gslot_group[j] = layer + 1;
        g = o->gslot[j];
    }
    point_layer(o, layer, o->wslot[k], g);
    return DSC_OK;
}

// ---- the step ----

// Where group g's gradients and 16-bit weights are on the device.
static size_t dev_off(const train_off *o, int g) {
    return o->params ? o->dev_off[g] : o->spans[g].off;
}

// The CPU optimizer over group g, its 16-bit result up to the GPU (with parameter offload, a
// layer's result stays in h16, where the next fetch reads it).
static dsc_status update_group(train_off *o, int g) {
    const dsc__engine_span *sp = &o->spans[g];
    size_t off = sp->off, n = sp->padded;
    const dsc__device_step *p = &o->plan;
    dsc_opt_step(&p->hp, p->opt_step, o->host.master + off, o->host.acc + off, o->host.m + off,
                 o->host.v ? o->host.v + off : NULL, n, p->grad_scale, o->h16 + off,
                 o->fp16 ? DSC_OPT_OUT_FP16 : DSC_OPT_OUT_BF16);
    if (ring_group(o, g)) return DSC_OK;
    return dsc__cuda_offload_weights_in(o->bus, g, o->st->p16 + dev_off(o, g), o->h16 + off, n);
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

// The backward's hook: group g's gradients are complete on the GPU. The step's last micro-step
// sends every group; with parameter offload the layers go every micro-step (their gradient slots
// are reused), straight into the accumulator at the step's first micro-step, later through tmp.
static dsc_status grads_out(void *user, int g) {
    train_off *o = user;
    if (g < 0 || g >= o->ngroups)
        return dsc__fail(DSC_ERR_INTERNAL, "ZeRO-Offload: the backward finished group %d of %d", g,
                         o->ngroups);
    const dsc__engine_span *sp = &o->spans[g];
    float *dst = o->host.acc + sp->off;
    const float *src = o->st->grad + dev_off(o, g);
    if (ring_group(o, g)) {
        int k = (g - 1) & 1;
        src = o->gslot[k];
        if (o->micro > 0) {
            DSC_TRY(drain_tmp(o, k));
            dst = o->tmp[k];
            o->tmp_group[k] = g;
        }
    } else if (!o->last) {
        return DSC_OK; // stays on the device, accumulating
    }
    return dsc__cuda_offload_grads_out(o->bus, g, dst, src, sp->padded);
}

// fp16 values, as dsc_step makes them (beyond fp16's range: inf), through a small buffer.
static void round_fp16(float *x, size_t n) {
    enum { CHUNK = 4096 };
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i += CHUNK) {
        uint16_t h[CHUNK];
        size_t c = n - i < CHUNK ? n - i : CHUNK;
        dsc_fp32_to_fp16_n(h, x + i, c);
        dsc_fp16_to_fp32_n(x + i, h, c);
    }
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
    if (o->fp16) round_fp16(a, sp->padded);
    o->part[g] = dsc_opt_sumsq(a, sp->padded, inv_scale, &o->nonfinite);
    if (o->early && o->plan.apply) DSC_TRY(update_group(o, g));
    o->t.cpu += dsc_now() - t1;
    return DSC_OK;
}

// The optimizer may run before the norm is known when nothing it does depends on the norm: no
// clipping and no fp16 loss scaling (bf16 and fp32 runs never skip a step).
static dsc_status start_step(train_off *o) {
    memset(&o->t, 0, sizeof o->t);
    o->nonfinite = false;
    o->early = !o->fp16 && !o->clipping;
    if (!o->early) return DSC_OK;
    o->t.overlapped = true;
    return dsc__engine_device_step(o->eng, 0.0, false, &o->plan, &o->early_info);
}

// Backward order: ln_f's group, the layers from the last, the embeddings. Before the last
// micro-step only the layers (parameter offload) are on their way.
static dsc_status take_all(train_off *o) {
    float inv = (float)(1.0 / dsc__engine_loss_scale(o->eng));
    if (o->last) DSC_TRY(take_group(o, o->ngroups - 1, inv));
    for (int g = o->ngroups - 2; g >= 1; g--)
        if (o->last || ring_group(o, g)) DSC_TRY(take_group(o, g, inv));
    return o->last ? take_group(o, 0, inv) : DSC_OK;
}

dsc_status dsc__train_off_micro(train_off *o, const uint16_t *const *p16, float *const *grad,
                                const int32_t *in, const int32_t *tg, int B, int T, float scale,
                                bool timed, float *loss, double *fwd_s, double *bwd_s) {
    o->last = o->micro + 1 == o->gas;
    bool hook = o->last || o->params;
    dsc_gpt2_cuda_set_grad_hook(o->model, hook ? grads_out : NULL, o);
    if (o->last) DSC_TRY(start_step(o));
    double t0 = dsc_now(), t1 = t0;
    if (timed) {
        DSC_TRY(dsc_gpt2_cuda_forward(o->model, p16, in, tg, B, T, loss));
        t1 = dsc_now();
        DSC_TRY(dsc_gpt2_cuda_backward(o->model, p16, grad, scale));
    } else {
        DSC_TRY(dsc_gpt2_cuda_train_step(o->model, p16, grad, in, tg, B, T, scale, NULL));
    }
    if (hook) DSC_TRY(take_all(o)); // while the GPU finishes the backward
    if (timed) {
        DSC_TRY(dsc__cuda_stream_wait(o->st->stream));
        *fwd_s += t1 - t0;
        *bwd_s += dsc_now() - t1;
        return DSC_OK;
    }
    return dsc_gpt2_cuda_read_loss(o->model, loss);
}

dsc_status dsc__train_off_step(train_off *o, dsc_step_info *info) {
    if (++o->micro < o->gas) {
        memset(info, 0, sizeof *info);
        info->step = dsc_engine_global_steps(o->eng);
        return DSC_OK;
    }
    o->micro = 0;
    double t0 = dsc_now();
    // --dump-grads: the accumulator holds the whole step's gradients (the optimizer reads them
    // and leaves them as they are, so an early update does not disturb them).
    if (dsc__engine_grads_observed(o->eng)) DSC_TRY(dsc__engine_observe_host_grads(o->eng));
    double sumsq = 0;
    for (int g = 0; g < o->ngroups; g++)
        sumsq += o->part[g]; // dsc__zero_norm's order
    bool nonfinite = o->nonfinite || !isfinite(sumsq);
    if (o->early) {
        *info = o->early_info;
        info->grad_norm = sqrt(sumsq);
        if (nonfinite)
            DSC_WARN("engine",
                     "step %lld: gradients contain inf/NaN (no loss scaling in %s "
                     "training to skip the step)",
                     (long long)info->step, o->fp16 ? "fp16" : "bf16");
    } else {
        DSC_TRY(dsc__engine_device_step(o->eng, sumsq, nonfinite, &o->plan, info));
        for (int g = 0; o->plan.apply && g < o->ngroups; g++)
            DSC_TRY(update_group(o, g));
    }
    o->t.cpu += dsc_now() - t0;
    if (o->plan.apply) o->wslot_layer[0] = o->wslot_layer[1] = -1; // the layers' weights changed
    DSC_TRY(dsc__cuda_offload_fence(o->bus)); // the next kernels read the new weights
    return dsc__cuda_state_zero_grads(o->st);
}

void dsc__train_off_views(train_off *o, const uint16_t **p16, float **grad) {
    o->p16 = p16;
    o->grad = grad;
    for (int i = 0; i < o->ntensors; i++) {
        int g = o->tgroup[i];
        if (ring_group(o, g)) { // the layer hook repoints them before every use
            p16[i] = o->wslot[0] + o->tin[i];
            grad[i] = o->gslot[0] + o->tin[i];
        } else {
            p16[i] = o->st->p16 + o->dev_off[g] + o->tin[i];
            grad[i] = o->st->grad + o->dev_off[g] + o->tin[i];
        }
    }
    dsc_gpt2_cuda_set_layer_hook(o->model, on_layer, o);
}

dsc_status dsc__train_off_load(train_off *o) {
    size_t n = o->host.total;
    if (o->fp16)
        dsc_fp32_to_fp16_n(o->h16, o->host.master, n);
    else
        dsc_fp32_to_bf16_n(o->h16, o->host.master, n);
    o->wslot_layer[0] = o->wslot_layer[1] = -1;
    for (int g = 0; g < o->ngroups; g++) {
        if (ring_group(o, g)) continue;
        const dsc__engine_span *sp = &o->spans[g];
        DSC_TRY(dsc__cuda_to_device(o->st->p16 + o->dev_off[g], o->h16 + sp->off,
                                    sp->padded * sizeof(uint16_t), o->st->stream));
    }
    return DSC_OK;
}

void dsc__train_off_times(const train_off *o, train_off_times *out) {
    *out = o->t;
}

#endif // DSC_WITH_CUDA
