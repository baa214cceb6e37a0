// engine/engine_impl.h - the engine's state, shared by engine.c and zero/zero.c.
#ifndef DSC_ENGINE_IMPL_H
#define DSC_ENGINE_IMPL_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/comm.h"                 // dsc_comm
#include "dsc/engine.h"               // dsc_engine
#include "dsc/memory.h"               // dsc_mem_pool, dsc_mem_handle
#include "engine/device.h"            // dsc__state_source
#include "engine/optim/loss_scaler.h" // dsc_loss_scaler
#include "engine/optim/lr_schedule.h" // dsc_sched_params
#include "engine/optim/optim.h"       // dsc_opt_hparams

#define DSC_ALIGN_ELEMS 16 // every tensor and slice starts on 64 bytes and spans whole vectors

typedef enum precision { PREC_FP32, PREC_FP16, PREC_BF16 } precision;

typedef struct param {
    char name[DSC_PARAM_NAME_MAX];
    int ndim;
    int64_t shape[DSC_PARAM_MAX_DIMS];
    int64_t numel;
    int group;
    size_t off; // element offset in the full flat layout
} param;

// A layer group is a contiguous range of the flat layout, padded to a multiple of
// world * DSC_ALIGN_ELEMS and split into `world` equal slices: rank r owns slice r. ZeRO stages
// partition per group, so gathering a group (stage 3) and reducing its gradients (stage 2) are
// single all-gather / reduce-scatter calls of equal counts.
typedef struct group {
    size_t off;      // offset of the group in the full layout
    size_t padded;   // elements of the group incl. padding
    size_t slice;    // padded / world
    size_t part_off; // offset of this rank's slice in the partition buffers
    bool persistent; // stage 3: small groups stay gathered (stage3_param_persistence_threshold)
    // The buffers below are blocks of the engine's pool (handles hp, hg, hr, h16; 0 = none); the
    // pointers are their addresses, re-read by dsc__engine_resolve after blocks moved.
    float *pbuf;     // stage 3: gathered parameters (padded), or NULL
    float *gbuf;     // stages 2-3: this micro-step's gradients (padded), or NULL
    float *rbuf;     // stages 2-3: reduce-scatter result (slice), or NULL
    uint16_t *stage16; // communication_data_type fp16/bf16 staging, or NULL
    dsc_mem_handle hp, hg, hr, h16;
    dsc_comm_req *preq, *greq; // gather / reduction in flight
} group;

// A layer group's frozen tensors when they are partitioned (dsc_engine.frozen_parted): laid out
// as a group's trainable tensors are, in their own flat layout (off, padded, slice, part_off as
// above), gathered into buf (handle h) between dsc_gather and dsc_release.
typedef struct fgroup {
    size_t off, padded, slice, part_off;
    bool persistent; // small: stays gathered (stage3_param_persistence_threshold)
    float *buf;
    dsc_mem_handle h;
    dsc_comm_req *req;
} fgroup;

struct dsc_engine {
    dsc_config cfg;
    int rank, world, stage;
    dsc_comm *comm; // NULL on one rank
    int nparams, ngroups;
    param *params; // the trainable tensors: every buffer below is theirs
    // Frozen tensors (dsc_param_desc.frozen, LoRA's base): fp32 values only (rounded once to the
    // training type), never in checkpoints or the optimizer (zero/frozen.c). Whole on every rank
    // in fdata (h_frozen), except at ZeRO stage 3 on several ranks with a host compute copy
    // (frozen_parted): rank r then keeps slice r of every group's frozen layout in fpart, the
    // fault-tolerance ring's buddy a replica of it in frep, and fdata is only the initialiser's
    // staging until dsc_params_updated.
    int npub;      // tensors the caller registered, trainable and frozen
    int *pub;      // (npub) the caller's index -> trainable index, or -1 - frozen index
    int *pub_of;   // (nparams) trainable index -> the caller's index
    int nfrozen;
    param *frozen; // (nfrozen) off: offset in the frozen layout (fdata)
    size_t frozen_total, frozen_part;
    float *fdata, *fpart, *frep;
    dsc_mem_handle h_frozen, h_fpart, h_frep;
    bool frozen_parted;
    fgroup *fgroups; // (ngroups) with frozen tensors
    group *groups;
    int64_t numel;    // parameter elements (no padding)
    size_t total;     // full layout length incl. padding
    size_t part;      // partition length (sum of slices)
    precision prec;
    bool no_compute_copy; // dsc_engine_opts.no_compute_copy: no `work` / `work_part` buffer
    bool no_grads; // one GPU (dsc__engine_keeps_no_grads): no gfull, acc
    // dsc_engine_opts.device_state took effect (dsc__engine_keeps_no_state): no master, moments
    // or compute copy on the host; src (set by the device trainer) reads and writes them there.
    bool dev_state;
    dsc__state_source src;
    int nmoments; // 2 (Adam, AdamW), 1 (SGD momentum, Lion): the moments kept, wherever they are
    dsc_dtype comm_dt; // communication_data_type
    // bf16.bf16_master_weights_and_grads (ZeRO 1-3, bf16 training): the master is the bf16
    // compute copy itself (no separate fp32 master) and gradients are rounded to bf16 before the
    // step; bf16.bf16_optimizer_states: the moments are rounded to bf16 after every step.
    bool master_bf16, states_bf16;
    bool bf16_sr; // bf16_master_rounding "stochastic" (with master_bf16)
    // buffers (see zero.c for which stage has which): blocks of `pool`, named by the handles
    // h_*; the pointers are their current addresses (dsc__engine_resolve). Buffers that alias
    // (work == master in fp32 stage 0, ...) share one handle.
    dsc_mem_pool *pool;
    bool own_pool;     // created by the engine (else the caller's, borrowed)
    uint64_t mem_gen;  // dsc_mem_generation(pool) when the pointers were last resolved
    bool in_step;      // from a step's first dsc_gather / dsc_backward_begin to its boundary
    bool may_move;     // inside dsc_engine_create, dsc_engine_maintain, dsc_engine_recover:
                       // an allocation that does not fit may compact the pool
    bool params_ready; // dsc_params_updated ran: dsc_param_master's staging is gone
    size_t max_transient; // largest block a step asks for (gathers, gradients), bytes
    dsc_mem_handle h_master, h_work, h_work_part, h_gfull, h_acc, h_m, h_v, h_init;
    float *master;    // fp32 master: full (stage 0) or partition (stages 1-3)
    float *work;      // full compute copy (stages 0-2); == master in fp32 stage 0
    float *work_part; // stage 3: rounded partition the gathers read (== master in fp32)
    float *gfull;     // stages 0-1: gradients of the current micro-step (full)
    float *acc;       // accumulated reduced gradients: full (0-1) or partition (2-3)
    float *m, *v;     // optimizer state, like master
    float *init;      // full fp32 staging for initial weights (an alias: dsc__engine_init_alias)
    float **pdata, **pgrad; // per-parameter pointers as the model sees them now
    bool backward;    // between dsc_backward_begin and dsc_step
    // optimizer and schedule
    dsc_opt_hparams hp;
    double base_lr; // optimizer.params.lr as the config gives it (double, as DeepSpeed keeps it)
    dsc_sched_params sched;
    bool has_sched;
    dsc_loss_scaler scaler;
    int64_t micro, global_steps, applied_steps, skipped_steps;
    unsigned char *gathered; // (ngroups) gather/release balance
    const char *inject;      // DSC_INJECT_OVERFLOW (tests)
    dsc_grad_observer observer;
    void *observer_user;
    double observer_inv_scale;
    size_t bytes_buffers, bytes_buffers_peak;      // transient group buffers (model states:
                                                   // the pool's accounting per tag)
    uint64_t comm_bytes_sent;                      // payload handed to collectives
    struct dsc__ft *ft; // fault tolerance (engine/ft/ft.h); NULL on one rank
    // The device trainer's step that dsc_step runs (dsc__engine_attach_device), or NULL.
    dsc_status (*device_step)(void *user, dsc_step_info *info);
    void *device_user;
};

// The caller's tensor i: trainable params[pub[i]], or frozen frozen[-1 - pub[i]] (LoRA's base).
static inline const param *dsc__engine_tensor(const dsc_engine *e, int i) {
    return e->pub[i] >= 0 ? &e->params[e->pub[i]] : &e->frozen[-1 - e->pub[i]];
}
// The frozen tensor i is, or NULL (a trainable one, or i out of range).
static inline const param *dsc__engine_frozen_of(const dsc_engine *e, int i) {
    return i >= 0 && i < e->npub && e->pub[i] < 0 ? dsc__engine_tensor(e, i) : NULL;
}

// engine.c: is global step `step` listed in DSC_INJECT_OVERFLOW ("3,7,10-12")? (tests)
bool dsc__inject_overflow(const char *spec, int64_t step);
// device.c: the decisions of an applied optimizer step (dsc_step and the device path share them):
// scaler update, clipping, this step's lr/betas; grad_scale = 1 / (loss scale * clip).
dsc_status dsc__step_plan(dsc_engine *e, double sumsq, dsc_opt_hparams *hp, float *grad_scale,
                          double *lr, double *norm);
// device.c: every decision of a step boundary, host and device alike, after global_steps counted
// the step. sumsq and nonfinite: the gradients' (divided by the loss scale). inf/NaN (or
// DSC_INJECT_OVERFLOW's step) in fp16 training skips the step: the scaler backs off, info says
// skipped, *apply false; elsewhere it is warned about once and the step is planned as
// dsc__step_plan says (info's lr and grad_norm filled, *apply true). An error: *apply false.
dsc_status dsc__step_decide(dsc_engine *e, double sumsq, bool nonfinite, dsc_step_info *info,
                            dsc_opt_hparams *hp, float *grad_scale, bool *apply);
// engine_mem.c: the engine's pool
// Creates the engine's pool (or adopts opts->pool).
dsc_status dsc__engine_pool_init(dsc_engine *e, dsc_mem_pool *given);
// Without an engine (exports): the optimizer's hyper-parameters, the schedule and the learning
// rate of applied step `step` (1-based) that an engine built from c would use.
dsc_status dsc__config_optimizer_at(const dsc_config *c, int64_t step, dsc_opt_hparams *hp,
                                    double *lr, dsc_sched_params *sched, bool *has_sched);
// A zeroed block of n floats tagged `tag`; *ptr its address. Where blocks may move (may_move),
// an allocation that does not fit compacts the pool once and retries (re-reading every address);
// elsewhere it fails at once. The error names the request and the pool's largest users.
dsc_status dsc__engine_alloc(dsc_engine *e, size_t n, const char *tag, dsc_mem_handle *h,
                             float **ptr);
// The same, `bytes` bytes, contents undefined (large buffers that are written before being read).
dsc_status dsc__engine_alloc_raw(dsc_engine *e, size_t bytes, const char *tag,
                                 dsc_mem_handle *h, void **ptr);
// Frees h (0: nothing) and clears it; the caller clears its pointer.
void dsc__engine_free(dsc_engine *e, dsc_mem_handle *h);
// Re-reads every address from its handle (after blocks moved); cheap when nothing moved.
void dsc__engine_resolve(dsc_engine *e);

// zero/zero.c
dsc_status dsc__zero_layout(dsc_engine *e);   // offsets, groups, partitions
// Group g's tensors of ps (n) placed one after the other from base, each on whole vectors (their
// off set); returns the elements they span and *numel their elements.
size_t dsc__zero_place(param *ps, int n, int g, size_t base, int64_t *numel);
dsc_status dsc__zero_alloc(dsc_engine *e);    // persistent buffers for the stage
void dsc__zero_free(dsc_engine *e);
float *dsc__zero_master_slice(dsc_engine *e, int g); // this rank's fp32 master of group g
void dsc__zero_repoint(dsc_engine *e); // per-parameter pointers of every group, from the buffers
dsc_status dsc__zero_gather(dsc_engine *e, int g);
dsc_status dsc__zero_release(dsc_engine *e, int g);
dsc_status dsc__zero_grads_ready(dsc_engine *e, int g);
dsc_status dsc__zero_finish_micro(dsc_engine *e);      // wait for reductions, accumulate
dsc_status dsc__zero_norm(dsc_engine *e, double inv_scale, double *sumsq, bool *nonfinite);
void dsc__zero_round_fp16(dsc_engine *e);
// bf16 master weights and gradients: the accumulated gradients take bf16 values.
void dsc__zero_round_bf16_grads(dsc_engine *e);
// x (n) rounded in place to the training type's values (the compute copy's rounding).
void dsc__zero_round_compute(const dsc_engine *e, float *x, size_t n);
dsc_status dsc__zero_optimizer(dsc_engine *e, const dsc_opt_hparams *hp, int64_t step,
                               float grad_scale);
void dsc__zero_zero_acc(dsc_engine *e);
// Where the initialiser writes in place when the master (or the compute buffer holding it)
// spans the whole layout: stage 0, fp32 at stages 1-2, and every stage on one rank; else NULL
// (a staging copy is needed).
float *dsc__engine_init_alias(dsc_engine *e);
// The state on the device (dev_state): n fp32 values of kind (0 master, 1 + k moment k) at flat
// offset off, read into buf or written from it through the registered source; an error naming
// the call order when no device trainer registered one yet.
dsc_status dsc__engine_state_io(dsc_engine *e, int kind, size_t off, size_t n, float *buf,
                                bool write);
dsc_status dsc__zero_full_grad(dsc_engine *e, int i, float *out, double inv_scale);
dsc_status dsc__zero_sync_params(dsc_engine *e); // master -> compute copies (rounded, gathered)
// Forget the step in progress: wait for (failed) requests, drop gathered groups and micro-step
// gradients, zero the accumulators, micro-step 0. The master and optimizer state stay.
void dsc__zero_abandon_step(dsc_engine *e);
// Free every buffer and the group table and clear their pointers, so that dsc__zero_layout and
// dsc__zero_alloc can lay the engine out again (another world size after a failure). Requests in
// flight must have been waited.
void dsc__zero_reset(dsc_engine *e);
// Transient blocks and the all-gather the stages share with zero/frozen.c.
dsc_status dsc__zero_take(dsc_engine *e, size_t n, dsc_mem_handle *h, float **p);
void dsc__zero_give(dsc_engine *e, dsc_mem_handle *h, size_t n);
dsc_status dsc__zero_all_gather(dsc_engine *e, const float *send, float *recv, size_t count,
                                dsc_comm_req **req);

// zero/frozen.c: the frozen tensors' layout (from the world; every recovery's re-layout too),
// buffers, gathers and values (see the fields above).
dsc_status dsc__frozen_layout(dsc_engine *e);
// staging: the caller initialises whole tensors (dsc_param_master) rather than dsc_params_init.
dsc_status dsc__frozen_alloc(dsc_engine *e, bool staging);
void dsc__frozen_free(dsc_engine *e);
void dsc__frozen_resolve(dsc_engine *e);
// Where the model reads frozen tensor f now: NULL while its group is not gathered (partitioned)
// or when the device keeps it.
float *dsc__frozen_data(const dsc_engine *e, const param *f);
// dsc_params_init's part: this rank's values of every frozen tensor, through fill.
dsc_status dsc__frozen_fill(dsc_engine *e, dsc_param_fill_fn fill, void *user);
// Once, in dsc_params_updated: rounded to the training type; the staging kept as this rank's
// slices (then freed); the persistent groups gathered; the buddy's replica sent.
dsc_status dsc__frozen_ready(dsc_engine *e);
dsc_status dsc__frozen_gather(dsc_engine *e, int g); // with dsc__zero_gather (stage 3)
dsc_status dsc__frozen_release(dsc_engine *e, int g);
void dsc__frozen_abandon(dsc_engine *e); // with dsc__zero_abandon_step
// Frozen tensor f whole into out (collective when partitioned: every rank calls it).
dsc_status dsc__frozen_full(dsc_engine *e, const param *f, float *out);
// Fault tolerance, partitioned only: send this rank's slices to the ring's buddy (rank + 1) and
// keep rank - 1's (collective; after the values are set and after every re-layout).
dsc_status dsc__frozen_replicate(dsc_engine *e);

// The full fp32 master, every group in the full layout (len e->total), into out; one all-gather
// per group at stages 1-3.
dsc_status dsc__zero_gather_master(dsc_engine *e, float *out);
// The fp32 master of parameter i, whole (all-gathers its group at stages 1-3).
dsc_status dsc__zero_full_master(dsc_engine *e, int i, float *out);

#endif
