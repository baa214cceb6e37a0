// model/gpt2/infer.c - GPT-2 inference rows through a key/value cache, optionally
// tensor-parallel (see infer.h).
#include "model/common.h" // dsc__model_* (checks, hooks, the KV block, row scratch)
#include "model/gpt2/infer.h"

#include <stdlib.h> // calloc, free, malloc
#include <string.h> // memcpy, memset

#include "base/status.h"        // dsc__fail, DSC_TRY
#include "model/blas.h"         // dsc__model_blas_single_thread
#include "model/gpt2/kernels.h" // dsc__gpt2_*
#include "model/kernels.h"      // dsc__model_attend_row
#include "model/linear.h"       // dsc__linear_forward
// The twelve tensors of a layer, in table order (as gpt2.c numbers them).
enum {
    K_LN1W, K_LN1B, K_ATTW, K_ATTB, K_APROJW, K_APROJB,
    K_LN2W, K_LN2B, K_FCW, K_FCB, K_MPROJW, K_MPROJB, PER_LAYER
};

// ---- tensor-parallel layout ----

dsc_status dsc__gpt2_tp_check(const dsc_gpt2_config *c, int size) {
    if (size >= 1 && c->n_head % size == 0 && (4 * c->n_embd) % size == 0) return DSC_OK;
    return dsc__fail(DSC_ERR_INVALID_ARG,
                     "tensor parallelism over %d ranks: the model's %d attention heads (and %d "
                     "MLP columns) must split evenly; use a size that divides %d "
                     "(hybrid_engine.inference_tp_size, or --tp)",
                     size, c->n_head, 4 * c->n_embd, c->n_head);
}

// Layer tensor kind of tensor i, or -1 for the embeddings and ln_f.
static int kind_of(const dsc_gpt2_config *c, int i) {
    if (i < 2 || i >= 2 + c->n_layer * PER_LAYER) return -1;
    return (i - 2) % PER_LAYER;
}

int64_t dsc__gpt2_tp_numel(const dsc_gpt2_config *c, int i, int size) {
    dsc_gpt2_tensor_info ti;
    dsc_gpt2_tensor_info_get(c, i, &ti);
    switch (kind_of(c, i)) {
    case K_ATTW: case K_ATTB: case K_APROJW: case K_FCW: case K_FCB: case K_MPROJW:
        return ti.numel / size;
    default:
        return ti.numel;
    }
}

// Columns [c0, c0 + w) of a (rows, ld) matrix into dst (rows, w).
static void copy_cols(float *dst, const float *src, int64_t rows, int64_t ld, int64_t c0,
                      int64_t w) {
    for (int64_t r = 0; r < rows; r++) memcpy(dst + r * w, src + r * ld + c0, sizeof(float) * w);
}

void dsc__gpt2_tp_slice(const dsc_gpt2_config *c, int i, int rank, int size, const float *full,
                        float *dst) {
    int64_t C = c->n_embd, Cl = C / size, Fl = 4 * C / size;
    int k = kind_of(c, i);
    if (k == K_ATTW || k == K_ATTB) { // q, k and v columns of this rank's heads
        int64_t rows = k == K_ATTW ? C : 1;
        for (int part = 0; part < 3; part++)
            for (int64_t r = 0; r < rows; r++)
                memcpy(dst + r * 3 * Cl + part * Cl, full + r * 3 * C + part * C + rank * Cl,
                       sizeof(float) * Cl);
    } else if (k == K_FCW || k == K_FCB) {
        copy_cols(dst, full, k == K_FCW ? C : 1, 4 * C, rank * Fl, Fl);
    } else if (k == K_APROJW || k == K_MPROJW) { // input rows: contiguous
        int64_t n = (k == K_APROJW ? Cl : Fl) * C;
        memcpy(dst, full + rank * n, sizeof(float) * n);
    } else {
        memcpy(dst, full, sizeof(float) * dsc__gpt2_tp_numel(c, i, size));
    }
}

// ---- the cache ----

struct dsc_gpt2_kv {
    dsc__kv k; // shape, scratch; k.block: (L, 2, nseq, max_len, Cl), keys then values a layer
    dsc_gpt2_config c;
    int Cl, Fl;
};

size_t dsc__gpt2_kv_bytes(const dsc_gpt2_config *c, int tp_size, int nseq, int max_len) {
    return (size_t)c->n_layer * 2 * (size_t)nseq * (size_t)max_len * (size_t)(c->n_embd / tp_size) *
           sizeof(float);
}

int dsc__gpt2_kv_fits(const dsc_gpt2_kv *kv, const dsc_gpt2_config *c, int tp_size, int nseq,
                      int max_len) {
    return kv && !memcmp(&kv->c, c, sizeof *c) && dsc__kv_holds(&kv->k, tp_size, nseq, max_len);
}

dsc_status dsc__gpt2_kv_create(dsc_gpt2_kv **out, const dsc_gpt2_config *c, int tp_size,
                               int nseq, int max_len) {
    *out = NULL;
    DSC_TRY(dsc__gpt2_tp_check(c, tp_size));
    DSC_TRY(dsc__model_check_kv("gpt2", nseq, max_len, c->max_seq_len));
    dsc_gpt2_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return dsc__fail(DSC_ERR_OOM, "gpt2 kv cache: out of memory for its handle");
    kv->c = *c;
    kv->Cl = c->n_embd / tp_size;
    kv->Fl = 4 * c->n_embd / tp_size;
    dsc_status st = dsc__kv_init(&kv->k, "gpt2", tp_size, nseq, max_len,
                                 dsc__gpt2_kv_bytes(c, tp_size, nseq, max_len));
    if (st != DSC_OK) {
        dsc__gpt2_kv_destroy(kv);
        return st;
    }
    *out = kv;
    return DSC_OK;
}

void dsc__gpt2_kv_destroy(dsc_gpt2_kv *kv) {
    if (!kv) return;
    dsc__kv_free(&kv->k);
    free(kv);
}

// ---- row scratch ----

typedef struct row_bufs {
    float *x, *x2, *ln, *mean, *rstd, *qkv, *y, *part, *f;
} row_bufs;

// With slab NULL only counts floats; views start on 64-byte boundaries.
static size_t carve_rows(const dsc_gpt2_kv *kv, int n, float *slab, row_bufs *b) {
    size_t R = (size_t)n, C = (size_t)kv->c.n_embd, Cl = (size_t)kv->Cl, Fl = (size_t)kv->Fl;
    const dsc__view table[] = {
        {&b->x, R * C},  {&b->x2, R * C},       {&b->ln, R * C},  {&b->mean, R},
        {&b->rstd, R},   {&b->qkv, R * 3 * Cl}, {&b->y, R * Cl},  {&b->part, R * C},
        {&b->f, R * Fl},
    };
    return dsc__carve(table, sizeof table / sizeof table[0], slab);
}

static dsc_status rows_scratch(dsc_gpt2_kv *kv, int n, row_bufs *b) {
    size_t nfloats = carve_rows(kv, n, NULL, b);
    DSC_TRY(dsc__model_rows_slab(&kv->k.slab, &kv->k.rows_cap, n, nfloats, "gpt2"));
    carve_rows(kv, n, kv->k.slab, b);
    return DSC_OK;
}

// ---- checks and hooks ----

static dsc_status check_rows(const dsc_gpt2_kv *kv, const dsc_model_rows *r) {
    return dsc__model_check_rows(r, kv->k.nseq, kv->k.max_len, kv->c.vocab_size, "gpt2");
}

static dsc_status hook(const dsc_model_hooks *h, int release, int g) {
    return dsc__model_hook(h, release ? DSC__HOOK_RELEASE : DSC__HOOK_GATHER, g, "gpt2 inference");
}

// ---- the layers ----

static float *kv_layer(dsc_gpt2_kv *kv, float *base, int l, int which) {
    size_t per = (size_t)kv->k.nseq * kv->k.max_len * kv->Cl;
    return base + ((size_t)l * 2 + (size_t)which) * per;
}

// Keys and values of every row into the cache, before any row attends.
static void store_kv(dsc_gpt2_kv *kv, float *K, float *V, const dsc_gpt2_rows *r,
                     const float *qkv) {
    int Cl = kv->Cl;
    for (int i = 0; i < r->n; i++) {
        size_t at = ((size_t)r->seq[i] * kv->k.max_len + (size_t)r->pos[i]) * Cl;
        memcpy(K + at, qkv + (size_t)i * 3 * Cl + Cl, sizeof(float) * Cl);
        memcpy(V + at, qkv + (size_t)i * 3 * Cl + 2 * Cl, sizeof(float) * Cl);
    }
}

static void attention(dsc_gpt2_kv *kv, const float *K, const float *V, const dsc_gpt2_rows *r,
                      const float *qkv, float *y) {
    int Cl = kv->Cl, hs = kv->c.n_embd / kv->c.n_head, nh = Cl / hs;
    int nthreads = dsc__model_max_threads() < kv->k.att_slots ? dsc__model_max_threads()
                                                              : kv->k.att_slots;
#pragma omp parallel for schedule(dynamic, 4) num_threads(nthreads)
    for (int64_t rh = 0; rh < (int64_t)r->n * nh; rh++) {
        int i = (int)(rh / nh), h = (int)(rh % nh);
        size_t base = (size_t)r->seq[i] * kv->k.max_len * Cl + (size_t)h * hs;
        dsc__model_attend_row(y + (size_t)i * Cl + (size_t)h * hs,
                              qkv + (size_t)i * 3 * Cl + (size_t)h * hs, K + base, V + base,
                              kv->k.att + (size_t)dsc__model_thread_id() * kv->k.max_len,
                              r->pos[i] + 1, Cl, hs);
    }
}

// Layer l's Conv1D weight k (in, out) and its bias kb (or -1: none) as the one linear product,
// with the weight's LoRA adapter beside it when the model has adapters (generation with an
// unmerged adapter, one rank: dsc_model_infer). p: the layer's tensors.
static dsc__linear conv1d(const dsc_gpt2_kv *kv, float *const *p, int l, int k, int kb, int in,
                          int out) {
    return (dsc__linear){.w = p[k], .bias = kb >= 0 ? p[kb] : NULL, .in = in, .out = out,
                         .in_out = true, .lora = kv->c.lora, .tensor = 2 + l * PER_LAYER + k};
}

// x (n, C) += in (n, IC) @ w (IC, C) + bias. One rank: the training forward's own product
// (bias and residual first, then the product onto them). Several: partial products summed
// over the group, then added to residual + bias in that order on every rank.
static dsc_status project(const dsc_gpt2_tp *tp, row_bufs *b, float **x, const float *in,
                          dsc__linear lin, int n, int IC, int C) {
    if (tp->size == 1) {
        dsc__linear_forward(lin, b->x2, C, in, IC, *x, n);
        float *t = *x;
        *x = b->x2;
        b->x2 = t;
        return DSC_OK;
    }
    const float *bias = lin.bias;
    lin.bias = NULL;
    dsc__linear_forward(lin, b->part, C, in, IC, NULL, n);
    DSC_TRY(dsc_comm_all_reduce(tp->comm, b->part, b->part, (size_t)n * C, DSC_DT_F32,
                                DSC_OP_SUM, NULL));
    float *xv = *x;
    for (size_t e = 0; e < (size_t)n * C; e++) xv[e] = (xv[e] + bias[e % C]) + b->part[e];
    return DSC_OK;
}

static dsc_status layer(dsc_gpt2_kv *kv, float *cache, float *const *p, const dsc_gpt2_tp *tp,
                        const dsc_gpt2_rows *r, row_bufs *b, float **x, int l) {
    int n = r->n, C = kv->c.n_embd, Cl = kv->Cl, Fl = kv->Fl;
    float *K = kv_layer(kv, cache, l, 0), *V = kv_layer(kv, cache, l, 1);
    dsc__gpt2_layernorm_forward(b->ln, b->mean, b->rstd, *x, p[K_LN1W], p[K_LN1B], n, C);
    dsc__linear_forward(conv1d(kv, p, l, K_ATTW, K_ATTB, C, 3 * Cl), b->qkv, 3 * Cl, b->ln, C,
                        NULL, n);
    store_kv(kv, K, V, r, b->qkv);
    attention(kv, K, V, r, b->qkv, b->y);
    DSC_TRY(project(tp, b, x, b->y, conv1d(kv, p, l, K_APROJW, K_APROJB, Cl, C), n, Cl, C));
    dsc__gpt2_layernorm_forward(b->ln, b->mean, b->rstd, *x, p[K_LN2W], p[K_LN2B], n, C);
    dsc__linear_forward(conv1d(kv, p, l, K_FCW, K_FCB, C, Fl), b->f, Fl, b->ln, C, NULL, n);
    dsc__gpt2_gelu_forward(b->f, b->f, (int64_t)n * Fl);
    return project(tp, b, x, b->f, conv1d(kv, p, l, K_MPROJW, K_MPROJB, Fl, C), n, Fl, C);
}

static void embed(const dsc_gpt2_kv *kv, float *x, const float *wte, const float *wpe,
                  const dsc_gpt2_rows *r) {
    int C = kv->c.n_embd;
    for (int i = 0; i < r->n; i++) {
        const float *e = wte + (size_t)r->tokens[i] * C, *pe = wpe + (size_t)r->pos[i] * C;
        for (int c = 0; c < C; c++) x[(size_t)i * C + c] = e[c] + pe[c];
    }
}

// ln_f and the tied head on the output rows only.
static dsc_status head(dsc_gpt2_kv *kv, float *const *params, const dsc_gpt2_rows *r,
                       const dsc_gpt2_hooks *hooks, row_bufs *b, const float *x, float *logits) {
    int C = kv->c.n_embd, L = kv->c.n_layer, lnf = 2 + L * PER_LAYER;
    for (int j = 0; j < r->nout; j++)
        memcpy(b->part + (size_t)j * C, x + (size_t)r->out[j] * C, sizeof(float) * C);
    DSC_TRY(hook(hooks, 0, L + 1));
    dsc__gpt2_layernorm_forward(b->ln, b->mean, b->rstd, b->part, params[lnf], params[lnf + 1],
                                r->nout, C);
    DSC_TRY(hook(hooks, 1, L + 1));
    DSC_TRY(hook(hooks, 0, 0));
    dsc__linear_forward((dsc__linear){.w = params[0], .in = C, .out = kv->c.vocab_size}, logits,
                        kv->c.vocab_size, b->ln, C, NULL, r->nout);
    return hook(hooks, 1, 0);
}

dsc_status dsc__gpt2_infer(dsc_gpt2_kv *kv, float *const *params, const dsc_gpt2_tp *tp,
                           const dsc_gpt2_rows *rows, const dsc_gpt2_hooks *hooks, float *logits) {
    static const dsc_gpt2_tp one = {0, 1, NULL};
    if (!kv || !params || !rows || (rows->nout && !logits))
        return dsc__fail(DSC_ERR_INVALID_ARG, "gpt2 inference: a NULL argument");
    if (!tp) tp = &one;
    if (tp->size != kv->k.tp || (tp->size > 1 && !tp->comm))
        return dsc__fail(DSC_ERR_INVALID_ARG, "gpt2 inference: tensor-parallel group of %d "
                         "ranks, cache made for %d (or no communicator)", tp->size, kv->k.tp);
    DSC_TRY(check_rows(kv, rows));
    dsc__model_blas_single_thread();
    row_bufs b;
    DSC_TRY(rows_scratch(kv, rows->n, &b));
    float *cache = dsc_mem_ptr(kv->k.pool, kv->k.block); // re-read: the pool may have moved it
    float *x = b.x;
    DSC_TRY(hook(hooks, 0, 0));
    embed(kv, x, params[0], params[1], rows);
    DSC_TRY(hook(hooks, 1, 0));
    for (int l = 0; l < kv->c.n_layer; l++) {
        DSC_TRY(hook(hooks, 0, 1 + l));
        DSC_TRY(layer(kv, cache, params + 2 + l * PER_LAYER, tp, rows, &b, &x, l));
        DSC_TRY(hook(hooks, 1, 1 + l));
    }
    if (rows->nout == 0) return DSC_OK;
    return head(kv, params, rows, hooks, &b, x, logits);
}
