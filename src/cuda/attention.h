// cuda/attention.h - causal self-attention on the GPU, flash-attention style: scores are made
// tile by tile in shared memory with an online softmax and never stored as a T x T matrix.
//
// Two layouts: GPT-2's (dsc__cuda_attention_*: qkv rows of q, k, v with NH heads each) and
// grouped-query attention (dsc__cuda_gqa_*, the Llama family: NH query heads share NKV kv heads,
// read in place, never repeated in memory). Both run the same register-tile kernels, compiled
// once per layout.
//
// bf16 operands (raw uint16_t bits; the `_h` entry points take fp16 ones when `fp16` is set),
// tensor-core tile products with fp32 accumulation, fp32 softmax statistics. fp16 and the
// grouped-query calls need the register-tile kernels of NVIDIA builds; elsewhere (HIP) they
// return DSC_ERR_UNSUPPORTED. Head size 64 (every GPT-2 size has it; the only one of the GPT-2
// calls), or 128 for the grouped-query calls (Llama 3.2 3B, 3.1 8B); T is any length.
// Both passes are deterministic: the backward computes dK, dV in one kernel (a block per key
// tile of one kv head, looping over its query heads in order and their query tiles) and dQ in
// another (a block per query tile), so no gradient is accumulated with atomics. The CPU
// references are dsc__gpt2_attention_* (model/gpt2/kernels.h) and dsc__llama_attention_*
// (model/llama/kernels.h).
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

// Grouped-query causal attention. qkv (B, T, (NH + 2 NKV) HS) dense rows: q (NH heads of HS
// channels), then k (NKV heads), then v (NKV heads); NKV divides NH (NKV == NH is GPT-2's
// layout with C = NH HS; NKV == 1 is multi-query); query head h reads kv head h / (NH / NKV).
// out (B, T, NH HS); lse (B, NH, T) natural-log logsumexp of each softmax row. Scale
// 1/sqrt(HS). HS must be 64 or 128 (DSC_ERR_INVALID_ARG naming it otherwise). fp16: 16-bit
// tensors are IEEE fp16, else bf16. With NKV == NH and HS 64 the results are bitwise those of the
// GPT-2 calls.
dsc_status dsc__cuda_gqa_forward(uint16_t *out, float *lse, const uint16_t *qkv, int B, int T,
                                 int NH, int NKV, int HS, bool fp16, void *stream);
// dqkv (same layout as qkv, overwritten) given dout (B, T, NH HS) and the forward's out, lse.
// The K and V gradients of a kv head sum its NH/NKV query heads in a fixed order
// (deterministic, no float atomics). scratch: dsc__cuda_gqa_backward_scratch(B, T, NH) floats.
size_t dsc__cuda_gqa_backward_scratch(int B, int T, int NH);
dsc_status dsc__cuda_gqa_backward(uint16_t *dqkv, float *scratch, const uint16_t *dout,
                                  const uint16_t *qkv, const uint16_t *out, const float *lse,
                                  int B, int T, int NH, int NKV, int HS, bool fp16,
                                  void *stream);

#ifdef __cplusplus
}
#endif
#endif
