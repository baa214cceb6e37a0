// model/llama/infer.c - Llama inference rows through a grouped-query key/value cache (see
// infer.h). The layers are the training forward's kernels on the rows of the call; only
// attention differs: each row reads its sequence's cached keys and values.
#include "model/common.h" // dsc__model_* (checks, hooks, the KV block, row scratch)
#include "model/llama/infer.h"

#include <stdlib.h> // aligned_alloc, calloc, free, malloc
#include <string.h> // memcpy, memset

#include "base/status.h"         // dsc__fail, dsc__error_prefix, DSC_TRY
#include "dsc/comm.h"            // dsc_comm_all_reduce
#include "dsc/memory.h"          // dsc_mem_*
#include "model/blas.h"          // dsc__model_blas_single_thread
#include "model/kernels.h"       // dsc__model_attend_row
#include "model/linear.h"        // dsc__linear_forward
#include "model/llama/kernels.h" // dsc__llama_*
// ---- tensor-parallel layout ----
//
// Rank r of P holds query heads [r NH/P, (r+1) NH/P) and the kv heads they read, [r NKV/P,
// (r+1) NKV/P) (query head h reads kv head h / (NH/NKV), so the two ranges line up): those rows of
// q/k/v_proj (and their biases), those columns of o_proj; rows [r I/P, (r+1) I/P) of gate_proj and
// up_proj and those columns of down_proj. The norms (Qwen3's q/k norms too: one weight shared by
// every head), embeddings and lm_head stay whole. After
// o_proj and down_proj the partial products are summed over the group.

dsc_status dsc__llama_tp_check(const dsc_llama_config *c, int size) {
    if (size >= 1 && c->n_kv_head % size == 0 && c->intermediate % size == 0) return DSC_OK;
    return dsc__fail(DSC_ERR_INVALID_ARG,
                     "tensor parallelism over %d ranks: the model's %d key/value heads (and %d "
                     "MLP rows) must split evenly; use a size that divides %d "
                     "(hybrid_engine.inference_tp_size, or --tp)",
                     size, c->n_kv_head, c->intermediate, c->n_kv_head);
}

// Kind of tensor i within its layer, or -1 outside the layers.
static int kind_of(const dsc_llama_config *c, int i) {
    int norm = dsc__llama_norm_tensor(c);
    if (i < 1 || i >= norm) return -1;
    int l = (i - 1) / ((norm - 1) / c->n_layer);
    for (int k = DSC_LLAMA_LN1; k < DSC_LLAMA_NKINDS; k++)
        if (dsc__llama_layer_tensor(c, l, k) == i) return k;
    return -1;
}

static bool split_rows(int k) {
    return k == DSC_LLAMA_QW || k == DSC_LLAMA_QB || k == DSC_LLAMA_KW || k == DSC_LLAMA_KB ||
           k == DSC_LLAMA_VW || k == DSC_LLAMA_VB || k == DSC_LLAMA_GATE || k == DSC_LLAMA_UP;
}

int64_t dsc__llama_tp_numel(const dsc_llama_config *c, int i, int size) {
    dsc_llama_tensor_info ti;
    dsc_llama_tensor_info_get(c, i, &ti);
    int k = kind_of(c, i);
    bool split = split_rows(k) || k == DSC_LLAMA_OW || k == DSC_LLAMA_DOWN;
    return split ? ti.numel / size : ti.numel;
}

void dsc__llama_tp_slice(const dsc_llama_config *c, int i, int rank, int size, const float *full,
                         float *dst) {
    dsc_llama_tensor_info ti;
    dsc_llama_tensor_info_get(c, i, &ti);
    int k = kind_of(c, i);
    if (split_rows(k)) { // rows (out) of this rank: contiguous
        int64_t n = ti.numel / size;
        memcpy(dst, full + (size_t)rank * (size_t)n, sizeof(float) * (size_t)n);
    } else if (k == DSC_LLAMA_OW || k == DSC_LLAMA_DOWN) { // columns (in) of this rank
        int64_t rows = ti.shape[0], ld = ti.shape[1], w = ld / size;
        for (int64_t r = 0; r < rows; r++)
            memcpy(dst + r * w, full + r * ld + rank * w, sizeof(float) * (size_t)w);
    } else {
        memcpy(dst, full, sizeof(float) * (size_t)ti.numel);
    }
}

// ---- the cache ----

struct dsc_llama_kv {
    dsc__kv k; // shape, scratch; k.block: (L, 2, nseq, max_len, KV), keys then values a layer
    dsc_llama_config c;
    int NH, NKV, I, KV;    // this rank's heads, kv heads, MLP rows; KV = NKV * head_dim
    float *cache;          // the block's address at the start of the current call
    float *rope_cos, *rope_sin; // (max_len, hd / 2)
};

size_t dsc__llama_kv_bytes(const dsc_llama_config *c, int tp_size, int nseq, int max_len) {
    return (size_t)c->n_layer * 2 * (size_t)nseq * (size_t)max_len *
           (size_t)(c->n_kv_head / tp_size) * (size_t)c->head_dim * sizeof(float);
}

bool dsc__llama_kv_fits(const dsc_llama_kv *kv, const dsc_llama_config *c, int tp_size, int nseq,
                        int max_len) {
    return kv && !memcmp(&kv->c, c, sizeof *c) && dsc__kv_holds(&kv->k, tp_size, nseq, max_len);
}

void dsc__llama_kv_destroy(dsc_llama_kv *kv) {
    if (!kv) return;
    dsc__kv_free(&kv->k);
    free(kv->rope_cos);
    free(kv->rope_sin);
    free(kv);
}

dsc_status dsc__llama_kv_create(dsc_llama_kv **out, const dsc_llama_config *c, int tp_size,
                                int nseq, int max_len) {
    *out = NULL;
    DSC_TRY(dsc__llama_tp_check(c, tp_size));
    DSC_TRY(dsc__model_check_kv("llama", nseq, max_len, c->max_seq_len));
    dsc_llama_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return dsc__fail(DSC_ERR_OOM, "llama kv cache: out of memory for its handle");
    memcpy(&kv->c, c, sizeof *c); // whole bytes: kv_fits compares them
    kv->NH = c->n_head / tp_size;
    kv->NKV = c->n_kv_head / tp_size;
    kv->I = c->intermediate / tp_size;
    kv->KV = kv->NKV * c->head_dim;
    size_t half = (size_t)max_len * (size_t)(c->head_dim / 2);
    kv->rope_cos = malloc(sizeof(float) * half);
    kv->rope_sin = malloc(sizeof(float) * half);
    dsc_status st = kv->rope_cos && kv->rope_sin
                        ? dsc__kv_init(&kv->k, "llama", tp_size, nseq, max_len,
                                       dsc__llama_kv_bytes(c, tp_size, nseq, max_len))
                        : dsc__fail(DSC_ERR_OOM, "llama kv cache: out of memory");
    if (st != DSC_OK) {
        dsc__llama_kv_destroy(kv);
        return st;
    }
    dsc__llama_rope_tables(kv->rope_cos, kv->rope_sin, max_len, c->head_dim, c->rope_theta,
                           c->rope_scaling, c->rope_factor, c->rope_low_freq_factor,
                           c->rope_high_freq_factor, c->rope_original_max_pos);
    *out = kv;
    return DSC_OK;
}

// ---- row scratch ----

typedef struct row_bufs {
    float *x, *x2, *ln, *rstd, *qkv, *y, *gate, *up, *h, *part;
} row_bufs;

// With slab NULL only counts floats; views start on 64-byte boundaries.
static size_t carve_rows(const dsc_llama_kv *kv, int n, float *slab, row_bufs *b) {
    const dsc_llama_config *c = &kv->c;
    size_t R = (size_t)n, C = (size_t)c->hidden, I = (size_t)kv->I;
    size_t Q = (size_t)kv->NH * (size_t)c->head_dim, ld = Q + 2 * (size_t)kv->KV;
    const dsc__view table[] = {
        {&b->x, R * C},   {&b->x2, R * C}, {&b->ln, R * C}, {&b->rstd, R}, {&b->qkv, R * ld},
        {&b->y, R * Q},   {&b->gate, R * I}, {&b->up, R * I}, {&b->h, R * I},
        {&b->part, kv->k.tp > 1 ? R * C : 0},
    };
    return dsc__carve(table, sizeof table / sizeof table[0], slab);
}

static dsc_status rows_scratch(dsc_llama_kv *kv, int n, row_bufs *b) {
    size_t nfloats = carve_rows(kv, n, NULL, b);
    DSC_TRY(dsc__model_rows_slab(&kv->k.slab, &kv->k.rows_cap, n, nfloats, "llama"));
    carve_rows(kv, n, kv->k.slab, b);
    return DSC_OK;
}

// ---- checks and hooks ----

static dsc_status check_rows(const dsc_llama_kv *kv, const dsc_model_rows *r) {
    return dsc__model_check_rows(r, kv->k.nseq, kv->k.max_len, kv->c.vocab_size, "llama");
}

static dsc_status hook(const dsc_model_hooks *h, int release, int g) {
    return dsc__model_hook(h, release ? DSC__HOOK_RELEASE : DSC__HOOK_GATHER, g, "llama inference");
}

// ---- the layers ----

static float *kv_layer(const dsc_llama_kv *kv, int l, int which) {
    size_t per = (size_t)kv->k.nseq * kv->k.max_len * kv->KV;
    return kv->cache + ((size_t)l * 2 + (size_t)which) * per;
}

// Keys (rotated) and values of every row into the cache, before any row attends.
static void store_kv(const dsc_llama_kv *kv, float *K, float *V, const dsc_model_rows *r,
                     const float *qkv, int Q, int ld) {
    int KV = kv->KV;
    for (int i = 0; i < r->n; i++) {
        size_t at = ((size_t)r->seq[i] * kv->k.max_len + (size_t)r->pos[i]) * KV;
        memcpy(K + at, qkv + (size_t)i * ld + Q, sizeof(float) * KV);
        memcpy(V + at, qkv + (size_t)i * ld + Q + KV, sizeof(float) * KV);
    }
}

static void attention(dsc_llama_kv *kv, const float *K, const float *V, const dsc_model_rows *r,
                      const float *qkv, int ld, float *y) {
    const dsc_llama_config *c = &kv->c;
    int NH = kv->NH, hd = c->head_dim, group = c->n_head / c->n_kv_head, Q = NH * hd;
    int nthreads = dsc__model_max_threads() < kv->k.att_slots ? dsc__model_max_threads()
                                                              : kv->k.att_slots;
#pragma omp parallel for schedule(dynamic, 4) num_threads(nthreads)
    for (int64_t rh = 0; rh < (int64_t)r->n * NH; rh++) {
        int i = (int)(rh / NH), h = (int)(rh % NH);
        size_t base = (size_t)r->seq[i] * kv->k.max_len * kv->KV + (size_t)(h / group) * hd;
        dsc__model_attend_row(y + (size_t)i * Q + (size_t)h * hd,
                              qkv + (size_t)i * ld + (size_t)h * hd, K + base, V + base,
                              kv->k.att + (size_t)dsc__model_thread_id() * kv->k.max_len,
                              r->pos[i] + 1, kv->KV, hd);
    }
}

static const float *tensor(const dsc_llama_config *c, float *const *p, int l, int k) {
    int i = dsc__llama_layer_tensor(c, l, k);
    return i < 0 ? NULL : p[i];
}

// Layer l's weight k (out, in) and its bias kb (a kind, or -1: none) as the one linear product,
// with the weight's LoRA adapter beside it when the model has adapters (generation with an
// unmerged adapter, one rank: dsc_model_infer).
static dsc__linear dense(const dsc_llama_config *c, float *const *p, int l, int k, int kb, int in,
                         int out) {
    int i = dsc__llama_layer_tensor(c, l, k);
    return (dsc__linear){.w = p[i], .bias = kb >= 0 ? tensor(c, p, l, kb) : NULL, .in = in,
                         .out = out, .lora = c->lora, .tensor = i};
}

// *x (n, C) += in (n, IN) @ w^T (the product lin). One rank: the training forward's product onto
// the residual (out into b->x2, swapped with *x). Several: this rank's partial product summed
// over the group, then added to the residual, in the same order on every rank.
static dsc_status project(const dsc_model_tp *tp, row_bufs *b, float **x, const float *in,
                          dsc__linear lin, int n, int IN, int C) {
    if (!tp || tp->size == 1) {
        dsc__linear_forward(lin, b->x2, C, in, IN, *x, n);
        float *t = *x;
        *x = b->x2;
        b->x2 = t;
        return DSC_OK;
    }
    dsc__linear_forward(lin, b->part, C, in, IN, NULL, n);
    DSC_TRY(dsc_comm_all_reduce(tp->comm, b->part, b->part, (size_t)n * C, DSC_DT_F32, DSC_OP_SUM,
                                NULL));
    float *xv = *x;
    for (size_t e = 0; e < (size_t)n * C; e++) xv[e] += b->part[e];
    return DSC_OK;
}

// Layer l on the rows: *x is the residual stream in, and out.
static dsc_status layer(dsc_llama_kv *kv, float *const *p, const dsc_model_tp *tp,
                        const dsc_model_rows *r, row_bufs *b, float **x, int l) {
    const dsc_llama_config *c = &kv->c;
    int n = r->n, C = c->hidden, I = kv->I, hd = c->head_dim, KV = kv->KV;
    int Q = kv->NH * hd, ld = Q + 2 * KV;
    float *K = kv_layer(kv, l, 0), *V = kv_layer(kv, l, 1);
    dsc__llama_rmsnorm_forward(b->ln, b->rstd, *x, tensor(c, p, l, DSC_LLAMA_LN1), c->rms_eps, n,
                               C);
    dsc__linear_forward(dense(c, p, l, DSC_LLAMA_QW, DSC_LLAMA_QB, C, Q), b->qkv, ld, b->ln, C,
                        NULL, n);
    dsc__linear_forward(dense(c, p, l, DSC_LLAMA_KW, DSC_LLAMA_KB, C, KV), b->qkv + Q, ld, b->ln,
                        C, NULL, n);
    dsc__linear_forward(dense(c, p, l, DSC_LLAMA_VW, DSC_LLAMA_VB, C, KV), b->qkv + Q + KV, ld,
                        b->ln, C, NULL, n);
    if (c->qk_norm)
        dsc__llama_head_norm_forward(b->qkv, ld, NULL, NULL, tensor(c, p, l, DSC_LLAMA_QN),
                                     tensor(c, p, l, DSC_LLAMA_KN), c->rms_eps, n, kv->NH,
                                     kv->NKV, hd);
    // Rows as one sequence of n tokens whose position ids are the rows' positions.
    dsc__llama_rope_pos(b->qkv, ld, kv->rope_cos, kv->rope_sin, r->pos, 1, n, kv->NH + kv->NKV,
                        hd, 0);
    store_kv(kv, K, V, r, b->qkv, Q, ld);
    attention(kv, K, V, r, b->qkv, ld, b->y);
    DSC_TRY(project(tp, b, x, b->y, dense(c, p, l, DSC_LLAMA_OW, -1, Q, C), n, Q, C));
    dsc__llama_rmsnorm_forward(b->ln, b->rstd, *x, tensor(c, p, l, DSC_LLAMA_LN2), c->rms_eps, n,
                               C);
    dsc__linear_forward(dense(c, p, l, DSC_LLAMA_GATE, -1, C, I), b->gate, I, b->ln, C, NULL, n);
    dsc__linear_forward(dense(c, p, l, DSC_LLAMA_UP, -1, C, I), b->up, I, b->ln, C, NULL, n);
    dsc__llama_swiglu_forward(b->h, b->gate, b->up, (int64_t)n * I);
    return project(tp, b, x, b->h, dense(c, p, l, DSC_LLAMA_DOWN, -1, I, C), n, I, C);
}

// The final norm and lm_head on the output rows only (embed_tokens when tied, in group 0).
static dsc_status head(dsc_llama_kv *kv, float *const *params, const dsc_model_rows *r,
                       const dsc_model_hooks *hooks, row_bufs *b, const float *x, float *logits) {
    const dsc_llama_config *c = &kv->c;
    int C = c->hidden, L = c->n_layer;
    for (int j = 0; j < r->nout; j++)
        memcpy(b->x2 + (size_t)j * C, x + (size_t)r->out[j] * C, sizeof(float) * C);
    DSC_TRY(hook(hooks, 0, L + 1));
    dsc__llama_rmsnorm_forward(b->ln, b->rstd, b->x2, params[dsc__llama_norm_tensor(c)],
                               c->rms_eps, r->nout, C);
    if (c->tied) {
        DSC_TRY(hook(hooks, 1, L + 1));
        DSC_TRY(hook(hooks, 0, 0));
    }
    dsc__linear_forward((dsc__linear){.w = params[dsc__llama_head_tensor(c)], .in = C,
                                      .out = c->vocab_size},
                        logits, c->vocab_size, b->ln, C, NULL, r->nout);
    return hook(hooks, 1, c->tied ? 0 : L + 1);
}

dsc_status dsc__llama_infer(dsc_llama_kv *kv, float *const *params, const dsc_model_tp *tp,
                            const dsc_model_rows *rows, const dsc_model_hooks *hooks,
                            float *logits) {
    if (!kv || !params || !rows || (rows->nout && !logits))
        return dsc__fail(DSC_ERR_INVALID_ARG, "llama inference: a NULL argument");
    int size = tp ? tp->size : 1;
    if (size != kv->k.tp || (size > 1 && !tp->comm))
        return dsc__fail(DSC_ERR_INVALID_ARG, "llama inference: tensor-parallel group of %d "
                         "ranks, cache made for %d (or no communicator)", size, kv->k.tp);
    DSC_TRY(check_rows(kv, rows));
    dsc__model_blas_single_thread();
    row_bufs b;
    DSC_TRY(rows_scratch(kv, rows->n, &b));
    kv->cache = dsc_mem_ptr(kv->k.pool, kv->k.block); // re-read: the pool may have moved it
    float *x = b.x;
    DSC_TRY(hook(hooks, 0, 0));
    dsc__llama_embed_forward(x, rows->tokens, params[0], rows->n, kv->c.hidden);
    DSC_TRY(hook(hooks, 1, 0));
    for (int l = 0; l < kv->c.n_layer; l++) {
        DSC_TRY(hook(hooks, 0, 1 + l));
        DSC_TRY(layer(kv, params, tp, rows, &b, &x, l));
        DSC_TRY(hook(hooks, 1, 1 + l));
    }
    if (rows->nout == 0) return DSC_OK;
    return head(kv, params, rows, hooks, &b, x, logits);
}
