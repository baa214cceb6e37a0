// base/hash.h - fast checksums (XXH3 from libxxhash).
#ifndef DSC_BASE_HASH_H
#define DSC_BASE_HASH_H
#include <stddef.h>
#include <stdint.h>

uint64_t dsc_hash64(const void *data, size_t n);

// Streaming form for files written in pieces.
typedef struct dsc_hasher dsc_hasher;
dsc_hasher *dsc_hasher_create(void); // NULL on OOM
void dsc_hasher_update(dsc_hasher *h, const void *data, size_t n);
uint64_t dsc_hasher_digest(const dsc_hasher *h);
void dsc_hasher_destroy(dsc_hasher *h);

#endif
