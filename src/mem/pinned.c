// mem/pinned.c - the pinned host pool for offload and double buffers.
//
// Offload moves optimizer state and gradients between device and host every step. Pinning and
// unpinning per step costs milliseconds and jitters, so the pool is page-locked once, at creation,
// with its whole capacity, and buffers are carved from it by the ordinary allocator. A double
// buffer lets the caller fill one half while the other is in flight.
#include <string.h> // memset

#include "base/status.h"   // dsc__fail
#include "mem/pool_impl.h" // dsc_mem_pool

dsc_status dsc_pinned_pool_create(dsc_mem_pool **out, size_t bytes, const char *name) {
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_pinned_pool_create: out is NULL");
    *out = NULL;
    if (bytes == 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "pinned pool: the size must be known at start "
                                              "(got 0 bytes); size it for the offloaded buffers");
    // Buffers of this pool are targets of asynchronous copies: never move them implicitly.
    dsc_mem_opts o = {
        .name = name ? name : "pinned pool", .pinned = true, .no_defrag_on_oom = true};
    return dsc_mem_pool_create(out, DSC_MEM_HOST, bytes, &o);
}

dsc_status dsc_mem_double_buffer_init(dsc_mem_double_buffer *db, dsc_mem_pool *p, size_t bytes,
                                      const char *tag) {
    if (!db || !p)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_mem_double_buffer_init: NULL argument");
    memset(db, 0, sizeof *db);
    db->pool = p;
    db->bytes = bytes;
    for (int h = 0; h < 2; h++) {
        dsc_status st = dsc_mem_alloc(p, bytes, tag, &db->half[h]);
        if (st != DSC_OK) {
            dsc_mem_double_buffer_release(db);
            return st;
        }
    }
    return DSC_OK;
}

void *dsc_mem_double_buffer_next(dsc_mem_double_buffer *db) {
    if (!db || !db->pool) return NULL;
    return dsc_mem_ptr(db->pool, db->half[db->turn++ & 1u]);
}

void dsc_mem_double_buffer_release(dsc_mem_double_buffer *db) {
    if (!db || !db->pool) return;
    for (int h = 0; h < 2; h++) dsc_mem_free(db->pool, db->half[h]);
    memset(db, 0, sizeof *db);
}
