// model/llama/infer.h - Llama inference rows through a key/value cache (the model interface's
// kv_* and infer slots; see dsc_model_infer in dsc/model.h for the contract).
//
// The cache holds, per layer, the keys (after rotation) and values of every (sequence, position)
// for the n_kv_head heads only: grouped-query attention shares them between the n_head / n_kv_head
// query heads of a group, so a cache is n_layer x 2 x nseq x max_len x n_kv_head x head_dim
// floats. Each row is rotated at its own position (the rotary tables of the training forward, up
// to max_len positions) and attends causally over positions 0 .. pos of its sequence.
//
// Tensor parallelism: the P ranks of a group split the query heads, the kv heads (n_kv_head must
// divide by P) and the MLP rows; each rank caches its own kv heads.
#ifndef DSC_MODEL_LLAMA_INFER_H
#define DSC_MODEL_LLAMA_INFER_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/model.h"         // dsc_model_rows, dsc_model_hooks, dsc_model_tp
#include "model/llama/llama.h" // dsc_llama_config

typedef struct dsc_llama_kv dsc_llama_kv;

// DSC_OK when size divides the kv heads and the MLP rows; DSC_ERR_INVALID_ARG otherwise.
dsc_status dsc__llama_tp_check(const dsc_llama_config *c, int size);
// Elements of tensor i on each rank of a group of size; rank's slice of the whole tensor.
int64_t dsc__llama_tp_numel(const dsc_llama_config *c, int i, int size);
void dsc__llama_tp_slice(const dsc_llama_config *c, int i, int rank, int size, const float *full,
                         float *dst);

size_t dsc__llama_kv_bytes(const dsc_llama_config *c, int tp_size, int nseq, int max_len);
dsc_status dsc__llama_kv_create(dsc_llama_kv **out, const dsc_llama_config *c, int tp_size,
                                int nseq, int max_len);
void dsc__llama_kv_destroy(dsc_llama_kv *kv); // NULL ok
bool dsc__llama_kv_fits(const dsc_llama_kv *kv, const dsc_llama_config *c, int tp_size, int nseq,
                        int max_len);

// params: every tensor in the local layout of tp (tp NULL: one rank); logits (rows->nout,
// vocab_size), the same on every rank of the group.
dsc_status dsc__llama_infer(dsc_llama_kv *kv, float *const *params, const dsc_model_tp *tp,
                            const dsc_model_rows *rows, const dsc_model_hooks *hooks,
                            float *logits);

#endif
