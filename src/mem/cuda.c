// mem/cuda.c - the device back end: arenas from cudaMalloc, moves as device-to-device copies on
// the pool's stream. Compiled only in CUDA builds (DSC_WITH_CUDA).
//
// cudaMemcpy does not allow overlapping ranges, but compaction slides a block down by a gap that
// may be smaller than the block. Such a move is split into pieces no longer than the gap, each
// copied in stream order (a piece overwrites only bytes already copied); when the gap is small the
// pieces go through an 8 MiB staging buffer instead (two copies per piece, but few pieces). The
// staging buffer is made at the first such move and kept with the pool.
#ifdef DSC_WITH_CUDA

#include <cuda_runtime_api.h> // cudaMalloc, cudaMemcpyAsync, ...
#include <stdio.h>            // snprintf

#include "base/status.h"   // dsc__fail
#include "mem/cuda.h"      // dsc__mem_cuda_host_register
#include "mem/pool_impl.h" // dsc__mem_backend

#define STAGE_BYTES ((size_t)8 << 20)

static dsc_status cuda_fail(const dsc_mem_pool *p, cudaError_t e, const char *what) {
    cudaGetLastError(); // clear the runtime's last-error state (non-sticky errors)
    return dsc__fail(DSC_ERR_CUDA, "%s: %s failed: %s", p->name, what, cudaGetErrorString(e));
}

static dsc_status cuda_reserve(dsc_mem_pool *p, size_t bytes, uintptr_t *base) {
    void *m = NULL;
    cudaError_t e = cudaSetDevice(p->device);
    if (e != cudaSuccess) return cuda_fail(p, e, "cudaSetDevice");
    e = cudaMalloc(&m, bytes);
    if (e == cudaErrorMemoryAllocation) {
        size_t fr = 0, tot = 0;
        char b[3][32];
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        return dsc__fail(DSC_ERR_OOM, "%s: cudaMalloc of %s failed (the device has %s free of %s)",
                         p->name, dsc_mem_format_bytes(bytes, b[0], 32),
                         dsc_mem_format_bytes(fr, b[1], 32), dsc_mem_format_bytes(tot, b[2], 32));
    }
    if (e != cudaSuccess) return cuda_fail(p, e, "cudaMalloc");
    *base = (uintptr_t)m;
    return DSC_OK;
}

static void cuda_release(dsc_mem_pool *p, uintptr_t base, size_t bytes) {
    cudaSetDevice(p->device);
    cudaFree((void *)base);
}

static dsc_status copy(dsc_mem_pool *p, uintptr_t dst, uintptr_t src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync((void *)dst, (const void *)src, bytes, cudaMemcpyDeviceToDevice,
                                    (cudaStream_t)p->stream);
    return e == cudaSuccess ? DSC_OK : cuda_fail(p, e, "cudaMemcpyAsync (defragmentation)");
}

static dsc_status cuda_move(dsc_mem_pool *p, uintptr_t dst, uintptr_t src, size_t bytes) {
    size_t gap = src - dst;
    if (gap >= bytes) return copy(p, dst, src, bytes);
    if (gap < STAGE_BYTES && !p->be_state) {
        cudaSetDevice(p->device);
        if (cudaMalloc(&p->be_state, STAGE_BYTES) != cudaSuccess) {
            cudaGetLastError();
            p->be_state = NULL; // fall back to gap-sized pieces
        } else {
            p->st.system_allocs++;
        }
    }
    size_t piece = gap >= STAGE_BYTES || !p->be_state ? gap : STAGE_BYTES;
    for (size_t off = 0; off < bytes; off += piece) {
        size_t n = bytes - off < piece ? bytes - off : piece;
        if (piece == gap) {
            DSC_TRY(copy(p, dst + off, src + off, n));
            continue;
        }
        DSC_TRY(copy(p, (uintptr_t)p->be_state, src + off, n));
        DSC_TRY(copy(p, dst + off, (uintptr_t)p->be_state, n));
    }
    return DSC_OK;
}

static dsc_status cuda_sync(dsc_mem_pool *p) {
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)p->stream);
    return e == cudaSuccess ? DSC_OK : cuda_fail(p, e, "cudaStreamSynchronize (defragmentation)");
}

static void cuda_fini(dsc_mem_pool *p) {
    if (!p->be_state) return;
    cudaSetDevice(p->device);
    cudaFree(p->be_state);
    p->be_state = NULL;
}

const dsc__mem_backend dsc__mem_cuda_backend = {
    .name = "cuda",
    .reserve = cuda_reserve,
    .release = cuda_release,
    .move = cuda_move,
    .sync = cuda_sync,
    .fini = cuda_fini,
};

bool dsc__mem_cuda_host_register(void *ptr, size_t bytes, char *reason, size_t reason_len) {
    cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable);
    if (e == cudaSuccess) return true;
    cudaGetLastError();
    snprintf(reason, reason_len, "cudaHostRegister: %s", cudaGetErrorString(e));
    return false;
}

void dsc__mem_cuda_host_unregister(void *ptr) {
    if (cudaHostUnregister(ptr) != cudaSuccess) cudaGetLastError();
}

#else
typedef int dsc__mem_cuda_absent; // ISO C wants a declaration in every translation unit
#endif
