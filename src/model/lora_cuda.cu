// model/lora_cuda.cu - the LoRA adapters' device passes (see lora_cuda.h).
#include "model/lora_cuda.h"

#include <string.h> // memset

extern "C" {
#include "model/lora.h" // struct dsc_lora, dsc__lora_kept
}

#include "cuda/common.cuh" // DSC_CUDA_TRY, DSC_CUDA_LAUNCHED, dsc_16_f32, dsc_f32_16
#include "cuda/matmul.h"   // dsc__cuda_gemm

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

static int max_in(const dsc_lora *lo) {
    int m = 0;
    for (int k = 0; k < lo->n_adapters; k++)
        if (lo->in[k] > m) m = lo->in[k];
    return m;
}

static size_t bytes_of(const dsc_lora *lo, int64_t N, size_t *xa, size_t *t, size_t *xd) {
    *xa = align256((size_t)lo->n_adapters * (size_t)N * (size_t)lo->r * 2);
    *t = align256((size_t)N * (size_t)lo->r * 2);
    *xd = lo->dropout > 0 ? align256((size_t)N * (size_t)max_in(lo) * 2) : 0;
    return *xa + *t + *xd;
}

extern "C" size_t dsc__lora_dev_bytes(const dsc_lora *lo, int64_t N) {
    size_t xa, t, xd;
    return lo ? bytes_of(lo, N, &xa, &t, &xd) : 0;
}

extern "C" void dsc__lora_dev_carve(dsc__lora_dev *d, const dsc_lora *lo, int64_t N, char *base) {
    d->lo = lo;
    d->maxN = N;
    d->xa = d->t = d->xd = NULL;
    if (!lo || !base) return;
    size_t xa, t, xd;
    bytes_of(lo, N, &xa, &t, &xd);
    d->xa = (uint16_t *)base;
    d->t = (uint16_t *)(base + xa);
    d->xd = xd ? (uint16_t *)(base + xa + t) : NULL;
}

static int adapter(const dsc_lora *lo, int tensor) {
    return lo && tensor >= 0 && tensor < lo->n_base ? lo->adapter_of[tensor] : -1;
}

static bool drops(const dsc_lora *lo) { return lo->dropout > 0 && lo->training; }

extern "C" bool dsc__lora_dev_graph_ok(const dsc_lora *lo) { return !lo || lo->dropout == 0.0f; }

// The dropout of adapter k's input on N rows of `in` elements, the elements kept by the host's
// mask scaled by 1 / (1 - p): ADD false: dst = that of src (others 0); ADD true (the backward
// through it): dst += that of src. Row strides ldd, lds.
template <bool F16, bool ADD>
__global__ void drop_kernel(uint16_t *dst, int ldd, const uint16_t *src, int lds, int64_t N, int in,
                            uint64_t seed, uint64_t pass, int k, float p, float keep) {
    size_t n = (size_t)N * in;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        int64_t row = (int64_t)(i / in);
        int col = (int)(i % in);
        bool on = dsc__lora_kept(seed, pass, k, row, col, p);
        uint16_t *o = dst + (size_t)row * ldd + col;
        float v = on ? dsc_16_f32<F16>(src[(size_t)row * lds + col]) * keep : 0.0f;
        if (ADD && !on) continue;
        *o = dsc_f32_16<F16>(ADD ? dsc_16_f32<F16>(*o) + v : v);
    }
}

static dsc_status drop(const dsc__lora_dev *d, int k, bool add, uint16_t *dst, int ldd,
                       const uint16_t *src, int lds, int64_t N) {
    const dsc_lora *lo = d->lo;
    int in = lo->in[k];
    float keep = 1.0f / (1.0f - lo->dropout);
    size_t blocks = ((size_t)N * in + 255) / 256;
    unsigned nb = (unsigned)(blocks > 65535 ? 65535 : blocks ? blocks : 1);
    cudaStream_t st = (cudaStream_t)d->stream;
#define DSC__DROP(F16, ADD)                                                                        \
    drop_kernel<F16, ADD><<<nb, 256, 0, st>>>(dst, ldd, src, lds, N, in, lo->seed, lo->pass, k,    \
                                              lo->dropout, keep)
    if (d->fp16 && add) DSC__DROP(true, true);
    else if (d->fp16) DSC__DROP(true, false);
    else if (add) DSC__DROP(false, true);
    else DSC__DROP(false, false);
#undef DSC__DROP
    DSC_CUDA_LAUNCHED("lora drop_kernel");
    return DSC_OK;
}

// D (M, N) = alpha op(A) op(B) + beta C, C = D when beta != 0 (16-bit D, or fp32 when d32).
static dsc_status gemm(const dsc__lora_dev *d, bool ta, bool tb, int M, int N, int K,
                       const uint16_t *A, int lda, const uint16_t *B, int ldb, void *D, int ldd,
                       bool d32, float alpha, float beta) {
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.trans_a = ta, g.trans_b = tb;
    g.M = M, g.N = N, g.K = K;
    g.A = A, g.lda = lda, g.B = B, g.ldb = ldb;
    g.D = D, g.ldd = ldd, g.d_fp32 = d32;
    g.C = beta != 0.0f ? D : NULL, g.ldc = ldd;
    g.alpha = alpha, g.beta = beta;
    g.fp16 = d->fp16;
    return dsc__cuda_gemm(d->blas, &g, d->stream);
}

extern "C" dsc_status dsc__lora_dev_forward(const dsc__lora_dev *d, const uint16_t *const *params,
                                            int tensor, uint16_t *out, int ldo,
                                            const uint16_t *inp, int ldi, int64_t N) {
    const dsc_lora *lo = d->lo;
    int k = adapter(lo, tensor);
    if (k < 0) return DSC_OK;
    int r = lo->r, in = lo->in[k], o = lo->out[k];
    const uint16_t *A = params[lo->n_base + 2 * k], *B = params[lo->n_base + 2 * k + 1];
    uint16_t *xa = d->xa + (size_t)k * (size_t)d->maxN * (size_t)r;
    if (drops(lo)) {
        DSC_TRY(drop(d, k, false, d->xd, in, inp, ldi, N));
        inp = d->xd, ldi = in;
    }
    DSC_TRY(gemm(d, false, true, (int)N, r, in, inp, ldi, A, in, xa, r, false, 1.0f, 0.0f));
    return gemm(d, false, true, (int)N, o, r, xa, r, B, r, out, ldo, false, lo->scale, 1.0f);
}

extern "C" dsc_status dsc__lora_dev_backward(const dsc__lora_dev *d, const uint16_t *const *params,
                                             float *const *grads, int tensor, uint16_t *dinp,
                                             int lddi, const uint16_t *dout, int ldd,
                                             const uint16_t *inp, int ldi, int64_t N, bool fresh) {
    const dsc_lora *lo = d->lo;
    int k = adapter(lo, tensor);
    if (k < 0) return DSC_OK;
    int r = lo->r, in = lo->in[k], o = lo->out[k], rows = (int)N;
    const uint16_t *A = params[lo->n_base + 2 * k], *B = params[lo->n_base + 2 * k + 1];
    float *gA = grads[lo->n_base + 2 * k], *gB = grads[lo->n_base + 2 * k + 1];
    const uint16_t *xa = d->xa + (size_t)k * (size_t)d->maxN * (size_t)r;
    float beta = fresh ? 0.0f : 1.0f;
    // B's gradient (o, r) = scale dout^T xa; t (N, r) = scale dout B
    if (gB)
        DSC_TRY(gemm(d, true, false, o, r, rows, dout, ldd, xa, r, gB, r, true, lo->scale, beta));
    DSC_TRY(gemm(d, false, false, rows, r, o, dout, ldd, B, r, d->t, r, false, lo->scale, 0.0f));
    bool dropped = drops(lo);
    if (dropped) { // A saw the dropped-out input
        DSC_TRY(drop(d, k, false, d->xd, in, inp, ldi, N));
        inp = d->xd, ldi = in;
    }
    if (gA) DSC_TRY(gemm(d, true, false, r, in, rows, d->t, r, inp, ldi, gA, in, true, 1.0f, beta));
    if (!dinp) return DSC_OK;
    if (!dropped)
        return gemm(d, false, false, rows, in, r, d->t, r, A, in, dinp, lddi, false, 1.0f, 1.0f);
    // through the dropout: t A into the scratch, its kept elements scaled into dinp
    DSC_TRY(gemm(d, false, false, rows, in, r, d->t, r, A, in, d->xd, in, false, 1.0f, 0.0f));
    return drop(d, k, true, dinp, lddi, d->xd, in, N);
}
