// cuda/kernels.h - GPU kernels that every model and the trainer share: softmax + cross-entropy
// over the vocabulary, column sums (bias gradients), sums, fp32 to 16-bit conversions, the fp16
// rounding of gradients, and the token sort of the embeddings' backward.
//
// Mixed precision as in bf16 or fp16 training: activations and their gradients are 16-bit (passed
// as raw uint16_t bit patterns, see dsc/half.h), statistics and parameter gradients fp32;
// arithmetic is fp32 inside every kernel. The plain entry points take bf16 tensors; each has a
// `_h` twin with a `fp16` argument (true: every 16-bit tensor of the call is IEEE fp16, false:
// bf16, the same as the plain one). fp16 results are rounded to nearest even and overflow to inf,
// never saturate, so that an overflow under a too-large loss scale reaches the fp32 gradients as
// inf/NaN, where the loss scaler sees it.
//
// Every pointer is device memory; `stream` is a cudaStream_t (hipStream_t in HIP builds), NULL for
// the default stream. Calls only enqueue work: they return DSC_ERR_INVALID_ARG for shapes the
// kernels do not take and DSC_ERR_CUDA when a launch fails. Every kernel is deterministic:
// parameter gradients are summed in a fixed order (fixed row chunks, then the chunks in order),
// never with floating-point atomics, so two runs give the same bits.
#ifndef DSC_CUDA_KERNELS_H
#define DSC_CUDA_KERNELS_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// Positions 0 .. N-1 of inp (N token ids in [0, V)) sorted by (token, position): the stable
// counting sort the embedding backward passes share (N < 2^31). *sorted (N) points into scratch,
// dsc__cuda_token_sort_scratch(N, V) bytes, valid until scratch is reused.
size_t dsc__cuda_token_sort_scratch(int64_t N, int V);
dsc_status dsc__cuda_token_sort(int **sorted, void *scratch, const int32_t *inp, int64_t N, int V,
                                void *stream);

// out (N, C) = emb[inp] (16-bit rows copied); inp (N) ids in [0, V) (not checked here).
dsc_status dsc__cuda_embed_forward_h(uint16_t *out, const int32_t *inp, const uint16_t *emb,
                                     int64_t N, int C, bool fp16, void *stream);

// The sum of the rows of dout (N, C) that hold token v, in position order (fp32), goes to row v
// of demb (V, C): add true adds it (+=); add false writes it (=) into the rows of the tokens that
// occur in inp and leaves every other row of demb untouched (not zeroed: the caller zeroes demb
// when it needs the rest to be 0). Deterministic without atomics: positions are sorted by token
// (dsc__cuda_token_sort), then one thread per (token, 8 channels) sums its run. N < 2^31.
// scratch: dsc__cuda_embed_backward_scratch(N, V) bytes.
size_t dsc__cuda_embed_backward_scratch(int64_t N, int V);
dsc_status dsc__cuda_embed_backward_h(float *demb, void *scratch, const uint16_t *dout,
                                      const int32_t *inp, int64_t N, int C, int V, bool add,
                                      bool fp16, void *stream);

// Rows of logits (N, ld) hold V live columns (ld >= V, ld % 8 == 0 lets rows move as vectors;
// the matrix products prefer a padded ld). losses (N) = logsumexp(row) - row[target]; lse (N).
// A negative target is ignored (a masked token): its loss and lse are 0, its gradient row 0.
dsc_status dsc__cuda_xent_forward(float *losses, float *lse, const uint16_t *logits,
                                  const int32_t *targets, int64_t N, int V, int ld, void *stream);
dsc_status dsc__cuda_xent_forward_h(float *losses, float *lse, const uint16_t *logits,
                                    const int32_t *targets, int64_t N, int V, int ld, bool fp16,
                                    void *stream);
// dlogits (N, ld) = g * (softmax(row) - onehot(target)), columns [V, ld) zeroed; may alias logits.
dsc_status dsc__cuda_xent_backward(uint16_t *dlogits, const uint16_t *logits, const float *lse,
                                   const int32_t *targets, float g, int64_t N, int V, int ld,
                                   void *stream);
dsc_status dsc__cuda_xent_backward_h(uint16_t *dlogits, const uint16_t *logits, const float *lse,
                                     const int32_t *targets, float g, int64_t N, int V, int ld,
                                     bool fp16, void *stream);
// Both in one pass over each row (training): losses (N) as the forward, then the row is
// overwritten by its gradient as the backward (one read of the logits fewer).
dsc_status dsc__cuda_xent_fused(float *losses, uint16_t *logits, const int32_t *targets, float g,
                                int64_t N, int V, int ld, void *stream);
dsc_status dsc__cuda_xent_fused_h(float *losses, uint16_t *logits, const int32_t *targets, float g,
                                  int64_t N, int V, int ld, bool fp16, void *stream);

// acc[i] += x[i] (add; else acc[i] = x[i]), then x[i] = 0, for i < n (fp32 on the device).
dsc_status dsc__cuda_add_f32_clear(float *acc, float *x, int64_t n, bool add, void *stream);

// acc (ncols) += column sums of d (rows, ncols) (bias gradients); the _h twin's add false
// overwrites acc instead. scratch: dsc__cuda_colsum_scratch(rows, ncols) floats.
size_t dsc__cuda_colsum_scratch(int64_t rows, int ncols);
dsc_status dsc__cuda_colsum(float *acc, float *scratch, const uint16_t *d, int64_t rows, int ncols,
                            void *stream);
dsc_status dsc__cuda_colsum_h(float *acc, float *scratch, const uint16_t *d, int64_t rows,
                              int ncols, bool add, bool fp16, void *stream);

// acc (ncols) += (add; else =) the sums over k in order of part (nchunks, ncols): the second half
// of a column sum whose first half another kernel made (the attention backward's bias_part).
dsc_status dsc__cuda_reduce_columns(float *acc, const float *part, int nchunks, int ncols, bool add,
                                    void *stream);
// The same into ndest (1 to 3) destinations in one launch: column c of part (nchunks,
// ndest * width) goes to dest[c / width][c % width] (a layernorm backward's dw, db and the column
// sums of its dinp).
dsc_status dsc__cuda_reduce_columns_split(float *const *dest, int ndest, int width,
                                          const float *part, int nchunks, bool add, void *stream);

// out[0] = scale * sum of x (n), one fixed order (e.g. the mean loss).
dsc_status dsc__cuda_sum(float *out, const float *x, int64_t n, float scale, void *stream);

// dst (n) = src rounded to bf16 (nearest even, as dsc_fp32_to_bf16); _16: to fp16 when fp16 is
// set (as dsc_fp32_to_fp16: overflow to inf), else to bf16.
dsc_status dsc__cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n, void *stream);
dsc_status dsc__cuda_f32_to_16(uint16_t *dst, const float *src, int64_t n, bool fp16, void *stream);

// x (n) = x rounded to fp16 values and back to fp32, in place: the engine's fp16 gradients
// (dsc_fp32_to_fp16, values beyond fp16's range become inf), so that the GPU's fp16 step sees
// exactly the overflows and the rounding the CPU engine does.
dsc_status dsc__cuda_round_fp16(float *x, int64_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
