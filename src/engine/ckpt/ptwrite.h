// ckpt/ptwrite.h - write PyTorch checkpoint files (torch.save's zip archive), the counterpart of
// torchfile.h: what this writes, torch.load and dsc_pt_open read back.
//
// A file holds one value, written in order as calls: scalars and strings are single calls,
// containers and objects are a _begin, their items, an _end (a dict's items alternate key, value).
// The values become a pickle of protocol 2, opcode for opcode what torch.save's pickler (CPython's)
// writes for the same values less its memo: no PUT or GET (torch's unpicklers and ours accept a
// pickle without them), so a value given twice is written twice. Tensors become
// _rebuild_tensor_v2 of a storage of their own. _save writes the archive torch's
// PyTorchStreamWriter writes (ptzipw.h): stored entries <archive>/data.pkl, byteorder ("little"),
// data/0, data/1, ... (one per tensor, in the order written), version ("3\n") and
// .data/serialization_id, each entry's data on a 64-byte boundary.
//
// Building calls return nothing: the first failure (out of memory, an _end that closes nothing
// or a container of another kind, a dict with a key left without its value, a second value at
// the top, a bad dtype or shape) is remembered, later calls do nothing, and _save reports it
// without touching the file. Misuse is an error, never a crash.
#ifndef DSC_CKPT_PTWRITE_H
#define DSC_CKPT_PTWRITE_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/status.h"            // dsc_status
#include "engine/ckpt/torchfile.h" // dsc_pt_dtype, DSC_PT_MAX_DIMS

typedef struct dsc__ptw dsc__ptw; // one file's pickle being built, plus its tensors' storages

dsc_status dsc__ptw_new(dsc__ptw **out);
void dsc__ptw_free(dsc__ptw *w); // NULL ok

// Values.
void dsc__ptw_none(dsc__ptw *w);
void dsc__ptw_bool(dsc__ptw *w, bool b);
void dsc__ptw_int(dsc__ptw *w, int64_t x);
void dsc__ptw_float(dsc__ptw *w, double x);
void dsc__ptw_str(dsc__ptw *w, const char *s); // UTF-8 (checked), copied

// Containers: dict (a plain dict) or ordered_dict (collections.OrderedDict), both closed by
// dict_end; keys may be any value but a list or a dict (Python could not hash them).
void dsc__ptw_dict_begin(dsc__ptw *w);
void dsc__ptw_ordered_dict_begin(dsc__ptw *w);
void dsc__ptw_dict_end(dsc__ptw *w);
void dsc__ptw_list_begin(dsc__ptw *w);
void dsc__ptw_list_end(dsc__ptw *w);
void dsc__ptw_tuple_begin(dsc__ptw *w);
void dsc__ptw_tuple_end(dsc__ptw *w);

// A contiguous CPU tensor of ndim dimensions (0 to DSC_PT_MAX_DIMS; 0 is a scalar) and the given
// shape (row-major; a dimension may be 0): its numel * element-size bytes are copied from data
// (NULL allowed when there are none) into a storage entry of its own.
void dsc__ptw_tensor(dsc__ptw *w, dsc_pt_dtype dtype, int ndim, const int64_t *shape,
                     const void *data);

// An object of a plain class as Python's default pickling makes it (the class with no
// constructor arguments): begin, at most one value, its state (usually a dict of its attributes),
// end. module and name are copied; torch.load imports the module to rebuild the object.
void dsc__ptw_object_begin(dsc__ptw *w, const char *module, const char *name);
void dsc__ptw_object_end(dsc__ptw *w);
// module.name(*args): the values written between begin and end are the arguments (torch.Size of
// a shape tuple, set of a list); REDUCE applies the callable when Python loads the file.
void dsc__ptw_call_begin(dsc__ptw *w, const char *module, const char *name);
void dsc__ptw_call_end(dsc__ptw *w);
// A class or function itself as a value (a torch dtype: "torch", "float16").
void dsc__ptw_global(dsc__ptw *w, const char *module, const char *name);

// The first building failure, DSC_OK while there is none (its sentence is recorded when it
// happens, and again, naming the file, by _save).
dsc_status dsc__ptw_status(const dsc__ptw *w);

// Tests: ZIP64 records for every entry and the end of the archive even where the sizes fit, so
// that the layout of a file past 4 GiB can be checked on a small one.
void dsc__ptw_force_zip64(dsc__ptw *w, bool on);

// Write the archive to path atomically: path.tmp is written, fsynced and renamed over path, and
// the directory fsynced; on a failure before the rename, path is untouched and path.tmp removed.
// archive is the folder inside the zip (torch.save uses the file's name without its extension,
// which NULL gives; torch.load accepts any). The value must be complete (every _begin closed,
// one value at the top). DSC_ERR_IO naming the file and the cause (no space, no directory,
// permissions), DSC_ERR_INVALID_ARG for a building failure or a bad archive name, DSC_ERR_OOM.
// The writer is unchanged and may be saved again.
dsc_status dsc__ptw_save(dsc__ptw *w, const char *path, const char *archive);

#endif
