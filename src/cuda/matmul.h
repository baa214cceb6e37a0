// cuda/matmul.h - matrix products through the vendor BLAS (cuBLASLt; hipBLASLt in HIP builds):
// bf16 or fp16 operands, fp32 accumulation, 16-bit (the operands' type) or fp32 results, with the
// epilogues GPT-2 uses.
//
// Shapes are row-major, as the CPU kernels (dsc__model_sgemm): D (M, N) = alpha op(A) op(B) +
// beta C, op(X) = X^T when its flag is set. The wrapper turns this into the column-major call the
// library expects (it computes D^T = op(B)^T op(A)^T). Heuristic algorithm choices are cached per
// shape, so repeated products of one shape cost one lookup.
#ifndef DSC_CUDA_MATMUL_H
#define DSC_CUDA_MATMUL_H

#include <stddef.h> // size_t
#include <stdint.h> // uint16_t

#include "dsc/memory.h" // dsc_mem_pool
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_cuda_blas dsc_cuda_blas; // a library handle, a workspace, an algorithm cache

// workspace_bytes: 0 picks 32 MiB (what Hopper kernels want). Caller owns *out.
dsc_status dsc__cuda_blas_create(dsc_cuda_blas **out, size_t workspace_bytes);
// The same with the workspace taken from a device pool (tag "gpu.matmul_workspace"; see
// cuda/devbuf.h); pool NULL: cudaMalloc.
dsc_status dsc__cuda_blas_create_in(dsc_cuda_blas **out, size_t workspace_bytes,
                                    dsc_mem_pool *pool);
void dsc__cuda_blas_destroy(dsc_cuda_blas *h); // NULL ok; waits for nothing: sync first

enum {
    DSC_CUDA_EPI_NONE = 0,
    DSC_CUDA_EPI_BIAS = 1,      // D = alpha op(A) op(B) + beta C + bias (bias: N, D's type)
    DSC_CUDA_EPI_GELU_BIAS = 2, // aux = that sum (pre-activation), D = GELU(aux) (tanh form)
    DSC_CUDA_EPI_DGELU = 3,     // D = (alpha op(A) op(B)) * GELU'(aux), aux from GELU_BIAS
};

// FP8 operand types (dsc_cuda_gemm's a8, b8): OCP E4M3 (max 448) and E5M2 (max 57344).
enum { DSC_CUDA_16BIT = 0, DSC_CUDA_E4M3 = 1, DSC_CUDA_E5M2 = 2 };

typedef struct dsc_cuda_gemm {
    int trans_a, trans_b;
    int M, N, K;
    const void *A; // bf16 (or a8's type), (M, K) or (K, M) when trans_a; row stride lda
    int lda;
    const void *B; // bf16 (or b8's type), (K, N) or (N, K) when trans_b; row stride ldb
    int ldb;
    const void *C; // (M, N) with row stride ldc, D's type; may equal D; NULL when beta == 0
    int ldc;
    void *D; // (M, N), row stride ldd: bf16, or fp32 when d_fp32
    int ldd;
    int d_fp32;
    float alpha, beta;
    int epilogue;     // DSC_CUDA_EPI_*; epilogues need bf16 D
    const void *bias; // (N) bf16, for BIAS and GELU_BIAS
    uint16_t *aux;    // (M, N) bf16, row stride ldaux (a multiple of 8), for GELU_BIAS, DGELU
    int ldaux;
    // 0 (what a zeroed struct says): every 16-bit matrix above (A, B, a 16-bit C and D, bias,
    // aux) is bf16. 1: they are IEEE fp16 instead (fp16 results overflow to inf, as the
    // library's conversions do; no saturation).
    int fp16;
    // FP8 operands (Hopper and Ada tensor cores): a8, b8 DSC_CUDA_E4M3 or DSC_CUDA_E5M2 (not
    // both E5M2), both set or neither. The product is then a_scale[0] b_scale[0] op(A) op(B)
    // (device floats, 16-byte aligned, read when the product runs: a captured graph sees each
    // step's), with
    // A (M, K) untransposed and B stored (N, K) (trans_b): both rows along K, as the FP8 kernels
    // require; K, lda and ldb multiples of 16; D bf16 or fp32, epilogue NONE or BIAS, not fp16.
    // fast_accum: the tensor cores' faster, less precise accumulation (forward products only).
    int a8, b8;
    const float *a_scale, *b_scale;
    int fast_accum;
} dsc_cuda_gemm;

// Enqueue one product on stream. DSC_ERR_INVALID_ARG for inconsistent shapes, DSC_ERR_CUDA when
// the library refuses (the message names the shape), DSC_ERR_UNSUPPORTED without a vendor BLAS.
dsc_status dsc__cuda_gemm(dsc_cuda_blas *h, const dsc_cuda_gemm *g, void *stream);

// ---- the families' forward products: one filling of dsc_cuda_gemm for trainer and decoder ----
// fp16 as the struct's field (0: bf16); the product is enqueued on stream.

// GPT-2's layout, w (IC, OC): out (rows, OC; row stride ldo) = inp (rows, IC; row stride lda) @ w
// [+ bias] [+ resid, with out's row stride; may be out]. epi DSC_CUDA_EPI_NONE becomes BIAS when
// bias is set; GELU_BIAS puts the pre-activation in aux (rows, OC).
dsc_status dsc__cuda_mm_forward(dsc_cuda_blas *h, uint16_t *out, int ldo, const uint16_t *inp,
                                int lda, const uint16_t *w, const uint16_t *bias,
                                const uint16_t *resid, int rows, int IC, int OC, int epi,
                                uint16_t *aux, int fp16, void *stream);

// nn.Linear's layout, w (OUT, IN): out (rows, OUT; row stride ldo) = inp (rows, IN; row stride
// ldi) @ w^T [+ bias] [+ resid, with out's row stride; may be out].
dsc_status dsc__cuda_linear_forward(dsc_cuda_blas *h, uint16_t *out, int ldo, const uint16_t *inp,
                                    int ldi, const uint16_t *w, const uint16_t *bias,
                                    const uint16_t *resid, int rows, int IN, int OUT, int fp16,
                                    void *stream);

// A weight gradient in either layout: dw (M, N; row stride N) fp32 += a^T @ b (= when fresh),
// a (rows, M; row stride lda), b (rows, N; row stride ldb). GPT-2: a the layer's input, b the
// output's gradient; nn.Linear: a the output's gradient, b the input.
dsc_status dsc__cuda_mm_dweight(dsc_cuda_blas *h, float *dw, const uint16_t *a, int lda,
                                const uint16_t *b, int ldb, int rows, int M, int N, int fresh,
                                int fp16, void *stream);

#ifdef __cplusplus
}
#endif
#endif
