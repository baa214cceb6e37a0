// infer/generate.h - the generation loop over a GPT-2 whose weights the caller provides: the
// engine's (hybrid.c) or a file's (`dsc generate`).
#ifndef DSC_INFER_GENERATE_H
#define DSC_INFER_GENERATE_H

#include "dsc/generate.h"     // dsc_gen_*
#include "model/gpt2/infer.h" // dsc_gpt2_kv, dsc_gpt2_tp

typedef struct dsc__gen_model {
    dsc_gpt2_config c;
    float *const *params;        // every tensor in the local layout of tp (borrowed)
    const dsc_gpt2_hooks *hooks; // NULL: params stay valid for the whole call
    dsc_gpt2_tp tp;              // size 1: none
    int max_positions;           // positions per sequence the cache may hold; 0: the context
} dsc__gen_model;

// Generate from n prompts into out[0..n) (see dsc_generate for the options). *kv is reused when
// it fits and replaced otherwise; the caller owns it (dsc__gpt2_kv_destroy). Every rank of a
// tensor-parallel group passes the same prompts and gets the same outputs. stats may be NULL.
dsc_status dsc__generate_run(const dsc__gen_model *m, dsc_gpt2_kv **kv,
                             const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                             dsc_gen_output *out, dsc_gen_stats *stats);

// The model of a parameter table with Hugging Face GPT-2 names and shapes (wte.weight (V, C),
// wpe.weight (T, C), h.<i>.* for every layer, ln_f.*), n_head heads (0: C / 64), checked tensor
// by tensor against dsc_gpt2_tensor_info. names[i], shapes[i][0..2) of tensor i, in any order:
// order[k] receives the table index of the model's tensor k. what names the source in errors.
dsc_status dsc__gen_model_config(const char *const *names, const int64_t (*shapes)[2],
                                 const int *ndims, int count, int n_head, const char *what,
                                 dsc_gpt2_config *out, int *order);

#endif
