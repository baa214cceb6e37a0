// mem/pool_impl.h - the pool's structures, shared by the allocator (pool.c), the block map
// (block.c), the defragmenter (defrag.c) and the back ends (host.c, cuda.c).
//
// Block records live outside the arenas (device memory cannot hold headers, and moving a block
// must not move its bookkeeping). Every byte of every arena belongs to exactly one record, live or
// free; the records of an arena form a list in address order (prev/next), and the free records
// are also kept in size bins (fprev/fnext) with a bitmap of non-empty bins, so that best fit looks
// at two bins at most.
//
// Records sit in fixed segments that never move once published, so dsc_mem_ptr can read a record
// without the lock: segs[i] is written once (release) before any handle into it is handed out.
#ifndef DSC_MEM_POOL_IMPL_H
#define DSC_MEM_POOL_IMPL_H

#include <pthread.h>   // pthread_mutex_t
#include <stdatomic.h> // _Atomic
#include <stdbool.h>   // bool
#include <stddef.h>    // size_t
#include <stdint.h>    // uint32_t, uintptr_t

#include "dsc/memory.h" // dsc_mem_pool, dsc_mem_stats

#define MEM_NIL UINT32_MAX
#define MEM_SEG_SHIFT 12 // records per segment: 4096
#define MEM_SEG_SIZE (1u << MEM_SEG_SHIFT)
#define MEM_SEG_MAX 4095u        // segments; records stay below 2^24 - 1
#define MEM_HANDLE_INDEX_BITS 24 // handle = gen << 24 | (record index + 1)
#define MEM_NBINS 448            // bins cover every size below 2^64
#define MEM_BIN_WORDS ((MEM_NBINS + 63) / 64)
#define MEM_SMALL_MAX ((size_t)256 << 10) // requests up to this size round to a size class
#define MEM_HOST_ALIGN 64
#define MEM_DEVICE_ALIGN 256

typedef struct mem_block {
    uintptr_t addr;        // first byte (host or device address)
    size_t size;           // bytes, a multiple of the pool's alignment
    uint32_t prev, next;   // neighbours in address order within the arena; MEM_NIL at the ends
    uint32_t fprev, fnext; // free: neighbours in its bin; recycled record: fnext = next spare
    uint32_t chunk;        // arena index
    uint32_t handle;       // live: its handle (never 0); free or spare: 0
    uint32_t tag;          // live: index into pool->tags
    uint16_t bin;          // free: its bin
    uint8_t gen;           // bumped each time the record becomes live, so stale handles miss
    uint8_t is_free;
} mem_block;

typedef struct mem_chunk {
    uintptr_t base;
    size_t size;
    uint32_t first; // record at offset 0
    bool used;      // false: the slot's arena was returned (dsc_mem_trim) and may be reused
} mem_chunk;

typedef struct mem_tag {
    char name[DSC_MEM_TAG_MAX];
    size_t bytes;
    uint64_t blocks;
} mem_tag;

// A back end provides arenas and moves bytes inside them.
typedef struct dsc__mem_backend {
    const char *name;
    // Obtain `bytes` of fresh arena; the message names the pool and the system's reason.
    dsc_status (*reserve)(dsc_mem_pool *p, size_t bytes, uintptr_t *base);
    void (*release)(dsc_mem_pool *p, uintptr_t base, size_t bytes);
    // Copy `bytes` from src down to dst (dst < src); the ranges may overlap.
    dsc_status (*move)(dsc_mem_pool *p, uintptr_t dst, uintptr_t src, size_t bytes);
    // Wait until every move issued so far has completed (NULL: moves are synchronous).
    dsc_status (*sync)(dsc_mem_pool *p);
    // Release back-end state kept in the pool (NULL: none).
    void (*fini)(dsc_mem_pool *p);
} dsc__mem_backend;

struct dsc_mem_pool {
    pthread_mutex_t mu;
    const dsc__mem_backend *be;
    char name[64];
    int device;
    size_t align;
    size_t capacity;    // 0: grows on demand
    size_t chunk_bytes; // growth step when capacity == 0
    bool pinned;        // asked for page-locked arenas
    bool pinned_ok;     // every arena so far is page-locked
    bool defrag_on_oom;
    void *stream;   // device: borrowed cudaStream_t
    void *be_state; // back-end private (device staging buffer)

    // Records: segments published atomically for the lock-free readers.
    _Atomic(mem_block *) segs[MEM_SEG_MAX];
    uint32_t nsegs; // segments published
    uint32_t nrec;  // records ever created (<= nsegs * MEM_SEG_SIZE)
    uint32_t spare; // stack of recycled records (linked by fnext)

    mem_chunk *chunks;
    uint32_t nchunks, chunks_cap;

    uint32_t bin_head[MEM_NBINS];
    uint64_t bin_map[MEM_BIN_WORDS];

    mem_tag *tags;
    uint32_t ntags, tags_cap;
    uint32_t *tag_index; // open addressing: tag id + 1, 0 = empty
    uint32_t tag_index_cap;

    dsc_mem_stats st; // counters; largest_free_block and fragmentation are computed on demand
    _Atomic uint64_t generation;
    double last_defrag; // caller's clock; NAN until the first maybe_defragment
};

// ---- block map (block.c); the caller holds p->mu ----

static inline mem_block *dsc__mem_rec(const dsc_mem_pool *p, uint32_t i) {
    mem_block *seg =
        atomic_load_explicit(&((dsc_mem_pool *)p)->segs[i >> MEM_SEG_SHIFT], memory_order_acquire);
    return &seg[i & (MEM_SEG_SIZE - 1)];
}

unsigned dsc__mem_bin_of(size_t size);
size_t dsc__mem_bin_floor(unsigned bin);
// The block size that serves a request of `bytes` (alignment and size class); 0 on overflow.
size_t dsc__mem_round(const dsc_mem_pool *p, size_t bytes);
// A record from the spare stack or a new one (its fields are reset); MEM_NIL when none is left.
uint32_t dsc__mem_rec_new(dsc_mem_pool *p);
void dsc__mem_rec_release(dsc_mem_pool *p, uint32_t i);
// Makes sure `n` records can be created without failing (grows the segments).
bool dsc__mem_rec_reserve(dsc_mem_pool *p, uint32_t n);
void dsc__mem_bin_insert(dsc_mem_pool *p, uint32_t i);
void dsc__mem_bin_remove(dsc_mem_pool *p, uint32_t i);
// Smallest free block of at least `size` bytes (lowest address among equals); MEM_NIL if none.
uint32_t dsc__mem_find_fit(const dsc_mem_pool *p, size_t size);
size_t dsc__mem_largest_free(const dsc_mem_pool *p);
// Turns the free block i into a live block of exactly `size` bytes, splitting off the rest as a
// free block (a spare record must be available: dsc__mem_rec_reserve(p, 1)).
void dsc__mem_carve(dsc_mem_pool *p, uint32_t i, size_t size);
// Marks the live block i free, merges it with free neighbours and bins the result.
void dsc__mem_release_block(dsc_mem_pool *p, uint32_t i);
// Adds a fresh arena as one free block and returns that block; MEM_NIL when no record or arena
// slot could be made.
uint32_t dsc__mem_add_chunk(dsc_mem_pool *p, uintptr_t base, size_t size);
// Grows the pool by an arena able to hold `size` bytes (pools without capacity) and returns its
// free block in *blk.
dsc_status dsc__mem_grow(dsc_mem_pool *p, size_t size, uint32_t *blk);

// ---- defragmentation (defrag.c); the caller holds p->mu ----

// Packs the live blocks (see dsc_mem_defragment) and counts the compaction.
dsc_status dsc__mem_compact(dsc_mem_pool *p, size_t *bytes_moved);
// 1 - largest free block / free bytes; 0 without free space.
double dsc__mem_fragmentation(const dsc_mem_pool *p, size_t *largest);

// Checks every structural invariant (tiling, bins, counters); returns false and describes the
// first violation in msg. For tests.
bool dsc__mem_check(dsc_mem_pool *p, char *msg, size_t msglen);

// ---- back ends ----
extern const dsc__mem_backend dsc__mem_host_backend;
#ifdef DSC_WITH_CUDA
extern const dsc__mem_backend dsc__mem_cuda_backend;
#endif

#endif
