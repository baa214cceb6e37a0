// examples/own_model/own_model.h - the shape of the example's model, shared by its host code
// (own_model.c) and its device passes (own_model_cuda.cu, built with -DOWN_MODEL_CUDA).
//
// The model's tensors and layer groups, in the order forward uses them, laid out as the engine's
// device trainer streams a model: group 0 (the embedding) and the last group (the head) stay
// whole on the device, the groups between them are its "layers" (here one: the hidden layer).
#ifndef OWN_MODEL_H
#define OWN_MODEL_H

#include "dsc/model.h" // struct dsc_model_device_ops

enum { VOCAB = 256, CTX = 4, EMB = 16, HID = 96, IN = CTX * EMB };
enum { G_EMBED = 0, G_HIDDEN = 1, G_HEAD = 2, NGROUPS = 3, NLAYERS = 1 };
enum { P_WTE, P_W1, P_B1, P_W2, P_B2, NPARAMS };

#ifdef __cplusplus
extern "C" {
#endif

// The device passes (own_model_cuda.cu): the same model on a GPU through cuBLAS and a few
// kernels of its own, 16-bit weights in, fp32 gradients out.
extern const struct dsc_model_device_ops own_mlp_device_ops;

#ifdef __cplusplus
}
#endif

#endif
