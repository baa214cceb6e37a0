// model/llama/ops.c - the Llama family (Llama, SmolLM2, Qwen2, Qwen3, Mistral without a sliding
// window)
// as a model family: the struct dsc_model_ops table over the dsc_llama_* functions (llama.c,
// profile.c, infer.c), the shape from a spec, a tensor table or a Hugging Face config.json, and
// the config.json an export writes.
//
// Contexts: a tiny llama-dN takes the data's vocabulary and --seq-len as its context (1024 when
// none is given), as GPT-2's dN does; a published shape keeps its own vocabulary and its own
// context, or --seq-len when that is longer.
//
// The one-line entries below have the same shape as every other family's ops table on purpose:
// each turns the table's untyped cfg and state into this family's typed calls, which is all an
// ops table does; what the families share lives behind them (model/common.c, model/linear.c).
#include <math.h>   // fabs
#include <stdio.h>  // snprintf
#include <stdlib.h> // malloc, free, strtod
#include <string.h> // strcmp, strncmp

#include "base/status.h"       // dsc__fail, DSC_TRY
#include "dsc/model.h"         // struct dsc_model_ops
#include "model/common.h"      // dsc__model_find_param, dsc__model_match_params
#include "model/hf_config.h"   // dsc_hf_config_read, dsc_hf_config_render
#include "model/llama/infer.h" // dsc__llama_kv_*, dsc__llama_infer
#include "model/llama/llama.h" // dsc_llama_*

enum { TINY_CONTEXT = 1024 };

// The family's configuration: the shape (first, so that a cfg is a dsc_llama_config) and what a
// config.json says beyond it, written back by an export.
typedef struct llama_cfg {
    dsc_llama_config c;
    dsc_hf_config hf; // the folder's own (from_hf), else the defaults of the architecture
    int from_hf;
} llama_cfg;

static const struct {
    const char *name;
    int context; // max_position_embeddings of the published config.json
} contexts[] = {
    {"smollm2-135M", 8192},  {"smollm2-360M", 8192},  {"llama-3.2-1B", 131072},
    {"llama-3.2-3B", 131072}, {"qwen2.5-0.5B", 32768}, {"llama-3.1-8B", 131072},
    {"qwen2.5-7B", 131072},   {"mistral-7B", 32768},
    {"qwen3-0.6B", 40960},    {"qwen3-1.7B", 40960},   {"qwen3-4B", 40960},
    {"qwen3-8B", 40960},
};

// ---- configuration ----

static bool claims(const char *spec) {
    return !strncmp(spec, "llama-", 6) || !strncmp(spec, "smollm2-", 8) ||
           !strncmp(spec, "qwen2.5-", 8) || !strncmp(spec, "mistral-", 8) ||
           !strncmp(spec, "qwen3-", 6);
}

static dsc_status config_new(const dsc_llama_config *c, const dsc_hf_config *hf, void **cfg) {
    llama_cfg *p = calloc(1, sizeof *p);
    if (!p) return dsc__fail(DSC_ERR_OOM, "llama: out of memory for the configuration");
    p->c = *c;
    if (hf) p->hf = *hf, p->from_hf = 1;
    *cfg = p;
    return DSC_OK;
}

static dsc_status config_parse(const char *spec, const dsc_model_opts *o, void **cfg) {
    int ctx = 0;
    for (size_t i = 0; i < sizeof contexts / sizeof contexts[0]; i++)
        if (!strcmp(spec, contexts[i].name)) ctx = contexts[i].context;
    int vocab = ctx ? 0 : o->vocab_size; // a published shape keeps its vocabulary
    if (ctx) ctx = o->max_seq_len > ctx ? o->max_seq_len : ctx;
    else ctx = o->max_seq_len > 0 ? o->max_seq_len : TINY_CONTEXT;
    dsc_llama_config c;
    DSC_TRY(dsc_llama_config_parse(spec, vocab, ctx, &c));
    return config_new(&c, NULL, cfg);
}

static int find_name(const dsc_param_desc *t, int count, const char *want) {
    return dsc__model_find_param(t, count, want, NULL);
}

static int64_t rows_of(const dsc_param_desc *t, int count, const char *name) {
    int j = find_name(t, count, name);
    return j < 0 ? 0 : t[j].shape[0];
}

// The shape from the tensors: sizes from the shapes, the head count from opts (it cannot be read
// off the shapes, except from Qwen3's q_norm, whose length is the head size), the rest the
// defaults of llama-dN (of Qwen3's published shapes with q/k norms: theta 1e6, eps 1e-6).
// DSC_ERR_UNSUPPORTED without Llama embeddings and layers (another family's tensors).
static dsc_status dims(const dsc_param_desc *t, int count, const dsc_model_opts *o,
                       const char *what, dsc_llama_config *c) {
    int emb = find_name(t, count, "model.embed_tokens.weight");
    if (emb < 0 || t[emb].ndim != 2 ||
        find_name(t, count, "model.layers.0.self_attn.q_proj.weight") < 0)
        return dsc__fail(DSC_ERR_UNSUPPORTED,
                         "%s: no Llama embeddings (model.embed_tokens.weight (vocab, hidden) and "
                         "model.layers.<i>.* layers, Hugging Face names)",
                         what);
    int L = 0;
    char name[96];
    for (;; L++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", L);
        if (find_name(t, count, name) < 0) break;
    }
    int64_t C = t[emb].shape[1];
    int64_t Q = rows_of(t, count, "model.layers.0.self_attn.q_proj.weight");
    int64_t KV = rows_of(t, count, "model.layers.0.self_attn.k_proj.weight");
    int64_t I = rows_of(t, count, "model.layers.0.mlp.gate_proj.weight");
    int64_t QN = rows_of(t, count, "model.layers.0.self_attn.q_norm.weight");
    int nh = o->n_head;
    if (nh <= 0 && QN > 0 && Q % QN == 0) nh = (int)(Q / QN);
    if (nh <= 0)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s: Llama weights (%d layers, hidden %lld) do not say how many "
                         "attention and key/value heads they have; use a checkpoint with its "
                         "config.json or a Hugging Face folder (hf:DIR), or give the head count",
                         what, L, (long long)C);
    if (L < 1 || Q % nh != 0 || KV < 1 || KV % (Q / nh) != 0 || I < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s: %d layers with q_proj (%lld, %lld), k_proj of %lld rows and %d "
                         "heads do not fit together: the heads must divide q_proj's rows and the "
                         "head size k_proj's",
                         what, L, (long long)Q, (long long)C, (long long)KV, nh);
    int hd = (int)(Q / nh);
    *c = (dsc_llama_config){.n_layer = L,
                            .hidden = (int)C,
                            .n_head = nh,
                            .n_kv_head = (int)(KV / hd),
                            .head_dim = hd,
                            .intermediate = (int)I,
                            .vocab_size = (int)t[emb].shape[0],
                            .max_seq_len = o->max_seq_len > 0 ? o->max_seq_len : TINY_CONTEXT,
                            .rms_eps = 1e-5f,
                            .rope_theta = 1e4,
                            .rope_factor = 1.0,
                            .tied = find_name(t, count, "lm_head.weight") < 0,
                            .qkv_bias = find_name(t, count,
                                                  "model.layers.0.self_attn.q_proj.bias") >= 0,
                            .qk_norm = QN > 0};
    if (c->qk_norm) c->rms_eps = 1e-6f, c->rope_theta = 1e6;
    return DSC_OK;
}

static void param(const void *cfg, int i, dsc_model_param *out);

static dsc_status config_from_params(const dsc_param_desc *t, int count, const dsc_model_opts *o,
                                     const char *what, void **cfg, int *order) {
    dsc_llama_config c;
    DSC_TRY(dims(t, count, o, what, &c));
    char whole[64], shape[128];
    snprintf(whole, sizeof whole, "Llama of %d layers", c.n_layer);
    snprintf(shape, sizeof shape, "a Llama of hidden %d, %d heads of %d and %d kv heads", c.hidden,
             c.n_head, c.head_dim, c.n_kv_head);
    DSC_TRY(dsc__model_match_params(t, count, NULL, param, &c, dsc_llama_num_tensors(&c), what,
                                    whole, shape, order));
    return config_new(&c, NULL, cfg);
}

static void config_free(void *cfg) { free(cfg); }

static void describe(const void *cfg, dsc_model_info *out) {
    const dsc_llama_config *c = cfg;
    *out = (dsc_model_info){.family = "llama",
                            .n_layer = c->n_layer,
                            .n_head = c->n_head,
                            .n_embd = c->hidden,
                            .vocab_size = c->vocab_size,
                            .max_seq_len = c->max_seq_len,
                            .num_tensors = dsc_llama_num_tensors(c),
                            .num_groups = dsc_llama_num_groups(c),
                            .num_params = dsc_llama_num_params(c)};
}

static void param(const void *cfg, int i, dsc_model_param *out) {
    dsc_llama_tensor_info ti;
    dsc_llama_tensor_info_get(cfg, i, &ti);
    *out = (dsc_model_param){.ndim = ti.ndim, .numel = ti.numel, .group = ti.group};
    snprintf(out->name, sizeof out->name, "%s", ti.name);
    for (int d = 0; d < ti.ndim; d++) out->shape[d] = ti.shape[d];
}

static void init(const void *cfg, int i, float *dst, int64_t begin, int64_t count, uint64_t seed) {
    dsc_llama_init_tensor(cfg, i, dst, begin, count, seed);
}

static double flops_per_token(const void *cfg, int T) { return dsc_llama_flops_per_token(cfg, T); }

static int modules(const void *cfg, int B, int T, dsc_model_module *out) {
    return dsc_llama_modules(cfg, B, T, out);
}

static int timing_slots(const void *cfg) { return dsc_llama_timing_slots(cfg); }

// ---- host passes ----

static dsc_status host_create(const void *cfg, int B, int T, dsc_mem_pool *pool, void **state) {
    dsc_llama *m = NULL;
    DSC_TRY(dsc_llama_create_in(&m, cfg, B, T, pool));
    *state = m;
    return DSC_OK;
}

static void host_destroy(void *state) { dsc_llama_destroy(state); }

static size_t act_bytes(const void *cfg, int B, int T) {
    return dsc_llama_activation_bytes(&((const llama_cfg *)cfg)->c, B, T);
}

static void set_recompute(void *cfg, bool on) { ((llama_cfg *)cfg)->c.recompute = on; }
// 2: recompute, the inputs on the host (the device passes' cpu_checkpointing)
static void set_recompute_host(void *cfg, bool on) {
    llama_cfg *c = cfg;
    if (c->c.recompute) c->c.recompute = on ? 2 : 1;
}
static void set_lora(void *cfg, const dsc_lora *lora) { ((llama_cfg *)cfg)->c.lora = lora; }
static void set_fp8(void *cfg, int format, int margin) {
    llama_cfg *c = cfg;
    c->c.fp8 = format, c->c.fp8_margin = margin;
}

static dsc_status forward(void *state, float *const *params, const int32_t *inputs,
                          const int32_t *pos, const int32_t *targets, int B, int T,
                          const dsc_model_hooks *hooks, float *loss) {
    return dsc_llama_forward_pos(state, params, inputs, pos, targets, B, T, hooks,
                                 loss);
}

static dsc_status backward(void *state, float *const *params, float *const *grads,
                           float loss_scale, const dsc_model_hooks *hooks) {
    return dsc_llama_backward(state, params, grads, loss_scale, hooks);
}

static const float *logits(void *state) { return dsc_llama_logits(state); }
static void set_timing(void *state, double *times) { dsc_llama_set_timing(state, times); }

// ---- inference ----

static dsc_status tp_check(const void *cfg, int size) { return dsc__llama_tp_check(cfg, size); }

static int64_t tp_numel(const void *cfg, int i, int size) {
    return dsc__llama_tp_numel(cfg, i, size);
}

static void tp_slice(const void *cfg, int i, int rank, int size, const float *full, float *dst) {
    dsc__llama_tp_slice(cfg, i, rank, size, full, dst);
}

static size_t kv_bytes(const void *cfg, int tp_size, int nseq, int max_len) {
    return dsc__llama_kv_bytes(cfg, tp_size, nseq, max_len);
}

static dsc_status kv_create(const void *cfg, int tp_size, int nseq, int max_len, void **kv) {
    dsc_llama_kv *k = NULL;
    DSC_TRY(dsc__llama_kv_create(&k, cfg, tp_size, nseq, max_len));
    *kv = k;
    return DSC_OK;
}

static void kv_destroy(void *kv) { dsc__llama_kv_destroy(kv); }

static bool kv_fits(const void *kv, const void *cfg, int tp_size, int nseq, int max_len) {
    return dsc__llama_kv_fits(kv, cfg, tp_size, nseq, max_len);
}

static dsc_status infer(void *kv, float *const *params, const dsc_model_tp *tp,
                        const dsc_model_rows *rows, const dsc_model_hooks *hooks, float *logits) {
    return dsc__llama_infer(kv, params, tp, rows, hooks, logits);
}

// ---- Hugging Face folders ----

// DSC_ERR_CONFIG, not DSC_ERR_UNSUPPORTED: the architecture is this family's (the registry would
// take UNSUPPORTED for another family's and lose the message).
static dsc_status refuse(const char *path, const char *field, const char *value,
                         const char *supported) {
    return dsc__fail(DSC_ERR_CONFIG, "%s: %s %s is not supported; dsc's Llama family takes %s",
                     path, field, value, supported);
}

// What a config.json says that dsc's Llama family does not compute, as a refusal naming the
// field (the reader took care of the two spellings; this is about the values).
static dsc_status check_hf(const char *path, const dsc_hf_config *h) {
    char v[96];
    if (strcmp(h->act, "silu") != 0) {
        snprintf(v, sizeof v, "\"%s\"", h->act);
        return refuse(path, "hidden_act", v, "\"silu\" (SwiGLU)");
    }
    if (h->mlp_bias) return refuse(path, "mlp_bias", "true", "MLPs without biases (false)");
    if (h->o_bias)
        return refuse(path, "attention_bias", "true",
                      "attention without biases (false; o_proj has no bias, Qwen2's q/k/v biases "
                      "are its own)");
    if (strcmp(h->rope_type, "default") && strcmp(h->rope_type, "linear") &&
        strcmp(h->rope_type, "llama3")) {
        snprintf(v, sizeof v, "\"%s\" (rope_scaling or rope_parameters)", h->rope_type);
        return refuse(path, "rope_type", v,
                      "no scaling (\"default\"), \"linear\" or \"llama3\"");
    }
    if (h->rope_partial != 1.0) {
        snprintf(v, sizeof v, "%g", h->rope_partial);
        return refuse(path, "partial_rotary_factor", v, "1 (the whole head rotates)");
    }
    if (h->n_sliding_layers > 0 && h->sliding_window < h->max_positions) {
        snprintf(v, sizeof v, "%d (context %d, on %d of %d layers)", h->sliding_window,
                 h->max_positions, h->n_sliding_layers, h->n_layer);
        return refuse(path, "sliding_window", v,
                      "full causal attention: no sliding window (null, Qwen2's "
                      "use_sliding_window false, or no \"sliding_attention\" in layer_types), or "
                      "one at least as long as max_position_embeddings");
    }
    if (h->attention_dropout != 0.0) {
        snprintf(v, sizeof v, "%g", h->attention_dropout);
        return refuse(path, "attention_dropout", v, "0 (dsc trains without dropout)");
    }
    if (h->head_dim % 2 != 0) {
        snprintf(v, sizeof v, "%d", h->head_dim);
        return refuse(path, "head_dim", v, "an even head size (rotary pairs)");
    }
    return DSC_OK;
}

static dsc_status config_from_hf(const char *path, const dsc_model_opts *o, void **cfg) {
    (void)o; // the folder's config.json decides vocabulary and context
    dsc_hf_config h;
    DSC_TRY(dsc_hf_config_read(path, &h));
    if (h.arch != DSC_HF_LLAMA && h.arch != DSC_HF_QWEN2 && h.arch != DSC_HF_MISTRAL &&
        h.arch != DSC_HF_QWEN3)
        return DSC_ERR_UNSUPPORTED;
    DSC_TRY(check_hf(path, &h));
    if (h.arch == DSC_HF_QWEN3 && h.qkv_bias) // q/k/v only would be a model Qwen3 is not
        return refuse(path, "attention_bias", "true", "Qwen3 attention without biases (false)");
    int scaling = DSC_LLAMA_ROPE_NONE;
    if (!strcmp(h.rope_type, "linear")) scaling = DSC_LLAMA_ROPE_LINEAR;
    else if (!strcmp(h.rope_type, "llama3")) scaling = DSC_LLAMA_ROPE_LLAMA3;
    dsc_llama_config c = {.n_layer = h.n_layer,
                          .hidden = h.hidden,
                          .n_head = h.n_head,
                          .n_kv_head = h.n_kv_head,
                          .head_dim = h.head_dim,
                          .intermediate = h.intermediate,
                          .vocab_size = h.vocab_size,
                          .max_seq_len = h.max_positions,
                          .rms_eps = (float)h.norm_eps,
                          .rope_theta = h.rope_theta,
                          .rope_scaling = scaling,
                          .rope_factor = scaling ? h.rope_factor : 1.0,
                          .tied = h.tied,
                          .qkv_bias = h.qkv_bias,
                          .qk_norm = h.arch == DSC_HF_QWEN3};
    if (scaling == DSC_LLAMA_ROPE_LLAMA3) {
        c.rope_low_freq_factor = h.rope_low_freq;
        c.rope_high_freq_factor = h.rope_high_freq;
        c.rope_original_max_pos = h.rope_orig_max;
    }
    return config_new(&c, &h, cfg);
}

static dsc_status hf_config(const void *cfg, char **config_json, char **generation_json) {
    const llama_cfg *p = cfg;
    const dsc_llama_config *c = &p->c;
    dsc_hf_config h = {0};
    if (p->from_hf) {
        h = p->hf;
    } else { // a spec or a tensor table: Qwen3 with q/k norms, Qwen2 when q/k/v carry biases,
             // else Llama
        const char *family = dsc__llama_family_name(c);
        h.arch = c->qk_norm ? DSC_HF_QWEN3 : c->qkv_bias ? DSC_HF_QWEN2 : DSC_HF_LLAMA;
        snprintf(h.architecture, sizeof h.architecture, "%sForCausalLM", family);
        snprintf(h.model_type, sizeof h.model_type, "%s",
                 c->qk_norm ? "qwen3" : c->qkv_bias ? "qwen2" : "llama");
        snprintf(h.act, sizeof h.act, "silu");
        h.bos_id = -1;
    }
    h.vocab_size = c->vocab_size;
    h.n_layer = c->n_layer;
    h.hidden = c->hidden;
    h.n_head = c->n_head;
    h.n_kv_head = c->n_kv_head;
    h.head_dim = c->head_dim;
    h.intermediate = c->intermediate;
    h.max_positions = c->max_seq_len;
    char eps[32]; // the float's shortest decimal (1e-05, not 9.99999975e-06)
    snprintf(eps, sizeof eps, "%.7g", (double)c->rms_eps);
    h.norm_eps = strtod(eps, NULL);
    h.rope_theta = c->rope_theta;
    h.tied = c->tied;
    h.qkv_bias = c->qkv_bias;
    static const char *const types[] = {"default", "linear", "llama3"};
    snprintf(h.rope_type, sizeof h.rope_type, "%s", types[c->rope_scaling]);
    h.rope_factor = c->rope_factor;
    h.rope_low_freq = c->rope_low_freq_factor;
    h.rope_high_freq = c->rope_high_freq_factor;
    h.rope_orig_max = c->rope_original_max_pos;
    snprintf(h.torch_dtype, sizeof h.torch_dtype, "float32");
    return dsc_hf_config_render(&h, config_json, generation_json);
}

#ifdef DSC_WITH_CUDA
extern const struct dsc_model_device_ops dsc__llama_device_ops; // model/llama/llama_cuda.cu
#endif

const struct dsc_model_ops dsc__llama_model_ops = {
    .family = "llama",
    .specs = "smollm2-135M, smollm2-360M, llama-3.2-1B, llama-3.2-3B, qwen2.5-0.5B, "
             "llama-3.1-8B, qwen2.5-7B, mistral-7B, qwen3-0.6B, qwen3-1.7B, qwen3-4B, qwen3-8B, "
             "llama-dN (N layers, N heads of 64 channels, 1 <= N <= 256, e.g. llama-d4) or "
             "qwen3-dN (with Qwen3's q/k norms, heads of 128)",
    .claims = claims,
    .config_parse = config_parse,
    .config_from_params = config_from_params,
    .config_free = config_free,
    .describe = describe,
    .param = param,
    .init = init,
    .flops_per_token = flops_per_token,
    .modules = modules,
    .timing_slots = timing_slots,
    .host_create = host_create,
    .host_destroy = host_destroy,
    .forward = forward,
    .backward = backward,
    .logits = logits,
    .set_timing = set_timing,
    .tp_check = tp_check,
    .tp_numel = tp_numel,
    .tp_slice = tp_slice,
    .kv_bytes = kv_bytes,
    .kv_create = kv_create,
    .kv_destroy = kv_destroy,
    .kv_fits = kv_fits,
    .infer = infer,
    .config_from_hf = config_from_hf,
    .hf_config = hf_config,
    .act_bytes = act_bytes,
    .set_recompute = set_recompute,
    .set_recompute_host = set_recompute_host,
    .set_lora = set_lora,
    .set_fp8 = set_fp8,
#ifdef DSC_WITH_CUDA
    .device = &dsc__llama_device_ops,
#endif
};
