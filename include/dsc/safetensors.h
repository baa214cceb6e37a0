// dsc/safetensors.h - safetensors files (Hugging Face's tensor files) and Hugging Face model
// folders of them: read, write, tensor by tensor. No engine needed.
//
// What dsc writes and reads outside its own checkpoints goes through these calls: `dsc ckpt
// export` (one file or a model folder, dsc/checkpoint.h), `dsc train --init-weights` and
// `--model hf:DIR` (a folder's weights into a model's parameters), `--dump-grads` and
// `--dump-weights`, and `dsc generate --weights`. A program that embeds libdsc uses them the
// same way, e.g. to load a published model's weights into the parameters it registers with the
// engine (docs/huggingface.md).
//
// A safetensors file: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {string: string}}, padded with spaces to a
// multiple of 8, then the tensor bytes, contiguous and in offset order.
//
// A Hugging Face model folder holds either one model.safetensors or shards named by
// model.safetensors.index.json ({"weight_map": {tensor name: shard file}}), as transformers'
// save_pretrained writes them.
#ifndef DSC_SAFETENSORS_H
#define DSC_SAFETENSORS_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t, uint64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// ---- one safetensors file ----

#define DSC_ST_MAX_DIMS 8

typedef struct dsc_st_tensor {
    const char *name;
    const char *dtype; // "F32", "F16", "BF16", "I32", "I64", "U8", ...
    int ndim;
    int64_t shape[DSC_ST_MAX_DIMS];
    const void *data;  // borrowed (writing) or pointing into the open file (reading)
    size_t nbytes;
} dsc_st_tensor;

// Bytes per element of a safetensors dtype name, 0 if unknown.
size_t dsc_st_dtype_size(const char *dtype);

// Write tensors and string metadata (meta: key, value, key, value, ...; nmeta pairs) to `path`
// atomically: written to path.tmp, fsynced, renamed over path.
dsc_status dsc_st_write(const char *path, const dsc_st_tensor *tensors, int n,
                        const char *const *meta, int nmeta);

// The same, with each tensor's bytes produced when they are written (t[i].data unused): fill
// writes tensor i's nbytes into dst, a buffer of the writer's reused from tensor to tensor, so
// that a file of any size is written holding one tensor at a time. A fill failure removes the
// temporary file and is returned.
typedef dsc_status (*dsc_st_fill_fn)(void *user, int i, void *dst, size_t nbytes);
dsc_status dsc_st_write_stream(const char *path, const dsc_st_tensor *tensors, int n,
                               const char *const *meta, int nmeta, dsc_st_fill_fn fill,
                               void *user);

typedef struct dsc_st_file dsc_st_file; // an open, validated file, mapped read-only

// Open and validate a file (header JSON, dtypes, shapes against byte ranges without overflow,
// and the format's tiling rule: the ranges, sorted, start at 0, each begins where the previous
// ends, the last ends at the end of the file). Errors name the file, the tensor and what is wrong.
dsc_status dsc_st_open(dsc_st_file **out, const char *path);
void dsc_st_close(dsc_st_file *f); // NULL ok
int dsc_st_count(const dsc_st_file *f);
// Tensors are borrowed until dsc_st_close; their data points into the mapped file.
const dsc_st_tensor *dsc_st_get(const dsc_st_file *f, int i); // in file order
const dsc_st_tensor *dsc_st_find(const dsc_st_file *f, const char *name); // NULL if absent
const char *dsc_st_meta(const dsc_st_file *f, const char *key);            // NULL if absent

// ---- a Hugging Face model folder ----

// The reader finds a tensor by name and copies any slice of it into fp32 (from F32, BF16 or
// F16), mapping one shard at a time: reading a model costs the address space of one shard, and
// only the pages of the slices read are touched, so a rank that loads its ZeRO partition reads
// its part and no more.
typedef struct dsc_hf_weights dsc_hf_weights;

typedef struct dsc_hf_tensor {
    char dtype[8]; // "F32", "BF16", "F16", ...
    int ndim;
    int64_t shape[DSC_ST_MAX_DIMS];
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

#ifdef __cplusplus
}
#endif
#endif
