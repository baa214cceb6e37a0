// cuda/decode_common.cu - see decode_common.h.
#include "cuda/decode_common.h"

#include <string.h> // memcpy, memset

#include "cuda/common.cuh" // DSC_CUDA_TRY, DSC_CUDA_LAUNCHED

#define ARGMAX_THREADS 256
#define LOGITS_ALIGN 64 // logits rows padded to a multiple of this many columns

// One block per row: each thread the best of its strided columns, then a fixed-order tree in
// shared memory.
static __global__ void argmax_kernel(int32_t *out, const float *logits, int V, int ld) {
    __shared__ float sv[ARGMAX_THREADS];
    __shared__ int si[ARGMAX_THREADS];
    const float *row = logits + (size_t)blockIdx.x * ld;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        float x = row[v];
        if (x > bv || (x == bv && v < bi)) bv = x, bi = v;
    }
    sv[threadIdx.x] = bv, si[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s) {
            float ov = sv[threadIdx.x + s];
            int oi = si[threadIdx.x + s];
            if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x]))
                sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] < V ? si[0] : 0;
}

extern "C" int dsc__cuda_decode_logits_ld(int V) {
    return (V + LOGITS_ALIGN - 1) / LOGITS_ALIGN * LOGITS_ALIGN;
}

extern "C" dsc_status dsc__cuda_decode_head(dsc_cuda_blas *h, float *logits, int ld,
                                            const uint16_t *ln, const uint16_t *w, int n, int C,
                                            int V, void *stream) {
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.trans_b = 1, g.M = n, g.N = V, g.K = C;
    g.A = ln, g.lda = C, g.B = w, g.ldb = C;
    g.D = logits, g.ldd = ld, g.d_fp32 = 1, g.alpha = 1.0f;
    return dsc__cuda_gemm(h, &g, stream);
}

extern "C" dsc_status dsc__cuda_decode_argmax(int32_t *out, const float *logits, int n, int V,
                                              int ld, void *stream) {
    argmax_kernel<<<n, ARGMAX_THREADS, 0, (cudaStream_t)stream>>>(out, logits, V, ld);
    DSC_CUDA_LAUNCHED("argmax_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_decode_tokens_read(int32_t *tokens, int32_t *staging,
                                                   const int32_t *chosen, int n, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    DSC_CUDA_TRY(
        cudaMemcpyAsync(staging, chosen, sizeof(int32_t) * n, cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    memcpy(tokens, staging, sizeof(int32_t) * n);
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_decode_logits_read(float *logits, float *staging,
                                                   const float *dev, int n, int V, int ld,
                                                   void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    DSC_CUDA_TRY(cudaMemcpyAsync(staging, dev, sizeof(float) * n * ld, cudaMemcpyDeviceToHost,
                                 st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    for (int b = 0; b < n; b++)
        memcpy(logits + (size_t)b * V, staging + (size_t)b * ld, sizeof(float) * V);
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_decode_smem_limit(const void *kernel, size_t need,
                                                  const char *who, int max_len) {
    if (need <= 48 * 1024) return DSC_OK;
    int dev = 0, most = 0;
    DSC_CUDA_TRY(cudaGetDevice(&dev));
    DSC_CUDA_TRY(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    DSC_CUDA_ARG(need <= (size_t)most,
                 "%s: %d positions need %zu bytes of shared memory per block for the attention "
                 "scores, the device allows %d; generate fewer tokens",
                 who, max_len, need, most);
    DSC_CUDA_TRY(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)need));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_decode_check_token(const char *who, int32_t tok, int V, int b,
                                                   int t) {
    if (tok >= 0 && tok < V) return DSC_OK;
    return dsc__fail(DSC_ERR_INVALID_ARG,
                     "%s: token %d of row %d (position %d) is outside the vocabulary [0, %d); "
                     "check the tokenizer",
                     who, tok, b, t, V);
}
