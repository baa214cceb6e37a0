// model/lora.c - low-rank adapters beside a model's frozen linear weights (LoRA, as PEFT's
// LoraConfig defines it): the table of adapters, their initial values and their passes.
//
// An adapter on a linear weight W (out x in) is A (r x in) and B (out x r); the product's output
// gains scale * (x A^T) B^T. The forward keeps x A^T (N x r) per adapter for the backward, which
// adds scale * dout^T (x A^T) to B's gradient, scale * (dout B)^T x to A's and scale * (dout B) A
// to the input's. Every product is a dsc__model_sgemm (fixed chunks: bits independent of the
// thread count).
#include <math.h>   // sqrt, log, cos
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free
#include <string.h> // strcmp, strrchr, strlen

#include "base/status.h" // dsc__fail
#include "dsc/memory.h"  // dsc_mem_pool
#include "model/blas.h"  // dsc__model_sgemm
#include "model/lora.h"  // dsc__lora_*

// ---- names ----

// The module of a tensor name: "model.layers.0.self_attn.q_proj.weight" -> its length without
// ".weight", and the leaf "q_proj" (*leaf, *leaf_len). False when the name is not "<module>.weight".
static bool module_of(const char *name, size_t *mod_len, const char **leaf, size_t *leaf_len) {
    size_t n = strlen(name);
    static const char suffix[] = ".weight";
    if (n <= sizeof suffix - 1 || strcmp(name + n - (sizeof suffix - 1), suffix)) return false;
    *mod_len = n - (sizeof suffix - 1);
    const char *l = name + *mod_len;
    while (l > name && l[-1] != '.') l--;
    *leaf = l;
    *leaf_len = (size_t)(name + *mod_len - l);
    return true;
}

static bool leaf_is(const char *name, const char *want) {
    size_t ml, ll;
    const char *leaf;
    return module_of(name, &ml, &leaf, &ll) && strlen(want) == ll && !strncmp(leaf, want, ll);
}

// A linear weight of a layer: two dimensions, "<module>.weight", in a layer group (not the
// embeddings' group 0 nor the head's last group: PEFT's "all-linear" leaves the output layer out).
static bool is_linear(const dsc_model_param *p, int num_groups) {
    size_t ml, ll;
    const char *leaf;
    return p->ndim == 2 && p->group > 0 && p->group < num_groups - 1 &&
           module_of(p->name, &ml, &leaf, &ll);
}

// "q_proj, k_proj, ..." of the model's linear modules (each leaf once), for messages.
static void list_leaves(const dsc_model_param *ps, int n, int num_groups, bool linear, char *buf,
                        size_t cap) {
    size_t k = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && k + 1 < cap; i++) {
        size_t ml, ll;
        const char *leaf;
        if (!module_of(ps[i].name, &ml, &leaf, &ll)) continue;
        if (linear != is_linear(&ps[i], num_groups)) continue;
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) {
            size_t ml2, ll2;
            const char *leaf2;
            seen = module_of(ps[j].name, &ml2, &leaf2, &ll2) &&
                   linear == is_linear(&ps[j], num_groups) && ll2 == ll &&
                   !strncmp(leaf, leaf2, ll);
        }
        if (!seen)
            k += (size_t)snprintf(buf + k, cap - k, "%s%.*s", k ? ", " : "", (int)ll, leaf);
    }
}

// ---- the table ----

dsc_status dsc__lora_create(dsc_lora **out, const dsc_model_param *ps, int n, int num_groups,
                            bool weights_in_out, const dsc_model_lora *o, const char *spec) {
    *out = NULL;
    if (o->r < 1)
        return dsc__fail(DSC_ERR_CONFIG, "lora.r is %d; the rank must be at least 1", o->r);
    if (!(o->dropout >= 0 && o->dropout < 1))
        return dsc__fail(DSC_ERR_CONFIG, "lora.lora_dropout is %g; give a probability in [0, 1)",
                         o->dropout);
    if (!(o->alpha >= 0))
        return dsc__fail(DSC_ERR_CONFIG, "lora.lora_alpha is %g; it must be >= 0", o->alpha);
    char have[1024];
    for (int t = 0; t < o->ntargets; t++) {
        bool hit = false;
        for (int i = 0; i < n && !hit; i++)
            hit = is_linear(&ps[i], num_groups) && leaf_is(ps[i].name, o->targets[t]);
        if (!hit) {
            list_leaves(ps, n, num_groups, true, have, sizeof have);
            return dsc__fail(DSC_ERR_CONFIG, "lora.target_modules: \"%s\" is no linear module of "
                             "model %s; its linear modules are %s (or \"all-linear\")",
                             o->targets[t], spec, have);
        }
    }
    for (int s = 0; s < o->nsave; s++) {
        bool hit = false;
        for (int i = 0; i < n && !hit; i++) hit = leaf_is(ps[i].name, o->save[s]);
        if (!hit) {
            char lin[1024];
            list_leaves(ps, n, num_groups, false, have, sizeof have);
            list_leaves(ps, n, num_groups, true, lin, sizeof lin);
            return dsc__fail(DSC_ERR_CONFIG, "lora.modules_to_save: \"%s\" is no module of model "
                             "%s; its modules are %s, %s (a model that ties its output layer to "
                             "the embeddings has no lm_head of its own)", o->save[s], spec, have,
                             lin);
        }
    }
    dsc_lora *lo = calloc(1, sizeof *lo);
    if (!lo) return dsc__fail(DSC_ERR_OOM, "out of memory for the LoRA table");
    *out = lo;
    lo->n_base = n;
    lo->r = o->r;
    lo->scale = (float)(o->rslora ? o->alpha / sqrt((double)o->r) : o->alpha / o->r);
    lo->init = o->init;
    lo->alpha = o->alpha;
    lo->rslora = o->rslora;
    lo->dropout = (float)o->dropout;
    lo->seed = o->seed;
    lo->training = true;
    lo->adapter_of = malloc((size_t)n * sizeof *lo->adapter_of);
    lo->trainable = calloc((size_t)n, sizeof *lo->trainable);
    lo->base = malloc((size_t)n * sizeof *lo->base);
    lo->in = malloc((size_t)n * sizeof *lo->in);
    lo->out = malloc((size_t)n * sizeof *lo->out);
    if (!lo->adapter_of || !lo->trainable || !lo->base || !lo->in || !lo->out)
        return dsc__fail(DSC_ERR_OOM, "out of memory for the LoRA table");
    for (int i = 0; i < n; i++) {
        lo->adapter_of[i] = -1;
        bool target = is_linear(&ps[i], num_groups) && !o->ntargets;
        for (int t = 0; t < o->ntargets && !target; t++)
            target = is_linear(&ps[i], num_groups) && leaf_is(ps[i].name, o->targets[t]);
        for (int s = 0; s < o->nsave; s++)
            if (leaf_is(ps[i].name, o->save[s])) lo->trainable[i] = true;
        if (!target) continue;
        int k = lo->n_adapters++;
        lo->adapter_of[i] = k;
        lo->base[k] = i;
        lo->in[k] = (int)ps[i].shape[weights_in_out ? 0 : 1];
        if (lo->in[k] > lo->max_in) lo->max_in = lo->in[k];
        lo->out[k] = (int)ps[i].shape[weights_in_out ? 1 : 0];
    }
    if (!lo->n_adapters)
        return dsc__fail(DSC_ERR_CONFIG, "lora: model %s has no linear module to adapt", spec);
    return DSC_OK;
}

void dsc__lora_destroy(dsc_lora *lo) {
    if (!lo) return;
    dsc__lora_release(lo);
    free(lo->adapter_of);
    free(lo->trainable);
    free(lo->base);
    free(lo->in);
    free(lo->out);
    free(lo);
}

void dsc__lora_param(const dsc_lora *lo, const dsc_model_param *base, int k, bool is_b,
                     dsc_model_param *out) {
    size_t ml = 0, ll;
    const char *leaf;
    module_of(base->name, &ml, &leaf, &ll);
    *out = (dsc_model_param){.ndim = 2, .group = base->group};
    snprintf(out->name, sizeof out->name, "%.*s.lora_%c.weight", (int)ml, base->name,
             is_b ? 'B' : 'A');
    out->shape[0] = is_b ? lo->out[k] : lo->r;
    out->shape[1] = is_b ? lo->r : lo->in[k];
    out->numel = out->shape[0] * out->shape[1];
}

// splitmix64's finalizer: every input bit reaches every output bit.
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A uniform in [0, 1) from (seed, tensor, element): order-free, so any slice can be made alone.
static double hash_uniform(uint64_t seed, int tensor, int64_t e, int draw) {
    uint64_t z = seed ^ ((uint64_t)(tensor + 1) * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)e * 0xD1B54A32D192ED03ull) ^ ((uint64_t)draw << 62);
    return (double)(mix64(z + 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53;
}

// As PEFT initialises them: A Kaiming-uniform with a = sqrt(5) (U(-1/sqrt(in), 1/sqrt(in))), or
// normal with std 1/r ("gaussian"); B zero, or (init_lora_weights false) torch's default for a
// Linear(r, out): U(-1/sqrt(r), 1/sqrt(r)).
void dsc__lora_init(const dsc_lora *lo, int k, bool is_b, float *dst, int64_t begin,
                    int64_t count, uint64_t seed) {
    int tensor = lo->n_base + 2 * k + (is_b ? 1 : 0);
    for (int64_t j = 0; j < count; j++) {
        int64_t e = begin + j;
        double u = hash_uniform(seed, tensor, e, 0);
        if (is_b) {
            dst[j] = lo->init == 2 ? (float)((2 * u - 1) / sqrt((double)lo->r)) : 0.0f;
        } else if (lo->init == 1) {
            double u2 = hash_uniform(seed, tensor, e, 1);
            dst[j] = (float)(sqrt(-2 * log(1 - u)) * cos(2 * M_PI * u2) / lo->r);
        } else {
            dst[j] = (float)((2 * u - 1) / sqrt((double)lo->in[k]));
        }
    }
}

// ---- activations ----

dsc_status dsc__lora_reserve(dsc_lora *lo, int64_t N) {
    dsc__lora_release(lo);
    lo->maxN = N;
    lo->xa = malloc((size_t)lo->n_adapters * (size_t)N * (size_t)lo->r * sizeof(float));
    lo->t = malloc((size_t)N * (size_t)lo->r * sizeof(float));
    if (lo->dropout > 0) lo->xd = malloc((size_t)N * (size_t)lo->max_in * sizeof(float));
    if (!lo->xa || !lo->t || (lo->dropout > 0 && !lo->xd))
        return dsc__fail(DSC_ERR_OOM, "out of memory for the LoRA activations (%lld tokens, "
                         "%d adapters of rank %d)", (long long)N, lo->n_adapters, lo->r);
    return DSC_OK;
}

void dsc__lora_release(dsc_lora *lo) {
    free(lo->xa);
    free(lo->t);
    free(lo->xd);
    lo->xa = lo->t = lo->xd = NULL;
}

size_t dsc__lora_act_bytes(const dsc_lora *lo, int64_t N) {
    size_t xd = lo->dropout > 0 ? (size_t)N * (size_t)lo->max_in * sizeof(float) : 0;
    return ((size_t)lo->n_adapters + 1) * (size_t)N * (size_t)lo->r * sizeof(float) + xd;
}

// ---- dropout ----

static inline bool kept(const dsc_lora *lo, int k, int64_t row, int col) {
    return dsc__lora_kept(lo->seed, lo->pass, k, row, col, lo->dropout);
}

static bool drops(const dsc_lora *lo) { return lo->dropout > 0 && lo->training; }

// xd = dropout(x) (N rows of in, ld in): kept elements scaled by 1 / (1 - p), as torch's Dropout.
static void drop_input(const dsc_lora *lo, int k, const float *x, int ldx, int64_t N) {
    int in = lo->in[k];
    float keep = 1.0f / (1.0f - lo->dropout);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < N; r++)
        for (int c = 0; c < in; c++)
            lo->xd[(size_t)r * in + c] = kept(lo, k, r, c) ? x[(size_t)r * ldx + c] * keep : 0.0f;
}

void dsc__lora_next_pass(dsc_lora *lo) {
    if (drops(lo)) lo->pass++;
}

// ---- passes ----

static int adapter(const dsc_lora *lo, int tensor) {
    return lo && tensor >= 0 && tensor < lo->n_base ? lo->adapter_of[tensor] : -1;
}

void dsc_lora_forward(const dsc_lora *lo, int tensor, float *out, int ldo, const float *inp,
                      int ldi, int64_t N) {
    int k = adapter(lo, tensor);
    if (k < 0) return;
    int r = lo->r, in = lo->in[k], o = lo->out[k];
    const float *A = lo->params[lo->n_base + 2 * k], *B = lo->params[lo->n_base + 2 * k + 1];
    float *xa = lo->xa + (size_t)k * (size_t)lo->maxN * (size_t)r;
    if (drops(lo)) {
        drop_input(lo, k, inp, ldi, N);
        inp = lo->xd;
        ldi = in;
    }
    dsc__model_sgemm(0, 1, (int)N, r, in, 1.0f, inp, ldi, A, in, 0.0f, xa, r);
    dsc__model_sgemm(0, 1, (int)N, o, r, lo->scale, xa, r, B, r, 1.0f, out, ldo);
}

void dsc_lora_backward_weights(const dsc_lora *lo, int tensor, const float *dout, int ldd,
                               const float *inp, int ldi, int64_t N) {
    int k = adapter(lo, tensor);
    if (k < 0) return;
    int r = lo->r, in = lo->in[k], o = lo->out[k];
    const float *B = lo->params[lo->n_base + 2 * k + 1];
    float *gA = lo->grads[lo->n_base + 2 * k], *gB = lo->grads[lo->n_base + 2 * k + 1];
    const float *xa = lo->xa + (size_t)k * (size_t)lo->maxN * (size_t)r;
    if (gB) dsc__model_sgemm(1, 0, o, r, (int)N, lo->scale, dout, ldd, xa, r, 1.0f, gB, r);
    dsc__model_sgemm(0, 0, (int)N, r, o, 1.0f, dout, ldd, B, r, 0.0f, lo->t, r);
    if (drops(lo)) { // A saw the dropped-out input
        drop_input(lo, k, inp, ldi, N);
        inp = lo->xd;
        ldi = in;
    }
    if (gA) dsc__model_sgemm(1, 0, r, in, (int)N, lo->scale, lo->t, r, inp, ldi, 1.0f, gA, in);
}

void dsc_lora_backward_input(const dsc_lora *lo, int tensor, float *dinp, int lddi, int64_t N) {
    int k = adapter(lo, tensor);
    if (k < 0 || !dinp) return;
    int r = lo->r, in = lo->in[k];
    const float *A = lo->params[lo->n_base + 2 * k];
    if (!drops(lo)) {
        dsc__model_sgemm(0, 0, (int)N, in, r, lo->scale, lo->t, r, A, in, 1.0f, dinp, lddi);
        return;
    }
    // Through the dropout: the kept elements' gradient, scaled as the forward scaled them.
    dsc__model_sgemm(0, 0, (int)N, in, r, lo->scale, lo->t, r, A, in, 0.0f, lo->xd, in);
    float keep = 1.0f / (1.0f - lo->dropout);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < N; row++)
        for (int c = 0; c < in; c++)
            if (kept(lo, k, row, c))
                dinp[(size_t)row * lddi + c] += lo->xd[(size_t)row * in + c] * keep;
}

void dsc_lora_backward(const dsc_lora *lo, int tensor, float *dinp, int lddi, const float *dout,
                       int ldd, const float *inp, int ldi, int64_t N) {
    dsc_lora_backward_weights(lo, tensor, dout, ldd, inp, ldi, N);
    dsc_lora_backward_input(lo, tensor, dinp, lddi, N);
}

int dsc_lora_base_of(const dsc_lora *lo, int i) {
    if (!lo || i < lo->n_base || i >= lo->n_base + 2 * lo->n_adapters) return -1;
    return lo->base[(i - lo->n_base) / 2];
}

int dsc_lora_rank(const dsc_lora *lo) { return lo ? lo->r : 0; }
double dsc_lora_scale(const dsc_lora *lo) { return lo ? lo->scale : 0; }
double dsc_lora_alpha(const dsc_lora *lo) { return lo ? lo->alpha : 0; }
bool dsc_lora_rslora(const dsc_lora *lo) { return lo && lo->rslora; }
double dsc_lora_dropout(const dsc_lora *lo) { return lo ? lo->dropout : 0; }
