// model/gpt2/gpt2.c - GPT-2 configuration, parameter table, initialisation, and the forward and
// backward passes, composed from the kernels of kernels.c.
#include "model/gpt2/gpt2.h"

#include <ctype.h>  // isdigit
#include <errno.h>  // errno
#include <math.h>   // sqrt
#include <stdbool.h> // bool
#include <stdio.h>  // snprintf
#include <stdlib.h> // aligned_alloc, calloc, free, strtol
#include <string.h> // memset, memcpy, strcmp

#include "base/status.h"        // dsc__fail, dsc__error_prefix, DSC_TRY
#include "model/blas.h"         // dsc__model_blas_single_thread
#include "model/common.h"       // dsc__model_hook, dsc__model_check_*, dsc__model_init_normal
#include "model/gpt2/kernels.h" // dsc__gpt2_*
#include "model/kernels.h"      // dsc__model_xent_*
#include "model/linear.h"       // dsc__linear_*
#include "model/lora.h"         // struct dsc_lora (its trainable base tensors)
#include "model/gpt2/model.h"   // dsc__gpt2_model_ops
// ---- configuration and parameter table ----

#define VALID_SPECS                                                                            \
    "gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M, or dN (N layers, N heads, 64N channels, "    \
    "1 <= N <= 256, e.g. d12)"

static const struct {
    const char *name;
    int n_layer, n_head, n_embd;
} named_specs[] = {
    {"gpt2-124M", 12, 12, 768},
    {"gpt2-350M", 24, 16, 1024},
    {"gpt2-774M", 36, 20, 1280},
    {"gpt2-1558M", 48, 25, 1600},
};

// The twelve tensors of a layer, in table order.
enum {
    K_LN1W, K_LN1B, K_ATTW, K_ATTB, K_APROJW, K_APROJB,
    K_LN2W, K_LN2B, K_FCW, K_FCB, K_MPROJW, K_MPROJB, PER_LAYER
};
static const char *const layer_names[PER_LAYER] = {
    "ln_1.weight",     "ln_1.bias",       "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",     "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias",   "mlp.c_proj.weight",  "mlp.c_proj.bias",
};
// Shapes in units of C: {rows, cols}; cols 0 means a vector.
static const int layer_shapes[PER_LAYER][2] = {
    {1, 0}, {1, 0}, {1, 3}, {3, 0}, {1, 1}, {1, 0}, {1, 0}, {1, 0}, {1, 4}, {4, 0}, {4, 1}, {1, 0},
};

static int layer_tensor(int l, int k) { return 2 + l * PER_LAYER + k; }
static int lnf_tensor(const dsc_gpt2_config *c) { return 2 + c->n_layer * PER_LAYER; }

dsc_status dsc_gpt2_config_parse(const char *spec, int vocab_size, int max_seq_len,
                                 dsc_gpt2_config *out) {
    if (!spec || !out) return dsc__fail(DSC_ERR_INVALID_ARG, "gpt2 config: spec and out are NULL");
    if (vocab_size <= 0 || max_seq_len <= 0)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "gpt2 config: vocab_size %d and max_seq_len %d must be positive",
                         vocab_size, max_seq_len);
    dsc_gpt2_config c = {0};
    for (size_t i = 0; i < sizeof named_specs / sizeof named_specs[0]; i++) {
        if (strcmp(spec, named_specs[i].name) != 0) continue;
        c.n_layer = named_specs[i].n_layer;
        c.n_head = named_specs[i].n_head;
        c.n_embd = named_specs[i].n_embd;
    }
    if (c.n_layer == 0 && spec[0] == 'd' && isdigit((unsigned char)spec[1])) {
        char *end = NULL;
        errno = 0;
        long n = strtol(spec + 1, &end, 10);
        if (errno == 0 && *end == '\0' && n >= 1 && n <= 256) {
            c.n_layer = c.n_head = (int)n;
            c.n_embd = 64 * (int)n;
        }
    }
    if (c.n_layer == 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "gpt2 model '%s' is not known; use " VALID_SPECS,
                         spec);
    c.vocab_size = vocab_size;
    c.max_seq_len = max_seq_len;
    *out = c;
    return DSC_OK;
}

static dsc_status config_check(const dsc_gpt2_config *c) {
    if (!c) return dsc__fail(DSC_ERR_INVALID_ARG, "gpt2: config is NULL");
    if (c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->n_embd % c->n_head != 0 ||
        c->vocab_size < 1 || c->max_seq_len < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "gpt2 config (n_layer %d, n_head %d, n_embd %d, vocab_size %d, "
                         "max_seq_len %d) is invalid: all must be positive and n_embd a multiple "
                         "of n_head; build it with dsc_gpt2_config_parse",
                         c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->max_seq_len);
    return DSC_OK;
}

int dsc_gpt2_num_tensors(const dsc_gpt2_config *c) { return 4 + c->n_layer * PER_LAYER; }

int dsc_gpt2_num_groups(const dsc_gpt2_config *c) { return c->n_layer + 2; }

static void set_shape(dsc_gpt2_tensor_info *out, int64_t rows, int64_t cols) {
    out->ndim = cols ? 2 : 1;
    out->shape[0] = rows;
    out->shape[1] = cols;
    out->numel = cols ? rows * cols : rows;
}

void dsc_gpt2_tensor_info_get(const dsc_gpt2_config *c, int i, dsc_gpt2_tensor_info *out) {
    memset(out, 0, sizeof *out);
    int64_t C = c->n_embd;
    int lnf = lnf_tensor(c);
    if (i < 2) {
        snprintf(out->name, sizeof out->name, "%s", i == 0 ? "wte.weight" : "wpe.weight");
        set_shape(out, i == 0 ? c->vocab_size : c->max_seq_len, C);
        out->group = 0;
    } else if (i < lnf) {
        int l = (i - 2) / PER_LAYER, k = (i - 2) % PER_LAYER;
        snprintf(out->name, sizeof out->name, "h.%d.%s", l, layer_names[k]);
        set_shape(out, layer_shapes[k][0] * C, layer_shapes[k][1] * C);
        out->group = 1 + l;
    } else {
        snprintf(out->name, sizeof out->name, "%s", i == lnf ? "ln_f.weight" : "ln_f.bias");
        set_shape(out, C, 0);
        out->group = c->n_layer + 1;
    }
}

int64_t dsc_gpt2_num_params(const dsc_gpt2_config *c) {
    return dsc__model_numel(&dsc__gpt2_model_ops, c, dsc_gpt2_num_tensors(c));
}

double dsc_gpt2_flops_per_token(const dsc_gpt2_config *c, int T) {
    double n = (double)dsc_gpt2_num_params(c) - (double)c->max_seq_len * c->n_embd;
    return 6.0 * n + 12.0 * c->n_layer * (double)c->n_embd * T;
}

// ---- initialisation ----

void dsc_gpt2_init_tensor(const dsc_gpt2_config *c, int i, float *dst, int64_t begin,
                          int64_t count, uint64_t seed) {
    int lnf = lnf_tensor(c);
    int k = (i >= 2 && i < lnf) ? (i - 2) % PER_LAYER : -1;
    if (i == lnf || i == lnf + 1 || k == K_LN1W || k == K_LN2W || (k >= 0 && k % 2 == 1)) {
        // layernorm weights 1; biases (odd k inside a layer, and ln_f.bias) 0
        float v = (i == lnf || k == K_LN1W || k == K_LN2W) ? 1.0f : 0.0f;
        for (int64_t j = 0; j < count; j++) dst[j] = v;
        return;
    }
    double std = 0.02;
    if (k == K_APROJW || k == K_MPROJW) std /= sqrt(2.0 * c->n_layer);
    dsc__model_init_normal(dst, i, begin, count, std, seed);
}

void dsc_gpt2_init_weights(const dsc_gpt2_config *c, float *const *params, uint64_t seed) {
    dsc__model_init_all(&dsc__gpt2_model_ops, c, dsc_gpt2_num_tensors(c), params, seed);
}

// ---- the model: activations and scratch ----

struct dsc_gpt2 {
    dsc__host h; // batch, last pass, activation slab (the views below), tokens, clock
    dsc_gpt2_config c;
    // Activations kept for backward: 10 BTC floats per layer (plus row statistics). Per-layer
    // arrays hold n_layer blocks of maxB * maxT rows. Layernorm and GELU outputs are not kept:
    // backward recomputes each in one cheap pass from res, res2 and fch, saving 6 BTC a layer.
    float *res;            // (L + 1, BT, C) residual stream into each layer; block L into ln_f
    float *ln1_mean, *ln1_rstd; // (L, BT)
    float *qkv;            // (L, BT, 3C)
    float *atty;           // (L, BT, C) attention output, input of c_proj
    float *att_stats;      // (L, B, NH, T, 2) softmax row max and 1 / sum
    float *res2;           // (L, BT, C) residual stream after attention
    float *ln2_mean, *ln2_rstd; // (L, BT)
    float *fch;            // (L, BT, 4C) before GELU
    float *lnf, *lnf_mean, *lnf_rstd; // (BT, C), (BT), (BT)
    float *logits;         // (BT, V); their gradients after backward
    float *lse, *losses;   // (BT)
    // Scratch of both passes.
    float *ln_out;         // (BT, C) a layernorm's output (forward), recomputed (backward)
    float *dres;           // (BT, C) gradient of the residual stream
    float *d1;             // (BT, C)
    float *d4;             // (BT, 4C): GELU output (forward), also (BT, 3C) gradients
    float *ln_scratch;     // dsc__gpt2_layernorm_scratch(BT, C)
    float *att_scratch;    // dsc__gpt2_attention_scratch(T, att_slots)
};

void dsc_gpt2_set_timing(dsc_gpt2 *m, double *times) {
    if (m) m->h.times = times;
}

// One layer's slice of the activations.
typedef struct layer_acts {
    float *res_in, *ln1_mean, *ln1_rstd, *qkv, *atty, *att_stats, *res2, *ln2_mean, *ln2_rstd,
        *fch, *res_out;
} layer_acts;

// The residual stream is kept for every layer; the rest lives in the layer's block, shared by
// all layers when they are recomputed (dsc__model_act_block).
static layer_acts acts_of(const dsc_gpt2 *m, int l) {
    size_t R = (size_t)m->h.maxB * m->h.maxT, C = (size_t)m->c.n_embd;
    size_t L = dsc__model_act_block(m->c.recompute, l);
    layer_acts a = {
        .res_in = m->res + (size_t)l * R * C,
        .ln1_mean = m->ln1_mean + L * R,
        .ln1_rstd = m->ln1_rstd + L * R,
        .qkv = m->qkv + L * R * 3 * C,
        .atty = m->atty + L * R * C,
        .att_stats = m->att_stats + L * R * 2 * (size_t)m->c.n_head,
        .res2 = m->res2 + L * R * C,
        .ln2_mean = m->ln2_mean + L * R,
        .ln2_rstd = m->ln2_rstd + L * R,
        .fch = m->fch + L * R * 4 * C,
        .res_out = m->res + ((size_t)l + 1) * R * C,
    };
    return a;
}

// Carve the slab: each view starts on a 64-byte boundary. With slab NULL only counts floats.
static size_t carve(dsc_gpt2 *m, float *slab) {
    size_t R = (size_t)m->h.maxB * m->h.maxT, C = (size_t)m->c.n_embd;
    size_t L = dsc__model_act_blocks(m->c.recompute, m->c.n_layer), NL = (size_t)m->c.n_layer;
    size_t NH = (size_t)m->c.n_head, V = (size_t)m->c.vocab_size;
    const dsc__view table[] = {
        {&m->res, (NL + 1) * R * C},      {&m->ln1_mean, L * R},   {&m->ln1_rstd, L * R},
        {&m->qkv, L * R * 3 * C},        {&m->atty, L * R * C},   {&m->att_stats, L * R * NH * 2},
        {&m->res2, L * R * C},           {&m->ln2_mean, L * R},   {&m->ln2_rstd, L * R},
        {&m->fch, L * R * 4 * C},        {&m->lnf, R * C},        {&m->lnf_mean, R},
        {&m->lnf_rstd, R},               {&m->logits, R * V},     {&m->lse, R},
        {&m->losses, R},                 {&m->ln_out, R * C},     {&m->dres, R * C},
        {&m->d1, R * C},                 {&m->d4, R * 4 * C},
        {&m->ln_scratch, dsc__gpt2_layernorm_scratch((int64_t)R, (int)C)},
        {&m->att_scratch, dsc__gpt2_attention_scratch(m->h.maxT, m->h.att_slots)},
    };
    return dsc__carve(table, sizeof table / sizeof table[0], slab);
}

// Bytes of the host activations dsc_gpt2_create_in takes for B x T tokens: the slab (counted
// by the same carve) and the token buffers, so that a memory plan can count them beforehand.
size_t dsc_gpt2_activation_bytes(const dsc_gpt2_config *c, int B, int T) {
    dsc_gpt2 m = {.c = *c};
    dsc__host_init(&m.h, "gpt2", &dsc__gpt2_model_ops, &m.c, dsc_gpt2_num_tensors(c),
                   c->vocab_size, NULL, B, T, c->n_head);
    return dsc__host_bytes(&m.h, carve(&m, NULL));
}

dsc_status dsc_gpt2_create(dsc_gpt2 **out, const dsc_gpt2_config *c, int B, int T) {
    return dsc_gpt2_create_in(out, c, B, T, NULL);
}

// The pool may have moved the slab since the last pass: carve the views at its new address.
// Contents move with the block, so a backward after a move still finds its forward's activations.
static void refresh(dsc_gpt2 *m) {
    if (dsc__slab_moved(&m->h.acts)) carve(m, m->h.acts.p);
}

// The typed shell of a create (its state, carve and tables) stays with the family; what every
// family does is dsc__host's (model/common.h).
static void layer_forward(void *state, float *const *params, int l); // below

dsc_status dsc_gpt2_create_in(dsc_gpt2 **out, const dsc_gpt2_config *c, int B, int T,
                              dsc_mem_pool *pool) {
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "gpt2 create: out is NULL");
    *out = NULL;
    DSC_TRY(config_check(c));
    DSC_TRY(dsc__model_check_create("gpt2", B, T, c->max_seq_len));
    dsc_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return dsc__fail(DSC_ERR_OOM, "gpt2 create: out of memory for the model handle");
    m->c = *c;
    dsc__host_init(&m->h, "gpt2", &dsc__gpt2_model_ops, &m->c, dsc_gpt2_num_tensors(c),
                   c->vocab_size, c->lora ? c->lora->trainable : NULL, B, T, c->n_head);
    m->h.layer_forward = layer_forward;
    dsc_status st = dsc__host_alloc(&m->h, pool, carve(m, NULL), "gpt2.activations");
    if (st != DSC_OK) {
        dsc_gpt2_destroy(m);
        return st;
    }
    carve(m, m->h.acts.p);
    *out = m;
    return DSC_OK;
}

void dsc_gpt2_destroy(dsc_gpt2 *m) {
    if (!m) return;
    dsc__host_free(&m->h);
    free(m);
}

const float *dsc_gpt2_logits(const dsc_gpt2 *m) {
    if (!m) return NULL;
    refresh((dsc_gpt2 *)m); // the handle is the caller's, never a constant object
    return m->logits;
}

// ---- forward ----

// Layer tensor k (a Conv1D weight (in, out)) with its bias as the one linear product, with its
// adapter; first: the layer's first tensor.
static dsc__linear lin(const dsc_gpt2 *m, float *const *p, int first, int k, int kb, int in,
                       int out) {
    return (dsc__linear){.w = p[k], .bias = p[kb], .in = in, .out = out, .in_out = true,
                         .lora = m->c.lora, .tensor = first + k};
}

// The tied lm_head: wte (vocab, C) as a weight (out, in).
static dsc__linear head(float *const *params, int C, int V) {
    return (dsc__linear){.w = params[0], .in = C, .out = V};
}

static void layer_forward(void *state, float *const *params, int l) {
    dsc_gpt2 *m = state;
    int B = m->h.B, T = m->h.T, C = m->c.n_embd, NH = m->c.n_head;
    int64_t BT = (int64_t)B * T;
    layer_acts a = acts_of(m, l);
    float *const *p = params + layer_tensor(l, 0);
    float *ln = m->ln_out, *gelu = m->d4;
    int first = layer_tensor(l, 0);
    double t0 = dsc__model_lap_start(m->h.times);
    dsc__gpt2_layernorm_forward(ln, a.ln1_mean, a.ln1_rstd, a.res_in, p[K_LN1W], p[K_LN1B], BT, C);
    dsc__model_lap(m->h.times, &t0, 1 + 4 * l);
    dsc__linear_forward(lin(m, p, first, K_ATTW, K_ATTB, C, 3 * C), a.qkv, 3 * C, ln, C, NULL, BT);
    dsc__gpt2_attention_forward(a.atty, a.att_stats, a.qkv, m->att_scratch, m->h.att_slots, B, T, C,
                                NH);
    dsc__linear_forward(lin(m, p, first, K_APROJW, K_APROJB, C, C), a.res2, C, a.atty, C, a.res_in,
                        BT);
    dsc__model_lap(m->h.times, &t0, 2 + 4 * l);
    dsc__gpt2_layernorm_forward(ln, a.ln2_mean, a.ln2_rstd, a.res2, p[K_LN2W], p[K_LN2B], BT, C);
    dsc__model_lap(m->h.times, &t0, 3 + 4 * l);
    dsc__linear_forward(lin(m, p, first, K_FCW, K_FCB, C, 4 * C), a.fch, 4 * C, ln, C, NULL, BT);
    dsc__gpt2_gelu_forward(gelu, a.fch, BT * 4 * C);
    dsc__linear_forward(lin(m, p, first, K_MPROJW, K_MPROJB, 4 * C, C), a.res_out, C, gelu, 4 * C,
                        a.res2, BT);
    dsc__model_lap(m->h.times, &t0, 4 + 4 * l);
}

// ln_f, tied lm_head and (with targets) the loss: the mean over the positions whose target is
// not ignored (negative), summed in order; 0 when every target is ignored.
static dsc_status head_forward(dsc_gpt2 *m, float *const *params, const int32_t *targets,
                               const dsc_gpt2_hooks *hooks, float *loss) {
    int C = m->c.n_embd, V = m->c.vocab_size, L = m->c.n_layer, lnf = lnf_tensor(&m->c);
    int64_t BT = (int64_t)m->h.B * m->h.T;
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, L + 1));
    double t0 = dsc__model_lap_start(m->h.times);
    dsc__gpt2_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, acts_of(m, L).res_in,
                                params[lnf], params[lnf + 1], BT, C);
    dsc__model_lap(m->h.times, &t0, 1 + 4 * L);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, L + 1));
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, 0));
    t0 = dsc__model_lap_start(m->h.times);
    dsc__linear_forward(head(params, C, V), m->logits, V, m->lnf, C, NULL, BT);
    dsc__model_lap(m->h.times, &t0, 2 + 4 * L);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, 0));
    if (targets)
        dsc__host_loss(&m->h, m->losses, m->lse, m->logits, targets, BT, V, loss, 2 + 4 * L);
    return DSC_OK;
}

dsc_status dsc_gpt2_forward(dsc_gpt2 *m, float *const *params, const int32_t *inputs,
                            const int32_t *targets, int B, int T, const dsc_gpt2_hooks *hooks,
                            float *loss) {
    return dsc_gpt2_forward_pos(m, params, inputs, NULL, targets, B, T, hooks, loss);
}

dsc_status dsc_gpt2_forward_pos(dsc_gpt2 *m, float *const *params, const int32_t *inputs,
                                const int32_t *positions, const int32_t *targets, int B, int T,
                                const dsc_gpt2_hooks *hooks, float *loss) {
    DSC_TRY(dsc__host_forward_begin(m ? &m->h : NULL, "gpt2", params, inputs, positions, targets,
                                    B, T, hooks, m ? m->c.max_seq_len : 0, "the rows of wpe"));
    refresh(m);
    int64_t BT = (int64_t)B * T;
    int32_t *tok_in = m->h.tokens, *tok_tg = m->h.tokens + BT;

    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, 0));
    double t0 = dsc__model_lap_start(m->h.times);
    dsc__gpt2_encoder_forward(m->res, tok_in, dsc__host_positions(&m->h), params[0],
                              params[1], B, T, m->c.n_embd);
    dsc__model_lap(m->h.times, &t0, 0);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, 0));
    DSC_TRY(dsc_model_layers_forward(hooks, "gpt2", m->c.n_layer, layer_forward, m, params));
    DSC_TRY(head_forward(m, params, targets ? tok_tg : NULL, hooks, loss));
    dsc__host_forward_end(&m->h, targets != NULL);
    return DSC_OK;
}

// ---- backward ----

// On entry m->dres holds the gradient of layer l's output; on return that of its input.
static void layer_backward(void *state, float *const *params, float *const *grads, int l) {
    dsc_gpt2 *m = state;
    int B = m->h.B, T = m->h.T, C = m->c.n_embd, NH = m->c.n_head;
    int64_t BT = (int64_t)B * T;
    layer_acts a = acts_of(m, l);
    float *const *p = params + layer_tensor(l, 0);
    float *const *g = grads + layer_tensor(l, 0);
    float *dres = m->dres, *d1 = m->d1, *d4 = m->d4, *ln = m->ln_out;
    int first = layer_tensor(l, 0);
    dsc__gpt2_gelu_forward(d4, a.fch, BT * 4 * C); // recomputed; then overwritten by its gradient
    dsc__linear_backward(lin(m, p, first, K_MPROJW, K_MPROJB, 4 * C, C), d4, false, g[K_MPROJW],
                         g[K_MPROJB], dres, C, d4, 4 * C, BT); // d4: the input, then its gradient
    dsc__gpt2_gelu_backward(d4, d4, a.fch, BT * 4 * C);
    dsc__gpt2_layernorm_apply(ln, a.res2, a.ln2_mean, a.ln2_rstd, p[K_LN2W], p[K_LN2B], BT, C);
    dsc__linear_backward(lin(m, p, first, K_FCW, K_FCB, C, 4 * C), d1, false, g[K_FCW], g[K_FCB], d4,
                         4 * C, ln, C, BT);
    dsc__gpt2_layernorm_backward(dres, g[K_LN2W], g[K_LN2B], m->ln_scratch, d1, a.res2, p[K_LN2W],
                                 a.ln2_mean, a.ln2_rstd, BT, C);
    dsc__linear_backward(lin(m, p, first, K_APROJW, K_APROJB, C, C), d1, false, g[K_APROJW],
                         g[K_APROJB], dres, C, a.atty, C, BT);
    dsc__gpt2_attention_backward(d4, d1, a.qkv, a.att_stats, m->att_scratch, m->h.att_slots, B, T,
                                 C, NH);
    dsc__gpt2_layernorm_apply(ln, a.res_in, a.ln1_mean, a.ln1_rstd, p[K_LN1W], p[K_LN1B], BT, C);
    dsc__linear_backward(lin(m, p, first, K_ATTW, K_ATTB, C, 3 * C), d1, false, g[K_ATTW], g[K_ATTB],
                         d4, 3 * C, ln, C, BT);
    dsc__gpt2_layernorm_backward(dres, g[K_LN1W], g[K_LN1B], m->ln_scratch, d1, a.res_in,
                                 p[K_LN1W], a.ln1_mean, a.ln1_rstd, BT, C);
}

// Loss, lm_head and ln_f: leaves the gradient of the last residual stream in m->dres.
static dsc_status head_backward(dsc_gpt2 *m, float *const *params, float *const *grads,
                                float loss_scale, const dsc_gpt2_hooks *hooks) {
    int C = m->c.n_embd, V = m->c.vocab_size, L = m->c.n_layer, lnf = lnf_tensor(&m->c);
    int64_t BT = (int64_t)m->h.B * m->h.T;
    float *dlogits = m->logits; // (BT, V), in place
    float g = m->h.ntargets ? loss_scale / (float)m->h.ntargets : 0.0f; // d(mean)/d(loss_i)
    dsc__model_xent_backward(dlogits, m->logits, m->lse, m->h.tokens + BT, g, BT, V);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, 0));
    // grads[0] NULL: frozen (LoRA)
    dsc__linear_backward(head(params, C, V), m->d1, false, grads[0], NULL, dlogits, V, m->lnf, C,
                         BT);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, 0));
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, L + 1));
    memset(m->dres, 0, sizeof(float) * (size_t)BT * C);
    dsc__gpt2_layernorm_backward(m->dres, grads[lnf], grads[lnf + 1], m->ln_scratch, m->d1,
                                 acts_of(m, L).res_in, params[lnf], m->lnf_mean, m->lnf_rstd, BT,
                                 C);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, L + 1));
    return dsc__host_hook(&m->h, hooks, DSC__HOOK_GRADS_READY, L + 1);
}

dsc_status dsc_gpt2_backward(dsc_gpt2 *m, float *const *params, float *const *grads,
                             float loss_scale, const dsc_gpt2_hooks *hooks) {
    DSC_TRY(dsc__host_backward_begin(m ? &m->h : NULL, "gpt2", params, grads, hooks));
    refresh(m);
    DSC_TRY(head_backward(m, params, grads, loss_scale, hooks));
    DSC_TRY(dsc_model_layers_backward(hooks, "gpt2", m->c.n_layer, layer_backward,
                                      m->c.recompute ? dsc__host_recompute : NULL, m, params,
                                      grads));
    dsc__gpt2_encoder_backward(grads[0], grads[1], m->dres, m->h.tokens, dsc__host_positions(&m->h),
                               m->h.B, m->h.T, m->c.n_embd);
    return dsc__host_hook(&m->h, hooks, DSC__HOOK_GRADS_READY, 0);
}
