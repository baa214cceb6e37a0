// cuda/fp8.cu - per-tensor FP8 quantization of bf16 tensors (see fp8.h).
#include "cuda/fp8.h"

#include "cuda/common.cuh" // DSC_CUDA_TRY, DSC_CUDA_ARG, dsc_unpack8, dsc_block_max
#include "cuda/matmul.h"   // DSC_CUDA_E4M3, DSC_CUDA_E5M2

#if !DSC_HIP
#include <cuda_fp8.h> // __nv_cvt_float2_to_fp8x2
#endif

#define AMAX_THREADS 256
#define AMAX_BLOCKS 1024 // grid-stride: enough blocks to fill any current GPU
#define TILE 64          // the transposing quantizer's square tile

extern "C" float dsc__fp8_max(int fmt) { return fmt == DSC_CUDA_E5M2 ? 57344.0f : 448.0f; }

#if !DSC_HIP

static cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }

extern "C" dsc_status dsc__cuda_fp8_supported(void) {
    int dev = 0;
    cudaDeviceProp p;
    DSC_CUDA_TRY(cudaGetDevice(&dev));
    DSC_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    if (p.major * 10 + p.minor >= 89) return DSC_OK;
    return dsc__fail(DSC_ERR_UNSUPPORTED,
                     "fp8: this GPU (%s, compute capability %d.%d) has no FP8 tensor cores; FP8 "
                     "products need compute capability 8.9 or later (Ada, Hopper): remove the "
                     "fp8 section or set fp8.enabled false",
                     p.name, p.major, p.minor);
}

// Non-negative floats order as their bit patterns: the maximum is an integer atomicMax.
__global__ void amax_kernel(float *amax, const uint16_t *x, long long rows, int cols,
                            long long ld) {
    __shared__ float sh[DSC_MAX_WARPS];
    long long per_row = cols / 8, n = rows * per_row;
    float m = 0.0f;
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < n;
         v += (long long)gridDim.x * blockDim.x) {
        long long r = v / per_row, c = (v - r * per_row) * 8;
        float f[8];
        dsc_unpack8(*(const uint4 *)(x + r * ld + c), f);
#pragma unroll
        for (int i = 0; i < 8; i++)
            m = fmaxf(m, fabsf(f[i])); // fmaxf drops a NaN operand
    }
    m = dsc_block_max(m, sh);
    if (threadIdx.x == 0 && m > 0.0f) atomicMax((unsigned int *)amax, __float_as_uint(m));
}

extern "C" dsc_status dsc__cuda_amax_bf16(float *amax, const uint16_t *x, int64_t rows, int cols,
                                          int64_t ld, void *stream) {
    DSC_CUDA_ARG(amax && x && rows >= 0 && cols > 0 && cols % 8 == 0 && ld >= cols && ld % 8 == 0 &&
                     dsc__aligned16(x),
                 "fp8 amax: bad arguments (rows %lld cols %d ld %lld; cols and ld multiples of "
                 "8, x 16-byte aligned)", (long long)rows, cols, (long long)ld);
    DSC_CUDA_TRY(cudaMemsetAsync(amax, 0, sizeof(float), as_stream(stream)));
    long long n = rows * (long long)(cols / 8);
    if (n == 0) return DSC_OK;
    unsigned blocks = dsc__blocks(n, AMAX_THREADS);
    if (blocks > AMAX_BLOCKS) blocks = AMAX_BLOCKS;
    amax_kernel<<<blocks, AMAX_THREADS, 0, as_stream(stream)>>>(amax, x, rows, cols, ld);
    DSC_CUDA_LAUNCHED("amax_kernel");
    return DSC_OK;
}

// The scale that maps amax onto the format's largest finite value, over 2^margin.
__device__ static inline float fp8_scale(const float *amax, float fmax, int margin) {
    float a = *amax;
    if (!(a > 0.0f) || !isfinite(a)) return 1.0f;
    float s = ldexpf(fmax / a, -margin);
    return isfinite(s) ? s : 0x1p126f;
}

template <int FMT> __device__ static inline uint16_t cvt2(float a, float b) {
    return (uint16_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                              FMT == DSC_CUDA_E5M2 ? __NV_E5M2 : __NV_E4M3);
}

template <int FMT>
__global__ void quantize_kernel(uint8_t *q, float *inv, const uint16_t *x, long long rows, int cols,
                                long long ld, const float *amax, float fmax, int margin) {
    float s = fp8_scale(amax, fmax, margin);
    if (blockIdx.x == 0 && threadIdx.x == 0) *inv = 1.0f / s;
    long long per_row = cols / 8, n = rows * per_row;
    for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < n;
         v += (long long)gridDim.x * blockDim.x) {
        long long r = v / per_row, c = (v - r * per_row) * 8;
        float f[8];
        dsc_unpack8(*(const uint4 *)(x + r * ld + c), f);
        uint2 o;
        o.x = (uint32_t)cvt2<FMT>(f[0] * s, f[1] * s) | ((uint32_t)cvt2<FMT>(f[2] * s, f[3] * s) << 16);
        o.y = (uint32_t)cvt2<FMT>(f[4] * s, f[5] * s) | ((uint32_t)cvt2<FMT>(f[6] * s, f[7] * s) << 16);
        *(uint2 *)(q + r * cols + c) = o;
    }
}

// One TILE x TILE block of x (rows r0.., columns c0..) through shared memory: q[c][r] for its
// columns, 16 consecutive rows (16 bytes) per thread and store.
template <int FMT>
__global__ void quantize_t_kernel(uint8_t *q, uint8_t *q2, float *inv, const uint16_t *x,
                                  long long rows, int cols, long long ld, const float *amax,
                                  float fmax, int margin) {
    __shared__ float tile[TILE][TILE + 1];
    float s = fp8_scale(amax, fmax, margin);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) *inv = 1.0f / s;
    long long r0 = (long long)blockIdx.y * TILE;
    int c0 = blockIdx.x * TILE;
    // load: TILE rows of TILE / 8 vectors
    for (int v = threadIdx.x; v < TILE * TILE / 8; v += blockDim.x) {
        int rr = v / (TILE / 8), cc = (v % (TILE / 8)) * 8;
        long long r = r0 + rr;
        int c = c0 + cc;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < rows && c < cols) dsc_unpack8(*(const uint4 *)(x + r * ld + c), f);
#pragma unroll
        for (int i = 0; i < 8; i++)
            tile[rr][cc + i] = f[i] * s;
        if (q2 && r < rows && c < cols) { // the untransposed copy too, from the same load
            uint2 o;
            o.x = (uint32_t)cvt2<FMT>(f[0] * s, f[1] * s) |
                  ((uint32_t)cvt2<FMT>(f[2] * s, f[3] * s) << 16);
            o.y = (uint32_t)cvt2<FMT>(f[4] * s, f[5] * s) |
                  ((uint32_t)cvt2<FMT>(f[6] * s, f[7] * s) << 16);
            *(uint2 *)(q2 + r * cols + c) = o;
        }
    }
    __syncthreads();
    // store: TILE columns of TILE / 16 segments of 16 rows
    for (int v = threadIdx.x; v < TILE * TILE / 16; v += blockDim.x) {
        int cc = v / (TILE / 16), rr = (v % (TILE / 16)) * 16;
        int c = c0 + cc;
        long long r = r0 + rr;
        if (c >= cols || r >= rows) continue; // rows is a multiple of 16: a whole segment
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            w[i] = (uint32_t)cvt2<FMT>(tile[rr + 4 * i][cc], tile[rr + 4 * i + 1][cc]) |
                   ((uint32_t)cvt2<FMT>(tile[rr + 4 * i + 2][cc], tile[rr + 4 * i + 3][cc]) << 16);
        *(uint4 *)(q + (long long)c * rows + r) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

extern "C" dsc_status dsc__cuda_fp8_quantize(uint8_t *q, float *inv, const uint16_t *x,
                                             int64_t rows, int cols, int64_t ld, const float *amax,
                                             int fmt, int margin, bool trans, void *stream) {
    return dsc__cuda_fp8_quantize2(q, NULL, inv, x, rows, cols, ld, amax, fmt, margin, trans,
                                   stream);
}

extern "C" dsc_status dsc__cuda_fp8_quantize2(uint8_t *q, uint8_t *q2, float *inv,
                                              const uint16_t *x, int64_t rows, int cols,
                                              int64_t ld, const float *amax, int fmt, int margin,
                                              bool trans, void *stream) {
    DSC_CUDA_ARG(q && inv && x && amax && rows >= 0 && cols > 0 && cols % 8 == 0 && ld >= cols &&
                     ld % 8 == 0 && dsc__aligned16(x) && dsc__aligned16(q) &&
                     (!q2 || (trans && dsc__aligned16(q2))) &&
                     (fmt == DSC_CUDA_E4M3 || fmt == DSC_CUDA_E5M2) && margin >= 0 && margin < 64 &&
                     (!trans || rows % 16 == 0),
                 "fp8 quantize: bad arguments (rows %lld cols %d ld %lld fmt %d margin %d trans "
                 "%d; cols and ld multiples of 8, rows of 16 when transposed, 16-byte aligned)",
                 (long long)rows, cols, (long long)ld, fmt, margin, (int)trans);
    if (rows == 0) return DSC_OK;
    float fmax = dsc__fp8_max(fmt);
    cudaStream_t st = as_stream(stream);
    if (trans) {
        dim3 grid((unsigned)((cols + TILE - 1) / TILE), (unsigned)((rows + TILE - 1) / TILE));
        if (fmt == DSC_CUDA_E5M2)
            quantize_t_kernel<DSC_CUDA_E5M2><<<grid, 256, 0, st>>>(q, q2, inv, x, rows, cols, ld,
                                                                  amax, fmax, margin);
        else
            quantize_t_kernel<DSC_CUDA_E4M3><<<grid, 256, 0, st>>>(q, q2, inv, x, rows, cols, ld,
                                                                  amax, fmax, margin);
        DSC_CUDA_LAUNCHED("quantize_t_kernel");
        return DSC_OK;
    }
    long long n = rows * (long long)(cols / 8);
    unsigned blocks = dsc__blocks(n, AMAX_THREADS);
    if (blocks > 8 * AMAX_BLOCKS) blocks = 8 * AMAX_BLOCKS;
    if (fmt == DSC_CUDA_E5M2)
        quantize_kernel<DSC_CUDA_E5M2><<<blocks, AMAX_THREADS, 0, st>>>(q, inv, x, rows, cols, ld,
                                                                       amax, fmax, margin);
    else
        quantize_kernel<DSC_CUDA_E4M3><<<blocks, AMAX_THREADS, 0, st>>>(q, inv, x, rows, cols, ld,
                                                                       amax, fmax, margin);
    DSC_CUDA_LAUNCHED("quantize_kernel");
    return DSC_OK;
}

#else // HIP: no FP8 products in this build

static dsc_status no_fp8(void) {
    return dsc__fail(DSC_ERR_UNSUPPORTED, "fp8: FP8 products are built for NVIDIA GPUs only "
                     "(compute capability 8.9 or later); remove the fp8 section");
}

extern "C" dsc_status dsc__cuda_fp8_supported(void) { return no_fp8(); }

extern "C" dsc_status dsc__cuda_amax_bf16(float *amax, const uint16_t *x, int64_t rows, int cols,
                                          int64_t ld, void *stream) {
    (void)amax, (void)x, (void)rows, (void)cols, (void)ld, (void)stream;
    return no_fp8();
}

extern "C" dsc_status dsc__cuda_fp8_quantize(uint8_t *q, float *inv, const uint16_t *x,
                                             int64_t rows, int cols, int64_t ld, const float *amax,
                                             int fmt, int margin, bool trans, void *stream) {
    (void)q, (void)inv, (void)x, (void)rows, (void)cols, (void)ld, (void)amax, (void)fmt;
    (void)margin, (void)trans, (void)stream;
    return no_fp8();
}

extern "C" dsc_status dsc__cuda_fp8_quantize2(uint8_t *q, uint8_t *q2, float *inv,
                                              const uint16_t *x, int64_t rows, int cols,
                                              int64_t ld, const float *amax, int fmt, int margin,
                                              bool trans, void *stream) {
    (void)q2;
    return dsc__cuda_fp8_quantize(q, inv, x, rows, cols, ld, amax, fmt, margin, trans, stream);
}

#endif
