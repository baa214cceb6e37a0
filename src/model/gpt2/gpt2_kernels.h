// model/gpt2/gpt2_kernels.h - GPU kernels of the GPT-2 layers other than attention and the matrix
// products: embeddings, layernorm, GELU, residual add. The kernels every model shares (softmax +
// cross-entropy, column sums, conversions, the token sort) are in cuda/kernels.h.
//
// The conventions of cuda/kernels.h: 16-bit tensors are raw uint16_t bit patterns, fp32
// statistics and parameter gradients, fp32 arithmetic; the plain entry points take bf16 tensors
// and each has a `_h` twin with a `fp16` argument; device pointers, an explicit stream, calls that
// only enqueue, deterministic parameter gradients.
//
// The contracts mirror the CPU kernels of model/gpt2/kernels.h (which are the reference the tests
// compare against): backward kernels add (+=) into parameter gradients; layernorm's backward adds
// into the residual-stream gradient.
//
// Shapes: C (channels) must be a multiple of 8 and bf16 tensors 16-byte aligned (cudaMalloc's
// alignment and whole rows of C keep them so), because rows move as 16-byte vectors.
#ifndef DSC_MODEL_GPT2_GPT2_KERNELS_H
#define DSC_MODEL_GPT2_GPT2_KERNELS_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// out (B, T, C) = wte[inp] + wpe[position]; inp (B, T) token ids in [0, V), pos (B, T) position
// ids in [0, max_seq_len) (not checked here), or NULL: t, the position in the row. The _h form
// takes the 16-bit type (fp16 or bf16); the plain one is bf16 with row positions.
dsc_status dsc__cuda_encoder_forward(uint16_t *out, const int32_t *inp, const uint16_t *wte,
                                     const uint16_t *wpe, int B, int T, int C, void *stream);
dsc_status dsc__cuda_encoder_forward_h(uint16_t *out, const int32_t *inp, const int32_t *pos,
                                       const uint16_t *wte, const uint16_t *wpe, int B, int T,
                                       int C, bool fp16, void *stream);

// dwte (V, C) += rows of dout (B, T, C) scattered by token (dsc__cuda_embed_backward_h, add).
// dwpe: with pos NULL, row t += the sum over b of dout[b, t], b in order (wpe_add false: rows
// [0, T) are written instead, the rest left as they are); with position ids pos (B, T) in
// [0, npos), scattered by id the same way as the tokens (wpe_add false: rows [0, npos) zeroed
// first). Deterministic without atomics on floats. scratch: dsc__cuda_embed_backward_scratch(B * T,
// max(V, npos)) bytes.
dsc_status dsc__cuda_encoder_backward_h(float *dwte, float *dwpe, void *scratch,
                                        const uint16_t *dout, const int32_t *inp,
                                        const int32_t *pos, int npos, int B, int T, int C, int V,
                                        bool wpe_add, bool fp16, void *stream);

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
dsc_status dsc__cuda_gelu_forward_h(uint16_t *out, const uint16_t *inp, int64_t n, bool fp16,
                                    void *stream);
dsc_status dsc__cuda_gelu_backward_h(uint16_t *dinp, const uint16_t *dout, const uint16_t *inp,
                                     int64_t n, bool fp16, void *stream);

// out (n) = a + b (out may alias a or b).
dsc_status dsc__cuda_residual_forward_h(uint16_t *out, const uint16_t *a, const uint16_t *b,
                                        int64_t n, bool fp16, void *stream);

#ifdef __cplusplus
}
#endif
#endif
