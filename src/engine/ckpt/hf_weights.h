// ckpt/hf_weights.h - the weights of a Hugging Face model folder, tensor by tensor.
//
// A folder holds either one model.safetensors or shards named by model.safetensors.index.json
// ({"weight_map": {tensor name: shard file}}). This reader finds a tensor by name and copies any
// slice of it into fp32 (from F32, BF16 or F16), mapping one shard at a time: reading a model
// costs the address space of one shard, and only the pages of the slices read are touched, so a
// rank that loads its ZeRO partition reads its part and no more.
#ifndef DSC_CKPT_HF_WEIGHTS_H
#define DSC_CKPT_HF_WEIGHTS_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/status.h"              // dsc_status
#include "engine/ckpt/safetensors.h" // dsc_st_tensor, dsc_st_fill_fn

typedef struct dsc_hf_weights dsc_hf_weights;

typedef struct dsc_hf_tensor {
    char dtype[8]; // "F32", "BF16", "F16", ...
    int ndim;
    int64_t shape[8];
    int64_t numel;
} dsc_hf_tensor;

// path: a folder (model.safetensors.index.json, else model.safetensors), an index file, or one
// .safetensors file. The index is read whole; shards are opened when first needed. Errors name
// the path and what a folder must hold.
dsc_status dsc_hf_weights_open(dsc_hf_weights **out, const char *path);
void dsc_hf_weights_close(dsc_hf_weights *w); // NULL ok

int dsc_hf_weights_count(const dsc_hf_weights *w);
const char *dsc_hf_weights_name(const dsc_hf_weights *w, int i); // borrowed, in index order
bool dsc_hf_weights_has(const dsc_hf_weights *w, const char *name);

// The tensor's dtype and shape (opens its shard). DSC_ERR_INVALID_ARG naming the tensor and the
// path when it is absent.
dsc_status dsc_hf_weights_info(dsc_hf_weights *w, const char *name, dsc_hf_tensor *out);

// Elements [begin, begin + count) of the tensor, in its row-major order, as fp32 into dst.
// F32, BF16 and F16 tensors; any other dtype, or a slice past the tensor's end, is an error
// naming the tensor.
dsc_status dsc_hf_weights_read(dsc_hf_weights *w, const char *name, int64_t begin, int64_t count,
                               float *dst);

// How many times a shard was mapped so far (one shard is mapped at a time; reading tensors in
// index order maps each shard once).
int dsc_hf_weights_maps(const dsc_hf_weights *w);

// ---- writing ----

// Write the tensors t[0..n) (names, dtypes, shapes; data unused) into dir as transformers'
// save_pretrained does: in order, into shards of at most shard_bytes of tensor data (a larger
// tensor alone in its own), named model-0000K-of-0000N.safetensors beside
// model.safetensors.index.json, or one model.safetensors when all fit in one. fill(user, i, ...)
// gives tensor i's bytes when it is written, so at most one tensor is held at a time. Each file
// is written under a temporary name and renamed; the index is written last. meta: safetensors
// metadata of every shard (key, value pairs; "format": "pt" is what transformers expects).
dsc_status dsc_hf_weights_write(const char *dir, const dsc_st_tensor *t, int n,
                                uint64_t shard_bytes, const char *const *meta, int nmeta,
                                dsc_st_fill_fn fill, void *user);

#endif
