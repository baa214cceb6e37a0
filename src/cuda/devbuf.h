// cuda/devbuf.h - a device buffer taken from a dsc memory pool (dsc/memory.h) or, without a pool,
// from cudaMalloc.
//
// The trainer hands one device pool to everything it allocates on the GPU (training state,
// activations, the matmul workspace), so that the pool's statistics account for every byte and
// show that a step allocates nothing from the system. Such a pool must never move blocks
// (created with no_defrag_on_oom and never defragmented): the kernels keep raw addresses.
// Without a pool (tests, stand-alone use) the buffer is a plain cudaMalloc.
#ifndef DSC_CUDA_DEVBUF_H
#define DSC_CUDA_DEVBUF_H

#include <stddef.h> // size_t

#include "dsc/memory.h" // dsc_mem_pool, dsc_mem_handle
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_cuda_buf {
    void *ptr;          // device address, NULL when empty
    dsc_mem_pool *pool; // borrowed; NULL: ptr came from cudaMalloc
    dsc_mem_handle h;
} dsc_cuda_buf;

// bytes on the current device (pool: a block tagged `tag`; its device must be the current one).
// On failure b is empty and DSC_ERR_OOM names `tag`, the request and the device's free memory.
dsc_status dsc__cuda_buf_alloc(dsc_cuda_buf *b, dsc_mem_pool *pool, size_t bytes, const char *tag);
void dsc__cuda_buf_free(dsc_cuda_buf *b); // empty ok; afterwards b is empty

#ifdef __cplusplus
}
#endif
#endif
