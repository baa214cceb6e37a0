// cuda/devbuf.cu - device buffers from a pool or cudaMalloc (see devbuf.h).
#include "cuda/devbuf.h"

#include "cuda/common.cuh" // dsc__cuda_fail, vendor names

static dsc_status oom(const char *tag, size_t bytes, const char *why) {
    size_t fr = 0, tot = 0;
    (void)cudaMemGetInfo(&fr, &tot);
    (void)cudaGetLastError();
    return dsc__fail(DSC_ERR_OOM, "device buffer %s: %.3f GiB do not fit (%s; the device has "
                     "%.2f GiB free of %.2f); use a smaller model or micro batch, or "
                     "zero_optimization.offload_optimizer.device \"cpu\"", tag,
                     bytes / 1073741824.0, why, fr / 1073741824.0, tot / 1073741824.0);
}

extern "C" dsc_status dsc__cuda_buf_alloc(dsc_cuda_buf *b, dsc_mem_pool *pool, size_t bytes,
                                          const char *tag) {
    *b = dsc_cuda_buf{NULL, NULL, 0};
    if (pool) {
        dsc_mem_handle h = 0;
        dsc_status st = dsc_mem_alloc(pool, bytes, tag, &h);
        if (st == DSC_ERR_OOM) {
            char why[512]; // oom() writes the buffer dsc_last_error() points to: copy first
            snprintf(why, sizeof why, "%s", dsc_last_error());
            return oom(tag, bytes, why);
        }
        DSC_TRY(st);
        *b = dsc_cuda_buf{dsc_mem_ptr(pool, h), pool, h};
        return DSC_OK;
    }
    cudaError_t e = cudaMalloc(&b->ptr, bytes);
    if (e == cudaErrorMemoryAllocation) {
        b->ptr = NULL;
        return oom(tag, bytes, "cudaMalloc");
    }
    if (e != cudaSuccess) b->ptr = NULL;
    DSC_CUDA_CHECK_AS(e, tag);
    return DSC_OK;
}

extern "C" void dsc__cuda_buf_free(dsc_cuda_buf *b) {
    if (b->pool) dsc_mem_free(b->pool, b->h);
    else if (b->ptr) (void)cudaFree(b->ptr);
    *b = dsc_cuda_buf{NULL, NULL, 0};
}
