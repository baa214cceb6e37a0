// cli/train_gpu_dp.c - data parallelism across GPUs through the nccl backend (see train_gpu_dp.h).
#include "cli/train_gpu_dp.h"

#include <stdlib.h> // getenv
#include <string.h> // strcmp

bool dsc__train_dp_selected(void) {
    const char *b = getenv("DSC_COMM_BACKEND");
    return b && !strcmp(b, "nccl");
}

#ifdef DSC_WITH_CUDA

#include <math.h>   // isfinite
#include <stdio.h>  // snprintf, fopen
#include <unistd.h> // gethostname

#include "base/hash.h"        // dsc_hash64
#include "base/status.h"      // dsc__fail, DSC_TRY
#include "cuda/convert.h"     // dsc__cuda_to16, dsc__cuda_from16, dsc__cuda_scale
#include "cuda/devbuf.h"      // dsc__cuda_buf_*
#include "cuda/train_state.h" // dsc__cuda_state_*
#include "dsc/comm.h"         // dsc_comm_*
#include "engine/device.h"    // dsc__engine_dp_layout, dsc__engine_device_step
#include "engine/hybrid.h"    // dsc__engine_comm

enum { BUF_GSHARD, BUF_SEND16, BUF_RECV16, BUF_NORM, NBUFS };

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
    int micro, gas;
    bool timed;
};

// ---- choosing ----

// Host and physical GPU of `device`, as one number.
static uint64_t device_key(int device, char *pci, size_t cap) {
    char buf[512] = "";
    gethostname(buf, 255);
    buf[255] = '\0';
    size_t n = strlen(buf);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(buf + n, 64, f)) n = strlen(buf);
        fclose(f);
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

static dsc_status make_comm(train_dp *dp) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.backend = "nccl";
    o.rank = dsc_engine_rank(dp->eng);
    o.world_size = dsc_engine_world_size(dp->eng);
    o.timeout_s = dsc_engine_config(dp->eng)->fault_tolerance.comm_timeout_s;
    o.group_tag = "gpu-dp";
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

static dsc_status make_buffers(train_dp *dp, dsc_mem_pool *pool) {
    const dsc__engine_dp *L = &dp->L;
    size_t ns = L->state_len;
    int moments = L->v ? 2 : 1;
    DSC_TRY(dsc__cuda_state_create_dp(&dp->st, L->total, ns, moments, pool));
    dp->red = dp->st->grad;
    if (L->stage > 0)
        DSC_TRY(buf(dp, pool, BUF_GSHARD, ns * 4, "gpu.grad_partition", (void **)&dp->red));
    if (L->comm_dt != DSC_DT_F32) {
        DSC_TRY(buf(dp, pool, BUF_SEND16, L->total * 2, "gpu.comm_stage16", (void **)&dp->send16));
        if (L->stage > 0)
            DSC_TRY(buf(dp, pool, BUF_RECV16, ns * 2, "gpu.comm_stage16", (void **)&dp->recv16));
    }
    size_t norm_bytes = (4 + 4 * (size_t)L->world) * sizeof(float);
    DSC_TRY(buf(dp, pool, BUF_NORM, norm_bytes, "gpu.norm", (void **)&dp->norm));
    dp->hfull = malloc(L->total * sizeof *dp->hfull);
    dp->hpart = malloc((ns ? ns : 1) * sizeof *dp->hpart);
    dp->reqs = calloc((size_t)L->ngroups, sizeof *dp->reqs);
    if (!dp->hfull || !dp->hpart || !dp->reqs)
        return dsc__fail(DSC_ERR_OOM, "out of memory for the host copies of %zu parameters",
                         L->total);
    return DSC_OK;
}

dsc_status dsc__train_dp_create(train_dp **out, dsc_engine *eng, dsc_mem_pool *pool, bool timed,
                                dsc_cuda_state **st) {
    *out = NULL;
    train_dp *dp = calloc(1, sizeof *dp);
    if (!dp) return dsc__fail(DSC_ERR_OOM, "out of memory");
    dp->eng = eng;
    dp->timed = timed;
    dp->gas = (int)dsc_engine_config(eng)->gradient_accumulation_steps;
    dsc_status s = dsc__engine_dp_layout(eng, &dp->L);
    if (s == DSC_OK) s = make_comm(dp);
    if (s == DSC_OK) s = make_buffers(dp, pool);
    if (s != DSC_OK) {
        dsc__train_dp_destroy(dp);
        return s;
    }
    *st = dp->st;
    *out = dp;
    return DSC_OK;
}

void dsc__train_dp_destroy(train_dp *dp) {
    if (!dp) return;
    dsc__cuda_state_destroy(dp->st); // waits for its stream
    dsc_comm_destroy(dp->nccl);
    for (int k = 0; k < NBUFS; k++) dsc__cuda_buf_free(&dp->bufs[k]);
    free(dp->hfull);
    free(dp->hpart);
    free(dp->reqs);
    free(dp);
}

void dsc__train_dp_describe(const train_dp *dp, char *buf, size_t cap) {
    const dsc__engine_dp *L = &dp->L;
    const char *how = L->stage == 0 ? "optimizer state whole on every GPU"
                      : L->stage == 3 ? "gradients and optimizer state partitioned, bf16 weights "
                                        "whole on every GPU (run as stage 2)"
                                      : "optimizer state partitioned";
    snprintf(buf, cap, "nccl data-parallel over %d GPU%s, ZeRO stage %d (%s), gradients reduced "
             "in %s, fp32 master and optimizer on the GPU", L->world, L->world == 1 ? "" : "s",
             L->stage, how, dsc_dtype_name(L->comm_dt));
}

// ---- host state <-> device ----

dsc_status dsc__train_dp_load(train_dp *dp) {
    DSC_TRY(dsc__engine_dp_layout(dp->eng, &dp->L));
    DSC_TRY(dsc__engine_gather_master(dp->eng, dp->hfull)); // a collective at stages 1-3
    for (int g = 0; g < dp->L.ngroups; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        memcpy(dp->hpart + sp.state_off, dsc__engine_master_of(dp->eng, g), sp.state_len * 4);
    }
    return dsc__cuda_state_upload_dp(dp->st, dp->hfull, dp->hpart, dp->L.m, dp->L.v);
}

dsc_status dsc__train_dp_store(train_dp *dp) {
    DSC_TRY(dsc__engine_dp_layout(dp->eng, &dp->L));
    DSC_TRY(dsc__cuda_state_download(dp->st, dp->hpart, dp->L.m, dp->L.v));
    for (int g = 0; g < dp->L.ngroups; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        memcpy(dsc__engine_master_of(dp->eng, g), dp->hpart + sp.state_off, sp.state_len * 4);
    }
    return dsc__engine_master_changed(dp->eng); // the compute copies (a collective at 1-3)
}

// ---- the step ----

// Wait for every request in reqs[0..n) (each freed); the first failure wins.
static dsc_status wait_all(dsc_comm_req **reqs, int n) {
    dsc_status first = DSC_OK;
    char msg[1024] = "";
    for (int k = 0; k < n; k++) {
        if (!reqs[k]) continue;
        dsc_status st = dsc_comm_wait(reqs[k]);
        reqs[k] = NULL;
        if (st != DSC_OK && first == DSC_OK) {
            first = st;
            snprintf(msg, sizeof msg, "%s", dsc_last_error());
        }
    }
    return first == DSC_OK ? DSC_OK : dsc__fail(first, "%s", msg);
}

// One reduce-scatter per group: send (total, element size es) -> recv (state_len).
static dsc_status scatter_groups(train_dp *dp, const void *send, void *recv, size_t es,
                                 dsc_dtype dt) {
    dsc_status st = DSC_OK;
    int g = 0;
    for (; g < dp->L.ngroups && st == DSC_OK; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        st = dsc_comm_reduce_scatter(dp->nccl, (const char *)send + sp.off * es,
                                     (char *)recv + sp.state_off * es, sp.slice, dt, DSC_OP_SUM,
                                     &dp->reqs[g]);
    }
    dsc_status w = wait_all(dp->reqs, g);
    return st != DSC_OK ? st : w;
}

// Step 1 (train_gpu_dp.h): the accumulated gradients reduced into dp->red, scaled by post.
static dsc_status reduce(train_dp *dp) {
    const dsc__engine_dp *L = &dp->L;
    void *s = dp->st->stream;
    float pre = L->pre != 1.0 ? (float)(1.0 / L->pre) : 1.0f, post = (float)L->post;
    float *grad = dp->st->grad;
    if (L->comm_dt == DSC_DT_F32) {
        DSC_TRY(dsc__cuda_scale(grad, L->total, pre, s));
        DSC_TRY(dsc__cuda_stream_wait(s)); // backward and the scaling are done
        if (L->stage == 0)
            DSC_TRY(dsc_comm_all_reduce(dp->nccl, grad, grad, L->total, DSC_DT_F32, DSC_OP_SUM,
                                        NULL));
        else
            DSC_TRY(scatter_groups(dp, grad, dp->red, 4, DSC_DT_F32));
        return dsc__cuda_scale(dp->red, L->stage == 0 ? L->total : L->state_len, post, s);
    }
    bool fp16 = L->comm_dt == DSC_DT_F16;
    DSC_TRY(dsc__cuda_to16(dp->send16, grad, L->total, pre, fp16, s));
    DSC_TRY(dsc__cuda_stream_wait(s));
    if (L->stage == 0) {
        DSC_TRY(dsc_comm_all_reduce(dp->nccl, dp->send16, dp->send16, L->total, L->comm_dt,
                                    DSC_OP_SUM, NULL));
        return dsc__cuda_from16(grad, dp->send16, L->total, post, fp16, s);
    }
    DSC_TRY(scatter_groups(dp, dp->send16, dp->recv16, 2, L->comm_dt));
    return dsc__cuda_from16(dp->red, dp->recv16, L->state_len, post, fp16, s);
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
        dsc_status w = wait_all(dp->reqs, g);
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
    double sum = 0;
    bool flag = false;
    for (int r = 0; st == DSC_OK && r < L->world; r++) {
        sum += all[2 * r];
        flag |= all[2 * r + 1] != 0;
    }
    if (L->stage == 0 && st == DSC_OK) sum = all[0]; // every rank summed the same vector
    free(all);
    *sumsq = sum;
    *nonfinite = flag || !isfinite(sum);
    return st;
}

// Step 4: the optimizer, then (stages 1-3) the 16-bit slices (bf16, or fp16 when the model
// computes in fp16; the all-gather moves bits, so the label is only their size) to every rank.
static dsc_status apply(train_dp *dp, const dsc__device_step *plan) {
    const dsc__engine_dp *L = &dp->L;
    dsc_cuda_state *st = dp->st;
    if (L->stage == 0) return dsc__cuda_state_step(st, &plan->hp, plan->opt_step, plan->grad_scale);
    for (int g = 0; g < L->ngroups; g++) {
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        DSC_TRY(dsc__cuda_state_step_range(st, &plan->hp, plan->opt_step, plan->grad_scale,
                                           dp->red + sp.state_off, sp.state_off, sp.slice,
                                           st->p16 + sp.off + (size_t)L->rank * sp.slice));
    }
    DSC_TRY(dsc__cuda_stream_wait(st->stream));
    dsc_status s = DSC_OK;
    int g = 0;
    for (; g < L->ngroups && s == DSC_OK; g++) { // in place: send is recv + rank * slice
        dsc__engine_span sp;
        dsc__engine_span_of(dp->eng, g, &sp);
        uint16_t *whole = st->p16 + sp.off;
        s = dsc_comm_all_gather(dp->nccl, whole + (size_t)L->rank * sp.slice, whole, sp.slice,
                                DSC_DT_BF16, &dp->reqs[g]);
    }
    dsc_status w = wait_all(dp->reqs, g);
    return s != DSC_OK ? s : w;
}

dsc_status dsc__train_dp_step(train_dp *dp, dsc_step_info *info) {
    if (++dp->micro < dp->gas) {
        memset(info, 0, sizeof *info);
        info->step = dsc_engine_global_steps(dp->eng);
        return DSC_OK;
    }
    dp->micro = 0;
    DSC_TRY(dsc__engine_dp_layout(dp->eng, &dp->L));
    // fp16: the accumulated gradients become fp16 values before the reduction, as on one GPU.
    if (dp->st->fp16) DSC_TRY(dsc__cuda_state_round_grads_fp16(dp->st));
    DSC_TRY(reduce(dp));
    if (dsc__engine_grads_observed(dp->eng)) DSC_TRY(observe(dp));
    double sumsq = 0;
    bool nonfinite = false;
    DSC_TRY(global_norm(dp, &sumsq, &nonfinite));
    dsc__device_step plan;
    DSC_TRY(dsc__engine_device_step(dp->eng, sumsq, nonfinite, &plan, info));
    if (plan.apply) DSC_TRY(apply(dp, &plan));
    DSC_TRY(dsc__cuda_state_zero_grads(dp->st));
    return dp->timed ? dsc__cuda_stream_wait(dp->st->stream) : DSC_OK;
}

#endif // DSC_WITH_CUDA
