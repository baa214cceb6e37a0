// engine/memplan.c - the memory plan (dsc/memplan.h): the bytes a run will hold per rank, on its
// device and on the host, by category, computed from the same layout rules the engine and the
// GPU trainer allocate by (engine/zero/zero.c, engine/gpu/*, engine/gpu/train_state.cu), before any
// of it is allocated. Each mode is one accounting function below; when the runtime changes what a
// mode allocates, that function changes with it (tests/cli/test_memory_plan.sh holds the plan
// against the measured peaks).
#include "dsc/memplan.h"

#include <jansson.h> // json_* (the plan's JSON object)
#include <stdio.h>   // snprintf, FILE
#include <stdlib.h>  // malloc, free
#include <string.h>  // strcmp
#include <sys/resource.h> // getrlimit (ulimit -v)

#include "base/env.h"           // dsc__env, DSC_ENV_*
#include "base/status.h"        // dsc__fail
#include "engine/device.h"      // dsc__engine_grads_streamed
#include "engine/engine_impl.h" // DSC_ALIGN_ELEMS

// ---- categories ----

static const char *const cat_names[DSC_PLAN_NCAT] = {
    "weights", "master", "moments", "gradients", "activations", "staging", "snapshots", "runtime",
};

const char *dsc_plan_cat_name(int cat) {
    return cat >= 0 && cat < DSC_PLAN_NCAT ? cat_names[cat] : "?";
}

// A process of dsc before the run allocates (code, libraries, BLAS and OpenMP threads, the data
// loader's window), when the caller cannot measure it.
#define RUNTIME_ESTIMATE ((int64_t)96 << 20)
// What the device holds beyond the model's buffers: matrix-product workspaces, norm scratch,
// the pool's rounding to its 16 MiB chunks.
#define DEVICE_RUNTIME ((int64_t)512 << 20)

// ---- the engine's layout (engine/zero/zero.c's dsc__zero_layout) ----

typedef struct layout {
    int64_t total, part;   // padded elements: whole, this rank's partition
    int64_t maxgroup;      // largest group, padded
    int64_t persist;       // stage 3: elements of the groups kept whole (persistence threshold)
    int64_t ends, maxlayer; // GPU layer slots: groups 0 and n_layer + 1; the largest layer
    int64_t maxend;         // the larger of those two end groups
    int64_t params;        // elements, unpadded
    int64_t frozen;        // frozen tensors (LoRA's base), padded: values only, whole per rank
    // ... partitioned (stage 3 on several ranks, engine/zero/frozen.c): this rank's slices, the
    // largest group's range, the groups kept gathered
    int64_t fpart, fmaxgroup, fpersist;
    int64_t fends, fmaxlayer; // ... in the end groups; the largest layer's (streamed: offload_param)
} layout;

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static int64_t desc_numel(const dsc_param_desc *d) {
    int64_t n = 1;
    for (int k = 0; k < d->ndim; k++) n *= d->shape[k];
    return n;
}

static void group_sizes(const dsc_memplan_input *in, int g, int64_t *content, int64_t *numel) {
    *content = *numel = 0;
    for (int i = 0; i < in->nparams; i++) {
        if (in->params[i].group != g || in->params[i].frozen) continue;
        int64_t n = desc_numel(&in->params[i]);
        *content += round_up(n, DSC_ALIGN_ELEMS);
        *numel += n;
    }
}

static void make_layout(const dsc_memplan_input *in, int stage, int world, layout *L) {
    *L = (layout){0};
    int ngroups = 0;
    for (int i = 0; i < in->nparams; i++)
        if (in->params[i].group + 1 > ngroups) ngroups = in->params[i].group + 1;
    double threshold = in->config->zero_optimization.param_persistence_threshold;
    for (int g = 0; g < ngroups; g++) { // the frozen tensors, laid out as zero/frozen.c does
        int64_t content = 0, numel = 0;
        for (int i = 0; i < in->nparams; i++)
            if (in->params[i].frozen && in->params[i].group == g) {
                content += round_up(desc_numel(&in->params[i]), DSC_ALIGN_ELEMS);
                numel += desc_numel(&in->params[i]);
            }
        int64_t padded = round_up(content, (int64_t)world * DSC_ALIGN_ELEMS);
        L->frozen += content;
        L->params += numel;
        L->fpart += padded / world;
        if (padded > L->fmaxgroup) L->fmaxgroup = padded;
        if ((double)numel < threshold) L->fpersist += padded;
        if (g >= 1 && g <= in->n_layer) {
            if (padded > L->fmaxlayer) L->fmaxlayer = padded;
        } else {
            L->fends += padded;
        }
    }
    for (int g = 0; g < ngroups; g++) {
        int64_t content, numel;
        group_sizes(in, g, &content, &numel);
        int64_t padded = round_up(content, (int64_t)world * DSC_ALIGN_ELEMS);
        L->total += padded;
        L->part += padded / world;
        L->params += numel;
        if (padded > L->maxgroup) L->maxgroup = padded;
        if (stage == 3 && (double)numel < threshold) L->persist += padded;
        if (g >= 1 && g <= in->n_layer) {
            if (padded > L->maxlayer) L->maxlayer = padded;
        } else {
            L->ends += padded;
            if (padded > L->maxend) L->maxend = padded;
        }
    }
}

// ---- the mode ----

typedef struct mode {
    int stage, world, B, gas;
    bool fp32, adam, offload, param_offload, replicate;
    bool master_bf16, states_bf16; // bf16.bf16_master_weights_and_grads, bf16_optimizer_states
    bool device, nccl, staged, unstreamed;
    bool grads_streamed; // streamed ZeRO-Offload on one GPU: the engine keeps no gradients
    bool no_host_grads;  // ... or one GPU with the optimizer on it (dsc__engine_keeps_no_grads)
    bool no_compute_copy; // one rank whose model computes on a GPU keeps no host compute copy
    bool no_host_state;   // ... and no master or moments (dsc__engine_keeps_no_state)
    bool ckpt_async, ckpt_validate; // checkpoint.async (a snapshot buffer), checkpoint.validate
    const char *comm_dt; // communication_data_type ("" : the training type's, as DeepSpeed)
} mode;

static mode mode_of(const dsc_memplan_input *in, const dsc_config *c) {
    mode m = {0};
    m.stage = (int)c->zero_optimization.stage;
    m.world = in->world;
    m.B = (int)c->train_micro_batch_size_per_gpu;
    m.gas = (int)c->gradient_accumulation_steps;
    m.fp32 = !c->fp16.enabled && !c->bf16.enabled;
    m.master_bf16 = c->bf16.enabled && c->bf16.bf16_master_weights_and_grads;
    m.states_bf16 = m.master_bf16 && c->bf16.bf16_optimizer_states;
    const char *t = c->optimizer.type;
    m.adam = !t[0] || !strcmp(t, "Adam") || !strcmp(t, "AdamW") || !strcmp(t, "adam") ||
             !strcmp(t, "adamw");
    m.offload = !strcmp(c->zero_optimization.offload_optimizer.device, "cpu") ||
                c->zero_optimization.cpu_offload;
    m.param_offload = !strcmp(c->zero_optimization.offload_param.device, "cpu");
    m.replicate = c->fault_tolerance.replicate;
    m.device = in->device;
    m.nccl = in->device && in->nccl && in->world > 1 && !m.offload;
    m.staged = in->device && in->world > 1 && !m.nccl;
    const char *stream = dsc__env(DSC_ENV_OFFLOAD_STREAM);
    m.unstreamed = m.offload && in->world == 1 && stream && !strcmp(stream, "0");
    m.no_compute_copy = in->device && in->world == 1;
    m.ckpt_async = c->checkpoint.async;
    m.ckpt_validate = c->checkpoint.validate;
    m.comm_dt = c->communication_data_type;
    m.grads_streamed = dsc__engine_grads_streamed(c, in->world, in->device);
    m.no_host_grads = dsc__engine_keeps_no_grads(c, in->world, in->device);
    m.no_host_state = dsc__engine_keeps_no_state(c, in->world, in->device) ||
                      (in->device_state && m.no_host_grads && !m.grads_streamed);
    if (m.no_host_state) // written in line from the device (save.c), validated tensor by tensor
        m.ckpt_async = m.ckpt_validate = false; // (publish.c): no whole copy either way
    return m;
}

static void add(int64_t *cat, int k, int64_t bytes) { cat[k] += bytes; }

// The state on the device (one GPU; DSC_DEVICE_STATE=0 keeps a host copy): the largest of the
// pieces that pass through the host, one at a time: the initial weights' (engine.c), the shard
// writer's (ckpt/shard.c), a load's of every kind (ckpt/load.c) and validation's two
// (ckpt/publish.c). A load's pieces stay beside the 64 MiB the checksum maps of its shard
// (ckpt/reader.c): measured, a load of 3 x 40 Mi elements peaks 192 + 64 MiB over its start
// (tests/unit/test_ckpt.c).
static int64_t device_state_pieces(const mode *m, const layout *L) {
    const int64_t piece = (int64_t)16 << 20, nk = m->adam ? 3 : 2, hash = (int64_t)64 << 20;
    int64_t big = L->total > L->frozen ? L->total : L->frozen;
    int64_t init = (big < piece ? big : piece) * 4;
    int64_t write = L->part * nk * 4 < 4 * piece ? L->part * nk * 4 : 4 * piece;
    int64_t group = L->maxgroup < piece ? L->maxgroup : piece;
    int64_t most = init > write ? init : write;
    if (group * nk * 4 + hash > most) most = group * nk * 4 + hash;
    return most > group * 2 * 4 ? most : group * 2 * 4;
}

// Frozen tensors partitioned: stage 3 on several ranks (zero/frozen.c).
static bool frozen_parted(const mode *m) { return m->stage == 3 && m->world > 1; }

// The engine's persistent host buffers (engine/zero/zero.c's dsc__zero_alloc).
static void engine_state(const mode *m, const layout *L, int64_t *h) {
    if (m->no_host_state) { // on the device, LoRA's frozen base too: only pieces pass through
        add(h, DSC_PLAN_STAGING, device_state_pieces(m, L));
        return;
    }
    // fp32 training and bf16 master weights keep the master in the compute buffer (zero.c)
    bool flat = m->fp32 || m->master_bf16;
    bool master_in_work = flat && (m->stage == 1 || m->stage == 2);
    int64_t full = L->total * 4, part = L->part * 4, mlen = m->stage == 0 ? full : part;
    if (!master_in_work)
        add(h, flat && (m->stage == 0 || m->stage == 3) ? DSC_PLAN_WEIGHTS : DSC_PLAN_MASTER,
            mlen);
    add(h, DSC_PLAN_MOMENTS, mlen * (m->adam ? 2 : 1));
    if (m->stage < 3 && !(m->stage == 0 && m->fp32) && (!m->no_compute_copy || master_in_work))
        add(h, DSC_PLAN_WEIGHTS, full);
    if (m->stage == 3 && !flat && !m->no_compute_copy) add(h, DSC_PLAN_WEIGHTS, part);
    if (m->stage == 3 && (m->fp32 || !m->no_compute_copy)) add(h, DSC_PLAN_WEIGHTS, L->persist * 4);
    if (!frozen_parted(m)) { // the engine's frozen store (zero/frozen.c)
        add(h, DSC_PLAN_WEIGHTS, L->frozen * 4);
    } else { // this rank's slices, the buddy's replica (the ring), the groups kept gathered
        add(h, DSC_PLAN_WEIGHTS, (L->fpart + L->fpersist) * 4);
        if (m->replicate) add(h, DSC_PLAN_SNAPSHOTS, L->fpart * 4);
    }
    if (!m->no_host_grads) // streamed: the device trainer's slots instead (device_offload)
        add(h, DSC_PLAN_GRADS, m->stage < 2 ? full * (m->gas > 1 ? 2 : 1) : part);
    if (m->world > 1 && !m->fp32) // 16-bit reductions' staging (communication_data_type)
        add(h, DSC_PLAN_STAGING, (L->total + L->part) * 2);
}

// A step's transient host buffers, and the initial weights' staging copy that precedes them in
// the same free space of the pool (dsc_params_updated frees it before the first step).
static int64_t engine_transients(const mode *m, const layout *L, bool init_in_place) {
    int64_t step = L->maxgroup * 4;
    if (m->stage >= 2) step = (L->total + L->part) * 4; // every group's gradients until the end
    if (m->stage == 3) step += 2 * L->maxgroup * 4;     // the group gathered and the next one
    if (frozen_parted(m)) step += 2 * L->fmaxgroup * 4; // ... and their frozen tensors
    // (on one rank the initialiser writes the master in place: engine.c dsc__engine_init_alias)
    bool staging = !init_in_place && m->world > 1 && m->stage != 0 && !(m->fp32 && m->stage < 3);
    int64_t init = staging ? L->total * 4 : 0;
    if (!init_in_place && frozen_parted(m)) init += L->frozen * 4; // the frozen tensors' too
    if (m->device && !m->staged) step = 0; // the device runs the step
    // The frozen tensors' replica (engine_state) is taken after their staging went, in its space.
    if (!init_in_place && frozen_parted(m) && m->replicate) init -= L->fpart * 4;
    return step > init ? step : init;
}

// Fault tolerance's snapshot slots (engine/ft/replica.c) and the checkpoint writer's copy.
static void engine_snapshots(const mode *m, const layout *L, bool ckpt, int64_t *h) {
    int64_t nvec = m->adam ? 3 : 2, len = m->stage == 0 ? L->total : L->part;
    if (m->world > 1) {
        bool ring = m->replicate && m->stage >= 1;
        const char *send = dsc__env(DSC_ENV_FT_SEND_REPLICAS);
        bool mapped = ring && !(send && !strcmp(send, "1")); // the buddy maps ours: no copy here
        add(h, DSC_PLAN_SNAPSHOTS, 2 * len * nvec * 4 * (ring && !mapped ? 2 : 1));
    }
    if (!ckpt) return;
    // the writer's snapshot (an in-line save writes from the live state: engine/ckpt/save.c),
    // and the validation's re-read: the whole master once live, once read back (publish.c), and
    // in 16-bit training on the CPU a rounded copy for its validation loss (cli/train.c)
    if (m->ckpt_async) add(h, DSC_PLAN_SNAPSHOTS, round_up(L->part * nvec * 4, (int64_t)2 << 20));
    if (m->ckpt_validate)
        add(h, DSC_PLAN_SNAPSHOTS,
            L->total * 4 + L->params * 4 * (!m->fp32 && !m->device ? 2 : 1));
}

static void host_engine(const mode *m, const layout *L, const dsc_memplan_input *in, int64_t *h) {
    engine_state(m, L, h);
    add(h, DSC_PLAN_STAGING, engine_transients(m, L, in->init_in_place));
    engine_snapshots(m, L, in->checkpoints, h);
}

// One GPU, optimizer on the device (engine/gpu/train_gpu.c flat_init, engine/gpu/train_state.cu).
// bf16 master weights: the bf16 weights are the master, the gradients bf16 plus an fp32 scratch
// of the end groups and two layer slots (train_gpu.c); bf16 optimizer states: 2-byte moments.
static void device_resident(const mode *m, const layout *L, int64_t *d) {
    if (!m->master_bf16) add(d, DSC_PLAN_MASTER, L->total * 4);
    if (m->master_bf16) add(d, DSC_PLAN_GRADS, L->total * 2 + (L->ends + 2 * L->maxlayer) * 4);
    else add(d, DSC_PLAN_GRADS, L->total * 4);
    add(d, DSC_PLAN_WEIGHTS, L->total * 2);
    add(d, DSC_PLAN_MOMENTS, L->total * (m->states_bf16 ? 2 : 4) * (m->adam ? 2 : 1));
}

// One GPU with ZeRO-Offload (engine/gpu/train_gpu_offload.c): the device keeps the gradients
// and the 16-bit weights of its layout (with offload_param: the two end groups and two layer
// slots), and no master (the host's comes up through the gradients). The host adds two
// page-locked gradient slots and two 16-bit weight slots of the largest resident group
// (streamed); with offload_param the 16-bit copy of every weight (the layers live there) and two
// layer-sized gradient slots, and the engine's gradient accumulator unless the step is streamed
// too (dsc__engine_grads_streamed).
static void device_offload(const mode *m, const layout *L, int64_t *d, int64_t *h) {
    int64_t n = m->param_offload ? L->ends + 2 * L->maxlayer : L->total;
    add(d, DSC_PLAN_GRADS, n * 4);
    add(d, DSC_PLAN_WEIGHTS, n * 2);
    if (m->grads_streamed) { // the resident groups' slots (with offload_param: the end groups)
        int64_t slot = m->param_offload ? L->maxend : L->maxgroup;
        add(h, DSC_PLAN_STAGING, 2 * round_up(slot * 4, 64));
        add(h, DSC_PLAN_STAGING, 2 * round_up(slot * 2, 64));
    }
    if (m->param_offload) {
        add(h, DSC_PLAN_STAGING, round_up(L->total * 2, 64));
        add(h, DSC_PLAN_STAGING, 2 * L->maxlayer * 4);
        // LoRA's frozen base streams with the layers: their 16-bit copy on the host
        add(h, DSC_PLAN_STAGING, round_up((L->frozen - L->fends) * 2, 64));
    }
}

// Stage 3 over nccl with the 16-bit weights partitioned (DSC_GPU_STAGE3_PARTITION, on by default).
static bool gpu_partitioned(const mode *m) {
    return m->nccl && m->stage == 3 && !dsc__env_is(DSC_ENV_GPU_STAGE3_PARTITION, "0");
}

// LoRA's base on the device in 16 bits: whole; with offload_param on one GPU the end groups'
// frozen tensors and two slots of the largest layer's (engine/gpu/layer_slots.h); partitioned at
// stage 3 over nccl, those and this rank's slice of every layer's (engine/gpu/train_gpu_dp.c).
static int64_t frozen_device(const mode *m, const layout *L) {
    if (!m->device || !L->frozen) return 0;
    if (m->world == 1 && m->offload && m->param_offload) return (L->fends + 2 * L->fmaxlayer) * 2;
    if (gpu_partitioned(m))
        return (L->fends + 2 * L->fmaxlayer + L->fpart - L->fends / m->world) * 2;
    return L->frozen * 2;
}

// Several ranks: host-staged (gradients to the host every micro-step, the engine's CPU step) or
// nccl (the optimizer over the device's partition, engine/gpu/train_gpu_dp.c).
static void device_ranks(const mode *m, const layout *L, int64_t *d, int64_t *h) {
    if (m->staged) { // an offload state on the device: gradients and 16-bit weights
        add(d, DSC_PLAN_GRADS, L->total * 4);
        add(d, DSC_PLAN_WEIGHTS, L->total * 2);
        add(h, DSC_PLAN_STAGING, L->total * 8);
        return;
    }
    // (train_gpu_dp.c) the device arrays: every group, or partitioned at stage 3 the end groups
    // and two layer slots, beside this rank's slices of the 16-bit weights; the reduced gradient
    // partition at stages 1-3; the 16-bit staging of a reduction in bf16 or fp16
    int64_t nstate = m->stage == 0 ? L->total : L->part;
    int64_t n = gpu_partitioned(m) ? L->ends + 2 * L->maxlayer : L->total;
    const char *cdt = m->comm_dt;
    bool comm16 = !strcmp(cdt, "fp16") || !strcmp(cdt, "bf16") || (!cdt[0] && !m->fp32);
    add(d, DSC_PLAN_MASTER, nstate * 4);
    add(d, DSC_PLAN_MOMENTS, nstate * 4 * (m->adam ? 2 : 1));
    add(d, DSC_PLAN_GRADS, n * 4 + (m->stage > 0 ? L->part * 4 : 0));
    add(d, DSC_PLAN_WEIGHTS, n * 2 + (gpu_partitioned(m) ? L->part * 2 : 0));
    if (comm16) add(d, DSC_PLAN_STAGING, n * 2 + (m->stage > 0 ? L->part * 2 : 0));
    add(h, DSC_PLAN_STAGING, (L->total + L->part) * 4);
}

static void describe_mode(const mode *m, char *out, size_t cap) {
    const char *prec = m->fp32 ? "fp32" : !m->master_bf16 ? "16-bit compute, fp32 master"
                       : m->states_bf16 ? "bf16 master, gradients and moments"
                                        : "bf16 master and gradients";
    if (!m->device)
        snprintf(out, cap, "CPU, ZeRO stage %d, %s, %d rank%s", m->stage, prec, m->world,
                 m->world == 1 ? "" : "s");
    else if (m->world == 1 && !m->offload)
        snprintf(out, cap, "one GPU, optimizer on the GPU (stage %d); %s", m->stage,
                 m->no_host_state  ? "no host copy of master or moments"
                 : m->no_host_grads ? "host mirror of master and moments"
                                    : "host mirror of master, moments and gradients");
    else if (m->world == 1)
        snprintf(out, cap, "one GPU, ZeRO-Offload%s (stage %d)",
                 m->param_offload ? " with offload_param" : "", m->stage);
    else
        snprintf(out, cap, "%d GPUs, %s, ZeRO stage %d", m->world,
                 m->staged ? "host-staged" : "nccl", m->stage);
}

static dsc_status plan_with(const dsc_memplan_input *in, const dsc_config *c, dsc_memplan *p) {
    if (!in || !c || !in->params || in->nparams <= 0 || in->world < 1 || in->seq_len < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "memory plan: no parameter table, config, ranks "
                         "or sequence length");
    *p = (dsc_memplan){.host_avail = in->host_avail, .device_avail = in->device_avail};
    mode m = mode_of(in, c);
    layout L;
    make_layout(in, m.stage, m.world, &L);
    p->params = L.params;
    host_engine(&m, &L, in, p->host);
    if (m.device && m.world == 1 && !m.offload) device_resident(&m, &L, p->device);
    else if (m.device && m.world == 1) device_offload(&m, &L, p->device, p->host);
    else if (m.device) device_ranks(&m, &L, p->device, p->host);
    if (in->act) add(m.device ? p->device : p->host, DSC_PLAN_ACTIVATIONS,
                     (int64_t)in->act(in->act_user, m.B, m.device));
    if (m.device && in->act_host)
        add(p->host, DSC_PLAN_ACTIVATIONS, (int64_t)in->act_host(in->act_user, m.B, true));
    // the loader's token buffers (inputs, targets) for a step's micro-batches, and the process
    add(p->host, DSC_PLAN_RUNTIME, (int64_t)m.gas * m.B * in->seq_len * 8 +
        (in->host_runtime > 0 ? in->host_runtime : RUNTIME_ESTIMATE));
    if (m.device) add(p->device, DSC_PLAN_RUNTIME, DEVICE_RUNTIME);
    add(p->device, DSC_PLAN_WEIGHTS, frozen_device(&m, &L)); // LoRA's base, 16-bit
    for (int k = 0; k < DSC_PLAN_NCAT; k++) {
        p->host_bytes += p->host[k];
        p->device_bytes += p->device[k];
    }
    describe_mode(&m, p->mode, sizeof p->mode);
    p->fits = (p->host_avail < 0 || p->host_bytes <= p->host_avail) &&
              (!m.device || p->device_avail < 0 || p->device_bytes <= p->device_avail);
    return DSC_OK;
}

dsc_status dsc_memplan_compute(const dsc_memplan_input *in, dsc_memplan *out) {
    return plan_with(in, in ? in->config : NULL, out);
}

// ---- what would fit ----

static void fmt_gib(int64_t bytes, char *buf, size_t cap) {
    double gib = (double)bytes / (double)((int64_t)1 << 30);
    if (gib >= 10) snprintf(buf, cap, "%.1f GiB", gib);
    else if (gib >= 1) snprintf(buf, cap, "%.2f GiB", gib);
    else snprintf(buf, cap, "%.0f MiB", (double)bytes / (double)(1 << 20));
}

typedef struct advice {
    char text[1536];
    size_t len;
    int count;
} advice;

// Try one alternative config; when its plan fits, name it with its numbers.
static void try_alt(const dsc_memplan_input *in, const dsc_config *c, int world, const char *what,
                    advice *a) {
    dsc_memplan_input alt = *in;
    alt.world = world;
    dsc_memplan p;
    if (a->len >= sizeof a->text - 1 || plan_with(&alt, c, &p) != DSC_OK || !p.fits) return;
    char h[32], d[32];
    fmt_gib(p.host_bytes, h, sizeof h);
    fmt_gib(p.device_bytes, d, sizeof d);
    int n = snprintf(a->text + a->len, sizeof a->text - a->len, "%s%s (host %s%s%s per rank)",
                     a->count ? "; " : "", what, h, in->device ? ", device " : "",
                     in->device ? d : "");
    size_t room = sizeof a->text - a->len;
    if (n > 0) a->len += (size_t)n < room ? (size_t)n : room - 1; // truncated: the text is full
    a->count++;
}

static void set_dev(dsc_offload_config *o, const char *dev) {
    snprintf(o->device, sizeof o->device, "%s", dev);
}

// Parameter offload on one GPU streams its step at one micro-step without clipping or fp16
// (dsc__engine_grads_streamed): the host keeps no gradient accumulator. Tried after c (a config
// with offload_param) did not fit; with_what: how c differs from the run's config ("" none).
static void alt_streamed(const dsc_memplan_input *in, dsc_config c, const char *with_what,
                         advice *a) {
    if (strcmp(c.zero_optimization.offload_param.device, "cpu") ||
        dsc__engine_grads_streamed(&c, in->world, in->device))
        return; // not parameter offload, or streamed already
    c.gradient_clipping = 0;
    c.gradient_accumulation_steps = 1;
    c.train_batch_size = c.train_micro_batch_size_per_gpu;
    if (!dsc__engine_grads_streamed(&c, in->world, in->device)) return; // fp16, several ranks
    char what[400];
    snprintf(what, sizeof what, "%s%sgradient_clipping 0 and gradient_accumulation_steps 1 "
             "(train_batch_size %lld; the step streamed without a host gradient accumulator)",
             with_what, with_what[0] ? " with " : "", (long long)c.train_batch_size);
    try_alt(in, &c, 1, what, a);
}

static void alt_offload(const dsc_memplan_input *in, const dsc_config *base, advice *a) {
    dsc_config c = *base;
    bool offload = !strcmp(c.zero_optimization.offload_optimizer.device, "cpu");
    if (!in->device || in->world > 1) return; // the trainer offloads on one GPU only
    if (!offload) {
        set_dev(&c.zero_optimization.offload_optimizer, "cpu");
        if (c.zero_optimization.stage == 0) c.zero_optimization.stage = 2;
        try_alt(in, &c, in->world, c.zero_optimization.stage == base->zero_optimization.stage
                ? "zero_optimization.offload_optimizer.device \"cpu\""
                : "zero_optimization.stage 2 with offload_optimizer.device \"cpu\"", a);
    }
    if (strcmp(c.zero_optimization.offload_param.device, "cpu")) {
        c.zero_optimization.stage = 3;
        set_dev(&c.zero_optimization.offload_optimizer, "cpu");
        set_dev(&c.zero_optimization.offload_param, "cpu");
        const char *what = "zero_optimization.stage 3 with offload_param.device \"cpu\" and "
                           "offload_optimizer.device \"cpu\"";
        size_t before = a->len;
        try_alt(in, &c, in->world, what, a);
        if (a->len == before) alt_streamed(in, c, what, a);
    } else {
        alt_streamed(in, c, "", a); // the run's own parameter offload, streamed
    }
}

// One GPU with the optimizer on it: no host copy of master and moments (for a run that set
// DSC_DEVICE_STATE=0).
static void alt_device_state(const dsc_memplan_input *in, const dsc_config *base, advice *a) {
    mode m = mode_of(in, base);
    if (!m.no_host_grads || m.grads_streamed || m.no_host_state) return;
    dsc_memplan_input alt = *in;
    alt.device_state = true;
    try_alt(&alt, base, in->world, "DSC_DEVICE_STATE=1 in the environment (the GPU keeps master "
            "and moments, the host no copy)", a);
}

// bf16 training on the CPU or with the optimizer on one GPU: the bf16 weights as the master (and
// bf16 moments), DeepSpeed's keys.
static void alt_bf16_master(const dsc_memplan_input *in, const dsc_config *base, advice *a) {
    if (!base->bf16.enabled || base->bf16.bf16_optimizer_states) return;
    if (in->device && (in->world != 1 || mode_of(in, base).offload)) return;
    dsc_config c = *base;
    bool stage0 = c.zero_optimization.stage == 0;
    if (stage0) c.zero_optimization.stage = 1; // DeepSpeed allows the keys at ZeRO 1-3 only
    c.bf16.bf16_master_weights_and_grads = true;
    c.bf16.bf16_optimizer_states = true;
    try_alt(in, &c, in->world, stage0 ? "zero_optimization.stage 1 with "
            "bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states"
            : "bf16.bf16_master_weights_and_grads and bf16.bf16_optimizer_states", a);
}

// A checkpoint writer without its snapshot copy (saved in line from the training state), and
// then without the validation's re-read.
static void alt_ckpt(const dsc_memplan_input *in, const dsc_config *base, advice *a) {
    if (!in->checkpoints || (!base->checkpoint.async && !base->checkpoint.validate)) return;
    dsc_config c = *base;
    c.checkpoint.async = false;
    size_t before = a->len;
    if (base->checkpoint.async) try_alt(in, &c, in->world, "checkpoint.async false", a);
    if (a->len != before || !base->checkpoint.validate) return;
    c.checkpoint.validate = false;
    try_alt(in, &c, in->world, base->checkpoint.async ? "checkpoint.async false with "
            "checkpoint.validate false" : "checkpoint.validate false", a);
}

static void alt_batch(const dsc_memplan_input *in, const dsc_config *base, advice *a) {
    for (int64_t B = base->train_micro_batch_size_per_gpu / 2; B >= 1; B /= 2) {
        dsc_config c = *base;
        c.train_micro_batch_size_per_gpu = B;
        c.gradient_accumulation_steps = base->train_batch_size / (B * in->world);
        char what[160];
        snprintf(what, sizeof what, "train_micro_batch_size_per_gpu %lld with "
                 "gradient_accumulation_steps %lld", (long long)B,
                 (long long)c.gradient_accumulation_steps);
        size_t before = a->len;
        try_alt(in, &c, in->world, what, a);
        if (a->len != before) return; // the largest micro batch that fits
    }
}

// More ranks share the model states (ZeRO stages 1-3); on the GPU each brings its device, and
// the ranks of a node share its host memory: nodes like this one, each with node_gpus ranks (8
// when unknown, or this run's own ranks per node if more).
static void alt_ranks(const dsc_memplan_input *in, const dsc_config *base, advice *a) {
    if (!in->device || base->zero_optimization.stage == 0) return;
    int local = in->local_ranks > 0 ? in->local_ranks : in->world;
    int per_node = in->node_gpus > 0 ? in->node_gpus : 8;
    if (per_node < local) per_node = local;
    int64_t node_host = in->host_avail < 0 ? -1 : in->host_avail * local;
    for (int w = in->world * 2; w <= 64; w *= 2) {
        int lw = w < per_node ? w : per_node;
        char what[96];
        snprintf(what, sizeof what, "%d GPUs at ZeRO stage %lld (%d per node)", w,
                 (long long)base->zero_optimization.stage, lw);
        dsc_config c = *base;
        c.train_batch_size = c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * w;
        size_t before = a->len;
        dsc_memplan_input alt = *in;
        alt.nccl = true;
        alt.local_ranks = lw;
        alt.host_avail = node_host < 0 ? -1 : node_host / lw;
        try_alt(&alt, &c, w, what, a);
        if (a->len != before) return;
    }
}

static void alt_replicas(const dsc_memplan_input *in, const dsc_config *base, advice *a) {
    if (in->world < 2 || !base->fault_tolerance.replicate || base->zero_optimization.stage < 1)
        return;
    dsc_config c = *base;
    c.fault_tolerance.replicate = false;
    try_alt(in, &c, in->world, "fault_tolerance.replicate false", a);
}

dsc_status dsc_memplan_check(const dsc_memplan_input *in, const dsc_memplan *p) {
    if (p->fits) return DSC_OK;
    char need[32], have[32], dneed[32], dhave[32], what[256];
    fmt_gib(p->host_bytes, need, sizeof need);
    fmt_gib(p->host_avail, have, sizeof have);
    fmt_gib(p->device_bytes, dneed, sizeof dneed);
    fmt_gib(p->device_avail, dhave, sizeof dhave);
    bool host = p->host_avail >= 0 && p->host_bytes > p->host_avail;
    bool dev = in->device && p->device_avail >= 0 && p->device_bytes > p->device_avail;
    int n = 0;
    what[0] = '\0';
    if (host) n = snprintf(what, sizeof what, "needs %s of host memory per rank, %s available",
                           need, have);
    if (dev) snprintf(what + n, sizeof what - (size_t)n, "%sneeds %s of device memory, %s free",
                      host ? "; " : "", dneed, dhave);
    advice a = {.text = ""};
    alt_device_state(in, in->config, &a);
    alt_offload(in, in->config, &a);
    alt_bf16_master(in, in->config, &a);
    alt_ckpt(in, in->config, &a);
    alt_batch(in, in->config, &a);
    alt_replicas(in, in->config, &a);
    alt_ranks(in, in->config, &a);
    return dsc__fail(DSC_ERR_OOM, "memory plan (%s): the run %s; %s%s (nothing was allocated; "
                     "dsc config check FILE --model SPEC prints the plan by category)", p->mode,
                     what, a.count ? "settings that would fit: " : "no mode dsc has today fits "
                     "this machine: use one with more memory, or a smaller model",
                     a.count ? a.text : "");
}

// ---- printing ----

static void cats_line(const int64_t *cat, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int k = 0; k < DSC_PLAN_NCAT && len < cap; k++) {
        if (!cat[k]) continue;
        char v[32];
        fmt_gib(cat[k], v, sizeof v);
        int n = snprintf(buf + len, cap - len, "%s%s %s", len ? ", " : "", cat_names[k], v);
        if (n > 0) len += (size_t)n;
    }
}

void dsc_memplan_print(const dsc_memplan *p, void *out, const char *prefix) {
    FILE *f = out;
    char cats[512], total[32], avail[32];
    fmt_gib(p->host_bytes, total, sizeof total);
    fmt_gib(p->host_avail, avail, sizeof avail);
    cats_line(p->host, cats, sizeof cats);
    fprintf(f, "%smemory plan per rank (%s): host %s of %s available [%s]\n", prefix, p->mode,
            total, p->host_avail >= 0 ? avail : "(unknown)", cats);
    if (!p->device_bytes) return;
    fmt_gib(p->device_bytes, total, sizeof total);
    fmt_gib(p->device_avail, avail, sizeof avail);
    cats_line(p->device, cats, sizeof cats);
    fprintf(f, "%s  device %s of %s free [%s]\n", prefix, total,
            p->device_avail >= 0 ? avail : "(unknown)", cats);
}

static json_t *cats_json(const int64_t *cat) {
    json_t *o = json_object();
    for (int k = 0; k < DSC_PLAN_NCAT; k++)
        json_object_set_new(o, cat_names[k], json_integer(cat[k]));
    return o;
}

char *dsc_memplan_json(const dsc_memplan *p) {
    json_t *o = json_object();
    json_object_set_new(o, "device_bytes", json_integer(p->device_bytes));
    json_object_set_new(o, "host_bytes", json_integer(p->host_bytes));
    json_object_set_new(o, "device_available", p->device_avail >= 0 ?
                        json_integer(p->device_avail) : json_null());
    json_object_set_new(o, "host_available", p->host_avail >= 0 ? json_integer(p->host_avail) :
                        json_null());
    json_object_set_new(o, "fits", json_boolean(p->fits));
    json_object_set_new(o, "mode", json_string(p->mode));
    json_object_set_new(o, "parameters", json_integer(p->params));
    json_object_set_new(o, "device", cats_json(p->device));
    json_object_set_new(o, "host", cats_json(p->host));
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_INDENT(2));
    json_decref(o);
    return s;
}

// ---- the machine ----

// The first number of a file (a cgroup's limit or usage); -1 when absent or "max".
static int64_t file_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1) v = -1;
    fclose(f);
    return v;
}

static int64_t meminfo_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return -1;
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(f);
    return kb < 0 ? -1 : (int64_t)kb * 1024;
}

// "64G", "512M", "1073741824": bytes (binary suffixes K, M, G, T); -1 when not a size.
static int64_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) return -1;
    int shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: break;
    }
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    return *end ? -1 : (int64_t)(v * (double)((int64_t)1 << shift));
}

static void take_min(int64_t v, const char *what, int64_t *best, char *src, size_t cap) {
    if (v < 0 || (*best >= 0 && v >= *best)) return;
    *best = v;
    if (src) snprintf(src, cap, "%s", what);
}

int64_t dsc_host_mem_available(char *src, size_t cap) {
    int64_t best = -1;
    if (src && cap) src[0] = '\0';
    take_min(meminfo_available(), "MemAvailable", &best, src, cap);
    int64_t max2 = file_number("/sys/fs/cgroup/memory.max");
    if (max2 > 0) {
        int64_t used = file_number("/sys/fs/cgroup/memory.current");
        take_min(max2 - (used > 0 ? used : 0), "cgroup memory.max", &best, src, cap);
    }
    int64_t max1 = file_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (max1 > 0 && max1 < ((int64_t)1 << 60)) {
        int64_t used = file_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
        take_min(max1 - (used > 0 ? used : 0), "cgroup memory.limit_in_bytes", &best, src, cap);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        take_min((int64_t)rl.rlim_cur, "ulimit -v", &best, src, cap);
    const char *cap_env = dsc__env(DSC_ENV_HOST_MEM_LIMIT);
    if (cap_env && cap_env[0]) take_min(parse_size(cap_env), "DSC_HOST_MEM_LIMIT", &best, src, cap);
    return best;
}
