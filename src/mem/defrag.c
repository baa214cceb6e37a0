// mem/defrag.c - compaction of a pool, the periodic policy, and returning empty arenas.
//
// Compaction visits the live blocks in arena order (arena index, then address) and places each at
// a cursor that starts at the beginning of the first arena; a block that does not fit in the rest
// of the cursor's arena sends the cursor to the start of the next one. The cursor never passes the
// block being placed (a block always fits where it already is), so every block moves down or
// stays, and a move only overwrites free space or the block's own old bytes: one forward pass,
// no scratch memory. Afterwards each arena holds its live blocks back to back followed by at most
// one free block; a pool with a capacity has one arena, so its free space is one block.
#include <math.h>   // isnan
#include <stdlib.h> // malloc, free

#include "base/status.h"   // dsc__fail, DSC_ASSERT
#include "mem/pool_impl.h" // dsc_mem_pool internals

double dsc__mem_fragmentation(const dsc_mem_pool *p, size_t *largest) {
    size_t lf = dsc__mem_largest_free(p), total = p->st.reserved - p->st.allocated;
    if (largest) *largest = lf;
    return total ? 1.0 - (double)lf / (double)total : 0.0;
}

// Live records in arena order; the free records go back to the spare stack.
static uint32_t *collect_live(dsc_mem_pool *p) {
    uint32_t *order = malloc((p->st.live_blocks + 1) * sizeof *order), n = 0;
    if (!order) return NULL;
    for (uint32_t c = 0; c < p->nchunks; c++) {
        if (!p->chunks[c].used) continue;
        for (uint32_t i = p->chunks[c].first, next; i != MEM_NIL; i = next) {
            mem_block *b = dsc__mem_rec(p, i);
            next = b->next;
            if (!b->is_free) {
                order[n++] = i;
                continue;
            }
            dsc__mem_bin_remove(p, i);
            dsc__mem_rec_release(p, i);
        }
        p->chunks[c].first = MEM_NIL;
    }
    DSC_ASSERT(n == p->st.live_blocks);
    return order;
}

static uint32_t next_used(const dsc_mem_pool *p, uint32_t c) {
    while (c < p->nchunks && !p->chunks[c].used) c++;
    return c;
}

// Ends arena c after its last live block `tail` at offset `off`: the rest becomes one free block.
static void close_chunk(dsc_mem_pool *p, uint32_t c, size_t off, uint32_t tail) {
    mem_chunk *ch = &p->chunks[c];
    if (off == ch->size) return;
    uint32_t r = dsc__mem_rec_new(p);
    DSC_ASSERT(r != MEM_NIL); // reserved before compaction started
    mem_block *b = dsc__mem_rec(p, r);
    b->addr = ch->base + off;
    b->size = ch->size - off;
    b->chunk = c;
    b->prev = tail;
    if (tail != MEM_NIL)
        dsc__mem_rec(p, tail)->next = r;
    else
        ch->first = r;
    dsc__mem_bin_insert(p, r);
}

// Places the live blocks of `order` as described at the top of the file.
static dsc_status pack(dsc_mem_pool *p, const uint32_t *order, uint64_t n, size_t *moved) {
    uint32_t cc = next_used(p, 0), tail = MEM_NIL;
    size_t off = 0;
    for (uint64_t k = 0; k < n; k++) {
        uint32_t i = order[k];
        mem_block *b = dsc__mem_rec(p, i);
        while (off + b->size > p->chunks[cc].size) {
            close_chunk(p, cc, off, tail);
            cc = next_used(p, cc + 1);
            off = 0;
            tail = MEM_NIL;
            DSC_ASSERT(cc <= b->chunk);
        }
        uintptr_t dst = p->chunks[cc].base + off;
        if (dst != b->addr) {
            DSC_ASSERT(cc < b->chunk || dst < b->addr);
            DSC_TRY(p->be->move(p, dst, b->addr, b->size));
            *moved += b->size;
            b->addr = dst;
        }
        b->chunk = cc;
        b->prev = tail;
        b->next = MEM_NIL;
        if (tail != MEM_NIL)
            dsc__mem_rec(p, tail)->next = i;
        else
            p->chunks[cc].first = i;
        tail = i;
        off += b->size;
    }
    for (; cc < p->nchunks; cc = next_used(p, cc + 1), off = 0, tail = MEM_NIL)
        close_chunk(p, cc, off, tail);
    return DSC_OK;
}

dsc_status dsc__mem_compact(dsc_mem_pool *p, size_t *bytes_moved) {
    size_t moved = 0;
    if (!dsc__mem_rec_reserve(p, p->nchunks))
        return dsc__fail(DSC_ERR_OOM, "%s: out of host memory for the defragmenter", p->name);
    uint32_t *order = collect_live(p);
    if (!order)
        return dsc__fail(DSC_ERR_OOM, "%s: out of host memory for the defragmenter", p->name);
    dsc_status st = pack(p, order, p->st.live_blocks, &moved);
    free(order);
    if (st == DSC_OK && p->be->sync) st = p->be->sync(p);
    if (st != DSC_OK) {
        dsc__error_prefix("%s: defragmentation failed, the pool's contents are lost: ", p->name);
        return st;
    }
    p->st.defrag_count++;
    p->st.defrag_bytes_moved += moved;
    if (moved) atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (bytes_moved) *bytes_moved = moved;
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc_mem_defragment(dsc_mem_pool *p, size_t *bytes_moved) {
    if (bytes_moved) *bytes_moved = 0;
    if (!p) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_mem_defragment: pool is NULL");
    pthread_mutex_lock(&p->mu);
    dsc_status st = dsc__mem_compact(p, bytes_moved);
    pthread_mutex_unlock(&p->mu);
    return st;
}

dsc_status dsc_mem_maybe_defragment(dsc_mem_pool *p, double now, double interval_s,
                                    double threshold, bool *did) {
    if (did) *did = false;
    if (!p) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_mem_maybe_defragment: pool is NULL");
    dsc_status st = DSC_OK;
    pthread_mutex_lock(&p->mu);
    if (isnan(p->last_defrag)) {
        p->last_defrag = now; // the clock starts at the first call
    } else if (now - p->last_defrag >= interval_s && dsc__mem_fragmentation(p, NULL) > threshold) {
        st = dsc__mem_compact(p, NULL);
        p->last_defrag = now;
        if (did) *did = st == DSC_OK;
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

size_t dsc_mem_trim(dsc_mem_pool *p) {
    size_t released = 0;
    if (!p || p->capacity > 0) return 0;
    pthread_mutex_lock(&p->mu);
    for (uint32_t c = 0; c < p->nchunks; c++) {
        mem_chunk *ch = &p->chunks[c];
        if (!ch->used) continue;
        mem_block *b = dsc__mem_rec(p, ch->first);
        if (!b->is_free || b->size != ch->size) continue;
        dsc__mem_bin_remove(p, ch->first);
        dsc__mem_rec_release(p, ch->first);
        p->be->release(p, ch->base, ch->size);
        ch->used = false;
        ch->first = MEM_NIL;
        p->st.reserved -= ch->size;
        p->st.system_frees++;
        released += ch->size;
    }
    pthread_mutex_unlock(&p->mu);
    return released;
}
