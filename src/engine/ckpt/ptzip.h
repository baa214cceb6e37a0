// ckpt/ptzip.h - the index of a zip archive of stored (uncompressed) entries, as torch.save
// writes them: PyTorch's checkpoint files (.pt) are such archives (data.pkl, data/<key>, ...).
//
// Only what torch.save produces is accepted: entries stored without compression or encryption,
// ZIP64 records where sizes or offsets need them. The archive is read from memory the caller has
// mapped; every offset and size is checked against it before it is used, so that a truncated
// or lying archive is an error naming the file and the entry, never a read outside the mapping.
#ifndef DSC_CKPT_PTZIP_H
#define DSC_CKPT_PTZIP_H

#include <stddef.h> // size_t
#include <stdint.h> // uint8_t, uint64_t

#include "dsc/status.h" // dsc_status

typedef struct dsc__zip_entry {
    char *name;          // NUL-terminated copy (caller of dsc__zip_index frees with the index)
    const uint8_t *data; // into the caller's mapping
    uint64_t size;
} dsc__zip_entry;

typedef struct dsc__zip {
    dsc__zip_entry *e;
    int n;
} dsc__zip;

// Index the archive base[0, len). path names the file in errors. DSC_ERR_CORRUPT for anything
// that is not a well-formed archive of stored entries lying inside [0, len).
dsc_status dsc__zip_index(dsc__zip *z, const uint8_t *base, size_t len, const char *path);
const dsc__zip_entry *dsc__zip_find(const dsc__zip *z, const char *name); // NULL if absent
void dsc__zip_free(dsc__zip *z);                                           // zeroed; twice ok

#endif
