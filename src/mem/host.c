// mem/host.c - the host back end: arenas from anonymous mmap, optionally page-locked.
//
// Page-locking happens once per arena, when it is reserved (a pinned pool with a capacity has one
// arena, locked at creation). CUDA builds register the arena with the driver (cudaHostRegister),
// so that copies from and to it run as DMA without staging; other builds mlock it, so that it is
// never swapped out. Where the system refuses (RLIMIT_MEMLOCK, no driver), the arena stays
// pageable: the pool works, slower, and one note per process says so.
#include <errno.h>     // errno
#include <stdatomic.h> // atomic_flag
#include <stdio.h>     // snprintf
#include <string.h>    // memmove, strerror
#include <sys/mman.h>  // mmap, munmap, mlock

#include "base/log.h"      // DSC_WARN
#include "base/status.h"   // dsc__fail
#include "mem/pool_impl.h" // dsc__mem_backend
#ifdef DSC_WITH_CUDA
#include "mem/cuda.h" // dsc__mem_cuda_host_register
#endif

static atomic_flag pin_note_given = ATOMIC_FLAG_INIT;

// Page-locks an arena; on refusal marks the pool as not pinned and notes it once per process.
static void pin(dsc_mem_pool *p, void *m, size_t bytes) {
    char reason[160];
#ifdef DSC_WITH_CUDA
    if (dsc__mem_cuda_host_register(m, bytes, reason, sizeof reason)) return;
#else
    if (mlock(m, bytes) == 0) return;
    snprintf(reason, sizeof reason, "mlock: %s", strerror(errno));
#endif
    p->pinned_ok = false;
    if (!atomic_flag_test_and_set(&pin_note_given)) {
        char b[32];
        DSC_WARN(
            "mem",
            "%s: could not page-lock %s of host memory (%s); it stays pageable, so "
            "offload copies may be slower. Raise the locked-memory limit (ulimit -l) to pin it.",
            p->name, dsc_mem_format_bytes(bytes, b, sizeof b), reason);
    }
}

static dsc_status host_reserve(dsc_mem_pool *p, size_t bytes, uintptr_t *base) {
    void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        char b[32];
        return dsc__fail(DSC_ERR_OOM, "%s: the system refused %s more (mmap: %s)", p->name,
                         dsc_mem_format_bytes(bytes, b, sizeof b), strerror(errno));
    }
#ifdef MADV_HUGEPAGE
    // Transparent huge pages where the system offers them: a model's state is tens of GB, and
    // first-touching it 4 KiB at a time costs millions of page faults (a hint; failure is fine).
    if (bytes >= ((size_t)2 << 20)) (void)madvise(m, bytes, MADV_HUGEPAGE);
#endif
    if (p->pinned) pin(p, m, bytes);
    *base = (uintptr_t)m;
    return DSC_OK;
}

static void host_release(dsc_mem_pool *p, uintptr_t base, size_t bytes) {
#ifdef DSC_WITH_CUDA
    if (p->pinned) dsc__mem_cuda_host_unregister((void *)base);
#endif
    munmap((void *)base, bytes); // also unlocks mlocked pages
}

static dsc_status host_move(dsc_mem_pool *p, uintptr_t dst, uintptr_t src, size_t bytes) {
    memmove((void *)dst, (const void *)src, bytes);
    return DSC_OK;
}

const dsc__mem_backend dsc__mem_host_backend = {
    .name = "host",
    .reserve = host_reserve,
    .release = host_release,
    .move = host_move,
};
