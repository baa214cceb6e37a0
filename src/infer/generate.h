// infer/generate.h - the generation loop over a model (dsc/model.h) whose weights the caller
// provides: the engine's (hybrid.c) or a file's (`dsc generate`).
#ifndef DSC_INFER_GENERATE_H
#define DSC_INFER_GENERATE_H

#include "dsc/generate.h" // dsc_gen_*, dsc_gen_model, dsc_generate_run*
#include "dsc/model.h"    // dsc_model, dsc_model_kv, dsc_model_tp, dsc_model_hooks

// ---- the loop, for any model ----

// One pass of the loop: what is new for each sequence, and which sequences want a next token.
typedef struct dsc__gen_pass {
    int n;                        // sequences of the call (all of them, ended or not)
    const int32_t *const *tokens; // (n) each sequence's tokens so far (prompt + generated)
    const int *len;               // (n) how many
    const bool *live;             // (n) still generating
    bool first;                   // the prompts' pass: every token is new (every sequence is
                                  // live); afterwards only each sequence's newest token is
    int nout;                     // the live sequences, in index order: sel[0 .. nout)
    const int32_t *sel;
} dsc__gen_pass;

// A model the loop drives: the CPU rows (dsc_model_infer, in generate.c) or the GPU decoder
// (generate_cuda.c). next writes logits (nout, V), fp32, of each selected sequence's newest
// token; or, when chosen is not NULL (a greedy call) and the model picks greedy tokens itself,
// chosen[0 .. nout) (the most likely token, the lowest id on ties) and *picked = true.
typedef struct dsc__gen_backend {
    void *ctx;
    dsc_status (*next)(void *ctx, const dsc__gen_pass *p, float *logits, int32_t *chosen,
                       bool *picked);
} dsc__gen_backend;

// Checks the prompts and options against m and gives the positions per sequence a call needs
// (prompt + new tokens of the longest, capped by the context; max_positions when set).
dsc_status dsc__generate_positions(const dsc_gen_model *m, const dsc_gen_prompt *prompts, int n,
                                   const dsc_gen_opts *o, int *positions);
// The loop over be: sampling, stop conditions, outputs, stats (prefill_s, decode_s,
// new_tokens). positions from dsc__generate_positions; m gives the config, the tensor-parallel
// group (rank 0's choices are broadcast) and the trace.
dsc_status dsc__generate_loop(const dsc_gen_model *m, const dsc__gen_backend *be, int positions,
                              const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                              dsc_gen_output *out, dsc_gen_stats *stats);

#endif
