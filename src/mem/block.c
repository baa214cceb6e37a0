// mem/block.c - the block map of a pool: records, size bins, best fit, split and merge.
//
// Bins: sizes are counted in 64-byte units u. Units below 16 have a bin each; above, every power
// of two [2^e, 2^(e+1)) is cut into 8 bins of equal width, so the blocks of one bin differ by less
// than 12.5%. A request of size s (bin b) is served by the smallest block of at least s in bin b,
// or else by the smallest block of the next non-empty bin (found with the bitmap): every block of
// a higher bin is larger than every block of bin b, so this is exactly the best fit.
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, realloc
#include <string.h> // memset

#include "base/status.h"   // DSC_ASSERT
#include "mem/pool_impl.h" // dsc_mem_pool internals

#define UNIT_SHIFT 6 // bins count 64-byte units

unsigned dsc__mem_bin_of(size_t size) {
    size_t u = size >> UNIT_SHIFT;
    if (u < 16) return (unsigned)u;
    unsigned e = 63u - (unsigned)__builtin_clzll((unsigned long long)u); // e >= 4
    unsigned m = (unsigned)(u >> (e - 3)) & 7u;
    return 16u + (e - 4u) * 8u + m;
}

size_t dsc__mem_bin_floor(unsigned bin) {
    if (bin < 16) return (size_t)bin << UNIT_SHIFT;
    unsigned e = (bin - 16u) / 8u + 4u, m = (bin - 16u) % 8u;
    return ((size_t)(8u + m) << (e - 3u)) << UNIT_SHIFT;
}

size_t dsc__mem_round(const dsc_mem_pool *p, size_t bytes) {
    if (bytes > SIZE_MAX / 4) return 0;
    if (bytes == 0) bytes = 1;
    size_t a = p->align, s = (bytes + a - 1) & ~(a - 1);
    if (s <= MEM_SMALL_MAX) {
        unsigned b = dsc__mem_bin_of(s);
        if (dsc__mem_bin_floor(b) < s) s = dsc__mem_bin_floor(b + 1); // next size class
        s = (s + a - 1) & ~(a - 1);
    }
    return s;
}

// ---- records ----

bool dsc__mem_rec_reserve(dsc_mem_pool *p, uint32_t n) {
    uint32_t spare = 0;
    for (uint32_t i = p->spare; i != MEM_NIL && spare < n; i = dsc__mem_rec(p, i)->fnext) spare++;
    while (spare + (p->nsegs * MEM_SEG_SIZE - p->nrec) < n) {
        if (p->nsegs == MEM_SEG_MAX) return false;
        mem_block *seg = calloc(MEM_SEG_SIZE, sizeof *seg);
        if (!seg) return false;
        // Published before any handle into it exists: readers that see a handle see the segment.
        atomic_store_explicit(&p->segs[p->nsegs], seg, memory_order_release);
        p->nsegs++;
    }
    return true;
}

uint32_t dsc__mem_rec_new(dsc_mem_pool *p) {
    uint32_t i;
    if (p->spare != MEM_NIL) {
        i = p->spare;
        p->spare = dsc__mem_rec(p, i)->fnext;
    } else {
        if (!dsc__mem_rec_reserve(p, 1)) return MEM_NIL;
        i = p->nrec++;
    }
    mem_block *b = dsc__mem_rec(p, i);
    uint8_t gen = b->gen;
    memset(b, 0, sizeof *b);
    b->gen = gen;
    b->prev = b->next = b->fprev = b->fnext = MEM_NIL;
    return i;
}

void dsc__mem_rec_release(dsc_mem_pool *p, uint32_t i) {
    mem_block *b = dsc__mem_rec(p, i);
    b->handle = 0;
    b->is_free = 0;
    b->fnext = p->spare;
    p->spare = i;
}

// ---- bins ----

void dsc__mem_bin_insert(dsc_mem_pool *p, uint32_t i) {
    mem_block *b = dsc__mem_rec(p, i);
    unsigned bin = dsc__mem_bin_of(b->size);
    b->is_free = 1;
    b->bin = (uint16_t)bin;
    b->fprev = MEM_NIL;
    b->fnext = p->bin_head[bin];
    if (b->fnext != MEM_NIL) dsc__mem_rec(p, b->fnext)->fprev = i;
    p->bin_head[bin] = i;
    p->bin_map[bin / 64] |= 1ull << (bin % 64);
}

void dsc__mem_bin_remove(dsc_mem_pool *p, uint32_t i) {
    mem_block *b = dsc__mem_rec(p, i);
    unsigned bin = b->bin;
    if (b->fprev != MEM_NIL)
        dsc__mem_rec(p, b->fprev)->fnext = b->fnext;
    else
        p->bin_head[bin] = b->fnext;
    if (b->fnext != MEM_NIL) dsc__mem_rec(p, b->fnext)->fprev = b->fprev;
    if (p->bin_head[bin] == MEM_NIL) p->bin_map[bin / 64] &= ~(1ull << (bin % 64));
    b->is_free = 0;
    b->fprev = b->fnext = MEM_NIL;
}

// First non-empty bin at or above `from`; MEM_NBINS when none.
static unsigned next_bin(const dsc_mem_pool *p, unsigned from) {
    for (unsigned w = from / 64; from < MEM_NBINS && w < MEM_BIN_WORDS; w++) {
        uint64_t bits = p->bin_map[w];
        if (w == from / 64) bits &= ~0ull << (from % 64);
        if (bits) return w * 64 + (unsigned)__builtin_ctzll(bits);
    }
    return MEM_NBINS;
}

// True when block a is a better fit than block b for the same request: smaller, or as small and
// earlier in the arenas (keeps live data low, which makes compaction cheaper).
static bool better(const mem_block *a, const mem_block *b) {
    if (a->size != b->size) return a->size < b->size;
    if (a->chunk != b->chunk) return a->chunk < b->chunk;
    return a->addr < b->addr;
}

static uint32_t best_in_bin(const dsc_mem_pool *p, unsigned bin, size_t size) {
    uint32_t best = MEM_NIL;
    const mem_block *bb = NULL;
    for (uint32_t i = p->bin_head[bin]; i != MEM_NIL;) {
        const mem_block *b = dsc__mem_rec(p, i);
        if (b->size >= size && (!bb || better(b, bb))) {
            best = i;
            bb = b;
        }
        i = b->fnext;
    }
    return best;
}

uint32_t dsc__mem_find_fit(const dsc_mem_pool *p, size_t size) {
    unsigned bin = dsc__mem_bin_of(size);
    uint32_t i = best_in_bin(p, bin, size);
    if (i != MEM_NIL) return i;
    unsigned nb = next_bin(p, bin + 1);
    return nb < MEM_NBINS ? best_in_bin(p, nb, 0) : MEM_NIL;
}

size_t dsc__mem_largest_free(const dsc_mem_pool *p) {
    for (unsigned w = MEM_BIN_WORDS; w-- > 0;) {
        if (!p->bin_map[w]) continue;
        unsigned bin = w * 64 + 63u - (unsigned)__builtin_clzll(p->bin_map[w]);
        size_t best = 0;
        for (uint32_t i = p->bin_head[bin]; i != MEM_NIL; i = dsc__mem_rec(p, i)->fnext)
            if (dsc__mem_rec(p, i)->size > best) best = dsc__mem_rec(p, i)->size;
        return best;
    }
    return 0;
}

// ---- split and merge ----

void dsc__mem_carve(dsc_mem_pool *p, uint32_t i, size_t size) {
    mem_block *b = dsc__mem_rec(p, i);
    dsc__mem_bin_remove(p, i);
    if (b->size == size) return;
    uint32_t r = dsc__mem_rec_new(p);
    DSC_ASSERT(r != MEM_NIL); // the caller reserved one
    mem_block *rb = dsc__mem_rec(p, r);
    rb->addr = b->addr + size;
    rb->size = b->size - size;
    rb->chunk = b->chunk;
    rb->prev = i;
    rb->next = b->next;
    if (b->next != MEM_NIL) dsc__mem_rec(p, b->next)->prev = r;
    b->next = r;
    b->size = size;
    dsc__mem_bin_insert(p, r);
}

// Absorbs block n, the successor of i, into i. Neither may be in a bin.
static void absorb_next(dsc_mem_pool *p, uint32_t i, uint32_t n) {
    mem_block *b = dsc__mem_rec(p, i), *nb = dsc__mem_rec(p, n);
    b->size += nb->size;
    b->next = nb->next;
    if (nb->next != MEM_NIL) dsc__mem_rec(p, nb->next)->prev = i;
    dsc__mem_rec_release(p, n);
}

void dsc__mem_release_block(dsc_mem_pool *p, uint32_t i) {
    mem_block *b = dsc__mem_rec(p, i);
    b->handle = 0;
    uint32_t n = b->next;
    if (n != MEM_NIL && dsc__mem_rec(p, n)->is_free) {
        dsc__mem_bin_remove(p, n);
        absorb_next(p, i, n);
    }
    uint32_t pr = b->prev;
    if (pr != MEM_NIL && dsc__mem_rec(p, pr)->is_free) {
        dsc__mem_bin_remove(p, pr);
        absorb_next(p, pr, i);
        i = pr;
    }
    dsc__mem_bin_insert(p, i);
}

uint32_t dsc__mem_add_chunk(dsc_mem_pool *p, uintptr_t base, size_t size) {
    uint32_t c = 0;
    while (c < p->nchunks && p->chunks[c].used) c++;
    if (c == p->nchunks && p->nchunks == p->chunks_cap) {
        uint32_t cap = p->chunks_cap ? 2 * p->chunks_cap : 16;
        mem_chunk *nc = realloc(p->chunks, cap * sizeof *nc);
        if (!nc) return MEM_NIL;
        p->chunks = nc;
        p->chunks_cap = cap;
    }
    uint32_t i = dsc__mem_rec_new(p);
    if (i == MEM_NIL) return MEM_NIL;
    if (c == p->nchunks) p->nchunks++;
    mem_block *b = dsc__mem_rec(p, i);
    b->addr = base;
    b->size = size;
    b->chunk = c;
    p->chunks[c] = (mem_chunk){.base = base, .size = size, .first = i, .used = true};
    dsc__mem_bin_insert(p, i);
    return i;
}

// ---- consistency check (tests) ----

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(msg, msglen, __VA_ARGS__);                                                    \
            return false;                                                                          \
        }                                                                                          \
    } while (0)

// Walks one arena: records tile it exactly, in order, no two free neighbours, live records carry
// their own handle. Adds to the running totals.
static bool check_chunk(dsc_mem_pool *p, uint32_t c, size_t *live_bytes, uint64_t *live,
                        uint64_t *nfree, char *msg, size_t msglen) {
    const mem_chunk *ch = &p->chunks[c];
    uintptr_t at = ch->base;
    uint32_t prev = MEM_NIL, steps = 0;
    bool prev_free = false;
    for (uint32_t i = ch->first; i != MEM_NIL; i = dsc__mem_rec(p, i)->next) {
        CHECK(i < p->nrec && ++steps <= p->nrec, "chunk %u: bad record %u", c, i);
        const mem_block *b = dsc__mem_rec(p, i);
        CHECK(b->chunk == c && b->prev == prev, "record %u: chunk %u prev %u", i, b->chunk,
              b->prev);
        CHECK(b->addr == at, "record %u: address gap in chunk %u", i, c);
        CHECK(b->size > 0 && b->size % p->align == 0, "record %u: size %zu", i, b->size);
        if (b->is_free) {
            CHECK(!prev_free, "records %u, %u: adjacent free blocks", prev, i);
            CHECK(b->handle == 0, "free record %u has a handle", i);
            (*nfree)++;
        } else {
            CHECK(b->handle != 0 && (b->handle & 0xFFFFFFu) == i + 1 && (b->handle >> 24) == b->gen,
                  "live record %u: handle 0x%x", i, b->handle);
            CHECK(b->tag < p->ntags, "live record %u: tag %u", i, b->tag);
            (*live)++;
            *live_bytes += b->size;
        }
        prev_free = b->is_free;
        at += b->size;
        prev = i;
    }
    CHECK(at == ch->base + ch->size, "chunk %u: records cover %zu of %zu bytes", c,
          (size_t)(at - ch->base), ch->size);
    return true;
}

static bool check_bins(dsc_mem_pool *p, uint64_t *binned, char *msg, size_t msglen) {
    for (unsigned bin = 0; bin < MEM_NBINS; bin++) {
        bool bit = (p->bin_map[bin / 64] >> (bin % 64)) & 1;
        CHECK(bit == (p->bin_head[bin] != MEM_NIL), "bin %u: bitmap disagrees", bin);
        uint32_t prev = MEM_NIL;
        for (uint32_t i = p->bin_head[bin]; i != MEM_NIL; i = dsc__mem_rec(p, i)->fnext) {
            const mem_block *b = dsc__mem_rec(p, i);
            CHECK(++*binned <= p->nrec, "bin %u: cycle", bin);
            CHECK(b->is_free && b->bin == bin && dsc__mem_bin_of(b->size) == bin &&
                      b->fprev == prev,
                  "bin %u: record %u misfiled", bin, i);
            prev = i;
        }
    }
    return true;
}

bool dsc__mem_check(dsc_mem_pool *p, char *msg, size_t msglen) {
    size_t reserved = 0, live_bytes = 0, tag_bytes = 0;
    uint64_t live = 0, nfree = 0, binned = 0, tag_blocks = 0;
    for (uint32_t c = 0; c < p->nchunks; c++) {
        if (!p->chunks[c].used) continue;
        if (!check_chunk(p, c, &live_bytes, &live, &nfree, msg, msglen)) return false;
        reserved += p->chunks[c].size;
    }
    if (!check_bins(p, &binned, msg, msglen)) return false;
    CHECK(binned == nfree, "%llu free blocks, %llu in bins", (unsigned long long)nfree,
          (unsigned long long)binned);
    CHECK(reserved == p->st.reserved, "reserved %zu, arenas %zu", p->st.reserved, reserved);
    CHECK(live_bytes == p->st.allocated, "allocated %zu, live blocks hold %zu", p->st.allocated,
          live_bytes);
    CHECK(live == p->st.live_blocks, "live_blocks %llu, counted %llu",
          (unsigned long long)p->st.live_blocks, (unsigned long long)live);
    for (uint32_t t = 0; t < p->ntags; t++) {
        tag_bytes += p->tags[t].bytes;
        tag_blocks += p->tags[t].blocks;
    }
    CHECK(tag_bytes == live_bytes && tag_blocks == live, "tag totals %zu bytes, %llu blocks",
          tag_bytes, (unsigned long long)tag_blocks);
    return true;
}
