// model/common.c - the families' shared pieces of a host pass (see common.h).
#include "model/common.h"

#include <math.h>   // sqrt, log, cos, sin
#include <stdio.h>  // snprintf
#include <stdlib.h> // aligned_alloc
#include <string.h> // strcmp, strlen, strncmp

#include "base/status.h"   // dsc__fail, dsc__error_prefix
#include "base/time.h"     // dsc_now
#include "model/blas.h"    // dsc__model_blas_single_thread
#include "model/kernels.h" // dsc__model_xent_forward

dsc_status dsc__model_hook(const dsc_model_hooks *h, enum dsc__hook_kind kind, int group,
                           const char *family) {
    if (!h) return DSC_OK;
    static const char *const names[] = {"gather", "release", "grads_ready"};
    dsc_status (*fn)(void *, int) = kind == DSC__HOOK_GATHER    ? h->gather
                                    : kind == DSC__HOOK_RELEASE ? h->release
                                                                : h->grads_ready;
    if (!fn) return DSC_OK;
    dsc_status st = fn(h->user, group);
    if (st != DSC_OK) dsc__error_prefix("%s: %s hook of group %d: ", family, names[kind], group);
    return st;
}

dsc_status dsc_model_layers_forward(const dsc_model_hooks *h, const char *family, int L,
                                    void (*layer)(void *m, float *const *params, int l),
                                    void *m, float *const *params) {
    for (int l = 0; l < L; l++) {
        DSC_TRY(dsc__model_hook(h, DSC__HOOK_GATHER, 1 + l, family));
        layer(m, params, l);
        DSC_TRY(dsc__model_hook(h, DSC__HOOK_RELEASE, 1 + l, family));
    }
    return DSC_OK;
}

dsc_status dsc_model_layers_backward(const dsc_model_hooks *h, const char *family, int L,
                                     void (*layer)(void *m, float *const *params,
                                                   float *const *grads, int l),
                                     void (*recompute)(void *m, float *const *params, int l),
                                     void *m, float *const *params, float *const *grads) {
    for (int l = L - 1; l >= 0; l--) {
        DSC_TRY(dsc__model_hook(h, DSC__HOOK_GATHER, 1 + l, family));
        if (recompute) recompute(m, params, l);
        layer(m, params, grads, l);
        DSC_TRY(dsc__model_hook(h, DSC__HOOK_RELEASE, 1 + l, family));
        DSC_TRY(dsc__model_hook(h, DSC__HOOK_GRADS_READY, 1 + l, family));
    }
    return DSC_OK;
}

dsc_status dsc__model_check_tokens(const int32_t *tok, const char *family, const char *what,
                                   int B, int T, int V, bool ignored_ok) {
    for (int64_t i = 0; i < (int64_t)B * T; i++) {
        if (tok[i] < V && (tok[i] >= 0 || ignored_ok)) continue;
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s forward: %s[b=%d, t=%d] = %d is outside the vocabulary [0, %d)%s; "
                         "check the tokenizer and vocab_size",
                         family, what, (int)(i / T), (int)(i % T), tok[i], V,
                         ignored_ok ? " (negative = ignored)" : "");
    }
    return DSC_OK;
}

dsc_status dsc__model_check_tensors(const struct dsc_model_ops *ops, const void *cfg, int n,
                                    float *const *t, const char *what,
                                    const dsc_model_hooks *hooks, const bool *required) {
    if (!t) return dsc__fail(DSC_ERR_INVALID_ARG, "%s: the %s array is NULL", ops->family, what);
    if (hooks && hooks->gather) return DSC_OK;
    for (int i = 0; i < n; i++) {
        if (t[i] || (required && !required[i])) continue;
        dsc_model_param p;
        ops->param(cfg, i, &p);
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: %s[%d] (%s) is NULL", ops->family, what, i,
                         p.name);
    }
    return DSC_OK;
}

dsc_status dsc__model_check_create(const char *family, int B, int T, int max_seq_len) {
    if (B < 1 || T < 1 || T > max_seq_len || (int64_t)B * T > (1 << 24))
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s create: batch %d x %d is invalid; need B >= 1, 1 <= T <= "
                         "max_seq_len (%d), and B * T <= 16M tokens",
                         family, B, T, max_seq_len);
    return DSC_OK;
}

dsc_status dsc__model_check_batch(const char *family, int B, int T, int maxB, int maxT) {
    if (B < 1 || T < 1 || B > maxB || T > maxT)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s forward: batch %d x %d does not fit the %d x %d this model was "
                         "created for; create it with the larger size",
                         family, B, T, maxB, maxT);
    return DSC_OK;
}

dsc_status dsc__model_check_backward(const char *family, bool has_model, bool after_loss) {
    if (!has_model) return dsc__fail(DSC_ERR_INVALID_ARG, "%s backward: model is NULL", family);
    if (!after_loss)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s backward: needs a forward with targets first, and each such "
                         "forward allows one backward (it consumes the logits)",
                         family);
    return DSC_OK;
}

float dsc__model_mean_loss(const float *losses, const int32_t *targets, int64_t n,
                           int64_t *counted) {
    double sum = 0.0;
    *counted = 0;
    for (int64_t i = 0; i < n; i++) {
        sum += losses[i]; // 0 at ignored positions
        *counted += targets[i] >= 0;
    }
    return *counted ? (float)(sum / (double)*counted) : 0.0f;
}

dsc_status dsc__model_check_rows(const dsc_model_rows *r, int nseq, int max_len, int V,
                                 const char *family) {
    if (r->n < 1 || !r->seq || !r->pos || !r->tokens || r->nout < 0 || (r->nout && !r->out))
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s inference: no rows, or a NULL row array",
                         family);
    for (int i = 0; i < r->n; i++) {
        if (r->seq[i] < 0 || r->seq[i] >= nseq || r->pos[i] < 0 || r->pos[i] >= max_len)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "%s inference: row %d (sequence %d, position %d) is outside the "
                             "cache of %d sequences x %d positions",
                             family, i, r->seq[i], r->pos[i], nseq, max_len);
        if (r->tokens[i] < 0 || r->tokens[i] >= V)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "%s inference: token %d of row %d is outside the vocabulary "
                             "[0, %d); check the tokenizer",
                             family, r->tokens[i], i, V);
    }
    for (int j = 0; j < r->nout; j++)
        if (r->out[j] < 0 || r->out[j] >= r->n)
            return dsc__fail(DSC_ERR_INVALID_ARG, "%s inference: output row %d is not a row",
                             family, r->out[j]);
    return DSC_OK;
}

int dsc__model_find_param(const dsc_param_desc *t, int count, const char *want,
                          const char *strip) {
    size_t ns = strip ? strlen(strip) : 0;
    for (int j = 0; j < count; j++) {
        const char *n = t[j].name;
        if (ns && !strncmp(n, strip, ns)) n += ns;
        if (!strcmp(n, want)) return j;
    }
    return -1;
}

dsc_status dsc__model_match_params(const dsc_param_desc *t, int count, const char *strip,
                                   void (*param)(const void *cfg, int i, dsc_model_param *out),
                                   const void *cfg, int n, const char *what, const char *whole,
                                   const char *shape, int *order) {
    for (int k = 0; k < n; k++) {
        dsc_model_param p;
        param(cfg, k, &p);
        int j = dsc__model_find_param(t, count, p.name, strip);
        if (j < 0)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "%s: tensor %s is missing; the file is not a complete %s", what,
                             p.name, whole);
        if (t[j].ndim != p.ndim || t[j].shape[0] != p.shape[0] ||
            (p.ndim == 2 && t[j].shape[1] != p.shape[1]))
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "%s: tensor %s has shape (%lld, %lld), %s needs (%lld, %lld); the "
                             "weights are inconsistent",
                             what, p.name, (long long)t[j].shape[0],
                             (long long)(t[j].ndim == 2 ? t[j].shape[1] : 0), shape,
                             (long long)p.shape[0], (long long)p.shape[1]);
        order[k] = j;
    }
    return DSC_OK;
}

dsc_status dsc__model_check_kv(const char *family, int nseq, int max_len, int context) {
    if (nseq < 1 || max_len < 1 || max_len > context)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s kv cache: %d sequences of %d positions is invalid; need at least "
                         "one sequence and 1 <= positions <= the context (%d)",
                         family, nseq, max_len, context);
    return DSC_OK;
}

dsc_status dsc__model_kv_alloc(size_t bytes, dsc_mem_pool **pool, dsc_mem_handle *block) {
    DSC_TRY(dsc_mem_default_pool(DSC_MEM_HOST, pool));
    return dsc_mem_alloc(*pool, bytes, "infer.kv_cache", block);
}

dsc_status dsc__model_rows_slab(float **slab, int *cap, int n, size_t nfloats, const char *family) {
    if (n <= *cap) return DSC_OK;
    free(*slab);
    *cap = 0;
    *slab = aligned_alloc(64, nfloats * sizeof(float));
    if (!*slab)
        return dsc__fail(DSC_ERR_OOM,
                         "%s inference: out of memory for %d rows of activations; generate fewer "
                         "or shorter prompts at once",
                         family, n);
    *cap = n;
    return DSC_OK;
}

size_t dsc__carve(const dsc__view *v, size_t n, float *slab) {
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        if (slab) *v[i].view = slab + off;
        off += (v[i].n + 15) / 16 * 16;
    }
    return off;
}

dsc_status dsc__slab_alloc(dsc__slab *s, dsc_mem_pool *pool, size_t nfloats, const char *tag) {
    size_t bytes = nfloats * sizeof(float);
    s->pool = pool;
    if (!pool) {
        s->h = 0;
        s->p = aligned_alloc(64, (bytes + 63) / 64 * 64);
        return s->p ? DSC_OK : DSC_ERR_OOM;
    }
    DSC_TRY(dsc_mem_alloc(pool, bytes, tag, &s->h));
    s->p = dsc_mem_ptr(pool, s->h);
    s->gen = dsc_mem_generation(pool);
    return DSC_OK;
}

bool dsc__slab_moved(dsc__slab *s) {
    if (!s->pool || dsc_mem_generation(s->pool) == s->gen) return false;
    s->p = dsc_mem_ptr(s->pool, s->h);
    s->gen = dsc_mem_generation(s->pool);
    return true;
}

void dsc__slab_free(dsc__slab *s) {
    if (s->pool) dsc_mem_free(s->pool, s->h);
    else free(s->p);
}

dsc_status dsc__slab_fail(dsc_status st, const dsc_mem_pool *pool, const char *family,
                          size_t nfloats, int B, int T) {
    if (st != DSC_OK && pool) { // the pool's message names its largest users
        dsc__error_prefix("%s create: activations for batch %d x %d (lower the micro-batch size "
                          "or the sequence length): ",
                          family, B, T);
        return st;
    }
    return dsc__fail(DSC_ERR_OOM,
                     "%s create: cannot allocate %.2f GiB of activations for batch %d x %d; "
                     "lower the micro-batch size or the sequence length",
                     family, (double)nfloats * sizeof(float) / (1u << 30), B, T);
}

// ---- a family's host model ----

void dsc__host_init(dsc__host *h, const char *family, const struct dsc_model_ops *ops,
                    const void *cfg, int ntensors, int vocab, const bool *grads_required, int B,
                    int T, int n_head) {
    *h = (dsc__host){.family = family, .ops = ops, .cfg = cfg, .ntensors = ntensors,
                     .vocab = vocab, .grads_required = grads_required, .maxB = B, .maxT = T};
    // one (T, T) pair per thread, but no more than there are heads
    h->att_slots = dsc__model_max_threads();
    if (h->att_slots > B * n_head) h->att_slots = B * n_head;
}

static size_t token_bytes(const dsc__host *h) {
    return sizeof(int32_t) * 3 * (size_t)h->maxB * h->maxT;
}

dsc_status dsc__host_alloc(dsc__host *h, dsc_mem_pool *pool, size_t nfloats, const char *tag) {
    dsc_status st = dsc__slab_alloc(&h->acts, pool, nfloats, tag);
    h->tokens = malloc(token_bytes(h));
    if (st != DSC_OK || !h->tokens)
        return dsc__slab_fail(st, pool, h->family, nfloats, h->maxB, h->maxT);
    dsc__model_blas_single_thread();
    return DSC_OK;
}

void dsc__host_free(dsc__host *h) {
    dsc__slab_free(&h->acts);
    free(h->tokens);
    h->tokens = NULL;
}

size_t dsc__host_bytes(const dsc__host *h, size_t nfloats) {
    return nfloats * sizeof(float) + token_bytes(h);
}

dsc_status dsc__host_check_tensors(const dsc__host *h, float *const *t, const char *what,
                                   const dsc_model_hooks *hooks) {
    const bool *required = !strcmp(what, "grads") ? h->grads_required : NULL;
    return dsc__model_check_tensors(h->ops, h->cfg, h->ntensors, t, what, hooks, required);
}

dsc_status dsc__host_forward_begin(dsc__host *h, const char *family, float *const *params,
                                   const int32_t *inputs, const int32_t *pos,
                                   const int32_t *targets, int B, int T,
                                   const dsc_model_hooks *hooks, int pos_limit,
                                   const char *pos_what) {
    if (!h || !inputs)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s forward: model or inputs NULL", family);
    DSC_TRY(dsc__model_check_batch(family, B, T, h->maxB, h->maxT));
    DSC_TRY(dsc__host_check_tensors(h, params, "params", hooks));
    DSC_TRY(dsc__model_check_tokens(inputs, family, "inputs", B, T, h->vocab, false));
    if (targets) DSC_TRY(dsc__model_check_tokens(targets, family, "targets", B, T, h->vocab, true));
    int64_t BT = (int64_t)B * T;
    for (int64_t i = 0; pos && i < BT; i++)
        if (pos[i] < 0 || pos[i] >= pos_limit)
            return dsc__fail(DSC_ERR_INVALID_ARG, "%s forward: position id [b=%d, t=%d] = %d is "
                             "outside [0, %d), %s", family, (int)(i / T), (int)(i % T), pos[i],
                             pos_limit, pos_what);
    dsc__model_blas_single_thread(); // cheap; in case someone changed it since create
    h->pass = DSC__PASS_NONE;
    h->B = B;
    h->T = T;
    memcpy(h->tokens, inputs, sizeof(int32_t) * (size_t)BT);
    if (targets) memcpy(h->tokens + BT, targets, sizeof(int32_t) * (size_t)BT);
    h->has_pos = pos != NULL;
    if (pos) memcpy(h->tokens + 2 * (int64_t)h->maxB * h->maxT, pos, sizeof(int32_t) * (size_t)BT);
    return DSC_OK;
}

dsc_status dsc__host_backward_begin(dsc__host *h, const char *family, float *const *params,
                                    float *const *grads, const dsc_model_hooks *hooks) {
    DSC_TRY(dsc__model_check_backward(family, h != NULL, h && h->pass == DSC__PASS_LOSS));
    DSC_TRY(dsc__host_check_tensors(h, params, "params", hooks));
    DSC_TRY(dsc__host_check_tensors(h, grads, "grads", hooks));
    dsc__model_blas_single_thread();
    h->pass = DSC__PASS_NONE;
    return DSC_OK;
}

dsc_status dsc__kv_init(dsc__kv *k, const char *family, int tp, int nseq, int max_len,
                        size_t bytes) {
    *k = (dsc__kv){.tp = tp, .nseq = nseq, .max_len = max_len};
    k->att_slots = dsc__model_max_threads();
    k->att = malloc(sizeof(float) * (size_t)k->att_slots * (size_t)max_len);
    dsc_status st = k->att ? DSC_OK : dsc__fail(DSC_ERR_OOM, "%s kv cache: out of memory", family);
    if (st == DSC_OK) st = dsc__model_kv_alloc(bytes, &k->pool, &k->block);
    if (st != DSC_OK)
        dsc__error_prefix("%s kv cache for %d sequences x %d positions: ", family, nseq, max_len);
    return st;
}

void dsc__kv_free(dsc__kv *k) {
    if (k->pool) dsc_mem_free(k->pool, k->block);
    free(k->slab);
    free(k->att);
    *k = (dsc__kv){0};
}

void dsc__host_loss(dsc__host *h, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int64_t BT, int V, float *loss, int slot) {
    double t0 = dsc__model_lap_start(h->times);
    dsc__model_xent_forward(losses, lse, logits, targets, BT, V);
    float mean = dsc__model_mean_loss(losses, targets, BT, &h->ntargets);
    if (loss) *loss = mean;
    dsc__model_lap(h->times, &t0, slot);
}

void dsc__host_recompute(void *state, float *const *params, int l) {
    dsc__host *h = state;
    double *times = h->times;
    h->times = NULL;
    h->layer_forward(state, params, l);
    h->times = times;
}

int64_t dsc__model_numel(const struct dsc_model_ops *ops, const void *cfg, int n) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        dsc_model_param p;
        ops->param(cfg, i, &p);
        total += p.numel;
    }
    return total;
}

void dsc__model_init_all(const struct dsc_model_ops *ops, const void *cfg, int n,
                         float *const *params, uint64_t seed) {
    for (int i = 0; i < n; i++) {
        dsc_model_param p;
        ops->param(cfg, i, &p);
        ops->init(cfg, i, params[i], 0, p.numel, seed);
    }
}

int dsc__tree_add(dsc__tree *t, int depth, const char *type, int64_t params, double flops,
                  int slot, const char *name) {
    if (t->out) {
        dsc_model_module *m = &t->out[t->n];
        *m = (dsc_model_module){.depth = depth, .params = params, .fwd_flops = flops,
                                .slot = slot};
        snprintf(m->name, sizeof m->name, "%s", name);
        snprintf(m->type, sizeof m->type, "%s", type);
    }
    return t->n++;
}

void dsc__tree_roll_up(dsc__tree *t, int parent, int child) {
    if (!t->out) return;
    t->out[parent].params += t->out[child].params;
    t->out[parent].fwd_flops += t->out[child].fwd_flops;
}

int dsc__tree_child(dsc__tree *t, int parent, int depth, const char *type, int64_t params,
                    double flops, int slot, const char *name) {
    int child = dsc__tree_add(t, depth, type, params, flops, slot, name);
    dsc__tree_roll_up(t, parent, child);
    return child;
}

double dsc__model_lap_start(const double *times) { return times ? dsc_now() : 0; }

void dsc__model_lap(double *times, double *t0, int slot) {
    if (!times) return;
    double now = dsc_now();
    times[slot] += now - *t0;
    *t0 = now;
}

// ---- initialisation ----

#define GOLDEN 0x9E3779B97F4A7C15ull

// splitmix64's output function: a bijective 64-bit mixer.
static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Element e of the standard-normal stream `key`: elements 2p and 2p+1 are the cosine and sine
// halves of one Box-Muller pair, made from splitmix64 outputs 2p+1 and 2p+2 of that stream.
static double normal_at(uint64_t key, int64_t e) {
    uint64_t pair = (uint64_t)e >> 1;
    uint64_t h1 = mix64(key + (2 * pair + 1) * GOLDEN);
    uint64_t h2 = mix64(key + (2 * pair + 2) * GOLDEN);
    double u1 = (double)((h1 >> 11) + 1) * 0x1.0p-53; // (0, 1]: log stays finite
    double u2 = (double)(h2 >> 11) * 0x1.0p-53;       // [0, 1)
    double r = sqrt(-2.0 * log(u1));
    double a = 6.283185307179586 * u2;
    return (e & 1) ? r * sin(a) : r * cos(a);
}

void dsc__model_init_normal(float *dst, int i, int64_t begin, int64_t count, double std,
                            uint64_t seed) {
    uint64_t key = mix64(seed ^ mix64((uint64_t)i * GOLDEN + 1));
    // Pair by pair: both halves of a Box-Muller pair share its hashes, log and sqrt (the values
    // are normal_at's, bit for bit; an unpaired first or last element goes through normal_at).
    int64_t lo = begin, hi = begin + count;
    if (count > 0 && (lo & 1)) {
        dst[0] = (float)(std * normal_at(key, lo));
        lo++;
    }
    if (hi > lo && (hi & 1)) {
        dst[hi - 1 - begin] = (float)(std * normal_at(key, hi - 1));
        hi--;
    }
#pragma omp parallel for schedule(static)
    for (int64_t e = lo; e < hi; e += 2) {
        uint64_t pair = (uint64_t)e >> 1;
        uint64_t h1 = mix64(key + (2 * pair + 1) * GOLDEN);
        uint64_t h2 = mix64(key + (2 * pair + 2) * GOLDEN);
        double u1 = (double)((h1 >> 11) + 1) * 0x1.0p-53, u2 = (double)(h2 >> 11) * 0x1.0p-53;
        double r = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
        dst[e - begin] = (float)(std * (r * cos(a)));
        dst[e + 1 - begin] = (float)(std * (r * sin(a)));
    }
}
