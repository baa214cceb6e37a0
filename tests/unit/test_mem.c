// Unit tests of mem/: the caching allocator, its statistics, the defragmenter, out-of-memory
// messages, steady-state behaviour, thread safety, default pools and the pinned pool.
//
// The randomized workloads print their seed on failure; rerun one with DSC_TEST_SEED=<seed>.
// DSC_MEM_TEST_OPS scales their length (default 200000 operations), e.g. for valgrind.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>      // pthread_create
#include <stdatomic.h>    // atomic_int
#include <stdio.h>        // printf
#include <stdlib.h>       // getenv, strtoull, qsort, malloc
#include <string.h>       // strstr, memcmp
#include <sys/resource.h> // getrlimit

#ifdef DSC_WITH_CUDA
#include <cuda_runtime_api.h> // cudaMemcpy
#endif

#include "base/log.h"      // dsc_log_set_level
#include "dsc/memory.h"    // dsc_mem_*
#include "mem/pool_impl.h" // dsc__mem_check

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

// ---- helpers ----

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) { // splitmix64
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t seed_or(uint64_t dflt) {
    const char *s = getenv("DSC_TEST_SEED");
    return s && *s ? strtoull(s, NULL, 10) : dflt;
}

static long ops_or(long dflt) {
    const char *s = getenv("DSC_MEM_TEST_OPS");
    return s && *s ? strtol(s, NULL, 10) : dflt;
}

// Word k of the pattern that a block with handle h holds.
static uint64_t pat(dsc_mem_handle h, size_t k) { return (uint64_t)h * 0x9E3779B97F4A7C15ull + k; }

static void fill(void *ptr, dsc_mem_handle h, size_t bytes) {
    uint64_t *w = ptr;
    size_t n = bytes / 8;
    for (size_t k = 0; k < n; k++) w[k] = pat(h, k);
    for (size_t b = n * 8; b < bytes; b++) ((uint8_t *)ptr)[b] = (uint8_t)pat(h, b);
}

// Offset of the first byte that differs from the pattern, or SIZE_MAX.
static size_t verify(const void *ptr, dsc_mem_handle h, size_t bytes) {
    const uint64_t *w = ptr;
    size_t n = bytes / 8;
    for (size_t k = 0; k < n; k++)
        if (w[k] != pat(h, k)) return k * 8;
    for (size_t b = n * 8; b < bytes; b++)
        if (((const uint8_t *)ptr)[b] != (uint8_t)pat(h, b)) return b;
    return SIZE_MAX;
}

static void assert_pool_ok(dsc_mem_pool *p, uint64_t seed, long op) {
    char msg[256];
    if (!dsc__mem_check(p, msg, sizeof msg))
        fail_msg("seed %llu op %ld: %s", (unsigned long long)seed, op, msg);
}

static dsc_mem_stats stats_of(const dsc_mem_pool *p) {
    dsc_mem_stats s;
    assert_int_equal(dsc_mem_pool_stats(p, &s), DSC_OK);
    return s;
}

// ---- randomized workload ----

typedef struct live {
    dsc_mem_handle h;
    size_t req;
    uintptr_t addr;
    size_t size;
} live;

typedef struct workload {
    dsc_mem_pool *p;
    uint64_t seed;
    rng r;
    live *v;
    size_t n, cap;
    uint64_t allocs, frees, ooms;
} workload;

static int by_addr(const void *a, const void *b) {
    uintptr_t x = ((const live *)a)->addr, y = ((const live *)b)->addr;
    return x < y ? -1 : x > y;
}

// Independent checks: blocks aligned and disjoint, statistics equal to sums over our own list.
static void check_invariants(workload *w, long op) {
    assert_pool_ok(w->p, w->seed, op);
    size_t sum = 0;
    for (size_t i = 0; i < w->n; i++) {
        live *l = &w->v[i];
        l->addr = (uintptr_t)dsc_mem_ptr(w->p, l->h);
        l->size = dsc_mem_size(w->p, l->h);
        if (!l->addr || l->addr % 64 || l->size < l->req)
            fail_msg("seed %llu op %ld: handle 0x%x: addr %p size %zu req %zu",
                     (unsigned long long)w->seed, op, l->h, (void *)l->addr, l->size, l->req);
        sum += l->size;
    }
    live *s = malloc((w->n + 1) * sizeof *s);
    assert_non_null(s);
    memcpy(s, w->v, w->n * sizeof *s);
    qsort(s, w->n, sizeof *s, by_addr);
    for (size_t i = 1; i < w->n; i++)
        if (s[i - 1].addr + s[i - 1].size > s[i].addr)
            fail_msg("seed %llu op %ld: blocks 0x%x and 0x%x overlap", (unsigned long long)w->seed,
                     op, s[i - 1].h, s[i].h);
    free(s);
    dsc_mem_stats st = stats_of(w->p);
    if (st.allocated != sum || st.live_blocks != w->n || st.alloc_count != w->allocs ||
        st.free_count != w->frees || st.oom_count != w->ooms || st.peak_allocated < st.allocated ||
        st.largest_free_block > st.reserved - st.allocated)
        fail_msg(
            "seed %llu op %ld: stats allocated %zu (want %zu) live %llu (want %zu) allocs %llu "
            "(want %llu) frees %llu (want %llu) ooms %llu (want %llu)",
            (unsigned long long)w->seed, op, st.allocated, sum, (unsigned long long)st.live_blocks,
            w->n, (unsigned long long)st.alloc_count, (unsigned long long)w->allocs,
            (unsigned long long)st.free_count, (unsigned long long)w->frees,
            (unsigned long long)st.oom_count, (unsigned long long)w->ooms);
    size_t free_bytes = st.reserved - st.allocated;
    double want = free_bytes ? 1.0 - (double)st.largest_free_block / (double)free_bytes : 0.0;
    if (st.fragmentation != want)
        fail_msg("seed %llu op %ld: fragmentation %g, want %g", (unsigned long long)w->seed, op,
                 st.fragmentation, want);
}

static void verify_all(workload *w, long op) {
    for (size_t i = 0; i < w->n; i++) {
        size_t bad = verify(dsc_mem_ptr(w->p, w->v[i].h), w->v[i].h, w->v[i].req);
        if (bad != SIZE_MAX)
            fail_msg("seed %llu op %ld: handle 0x%x (%zu bytes) corrupt at byte %zu",
                     (unsigned long long)w->seed, op, w->v[i].h, w->v[i].req, bad);
    }
}

static void do_alloc(workload *w, long op, size_t max_log2) {
    static const char *tags[] = {"zero.master", "zero.grad", "act", "bucket", "opt.m", "opt.v"};
    size_t req = 1 + (size_t)(rng_next(&w->r) % ((size_t)1 << (rng_next(&w->r) % (max_log2 + 1))));
    const char *tag = tags[rng_next(&w->r) % 6];
    dsc_mem_stats before = stats_of(w->p);
    dsc_mem_handle h = 1234;
    dsc_status st = dsc_mem_alloc(w->p, req, tag, &h);
    if (st == DSC_ERR_OOM) {
        // Only when even compaction cannot help: the free space is below the rounded request.
        size_t free_bytes = before.reserved - before.allocated;
        if (h != 0 || free_bytes >= req + req / 8 + 256 ||
            !strstr(dsc_last_error(), "out of memory"))
            fail_msg("seed %llu op %ld: OOM for %zu bytes with %zu free: %s",
                     (unsigned long long)w->seed, op, req, free_bytes, dsc_last_error());
        w->ooms++;
        return;
    }
    if (st != DSC_OK)
        fail_msg("seed %llu op %ld: alloc: %s", (unsigned long long)w->seed, op, dsc_last_error());
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 1024;
        w->v = realloc(w->v, w->cap * sizeof *w->v);
        assert_non_null(w->v);
    }
    fill(dsc_mem_ptr(w->p, h), h, req);
    w->v[w->n++] = (live){.h = h, .req = req};
    w->allocs++;
}

static void do_free(workload *w, long op) {
    size_t i = rng_next(&w->r) % w->n;
    live l = w->v[i];
    size_t bad = verify(dsc_mem_ptr(w->p, l.h), l.h, l.req);
    if (bad != SIZE_MAX)
        fail_msg("seed %llu op %ld: handle 0x%x corrupt at byte %zu before free",
                 (unsigned long long)w->seed, op, l.h, bad);
    dsc_mem_free(w->p, l.h);
    if (dsc_mem_ptr(w->p, l.h))
        fail_msg("seed %llu op %ld: freed handle still live", (unsigned long long)w->seed, op);
    w->v[i] = w->v[--w->n];
    w->frees++;
}

// Compacts, then checks contents, handles, the reported bytes and (single arena) fragmentation 0.
static void do_defrag(workload *w, long op, bool single_arena) {
    dsc_mem_stats a = stats_of(w->p);
    uint64_t gen = dsc_mem_generation(w->p);
    size_t moved = 0;
    assert_int_equal(dsc_mem_defragment(w->p, &moved), DSC_OK);
    dsc_mem_stats b = stats_of(w->p);
    if (b.defrag_count != a.defrag_count + 1 ||
        b.defrag_bytes_moved != a.defrag_bytes_moved + moved ||
        (moved > 0) != (dsc_mem_generation(w->p) != gen) || b.allocated != a.allocated)
        fail_msg("seed %llu op %ld: defragment bookkeeping", (unsigned long long)w->seed, op);
    if (single_arena &&
        (b.fragmentation != 0.0 || b.largest_free_block != b.reserved - b.allocated))
        fail_msg("seed %llu op %ld: after compaction fragmentation %g largest %zu free %zu",
                 (unsigned long long)w->seed, op, b.fragmentation, b.largest_free_block,
                 b.reserved - b.allocated);
    verify_all(w, op);
    check_invariants(w, op);
}

static void run_workload(dsc_mem_pool *p, uint64_t seed, long ops, size_t max_log2, size_t target,
                         bool single_arena) {
    workload w = {.p = p, .seed = seed, .r = {seed}};
    for (long op = 0; op < ops; op++) {
        bool grow = w.n < target ? rng_next(&w.r) % 100 < 60 : rng_next(&w.r) % 100 < 40;
        if (grow || w.n == 0)
            do_alloc(&w, op, max_log2);
        else
            do_free(&w, op);
        if (op % 64 == 0) check_invariants(&w, op);
        if (op % 5000 == 4999) do_defrag(&w, op, single_arena);
    }
    do_defrag(&w, ops, single_arena);
    while (w.n) do_free(&w, ops);
    check_invariants(&w, ops);
    dsc_mem_stats st = stats_of(p);
    print_message("    seed %llu: %llu allocs, %llu OOMs, %llu compactions moved %.1f MiB, "
                  "peak %.1f MiB of %.1f MiB\n",
                  (unsigned long long)seed, (unsigned long long)w.allocs,
                  (unsigned long long)w.ooms, (unsigned long long)st.defrag_count,
                  st.defrag_bytes_moved / (double)MiB, st.peak_allocated / (double)MiB,
                  st.reserved / (double)MiB);
    if (single_arena && (st.largest_free_block != st.reserved || st.fragmentation != 0.0))
        fail_msg("seed %llu: empty pool is not one free block", (unsigned long long)seed);
    free(w.v);
}

// A tight pool (peak demand above capacity): OOMs happen, allocation-time compaction runs.
static void test_random_bounded(void **state) {
    dsc_mem_pool *p;
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 16 * MiB, NULL), DSC_OK);
    run_workload(p, seed_or(20240601), ops_or(200000), 18, 1000, true);
    dsc_mem_stats st = stats_of(p);
    assert_int_equal(st.system_allocs, 1); // a pool with a capacity never grows
    dsc_mem_pool_destroy(p);
}

// A growing pool with small chunks: compaction across several arenas, then trimming.
static void test_random_growing(void **state) {
    dsc_mem_pool *p;
    dsc_mem_opts o = {.chunk_bytes = 2 * MiB};
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 0, &o), DSC_OK);
    run_workload(p, seed_or(7), ops_or(200000) / 4, 20, 300, false);
    dsc_mem_stats a = stats_of(p);
    size_t released = dsc_mem_trim(p);
    dsc_mem_stats b = stats_of(p);
    assert_int_equal(released, a.reserved); // nothing is live: every arena goes back
    assert_int_equal(b.reserved, 0);
    assert_int_equal(b.system_frees, a.system_allocs);
    assert_pool_ok(p, 7, -1);
    dsc_mem_pool_destroy(p);
}

// ---- deterministic cases ----

static void test_basics(void **state) {
    dsc_mem_pool *p;
    dsc_mem_handle h = 99, h2;
    dsc_mem_pool_destroy(NULL);
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 0, NULL), DSC_OK);
    assert_string_equal(dsc_mem_pool_name(p), "host pool");
    assert_int_equal(dsc_mem_alloc(p, 0, "empty", &h), DSC_OK);
    assert_int_not_equal(h, 0);
    assert_int_equal(dsc_mem_size(p, h), 64);
    assert_null(dsc_mem_ptr(p, 0));
    dsc_mem_free(p, 0); // no-op
    // A freed handle is dead, even when its record is reused for the next block.
    dsc_mem_free(p, h);
    assert_null(dsc_mem_ptr(p, h));
    assert_int_equal(dsc_mem_size(p, h), 0);
    dsc_log_set_level(DSC_LOG_ERROR); // the double free below warns
    dsc_mem_free(p, h);
    dsc_log_set_level(-1);
    assert_int_equal(stats_of(p).free_count, 1);
    assert_int_equal(dsc_mem_alloc(p, 100, NULL, &h2), DSC_OK);
    assert_int_not_equal(h2, h);
    assert_null(dsc_mem_ptr(p, h));
    assert_null(dsc_mem_ptr(p, h2 + (1u << 20))); // index never created
    assert_null(dsc_mem_ptr(p, 0xFF000000u));     // index 0 with a generation: not a handle
    dsc_mem_user u[4];
    assert_int_equal(dsc_mem_top_users(p, u, 4), 1);
    assert_string_equal(u[0].tag, "untagged");
    assert_int_equal(dsc_mem_alloc(NULL, 1, "x", &h), DSC_ERR_INVALID_ARG);
    dsc_mem_pool *q = (dsc_mem_pool *)1;
    assert_int_equal(dsc_mem_pool_create(&q, -2, 0, NULL), DSC_ERR_INVALID_ARG);
    assert_null(q);
#ifndef DSC_WITH_CUDA
    assert_int_equal(dsc_mem_pool_create(&q, 0, 0, NULL), DSC_ERR_UNSUPPORTED);
    assert_null(q);
    assert_non_null(strstr(dsc_last_error(), "no CUDA support"));
#endif
    dsc_mem_pool_destroy(p);
}

// Rounding: at least the request, 64-byte aligned, at most 12.5% (small) or 63 bytes (large) more.
static void test_rounding(void **state) {
    dsc_mem_pool *p;
    rng r = {seed_or(3)};
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 0, NULL), DSC_OK);
    for (int i = 0; i < 20000; i++) {
        size_t req = 1 + rng_next(&r) % ((size_t)1 << (1 + rng_next(&r) % 22));
        dsc_mem_handle h;
        assert_int_equal(dsc_mem_alloc(p, req, "r", &h), DSC_OK);
        size_t sz = dsc_mem_size(p, h);
        size_t limit = req <= 256 * KiB ? req + 63 + (req + 63) / 8 : req + 63;
        if (sz < req || sz > limit || sz % 64 || (uintptr_t)dsc_mem_ptr(p, h) % 64)
            fail_msg("request %zu: block %zu at %p", req, sz, dsc_mem_ptr(p, h));
        // Same-class requests share one block size, so a freed block is reused exactly.
        dsc_mem_handle h2;
        assert_int_equal(dsc_mem_alloc(p, sz, "r", &h2), DSC_OK);
        assert_int_equal(dsc_mem_size(p, h2), sz);
        dsc_mem_free(p, h);
        dsc_mem_free(p, h2);
    }
    dsc_mem_pool_destroy(p);
}

static void test_format(void **state) {
    char b[32];
    assert_string_equal(dsc_mem_format_bytes(0, b, sizeof b), "0 B");
    assert_string_equal(dsc_mem_format_bytes(1023, b, sizeof b), "1023 B");
    assert_string_equal(dsc_mem_format_bytes(1024, b, sizeof b), "1.0 KiB");
    assert_string_equal(dsc_mem_format_bytes(96 * MiB, b, sizeof b), "96.0 MiB");
    assert_string_equal(dsc_mem_format_bytes(3 * MiB * 512, b, sizeof b), "1.5 GiB");
}

static void test_oom_message(void **state) {
    dsc_mem_pool *p;
    dsc_mem_handle h;
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 8 * MiB, NULL), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 4 * MiB, "zero.master", &h), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 2 * MiB, "zero.grad", &h), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 1 * MiB, "zero.grad", &h), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 1000, "tiny", &h), DSC_OK);
    dsc_mem_handle big = 77;
    assert_int_equal(dsc_mem_alloc(p, 16 * MiB, "zero.grad_bucket", &big), DSC_ERR_OOM);
    assert_int_equal(big, 0);
    const char *want =
        "host pool: out of memory allocating 16.0 MiB for zero.grad_bucket: 8.0 MiB "
        "reserved (the pool's capacity), 7.0 MiB allocated, largest free block "
        "1023.0 KiB; largest users: zero.master 4.0 MiB, zero.grad 3.0 MiB, tiny 1.0 KiB;";
    if (strncmp(dsc_last_error(), want, strlen(want)) != 0)
        fail_msg("message:\n  %s\nwant prefix:\n  %s", dsc_last_error(), want);
    dsc_mem_stats st = stats_of(p);
    assert_int_equal(st.oom_count, 1);
    assert_int_equal(st.defrag_count, 0); // 1 MiB free cannot hold 16 MiB: no compaction tried
    char users[128];
    assert_string_equal(dsc_mem_format_top_users(p, 2, users, sizeof users),
                        "zero.master 4.0 MiB, zero.grad 3.0 MiB");
    dsc_mem_pool_destroy(p);
}

// 64 blocks of 1 MiB fill a 64 MiB pool; every other one is freed: 32 MiB free in 1 MiB holes.
static void fragment(dsc_mem_pool *p, dsc_mem_handle hs[64]) {
    for (int i = 0; i < 64; i++) {
        assert_int_equal(dsc_mem_alloc(p, MiB, "act", &hs[i]), DSC_OK);
        fill(dsc_mem_ptr(p, hs[i]), hs[i], MiB);
    }
    for (int i = 0; i < 64; i += 2) {
        dsc_mem_free(p, hs[i]);
        hs[i] = 0;
    }
}

static void test_compaction_rescues_oom(void **state) {
    dsc_mem_pool *a, *b;
    dsc_mem_handle ha[64], hb[64], big;
    dsc_mem_opts no = {.no_defrag_on_oom = true};
    assert_int_equal(dsc_mem_pool_create(&a, DSC_MEM_HOST, 64 * MiB, &no), DSC_OK);
    assert_int_equal(dsc_mem_pool_create(&b, DSC_MEM_HOST, 64 * MiB, NULL), DSC_OK);
    fragment(a, ha);
    fragment(b, hb);
    dsc_mem_stats st = stats_of(b);
    assert_int_equal(st.largest_free_block, MiB);
    assert_true(st.fragmentation == 1.0 - 1.0 / 32);
    // Without compaction: out of memory although half the pool is free.
    assert_int_equal(dsc_mem_alloc(a, 16 * MiB, "zero.grad_bucket", &big), DSC_ERR_OOM);
    assert_non_null(strstr(dsc_last_error(), "largest free block 1.0 MiB"));
    // With it: the pool compacts once and the allocation succeeds; survivors keep their bytes.
    void *before = dsc_mem_ptr(b, hb[1]);
    uint64_t gen = dsc_mem_generation(b);
    assert_int_equal(dsc_mem_alloc(b, 16 * MiB, "zero.grad_bucket", &big), DSC_OK);
    st = stats_of(b);
    assert_int_equal(st.defrag_count, 1);
    assert_int_equal(st.defrag_bytes_moved, 32 * MiB); // each survivor slid down
    assert_int_equal(st.oom_count, 0);
    assert_true(dsc_mem_generation(b) != gen);
    assert_true(dsc_mem_ptr(b, hb[1]) != before);
    for (int i = 1; i < 64; i += 2)
        assert_int_equal(verify(dsc_mem_ptr(b, hb[i]), hb[i], MiB), SIZE_MAX);
    assert_int_equal(st.allocated, 48 * MiB);
    assert_int_equal(st.largest_free_block, 16 * MiB);
    assert_true(st.fragmentation == 0.0);
    assert_pool_ok(b, 0, 0);
    dsc_mem_pool_destroy(a);
    dsc_mem_pool_destroy(b);
}

static void test_maybe_defragment(void **state) {
    dsc_mem_pool *p;
    dsc_mem_handle hs[64];
    bool did = true;
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 64 * MiB, NULL), DSC_OK);
    fragment(p, hs); // fragmentation 0.96875
    assert_int_equal(dsc_mem_maybe_defragment(p, 1000.0, 300, 0.3, &did), DSC_OK);
    assert_false(did); // the first call starts the clock
    assert_int_equal(dsc_mem_maybe_defragment(p, 1299.0, 300, 0.3, &did), DSC_OK);
    assert_false(did); // interval not over
    assert_int_equal(dsc_mem_maybe_defragment(p, 1300.0, 300, 0.99, &did), DSC_OK);
    assert_false(did); // below the threshold
    assert_int_equal(dsc_mem_maybe_defragment(p, 1300.0, 300, 0.3, &did), DSC_OK);
    assert_true(did);
    assert_true(stats_of(p).fragmentation == 0.0);
    // Fragment again: the next compaction waits for the interval from 1300.
    dsc_mem_handle f[32];
    for (int i = 0; i < 32; i++) assert_int_equal(dsc_mem_alloc(p, MiB, "act", &f[i]), DSC_OK);
    for (int i = 0; i < 32; i += 2) dsc_mem_free(p, f[i]);
    assert_true(stats_of(p).fragmentation > 0.3);
    assert_int_equal(dsc_mem_maybe_defragment(p, 1500.0, 300, 0.3, &did), DSC_OK);
    assert_false(did);
    assert_int_equal(dsc_mem_maybe_defragment(p, 1600.0, 300, 0.3, &did), DSC_OK);
    assert_true(did);
    assert_int_equal(stats_of(p).defrag_count, 2);
    for (int i = 1; i < 64; i += 2)
        assert_int_equal(verify(dsc_mem_ptr(p, hs[i]), hs[i], MiB), SIZE_MAX);
    dsc_mem_pool_destroy(p);
}

// The allocation pattern of a small model's training step, 10000 times, with the periodic
// defragmenter on: after warm-up no arena is added or returned and reserved memory stays flat.
static void test_steady_state(void **state) {
    dsc_mem_pool *p;
    dsc_mem_opts o = {.chunk_bytes = 8 * MiB};
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 0, &o), DSC_OK);
    dsc_mem_handle params, master, m, v, act[12], grad[4], logits;
    assert_int_equal(dsc_mem_alloc(p, 3 * MiB, "params", &params), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 6 * MiB, "zero.master", &master), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 6 * MiB, "opt.m", &m), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 6 * MiB, "opt.v", &v), DSC_OK);
    uint64_t sys = 0;
    size_t reserved = 0;
    int steps = (int)ops_or(200000) / 20;
    for (int step = 0; step < steps; step++) {
        for (int l = 0; l < 12; l++) {
            size_t bytes = (size_t)(100 + 37 * l + step % 7) * KiB; // sizes vary a little per step
            assert_int_equal(dsc_mem_alloc(p, bytes, "act", &act[l]), DSC_OK);
            *(volatile char *)dsc_mem_ptr(p, act[l]) = 1;
        }
        assert_int_equal(dsc_mem_alloc(p, 12 * MiB + (size_t)(step % 3) * 4096, "logits", &logits),
                         DSC_OK);
        dsc_mem_free(p, logits);
        for (int g = 0; g < 4; g++)
            assert_int_equal(dsc_mem_alloc(p, (size_t)(g + 1) * 700 * KiB, "bucket", &grad[g]),
                             DSC_OK);
        for (int l = 11; l >= 0; l -= 2) dsc_mem_free(p, act[l]); // backward frees in reverse...
        for (int g = 3; g >= 0; g--) dsc_mem_free(p, grad[g]);
        for (int l = 0; l < 12; l += 2) dsc_mem_free(p, act[l]); // ...and checkpoints later
        assert_int_equal(dsc_mem_maybe_defragment(p, (double)step, 100, 0.0, NULL), DSC_OK);
        if (step == 10) {
            dsc_mem_stats st = stats_of(p);
            sys = st.system_allocs;
            reserved = st.reserved;
        }
        if (step > 10) {
            dsc_mem_stats st = stats_of(p);
            if (st.system_allocs != sys || st.system_frees != 0 || st.reserved != reserved)
                fail_msg("step %d: system allocs %llu (was %llu), reserved %zu (was %zu)", step,
                         (unsigned long long)st.system_allocs, (unsigned long long)sys, st.reserved,
                         reserved);
        }
    }
    dsc_mem_stats st = stats_of(p);
    print_message("    %d steps: %llu arenas, %.1f MiB reserved, %llu compactions\n", steps,
                  (unsigned long long)st.system_allocs, st.reserved / (double)MiB,
                  (unsigned long long)st.defrag_count);
    assert_true(st.defrag_count > 0);
    assert_int_equal(st.live_blocks, 4);
    assert_pool_ok(p, 0, steps);
    dsc_mem_pool_destroy(p);
}

// ---- threads ----

typedef struct thread_arg {
    dsc_mem_pool *p;
    int id;
    long ops;
    uint64_t allocs, frees;
    size_t live_bytes;
    int errors;
} thread_arg;

static void *thread_main(void *arg) {
    thread_arg *t = arg;
    char tag[16];
    snprintf(tag, sizeof tag, "thread.%d", t->id);
    rng r = {seed_or(11) + (uint64_t)t->id};
    dsc_mem_handle hs[64] = {0};
    for (long op = 0; op < t->ops; op++) {
        int k = (int)(rng_next(&r) % 64);
        if (hs[k]) {
            uint64_t *w = dsc_mem_ptr(t->p, hs[k]);
            if (!w || w[0] != pat(hs[k], 0)) t->errors++;
            t->live_bytes -= dsc_mem_size(t->p, hs[k]);
            dsc_mem_free(t->p, hs[k]);
            hs[k] = 0;
            t->frees++;
            continue;
        }
        size_t bytes = 8 + rng_next(&r) % (64 * KiB);
        if (dsc_mem_alloc(t->p, bytes, tag, &hs[k]) != DSC_OK) {
            t->errors++;
            continue;
        }
        *(uint64_t *)dsc_mem_ptr(t->p, hs[k]) = pat(hs[k], 0);
        t->live_bytes += dsc_mem_size(t->p, hs[k]);
        t->allocs++;
    }
    return NULL;
}

static atomic_int stop_reader;

static void *reader_main(void *arg) {
    dsc_mem_stats st;
    long n = 0;
    while (!atomic_load(&stop_reader)) {
        if (dsc_mem_pool_stats(arg, &st) != DSC_OK || st.allocated > st.reserved) break;
        n++;
    }
    return (void *)n;
}

static void test_threads(void **state) {
    enum { NT = 4 };
    dsc_mem_pool *p;
    pthread_t th[NT], rd;
    thread_arg a[NT];
    assert_int_equal(dsc_mem_pool_create(&p, DSC_MEM_HOST, 0, NULL), DSC_OK);
    atomic_store(&stop_reader, 0);
    pthread_create(&rd, NULL, reader_main, p);
    for (int i = 0; i < NT; i++) {
        a[i] = (thread_arg){.p = p, .id = i, .ops = ops_or(200000) / 4};
        pthread_create(&th[i], NULL, thread_main, &a[i]);
    }
    uint64_t allocs = 0, frees = 0;
    size_t live = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].errors, 0);
        allocs += a[i].allocs;
        frees += a[i].frees;
        live += a[i].live_bytes;
    }
    atomic_store(&stop_reader, 1);
    pthread_join(rd, NULL);
    dsc_mem_stats st = stats_of(p);
    assert_int_equal(st.alloc_count, allocs);
    assert_int_equal(st.free_count, frees);
    assert_int_equal(st.allocated, live);
    dsc_mem_user u[NT + 1];
    size_t n = dsc_mem_top_users(p, u, NT + 1);
    size_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        assert_non_null(strstr(u[i].tag, "thread."));
        if (i) assert_true(u[i - 1].bytes >= u[i].bytes);
        sum += u[i].bytes;
    }
    assert_int_equal(sum, live);
    assert_pool_ok(p, 11, -1);
    dsc_mem_pool_destroy(p);
}

// ---- default pools and the pinned pool ----

static void test_default_pools(void **state) {
    dsc_mem_stats st;
    dsc_mem_pool *p;
    dsc_mem_handle h;
    dsc_mem_shutdown();
    assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &st), DSC_OK);
    assert_int_equal(st.reserved, 0);
    assert_int_equal(dsc_mem_default_pool(DSC_MEM_HOST, &p), DSC_OK);
    dsc_mem_pool *again;
    assert_int_equal(dsc_mem_default_pool(DSC_MEM_HOST, &again), DSC_OK);
    assert_ptr_equal(p, again);
    assert_int_equal(dsc_mem_alloc(p, 5000, "x", &h), DSC_OK);
    assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &st), DSC_OK);
    assert_int_equal(st.allocated, dsc_mem_size(p, h));
    assert_int_equal(st.alloc_count, 1);
    assert_true(st.reserved >= st.allocated);
    assert_int_equal(dsc_memory_stats(-5, &st), DSC_ERR_INVALID_ARG);
#ifndef DSC_WITH_CUDA
    assert_int_equal(dsc_memory_stats(0, &st), DSC_ERR_UNSUPPORTED);
#endif
    dsc_mem_shutdown();
    assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &st), DSC_OK);
    assert_int_equal(st.alloc_count, 0);
}

static void test_pinned(void **state) {
    dsc_mem_pool *p;
    dsc_mem_double_buffer db;
    assert_int_equal(dsc_pinned_pool_create(&p, 0, NULL), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_pinned_pool_create(&p, 4 * MiB, NULL), DSC_OK);
    assert_string_equal(dsc_mem_pool_name(p), "pinned pool");
    struct rlimit rl;
    getrlimit(RLIMIT_MEMLOCK, &rl);
    print_message("    pinned pool of 4 MiB: %s (RLIMIT_MEMLOCK %lld)\n",
                  dsc_mem_pool_pinned(p) ? "page-locked" : "pageable",
                  rl.rlim_cur == RLIM_INFINITY ? -1LL : (long long)rl.rlim_cur);
    assert_int_equal(dsc_mem_double_buffer_init(&db, p, MiB, "offload.grad"), DSC_OK);
    void *first = NULL, *second = NULL;
    for (int i = 0; i < 1000; i++) {
        char *b = dsc_mem_double_buffer_next(&db);
        assert_non_null(b);
        if (i == 0) first = b;
        if (i == 1) second = b;
        assert_ptr_equal(b, i % 2 ? second : first);
        b[0] = (char)i;
        b[MiB - 1] = (char)i;
    }
    assert_true(first != second);
    dsc_mem_stats st = stats_of(p);
    assert_int_equal(st.system_allocs, 1); // pinned once, at creation
    assert_int_equal(st.alloc_count, 2);
    assert_int_equal(st.reserved, 4 * MiB);
    // A request beyond the pool fails instead of pinning more.
    dsc_mem_double_buffer db2;
    assert_int_equal(dsc_mem_double_buffer_init(&db2, p, 2 * MiB, "offload.param"), DSC_ERR_OOM);
    assert_null(db2.pool);
    assert_int_equal(stats_of(p).allocated, 2 * MiB);
    dsc_mem_double_buffer_release(&db);
    dsc_mem_double_buffer_release(&db); // idempotent
    assert_int_equal(stats_of(p).allocated, 0);
    assert_int_equal(stats_of(p).system_allocs, 1);
    dsc_mem_pool_destroy(p);
}

// ---- device pools (CUDA builds) ----

#ifdef DSC_WITH_CUDA
// Fills a device block with the pattern of its handle (through a host buffer).
static void dev_fill(dsc_mem_pool *p, dsc_mem_handle h, size_t bytes) {
    void *host = malloc(bytes);
    assert_non_null(host);
    fill(host, h, bytes);
    assert_int_equal(cudaMemcpy(dsc_mem_ptr(p, h), host, bytes, cudaMemcpyHostToDevice),
                     cudaSuccess);
    free(host);
}

static size_t dev_verify(dsc_mem_pool *p, dsc_mem_handle h, size_t bytes) {
    void *host = malloc(bytes);
    assert_non_null(host);
    assert_int_equal(cudaMemcpy(host, dsc_mem_ptr(p, h), bytes, cudaMemcpyDeviceToHost),
                     cudaSuccess);
    size_t bad = verify(host, h, bytes);
    free(host);
    return bad;
}

// Compaction on the device: a non-overlapping move, a move by a gap smaller than the 8 MiB
// staging buffer (staged), and one by a larger gap that is still smaller than the block (pieces).
static void test_device_pool(void **state) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        cudaGetLastError();
        print_message("    SKIP: no CUDA device\n");
        skip();
    }
    dsc_mem_pool *p;
    assert_int_equal(dsc_mem_pool_create(&p, 0, 96 * MiB, NULL), DSC_OK);
    assert_string_equal(dsc_mem_pool_name(p), "cuda:0 pool");
    dsc_mem_handle tiny, a, gap16, b, c, big;
    assert_int_equal(dsc_mem_alloc(p, 300, "tiny", &tiny), DSC_OK);
    assert_int_equal(dsc_mem_size(p, tiny) % 256, 0);
    assert_int_equal(dsc_mem_alloc(p, 24 * MiB + 8, "a", &a), DSC_OK); // slides by 512 B
    assert_int_equal(dsc_mem_alloc(p, 16 * MiB, "gap", &gap16), DSC_OK);
    assert_int_equal(dsc_mem_alloc(p, 40 * MiB + 1000, "b", &b), DSC_OK); // slides by 16 MiB
    assert_int_equal(dsc_mem_alloc(p, 3 * MiB, "c", &c), DSC_OK);         // moves without overlap
    size_t sa = 24 * MiB + 8, sb = 40 * MiB + 1000, sc = 3 * MiB;
    assert_int_equal((uintptr_t)dsc_mem_ptr(p, a) % 256, 0);
    dev_fill(p, a, sa);
    dev_fill(p, b, sb);
    dev_fill(p, c, sc);
    dsc_mem_free(p, tiny);
    dsc_mem_free(p, gap16);
    size_t moved = 0;
    assert_int_equal(dsc_mem_defragment(p, &moved), DSC_OK);
    assert_int_equal(moved, dsc_mem_size(p, a) + dsc_mem_size(p, b) + dsc_mem_size(p, c));
    assert_int_equal(dev_verify(p, a, sa), SIZE_MAX);
    assert_int_equal(dev_verify(p, b, sb), SIZE_MAX);
    assert_int_equal(dev_verify(p, c, sc), SIZE_MAX);
    dsc_mem_stats st = stats_of(p);
    assert_true(st.fragmentation == 0.0);
    assert_int_equal(st.system_allocs, 2); // the arena and the staging buffer
    assert_int_equal(dsc_mem_alloc(p, 16 * MiB, "big", &big), DSC_OK);
    assert_pool_ok(p, 0, 0);
    dsc_mem_pool_destroy(p);
    // A growing device pool stops calling cudaMalloc once warm.
    assert_int_equal(dsc_mem_pool_create(&p, 0, 0, NULL), DSC_OK);
    uint64_t sys = 0;
    for (int step = 0; step < 200; step++) {
        dsc_mem_handle h[8];
        for (int k = 0; k < 8; k++)
            assert_int_equal(
                dsc_mem_alloc(p, (size_t)(k + 1) * 3 * MiB + (size_t)step, "act", &h[k]), DSC_OK);
        for (int k = 0; k < 8; k++) dsc_mem_free(p, h[(k * 3) % 8]);
        if (step == 2) sys = stats_of(p).system_allocs;
    }
    assert_int_equal(stats_of(p).system_allocs, sys);
    dsc_mem_pool_destroy(p);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_basics),
        cmocka_unit_test(test_rounding),
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_oom_message),
        cmocka_unit_test(test_compaction_rescues_oom),
        cmocka_unit_test(test_maybe_defragment),
        cmocka_unit_test(test_steady_state),
        cmocka_unit_test(test_random_bounded),
        cmocka_unit_test(test_random_growing),
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_default_pools),
        cmocka_unit_test(test_pinned),
#ifdef DSC_WITH_CUDA
        cmocka_unit_test(test_device_pool),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
