// mem/pool.c - memory pools: create/destroy, alloc/free through handles, statistics, tags and
// the out-of-memory message. The block map is in block.c, compaction in defrag.c.
#include <math.h>   // NAN
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, realloc
#include <string.h> // memcpy, memset, strlen

#include "base/log.h"      // DSC_WARN, DSC_DEBUG
#include "base/status.h"   // dsc__fail
#include "mem/pool_impl.h" // dsc_mem_pool internals

#define HOST_CHUNK ((size_t)64 << 20)
#define DEVICE_CHUNK ((size_t)256 << 20)
#define CHUNK_ROUND ((size_t)2 << 20) // a chunk sized for one large request rounds to 2 MiB
#define OOM_USERS 5                   // largest users named in an out-of-memory message

static void lock(const dsc_mem_pool *p) { pthread_mutex_lock(&((dsc_mem_pool *)p)->mu); }
static void unlock(const dsc_mem_pool *p) { pthread_mutex_unlock(&((dsc_mem_pool *)p)->mu); }

static dsc_mem_handle make_handle(uint8_t gen, uint32_t i) {
    return ((uint32_t)gen << MEM_HANDLE_INDEX_BITS) | (i + 1);
}

// The live record named by h, or NULL. Lock-free (see pool_impl.h).
static mem_block *live_block(const dsc_mem_pool *p, dsc_mem_handle h, uint32_t *index) {
    if (!p || h == 0) return NULL;
    uint32_t i = (h & ((1u << MEM_HANDLE_INDEX_BITS) - 1)) - 1;
    if (i >= MEM_SEG_MAX * MEM_SEG_SIZE) return NULL;
    mem_block *seg =
        atomic_load_explicit(&((dsc_mem_pool *)p)->segs[i >> MEM_SEG_SHIFT], memory_order_acquire);
    if (!seg) return NULL;
    mem_block *b = &seg[i & (MEM_SEG_SIZE - 1)];
    if (b->handle != h) return NULL;
    if (index) *index = i;
    return b;
}

// ---- tags ----

// FNV-1a of the tag's first `n` characters. Tags are short, so an inline loop beats a library call
// (the tag is looked up on every allocation).
static uint32_t tag_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static bool tag_index_grow(dsc_mem_pool *p) {
    uint32_t cap = p->tag_index_cap ? 2 * p->tag_index_cap : 64;
    uint32_t *idx = calloc(cap, sizeof *idx);
    if (!idx) return false;
    for (uint32_t t = 0; t < p->ntags; t++) {
        const char *s = p->tags[t].name;
        uint32_t j = tag_hash(s, strlen(s)) & (cap - 1);
        while (idx[j]) j = (j + 1) & (cap - 1);
        idx[j] = t + 1;
    }
    free(p->tag_index);
    p->tag_index = idx;
    p->tag_index_cap = cap;
    return true;
}

// True when the stored name equals the first n characters of tag (and has no more).
static bool tag_equal(const char *name, const char *tag, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (name[i] != tag[i]) return false;
    return name[n] == '\0';
}

// The id of a tag (interned, cut to DSC_MEM_TAG_MAX - 1 characters); MEM_NIL when out of memory.
static uint32_t tag_id(dsc_mem_pool *p, const char *tag) {
    if (!tag || !*tag) tag = "untagged";
    size_t n = 0;
    while (n < DSC_MEM_TAG_MAX - 1 && tag[n]) n++;
    if ((p->ntags + 1) * 2 > p->tag_index_cap && !tag_index_grow(p)) return MEM_NIL;
    uint32_t mask = p->tag_index_cap - 1, j = tag_hash(tag, n) & mask;
    for (; p->tag_index[j]; j = (j + 1) & mask)
        if (tag_equal(p->tags[p->tag_index[j] - 1].name, tag, n)) return p->tag_index[j] - 1;
    if (p->ntags == p->tags_cap) {
        uint32_t cap = p->tags_cap ? 2 * p->tags_cap : 16;
        mem_tag *nt = realloc(p->tags, cap * sizeof *nt);
        if (!nt) return MEM_NIL;
        p->tags = nt;
        p->tags_cap = cap;
    }
    mem_tag *t = &p->tags[p->ntags];
    memset(t, 0, sizeof *t);
    memcpy(t->name, tag, n);
    p->tag_index[j] = ++p->ntags;
    return p->ntags - 1;
}

// Inserts every tag with live blocks into out[0..n), kept sorted by bytes, largest first.
static size_t top_users_locked(const dsc_mem_pool *p, dsc_mem_user *out, size_t n) {
    size_t k = 0;
    for (uint32_t t = 0; t < p->ntags && n > 0; t++) {
        const mem_tag *tg = &p->tags[t];
        if (tg->blocks == 0) continue;
        if (k == n && tg->bytes <= out[n - 1].bytes) continue;
        size_t at = k < n ? k++ : n - 1;
        while (at > 0 && out[at - 1].bytes < tg->bytes) {
            out[at] = out[at - 1];
            at--;
        }
        memcpy(out[at].tag, tg->name, sizeof out[at].tag);
        out[at].bytes = tg->bytes;
        out[at].blocks = tg->blocks;
    }
    return k;
}

// ---- pools ----

static const dsc__mem_backend *backend_for(int device) {
    if (device == DSC_MEM_HOST) return &dsc__mem_host_backend;
#ifdef DSC_WITH_CUDA
    if (device >= 0) return &dsc__mem_cuda_backend;
#endif
    return NULL;
}

static dsc_status check_create_args(dsc_mem_pool **out, int device, const dsc_mem_opts *o) {
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_mem_pool_create: out is NULL");
    if (device < DSC_MEM_HOST)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "memory pool: device %d does not exist; use -1 "
                         "for host memory or a CUDA device number",
                         device);
    if (!backend_for(device))
        return dsc__fail(DSC_ERR_UNSUPPORTED,
                         "memory pool for device %d: this build of dsc has "
                         "no CUDA support; rebuild it with the CUDA toolkit, or use host memory "
                         "(device -1)",
                         device);
    if (o->pinned && device != DSC_MEM_HOST)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "memory pool for device %d: only host pools can "
                         "be pinned",
                         device);
    return DSC_OK;
}

dsc_status dsc_mem_pool_create(dsc_mem_pool **out, int device, size_t capacity,
                               const dsc_mem_opts *opts) {
    dsc_mem_opts o = opts ? *opts : (dsc_mem_opts){0};
    if (out) *out = NULL;
    DSC_TRY(check_create_args(out, device, &o));
    dsc_mem_pool *p = calloc(1, sizeof *p);
    if (!p) return dsc__fail(DSC_ERR_OOM, "memory pool: out of host memory for its bookkeeping");
    pthread_mutex_init(&p->mu, NULL);
    p->be = backend_for(device);
    p->device = device;
    p->align = device == DSC_MEM_HOST ? MEM_HOST_ALIGN : MEM_DEVICE_ALIGN;
    p->chunk_bytes = o.chunk_bytes            ? o.chunk_bytes
                     : device == DSC_MEM_HOST ? HOST_CHUNK
                                              : DEVICE_CHUNK;
    p->chunk_bytes = (p->chunk_bytes + p->align - 1) & ~(p->align - 1);
    p->pinned = p->pinned_ok = o.pinned;
    p->defrag_on_oom = !o.no_defrag_on_oom;
    p->stream = o.stream;
    p->spare = MEM_NIL;
    p->last_defrag = NAN;
    for (unsigned b = 0; b < MEM_NBINS; b++) p->bin_head[b] = MEM_NIL;
    if (o.name)
        snprintf(p->name, sizeof p->name, "%s", o.name);
    else if (device == DSC_MEM_HOST)
        snprintf(p->name, sizeof p->name, "%s pool", o.pinned ? "pinned" : "host");
    else
        snprintf(p->name, sizeof p->name, "cuda:%d pool", device);
    if (capacity > 0) {
        p->capacity = (capacity + p->align - 1) & ~(p->align - 1);
        uint32_t blk;
        dsc_status st = dsc__mem_grow(p, p->capacity, &blk);
        if (st != DSC_OK) {
            dsc_mem_pool_destroy(p);
            return st;
        }
    }
    *out = p;
    return DSC_OK;
}

void dsc_mem_pool_destroy(dsc_mem_pool *p) {
    if (!p) return;
    if (p->st.live_blocks > 0) {
        char users[256];
        DSC_DEBUG("mem", "%s destroyed with %llu live blocks; largest: %s", p->name,
                  (unsigned long long)p->st.live_blocks,
                  dsc_mem_format_top_users(p, 3, users, sizeof users));
    }
    for (uint32_t c = 0; c < p->nchunks; c++)
        if (p->chunks[c].used) p->be->release(p, p->chunks[c].base, p->chunks[c].size);
    if (p->be->fini) p->be->fini(p);
    for (uint32_t s = 0; s < p->nsegs; s++) free(atomic_load(&p->segs[s]));
    free(p->chunks);
    free(p->tags);
    free(p->tag_index);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

int dsc_mem_pool_device(const dsc_mem_pool *p) { return p ? p->device : DSC_MEM_HOST; }
const char *dsc_mem_pool_name(const dsc_mem_pool *p) { return p ? p->name : ""; }
bool dsc_mem_pool_pinned(const dsc_mem_pool *p) { return p && p->pinned && p->pinned_ok; }

dsc_status dsc__mem_grow(dsc_mem_pool *p, size_t size, uint32_t *blk) {
    size_t bytes = size;
    if (p->capacity == 0) {
        bytes = (size + CHUNK_ROUND - 1) & ~(CHUNK_ROUND - 1);
        if (bytes < p->chunk_bytes) bytes = p->chunk_bytes;
    }
    uintptr_t base;
    DSC_TRY(p->be->reserve(p, bytes, &base));
    *blk = dsc__mem_add_chunk(p, base, bytes);
    if (*blk == MEM_NIL) {
        p->be->release(p, base, bytes);
        return dsc__fail(DSC_ERR_OOM, "%s: out of host memory for its bookkeeping", p->name);
    }
    p->st.reserved += bytes;
    p->st.system_allocs++;
    return DSC_OK;
}

// ---- blocks ----

// Records the out-of-memory message: the request, the pool's state, its largest users, and what
// to do. `why` is the system's refusal when the pool tried to grow ("" otherwise).
static dsc_status oom(dsc_mem_pool *p, size_t bytes, const char *tag, const char *why) {
    char req[32], res[32], all[32], lf[32], users[320];
    dsc_mem_user top[OOM_USERS];
    size_t n = top_users_locked(p, top, OOM_USERS), at = 0;
    users[0] = '\0';
    for (size_t k = 0; k < n && at < sizeof users; k++) {
        int w = snprintf(users + at, sizeof users - at, "%s%s %s", k ? ", " : "", top[k].tag,
                         dsc_mem_format_bytes(top[k].bytes, res, sizeof res));
        if (w > 0) at += (size_t)w;
    }
    p->st.oom_count++;
    return dsc__fail(DSC_ERR_OOM,
                     "%s: out of memory allocating %s for %s: %s reserved%s, %s allocated, "
                     "largest free block %s%s%s; largest users: %s; free memory, lower the "
                     "micro-batch size or raise the pool's capacity",
                     p->name, dsc_mem_format_bytes(bytes, req, sizeof req), tag,
                     dsc_mem_format_bytes(p->st.reserved, res, sizeof res),
                     p->capacity ? " (the pool's capacity)" : "",
                     dsc_mem_format_bytes(p->st.allocated, all, sizeof all),
                     dsc_mem_format_bytes(dsc__mem_largest_free(p), lf, sizeof lf),
                     *why ? "; " : "", why, n ? users : "none");
}

// Finds a free block for `size` bytes: best fit, else a new arena (pools without capacity), else
// one compaction when the free space would suffice.
static dsc_status find_block(dsc_mem_pool *p, size_t bytes, size_t size, const char *tag,
                             uint32_t *out) {
    char why[200] = "";
    uint32_t i = dsc__mem_find_fit(p, size);
    if (i == MEM_NIL && p->capacity == 0) {
        dsc_status st = dsc__mem_grow(p, size, &i);
        if (st != DSC_OK) {
            snprintf(why, sizeof why, "%s", dsc_last_error());
            i = MEM_NIL;
        }
    }
    if (i == MEM_NIL && p->defrag_on_oom && p->st.reserved - p->st.allocated >= size) {
        DSC_DEBUG("mem", "%s: compacting to fit %zu bytes for %s", p->name, size, tag);
        DSC_TRY(dsc__mem_compact(p, NULL));
        i = dsc__mem_find_fit(p, size);
    }
    if (i == MEM_NIL) return oom(p, bytes, tag, why);
    *out = i;
    return DSC_OK;
}

static dsc_status alloc_locked(dsc_mem_pool *p, size_t bytes, const char *tag,
                               dsc_mem_handle *out) {
    if (!tag || !*tag) tag = "untagged";
    size_t size = dsc__mem_round(p, bytes);
    uint32_t t = tag_id(p, tag), i = MEM_NIL;
    if (size == 0 || t == MEM_NIL) return oom(p, bytes, tag, "");
    DSC_TRY(find_block(p, bytes, size, tag, &i));
    // The split may need a record; the block stays free if there is none.
    if (!dsc__mem_rec_reserve(p, 1)) return oom(p, bytes, tag, "no memory for bookkeeping");
    dsc__mem_carve(p, i, size);
    mem_block *b = dsc__mem_rec(p, i);
    b->gen++;
    b->tag = t;
    b->handle = make_handle(b->gen, i);
    p->tags[t].bytes += size;
    p->tags[t].blocks++;
    p->st.allocated += size;
    if (p->st.allocated > p->st.peak_allocated) p->st.peak_allocated = p->st.allocated;
    p->st.live_blocks++;
    p->st.alloc_count++;
    *out = b->handle;
    return DSC_OK;
}

dsc_status dsc_mem_alloc(dsc_mem_pool *p, size_t bytes, const char *tag, dsc_mem_handle *out) {
    if (!out || !p) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_mem_alloc: pool or out is NULL");
    *out = 0;
    lock(p);
    dsc_status st = alloc_locked(p, bytes, tag, out);
    unlock(p);
    return st;
}

void dsc_mem_free(dsc_mem_pool *p, dsc_mem_handle h) {
    if (!p || h == 0) return;
    lock(p);
    uint32_t i;
    mem_block *b = live_block(p, h, &i);
    if (!b) {
        unlock(p);
        DSC_WARN("mem", "%s: free of handle 0x%08x, which is not live (freed twice?); ignored",
                 p->name, h);
        return;
    }
    mem_tag *t = &p->tags[b->tag];
    t->bytes -= b->size;
    t->blocks--;
    p->st.allocated -= b->size;
    p->st.live_blocks--;
    p->st.free_count++;
    dsc__mem_release_block(p, i);
    unlock(p);
}

void *dsc_mem_ptr(dsc_mem_pool *p, dsc_mem_handle h) {
    mem_block *b = live_block(p, h, NULL);
    return b ? (void *)b->addr : NULL;
}

size_t dsc_mem_size(const dsc_mem_pool *p, dsc_mem_handle h) {
    mem_block *b = live_block(p, h, NULL);
    return b ? b->size : 0;
}

uint64_t dsc_mem_generation(const dsc_mem_pool *p) {
    return p ? atomic_load_explicit(&((dsc_mem_pool *)p)->generation, memory_order_acquire) : 0;
}

// ---- statistics ----

dsc_status dsc_mem_pool_stats(const dsc_mem_pool *p, dsc_mem_stats *out) {
    if (!p || !out)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_mem_pool_stats: pool or out is NULL");
    lock(p);
    *out = p->st;
    out->fragmentation = dsc__mem_fragmentation(p, &out->largest_free_block);
    unlock(p);
    return DSC_OK;
}

void dsc_mem_reset_peak(dsc_mem_pool *p) {
    if (!p) return;
    lock(p);
    p->st.peak_allocated = p->st.allocated;
    unlock(p);
}

size_t dsc_mem_top_users(const dsc_mem_pool *p, dsc_mem_user *out, size_t n) {
    if (!p || !out) return 0;
    lock(p);
    size_t k = top_users_locked(p, out, n);
    unlock(p);
    return k;
}

char *dsc_mem_format_top_users(const dsc_mem_pool *p, size_t n, char *buf, size_t buflen) {
    dsc_mem_user top[16];
    char b[32];
    if (!buf || buflen == 0) return buf;
    buf[0] = '\0';
    size_t k = dsc_mem_top_users(p, top, n < 16 ? n : 16), at = 0;
    for (size_t i = 0; i < k && at < buflen; i++) {
        int w = snprintf(buf + at, buflen - at, "%s%s %s", i ? ", " : "", top[i].tag,
                         dsc_mem_format_bytes(top[i].bytes, b, sizeof b));
        if (w > 0) at += (size_t)w;
    }
    return buf;
}

char *dsc_mem_format_bytes(size_t bytes, char *buf, size_t buflen) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (!buf || buflen == 0) return buf;
    if (bytes < 1024) {
        snprintf(buf, buflen, "%zu B", bytes);
        return buf;
    }
    double v = (double)bytes / 1024;
    unsigned u = 0;
    while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
        v /= 1024;
        u++;
    }
    snprintf(buf, buflen, "%.1f %s", v, units[u]);
    return buf;
}
