// cuda/gpt2_cuda.h - GPT-2 forward and backward on one GPU in bf16, with fp32 parameter gradients.
//
// The same model as model/gpt2/gpt2.h, with the same parameter table (Hugging Face names and
// shapes, the order of dsc_gpt2_tensor_info_get): the caller keeps fp32 master weights (for the
// optimizer, e.g. dsc__cuda_opt_step with a bf16 copy out) and hands the model the bf16 copy of
// each tensor plus an fp32 gradient buffer per tensor. Activations are bf16 and kept for backward
// (no recomputation); statistics are fp32. Products go through cuBLASLt, attention through the
// flash kernels of cuda/attention.h, everything else through cuda/gpt2_kernels.h.
//
// All device work of a pass is enqueued on the model's stream; the only host synchronisation is
// the loss read (when forward is given a loss pointer). Results are deterministic: the same
// inputs give the same bits on the same GPU.
#ifndef DSC_CUDA_GPT2_CUDA_H
#define DSC_CUDA_GPT2_CUDA_H

#include <stdbool.h> // bool
#include <stdint.h>  // int32_t, uint16_t

#include "dsc/memory.h" // dsc_mem_pool
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#include "model/gpt2/gpt2.h" // dsc_gpt2_config, dsc_gpt2_tensor_info_get

typedef struct dsc_gpt2_cuda dsc_gpt2_cuda; // device activations for up to B x T tokens

// Allocates activations and scratch on the current device for batches up to B x T. stream: the
// cudaStream_t every pass runs on (NULL: default stream); borrowed. Caller owns *out.
dsc_status dsc_gpt2_cuda_create(dsc_gpt2_cuda **out, const dsc_gpt2_config *c, int B, int T,
                                void *stream);
// The same with every device buffer (activations and scratch as one block tagged
// "gpu.activations", the matmul workspace as "gpu.matmul_workspace") taken from `pool`, a device
// pool that never moves blocks (cuda/devbuf.h); NULL: cudaMalloc, as dsc_gpt2_cuda_create.
dsc_status dsc_gpt2_cuda_create_in(dsc_gpt2_cuda **out, const dsc_gpt2_config *c, int B, int T,
                                   void *stream, dsc_mem_pool *pool);
void dsc_gpt2_cuda_destroy(dsc_gpt2_cuda *m); // NULL ok; synchronises the stream first

// Use cuBLASLt's GELU epilogues (the GELU fused into the c_fc product, its derivative into the
// c_proj input-gradient product) instead of separate GELU kernels. On by default (measured 1-2%
// faster on an H200); both paths are tested against the CPU model.
void dsc_gpt2_cuda_set_fused_gelu(dsc_gpt2_cuda *m, bool on);

// params[i]: device bf16 copy of tensor i (borrowed for the call). inputs, targets: HOST (B, T)
// token ids in [0, vocab_size), checked and copied. targets may be NULL (logits only). loss:
// NULL, or host float that receives the mean loss (this waits for the stream).
dsc_status dsc_gpt2_cuda_forward(dsc_gpt2_cuda *m, const uint16_t *const *params,
                                 const int32_t *inputs, const int32_t *targets, int B, int T,
                                 float *loss);

// grads[i]: device fp32 (numel of tensor i); adds (+=) the gradients of loss_scale * mean loss.
// Must follow a forward with targets; overwrites the logits with their gradients.
dsc_status dsc_gpt2_cuda_backward(dsc_gpt2_cuda *m, const uint16_t *const *params,
                                  float *const *grads, float loss_scale);

// The last forward's logits (B, T, ld) bf16 on the device (columns [vocab_size, ld) unused) and
// ld; borrowed, valid until the next backward.
const uint16_t *dsc_gpt2_cuda_logits(const dsc_gpt2_cuda *m, int *ld);

#ifdef __cplusplus
}
#endif
#endif
