// cuda/linear.cu - one linear layer on the device, 16-bit or FP8 (see linear.h).
#include "cuda/linear.h"

#include <stdlib.h> // calloc, free
#include <string.h> // memset

#include "cuda/common.cuh" // DSC_TRY, dsc__aligned16
#include "cuda/fp8.h"      // dsc__cuda_amax_bf16, dsc__cuda_fp8_quantize

// sc: 0, 1 amax and 1 / scale of a product's A operand; 2, 3 of its B operand; 4, 5 of the
// output gradient kept in qc. Each in its own 256 bytes: the products read the inverse scales
// through pointers, and cuBLASLt refuses FP8 products whose scale pointers are not aligned.
#define SCALES 8
#define SC_STRIDE 64 // floats

static float *sc(const dsc__cuda_lin *L, int k) { return L->sc + SC_STRIDE * k; }

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

static int64_t qb_elems(int64_t rows, int64_t max_dim, int64_t max_w) {
    return max_w > rows * max_dim ? max_w : rows * max_dim;
}

extern "C" size_t dsc__cuda_lin_scratch_bytes(int fp8, int64_t rows, int64_t max_dim,
                                              int64_t max_w, int nslots) {
    if (fp8 == DSC_FP8_OFF) return 0;
    return round256(SCALES * SC_STRIDE * sizeof(float)) + round256((size_t)nslots * 2 * sizeof(float)) +
           2 * round256((size_t)(rows * max_dim)) + round256((size_t)qb_elems(rows, max_dim, max_w));
}

extern "C" void dsc__cuda_lin_release(dsc__cuda_lin *L) {
    free(L->seen);
    L->seen = NULL, L->nslots = 0;
}

extern "C" dsc_status dsc__cuda_lin_carve(dsc__cuda_lin *L, void *base, int64_t rows,
                                          int64_t max_dim, int64_t max_w, int nslots) {
    dsc__cuda_lin_release(L);
    L->sc = L->tab = NULL, L->qa = L->qb = L->qc = NULL, L->qa_cap = L->qb_cap = 0;
    L->kept = NULL;
    if (!base || L->fp8 == DSC_FP8_OFF) return DSC_OK;
    if (nslots > 0 && !(L->seen = (unsigned char *)calloc((size_t)nslots, 1)))
        return dsc__fail(DSC_ERR_OOM, "fp8: out of host memory for %d product slots", nslots);
    char *p = (char *)base;
    L->sc = (float *)p;
    p += round256(SCALES * SC_STRIDE * sizeof(float));
    L->tab = (float *)p, L->nslots = nslots;
    p += round256((size_t)nslots * 2 * sizeof(float));
    L->qa = (uint8_t *)p, L->qa_cap = rows * max_dim;
    p += round256((size_t)L->qa_cap);
    L->qc = (uint8_t *)p;
    p += round256((size_t)L->qa_cap);
    L->qb = (uint8_t *)p, L->qb_cap = qb_elems(rows, max_dim, max_w);
    return DSC_OK;
}

// Whether this product runs with FP8 operands: fp8 on, bf16, sizes multiples of 16, 16-bit
// operands whose rows are whole 16-byte vectors, and the quantized copies fit the scratch.
static bool fp8_ok(const dsc__cuda_lin *L, int rows, int IN, int OUT, const void *x, int ldx,
                   const void *y, int ldy) {
    return L->fp8 != DSC_FP8_OFF && !L->fp16 && !L->in_out && L->qa && rows % 16 == 0 && IN % 16 == 0 &&
           OUT % 16 == 0 && ldx % 8 == 0 && ldy % 8 == 0 && dsc__aligned16(x) &&
           dsc__aligned16(y) && (int64_t)rows * (IN > OUT ? IN : OUT) <= L->qa_cap &&
           (int64_t)OUT * IN <= L->qb_cap && (int64_t)rows * IN <= L->qb_cap;
}

static int grad_format(const dsc__cuda_lin *L) {
    return L->fp8 == DSC_FP8_HYBRID ? DSC_CUDA_E5M2 : DSC_CUDA_E4M3;
}

// Where a slot's absolute maximum of the input (k 0) or weight (k 1) lives, and whether it has
// to be measured now: always without a slot (into the scratch of operand `fallback`), in a
// forward outside a recompute, and where no forward has measured it.
static float *amax_of(const dsc__cuda_lin *L, int slot, int k, int fallback, bool *measure,
                      bool forward) {
    if (slot < 0 || slot >= L->nslots) {
        *measure = true;
        return sc(L, 2 * fallback);
    }
    *measure = (forward && !L->recompute) || !L->seen[slot];
    return L->tab + 2 * slot + k;
}

// q = x (rows, cols; stride ld) in fmt with the absolute maximum at amax (measured first when
// measure), 1 / scale into inv; transposed or not (q2: the untransposed copy too).
static dsc_status quantize(const dsc__cuda_lin *L, float *amax, bool measure, float *inv,
                           uint8_t *q, uint8_t *q2, const uint16_t *x, int rows, int cols, int ld,
                           int fmt, bool trans) {
    if (measure) DSC_TRY(dsc__cuda_amax_bf16(amax, x, rows, cols, ld, L->stream));
    return dsc__cuda_fp8_quantize2(q, q2, inv, x, rows, cols, ld, amax, fmt, L->margin, trans,
                                   L->stream);
}

// The FP8 product D (M, N) = sa sb a (M, K) b^T, b stored (N, K), both dense.
static void fp8_gemm(dsc_cuda_gemm *g, int M, int N, int K, const uint8_t *a, int a8,
                     const float *sa, const uint8_t *b, int b8, const float *sb) {
    g->trans_b = 1, g->M = M, g->N = N, g->K = K;
    g->A = a, g->lda = K, g->B = b, g->ldb = K;
    g->a8 = a8, g->b8 = b8, g->a_scale = sa, g->b_scale = sb;
}

extern "C" dsc_status dsc__cuda_lin_forward_gelu(dsc__cuda_lin *L, int slot, uint16_t *out,
                                                 int ldo, const uint16_t *inp, int ldi,
                                                 const uint16_t *w, const uint16_t *bias,
                                                 uint16_t *aux, int rows, int IN, int OUT) {
    (void)slot;
    L->kept = NULL;
    DSC_CUDA_ARG(L->in_out, "linear forward with GELU: only the Conv1D layout (in_out) has it");
    return dsc__cuda_mm_forward(L->blas, out, ldo, inp, ldi, w, bias, NULL, rows, IN, OUT,
                                DSC_CUDA_EPI_GELU_BIAS, aux, L->fp16, L->stream);
}

extern "C" dsc_status dsc__cuda_lin_forward(dsc__cuda_lin *L, int slot, uint16_t *out, int ldo,
                                            const uint16_t *inp, int ldi, const uint16_t *w,
                                            const uint16_t *bias, const uint16_t *resid, int rows,
                                            int IN, int OUT) {
    L->kept = NULL;
    if (L->in_out)
        return dsc__cuda_mm_forward(L->blas, out, ldo, inp, ldi, w, bias, resid, rows, IN, OUT,
                                    DSC_CUDA_EPI_NONE, NULL, L->fp16, L->stream);
    if (!fp8_ok(L, rows, IN, OUT, inp, ldi, w, IN))
        return dsc__cuda_linear_forward(L->blas, out, ldo, inp, ldi, w, bias, resid, rows, IN,
                                        OUT, L->fp16, L->stream);
    bool mx, mw;
    float *ax = amax_of(L, slot, 0, 0, &mx, true), *aw = amax_of(L, slot, 1, 1, &mw, true);
    DSC_TRY(quantize(L, ax, mx, sc(L, 1), L->qa, NULL, inp, rows, IN, ldi, DSC_CUDA_E4M3, false));
    DSC_TRY(quantize(L, aw, mw, sc(L, 3), L->qb, NULL, w, OUT, IN, IN, DSC_CUDA_E4M3, false));
    if (slot >= 0 && slot < L->nslots) L->seen[slot] = 1;
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    fp8_gemm(&g, rows, OUT, IN, L->qa, DSC_CUDA_E4M3, sc(L, 1), L->qb, DSC_CUDA_E4M3, sc(L, 3));
    g.D = out, g.ldd = ldo, g.alpha = 1.0f, g.fast_accum = 1;
    g.beta = resid ? 1.0f : 0.0f, g.C = resid, g.ldc = ldo;
    g.epilogue = bias ? DSC_CUDA_EPI_BIAS : DSC_CUDA_EPI_NONE, g.bias = bias;
    return dsc__cuda_gemm(L->blas, &g, L->stream);
}

// The input gradient of the Conv1D layout (w (IN, OUT)): dinp = dout @ w^T [* GELU'(aux)].
static dsc_status dinp_in_out(dsc__cuda_lin *L, uint16_t *dinp, int ldo, const uint16_t *dout,
                              int ldd, const uint16_t *w, int rows, int IN, int OUT, bool acc,
                              uint16_t *aux) {
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.trans_b = 1, g.M = rows, g.N = IN, g.K = OUT;
    g.A = dout, g.lda = ldd, g.B = w, g.ldb = OUT, g.D = dinp, g.ldd = ldo;
    g.alpha = 1.0f;
    if (acc) g.beta = 1.0f, g.C = dinp, g.ldc = ldo;
    g.epilogue = aux ? DSC_CUDA_EPI_DGELU : DSC_CUDA_EPI_NONE;
    g.aux = aux, g.ldaux = IN, g.fp16 = L->fp16;
    return dsc__cuda_gemm(L->blas, &g, L->stream);
}

extern "C" dsc_status dsc__cuda_lin_dinp_dgelu(dsc__cuda_lin *L, int slot, uint16_t *dinp,
                                               int ldo, const uint16_t *dout, int ldd,
                                               const uint16_t *w, int rows, int IN, int OUT,
                                               uint16_t *aux) {
    (void)slot;
    L->kept = NULL;
    DSC_CUDA_ARG(L->in_out, "linear input gradient with GELU's derivative: only the Conv1D "
                 "layout (in_out) has it");
    return dinp_in_out(L, dinp, ldo, dout, ldd, w, rows, IN, OUT, false, aux);
}

extern "C" dsc_status dsc__cuda_lin_dinp(dsc__cuda_lin *L, int slot, uint16_t *dinp, int ldo,
                                         const uint16_t *dout, int ldd, const uint16_t *w,
                                         int rows, int IN, int OUT, bool acc) {
    L->kept = NULL;
    if (L->in_out) return dinp_in_out(L, dinp, ldo, dout, ldd, w, rows, IN, OUT, acc, NULL);
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.alpha = 1.0f, g.beta = acc ? 1.0f : 0.0f, g.C = acc ? dinp : NULL, g.ldc = ldo;
    g.D = dinp, g.ldd = ldo;
    if (!fp8_ok(L, rows, IN, OUT, dout, ldd, w, IN)) {
        g.M = rows, g.N = IN, g.K = OUT;
        g.A = dout, g.lda = ldd, g.B = w, g.ldb = IN, g.fp16 = L->fp16;
        return dsc__cuda_gemm(L->blas, &g, L->stream);
    }
    int gf = grad_format(L);
    bool mw;
    float *aw = amax_of(L, slot, 1, 1, &mw, false);
    // dout (rows, OUT) for this product and its transpose (OUT, rows) for the weight gradient
    DSC_TRY(quantize(L, sc(L, 4), true, sc(L, 5), L->qc, L->qa, dout, rows, OUT, ldd, gf, true));
    DSC_TRY(quantize(L, aw, mw, sc(L, 3), L->qb, NULL, w, OUT, IN, IN, DSC_CUDA_E4M3, true));
    fp8_gemm(&g, rows, IN, OUT, L->qa, gf, sc(L, 5), L->qb, DSC_CUDA_E4M3, sc(L, 3));
    DSC_TRY(dsc__cuda_gemm(L->blas, &g, L->stream));
    L->kept = dout, L->kept_rows = rows, L->kept_cols = OUT, L->kept_ld = ldd;
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_lin_dw(dsc__cuda_lin *L, int slot, float *dw,
                                       const uint16_t *dout, int ldd, const uint16_t *inp,
                                       int ldi, int rows, int IN, int OUT, bool fresh) {
    bool kept = L->kept == dout && L->kept_rows == rows && L->kept_cols == OUT &&
                L->kept_ld == ldd;
    L->kept = NULL;
    if (L->in_out) { // dw (IN, OUT) += inp^T @ dout; a long unaligned IN (4096 or more) leaves
        // cuBLASLt only older kernels: the aligned rows first, the last few in a product of their own
        int tail = IN >= 4096 ? IN % 64 : 0;
        DSC_TRY(dsc__cuda_mm_dweight(L->blas, dw, inp, ldi, dout, ldd, rows, IN - tail, OUT, fresh,
                                     L->fp16, L->stream));
        if (!tail) return DSC_OK;
        return dsc__cuda_mm_dweight(L->blas, dw + (size_t)(IN - tail) * OUT, inp + (IN - tail), ldi,
                                    dout, ldd, rows, tail, OUT, fresh, L->fp16, L->stream);
    }
    if (!fp8_ok(L, rows, IN, OUT, dout, ldd, inp, ldi))
        return dsc__cuda_mm_dweight(L->blas, dw, dout, ldd, inp, ldi, rows, OUT, IN, fresh,
                                    L->fp16, L->stream);
    int gf = grad_format(L);
    if (!kept) // (OUT, rows)
        DSC_TRY(quantize(L, sc(L, 4), true, sc(L, 5), L->qc, NULL, dout, rows, OUT, ldd, gf,
                         true));
    bool mx;
    float *ax = amax_of(L, slot, 0, 0, &mx, false);
    DSC_TRY(quantize(L, ax, mx, sc(L, 1), L->qb, NULL, inp, rows, IN, ldi, DSC_CUDA_E4M3,
                     true)); // (IN, rows)
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    fp8_gemm(&g, OUT, IN, rows, L->qc, gf, sc(L, 5), L->qb, DSC_CUDA_E4M3, sc(L, 1));
    g.D = dw, g.ldd = IN, g.d_fp32 = 1, g.alpha = 1.0f;
    g.beta = fresh ? 0.0f : 1.0f, g.C = dw, g.ldc = IN;
    return dsc__cuda_gemm(L->blas, &g, L->stream);
}
