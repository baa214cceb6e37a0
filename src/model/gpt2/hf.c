// model/gpt2/hf.c - GPT-2's shape to and from a Hugging Face config.json.
#include "model/gpt2/hf.h"

#include <math.h>   // fabs
#include <stdio.h>  // snprintf
#include <string.h> // strcmp

#include "base/status.h" // dsc__fail

static bool tanh_gelu(const char *act) {
    return !strcmp(act, "gelu_new") || !strcmp(act, "gelu_pytorch_tanh") ||
           !strcmp(act, "gelu_fast");
}

dsc_status dsc_gpt2_config_from_hf(const dsc_hf_config *h, const char *path, dsc_gpt2_config *out) {
    if (h->arch != DSC_HF_GPT2)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: architecture %s is not GPT-2", path,
                         h->architecture);
    if (!tanh_gelu(h->act))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: activation_function \"%s\": dsc's GPT-2 "
                         "computes the tanh GELU (gelu_new, gelu_pytorch_tanh, gelu_fast)", path,
                         h->act);
    if (fabs(h->norm_eps - 1e-5) > 1e-12)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: layer_norm_epsilon %g: dsc's GPT-2 uses 1e-5",
                         path, h->norm_eps);
    if (h->intermediate != 4 * h->hidden)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: n_inner %d: dsc's GPT-2 has an MLP of 4 n_embd "
                         "(%d); leave n_inner null", path, h->intermediate, 4 * h->hidden);
    if (!h->tied)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: tie_word_embeddings false: dsc's GPT-2 ties "
                         "lm_head to wte", path);
    if (h->scale_attn_by_inverse_layer_idx || !h->scale_attn_weights)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: scale_attn_by_inverse_layer_idx true or "
                         "scale_attn_weights false: dsc's GPT-2 scales attention by "
                         "1/sqrt(head_dim) alone", path);
    if (h->hidden % h->n_head)
        return dsc__fail(DSC_ERR_CONFIG, "%s: n_embd %d is not a multiple of n_head %d", path,
                         h->hidden, h->n_head);
    *out = (dsc_gpt2_config){.n_layer = h->n_layer, .n_head = h->n_head, .n_embd = h->hidden,
                             .vocab_size = h->vocab_size, .max_seq_len = h->max_positions};
    return DSC_OK;
}

void dsc_gpt2_config_to_hf(const dsc_gpt2_config *c, dsc_hf_config *out) {
    *out = (dsc_hf_config){.arch = DSC_HF_GPT2, .vocab_size = c->vocab_size,
                           .n_layer = c->n_layer, .hidden = c->n_embd, .n_head = c->n_head,
                           .n_kv_head = c->n_head, .head_dim = c->n_embd / c->n_head,
                           .intermediate = 4 * c->n_embd, .max_positions = c->max_seq_len,
                           .norm_eps = 1e-5, .tied = true, .scale_attn_weights = true,
                           .bos_id = -1};
    snprintf(out->architecture, sizeof out->architecture, "GPT2LMHeadModel");
    snprintf(out->model_type, sizeof out->model_type, "gpt2");
    snprintf(out->act, sizeof out->act, "gelu_new");
    snprintf(out->rope_type, sizeof out->rope_type, "none");
    snprintf(out->torch_dtype, sizeof out->torch_dtype, "float32");
    if (c->vocab_size > 50256) {
        out->bos_id = 50256;
        out->eos_ids[0] = 50256;
        out->n_eos = 1;
    }
}
