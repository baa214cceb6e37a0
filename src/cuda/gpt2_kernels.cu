// cuda/gpt2_kernels.cu - GPU kernels of the GPT-2 layers (see gpt2_kernels.h for the contracts).
#include "cuda/gpt2_kernels.h"

#include "cuda/common.cuh" // DSC_CUDA_TRY, dsc_unpack8, dsc_block_sum, ...

// Threads per block of each family; all multiples of 64 so that AMD wavefronts divide them.
#define ELEM_THREADS 256    // elementwise passes
#define LN_THREADS 256      // layernorm forward: one warp per row
#define LNB_ROWS 32         // rows per partial sum of the layernorm parameter gradients
#define LNB_REG_THREADS 128 // layernorm backward, rows held in registers
#define COLSUM_THREADS 256
#define COLSUM_ROWS 256  // rows per partial column sum
#define XENT_THREADS 512 // one block per row of logits
#define SUM_THREADS 1024 // dsc__cuda_sum: one block
#define ENC_CHUNK 1024   // positions per block of the encoder's counting sort
#define ENC_THREADS 256

#define LN_EPS 1e-5f
#define GELU_K 0.79788456080286536f // sqrt(2 / pi)
#define GELU_A 0.044715f

static cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }

// ---- elementwise math ----

// GELU(x) = x e / (e + 1) with e = exp(2u), u = k (x + a x^3): the form of the CPU kernel, which
// keeps relative precision where tanh u is near +-1. u is capped so that e stays finite.
__device__ static inline float gelu_f(float x) {
    float e = expf(fminf(2.0f * GELU_K * (x + GELU_A * x * x * x), 88.0f));
    return x * (e / (e + 1.0f));
}

// GELU'(x) = e s (1 + 2 x s u'), s = 1 / (e + 1).
__device__ static inline float gelu_grad_f(float x) {
    float e = expf(fminf(2.0f * GELU_K * (x + GELU_A * x * x * x), 88.0f));
    float s = 1.0f / (e + 1.0f);
    float du = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
    return (e * s) * (1.0f + 2.0f * x * s * du);
}

enum { OP_GELU_FWD, OP_GELU_BWD, OP_ADD };

__device__ static inline float elem_op(int op, float a, float b) {
    if (op == OP_GELU_FWD) return gelu_f(a);
    if (op == OP_GELU_BWD) return b * gelu_grad_f(a);
    return a + b;
}

// out = op(a, b) over n elements; VEC: eight per thread as 16-byte accesses (n % 8 == 0).
template <int OP, bool VEC, bool F16>
__global__ void elem_kernel(uint16_t *out, const uint16_t *a, const uint16_t *b, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        if (i * 8 >= n) return;
        float x[8], y[8] = {0};
        dsc_unpack8_16<F16>(((const uint4 *)a)[i], x);
        if (b) dsc_unpack8_16<F16>(((const uint4 *)b)[i], y);
#pragma unroll
        for (int k = 0; k < 8; k++)
            x[k] = elem_op(OP, x[k], y[k]);
        ((uint4 *)out)[i] = dsc_pack8_16<F16>(x);
    } else {
        if (i >= n) return;
        float y = b ? dsc_16_f32<F16>(b[i]) : 0.0f;
        out[i] = dsc_f32_16<F16>(elem_op(OP, dsc_16_f32<F16>(a[i]), y));
    }
}

template <int OP, bool F16>
static dsc_status elem_launch(uint16_t *out, const uint16_t *a, const uint16_t *b, int64_t n,
                              void *stream, const char *name) {
    DSC_CUDA_ARG(n >= 0 && out && a, "%s: bad arguments (n %lld)", name, (long long)n);
    if (n == 0) return DSC_OK;
    bool vec = n % 8 == 0 && dsc__aligned16(out) && dsc__aligned16(a) && (!b || dsc__aligned16(b));
    if (vec)
        elem_kernel<OP, true, F16>
            <<<dsc__blocks(n / 8, ELEM_THREADS), ELEM_THREADS, 0, as_stream(stream)>>>(out, a, b,
                                                                                       n);
    else
        elem_kernel<OP, false, F16>
            <<<dsc__blocks(n, ELEM_THREADS), ELEM_THREADS, 0, as_stream(stream)>>>(out, a, b, n);
    DSC_CUDA_CHECK_AS(cudaGetLastError(), name);
    return DSC_OK;
}

// dinp = dout * GELU'(inp): the elementwise op takes (inp, dout) in that order.
extern "C" dsc_status dsc__cuda_gelu_forward_h(uint16_t *out, const uint16_t *inp, int64_t n,
                                               bool fp16, void *stream) {
    const char *name = "gelu forward";
    return fp16 ? elem_launch<OP_GELU_FWD, true>(out, inp, NULL, n, stream, name)
                : elem_launch<OP_GELU_FWD, false>(out, inp, NULL, n, stream, name);
}

extern "C" dsc_status dsc__cuda_gelu_forward(uint16_t *out, const uint16_t *inp, int64_t n,
                                             void *stream) {
    return dsc__cuda_gelu_forward_h(out, inp, n, false, stream);
}

extern "C" dsc_status dsc__cuda_gelu_backward_h(uint16_t *dinp, const uint16_t *dout,
                                                const uint16_t *inp, int64_t n, bool fp16,
                                                void *stream) {
    const char *name = "gelu backward";
    return fp16 ? elem_launch<OP_GELU_BWD, true>(dinp, inp, dout, n, stream, name)
                : elem_launch<OP_GELU_BWD, false>(dinp, inp, dout, n, stream, name);
}

extern "C" dsc_status dsc__cuda_gelu_backward(uint16_t *dinp, const uint16_t *dout,
                                              const uint16_t *inp, int64_t n, void *stream) {
    return dsc__cuda_gelu_backward_h(dinp, dout, inp, n, false, stream);
}

extern "C" dsc_status dsc__cuda_residual_forward_h(uint16_t *out, const uint16_t *a,
                                                   const uint16_t *b, int64_t n, bool fp16,
                                                   void *stream) {
    DSC_CUDA_ARG(b != NULL, "residual forward: b is NULL");
    const char *name = "residual forward";
    return fp16 ? elem_launch<OP_ADD, true>(out, a, b, n, stream, name)
                : elem_launch<OP_ADD, false>(out, a, b, n, stream, name);
}

extern "C" dsc_status dsc__cuda_residual_forward(uint16_t *out, const uint16_t *a,
                                                 const uint16_t *b, int64_t n, void *stream) {
    return dsc__cuda_residual_forward_h(out, a, b, n, false, stream);
}

template <bool F16> __global__ void f32_to_16_kernel(uint16_t *dst, const float *src, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = dsc_f32_16<F16>(src[i]);
}

extern "C" dsc_status dsc__cuda_f32_to_16(uint16_t *dst, const float *src, int64_t n, bool fp16,
                                          void *stream) {
    DSC_CUDA_ARG(n >= 0 && dst && src, "f32 to %s: bad arguments", fp16 ? "fp16" : "bf16");
    if (n == 0) return DSC_OK;
    unsigned blocks = dsc__blocks(n, ELEM_THREADS);
    if (fp16)
        f32_to_16_kernel<true><<<blocks, ELEM_THREADS, 0, as_stream(stream)>>>(dst, src, n);
    else
        f32_to_16_kernel<false><<<blocks, ELEM_THREADS, 0, as_stream(stream)>>>(dst, src, n);
    DSC_CUDA_LAUNCHED("f32_to_16_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t n,
                                            void *stream) {
    return dsc__cuda_f32_to_16(dst, src, n, false, stream);
}

// x = x rounded to fp16 and back: what the engine does to fp16 gradients (dsc_fp32_to_fp16,
// overflow to inf), in place.
__global__ void round_fp16_kernel(float *x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = dsc_fp16_f32(dsc_f32_16<true>(x[i]));
}

extern "C" dsc_status dsc__cuda_round_fp16(float *x, int64_t n, void *stream) {
    DSC_CUDA_ARG(n >= 0 && (x || n == 0), "round to fp16: bad arguments");
    if (n == 0) return DSC_OK;
    round_fp16_kernel<<<dsc__blocks(n, ELEM_THREADS), ELEM_THREADS, 0, as_stream(stream)>>>(x, n);
    DSC_CUDA_LAUNCHED("round_fp16_kernel");
    return DSC_OK;
}

// ---- token and position embeddings ----

// One thread per 8 channels of one position.
template <bool F16>
__global__ void encoder_fwd_kernel(uint4 *out, const int32_t *inp, const uint4 *wte,
                                   const uint4 *wpe, int BT, int T, int C8) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)BT * C8) return;
    int bt = (int)(i / C8), c8 = (int)(i % C8);
    float e[8], p[8];
    dsc_unpack8_16<F16>(wte[(size_t)inp[bt] * C8 + c8], e);
    dsc_unpack8_16<F16>(wpe[(size_t)(bt % T) * C8 + c8], p);
#pragma unroll
    for (int k = 0; k < 8; k++)
        e[k] += p[k];
    out[i] = dsc_pack8_16<F16>(e);
}

static dsc_status check_rows(const char *what, int C, const void *a, const void *b, const void *c) {
    DSC_CUDA_ARG(C > 0 && C % 8 == 0, "%s: C = %d must be a positive multiple of 8", what, C);
    DSC_CUDA_ARG(dsc__aligned16(a) && dsc__aligned16(b) && dsc__aligned16(c),
                 "%s: tensors must be 16-byte aligned (whole rows of cudaMalloc'd buffers)", what);
    return DSC_OK;
}

template <bool F16>
static dsc_status encoder_forward(uint16_t *out, const int32_t *inp, const uint16_t *wte,
                                  const uint16_t *wpe, int B, int T, int C, void *stream) {
    DSC_TRY(check_rows("encoder forward", C, out, wte, wpe));
    DSC_CUDA_ARG(B > 0 && T > 0 && inp, "encoder forward: bad batch %d x %d", B, T);
    long long n = (long long)B * T * (C / 8);
    encoder_fwd_kernel<F16><<<dsc__blocks(n, ELEM_THREADS), ELEM_THREADS, 0, as_stream(stream)>>>(
        (uint4 *)out, inp, (const uint4 *)wte, (const uint4 *)wpe, B * T, T, C / 8);
    DSC_CUDA_LAUNCHED("encoder_fwd_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_encoder_forward_h(uint16_t *out, const int32_t *inp,
                                                  const uint16_t *wte, const uint16_t *wpe, int B,
                                                  int T, int C, bool fp16, void *stream) {
    return fp16 ? encoder_forward<true>(out, inp, wte, wpe, B, T, C, stream)
                : encoder_forward<false>(out, inp, wte, wpe, B, T, C, stream);
}

extern "C" dsc_status dsc__cuda_encoder_forward(uint16_t *out, const int32_t *inp,
                                                const uint16_t *wte, const uint16_t *wpe, int B,
                                                int T, int C, void *stream) {
    return dsc__cuda_encoder_forward_h(out, inp, wte, wpe, B, T, C, false, stream);
}

// Backward, step 1: each position's rank among the earlier positions of its chunk that hold the
// same token, and per (chunk, token) counts (integer atomics: the counts do not depend on order).
__global__ void enc_rank_kernel(int *rank, int *counts, const int32_t *inp, int BT, int V) {
    __shared__ int tok[ENC_CHUNK];
    int base = blockIdx.x * ENC_CHUNK;
    int n = min(ENC_CHUNK, BT - base);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        tok[i] = inp[base + i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int v = tok[i], r = 0;
        for (int j = 0; j < i; j++)
            r += tok[j] == v;
        rank[base + i] = r;
        atomicAdd(&counts[(size_t)blockIdx.x * V + v], 1);
    }
}

// Step 2: per token, counts become exclusive prefixes over the chunks; totals (V) per token,
// and per block of ELEM_THREADS tokens their sum (blocksum, zeroed before; integer atomics).
__global__ void enc_chunk_prefix_kernel(int *counts, int *totals, int *blocksum, int nchunks,
                                        int V) {
    int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= V) return;
    int run = 0;
    for (int c = 0; c < nchunks; c++) {
        int k = counts[(size_t)c * V + v];
        counts[(size_t)c * V + v] = run;
        run += k;
    }
    totals[v] = run;
    if (run) atomicAdd(&blocksum[blockIdx.x], run);
}

// Step 3: offsets (V) = exclusive scan of totals; block b (ELEM_THREADS tokens, as step 2's)
// starts from the sum of the blocks before it, then scans its own tokens in shared memory.
__global__ void __launch_bounds__(ELEM_THREADS)
    enc_scan_kernel(int *offsets, const int *totals, const int *blocksum, int V) {
    __shared__ int sh[ELEM_THREADS];
    int t = threadIdx.x, v = blockIdx.x * ELEM_THREADS + t, before = 0;
    for (int k = t; k < (int)blockIdx.x; k += ELEM_THREADS)
        before += blocksum[k];
    sh[t] = before;
    __syncthreads();
    for (int half = ELEM_THREADS / 2; half > 0; half >>= 1) {
        if (t < half) sh[t] += sh[t + half];
        __syncthreads();
    }
    int base = sh[0], own = v < V ? totals[v] : 0;
    __syncthreads();
    sh[t] = own;
    __syncthreads();
    for (int off = 1; off < ELEM_THREADS; off <<= 1) { // inclusive Hillis-Steele scan
        int x = t >= off ? sh[t - off] : 0;
        __syncthreads();
        sh[t] += x;
        __syncthreads();
    }
    if (v < V) offsets[v] = base + sh[t] - own;
}

// Step 4: sorted (BT) = positions ordered by (token, position): a stable counting sort.
__global__ void enc_scatter_kernel(int *sorted, const int *rank, const int *counts,
                                   const int *offsets, const int32_t *inp, int BT, int V) {
    int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= BT) return;
    int v = inp[p];
    sorted[offsets[v] + counts[(size_t)(p / ENC_CHUNK) * V + v] + rank[p]] = p;
}

// Step 5: the first thread of each token's run sums the run's rows (8 channels) in position
// order and adds them to dwte: one writer per (token, channel group), hence no atomics.
template <bool F16>
__global__ void enc_wte_grad_kernel(float *dwte, const uint4 *dout, const int *sorted,
                                    const int32_t *inp, int BT, int C8) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)BT * C8) return;
    int i = (int)(idx / C8), c8 = (int)(idx % C8);
    int v = inp[sorted[i]];
    if (i > 0 && inp[sorted[i - 1]] == v) return;
    float acc[8] = {0}, x[8];
    for (int j = i; j < BT; j++) {
        int p = sorted[j];
        if (inp[p] != v) break;
        dsc_unpack8_16<F16>(dout[(size_t)p * C8 + c8], x);
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[k] += x[k];
    }
    float4 *g = (float4 *)(dwte + ((size_t)v * C8 + c8) * 8);
    float4 g0 = g[0], g1 = g[1];
    g[0] = make_float4(g0.x + acc[0], g0.y + acc[1], g0.z + acc[2], g0.w + acc[3]);
    g[1] = make_float4(g1.x + acc[4], g1.y + acc[5], g1.z + acc[6], g1.w + acc[7]);
}

// dwpe[t] += (add) or = the sum over b of dout[b, t], b in order; one thread per (t, 8 channels).
template <bool F16>
__global__ void enc_wpe_grad_kernel(float *dwpe, const uint4 *dout, int B, int T, int C8,
                                    bool add) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)T * C8) return;
    int t = (int)(idx / C8), c8 = (int)(idx % C8);
    float acc[8] = {0}, x[8];
    for (int b = 0; b < B; b++) {
        dsc_unpack8_16<F16>(dout[((size_t)b * T + t) * C8 + c8], x);
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[k] += x[k];
    }
    float4 *g = (float4 *)(dwpe + idx * 8);
    if (!add) {
        g[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        g[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
        return;
    }
    float4 g0 = g[0], g1 = g[1];
    g[0] = make_float4(g0.x + acc[0], g0.y + acc[1], g0.z + acc[2], g0.w + acc[3]);
    g[1] = make_float4(g1.x + acc[4], g1.y + acc[5], g1.z + acc[6], g1.w + acc[7]);
}

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// Scratch: counts (nchunks, V) and blocksum (V / ELEM_THREADS, rounded up) zeroed together,
// totals (V), offsets (V), rank (BT), sorted (BT), all int.
static size_t enc_counts_bytes(size_t nchunks, int V) {
    return align256((nchunks * V + (V + ELEM_THREADS - 1) / ELEM_THREADS) * 4);
}

extern "C" size_t dsc__cuda_token_sort_scratch(int64_t N, int V) {
    size_t nchunks = ((size_t)N + ENC_CHUNK - 1) / ENC_CHUNK;
    return enc_counts_bytes(nchunks, V) + 2 * align256((size_t)V * 4) + 2 * align256((size_t)N * 4);
}

extern "C" size_t dsc__cuda_encoder_backward_scratch(int B, int T, int V) {
    return dsc__cuda_token_sort_scratch((int64_t)B * T, V);
}

extern "C" dsc_status dsc__cuda_token_sort(int **sorted, void *scratch, const int32_t *inp,
                                           int64_t N, int V, void *stream) {
    DSC_CUDA_ARG(sorted && scratch && inp && N > 0 && N < (1ll << 31) && V > 0,
                 "token sort: bad arguments (N %lld, V %d)", (long long)N, V);
    cudaStream_t st = as_stream(stream);
    int BT = (int)N, nchunks = (BT + ENC_CHUNK - 1) / ENC_CHUNK;
    char *s = (char *)scratch;
    int *counts = (int *)s, *blocksum = counts + (size_t)nchunks * V;
    s += enc_counts_bytes(nchunks, V);
    int *totals = (int *)s, *offsets = (int *)(s + align256((size_t)V * 4));
    s += 2 * align256((size_t)V * 4);
    int *rank = (int *)s;
    *sorted = (int *)(s + align256((size_t)BT * 4));
    DSC_CUDA_TRY(cudaMemsetAsync(counts, 0, enc_counts_bytes(nchunks, V), st));
    enc_rank_kernel<<<nchunks, ENC_THREADS, 0, st>>>(rank, counts, inp, BT, V);
    DSC_CUDA_LAUNCHED("enc_rank_kernel");
    unsigned vblocks = dsc__blocks(V, ELEM_THREADS);
    enc_chunk_prefix_kernel<<<vblocks, ELEM_THREADS, 0, st>>>(counts, totals, blocksum, nchunks, V);
    DSC_CUDA_LAUNCHED("enc_chunk_prefix_kernel");
    enc_scan_kernel<<<vblocks, ELEM_THREADS, 0, st>>>(offsets, totals, blocksum, V);
    DSC_CUDA_LAUNCHED("enc_scan_kernel");
    enc_scatter_kernel<<<dsc__blocks(BT, ELEM_THREADS), ELEM_THREADS, 0, st>>>(
        *sorted, rank, counts, offsets, inp, BT, V);
    DSC_CUDA_LAUNCHED("enc_scatter_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_encoder_backward_h(float *dwte, float *dwpe, void *scratch,
                                                   const uint16_t *dout, const int32_t *inp, int B,
                                                   int T, int C, int V, bool wpe_add, bool fp16,
                                                   void *stream) {
    DSC_TRY(check_rows("encoder backward", C, dwte, dwpe, dout));
    DSC_CUDA_ARG(B > 0 && T > 0 && V > 0 && inp && scratch, "encoder backward: bad arguments");
    cudaStream_t st = as_stream(stream);
    int BT = B * T, C8 = C / 8, *sorted = NULL;
    DSC_TRY(dsc__cuda_token_sort(&sorted, scratch, inp, BT, V, stream));
    unsigned wte_blocks = dsc__blocks((long long)BT * C8, ELEM_THREADS);
    unsigned wpe_blocks = dsc__blocks((long long)T * C8, ELEM_THREADS);
    const uint4 *d = (const uint4 *)dout;
    if (fp16)
        enc_wte_grad_kernel<true>
            <<<wte_blocks, ELEM_THREADS, 0, st>>>(dwte, d, sorted, inp, BT, C8);
    else
        enc_wte_grad_kernel<false>
            <<<wte_blocks, ELEM_THREADS, 0, st>>>(dwte, d, sorted, inp, BT, C8);
    DSC_CUDA_LAUNCHED("enc_wte_grad_kernel");
    if (fp16)
        enc_wpe_grad_kernel<true><<<wpe_blocks, ELEM_THREADS, 0, st>>>(dwpe, d, B, T, C8, wpe_add);
    else
        enc_wpe_grad_kernel<false><<<wpe_blocks, ELEM_THREADS, 0, st>>>(dwpe, d, B, T, C8, wpe_add);
    DSC_CUDA_LAUNCHED("enc_wpe_grad_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_encoder_backward(float *dwte, float *dwpe, void *scratch,
                                                 const uint16_t *dout, const int32_t *inp, int B,
                                                 int T, int C, int V, void *stream) {
    return dsc__cuda_encoder_backward_h(dwte, dwpe, scratch, dout, inp, B, T, C, V, true, false,
                                        stream);
}

// ---- layernorm ----

// Eight channels of a row (x), in the order both forward kernels keep: s += x; q += (x - m)^2;
// the normalised (x - m) r w + b as the result.
template <bool F16> __device__ static inline void ln_sum8(float &s, uint4 xq) {
    float v[8];
    dsc_unpack8_16<F16>(xq, v);
#pragma unroll
    for (int k = 0; k < 8; k++)
        s += v[k];
}

template <bool F16> __device__ static inline void ln_var8(float &q, uint4 xq, float m) {
    float v[8];
    dsc_unpack8_16<F16>(xq, v);
#pragma unroll
    for (int k = 0; k < 8; k++)
        q += (v[k] - m) * (v[k] - m);
}

template <bool F16>
__device__ static inline uint4 ln_norm8(uint4 xq, uint4 wq, uint4 bq, float m, float r) {
    float v[8], wv[8], bv[8];
    dsc_unpack8_16<F16>(xq, v);
    dsc_unpack8_16<F16>(wq, wv);
    dsc_unpack8_16<F16>(bq, bv);
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = (v[k] - m) * r * wv[k] + bv[k];
    return dsc_pack8_16<F16>(v);
}

// One warp per row: mean, then the centred variance (two passes, as the CPU kernel), then out.
template <bool F16>
__global__ void ln_fwd_kernel(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                              const uint16_t *w, const uint16_t *b, long long N, int C) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    long long row =
        (long long)blockIdx.x * (blockDim.x / DSC_WARP_SIZE) + threadIdx.x / DSC_WARP_SIZE;
    if (row >= N) return; // whole warps leave together
    int C8 = C / 8;
    const uint4 *x = (const uint4 *)(inp + row * C);
    float s = 0.0f, var = 0.0f;
    for (int i = lane; i < C8; i += DSC_WARP_SIZE)
        ln_sum8<F16>(s, x[i]);
    float m = dsc_warp_sum(s) / (float)C;
    for (int i = lane; i < C8; i += DSC_WARP_SIZE)
        ln_var8<F16>(var, x[i], m);
    float r = 1.0f / sqrtf(dsc_warp_sum(var) / (float)C + LN_EPS);
    uint4 *o = (uint4 *)(out + row * C);
    for (int i = lane; i < C8; i += DSC_WARP_SIZE)
        o[i] = ln_norm8<F16>(x[i], ((const uint4 *)w)[i], ((const uint4 *)b)[i], m, r);
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// The same with the row in registers (at most NCH chunks of 8 channels per lane): all of a
// lane's loads in flight at once, then the three passes over registers, in the same order (so
// bitwise ln_fwd_kernel's results).
template <bool F16, int NCH>
__global__ void ln_fwd_reg_kernel(uint16_t *out, float *mean, float *rstd, const uint16_t *inp,
                                  const uint16_t *w, const uint16_t *b, long long N, int C) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    long long row =
        (long long)blockIdx.x * (blockDim.x / DSC_WARP_SIZE) + threadIdx.x / DSC_WARP_SIZE;
    if (row >= N) return; // whole warps leave together
    int C8 = C / 8;
    const uint4 *x = (const uint4 *)(inp + row * C);
    uint4 xq[NCH];
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int i = lane + j * DSC_WARP_SIZE;
        xq[j] = i < C8 ? x[i] : make_uint4(0, 0, 0, 0);
    }
    float s = 0.0f, var = 0.0f;
#pragma unroll
    for (int j = 0; j < NCH; j++)
        if (lane + j * DSC_WARP_SIZE < C8) ln_sum8<F16>(s, xq[j]);
    float m = dsc_warp_sum(s) / (float)C;
#pragma unroll
    for (int j = 0; j < NCH; j++)
        if (lane + j * DSC_WARP_SIZE < C8) ln_var8<F16>(var, xq[j], m);
    float r = 1.0f / sqrtf(dsc_warp_sum(var) / (float)C + LN_EPS);
    uint4 *o = (uint4 *)(out + row * C);
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int i = lane + j * DSC_WARP_SIZE;
        if (i < C8) o[i] = ln_norm8<F16>(xq[j], ((const uint4 *)w)[i], ((const uint4 *)b)[i], m, r);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

extern "C" dsc_status dsc__cuda_layernorm_forward_h(uint16_t *out, float *mean, float *rstd,
                                                    const uint16_t *inp, const uint16_t *w,
                                                    const uint16_t *b, int64_t N, int C, bool fp16,
                                                    void *stream) {
    DSC_TRY(check_rows("layernorm forward", C, out, inp, w));
    DSC_CUDA_ARG(N > 0 && mean && rstd && dsc__aligned16(b), "layernorm forward: bad arguments");
    int rows_per_block = LN_THREADS / dsc__host_warp_size();
    unsigned blocks = dsc__blocks(N, rows_per_block);
    cudaStream_t st = as_stream(stream);
    typedef void (*ln_fwd_fn)(uint16_t *, float *, float *, const uint16_t *, const uint16_t *,
                              const uint16_t *, long long, int);
    static const ln_fwd_fn reg[2][4] = {
        {ln_fwd_reg_kernel<false, 1>, ln_fwd_reg_kernel<false, 2>, ln_fwd_reg_kernel<false, 3>,
         ln_fwd_reg_kernel<false, 4>},
        {ln_fwd_reg_kernel<true, 1>, ln_fwd_reg_kernel<true, 2>, ln_fwd_reg_kernel<true, 3>,
         ln_fwd_reg_kernel<true, 4>}};
    int ws = dsc__host_warp_size(), nch = (C / 8 + ws - 1) / ws;
    ln_fwd_fn k = nch <= 4 ? reg[fp16][nch - 1] : fp16 ? ln_fwd_kernel<true> : ln_fwd_kernel<false>;
    k<<<blocks, LN_THREADS, 0, st>>>(out, mean, rstd, inp, w, b, N, C);
    DSC_CUDA_LAUNCHED("ln_fwd_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_layernorm_forward(uint16_t *out, float *mean, float *rstd,
                                                  const uint16_t *inp, const uint16_t *w,
                                                  const uint16_t *b, int64_t N, int C,
                                                  void *stream) {
    return dsc__cuda_layernorm_forward_h(out, mean, rstd, inp, w, b, N, C, false, stream);
}

// pw[0..7] += dy xhat, pb[0..7] += dy: eight channels of a warp's partial sums in shared memory
// (16-byte accesses, so a warp's lanes do not collide on banks).
__device__ static inline void ln_add_partials(float *pw, float *pb, const float a[8],
                                              const float xh[8]) {
    float4 *w4 = (float4 *)pw, *b4 = (float4 *)pb;
    float4 w0 = w4[0], w1 = w4[1], b0 = b4[0], b1 = b4[1];
    w0.x += a[0] * xh[0], w0.y += a[1] * xh[1], w0.z += a[2] * xh[2], w0.w += a[3] * xh[3];
    w1.x += a[4] * xh[4], w1.y += a[5] * xh[5], w1.z += a[6] * xh[6], w1.w += a[7] * xh[7];
    b0.x += a[0], b0.y += a[1], b0.z += a[2], b0.w += a[3];
    b1.x += a[4], b1.y += a[5], b1.z += a[6], b1.w += a[7];
    w4[0] = w0, w4[1] = w1, b4[0] = b0, b4[1] = b1;
}

// Eight channels of a row: s1 += g, s2 += g xhat, g = dy w.
template <bool F16>
__device__ static inline void ln_bwd_sums(uint4 dyq, uint4 xq, uint4 wq, float m, float rs,
                                          float &s1, float &s2) {
    float a[8], xv[8], wv[8];
    dsc_unpack8_16<F16>(dyq, a);
    dsc_unpack8_16<F16>(xq, xv);
    dsc_unpack8_16<F16>(wq, wv);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float g = a[k] * wv[k];
        s1 += g;
        s2 += g * ((xv[k] - m) * rs);
    }
}

// Eight channels of a row once s1 and s2 are the row's means: dx + rstd (g - s1 - xhat s2) as
// the result, and dy xhat, dy into the warp's partial sums; pc (NULL: none) += the result as
// stored (16-bit), for the column sums of dinp.
template <bool F16>
__device__ static inline uint4 ln_bwd_dx(uint4 dyq, uint4 xq, uint4 wq, uint4 dxq, float m,
                                         float rs, float s1, float s2, float *pw, float *pb,
                                         float *pc) {
    float a[8], xv[8], wv[8], d[8], xh[8];
    dsc_unpack8_16<F16>(dyq, a);
    dsc_unpack8_16<F16>(xq, xv);
    dsc_unpack8_16<F16>(wq, wv);
    dsc_unpack8_16<F16>(dxq, d);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        xh[k] = (xv[k] - m) * rs;
        d[k] += rs * (a[k] * wv[k] - s1 - xh[k] * s2);
    }
    ln_add_partials(pw, pb, a, xh);
    uint4 out = dsc_pack8_16<F16>(d);
    if (pc) {
        dsc_unpack8_16<F16>(out, d);
        float4 *c4 = (float4 *)pc;
        float4 c0 = c4[0], c1 = c4[1];
        c0.x += d[0], c0.y += d[1], c0.z += d[2], c0.w += d[3];
        c1.x += d[4], c1.y += d[5], c1.z += d[6], c1.w += d[7];
        c4[0] = c0, c4[1] = c1;
    }
    return out;
}

// A block's start: its rows' mean and rstd into shared memory, the calling warp's slice of
// partial sums (nparts C floats) zeroed (the block synchronises after).
__device__ static inline void ln_bwd_start(float *sm, float *sr, float *pw, const float *mean,
                                           const float *rstd, long long r0, int nr, int C,
                                           int nparts) {
    for (int i = threadIdx.x; i < nr; i += blockDim.x) {
        sm[i] = mean[r0 + i];
        sr[i] = rstd[r0 + i];
    }
    for (int i = threadIdx.x % DSC_WARP_SIZE; i < nparts * C / 4; i += DSC_WARP_SIZE)
        ((float4 *)pw)[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

// A block's end: the warps' slices summed in warp order (deterministic) into out (nparts C).
__device__ static inline void ln_bwd_finish(float *out, const float *sh, int C, int nwarps,
                                            int nparts) {
    for (int c = threadIdx.x; c < nparts * C; c += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < nwarps; k++)
            v += sh[(size_t)k * nparts * C + c];
        out[c] = v;
    }
}

// One block per chunk of LNB_ROWS rows, a warp per row: dinp += rstd (g - mean(g) - xhat
// mean(g xhat)), g = dy w. In the same pass each lane adds dy xhat and dy of its channels into
// its warp's slice of shared memory (2 C floats a warp, each channel one lane's, so no atomics);
// the block then sums the slices in warp order into scratch (nchunks, nparts, C). nparts 3: the
// third slice sums the resulting dinp's columns. Deterministic.
template <bool F16>
__global__ void ln_bwd_kernel(uint16_t *dinp, float *scratch, const uint16_t *dout,
                              const uint16_t *inp, const uint16_t *w, const float *mean,
                              const float *rstd, long long N, int C, int nparts) {
    extern __shared__ float4 ln_sh4[]; // [nwarps][nparts][C] partial sums, then mean and rstd
    float *sh = (float *)ln_sh4;
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = blockDim.x / DSC_WARP_SIZE, C8 = C / 8;
    float *sm = sh + (size_t)nwarps * nparts * C, *sr = sm + LNB_ROWS;
    float *pw = sh + (size_t)warp * nparts * C, *pb = pw + C, *pc = nparts > 2 ? pb + C : NULL;
    const uint4 *w4 = (const uint4 *)w;
    long long r0 = (long long)blockIdx.x * LNB_ROWS;
    int nr = (int)min((long long)LNB_ROWS, N - r0);
    ln_bwd_start(sm, sr, pw, mean, rstd, r0, nr, C, nparts);
    __syncthreads();
    for (int r = warp; r < nr; r += nwarps) {
        const uint4 *dy = (const uint4 *)(dout + (r0 + r) * C);
        const uint4 *x = (const uint4 *)(inp + (r0 + r) * C);
        uint4 *dx = (uint4 *)(dinp + (r0 + r) * C);
        float m = sm[r], rs = sr[r], s1 = 0.0f, s2 = 0.0f;
        for (int i = lane; i < C8; i += DSC_WARP_SIZE)
            ln_bwd_sums<F16>(dy[i], x[i], w4[i], m, rs, s1, s2);
        s1 = dsc_warp_sum(s1) / (float)C;
        s2 = dsc_warp_sum(s2) / (float)C;
        for (int i = lane; i < C8; i += DSC_WARP_SIZE)
            dx[i] = ln_bwd_dx<F16>(dy[i], x[i], w4[i], dx[i], m, rs, s1, s2, pw + i * 8,
                                   pb + i * 8, pc ? pc + i * 8 : NULL);
    }
    __syncthreads();
    ln_bwd_finish(scratch + (size_t)blockIdx.x * nparts * C, sh, C, nwarps, nparts);
}

// The same for rows of at most NCH chunks of 8 channels per lane (C <= 256 NCH with 32 lanes),
// the row's values in registers: dy and x are read once, all chunks at a time, so each warp has
// its whole row in flight.
template <bool F16, int NCH>
__global__ void __launch_bounds__(LNB_REG_THREADS, 4)
    ln_bwd_reg_kernel(uint16_t *dinp, float *scratch, const uint16_t *dout, const uint16_t *inp,
                      const uint16_t *w, const float *mean, const float *rstd, long long N, int C,
                      int nparts) {
    extern __shared__ float4 ln_sh4[]; // [nwarps][nparts][C] partial sums, then mean and rstd
    float *sh = (float *)ln_sh4;
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = blockDim.x / DSC_WARP_SIZE, C8 = C / 8;
    float *sm = sh + (size_t)nwarps * nparts * C, *sr = sm + LNB_ROWS;
    float *pw = sh + (size_t)warp * nparts * C, *pb = pw + C, *pc = nparts > 2 ? pb + C : NULL;
    long long r0 = (long long)blockIdx.x * LNB_ROWS;
    int nr = (int)min((long long)LNB_ROWS, N - r0);
    ln_bwd_start(sm, sr, pw, mean, rstd, r0, nr, C, nparts);
    uint4 wq[NCH];
#pragma unroll
    for (int j = 0; j < NCH; j++) {
        int i = lane + j * DSC_WARP_SIZE;
        wq[j] = i < C8 ? ((const uint4 *)w)[i] : make_uint4(0, 0, 0, 0);
    }
    __syncthreads();
    for (int r = warp; r < nr; r += nwarps) {
        const uint4 *dy = (const uint4 *)(dout + (r0 + r) * C);
        const uint4 *x = (const uint4 *)(inp + (r0 + r) * C);
        uint4 *dx = (uint4 *)(dinp + (r0 + r) * C);
        uint4 dyq[NCH], xq[NCH];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = lane + j * DSC_WARP_SIZE;
            dyq[j] = i < C8 ? dy[i] : make_uint4(0, 0, 0, 0);
            xq[j] = i < C8 ? x[i] : make_uint4(0, 0, 0, 0);
        }
        float m = sm[r], rs = sr[r], s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) // zeros past the row add nothing
            ln_bwd_sums<F16>(dyq[j], xq[j], wq[j], m, rs, s1, s2);
        s1 = dsc_warp_sum(s1) / (float)C;
        s2 = dsc_warp_sum(s2) / (float)C;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = lane + j * DSC_WARP_SIZE;
            if (i < C8)
                dx[i] = ln_bwd_dx<F16>(dyq[j], xq[j], wq[j], dx[i], m, rs, s1, s2, pw + i * 8,
                                       pb + i * 8, pc ? pc + i * 8 : NULL);
        }
    }
    __syncthreads();
    ln_bwd_finish(scratch + (size_t)blockIdx.x * nparts * C, sh, C, nwarps, nparts);
}

static size_t ln_bwd_smem(int C, int warps, int nparts) {
    return ((size_t)warps * nparts * C + 2 * LNB_ROWS) * sizeof(float);
}

// Warps per layernorm backward block: as many (up to 8) as the device's shared memory per block
// holds with nparts C floats of partial sums each; 0 if not even one fits.
static dsc_status ln_bwd_warps(int C, int nparts, int *warps, size_t *smem) {
    int dev = 0, optin = 0;
    DSC_CUDA_TRY(cudaGetDevice(&dev));
    DSC_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    int w = 8;
    while (w > 0 && ln_bwd_smem(C, w, nparts) > (size_t)optin)
        w--;
    DSC_CUDA_ARG(w > 0,
                 "layernorm backward: C = %d needs %zu bytes of shared memory a block, more than "
                 "this device's %d",
                 C, ln_bwd_smem(C, 1, nparts), optin);
    *warps = w;
    *smem = ln_bwd_smem(C, w, nparts);
    return DSC_OK;
}

// The layernorm backward kernel for a 16-bit type and a row width: the register kernel for
// rows of at most 4 chunks of 8 channels per lane (nch), the shared-memory one beyond.
typedef void (*ln_bwd_fn)(uint16_t *, float *, const uint16_t *, const uint16_t *, const uint16_t *,
                          const float *, const float *, long long, int, int);
static ln_bwd_fn ln_bwd_pick(bool fp16, int nch) {
    static const ln_bwd_fn reg[2][4] = {{ln_bwd_reg_kernel<false, 1>, ln_bwd_reg_kernel<false, 2>,
                                         ln_bwd_reg_kernel<false, 3>, ln_bwd_reg_kernel<false, 4>},
                                        {ln_bwd_reg_kernel<true, 1>, ln_bwd_reg_kernel<true, 2>,
                                         ln_bwd_reg_kernel<true, 3>, ln_bwd_reg_kernel<true, 4>}};
    if (nch <= 4) return reg[fp16][nch - 1];
    return fp16 ? ln_bwd_kernel<true> : ln_bwd_kernel<false>;
}

// Column c of part (nchunks rows, stride apart) summed over k in order, added to dest[c / width]
// [c % width]: the second half of every chunked column reduction; several destinations (the
// layernorm's dw, db and dinp's column sums) in one launch. One destination: width = ncols.
#define RED_X 32 // columns per block of the partial-sum reduction
#define RED_Y 16 // lanes along the chunks
typedef struct red_dests {
    float *d[3];
    bool add; // false: each destination is overwritten (=), not added to
} red_dests;

__global__ void __launch_bounds__(RED_X *RED_Y)
    reduce_partials_kernel(red_dests dest, int width, const float *part, int nchunks,
                           size_t stride, int ncols) {
    __shared__ float sh[RED_Y][RED_X + 1];
    int c = blockIdx.x * RED_X + threadIdx.x;
    float s = 0.0f;
    if (c < ncols)
        for (int k = threadIdx.y; k < nchunks; k += RED_Y)
            s += part[(size_t)k * stride + c];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= ncols) return;
    for (int y = 1; y < RED_Y; y++) // a fixed order: deterministic
        s += sh[y][threadIdx.x];
    float *o = dest.d[c / width] + c % width;
    *o = dest.add ? *o + s : s;
}

static void reduce_partials_to(red_dests dest, int width, const float *part, int nchunks,
                               size_t stride, int ncols, cudaStream_t st) {
    reduce_partials_kernel<<<(ncols + RED_X - 1) / RED_X, dim3(RED_X, RED_Y), 0, st>>>(
        dest, width, part, nchunks, stride, ncols);
}

static void reduce_partials(float *acc, bool add, const float *part, int nchunks, size_t stride,
                            int ncols, cudaStream_t st) {
    red_dests dest = {{acc, NULL, NULL}, add};
    reduce_partials_to(dest, ncols, part, nchunks, stride, ncols, st);
}

extern "C" size_t dsc__cuda_layernorm_backward_scratch(int64_t N, int C) {
    return (size_t)((N + LNB_ROWS - 1) / LNB_ROWS) * 3 * (size_t)C;
}

extern "C" dsc_status dsc__cuda_layernorm_backward_h(uint16_t *dinp, float *dw, float *db,
                                                     float *scratch, const uint16_t *dout,
                                                     const uint16_t *inp, const uint16_t *w,
                                                     const float *mean, const float *rstd,
                                                     float *dsum, bool add, int64_t N, int C,
                                                     bool fp16, void *stream) {
    DSC_TRY(check_rows("layernorm backward", C, dinp, dout, inp));
    DSC_CUDA_ARG(N > 0 && dsc__aligned16(w) && dw && db && scratch && mean && rstd,
                 "layernorm backward: bad arguments");
    cudaStream_t st = as_stream(stream);
    int nchunks = (int)((N + LNB_ROWS - 1) / LNB_ROWS), nparts = dsum ? 3 : 2;
    int ws = dsc__host_warp_size(), nch = (C / 8 + ws - 1) / ws, threads = LNB_REG_THREADS;
    size_t smem = ln_bwd_smem(C, threads / ws, nparts);
    if (nch > 4) { // the shared-memory kernel: as many warps as three parts leave room for (with
        int warps = 0; // or without dsum: the same blocks, so dw and db come out the same bits)
        DSC_TRY(ln_bwd_warps(C, 3, &warps, &smem));
        threads = warps * ws;
        smem = ln_bwd_smem(C, warps, nparts);
    }
    ln_bwd_fn k = ln_bwd_pick(fp16, nch);
    DSC_CUDA_CHECK_AS(
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
        "layernorm backward: shared memory limit");
    k<<<nchunks, threads, smem, st>>>(dinp, scratch, dout, inp, w, mean, rstd, N, C, nparts);
    DSC_CUDA_LAUNCHED("ln_bwd_kernel");
    red_dests dest = {{dw, db, dsum}, add};
    reduce_partials_to(dest, C, scratch, nchunks, (size_t)nparts * C, nparts * C, st);
    DSC_CUDA_LAUNCHED("reduce_partials_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_layernorm_backward(uint16_t *dinp, float *dw, float *db,
                                                   float *scratch, const uint16_t *dout,
                                                   const uint16_t *inp, const uint16_t *w,
                                                   const float *mean, const float *rstd, int64_t N,
                                                   int C, void *stream) {
    return dsc__cuda_layernorm_backward_h(dinp, dw, db, scratch, dout, inp, w, mean, rstd, NULL,
                                          true, N, C, false, stream);
}

// ---- column sums (bias gradients) ----

// One block per chunk of COLSUM_ROWS rows; threads walk the columns, rows in order.
template <bool F16>
__global__ void colsum_kernel(float *part, const uint16_t *d, long long rows, int ncols) {
    long long r0 = (long long)blockIdx.x * COLSUM_ROWS;
    int nr = (int)min((long long)COLSUM_ROWS, rows - r0);
    for (int c = threadIdx.x; c < ncols; c += blockDim.x) {
        float s = 0.0f;
        for (int r = 0; r < nr; r++)
            s += dsc_16_f32<F16>(d[(r0 + r) * ncols + c]);
        part[(size_t)blockIdx.x * ncols + c] = s;
    }
}

// The same with 16-byte loads (ncols % 8 == 0, d aligned): block (32, COLSUM_VY) covers 32
// groups of 8 columns of one chunk of rows; lane y sums rows y, y + COLSUM_VY, ..., then the lanes
// are added in order.
#define COLSUM_VY 8
template <bool F16>
__global__ void __launch_bounds__(32 * COLSUM_VY)
    colsum_vec_kernel(float *part, const uint4 *d, long long rows, int ncols) {
    __shared__ float sh[COLSUM_VY][32 * 8 + 1];
    int groups = ncols / 8, g = blockIdx.y * 32 + threadIdx.x;
    long long r0 = (long long)blockIdx.x * COLSUM_ROWS;
    int nr = (int)min((long long)COLSUM_ROWS, rows - r0);
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (g < groups) {
        for (int r = threadIdx.y; r < nr; r += COLSUM_VY) {
            float x[8];
            dsc_unpack8_16<F16>(d[(r0 + r) * groups + g], x);
#pragma unroll
            for (int k = 0; k < 8; k++)
                s[k] += x[k];
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        sh[threadIdx.y][threadIdx.x * 8 + k] = s[k];
    __syncthreads();
    int t = threadIdx.y * 32 + threadIdx.x, c = blockIdx.y * 256 + t; // one column per thread
    if (t >= 256 || c >= ncols) return;
    float v = 0.0f;
    for (int y = 0; y < COLSUM_VY; y++)
        v += sh[y][t];
    part[(size_t)blockIdx.x * ncols + c] = v;
}

extern "C" dsc_status dsc__cuda_reduce_columns(float *acc, const float *part, int nchunks,
                                               int ncols, bool add, void *stream) {
    DSC_CUDA_ARG(acc && part && nchunks > 0 && ncols > 0, "reduce columns: bad arguments");
    reduce_partials(acc, add, part, nchunks, (size_t)ncols, ncols, as_stream(stream));
    DSC_CUDA_LAUNCHED("reduce_partials_kernel");
    return DSC_OK;
}

extern "C" size_t dsc__cuda_colsum_scratch(int64_t rows, int ncols) {
    return (size_t)((rows + COLSUM_ROWS - 1) / COLSUM_ROWS) * (size_t)ncols;
}

extern "C" dsc_status dsc__cuda_colsum_h(float *acc, float *scratch, const uint16_t *d,
                                         int64_t rows, int ncols, bool add, bool fp16,
                                         void *stream) {
    DSC_CUDA_ARG(rows > 0 && ncols > 0 && acc && scratch && d, "colsum: bad arguments");
    cudaStream_t st = as_stream(stream);
    int nchunks = (int)((rows + COLSUM_ROWS - 1) / COLSUM_ROWS);
    bool vec = ncols % 8 == 0 && dsc__aligned16(d);
    dim3 vgrid(nchunks, (ncols / 8 + 31) / 32), vblock(32, COLSUM_VY);
    if (vec && fp16)
        colsum_vec_kernel<true><<<vgrid, vblock, 0, st>>>(scratch, (const uint4 *)d, rows, ncols);
    else if (vec)
        colsum_vec_kernel<false><<<vgrid, vblock, 0, st>>>(scratch, (const uint4 *)d, rows, ncols);
    else if (fp16)
        colsum_kernel<true><<<nchunks, COLSUM_THREADS, 0, st>>>(scratch, d, rows, ncols);
    else
        colsum_kernel<false><<<nchunks, COLSUM_THREADS, 0, st>>>(scratch, d, rows, ncols);
    DSC_CUDA_LAUNCHED("colsum_kernel");
    reduce_partials(acc, add, scratch, nchunks, (size_t)ncols, ncols, st);
    DSC_CUDA_LAUNCHED("reduce_partials_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_colsum(float *acc, float *scratch, const uint16_t *d, int64_t rows,
                                       int ncols, void *stream) {
    return dsc__cuda_colsum_h(acc, scratch, d, rows, ncols, true, false, stream);
}

// ---- softmax + cross-entropy ----

// Running (max, sum of exp(x - max)) of a stream of values; merge combines two such pairs.
__device__ static inline void online_add(float &m, float &s, float x) {
    if (x > m) {
        s = s * __expf(m - x) + 1.0f;
        m = x;
    } else {
        s += __expf(x - m);
    }
}

__device__ static inline void online_merge(float &m, float &s, float m2, float s2) {
    float M = fmaxf(m, m2);
    if (M == -INFINITY) return; // both empty
    s = (m == -INFINITY ? 0.0f : s * __expf(m - M)) +
        (m2 == -INFINITY ? 0.0f : s2 * __expf(m2 - M));
    m = M;
}

// logsumexp of one row, returned to every thread of the block. Vector loads when ld % 8 == 0.
template <bool F16>
__device__ static float row_lse(const uint16_t *row, int V, bool vec, float *sh) {
    float m = -INFINITY, s = 0.0f;
    int done = 0;
    if (vec) {
        int V8 = V / 8;
        for (int i = threadIdx.x; i < V8; i += blockDim.x) {
            float x[8];
            dsc_unpack8_16<F16>(((const uint4 *)row)[i], x);
#pragma unroll
            for (int k = 0; k < 8; k++)
                online_add(m, s, x[k]);
        }
        done = V8 * 8;
    }
    for (int j = done + threadIdx.x; j < V; j += blockDim.x)
        online_add(m, s, dsc_16_f32<F16>(row[j]));
    for (int o = DSC_WARP_SIZE / 2; o > 0; o >>= 1) {
        float m2 = dsc_shfl_xor(m, o), s2 = dsc_shfl_xor(s, o);
        online_merge(m, s, m2, s2);
    }
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = blockDim.x / DSC_WARP_SIZE;
    __syncthreads();
    if (lane == 0) {
        sh[warp] = m;
        sh[DSC_MAX_WARPS + warp] = s;
    }
    __syncthreads();
    float M = -INFINITY, S = 0.0f;
    for (int w2 = 0; w2 < nwarps; w2++)
        online_merge(M, S, sh[w2], sh[DSC_MAX_WARPS + w2]);
    return M + logf(S);
}

// d[j] = g (exp(x_j - lse) - [j == target]) over the row, pads [V, ld) zeroed.
template <bool F16>
__device__ static void row_grad(uint16_t *drow, const uint16_t *row, float lse, int target, float g,
                                int V, int ld, bool vec) {
    int done = 0;
    if (vec) {
        int V8 = V / 8;
        for (int i = threadIdx.x; i < V8; i += blockDim.x) {
            float x[8];
            dsc_unpack8_16<F16>(((const uint4 *)row)[i], x);
#pragma unroll
            for (int k = 0; k < 8; k++)
                x[k] = g * (__expf(x[k] - lse) - (i * 8 + k == target ? 1.0f : 0.0f));
            ((uint4 *)drow)[i] = dsc_pack8_16<F16>(x);
        }
        done = V8 * 8;
    }
    for (int j = done + threadIdx.x; j < ld; j += blockDim.x) {
        float d = 0.0f;
        if (j < V) d = g * (__expf(dsc_16_f32<F16>(row[j]) - lse) - (j == target ? 1.0f : 0.0f));
        drow[j] = dsc_f32_16<F16>(d);
    }
}

// MODE 0: forward (losses, lse); 1: backward (dlogits from lse); 2: both, in place.
template <int MODE, bool F16>
__global__ void xent_kernel(float *losses, float *lse_out, uint16_t *dlogits,
                            const uint16_t *logits, const float *lse_in, const int32_t *targets,
                            float g, int V, int ld, bool vec) {
    __shared__ float sh[2 * DSC_MAX_WARPS];
    size_t r = blockIdx.x;
    const uint16_t *row = logits + r * ld;
    int target = targets[r];
    if (target < 0) { // ignored (a masked target): no loss and a zero gradient row
        if (MODE != 1 && threadIdx.x == 0) {
            losses[r] = 0.0f;
            if (lse_out) lse_out[r] = 0.0f;
        }
        for (int j = threadIdx.x; MODE != 0 && j < ld; j += blockDim.x)
            dlogits[r * ld + j] = dsc_f32_16<F16>(0.0f);
        return; // the whole block takes this branch: no barrier is skipped by some threads only
    }
    float lse;
    if (MODE == 1) {
        lse = lse_in[r];
    } else {
        lse = row_lse<F16>(row, V, vec, sh);
        if (threadIdx.x == 0) {
            losses[r] = lse - dsc_16_f32<F16>(row[target]);
            if (lse_out) lse_out[r] = lse;
        }
        __syncthreads(); // row[target] is read before MODE 2 overwrites the row
    }
    if (MODE != 0) row_grad<F16>(dlogits + r * ld, row, lse, target, g, V, ld, vec);
}

static dsc_status xent_check(const char *what, int64_t N, int V, int ld, const void *tg) {
    DSC_CUDA_ARG(N > 0 && N < (1ll << 31) && V > 0 && ld >= V && tg,
                 "%s: bad shape (N %lld, V %d, ld %d) or NULL targets", what, (long long)N, V, ld);
    return DSC_OK;
}

// One block per row; MODE as xent_kernel's.
template <int MODE>
static dsc_status xent_launch(float *losses, float *lse_out, uint16_t *dlogits,
                              const uint16_t *logits, const float *lse_in, const int32_t *targets,
                              float g, int64_t N, int V, int ld, bool vec, bool fp16,
                              void *stream) {
    cudaStream_t st = as_stream(stream);
    if (fp16)
        xent_kernel<MODE, true><<<(unsigned)N, XENT_THREADS, 0, st>>>(
            losses, lse_out, dlogits, logits, lse_in, targets, g, V, ld, vec);
    else
        xent_kernel<MODE, false><<<(unsigned)N, XENT_THREADS, 0, st>>>(
            losses, lse_out, dlogits, logits, lse_in, targets, g, V, ld, vec);
    const char *name = MODE == 0   ? "launch of xent_kernel<forward>"
                       : MODE == 1 ? "launch of xent_kernel<backward>"
                                   : "launch of xent_kernel<fused>";
    DSC_CUDA_CHECK_AS(cudaGetLastError(), name);
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_xent_forward_h(float *losses, float *lse, const uint16_t *logits,
                                               const int32_t *targets, int64_t N, int V, int ld,
                                               bool fp16, void *stream) {
    DSC_TRY(xent_check("xent forward", N, V, ld, targets));
    bool vec = ld % 8 == 0 && dsc__aligned16(logits);
    return xent_launch<0>(losses, lse, NULL, logits, NULL, targets, 0.0f, N, V, ld, vec, fp16,
                          stream);
}

extern "C" dsc_status dsc__cuda_xent_forward(float *losses, float *lse, const uint16_t *logits,
                                             const int32_t *targets, int64_t N, int V, int ld,
                                             void *stream) {
    return dsc__cuda_xent_forward_h(losses, lse, logits, targets, N, V, ld, false, stream);
}

extern "C" dsc_status dsc__cuda_xent_backward_h(uint16_t *dlogits, const uint16_t *logits,
                                                const float *lse, const int32_t *targets, float g,
                                                int64_t N, int V, int ld, bool fp16, void *stream) {
    DSC_TRY(xent_check("xent backward", N, V, ld, targets));
    bool vec = ld % 8 == 0 && dsc__aligned16(logits) && dsc__aligned16(dlogits);
    return xent_launch<1>(NULL, NULL, dlogits, logits, lse, targets, g, N, V, ld, vec, fp16,
                          stream);
}

extern "C" dsc_status dsc__cuda_xent_backward(uint16_t *dlogits, const uint16_t *logits,
                                              const float *lse, const int32_t *targets, float g,
                                              int64_t N, int V, int ld, void *stream) {
    return dsc__cuda_xent_backward_h(dlogits, logits, lse, targets, g, N, V, ld, false, stream);
}

extern "C" dsc_status dsc__cuda_xent_fused_h(float *losses, uint16_t *logits,
                                             const int32_t *targets, float g, int64_t N, int V,
                                             int ld, bool fp16, void *stream) {
    DSC_TRY(xent_check("xent fused", N, V, ld, targets));
    bool vec = ld % 8 == 0 && dsc__aligned16(logits);
    return xent_launch<2>(losses, NULL, logits, logits, NULL, targets, g, N, V, ld, vec, fp16,
                          stream);
}

extern "C" dsc_status dsc__cuda_xent_fused(float *losses, uint16_t *logits, const int32_t *targets,
                                           float g, int64_t N, int V, int ld, void *stream) {
    return dsc__cuda_xent_fused_h(losses, logits, targets, g, N, V, ld, false, stream);
}

// ---- sums ----

__global__ void add_f32_kernel(float *acc, const float *x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) acc[i] += x[i];
}

extern "C" dsc_status dsc__cuda_add_f32(float *acc, const float *x, int64_t n, void *stream) {
    DSC_CUDA_ARG(n >= 0 && (n == 0 || (acc && x)), "add f32: bad arguments");
    if (n == 0) return DSC_OK;
    add_f32_kernel<<<dsc__blocks(n, 256), 256, 0, as_stream(stream)>>>(acc, x, n);
    DSC_CUDA_LAUNCHED("add_f32_kernel");
    return DSC_OK;
}

__global__ void add_f32_clear_kernel(float *acc, float *x, long long n, bool add) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    acc[i] = add ? acc[i] + x[i] : x[i];
    x[i] = 0.0f;
}

extern "C" dsc_status dsc__cuda_add_f32_clear(float *acc, float *x, int64_t n, bool add,
                                              void *stream) {
    DSC_CUDA_ARG(n >= 0 && (n == 0 || (acc && x)), "add f32: bad arguments");
    if (n == 0) return DSC_OK;
    add_f32_clear_kernel<<<dsc__blocks(n, ELEM_THREADS), ELEM_THREADS, 0, as_stream(stream)>>>(
        acc, x, n, add);
    DSC_CUDA_LAUNCHED("add_f32_clear_kernel");
    return DSC_OK;
}

// One block: thread t adds x[t], x[t + blockDim], ... in order, then a fixed tree.
__global__ void sum_kernel(float *out, const float *x, long long n, float scale) {
    __shared__ float sh[DSC_MAX_WARPS];
    float s = 0.0f;
    for (long long i = threadIdx.x; i < n; i += blockDim.x)
        s += x[i];
    s = dsc_block_sum(s, sh);
    if (threadIdx.x == 0) out[0] = s * scale;
}

extern "C" dsc_status dsc__cuda_sum(float *out, const float *x, int64_t n, float scale,
                                    void *stream) {
    DSC_CUDA_ARG(n > 0 && out && x, "sum: bad arguments");
    sum_kernel<<<1, SUM_THREADS, 0, as_stream(stream)>>>(out, x, n, scale);
    DSC_CUDA_LAUNCHED("sum_kernel");
    return DSC_OK;
}
