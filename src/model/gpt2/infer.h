// model/gpt2/infer.h - GPT-2 inference with a key/value cache: incremental decoding of ragged
// batches, optionally tensor-parallel across ranks.
//
// A call processes a list of rows, each one token of one sequence at one position. Keys and
// values of every layer are written into the cache at (sequence, position), so that the next call
// only processes the new tokens: a prompt is one call with all its rows (prefill), each generated
// token one more row. A row attends to the cached positions 0..pos of its own sequence, which must
// have been written before (by an earlier call, or by an earlier row of the same call: every row's
// keys and values are stored before any row attends). Sequences of different lengths share calls.
//
// Tensor parallelism (tp.size > 1): each rank computes n_head / size of the attention heads and
// 4 n_embd / size of the MLP columns, from its own slice of the weights (the "local layout", made
// by dsc__gpt2_tp_slice); the two output projections are partial sums that an all-reduce adds.
// Embeddings, layernorms and the tied output head stay whole on every rank.
#ifndef DSC_MODEL_GPT2_INFER_H
#define DSC_MODEL_GPT2_INFER_H

#include <stddef.h> // size_t
#include <stdint.h> // int32_t

#include "dsc/comm.h"        // dsc_comm
#include "dsc/memory.h"      // dsc_mem_handle
#include "model/gpt2/gpt2.h" // dsc_gpt2_config, dsc_gpt2_hooks

typedef dsc_model_tp dsc_gpt2_tp; // {rank, size, comm}: size 1 is no tensor parallelism

// Valid when n_head and 4 n_embd split evenly over size ranks; otherwise DSC_ERR_INVALID_ARG
// naming the model and the sizes that would work.
dsc_status dsc__gpt2_tp_check(const dsc_gpt2_config *c, int size);

// Elements of tensor i in the local layout of rank `rank` of `size` (its slice, or the whole
// tensor for those that stay whole).
int64_t dsc__gpt2_tp_numel(const dsc_gpt2_config *c, int i, int size);
// Copy rank's slice of tensor i from full (the whole tensor) into dst (tp_numel elements).
void dsc__gpt2_tp_slice(const dsc_gpt2_config *c, int i, int rank, int size, const float *full,
                        float *dst);

typedef struct dsc_gpt2_kv dsc_gpt2_kv;

// A cache for nseq sequences of up to max_len positions each (max_len <= max_seq_len), for the
// local heads of a group of tp_size ranks. Its keys and values come from dsc's default host pool
// (tag "infer.kv_cache": dsc_memory_stats shows them) and take exactly dsc__gpt2_kv_bytes; the
// rows' activations are separate scratch that grows with the largest call.
dsc_status dsc__gpt2_kv_create(dsc_gpt2_kv **out, const dsc_gpt2_config *c, int tp_size,
                               int nseq, int max_len);
void dsc__gpt2_kv_destroy(dsc_gpt2_kv *kv); // NULL ok
size_t dsc__gpt2_kv_bytes(const dsc_gpt2_config *c, int tp_size, int nseq, int max_len);
// True when kv serves this model, group size and at least nseq x max_len.
int dsc__gpt2_kv_fits(const dsc_gpt2_kv *kv, const dsc_gpt2_config *c, int tp_size, int nseq,
                      int max_len);

typedef dsc_model_rows dsc_gpt2_rows; // {n, seq, pos, tokens, nout, out}

// Run the rows through the model: params[i] is tensor i in the local layout (borrowed; with a
// gather hook the hook fills group g's entries, as in dsc_gpt2_forward). logits (nout, V) receive
// the output of rows out[0..nout). Every rank of a tensor-parallel group calls it with the same
// rows.
dsc_status dsc__gpt2_infer(dsc_gpt2_kv *kv, float *const *params, const dsc_gpt2_tp *tp,
                           const dsc_gpt2_rows *rows, const dsc_gpt2_hooks *hooks, float *logits);

#endif
