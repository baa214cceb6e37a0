// tests/cuda/compat/cblas.h - the few CBLAS declarations the CPU GPT-2 kernels use, for building
// the GPU tests' CPU reference on a machine without OpenBLAS (scripts/gpu-test.sh's direct
// build). cblas_naive.c implements them with plain loops: slow, but the references are small.
#ifndef DSC_TESTS_COMPAT_CBLAS_H
#define DSC_TESTS_COMPAT_CBLAS_H

enum CBLAS_ORDER { CblasRowMajor = 101, CblasColMajor = 102 };
enum CBLAS_TRANSPOSE { CblasNoTrans = 111, CblasTrans = 112 };

void cblas_sgemm(enum CBLAS_ORDER order, enum CBLAS_TRANSPOSE ta, enum CBLAS_TRANSPOSE tb, int M,
                 int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
                 float beta, float *C, int ldc);
void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);

#endif
