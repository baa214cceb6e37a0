// cuda/common.cuh - what every .cu file of dsc shares: error translation, bf16/fp16 bit
// conversions, warp and block reductions, launch sizing. C++ (nvcc/hipcc) only.
//
// 16-bit tensors are passed around as raw bits (uint16_t) rather than __nv_bfloat16 / __half, so
// that the C headers need no vendor types and the HIP build needs no 16-bit headers: conversions
// are done here, bit-exactly as dsc/half.h does them on the CPU (round to nearest even, NaN kept
// quiet). Kernels that take either storage type are templates on `bool F16` and convert through
// dsc_16_f32 / dsc_f32_16 / dsc_unpack8_16 / dsc_pack8_16.
#ifndef DSC_CUDA_COMMON_CUH
#define DSC_CUDA_COMMON_CUH

#include <math.h>   // INFINITY
#include <stdint.h> // uint16_t, uint32_t, uintptr_t
#include <string.h> // strrchr

#include "cuda/vendor.h" // cuda* (or hip*), DSC_WARP_SIZE, dsc_shfl_xor
#if !DSC_HIP
#include <cuda_fp16.h> // __half2float, __float2half_rn (the device pass's fp16 conversions)
#endif

extern "C" {
#include "base/status.h" // dsc__fail
}

// ---- errors ----

// Records "what failed where, and why" for dsc_last_error() and returns DSC_ERR_CUDA. The
// runtime's last error is cleared so that the next check does not report it again.
static inline dsc_status dsc__cuda_fail(cudaError_t e, const char *what, const char *file,
                                        int line) {
    const char *base = strrchr(file, '/');
    (void)cudaGetLastError();
    return dsc__fail(DSC_ERR_CUDA,
                     "%s failed (%s:%d): %s; check that a GPU is visible (nvidia-smi) and, for "
                     "a kernel fault, rerun under compute-sanitizer",
                     what, base ? base + 1 : file, line, cudaGetErrorString(e));
}

// The one generator of the check macros: evaluate a runtime call, translate a failure.
#define DSC_CUDA_CHECK_AS(expr, what)                                                              \
    do {                                                                                           \
        cudaError_t dsc__e_ = (expr);                                                              \
        if (dsc__e_ != cudaSuccess) return dsc__cuda_fail(dsc__e_, what, __FILE__, __LINE__);      \
    } while (0)
#define DSC_CUDA_TRY(expr) DSC_CUDA_CHECK_AS(expr, #expr)
// After every kernel launch: a bad configuration shows up here, not at the next call.
#define DSC_CUDA_LAUNCHED(kernel) DSC_CUDA_CHECK_AS(cudaGetLastError(), "launch of " kernel)

#define DSC_CUDA_ARG(cond, ...)                                                                    \
    do {                                                                                           \
        if (!(cond)) return dsc__fail(DSC_ERR_INVALID_ARG, __VA_ARGS__);                           \
    } while (0)

// ---- 16-bit formats ----

__host__ __device__ static inline float dsc_bf16_f32(uint16_t b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __uint_as_float((uint32_t)b << 16);
#else
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

__device__ static inline uint16_t dsc_f32_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040); // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

// The same rounding as dsc_fp32_to_fp16 (overflow to inf, subnormals rounded to nearest even).
__device__ static inline uint16_t dsc_f32_fp16(float f) {
    uint32_t u = __float_as_uint(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff);
    if (a >= 0x477ff000u) return sign | 0x7c00;
    if (a >= 0x38800000u) {
        uint32_t r = a - 0x38000000u;
        r += 0xfff + ((r >> 13) & 1);
        return sign | (uint16_t)(r >> 13);
    }
    if (a < 0x33000000u) return sign;
    uint32_t shift = 126 - (a >> 23);
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
}

// Exact (every fp16 value is an fp32 value); host and device, as dsc_fp16_to_fp32.
__host__ __device__ static inline float dsc_fp16_f32(uint16_t h) {
#if defined(__CUDA_ARCH__) && !DSC_HIP
    return __half2float(__ushort_as_half(h));
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, a = h & 0x7fffu, u;
    if (a >= 0x7c00u) {
        u = 0x7f800000u | ((a & 0x3ffu) << 13); // inf, NaN (payload kept)
    } else if (a >= 0x0400u) {
        u = (a << 13) + 0x38000000u; // normal: rebias the exponent (15 -> 127)
    } else {                         // zero, subnormal: a * 2^-24, a normal fp32 (no flushing)
        float f = (float)a * 5.9604644775390625e-08f;
        return sign ? -f : f;
    }
    u |= sign;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
#endif
}

// The storage type of a 16-bit tensor as a template argument: F16 true is IEEE fp16, false bf16.
// The NVIDIA device pass converts to fp16 with the hardware instruction (round to nearest even,
// overflow to inf: the same values as dsc_f32_fp16, NaN payloads aside).
template <bool F16> __device__ static inline float dsc_16_f32(uint16_t b) {
    return F16 ? dsc_fp16_f32(b) : dsc_bf16_f32(b);
}

__device__ static inline uint16_t dsc__f32_fp16_fast(float f) {
#if defined(__CUDA_ARCH__) && !DSC_HIP
    return __half_as_ushort(__float2half_rn(f));
#else
    return dsc_f32_fp16(f);
#endif
}

template <bool F16> __device__ static inline uint16_t dsc_f32_16(float f) {
    return F16 ? dsc__f32_fp16_fast(f) : dsc_f32_bf16(f);
}

// Eight bf16 values travel as one 16-byte access (uint4): unpack to / pack from fp32.
__device__ static inline void dsc_unpack8(uint4 r, float *f) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

__device__ static inline uint4 dsc_pack8(const float *f) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = (uint32_t)dsc_f32_bf16(f[2 * i]) | ((uint32_t)dsc_f32_bf16(f[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The same for either storage type (dsc_unpack8 / dsc_pack8 are the bf16 instances).
__device__ static inline void dsc__unpack8_fp16(uint4 r, float *f) {
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        f[2 * i] = dsc_fp16_f32((uint16_t)(w[i] & 0xffffu));
        f[2 * i + 1] = dsc_fp16_f32((uint16_t)(w[i] >> 16));
    }
}

__device__ static inline uint4 dsc__pack8_fp16(const float *f) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++)
        w[i] = (uint32_t)dsc__f32_fp16_fast(f[2 * i]) |
               ((uint32_t)dsc__f32_fp16_fast(f[2 * i + 1]) << 16);
    return make_uint4(w[0], w[1], w[2], w[3]);
}

template <bool F16> __device__ static inline void dsc_unpack8_16(uint4 r, float *f) {
    if (F16)
        dsc__unpack8_fp16(r, f);
    else
        dsc_unpack8(r, f);
}

template <bool F16> __device__ static inline uint4 dsc_pack8_16(const float *f) {
    return F16 ? dsc__pack8_fp16(f) : dsc_pack8(f);
}

// ---- reductions ----

__device__ static inline float dsc_warp_sum(float v) {
#pragma unroll
    for (int o = DSC_WARP_SIZE / 2; o > 0; o >>= 1)
        v += dsc_shfl_xor(v, o);
    return v;
}

__device__ static inline float dsc_warp_max(float v) {
#pragma unroll
    for (int o = DSC_WARP_SIZE / 2; o > 0; o >>= 1)
        v = fmaxf(v, dsc_shfl_xor(v, o));
    return v;
}

// Warps of a block of at most 1024 threads, for any warp size the vendors use (>= 32).
#define DSC_MAX_WARPS (1024 / 32)

// Sum over the block, the same order on every call (so the result is deterministic); every
// thread gets it. `sh` holds DSC_MAX_WARPS floats; the block must call this uniformly.
__device__ static inline float dsc_block_sum(float v, float *sh) {
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = (blockDim.x + DSC_WARP_SIZE - 1) / DSC_WARP_SIZE;
    v = dsc_warp_sum(v);
    __syncthreads(); // sh may still be read by a previous call
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : 0.0f;
    return dsc_warp_sum(v);
}

__device__ static inline float dsc_block_max(float v, float *sh) {
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = (blockDim.x + DSC_WARP_SIZE - 1) / DSC_WARP_SIZE;
    v = dsc_warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = lane < nwarps ? sh[lane] : -INFINITY;
    return dsc_warp_max(v);
}

// ---- launch sizing ----

// Lanes per warp of the current device, for host code that sizes launches by warps. NVIDIA
// devices all have 32; AMD ones are asked once (all devices of one build share an architecture).
static inline int dsc__host_warp_size(void) {
#if DSC_HIP
    static int cached = 0;
    if (cached == 0) {
        int dev = 0, w = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&w, cudaDevAttrWarpSize, dev) == cudaSuccess && w > 0)
            cached = w;
        else
            cached = 64;
    }
    return cached;
#else
    return DSC_WARP_SIZE;
#endif
}

static inline unsigned dsc__blocks(long long n, int per_block) {
    return (unsigned)((n + per_block - 1) / per_block);
}

static inline bool dsc__aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

#endif
