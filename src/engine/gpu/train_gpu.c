// engine/gpu/train_gpu.c - the engine's GPU training runtime behind dsc/device.h: the device
// trainer picks one-rank, nccl data-parallel (train_gpu_dp.c), host-staged or ZeRO-Offload
// (train_gpu_offload.c) training from the engine's config and drives the model's device passes.
#include "dsc/device.h"

#include <stdint.h> // SIZE_MAX
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, getenv
#include <string.h> // strcmp

#include "base/env.h"                     // dsc__env, DSC_ENV_*
#include "base/status.h"                  // dsc__fail, DSC_TRY
#include "base/time.h"                    // dsc_now
#include "engine/gpu/layer_slots.h"       // dsc__slots_* (bf16 master: gradient slots)
#include "engine/gpu/train_gpu_dp.h"      // dsc__train_dp_* (several GPUs through nccl)
#include "engine/gpu/train_gpu_offload.h" // dsc__train_off_* (ZeRO-Offload, streamed)
#include "dsc/comm.h"                     // dsc_comm_backend_available

// The layer groups as the device trainer lays them out (dsc/model.h, "a family on a GPU"): group
// 0, the layers 1 .. n_layer, group n_layer + 1; every tensor in one of them. Checked in every
// build, so that a model described otherwise is refused by name rather than trained with groups
// the device layout leaves out.
static dsc_status check_groups(const dsc_model *model) {
    const dsc_model_info *mi = dsc_model_describe(model);
    if (mi->n_layer < 0 || mi->num_groups != mi->n_layer + 2)
        return dsc__fail(DSC_ERR_INVALID_ARG, "--device cuda: model %s (family %s) describes %d "
                         "layer groups and %d layers; the device trainer takes n_layer + 2 groups "
                         "(0 before the layers, one per layer, the last after them; dsc/model.h): "
                         "describe the model's groups that way (a model without layers: n_layer 0, "
                         "two groups)", dsc_model_spec(model), mi->family, mi->num_groups,
                         mi->n_layer);
    for (int i = 0; i < mi->num_tensors; i++) {
        const dsc_model_param *p = dsc_model_param_get(model, i);
        if (p->group < 0 || p->group >= mi->num_groups)
            return dsc__fail(DSC_ERR_INVALID_ARG, "--device cuda: model %s: tensor %s is in layer "
                             "group %d, outside the model's %d groups; give it a group 0 .. %d",
                             dsc_model_spec(model), p->name, p->group, mi->num_groups,
                             mi->num_groups - 1);
    }
    return DSC_OK;
}

#ifdef DSC_WITH_CUDA

#include "engine/gpu/train_state.h" // dsc__cuda_state_*
#include "dsc/model.h"              // dsc_model_device_*
#include "engine/device.h"          // dsc__engine_*
#include "engine/state.h"           // dsc__state_layout

typedef dsc_device_trainer train_gpu; // this file's short name

struct dsc_device_trainer {
    dsc_engine *eng;
    const dsc_model *mdl;   // borrowed from the trainer
    dsc_mem_pool *pool;     // every device buffer of the run (state, activations, workspace)
    dsc__engine_flat host;  // the engine's flat state (one rank); staged: only total is set
    bool staged;            // several ranks: gradients to the engine every micro-step, the
                            // engine's dsc_step (reduction + CPU optimizer), weights back
    train_dp *dp;           // nccl: gradients reduced among the GPUs, optimizer on the device
                            // (train_gpu_dp.h); it owns st then
    train_off *off;         // ZeRO-Offload on one GPU (train_gpu_offload.h)
    bool unstreamed;        // ZeRO-Offload, DSC_OFFLOAD_STREAM=0: whole gradient after backward
    bool param_offload;     // offload_param: layer weights on the host, streamed (off owns views)
    char dp_note[256];      // why nccl was selected but not used, for the banner
    int world;              // ranks now (dsc_device_trainer_recovered follows a smaller world)
    int sharing;            // ranks of this node on this device (MFU's share of its peak)
    int devices;            // devices visible to this node's ranks
    bool one_node;          // every rank on this node (then a recovery's world is the node's)
    int device;
    float *hgrad, *hweights; // staged: host copies of a micro-step's gradients / the weights
    dsc_cuda_state *st;     // the device's
    dsc_model_device *model; // the model's device passes
    int ntensors;
    int maxB;               // the micro-batch the model was made for
    bool timed;             // wall_clock_breakdown: wait for the device after each phase
    bool fp16;              // fp16.enabled: the model computes in fp16 (else bf16)
    bool loss_pending;      // the last micro-step's loss is not in the trainer's sum yet
    bool loss_ready;        // ... and loss_value holds it (read with the step's results)
    float loss_value;
    // bf16 master weights (st->master16): the model writes a micro-step's fp32 gradients into
    // the resident groups' scratch and two layer slots (engine/gpu/layer_slots.h, weights
    // resident), and each group is added into the bf16 gradients as soon as the backward is done
    // with it; acc_first: this micro-step is the step's first (= rather than +=)
    dsc__slots gslots;
    bool gslots_on, acc_first;
    const uint16_t **p16;   // per-tensor views into st->p16
    float **grad;           // per-tensor views into st->grad
    double peak;            // this rank's share of the device's peak (FLOP/s)
    double device_peak;
    char line[2048];
};

// DSC_COMM_BACKEND=nccl asks for device collectives: an error when this build has none or the
// run is on the CPU.
static dsc_status check_nccl_choice(bool on_cpu) {
    if (!dsc__train_dp_selected()) return DSC_OK;
    if (!dsc_comm_backend_available("nccl")) {
        dsc_comm_opts o = dsc_comm_opts_default();
        o.backend = "nccl";
        dsc_comm *c = NULL;
        dsc_status st = dsc_comm_create(&c, &o); // fails, naming what the build lacks
        dsc_comm_destroy(c);
        dsc__error_prefix("DSC_COMM_BACKEND=nccl: ");
        return st == DSC_OK ? DSC_ERR_INTERNAL : st;
    }
    if (on_cpu)
        return dsc__fail(DSC_ERR_INVALID_ARG, "DSC_COMM_BACKEND=nccl moves GPU buffers, but this "
                         "run trains on the CPU (--device cpu): use --device cuda, or unset "
                         "DSC_COMM_BACKEND (shm) or set it to mpi");
    return DSC_OK;
}

dsc_status dsc_device_pick(const char *flag, int world, bool *cuda) {
    *cuda = false;
    bool autopick = !flag || !strcmp(flag, "auto");
    if (!autopick && strcmp(flag, "cpu") && strcmp(flag, "cuda"))
        return dsc__fail(DSC_ERR_INVALID_ARG, "--device %s: expected cuda, cpu or auto", flag);
    DSC_TRY(check_nccl_choice(!autopick && !strcmp(flag, "cpu")));
    if (!autopick && !strcmp(flag, "cpu")) return DSC_OK;
    char name[256];
    double peak;
    dsc_status st = dsc__cuda_device_info(name, sizeof name, &peak);
    if (autopick && (st == DSC_OK || !dsc__train_dp_selected())) {
        *cuda = st == DSC_OK && (world == 1 || dsc__train_dp_selected());
        dsc_clear_error();
        return DSC_OK;
    }
    if (st != DSC_OK) {
        char why[512]; // dsc__fail writes the buffer dsc_last_error() points to: copy first
        snprintf(why, sizeof why, "%s", dsc_last_error());
        return dsc__fail(DSC_ERR_UNSUPPORTED, "--device %s: %s; check nvidia-smi and "
                         "CUDA_VISIBLE_DEVICES, or train with --device cpu%s", flag ? flag : "auto",
                         why, dsc__train_dp_selected() ? " and without DSC_COMM_BACKEND=nccl" : "");
    }
    *cuda = true; // several ranks: nccl data-parallel or host-staged (dsc/device.h)
    return DSC_OK;
}

// The config's sections that the GPU path cannot honour are errors naming the key; a precision
// it computes differently (fp32) gets a note. fp16 and bf16 configs compute in their own type.
static dsc_status check_config(train_gpu *g, bool *offload, const char **prec) {
    const dsc_config *c = dsc_engine_config(g->eng);
    const char *od = c->zero_optimization.offload_optimizer.device;
    const char *pd = c->zero_optimization.offload_param.device;
    if (!strcmp(od, "nvme") || !strcmp(pd, "nvme"))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "zero_optimization.%s.device \"nvme\" is not "
                         "built; use \"cpu\" or \"none\"",
                         !strcmp(od, "nvme") ? "offload_optimizer" : "offload_param");
    *offload = !strcmp(od, "cpu");
    g->param_offload = !strcmp(pd, "cpu");
    if (g->param_offload && c->zero_optimization.stage != 3)
        return dsc__fail(DSC_ERR_CONFIG, "zero_optimization.offload_param needs ZeRO stage 3 (as "
                         "in DeepSpeed); set zero_optimization.stage to 3, or offload_param.device "
                         "to \"none\"");
    if (g->param_offload && !*offload)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "zero_optimization.offload_param on --device cuda "
                         "streams the weights the CPU optimizer writes: set "
                         "zero_optimization.offload_optimizer.device to \"cpu\" too, or "
                         "offload_param.device to \"none\"");
    if (g->param_offload && g->world > 1)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "zero_optimization.offload_param on --device cuda "
                         "runs on one rank (this run has %d); set offload_param.device to "
                         "\"none\", or train on one GPU", g->world);
    const char *stream = dsc__env(DSC_ENV_OFFLOAD_STREAM);
    g->unstreamed = *offload && g->world == 1 && stream && !strcmp(stream, "0");
    if (g->unstreamed && g->param_offload)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "DSC_OFFLOAD_STREAM=0 (the whole-gradient "
                         "offload) cannot stream parameters: unset it, or set "
                         "zero_optimization.offload_param.device to \"none\"");
    if (*offload && !g->unstreamed && g->world == 1 && dsc__engine_master_bf16(g->eng, NULL))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "bf16.bf16_master_weights_and_grads with "
                         "zero_optimization.offload_optimizer \"cpu\" on one GPU: the streamed "
                         "offload keeps an fp32 master; set offload_optimizer.device to \"none\" "
                         "(bf16 master, gradients and moments on the GPU), or the bf16 master keys "
                         "false");
    *prec = c->bf16.enabled ? "bf16" : c->fp16.enabled ? "fp16" : "fp32";
    g->fp16 = c->fp16.enabled;
    if (!c->bf16.enabled && !c->fp16.enabled)
        fprintf(stderr, "note: --device cuda computes in bf16 (the GPU kernels have no fp32 "
                "path): fp32 master weights and optimizer state; set \"bf16\": {\"enabled\": "
                "true} to say so in the config, or \"fp16\" for fp16 with loss scaling\n");
    return DSC_OK;
}

// ---- bf16 master weights: the gradient slots ----

// Group `group`'s fp32 gradients at scratch element `from` into the bf16 gradients.
static dsc_status acc_group(train_gpu *g, int group, size_t from) {
    dsc__engine_span sp;
    dsc__engine_span_of(g->eng, group, &sp);
    return dsc__cuda_state_acc_grads(g->st, sp.off, from, sp.padded, g->acc_first);
}

// Gradient slot j takes another layer: the one it held goes into the bf16 gradients first (on
// the model's stream, so the layer's kernels write the slot after that addition read it). The
// model writes every gradient of the layer (fresh), so the slot needs no zeroing.
static dsc_status gslot_reuse(void *user, int j, int before, int group) {
    (void)group;
    train_gpu *g = user;
    if (before < 0) return DSC_OK;
    return acc_group(g, before, (size_t)(g->gslots.g[j] - g->st->grad));
}
// (with the weights resident the hook never fetches, waits for or releases weights)
static const dsc__slots_ops gslot_ops = {.reuse = gslot_reuse};

// After a micro-step's backward: the two layers still in the slots and the resident groups.
static dsc_status gslots_flush(train_gpu *g) {
    dsc__slots *s = &g->gslots;
    for (int j = 0; j < 2; j++) {
        if (s->gheld[j] < 0) continue;
        DSC_TRY(acc_group(g, s->gheld[j], (size_t)(s->g[j] - g->st->grad)));
        s->gheld[j] = -1;
    }
    int ends[2] = {0, s->L + 1};
    for (int k = 0; k < 2; k++) DSC_TRY(acc_group(g, ends[k], s->dev_off[ends[k]]));
    return DSC_OK;
}

static dsc_status make_views(train_gpu *g) {
    if (!g->p16) g->p16 = calloc((size_t)g->ntensors, sizeof *g->p16);
    if (!g->grad) g->grad = calloc((size_t)g->ntensors, sizeof *g->grad);
    if (!g->p16 || !g->grad) return dsc__fail(DSC_ERR_OOM, "out of memory");
    for (int i = 0; i < g->ntensors; i++) // frozen (LoRA's base): its 16-bit values, no gradient
        if (dsc__engine_param_offset(g->eng, i) == SIZE_MAX) {
            g->p16[i] = g->st->frozen16 + dsc__engine_frozen_offset(g->eng, i);
            g->grad[i] = NULL;
        }
    if (g->param_offload) { // (the slots' tables keep the frozen entries as set above)
        dsc__train_off_views(g->off, g->p16, g->grad);
        return DSC_OK;
    }
    if (g->dp && dsc__train_dp_views(g->dp, g->model, g->p16, g->grad)) return DSC_OK;
    for (int i = 0; i < g->ntensors; i++) {
        size_t off = dsc__engine_param_offset(g->eng, i);
        if (off == SIZE_MAX) continue; // frozen: above
        g->p16[i] = g->st->p16 + off;
        g->grad[i] = g->gslots_on ? NULL : g->st->grad + off;
    }
    if (g->gslots_on) {
        g->gslots.gheld[0] = g->gslots.gheld[1] = -1; // (a recovery dropped what they held)
        dsc__slots_views(&g->gslots, g->model, g->p16, g->grad);
    }
    return DSC_OK;
}

// One device pool for the whole run. Everything is allocated once, here, and addresses are kept by
// the kernels, so the pool must never move blocks (no_defrag_on_oom, never defragmented); what it
// buys is accounting: its statistics show every device byte by tag, and that steps allocate
// nothing from the system. Small chunks keep the few scalars from reserving 256 MiB.
static dsc_status make_pool(train_gpu *g) {
    int dev = 0;
    DSC_TRY(dsc__cuda_current_device(&dev));
    char name[64];
    snprintf(name, sizeof name, "cuda:%d training pool", dev);
    dsc_mem_opts o = {.name = name, .chunk_bytes = (size_t)16 << 20, .no_defrag_on_oom = true};
    return dsc_mem_pool_create(&g->pool, dev, 0, &o);
}

// Ranks of this node on one device when `ranks` share the visible devices round-robin.
static int ranks_per_device(const train_gpu *g, int ranks) {
    return (ranks + g->devices - 1) / g->devices;
}

// The node's ranks share the visible devices round-robin by local rank (all on one device when
// there is one); MFU then counts each rank's share of its device's peak.
static dsc_status pick_gpu(train_gpu *g) {
    dsc_comm_env_info env;
    DSC_TRY(dsc_comm_env(&env));
    g->devices = 1;
    DSC_TRY(dsc__cuda_select_device(env.local_rank, &g->device, &g->devices));
    int local = env.local_world_size > 0 ? env.local_world_size : 1;
    g->sharing = ranks_per_device(g, local);
    g->one_node = local == dsc_engine_world_size(g->eng);
    return DSC_OK;
}

// The engine keeps no master or moments (dsc_engine_state_on_device): it reads and writes them
// here, n elements at a time.
static dsc_status state_read(void *user, int kind, size_t off, size_t n, float *dst) {
    return dsc__cuda_state_io(((train_gpu *)user)->st, kind, off, n, dst, false);
}
static dsc_status state_write(void *user, int kind, size_t off, size_t n, const float *src) {
    return dsc__cuda_state_io(((train_gpu *)user)->st, kind, off, n, (float *)src, true);
}

// One rank: the device holds the engine's flat layout (and, without offload, the optimizer;
// with it, train_gpu_offload.c moves gradients and weights once the model exists).
static dsc_status flat_init(train_gpu *g, bool offload) {
    DSC_TRY(dsc__engine_flat_state(g->eng, &g->host));
    dsc_state_layout L;
    dsc__state_layout(g->eng, &L);
    int moments = L.nmoments;
    size_t n = g->param_offload ? dsc__train_off_device_len(g->eng, g->mdl) : g->host.total;
    bool states16;
    if (!offload && dsc__engine_master_bf16(g->eng, &states16)) {
        size_t glen = dsc__slots_layout(g->eng, dsc_model_describe(g->mdl)->n_layer, NULL, NULL);
        DSC_TRY(dsc__cuda_state_create_bf16(&g->st, n, glen, moments, states16, g->pool));
        dsc__cuda_state_set_sr(g->st, dsc__engine_bf16_sr(g->eng));
        return DSC_OK;
    }
    return dsc__cuda_state_create(&g->st, n, moments, offload, g->pool);
}

// Several ranks: the engine's host buffers are partitioned by stage and move between steps, so
// the bus copies go through two full-layout host buffers of this rank, page-locked once.
// The two full-layout host buffers of the staging (n elements each), page-locked when the system
// allows; earlier ones are freed (the state unpinned them first).
static dsc_status staged_host(train_gpu *g, size_t n, bool *pinned, char *why, size_t cap) {
    free(g->hgrad);
    free(g->hweights);
    g->host = (dsc__engine_flat){.total = n};
    g->hgrad = calloc(n, sizeof *g->hgrad);
    g->hweights = calloc(n, sizeof *g->hweights);
    if (!g->hgrad || !g->hweights)
        return dsc__fail(DSC_ERR_OOM, "out of memory for the host staging of %zu parameters "
                         "(8 bytes each)", n);
    dsc__cuda_state_pin(g->st, g->hgrad, g->hweights, n, pinned, why, cap);
    return DSC_OK;
}

static dsc_status staged_init(train_gpu *g, bool *pinned, char *why, size_t cap) {
    size_t n = dsc__engine_layout_len(g->eng);
    DSC_TRY(dsc__cuda_state_create(&g->st, n, 0, true, g->pool));
    return staged_host(g, n, pinned, why, cap);
}

static dsc_status frozen_put(void *user, size_t off, size_t n, float *values) {
    return dsc__cuda_state_io(((train_gpu *)user)->st, DSC__STATE_FROZEN, off, n, values, true);
}

// LoRA's frozen base on the device (its 16-bit values, uploaded once: they never change), whole
// on every GPU. With ZeRO-Offload and with nccl it stays there too: the host's optimizer, the
// bus and the collectives carry the trained tensors (the adapters) only. At stage 3 on several
// ranks the host keeps only this rank's slices of it (engine/zero/frozen.c), and so does each GPU
// at stage 3 over nccl: its slice of every layer's base, all-gathered beside the layer's weights
// (dsc__train_dp_frozen); with the weights whole on every GPU (DSC_GPU_STAGE3_PARTITION=0) the
// base is uploaded whole, a gathered group at a time. With offload_param on one GPU the layers' frozen tensors stream through two
// slots of their own beside the layers' weights (train_gpu_offload.c, layer_slots.h): the
// device keeps the end groups' frozen tensors (embeddings, head) and the two slots.
static dsc_status frozen_init(train_gpu *g, bool offload) {
    size_t n;
    const float *host = dsc__engine_frozen_store(g->eng, &n);
    if (!n) return DSC_OK;
    bool parted = false; // stage 3 over nccl: each GPU keeps its slices, gathered per layer
    if (g->dp) DSC_TRY(dsc__train_dp_frozen(g->dp, &parted));
    if (parted) return DSC_OK;
    if (offload && !g->staged && g->param_offload) {
        size_t end_off[2], off, padded;
        int L = dsc_model_describe(g->mdl)->n_layer;
        size_t dn = dsc__slots_frozen_layout(g->eng, L, NULL, end_off);
        if (!host)
            return dsc__fail(DSC_ERR_INTERNAL, "parameter offload: no host store of the frozen "
                             "tensors (a bug: report it)");
        DSC_TRY(dsc__cuda_state_frozen(g->st, NULL, dn, g->pool));
        for (int k = 0; k < 2; k++) { // the end groups' frozen ranges, once
            dsc__engine_frozen_span(g->eng, k ? L + 1 : 0, &off, &padded);
            if (padded)
                DSC_TRY(dsc__cuda_state_io(g->st, DSC__STATE_FROZEN, end_off[k], padded,
                                           (float *)host + off, true));
        }
        return DSC_OK;
    }
    DSC_TRY(dsc__cuda_state_frozen(g->st, host, n, g->pool));
    return host ? DSC_OK : dsc__engine_frozen_gathered(g->eng, frozen_put, g);
}

// The banner's words for a one-rank run.
static const char *one_rank_mode(const train_gpu *g, bool offload) {
    bool states16;
    if (!offload && dsc__engine_master_bf16(g->eng, &states16))
        return states16 ? "bf16 master, bf16 gradients and bf16 optimizer state on the GPU "
                          "(bf16.bf16_master_weights_and_grads, bf16_optimizer_states)"
                        : "bf16 master, bf16 gradients, fp32 optimizer state on the GPU "
                          "(bf16.bf16_master_weights_and_grads)";
    if (!offload) return "fp32 master + optimizer state on the GPU";
    if (g->unstreamed)
        return "ZeRO-Offload: fp32 master + optimizer on the host (CPU step), not streamed "
               "(DSC_OFFLOAD_STREAM=0)";
    if (g->param_offload)
        return "ZeRO-Offload with parameter offload: fp32 master + optimizer and the layers' "
               "16-bit weights on the host, streamed through two layer slots; gradients down "
               "per layer group, overlapping the backward";
    return "ZeRO-Offload: fp32 master + optimizer on the host (CPU step; no host gradient "
           "buffer, four page-locked group slots), gradients down and 16-bit weights up per "
           "layer group, overlapping the backward";
}

static void describe(train_gpu *g, const char *name, bool offload, const char *prec, bool pinned,
                     const char *why) {
    char mode[512];
    if (g->dp)
        dsc__train_dp_describe(g->dp, mode, sizeof mode);
    else if (g->staged)
        snprintf(mode, sizeof mode, "cuda:%d shared by %d rank%s | %d ranks, host-staged: "
                 "gradients to the host every micro-step, ZeRO stage %lld reduction, fp32 "
                 "master and optimizer on the host (CPU step), weights back", g->device,
                 g->sharing, g->sharing == 1 ? "" : "s", g->world,
                 (long long)dsc_engine_config(g->eng)->zero_optimization.stage);
    else
        snprintf(mode, sizeof mode, "%s%s", one_rank_mode(g, offload),
                 offload ? ""
                 : dsc_engine_state_on_device(g->eng) ? " (no host copy: checkpoints read it "
                                                        "from the device)"
                                                      : " (a host copy for checkpoints; "
                                                        "DSC_DEVICE_STATE=1 keeps none)");
    bool note = (offload || g->staged) && !g->dp && !pinned;
    snprintf(g->line, sizeof g->line, "device %s | %s | %s compute, %s config%s%s%s%s%s", name,
             mode, dsc_device_trainer_compute(g), prec,
             note ? " | host buffers not page-locked (" : "",
             note ? why : "", note ? ")" : "", g->dp_note[0] ? " | " : "", g->dp_note);
}

// nccl data-parallel or not: every rank decides the same (offload and the selection come from the
// config and the environment; the GPU check is a collective).
static dsc_status choose_dp(train_gpu *g, bool offload, bool *use) {
    *use = false;
    if (!dsc__train_dp_selected()) return DSC_OK;
    if (!offload && dsc__engine_master_bf16(g->eng, NULL))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "DSC_COMM_BACKEND=nccl with "
                         "bf16.bf16_master_weights_and_grads: the nccl data-parallel path keeps "
                         "an fp32 master partition; unset DSC_COMM_BACKEND (the ranks then stage "
                         "through the host, whose engine keeps the bf16 master), or set the bf16 "
                         "master keys false");
    if (offload) {
        snprintf(g->dp_note, sizeof g->dp_note, "DSC_COMM_BACKEND=nccl, but the optimizer is "
                 "offloaded to the CPU (offload_optimizer.device \"cpu\"): no device collectives");
        return DSC_OK;
    }
    return dsc__train_dp_wanted(g->eng, g->device, use, g->dp_note, sizeof g->dp_note);
}

static dsc_status gpu_init(train_gpu *g, int B, int T) {
    bool offload = false;
    const char *prec = "";
    g->world = dsc_engine_world_size(g->eng);
    DSC_TRY(check_config(g, &offload, &prec));
    g->timed = dsc_engine_config(g->eng)->wall_clock_breakdown;
    DSC_TRY(pick_gpu(g));
    char name[256];
    DSC_TRY(dsc__cuda_device_info(name, sizeof name, &g->device_peak));
    g->peak = g->device_peak / g->sharing;
    DSC_TRY(make_pool(g));
    bool dp;
    DSC_TRY(choose_dp(g, offload, &dp));
    g->staged = g->world > 1 && !dp;
    char why[256] = "";
    bool pinned = false;
    if (dp) DSC_TRY(dsc__train_dp_create(&g->dp, g->eng, g->mdl, g->pool, g->timed, &g->st));
    else if (g->staged) DSC_TRY(staged_init(g, &pinned, why, sizeof why));
    else DSC_TRY(flat_init(g, offload));
    dsc__cuda_state_set_fp16(g->st, g->fp16); // before the load below makes the 16-bit copy
    DSC_TRY(frozen_init(g, offload));
    DSC_TRY(dsc_model_device_create(&g->model, g->mdl, B, T, g->st->stream, g->pool));
    g->maxB = B;
    dsc_model_device_set_fp16(g->model, g->fp16);
    if (offload && !g->staged && !g->unstreamed)
        DSC_TRY(dsc__train_off_create(&g->off, g->eng, g->st, &g->host, g->model, g->mdl,
                                      g->fp16, g->param_offload, &pinned, why, sizeof why));
    if (g->st->master16) {
        DSC_TRY(dsc__slots_init(&g->gslots, g->eng, g->mdl, NULL, g->st->grad, g->st->grad_len,
                                &gslot_ops, g));
        g->gslots_on = true;
    }
    if (g->unstreamed) // the gradients come down into acc, the weights go up from master
        dsc__cuda_state_pin(g->st, g->host.acc, g->host.master, g->host.total, &pinned, why,
                            sizeof why);
    DSC_TRY(make_views(g));
    describe(g, name, offload, prec, pinned, why);
    if (dsc_engine_state_on_device(g->eng)) { // the engine sets the state through us from now on
        dsc__engine_set_state_source(g->eng, &(dsc__state_source){g, state_read, state_write});
        return DSC_OK;
    }
    return dsc_device_trainer_load(g);
}

bool dsc_device_model_ok(const dsc_model *model) { return dsc_model_has_device(model); }

static dsc_status step_fn(void *user, dsc_step_info *info) {
    return dsc_device_trainer_step(user, info);
}

dsc_status dsc_device_trainer_create(train_gpu **out, dsc_engine *eng, const dsc_model *model,
                                     int B, int T) {
    *out = NULL;
    if (!dsc_model_has_device(model))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "--device cuda: model %s (family %s) has no CUDA "
                         "training yet; the CPU trains it: pass --device cpu",
                         dsc_model_spec(model), dsc_model_describe(model)->family);
    DSC_TRY(check_groups(model));
    if (dsc__engine_device_attached(eng))
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_device_trainer_create: the engine has a device "
                         "trainer already (dsc_step runs it); destroy that one first");
    train_gpu *g = calloc(1, sizeof *g);
    if (!g) return dsc__fail(DSC_ERR_OOM, "out of memory");
    g->eng = eng;
    g->mdl = model;
    g->ntensors = dsc_model_describe(model)->num_tensors;
    dsc_status st = gpu_init(g, B, T);
    if (st != DSC_OK) {
        dsc_device_trainer_destroy(g);
        return st;
    }
    dsc__engine_attach_device(eng, step_fn, g); // dsc_step(eng) is this trainer's step now
    *out = g;
    return DSC_OK;
}

void dsc_device_trainer_destroy(train_gpu *g) {
    if (!g) return;
    dsc__engine_detach_device(g->eng, g);
    if (dsc_engine_state_on_device(g->eng)) dsc__engine_set_state_source(g->eng, NULL);
    dsc__train_off_destroy(g->off); // its copies end and its host buffers are unpinned first
    dsc_model_device_destroy(g->model);
    if (g->dp) dsc__train_dp_destroy(g->dp); // with the state it owns
    else dsc__cuda_state_destroy(g->st); // unpins the staging buffers: free them after
    dsc__slots_free(&g->gslots);
    dsc_mem_pool_destroy(g->pool); // after its users: they wait for their streams first
    free(g->hgrad);
    free(g->hweights);
    free(g->p16);
    free(g->grad);
    free(g);
}

const char *dsc_device_trainer_describe(const train_gpu *g, double *peak_flops) {
    *peak_flops = g->peak;
    return g->line;
}

const char *dsc_device_trainer_compute(const train_gpu *g) { return g->fp16 ? "fp16" : "bf16"; }

void dsc_device_trainer_metrics(const train_gpu *g, char *buf, size_t cap) {
    buf[0] = '\0';
    if (!g->off) return;
    train_off_times t;
    dsc__train_off_times(g->off, &t);
    snprintf(buf, cap, ", \"offload_grad_wait_ms\": %.3f, \"offload_cpu_ms\": %.3f, "
             "\"offload_overlapped\": %s", t.grad_wait * 1e3, t.cpu * 1e3,
             t.overlapped ? "true" : "false");
}

// Host-staged: the staging buffers and the device state for the engine's layout as it is now
// (the device state keeps its stream, which the model borrowed).
static dsc_status staged_remake(train_gpu *g) {
    size_t n = dsc__engine_layout_len(g->eng);
    DSC_TRY(dsc__cuda_state_resize(g->st, n)); // waits for the stream; unpins the old buffers
    bool pinned;
    char why[256];
    return staged_host(g, n, &pinned, why, sizeof why);
}

void dsc_device_trainer_fault(train_gpu *g) {
    if (g->dp) dsc__train_dp_fault(g->dp);
}

dsc_status dsc_device_trainer_recovered(train_gpu *g, int B) {
    if (B > g->maxB)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "--device cuda: after the recovery each rank takes "
                         "micro-batches of %d, but the GPU model was made for %d; restart the job "
                         "(fault_tolerance.on_failure \"restart\")", B, g->maxB);
    if (g->staged && dsc__engine_layout_len(g->eng) != g->host.total) DSC_TRY(staged_remake(g));
    if (g->dp) DSC_TRY(dsc__train_dp_recovered(g->dp, g->mdl)); // new buffers and communicator
    g->world = dsc_engine_world_size(g->eng);
    // Fewer ranks share the devices now; on one node the survivors are all of the node's ranks
    // (on several nodes which ones survived here is not known: the share stays).
    if (g->one_node) {
        g->sharing = ranks_per_device(g, g->world);
        g->peak = g->device_peak / g->sharing;
    }
    DSC_TRY(dsc__cuda_state_zero_grads(g->st)); // a failed step's partial gradients go
    DSC_TRY(make_views(g));
    return dsc_device_trainer_load(g);
}

dsc_status dsc_device_trainer_load(train_gpu *g) {
    if (dsc_engine_state_on_device(g->eng)) return DSC_OK; // it is here (the frozen base too)
    if (g->dp) return dsc__train_dp_load(g->dp);
    if (g->staged) { // every rank holds a part of the master at stages 1-3: gather it
        DSC_TRY(dsc__engine_gather_master(g->eng, g->hweights));
        return dsc__cuda_state_upload(g->st, g->hweights, NULL, NULL);
    }
    if (g->param_offload) return dsc__train_off_load(g->off);
    if (g->st->offload) return dsc__cuda_state_upload(g->st, g->host.master, NULL, NULL);
    return dsc__cuda_state_upload(g->st, g->host.master, g->host.m, g->host.v);
}

dsc_status dsc_device_trainer_store(train_gpu *g) {
    if (dsc_engine_state_on_device(g->eng)) return DSC_OK; // the engine reads it from here
    if (g->dp) return dsc__train_dp_store(g->dp);
    if (g->st->offload) return DSC_OK; // the host state is the one the optimizer updates (and
                                       // staged runs are offloaded)
    DSC_TRY(dsc__cuda_state_download(g->st, g->host.master, g->host.m, g->host.v));
    return dsc__engine_master_changed(g->eng);
}

// One GPU with the optimizer on it (the tail of dsc_device_trainer_step): a step's first
// micro-step writes the gradients rather than adding to zeroed ones, so nothing zeroes them
// between steps.
static bool device_optimizer(const train_gpu *g) {
    return !g->dp && !g->staged && !g->off && !g->st->offload;
}

// The device runs ahead of the host; only with wall_clock_breakdown does the host wait after each
// phase (the forward already waits for its loss), so that the phase times are the device's.
dsc_status dsc_device_trainer_micro(train_gpu *g, const int32_t *in, const int32_t *tg, int B,
                                    int T, float *loss, double *fwd_s, double *bwd_s) {
    double fwd_unused = 0, bwd_unused = 0; // the caller keeps no phase times
    if (!fwd_s) fwd_s = &fwd_unused;
    if (!bwd_s) bwd_s = &bwd_unused;
    float scale = (float)dsc_backward_scale(g->eng);
    g->loss_pending = false; // one not taken belonged to a step a fault abandoned
    g->acc_first = dsc__engine_micro(g->eng) == 0;
    if (device_optimizer(g)) // the step's first micro-step writes the gradients (bf16 master:
                             // every micro-step writes its scratch, then adds it in bf16)
        dsc_model_device_set_grads_fresh(g->model, g->gslots_on || g->acc_first);
    dsc__engine_phase(g->eng, "forward");
    if (g->off)
        return dsc__train_off_micro(g->off, g->p16, g->grad, in, tg, B, T, scale, g->timed, loss,
                                    fwd_s, bwd_s);
    if (g->dp) { // the last micro-step's backward starts each group's reduction as it completes
        dsc_model_grad_hook fn;
        void *user;
        dsc__train_dp_backward_hook(g->dp, &fn, &user);
        dsc_model_device_set_grad_hook(g->model, fn, user);
    }
    // With nccl the loss is read after the pass's collectives were waited for (pass_done).
    if (!g->timed) { // one pass over the logits for loss and gradient; bitwise the split calls
        if (!g->dp) { // the step's last loss is read with its results (take_loss)
            bool defer = dsc__engine_micro_last(g->eng);
            DSC_TRY(dsc_model_device_train_step(g->model, g->p16, g->grad, in, tg, B, T, scale,
                                             defer ? NULL : loss));
            if (g->gslots_on) DSC_TRY(gslots_flush(g));
            dsc__engine_phase(g->eng, "backward"); // the backward is enqueued
            if (defer) *loss = 0.0f, g->loss_pending = true, g->loss_ready = false;
            return DSC_OK;
        }
        DSC_TRY(dsc_model_device_train_step(g->model, g->p16, g->grad, in, tg, B, T, scale, NULL));
        dsc__engine_phase(g->eng, "backward");
        DSC_TRY(dsc__train_dp_pass_done(g->dp));
        return dsc_model_device_read_loss(g->model, loss);
    }
    double t0 = dsc_now();
    DSC_TRY(dsc_model_device_forward(g->model, g->p16, in, tg, B, T, g->dp ? NULL : loss));
    if (g->dp) {
        DSC_TRY(dsc__train_dp_pass_done(g->dp));
        DSC_TRY(dsc_model_device_read_loss(g->model, loss));
    }
    double t1 = dsc_now();
    dsc__engine_phase(g->eng, "backward");
    DSC_TRY(dsc_model_device_backward(g->model, g->p16, g->grad, scale));
    if (g->gslots_on) DSC_TRY(gslots_flush(g));
    if (g->dp) DSC_TRY(dsc__train_dp_pass_done(g->dp));
    DSC_TRY(dsc__cuda_stream_wait(g->st->stream));
    *fwd_s += t1 - t0;
    *bwd_s += dsc_now() - t1;
    return DSC_OK;
}

dsc_status dsc_device_trainer_take_loss(train_gpu *g, double *loss_sum) {
    if (!g->loss_pending) return DSC_OK;
    if (!g->loss_ready) DSC_TRY(dsc_model_device_read_loss(g->model, &g->loss_value));
    *loss_sum += g->loss_value;
    g->loss_pending = g->loss_ready = false;
    return DSC_OK;
}

dsc_status dsc_device_trainer_memory(const train_gpu *g, dsc_mem_stats *pool,
                                     size_t *device_used) {
    DSC_TRY(dsc_mem_pool_stats(g->pool, pool));
    return dsc__cuda_device_used(device_used);
}

dsc_status dsc_device_trainer_positions(train_gpu *g, const int32_t *pos) {
    return dsc_model_device_set_positions(g->model, pos);
}

dsc_status dsc_device_trainer_loss(train_gpu *g, const int32_t *in, const int32_t *tg, int B, int T,
                                   float *loss) {
    if (!g->dp) return dsc_model_device_forward(g->model, g->p16, in, tg, B, T, loss);
    DSC_TRY(dsc_model_device_forward(g->model, g->p16, in, tg, B, T, NULL));
    DSC_TRY(dsc__train_dp_pass_done(g->dp)); // stage 3's gathers, waited with their deadline
    return dsc_model_device_read_loss(g->model, loss);
}

// ZeRO-Offload without streaming (DSC_OFFLOAD_STREAM=0, for comparisons): after the backward the
// whole gradient goes to the engine, whose dsc_step runs the CPU optimizer; the updated master
// weights come back and are rounded to the 16-bit type on the device.
static dsc_status offload_step(train_gpu *g, dsc_step_info *info) {
    bool last = dsc__engine_micro_last(g->eng);
    if (last) DSC_TRY(dsc__cuda_state_grads_to_host(g->st, g->host.acc));
    DSC_TRY(dsc__engine_host_step(g->eng, info));
    if (!last) return DSC_OK;
    DSC_TRY(dsc__cuda_state_zero_grads(g->st));
    return info->skipped ? DSC_OK : dsc__cuda_state_upload(g->st, g->host.master, NULL, NULL);
}

// Several ranks: every micro-step's gradients go to the engine as the CPU model's backward would
// hand them over (the engine reduces each micro-step, at every stage), then the engine's own
// dsc_step; after an applied step the new master weights come back to the device, rounded to
// the 16-bit type.
static dsc_status staged_step(train_gpu *g, dsc_step_info *info) {
    if (dsc_engine_world_size(g->eng) != g->world)
        return dsc__fail(DSC_ERR_INTERNAL, "--device cuda: the engine has %d ranks, the GPU "
                         "staging was made for %d (a recovery that did not reach the GPU side; "
                         "a bug: report it)", dsc_engine_world_size(g->eng), g->world);
    DSC_TRY(dsc__cuda_state_grads_to_host(g->st, g->hgrad));
    DSC_TRY(dsc__cuda_state_zero_grads(g->st));
    DSC_TRY(dsc__engine_add_grads(g->eng, g->hgrad));
    DSC_TRY(dsc__engine_host_step(g->eng, info));
    if (!info->boundary || info->skipped) return DSC_OK;
    DSC_TRY(dsc__engine_gather_master(g->eng, g->hweights));
    return dsc__cuda_state_upload(g->st, g->hweights, NULL, NULL);
}

// --dump-grads on one GPU with the device optimizer: the accumulated gradients (nothing to reduce
// on one rank) into a temporary host buffer (the engine keeps none: dsc__engine_keeps_no_grads)
// or the engine's host accumulator, then the trainer's observer.
static dsc_status observe_grads(train_gpu *g) {
    if (!dsc__engine_grads_observed(g->eng)) return DSC_OK;
    size_t len;
    float *acc = dsc__engine_grad_acc(g->eng, &len);
    if (!acc && dsc_engine_state_on_device(g->eng)) // read tensor by tensor from here
        return dsc__engine_observe_grads_in(g->eng, NULL);
    if (!acc) { // the engine keeps no gradients (dsc__engine_keeps_no_grads): a temporary copy
        float *tmp = malloc(g->st->n * sizeof *tmp);
        if (!tmp)
            return dsc__fail(DSC_ERR_OOM, "--dump-grads: out of memory for a host copy of the "
                             "%zu gradients", g->st->n);
        dsc_status st = dsc__cuda_state_grads_to_host(g->st, tmp);
        if (st == DSC_OK) st = dsc__engine_observe_grads_in(g->eng, tmp);
        free(tmp);
        return st;
    }
    if (len != g->st->n)
        return dsc__fail(DSC_ERR_INTERNAL, "--dump-grads: the engine's accumulator holds %zu "
                         "elements, the device %zu", len, g->st->n);
    DSC_TRY(dsc__cuda_state_grads_to_host(g->st, acc));
    return dsc__engine_observe_device_grads(g->eng);
}

// bf16 / fp32 on one GPU (no step is skipped): the norm, the loss copies, the clipping divisor
// and the optimizer step are all queued before the host waits, once, for the copies; the
// optimizer runs while the host reports the step and starts the next one.
static dsc_status queued_step(train_gpu *g, dsc_step_info *info) {
    const float *loss_dev = NULL;
    float inv = (float)(1.0 / dsc__engine_loss_scale(g->eng));
    DSC_TRY(dsc__cuda_state_grad_sumsq_enqueue(g->st, inv));
    if (g->loss_pending && !g->loss_ready) DSC_TRY(dsc_model_device_loss_enqueue(g->model, &loss_dev));
    DSC_TRY(dsc__cuda_state_results_enqueue(g->st, loss_dev));
    dsc__device_step plan;
    dsc__device_divisor div;
    DSC_TRY(dsc__engine_device_step_begin(g->eng, &plan, info, &div));
    if (plan.apply)
        DSC_TRY(dsc__cuda_state_step_div(g->st, &plan.hp, plan.opt_step, div.prev, div.scale,
                                         div.clipping));
    double sumsq;
    bool nonfinite;
    float loss;
    DSC_TRY(dsc__cuda_state_results_wait(g->st, &loss, &sumsq, &nonfinite));
    if (loss_dev) g->loss_value = loss, g->loss_ready = true;
    dsc__engine_device_step_end(g->eng, sumsq, nonfinite, info);
    return DSC_OK;
}

// Whether this step boundary goes through queued_step.
static bool queued(const train_gpu *g) {
    return device_optimizer(g) && dsc__engine_micro_last(g->eng) && !dsc__engine_fp16(g->eng) &&
           !g->timed && !dsc__engine_grads_observed(g->eng);
}

dsc_status dsc_device_trainer_step(train_gpu *g, dsc_step_info *info) {
    bool q = queued(g);
    if (g->loss_pending && !g->loss_ready && !q) { // read before the step, as ever
        DSC_TRY(dsc_model_device_read_loss(g->model, &g->loss_value));
        g->loss_ready = true;
    }
    if (g->dp) return dsc__train_dp_step(g->dp, info);
    if (g->staged) return staged_step(g, info);
    if (g->off) {
        DSC_TRY(dsc__train_off_step(g->off, info));
        return g->timed ? dsc__cuda_stream_wait(g->st->stream) : DSC_OK;
    }
    if (g->st->offload) return offload_step(g, info);
    if (!dsc__engine_micro_done(g->eng, info)) return DSC_OK;
    if (q) return queued_step(g, info);
    DSC_TRY(observe_grads(g));
    double sumsq;
    bool nonfinite;
    // fp16: the gradients become fp16 values as the engine's CPU step makes them (an overflow
    // beyond fp16's range becomes inf there too), so both paths skip the same steps.
    if (dsc__engine_fp16(g->eng)) DSC_TRY(dsc__cuda_state_round_grads_fp16(g->st));
    DSC_TRY(dsc__cuda_state_grad_sumsq(g->st, (float)(1.0 / dsc__engine_loss_scale(g->eng)),
                                       &sumsq, &nonfinite));
    dsc__device_step plan;
    DSC_TRY(dsc__engine_device_step(g->eng, sumsq, nonfinite, &plan, info));
    if (plan.apply)
        DSC_TRY(dsc__cuda_state_step(g->st, &plan.hp, plan.opt_step, plan.grad_scale));
    return g->timed ? dsc__cuda_stream_wait(g->st->stream) : DSC_OK; // (no zeroing: see micro)
}

#else // a build without the CUDA kernels: only the choice exists, and says why

typedef dsc_device_trainer train_gpu;

dsc_status dsc_device_pick(const char *flag, int world, bool *cuda) {
    *cuda = false;
    if (dsc__train_dp_selected())
        return dsc__fail(DSC_ERR_UNSUPPORTED, "DSC_COMM_BACKEND=nccl: this dsc was built without "
                         "the CUDA kernels (nvcc was not found, or -DDSC_CUDA=OFF), so it has no "
                         "nccl backend; rebuild with the CUDA toolkit and NCCL, or unset "
                         "DSC_COMM_BACKEND");
    if (!flag || !strcmp(flag, "auto") || !strcmp(flag, "cpu")) return DSC_OK;
    if (strcmp(flag, "cuda"))
        return dsc__fail(DSC_ERR_INVALID_ARG, "--device %s: expected cuda, cpu or auto", flag);
    return dsc__fail(DSC_ERR_UNSUPPORTED, "--device cuda: this dsc was built without the CUDA "
                     "kernels (nvcc was not found, or -DDSC_CUDA=OFF); rebuild with the CUDA "
                     "toolkit on PATH, or train with --device cpu");
}

bool dsc_device_model_ok(const dsc_model *model) {
    (void)model;
    return false;
}

static dsc_status no_cuda(void) {
    bool cuda;
    return dsc_device_pick("cuda", 1, &cuda);
}

// create always fails here, so no train_gpu exists and the calls below are never reached.
dsc_status dsc_device_trainer_create(train_gpu **out, dsc_engine *eng, const dsc_model *model,
                                     int B, int T) {
    *out = NULL;
    if (model && dsc_model_has_device(model)) DSC_TRY(check_groups(model));
    return no_cuda();
}
void dsc_device_trainer_destroy(train_gpu *g) {}
const char *dsc_device_trainer_describe(const train_gpu *g, double *peak_flops) {
    *peak_flops = 0;
    return "no CUDA";
}
const char *dsc_device_trainer_compute(const train_gpu *g) { return "none"; }
void dsc_device_trainer_metrics(const train_gpu *g, char *buf, size_t cap) { buf[0] = '\0'; }
dsc_status dsc_device_trainer_load(train_gpu *g) { return no_cuda(); }
void dsc_device_trainer_fault(train_gpu *g) {}
dsc_status dsc_device_trainer_recovered(train_gpu *g, int B) { return no_cuda(); }
dsc_status dsc_device_trainer_store(train_gpu *g) { return no_cuda(); }
dsc_status dsc_device_trainer_micro(train_gpu *g, const int32_t *in, const int32_t *tg, int B,
                                    int T, float *loss, double *fwd_s, double *bwd_s) {
    return no_cuda();
}
dsc_status dsc_device_trainer_take_loss(train_gpu *g, double *loss_sum) { return no_cuda(); }
dsc_status dsc_device_trainer_memory(const train_gpu *g, dsc_mem_stats *pool,
                                     size_t *device_used) {
    return no_cuda();
}
dsc_status dsc_device_trainer_step(train_gpu *g, dsc_step_info *info) { return no_cuda(); }
dsc_status dsc_device_trainer_loss(train_gpu *g, const int32_t *in, const int32_t *tg, int B, int T,
                                   float *loss) {
    return no_cuda();
}
dsc_status dsc_device_trainer_positions(train_gpu *g, const int32_t *pos) { return no_cuda(); }

#endif
