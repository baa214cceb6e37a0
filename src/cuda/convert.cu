// cuda/convert.cu - scaling, 16-bit staging, host copies and events (see convert.h).
#include "cuda/convert.h"

#include "cuda/common.cuh" // DSC_CUDA_TRY, dsc_f32_bf16, dsc_f32_fp16

#define CONV_THREADS 256
#define CONV_MAX_BLOCKS 4096 // grid-stride beyond this: any n, and plenty to fill a GPU

static cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }

static unsigned conv_blocks(size_t n) {
    size_t b = (n + CONV_THREADS - 1) / CONV_THREADS;
    return (unsigned)(b < CONV_MAX_BLOCKS ? b : CONV_MAX_BLOCKS);
}

// fp16 bits -> fp32, as dsc_fp16_to_fp32 (subnormals exact: man * 2^-24).
__device__ static inline float fp16_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) return __uint_as_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) return __uint_as_float(sign | __float_as_uint(__fmul_rn((float)man, 0x1p-24f)));
    return __uint_as_float(sign | ((exp + 112) << 23) | (man << 13));
}

__global__ void scale_kernel(float *x, size_t n, float s) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], s);
}

__global__ void to16_kernel(uint16_t *dst, const float *src, size_t n, float s, bool fp16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = s == 1.0f ? src[i] : __fmul_rn(src[i], s);
        dst[i] = fp16 ? dsc_f32_fp16(v) : dsc_f32_bf16(v);
    }
}

__global__ void from16_kernel(float *dst, const uint16_t *src, size_t n, float s, bool fp16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = fp16 ? fp16_f32(src[i]) : dsc_bf16_f32(src[i]);
        dst[i] = s == 1.0f ? v : __fmul_rn(v, s);
    }
}

__global__ void add_kernel(float *dst, const float *src, const uint16_t *src16, size_t n,
                           bool fp16) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = src ? src[i] : fp16 ? fp16_f32(src16[i]) : dsc_bf16_f32(src16[i]);
        dst[i] = __fadd_rn(dst[i], v);
    }
}

static dsc_status add_any(float *dst, const float *src, const uint16_t *src16, size_t n,
                          bool fp16, void *stream) {
    DSC_CUDA_ARG((dst && (src || src16)) || n == 0, "add: NULL array");
    if (n == 0) return DSC_OK;
    add_kernel<<<conv_blocks(n), CONV_THREADS, 0, as_stream(stream)>>>(dst, src, src16, n, fp16);
    DSC_CUDA_LAUNCHED("add_kernel");
    return DSC_OK;
}

__global__ void acc_bf16_kernel(uint16_t *dst, const float *src, size_t n, bool first) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = dsc_f32_bf16(first ? src[i] : __fadd_rn(dsc_bf16_f32(dst[i]), src[i]));
}

extern "C" dsc_status dsc__cuda_acc_bf16(uint16_t *dst, const float *src, size_t n, bool first,
                                         void *stream) {
    DSC_CUDA_ARG((dst && src) || n == 0, "accumulate into bf16: NULL array");
    if (n == 0) return DSC_OK;
    acc_bf16_kernel<<<conv_blocks(n), CONV_THREADS, 0, as_stream(stream)>>>(dst, src, n, first);
    DSC_CUDA_LAUNCHED("acc_bf16_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_add(float *dst, const float *src, size_t n, void *stream) {
    return add_any(dst, src, NULL, n, false, stream);
}

extern "C" dsc_status dsc__cuda_add_from16(float *dst, const uint16_t *src, size_t n, bool fp16,
                                           void *stream) {
    return add_any(dst, NULL, src, n, fp16, stream);
}

extern "C" dsc_status dsc__cuda_copy(void *dst, const void *src, size_t bytes, void *stream) {
    if (bytes == 0) return DSC_OK;
    DSC_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_zero(void *dst, size_t bytes, void *stream) {
    if (bytes == 0) return DSC_OK;
    DSC_CUDA_TRY(cudaMemsetAsync(dst, 0, bytes, as_stream(stream)));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_scale(float *x, size_t n, float s, void *stream) {
    DSC_CUDA_ARG(x || n == 0, "scale: NULL array");
    if (n == 0 || s == 1.0f) return DSC_OK;
    scale_kernel<<<conv_blocks(n), CONV_THREADS, 0, as_stream(stream)>>>(x, n, s);
    DSC_CUDA_LAUNCHED("scale_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_to16(uint16_t *dst, const float *src, size_t n, float scale,
                                     bool fp16, void *stream) {
    DSC_CUDA_ARG((dst && src) || n == 0, "to16: NULL array");
    if (n == 0) return DSC_OK;
    to16_kernel<<<conv_blocks(n), CONV_THREADS, 0, as_stream(stream)>>>(dst, src, n, scale, fp16);
    DSC_CUDA_LAUNCHED("to16_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_from16(float *dst, const uint16_t *src, size_t n, float scale,
                                       bool fp16, void *stream) {
    DSC_CUDA_ARG((dst && src) || n == 0, "from16: NULL array");
    if (n == 0) return DSC_OK;
    from16_kernel<<<conv_blocks(n), CONV_THREADS, 0, as_stream(stream)>>>(dst, src, n, scale,
                                                                           fp16);
    DSC_CUDA_LAUNCHED("from16_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_to_host(void *host, const void *dev, size_t bytes, void *stream) {
    if (bytes == 0) return DSC_OK;
    DSC_CUDA_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
    DSC_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_to_device(void *dev, const void *host, size_t bytes,
                                          void *stream) {
    if (bytes == 0) return DSC_OK;
    DSC_CUDA_TRY(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
    DSC_CUDA_TRY(cudaStreamSynchronize(as_stream(stream)));
    return DSC_OK;
}

// ---- events ----

extern "C" dsc_status dsc__cuda_event_create(void **ev) {
    cudaEvent_t e = NULL;
    DSC_CUDA_TRY(cudaEventCreate(&e));
    *ev = (void *)e;
    return DSC_OK;
}

extern "C" void dsc__cuda_event_destroy(void *ev) {
    if (ev) (void)cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" dsc_status dsc__cuda_event_record(void *ev, void *stream) {
    DSC_CUDA_ARG(ev != NULL, "event record: NULL event");
    DSC_CUDA_TRY(cudaEventRecord((cudaEvent_t)ev, as_stream(stream)));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_stream_wait_event(void *stream, void *ev) {
    DSC_CUDA_ARG(ev != NULL, "stream wait: NULL event");
    DSC_CUDA_TRY(cudaStreamWaitEvent(as_stream(stream), (cudaEvent_t)ev, 0));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_to_host_async(void *host, const void *dev, size_t bytes,
                                              void *stream) {
    if (bytes == 0) return DSC_OK;
    DSC_CUDA_TRY(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_event_wait(void *ev) {
    DSC_CUDA_ARG(ev != NULL, "event wait: NULL event");
    DSC_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)ev));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_stream_create(void **stream) {
    cudaStream_t st = NULL;
    DSC_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    *stream = (void *)st;
    return DSC_OK;
}

extern "C" void dsc__cuda_stream_destroy(void *stream) {
    if (!stream) return;
    (void)cudaStreamSynchronize(as_stream(stream));
    (void)cudaStreamDestroy(as_stream(stream));
}

extern "C" dsc_status dsc__cuda_host_alloc(void **p, size_t bytes) {
    *p = NULL;
    cudaError_t e = cudaMallocHost(p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        return dsc__fail(DSC_ERR_OOM, "page-locked host memory: %zu bytes: %s", bytes,
                         cudaGetErrorString(e));
    }
    return DSC_OK;
}

extern "C" void dsc__cuda_host_free(void *p) {
    if (p) (void)cudaFreeHost(p);
}
