// cuda/decode_common.h - what the families' GPU decoders (model/gpt2/gpt2_decode.cu,
// model/llama/llama_decode.cu) share around their own kernels: the logits rows' padding, the head's
// product into fp32 logits, the greedy choice over each row's logits, reading a pass's results
// back to the host, the check of an input token and the attention's shared-memory limit.
//
// Logits live on the device as (n, ld) fp32 rows with ld = dsc__cuda_decode_logits_ld(V) >= V
// columns, of which [0, V) are live.
#ifndef DSC_CUDA_DECODE_COMMON_H
#define DSC_CUDA_DECODE_COMMON_H

#include <stddef.h> // size_t
#include <stdint.h> // int32_t, uint16_t

#include "cuda/matmul.h" // dsc_cuda_blas
#include "dsc/status.h"  // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// The row stride of a decoder's logits: V rounded up to a multiple of 64 columns.
int dsc__cuda_decode_logits_ld(int V);

// logits (n, ld) fp32 = ln (n, C) @ w^T, w the head (V, C) as nn.Linear holds it; columns
// [V, ld) are not written. Queued on stream.
dsc_status dsc__cuda_decode_head(dsc_cuda_blas *h, float *logits, int ld, const uint16_t *ln,
                                 const uint16_t *w, int n, int C, int V, void *stream);

// out[b] (n, device) = the column of the largest value of logits row b (n, ld) over [0, V), the
// lowest on ties; NaN never wins (as dsc__sample's greedy choice, which only replaces on a
// strictly larger value: the two agree unless NaN is at column 0). One block per row, a
// fixed-order tree: the same bits on every run. Queued on stream.
dsc_status dsc__cuda_decode_argmax(int32_t *out, const float *logits, int n, int V, int ld,
                                   void *stream);

// tokens (n, HOST) = chosen (n, device), through the pinned staging (n); waits for the stream.
dsc_status dsc__cuda_decode_tokens_read(int32_t *tokens, int32_t *staging, const int32_t *chosen,
                                        int n, void *stream);
// logits (n, V, HOST, packed) = the rows of dev (n, ld, device), through the pinned staging
// (n, ld); waits for the stream.
dsc_status dsc__cuda_decode_logits_read(float *logits, float *staging, const float *dev, int n,
                                        int V, int ld, void *stream);

// A decode attention kernel (a __global__ function) whose blocks take `need` bytes of dynamic
// shared memory: past the default 48 KiB its limit is raised to need, up to the device's opt-in
// limit; beyond that DSC_ERR_INVALID_ARG names `who` and the max_len positions to cut.
dsc_status dsc__cuda_decode_smem_limit(const void *kernel, size_t need, const char *who,
                                       int max_len);

// tok in [0, V), else DSC_ERR_INVALID_ARG naming `who`, the row b and the position t.
dsc_status dsc__cuda_decode_check_token(const char *who, int32_t tok, int V, int b, int t);

#ifdef __cplusplus
}
#endif
#endif
