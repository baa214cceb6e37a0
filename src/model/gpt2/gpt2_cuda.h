// model/gpt2/gpt2_cuda.h - GPT-2 forward and backward on one GPU in bf16 or fp16, with fp32
// parameter gradients.
//
// The same model as model/gpt2/gpt2.h, with the same parameter table (Hugging Face names and
// shapes, the order of dsc_gpt2_tensor_info_get): the caller keeps fp32 master weights (for the
// optimizer, e.g. dsc__cuda_opt_step with a 16-bit copy out) and hands the model the 16-bit copy
// of each tensor plus an fp32 gradient buffer per tensor. Activations are 16-bit and kept for
// backward (no recomputation); statistics are fp32. The 16-bit type is bf16 unless
// dsc_gpt2_cuda_set_fp16 says fp16. Products go through cuBLASLt, attention through the flash
// kernels of cuda/attention.h, everything else through model/gpt2/gpt2_kernels.h and
// cuda/kernels.h.
//
// All device work of a pass is enqueued on the model's stream; the only host synchronisation is
// the loss read (when forward is given a loss pointer). Results are deterministic: the same
// inputs give the same bits on the same GPU.
#ifndef DSC_MODEL_GPT2_GPT2_CUDA_H
#define DSC_MODEL_GPT2_GPT2_CUDA_H

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

// on: the next backwards (dsc_gpt2_cuda_backward, _train_step) write the gradients (=) instead of
// adding to them (+=): a step's first micro-step, so that nobody zeroes them between steps (every
// gradient element a backward produces is written; wpe rows past T are left as they are). Off by
// default.
void dsc_gpt2_cuda_set_grads_fresh(dsc_gpt2_cuda *m, bool on);

// Position ids of the forwards that follow: pos HOST (B, T), each in [0, max_seq_len), read (and
// checked) at each forward, so it must stay valid while they run; NULL (the default): each row's
// positions are 0 .. T-1. The backward scatters wpe's gradient by the same ids.
void dsc_gpt2_cuda_set_positions(dsc_gpt2_cuda *m, const int32_t *pos);

// on: parameters, activations and activation gradients are IEEE fp16 (fp16 training, with the
// caller's loss scale on backward); off (the default): bf16. Arithmetic stays fp32 inside the
// kernels either way. fp16 values overflow to inf (never saturate), so a loss scale that is too
// large shows up as inf/NaN in the fp32 gradients, where the loss scaler looks. Set it before a
// forward; the parameters handed in must then be fp16 copies (dsc__cuda_f32_to_16).
// dsc_gpt2_cuda_fp16: the current setting (false for NULL).
void dsc_gpt2_cuda_set_fp16(dsc_gpt2_cuda *m, bool on);
bool dsc_gpt2_cuda_fp16(const dsc_gpt2_cuda *m);

// params[i]: device 16-bit copy of tensor i (borrowed for the call). inputs, targets: HOST (B, T)
// token ids in [0, vocab_size), checked and copied; a negative target is ignored, as on the CPU
// (dsc_gpt2_forward): the loss is the mean over the others. targets may be NULL (logits only).
// loss: NULL, or host float that receives the mean loss (this waits for the stream).
dsc_status dsc_gpt2_cuda_forward(dsc_gpt2_cuda *m, const uint16_t *const *params,
                                 const int32_t *inputs, const int32_t *targets, int B, int T,
                                 float *loss);

// grads[i]: device fp32 (numel of tensor i); adds (+=) the gradients of loss_scale * mean loss.
// Must follow a forward with targets; overwrites the logits with their gradients.
dsc_status dsc_gpt2_cuda_backward(dsc_gpt2_cuda *m, const uint16_t *const *params,
                                  float *const *grads, float loss_scale);

// One training micro-step: forward with targets, then backward (grads +=, as
// dsc_gpt2_cuda_backward), with the softmax cross-entropy's loss and gradient made in one pass
// over the logits; bitwise the results of forward then backward. The loss (NULL: not read) is
// read after the whole backward is enqueued, so the host waits once, at the end. The logits are
// not available afterwards.
dsc_status dsc_gpt2_cuda_train_step(dsc_gpt2_cuda *m, const uint16_t *const *params,
                                    float *const *grads, const int32_t *inputs,
                                    const int32_t *targets, int B, int T, float loss_scale,
                                    float *loss);

// The mean loss of the last forward with targets (or train step), read now: waits for the
// model's stream. For a train step called with loss NULL, so that the host can do other work
// (e.g. take gradients as the hook hands them over) before it waits.
dsc_status dsc_gpt2_cuda_read_loss(dsc_gpt2_cuda *m, float *loss);
// The same mean queued into a device float (*loss_dev, valid until the next forward), not read.
dsc_status dsc_gpt2_cuda_loss_enqueue(dsc_gpt2_cuda *m, const float **loss_dev);

// A hook called on the host while a backward (dsc_gpt2_cuda_backward or _train_step) is being
// enqueued: once per parameter group of the model table (dsc_gpt2_tensor_info.group), right after
// the last kernel that writes that group's gradients has been enqueued on the model's stream, in
// the order the backward finishes them: ln_f's group (n_layer + 1) first, then the layers' groups
// n_layer .. 1, then group 0 (wte and wpe, whose gradients the embedding backward completes last).
// The hook typically records an event on the stream and starts copies or reductions of those
// gradients on another stream, so they overlap the rest of the backward. A non-OK return ends the
// backward with that status. fn NULL: no hook (the default).
typedef dsc_model_grad_hook dsc_gpt2_cuda_grad_hook; // (void *user, int group)
void dsc_gpt2_cuda_set_grad_hook(dsc_gpt2_cuda *m, dsc_gpt2_cuda_grad_hook fn, void *user);

// A hook called on the host before each layer's kernels are enqueued: pass 0 (forward) for
// layers 0 .. n_layer - 1 and then once more with layer n_layer (after the last), pass 1
// (backward) for layers n_layer - 1 .. 0 and then with layer -1. It may change that layer's
// entries of the params table (and in backward of the grads table) the pass was called with:
// the model reads a layer's entries after its hook (a caller streaming layer weights through a
// few device buffers points them at the buffer that holds the layer). A non-OK return ends the
// pass with that status. fn NULL: no hook (the default).
typedef dsc_model_layer_hook dsc_gpt2_cuda_layer_hook; // (void *user, int pass, int layer)
void dsc_gpt2_cuda_set_layer_hook(dsc_gpt2_cuda *m, dsc_gpt2_cuda_layer_hook fn, void *user);

// GPT-2's device passes behind the model interface (dsc/model.h): model/gpt2/ops.c points its
// table here in CUDA builds.
extern const struct dsc_model_device_ops dsc__gpt2_device_ops;

// The last forward's logits (B, T, ld) on the device, bf16 (fp16 under dsc_gpt2_cuda_set_fp16;
// columns [vocab_size, ld) unused) and ld; borrowed, valid until the next backward.
const uint16_t *dsc_gpt2_cuda_logits(const dsc_gpt2_cuda *m, int *ld);

#ifdef __cplusplus
}
#endif
#endif
