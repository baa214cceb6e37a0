// model/gpt2/gpt2_decode.h - GPT-2 generation on one GPU: a prompt pass (prefill) that fills a
// key/value cache, then one token per sequence per step (decode), in bf16.
//
// The model is the one of model/gpt2/gpt2.h and model/gpt2/gpt2_cuda.h: the same parameter table
// (dsc_gpt2_tensor_info_get), handed in as device bf16 copies, params[i] = tensor i (borrowed for
// each call). Head size must be 64 (every GPT-2 size and dN has it).
//
// Sequences are the rows 0 .. n-1 of the decoder (n <= batch). Each row has its own length:
// the prefill takes every row's prompt (any lengths; the rows are right-padded to the longest, and
// since attention is causal a padded position never influences a real one), writes the keys and
// values of positions 0 .. len-1 into the cache and gives the logits of each row's last position.
// A step takes one token per row at its own position pos[b]: its key and value are written at
// (b, pos[b]) and the row attends to positions 0 .. pos[b] of the cache (which the prefill and the
// earlier steps wrote; positions past pos[b] are never read, so a padded prefill's junk there is
// harmless). A row whose sequence has ended may go on being fed (its last token at its last
// position): rows are independent, so this changes nothing for the others.
//
// Numerics: bf16 weights and activations, fp32 accumulation, layernorm statistics and attention
// softmax; the logits are fp32 (the lm-head product writes them in fp32). Products go through
// cuda/matmul.h (cuBLASLt), layernorm and the prompt pass's attention through the training
// kernels (model/gpt2/gpt2_kernels.h, cuda/attention.h); a step's attention is this file's kernel
// (one block per (row, head) over the cached positions).
//
// Host synchronisation: prefill and step only enqueue work on the decoder's stream; reading the
// result (dsc_gpt2_decode_argmax or dsc_gpt2_decode_logits) waits once. A step's kernels are
// captured into a CUDA graph at the second step of a given row count and weights, and replayed
// after that (opts.no_graph turns this off; DSC_GEN_GRAPH=0 in the environment too).
//
// Recompute mode (opts.recompute): no cache. The decoder keeps every row's tokens on the host and
// each prefill/step runs the training forward (model/gpt2/gpt2_cuda.h) over the rows' whole
// sequences, taking the logits of position pos[b]: the reference the cache is compared against,
// slow.
#ifndef DSC_MODEL_GPT2_GPT2_DECODE_H
#define DSC_MODEL_GPT2_GPT2_DECODE_H

#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, uint16_t

#include "dsc/memory.h" // dsc_mem_pool
#include "dsc/model.h"  // dsc_model_decode_opts, struct dsc_model_decode_ops
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#include "model/gpt2/gpt2.h" // dsc_gpt2_config

typedef struct dsc_gpt2_decode dsc_gpt2_decode;

// The model interface's decoder options (dsc/model.h): batch, max_len, recompute (no cache: the
// training forward over whole sequences every step), no_graph (launch a step's kernels one by one
// instead of replaying a graph), stream, pool (tags "gpu.kv_cache", "gpu.decode", "gpu.prefill",
// "gpu.matmul_workspace"; it must never move blocks, cuda/devbuf.h).
typedef dsc_model_decode_opts dsc_gpt2_decode_opts;

// Bytes of the key/value cache for these sizes: n_layer x 2 x batch x max_len x n_embd bf16.
size_t dsc_gpt2_decode_kv_bytes(const dsc_gpt2_config *c, int batch, int max_len);

// Allocates the cache and a step's buffers on the current device (the prefill's buffers come at
// the first prefill and are kept, grown when a longer prompt batch comes). Caller owns *out.
dsc_status dsc_gpt2_decode_create(dsc_gpt2_decode **out, const dsc_gpt2_config *c,
                                  const dsc_gpt2_decode_opts *o);
void dsc_gpt2_decode_destroy(dsc_gpt2_decode *d); // NULL ok; waits for the stream first

// The prompts of rows 0 .. n-1: tokens[b] (HOST, lens[b] ids in [0, vocab_size), 1 <= lens[b] <=
// max_len), copied. Afterwards the cache holds positions 0 .. lens[b]-1 of row b and the result
// is the logits of position lens[b]-1.
dsc_status dsc_gpt2_decode_prefill(dsc_gpt2_decode *d, const uint16_t *const *params,
                                   const int32_t *const *tokens, const int *lens, int n);

// One token per row b < n: tokens[b] at position pos[b] (HOST arrays, copied; 0 <= pos[b] <
// max_len; the positions before it must have been filled by the prefill or earlier steps). The
// result is the logits of that position.
dsc_status dsc_gpt2_decode_step(dsc_gpt2_decode *d, const uint16_t *const *params,
                                const int32_t *tokens, const int32_t *pos, int n);

// The last prefill's or step's result for its n rows, waiting for the stream: the most likely
// token of each row (the lowest id on ties, as dsc__sample's greedy choice on the same logits),
// or the logits themselves, (n, vocab_size) fp32 row-major.
dsc_status dsc_gpt2_decode_argmax(dsc_gpt2_decode *d, int32_t *tokens);
dsc_status dsc_gpt2_decode_logits(dsc_gpt2_decode *d, float *logits);

// Device bf16 copies of a whole model: every tensor of the table (host fp32, rounded to nearest
// even as dsc_fp32_to_bf16) in one device block (tag "gpu.bf16_weights" of pool, or cudaMalloc),
// each tensor on a 256-byte boundary. The copy waits for the transfers.
typedef struct dsc_gpt2_decode_weights dsc_gpt2_decode_weights;
dsc_status dsc_gpt2_decode_weights_upload(dsc_gpt2_decode_weights **out, const dsc_gpt2_config *c,
                                          const float *const *host, dsc_mem_pool *pool);
// params[i] = device bf16 tensor i, as prefill and step take them; borrowed from w.
const uint16_t *const *dsc_gpt2_decode_weights_params(const dsc_gpt2_decode_weights *w);
void dsc_gpt2_decode_weights_destroy(dsc_gpt2_decode_weights *w); // NULL ok

// Steps so far that replayed a captured graph (0 with no_graph or in recompute mode).
long dsc_gpt2_decode_graph_replays(const dsc_gpt2_decode *d);

// The decoder behind the model interface (struct dsc_model_decode_ops, dsc/model.h): the calls
// above, which the family's device passes (model/gpt2/gpt2_cuda.cu) point to.
extern const struct dsc_model_decode_ops dsc__gpt2_decode_ops;

#ifdef __cplusplus
}
#endif
#endif
