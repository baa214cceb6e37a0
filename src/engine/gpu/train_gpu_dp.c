// engine/gpu/train_gpu_dp.c - data parallelism across GPUs through the nccl backend (see
// train_gpu_dp.h).
#include "engine/gpu/train_gpu_dp.h"

#include <stdlib.h> // getenv
#include <string.h> // strcmp

#include "base/env.h" // dsc__env, DSC_ENV_*

bool dsc__train_dp_selected(void) {
    const char *b = dsc__env(DSC_ENV_COMM_BACKEND);
    return b && !strcmp(b, "nccl");
}

#ifdef DSC_WITH_CUDA

#include <stdio.h>  // snprintf, fopen
#include <time.h>   // nanosleep
#include <unistd.h> // gethostname

#include "base/hash.h"              // dsc_hash64
#include "base/log.h"               // DSC_WARN
#include "base/status.h"            // dsc__fail, DSC_TRY
#include "base/time.h"              // dsc_now
#include "comm/store.h"             // dsc_store_* (the rendezvous after a recovery)
#include "engine/gpu/layer_slots.h" // dsc__slots_* (stage 3)
#include "comm/nccl.h"              // dsc__nccl_after_event, dsc__nccl_record_event
#include "cuda/convert.h"           // dsc__cuda_to16, _from16, _scale, events, copies
#include "cuda/kernels.h"           // dsc__cuda_round_fp16
#include "cuda/devbuf.h"            // dsc__cuda_buf_*
#include "engine/gpu/train_state.h" // dsc__cuda_state_*
#include "dsc/comm.h"               // dsc_comm_*
#include "engine/device.h"          // dsc__engine_dp_layout, dsc__engine_device_step
#include "engine/hybrid.h"          // dsc__engine_comm

enum { BUF_GSHARD, BUF_SEND16, BUF_RECV16, BUF_NORM, BUF_OWN16, NBUFS };

struct train_dp {
    dsc_engine *eng;
    dsc_comm *nccl;
    dsc__engine_dp L;      // layout (pointers refreshed before each use)
    dsc_cuda_state *st;
    dsc_cuda_buf bufs[NBUFS];
    float *red;            // the reduced gradients: st->grad (total) at stage 0, else the
                           // partition (state_len)
    uint16_t *send16;      // (total) 16-bit staging of the reduction, or NULL (fp32)
    uint16_t *recv16;      // (state_len) stages 1-3: the 16-bit reduce-scatter result
    float *norm;           // (4 + 4 world) this rank's (sum, flag) doubles, then every rank's
    float *hfull, *hpart;  // host: the whole fp32 weights (total), this rank's master (state_len)
    dsc_comm_req **reqs;   // (ngroups) one per group in flight
    void **ready;          // (ngroups) cudaEvent_t: group g staged for its collective on the
                           // compute stream (recorded every step; created once)
    bool *begun;           // (ngroups) group g's reduction was started at this step
    bool timed;
    // Stage 3 (shard): the layers' 16-bit weights are partitioned as the optimizer state is.
    // This rank keeps its slice of each layer group (own16); a layer is all-gathered into one of
    // two device slots one layer ahead of use (engine/gpu/layer_slots.h), in forward and again in
    // backward. The layers' gradients go through two gradient slots: reduce-scattered in place
    // every micro-step, then added into the partition (red). The embeddings and ln_f stay whole
    // on every device (resident) and are reduced once per step, as at stage 2.
    bool shard;
    dsc__slots sl;
    uint16_t *own16;   // (state_len) this rank's slices of the 16-bit weights (layer groups)
    // LoRA's frozen base (dsc__train_dp_frozen): the state's frozen array holds the end groups'
    // and two slots (fdn elements, dsc__slots_frozen), then this rank's slice of each layer's
    // frozen range at fdn + fown[g] (fslice[g] elements); fown NULL: the base is whole.
    size_t fdn, *fown, *fslice;
    float *hdev;       // host: the device layout's fp32 weights, for a load
    void *wfree[2];    // cudaEvent_t, compute stream: weight slot k's readers are enqueued
    void *wready[2];   // communicator's stream: weight slot k's gather is done
    void *gdone[2];    // communicator's stream: gradient slot j's reduce-scatter is done
    int gpend[2];      // the group whose reduce-scatter in gradient slot j is not yet added
                       // into red (-1: none)
    dsc_comm_req **mreqs; // the gathers and reduce-scatters of the pass running
    int nm, mcap;
    int gen; // recoveries so far (the communicator's tag after one)
    // Fault tolerance (engine/device.h): after each step's optimizer the device copies this
    // rank's packed state into the engine's snapshot slot on a stream of its own, overlapping the
    // next step's compute; the slots are page-locked buffers of ours (snap) when that memory was
    // granted.
    void *copy_stream;          // cudaStream_t; NULL: no fault tolerance
    void *opt_done, *copy_done; // cudaEvent_t: the optimizer is enqueued before; the copy done
    bool snap_pending;          // a copy was started and its snapshot not yet published
    float *snap[2];             // page-locked own snapshot slots, or NULL
    bool snap_shared;           // snap are the engine's shared slots (pinned here, not ours)
};

// ---- choosing ----

// Host and physical GPU of `device`, as one number. The host is NCCL's: NCCL_HOSTID when set
// (NCCL then treats ranks with different ids as different hosts, even on one GPU: the tests
// run several nccl ranks on one device that way, over its socket transport), else the host name
// and boot id.
static uint64_t device_key(int device, char *pci, size_t cap) {
    char buf[512] = "";
    const char *hostid = getenv("NCCL_HOSTID");
    size_t n;
    if (hostid && *hostid) {
        snprintf(buf, 256, "hostid:%s", hostid);
        n = strlen(buf);
    } else {
        gethostname(buf, 255);
        buf[255] = '\0';
        n = strlen(buf);
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        if (f) {
            if (fgets(buf + n, 64, f)) n = strlen(buf);
            fclose(f);
        }
    }
    if (dsc__cuda_device_pci(device, pci, cap) != DSC_OK) {
        dsc_clear_error();
        snprintf(pci, cap, "cuda:%d", device);
    }
    snprintf(buf + n, sizeof buf - n, "|%s", pci);
    return dsc_hash64(buf, strlen(buf));
}

dsc_status dsc__train_dp_wanted(dsc_engine *eng, int device, bool *use, char *why, size_t cap) {
    *use = false;
    why[0] = '\0';
    if (!dsc__train_dp_selected()) return DSC_OK;
    dsc_comm *c = dsc__engine_comm(eng);
    int world = dsc_engine_world_size(eng);
    if (!c || world == 1) {
        *use = true;
        return DSC_OK;
    }
    char pci[64];
    uint64_t key = device_key(device, pci, sizeof pci);
    uint64_t *keys = calloc((size_t)world, sizeof *keys);
    if (!keys) return dsc__fail(DSC_ERR_OOM, "out of memory");
    dsc_status st = dsc_comm_all_gather(c, &key, keys, 2, DSC_DT_F32, NULL); // 8 bytes each
    int a = -1, b = -1;
    for (int i = 0; st == DSC_OK && a < 0 && i < world; i++)
        for (int j = i + 1; j < world; j++)
            if (keys[i] == keys[j]) {
                a = i;
                b = j;
                break;
            }
    free(keys);
    DSC_TRY(st);
    *use = a < 0;
    if (a >= 0)
        snprintf(why, cap, "DSC_COMM_BACKEND=nccl, but ranks %d and %d share one GPU (NCCL "
                 "needs a GPU per rank): host-staged instead", a, b);
    return DSC_OK;
}

// ---- create / destroy ----

// The nccl communicator of the engine's rank and world: at the start through the job's
// rendezvous (MASTER_ADDR / MASTER_PORT), after a recovery through `store` (tag "gpu-dp<gen>").
static dsc_status make_comm(train_dp *dp, dsc_store *store, const char *tag) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.backend = "nccl";
    o.rank = dsc_engine_rank(dp->eng);
    o.world_size = dsc_engine_world_size(dp->eng);
    o.timeout_s = dsc_engine_config(dp->eng)->fault_tolerance.comm_timeout_s;
    o.group_tag = tag;
    o.store = store;
    DSC_TRY(dsc__cuda_current_device(&o.device)); // the trainer's (LOCAL_RANK % devices)
    dsc_status st = dsc_comm_create(&dp->nccl, &o);
    if (st != DSC_OK)
        dsc__error_prefix("--device cuda with DSC_COMM_BACKEND=nccl: ");
    return st;
}

static dsc_status buf(train_dp *dp, dsc_mem_pool *pool, int k, size_t bytes, const char *tag,
                      void **view) {
    DSC_TRY(dsc__cuda_buf_alloc(&dp->bufs[k], pool, bytes, tag));
    *view = dp->bufs[k].ptr;
    return DSC_OK;
}

static const dsc__slots_ops slot_ops; // stage 3, below
static dsc_status wait_all(train_dp *dp, dsc_comm_req **reqs, int n); // the step, below
static dsc_status snap_init(train_dp *dp);              // snapshots, below

// Stage 3's own buffers: the weight partition, the slots' events, the pass's requests.
static dsc_status shard_init(train_dp *dp, dsc_mem_pool *pool, const dsc_model *model) {
    const dsc__engine_dp *L = &dp->L;
    DSC_TRY(dsc__slots_init(&dp->sl, dp->eng, model, dp->st->p16, dp->st->grad, dp->st->n,
                            &slot_ops, dp));
    DSC_TRY(buf(dp, pool, BUF_OWN16, L->state_len * 2, "gpu.weight_partition",
                (void **)&dp->own16));
    dp->mcap = 5 * dsc_model_describe(model)->n_layer + 8; // a pass issues at most 4 per layer
    dp->mreqs = calloc((size_t)dp->mcap, sizeof *dp->mreqs);
    dp->hdev = calloc(dp->st->n, sizeof *dp->hdev);
    if (!dp->mreqs || !dp->hdev) return dsc__fail(DSC_ERR_OOM, "out of memory");
    for (int k = 0; k < 2; k++) {
        DSC_TRY(dsc__cuda_event_create(&dp->wfree[k]));
        DSC_TRY(dsc__cuda_event_create(&dp->wready[k]));
        DSC_TRY(dsc__cuda_event_create(&dp->gdone[k]));
    }
    return DSC_OK;
}

// Stage 3 partitions the 16-bit weights unless DSC_GPU_STAGE3_PARTITION=0, which keeps them whole
// on every GPU (stage 3 then runs as stage 2: faster where the memory allows it).
static dsc_status partition_wanted(int stage, bool *on) {
    const char *v = dsc__env(DSC_ENV_GPU_STAGE3_PARTITION);
    *on = stage == 3;
    if (!v || !*v || !strcmp(v, "1")) return DSC_OK;
    *on = false;
    if (strcmp(v, "0"))
        return dsc__fail(DSC_ERR_INVALID_ARG, "DSC_GPU_STAGE3_PARTITION=%s: expected 1 (partition "
                         "the 16-bit weights at ZeRO stage 3) or 0", v);
    return DSC_OK;
}

static dsc_status make_buffers(train_dp *dp, dsc_mem_pool *pool, const dsc_model *model) {
    const dsc__engine_dp *L = &dp->L;
    size_t ns = L->state_len;
    int moments = L->v ? 2 : 1;
    DSC_TRY(partition_wanted(L->stage, &dp->shard));
    // stage 3: the device arrays hold the resident groups and the slots (engine/gpu/layer_slots.h)
    size_t n = dp->shard ? dsc__slots_layout(dp->eng, dsc_model_describe(model)->n_layer, NULL, NULL) : L->total;
    if (dp->st)
        DSC_TRY(dsc__cuda_state_resize_dp(dp->st, n, ns, moments)); // after a recovery
    else
        DSC_TRY(dsc__cuda_state_create_dp(&dp->st, n, ns, moments, pool));
    dp->red = dp->st->grad;
    if (L->stage > 0)
        DSC_TRY(buf(dp, pool, BUF_GSHARD, ns * 4, "gpu.grad_partition", (void **)&dp->red));
    if (L->comm_dt != DSC_DT_F32) {
        DSC_TRY(buf(dp, pool, BUF_SEND16, n * 2, "gpu.comm_stage16", (void **)&dp->send16));
        if (L->stage > 0)
            DSC_TRY(buf(dp, pool, BUF_RECV16, ns * 2, "gpu.comm_stage16", (void **)&dp->recv16));
    }
    size_t norm_bytes = (4 + 4 * (size_t)L->world) * sizeof(float);
    DSC_TRY(buf(dp, pool, BUF_NORM, norm_bytes, "gpu.norm", (void **)&dp->norm));
    dp->hfull = malloc(L->total * sizeof *dp->hfull);
    dp->hpart = malloc((ns ? ns : 1) * sizeof *dp->hpart);
    dp->reqs = calloc((size_t)L->ngroups, sizeof *dp->reqs);
    dp->ready = calloc((size_t)L->ngroups, sizeof *dp->ready);
    dp->begun = calloc((size_t)L->ngroups, sizeof *dp->begun);
    if (!dp->hfull || !dp->hpart || !dp->reqs || !dp->ready || !dp->begun)
        return dsc__fail(DSC_ERR_OOM, "out of memory for the host copies of %zu parameters",
                         L->total);
    for (int g = 0; g < L->ngroups; g++) DSC_TRY(dsc__cuda_event_create(&dp->ready[g]));
    return dp->shard ? shard_init(dp, pool, model) : DSC_OK;
}

dsc_status dsc__train_dp_create(train_dp **out, dsc_engine *eng, const dsc_model *model,
                                dsc_mem_pool *pool, bool timed, dsc_cuda_state **st) {
    *out = NULL;
    train_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return dsc__fail(DSC_ERR_OOM, "out of memory");
    dp->eng = eng;
    dp->timed = timed;
    dp->gpend[0] = dp->gpend[1] = -1;
    dsc_status s = dsc__engine_dp_layout(eng, &dp->L);
    if (s == DSC_OK) s = make_comm(dp, NULL, "gpu-dp");
    if (s == DSC_OK) s = make_buffers(dp, pool, model);
    if (s == DSC_OK) s = snap_init(dp);
    if (s != DSC_OK) {
        dsc__train_dp_destroy(dp);
        return s;
    }
    *st = dp->st;
    *out = dp;
    return DSC_OK;
}

// Everything but the device state (whose stream the model borrowed) and the engine.
static void release(train_dp *dp) {
    dsc_comm_destroy(dp->nccl); // ends and frees requests still in reqs and mreqs
    dp->nccl = NULL;
    for (int k = 0; k < 2; k++) {
        dsc__cuda_event_destroy(dp->wfree[k]);
        dsc__cuda_event_destroy(dp->wready[k]);
        dsc__cuda_event_destroy(dp->gdone[k]);
        dp->wfree[k] = dp->wready[k] = dp->gdone[k] = NULL;
    }
    dsc__slots_free(&dp->sl);
    memset(&dp->sl, 0, sizeof dp->sl);
    free(dp->fown);
    free(dp->fslice);
    dp->fown = dp->fslice = NULL;
    dp->fdn = 0;
    free(dp->mreqs);
    free(dp->hdev);
    for (int k = 0; k < NBUFS; k++) dsc__cuda_buf_free(&dp->bufs[k]);
    for (int g = 0; dp->ready && g < dp->L.ngroups; g++) dsc__cuda_event_destroy(dp->ready[g]);
    free(dp->hfull);
    free(dp->hpart);
    free(dp->reqs);
    free(dp->ready);
    free(dp->begun);
    dp->mreqs = dp->reqs = NULL;
    dp->hdev = dp->hfull = dp->hpart = NULL;
    dp->ready = NULL;
    dp->begun = NULL;
    dp->send16 = dp->recv16 = dp->own16 = NULL;
    dp->nm = dp->mcap = 0;
    dp->gpend[0] = dp->gpend[1] = -1;
}

// ---- snapshots for fault tolerance ----

// The copy in flight ends; the engine's own slots go back into its pool (at the end of the run:
// are dropped); our buffers are freed.
static void snap_release(train_dp *dp, bool end) {
    if (dp->copy_stream) (void)dsc__cuda_stream_wait(dp->copy_stream);
    dp->snap_pending = false;
    if (dp->snap_shared) { // the engine's: unlocked before it lets them go
        for (int k = 0; k < 2; k++) {
            dsc__cuda_host_unpin(dp->snap[k]);
            dp->snap[k] = NULL;
        }
        dp->snap_shared = false;
        return;
    }
    if (dp->snap[0] && end)
        dsc__engine_ft_own_drop(dp->eng);
    else if (dp->snap[0] && dsc__engine_ft_own_external(dp->eng, NULL) != DSC_OK) {
        DSC_WARN("ft", "%s", dsc_last_error()); // the slots stay ours: keep the buffers
        dsc_clear_error();
        return;
    }
    for (int k = 0; k < 2; k++) {
        dsc__cuda_host_free(dp->snap[k]);
        dp->snap[k] = NULL;
    }
}

// For the engine's layout as it is now: the copy stream and its events once, and two page-locked
// slots (without them the copies go to the pool's pageable slots: the same, slower).
static dsc_status snap_init(train_dp *dp) {
    size_t n = dsc__engine_ft_floats(dp->eng);
    if (!n) return DSC_OK;
    if (!dp->copy_stream) {
        DSC_TRY(dsc__cuda_stream_create(&dp->copy_stream));
        DSC_TRY(dsc__cuda_event_create(&dp->opt_done));
        DSC_TRY(dsc__cuda_event_create(&dp->copy_done));
    }
    char why[160] = "";
    float *shared[2];
    if (dsc__engine_ft_own_shared(dp->eng, shared)) { // one node: the slots the buddy reads
        bool ok = dsc__cuda_host_pin(shared[0], n * sizeof(float), why, sizeof why);
        if (ok && !dsc__cuda_host_pin(shared[1], n * sizeof(float), why, sizeof why)) {
            dsc__cuda_host_unpin(shared[0]);
            ok = false;
        }
        if (!ok) {
            DSC_WARN("ft", "the state snapshots could not be page-locked, so copying them from "
                     "the GPU takes longer (%s)", why);
            return DSC_OK;
        }
        dp->snap[0] = shared[0], dp->snap[1] = shared[1];
        dp->snap_shared = true;
        return DSC_OK;
    }
    dsc_status st = DSC_OK;
    for (int k = 0; k < 2 && st == DSC_OK; k++)
        st = dsc__cuda_host_alloc((void **)&dp->snap[k], n * sizeof(float));
    if (st == DSC_OK) st = dsc__engine_ft_own_external(dp->eng, dp->snap);
    if (st != DSC_OK) {
        DSC_WARN("ft",
                 "the state snapshots stay in pageable memory, so copying them from the GPU "
                 "takes longer (%s)",
                 dsc_last_error());
        dsc_clear_error();
        for (int k = 0; k < 2; k++) {
            dsc__cuda_host_free(dp->snap[k]);
            dp->snap[k] = NULL;
        }
    }
    return DSC_OK;
}

// After the optimizer: this boundary's state into its slot, behind the optimizer, off the
// compute stream.
static dsc_status snap_start(train_dp *dp) {
    if (!dp->copy_stream) return DSC_OK;
    float *buf = dsc__engine_ft_reserve(dp->eng);
    if (!buf) return DSC_OK;
    const dsc__engine_dp *L = &dp->L;
    dsc_cuda_state *st = dp->st;
    const float *vec[3] = {st->master, st->m, st->v};
    int nvec = st->v ? 3 : 2;
    if (dsc__engine_ft_floats(dp->eng) != (size_t)nvec * L->state_len)
        return dsc__fail(DSC_ERR_INTERNAL,
                         "fault tolerance: a snapshot holds %zu floats, the "
                         "device state %d x %zu (a bug: report it)",
                         dsc__engine_ft_floats(dp->eng), nvec, L->state_len);
    DSC_TRY(dsc__cuda_event_record(dp->opt_done, st->stream));
    DSC_TRY(dsc__cuda_stream_wait_event(dp->copy_stream, dp->opt_done));
    for (int k = 0; k < nvec; k++)
        DSC_TRY(dsc__cuda_to_host_async(buf + (size_t)k * L->state_len, vec[k],
                                        L->state_len * sizeof(float), dp->copy_stream));
    DSC_TRY(dsc__cuda_event_record(dp->copy_done, dp->copy_stream));
    dp->snap_pending = true;
    return DSC_OK;
}

// Before the norm's collective: the last exchange completes, and the last boundary's snapshot,
// copied by now, is published and sent to the buddy.
static dsc_status snap_publish(train_dp *dp) {
    if (dp->snap_pending) {
        DSC_TRY(dsc__cuda_event_wait(dp->copy_done));
        dp->snap_pending = false;
    }
    DSC_TRY(dsc__engine_ft_commit_end(dp->eng));
    return dsc__engine_ft_publish(dp->eng);
}

void dsc__train_dp_destroy(train_dp *dp) {
    if (!dp) return;
    snap_release(dp, true);
    dsc__cuda_stream_destroy(dp->copy_stream);
    dsc__cuda_event_destroy(dp->opt_done);
    dsc__cuda_event_destroy(dp->copy_done);
    dsc__cuda_state_destroy(dp->st); // waits for its stream
    release(dp);
    free(dp);
}

void dsc__train_dp_fault(train_dp *dp) {
    // NCCL's kernels end with the communicator, so the streams drain; requests end at once.
    if (dp->nccl) dsc_comm_abort(dp->nccl, DSC_ERR_PEER, "the step was abandoned after a fault");
    (void)wait_all(dp, dp->reqs, dp->L.ngroups);
    (void)wait_all(dp, dp->mreqs, dp->nm);
    dp->nm = 0;
    dsc_clear_error();
    if (dp->copy_stream) (void)dsc__cuda_stream_wait(dp->copy_stream);
    (void)dsc__cuda_stream_wait(dp->st->stream);
    dsc_clear_error();
    dp->snap_pending = false;
    dsc__engine_ft_cancel(dp->eng);
    if (dp->snap_shared) snap_release(dp, false); // a recovery may let the shared slots go
}

// A fresh store on this node for the new group's rendezvous: the new rank 0 hosts it on a free
// loopback port and tells the others the port over the engine's (already rebuilt) communicator.
// In-place recovery happens among the ranks of one node (the shm backend), so loopback reaches
// every member.
static dsc_status recovery_store(train_dp *dp, dsc_store **out) {
    *out = NULL;
    dsc_comm *c = dsc__engine_comm(dp->eng);
    double tmo = dsc_engine_config(dp->eng)->fault_tolerance.comm_timeout_s;
    float port = 0; // a port fits a float exactly
    dsc_status st = DSC_OK;
    if (dsc_engine_rank(dp->eng) == 0) {
        st = dsc_store_create(out, "127.0.0.1", 0, true, tmo);
        if (st == DSC_OK) port = (float)dsc_store_port(*out);
    }
    if (c && st == DSC_OK) st = dsc_comm_broadcast(c, &port, 1, DSC_DT_F32, 0, NULL);
    if (c && st == DSC_OK && dsc_engine_rank(dp->eng) != 0)
        st = dsc_store_create(out, "127.0.0.1", (int)port, false, tmo);
    return st;
}

dsc_status dsc__train_dp_recovered(train_dp *dp, const dsc_model *model) {
    double t0 = dsc_now();
    dsc__train_dp_fault(dp); // normally done already, before the engine's recovery
    dsc_mem_pool *pool = dp->st->bufs[1].pool;
    snap_release(dp, false);
    release(dp);
    dp->gen++;
    DSC_TRY(dsc__engine_dp_layout(dp->eng, &dp->L));
    DSC_TRY(make_buffers(dp, pool, model));
    dsc_store *store = NULL;
    char tag[32];
    snprintf(tag, sizeof tag, "gpu-dp%d", dp->gen);
    dsc_status st = recovery_store(dp, &store);
    if (st == DSC_OK) st = make_comm(dp, store, tag);
    // The new rank 0 took its rendezvous key out before its create returned; the barrier keeps
    // its store up until every rank has read the id.
    if (st == DSC_OK) st = dsc_comm_barrier(dsc__engine_comm(dp->eng), NULL);
    dsc_store_destroy(store);
    if (st == DSC_OK) st = snap_init(dp);
    bool frozen; // LoRA's base: the slices of the new world
    if (st == DSC_OK) st = dsc__train_dp_frozen(dp, &frozen);
    if (st != DSC_OK) {
        dsc__error_prefix("--device cuda with DSC_COMM_BACKEND=nccl: after the recovery: ");
        return st;
    }
    DSC_WARN("ft", "rank %d: a new nccl communicator over %d GPU%s (%s) in %.3f s", dp->L.rank,
             dp->L.world, dp->L.world == 1 ? "" : "s", tag, dsc_now() - t0);
    return DSC_OK;
}

void dsc__train_dp_describe(const train_dp *dp, char *buf, size_t cap) {
    const dsc__engine_dp *L = &dp->L;
    const char *how = L->stage == 0  ? "optimizer state whole on every GPU"
                      : dp->shard    ? "16-bit weights, gradients and optimizer state "
                                       "partitioned; each layer gathered one ahead into two "
                                       "slots, its gradients reduce-scattered every micro-step"
                      : L->stage == 3 ? "gradients and optimizer state partitioned, bf16 weights "
                                        "whole on every GPU (run as stage 2: "
                                        "DSC_GPU_STAGE3_PARTITION=0)"
                                      : "optimizer state partitioned";
    snprintf(buf, cap, "nccl data-parallel over %d GPU%s, ZeRO stage %d (%s), gradients reduced "
             "in %s, fp32 master and optimizer on the GPU", L->world, L->world == 1 ? "" : "s",
             L->stage, how, dsc_dtype_name(L->comm_dt));
}

// ---- host state <-> device ----

// Stage 3: the resident groups' weights go up whole (through hdev, in the device layout), the
// layers' 16-bit slices are this rank's master partition rounded on the device (the same bits as
// rounding the whole weights: the master slices are those weights).
static dsc_status shard_load(train_dp *dp) {
    for (int g = 0; g < dp->L.ngroups; g++) {
        if (dsc__slots_layer_group(&dp->sl, g)) continue;
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        memcpy(dp->hdev + dp->sl.dev_off[g], dp->hfull + sp.off, sp.padded * 4);
    }
    DSC_TRY(dsc__cuda_state_upload_dp(dp->st, dp->hdev, dp->hpart, dp->L.m, dp->L.v));
    DSC_TRY(dsc__cuda_to16(dp->own16, dp->st->master, dp->L.state_len, 1.0f, dp->st->fp16,
                           dp->st->stream));
    dsc__slots_forget(&dp->sl);
    return dsc__cuda_stream_wait(dp->st->stream);
}

dsc_status dsc__train_dp_load(train_dp *dp) {
    DSC_TRY(dsc__engine_dp_layout(dp->eng, &dp->L));
    DSC_TRY(dsc__engine_gather_master(dp->eng, dp->hfull)); // a collective at stages 1-3
    for (int g = 0; g < dp->L.ngroups; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        memcpy(dp->hpart + sp.state_off, dsc__engine_master_of(dp->eng, g), sp.state_len * 4);
    }
    if (dp->shard) return shard_load(dp);
    return dsc__cuda_state_upload_dp(dp->st, dp->hfull, dp->hpart, dp->L.m, dp->L.v);
}

// This rank's master and moments -> the engine's host buffers.
static dsc_status download(train_dp *dp) {
    DSC_TRY(dsc__engine_dp_layout(dp->eng, &dp->L));
    DSC_TRY(dsc__cuda_state_download(dp->st, dp->hpart, dp->L.m, dp->L.v));
    for (int g = 0; g < dp->L.ngroups; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        memcpy(dsc__engine_master_of(dp->eng, g), dp->hpart + sp.state_off, sp.state_len * 4);
    }
    return DSC_OK;
}

dsc_status dsc__train_dp_store(train_dp *dp) {
    DSC_TRY(download(dp));
    return dsc__engine_master_changed(dp->eng); // the compute copies (a collective at 1-3)
}

// ---- the step ----

// Whether a rank of the engine's (host) communicator can no longer join this rank's NCCL
// operations: its process is gone, or a rank announced a fault by breaking that communicator. NCCL
// itself notices a dead peer only where sockets connect the ranks (not over NVLink or PCIe peer
// access), and its deadline is comm_timeout_s; the host communicator knows within tens of
// milliseconds on one node. *why says which.
static bool group_failed(train_dp *dp, char *why, size_t cap) {
    dsc_comm *c = dsc__engine_comm(dp->eng);
    const char *msg = NULL;
    if (!c) return false;
    if (dsc_comm_is_broken(c, NULL, &msg)) {
        snprintf(why, cap, "another rank reported a fault (%s)", msg ? msg : "no reason given");
        return true;
    }
    for (int j = 0; j < dp->L.world; j++) {
        dsc_comm_peer p;
        if (j == dp->L.rank || dsc_comm_peer_info(c, j, &p) != DSC_OK) continue;
        // A dead process, not one that left: a rank exits only after a host collective of all
        // ranks, which every rank reaches after its NCCL waits, so none can be left waiting.
        if (p.state == DSC_PEER_DEAD) {
            snprintf(why, cap, "rank %d (pid %d) died", j, p.pid);
            return true;
        }
    }
    return false;
}

static void pause_us(int k) { // spin a little, then sleep up to 50 us between polls
    if (k < 64) return;
    struct timespec ts = {0, k < 256 ? 5000 : 50000};
    nanosleep(&ts, NULL);
}

// Wait for every request in reqs[0..n) (each freed); the first failure wins. Every 10 ms the
// engine's communicator is asked whether the group failed (group_failed): then the NCCL
// communicator is aborted, which ends the requests at once.
static dsc_status wait_all(train_dp *dp, dsc_comm_req **reqs, int n) {
    dsc_status first = DSC_OK;
    char msg[1024] = "";
    double next = dsc_now() + 0.01;
    for (int k = 0;; k++) {
        bool pending = false;
        for (int i = 0; i < n; i++) {
            if (!reqs[i]) continue;
            bool done = false;
            dsc_status st = dsc_comm_test(reqs[i], &done);
            if (!done) {
                pending = true;
                continue;
            }
            reqs[i] = NULL;
            if (st != DSC_OK && first == DSC_OK) {
                first = st;
                snprintf(msg, sizeof msg, "%s", dsc_last_error());
            }
        }
        if (!pending) break;
        char why[512];
        if (dsc_now() >= next) {
            next = dsc_now() + 0.01;
            if (group_failed(dp, why, sizeof why)) {
                char reason[700];
                snprintf(reason, sizeof reason, "rank %d: the NCCL operation cannot complete: %s",
                         dp->L.rank, why);
                dsc_comm_abort(dp->nccl, DSC_ERR_PEER, reason);
            }
        }
        pause_us(k);
    }
    return first == DSC_OK ? DSC_OK : dsc__fail(first, "%s", msg);
}

// Where group g's gradients (and 16-bit weights) start in the device arrays: the engine's
// offset, or at stage 3 the resident group's offset in the slots' layout.
static size_t dev_off(const train_dp *dp, int g, const dsc__engine_span *sp) {
    return dp->shard ? dp->sl.dev_off[g] : sp->off;
}

// Group g's collective on the communicator's stream, after everything enqueued there before:
// stage 0 an all-reduce of the group's range in place, stages 1-3 a reduce-scatter of it into
// this rank's slice of the partition. fp32 in the gradients, else in the 16-bit staging copy.
static dsc_status issue_group(train_dp *dp, int g, const dsc__engine_span *sp) {
    const dsc__engine_dp *L = &dp->L;
    bool wide = L->comm_dt == DSC_DT_F32;
    size_t es = wide ? 4 : 2;
    char *send = (wide ? (char *)dp->st->grad : (char *)dp->send16) + dev_off(dp, g, sp) * es;
    if (L->stage == 0)
        return dsc_comm_all_reduce(dp->nccl, send, send, sp->padded, L->comm_dt, DSC_OP_SUM,
                                   &dp->reqs[g]);
    char *recv = wide ? (char *)dp->red : (char *)dp->recv16;
    return dsc_comm_reduce_scatter(dp->nccl, send, recv + sp->state_off * es,
                                   sp->slice, L->comm_dt, DSC_OP_SUM, &dp->reqs[g]);
}

// Group g's gradients are final on the compute stream: there its fp16 rounding (fp16 training;
// the same bits as the whole-array rounding one GPU does at the step) and DeepSpeed's
// pre-scaling or the 16-bit staging of its range [off, off + padded), then its event, which the
// communicator's stream waits for before the group's collective. Only enqueues: the host never
// waits here. The groups tile the layout, so every element is staged once per step.
static dsc_status stage_group(train_dp *dp, int g) {
    const dsc__engine_dp *L = &dp->L;
    dsc__engine_span sp;
    dsc__engine_span_of(dp->eng, g, &sp);
    void *s = dp->st->stream;
    size_t off = dev_off(dp, g, &sp);
    float *grad = dp->st->grad + off;
    float pre = L->pre != 1.0 ? (float)(1.0 / L->pre) : 1.0f;
    dp->begun[g] = true;
    if (dsc__engine_fp16(dp->eng))
        DSC_TRY(dsc__cuda_state_round_grads_fp16_range(dp->st, off, sp.padded));
    if (L->comm_dt == DSC_DT_F32) DSC_TRY(dsc__cuda_scale(grad, sp.padded, pre, s));
    else
        DSC_TRY(dsc__cuda_to16(dp->send16 + off, grad, sp.padded, pre, L->comm_dt == DSC_DT_F16,
                               s));
    DSC_TRY(dsc__cuda_event_record(dp->ready[g], s));
    DSC_TRY(dsc__nccl_after_event(dp->nccl, dp->ready[g]));
    return issue_group(dp, g, &sp);
}

static dsc_status begin_group(train_dp *dp, int g) {
    dsc_status st = stage_group(dp, g);
    if (st != DSC_OK)
        dsc__error_prefix("--device cuda with DSC_COMM_BACKEND=nccl: starting the gradient "
                          "reduction of parameter group %d (of %d): ", g, dp->L.ngroups);
    return st;
}

// The backward's hook (dsc_model_grad_hook). The model's group numbers are the engine's:
// the engine numbers its groups by dsc_param_desc.group, which the trainer copies from the
// model's tensor table (0: wte and wpe, 1 + l: layer l, n_layer + 1: ln_f), and lays them out in
// that order.
static dsc_status reduce_layer(train_dp *dp, int g); // stage 3, below

static dsc_status grads_final(void *user, int g) {
    train_dp *dp = user;
    if (g < 0 || g >= dp->L.ngroups)
        return dsc__fail(DSC_ERR_INTERNAL, "--device cuda with DSC_COMM_BACKEND=nccl: the "
                         "backward finished parameter group %d, but the engine has groups 0-%d; "
                         "the model and the engine disagree on the parameter table (a bug: "
                         "report it)", g, dp->L.ngroups - 1);
    if (dp->shard && dsc__slots_layer_group(&dp->sl, g)) return reduce_layer(dp, g);
    if (!dsc__engine_micro_last(dp->eng)) return DSC_OK; // stage 3's resident groups: at the last
    if (dp->begun[g])
        return dsc__fail(DSC_ERR_INTERNAL, "--device cuda with DSC_COMM_BACKEND=nccl: parameter "
                         "group %d was reported complete twice in the last micro-step of step "
                         "%lld (a second backward carried the hook; a bug: report it)", g,
                         (long long)dsc_engine_global_steps(dp->eng) + 1);
    return begin_group(dp, g);
}

void dsc__train_dp_backward_hook(train_dp *dp, dsc_model_grad_hook *fn, void **user) {
    bool hooked = dsc__engine_micro_last(dp->eng) || dp->shard; // stage 3: layers every time
    *fn = hooked ? grads_final : NULL;
    *user = hooked ? dp : NULL;
}

// Step 1 (train_gpu_dp.h): the groups the hook did not start are started now, in the hook's
// order (the same on every rank, as NCCL needs); every group's collective is waited for; the
// reduced gradients in dp->red are scaled by post (or converted back from 16 bits).
static dsc_status shard_finish(train_dp *dp); // stage 3, below

static dsc_status reduce(train_dp *dp) {
    const dsc__engine_dp *L = &dp->L;
    dsc_status st = DSC_OK;
    for (int g = L->ngroups - 1; g >= 0 && st == DSC_OK; g--)
        if (!dp->begun[g] && !(dp->shard && dsc__slots_layer_group(&dp->sl, g)))
            st = begin_group(dp, g);
    dsc_status w = wait_all(dp, dp->reqs, L->ngroups);
    memset(dp->begun, 0, (size_t)L->ngroups * sizeof *dp->begun);
    DSC_TRY(st != DSC_OK ? st : w);
    if (dp->shard) return shard_finish(dp);
    void *s = dp->st->stream;
    float post = (float)L->post;
    size_t n = L->stage == 0 ? L->total : L->state_len;
    if (L->comm_dt == DSC_DT_F32) return dsc__cuda_scale(dp->red, n, post, s);
    const uint16_t *src = L->stage == 0 ? dp->send16 : dp->recv16;
    return dsc__cuda_from16(dp->red, src, n, post, L->comm_dt == DSC_DT_F16, s);
}

// Step 2: --dump-grads. The engine's accumulator takes the full reduced gradient at stages 0-1
// (at 1 the partitions are all-gathered first, into the gradient buffer that is no longer
// needed) and this rank's partition at 2-3.
static dsc_status observe(train_dp *dp) {
    const dsc__engine_dp *L = &dp->L;
    size_t len;
    float *acc = dsc__engine_grad_acc(dp->eng, &len);
    const float *src = dp->red;
    if (L->stage == 1) {
        DSC_TRY(dsc__cuda_stream_wait(dp->st->stream));
        dsc_status st = DSC_OK;
        int g = 0;
        for (; g < L->ngroups && st == DSC_OK; g++) {
            dsc__engine_span sp;
            dsc__engine_span_of(dp->eng, g, &sp);
            st = dsc_comm_all_gather(dp->nccl, dp->red + sp.state_off, dp->st->grad + sp.off,
                                     sp.slice, DSC_DT_F32, &dp->reqs[g]);
        }
        dsc_status w = wait_all(dp, dp->reqs, g);
        DSC_TRY(st != DSC_OK ? st : w);
        src = dp->st->grad;
    }
    DSC_TRY(dsc__cuda_to_host(acc, src, len * sizeof(float), dp->st->stream));
    return dsc__engine_observe_device_grads(dp->eng);
}

// Step 3: the global sum of squares of the unscaled gradients and the overflow flag, the same on
// every rank.
static dsc_status global_norm(train_dp *dp, double *sumsq, bool *nonfinite) {
    const dsc__engine_dp *L = &dp->L;
    float inv = (float)(1.0 / dsc__engine_loss_scale(dp->eng));
    double mine[2];
    bool bad = false;
    size_t n = L->stage == 0 ? L->total : L->state_len;
    DSC_TRY(dsc__cuda_state_sumsq(dp->st, dp->red, n, inv, &mine[0], &bad));
    mine[1] = bad ? 1.0 : 0.0;
    double *all = malloc(sizeof(double) * 2 * (size_t)L->world);
    if (!all) return dsc__fail(DSC_ERR_OOM, "out of memory");
    dsc_status st = dsc__cuda_to_device(dp->norm, mine, sizeof mine, dp->st->stream);
    if (st == DSC_OK) // 16 bytes per rank, moved as 4 floats
        st = dsc_comm_all_gather(dp->nccl, dp->norm, dp->norm + 4, 4, DSC_DT_F32, NULL);
    if (st == DSC_OK)
        st = dsc__cuda_to_host(all, dp->norm + 4, sizeof(double) * 2 * (size_t)L->world,
                               dp->st->stream);
    // at stage 0 every rank summed the same vector
    dsc__step_global_norm(all, st == DSC_OK ? L->world : 0, L->stage == 0, sumsq, nonfinite);
    free(all);
    return st;
}

// Step 4: the optimizer, then (stages 1-3) the 16-bit slices (bf16, or fp16 when the model
// computes in fp16; the all-gather moves bits, so the label is only their size) to every rank.
static dsc_status apply(train_dp *dp, const dsc__device_step *plan) {
    const dsc__engine_dp *L = &dp->L;
    dsc_cuda_state *st = dp->st;
    if (L->stage == 0) return dsc__cuda_state_step(st, &plan->hp, plan->opt_step, plan->grad_scale);
    for (int g = 0; g < L->ngroups; g++) { // stage 3's layers: into this rank's slices only
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        bool sliced = dp->shard && dsc__slots_layer_group(&dp->sl, g);
        uint16_t *out16 = sliced ? dp->own16 + sp.state_off
                                 : st->p16 + dev_off(dp, g, &sp) + (size_t)L->rank * sp.slice;
        DSC_TRY(dsc__cuda_state_step_range(st, &plan->hp, plan->opt_step, plan->grad_scale,
                                           dp->red + sp.state_off, sp.state_off, sp.slice,
                                           out16));
    }
    if (dp->shard) dsc__slots_forget(&dp->sl); // the slots' copies are stale
    DSC_TRY(dsc__cuda_stream_wait(st->stream));
    dsc_status s = DSC_OK;
    int g = 0;
    for (; g < L->ngroups && s == DSC_OK; g++) { // in place: send is recv + rank * slice
        if (dp->shard && dsc__slots_layer_group(&dp->sl, g)) continue; // gathered when used
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        uint16_t *whole = st->p16 + dev_off(dp, g, &sp);
        s = dsc_comm_all_gather(dp->nccl, whole + (size_t)L->rank * sp.slice, whole, sp.slice,
                                DSC_DT_BF16, &dp->reqs[g]);
    }
    dsc_status w = wait_all(dp, dp->reqs, g);
    return s != DSC_OK ? s : w;
}

// ---- stage 3: the layers through the slots ----

// The pass's requests: the next free entry (when full, the ones issued so far are waited for
// first; a pass issues at most three per layer, so this does not happen).
static dsc_status next_req(train_dp *dp, dsc_comm_req ***r) {
    if (dp->nm == dp->mcap) {
        DSC_TRY(wait_all(dp, dp->mreqs, dp->nm));
        dp->nm = 0;
    }
    *r = &dp->mreqs[dp->nm++];
    return DSC_OK;
}

// Layer `layer`'s slices from every rank into weight slot k, on the communicator's stream once
// the slot's last readers are done; the slot's ready event after it.
static dsc_status slot_fetch(void *user, int k, int layer) {
    train_dp *dp = user;
    dsc__engine_span sp;
    dsc__engine_span_of(dp->eng, layer + 1, &sp);
    dsc_comm_req **r;
    DSC_TRY(next_req(dp, &r));
    DSC_TRY(dsc__nccl_after_event(dp->nccl, dp->wfree[k]));
    DSC_TRY(dsc_comm_all_gather(dp->nccl, dp->own16 + sp.state_off, dp->sl.w[k], sp.slice,
                                DSC_DT_BF16, r));
    if (dp->fown && dp->fslice[layer + 1]) { // its frozen base into frozen slot k (16 bits: the
        DSC_TRY(next_req(dp, &r));           // type only sizes the elements)
        DSC_TRY(dsc_comm_all_gather(dp->nccl, dp->st->frozen16 + dp->fdn + dp->fown[layer + 1],
                                    dp->sl.fw[k], dp->fslice[layer + 1], DSC_DT_BF16, r));
    }
    return dsc__nccl_record_event(dp->nccl, dp->wready[k]);
}

static dsc_status slot_use(void *user, int k) {
    train_dp *dp = user;
    return dsc__cuda_stream_wait_event(dp->st->stream, dp->wready[k]);
}

static dsc_status slot_release(void *user, int k) {
    train_dp *dp = user;
    return dsc__cuda_event_record(dp->wfree[k], dp->st->stream);
}

// Gradient slot j's reduced slice (this rank's, in place at rank x slice) into the partition,
// once its reduce-scatter is done: written at a step's first micro-step, added at the others.
static dsc_status settle(train_dp *dp, int j) {
    int g = dp->gpend[j];
    if (g < 0) return DSC_OK;
    dp->gpend[j] = -1;
    const dsc__engine_dp *L = &dp->L;
    dsc__engine_span sp;
    dsc__engine_span_of(dp->eng, g, &sp);
    void *s = dp->st->stream;
    DSC_TRY(dsc__cuda_stream_wait_event(s, dp->gdone[j]));
    float *dst = dp->red + sp.state_off;
    size_t at = (size_t)L->rank * sp.slice;
    bool f16 = L->comm_dt == DSC_DT_F16, first = dsc__engine_micro(dp->eng) == 0;
    if (L->comm_dt == DSC_DT_F32) {
        const float *src = dp->sl.g[j] + at;
        return first ? dsc__cuda_copy(dst, src, sp.slice * 4, s)
                     : dsc__cuda_add(dst, src, sp.slice, s);
    }
    const uint16_t *src16 = dp->send16 + (dp->sl.g[j] - dp->st->grad) + at;
    return first ? dsc__cuda_from16(dst, src16, sp.slice, 1.0f, f16, s)
                 : dsc__cuda_add_from16(dst, src16, sp.slice, f16, s);
}

// Gradient slot j may take group g's gradients: the last group's result is added first (which
// waits for its reduce-scatter), then the slot is zeroed for the backward's +=.
static dsc_status slot_reuse(void *user, int j, int before, int g) {
    train_dp *dp = user;
    (void)before;
    (void)g;
    DSC_TRY(settle(dp, j));
    return dsc__cuda_zero(dp->sl.g[j], dp->sl.slot_len * sizeof(float), dp->st->stream);
}

static const dsc__slots_ops slot_ops = {slot_fetch, slot_use, slot_release, slot_reuse};

// Layer group g's gradients are complete in its gradient slot (the backward's hook, every
// micro-step): pre-scaled or staged in 16 bits there, then reduce-scattered in place on the
// communicator's stream behind the compute stream's event; the slot's done event after it.
static dsc_status shard_reduce(train_dp *dp, int g) {
    const dsc__engine_dp *L = &dp->L;
    dsc__engine_span sp;
    dsc__engine_span_of(dp->eng, g, &sp);
    int j = (g - 1) & 1; // the layer's gradient slot (layer_slots.h)
    float *slot = dp->sl.g[j];
    void *s = dp->st->stream;
    float pre = L->pre != 1.0 ? (float)(1.0 / L->pre) : 1.0f;
    bool wide = L->comm_dt == DSC_DT_F32;
    size_t es = wide ? 4 : 2;
    char *buf = wide ? (char *)slot : (char *)(dp->send16 + (slot - dp->st->grad));
    if (wide) DSC_TRY(dsc__cuda_scale(slot, sp.padded, pre, s));
    else DSC_TRY(dsc__cuda_to16((uint16_t *)buf, slot, sp.padded, pre, L->comm_dt == DSC_DT_F16, s));
    DSC_TRY(dsc__cuda_event_record(dp->ready[g], s));
    dsc_comm_req **r;
    DSC_TRY(next_req(dp, &r));
    DSC_TRY(dsc__nccl_after_event(dp->nccl, dp->ready[g]));
    DSC_TRY(dsc_comm_reduce_scatter(dp->nccl, buf, buf + (size_t)L->rank * sp.slice * es,
                                    sp.slice, L->comm_dt, DSC_OP_SUM, r));
    DSC_TRY(dsc__nccl_record_event(dp->nccl, dp->gdone[j]));
    dp->gpend[j] = g;
    return DSC_OK;
}

static dsc_status reduce_layer(train_dp *dp, int g) {
    dsc_status st = shard_reduce(dp, g);
    if (st != DSC_OK)
        dsc__error_prefix("--device cuda with DSC_COMM_BACKEND=nccl, ZeRO stage 3: reducing "
                          "the gradients of layer %d: ", g - 1);
    return st;
}

// At the step, after the resident groups' reductions: post-scaling (or the conversion back from
// 16 bits) of the resident groups' results; the layers' partition (sums of the micro-steps'
// reductions) scaled by post and, in fp16 training, rounded to fp16 values, as the resident
// groups were before their reduction.
static dsc_status shard_finish(train_dp *dp) {
    const dsc__engine_dp *L = &dp->L;
    void *s = dp->st->stream;
    float post = (float)L->post;
    for (int g = 0; g < L->ngroups; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        float *r = dp->red + sp.state_off;
        bool layer = dsc__slots_layer_group(&dp->sl, g);
        if (layer || L->comm_dt == DSC_DT_F32) DSC_TRY(dsc__cuda_scale(r, sp.slice, post, s));
        else
            DSC_TRY(dsc__cuda_from16(r, dp->recv16 + sp.state_off, sp.slice, post,
                                     L->comm_dt == DSC_DT_F16, s));
        if (layer && dsc__engine_fp16(dp->eng))
            DSC_TRY(dsc__cuda_round_fp16(r, (int64_t)sp.slice, s));
    }
    return DSC_OK;
}

// ---- stage 3: LoRA's frozen base partitioned ----

typedef struct { // an end group's whole frozen range -> the state's frozen array at `at`
    dsc_cuda_state *st;
    size_t at;
} fput;

static dsc_status frozen_end_put(void *user, size_t off, size_t n, float *values) {
    fput *f = user;
    (void)off;
    return dsc__cuda_state_io(f->st, DSC__STATE_FROZEN, f->at, n, values, true);
}

dsc_status dsc__train_dp_frozen(train_dp *dp, bool *done) {
    *done = false;
    int L = dp->sl.L, world = dp->L.world;
    size_t end_off[2], off, padded, own = 0, n = 0;
    if (!dp->shard) return DSC_OK;
    const float *store = dsc__engine_frozen_store(dp->eng, &n);
    if (!n || (!store && !dsc__engine_frozen_parted(dp->eng))) return DSC_OK;
    size_t *fown = calloc((size_t)L + 2, sizeof *fown), *fslice = calloc((size_t)L + 2, sizeof *fslice);
    if (!fown || !fslice) {
        free(fown);
        free(fslice);
        return dsc__fail(DSC_ERR_OOM, "out of memory");
    }
    bool sliced = true; // every layer's slice, world times over, is its padded range
    for (int g = 1; g <= L; g++) {
        dsc__engine_frozen_span(dp->eng, g, &off, &padded);
        size_t len;
        const float *mine = dsc__engine_frozen_own(dp->eng, g, &len);
        if (padded && (!mine || len * (size_t)world != padded)) sliced = false;
        fown[g] = own;
        fslice[g] = padded ? len : 0;
        own += fslice[g];
    }
    if (!sliced) { // (the host's base whole on several ranks: a layout this path never makes)
        free(fown);
        free(fslice);
        return DSC_OK;
    }
    free(dp->fown);
    free(dp->fslice);
    dp->fown = fown;
    dp->fslice = fslice;
    dp->fdn = dsc__slots_frozen_layout(dp->eng, L, NULL, end_off);
    DSC_TRY(dsc__cuda_state_frozen(dp->st, NULL, dp->fdn + own, dp->st->bufs[1].pool));
    for (int k = 0; k < 2; k++) { // the end groups whole (gathered where partitioned)
        fput f = {dp->st, end_off[k]};
        DSC_TRY(dsc__engine_frozen_group(dp->eng, k ? L + 1 : 0, frozen_end_put, &f));
    }
    for (int g = 1; g <= L; g++) { // this rank's slices
        size_t len;
        const float *mine = dsc__engine_frozen_own(dp->eng, g, &len);
        if (fslice[g])
            DSC_TRY(dsc__cuda_state_io(dp->st, DSC__STATE_FROZEN, dp->fdn + fown[g], fslice[g],
                                       (float *)mine, true));
    }
    DSC_TRY(dsc__slots_frozen(&dp->sl, dp->eng, dp->st->frozen16, dp->fdn));
    *done = true;
    return DSC_OK;
}

dsc_status dsc__train_dp_pass_done(train_dp *dp) {
    if (!dp->shard) return DSC_OK;
    DSC_TRY(settle(dp, 0));
    DSC_TRY(settle(dp, 1));
    dsc_status st = wait_all(dp, dp->mreqs, dp->nm);
    dp->nm = 0;
    return st;
}

bool dsc__train_dp_views(train_dp *dp, dsc_model_device *dev, const uint16_t **p16,
                         float **grad) {
    if (!dp->shard) return false;
    dsc__slots_views(&dp->sl, dev, p16, grad);
    return true;
}

dsc_status dsc__train_dp_step(train_dp *dp, dsc_step_info *info) {
    if (!dsc__engine_micro_done(dp->eng, info)) return DSC_OK;
    DSC_TRY(dsc__engine_dp_layout(dp->eng, &dp->L));
    // fp16: the accumulated gradients become fp16 values before the reduction, as on one GPU;
    // each group's when its reduction starts (stage_group), so never twice.
    DSC_TRY(reduce(dp));
    if (dsc__engine_grads_observed(dp->eng)) DSC_TRY(observe(dp));
    DSC_TRY(snap_publish(dp)); // fault tolerance: before the norm's collective
    double sumsq = 0;
    bool nonfinite = false;
    DSC_TRY(global_norm(dp, &sumsq, &nonfinite));
    dsc__device_step plan;
    DSC_TRY(dsc__engine_device_step(dp->eng, sumsq, nonfinite, &plan, info));
    if (plan.apply) DSC_TRY(apply(dp, &plan));
    DSC_TRY(dsc__cuda_state_zero_grads(dp->st));
    DSC_TRY(snap_start(dp));               // this boundary's snapshot, copied during the next step
    if (dsc__engine_save_state_wanted()) { // the test hook reads the engine's host buffers
        DSC_TRY(download(dp));
        DSC_TRY(dsc__engine_save_state(dp->eng));
    }
    return dp->timed ? dsc__cuda_stream_wait(dp->st->stream) : DSC_OK;
}

#endif // DSC_WITH_CUDA
