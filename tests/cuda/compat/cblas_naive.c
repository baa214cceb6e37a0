// tests/cuda/compat/cblas_naive.c - row-major sgemm with plain loops (see cblas.h beside it).
#include "cblas.h"

#include <stddef.h> // size_t

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
                 int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc) {
    (void)order; // the CPU kernels only use row-major
    for (int m = 0; m < M; m++) {
        for (int n = 0; n < N; n++) {
            float s = 0.0f;
            for (int k = 0; k < K; k++) {
                float a = ta == CblasTrans ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k];
                float b = tb == CblasTrans ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
                s += a * b;
            }
            float *c = &C[(size_t)m * ldc + n];
            *c = alpha * s + (beta == 0.0f ? 0.0f : beta * *c);
        }
    }
}

void openblas_set_num_threads(int n) { (void)n; }

int openblas_get_num_threads(void) { return 1; }
