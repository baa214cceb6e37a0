// model/llama/infer.h - Llama inference rows through a key/value cache (the model interface's
// kv_* and infer slots; see dsc_model_infer in dsc/model.h for the contract).
//
// The cache holds, per layer, the keys (after rotation) and values of every (sequence, position)
// for the n_kv_head heads only: grouped-query attention shares them between the n_head / n_kv_head
// query heads of a group, so a cache is n_layer x 2 x nseq x max_len x n_kv_head x head_dim
// floats. Each row is rotated at its own position (the rotary tables of the training forward, up
// to max_len positions) and attends causally over positions 0 .. pos of its sequence.
//
// Tensor parallelism: a group of one rank only (the split by heads is not implemented yet).
#ifndef DSC_MODEL_LLAMA_INFER_H
#define DSC_MODEL_LLAMA_INFER_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/model.h"         // dsc_model_rows, dsc_model_hooks, dsc_model_tp
#include "model/llama/llama.h" // dsc_llama_config

typedef struct dsc_llama_kv dsc_llama_kv;

// DSC_OK for size 1; DSC_ERR_INVALID_ARG otherwise, saying so.
dsc_status dsc__llama_tp_check(const dsc_llama_config *c, int size);

size_t dsc__llama_kv_bytes(const dsc_llama_config *c, int nseq, int max_len);
dsc_status dsc__llama_kv_create(dsc_llama_kv **out, const dsc_llama_config *c, int tp_size,
                                int nseq, int max_len);
void dsc__llama_kv_destroy(dsc_llama_kv *kv); // NULL ok
bool dsc__llama_kv_fits(const dsc_llama_kv *kv, const dsc_llama_config *c, int tp_size, int nseq,
                        int max_len);

// params: every tensor of the model (whole); logits (rows->nout, vocab_size).
dsc_status dsc__llama_infer(dsc_llama_kv *kv, float *const *params, const dsc_model_tp *tp,
                            const dsc_model_rows *rows, const dsc_model_hooks *hooks,
                            float *logits);

#endif
