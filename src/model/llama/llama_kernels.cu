// model/llama/llama_kernels.cu - GPU kernels of the Llama-family layers (see llama_kernels.h for
// the contracts).
#include "model/llama/llama_kernels.h"

#include "cuda/common.cuh" // DSC_CUDA_TRY, dsc_unpack8_16, dsc_pack8_16, dsc_warp_sum, ...
#include "cuda/kernels.h"  // dsc__cuda_reduce_columns, ...

// Threads per block of each family; all multiples of 64 so that AMD wavefronts divide them.
#define ELEM_THREADS 256 // elementwise passes: RoPE, SwiGLU (eight values a thread)
#define RMS_THREADS 256  // RMSNorm forward: one warp per row
#define RMS_REG_MAX 8    // rows of up to 8 chunks of 8 channels a lane live in registers
#define RMSB_THREADS 128 // RMSNorm backward: one warp per row (two for widths over 2048)
#ifndef RMSB_ROWS
#define RMSB_ROWS 32 // rows per partial sum of the RMSNorm weight gradient, widths up to 2048
#endif
#ifndef RMSP_ROWS
#define RMSP_ROWS 8 // the same for the two-warp kernel (widths 2056..4096): more blocks, as its
                    // rows are wider
#endif
#define RMSP_NCH 8 // chunks of 8 channels a lane of the two-warp kernel holds: C <= 2 x 8 x 8 x 32
#define QKN_ROWS 32      // rows per partial sum of the q/k norm weight gradients

static cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }

// 16-byte alignment of every tensor a call moves as vectors (NULL counts as aligned).
static dsc_status check_aligned(const char *what, const void *a, const void *b, const void *c) {
    DSC_CUDA_ARG(dsc__aligned16(a) && dsc__aligned16(b) && dsc__aligned16(c),
                 "%s: tensors must be 16-byte aligned (whole rows of cudaMalloc'd buffers)", what);
    return DSC_OK;
}

static dsc_status check_width(const char *what, const char *name, int n, int64_t N) {
    DSC_CUDA_ARG(n > 0 && n % 8 == 0, "%s: %s = %d must be a positive multiple of 8", what, name,
                 n);
    DSC_CUDA_ARG(N > 0, "%s: N = %lld rows; it must be positive", what, (long long)N);
    return DSC_OK;
}

// ---- RMSNorm ----

// Eight channels of a row: s += x^2.
template <bool F16> __device__ static inline void rms_sq8(float &s, uint4 xq) {
    float v[8];
    dsc_unpack8_16<F16>(xq, v);
#pragma unroll
    for (int k = 0; k < 8; k++)
        s += v[k] * v[k];
}

// Eight channels of the result, in Hugging Face's order: w (x rstd).
template <bool F16> __device__ static inline uint4 rms_norm8(uint4 xq, uint4 wq, float r) {
    float v[8], wv[8];
    dsc_unpack8_16<F16>(xq, v);
    dsc_unpack8_16<F16>(wq, wv);
#pragma unroll
    for (int k = 0; k < 8; k++)
        v[k] = wv[k] * (v[k] * r);
    return dsc_pack8_16<F16>(v);
}

// One warp per row. NCH > 0: the row in registers (at most NCH chunks of 8 channels a lane), all
// of a lane's loads in flight at once; NCH 0: any C, the row read twice. Both add a lane's
// squares in the same order (zeros past the row add nothing), so they give the same bits.
template <bool F16, int NCH>
__global__ void __launch_bounds__(RMS_THREADS)
    rms_fwd_kernel(uint16_t *out, float *rstd, const uint16_t *x, const uint16_t *w, float eps,
                   long long N, int C) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    long long row =
        (long long)blockIdx.x * (blockDim.x / DSC_WARP_SIZE) + threadIdx.x / DSC_WARP_SIZE;
    if (row >= N) return; // whole warps leave together
    int C8 = C / 8;
    const uint4 *xr = (const uint4 *)(x + row * C), *w4 = (const uint4 *)w;
    uint4 *o = (uint4 *)(out + row * C);
    float s = 0.0f, r;
    if (NCH > 0) {
        uint4 xq[NCH > 0 ? NCH : 1];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = lane + j * DSC_WARP_SIZE;
            xq[j] = i < C8 ? xr[i] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < NCH; j++)
            rms_sq8<F16>(s, xq[j]);
        r = 1.0f / sqrtf(dsc_warp_sum(s) / (float)C + eps);
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = lane + j * DSC_WARP_SIZE;
            if (i < C8) o[i] = rms_norm8<F16>(xq[j], w4[i], r);
        }
    } else {
        for (int i = lane; i < C8; i += DSC_WARP_SIZE)
            rms_sq8<F16>(s, xr[i]);
        r = 1.0f / sqrtf(dsc_warp_sum(s) / (float)C + eps);
        for (int i = lane; i < C8; i += DSC_WARP_SIZE)
            o[i] = rms_norm8<F16>(xr[i], w4[i], r);
    }
    if (lane == 0) rstd[row] = r;
}

typedef void (*rms_fwd_fn)(uint16_t *, float *, const uint16_t *, const uint16_t *, float,
                           long long, int);

// The kernel for a 16-bit type and nch chunks of 8 channels a lane (0: beyond the registers).
template <bool F16> static rms_fwd_fn rms_fwd_pick(int nch) {
    static const rms_fwd_fn reg[RMS_REG_MAX] = {
        rms_fwd_kernel<F16, 1>, rms_fwd_kernel<F16, 2>, rms_fwd_kernel<F16, 3>,
        rms_fwd_kernel<F16, 4>, rms_fwd_kernel<F16, 5>, rms_fwd_kernel<F16, 6>,
        rms_fwd_kernel<F16, 7>, rms_fwd_kernel<F16, 8>};
    return nch >= 1 && nch <= RMS_REG_MAX ? reg[nch - 1] : rms_fwd_kernel<F16, 0>;
}

extern "C" dsc_status dsc__cuda_rmsnorm_forward_h(uint16_t *out, float *rstd, const uint16_t *x,
                                                  const uint16_t *w, float eps, int64_t N, int C,
                                                  bool fp16, void *stream) {
    DSC_TRY(check_width("rmsnorm forward", "C", C, N));
    DSC_TRY(check_aligned("rmsnorm forward", out, x, w));
    DSC_CUDA_ARG(out && rstd && x && w, "rmsnorm forward: NULL tensor");
    int ws = dsc__host_warp_size(), nch = (C / 8 + ws - 1) / ws;
    rms_fwd_fn k = fp16 ? rms_fwd_pick<true>(nch) : rms_fwd_pick<false>(nch);
    k<<<dsc__blocks(N, RMS_THREADS / ws), RMS_THREADS, 0, as_stream(stream)>>>(out, rstd, x, w, eps,
                                                                               N, C);
    DSC_CUDA_LAUNCHED("rms_fwd_kernel");
    return DSC_OK;
}

// Eight channels of a row: s += dy w (x rstd), the CPU kernel's order.
template <bool F16>
__device__ static inline void rms_bwd_dot8(float &s, uint4 dyq, uint4 xq, uint4 wq, float r) {
    float a[8], xv[8], wv[8];
    dsc_unpack8_16<F16>(dyq, a);
    dsc_unpack8_16<F16>(xq, xv);
    dsc_unpack8_16<F16>(wq, wv);
#pragma unroll
    for (int k = 0; k < 8; k++)
        s += a[k] * wv[k] * (xv[k] * r);
}

// Eight channels once s is the row's mean of g xh: dx + rstd (dy w - xh s) as the result (one
// rounding), and dy xh added into pw[0..7], the lane's partial weight gradient.
template <bool F16>
__device__ static inline uint4 rms_bwd_dx8(uint4 dyq, uint4 xq, uint4 wq, uint4 dxq, float r,
                                           float s, float *pw) {
    float a[8], xv[8], wv[8], d[8];
    dsc_unpack8_16<F16>(dyq, a);
    dsc_unpack8_16<F16>(xq, xv);
    dsc_unpack8_16<F16>(wq, wv);
    dsc_unpack8_16<F16>(dxq, d);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float xh = xv[k] * r;
        d[k] += r * (a[k] * wv[k] - xh * s);
        pw[k] += a[k] * xh;
    }
    return dsc_pack8_16<F16>(d);
}

// A lane's partial weight gradients (NCH chunks of 8 channels), in registers, zeroed.
template <int NCH> __device__ static inline void rms_zero_partials(float (&pw)[NCH][8]) {
#pragma unroll
    for (int j = 0; j < NCH; j++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            pw[j][k] = 0.0f;
}

// One block per chunk of RMSB_ROWS rows, a warp per row, the row (dy, x, dx) in registers (at
// most NCH chunks of 8 channels a lane) and each lane's partial weight gradient of its channels
// in registers across the warp's rows. At the end the warps add their partials into shared
// memory one after the other (warp order: deterministic) and the block writes its chunk's row
// of part (nchunks, C).
template <bool F16, int NCH>
__global__ void __launch_bounds__(RMSB_THREADS)
    rms_bwd_reg_kernel(uint16_t *dx, float *part, const uint16_t *dout, const uint16_t *x,
                       const uint16_t *w, const float *rstd, long long N, int C) {
    extern __shared__ float4 rms_sh4[]; // C floats
    float *sh = (float *)rms_sh4;
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = blockDim.x / DSC_WARP_SIZE, C8 = C / 8;
    const uint4 *w4 = (const uint4 *)w;
    long long r0 = (long long)blockIdx.x * RMSB_ROWS;
    int nr = (int)min((long long)RMSB_ROWS, N - r0);
    float pw[NCH][8];
    rms_zero_partials<NCH>(pw);
    for (int r = warp; r < nr; r += nwarps) {
        size_t off = (size_t)(r0 + r) * C8;
        const uint4 *dy = (const uint4 *)dout + off, *xr = (const uint4 *)x + off;
        uint4 *dxr = (uint4 *)dx + off;
        uint4 dyq[NCH], xq[NCH], dxq[NCH];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = lane + j * DSC_WARP_SIZE;
            bool in = i < C8;
            dyq[j] = in ? dy[i] : make_uint4(0, 0, 0, 0);
            xq[j] = in ? xr[i] : make_uint4(0, 0, 0, 0);
            dxq[j] = in ? dxr[i] : make_uint4(0, 0, 0, 0);
        }
        float rs = rstd[r0 + r], s = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = lane + j * DSC_WARP_SIZE;
            if (i < C8) rms_bwd_dot8<F16>(s, dyq[j], xq[j], w4[i], rs);
        }
        s = dsc_warp_sum(s) / (float)C;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = lane + j * DSC_WARP_SIZE;
            if (i < C8) dxr[i] = rms_bwd_dx8<F16>(dyq[j], xq[j], w4[i], dxq[j], rs, s, pw[j]);
        }
    }
    for (int k = 0; k < nwarps; k++) {
        if (warp == k) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                int i = lane + j * DSC_WARP_SIZE;
                if (i >= C8) continue;
#pragma unroll
                for (int q = 0; q < 8; q++)
                    sh[i * 8 + q] = k ? sh[i * 8 + q] + pw[j][q] : pw[j][q];
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        part[(size_t)blockIdx.x * C + c] = sh[c];
}

// Widths of 2056..4096 channels (more than one warp's registers hold): a pair of warps per row,
// warp h of the pair holding chunks i = (2 j + h) x warp size + lane (j < NCH) of dy, x and dx in
// registers and its lanes' partial weight gradients across the pair's rows. The row's dot product
// is the two warps' sums added through shared memory (one barrier a row; every pair takes the
// same number of turns so that the barrier is reached by all, double-buffered so that a warp a
// row ahead cannot overwrite a sum still being read). At the end the warps add their partials
// into the block's C floats in warp order (deterministic); a chunk has RMSP_ROWS rows.
template <bool F16, int NCH>
__global__ void __launch_bounds__(RMSB_THREADS)
    rms_bwd_pair_kernel(uint16_t *dx, float *part, const uint16_t *dout, const uint16_t *x,
                        const uint16_t *w, const float *rstd, long long N, int C) {
    extern __shared__ float4 rms_sh4[]; // C floats, then 2 x nwarps row sums
    float *sh = (float *)rms_sh4, *red = sh + C;
    int ws = DSC_WARP_SIZE, lane = threadIdx.x % ws, warp = threadIdx.x / ws;
    int nwarps = blockDim.x / ws, npairs = nwarps / 2, pair = warp / 2, h = warp % 2;
    int C8 = C / 8;
    const uint4 *w4 = (const uint4 *)w;
    long long r0 = (long long)blockIdx.x * RMSP_ROWS;
    int nr = (int)min((long long)RMSP_ROWS, N - r0), turns = (nr + npairs - 1) / npairs;
    float pw[NCH][8];
    rms_zero_partials<NCH>(pw);
    for (int t = 0; t < turns; t++) {
        int r = pair + t * npairs;
        bool live = r < nr;
        size_t off = (size_t)(r0 + (live ? r : 0)) * C8;
        const uint4 *dy = (const uint4 *)dout + off, *xr = (const uint4 *)x + off;
        uint4 *dxr = (uint4 *)dx + off;
        uint4 dyq[NCH], xq[NCH], dxq[NCH];
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = (2 * j + h) * ws + lane;
            bool in = live && i < C8;
            dyq[j] = in ? dy[i] : make_uint4(0, 0, 0, 0);
            xq[j] = in ? xr[i] : make_uint4(0, 0, 0, 0);
            dxq[j] = in ? dxr[i] : make_uint4(0, 0, 0, 0);
        }
        float rs = live ? rstd[r0 + r] : 0.0f, s = 0.0f;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = (2 * j + h) * ws + lane;
            if (live && i < C8) rms_bwd_dot8<F16>(s, dyq[j], xq[j], w4[i], rs);
        }
        s = dsc_warp_sum(s);
        float *rb = red + (t % 2) * nwarps;
        if (lane == 0) rb[warp] = s;
        __syncthreads();
        s = (rb[2 * pair] + rb[2 * pair + 1]) / (float)C;
        if (!live) continue;
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            int i = (2 * j + h) * ws + lane;
            if (i < C8) dxr[i] = rms_bwd_dx8<F16>(dyq[j], xq[j], w4[i], dxq[j], rs, s, pw[j]);
        }
    }
    __syncthreads();
    for (int k = 0; k < nwarps; k++) {
        if (warp == k) {
#pragma unroll
            for (int j = 0; j < NCH; j++) {
                int i = (2 * j + h) * ws + lane;
                if (i >= C8) continue;
#pragma unroll
                for (int q = 0; q < 8; q++)
                    sh[i * 8 + q] = k >= 2 ? sh[i * 8 + q] + pw[j][q] : pw[j][q];
            }
        }
        __syncthreads();
    }
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        part[(size_t)blockIdx.x * C + c] = sh[c];
}

// The same for any C: the row read twice from memory, each warp's partial weight gradient in its
// own slice of shared memory (nwarps C floats; a channel is one lane's, so no atomics), the
// slices summed in warp order at the end.
template <bool F16>
__global__ void __launch_bounds__(RMSB_THREADS)
    rms_bwd_kernel(uint16_t *dx, float *part, const uint16_t *dout, const uint16_t *x,
                   const uint16_t *w, const float *rstd, long long N, int C) {
    extern __shared__ float4 rms_sh4[]; // (nwarps, C) floats
    float *sh = (float *)rms_sh4;
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = blockDim.x / DSC_WARP_SIZE, C8 = C / 8;
    float *pw = sh + (size_t)warp * C;
    const uint4 *w4 = (const uint4 *)w;
    long long r0 = (long long)blockIdx.x * RMSB_ROWS;
    int nr = (int)min((long long)RMSB_ROWS, N - r0);
    for (int c = threadIdx.x; c < nwarps * C; c += blockDim.x)
        sh[c] = 0.0f;
    __syncthreads();
    for (int r = warp; r < nr; r += nwarps) {
        size_t off = (size_t)(r0 + r) * C8;
        const uint4 *dy = (const uint4 *)dout + off, *xr = (const uint4 *)x + off;
        uint4 *dxr = (uint4 *)dx + off;
        float rs = rstd[r0 + r], s = 0.0f;
        for (int i = lane; i < C8; i += DSC_WARP_SIZE)
            rms_bwd_dot8<F16>(s, dy[i], xr[i], w4[i], rs);
        s = dsc_warp_sum(s) / (float)C;
        for (int i = lane; i < C8; i += DSC_WARP_SIZE)
            dxr[i] = rms_bwd_dx8<F16>(dy[i], xr[i], w4[i], dxr[i], rs, s, pw + i * 8);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float v = 0.0f;
        for (int k = 0; k < nwarps; k++)
            v += sh[(size_t)k * C + c];
        part[(size_t)blockIdx.x * C + c] = v;
    }
}

// Which backward kernel a width takes: one warp a row with the row in registers (nch chunks of 8
// channels a lane up to RMS_REG_MAX), two warps a row (up to 2 RMSP_NCH), or the shared-memory one.
enum { RMSB_REG, RMSB_PAIR, RMSB_SHARED };
static int rms_bwd_kind(int nch) {
    return nch <= RMS_REG_MAX ? RMSB_REG : nch <= 2 * RMSP_NCH ? RMSB_PAIR : RMSB_SHARED;
}

static int rms_bwd_rows(int C) {
    int ws = dsc__host_warp_size(), nch = (C / 8 + ws - 1) / ws;
    return rms_bwd_kind(nch) == RMSB_PAIR ? RMSP_ROWS : RMSB_ROWS;
}

extern "C" size_t dsc__cuda_rmsnorm_backward_scratch(int64_t N, int C) {
    int rows = rms_bwd_rows(C);
    return (size_t)((N + rows - 1) / rows) * (size_t)C;
}

typedef void (*rms_bwd_fn)(uint16_t *, float *, const uint16_t *, const uint16_t *,
                           const uint16_t *, const float *, long long, int);

template <bool F16> static rms_bwd_fn rms_bwd_pick(int nch) {
    static const rms_bwd_fn reg[RMS_REG_MAX] = {
        rms_bwd_reg_kernel<F16, 1>, rms_bwd_reg_kernel<F16, 2>, rms_bwd_reg_kernel<F16, 3>,
        rms_bwd_reg_kernel<F16, 4>, rms_bwd_reg_kernel<F16, 5>, rms_bwd_reg_kernel<F16, 6>,
        rms_bwd_reg_kernel<F16, 7>, rms_bwd_reg_kernel<F16, 8>};
    static const rms_bwd_fn pair[RMSP_NCH - RMS_REG_MAX / 2] = {
        rms_bwd_pair_kernel<F16, 5>, rms_bwd_pair_kernel<F16, 6>, rms_bwd_pair_kernel<F16, 7>,
        rms_bwd_pair_kernel<F16, 8>};
    switch (rms_bwd_kind(nch)) {
    case RMSB_REG: return reg[nch - 1];
    case RMSB_PAIR: return pair[(nch + 1) / 2 - RMS_REG_MAX / 2 - 1];
    default: return rms_bwd_kernel<F16>;
    }
}

// Threads and shared memory of a backward block: the register kernel takes C floats; the other
// one C floats a warp, as many warps (up to RMSB_THREADS / ws) as the device's opt-in limit holds.
static dsc_status rms_bwd_shape(int C, int nch, int *threads, size_t *smem) {
    int ws = dsc__host_warp_size(), warps = RMSB_THREADS / ws;
    if (rms_bwd_kind(nch) != RMSB_SHARED) {
        *threads = RMSB_THREADS;
        *smem = ((size_t)C + 2 * (size_t)warps) * sizeof(float);
        return DSC_OK;
    }
    int dev = 0, optin = 0;
    DSC_CUDA_TRY(cudaGetDevice(&dev));
    DSC_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    while (warps > 0 && (size_t)warps * C * sizeof(float) > (size_t)optin)
        warps--;
    DSC_CUDA_ARG(warps > 0,
                 "rmsnorm backward: C = %d needs %zu bytes of shared memory a block, more than "
                 "this device's %d",
                 C, (size_t)C * sizeof(float), optin);
    *threads = warps * ws;
    *smem = (size_t)warps * C * sizeof(float);
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_rmsnorm_backward_h(uint16_t *dx, float *dw, float *scratch,
                                                   const uint16_t *dout, const uint16_t *x,
                                                   const uint16_t *w, const float *rstd, bool add,
                                                   int64_t N, int C, bool fp16, void *stream) {
    DSC_TRY(check_width("rmsnorm backward", "C", C, N));
    DSC_TRY(check_aligned("rmsnorm backward", dx, dout, x));
    DSC_TRY(check_aligned("rmsnorm backward", w, NULL, NULL));
    DSC_CUDA_ARG(dx && dw && scratch && dout && x && w && rstd, "rmsnorm backward: NULL tensor");
    cudaStream_t st = as_stream(stream);
    int ws = dsc__host_warp_size(), nch = (C / 8 + ws - 1) / ws, threads = 0;
    int rows = rms_bwd_rows(C), nchunks = (int)((N + rows - 1) / rows);
    size_t smem = 0;
    DSC_TRY(rms_bwd_shape(C, nch, &threads, &smem));
    rms_bwd_fn k = fp16 ? rms_bwd_pick<true>(nch) : rms_bwd_pick<false>(nch);
    if (smem > 48 * 1024)
        DSC_CUDA_CHECK_AS(
            cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
            "rmsnorm backward: shared memory limit");
    k<<<nchunks, threads, smem, st>>>(dx, scratch, dout, x, w, rstd, N, C);
    DSC_CUDA_LAUNCHED("rms_bwd_kernel");
    // dw (C) += (add) or = the chunks' partial sums, in chunk order: the shared column reduction
    return dsc__cuda_reduce_columns(dw, scratch, nchunks, C, add, stream);
}

// ---- rotary position embeddings ----

// One thread per 8 pairs (i, i + HS/2) of one head of one row: 16 bytes from each half of the
// head, 32 from each table. sign -1 rotates back.
template <bool F16>
__global__ void rope_kernel(uint16_t *x, int ld, const float *cos_t, const float *sin_t,
                            const int32_t *pos, long long rows, int T, int nheads, int H8,
                            float sign) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long per_row = (long long)nheads * H8;
    if (idx >= rows * per_row) return;
    long long bt = idx / per_row;
    int rem = (int)(idx % per_row), h = rem / H8, i8 = rem % H8, half = H8 * 8;
    long long t = pos ? (long long)pos[bt] : bt % T;
    uint16_t *head = x + (size_t)bt * ld + (size_t)h * 2 * half;
    uint4 *p1 = (uint4 *)head + i8, *p2 = (uint4 *)(head + half) + i8;
    const float4 *c4 = (const float4 *)(cos_t + (size_t)t * half) + 2 * i8;
    const float4 *s4 = (const float4 *)(sin_t + (size_t)t * half) + 2 * i8;
    float4 c0 = c4[0], c1 = c4[1], s0 = s4[0], s1 = s4[1];
    const float c[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const float s[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    float a[8], b[8];
    dsc_unpack8_16<F16>(*p1, a);
    dsc_unpack8_16<F16>(*p2, b);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float x1 = a[k], x2 = b[k], sk = sign * s[k];
        a[k] = x1 * c[k] - x2 * sk;
        b[k] = x2 * c[k] + x1 * sk;
    }
    *p1 = dsc_pack8_16<F16>(a);
    *p2 = dsc_pack8_16<F16>(b);
}

extern "C" dsc_status dsc__cuda_rope_h(uint16_t *x, int ld, const float *cos_t,
                                       const float *sin_t, const int32_t *pos, int B, int T,
                                       int nheads, int HS, bool inverse, bool fp16,
                                       void *stream) {
    DSC_CUDA_ARG(HS > 0 && HS % 16 == 0,
                 "rope: head size %d must be a positive multiple of 16 (each half of a head moves "
                 "as 16-byte vectors)",
                 HS);
    DSC_CUDA_ARG(B > 0 && T > 0 && nheads > 0 && ld % 8 == 0 && ld >= nheads * HS,
                 "rope: bad shape (B %d, T %d, %d heads of %d, row stride %d: a multiple of 8 "
                 "holding the heads)",
                 B, T, nheads, HS, ld);
    DSC_TRY(check_aligned("rope", x, cos_t, sin_t));
    DSC_CUDA_ARG(x && cos_t && sin_t, "rope: NULL tensor");
    long long rows = (long long)B * T, n = rows * nheads * (HS / 16);
    unsigned blocks = dsc__blocks(n, ELEM_THREADS);
    float sign = inverse ? -1.0f : 1.0f;
    cudaStream_t st = as_stream(stream);
    if (fp16)
        rope_kernel<true><<<blocks, ELEM_THREADS, 0, st>>>(x, ld, cos_t, sin_t, pos, rows, T,
                                                           nheads, HS / 16, sign);
    else
        rope_kernel<false><<<blocks, ELEM_THREADS, 0, st>>>(x, ld, cos_t, sin_t, pos, rows, T,
                                                            nheads, HS / 16, sign);
    DSC_CUDA_LAUNCHED("rope_kernel");
    return DSC_OK;
}

// ---- Qwen3's q/k norms with the rotation ----

// A thread per 8 pairs (i, i + HS/2) of one head of one row, as rope_kernel; the H8 = HS/16
// threads of a head are adjacent lanes of one warp (H8 a power of two dividing the warp) and
// reduce the head's sums with shuffles. Threads past the end take part in the shuffles (every
// lane must) but neither read nor write.
struct qkn_at {
    long long bt, t;
    int h, i8;
    bool live;
};

__device__ static inline qkn_at qkn_where(const int32_t *pos, long long rows, int T, int nheads,
                                          int H8) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long per_row = (long long)nheads * H8;
    qkn_at a;
    a.live = idx < rows * per_row;
    if (!a.live) idx = 0;
    a.bt = idx / per_row;
    int rem = (int)(idx % per_row);
    a.h = rem / H8, a.i8 = rem % H8;
    a.t = pos ? (long long)pos[a.bt] : a.bt % T;
    return a;
}

// The sum of v over the H8 lanes of a head.
__device__ static inline float qkn_sum(float v, int H8) {
    for (int o = H8 / 2; o > 0; o >>= 1)
        v += dsc_shfl_xor(v, o);
    return v;
}

__device__ static inline void qkn_load8(const float *t, int half, long long pos, int i8, float *o) {
    const float4 *p = (const float4 *)(t + (size_t)pos * half) + 2 * i8;
    float4 a = p[0], b = p[1];
    o[0] = a.x, o[1] = a.y, o[2] = a.z, o[3] = a.w, o[4] = b.x, o[5] = b.y, o[6] = b.z, o[7] = b.w;
}

template <bool F16>
__global__ void qk_norm_rope_kernel(uint16_t *x, int ld, uint16_t *raw, float *rstd,
                                    const uint16_t *wq, const uint16_t *wk, float eps,
                                    const float *cos_t, const float *sin_t, const int32_t *pos,
                                    long long rows, int T, int nq, int nheads, int H8) {
    qkn_at at = qkn_where(pos, rows, T, nheads, H8);
    int half = H8 * 8, HS = 2 * half;
    uint16_t *head = x + (size_t)at.bt * ld + (size_t)at.h * HS;
    uint4 *p1 = (uint4 *)head + at.i8, *p2 = (uint4 *)(head + half) + at.i8;
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (at.live) {
        uint4 ra = *p1, rb = *p2;
        if (raw) {
            uint16_t *kept = raw + ((size_t)at.bt * nheads + at.h) * HS;
            ((uint4 *)kept)[at.i8] = ra;
            ((uint4 *)(kept + half))[at.i8] = rb;
        }
        dsc_unpack8_16<F16>(ra, a);
        dsc_unpack8_16<F16>(rb, b);
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++)
        s += a[k] * a[k] + b[k] * b[k];
    float r = 1.0f / sqrtf(qkn_sum(s, H8) / (float)HS + eps);
    if (!at.live) return;
    if (rstd && at.i8 == 0) rstd[at.bt * nheads + at.h] = r;
    const uint16_t *w = at.h < nq ? wq : wk;
    float w1[8], w2[8], c[8], sn[8];
    dsc_unpack8_16<F16>(((const uint4 *)w)[at.i8], w1);
    dsc_unpack8_16<F16>(((const uint4 *)(w + half))[at.i8], w2);
    qkn_load8(cos_t, half, at.t, at.i8, c);
    qkn_load8(sin_t, half, at.t, at.i8, sn);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float n1 = w1[k] * (a[k] * r), n2 = w2[k] * (b[k] * r);
        a[k] = n1 * c[k] - n2 * sn[k];
        b[k] = n2 * c[k] + n1 * sn[k];
    }
    *p1 = dsc_pack8_16<F16>(a);
    *p2 = dsc_pack8_16<F16>(b);
}

// The rotation undone on the 8 + 8 gradients of a thread: (g1, g2) = (d1 c + d2 s, d2 c - d1 s).
__device__ static inline void qkn_unrotate(float *d1, float *d2, const float *c, const float *s) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float a = d1[k], b = d2[k];
        d1[k] = a * c[k] + b * s[k];
        d2[k] = b * c[k] - a * s[k];
    }
}

template <bool F16>
__global__ void qk_norm_rope_bwd_kernel(uint16_t *dx, int ld, const uint16_t *raw,
                                        const float *rstd, const uint16_t *wq, const uint16_t *wk,
                                        const float *cos_t, const float *sin_t, const int32_t *pos,
                                        long long rows, int T, int nq, int nheads, int H8) {
    qkn_at at = qkn_where(pos, rows, T, nheads, H8);
    int half = H8 * 8, HS = 2 * half;
    uint16_t *head = dx + (size_t)at.bt * ld + (size_t)at.h * HS;
    uint4 *p1 = (uint4 *)head + at.i8, *p2 = (uint4 *)(head + half) + at.i8;
    float g1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, g2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float x1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, x2[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float w1[8] = {0, 0, 0, 0, 0, 0, 0, 0}, w2[8] = {0, 0, 0, 0, 0, 0, 0, 0}, r = 0.0f;
    if (at.live) {
        float c[8], sn[8];
        dsc_unpack8_16<F16>(*p1, g1);
        dsc_unpack8_16<F16>(*p2, g2);
        qkn_load8(cos_t, half, at.t, at.i8, c);
        qkn_load8(sin_t, half, at.t, at.i8, sn);
        qkn_unrotate(g1, g2, c, sn);
        const uint16_t *kept = raw + ((size_t)at.bt * nheads + at.h) * HS;
        dsc_unpack8_16<F16>(((const uint4 *)kept)[at.i8], x1);
        dsc_unpack8_16<F16>(((const uint4 *)(kept + half))[at.i8], x2);
        const uint16_t *w = at.h < nq ? wq : wk;
        dsc_unpack8_16<F16>(((const uint4 *)w)[at.i8], w1);
        dsc_unpack8_16<F16>(((const uint4 *)(w + half))[at.i8], w2);
        r = rstd[at.bt * nheads + at.h];
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++)
        s += g1[k] * w1[k] * (x1[k] * r) + g2[k] * w2[k] * (x2[k] * r);
    s = qkn_sum(s, H8) / (float)HS;
    if (!at.live) return;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        g1[k] = r * (g1[k] * w1[k] - x1[k] * r * s);
        g2[k] = r * (g2[k] * w2[k] - x2[k] * r * s);
    }
    *p1 = dsc_pack8_16<F16>(g1);
    *p2 = dsc_pack8_16<F16>(g2);
}

// The weight gradients' partial sums: block k sums rows [k QKN_ROWS, (k + 1) QKN_ROWS) into
// part[k] (2 HS: q's channels, then k's), a thread per channel, rows then heads in order. The
// gradient of channel c of a head is the unrotated one: dy_c cos + dy_(c+half) sin below the
// half, dy_c cos - dy_(c-half) sin above it. Runs before the backward kernel overwrites dy.
template <bool F16>
__global__ void qk_norm_dw_kernel(float *part, const uint16_t *dy, int ld, const uint16_t *raw,
                                  const float *rstd, const float *cos_t, const float *sin_t,
                                  const int32_t *pos, long long rows, int T, int nq, int nheads,
                                  int HS) {
    int half = HS / 2;
    long long r0 = (long long)blockIdx.x * QKN_ROWS;
    long long r1 = r0 + QKN_ROWS < rows ? r0 + QKN_ROWS : rows;
    for (int j = threadIdx.x; j < 2 * HS; j += blockDim.x) {
        int c = j % HS, i = c % half, kq = j < HS;
        float acc = 0.0f;
        for (long long bt = r0; bt < r1; bt++) {
            long long t = pos ? (long long)pos[bt] : bt % T;
            float cs = cos_t[(size_t)t * half + i], sn = sin_t[(size_t)t * half + i];
            for (int h = kq ? 0 : nq; h < (kq ? nq : nheads); h++) {
                const uint16_t *d = dy + (size_t)bt * ld + (size_t)h * HS;
                float g = c < half ? dsc_16_f32<F16>(d[c]) * cs + dsc_16_f32<F16>(d[c + half]) * sn
                                   : dsc_16_f32<F16>(d[c]) * cs - dsc_16_f32<F16>(d[c - half]) * sn;
                float xh = dsc_16_f32<F16>(raw[((size_t)bt * nheads + h) * HS + c]) *
                           rstd[bt * nheads + h];
                acc += g * xh;
            }
        }
        part[(size_t)blockIdx.x * 2 * HS + j] = acc;
    }
}

static dsc_status qkn_check(const char *what, int ld, int B, int T, int nq, int nk, int HS) {
    int H8 = HS / 16, ws = dsc__host_warp_size();
    DSC_CUDA_ARG(HS > 0 && HS % 16 == 0 && (H8 & (H8 - 1)) == 0 && H8 <= ws,
                 "%s: head size %d must be 16 times a power of two of at most %d (a head's "
                 "threads share one warp)",
                 what, HS, ws);
    DSC_CUDA_ARG(B > 0 && T > 0 && nq > 0 && nk > 0 && ld % 8 == 0 && ld >= (nq + nk) * HS,
                 "%s: bad shape (B %d, T %d, %d + %d heads of %d, row stride %d: a multiple of 8 "
                 "holding the heads)",
                 what, B, T, nq, nk, HS, ld);
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_qk_norm_rope_h(uint16_t *x, int ld, uint16_t *raw, float *rstd,
                                               const uint16_t *wq, const uint16_t *wk, float eps,
                                               const float *cos_t, const float *sin_t,
                                               const int32_t *pos, int B, int T, int nq, int nk,
                                               int HS, bool fp16, void *stream) {
    DSC_TRY(qkn_check("q/k norm", ld, B, T, nq, nk, HS));
    DSC_TRY(check_aligned("q/k norm", x, raw, wq));
    DSC_TRY(check_aligned("q/k norm", wk, cos_t, sin_t));
    DSC_CUDA_ARG(x && wq && wk && cos_t && sin_t && !raw == !rstd,
                 "q/k norm: NULL tensor (raw and rstd are both set or both NULL)");
    long long rows = (long long)B * T, n = rows * (nq + nk) * (HS / 16);
    unsigned blocks = dsc__blocks(n, ELEM_THREADS);
    cudaStream_t st = as_stream(stream);
    if (fp16)
        qk_norm_rope_kernel<true><<<blocks, ELEM_THREADS, 0, st>>>(
            x, ld, raw, rstd, wq, wk, eps, cos_t, sin_t, pos, rows, T, nq, nq + nk, HS / 16);
    else
        qk_norm_rope_kernel<false><<<blocks, ELEM_THREADS, 0, st>>>(
            x, ld, raw, rstd, wq, wk, eps, cos_t, sin_t, pos, rows, T, nq, nq + nk, HS / 16);
    DSC_CUDA_LAUNCHED("qk_norm_rope_kernel");
    return DSC_OK;
}

extern "C" size_t dsc__cuda_qk_norm_backward_scratch(int64_t N, int HS) {
    return (size_t)((N + QKN_ROWS - 1) / QKN_ROWS) * 2 * (size_t)HS;
}

extern "C" dsc_status dsc__cuda_qk_norm_rope_backward_h(
    uint16_t *dx, int ld, float *dwq, float *dwk, float *scratch, const uint16_t *raw,
    const float *rstd, const uint16_t *wq, const uint16_t *wk, const float *cos_t,
    const float *sin_t, const int32_t *pos, int B, int T, int nq, int nk, int HS, bool add,
    bool fp16, void *stream) {
    DSC_TRY(qkn_check("q/k norm backward", ld, B, T, nq, nk, HS));
    DSC_TRY(check_aligned("q/k norm backward", dx, raw, wq));
    DSC_TRY(check_aligned("q/k norm backward", wk, cos_t, sin_t));
    DSC_CUDA_ARG(dx && dwq && dwk && scratch && raw && rstd && wq && wk && cos_t && sin_t,
                 "q/k norm backward: NULL tensor");
    long long rows = (long long)B * T;
    int nheads = nq + nk, chunks = (int)((rows + QKN_ROWS - 1) / QKN_ROWS);
    cudaStream_t st = as_stream(stream);
    int dw_threads = 2 * HS < 256 ? 2 * HS : 256;
    if (fp16)
        qk_norm_dw_kernel<true><<<chunks, dw_threads, 0, st>>>(scratch, dx, ld, raw, rstd, cos_t,
                                                               sin_t, pos, rows, T, nq, nheads, HS);
    else
        qk_norm_dw_kernel<false><<<chunks, dw_threads, 0, st>>>(scratch, dx, ld, raw, rstd, cos_t,
                                                                sin_t, pos, rows, T, nq, nheads,
                                                                HS);
    DSC_CUDA_LAUNCHED("qk_norm_dw_kernel");
    float *dest[2] = {dwq, dwk};
    DSC_TRY(dsc__cuda_reduce_columns_split(dest, 2, HS, scratch, chunks, add, stream));
    long long n = rows * nheads * (HS / 16);
    unsigned blocks = dsc__blocks(n, ELEM_THREADS);
    if (fp16)
        qk_norm_rope_bwd_kernel<true><<<blocks, ELEM_THREADS, 0, st>>>(
            dx, ld, raw, rstd, wq, wk, cos_t, sin_t, pos, rows, T, nq, nheads, HS / 16);
    else
        qk_norm_rope_bwd_kernel<false><<<blocks, ELEM_THREADS, 0, st>>>(
            dx, ld, raw, rstd, wq, wk, cos_t, sin_t, pos, rows, T, nq, nheads, HS / 16);
    DSC_CUDA_LAUNCHED("qk_norm_rope_bwd_kernel");
    return DSC_OK;
}

// ---- SwiGLU ----

// silu(g) = g s with s = sigmoid(g) = 1 / (1 + exp(-g)). The fast exponential and division
// (a few ulp, far below the 16-bit rounding of every result) keep the kernels memory-bound;
// exp(-g) = inf for g < -88 gives s = 0, the limit.
__device__ static inline float sigmoid_f(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

// One thread per 8 elements of h: 16 bytes of gate, of up and of h.
template <bool F16>
__global__ void swiglu_fwd_kernel(uint4 *h, const uint4 *gu, long long N, int I8) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * I8) return;
    size_t gi = (size_t)(idx / I8) * 2 * I8 + (size_t)(idx % I8);
    float g[8], u[8];
    dsc_unpack8_16<F16>(gu[gi], g);
    dsc_unpack8_16<F16>(gu[gi + I8], u);
#pragma unroll
    for (int k = 0; k < 8; k++)
        g[k] = g[k] * sigmoid_f(g[k]) * u[k];
    h[idx] = dsc_pack8_16<F16>(g);
}

// dgate = dh up silu'(gate) with silu'(g) = s (1 + g (1 - s)), dup = dh silu(gate). Each thread
// reads its gate, up and dh before it writes the same places of dgu, so dgu may be gu.
template <bool F16>
__global__ void swiglu_bwd_kernel(uint4 *dgu, const uint4 *dh, const uint4 *gu, long long N,
                                  int I8) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= N * I8) return;
    size_t gi = (size_t)(idx / I8) * 2 * I8 + (size_t)(idx % I8);
    float g[8], u[8], d[8];
    dsc_unpack8_16<F16>(gu[gi], g);
    dsc_unpack8_16<F16>(gu[gi + I8], u);
    dsc_unpack8_16<F16>(dh[idx], d);
#pragma unroll
    for (int k = 0; k < 8; k++) {
        float s = sigmoid_f(g[k]);
        float du = d[k] * (g[k] * s);
        g[k] = d[k] * u[k] * (s * (1.0f + g[k] * (1.0f - s)));
        u[k] = du;
    }
    dgu[gi] = dsc_pack8_16<F16>(g);
    dgu[gi + I8] = dsc_pack8_16<F16>(u);
}

extern "C" dsc_status dsc__cuda_swiglu_forward_h(uint16_t *h, const uint16_t *gu, int64_t N,
                                                 int I, bool fp16, void *stream) {
    DSC_TRY(check_width("swiglu forward", "I", I, N));
    DSC_TRY(check_aligned("swiglu forward", h, gu, NULL));
    DSC_CUDA_ARG(h && gu, "swiglu forward: NULL tensor");
    long long n = (long long)N * (I / 8);
    unsigned blocks = dsc__blocks(n, ELEM_THREADS);
    cudaStream_t st = as_stream(stream);
    if (fp16)
        swiglu_fwd_kernel<true>
            <<<blocks, ELEM_THREADS, 0, st>>>((uint4 *)h, (const uint4 *)gu, N, I / 8);
    else
        swiglu_fwd_kernel<false>
            <<<blocks, ELEM_THREADS, 0, st>>>((uint4 *)h, (const uint4 *)gu, N, I / 8);
    DSC_CUDA_LAUNCHED("swiglu_fwd_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_swiglu_backward_h(uint16_t *dgu, const uint16_t *dh,
                                                  const uint16_t *gu, int64_t N, int I, bool fp16,
                                                  void *stream) {
    DSC_TRY(check_width("swiglu backward", "I", I, N));
    DSC_TRY(check_aligned("swiglu backward", dgu, dh, gu));
    DSC_CUDA_ARG(dgu && dh && gu, "swiglu backward: NULL tensor");
    long long n = (long long)N * (I / 8);
    unsigned blocks = dsc__blocks(n, ELEM_THREADS);
    cudaStream_t st = as_stream(stream);
    if (fp16)
        swiglu_bwd_kernel<true><<<blocks, ELEM_THREADS, 0, st>>>(
            (uint4 *)dgu, (const uint4 *)dh, (const uint4 *)gu, N, I / 8);
    else
        swiglu_bwd_kernel<false><<<blocks, ELEM_THREADS, 0, st>>>(
            (uint4 *)dgu, (const uint4 *)dh, (const uint4 *)gu, N, I / 8);
    DSC_CUDA_LAUNCHED("swiglu_bwd_kernel");
    return DSC_OK;
}
