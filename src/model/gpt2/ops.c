// model/gpt2/ops.c - GPT-2 as a model family: the struct dsc_model_ops table over the dsc_gpt2_*
// functions (gpt2.c, profile.c, infer.c), the shape from a spec or from a tensor table, and the
// getter the GPU code uses until its model goes through the table too (model/gpt2/model.h).
//
// The one-line entries below have the same shape as every other family's ops table on purpose:
// each turns the table's untyped cfg and state into this family's typed calls, which is all an
// ops table does; what the families share lives behind them (model/common.c, model/linear.c).
#include "model/gpt2/model.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // malloc, free
#include <string.h> // strcmp, strncmp

#include "base/status.h"      // dsc__fail, DSC_TRY
#include "model/common.h"     // dsc__model_find_param, dsc__model_match_params
#include "model/gpt2/hf.h"    // dsc_gpt2_config_from_hf, dsc_gpt2_config_to_hf
#include "model/gpt2/infer.h" // dsc__gpt2_kv_*, dsc__gpt2_infer, dsc__gpt2_tp_*
#include "model/hf_config.h"  // dsc_hf_config_read, dsc_hf_config_render
#include "model/model.h"      // dsc__model_ops, dsc__model_config

enum { GPT2_VOCAB = 50257, GPT2_CONTEXT = 1024 };

#ifdef DSC_WITH_CUDA
extern const struct dsc_model_device_ops dsc__gpt2_device_ops; // model/gpt2/gpt2_cuda.cu
#endif

const dsc_gpt2_config *dsc__model_gpt2_config(const dsc_model *m) {
    return dsc__model_ops(m) == &dsc__gpt2_model_ops ? dsc__model_config(m) : NULL;
}

// ---- configuration ----

static bool claims(const char *spec) {
    return !strncmp(spec, "gpt2-", 5) || (spec[0] == 'd' && spec[1] >= '0' && spec[1] <= '9');
}

static dsc_status config_new(const dsc_gpt2_config *c, void **cfg) {
    dsc_gpt2_config *p = malloc(sizeof *p);
    if (!p) return dsc__fail(DSC_ERR_OOM, "gpt2: out of memory for the configuration");
    *p = *c;
    *cfg = p;
    return DSC_OK;
}

dsc_status dsc__model_gpt2_create(dsc_model **out, const dsc_gpt2_config *c) {
    *out = NULL;
    if (!c || c->n_layer < 1 || c->n_head < 1 || c->n_embd < 1 || c->n_embd % c->n_head != 0 ||
        c->vocab_size < 1 || c->max_seq_len < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "gpt2 model: the configuration is invalid: every "
                         "size must be positive and n_embd a multiple of n_head");
    void *cfg = NULL;
    DSC_TRY(config_new(c, &cfg));
    return dsc__model_wrap(out, &dsc__gpt2_model_ops, cfg, "gpt2 (custom shape)");
}

static dsc_status config_parse(const char *spec, const dsc_model_opts *o, void **cfg) {
    dsc_gpt2_config c;
    DSC_TRY(dsc_gpt2_config_parse(spec, o->vocab_size > 0 ? o->vocab_size : GPT2_VOCAB,
                                  o->max_seq_len > 0 ? o->max_seq_len : GPT2_CONTEXT, &c));
    return config_new(&c, cfg);
}

static int find_name(const dsc_param_desc *t, int count, const char *want) {
    return dsc__model_find_param(t, count, want, "transformer."); // some exports prefix every name
}

// The dimensions from the embeddings and the layers present. DSC_ERR_UNSUPPORTED when the table
// holds no GPT-2 embeddings (another family's tensors).
static dsc_status dims(const dsc_param_desc *t, int count, int n_head, const char *what,
                       dsc_gpt2_config *c) {
    int wte = find_name(t, count, "wte.weight"), wpe = find_name(t, count, "wpe.weight");
    if (wte < 0 || wpe < 0 || t[wte].ndim != 2 || t[wpe].ndim != 2 ||
        t[wte].shape[1] != t[wpe].shape[1])
        return dsc__fail(DSC_ERR_UNSUPPORTED,
                         "%s: no GPT-2 embeddings (wte.weight (vocab, C) and wpe.weight (context, "
                         "C), Hugging Face names); give GPT-2 weights",
                         what);
    int L = 0;
    char name[64];
    for (;; L++) {
        snprintf(name, sizeof name, "h.%d.ln_1.weight", L);
        if (find_name(t, count, name) < 0) break;
    }
    int64_t C = t[wte].shape[1];
    if (n_head <= 0) n_head = C % 64 == 0 ? (int)(C / 64) : 0;
    if (L < 1 || n_head < 1 || C % n_head != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s: %d layers (h.0 ...) of %lld channels: cannot derive the attention "
                         "heads (%d); the weights need h.<i>.* layers and a head count that "
                         "divides the channels (GPT-2: 64 channels per head)",
                         what, L, (long long)C, n_head);
    *c = (dsc_gpt2_config){.n_layer = L,
                           .n_head = n_head,
                           .n_embd = (int)C,
                           .vocab_size = (int)t[wte].shape[0],
                           .max_seq_len = (int)t[wpe].shape[0]};
    return DSC_OK;
}

static void param(const void *cfg, int i, dsc_model_param *out);

static dsc_status config_from_params(const dsc_param_desc *t, int count, const dsc_model_opts *o,
                                     const char *what, void **cfg, int *order) {
    dsc_gpt2_config c;
    DSC_TRY(dims(t, count, o->n_head, what, &c));
    char whole[64], shape[96];
    snprintf(whole, sizeof whole, "GPT-2 of %d layers", c.n_layer);
    snprintf(shape, sizeof shape, "GPT-2 with %d channels and vocabulary %d", c.n_embd,
             c.vocab_size);
    DSC_TRY(dsc__model_match_params(t, count, "transformer.", param, &c, dsc_gpt2_num_tensors(&c),
                                    what, whole, shape, order));
    return config_new(&c, cfg);
}

static void config_free(void *cfg) { free(cfg); }

static void describe(const void *cfg, dsc_model_info *out) {
    const dsc_gpt2_config *c = cfg;
    *out = (dsc_model_info){.family = "gpt2",
                            .n_layer = c->n_layer,
                            .n_head = c->n_head,
                            .n_embd = c->n_embd,
                            .vocab_size = c->vocab_size,
                            .max_seq_len = c->max_seq_len,
                            .num_tensors = dsc_gpt2_num_tensors(c),
                            .num_groups = dsc_gpt2_num_groups(c),
                            .num_params = dsc_gpt2_num_params(c)};
}

static void param(const void *cfg, int i, dsc_model_param *out) {
    dsc_gpt2_tensor_info ti;
    dsc_gpt2_tensor_info_get(cfg, i, &ti);
    *out = (dsc_model_param){.ndim = ti.ndim, .numel = ti.numel, .group = ti.group};
    snprintf(out->name, sizeof out->name, "%s", ti.name);
    for (int d = 0; d < ti.ndim; d++) out->shape[d] = ti.shape[d];
}

static void init(const void *cfg, int i, float *dst, int64_t begin, int64_t count, uint64_t seed) {
    dsc_gpt2_init_tensor(cfg, i, dst, begin, count, seed);
}

static double flops_per_token(const void *cfg, int T) { return dsc_gpt2_flops_per_token(cfg, T); }

static int modules(const void *cfg, int B, int T, dsc_model_module *out) {
    return dsc_gpt2_modules(cfg, B, T, out);
}

static int timing_slots(const void *cfg) { return dsc_gpt2_timing_slots(cfg); }

// ---- host passes ----

static dsc_status host_create(const void *cfg, int B, int T, dsc_mem_pool *pool, void **state) {
    dsc_gpt2 *m = NULL;
    DSC_TRY(dsc_gpt2_create_in(&m, cfg, B, T, pool));
    *state = m;
    return DSC_OK;
}

static void host_destroy(void *state) { dsc_gpt2_destroy(state); }

static size_t act_bytes(const void *cfg, int B, int T) {
    return dsc_gpt2_activation_bytes(cfg, B, T);
}

static void set_recompute(void *cfg, bool on) { ((dsc_gpt2_config *)cfg)->recompute = on; }
// 2: recompute, the inputs on the host (the device passes' cpu_checkpointing)
static void set_recompute_host(void *cfg, bool on) {
    dsc_gpt2_config *c = cfg;
    if (c->recompute) c->recompute = on ? 2 : 1;
}
static void set_lora(void *cfg, const dsc_lora *lora) { ((dsc_gpt2_config *)cfg)->lora = lora; }

static dsc_status forward(void *state, float *const *params, const int32_t *inputs,
                          const int32_t *pos, const int32_t *targets, int B, int T,
                          const dsc_model_hooks *hooks, float *loss) {
    return dsc_gpt2_forward_pos(state, params, inputs, pos, targets, B, T, hooks, loss);
}

static dsc_status backward(void *state, float *const *params, float *const *grads,
                           float loss_scale, const dsc_model_hooks *hooks) {
    return dsc_gpt2_backward(state, params, grads, loss_scale, hooks);
}

static const float *logits(void *state) { return dsc_gpt2_logits(state); }
static void set_timing(void *state, double *times) { dsc_gpt2_set_timing(state, times); }

// ---- inference ----

static dsc_status tp_check(const void *cfg, int size) { return dsc__gpt2_tp_check(cfg, size); }

static int64_t tp_numel(const void *cfg, int i, int size) {
    return dsc__gpt2_tp_numel(cfg, i, size);
}

static void tp_slice(const void *cfg, int i, int rank, int size, const float *full, float *dst) {
    dsc__gpt2_tp_slice(cfg, i, rank, size, full, dst);
}

static size_t kv_bytes(const void *cfg, int tp_size, int nseq, int max_len) {
    return dsc__gpt2_kv_bytes(cfg, tp_size, nseq, max_len);
}

static dsc_status kv_create(const void *cfg, int tp_size, int nseq, int max_len, void **kv) {
    dsc_gpt2_kv *k = NULL;
    DSC_TRY(dsc__gpt2_kv_create(&k, cfg, tp_size, nseq, max_len));
    *kv = k;
    return DSC_OK;
}

static void kv_destroy(void *kv) { dsc__gpt2_kv_destroy(kv); }

static bool kv_fits(const void *kv, const void *cfg, int tp_size, int nseq, int max_len) {
    return dsc__gpt2_kv_fits(kv, cfg, tp_size, nseq, max_len) != 0;
}

static dsc_status infer(void *kv, float *const *params, const dsc_model_tp *tp,
                        const dsc_model_rows *rows, const dsc_model_hooks *hooks, float *logits) {
    return dsc__gpt2_infer(kv, params, tp, rows, hooks, logits);
}

// ---- Hugging Face folders ----

static dsc_status config_from_hf(const char *path, const dsc_model_opts *o, void **cfg) {
    (void)o; // the folder's config.json decides vocabulary and context
    dsc_hf_config h;
    DSC_TRY(dsc_hf_config_read(path, &h));
    if (h.arch != DSC_HF_GPT2) return DSC_ERR_UNSUPPORTED;
    dsc_gpt2_config c;
    dsc_status st = dsc_gpt2_config_from_hf(&h, path, &c);
    // A GPT-2 dsc does not compute is this family's refusal, not another family's folder.
    if (st != DSC_OK) return st == DSC_ERR_UNSUPPORTED ? DSC_ERR_CONFIG : st;
    return config_new(&c, cfg);
}

static dsc_status hf_config(const void *cfg, char **config_json, char **generation_json) {
    dsc_hf_config h;
    dsc_gpt2_config_to_hf(cfg, &h);
    return dsc_hf_config_render(&h, config_json, generation_json);
}

const struct dsc_model_ops dsc__gpt2_model_ops = {
    .family = "gpt2",
    .specs = "gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M, or dN (N layers, N heads, 64N "
             "channels, 1 <= N <= 256, e.g. d12)",
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
#ifdef DSC_WITH_CUDA
    .device = &dsc__gpt2_device_ops, // model/gpt2/gpt2_cuda.cu
#endif
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
    .weights_in_out = true, // Conv1D: (in, out)
};
