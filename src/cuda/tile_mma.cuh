// cuda/tile_mma.cuh - 16x16x16 bf16 tile products for one warp, fp32 accumulate.
//
// On NVIDIA GPUs these are the tensor-core fragments of <mma.h> (nvcuda::wmma). Elsewhere (the
// HIP build, where rocWMMA is not assumed) a portable stand-in with the same calls: operand
// "fragments" remember where their tile lies in shared memory, and the accumulator holds
// 256 / DSC_WARP_SIZE elements per lane in a fixed row-major order. The stand-in reads operands
// when mma() runs, so a caller must not overwrite an operand's shared memory between its load
// and the mma that uses it (the kernels of attention.cu never do).
//
// Operands are bf16 bit patterns in shared memory. ld counts elements and must be a multiple of
// 8; tile pointers must be 32-byte aligned (what wmma requires).
#ifndef DSC_CUDA_TILE_MMA_CUH
#define DSC_CUDA_TILE_MMA_CUH

#include "cuda/common.cuh" // DSC_WARP_SIZE, dsc_bf16_f32

#if !DSC_HIP && defined(__CUDACC__)
#include <cuda_bf16.h> // __nv_bfloat16
#include <mma.h>       // nvcuda::wmma
#define DSC_TILE_WMMA 1
#else
#define DSC_TILE_WMMA 0
#endif

namespace dsc_tile {

#if DSC_TILE_WMMA
namespace w = nvcuda::wmma;
typedef w::fragment<w::matrix_a, 16, 16, 16, __nv_bfloat16, w::row_major> frag_a;
// B given as (K, N) row-major, or as its transpose (N, K) row-major = (K, N) column-major.
typedef w::fragment<w::matrix_b, 16, 16, 16, __nv_bfloat16, w::row_major> frag_b_row;
typedef w::fragment<w::matrix_b, 16, 16, 16, __nv_bfloat16, w::col_major> frag_b_col;
typedef w::fragment<w::accumulator, 16, 16, 16, float> frag_c;

__device__ static inline void load_a(frag_a &f, const uint16_t *p, int ld) {
    w::load_matrix_sync(f, (const __nv_bfloat16 *)p, ld);
}
__device__ static inline void load_b(frag_b_row &f, const uint16_t *p, int ld) {
    w::load_matrix_sync(f, (const __nv_bfloat16 *)p, ld);
}
__device__ static inline void load_b(frag_b_col &f, const uint16_t *p, int ld) {
    w::load_matrix_sync(f, (const __nv_bfloat16 *)p, ld);
}
__device__ static inline void zero(frag_c &c) { w::fill_fragment(c, 0.0f); }
template <typename FB> __device__ static inline void mma(frag_c &c, const frag_a &a, const FB &b) {
    w::mma_sync(c, a, b, c);
}
__device__ static inline void store(float *p, int ld, const frag_c &c) {
    w::store_matrix_sync(p, c, ld, w::mem_row_major);
}
__device__ static inline void load_c(frag_c &c, const float *p, int ld) {
    w::load_matrix_sync(c, p, ld, w::mem_row_major);
}
__device__ static inline void mul(frag_c &c, float s) {
    for (int i = 0; i < c.num_elements; i++)
        c.x[i] *= s;
}

#else

struct frag_a {
    const uint16_t *p;
    int ld;
};
struct frag_b_row {
    const uint16_t *p;
    int ld;
};
struct frag_b_col {
    const uint16_t *p;
    int ld;
};
#define DSC_TILE_PER_LANE (256 / DSC_WARP_SIZE)
struct frag_c {
    float x[DSC_TILE_PER_LANE]; // element e of lane l is tile element l * PER_LANE + e
};

__device__ static inline void load_a(frag_a &f, const uint16_t *p, int ld) { f.p = p, f.ld = ld; }
__device__ static inline void load_b(frag_b_row &f, const uint16_t *p, int ld) {
    f.p = p, f.ld = ld;
}
__device__ static inline void load_b(frag_b_col &f, const uint16_t *p, int ld) {
    f.p = p, f.ld = ld;
}
__device__ static inline float b_at(const frag_b_row &b, int k, int n) {
    return dsc_bf16_f32(b.p[k * b.ld + n]);
}
__device__ static inline float b_at(const frag_b_col &b, int k, int n) {
    return dsc_bf16_f32(b.p[n * b.ld + k]);
}
__device__ static inline void zero(frag_c &c) {
    for (int e = 0; e < DSC_TILE_PER_LANE; e++)
        c.x[e] = 0.0f;
}
template <typename FB> __device__ static inline void mma(frag_c &c, const frag_a &a, const FB &b) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    for (int e = 0; e < DSC_TILE_PER_LANE; e++) {
        int i = lane * DSC_TILE_PER_LANE + e, r = i / 16, n = i % 16;
        float s = c.x[e];
        for (int k = 0; k < 16; k++)
            s += dsc_bf16_f32(a.p[r * a.ld + k]) * b_at(b, k, n);
        c.x[e] = s;
    }
}
__device__ static inline void store(float *p, int ld, const frag_c &c) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    for (int e = 0; e < DSC_TILE_PER_LANE; e++) {
        int i = lane * DSC_TILE_PER_LANE + e;
        p[(i / 16) * ld + i % 16] = c.x[e];
    }
    dsc_syncwarp();
}
__device__ static inline void load_c(frag_c &c, const float *p, int ld) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    dsc_syncwarp();
    for (int e = 0; e < DSC_TILE_PER_LANE; e++) {
        int i = lane * DSC_TILE_PER_LANE + e;
        c.x[e] = p[(i / 16) * ld + i % 16];
    }
}
__device__ static inline void mul(frag_c &c, float s) {
    for (int e = 0; e < DSC_TILE_PER_LANE; e++)
        c.x[e] *= s;
}

#endif

} // namespace dsc_tile

#endif
