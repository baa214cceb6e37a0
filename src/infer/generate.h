// infer/generate.h - the generation loop over a model (dsc/model.h) whose weights the caller
// provides: the engine's (hybrid.c) or a file's (`dsc generate`).
#ifndef DSC_INFER_GENERATE_H
#define DSC_INFER_GENERATE_H

#include <stdio.h> // FILE

#include "dsc/generate.h" // dsc_gen_*
#include "dsc/model.h"    // dsc_model, dsc_model_kv, dsc_model_tp, dsc_model_hooks

typedef struct dsc__gen_model {
    const dsc_model *model;       // the model's shape and passes (borrowed)
    float *const *params;         // every tensor in the local layout of tp (borrowed)
    const dsc_model_hooks *hooks; // NULL: params stay valid for the whole call
    dsc_model_tp tp;              // size 1: none
    int max_positions;           // positions per sequence the cache may hold; 0: the context
    FILE *trace; // NULL, or one JSON line per sequence and token: the choice and the two most
                 // likely tokens with their logits (greedy then reads the logits on the host)
} dsc__gen_model;

// Generate from n prompts into out[0..n) (see dsc_generate for the options). *kv is reused when
// it fits and replaced otherwise; the caller owns it (dsc_model_kv_destroy). Every rank of a
// tensor-parallel group passes the same prompts and gets the same outputs. stats may be NULL.
dsc_status dsc__generate_run(const dsc__gen_model *m, dsc_model_kv **kv,
                             const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                             dsc_gen_output *out, dsc_gen_stats *stats);

// The same on the current CUDA device (infer/generate_cuda.c): m->params are whole fp32 host
// tensors (no tensor parallelism, no hooks), copied to the device as bf16 for the call; the
// key/value cache (bf16) and everything else lives on the device for the call only. Greedy
// choices are made on the device; sampling copies each step's logits (fp32) to the host and runs
// dsc__sample there, so a seed gives the CPU path's choices for the same logits. o->no_cache
// recomputes every sequence with the training forward (the family's CUDA model) for each token. One
// prompt pass and two steps run before the timed loop (a warm-up: the products' algorithm choices
// and the step's graph capture), reported as stats->warmup_s. DSC_ERR_UNSUPPORTED, naming what is
// missing, in a build without the CUDA kernels or without a usable device.
dsc_status dsc__generate_run_cuda(const dsc__gen_model *m, const dsc_gen_prompt *prompts, int n,
                                  const dsc_gen_opts *o, dsc_gen_output *out,
                                  dsc_gen_stats *stats);
// Whether generation on the GPU can run here: OK with the device's name in name[0 .. cap), or
// the error dsc__generate_run_cuda would give.
dsc_status dsc__generate_cuda_check(char *name, size_t cap);

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
dsc_status dsc__generate_positions(const dsc__gen_model *m, const dsc_gen_prompt *prompts, int n,
                                   const dsc_gen_opts *o, int *positions);
// The loop over be: sampling, stop conditions, outputs, stats (prefill_s, decode_s,
// new_tokens). positions from dsc__generate_positions; m gives the config, the tensor-parallel
// group (rank 0's choices are broadcast) and the trace.
dsc_status dsc__generate_loop(const dsc__gen_model *m, const dsc__gen_backend *be, int positions,
                              const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                              dsc_gen_output *out, dsc_gen_stats *stats);

#endif
