// model/llama/profile.c - the Llama module tree with parameters and analytic forward FLOPs, for
// the flops profiler: Hugging Face's module names, so a profile reads like one of the Python
// model.
#include <stdio.h> // snprintf

#include "model/common.h" // dsc__tree
#include "model/llama/llama.h"

int dsc_llama_timing_slots(const dsc_llama_config *c) { return 3 + 4 * c->n_layer; }

// Hugging Face's class prefix of the model a configuration is: Qwen3 (q/k norms), Qwen2 (q/k/v
// biases) or Llama.
const char *dsc__llama_family_name(const dsc_llama_config *c) {
    return c->qk_norm ? "Qwen3" : c->qkv_bias ? "Qwen2" : "Llama";
}


// One decoder layer under model.layers: input_layernorm, self_attn (q, k, v, o projections and
// attention), post_attention_layernorm, mlp (gate, up, down). 2 FLOPs per parameter per token
// (norm weights and biases included, as dsc_llama_flops_per_token counts them); attention's
// scores and weighted sum 2 T NH hd each per token.
static void block(dsc__tree *t, const dsc_llama_config *c, double tokens, int T, int l,
                  int layers) {
    int64_t C = c->hidden, Q = (int64_t)c->n_head * c->head_dim;
    int64_t KV = (int64_t)c->n_kv_head * c->head_dim, I = c->intermediate;
    int64_t attn = C * Q + 2 * C * KV + Q * C + (c->qkv_bias ? Q + 2 * KV : 0) +
                   (c->qk_norm ? 2 * (int64_t)c->head_dim : 0);
    const int64_t params[4] = {C, attn, C, 3 * C * I};
    double flops[4];
    for (int k = 0; k < 4; k++) flops[k] = 2.0 * (double)params[k] * tokens;
    flops[1] += 4.0 * (double)Q * T * tokens;
    const char *family = dsc__llama_family_name(c);
    static const char *const sub[4] = {"input_layernorm", "self_attn", "post_attention_layernorm",
                                       "mlp"};
    static const char *const kind[4] = {"RMSNorm", "Attention", "RMSNorm", "MLP"};
    char bname[48], name[48], type[32];
    snprintf(bname, sizeof bname, "model.layers.%d", l);
    snprintf(type, sizeof type, "%sDecoderLayer", family);
    int b = dsc__tree_add(t, 3, type, 0, 0, -1, bname);
    for (int k = 0; k < 4; k++) {
        snprintf(name, sizeof name, "model.layers.%d.%s", l, sub[k]);
        snprintf(type, sizeof type, "%s%s", family, kind[k]);
        dsc__tree_child(t, b, 4, type, params[k], flops[k], 1 + 4 * l + k, name);
    }
    dsc__tree_roll_up(t, layers, b);
}

int dsc_llama_modules(const dsc_llama_config *c, int B, int T, dsc_llama_module *out) {
    dsc__tree t = {out, 0};
    double tokens = (double)B * T, V = c->vocab_size, C = c->hidden;
    int L = c->n_layer;
    const char *family = dsc__llama_family_name(c);
    char type[32];
    snprintf(type, sizeof type, "%sForCausalLM", family);
    int root = dsc__tree_add(&t, 0, type, 0, 0, -1, "(root)");
    snprintf(type, sizeof type, "%sModel", family);
    int model = dsc__tree_add(&t, 1, type, 0, 0, -1, "model");
    // The lookup costs no products; a tied table's FLOPs are counted where it is lm_head.
    dsc__tree_child(&t, model, 2, "Embedding", (int64_t)(V * C), 0, 0, "model.embed_tokens");
    int layers = dsc__tree_add(&t, 2, "ModuleList", 0, 0, -1, "model.layers");
    for (int l = 0; l < L; l++) block(&t, c, tokens, T, l, layers);
    dsc__tree_roll_up(&t, model, layers);
    snprintf(type, sizeof type, "%sRMSNorm", family);
    dsc__tree_child(&t, model, 2, type, c->hidden, 2.0 * C * tokens, 1 + 4 * L, "model.norm");
    dsc__tree_roll_up(&t, root, model);
    dsc__tree_child(&t, root, 1, c->tied ? "Linear (tied to embed_tokens)" : "Linear",
                    c->tied ? 0 : (int64_t)(V * C), 2.0 * V * C * tokens, 2 + 4 * L, "lm_head");
    return t.n;
}
