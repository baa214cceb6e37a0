// engine/gpu/buffers.c - device buffers and copies for programs that embed libdsc (dsc/device.h).
#include "dsc/device.h"

#include "base/status.h" // dsc__fail
#include "dsc/comm.h"    // dsc_comm_env

#ifdef DSC_WITH_CUDA

#include "cuda/convert.h"           // dsc__cuda_to_device, dsc__cuda_to_host
#include "cuda/devbuf.h"            // dsc__cuda_buf_*
#include "engine/gpu/train_state.h" // dsc__cuda_device_info, _select_device, _mem_info

dsc_status dsc_device_select(int *device) {
    char name[256];
    double peak;
    DSC_TRY(dsc__cuda_device_info(name, sizeof name, &peak)); // says why no device is usable
    dsc_comm_env_info env;
    DSC_TRY(dsc_comm_env(&env));
    int count = 0;
    return dsc__cuda_select_device(env.local_rank, device, &count);
}

dsc_status dsc_device_mem_info(int64_t *free_bytes, int64_t *total_bytes) {
    *free_bytes = *total_bytes = -1;
    int device;
    DSC_TRY(dsc_device_select(&device));
    size_t fr, tot;
    DSC_TRY(dsc__cuda_mem_info(&fr, &tot));
    *free_bytes = (int64_t)fr;
    *total_bytes = (int64_t)tot;
    return DSC_OK;
}

dsc_status dsc_device_alloc(void **ptr, size_t bytes, const char *tag) {
    dsc_cuda_buf b;
    dsc_status st = dsc__cuda_buf_alloc(&b, NULL, bytes, tag);
    *ptr = b.ptr;
    return st;
}

void dsc_device_free(void *ptr) {
    dsc_cuda_buf b = {.ptr = ptr}; // from cudaMalloc (no pool)
    dsc__cuda_buf_free(&b);
}

dsc_status dsc_device_to_device(void *dev, const void *host, size_t bytes) {
    return dsc__cuda_to_device(dev, host, bytes, NULL);
}

dsc_status dsc_device_to_host(void *host, const void *dev, size_t bytes) {
    return dsc__cuda_to_host(host, dev, bytes, NULL);
}

#else // a build without the CUDA kernels

static dsc_status no_cuda(void) {
    return dsc__fail(DSC_ERR_UNSUPPORTED, "device buffers: this dsc was built without the CUDA "
                     "kernels (nvcc was not found, or -DDSC_CUDA=OFF); rebuild with the CUDA "
                     "toolkit on PATH");
}

dsc_status dsc_device_select(int *device) {
    *device = 0;
    return no_cuda();
}
dsc_status dsc_device_mem_info(int64_t *free_bytes, int64_t *total_bytes) {
    *free_bytes = *total_bytes = -1;
    return no_cuda();
}
dsc_status dsc_device_alloc(void **ptr, size_t bytes, const char *tag) {
    *ptr = NULL;
    return no_cuda();
}
void dsc_device_free(void *ptr) {}
dsc_status dsc_device_to_device(void *dev, const void *host, size_t bytes) { return no_cuda(); }
dsc_status dsc_device_to_host(void *host, const void *dev, size_t bytes) { return no_cuda(); }

#endif
