// cuda/gpt2_kernels.h - GPU kernels of the GPT-2 layers other than attention and the matrix
// products: embeddings, layernorm, GELU, residual add, softmax + cross-entropy, column sums.
//
// Mixed precision as in bf16 or fp16 training: activations and their gradients are 16-bit (passed
// as raw uint16_t bit patterns, see dsc/half.h), statistics and parameter gradients fp32;
// arithmetic is fp32 inside every kernel. The plain entry points take bf16 tensors; each has a
// `_h` twin with a `fp16` argument (true: every 16-bit tensor of the call is IEEE fp16, false:
// bf16, the same as the plain one). fp16 results are rounded to nearest even and overflow to inf,
// never saturate, so that an overflow under a too-large loss scale reaches the fp32 gradients as
// inf/NaN, where the loss scaler sees it.
//
// The contracts mirror the CPU kernels of model/gpt2/kernels.h (which are the reference the tests
// compare against): backward kernels add (+=) into parameter gradients; layernorm's backward adds
// into the residual-stream gradient.
//
// Every pointer is device memory; `stream` is a cudaStream_t (hipStream_t in HIP builds), NULL for
// the default stream. Calls only enqueue work: they return DSC_ERR_INVALID_ARG for shapes the
// kernels do not take and DSC_ERR_CUDA when a launch fails. Every kernel is deterministic:
// parameter gradients are summed in a fixed order (fixed row chunks, then the chunks in order),
// never with floating-point atomics, so two runs give the same bits.
//
// Shapes: C (channels) must be a multiple of 8 and bf16 tensors 16-byte aligned (cudaMalloc's
// alignment and whole rows of C keep them so), because rows move as 16-byte vectors.
#ifndef DSC_CUDA_GPT2_KERNELS_H
#define DSC_CUDA_GPT2_KERNELS_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// out (B, T, C) = wte[inp] + wpe[t]; inp (B, T) token ids in [0, V) (not checked here).
dsc_status dsc__cuda_encoder_forward(uint16_t *out, const int32_t *inp, const uint16_t *wte,
                                     const uint16_t *wpe, int B, int T, int C, void *stream);
dsc_status dsc__cuda_encoder_forward_h(uint16_t *out, const int32_t *inp, const uint16_t *wte,
                                       const uint16_t *wpe, int B, int T, int C, bool fp16,
                                       void *stream);

// dwte (V, C) += rows of dout (B, T, C) scattered by token; dwpe (maxT, C) += the sum over b.
// Deterministic without atomics on floats: positions are sorted by token (a stable counting
// sort on the device), then each (token, channel group) is summed by one thread in position
// order. scratch: dsc__cuda_encoder_backward_scratch(B, T, V) bytes.
size_t dsc__cuda_encoder_backward_scratch(int B, int T, int V);
dsc_status dsc__cuda_encoder_backward(float *dwte, float *dwpe, void *scratch, const uint16_t *dout,
                                      const int32_t *inp, int B, int T, int C, int V, void *stream);
// The _h twin's wpe_add false overwrites dwpe (rows [0, T)) instead of adding (dwte is added to).
dsc_status dsc__cuda_encoder_backward_h(float *dwte, float *dwpe, void *scratch,
                                        const uint16_t *dout, const int32_t *inp, int B, int T,
                                        int C, int V, bool wpe_add, bool fp16, void *stream);

// Positions 0 .. N-1 of inp (N token ids in [0, V)) sorted by (token, position): the stable
// counting sort the embedding backward passes share (N < 2^31). *sorted (N) points into scratch,
// dsc__cuda_token_sort_scratch(N, V) bytes, valid until scratch is reused.
size_t dsc__cuda_token_sort_scratch(int64_t N, int V);
dsc_status dsc__cuda_token_sort(int **sorted, void *scratch, const int32_t *inp, int64_t N, int V,
                                void *stream);

// out (N, C) = (inp - mean) * rstd * w + b with eps 1e-5; mean, rstd (N) fp32 kept for backward.
dsc_status dsc__cuda_layernorm_forward(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                                       const uint16_t *w, const uint16_t *b, int64_t N, int C,
                                       void *stream);
dsc_status dsc__cuda_layernorm_forward_h(uint16_t *out, float *mean, float *rstd,
                                         const uint16_t *inp, const uint16_t *w, const uint16_t *b,
                                         int64_t N, int C, bool fp16, void *stream);

// dinp (N, C) += the gradient through the layernorm (it sits on the residual stream);
// dw, db (C) +=; dsum (C; NULL: none) += the column sums of the resulting dinp (as stored, 16-bit:
// the bias gradient of the product that reads it next). The _h twin's add false overwrites dw,
// db and dsum instead (=). scratch: dsc__cuda_layernorm_backward_scratch(N, C) floats.
size_t dsc__cuda_layernorm_backward_scratch(int64_t N, int C);
dsc_status dsc__cuda_layernorm_backward(uint16_t *dinp, float *dw, float *db, float *scratch,
                                        const uint16_t *dout, const uint16_t *inp,
                                        const uint16_t *w, const float *mean, const float *rstd,
                                        int64_t N, int C, void *stream);
dsc_status dsc__cuda_layernorm_backward_h(uint16_t *dinp, float *dw, float *db, float *scratch,
                                          const uint16_t *dout, const uint16_t *inp,
                                          const uint16_t *w, const float *mean, const float *rstd,
                                          float *dsum, bool add, int64_t N, int C, bool fp16,
                                          void *stream);

// out (n) = GELU(inp), GPT-2's tanh approximation; dinp (n) = dout * GELU'(inp), dinp may alias
// dout. Any n; 16-byte aligned pointers with n % 8 == 0 take the vector path.
dsc_status dsc__cuda_gelu_forward(uint16_t *out, const uint16_t *inp, int64_t n, void *stream);
dsc_status dsc__cuda_gelu_backward(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                   int64_t n, void *stream);
dsc_status dsc__cuda_gelu_forward_h(uint16_t *out, const uint16_t *inp, int64_t n, bool fp16,
                                    void *stream);
dsc_status dsc__cuda_gelu_backward_h(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                     int64_t n, bool fp16, void *stream);

// out (n) = a + b (out may alias a or b).
dsc_status dsc__cuda_residual_forward(uint16_t *out, const uint16_t *a, const uint16_t *b,
                                      int64_t n, void *stream);
dsc_status dsc__cuda_residual_forward_h(uint16_t *out, const uint16_t *a, const uint16_t *b,
                                        int64_t n, bool fp16, void *stream);

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
