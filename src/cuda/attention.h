// cuda/attention.h - causal self-attention on the GPU, flash-attention style: scores are made
// tile by tile in shared memory with an online softmax and never stored as a T x T matrix.
//
// bf16 operands (raw uint16_t bits; the `_h` entry points take fp16 ones when `fp16` is set),
// tensor-core tile products with fp32 accumulation, fp32 softmax statistics. fp16 needs the
// register-tile kernels of NVIDIA builds; elsewhere (HIP) the `_h` calls with fp16 return
// DSC_ERR_UNSUPPORTED. Head size (C / NH) must be 64 (every GPT-2 size has it); T is any length.
// Both passes are deterministic: the backward computes dK, dV in one kernel (a block per key
// tile, looping over query tiles) and dQ in another (a block per query tile), so no gradient is
// accumulated with atomics. The CPU reference is dsc__gpt2_attention_* (model/gpt2/kernels.h).
//
// Pointers are device memory; stream is a cudaStream_t (NULL: default stream).
#ifndef DSC_CUDA_ATTENTION_H
#define DSC_CUDA_ATTENTION_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// At most this many (batch, head) pairs per call (a grid dimension's limit).
#define DSC_CUDA_ATT_MAX_BH 65535

// qkv (B, T, 3C): q, k, v of NH heads; out (B, T, C); lse (B, NH, T) the natural-log
// logsumexp of each softmax row, kept for backward.
dsc_status dsc__cuda_attention_forward(uint16_t *out, float *lse, const uint16_t *qkv, int B, int T,
                                       int C, int NH, void *stream);
dsc_status dsc__cuda_attention_forward_h(uint16_t *out, float *lse, const uint16_t *qkv, int B,
                                         int T, int C, int NH, bool fp16, void *stream);

// dqkv (B, T, 3C) = gradient of qkv (overwritten) given dout (B, T, C) and the forward's out and
// lse. scratch: dsc__cuda_attention_backward_scratch(B, T, NH) floats.
size_t dsc__cuda_attention_backward_scratch(int B, int T, int NH);
dsc_status dsc__cuda_attention_backward(uint16_t *dqkv, float *scratch, const uint16_t *dout,
                                        const uint16_t *qkv, const uint16_t *out, const float *lse,
                                        int B, int T, int C, int NH, void *stream);
// The _h twin's bias_part (NULL: none): the column sums of the stored dqkv (the bias gradient of
// the qkv product) per chunk of 64 rows of one sequence, (dsc__cuda_attention_bias_chunks(B, T),
// 3C) floats overwritten, for the caller to sum over the chunks (dsc__cuda_reduce_columns).
int dsc__cuda_attention_bias_chunks(int B, int T);
dsc_status dsc__cuda_attention_backward_h(uint16_t *dqkv, float *scratch, float *bias_part,
                                          const uint16_t *dout, const uint16_t *qkv,
                                          const uint16_t *out, const float *lse, int B, int T,
                                          int C, int NH, bool fp16, void *stream);

#ifdef __cplusplus
}
#endif
#endif
