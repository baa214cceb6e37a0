// model/gpt2/gpt2_cuda.h - GPT-2 forward and backward on one GPU in bf16 or fp16, with fp32
// parameter gradients: the family's device passes behind the model interface (struct
// dsc_model_device_ops, dsc/model.h), which model/gpt2/ops.c points to in CUDA builds.
//
// The same model as model/gpt2/gpt2.h, with the same parameter table (Hugging Face names and
// shapes, the order of dsc_gpt2_tensor_info_get): the caller keeps fp32 master weights and hands
// each pass the 16-bit copy of every tensor plus an fp32 gradient buffer per tensor. Activations
// are 16-bit and kept for backward (or, with the config's recompute, each layer's input only and
// the layer run again in the backward); statistics are fp32. The 16-bit type is bf16 unless
// set_fp16 says fp16 (values then overflow to inf, never saturate, so a loss scale that is too
// large shows up as inf/NaN in the fp32 gradients, where the loss scaler looks). Products go
// through cuBLASLt (with GELU epilogues: the GELU fused into the c_fc product, its derivative
// into the c_proj input-gradient product), attention through the flash kernels of
// cuda/attention.h, everything else through model/gpt2/gpt2_kernels.h and cuda/kernels.h.
// Position ids (set_positions) choose the rows of the position embedding that each token reads,
// and its gradient is scattered by the same ids.
//
// The gradient hook is called in the order the backward finishes the groups: ln_f's group
// (n_layer + 1) first, then the layers' groups n_layer .. 1, then group 0 (wte and wpe, whose
// gradients the embedding backward completes last). A train step without hooks runs as one CUDA
// graph from its second call with the same shape, scale and addresses (DSC_GPU_GRAPH=0: never).
//
// All device work of a pass is enqueued on the model's stream; the only host synchronisation is
// the loss read. Results are deterministic: the same inputs give the same bits on the same GPU.
#ifndef DSC_MODEL_GPT2_GPT2_CUDA_H
#define DSC_MODEL_GPT2_GPT2_CUDA_H

#include <stdbool.h> // bool
#include <stdint.h>  // uint16_t

#include "dsc/model.h" // struct dsc_model_device_ops

#ifdef __cplusplus
extern "C" {
#endif

// The table; its cfg is a dsc_gpt2_config (model/gpt2/gpt2.h), its dev what create made.
extern const struct dsc_model_device_ops dsc__gpt2_device_ops;

// The cuBLASLt GELU epilogues (on by default, measured 1-2% faster on an H200) or separate GELU
// kernels instead: both are tested against the CPU model (tests/cuda/test_cuda_gpt2.cu).
void dsc__gpt2_cuda_set_fused_gelu(void *dev, bool on);

// The last forward's logits (B, T, ld) on the device in the 16-bit type (columns [vocab_size, ld)
// unused) and ld; borrowed, valid until the next backward (the decoder's recompute mode).
const uint16_t *dsc__gpt2_cuda_logits(const void *dev, int *ld);

#ifdef __cplusplus
}
#endif
#endif
