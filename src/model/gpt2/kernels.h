// model/gpt2/kernels.h - CPU kernels of the GPT-2 layers: forward and backward of each, fused
// where a fused pass saves memory traffic (the weight products go through the families' one
// linear, model/linear.h). fp32, OpenMP threads, OpenBLAS for products.
//
// Every kernel is deterministic and independent of the thread count: work is cut into tasks that
// depend only on the shapes, each output element is produced by one fixed sequence of operations,
// and sums over rows run either down whole columns in row order or through partial sums of fixed
// row chunks added in chunk order. Backward kernels add (+=) into parameter gradients and
// overwrite (=) activation gradients unless they say otherwise.
#ifndef DSC_MODEL_GPT2_KERNELS_H
#define DSC_MODEL_GPT2_KERNELS_H

#include <stddef.h> // size_t
#include <stdint.h> // int32_t, int64_t

// out (N, C) = (inp - mean) * rstd * w + b, eps 1e-5; mean, rstd (N) kept for backward.
void dsc__gpt2_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int64_t N, int C);
// The forward's out again from its mean and rstd (bitwise the same), for backward.
void dsc__gpt2_layernorm_apply(float *out, const float *inp, const float *mean, const float *rstd,
                               const float *w, const float *b, int64_t N, int C);
// dinp (N, C) += gradient through the layernorm (it sits on the residual stream); dw, db (C) +=.
// scratch: dsc__gpt2_layernorm_scratch(N, C) floats.
void dsc__gpt2_layernorm_backward(float *dinp, float *dw, float *db, float *scratch,
                                  const float *dout, const float *inp, const float *w,
                                  const float *mean, const float *rstd, int64_t N, int C);
size_t dsc__gpt2_layernorm_scratch(int64_t N, int C);

// out (n) = GELU of inp with GPT-2's tanh approximation.
void dsc__gpt2_gelu_forward(float *out, const float *inp, int64_t n);
// dinp (n) = dout * GELU'(inp); dinp may alias dout.
void dsc__gpt2_gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n);

// Causal self-attention. qkv (B, T, 3C) holds q, k, v of NH heads of C / NH channels each;
// out (B, T, C); stats (B, NH, T, 2) keeps each softmax row's max and 1 / sum for backward,
// which recomputes the probabilities rather than storing B NH T T of them.
// scratch: dsc__gpt2_attention_scratch(T, slots) floats; slots bounds the threads used.
void dsc__gpt2_attention_forward(float *out, float *stats, const float *qkv, float *scratch,
                                 int slots, int B, int T, int C, int NH);
// dqkv (B, T, 3C) = gradient of qkv given dout (B, T, C) (overwritten).
void dsc__gpt2_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                  const float *stats, float *scratch, int slots, int B, int T,
                                  int C, int NH);
size_t dsc__gpt2_attention_scratch(int T, int slots);

// out (B, T, C) = wte[inputs] + wpe[pos]; pos (B, T) position ids, or NULL for t.
void dsc__gpt2_encoder_forward(float *out, const int32_t *inputs, const int32_t *pos,
                               const float *wte, const float *wpe, int B, int T, int C);
// dwte (V, C) += and dwpe (maxT, C) += the scattered rows of dout (B, T, C). With pos NULL or
// pos = t the results are bitwise the same.
void dsc__gpt2_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                const int32_t *inputs, const int32_t *pos, int B, int T, int C);

#endif
