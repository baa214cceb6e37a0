// model/blas.h - what every model family's CPU kernels share: matrix products split into fixed
// chunks, each a single-threaded OpenBLAS call on an OpenMP thread (so that every bit of a result
// is independent of the thread count), and a vectorizable exp.
#ifndef DSC_MODEL_BLAS_H
#define DSC_MODEL_BLAS_H

#include <stdint.h> // int32_t, int64_t
#include <string.h> // memcpy

// Make OpenBLAS single-threaded (OpenBLAS's thread pool and OpenMP's, both spinning on the same
// cores, slow each other down); idempotent and cheap.
void dsc__model_blas_single_thread(void);

// Chunk length along a dimension of D: about 16 chunks, whole 16-row micro-tiles, at least 64.
// A function of D only, so a split by it ignores the thread count.
int dsc__model_chunk(int64_t D);

// Row-major C (M, N) = alpha * op(A) op(B) + beta * C, op(X) = X^T when its flag is set. Split
// into fixed chunks along the larger of M and N, each a single-threaded OpenBLAS call on an
// OpenMP thread. Must not be called from inside an OpenMP parallel region.
void dsc__model_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc);

// exp(x) within about 2 ulp for x in [-87, 88] (Cody-Waite reduction, Cephes' degree-6
// polynomial), 0 below, exp(88) above. Branch-free so that loops calling it vectorize; libm's
// expf does not. Relies on round-to-nearest for the 1.5 * 2^23 rounding trick.
static inline __attribute__((always_inline)) float dsc__exp_fast(float x) {
    float xc = x > 88.0f ? 88.0f : (x < -87.0f ? -87.0f : x);
    float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f; // round(x / ln 2)
    float r = xc - n * 0.693359375f;
    r = r + n * 2.12194440e-4f; // r = x - n ln 2 in two steps, |r| <= ln 2 / 2
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23; // 2^n, n in [-126, 127]
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x < -87.0f ? 0.0f : y;
}

#endif
