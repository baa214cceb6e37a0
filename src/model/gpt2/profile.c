// model/gpt2/profile.c - GPT-2's module tree with parameters and analytic forward FLOPs, for the
// flops profiler: Hugging Face's module names, so a profile reads like one of the Python model.
#include <stdio.h>  // snprintf

#include "model/common.h" // dsc__tree
#include "model/gpt2/gpt2.h"

int dsc_gpt2_timing_slots(const dsc_gpt2_config *c) { return 3 + 4 * c->n_layer; }


// One transformer block under h: ln_1, attn (c_attn, attention, c_proj), ln_2, mlp (c_fc, GELU,
// c_proj). Products cost 2 FLOPs per parameter per token; attention's scores and weighted sum
// 2 T C each per token (counted over the full T x T, as dsc_gpt2_flops_per_token does).
static void block(dsc__tree *t, const dsc_gpt2_config *c, double tokens, int T, int l, int h) {
    int64_t C = c->n_embd, ln = 2 * C, attn = 4 * C * C + 4 * C, mlp = 8 * C * C + 5 * C;
    char name[4][48], bname[48];
    static const char *const sub[4] = {"ln_1", "attn", "ln_2", "mlp"};
    static const char *const type[4] = {"LayerNorm", "GPT2Attention", "LayerNorm", "GPT2MLP"};
    const int64_t params[4] = {ln, attn, ln, mlp};
    snprintf(bname, sizeof bname, "transformer.h.%d", l);
    int b = dsc__tree_add(t, 3, "GPT2Block", 0, 0, -1, bname);
    for (int k = 0; k < 4; k++) {
        snprintf(name[k], sizeof name[k], "transformer.h.%d.%s", l, sub[k]);
        double flops = 2.0 * (double)params[k] * tokens;
        if (k == 1) flops += 4.0 * (double)C * T * tokens;
        dsc__tree_child(t, b, 4, type[k], params[k], flops, 1 + 4 * l + k, name[k]);
    }
    dsc__tree_roll_up(t, h, b);
}

int dsc_gpt2_modules(const dsc_gpt2_config *c, int B, int T, dsc_gpt2_module *out) {
    dsc__tree t = {out, 0};
    double tokens = (double)B * T, V = c->vocab_size, C = c->n_embd;
    int L = c->n_layer;
    // The embedding's lookups cost no products; wte's FLOPs are counted where it is a product,
    // as the tied lm_head.
    int root = dsc__tree_add(&t, 0, "GPT2LMHeadModel", 0, 0, -1, "model");
    int tr = dsc__tree_add(&t, 1, "GPT2Model", 0, 0, -1, "transformer");
    dsc__tree_child(&t, tr, 2, "Embedding", (int64_t)(V * C) + (int64_t)c->max_seq_len * c->n_embd,
                    0, 0, "transformer.wte+wpe");
    int h = dsc__tree_add(&t, 2, "ModuleList", 0, 0, -1, "transformer.h");
    for (int l = 0; l < L; l++) block(&t, c, tokens, T, l, h);
    dsc__tree_roll_up(&t, tr, h);
    dsc__tree_child(&t, tr, 2, "LayerNorm", 2 * (int64_t)c->n_embd, 4.0 * C * tokens, 1 + 4 * L,
                    "transformer.ln_f");
    dsc__tree_roll_up(&t, root, tr);
    dsc__tree_child(&t, root, 1, "Linear (tied to wte)", 0, 2.0 * V * C * tokens, 2 + 4 * L,
                    "lm_head");
    return t.n;
}
