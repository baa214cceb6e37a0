// ckpt/safetensors.h - read and write the safetensors format (Hugging Face's tensor files).
//
// Layout: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
// [begin, end]}, "__metadata__": {string: string}}, padded with spaces to a multiple of 8, then the
// tensor bytes, contiguous and in offset order.
#ifndef DSC_CKPT_SAFETENSORS_H
#define DSC_CKPT_SAFETENSORS_H

#include <stddef.h> // size_t
#include <stdint.h> // int64_t

#include "dsc/status.h" // dsc_status

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

typedef struct dsc_st_file dsc_st_file;

// Open and validate a file (header JSON, dtypes, shapes against byte ranges without overflow,
// and the format's tiling rule: the ranges, sorted, start at 0, each begins where the previous
// ends, the last ends at the end of the file). Errors name the file, the tensor and what is wrong.
dsc_status dsc_st_open(dsc_st_file **out, const char *path);
void dsc_st_close(dsc_st_file *f); // NULL ok
int dsc_st_count(const dsc_st_file *f);
const dsc_st_tensor *dsc_st_get(const dsc_st_file *f, int i); // in file order
const dsc_st_tensor *dsc_st_find(const dsc_st_file *f, const char *name); // NULL if absent
const char *dsc_st_meta(const dsc_st_file *f, const char *key);            // NULL if absent

#endif
