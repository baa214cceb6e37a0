// bench_mem - the memory layer against the C library.
//
//   bench_mem [iterations]     (default 200000)
//
// 1. Latency of one alloc + first-byte write + free, for several sizes: dsc's caching pool
//    (host, grows on demand) vs malloc/free. Large malloc requests go to mmap/munmap and fault
//    their pages in again each time; the pool keeps its arenas.
// 2. A mixed workload: 256 live blocks of random sizes (64 B .. 1 MiB), freed and replaced in
//    random order.
// 3. Cost of the calls made every step: dsc_mem_ptr, dsc_mem_pool_stats.
// 4. The fragmenting workload: a full pool with every other block freed cannot hold a request of
//    a quarter of its size without compaction, and can with it; the compaction's throughput.
// 5. (CUDA builds, when a device is present) device pool vs cudaMalloc/cudaFree and vs CUDA's
//    stream-ordered allocator (cudaMallocAsync/cudaFreeAsync), and the fragmenting workload on
//    the device.
#include <stdio.h>  // printf
#include <stdlib.h> // malloc, free, strtol
#include <string.h> // memset
#include <time.h>   // clock_gettime

#ifdef DSC_WITH_CUDA
#include <cuda_runtime_api.h> // cudaMalloc, cudaFree
#endif

#include "dsc/memory.h" // dsc_mem_*

#define MiB ((size_t)1 << 20)

static volatile unsigned char sink;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *s) { // splitmix64
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int die(const char *what) {
    fprintf(stderr, "bench_mem: %s: %s\n", what, dsc_last_error());
    return 1;
}

// ns per alloc + touch + free of `bytes` with the pool.
static double pool_pair_ns(dsc_mem_pool *p, size_t bytes, long iters) {
    dsc_mem_handle h;
    double t0 = now_s();
    for (long i = 0; i < iters; i++) {
        if (dsc_mem_alloc(p, bytes, "bench", &h) != DSC_OK) return -1;
        unsigned char *b = dsc_mem_ptr(p, h);
        b[0] = (unsigned char)i;
        sink = b[0];
        dsc_mem_free(p, h);
    }
    return (now_s() - t0) * 1e9 / (double)iters;
}

static double malloc_pair_ns(size_t bytes, long iters) {
    double t0 = now_s();
    for (long i = 0; i < iters; i++) {
        unsigned char *b = malloc(bytes);
        if (!b) return -1;
        b[0] = (unsigned char)i;
        sink = b[0];
        free(b);
    }
    return (now_s() - t0) * 1e9 / (double)iters;
}

static int bench_sizes(long iters) {
    static const size_t sizes[] = {64, 1024, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
    dsc_mem_pool *p;
    if (dsc_mem_pool_create(&p, DSC_MEM_HOST, 0, NULL) != DSC_OK) return die("pool");
    printf("alloc + touch + free, ns per pair (%ld iterations)\n", iters);
    printf("  %-10s %12s %12s %8s\n", "size", "dsc pool", "malloc", "ratio");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        long n = sizes[k] >= MiB ? iters / 10 : iters;
        pool_pair_ns(p, sizes[k], n / 10 + 1); // warm-up: the arena exists afterwards
        malloc_pair_ns(sizes[k], n / 10 + 1);
        double a = pool_pair_ns(p, sizes[k], n), b = malloc_pair_ns(sizes[k], n);
        char s[32];
        printf("  %-10s %12.1f %12.1f %7.2fx\n", dsc_mem_format_bytes(sizes[k], s, sizeof s), a, b,
               b / a);
    }
    dsc_mem_stats st;
    dsc_mem_pool_stats(p, &st);
    printf("  pool: %llu system allocations for %llu allocations\n\n",
           (unsigned long long)st.system_allocs, (unsigned long long)st.alloc_count);
    dsc_mem_pool_destroy(p);
    return 0;
}

// Mixed sizes, 256 live, random replacement. Returns ns per alloc + free pair.
static double mixed(dsc_mem_pool *p, long iters) {
    enum { LIVE = 256 };
    dsc_mem_handle hs[LIVE] = {0};
    void *ms[LIVE] = {0};
    uint64_t s = 42;
    double t0 = now_s();
    for (long i = 0; i < iters; i++) {
        size_t k = rng_next(&s) % LIVE,
               bytes = 64 + rng_next(&s) % ((size_t)1 << (6 + rng_next(&s) % 15));
        if (p) {
            dsc_mem_free(p, hs[k]);
            if (dsc_mem_alloc(p, bytes, "mixed", &hs[k]) != DSC_OK) return -1;
            ((unsigned char *)dsc_mem_ptr(p, hs[k]))[0] = 1;
        } else {
            free(ms[k]);
            ms[k] = malloc(bytes);
            if (!ms[k]) return -1;
            ((unsigned char *)ms[k])[0] = 1;
        }
    }
    double ns = (now_s() - t0) * 1e9 / (double)iters;
    for (int k = 0; k < LIVE; k++) {
        if (p)
            dsc_mem_free(p, hs[k]);
        else
            free(ms[k]);
    }
    return ns;
}

static int bench_mixed_and_calls(long iters) {
    dsc_mem_pool *p;
    if (dsc_mem_pool_create(&p, DSC_MEM_HOST, 0, NULL) != DSC_OK) return die("pool");
    mixed(p, iters / 10);
    double a = mixed(p, iters), b = mixed(NULL, iters);
    printf("mixed workload (256 live blocks, 64 B .. 1 MiB, random replacement), ns per pair\n");
    printf("  dsc pool %.1f, malloc %.1f (%.2fx)\n", a, b, b / a);
    dsc_mem_handle h;
    dsc_mem_stats st;
    if (dsc_mem_alloc(p, 4096, "x", &h) != DSC_OK) return die("alloc");
    double t0 = now_s();
    for (long i = 0; i < iters; i++) sink = *(unsigned char *)dsc_mem_ptr(p, h);
    double t1 = now_s();
    for (long i = 0; i < iters; i++) dsc_mem_pool_stats(p, &st);
    double t2 = now_s();
    printf("  dsc_mem_ptr %.1f ns, dsc_mem_pool_stats %.1f ns; %llu system allocations\n\n",
           (t1 - t0) * 1e9 / (double)iters, (t2 - t1) * 1e9 / (double)iters,
           (unsigned long long)st.system_allocs);
    dsc_mem_pool_destroy(p);
    return 0;
}

// Sets a block to byte value v (host or device).
static void set_block(int device, void *ptr, int v, size_t bytes) {
#ifdef DSC_WITH_CUDA
    if (device >= 0) {
        cudaMemset(ptr, v, bytes);
        return;
    }
#endif
    memset(ptr, v, bytes);
}

static unsigned char last_byte(int device, const void *ptr, size_t bytes) {
#ifdef DSC_WITH_CUDA
    if (device >= 0) {
        unsigned char b = 0;
        cudaMemcpy(&b, (const unsigned char *)ptr + bytes - 1, 1, cudaMemcpyDeviceToHost);
        return b;
    }
#endif
    return ((const unsigned char *)ptr)[bytes - 1];
}

// Fills a pool of `cap` bytes with blocks of cap/64, frees every other one, then asks for cap/4.
static int fragmenting(int device, size_t cap, bool compact) {
    dsc_mem_opts o = {.no_defrag_on_oom = !compact};
    dsc_mem_pool *p;
    dsc_mem_handle hs[64], big;
    if (dsc_mem_pool_create(&p, device, cap, &o) != DSC_OK) return die("pool");
    for (int i = 0; i < 64; i++) {
        if (dsc_mem_alloc(p, cap / 64, "act", &hs[i]) != DSC_OK) return die("fill");
        set_block(device, dsc_mem_ptr(p, hs[i]), i, cap / 64);
    }
    for (int i = 0; i < 64; i += 2) dsc_mem_free(p, hs[i]);
    dsc_mem_stats before, after;
    dsc_mem_pool_stats(p, &before);
    double t0 = now_s();
    dsc_status st = dsc_mem_alloc(p, cap / 4, "zero.grad_bucket", &big);
    double dt = now_s() - t0;
    dsc_mem_pool_stats(p, &after);
    int bad = 0;
    for (int i = 1; i < 64; i += 2) bad += last_byte(device, dsc_mem_ptr(p, hs[i]), cap / 64) != i;
    char c[32], f[32], l[32];
    printf("  %-9s %-14s free %-9s largest %-9s frag %.3f -> %s",
           dsc_mem_format_bytes(cap, c, sizeof c), compact ? "compaction" : "no compaction",
           dsc_mem_format_bytes(before.reserved - before.allocated, f, sizeof f),
           dsc_mem_format_bytes(before.largest_free_block, l, sizeof l), before.fragmentation,
           st == DSC_OK ? "ok" : "OOM");
    if (after.defrag_count)
        printf(", moved %.0f MiB in %.1f ms (%.1f GB/s)", after.defrag_bytes_moved / (double)MiB,
               dt * 1e3, after.defrag_bytes_moved / dt / 1e9);
    printf("%s\n", bad ? ", CONTENTS CORRUPT" : "");
    dsc_mem_pool_destroy(p);
    return bad;
}

#ifdef DSC_WITH_CUDA
// ns per cudaMallocAsync + cudaFreeAsync pair on one stream: CUDA's own stream-ordered pool, told
// to keep what is freed (release threshold: all), with the final synchronisation counted.
static double async_pair_ns(size_t bytes, long n) {
    cudaStream_t st;
    cudaMemPool_t mp;
    uint64_t keep = UINT64_MAX;
    void *d;
    if (cudaStreamCreate(&st) != cudaSuccess ||
        cudaDeviceGetDefaultMemPool(&mp, 0) != cudaSuccess ||
        cudaMemPoolSetAttribute(mp, cudaMemPoolAttrReleaseThreshold, &keep) != cudaSuccess)
        return -1;
    if (cudaMallocAsync(&d, bytes, st) != cudaSuccess) return -1; // warm-up: the pool grows once
    cudaFreeAsync(d, st);
    cudaStreamSynchronize(st);
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        if (cudaMallocAsync(&d, bytes, st) != cudaSuccess) return -1;
        cudaFreeAsync(d, st);
    }
    cudaStreamSynchronize(st);
    double ns = (now_s() - t0) * 1e9 / (double)n;
    cudaStreamDestroy(st);
    return ns;
}

// Device pool vs cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync, ns per pair (host-side
// cost: what a step that allocates pays), and the fragmenting workload on device 0.
static int bench_device(long iters) {
    static const size_t sizes[] = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("device: no CUDA device, skipped\n");
        return 0;
    }
    dsc_mem_pool *p;
    if (dsc_mem_pool_create(&p, 0, 0, NULL) != DSC_OK) return die("device pool");
    printf("\ndevice 0: alloc + free, ns per pair\n  %-10s %10s %16s %8s %18s %8s\n", "size",
           "dsc pool", "cudaMalloc/Free", "ratio", "cudaMallocAsync", "ratio");
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        long n = iters / 100 + 10;
        dsc_mem_handle h;
        void *d;
        dsc_mem_alloc(p, sizes[k], "bench", &h); // warm-up: the arena exists afterwards
        dsc_mem_free(p, h);
        double t0 = now_s();
        for (long i = 0; i < n; i++) {
            if (dsc_mem_alloc(p, sizes[k], "bench", &h) != DSC_OK) return die("device alloc");
            dsc_mem_free(p, h);
        }
        double t1 = now_s();
        for (long i = 0; i < n; i++) {
            if (cudaMalloc(&d, sizes[k]) != cudaSuccess) return die("cudaMalloc");
            cudaFree(d);
        }
        double t2 = now_s(), a = (t1 - t0) * 1e9 / (double)n, b = (t2 - t1) * 1e9 / (double)n;
        double c = async_pair_ns(sizes[k], iters / 10 + 10);
        if (c < 0) return die("cudaMallocAsync");
        char s[32];
        printf("  %-10s %10.1f %16.1f %7.0fx %18.1f %7.1fx\n",
               dsc_mem_format_bytes(sizes[k], s, sizeof s), a, b, b / a, c, c / a);
    }
    dsc_mem_pool_destroy(p);
    printf("device 0: fragmenting workload\n");
    for (size_t cap = 256 * MiB; cap <= 16384 * MiB; cap *= 8)
        if (fragmenting(0, cap, false) || fragmenting(0, cap, true)) return 1;
    return 0;
}
#endif

int main(int argc, char **argv) {
    long iters = argc > 1 ? strtol(argv[1], NULL, 10) : 200000;
    if (iters < 10) iters = 10;
    if (bench_sizes(iters) || bench_mixed_and_calls(iters)) return 1;
    printf(
        "fragmenting workload: 64 blocks fill the pool, every other one freed, then a request of "
        "a quarter of the pool\n");
    for (size_t cap = 64 * MiB; cap <= 1024 * MiB; cap *= 4)
        if (fragmenting(DSC_MEM_HOST, cap, false) || fragmenting(DSC_MEM_HOST, cap, true)) return 1;
#ifdef DSC_WITH_CUDA
    if (bench_device(iters)) return 1;
#endif
    return 0;
}
