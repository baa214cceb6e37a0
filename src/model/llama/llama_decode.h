// model/llama/llama_decode.h - Llama-family generation on one GPU (Llama 3, SmolLM2, Qwen2): a
// prompt pass (prefill) that fills a grouped-query key/value cache, then one token per sequence per
// step (decode), in bf16 with fp32 logits; the family's decoder behind the model interface (struct
// dsc_model_decode_ops, dsc/model.h), which the family's device passes (model/llama/llama_cuda.cu)
// point to.
//
// The model is the one of model/llama/llama.h with the same parameter table, handed in as device
// bf16 copies, params[i] = tensor i (borrowed for each call).
//
// Cache: per layer, keys (after rotation) then values, each (batch, max_len, n_kv_head * head_dim)
// bf16 - n_layer x 2 x batch x max_len x n_kv_head x head_dim in all, the CPU cache's layout
// (model/llama/infer.h) in 16 bits: the n_head / n_kv_head query heads of a group share one kv
// head.
//
// A pass is a set of rows, each one token of one sequence at one position, as the CPU's
// dsc_model_infer takes them: a prefill is every position of every prompt, a step one row per
// sequence. The layers run on all rows of the pass at once (RMSNorm, the q/k/v products with
// Qwen2's biases, rotary embeddings at each row's own position, the o product, SwiGLU), every
// row's rotated key and value go into the cache at (sequence, position), and then each row
// attends over positions 0 .. pos of its own sequence (one block per (row, query head), reading
// kv head h / (n_head / n_kv_head); fp32 scores and softmax). The final norm and the head run on
// each sequence's last row only; its logits are fp32 and its argmax the lowest id on ties.
//
// Limits: head_dim 64 or 128, hidden and intermediate sizes multiples of 8. No CUDA graphs
// (opts.no_graph is accepted and changes nothing). Recompute mode (opts.recompute): the decoder
// keeps every row's tokens on the host and each prefill or step runs the rows of the sequences'
// whole prefixes again, rewriting every cache position they use: nothing of an earlier pass is
// read, which is the reference the cache is compared against.
#ifndef DSC_MODEL_LLAMA_LLAMA_DECODE_H
#define DSC_MODEL_LLAMA_LLAMA_DECODE_H

#include <stddef.h> // size_t
#include <stdint.h> // int32_t, uint16_t

#include "dsc/model.h"  // dsc_model_decode_opts, struct dsc_model_decode_ops
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#include "model/llama/llama.h" // dsc_llama_config

typedef struct dsc_llama_decode dsc_llama_decode;

// Bytes of the key/value cache: n_layer x 2 x batch x max_len x n_kv_head x head_dim bf16.
size_t dsc_llama_decode_kv_bytes(const dsc_llama_config *c, int batch, int max_len);

// The cache and the fixed buffers on the current device (the rows' buffers come at the first
// pass and grow with the largest). DSC_ERR_INVALID_ARG naming the limit a model or size breaks.
// Caller owns *out.
dsc_status dsc_llama_decode_create(dsc_llama_decode **out, const dsc_llama_config *c,
                                   const dsc_model_decode_opts *o);
void dsc_llama_decode_destroy(dsc_llama_decode *d); // NULL ok; waits for the stream first

// The calls of struct dsc_model_decode_ops (dsc/model.h says what each does).
dsc_status dsc_llama_decode_prefill(dsc_llama_decode *d, const uint16_t *const *params,
                                    const int32_t *const *tokens, const int *lens, int n);
dsc_status dsc_llama_decode_step(dsc_llama_decode *d, const uint16_t *const *params,
                                 const int32_t *tokens, const int32_t *pos, int n);
dsc_status dsc_llama_decode_argmax(dsc_llama_decode *d, int32_t *tokens);
dsc_status dsc_llama_decode_logits(dsc_llama_decode *d, float *logits);

// The table model/llama/ops.c's device passes point to.
extern const struct dsc_model_decode_ops dsc__llama_decode_ops;

#ifdef __cplusplus
}
#endif
#endif
