// ckpt/torchfile.h - read PyTorch checkpoint files (torch.save's zip archive) without running
// anything from them.
//
// torch.save writes a zip archive of stored entries: <archive>/data.pkl (a pickle of the saved
// object), <archive>/data/<key> (one entry per storage, raw little-endian elements),
// <archive>/version and, from torch 2, <archive>/byteorder. The pickle is read by a restricted
// unpickler: the opcodes of protocols 2-4 that build plain values (None, bools, integers up to
// 64 bits, floats, strings, lists, tuples, dicts), and only the globals torch.save emits for
// tensors (torch._utils._rebuild_tensor_v2, _rebuild_parameter, the torch.<Type>Storage classes,
// torch.Size, collections.OrderedDict) plus the few plain classes DeepSpeed stores in its
// checkpoints (its loss scalers, ZeroStageEnum, fragment_address, argparse.Namespace), which
// become inert values (the class's name and the state the pickle gives it). Every other global,
// opcode or call is refused with an error naming it, the byte offset and the file: a class is
// never instantiated, a function never called. The legacy (pre-zip) format is refused with the
// way to convert the file.
//
// Tensors are checked when the pickle is read: dtype known, storage entry present with exactly
// numel * element-size bytes, and every element the shape and strides reach inside the storage.
// Their bytes stay in the mapped file until read.
#ifndef DSC_CKPT_TORCHFILE_H
#define DSC_CKPT_TORCHFILE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t

#include "dsc/status.h" // dsc_status

#define DSC_PT_MAX_DIMS 8

typedef enum dsc_pt_kind {
    DSC_PT_NONE,
    DSC_PT_BOOL,
    DSC_PT_INT,
    DSC_PT_FLOAT,
    DSC_PT_STR,    // UTF-8, NUL-terminated (len excludes the NUL; may hold inner NULs)
    DSC_PT_BYTES,
    DSC_PT_LIST,
    DSC_PT_TUPLE,  // also torch.Size
    DSC_PT_DICT,   // also OrderedDict; keys in insertion order, a key set twice keeps the last
    DSC_PT_TENSOR,
    DSC_PT_OBJECT, // an allowed plain class: its name and its state (the pickle's BUILD value)
    DSC_PT_GLOBAL, // an allowed class or function not (yet) applied, e.g. a torch dtype
    DSC_PT_STORAGE,
} dsc_pt_kind;

typedef enum dsc_pt_dtype {
    DSC_PT_F32, DSC_PT_F64, DSC_PT_F16, DSC_PT_BF16, DSC_PT_I64, DSC_PT_I32, DSC_PT_I16,
    DSC_PT_I8, DSC_PT_U8, DSC_PT_BOOL8,
} dsc_pt_dtype;

typedef struct dsc_pt_value dsc_pt_value;

typedef struct dsc_pt_tensor {
    dsc_pt_dtype dtype;
    int ndim;
    int64_t shape[DSC_PT_MAX_DIMS], stride[DSC_PT_MAX_DIMS]; // in elements
    int64_t offset, numel;       // storage offset, in elements; numel = product of shape
    const void *storage;         // the storage's first element, in the mapped file
    int64_t storage_numel;
    const char *key;             // the storage's entry, data/<key>
} dsc_pt_tensor;

struct dsc_pt_value {
    dsc_pt_kind kind;
    int64_t i;          // BOOL, INT
    double f;           // FLOAT
    char *s;            // STR, BYTES; OBJECT, GLOBAL: "module.name"
    size_t len;         // of s
    dsc_pt_value **items; // LIST, TUPLE: n items; DICT: n pairs as key, value, key, value...
    int n, cap;
    dsc_pt_value *state; // OBJECT: what BUILD gave it (NULL if nothing)
    dsc_pt_tensor *t;    // TENSOR, STORAGE (storage: dtype, storage, storage_numel, key)
};

typedef struct dsc_pt_file dsc_pt_file; // an open file, mapped read-only

// Open, index and unpickle path. DSC_ERR_CORRUPT naming the file and the fault for anything
// torch.save would not have written, DSC_ERR_IO when it cannot be read.
dsc_status dsc_pt_open(dsc_pt_file **out, const char *path);
// The same from memory (borrowed until dsc_pt_close); name is what errors call it.
dsc_status dsc_pt_open_mem(dsc_pt_file **out, const void *data, size_t len, const char *name);
void dsc_pt_close(dsc_pt_file *f); // NULL ok
// Give back the pages of the mapped file that reading touched (they are read again from the
// page cache if needed): a reader going tensor by tensor then holds one tensor's pages at a time.
void dsc_pt_release_pages(dsc_pt_file *f);
// The file's size in bytes (0 for a file opened from memory).
size_t dsc_pt_file_bytes(const dsc_pt_file *f);

// The saved object (borrowed until dsc_pt_close).
const dsc_pt_value *dsc_pt_root(const dsc_pt_file *f);
const char *dsc_pt_path(const dsc_pt_file *f);

// Lookups on values; NULL when v is not of the kind, or has no such entry.
const dsc_pt_value *dsc_pt_dict_get(const dsc_pt_value *v, const char *key);
const dsc_pt_value *dsc_pt_item(const dsc_pt_value *v, int i); // LIST or TUPLE
// OBJECT's state attribute (its state is a dict): the loss scaler's cur_scale, ...
const dsc_pt_value *dsc_pt_attr(const dsc_pt_value *v, const char *name);
bool dsc_pt_is_str(const dsc_pt_value *v, const char *s);
// An INT or BOOL as int64 / an INT, BOOL or FLOAT as double; false for anything else.
bool dsc_pt_int(const dsc_pt_value *v, int64_t *out);
bool dsc_pt_num(const dsc_pt_value *v, double *out);

size_t dsc_pt_dtype_size(dsc_pt_dtype d);
const char *dsc_pt_dtype_name(dsc_pt_dtype d); // "F32", "BF16", ... (safetensors' spelling)

// Elements [begin, begin + count) of the tensor in row-major order, as fp32 into dst (any
// floating dtype, or integers converted). Strided views are followed. The range must lie in
// [0, numel).
void dsc_pt_tensor_read(const dsc_pt_tensor *t, int64_t begin, int64_t count, float *dst);

#endif
