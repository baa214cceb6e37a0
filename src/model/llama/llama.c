// model/llama/llama.c - Llama configuration, parameter table, initialisation, and the forward
// and backward passes, composed from the kernels of kernels.c.
#include "model/llama/llama.h"

#include <ctype.h>  // isdigit
#include <errno.h>  // errno
#include <stdio.h>  // snprintf
#include <stdlib.h> // aligned_alloc, calloc, free, malloc, strtol
#include <string.h> // memset, memcpy, strcmp

#include "base/status.h"         // dsc__fail, dsc__error_prefix, DSC_TRY
#include "model/blas.h"          // dsc__model_blas_single_thread
#include "model/common.h"        // dsc__model_hook, dsc__model_check_*, dsc__model_init_normal
#include "model/linear.h"        // dsc__linear_*
#include "model/llama/kernels.h" // dsc__llama_*
#include "model/lora.h"          // struct dsc_lora (its trainable base tensors)
#include "model/kernels.h"       // dsc__model_xent_*
// ---- configuration and parameter table ----

#define VALID_SPECS                                                                            \
    "smollm2-135M, smollm2-360M, llama-3.2-1B, llama-3.2-3B, qwen2.5-0.5B, llama-3.1-8B, "     \
    "qwen2.5-7B, mistral-7B (v0.3), qwen3-0.6B, qwen3-1.7B, qwen3-4B, qwen3-8B, llama-dN "     \
    "(N layers, N heads of 64 channels, 1 <= N <= 256, e.g. llama-d4) or qwen3-dN (the same "  \
    "with Qwen3's q/k norms and heads of 128, e.g. qwen3-d4)"

// The published shapes, from each model's config.json (cited in docs/models.md).
static const struct {
    const char *name;
    int n_layer, hidden, n_head, n_kv_head, head_dim, intermediate, vocab;
    float eps;
    double theta;
    int scaling;
    double factor;
    int tied, qkv_bias, qk_norm;
} named_specs[] = {
    {"smollm2-135M", 30, 576, 9, 3, 64, 1536, 49152, 1e-5f, 1e5, DSC_LLAMA_ROPE_NONE, 0, 1, 0, 0},
    {"smollm2-360M", 32, 960, 15, 5, 64, 2560, 49152, 1e-5f, 1e5, DSC_LLAMA_ROPE_NONE, 0, 1, 0, 0},
    {"llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256, 1e-5f, 5e5, DSC_LLAMA_ROPE_LLAMA3, 32, 1,
     0, 0},
    {"llama-3.2-3B", 28, 3072, 24, 8, 128, 8192, 128256, 1e-5f, 5e5, DSC_LLAMA_ROPE_LLAMA3, 32, 1,
     0, 0},
    {"qwen2.5-0.5B", 24, 896, 14, 2, 64, 4864, 151936, 1e-6f, 1e6, DSC_LLAMA_ROPE_NONE, 0, 1, 1, 0},
    {"llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 1e-5f, 5e5, DSC_LLAMA_ROPE_LLAMA3, 8, 0,
     0, 0},
    {"qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 1e-6f, 1e6, DSC_LLAMA_ROPE_NONE, 0, 0, 1, 0},
    // Mistral 7B v0.3: no sliding window (its config.json has "sliding_window": null)
    {"mistral-7B", 32, 4096, 32, 8, 128, 14336, 32768, 1e-5f, 1e6, DSC_LLAMA_ROPE_NONE, 0, 0, 0,
     0},
    {"qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, 1e-6f, 1e6, DSC_LLAMA_ROPE_NONE, 0, 1, 0, 1},
    {"qwen3-1.7B", 28, 2048, 16, 8, 128, 6144, 151936, 1e-6f, 1e6, DSC_LLAMA_ROPE_NONE, 0, 1, 0, 1},
    {"qwen3-4B", 36, 2560, 32, 8, 128, 9728, 151936, 1e-6f, 1e6, DSC_LLAMA_ROPE_NONE, 0, 1, 0, 1},
    {"qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 1e-6f, 1e6, DSC_LLAMA_ROPE_NONE, 0, 0, 0, 1},
};

// The tensors of a layer by kind; the three biases only with qkv_bias, the q/k norms only with
// qk_norm. Kinds are numbered as llama.h's DSC_LLAMA_*; table order is layer_order.
enum {
    K_LN1, K_QW, K_QB, K_KW, K_KB, K_VW, K_VB, K_OW, K_LN2, K_GATE, K_UP, K_DOWN, K_QN, K_KN,
    N_KINDS
};
static const char *const kind_names[N_KINDS] = {
    "input_layernorm.weight",          "self_attn.q_proj.weight", "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",         "self_attn.k_proj.bias",   "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",           "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",            "mlp.up_proj.weight",      "mlp.down_proj.weight",
    "self_attn.q_norm.weight",         "self_attn.k_norm.weight",
};
// q, k and v stay adjacent (the GPU fuses their products when no bias sits between them).
static const int layer_order[N_KINDS] = {K_LN1, K_QW, K_QB, K_KW, K_KB, K_VW, K_VB,
                                         K_OW,  K_QN, K_KN, K_LN2, K_GATE, K_UP, K_DOWN};

static int is_bias(int k) { return k == K_QB || k == K_KB || k == K_VB; }
static int is_head_norm(int k) { return k == K_QN || k == K_KN; }
static int has_kind(const dsc_llama_config *c, int k) {
    return (!is_bias(k) || c->qkv_bias) && (!is_head_norm(k) || c->qk_norm);
}
static int per_layer(const dsc_llama_config *c) {
    return N_KINDS - (c->qkv_bias ? 0 : 3) - (c->qk_norm ? 0 : 2);
}

// Position of kind k within a layer's tensors (k must be present).
static int kind_pos(const dsc_llama_config *c, int k) {
    int p = 0;
    for (int j = 0; layer_order[j] != k; j++) p += has_kind(c, layer_order[j]);
    return p;
}

// Kind of the tensor at position p within a layer.
static int kind_at(const dsc_llama_config *c, int p) {
    for (int j = 0; j < N_KINDS; j++)
        if (has_kind(c, layer_order[j]) && p-- == 0) return layer_order[j];
    return -1;
}

static int layer_tensor(const dsc_llama_config *c, int l, int k) {
    return 1 + l * per_layer(c) + kind_pos(c, k);
}
static int norm_tensor(const dsc_llama_config *c) { return 1 + c->n_layer * per_layer(c); }
// lm_head's weight: its own tensor when untied, embed_tokens when tied.
static int head_tensor(const dsc_llama_config *c) { return c->tied ? 0 : norm_tensor(c) + 1; }

_Static_assert((int)K_LN1 == (int)DSC_LLAMA_LN1 && (int)K_QB == (int)DSC_LLAMA_QB &&
                   (int)K_VB == (int)DSC_LLAMA_VB && (int)K_DOWN == (int)DSC_LLAMA_DOWN &&
                   (int)K_QN == (int)DSC_LLAMA_QN && (int)N_KINDS == (int)DSC_LLAMA_NKINDS,
               "llama.h's tensor kinds follow llama.c's");

int dsc__llama_layer_tensor(const dsc_llama_config *c, int l, int k) {
    return has_kind(c, k) ? layer_tensor(c, l, k) : -1;
}
int dsc__llama_norm_tensor(const dsc_llama_config *c) { return norm_tensor(c); }
int dsc__llama_head_tensor(const dsc_llama_config *c) { return head_tensor(c); }

// llama-dN and qwen3-dN: see llama.h.
static int parse_tiny(const char *spec, dsc_llama_config *c) {
    int qwen3 = !strncmp(spec, "qwen3-d", 7);
    if ((!qwen3 && strncmp(spec, "llama-d", 7) != 0) || !isdigit((unsigned char)spec[7])) return 0;
    char *end = NULL;
    errno = 0;
    long n = strtol(spec + 7, &end, 10);
    if (errno != 0 || *end != '\0' || n < 1 || n > 256) return 0;
    c->n_layer = c->n_head = (int)n;
    c->n_kv_head = n % 2 == 0 ? (int)n / 2 : (int)n;
    c->head_dim = 64;
    c->hidden = 64 * (int)n;
    c->intermediate = (8 * c->hidden / 3 + 63) / 64 * 64;
    c->rms_eps = 1e-5f;
    c->rope_theta = 1e4;
    c->tied = 1;
    if (qwen3) { // as qwen3-0.6B: heads of 128, q twice the hidden size
        c->head_dim = 128;
        c->intermediate = 3 * c->hidden;
        c->rms_eps = 1e-6f;
        c->rope_theta = 1e6;
        c->qk_norm = 1;
    }
    return 1;
}

dsc_status dsc_llama_config_parse(const char *spec, int vocab_size, int max_seq_len,
                                  dsc_llama_config *out) {
    if (!spec || !out) return dsc__fail(DSC_ERR_INVALID_ARG, "llama config: spec or out is NULL");
    if (vocab_size < 0 || max_seq_len <= 0)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "llama config: vocab_size %d must be >= 0 (0 = the model's own) and "
                         "max_seq_len %d positive",
                         vocab_size, max_seq_len);
    dsc_llama_config c = {0};
    c.rope_factor = 1.0;
    for (size_t i = 0; i < sizeof named_specs / sizeof named_specs[0]; i++) {
        if (strcmp(spec, named_specs[i].name) != 0) continue;
        c.n_layer = named_specs[i].n_layer;
        c.hidden = named_specs[i].hidden;
        c.n_head = named_specs[i].n_head;
        c.n_kv_head = named_specs[i].n_kv_head;
        c.head_dim = named_specs[i].head_dim;
        c.intermediate = named_specs[i].intermediate;
        c.vocab_size = named_specs[i].vocab;
        c.rms_eps = named_specs[i].eps;
        c.rope_theta = named_specs[i].theta;
        c.rope_scaling = named_specs[i].scaling;
        c.tied = named_specs[i].tied;
        c.qkv_bias = named_specs[i].qkv_bias;
        c.qk_norm = named_specs[i].qk_norm;
        if (c.rope_scaling == DSC_LLAMA_ROPE_LLAMA3) { // the same in all three Llama 3 configs
            c.rope_factor = named_specs[i].factor;
            c.rope_low_freq_factor = 1.0;
            c.rope_high_freq_factor = 4.0;
            c.rope_original_max_pos = 8192;
        }
    }
    if (c.n_layer == 0 && !parse_tiny(spec, &c))
        return dsc__fail(DSC_ERR_INVALID_ARG, "llama model '%s' is not known; use " VALID_SPECS,
                         spec);
    if (vocab_size > 0) c.vocab_size = vocab_size;
    if (c.vocab_size == 0)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "llama model '%s' has no vocabulary of its own; pass the tokenizer's "
                         "vocab_size",
                         spec);
    c.max_seq_len = max_seq_len;
    *out = c;
    return DSC_OK;
}

static dsc_status config_check(const dsc_llama_config *c) {
    if (!c) return dsc__fail(DSC_ERR_INVALID_ARG, "llama: config is NULL");
    if (c->n_layer < 1 || c->hidden < 1 || c->n_head < 1 || c->n_kv_head < 1 ||
        c->n_head % c->n_kv_head != 0 || c->head_dim < 2 || c->head_dim % 2 != 0 ||
        c->intermediate < 1 || c->vocab_size < 1 || c->max_seq_len < 1 || !(c->rms_eps > 0) ||
        !(c->rope_theta > 1.0) || (c->qk_norm != 0 && c->qk_norm != 1))
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "llama config (n_layer %d, hidden %d, n_head %d, n_kv_head %d, head_dim "
                         "%d, intermediate %d, vocab_size %d, max_seq_len %d, rms_eps %g, "
                         "rope_theta %g, qk_norm %d) is invalid: sizes must be positive, "
                         "n_kv_head must divide n_head, head_dim must be even, rms_eps > 0, "
                         "rope_theta > 1, qk_norm 0 or 1; build it with dsc_llama_config_parse",
                         c->n_layer, c->hidden, c->n_head, c->n_kv_head, c->head_dim,
                         c->intermediate, c->vocab_size, c->max_seq_len, (double)c->rms_eps,
                         c->rope_theta, c->qk_norm);
    int sc = c->rope_scaling;
    int bad = sc < DSC_LLAMA_ROPE_NONE || sc > DSC_LLAMA_ROPE_LLAMA3 ||
              (sc != DSC_LLAMA_ROPE_NONE && !(c->rope_factor > 0)) ||
              (sc == DSC_LLAMA_ROPE_LLAMA3 &&
               (!(c->rope_low_freq_factor > 0) ||
                !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
                c->rope_original_max_pos < 1));
    if (bad)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "llama config: rope scaling (type %d, factor %g, low_freq_factor %g, "
                         "high_freq_factor %g, original_max_position_embeddings %d) is invalid: "
                         "the type is none (0), linear (1) or llama3 (2); factor > 0; llama3 "
                         "needs 0 < low_freq_factor < high_freq_factor and positive original "
                         "positions",
                         sc, c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                         c->rope_original_max_pos);
    return DSC_OK;
}

int dsc_llama_num_tensors(const dsc_llama_config *c) {
    return 2 + c->n_layer * per_layer(c) + (c->tied ? 0 : 1);
}

int dsc_llama_num_groups(const dsc_llama_config *c) { return c->n_layer + 2; }

static void set_shape(dsc_llama_tensor_info *out, int64_t rows, int64_t cols) {
    out->ndim = cols ? 2 : 1;
    out->shape[0] = rows;
    out->shape[1] = cols;
    out->numel = cols ? rows * cols : rows;
}

// {out, in} of kind k (in 0: a vector).
static void kind_shape(const dsc_llama_config *c, int k, int64_t *rows, int64_t *cols) {
    int64_t C = c->hidden, Q = (int64_t)c->n_head * c->head_dim;
    int64_t KV = (int64_t)c->n_kv_head * c->head_dim, I = c->intermediate;
    switch (k) {
    case K_QW: *rows = Q, *cols = C; break;
    case K_QB: *rows = Q, *cols = 0; break;
    case K_KW: case K_VW: *rows = KV, *cols = C; break;
    case K_KB: case K_VB: *rows = KV, *cols = 0; break;
    case K_OW: *rows = C, *cols = Q; break;
    case K_GATE: case K_UP: *rows = I, *cols = C; break;
    case K_DOWN: *rows = C, *cols = I; break;
    case K_QN: case K_KN: *rows = c->head_dim, *cols = 0; break;
    default: *rows = C, *cols = 0; break; // the two norms
    }
}

void dsc_llama_tensor_info_get(const dsc_llama_config *c, int i, dsc_llama_tensor_info *out) {
    memset(out, 0, sizeof *out);
    int norm = norm_tensor(c);
    if (i == 0) {
        snprintf(out->name, sizeof out->name, "model.embed_tokens.weight");
        set_shape(out, c->vocab_size, c->hidden);
    } else if (i < norm) {
        int l = (i - 1) / per_layer(c), k = kind_at(c, (i - 1) % per_layer(c));
        int64_t rows, cols;
        kind_shape(c, k, &rows, &cols);
        snprintf(out->name, sizeof out->name, "model.layers.%d.%s", l, kind_names[k]);
        set_shape(out, rows, cols);
        out->group = 1 + l;
    } else if (i == norm) {
        snprintf(out->name, sizeof out->name, "model.norm.weight");
        set_shape(out, c->hidden, 0);
        out->group = c->n_layer + 1;
    } else {
        snprintf(out->name, sizeof out->name, "lm_head.weight");
        set_shape(out, c->vocab_size, c->hidden);
        out->group = c->n_layer + 1;
    }
}

int64_t dsc_llama_num_params(const dsc_llama_config *c) {
    return dsc__model_numel(&dsc__llama_model_ops, c, dsc_llama_num_tensors(c));
}

double dsc_llama_flops_per_token(const dsc_llama_config *c, int T) {
    double n = (double)dsc_llama_num_params(c);
    if (!c->tied) n -= (double)c->vocab_size * c->hidden; // the lookup table
    return 6.0 * n + 12.0 * c->n_layer * (double)c->n_head * c->head_dim * T;
}

// ---- initialisation ----

void dsc_llama_init_tensor(const dsc_llama_config *c, int i, float *dst, int64_t begin,
                           int64_t count, uint64_t seed) {
    dsc_llama_tensor_info info;
    dsc_llama_tensor_info_get(c, i, &info);
    if (info.ndim == 1) { // RMSNorm weights 1, biases 0
        int norm_weight = i == norm_tensor(c) ||
                          !is_bias(kind_at(c, (i - 1) % per_layer(c)));
        for (int64_t j = 0; j < count; j++) dst[j] = norm_weight ? 1.0f : 0.0f;
        return;
    }
    dsc__model_init_normal(dst, i, begin, count, 0.02, seed);
}

void dsc_llama_init_weights(const dsc_llama_config *c, float *const *params, uint64_t seed) {
    dsc__model_init_all(&dsc__llama_model_ops, c, dsc_llama_num_tensors(c), params, seed);
}

// ---- the model: activations and scratch ----

struct dsc_llama {
    dsc__host h; // batch, last pass, activation slab (the views below), tokens, clock
    dsc_llama_config c;
    int ld;        // width of a qkv row: (NH + 2 NKV) hd
    // Activations kept for backward (R = maxB maxT rows, C hidden, Q = NH hd, I intermediate).
    // The norms' outputs and the SwiGLU product are recomputed in backward, not kept.
    float *res;       // (L + 1, R, C) residual stream into each layer; block L into the norm
    float *rms1, *rms2; // (L, R) rstd of the two norms
    float *qkv;       // (L, R, ld) q, k after rotation, v
    float *qk_raw;    // qk_norm: (L, R, (NH + NKV) hd) q and k before their norms
    float *qk_rstd;   // qk_norm: (L, R, NH + NKV) each head's rstd
    float *atty;      // (L, R, Q) attention output, input of o_proj
    float *att_stats; // (L, B, NH, T, 2) softmax row max and 1 / sum
    float *res2;      // (L, R, C) residual stream after attention
    float *gate, *up; // (L, R, I) the MLP's two projections
    float *fin, *fin_rstd; // (R, C), (R) the final norm's output and rstd
    float *logits;    // (R, V); their gradients after backward
    float *lse, *losses; // (R)
    float *rope_cos, *rope_sin; // (maxT, hd / 2)
    // Scratch of both passes.
    float *ln_out;    // (R, C) a norm's output (forward), recomputed (backward)
    float *dres;      // (R, C) gradient of the residual stream
    float *d1;        // (R, max(C, Q))
    float *dqkv;      // (R, ld)
    float *hI, *dI;   // (R, I): SwiGLU output (forward); gradients of gate and up (backward)
    float *norm_scratch; // dsc__llama_rmsnorm_scratch(R, C)
    float *head_scratch; // qk_norm: dsc__llama_head_norm_scratch(R, hd)
    float *att_scratch;  // dsc__llama_attention_scratch(maxT, att_slots)
};

void dsc_llama_set_timing(dsc_llama *m, double *times) {
    if (m) m->h.times = times;
}

// One layer's slice of the activations.
typedef struct layer_acts {
    float *res_in, *rms1, *qkv, *qk_raw, *qk_rstd, *atty, *att_stats, *res2, *rms2, *gate, *up;
    float *res_out;
    int first; // the layer's first tensor (LoRA finds its adapters by tensor index)
} layer_acts;

// The residual stream is kept for every layer; the rest lives in the layer's block, shared by
// all layers when they are recomputed (dsc__model_act_block).
static layer_acts acts_of(const dsc_llama *m, int l) {
    size_t R = (size_t)m->h.maxB * m->h.maxT, C = (size_t)m->c.hidden;
    size_t L = dsc__model_act_block(m->c.recompute, l);
    size_t Q = (size_t)m->c.n_head * m->c.head_dim, I = (size_t)m->c.intermediate;
    size_t NQK = m->c.qk_norm ? (size_t)(m->c.n_head + m->c.n_kv_head) : 0; // heads normed
    layer_acts a = {
        .res_in = m->res + (size_t)l * R * C,
        .rms1 = m->rms1 + L * R,
        .qkv = m->qkv + L * R * (size_t)m->ld,
        .qk_raw = m->qk_raw + L * R * NQK * (size_t)m->c.head_dim,
        .qk_rstd = m->qk_rstd + L * R * NQK,
        .atty = m->atty + L * R * Q,
        .att_stats = m->att_stats + L * R * 2 * (size_t)m->c.n_head,
        .res2 = m->res2 + L * R * C,
        .rms2 = m->rms2 + L * R,
        .gate = m->gate + L * R * I,
        .up = m->up + L * R * I,
        .res_out = m->res + ((size_t)l + 1) * R * C,
        .first = layer_tensor(&m->c, l, 0),
    };
    return a;
}

// Carve the slab: each view starts on a 64-byte boundary. With slab NULL only counts floats.
static size_t carve(dsc_llama *m, float *slab) {
    size_t R = (size_t)m->h.maxB * m->h.maxT, C = (size_t)m->c.hidden;
    size_t L = dsc__model_act_blocks(m->c.recompute, m->c.n_layer), NL = (size_t)m->c.n_layer;
    size_t NH = (size_t)m->c.n_head, V = (size_t)m->c.vocab_size, ld = (size_t)m->ld;
    size_t Q = NH * (size_t)m->c.head_dim, I = (size_t)m->c.intermediate;
    size_t half = (size_t)m->h.maxT * (size_t)(m->c.head_dim / 2), hd = (size_t)m->c.head_dim;
    size_t NQK = m->c.qk_norm ? NH + (size_t)m->c.n_kv_head : 0; // heads normed (Qwen3)
    const dsc__view table[] = {
        {&m->res, (NL + 1) * R * C}, {&m->rms1, L * R},         {&m->rms2, L * R},
        {&m->qkv, L * R * ld},      {&m->atty, L * R * Q},     {&m->att_stats, L * R * NH * 2},
        {&m->res2, L * R * C},      {&m->gate, L * R * I},     {&m->up, L * R * I},
        {&m->fin, R * C},           {&m->fin_rstd, R},         {&m->logits, R * V},
        {&m->lse, R},               {&m->losses, R},           {&m->rope_cos, half},
        {&m->rope_sin, half},       {&m->ln_out, R * C},       {&m->dres, R * C},
        {&m->d1, R * (C > Q ? C : Q)}, {&m->dqkv, R * ld},     {&m->hI, R * I},
        {&m->dI, R * I},
        {&m->norm_scratch, dsc__llama_rmsnorm_scratch((int64_t)R, (int)C)},
        {&m->att_scratch, dsc__llama_attention_scratch(m->h.maxT, m->h.att_slots)},
        {&m->qk_raw, L * R * NQK * hd}, {&m->qk_rstd, L * R * NQK},
        {&m->head_scratch, NQK ? dsc__llama_head_norm_scratch((int64_t)R, (int)hd) : 0},
    };
    return dsc__carve(table, sizeof table / sizeof table[0], slab);
}

// Bytes of the host activations dsc_llama_create_in takes for B x T tokens: the slab (counted
// by the same carve) and the token buffers, so that a memory plan can count them beforehand.
size_t dsc_llama_activation_bytes(const dsc_llama_config *c, int B, int T) {
    dsc_llama m = {.c = *c};
    m.ld = (c->n_head + 2 * c->n_kv_head) * c->head_dim;
    dsc__host_init(&m.h, "llama", &dsc__llama_model_ops, &m.c, dsc_llama_num_tensors(c),
                   c->vocab_size, NULL, B, T, c->n_head);
    return dsc__host_bytes(&m.h, carve(&m, NULL));
}

dsc_status dsc_llama_create(dsc_llama **out, const dsc_llama_config *c, int B, int T) {
    return dsc_llama_create_in(out, c, B, T, NULL);
}

// The pool may have moved the slab since the last pass: carve the views at its new address.
// Contents (the rotary tables too) move with the block.
static void refresh(dsc_llama *m) {
    if (dsc__slab_moved(&m->h.acts)) carve(m, m->h.acts.p);
}

// The typed shell of a create (its state, carve and tables) stays with the family; what every
// family does is dsc__host's (model/common.h).
static void layer_forward(void *state, float *const *params, int l); // below

dsc_status dsc_llama_create_in(dsc_llama **out, const dsc_llama_config *c, int B, int T,
                               dsc_mem_pool *pool) {
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "llama create: out is NULL");
    *out = NULL;
    DSC_TRY(config_check(c));
    DSC_TRY(dsc__model_check_create("llama", B, T, c->max_seq_len));
    dsc_llama *m = calloc(1, sizeof *m);
    if (!m) return dsc__fail(DSC_ERR_OOM, "llama create: out of memory for the model handle");
    m->c = *c;
    m->ld = (c->n_head + 2 * c->n_kv_head) * c->head_dim;
    dsc__host_init(&m->h, "llama", &dsc__llama_model_ops, &m->c, dsc_llama_num_tensors(c),
                   c->vocab_size, c->lora ? c->lora->trainable : NULL, B, T, c->n_head);
    m->h.layer_forward = layer_forward;
    dsc_status st = dsc__host_alloc(&m->h, pool, carve(m, NULL), "llama.activations");
    if (st != DSC_OK) {
        dsc_llama_destroy(m);
        return st;
    }
    carve(m, m->h.acts.p);
    dsc__llama_rope_tables(m->rope_cos, m->rope_sin, T, c->head_dim, c->rope_theta,
                           c->rope_scaling, c->rope_factor, c->rope_low_freq_factor,
                           c->rope_high_freq_factor, c->rope_original_max_pos);
    *out = m;
    return DSC_OK;
}

void dsc_llama_destroy(dsc_llama *m) {
    if (!m) return;
    dsc__host_free(&m->h);
    free(m);
}

const float *dsc_llama_logits(const dsc_llama *m) {
    if (!m) return NULL;
    refresh((dsc_llama *)m); // the handle is the caller's, never a constant object
    return m->logits;
}

// ---- forward ----

// The layer's weight of kind k (in, out) as the one linear product, with its adapter.
static dsc__linear lin(const dsc_llama_config *c, float *const *p, const layer_acts *a, int k,
                       const float *bias, int in, int out) {
    return (dsc__linear){.w = p[kind_pos(c, k)], .bias = bias, .in = in, .out = out,
                         .lora = c->lora, .tensor = a->first + kind_pos(c, k)};
}

static void attention_forward(dsc_llama *m, float *const *p, const layer_acts *a) {
    const dsc_llama_config *c = &m->c;
    int B = m->h.B, T = m->h.T, C = c->hidden, hd = c->head_dim, ld = m->ld;
    int Q = c->n_head * hd, KV = c->n_kv_head * hd;
    int64_t BT = (int64_t)B * T;
    const float *bq = c->qkv_bias ? p[kind_pos(c, K_QB)] : NULL;
    const float *bk = c->qkv_bias ? p[kind_pos(c, K_KB)] : NULL;
    const float *bv = c->qkv_bias ? p[kind_pos(c, K_VB)] : NULL;
    float *ln = m->ln_out;
    dsc__linear_forward(lin(c, p, a, K_QW, bq, C, Q), a->qkv, ld, ln, C, NULL, BT);
    dsc__linear_forward(lin(c, p, a, K_KW, bk, C, KV), a->qkv + Q, ld, ln, C, NULL,
                        BT);
    dsc__linear_forward(lin(c, p, a, K_VW, bv, C, KV), a->qkv + Q + KV, ld, ln, C,
                        NULL, BT);
    if (c->qk_norm)
        dsc__llama_head_norm_forward(a->qkv, ld, a->qk_raw, a->qk_rstd, p[kind_pos(c, K_QN)],
                                     p[kind_pos(c, K_KN)], c->rms_eps, BT, c->n_head,
                                     c->n_kv_head, hd);
    dsc__llama_rope_pos(a->qkv, ld, m->rope_cos, m->rope_sin, dsc__host_positions(&m->h), B, T,
                        c->n_head + c->n_kv_head, hd, 0);
    dsc__llama_attention_forward(a->atty, a->att_stats, a->qkv, m->att_scratch, m->h.att_slots, B,
                                 T, c->n_head, c->n_kv_head, hd);
    dsc__linear_forward(lin(c, p, a, K_OW, NULL, Q, C), a->res2, C, a->atty, Q,
                        a->res_in, BT);
}

static void layer_forward(void *state, float *const *params, int l) {
    dsc_llama *m = state;
    const dsc_llama_config *c = &m->c;
    int C = c->hidden, I = c->intermediate;
    int64_t BT = (int64_t)m->h.B * m->h.T;
    layer_acts a = acts_of(m, l);
    float *const *p = params + layer_tensor(c, l, 0);
    float *ln = m->ln_out;
    double t0 = dsc__model_lap_start(m->h.times);
    dsc__llama_rmsnorm_forward(ln, a.rms1, a.res_in, p[kind_pos(c, K_LN1)], c->rms_eps, BT, C);
    dsc__model_lap(m->h.times, &t0, 1 + 4 * l);
    attention_forward(m, p, &a);
    dsc__model_lap(m->h.times, &t0, 2 + 4 * l);
    dsc__llama_rmsnorm_forward(ln, a.rms2, a.res2, p[kind_pos(c, K_LN2)], c->rms_eps, BT, C);
    dsc__model_lap(m->h.times, &t0, 3 + 4 * l);
    dsc__linear_forward(lin(c, p, &a, K_GATE, NULL, C, I), a.gate, I, ln, C, NULL,
                        BT);
    dsc__linear_forward(lin(c, p, &a, K_UP, NULL, C, I), a.up, I, ln, C, NULL, BT);
    dsc__llama_swiglu_forward(m->hI, a.gate, a.up, BT * I);
    dsc__linear_forward(lin(c, p, &a, K_DOWN, NULL, I, C), a.res_out, C, m->hI, I,
                        a.res2, BT);
    dsc__model_lap(m->h.times, &t0, 4 + 4 * l);
}

static void lm_head_forward(dsc_llama *m, float *const *params) {
    int C = m->c.hidden, V = m->c.vocab_size;
    int64_t BT = (int64_t)m->h.B * m->h.T;
    dsc__linear_forward((dsc__linear){.w = params[head_tensor(&m->c)], .in = C, .out = V},
                        m->logits, V, m->fin, C, NULL, BT);
}

// The final norm, lm_head (embed_tokens when tied, in group 0) and, with targets, the loss: the
// mean over the positions not ignored, summed in order.
static dsc_status head_forward(dsc_llama *m, float *const *params, const int32_t *targets,
                               const dsc_llama_hooks *hooks, float *loss) {
    int C = m->c.hidden, V = m->c.vocab_size, L = m->c.n_layer;
    int64_t BT = (int64_t)m->h.B * m->h.T;
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, L + 1));
    double t0 = dsc__model_lap_start(m->h.times);
    dsc__llama_rmsnorm_forward(m->fin, m->fin_rstd, acts_of(m, L).res_in,
                               params[norm_tensor(&m->c)], m->c.rms_eps, BT, C);
    dsc__model_lap(m->h.times, &t0, 1 + 4 * L);
    if (m->c.tied) {
        DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, L + 1));
        DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, 0));
    }
    t0 = dsc__model_lap_start(m->h.times);
    lm_head_forward(m, params);
    dsc__model_lap(m->h.times, &t0, 2 + 4 * L);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, m->c.tied ? 0 : L + 1));
    if (targets)
        dsc__host_loss(&m->h, m->losses, m->lse, m->logits, targets, BT, V, loss, 2 + 4 * L);
    return DSC_OK;
}

dsc_status dsc_llama_forward(dsc_llama *m, float *const *params, const int32_t *inputs,
                             const int32_t *targets, int B, int T, const dsc_llama_hooks *hooks,
                             float *loss) {
    return dsc_llama_forward_pos(m, params, inputs, NULL, targets, B, T, hooks, loss);
}

dsc_status dsc_llama_forward_pos(dsc_llama *m, float *const *params, const int32_t *inputs,
                                 const int32_t *pos, const int32_t *targets, int B, int T,
                                 const dsc_llama_hooks *hooks, float *loss) {
    DSC_TRY(dsc__host_forward_begin(m ? &m->h : NULL, "llama", params, inputs, pos, targets, B,
                                    T, hooks, m ? m->h.maxT : 0,
                                    "the sequence length this model was created for"));
    refresh(m);
    int64_t BT = (int64_t)B * T;
    int32_t *tok_in = m->h.tokens, *tok_tg = m->h.tokens + BT;

    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, 0));
    double t0 = dsc__model_lap_start(m->h.times);
    dsc__llama_embed_forward(m->res, tok_in, params[0], BT, m->c.hidden);
    dsc__model_lap(m->h.times, &t0, 0);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, 0));
    DSC_TRY(dsc_model_layers_forward(hooks, "llama", m->c.n_layer, layer_forward, m, params));
    DSC_TRY(head_forward(m, params, targets ? tok_tg : NULL, hooks, loss));
    dsc__host_forward_end(&m->h, targets != NULL);
    return DSC_OK;
}

// ---- backward ----

// MLP: m->dres holds the gradient of the layer's output and gains that through the MLP.
static void mlp_backward(dsc_llama *m, float *const *p, float *const *g, const layer_acts *a) {
    const dsc_llama_config *c = &m->c;
    int C = c->hidden, I = c->intermediate;
    int64_t BT = (int64_t)m->h.B * m->h.T;
    float *hI = m->hI, *dI = m->dI, *ln = m->ln_out;
    dsc__llama_swiglu_forward(hI, a->gate, a->up, BT * I); // recomputed
    // h is overwritten by its own gradient dres @ W_down (the weight's gradient read it first).
    dsc__linear_backward(lin(c, p, a, K_DOWN, NULL, I, C), hI, false,
                         g[kind_pos(c, K_DOWN)], NULL, m->dres, C, hI, I, BT);
    dsc__llama_swiglu_backward(hI, dI, hI, a->gate, a->up, BT * I); // hI: dgate, dI: dup
    dsc__llama_rmsnorm_apply(ln, a->res2, a->rms2, p[kind_pos(c, K_LN2)], BT, C);
    dsc__linear_backward(lin(c, p, a, K_GATE, NULL, C, I), m->d1, false,
                         g[kind_pos(c, K_GATE)], NULL, hI, I, ln, C, BT);
    dsc__linear_backward(lin(c, p, a, K_UP, NULL, C, I), m->d1, true,
                         g[kind_pos(c, K_UP)], NULL, dI, I, ln, C, BT);
    dsc__llama_rmsnorm_backward(m->dres, g[kind_pos(c, K_LN2)], m->norm_scratch, m->d1, a->res2,
                                p[kind_pos(c, K_LN2)], a->rms2, BT, C);
}

// Attention: m->dres holds the gradient of res2 and gains that through attention.
static void attention_backward(dsc_llama *m, float *const *p, float *const *g,
                               const layer_acts *a) {
    const dsc_llama_config *c = &m->c;
    int B = m->h.B, T = m->h.T, C = c->hidden, hd = c->head_dim, ld = m->ld;
    int Q = c->n_head * hd, KV = c->n_kv_head * hd;
    int64_t BT = (int64_t)B * T;
    float *ln = m->ln_out, *dqkv = m->dqkv;
    dsc__linear_backward(lin(c, p, a, K_OW, NULL, Q, C), m->d1, false,
                         g[kind_pos(c, K_OW)], NULL, m->dres, C, a->atty, Q, BT);
    dsc__llama_attention_backward(dqkv, m->d1, a->qkv, a->att_stats, m->att_scratch,
                                  m->h.att_slots, B, T, c->n_head, c->n_kv_head, hd);
    dsc__llama_rope_pos(dqkv, ld, m->rope_cos, m->rope_sin, dsc__host_positions(&m->h), B, T,
                        c->n_head + c->n_kv_head, hd, 1);
    if (c->qk_norm)
        dsc__llama_head_norm_backward(dqkv, ld, g[kind_pos(c, K_QN)], g[kind_pos(c, K_KN)],
                                      m->head_scratch, a->qk_raw, a->qk_rstd,
                                      p[kind_pos(c, K_QN)], p[kind_pos(c, K_KN)], BT, c->n_head,
                                      c->n_kv_head, hd);
    dsc__llama_rmsnorm_apply(ln, a->res_in, a->rms1, p[kind_pos(c, K_LN1)], BT, C);
    static const int w[3] = {K_QW, K_KW, K_VW}, b[3] = {K_QB, K_KB, K_VB};
    const int off[3] = {0, Q, Q + KV}, width[3] = {Q, KV, KV};
    for (int j = 0; j < 3; j++)
        dsc__linear_backward(lin(c, p, a, w[j], NULL, C, width[j]), m->d1, j > 0,
                             g[kind_pos(c, w[j])], c->qkv_bias ? g[kind_pos(c, b[j])] : NULL,
                             dqkv + off[j], ld, ln, C, BT);
    dsc__llama_rmsnorm_backward(m->dres, g[kind_pos(c, K_LN1)], m->norm_scratch, m->d1, a->res_in,
                                p[kind_pos(c, K_LN1)], a->rms1, BT, C);
}

// On entry m->dres holds the gradient of layer l's output; on return that of its input.
static void layer_backward(void *state, float *const *params, float *const *grads, int l) {
    dsc_llama *m = state;
    layer_acts a = acts_of(m, l);
    int first = layer_tensor(&m->c, l, 0);
    mlp_backward(m, params + first, grads + first, &a);
    attention_backward(m, params + first, grads + first, &a);
}

// Loss, lm_head and the final norm: leaves the gradient of the last residual stream in m->dres.
static dsc_status head_backward(dsc_llama *m, float *const *params, float *const *grads,
                                float loss_scale, const dsc_llama_hooks *hooks) {
    int C = m->c.hidden, V = m->c.vocab_size, L = m->c.n_layer, norm = norm_tensor(&m->c);
    int head = head_tensor(&m->c), head_group = m->c.tied ? 0 : L + 1;
    int64_t BT = (int64_t)m->h.B * m->h.T;
    float *dlogits = m->logits; // (BT, V), in place
    float g = m->h.ntargets ? loss_scale / (float)m->h.ntargets : 0.0f;
    dsc__model_xent_backward(dlogits, m->logits, m->lse, m->h.tokens + BT, g, BT, V);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, head_group));
    // grads[head] NULL: frozen (LoRA)
    dsc__linear_backward((dsc__linear){.w = params[head], .in = C, .out = V}, m->d1, false,
                         grads[head], NULL, dlogits, V, m->fin, C, BT);
    if (m->c.tied) {
        DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, 0));
        DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, L + 1));
    }
    memset(m->dres, 0, sizeof(float) * (size_t)BT * C);
    dsc__llama_rmsnorm_backward(m->dres, grads[norm], m->norm_scratch, m->d1,
                                acts_of(m, L).res_in, params[norm], m->fin_rstd, BT, C);
    DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, L + 1));
    return dsc__host_hook(&m->h, hooks, DSC__HOOK_GRADS_READY, L + 1);
}

dsc_status dsc_llama_backward(dsc_llama *m, float *const *params, float *const *grads,
                              float loss_scale, const dsc_llama_hooks *hooks) {
    DSC_TRY(dsc__host_backward_begin(m ? &m->h : NULL, "llama", params, grads, hooks));
    refresh(m);
    DSC_TRY(head_backward(m, params, grads, loss_scale, hooks));
    DSC_TRY(dsc_model_layers_backward(hooks, "llama", m->c.n_layer, layer_backward,
                                      m->c.recompute ? dsc__host_recompute : NULL, m, params,
                                      grads));
    // Tied, group 0 was gathered for lm_head and grads[0] is still the one it gave; untied, it
    // is gathered here so that the hook can hand out the gradient buffer.
    if (!m->c.tied) DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_GATHER, 0));
    if (grads[0]) // NULL: frozen (LoRA)
        dsc__llama_embed_backward(grads[0], m->dres, m->h.tokens, (int64_t)m->h.B * m->h.T,
                                  m->c.hidden);
    if (!m->c.tied) DSC_TRY(dsc__host_hook(&m->h, hooks, DSC__HOOK_RELEASE, 0));
    return dsc__host_hook(&m->h, hooks, DSC__HOOK_GRADS_READY, 0);
}
