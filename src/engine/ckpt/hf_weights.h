// ckpt/hf_weights.h - the weights of a Hugging Face model folder, tensor by tensor.
//
// The reader and writer (dsc_hf_weights_*) are public API, declared and documented in
// include/dsc/safetensors.h; hf_weights.c implements them. What is here is the library's own.
#ifndef DSC_CKPT_HF_WEIGHTS_H
#define DSC_CKPT_HF_WEIGHTS_H

#include "dsc/safetensors.h" // dsc_hf_weights, dsc_hf_tensor, dsc_st_tensor, dsc_st_fill_fn

// How many times a shard was mapped so far (one shard is mapped at a time; reading tensors in
// index order maps each shard once).
int dsc_hf_weights_maps(const dsc_hf_weights *w);

#endif
