// model/llama/llama_cuda.h - the Llama family (Llama 3, SmolLM2, Qwen2) forward and backward on one
// GPU in bf16 or fp16, with fp32 parameter gradients: the family's device passes behind the model
// interface (struct dsc_model_device_ops, dsc/model.h), which model/llama/ops.c points to in CUDA
// builds.
//
// The same model as model/llama/llama.h with the same parameter table (Hugging Face names and
// shapes, nn.Linear weights (out, in)). The caller keeps fp32 master weights and hands each pass
// the 16-bit copy of every tensor plus an fp32 gradient buffer per tensor. Activations are 16-bit
// and kept for backward; statistics (RMSNorm's 1/rms, softmax's logsumexp) are fp32.
//
// A layer on the device: RMSNorm; q, k and v products (each writes its columns of one qkv row,
// Qwen2's biases in the product's epilogue); rotary embeddings in place on q and k
// (model/llama/llama_kernels.h, tables from dsc__llama_rope_tables); grouped-query flash attention
// that reads each kv head once per group (cuda/attention.h, no repeated K/V); the o product adding
// the residual in its epilogue; RMSNorm; gate and up products into one (rows, 2 I) buffer; SwiGLU;
// the down product adding the residual. Logits are 16-bit (rows of the vocabulary padded to a
// multiple of 64) and the softmax cross-entropy makes loss and gradient in one pass over them,
// so no fp32 logits exist. Products go through cuBLASLt (cuda/matmul.h).
//
// Limits: head_dim 64 (SmolLM2, Llama 3.2 1B, Qwen2.5 0.5B) or 128 (Llama 3.2 3B, 3.1 8B), the
// attention kernels' head sizes; others are refused at create, naming the model's. Positions are 0
// .. T-1 in every row. Deterministic: the same inputs give the same bits on the same GPU.
#ifndef DSC_MODEL_LLAMA_LLAMA_CUDA_H
#define DSC_MODEL_LLAMA_LLAMA_CUDA_H

#include "dsc/model.h"  // struct dsc_model_device_ops
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#include "model/llama/llama.h" // dsc_llama_config

// The table; its cfg is a dsc_llama_config (model/llama/llama.h).
extern const struct dsc_model_device_ops dsc__llama_device_ops;

// cos, sin (npos, head_dim / 2) fp32, device = the rotary tables of positions 0 .. npos-1, made
// on the host as the CPU model makes them (dsc__llama_rope_tables) and copied, waiting for the
// copies; a failure's sentence starts with `who`. The training passes and the decoder share it.
dsc_status dsc__llama_cuda_rope_upload(float *cos, float *sin, const dsc_llama_config *c, int npos,
                                       const char *who);

#ifdef __cplusplus
}
#endif
#endif
