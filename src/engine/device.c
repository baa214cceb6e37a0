// engine/device.c - the engine's side of device training (see device.h), and the decisions of a
// step that dsc_step and the device paths share: the accumulation position, inf/NaN (the skip
// and the warning), clipping, the scaler, the lr, fp16 rounding.
#include "engine/device.h"

#include <math.h>   // sqrt, INFINITY
#include <stdint.h> // SIZE_MAX
#include <string.h> // memset, strcmp

#include "base/env.h"                 // dsc__env, DSC_ENV_OFFLOAD_STREAM
#include "base/log.h"                 // DSC_WARN
#include "base/status.h"              // dsc__fail, DSC_TRY
#include "dsc/half.h"                 // dsc_fp32_to_fp16, dsc_fp16_to_fp32
#include "engine/engine_impl.h"       // struct dsc_engine, dsc__zero_sync_params
#include "engine/ft/ft.h"             // dsc__ft_point, dsc__ft_step_end
#include "engine/optim/loss_scaler.h" // dsc_loss_scaler_*
#include "engine/optim/lr_schedule.h" // dsc_sched_lr_at

// ---- the accumulation position ----

int64_t dsc__engine_micro(const dsc_engine *e) { return e->micro; }

bool dsc__engine_micro_last(const dsc_engine *e) {
    return e->micro + 1 >= e->cfg.gradient_accumulation_steps;
}

bool dsc__engine_micro_done(dsc_engine *e, dsc_step_info *info) {
    memset(info, 0, sizeof *info);
    if (++e->micro < e->cfg.gradient_accumulation_steps) {
        info->step = e->global_steps;
        return false;
    }
    e->micro = 0;
    return true;
}

// ---- the step's decisions ----

bool dsc__engine_fp16(const dsc_engine *e) { return e->prec == PREC_FP16; }

bool dsc__engine_bf16_sr(const dsc_engine *e) { return e->bf16_sr; }

bool dsc__engine_master_bf16(const dsc_engine *e, bool *states) {
    if (states) *states = e->states_bf16;
    return e->master_bf16;
}

// The one read of gradient_clipping (0: none).
static double clipping(const dsc_engine *e) { return e->cfg.gradient_clipping; }

bool dsc__engine_norm_free(const dsc_engine *e) {
    return !dsc__engine_fp16(e) && !(clipping(e) > 0);
}

void dsc__round_fp16(float *dst, const float *src, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) dst[i] = dsc_fp16_to_fp32(dsc_fp32_to_fp16(src[i]));
}

void dsc__step_global_norm(const double *parts, int n, bool replicated, double *sumsq,
                           bool *nonfinite) {
    double sum = 0;
    bool flag = false;
    for (int r = 0; r < n; r++) {
        sum += parts[2 * r];
        flag |= parts[2 * r + 1] != 0;
    }
    if (replicated && n > 0) sum = parts[0];
    *sumsq = sum;
    *nonfinite = flag || !isfinite(sum);
}

// DeepSpeed's ZeRO optimizer (stages 1-3, which dsc follows at every stage) updates the loss scale
// before it unscales: on a step where the scale grows, the gradients (scaled by the old scale)
// are divided by the new one, and clipping compares against that too. The reported norm uses the
// old scale. Mirrored exactly so that runs match DeepSpeed step for step.
double dsc__step_divisor(double norm, double prev, double scale, double clipping) {
    double combined = scale;
    if (clipping > 0) {
        double clip = (norm * prev / scale + 1e-6) / clipping;
        if (clip > 1) combined = clip * scale;
    }
    return combined;
}

// Everything of an applied step but what the norm decides: lr, hp, and the loss scale before
// (prev) and after (scale) the scaler's update.
static dsc_status plan_common(dsc_engine *e, dsc_opt_hparams *hp, double *lr, double *prev,
                              double *scale) {
    double mom = NAN; // NAN: the schedule leaves the momentum alone
    *lr = e->base_lr;
    if (e->has_sched) // before anything changes: a schedule error leaves the state as it was
        DSC_TRY(dsc_sched_lr_at(&e->sched, e->base_lr, e->applied_steps + 1, lr, &mom));
    *prev = dsc_loss_scaler_scale(&e->scaler);
    DSC_TRY(dsc_loss_scaler_update(&e->scaler, false));
    *scale = dsc_loss_scaler_scale(&e->scaler);
    *hp = e->hp;
    hp->lr = (float)*lr;
    if (!isnan(mom) && hp->kind != DSC_OPT_SGD) {
        // OneCycle cycles the momentum as DeepSpeed does: betas = (momentum, 0.99). For SGD
        // DeepSpeed leaves the momentum alone (and warns); so do we, at create.
        hp->beta1 = (float)mom;
        hp->beta2 = (float)DSC_SCHED_ONE_CYCLE_BETA2;
    }
    return DSC_OK;
}

dsc_status dsc__step_plan(dsc_engine *e, double sumsq, dsc_opt_hparams *hp, float *grad_scale,
                          double *lr, double *norm) {
    double prev, scale;
    DSC_TRY(plan_common(e, hp, lr, &prev, &scale));
    *norm = sqrt(sumsq); // of g / prev: the true gradient norm
    *grad_scale = (float)(1.0 / dsc__step_divisor(*norm, prev, scale, clipping(e)));
    return DSC_OK;
}

// An fp16 overflow: nothing is applied; the scaler backs off (or DeepSpeed's error at the minimum).
static dsc_status skip_step(dsc_engine *e, dsc_step_info *info) {
    double mom;
    info->lr = e->base_lr;
    if (e->has_sched)
        DSC_TRY(dsc_sched_lr_at(&e->sched, e->base_lr, e->applied_steps + 1, &info->lr, &mom));
    e->skipped_steps++;
    info->skipped = true;
    info->grad_norm = INFINITY;
    return dsc_loss_scaler_update(&e->scaler, true);
}

// Whether this step's gradients count as inf/NaN (DSC_INJECT_OVERFLOW too); without loss
// scaling to skip the step, a warning says so.
static bool nonfinite_step(dsc_engine *e, bool nonfinite) {
    if (dsc__inject_overflow(e->inject, e->global_steps)) nonfinite = true;
    if (nonfinite && !dsc__engine_fp16(e))
        DSC_WARN("engine", "step %lld: gradients contain inf/NaN (no loss scaling in %s "
                 "training to skip the step)", (long long)e->global_steps,
                 e->prec == PREC_BF16 ? "bf16" : "fp32");
    return nonfinite;
}

dsc_status dsc__step_decide(dsc_engine *e, double sumsq, bool nonfinite, dsc_step_info *info,
                            dsc_opt_hparams *hp, float *grad_scale, bool *apply) {
    *apply = false;
    if (nonfinite_step(e, nonfinite) && dsc__engine_fp16(e)) return skip_step(e, info);
    DSC_TRY(dsc__step_plan(e, sumsq, hp, grad_scale, &info->lr, &info->grad_norm));
    *apply = true;
    return DSC_OK;
}

dsc_status dsc__engine_flat_state(dsc_engine *e, dsc__engine_flat *out) {
    memset(out, 0, sizeof *out);
    if (e->world != 1)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "GPU training runs on one rank for now (this run "
                         "has %d ranks); start one process, or use --device cpu", e->world);
    // On one rank each group's slice is the whole group and the partitions follow the full
    // layout, so master, moments and accumulators are flat arrays at every stage.
    for (int g = 0; g < e->ngroups; g++)
        if (e->stage > 0 && e->groups[g].part_off != e->groups[g].off)
            return dsc__fail(DSC_ERR_INTERNAL, "engine layout: group %d partition offset %zu "
                             "differs from its offset %zu on one rank", g,
                             e->groups[g].part_off, e->groups[g].off);
    *out = (dsc__engine_flat){.total = e->total, .master = dsc__zero_master_slice(e, 0),
                              .acc = e->acc, .m = e->m, .v = e->v};
    return DSC_OK;
}

size_t dsc__engine_param_offset(const dsc_engine *e, int i) {
    return e->pub[i] >= 0 ? e->params[e->pub[i]].off : SIZE_MAX;
}

const float *dsc__engine_frozen_store(const dsc_engine *e, size_t *len) {
    *len = e->nfrozen ? e->frozen_total : 0; // (with fdata NULL when the device keeps them)
    return e->nfrozen ? e->fdata : NULL;
}

bool dsc__engine_frozen_parted(const dsc_engine *e) { return e->frozen_parted; }

void dsc__engine_frozen_span(const dsc_engine *e, int g, size_t *off, size_t *padded) {
    bool in = e->fgroups && g >= 0 && g < e->ngroups;
    *off = in ? e->fgroups[g].off : 0;
    *padded = in ? e->fgroups[g].padded : 0;
}
int64_t dsc__engine_tensor_numel(const dsc_engine *e, int i) { return dsc__engine_tensor(e, i)->numel; }

size_t dsc__engine_frozen_offset(const dsc_engine *e, int i) {
    return e->pub[i] < 0 ? e->frozen[-1 - e->pub[i]].off : SIZE_MAX;
}

double dsc__engine_loss_scale(const dsc_engine *e) { return dsc_loss_scaler_scale(&e->scaler); }

dsc_status dsc__engine_master_changed(dsc_engine *e) { return dsc__zero_sync_params(e); }

size_t dsc__engine_layout_len(const dsc_engine *e) { return e->total; }

// acc += x: the CPU model's backward adds into the gradient buffers too, so the engine sees the
// same contract whichever side computed the gradients.
static void add_into(float *acc, const float *x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t k = 0; k < n; k++) acc[k] += x[k];
}

// One group, as backward hands it over: buffers (gather), gradients, reduction, release.
static dsc_status add_group(dsc_engine *e, int g, const float *grads) {
    DSC_TRY(dsc_gather(e, g));
    for (int i = 0; i < e->nparams; i++) {
        if (e->params[i].group != g) continue;
        float *dst = dsc_param_grad(e, i);
        if (!dst)
            return dsc__fail(DSC_ERR_INTERNAL, "tensor %s has no gradient buffer after its "
                             "group's gather", e->params[i].name);
        add_into(dst, grads + e->params[i].off, e->params[i].numel);
    }
    DSC_TRY(dsc_grads_ready(e, g));
    return dsc_release(e, g);
}

dsc_status dsc__engine_add_grads(dsc_engine *e, const float *grads) {
    DSC_TRY(dsc_backward_begin(e));
    for (int g = e->ngroups - 1; g >= 0; g--) DSC_TRY(add_group(e, g, grads));
    return DSC_OK;
}

dsc_status dsc__engine_gather_master(dsc_engine *e, float *out) {
    return dsc__zero_gather_master(e, out);
}

// A device step's start and end, whichever way it is planned: the counters and info's fields, and
// the end of the step for the fault-tolerance watchdog.
static void device_step_start(dsc_engine *e, dsc__device_step *out, dsc_step_info *info) {
    memset(info, 0, sizeof *info);
    memset(out, 0, sizeof *out);
    e->global_steps++;
    info->boundary = true;
    info->step = e->global_steps;
    info->loss_scale = dsc_loss_scaler_scale(&e->scaler);
}

static void device_step_finish(dsc_engine *e, dsc_step_info *info) {
    info->skipped_total = e->skipped_steps;
    dsc__ft_point(e, "step");
    dsc__ft_step_end(e);
}

dsc_status dsc__engine_device_step(dsc_engine *e, double sumsq, bool nonfinite,
                                   dsc__device_step *out, dsc_step_info *info) {
    device_step_start(e, out, info);
    dsc_status st = dsc__step_decide(e, sumsq, nonfinite, info, &out->hp, &out->grad_scale,
                                     &out->apply);
    if (out->apply) out->opt_step = ++e->applied_steps;
    device_step_finish(e, info);
    return st;
}

dsc_status dsc__engine_device_step_begin(dsc_engine *e, dsc__device_step *out,
                                         dsc_step_info *info, dsc__device_divisor *div) {
    if (dsc__engine_fp16(e))
        return dsc__fail(DSC_ERR_INTERNAL, "device step begin: fp16 steps may be skipped, which "
                         "needs the norm first (use dsc__engine_device_step; a bug: report it)");
    device_step_start(e, out, info);
    dsc_status st = plan_common(e, &out->hp, &info->lr, &div->prev, &div->scale);
    div->clipping = clipping(e);
    out->apply = st == DSC_OK;
    out->grad_scale = 1.0f; // the device's divisor replaces it
    if (st == DSC_OK) out->opt_step = ++e->applied_steps;
    device_step_finish(e, info);
    return st;
}

void dsc__engine_device_step_end(dsc_engine *e, double sumsq, bool nonfinite,
                                 dsc_step_info *info) {
    (void)nonfinite_step(e, nonfinite);
    info->grad_norm = sqrt(sumsq);
}

void dsc__engine_phase(dsc_engine *e, const char *phase) {
    dsc__ft_point(e, phase);
}

// ---- data-parallel on the devices ----

void dsc__engine_span_of(const dsc_engine *e, int g, dsc__engine_span *out) {
    const group *gr = &e->groups[g];
    *out = (dsc__engine_span){.off = gr->off, .padded = gr->padded, .slice = gr->slice,
                              .state_off = e->stage == 0 ? gr->off : gr->part_off,
                              .state_len = e->stage == 0 ? gr->padded : gr->slice};
}

dsc_status dsc__engine_dp_layout(dsc_engine *e, dsc__engine_dp *out) {
    double pre = e->cfg.prescale_gradients ? e->world : e->cfg.gradient_predivide_factor;
    if (!(pre > 0))
        return dsc__fail(DSC_ERR_CONFIG, "gradient_predivide_factor %g: must be above 0", pre);
    *out = (dsc__engine_dp){.stage = e->stage, .rank = e->rank, .world = e->world,
                            .ngroups = e->ngroups, .total = e->total,
                            .state_len = e->stage == 0 ? e->total : e->part, .m = e->m, .v = e->v,
                            .comm_dt = e->comm_dt, .pre = pre, .post = pre / e->world};
    return DSC_OK;
}

float *dsc__engine_master_of(dsc_engine *e, int g) { return dsc__zero_master_slice(e, g); }

bool dsc__engine_grads_observed(const dsc_engine *e) { return e->observer != NULL; }

float *dsc__engine_grad_acc(dsc_engine *e, size_t *len) {
    *len = e->stage < 2 ? e->total : e->part;
    return e->acc;
}

static dsc_status observe(dsc_engine *e) {
    dsc_grad_observer fn = e->observer;
    e->observer = NULL;
    e->observer_inv_scale = 1.0 / dsc_loss_scaler_scale(&e->scaler); // as dsc_step's info
    return fn(e->observer_user, e);
}

dsc_status dsc__engine_observe_device_grads(dsc_engine *e) {
    if (!e->observer) return DSC_OK;
    dsc_status st = observe(e);
    dsc__zero_zero_acc(e);
    return st;
}

dsc_status dsc__engine_observe_host_grads(dsc_engine *e) {
    return e->observer ? observe(e) : DSC_OK;
}

dsc_status dsc__engine_observe_grads_in(dsc_engine *e, float *grads) {
    if (!e->observer) return DSC_OK;
    if (e->acc || e->world != 1)
        return dsc__fail(DSC_ERR_INTERNAL, "--dump-grads: the engine has its own gradient "
                         "buffers (dsc__engine_observe_host_grads reads them; a bug: report it)");
    if (!grads && !e->dev_state)
        return dsc__fail(DSC_ERR_INTERNAL, "--dump-grads: no gradients to read (the state is not "
                         "on the device; a bug: report it)");
    e->acc = grads; // what dsc__zero_full_grad reads, for the observer's call only
    dsc_status st = observe(e);
    e->acc = NULL;
    return st;
}

bool dsc__engine_keeps_no_grads(const dsc_config *c, int world, bool device) {
    if (dsc__engine_grads_streamed(c, world, device)) return true;
    const char *backend = dsc__env(DSC_ENV_COMM_BACKEND);
    return device && world == 1 && strcmp(c->zero_optimization.offload_optimizer.device, "cpu") &&
           !c->zero_optimization.cpu_offload && !(backend && !strcmp(backend, "nccl"));
}

bool dsc__engine_keeps_no_state(const dsc_config *c, int world, bool device) {
    return dsc__engine_keeps_no_grads(c, world, device) &&
           !dsc__engine_grads_streamed(c, world, device) && !dsc__env_is(DSC_ENV_DEVICE_STATE, "0");
}

void dsc__engine_set_state_source(dsc_engine *e, const dsc__state_source *src) {
    e->src = src ? *src : (dsc__state_source){0};
}

bool dsc__engine_grads_streamed(const dsc_config *c, int world, bool device) {
    const char *stream = dsc__env(DSC_ENV_OFFLOAD_STREAM);
    if (!device || world != 1 || strcmp(c->zero_optimization.offload_optimizer.device, "cpu") ||
        (stream && !strcmp(stream, "0")))
        return false;
    if (strcmp(c->zero_optimization.offload_param.device, "cpu")) return true;
    // Parameter offload: the layers' gradients leave the device's slots as the backward goes,
    // so the CPU must take each for good at once: one micro-step per step, nothing that needs
    // the whole gradient first (no clipping, no fp16 loss scaling; dsc__engine_norm_free).
    return c->gradient_accumulation_steps == 1 && !(c->gradient_clipping > 0) && !c->fp16.enabled;
}
