// model/llama/llama_kernels.h - GPU kernels of the Llama-family layers other than attention and the
// matrix products: token embeddings, RMSNorm, rotary position embeddings (rotate_half), Qwen3's
// q/k norms (fused with the rotation), SwiGLU.
//
// The conventions of cuda/kernels.h: 16-bit tensors are raw uint16_t bit patterns, bf16 or
// IEEE fp16 as `fp16` says (one type for every 16-bit tensor of a call); statistics and parameter
// gradients are fp32; arithmetic is fp32 inside every kernel and each 16-bit result is rounded
// once, to nearest even; fp16 results overflow to inf, never saturate. The CPU kernels of
// model/llama/kernels.h are the reference the tests compare against.
//
// Every pointer is device memory; `stream` is a cudaStream_t (hipStream_t in HIP builds), NULL for
// the default stream. Calls only enqueue work: they return DSC_ERR_INVALID_ARG for shapes the
// kernels do not take and DSC_ERR_CUDA when a launch fails. Every kernel is deterministic:
// parameter gradients are summed in a fixed order (fixed row chunks, then the chunks in order;
// token runs in position order), never with floating-point atomics, so two runs give the same
// bits.
//
// Shapes: rows move as 16-byte vectors of eight 16-bit values, so C and I must be multiples of 8,
// HS a multiple of 16 (each half of a head in whole vectors) and ld a multiple of 8, and every
// tensor 16-byte aligned (cudaMalloc's alignment and whole rows keep them so). Token ids and
// position ids are not checked: ids in [0, V), positions below the tables' maxT.
#ifndef DSC_MODEL_LLAMA_LLAMA_KERNELS_H
#define DSC_MODEL_LLAMA_LLAMA_KERNELS_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// out (N, C) = w * (x * rstd), rstd (N) = 1 / sqrt(mean(x^2) + eps) kept (fp32) for backward.
dsc_status dsc__cuda_rmsnorm_forward_h(uint16_t *out, float *rstd, const uint16_t *x,
                                       const uint16_t *w, float eps, int64_t N, int C, bool fp16,
                                       void *stream);

// dx (N, C) += the gradient through the norm, rstd (g - xh mean(g xh)) with xh = x rstd and
// g = dout w (dx sits on the residual stream: 16-bit, added in fp32 and rounded once); dw (C) +=
// (add) or = (!add) the sum over rows of dout * x * rstd, in fixed chunks of rows then the chunks
// in order (deterministic). scratch: dsc__cuda_rmsnorm_backward_scratch(N, C) floats.
size_t dsc__cuda_rmsnorm_backward_scratch(int64_t N, int C);
dsc_status dsc__cuda_rmsnorm_backward_h(uint16_t *dx, float *dw, float *scratch,
                                        const uint16_t *dout, const uint16_t *x, const uint16_t *w,
                                        const float *rstd, bool add, int64_t N, int C, bool fp16,
                                        void *stream);

// In place on rows of x (B, T, ld): heads 0 .. nheads-1 of HS channels at the start of each row
// (the caller passes the q and k heads, which are adjacent: nheads = NH + NKV; what follows them
// in the row is not touched). Pairs (i, i + HS/2) are rotated as Hugging Face's rotate_half:
// (x1 c - x2 s, x2 c + x1 s) with c, s from cos_t / sin_t (maxT, HS/2), the fp32 device tables of
// dsc__llama_rope_tables, at row position pos[b * T + t] (pos NULL: t). inverse rotates back
// (s -> -s), which is the backward. fp32 arithmetic, one rounding per element.
dsc_status dsc__cuda_rope_h(uint16_t *x, int ld, const float *cos_t, const float *sin_t,
                            const int32_t *pos, int B, int T, int nheads, int HS, bool inverse,
                            bool fp16, void *stream);

// Qwen3's per-head RMSNorm of q and k fused with the rotation, in place on rows of x (B, T, ld)
// as dsc__cuda_rope_h: heads 0 .. nq-1 are normed with wq (HS, 16-bit), heads nq .. nq+nk-1 with
// wk, each as w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps), then rotated at the row's
// position; fp32 throughout, one rounding per element. With raw and rstd set (training), the
// inputs are kept in raw (B T, (nq + nk) HS) dense, 16-bit, and each head's rstd in rstd
// (B T, nq + nk) for the backward; NULL both for inference. HS/16 must be a power of two no larger
// than the warp (HS 16 .. 512 on 32-lane warps).
dsc_status dsc__cuda_qk_norm_rope_h(uint16_t *x, int ld, uint16_t *raw, float *rstd,
                                    const uint16_t *wq, const uint16_t *wk, float eps,
                                    const float *cos_t, const float *sin_t, const int32_t *pos,
                                    int B, int T, int nq, int nk, int HS, bool fp16, void *stream);

// Its backward, in place on dx (the layout of x): the gradient of the rotated outputs becomes that
// of the norms' inputs (the rotation undone, then rstd (g w - xh mean(g w xh)) with xh = raw rstd,
// g the unrotated gradient); dwq, dwk (HS) += (add) or = (!add) the sums over rows and heads of
// g xh, in fixed chunks of rows then the chunks in order (deterministic, no atomics).
// scratch: dsc__cuda_qk_norm_backward_scratch(B T, HS) floats.
size_t dsc__cuda_qk_norm_backward_scratch(int64_t N, int HS);
dsc_status dsc__cuda_qk_norm_rope_backward_h(uint16_t *dx, int ld, float *dwq, float *dwk,
                                             float *scratch, const uint16_t *raw,
                                             const float *rstd, const uint16_t *wq,
                                             const uint16_t *wk, const float *cos_t,
                                             const float *sin_t, const int32_t *pos, int B, int T,
                                             int nq, int nk, int HS, bool add, bool fp16,
                                             void *stream);

// gu (N, 2I) rows [gate | up]; h (N, I) = silu(gate) * up.
dsc_status dsc__cuda_swiglu_forward_h(uint16_t *h, const uint16_t *gu, int64_t N, int I,
                                      bool fp16, void *stream);
// dgu (N, 2I) = [dh * up * silu'(gate) | dh * silu(gate)]; dgu may equal gu (in place).
dsc_status dsc__cuda_swiglu_backward_h(uint16_t *dgu, const uint16_t *dh, const uint16_t *gu,
                                       int64_t N, int I, bool fp16, void *stream);

#ifdef __cplusplus
}
#endif
#endif
