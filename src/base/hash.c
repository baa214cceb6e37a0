// base/hash.c - XXH3-64 checksums through Debian's libxxhash.
#include "base/hash.h"

#include <xxhash.h> // XXH3_*

uint64_t dsc_hash64(const void *data, size_t n) { return XXH3_64bits(data, n); }

dsc_hasher *dsc_hasher_create(void) {
    XXH3_state_t *s = XXH3_createState();
    if (s) XXH3_64bits_reset(s);
    return (dsc_hasher *)s;
}

void dsc_hasher_update(dsc_hasher *h, const void *data, size_t n) {
    XXH3_64bits_update((XXH3_state_t *)h, data, n);
}

uint64_t dsc_hasher_digest(const dsc_hasher *h) {
    return XXH3_64bits_digest((const XXH3_state_t *)h);
}

void dsc_hasher_destroy(dsc_hasher *h) { XXH3_freeState((XXH3_state_t *)h); }
