// cuda/matmul.cu - bf16 / fp16 matrix products through cuBLASLt / hipBLASLt (see matmul.h).
#include "cuda/matmul.h"

#include <stdlib.h> // calloc, free
#include <string.h> // memset

#include "cuda/common.cuh" // DSC_CUDA_TRY, vendor names
#include "cuda/devbuf.h"   // dsc__cuda_buf_*

#define DEFAULT_WORKSPACE ((size_t)32 << 20)
#define ALGO_CACHE 128 // distinct product shapes remembered (a GPT-2 step has about 20)

#if DSC_HAVE_BLASLT

// What the heuristic's answer depends on: everything but the pointers' values and alpha, beta.
typedef struct gemm_key {
    int trans_a, trans_b, M, N, K, lda, ldb, ldc, ldd, ldaux, d_fp32, epilogue, align, fp16;
    int a8, b8, fast_accum;
} gemm_key;

typedef struct algo_entry {
    gemm_key key;
    cublasLtMatmulAlgo_t algo;
} algo_entry;

struct dsc_cuda_blas {
    cublasLtHandle_t lt;
    dsc_cuda_buf wsbuf; // the workspace; ws is its address
    void *ws;
    size_t ws_bytes;
    algo_entry cache[ALGO_CACHE];
    int ncache, next; // entries used; the slot a new shape replaces once full
};

// The 16-bit type of the product's operands (and of its 16-bit results).
static cudaDataType_t type16(const dsc_cuda_gemm *g) {
    return g->fp16 ? CUDA_R_16F : CUDA_R_16BF;
}

// The library's type of operand A (our B) or B (our A): 16-bit, or an FP8 format.
static cudaDataType_t operand_type(const dsc_cuda_gemm *g, int f8) {
#if DSC_HIP
    (void)f8;
    return type16(g);
#else
    return f8 == DSC_CUDA_E4M3 ? CUDA_R_8F_E4M3 : f8 == DSC_CUDA_E5M2 ? CUDA_R_8F_E5M2 : type16(g);
#endif
}

static const char *out_name(const dsc_cuda_gemm *g) {
    if (!g) return "?";
    return g->d_fp32 ? "fp32" : g->fp16 ? "fp16" : "bf16";
}

static dsc_status blas_fail(cublasStatus_t s, const char *what, const dsc_cuda_gemm *g) {
#if DSC_HIP
    const char *why = "hipBLASLt error";
#else
    const char *why = cublasLtGetStatusString(s);
#endif
    return dsc__fail(DSC_ERR_CUDA,
                     "%s failed (status %d, %s) for the product M %d N %d K %d (trans %d%d, ld "
                     "%d %d %d, %s out, epilogue %d); check shapes, alignment and free memory",
                     what, (int)s, why, g ? g->M : 0, g ? g->N : 0, g ? g->K : 0,
                     g ? g->trans_a : 0, g ? g->trans_b : 0, g ? g->lda : 0, g ? g->ldb : 0,
                     g ? g->ldd : 0, out_name(g), g ? g->epilogue : 0);
}

#define BLAS_TRY(expr, what, g)                                                                    \
    do {                                                                                           \
        cublasStatus_t dsc__s_ = (expr);                                                           \
        if (dsc__s_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            st = blas_fail(dsc__s_, what, g);                                                      \
            goto done;                                                                             \
        }                                                                                          \
    } while (0)

extern "C" dsc_status dsc__cuda_blas_create_in(dsc_cuda_blas **out, size_t workspace_bytes,
                                               dsc_mem_pool *pool) {
    DSC_CUDA_ARG(out != NULL, "blas create: out is NULL");
    *out = NULL;
    dsc_cuda_blas *h = (dsc_cuda_blas *)calloc(1, sizeof *h);
    if (!h) return dsc__fail(DSC_ERR_OOM, "blas create: out of host memory");
    h->ws_bytes = workspace_bytes ? workspace_bytes : DEFAULT_WORKSPACE;
    dsc_status st = dsc__cuda_buf_alloc(&h->wsbuf, pool, h->ws_bytes, "gpu.matmul_workspace");
    if (st != DSC_OK) {
        free(h);
        return st;
    }
    h->ws = h->wsbuf.ptr;
    cublasStatus_t s = cublasLtCreate(&h->lt);
    if (s != CUBLAS_STATUS_SUCCESS) {
        dsc__cuda_buf_free(&h->wsbuf);
        free(h);
        return blas_fail(s, "cublasLtCreate", NULL);
    }
    *out = h;
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_blas_create(dsc_cuda_blas **out, size_t workspace_bytes) {
    return dsc__cuda_blas_create_in(out, workspace_bytes, NULL);
}

extern "C" void dsc__cuda_blas_destroy(dsc_cuda_blas *h) {
    if (!h) return;
    (void)cublasLtDestroy(h->lt);
    dsc__cuda_buf_free(&h->wsbuf);
    free(h);
}

// Largest power of two (<= 256) that divides every pointer: the library picks kernels by it.
static int common_alignment(const dsc_cuda_gemm *g) {
    uintptr_t bits = (uintptr_t)g->A | (uintptr_t)g->B | (uintptr_t)g->D | 256;
    if (g->C) bits |= (uintptr_t)g->C;
    if (g->bias) bits |= (uintptr_t)g->bias;
    if (g->aux) bits |= (uintptr_t)g->aux;
    return (int)(bits & (~bits + 1));
}

static gemm_key key_of(const dsc_cuda_gemm *g) {
    gemm_key k = {g->trans_a,
                  g->trans_b,
                  g->M,
                  g->N,
                  g->K,
                  g->lda,
                  g->ldb,
                  g->ldc,
                  g->ldd,
                  g->aux ? g->ldaux : 0,
                  g->d_fp32,
                  g->epilogue,
                  common_alignment(g),
                  g->fp16 != 0,
                  g->a8,
                  g->b8,
                  g->fast_accum != 0};
    return k;
}

static bool key_eq(const gemm_key *a, const gemm_key *b) { return memcmp(a, b, sizeof *a) == 0; }

static dsc_status check_gemm(const dsc_cuda_gemm *g) {
    DSC_CUDA_ARG(g && g->A && g->B && g->D && g->M > 0 && g->N > 0 && g->K > 0,
                 "gemm: missing operands or non-positive shape");
    int cols_a = g->trans_a ? g->M : g->K, cols_b = g->trans_b ? g->K : g->N;
    DSC_CUDA_ARG(g->lda >= cols_a && g->ldb >= cols_b && g->ldd >= g->N,
                 "gemm: a row stride is shorter than its row (M %d N %d K %d, ld %d %d %d)", g->M,
                 g->N, g->K, g->lda, g->ldb, g->ldd);
    DSC_CUDA_ARG(g->beta == 0.0f || (g->C && g->ldc >= g->N), "gemm: beta != 0 needs C");
    DSC_CUDA_ARG(g->epilogue >= DSC_CUDA_EPI_NONE && g->epilogue <= DSC_CUDA_EPI_DGELU,
                 "gemm: unknown epilogue %d", g->epilogue);
    DSC_CUDA_ARG(g->epilogue == DSC_CUDA_EPI_NONE || !g->d_fp32,
                 "gemm: epilogues need a 16-bit result");
    bool need_bias = g->epilogue == DSC_CUDA_EPI_BIAS || g->epilogue == DSC_CUDA_EPI_GELU_BIAS;
    bool need_aux = g->epilogue == DSC_CUDA_EPI_GELU_BIAS || g->epilogue == DSC_CUDA_EPI_DGELU;
    DSC_CUDA_ARG(!need_bias || g->bias, "gemm: epilogue %d needs a bias", g->epilogue);
    DSC_CUDA_ARG(!need_aux || (g->aux && g->ldaux >= g->N && g->ldaux % 8 == 0),
                 "gemm: epilogue %d needs aux with a row stride >= N and a multiple of 8",
                 g->epilogue);
    if (!g->a8 && !g->b8) return DSC_OK;
#if DSC_HIP
    return dsc__fail(DSC_ERR_UNSUPPORTED, "gemm: FP8 products are built for NVIDIA GPUs only");
#else
    DSC_CUDA_ARG(g->a8 >= DSC_CUDA_E4M3 && g->a8 <= DSC_CUDA_E5M2 && g->b8 >= DSC_CUDA_E4M3 &&
                     g->b8 <= DSC_CUDA_E5M2 && !(g->a8 == DSC_CUDA_E5M2 && g->b8 == DSC_CUDA_E5M2),
                 "gemm: FP8 needs both operands E4M3 or E5M2, not both E5M2 (a8 %d b8 %d)",
                 g->a8, g->b8);
    DSC_CUDA_ARG(!g->trans_a && g->trans_b && g->K % 16 == 0 && g->lda % 16 == 0 &&
                     g->ldb % 16 == 0 && g->a_scale && g->b_scale && dsc__aligned16(g->a_scale) &&
                     dsc__aligned16(g->b_scale),
                 "gemm: FP8 needs A (M, K) and B stored (N, K), K and the row strides multiples "
                 "of 16, and both scales 16-byte aligned (M %d N %d K %d, trans %d%d, ld %d %d)",
                 g->M, g->N, g->K, g->trans_a, g->trans_b, g->lda, g->ldb);
    DSC_CUDA_ARG(!g->fp16 && (g->epilogue == DSC_CUDA_EPI_NONE || g->epilogue == DSC_CUDA_EPI_BIAS),
                 "gemm: FP8 products give bf16 or fp32 with no epilogue but a bias");
    return DSC_OK;
#endif
}

static cublasLtEpilogue_t epilogue_of(int e) {
    switch (e) {
    case DSC_CUDA_EPI_BIAS: return CUBLASLT_EPILOGUE_BIAS;
    case DSC_CUDA_EPI_GELU_BIAS: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case DSC_CUDA_EPI_DGELU: return CUBLASLT_EPILOGUE_DGELU;
    default: return CUBLASLT_EPILOGUE_DEFAULT;
    }
}

// The column-major problem: D^T (N, M) = op(B)^T (N, K) op(A)^T (K, M). A row-major matrix is
// its own transpose read column-major, so the library's A is our B and its B our A.
static dsc_status describe(const dsc_cuda_gemm *g, cublasLtMatmulDesc_t *op,
                           cublasLtMatrixLayout_t lay[3]) {
    dsc_status st = DSC_OK;
    cublasOperation_t ta = g->trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t tb = g->trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtEpilogue_t epi = epilogue_of(g->epilogue);
    cudaDataType_t dt = g->d_fp32 ? CUDA_R_32F : type16(g);
    BLAS_TRY(cublasLtMatmulDescCreate(op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate", g);
    BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
             "set TRANSA", g);
    BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
             "set TRANSB", g);
    BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
             "set EPILOGUE", g);
    if (g->bias)
        BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias,
                                                sizeof g->bias),
                 "set BIAS_POINTER", g);
#if !DSC_HIP
    if (g->a8) { // the library's A is our B
        int8_t fast = g->fast_accum ? 1 : 0;
        BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                &g->b_scale, sizeof g->b_scale),
                 "set A_SCALE_POINTER", g);
        BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                &g->a_scale, sizeof g->a_scale),
                 "set B_SCALE_POINTER", g);
        BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast,
                                                sizeof fast),
                 "set FAST_ACCUM", g);
    }
#endif
    if (g->aux) {
        int64_t ld = g->ldaux;
        BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &g->aux, sizeof g->aux),
                 "set EPILOGUE_AUX_POINTER", g);
        BLAS_TRY(cublasLtMatmulDescSetAttribute(*op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                                sizeof ld),
                 "set EPILOGUE_AUX_LD", g);
    }
    BLAS_TRY(cublasLtMatrixLayoutCreate(&lay[0], operand_type(g, g->b8), g->trans_b ? g->K : g->N,
                                        g->trans_b ? g->N : g->K, g->ldb),
             "layout of B", g);
    BLAS_TRY(cublasLtMatrixLayoutCreate(&lay[1], operand_type(g, g->a8), g->trans_a ? g->M : g->K,
                                        g->trans_a ? g->K : g->M, g->lda),
             "layout of A", g);
    BLAS_TRY(cublasLtMatrixLayoutCreate(&lay[2], dt, g->N, g->M, g->ldd), "layout of D", g);
done:
    return st;
}

// The cached algorithm for this shape, or the heuristic's first choice (then cached).
static dsc_status pick_algo(dsc_cuda_blas *h, const dsc_cuda_gemm *g, cublasLtMatmulDesc_t op,
                            cublasLtMatrixLayout_t lay[3], cublasLtMatrixLayout_t cl,
                            const cublasLtMatmulAlgo_t **algo) {
    gemm_key k = key_of(g);
    for (int i = 0; i < h->ncache; i++) {
        if (!key_eq(&h->cache[i].key, &k)) continue;
        *algo = &h->cache[i].algo;
        return DSC_OK;
    }
    dsc_status st = DSC_OK;
    cublasLtMatmulPreference_t pref = NULL;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    uint32_t align = (uint32_t)k.align;
    BLAS_TRY(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate", g);
    BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &h->ws_bytes, sizeof h->ws_bytes),
             "set MAX_WORKSPACE_BYTES", g);
#if !DSC_HIP
    {
        const cublasLtMatmulPreferenceAttributes_t which[4] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int i = 0; i < 4; i++)
            BLAS_TRY(cublasLtMatmulPreferenceSetAttribute(pref, which[i], &align, sizeof align),
                     "set MIN_ALIGNMENT", g);
    }
#endif
    (void)align;
    BLAS_TRY(cublasLtMatmulAlgoGetHeuristic(h->lt, op, lay[0], lay[1], cl, lay[2], pref, 1, &res,
                                            &found),
             "MatmulAlgoGetHeuristic", g);
    if (found == 0) {
        st = dsc__fail(DSC_ERR_UNSUPPORTED,
                       "the BLAS library has no algorithm for the product M %d N %d K %d "
                       "(epilogue %d, alignment %d bytes)",
                       g->M, g->N, g->K, g->epilogue, k.align);
        goto done;
    }
    {
        int slot = h->ncache < ALGO_CACHE ? h->ncache++ : h->next++ % ALGO_CACHE;
        h->cache[slot].key = k;
        h->cache[slot].algo = res.algo;
        *algo = &h->cache[slot].algo;
    }
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    return st;
}

extern "C" dsc_status dsc__cuda_gemm(dsc_cuda_blas *h, const dsc_cuda_gemm *g, void *stream) {
    DSC_CUDA_ARG(h != NULL, "gemm: blas handle is NULL");
    DSC_TRY(check_gemm(g));
    dsc_status st = DSC_OK;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t lay[3] = {NULL, NULL, NULL}, cl = NULL;
    const cublasLtMatmulAlgo_t *algo = NULL;
    const void *C = g->beta != 0.0f ? g->C : g->D;
    int ldc = g->beta != 0.0f ? g->ldc : g->ldd;
    st = describe(g, &op, lay);
    if (st != DSC_OK) goto done;
    BLAS_TRY(cublasLtMatrixLayoutCreate(&cl, g->d_fp32 ? CUDA_R_32F : type16(g), g->N, g->M, ldc),
             "layout of C", g);
    st = pick_algo(h, g, op, lay, cl, &algo);
    if (st != DSC_OK) goto done;
    BLAS_TRY(cublasLtMatmul(h->lt, op, &g->alpha, g->B, lay[0], g->A, lay[1], &g->beta, C, cl, g->D,
                            lay[2], algo, h->ws, h->ws_bytes, (cudaStream_t)stream),
             "cublasLtMatmul", g);
done:
    if (cl) cublasLtMatrixLayoutDestroy(cl);
    for (int i = 0; i < 3; i++)
        if (lay[i]) cublasLtMatrixLayoutDestroy(lay[i]);
    if (op) cublasLtMatmulDescDestroy(op);
    return st;
}

#else // a HIP build without hipBLASLt

struct dsc_cuda_blas {
    int unused;
};

static dsc_status no_blas(void) {
    return dsc__fail(DSC_ERR_UNSUPPORTED,
                     "this build has no GPU BLAS (hipBLASLt was not found when it was compiled); "
                     "install ROCm's hipblaslt and rebuild with DS_BUILD_HIP=1");
}

extern "C" dsc_status dsc__cuda_blas_create(dsc_cuda_blas **out, size_t workspace_bytes) {
    if (out) *out = NULL;
    return no_blas();
}

extern "C" dsc_status dsc__cuda_blas_create_in(dsc_cuda_blas **out, size_t workspace_bytes,
                                               dsc_mem_pool *pool) {
    if (out) *out = NULL;
    return no_blas();
}

extern "C" void dsc__cuda_blas_destroy(dsc_cuda_blas *h) { free(h); }

extern "C" dsc_status dsc__cuda_gemm(dsc_cuda_blas *h, const dsc_cuda_gemm *g, void *stream) {
    return no_blas();
}

#endif

// ---- the families' forward products ----

extern "C" dsc_status dsc__cuda_mm_forward(dsc_cuda_blas *h, uint16_t *out, int ldo,
                                           const uint16_t *inp, int lda, const uint16_t *w,
                                           const uint16_t *bias, const uint16_t *resid, int rows,
                                           int IC, int OC, int epi, uint16_t *aux, int fp16,
                                           void *stream) {
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.M = rows, g.N = OC, g.K = IC;
    g.A = inp, g.lda = lda, g.B = w, g.ldb = OC, g.D = out, g.ldd = ldo;
    g.alpha = 1.0f, g.beta = resid ? 1.0f : 0.0f, g.C = resid, g.ldc = ldo;
    g.epilogue = epi != DSC_CUDA_EPI_NONE ? epi : (bias ? DSC_CUDA_EPI_BIAS : DSC_CUDA_EPI_NONE);
    g.bias = bias, g.aux = aux, g.ldaux = OC, g.fp16 = fp16;
    return dsc__cuda_gemm(h, &g, stream);
}

extern "C" dsc_status dsc__cuda_linear_forward(dsc_cuda_blas *h, uint16_t *out, int ldo,
                                               const uint16_t *inp, int ldi, const uint16_t *w,
                                               const uint16_t *bias, const uint16_t *resid,
                                               int rows, int IN, int OUT, int fp16,
                                               void *stream) {
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.trans_b = 1, g.M = rows, g.N = OUT, g.K = IN;
    g.A = inp, g.lda = ldi, g.B = w, g.ldb = IN, g.D = out, g.ldd = ldo;
    g.alpha = 1.0f, g.beta = resid ? 1.0f : 0.0f, g.C = resid, g.ldc = ldo;
    g.epilogue = bias ? DSC_CUDA_EPI_BIAS : DSC_CUDA_EPI_NONE, g.bias = bias;
    g.fp16 = fp16;
    return dsc__cuda_gemm(h, &g, stream);
}

extern "C" dsc_status dsc__cuda_mm_dweight(dsc_cuda_blas *h, float *dw, const uint16_t *a, int lda,
                                           const uint16_t *b, int ldb, int rows, int M, int N,
                                           int fresh, int fp16, void *stream) {
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.trans_a = 1, g.M = M, g.N = N, g.K = rows;
    g.A = a, g.lda = lda, g.B = b, g.ldb = ldb, g.D = dw, g.ldd = N, g.d_fp32 = 1;
    g.alpha = 1.0f, g.beta = fresh ? 0.0f : 1.0f, g.C = dw, g.ldc = N, g.fp16 = fp16;
    return dsc__cuda_gemm(h, &g, stream);
}
