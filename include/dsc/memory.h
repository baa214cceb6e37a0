// dsc/memory.h - memory pools: a caching allocator with movable handles, a defragmenter,
// statistics, and page-locked host memory for offload.
//
// A pool owns large arenas of one device (DSC_MEM_HOST = -1, or a CUDA device >= 0) and carves
// them into blocks. A block is named by a handle, never by its address, so that the pool can move
// it: dsc_mem_defragment() packs the live blocks towards the start of the arenas and updates the
// handles. dsc_mem_ptr() turns a handle into an address, valid until the pool next moves blocks.
//
// Arenas: a pool created with a capacity reserves exactly that much, once, as one arena (the
// operating system backs host pages only when they are first touched); it never grows, and an
// allocation that does not fit is an out-of-memory error. A pool created with capacity 0 grows on
// demand in chunks (opts.chunk_bytes, or one chunk sized for a request larger than that). Arenas
// come from mmap (host) or cudaMalloc (device) and are returned only by dsc_mem_trim() and
// dsc_mem_pool_destroy(), so that a training step that repeats the allocations of the previous one
// makes no system allocation at all (stats: system_allocs, system_frees).
//
// Placement: requests are rounded up to the pool's alignment (64 bytes host, 256 bytes device);
// requests up to 256 KiB are rounded further to a size class (8 classes per power of two, at most
// 12.5% larger), so that a freed small block is reused exactly by the next request of its class.
// A request takes the smallest free block that fits (best fit, lowest address among equals) and
// splits off the rest; a freed block merges with its free neighbours.
//
// Moving blocks (SAFE POINTS): blocks move only in dsc_mem_defragment(),
// dsc_mem_maybe_defragment(), and in dsc_mem_alloc() when an allocation would otherwise fail
// (the pool compacts once and retries, unless opts.no_defrag_on_oom). The caller must call these
// only at a safe point: no other thread uses the pool, no kernel or copy that reads or writes the
// pool's memory is in flight, and addresses obtained from dsc_mem_ptr() before the call are
// re-read after it. dsc_mem_generation() changes whenever blocks moved, so a caller may cache
// addresses and refresh them when it changes. The engine's pool has no_defrag_on_oom: it moves
// blocks only between steps (dsc_engine_maintain, see dsc/engine.h).
//
// THREAD SAFETY: every pool has one mutex, held briefly by alloc, free, stats, top_users and
// trim; those may be called from any thread. dsc_mem_ptr() and dsc_mem_size() take no lock (they
// read one table entry that alloc/free of other blocks never change) and may run concurrently with
// alloc and free of other handles. Using a handle while another thread frees it is a bug.
// Defragmentation holds the mutex while it moves blocks, but it cannot stop another thread that
// is reading or writing block memory: see SAFE POINTS.
#ifndef DSC_MEMORY_H
#define DSC_MEMORY_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint32_t, uint64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_MEM_HOST (-1)  // the device number of host memory
#define DSC_MEM_TAG_MAX 48 // tags are copied and cut to DSC_MEM_TAG_MAX - 1 characters

typedef struct dsc_mem_pool dsc_mem_pool;
// 0 = none. A freed handle stays invalid until its record has been reused 256 times.
typedef uint32_t dsc_mem_handle;

typedef struct dsc_mem_opts {
    const char *name;      // pool name for messages ("host pool", "cuda:0 pool"); NULL: derived
                           // from the device; copied
    size_t chunk_bytes;    // growth step of a pool without capacity; 0: 64 MiB host, 256 MiB device
    bool pinned;           // host only: page-lock the arenas (cudaHostRegister in CUDA builds,
                           // mlock otherwise; when that is refused the memory stays pageable and
                           // one note is logged: see dsc_mem_pool_pinned)
    bool no_defrag_on_oom; // true: an allocation that does not fit fails without compacting
    void *stream;          // device only: the cudaStream_t that moves are issued on; NULL: the
                           // default stream. Borrowed for the life of the pool.
} dsc_mem_opts;

// Statistics of one pool. Every field is exact at the moment of the call. (The type is named
// dsc_mem_stats because C gives types and functions one namespace, and dsc_memory_stats is the
// function below; `struct dsc_memory_stats` names it too.)
typedef struct dsc_memory_stats {
    size_t allocated;          // bytes in live blocks (each rounded up as described above)
    size_t reserved;           // bytes of the arenas; reserved - allocated is the free space
    size_t peak_allocated;     // largest `allocated` since creation or dsc_mem_reset_peak
    size_t largest_free_block; // bytes
    double fragmentation; // 1 - largest_free_block / (reserved - allocated); 0 when no free space
    uint64_t live_blocks; // blocks allocated and not freed
    uint64_t alloc_count, free_count; // successful dsc_mem_alloc / dsc_mem_free calls
    uint64_t defrag_count;            // compactions (explicit, periodic, or before an OOM)
    uint64_t defrag_bytes_moved;
    uint64_t oom_count;                   // allocations that failed
    uint64_t system_allocs, system_frees; // arenas (and the device staging buffer of the
                                          // defragmenter) obtained from / returned to the system
} dsc_mem_stats;

// One tag's share of a pool (dsc_mem_top_users).
typedef struct dsc_mem_user {
    char tag[DSC_MEM_TAG_MAX];
    size_t bytes;    // allocated bytes of the live blocks with this tag
    uint64_t blocks; // number of such blocks
} dsc_mem_user;

// ---- pools ----

// device: DSC_MEM_HOST or a CUDA device (DSC_ERR_UNSUPPORTED in builds without CUDA).
// capacity: bytes reserved at once as one arena (the pool never grows); 0: grow on demand.
// opts: NULL for the defaults (all fields zero).
dsc_status dsc_mem_pool_create(dsc_mem_pool **out, int device, size_t capacity,
                               const dsc_mem_opts *opts);
// Returns every arena to the system; handles still live are freed with it. destroy(NULL) is a
// no-op.
void dsc_mem_pool_destroy(dsc_mem_pool *p);
int dsc_mem_pool_device(const dsc_mem_pool *p);
const char *dsc_mem_pool_name(const dsc_mem_pool *p); // borrowed, lives as long as the pool
// True when the pool's arenas are page-locked (pinned pools where the system allowed it).
bool dsc_mem_pool_pinned(const dsc_mem_pool *p);

// ---- blocks ----

// A block of at least `bytes` bytes (0 is served as the smallest block), aligned to 64 bytes
// (host) or 256 bytes (device), contents undefined. tag names the user in statistics and
// out-of-memory messages ("zero.grad_partition"); copied; NULL = "untagged". On failure *out = 0
// and DSC_ERR_OOM with a message naming the request, the pool's state and its largest users.
// May move other blocks (see SAFE POINTS) unless opts.no_defrag_on_oom.
dsc_status dsc_mem_alloc(dsc_mem_pool *p, size_t bytes, const char *tag, dsc_mem_handle *out);
// Frees the block; h == 0 is a no-op. A handle that is not live (freed already) is logged and
// ignored. Handles are numbers private to their pool: passing one to another pool is a bug that
// cannot always be detected.
void dsc_mem_free(dsc_mem_pool *p, dsc_mem_handle h);
// The block's address: a host pointer, or a device pointer for device pools. Valid until blocks
// next move (dsc_mem_generation changes). NULL for 0 or a handle that is not live. Lock-free.
void *dsc_mem_ptr(dsc_mem_pool *p, dsc_mem_handle h);
// The block's usable size in bytes (>= the request); 0 for a handle that is not live. Lock-free.
size_t dsc_mem_size(const dsc_mem_pool *p, dsc_mem_handle h);
// Changes every time blocks move; addresses read under one value stay valid while it holds.
uint64_t dsc_mem_generation(const dsc_mem_pool *p);

// ---- defragmentation (call only at a safe point) ----

// Packs the live blocks towards the start of the arenas, in address order (memmove, or
// device-to-device copies synchronized before return), and updates the handles. Afterwards the
// free space of a pool with a capacity is one block (fragmentation 0). bytes_moved may be NULL.
dsc_status dsc_mem_defragment(dsc_mem_pool *p, size_t *bytes_moved);
// The periodic policy of the engine, called at step boundaries with the config keys
// memory.defrag_interval_s and memory.defrag_threshold: compacts when at least interval_s
// seconds (on the caller's clock `now`, e.g. dsc_now()) passed since the last compaction (or
// since the first call) and fragmentation exceeds threshold. did (may be NULL) tells whether it
// compacted.
dsc_status dsc_mem_maybe_defragment(dsc_mem_pool *p, double now, double interval_s,
                                    double threshold, bool *did);
// Returns arenas that hold no live block to the system (pools without capacity only; call after
// dsc_mem_defragment to release the most). Returns the bytes released.
size_t dsc_mem_trim(dsc_mem_pool *p);

// ---- statistics ----

dsc_status dsc_mem_pool_stats(const dsc_mem_pool *p, dsc_mem_stats *out);
// Sets peak_allocated to the current allocated bytes.
void dsc_mem_reset_peak(dsc_mem_pool *p);
// Fills out[0..n) with the tags holding the most memory, largest first; returns how many.
size_t dsc_mem_top_users(const dsc_mem_pool *p, dsc_mem_user *out, size_t n);
// Writes "zero.master 400.0 MiB, zero.grad 200.0 MiB, ..." (at most n tags) into buf; returns buf.
char *dsc_mem_format_top_users(const dsc_mem_pool *p, size_t n, char *buf, size_t buflen);
// Writes a byte count for people ("96.0 MiB", "512 B") into buf; returns buf.
char *dsc_mem_format_bytes(size_t bytes, char *buf, size_t buflen);

// ---- process-wide default pools ----

// The default pool of a device, created on first use (grows on demand). Borrowed: lives until
// dsc_mem_shutdown.
dsc_status dsc_mem_default_pool(int device, dsc_mem_pool **out);
// Statistics of the default pool of `device` (DSC_MEM_HOST for host); all zero when it was never
// used. Cheap: one short critical section and a scan of the largest size bin.
dsc_status dsc_memory_stats(int device, dsc_mem_stats *out);
// Destroys the default pools (end of the process, tests). Their handles become invalid.
void dsc_mem_shutdown(void);

// ---- pinned host memory for offload ----

// A page-locked host pool of exactly `bytes`, reserved and pinned once, here: nothing is pinned or
// unpinned afterwards. Use dsc_mem_alloc/dsc_mem_free on it like any pool. Where page-locking is
// refused (RLIMIT_MEMLOCK) the pool works with pageable memory and logs one note.
dsc_status dsc_pinned_pool_create(dsc_mem_pool **out, size_t bytes, const char *name);

// Two equal buffers of one pool used in turn: the caller fills one while the other is being
// transferred. Allocated once by init; next() allocates nothing.
typedef struct dsc_mem_double_buffer {
    dsc_mem_pool *pool; // borrowed
    dsc_mem_handle half[2];
    size_t bytes;  // size of each half
    unsigned turn; // number of next() calls so far
} dsc_mem_double_buffer;

dsc_status dsc_mem_double_buffer_init(dsc_mem_double_buffer *db, dsc_mem_pool *p, size_t bytes,
                                      const char *tag);
// The half to fill now: alternates 0, 1, 0, ... The other half is the one returned last time.
void *dsc_mem_double_buffer_next(dsc_mem_double_buffer *db);
void dsc_mem_double_buffer_release(dsc_mem_double_buffer *db); // frees both halves; idempotent

#ifdef __cplusplus
}
#endif
#endif
