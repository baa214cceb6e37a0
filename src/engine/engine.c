// engine/engine.c - parameter table, flat buffers, micro-steps and the optimizer step.
#include "dsc/engine.h"

#include <math.h>   // NAN
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, getenv, strtol
#include <string.h> // memset, memcpy, strncmp

#include "base/env.h"                   // dsc__env, DSC_ENV_*
#include "base/log.h"                   // DSC_WARN, DSC_INFO
#include "base/status.h"                // dsc__fail, DSC_TRY
#include "dsc/half.h"                   // dsc_fp32_to_fp16, dsc_fp32_to_bf16
#include "engine/optim/loss_scaler.h"   // dsc_loss_scaler_*
#include "engine/optim/lr_schedule.h"   // dsc_sched_*
#include "engine/optim/optim.h"         // dsc_opt_step, dsc_opt_sumsq
#include "engine/device.h"              // dsc__engine_micro_done, dsc__engine_fp16
#include "engine/engine_impl.h"         // struct dsc_engine, dsc__zero_*
#include "engine/ft/ft.h"               // dsc__ft_*
#include "engine/sched_config.h"        // dsc__sched_params_from_config

// ---- configuration -> optimizer, schedule, scaler ----

static dsc_status optimizer_from_config(dsc_engine *e) {
    const dsc_config *c = &e->cfg;
    const char *t = c->optimizer.type[0] ? c->optimizer.type : "adamw";
    dsc_opt_kind kind;
    if (!strcmp(t, "adam")) kind = DSC_OPT_ADAM;
    else if (!strcmp(t, "adamw")) kind = DSC_OPT_ADAMW;
    else if (!strcmp(t, "sgd")) kind = DSC_OPT_SGD;
    else if (!strcmp(t, "lion")) kind = DSC_OPT_LION;
    else
        return dsc__fail(DSC_ERR_UNSUPPORTED, "optimizer.type \"%s\" is not implemented by dsc; "
                         "use Adam, AdamW, SGD or Lion", t);
    dsc_opt_hparams_defaults(kind, &e->hp);
    // Only keys present in the file override the optimizer's own defaults.
#define OVERRIDE(key, field, expr)                                                              \
    if (dsc_config_given(c, "optimizer.params." key)) e->hp.field = (expr)
    OVERRIDE("lr", lr, (float)c->optimizer.lr);
    e->base_lr = dsc_config_given(c, "optimizer.params.lr") ? c->optimizer.lr : 1e-3; // = hp.lr default
    OVERRIDE("betas", beta1, (float)c->optimizer.betas[0]);
    OVERRIDE("betas", beta2, (float)c->optimizer.betas[1]);
    OVERRIDE("eps", eps, (float)c->optimizer.eps);
    OVERRIDE("weight_decay", weight_decay, (float)c->optimizer.weight_decay);
    OVERRIDE("adam_w_mode", adam_w_mode, c->optimizer.adam_w_mode);
    OVERRIDE("bias_correction", bias_correction, c->optimizer.bias_correction);
    OVERRIDE("momentum", momentum, (float)c->optimizer.momentum);
    OVERRIDE("dampening", dampening, (float)c->optimizer.dampening);
    OVERRIDE("nesterov", nesterov, c->optimizer.nesterov);
#undef OVERRIDE
    if (c->optimizer.amsgrad)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "optimizer.params.amsgrad = true is not supported "
                         "(DeepSpeed's fused Adam rejects it too); remove it");
    return dsc_opt_hparams_validate(&e->hp);
}

static dsc_status schedule_from_config(dsc_engine *e) {
    const dsc_config *c = &e->cfg;
    e->has_sched = c->scheduler.type[0] != '\0';
    if (!e->has_sched) return DSC_OK;
    dsc_sched_kind kind;
    DSC_TRY(dsc_sched_kind_parse(c->scheduler.type, &kind));
    dsc_sched_params_defaults(kind, &e->sched);
    DSC_TRY(dsc__sched_params_from_config(&e->sched, c));
    if (kind == DSC_SCHED_ONE_CYCLE && e->sched.cycle_momentum && e->hp.kind == DSC_OPT_SGD) {
        // DeepSpeed turns cycle_momentum off for an optimizer without betas.
        DSC_WARN("engine", "scheduler OneCycle: cycle_momentum does not apply to SGD (as in "
                 "DeepSpeed); the momentum stays %g", e->hp.momentum);
        e->sched.cycle_momentum = false;
    }
    return dsc_sched_validate(&e->sched);
}

static void scaler_from_config(dsc_engine *e) {
    const dsc_config *c = &e->cfg;
    if (e->prec != PREC_FP16) {
        dsc_loss_scaler_init(&e->scaler, 1.0, 0, 1000, 1, false, 1.0); // static scale 1
        return;
    }
    dsc_loss_scaler_init(&e->scaler, c->fp16.loss_scale, (int)c->fp16.initial_scale_power,
                         (int)c->fp16.loss_scale_window, (int)c->fp16.hysteresis,
                         c->fp16.consecutive_hysteresis, c->fp16.min_loss_scale);
}

// ---- creation ----

static dsc_status world_from_env(dsc_engine *e, const dsc_engine_opts *o) {
    e->rank = o->rank;
    e->world = o->world_size;
    if (e->world > 0) return DSC_OK;
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
    e->rank = r ? (int)strtol(r, NULL, 10) : 0;
    e->world = w ? (int)strtol(w, NULL, 10) : 1;
    if (e->world < 1 || e->rank < 0 || e->rank >= e->world)
        return dsc__fail(DSC_ERR_CONFIG, "RANK=%s WORLD_SIZE=%s: need 0 <= RANK < WORLD_SIZE",
                         r ? r : "(unset)", w ? w : "(unset)");
    return DSC_OK;
}

static dsc_status load_config(dsc_engine *e, const dsc_engine_opts *o) {
    int given = (o->config != NULL) + (o->config_path != NULL) + (o->config_json != NULL);
    if (given != 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_create: give exactly one of config, "
                         "config_path, config_json (got %d)", given);
    if (o->config) {
        e->cfg = *o->config;
        return dsc_config_resolve_batch(&e->cfg, e->world);
    }
    if (o->config_path)
        return dsc_config_load_file(&e->cfg, o->config_path, e->world, o->warn, o->warn_user);
    return dsc_config_load_string(&e->cfg, o->config_json, e->world, o->warn, o->warn_user);
}

static dsc_status copy_params(dsc_engine *e, const dsc_engine_opts *o) {
    if (o->nparams <= 0 || !o->params)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_create: no parameters registered");
    e->params = calloc((size_t)o->nparams, sizeof *e->params);
    e->frozen = calloc((size_t)o->nparams, sizeof *e->frozen);
    e->pub = calloc((size_t)o->nparams, sizeof *e->pub);
    e->pub_of = calloc((size_t)o->nparams, sizeof *e->pub_of);
    if (!e->params || !e->frozen || !e->pub || !e->pub_of)
        return dsc__fail(DSC_ERR_OOM, "out of memory for the parameter table");
    e->npub = o->nparams;
    for (int i = 0; i < o->nparams; i++) {
        const dsc_param_desc *d = &o->params[i];
        param *p;
        if (d->frozen) {
            e->pub[i] = -1 - e->nfrozen;
            p = &e->frozen[e->nfrozen++];
        } else {
            e->pub[i] = e->nparams;
            e->pub_of[e->nparams] = i;
            p = &e->params[e->nparams++];
        }
        if (!d->name || strlen(d->name) >= DSC_PARAM_NAME_MAX || d->ndim < 1 ||
            d->ndim > DSC_PARAM_MAX_DIMS || d->group < 0)
            return dsc__fail(DSC_ERR_INVALID_ARG, "parameter %d (%s): bad name, rank or group", i,
                             d->name ? d->name : "unnamed");
        snprintf(p->name, sizeof p->name, "%s", d->name);
        p->ndim = d->ndim;
        p->numel = 1;
        for (int k = 0; k < d->ndim; k++) {
            if (d->shape[k] <= 0)
                return dsc__fail(DSC_ERR_INVALID_ARG, "parameter %s: dimension %d is %lld", d->name,
                                 k, (long long)d->shape[k]);
            p->shape[k] = d->shape[k];
            p->numel *= d->shape[k];
        }
        p->group = d->group;
        if (d->group + 1 > e->ngroups) e->ngroups = d->group + 1;
        if (!d->frozen) e->numel += p->numel; // (the frozen layout: zero/frozen.c)
    }
    if (!e->nparams)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_create: every one of the %d tensors is "
                         "frozen; nothing would train", o->nparams);
    return DSC_OK;
}

static const param *frozen_of(const dsc_engine *e, int i) { return dsc__engine_frozen_of(e, i); }

static dsc_status comm_dtype(dsc_engine *e) {
    const char *t = e->cfg.communication_data_type;
    e->comm_dt = DSC_DT_F32;
    if (!strcmp(t, "fp16")) e->comm_dt = DSC_DT_F16;
    else if (!strcmp(t, "bf16")) e->comm_dt = DSC_DT_BF16;
    else if (!t[0] && e->prec == PREC_FP16) e->comm_dt = DSC_DT_F16; // DeepSpeed: the training dtype
    else if (!t[0] && e->prec == PREC_BF16) e->comm_dt = DSC_DT_BF16;
    return DSC_OK;
}

// The engine's communicator moves host buffers. DSC_COMM_BACKEND=nccl asks for device
// collectives, which the GPU trainer makes for itself (engine/gpu/train_gpu_dp.c); the engine's own
// collectives (loss means, norms of the host paths, checkpoints, fault tolerance) then stay on a
// host backend: DSC_HOST_COMM_BACKEND, else shm.
const char *dsc__engine_host_backend(void) {
    const char *b = dsc__env(DSC_ENV_COMM_BACKEND);
    if (!b || !b[0]) return "shm";
    if (strcmp(b, "nccl")) return b;
    const char *h = dsc__env(DSC_ENV_HOST_COMM_BACKEND);
    return h && h[0] ? h : "shm";
}

static dsc_status create_comm(dsc_engine *e) {
    if (e->world == 1) return DSC_OK;
    const char *backend = dsc__engine_host_backend();
    if (!strcmp(backend, "nccl"))
        return dsc__fail(DSC_ERR_CONFIG, "DSC_HOST_COMM_BACKEND=nccl: the engine's own "
                         "collectives move host buffers; use shm (one node) or mpi");
    dsc_comm_opts co = {.backend = backend, .rank = e->rank,
                        .world_size = e->world,
                        .timeout_s = e->cfg.fault_tolerance.comm_timeout_s};
    dsc_status st = dsc_comm_create(&e->comm, &co);
    char who[48];
    int n = snprintf(who, sizeof who, "rank %d of %d: ", e->rank, e->world);
    // the shm and nccl back ends name the rank themselves; say it once
    if (st != DSC_OK && strncmp(dsc_last_error(), who, (size_t)n)) dsc__error_prefix("%s", who);
    return st;
}

float *dsc__engine_init_alias(dsc_engine *e) {
    if (e->stage == 0) return e->master;
    if (e->prec == PREC_FP32 && e->stage < 3) return e->work;
    // One rank: every group's slice is the whole group and the partitions follow the full layout.
    if (e->world == 1) return dsc__zero_master_slice(e, 0);
    return NULL;
}

// Stages 1-3 on several ranks keep only a partition of the master weights; the caller
// initialises full tensors in this staging copy, which dsc_params_updated scatters and frees.
static dsc_status alloc_init(dsc_engine *e, bool in_place) {
    // dsc_params_init writes the partition itself (or, with the state on the device, sends it
    // there in pieces: no staging either way)
    if (in_place || e->dev_state) return DSC_OK;
    if ((e->init = dsc__engine_init_alias(e))) return DSC_OK; // the full buffer is there
    return dsc__engine_alloc(e, e->total, "engine.init_weights", &e->h_init, &e->init);
}

static dsc_status engine_init(dsc_engine *e, const dsc_engine_opts *o) {
    DSC_TRY(world_from_env(e, o));
    DSC_TRY(load_config(e, o));
    e->prec = e->cfg.fp16.enabled ? PREC_FP16 : e->cfg.bf16.enabled ? PREC_BF16 : PREC_FP32;
    e->stage = (int)e->cfg.zero_optimization.stage;
    e->master_bf16 = e->prec == PREC_BF16 && e->cfg.bf16.bf16_master_weights_and_grads;
    e->states_bf16 = e->master_bf16 && e->cfg.bf16.bf16_optimizer_states;
    e->bf16_sr = e->master_bf16 && !strcmp(e->cfg.bf16_master_rounding, "stochastic");
    e->no_compute_copy = o->no_compute_copy;
    e->no_grads = dsc__engine_grads_streamed(&e->cfg, e->world, o->no_compute_copy) ||
                  (o->device_grads &&
                   dsc__engine_keeps_no_grads(&e->cfg, e->world, o->no_compute_copy));
    e->dev_state = o->device_grads && o->device_state &&
                   dsc__engine_keeps_no_state(&e->cfg, e->world, o->no_compute_copy);
    DSC_TRY(comm_dtype(e));
    DSC_TRY(optimizer_from_config(e));
    DSC_TRY(schedule_from_config(e));
    scaler_from_config(e);
    DSC_TRY(copy_params(e, o));
    DSC_TRY(dsc__engine_pool_init(e, o->pool));
    DSC_TRY(dsc__zero_layout(e));
    DSC_TRY(dsc__zero_alloc(e));
    DSC_TRY(alloc_init(e, o->init_in_place));
    // The frozen tensors' values (zero/frozen.c): whole on every rank (a device trainer uploads
    // its 16-bit copy from there), partitioned at stage 3 on the host; none when the state lives
    // on the device, which holds them too.
    DSC_TRY(dsc__frozen_layout(e));
    DSC_TRY(dsc__frozen_alloc(e, !o->init_in_place));
    DSC_TRY(create_comm(e));
    DSC_TRY(dsc__ft_create(e));
    e->inject = dsc__env(DSC_ENV_INJECT_OVERFLOW);
    return DSC_OK;
}

dsc_status dsc_engine_create(dsc_engine **out, const dsc_engine_opts *o) {
    *out = NULL;
    dsc_engine *e = calloc(1, sizeof *e);
    if (!e) return dsc__fail(DSC_ERR_OOM, "out of memory creating the engine");
    e->may_move = true; // nothing has seen an address yet
    dsc_status st = engine_init(e, o);
    e->may_move = false;
    if (st != DSC_OK) {
        dsc_engine_destroy(e);
        return st;
    }
    *out = e;
    return DSC_OK;
}

void dsc_engine_destroy(dsc_engine *e) {
    if (!e) return;
    dsc__ft_destroy(e); // the watchdog first: it may abort the communicator
    if (e->pool) {
        dsc__zero_free(e);
        dsc__engine_free(e, &e->h_init);
        dsc__frozen_free(e);
        if (e->own_pool) dsc_mem_pool_destroy(e->pool);
    }
    dsc_comm_destroy(e->comm);
    free(e->params);
    free(e->frozen);
    free(e->fgroups);
    free(e->pub);
    free(e->pub_of);
    free(e);
}

// ---- accessors ----

const dsc_config *dsc_engine_config(const dsc_engine *e) { return &e->cfg; }
int dsc_engine_rank(const dsc_engine *e) { return e->rank; }
int dsc_engine_world_size(const dsc_engine *e) { return e->world; }
int dsc_engine_num_params(const dsc_engine *e) { return e->npub; }
int64_t dsc_engine_num_elements(const dsc_engine *e) { return e->numel; }
int64_t dsc_engine_global_steps(const dsc_engine *e) { return e->global_steps; }
// The caller's index i names trainable tensor pub[i], or frozen tensor -1 - pub[i].
float *dsc_param_data(dsc_engine *e, int i) {
    const param *f = frozen_of(e, i);
    if (f) return dsc__frozen_data(e, f); // NULL: on the device, or its group not gathered
    return e->pdata[e->pub[i]];
}
float *dsc_param_grad(dsc_engine *e, int i) { return frozen_of(e, i) ? NULL : e->pgrad[e->pub[i]]; }
float *dsc_param_master(dsc_engine *e, int i) {
    const param *f = frozen_of(e, i);
    if (f) return e->fdata ? e->fdata + f->off : NULL;
    return e->init ? e->init + e->params[e->pub[i]].off : NULL;
}
bool dsc_param_frozen(const dsc_engine *e, int i) { return frozen_of(e, i) != NULL; }
bool dsc_engine_state_on_device(const dsc_engine *e) { return e->dev_state; }

dsc_status dsc__engine_state_io(dsc_engine *e, int kind, size_t off, size_t n, float *buf,
                                bool write) {
    if (!e->src.read)
        return dsc__fail(DSC_ERR_INVALID_ARG, "the engine's master weights and moments live on "
                         "the device (dsc_engine_opts.device_state): create the device trainer "
                         "(dsc_device_trainer_create) before setting, loading or reading them");
    return write ? e->src.write(e->src.user, kind, off, n, buf)
                 : e->src.read(e->src.user, kind, off, n, buf);
}

dsc_status dsc_params_updated(dsc_engine *e) {
    if (!e->params_ready) DSC_TRY(dsc__frozen_ready(e)); // rounded once, kept, replicated
    if (e->stage > 0 && e->init) { // keep this rank's slices
        for (int g = 0; g < e->ngroups; g++) {
            const group *gr = &e->groups[g];
            float *dst = dsc__zero_master_slice(e, g), *src = e->init + gr->off + (size_t)e->rank * gr->slice;
            if (dst != src) memcpy(dst, src, gr->slice * sizeof(float));
        }
        dsc__engine_free(e, &e->h_init);
        e->init = NULL;
    }
    e->params_ready = true;
    // DSC_FT_LOAD_STATE (a test hook, docs/fault-tolerance.md): continue from a saved state.
    const char *load = dsc__env(DSC_ENV_FT_LOAD_STATE);
    if (load && *load && e->dev_state)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "DSC_FT_LOAD_STATE: the state lives on the device "
                         "(one GPU with the optimizer on it); DSC_DEVICE_STATE=0 keeps it on the "
                         "host");
    if (load && *load) return dsc__ft_load_state(e, load);
    DSC_TRY(dsc__zero_sync_params(e));
    return dsc__ft_state_changed(e); // the first snapshot, and its replica at the buddy
}

// Tensor i's elements inside [lo, hi) of the flat layout, asked of fill into dst (which holds
// the flat positions from base on).
static dsc_status fill_range(dsc_engine *e, int i, size_t lo, size_t hi, float *dst, size_t base,
                             dsc_param_fill_fn fill, void *user) {
    size_t b = e->params[i].off, end = b + (size_t)e->params[i].numel;
    if (lo > b) b = lo;
    if (hi < end) end = hi;
    if (b >= end) return DSC_OK;
    return fill(user, e->pub_of[i], (int64_t)(b - e->params[i].off), (int64_t)(end - b),
                dst + (b - base));
}

// The state on the device: each group filled in pieces of at most PIECE elements on the host
// (padding zero) and written there; the frozen tensors too, piece by piece.
static dsc_status init_on_device(dsc_engine *e, dsc_param_fill_fn fill, void *user) {
    enum { PIECE = 16 << 20 };
    size_t most = e->total > e->frozen_total ? e->total : e->frozen_total;
    size_t cap = most < PIECE ? most : PIECE;
    float *buf = malloc((cap ? cap : 1) * sizeof *buf);
    if (!buf) return dsc__fail(DSC_ERR_OOM, "out of memory for the initial weights' staging");
    dsc_status st = DSC_OK;
    for (int i = 0; i < e->npub && st == DSC_OK; i++) {
        const param *f = frozen_of(e, i);
        for (int64_t b = 0; f && b < f->numel && st == DSC_OK; b += (int64_t)cap) {
            int64_t n = f->numel - b < (int64_t)cap ? f->numel - b : (int64_t)cap;
            st = fill(user, i, b, n, buf);
            if (st != DSC_OK) dsc__error_prefix("initialising %s: ", f->name);
            else st = dsc__engine_state_io(e, DSC__STATE_FROZEN, f->off + (size_t)b, (size_t)n,
                                           buf, true);
        }
    }
    for (int g = 0; g < e->ngroups && st == DSC_OK; g++) {
        const group *gr = &e->groups[g];
        for (size_t lo = gr->off; lo < gr->off + gr->padded && st == DSC_OK; lo += cap) {
            size_t hi = lo + cap < gr->off + gr->padded ? lo + cap : gr->off + gr->padded;
            memset(buf, 0, (hi - lo) * sizeof *buf);
            for (int i = 0; i < e->nparams && st == DSC_OK; i++) {
                if (e->params[i].group != g) continue;
                st = fill_range(e, i, lo, hi, buf, lo, fill, user);
                if (st != DSC_OK) dsc__error_prefix("initialising %s: ", e->params[i].name);
            }
            if (st == DSC_OK) st = dsc__engine_state_io(e, 0, lo, hi - lo, buf, true);
        }
    }
    free(buf);
    return st;
}

dsc_status dsc_params_init(dsc_engine *e, dsc_param_fill_fn fill, void *user) {
    if (e->params_ready || e->h_init)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_params_init: the engine was created without "
                         "dsc_engine_opts.init_in_place, or its parameters were set already");
    if (e->dev_state) DSC_TRY(init_on_device(e, fill, user));
    for (int g = 0; g < e->ngroups && !e->dev_state; g++) {
        const group *gr = &e->groups[g];
        // This rank's flat range of the group, and where it lives.
        size_t lo = gr->off + (e->stage > 0 ? (size_t)e->rank * gr->slice : 0);
        size_t hi = e->stage > 0 ? lo + gr->slice : gr->off + gr->padded;
        float *dst = dsc__zero_master_slice(e, g);
        for (int i = 0; i < e->nparams; i++) {
            if (e->params[i].group != g) continue;
            dsc_status st = fill_range(e, i, lo, hi, dst, lo, fill, user);
            if (st != DSC_OK) {
                dsc__error_prefix("initialising %s: ", e->params[i].name);
                return st;
            }
        }
    }
    if (!e->dev_state) DSC_TRY(dsc__frozen_fill(e, fill, user)); // whole, or this rank's slices
    e->init = NULL;
    return dsc_params_updated(e);
}

static dsc_status check_group(const dsc_engine *e, int g, const char *what) {
    if (g < 0 || g >= e->ngroups)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s(%d): the model registered groups 0..%d", what, g,
                         e->ngroups - 1);
    return DSC_OK;
}

dsc_status dsc_gather(dsc_engine *e, int g) {
    DSC_TRY(check_group(e, g, "dsc_gather"));
    dsc__ft_point(e, e->backward ? "backward" : "forward");
    e->in_step = true;
    e->gathered[g] = 1;
    return dsc__zero_gather(e, g);
}

dsc_status dsc_release(dsc_engine *e, int g) {
    DSC_TRY(check_group(e, g, "dsc_release"));
    if (!e->gathered[g])
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_release(%d) without dsc_gather(%d)", g, g);
    e->gathered[g] = 0;
    return dsc__zero_release(e, g);
}

dsc_status dsc_grads_ready(dsc_engine *e, int g) {
    DSC_TRY(check_group(e, g, "dsc_grads_ready"));
    e->in_step = true;
    return dsc__zero_grads_ready(e, g);
}

dsc_status dsc_backward_begin(dsc_engine *e) {
    if (e->no_grads)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_backward_begin: this engine keeps no gradient "
                         "buffers (one GPU: the gradients stay on the device, or go from it to "
                         "the offloaded optimizer); a host backward needs an engine created "
                         "without dsc_engine_opts.no_compute_copy");
    e->backward = true;
    e->in_step = true;
    return DSC_OK;
}

double dsc_backward_scale(const dsc_engine *e) {
    return dsc_loss_scaler_scale(&e->scaler) / (double)e->cfg.gradient_accumulation_steps;
}

dsc_status dsc_engine_mean(dsc_engine *e, double *v, int n) {
    if (!e->comm || n <= 0) return DSC_OK;
    double *all = malloc(sizeof(double) * (size_t)n * (size_t)e->world);
    if (!all) return dsc__fail(DSC_ERR_OOM, "out of memory");
    dsc_status st = dsc_comm_all_gather(e->comm, v, all, (size_t)n * 2, DSC_DT_F32, NULL);
    for (int k = 0; st == DSC_OK && k < n; k++) {
        double sum = 0;
        for (int r = 0; r < e->world; r++) sum += all[(size_t)r * n + k];
        v[k] = sum / e->world;
    }
    free(all);
    return st;
}

void dsc_engine_observe_grads(dsc_engine *e, dsc_grad_observer fn, void *user) {
    e->observer = fn;
    e->observer_user = user;
}

dsc_status dsc_engine_full_grad(dsc_engine *e, int i, float *out) {
    if (i < 0 || i >= e->npub)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_full_grad: no tensor %d", i);
    if (frozen_of(e, i))
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_full_grad: tensor %d (%s) is frozen and "
                         "has no gradient", i, frozen_of(e, i)->name);
    if (e->dev_state && !e->acc) { // read from the device, scaled as dsc__zero_full_grad does
        const param *p = &e->params[e->pub[i]];
        DSC_TRY(dsc__engine_state_io(e, DSC__STATE_GRAD, p->off, (size_t)p->numel, out, false));
        for (int64_t k = 0; k < p->numel; k++) out[k] = (float)(out[k] * e->observer_inv_scale);
        return DSC_OK;
    }
    return dsc__zero_full_grad(e, e->pub[i], out, e->observer_inv_scale);
}

// ---- the optimizer step ----

// The lr (and OneCycle's momentum; NAN: the optimizer's own) of applied step `step`. Fails where
// DeepSpeed's scheduler fails computing it.
static dsc_status sched_at(const dsc_engine *e, int64_t step, double *lr, double *mom) {
    *lr = e->base_lr;
    *mom = NAN;
    return e->has_sched ? dsc_sched_lr_at(&e->sched, e->base_lr, step, lr, mom) : DSC_OK;
}

dsc_status dsc__config_optimizer_at(const dsc_config *c, int64_t step, dsc_opt_hparams *hp,
                                    double *lr, dsc_sched_params *sched, bool *has_sched) {
    dsc_engine *e = calloc(1, sizeof *e); // only the configuration's fields are used
    if (!e) return dsc__fail(DSC_ERR_OOM, "out of memory reading a configuration");
    e->cfg = *c;
    double mom;
    dsc_status st = optimizer_from_config(e);
    if (st == DSC_OK) st = schedule_from_config(e);
    if (st == DSC_OK) st = sched_at(e, step, lr, &mom);
    *hp = e->hp;
    *sched = e->sched;
    *has_sched = e->has_sched;
    free(e);
    return st;
}

double dsc_engine_next_lr(const dsc_engine *e) {
    double lr, mom;
    return sched_at(e, e->applied_steps + 1, &lr, &mom) == DSC_OK ? lr : NAN;
}

// Is global step `step` listed in DSC_INJECT_OVERFLOW ("3,7,10-12")? A test-only fault switch.
bool dsc__inject_overflow(const char *spec, int64_t step) {
    if (!spec) return false;
    const char *p = spec;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b = a;
        if (end == p) return false;
        if (*end == '-') b = strtol(end + 1, &end, 10);
        if (step >= a && step <= b) return true;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return false;
    }
    return false;
}

// DSC_FT_SAVE_STATE=DIR (a test hook, docs/fault-tolerance.md): the whole state after every
// optimizer step to DIR/step<N>.safetensors. A collective; rank 0 writes.
static dsc_status save_state_hook(dsc_engine *e) {
    const char *dir = dsc__env(DSC_ENV_FT_SAVE_STATE);
    if (!dir || !*dir) return DSC_OK;
    if (e->dev_state)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "DSC_FT_SAVE_STATE: the state lives on the device "
                         "(one GPU with the optimizer on it); DSC_DEVICE_STATE=0 keeps it on the "
                         "host");
    char path[4096];
    snprintf(path, sizeof path, "%s/step%lld.safetensors", dir, (long long)e->global_steps);
    return dsc__ft_save_state(e, path);
}

static dsc_status apply_step(dsc_engine *e, const dsc_opt_hparams *hp, float grad_scale) {
    DSC_TRY(dsc__zero_optimizer(e, hp, e->applied_steps + 1, grad_scale));
    e->applied_steps++;
    // Snapshot the new state and start sending it to the buddy; the exchange runs on during the
    // parameter gather and the next step's compute, and completes at the next boundary.
    DSC_TRY(dsc__ft_commit_begin(e));
    DSC_TRY(dsc__zero_sync_params(e));
    return DSC_OK;
}

dsc_status dsc_step(dsc_engine *e, dsc_step_info *info) {
    if (e->device_step) return e->device_step(e->device_user, info);
    return dsc__engine_host_step(e, info);
}

void dsc__engine_attach_device(dsc_engine *e, dsc__engine_device_fn fn, void *user) {
    e->device_step = fn;
    e->device_user = fn ? user : NULL;
}

bool dsc__engine_device_attached(const dsc_engine *e) { return e->device_step != NULL; }

void dsc__engine_detach_device(dsc_engine *e, const void *user) {
    if (e->device_user == user) e->device_step = NULL, e->device_user = NULL;
}

dsc_status dsc__engine_host_step(dsc_engine *e, dsc_step_info *info) {
    memset(info, 0, sizeof *info);
    e->backward = false;
    DSC_TRY(dsc__zero_finish_micro(e));
    if (!dsc__engine_micro_done(e, info)) return DSC_OK;
    e->in_step = false; // from here on the step's buffers are back in the pool
    e->global_steps++;
    dsc__ft_point(e, "step");
    info->boundary = true;
    info->step = e->global_steps;
    info->loss_scale = dsc_loss_scaler_scale(&e->scaler);
    if (dsc__engine_fp16(e)) dsc__zero_round_fp16(e);
    if (e->master_bf16) dsc__zero_round_bf16_grads(e);
    DSC_TRY(dsc__engine_observe_host_grads(e)); // --dump-grads: the accumulated gradients
    // The previous step's replica exchange completes before the norm's collective: no rank
    // passes it (and overwrites its older snapshot) until every replica of that step is whole.
    DSC_TRY(dsc__ft_commit_end(e));
    bool nonfinite = false;
    double sumsq;
    DSC_TRY(dsc__zero_norm(e, 1.0 / info->loss_scale, &sumsq, &nonfinite));
    dsc_opt_hparams hp;
    float grad_scale;
    bool apply;
    dsc_status st = dsc__step_decide(e, sumsq, nonfinite, info, &hp, &grad_scale, &apply);
    // A skipped step (fp16 overflow) leaves weights, optimizer state and the LR schedule as they
    // are; the scaler's state moved: commit it.
    if (st == DSC_OK) st = apply ? apply_step(e, &hp, grad_scale) : dsc__ft_state_changed(e);
    dsc__zero_zero_acc(e);
    info->skipped_total = e->skipped_steps;
    if (st == DSC_OK) st = save_state_hook(e);
    dsc__ft_step_end(e);
    return st;
}

// ---- fault tolerance ----

// The device path's step boundary (engine/device.h).
size_t dsc__engine_ft_floats(const dsc_engine *e) {
    return dsc__ft_keeps_state(e) ? dsc__ft_snapshot_floats(e) : 0;
}

dsc_status dsc__engine_ft_own_external(dsc_engine *e, float *const bufs[2]) {
    return dsc__ft_own_external(e, bufs);
}

bool dsc__engine_ft_own_shared(dsc_engine *e, float *bufs[2]) {
    return dsc__engine_ft_floats(e) && dsc__ft_own_shared(e, bufs);
}

void dsc__engine_ft_own_drop(dsc_engine *e) {
    dsc__ft_own_drop(e);
}

dsc_status dsc__engine_ft_commit_end(dsc_engine *e) {
    return dsc__ft_commit_end(e);
}
float *dsc__engine_ft_reserve(dsc_engine *e) {
    return dsc__ft_snapshot_reserve(e);
}
dsc_status dsc__engine_ft_publish(dsc_engine *e) {
    return dsc__ft_snapshot_publish(e);
}
void dsc__engine_ft_cancel(dsc_engine *e) {
    dsc__ft_snapshot_cancel(e);
}

bool dsc__engine_save_state_wanted(void) {
    const char *dir = dsc__env(DSC_ENV_FT_SAVE_STATE);
    return dir && *dir;
}

dsc_status dsc__engine_save_state(dsc_engine *e) {
    return save_state_hook(e);
}

dsc_status dsc_step_begin(dsc_engine *e) {
    dsc__ft_step_begin(e);
    dsc_status st;
    const char *msg;
    if (e->comm && dsc_comm_is_broken(e->comm, &st, &msg)) // a peer failed after our last step
        return dsc__fail(st, "rank %d: step %lld cannot start: %s", e->rank,
                         (long long)e->global_steps + 1, msg);
    return DSC_OK;
}

void dsc_engine_abort(dsc_engine *e, const char *reason) {
    if (!e || !e->comm) return;
    char msg[512]; // the comm layer keeps as much of a reason
    snprintf(msg, sizeof msg, "rank %d stopped: %s", e->rank, reason ? reason : "(no reason)");
    dsc_comm_abort(e->comm, DSC_ERR_ABORTED, msg);
}

dsc_status dsc_engine_recover(dsc_engine *e, dsc_status failure, dsc_ft_report *out) {
    dsc_ft_report ignored;
    e->may_move = true; // the caller re-reads every pointer after a recovery
    dsc_status st = dsc__ft_recover(e, failure, out ? out : &ignored);
    e->may_move = false;
    return st;
}

int64_t dsc_engine_fault_events(const dsc_engine *e) { return dsc__ft_events(e); }

dsc_status dsc_engine_full_param(dsc_engine *e, int i, float *out) {
    if (i < 0 || i >= e->npub || !out)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_full_param: no tensor %d", i);
    const param *f = frozen_of(e, i);
    if (f && e->dev_state)
        return dsc__engine_state_io(e, DSC__STATE_FROZEN, f->off, (size_t)f->numel, out, false);
    if (f) return dsc__frozen_full(e, f, out);
    i = e->pub[i];
    if (e->dev_state)
        return dsc__engine_state_io(e, 0, e->params[i].off, (size_t)e->params[i].numel, out, false);
    if (e->init) { // before dsc_params_updated the staging copy holds every value
        memcpy(out, e->init + e->params[i].off, (size_t)e->params[i].numel * sizeof(float));
        return DSC_OK;
    }
    return dsc__zero_full_master(e, i, out);
}
