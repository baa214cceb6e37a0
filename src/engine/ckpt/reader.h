// ckpt/reader.h - the opened checkpoint (struct dsc_ckpt), shared by loading, export and
// validation.
#ifndef DSC_CKPT_READER_H
#define DSC_CKPT_READER_H

#include "dsc/checkpoint.h"          // dsc_ckpt
#include "engine/ckpt/fs.h"          // DSC_CKPT_PATH_MAX
#include "engine/ckpt/manifest.h"    // dsc__manifest
#include "engine/ckpt/safetensors.h" // dsc_st_file

struct dsc_ckpt {
    char path[DSC_CKPT_PATH_MAX]; // <dir>/<tag>
    dsc__manifest m;
    char *text;           // manifest.json
    dsc_st_file **shards; // (world), mapped
    const float **slices; // [(r * (1 + nmoments) + kind) * ngroups + g]: (slice,)
};

// Copy n elements of the saved flat layout, from offset off, of kind (0 master, 1 + k moment k).
// The range may span slices (and ranks) but must lie inside one group.
void dsc__ckpt_read_flat(const dsc_ckpt *ck, int kind, uint64_t off, size_t n, float *dst);

// Hash a whole file (XXH3) and return its size, reading it once.
dsc_status dsc__ckpt_hash_file(const char *path, uint64_t *bytes, uint64_t *xxh3);

#endif
