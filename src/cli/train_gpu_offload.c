// cli/train_gpu_offload.c - streamed ZeRO-Offload on one GPU (see train_gpu_offload.h).
#include "cli/train_gpu_offload.h"

#ifdef DSC_WITH_CUDA

#include <math.h>   // isfinite, sqrt
#include <stdlib.h> // calloc, free, aligned_alloc
#include <string.h> // memset

#include "base/log.h"           // DSC_WARN
#include "base/status.h"        // dsc__fail, DSC_TRY
#include "base/time.h"          // dsc_now
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
    double *part;             // (ngroups) each group's sum of squares, added in group order
    bool nonfinite;
    bool early;               // the optimizer ran group by group as the gradients landed
    dsc__device_step plan;    // early: made before the norm was known (nothing depends on it)
    dsc_step_info early_info;
    train_off_times t;
};

// ---- create / destroy ----

// The backward's groups are the engine's: tensor i of model group k lies inside engine group k,
// and at one rank every group's optimizer state is its whole range.
static dsc_status check_groups(train_off *o, const dsc_gpt2_config *mc) {
    for (int i = 0; i < dsc_gpt2_num_tensors(mc); i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(mc, i, &info);
        const dsc__engine_span *sp = &o->spans[info.group];
        size_t off = dsc__engine_param_offset(o->eng, i);
        if (info.group >= o->ngroups || off < sp->off || off + (size_t)info.numel > sp->off + sp->padded)
            return dsc__fail(DSC_ERR_INTERNAL, "ZeRO-Offload: tensor %s is not inside the "
                             "engine's parameter group %d", info.name, info.group);
    }
    for (int g = 0; g < o->ngroups; g++)
        if (o->spans[g].state_off != o->spans[g].off || o->spans[g].state_len != o->spans[g].padded)
            return dsc__fail(DSC_ERR_INTERNAL, "ZeRO-Offload on one GPU: group %d's optimizer "
                             "state is a partition (%zu of %zu elements)", g,
                             o->spans[g].state_len, o->spans[g].padded);
    return DSC_OK;
}

static void pin(void *p, size_t bytes, bool *ok, bool *all, char *why, size_t cap) {
    *ok = dsc__cuda_host_pin(p, bytes, why, cap);
    if (!*ok) *all = false;
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
        return dsc__fail(DSC_ERR_OOM, "ZeRO-Offload: out of memory for the host staging of "
                         "%zu 16-bit weights", o->host.total);
    for (int g = 0; g < o->ngroups; g++) dsc__engine_span_of(o->eng, g, &o->spans[g]);
    DSC_TRY(check_groups(o, mc));
    DSC_TRY(dsc__cuda_offload_create(&o->bus, o->ngroups, o->st->stream));
    *pinned = true;
    pin(o->host.acc, o->host.total * sizeof(float), &o->acc_pinned, pinned, why, cap);
    pin(o->h16, bytes, &o->h16_pinned, pinned, why, cap);
    return DSC_OK;
}

dsc_status dsc__train_off_create(train_off **out, dsc_engine *eng, dsc_cuda_state *st,
                                 const dsc__engine_flat *host, dsc_gpt2_cuda *model,
                                 const dsc_gpt2_config *mc, bool fp16, bool *pinned, char *why,
                                 size_t cap) {
    *out = NULL;
    train_off *o = calloc(1, sizeof *o);
    if (!o) return dsc__fail(DSC_ERR_OOM, "out of memory");
    *o = (train_off){.eng = eng, .st = st, .model = model, .host = *host, .fp16 = fp16};
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
    free(o->h16);
    free(o->spans);
    free(o->part);
    free(o);
}

// ---- the step ----

// The CPU optimizer over group g, its 16-bit result up to the GPU.
static dsc_status update_group(train_off *o, int g) {
    const dsc__engine_span *sp = &o->spans[g];
    size_t off = sp->off, n = sp->padded;
    const dsc__device_step *p = &o->plan;
    dsc_opt_step(&p->hp, p->opt_step, o->host.master + off, o->host.acc + off, o->host.m + off,
                 o->host.v ? o->host.v + off : NULL, n, p->grad_scale, o->h16 + off,
                 o->fp16 ? DSC_OPT_OUT_FP16 : DSC_OPT_OUT_BF16);
    return dsc__cuda_offload_weights_in(o->bus, g, o->st->p16 + off, o->h16 + off, n);
}

// The backward's hook: group g's gradients are complete on the GPU.
static dsc_status grads_out(void *user, int g) {
    train_off *o = user;
    if (g < 0 || g >= o->ngroups)
        return dsc__fail(DSC_ERR_INTERNAL, "ZeRO-Offload: the backward finished group %d of %d",
                         g, o->ngroups);
    const dsc__engine_span *sp = &o->spans[g];
    return dsc__cuda_offload_grads_out(o->bus, g, o->host.acc + sp->off, o->st->grad + sp->off,
                                       sp->padded);
}

// Group g landed: fp16 rounding as dsc_step's (values beyond fp16's range become inf), its part
// of the norm as dsc__zero_norm computes it, and early, the update.
static dsc_status take_group(train_off *o, int g, float inv_scale) {
    double t0 = dsc_now();
    DSC_TRY(dsc__cuda_offload_grads_wait(o->bus, g));
    double t1 = dsc_now();
    const dsc__engine_span *sp = &o->spans[g];
    float *a = o->host.acc + sp->off;
    if (o->fp16) { // through the group's slice of h16, which the update overwrites later
        dsc_fp32_to_fp16_n(o->h16 + sp->off, a, sp->padded);
        dsc_fp16_to_fp32_n(a, o->h16 + sp->off, sp->padded);
    }
    o->part[g] = dsc_opt_sumsq(a, sp->padded, inv_scale, &o->nonfinite);
    if (o->early && o->plan.apply) DSC_TRY(update_group(o, g));
    o->t.grad_wait += t1 - t0;
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

// Backward order: ln_f's group, the layers from the last, the embeddings.
static dsc_status take_all(train_off *o) {
    float inv = (float)(1.0 / dsc__engine_loss_scale(o->eng));
    DSC_TRY(take_group(o, o->ngroups - 1, inv));
    for (int g = o->ngroups - 2; g >= 1; g--) DSC_TRY(take_group(o, g, inv));
    return take_group(o, 0, inv);
}

dsc_status dsc__train_off_micro(train_off *o, const uint16_t *const *p16, float *const *grad,
                                const int32_t *in, const int32_t *tg, int B, int T, float scale,
                                bool timed, float *loss, double *fwd_s, double *bwd_s) {
    bool last = o->micro + 1 == o->gas;
    dsc_gpt2_cuda_set_grad_hook(o->model, last ? grads_out : NULL, o);
    if (last) DSC_TRY(start_step(o));
    double t0 = dsc_now(), t1 = t0;
    if (timed) {
        DSC_TRY(dsc_gpt2_cuda_forward(o->model, p16, in, tg, B, T, loss));
        t1 = dsc_now();
        DSC_TRY(dsc_gpt2_cuda_backward(o->model, p16, grad, scale));
    } else {
        DSC_TRY(dsc_gpt2_cuda_train_step(o->model, p16, grad, in, tg, B, T, scale, NULL));
    }
    if (last) DSC_TRY(take_all(o)); // while the GPU finishes the backward
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
    for (int g = 0; g < o->ngroups; g++) sumsq += o->part[g]; // dsc__zero_norm's order
    bool nonfinite = o->nonfinite || !isfinite(sumsq);
    if (o->early) {
        *info = o->early_info;
        info->grad_norm = sqrt(sumsq);
        if (nonfinite)
            DSC_WARN("engine", "step %lld: gradients contain inf/NaN (no loss scaling in %s "
                     "training to skip the step)", (long long)info->step,
                     o->fp16 ? "fp16" : "bf16");
    } else {
        DSC_TRY(dsc__engine_device_step(o->eng, sumsq, nonfinite, &o->plan, info));
        for (int g = 0; o->plan.apply && g < o->ngroups; g++) DSC_TRY(update_group(o, g));
    }
    o->t.cpu += dsc_now() - t0;
    DSC_TRY(dsc__cuda_offload_fence(o->bus)); // the next kernels read the new weights
    return dsc__cuda_state_zero_grads(o->st);
}

void dsc__train_off_times(const train_off *o, train_off_times *out) { *out = o->t; }

#endif // DSC_WITH_CUDA
