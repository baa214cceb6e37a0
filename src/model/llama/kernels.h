// model/llama/kernels.h - CPU kernels of the Llama layers: RMSNorm, rotary embeddings, SwiGLU,
// grouped-query causal attention and cross-entropy with ignored positions (the weight products go
// through the families' one linear, model/linear.h). fp32, OpenMP threads, OpenBLAS for products (through
// dsc__model_sgemm, whose fixed splits they share).
//
// Deterministic for any thread count: tasks depend only on shapes, sums over rows run in fixed
// chunks added in chunk order. Backward kernels add (+=) into parameter
// gradients and overwrite (=) activation gradients unless they say otherwise.
#ifndef DSC_MODEL_LLAMA_KERNELS_H
#define DSC_MODEL_LLAMA_KERNELS_H

#include <stddef.h> // size_t
#include <stdint.h> // int32_t, int64_t

// out (N, C) = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), kept (N) for backward.
void dsc__llama_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
                                float eps, int64_t N, int C);
// The forward's out again from rstd (bitwise the same), for backward.
void dsc__llama_rmsnorm_apply(float *out, const float *inp, const float *rstd, const float *w,
                              int64_t N, int C);
// dinp (N, C) += gradient through the norm (it sits on the residual stream); dw (C) += (NULL:
// frozen, not computed).
// scratch: dsc__llama_rmsnorm_scratch(N, C) floats.
void dsc__llama_rmsnorm_backward(float *dinp, float *dw, float *scratch, const float *dout,
                                 const float *inp, const float *w, const float *rstd, int64_t N,
                                 int C);
size_t dsc__llama_rmsnorm_scratch(int64_t N, int C);

// Qwen3's per-head RMSNorm of q and k, in place on the first (nq + nk) hd floats of each of the
// N rows of x (row stride ld): heads 0 .. nq-1 are scaled by wq (hd), heads nq .. nq+nk-1 by wk.
// The inputs are kept in raw (N, (nq + nk) hd) dense and each head's rstd in rstd (N, nq + nk)
// for backward; raw may be NULL (inference).
void dsc__llama_head_norm_forward(float *x, int ld, float *raw, float *rstd, const float *wq,
                                  const float *wk, float eps, int64_t N, int nq, int nk, int hd);
// In place on dx (the same layout as x): the gradient of the norms' outputs becomes that of
// their inputs; dwq, dwk (hd) +=. scratch: dsc__llama_head_norm_scratch(N, hd) floats.
void dsc__llama_head_norm_backward(float *dx, int ld, float *dwq, float *dwk, float *scratch,
                                   const float *raw, const float *rstd, const float *wq,
                                   const float *wk, int64_t N, int nq, int nk, int hd);
size_t dsc__llama_head_norm_scratch(int64_t N, int hd);

// Rotary tables: cos, sin (maxT, hd / 2) for positions 0 .. maxT-1, in fp32 as Hugging Face
// computes them: inv_freq[i] = 1 / theta^(2i / hd) in fp32 (then scaled per the rope_scaling
// type: linear divides by factor, llama3 as _compute_llama3_parameters), angle = pos * inv_freq
// rounded to fp32, then cos and sin of that angle.
void dsc__llama_rope_tables(float *cos_t, float *sin_t, int maxT, int hd, double theta,
                            int scaling, double factor, double low_freq, double high_freq,
                            int original_max_pos);
// In place on x (B, T, nh heads of hd) with row stride ld: pairs (i, i + hd/2) of each head are
// rotated by the position's angle (rotate_half). inverse = 1 rotates back, which is the
// backward (the transpose of a rotation is its inverse).
void dsc__llama_rope(float *x, int ld, const float *cos_t, const float *sin_t, int B, int T,
                     int nh, int hd, int inverse);
// The same with position ids pos (B * T entries, each < the tables' maxT) choosing each row's
// angle; pos NULL is dsc__llama_rope (position t of each sequence).
void dsc__llama_rope_pos(float *x, int ld, const float *cos_t, const float *sin_t,
                         const int32_t *pos, int B, int T, int nh, int hd, int inverse);

// h (n) = silu(gate) * up.
void dsc__llama_swiglu_forward(float *h, const float *gate, const float *up, int64_t n);
// dgate (n) = dh * up * silu'(gate), dup (n) = dh * silu(gate); dgate may alias dh.
void dsc__llama_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                                const float *up, int64_t n);

// Causal grouped-query attention. qkv (B, T, ld) rows hold q (NH heads of hd), then k and v
// (NKV heads each); query head h reads kv head h / (NH / NKV). out (B, T, NH hd); stats
// (B, NH, T, 2) keeps each softmax row's max and 1 / sum for backward. Softmax in fp32 with
// the max subtracted; scale 1 / sqrt(hd). scratch: dsc__llama_attention_scratch(T, slots).
void dsc__llama_attention_forward(float *out, float *stats, const float *qkv, float *scratch,
                                  int slots, int B, int T, int NH, int NKV, int hd);
// dqkv (B, T, ld) = gradient of qkv given dout (B, T, NH hd) (overwritten). Each task is one
// (batch, kv head) and visits its query heads in order, so K and V gradients shared by a group
// add up in a fixed order.
void dsc__llama_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                   const float *stats, float *scratch, int slots, int B, int T,
                                   int NH, int NKV, int hd);
size_t dsc__llama_attention_scratch(int T, int slots);

// out (N, C) = emb[inputs].
void dsc__llama_embed_forward(float *out, const int32_t *inputs, const float *emb, int64_t N,
                              int C);
// demb (V, C) += the scattered rows of dout (N, C).
void dsc__llama_embed_backward(float *demb, const float *dout, const int32_t *inputs, int64_t N,
                               int C);

#endif
