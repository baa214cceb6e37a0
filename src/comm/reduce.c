// comm/reduce.c - rank-ordered reductions in fp32 tiles; F16C conversions where the CPU has them.
#include "comm/reduce.h"

#include <stdint.h> // uint16_t, uint32_t
#include <string.h> // memcpy, memmove

#include "dsc/half.h" // dsc_fp16_*, dsc_bf16_*

#if defined(__x86_64__)
#include <immintrin.h> // _mm256_cvtph_ps, _mm256_cvtps_ph
#endif

// Elements per fp32 tile: two tiles (acc, tmp) stay in L1.
#define TILE 1024

// ---- conversions ----

#if defined(__x86_64__)
__attribute__((target("avx2,f16c"))) static void f16_to_f32_hw(float *dst, const uint16_t *src,
                                                                  size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++) dst[i] = dsc_fp16_to_fp32(src[i]);
}

// The hardware rounds to nearest even, quiets NaN keeping the payload's top bits, and handles
// subnormals exactly (MXCSR's DAZ/FTZ do not apply to VCVTPS2PH), so it equals dsc_fp32_to_fp16.
__attribute__((target("avx2,f16c"))) static void f32_to_f16_hw(uint16_t *dst, const float *src,
                                                                  size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = dsc_fp32_to_fp16(src[i]);
}

static int have_f16c(void) {
    static int cached = -1; // benign race: every thread computes the same value
    if (cached < 0) cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    return cached;
}
#endif

static void f16_to_f32(float *dst, const uint16_t *src, size_t n) {
#if defined(__x86_64__)
    if (have_f16c()) {
        f16_to_f32_hw(dst, src, n);
        return;
    }
#endif
    dsc_fp16_to_fp32_n(dst, src, n);
}

static void f32_to_f16(uint16_t *dst, const float *src, size_t n) {
#if defined(__x86_64__)
    if (have_f16c()) {
        f32_to_f16_hw(dst, src, n);
        return;
    }
#endif
    dsc_fp32_to_fp16_n(dst, src, n);
}

// Same rules as dsc_bf16_to_fp32 / dsc_fp32_to_bf16, written so that the compiler vectorizes them.
static void bf16_to_f32(float *restrict dst, const uint16_t *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        memcpy(&dst[i], &u, 4);
    }
}

static void f32_to_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
        uint32_t nan = (u >> 16) | 0x0040;
        dst[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    }
}

void dsc__to_f32(float *dst, const void *src, size_t n, dsc_dtype dt) {
    if (dt == DSC_DT_F32) memmove(dst, src, n * sizeof(float));
    else if (dt == DSC_DT_F16) f16_to_f32(dst, src, n);
    else bf16_to_f32(dst, src, n);
}

void dsc__from_f32(void *dst, const float *src, size_t n, dsc_dtype dt) {
    if (dt == DSC_DT_F32) memmove(dst, src, n * sizeof(float));
    else if (dt == DSC_DT_F16) f32_to_f16(dst, src, n);
    else f32_to_bf16(dst, src, n);
}

// ---- reductions ----

static inline float max_ordered(float r, float x) { return (x > r || x != x) ? x : r; }

static void combine(float *restrict acc, const float *restrict x, size_t n, dsc_red_op op) {
    if (op == DSC_OP_SUM)
        for (size_t i = 0; i < n; i++) acc[i] += x[i];
    else
        for (size_t i = 0; i < n; i++) acc[i] = max_ordered(acc[i], x[i]);
}

// The common case of two fp32 sources, streamed without a tile (out may alias a or b exactly).
static void sum2_f32(float *out, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// One tile of fp32 sources: read everything before writing, so out may alias a source.
static void reduce_tile_f32(float *out, const void *const *srcs, int nsrc, size_t off, size_t m,
                            dsc_red_op op) {
    float acc[TILE];
    memcpy(acc, (const float *)srcs[0] + off, m * sizeof(float));
    for (int s = 1; s < nsrc; s++) combine(acc, (const float *)srcs[s] + off, m, op);
    memcpy(out + off, acc, m * sizeof(float));
}

static void reduce_tile_half(uint16_t *out, const void *const *srcs, int nsrc, size_t off,
                             size_t m, dsc_dtype dt, dsc_red_op op) {
    float acc[TILE], tmp[TILE];
    dsc__to_f32(acc, (const uint16_t *)srcs[0] + off, m, dt);
    for (int s = 1; s < nsrc; s++) {
        dsc__to_f32(tmp, (const uint16_t *)srcs[s] + off, m, dt);
        combine(acc, tmp, m, op);
    }
    dsc__from_f32(out + off, acc, m, dt);
}

void dsc__reduce(void *out, const void *const *srcs, int nsrc, size_t n, dsc_dtype dt,
                 dsc_red_op op) {
    if (n == 0) return;
    if (nsrc == 1) { // a copy: no rounding, NaN payloads kept
        size_t esize = dt == DSC_DT_F32 ? 4 : 2;
        if (out != srcs[0]) memmove(out, srcs[0], n * esize);
        return;
    }
    if (dt == DSC_DT_F32 && nsrc == 2 && op == DSC_OP_SUM) {
        sum2_f32(out, srcs[0], srcs[1], n);
        return;
    }
    for (size_t off = 0; off < n; off += TILE) {
        size_t m = n - off < TILE ? n - off : TILE;
        if (dt == DSC_DT_F32) reduce_tile_f32(out, srcs, nsrc, off, m, op);
        else reduce_tile_half(out, srcs, nsrc, off, m, dt, op);
    }
}
