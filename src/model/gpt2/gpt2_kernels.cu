// model/gpt2/gpt2_kernels.cu - GPU kernels of the GPT-2 layers (see gpt2_kernels.h for the
// contracts).
#include "model/gpt2/gpt2_kernels.h"

#include "cuda/common.cuh" // DSC_CUDA_TRY, dsc_unpack8, dsc_block_sum, ...
#include "cuda/kernels.h"  // dsc__cuda_embed_backward_h, dsc__cuda_reduce_columns_split

// Threads per block of each family; all multiples of 64 so that AMD wavefronts divide them.
#define ELEM_THREADS 256    // elementwise passes
#define LN_THREADS 256      // layernorm forward: one warp per row
#define LNB_ROWS 32         // rows per partial sum of the layernorm parameter gradients
#define LNB_REG_THREADS 128 // layernorm backward, rows held in registers

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

extern "C" dsc_status dsc__cuda_residual_forward_h(uint16_t *out, const uint16_t *a,
                                                   const uint16_t *b, int64_t n, bool fp16,
                                                   void *stream) {
    DSC_CUDA_ARG(b != NULL, "residual forward: b is NULL");
    const char *name = "residual forward";
    return fp16 ? elem_launch<OP_ADD, true>(out, a, b, n, stream, name)
                : elem_launch<OP_ADD, false>(out, a, b, n, stream, name);
}

// ---- token and position embeddings ----

// One thread per 8 channels of one position; the position's id is pos[bt], or bt % T (pos NULL).
template <bool F16>
__global__ void encoder_fwd_kernel(uint4 *out, const int32_t *inp, const int32_t *pos,
                                   const uint4 *wte, const uint4 *wpe, int BT, int T, int C8) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)BT * C8) return;
    int bt = (int)(i / C8), c8 = (int)(i % C8);
    float e[8], p[8];
    dsc_unpack8_16<F16>(wte[(size_t)inp[bt] * C8 + c8], e);
    dsc_unpack8_16<F16>(wpe[(size_t)(pos ? pos[bt] : bt % T) * C8 + c8], p);
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
static dsc_status encoder_forward(uint16_t *out, const int32_t *inp, const int32_t *pos,
                                  const uint16_t *wte, const uint16_t *wpe, int B, int T, int C,
                                  void *stream) {
    DSC_TRY(check_rows("encoder forward", C, out, wte, wpe));
    DSC_CUDA_ARG(B > 0 && T > 0 && inp, "encoder forward: bad batch %d x %d", B, T);
    long long n = (long long)B * T * (C / 8);
    encoder_fwd_kernel<F16><<<dsc__blocks(n, ELEM_THREADS), ELEM_THREADS, 0, as_stream(stream)>>>(
        (uint4 *)out, inp, pos, (const uint4 *)wte, (const uint4 *)wpe, B * T, T, C / 8);
    DSC_CUDA_LAUNCHED("encoder_fwd_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_encoder_forward_h(uint16_t *out, const int32_t *inp,
                                                  const int32_t *pos, const uint16_t *wte,
                                                  const uint16_t *wpe, int B, int T, int C,
                                                  bool fp16, void *stream) {
    return fp16 ? encoder_forward<true>(out, inp, pos, wte, wpe, B, T, C, stream)
                : encoder_forward<false>(out, inp, pos, wte, wpe, B, T, C, stream);
}

extern "C" dsc_status dsc__cuda_encoder_forward(uint16_t *out, const int32_t *inp,
                                                const uint16_t *wte, const uint16_t *wpe, int B,
                                                int T, int C, void *stream) {
    return dsc__cuda_encoder_forward_h(out, inp, NULL, wte, wpe, B, T, C, false, stream);
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

extern "C" dsc_status dsc__cuda_encoder_backward_h(float *dwte, float *dwpe, void *scratch,
                                                   const uint16_t *dout, const int32_t *inp,
                                                   const int32_t *pos, int npos, int B, int T,
                                                   int C, int V, bool wpe_add, bool fp16,
                                                   void *stream) {
    DSC_TRY(check_rows("encoder backward", C, dwte, dwpe, dout));
    DSC_CUDA_ARG(B > 0 && T > 0 && V > 0 && inp && scratch, "encoder backward: bad arguments");
    // dwte: the embedding backward every family shares (cuda/kernels.h), added to.
    DSC_TRY(dsc__cuda_embed_backward_h(dwte, scratch, dout, inp, (int64_t)B * T, C, V, true, fp16,
                                       stream));
    cudaStream_t st = as_stream(stream);
    if (pos) { // dwpe scattered by position id as dwte by token (its rows [0, npos) zeroed first
               // when not added to: an id present last time may be absent now)
        DSC_CUDA_ARG(npos > 0, "encoder backward: position ids need the table's rows (npos %d)",
                     npos);
        if (!wpe_add) DSC_CUDA_TRY(cudaMemsetAsync(dwpe, 0, (size_t)npos * C * sizeof(float), st));
        return dsc__cuda_embed_backward_h(dwpe, scratch, dout, pos, (int64_t)B * T, C, npos, true,
                                          fp16, stream);
    }
    int C8 = C / 8;
    unsigned wpe_blocks = dsc__blocks((long long)T * C8, ELEM_THREADS);
    const uint4 *d = (const uint4 *)dout;
    if (fp16)
        enc_wpe_grad_kernel<true><<<wpe_blocks, ELEM_THREADS, 0, st>>>(dwpe, d, B, T, C8, wpe_add);
    else
        enc_wpe_grad_kernel<false><<<wpe_blocks, ELEM_THREADS, 0, st>>>(dwpe, d, B, T, C8, wpe_add);
    DSC_CUDA_LAUNCHED("enc_wpe_grad_kernel");
    return DSC_OK;
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
    float *dests[3] = {dw, db, dsum};
    return dsc__cuda_reduce_columns_split(dests, nparts, C, scratch, nchunks, add, stream);
}

extern "C" dsc_status dsc__cuda_layernorm_backward(uint16_t *dinp, float *dw, float *db,
                                                   float *scratch, const uint16_t *dout,
                                                   const uint16_t *inp, const uint16_t *w,
                                                   const float *mean, const float *rstd, int64_t N,
                                                   int C, void *stream) {
    return dsc__cuda_layernorm_backward_h(dinp, dw, db, scratch, dout, inp, w, mean, rstd, NULL,
                                          true, N, C, false, stream);
}
