// model/blas.c - the families' shared matrix products (see blas.h).
#include "model/blas.h"

#include <cblas.h> // cblas_sgemm, openblas_set_num_threads

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

void dsc__model_blas_single_thread(void) {
    if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
}

// Chunk length along a dimension of D: about 16 chunks, whole 16-row micro-tiles, at least 64.
// A function of D only, so the split (and with it every bit of the result) ignores thread count.
int dsc__model_chunk(int64_t D) {
    int64_t c = (D + 15) / 16;
    c = (c + 15) / 16 * 16;
    return (int)(c < 64 ? 64 : c);
}

void dsc__model_sgemm(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M <= 0 || N <= 0) return;
    enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    int split_m = M >= N;
    int D = split_m ? M : N;
    int chunk = dsc__model_chunk(D);
    int nchunks = (D + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1) if (nchunks > 1)
    for (int i = 0; i < nchunks; i++) {
        int d0 = i * chunk;
        int dn = (int)min64(chunk, D - d0);
        if (split_m) {
            const float *a = trans_a ? A + d0 : A + (size_t)d0 * lda;
            cblas_sgemm(CblasRowMajor, ta, tb, dn, N, K, alpha, a, lda, B, ldb, beta,
                        C + (size_t)d0 * ldc, ldc);
        } else {
            const float *b = trans_b ? B + (size_t)d0 * ldb : B + d0;
            cblas_sgemm(CblasRowMajor, ta, tb, M, dn, K, alpha, A, lda, b, ldb, beta, C + d0,
                        ldc);
        }
    }
}
