// cuda/attention.cu - causal flash attention, forward and backward (see
// attention.h).
//
// A block has ATT_WARPS warps and works on one (batch, head) and one tile of
// ATT_TILE rows; each warp owns 16 of them. Tiles of Q, K, V (ATT_TILE x HS
// bf16) are staged in shared memory with rows padded to LDH elements; 16x16x16
// tile products (tile_mma.cuh) produce scores into a per-warp fp32 buffer (rows
// padded to LDF), where the softmax runs. Softmax exponents are in base 2
// (scores pre-multiplied by log2 e), so exp2f does the work; lse is stored in
// natural log.
#include "cuda/attention.h"

#include "cuda/common.cuh"   // DSC_CUDA_TRY, dsc_f32_bf16, ...
#include "cuda/tile_mma.cuh" // dsc_tile::*

#define ATT_HS 64   // head size handled
#define ATT_TILE 64 // query rows and key rows per tile
#define ATT_WARPS 4 // 16 rows each
#define LDH 72      // bf16 row stride in shared memory: 64 + 8 (keeps 32-byte tile alignment)
#define LDF 68      // fp32 row stride: 64 + 4
#define TILE_H (ATT_TILE * LDH) // elements of one bf16 tile
#define WARP_F (16 * LDF)       // floats of one warp's fp32 rows
#define WARP_H (16 * LDH)       // elements of one warp's bf16 rows
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

using namespace dsc_tile;

#if DSC_TILE_WMMA
#include "cuda/attention_mma.cuh" // dsc_att::* (register-resident tiles; NVIDIA only)
#define ATT_MMA 1
#else
#define ATT_MMA 0
#endif

// Shared memory of each kernel, in bytes (all region sizes are multiples of 32
// bytes).
#define FWD_SMEM (3 * TILE_H * 2 + 2 * ATT_WARPS * WARP_F * 4 + ATT_WARPS * WARP_H * 2)
#define DKDV_SMEM                                                                                  \
    (4 * TILE_H * 2 + 2 * ATT_WARPS * WARP_F * 4 + 2 * ATT_WARPS * WARP_H * 2 + 2 * ATT_TILE * 4)
#define DQ_SMEM                                                                                    \
    (4 * TILE_H * 2 + 2 * ATT_WARPS * WARP_F * 4 + ATT_WARPS * WARP_H * 2 + 2 * ATT_TILE * 4)

#if !ATT_MMA
// Rows [0, nvalid) of a ATT_TILE x 64 tile from global (row stride gld
// elements) into shared memory; rows past nvalid become zeros (they are masked
// later, but must not hold NaN bits).
__device__ static void load_tile(uint16_t *s, const uint16_t *g, size_t gld, int nvalid) {
    for (int i = threadIdx.x; i < ATT_TILE * (ATT_HS / 8); i += blockDim.x) {
        int r = i / (ATT_HS / 8), c = i % (ATT_HS / 8);
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < nvalid) v = *(const uint4 *)(g + r * gld + c * 8);
        *(uint4 *)(s + r * LDH + c * 8) = v;
    }
}

// C (16 x 64, fp32 rows of LDF) = A (16 x 64 as four a-fragments) times B^T, B
// given as 64 rows of 64 (row n of B is column n of the product): scores Q K^T,
// or dO V^T.
__device__ static void rows_times_bt(float *out, const frag_a *a, const uint16_t *sB) {
    for (int n = 0; n < 4; n++) {
        frag_c acc;
        zero(acc);
        for (int k = 0; k < 4; k++) {
            frag_b_col b;
            load_b(b, sB + n * 16 * LDH + k * 16, LDH);
            mma(acc, a[k], b);
        }
        store(out + n * 16, LDF, acc);
    }
}

// Write a warp's 16 x 64 fp32 rows (scaled) as bf16 rows of global memory
// (stride gld), rows at or past `valid` skipped.
__device__ static void store_rows(uint16_t *g, size_t gld, const float *s, int valid) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    for (int i = lane; i < 16 * ATT_HS; i += DSC_WARP_SIZE) {
        int r = i / ATT_HS, d = i % ATT_HS;
        if (r < valid) g[r * gld + d] = dsc_f32_bf16(s[r * LDF + d]);
    }
}

// ---- forward (portable) ----

__global__ void __launch_bounds__(ATT_WARPS *DSC_WARP_SIZE)
    att_fwd_kernel(uint16_t *out, float *lse, const uint16_t *qkv, int T, int C, int NH,
                   float scale_log2) {
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *sQ = (uint16_t *)smem, *sK = sQ + TILE_H, *sV = sK + TILE_H;
    float *sS = (float *)(sV + TILE_H), *sO = sS + ATT_WARPS * WARP_F;
    uint16_t *sP = (uint16_t *)(sO + ATT_WARPS * WARP_F);

    int nt = (T + ATT_TILE - 1) / ATT_TILE,
        qt = nt - 1 - blockIdx.x; // longest rows first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int warp = threadIdx.x / DSC_WARP_SIZE, lane = threadIdx.x % DSC_WARP_SIZE;
    size_t C3 = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * C3 + (size_t)h * ATT_HS;
    int q0 = qt * ATT_TILE;
    float *S = sS + warp * WARP_F, *O = sO + warp * WARP_F;
    uint16_t *P = sP + warp * WARP_H;

    load_tile(sQ, base + q0 * C3, C3, min(ATT_TILE, T - q0));
    for (int i = lane; i < WARP_F; i += DSC_WARP_SIZE)
        O[i] = 0.0f;
    __syncthreads();
    frag_a qf[4];
    for (int k = 0; k < 4; k++)
        load_a(qf[k], sQ + warp * 16 * LDH + k * 16, LDH);

    // Each row of the warp's 16 is handled by LPR lanes, which interleave its
    // columns.
    const int LPR = DSC_WARP_SIZE / 16;
    int r = lane / LPR, sub = lane % LPR, qi = q0 + warp * 16 + r;
    float m_run = -INFINITY, l_run = 0.0f;
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATT_TILE;
        __syncthreads(); // every warp is done with the previous K, V
        load_tile(sK, base + C + k0 * C3, C3, min(ATT_TILE, T - k0));
        load_tile(sV, base + 2 * C + k0 * C3, C3, min(ATT_TILE, T - k0));
        __syncthreads();
        rows_times_bt(S, qf, sK);
        dsc_syncwarp();
        float mx = -INFINITY;
        for (int j = sub; j < ATT_TILE; j += LPR) {
            float s = k0 + j <= qi ? S[r * LDF + j] * scale_log2 : -INFINITY;
            S[r * LDF + j] = s;
            mx = fmaxf(mx, s);
        }
        for (int o = 1; o < LPR; o <<= 1)
            mx = fmaxf(mx, dsc_shfl_xor(mx, o));
        float m_new = fmaxf(m_run, mx); // finite: key 0 is visible to every row in tile 0
        float alpha = exp2f(m_run - m_new), ls = 0.0f;
        for (int j = sub; j < ATT_TILE; j += LPR) {
            float p = exp2f(S[r * LDF + j] - m_new);
            ls += p;
            P[r * LDH + j] = dsc_f32_bf16(p);
        }
        for (int o = 1; o < LPR; o <<= 1)
            ls += dsc_shfl_xor(ls, o);
        l_run = l_run * alpha + ls;
        m_run = m_new;
        for (int d = sub; d < ATT_HS; d += LPR)
            O[r * LDF + d] *= alpha;
        dsc_syncwarp();
        for (int n = 0; n < 4; n++) {
            frag_c acc;
            load_c(acc, O + n * 16, LDF);
            for (int k = 0; k < 4; k++) {
                frag_a pa;
                frag_b_row vb;
                load_a(pa, P + k * 16, LDH);
                load_b(vb, sV + k * 16 * LDH + n * 16, LDH);
                mma(acc, pa, vb);
            }
            store(O + n * 16, LDF, acc);
        }
        dsc_syncwarp();
    }
    float inv = 1.0f / l_run;
    for (int d = sub; d < ATT_HS; d += LPR)
        O[r * LDF + d] *= inv;
    if (qi < T && sub == 0) lse[(size_t)bh * T + qi] = (m_run + log2f(l_run)) * LN2;
    dsc_syncwarp();
    store_rows(out + ((size_t)b * T + q0 + warp * 16) * C + (size_t)h * ATT_HS, C, O,
               T - (q0 + warp * 16));
}

#endif // !ATT_MMA

// ---- backward ----

// Dv (B, NH, T) = rowsum(dO * O) per head: the softmax backward's correction term. A warp per
// position: lane l takes the row's 16-byte chunks l, l + warp, ... (both tensors, so a warp reads
// whole contiguous runs), and the HC lanes holding one head's HC chunks (8: head size 64, 16: 128)
// add in a fixed tree.
template <bool F16, int HC = 8>
__global__ void att_bwd_dot_kernel(float *Dv, const uint16_t *dout, const uint16_t *out, int BT,
                                   int T, int C, int NH) {
    int lane = threadIdx.x % DSC_WARP_SIZE;
    long long bt =
        (long long)blockIdx.x * (blockDim.x / DSC_WARP_SIZE) + threadIdx.x / DSC_WARP_SIZE;
    if (bt >= BT) return; // whole warps leave together
    int b = (int)(bt / T), t = (int)(bt % T), C8 = C / 8;
    const uint4 *a = (const uint4 *)(dout + bt * C), *o = (const uint4 *)(out + bt * C);
    for (int base = 0; base < C8; base += DSC_WARP_SIZE) { // C8 and the warp: multiples of HC
        int i = base + lane;
        float s = 0.0f;
        if (i < C8) {
            float x[8], y[8];
            dsc_unpack8_16<F16>(a[i], x);
            dsc_unpack8_16<F16>(o[i], y);
            for (int k = 0; k < 8; k++)
                s += x[k] * y[k];
        }
        s += dsc_shfl_xor(s, 1);
        s += dsc_shfl_xor(s, 2);
        s += dsc_shfl_xor(s, 4);
        if (HC > 8) s += dsc_shfl_xor(s, 8);
        if (i < C8 && (i & (HC - 1)) == 0) Dv[((size_t)b * NH + i / HC) * T + t] = s;
    }
}

#if !ATT_MMA
// lse (scaled to base 2) and Dv of query rows [q0, q0 + ATT_TILE) into shared
// memory.
__device__ static void load_row_stats(float *sL, float *sD, const float *lse, const float *Dv,
                                      int q0, int T) {
    for (int i = threadIdx.x; i < ATT_TILE; i += blockDim.x) {
        bool ok = q0 + i < T;
        sL[i] = ok ? lse[q0 + i] * LOG2E : 0.0f;
        sD[i] = ok ? Dv[q0 + i] : 0.0f;
    }
}

// dK, dV of one key tile: loop over the query tiles that can see it. Warps own
// 16 keys; the products are transposed (keys as rows): S^T = K Q^T, dP^T = V
// dO^T, dV += P^T dO, dK += dS^T Q.
__global__ void __launch_bounds__(ATT_WARPS *DSC_WARP_SIZE)
    att_bwd_dkdv_kernel(uint16_t *dqkv, const uint16_t *qkv, const uint16_t *dout, const float *lse,
                        const float *Dv, int T, int C, int NH, float scale_log2, float sm_scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *sK = (uint16_t *)smem, *sV = sK + TILE_H, *sQ = sV + TILE_H, *sdO = sQ + TILE_H;
    float *sS = (float *)(sdO + TILE_H), *sdP = sS + ATT_WARPS * WARP_F;
    uint16_t *sP = (uint16_t *)(sdP + ATT_WARPS * WARP_F), *sdS = sP + ATT_WARPS * WARP_H;
    float *sL = (float *)(sdS + ATT_WARPS * WARP_H), *sD = sL + ATT_TILE;

    int nt = (T + ATT_TILE - 1) / ATT_TILE,
        kt = blockIdx.x; // most query tiles first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int warp = threadIdx.x / DSC_WARP_SIZE, lane = threadIdx.x % DSC_WARP_SIZE;
    size_t C3 = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * C3 + (size_t)h * ATT_HS;
    const uint16_t *dbase = dout + (size_t)b * T * C + (size_t)h * ATT_HS;
    int k0 = kt * ATT_TILE;
    float *St = sS + warp * WARP_F, *dPt = sdP + warp * WARP_F;
    uint16_t *Pt = sP + warp * WARP_H, *dSt = sdS + warp * WARP_H;

    load_tile(sK, base + C + k0 * C3, C3, min(ATT_TILE, T - k0));
    load_tile(sV, base + 2 * C + k0 * C3, C3, min(ATT_TILE, T - k0));
    __syncthreads();
    frag_a kf[4], vf[4];
    for (int k = 0; k < 4; k++) {
        load_a(kf[k], sK + warp * 16 * LDH + k * 16, LDH);
        load_a(vf[k], sV + warp * 16 * LDH + k * 16, LDH);
    }
    frag_c dV[4], dK[4];
    for (int n = 0; n < 4; n++) {
        zero(dV[n]);
        zero(dK[n]);
    }
    for (int qt = kt; qt < nt; qt++) {
        int q0 = qt * ATT_TILE;
        __syncthreads(); // every warp is done with the previous Q, dO
        load_tile(sQ, base + q0 * C3, C3, min(ATT_TILE, T - q0));
        load_tile(sdO, dbase + (size_t)q0 * C, C, min(ATT_TILE, T - q0));
        load_row_stats(sL, sD, lse + (size_t)bh * T, Dv + (size_t)bh * T, q0, T);
        __syncthreads();
        rows_times_bt(St, kf, sQ);
        rows_times_bt(dPt, vf, sdO);
        dsc_syncwarp();
        for (int i = lane; i < 16 * ATT_TILE; i += DSC_WARP_SIZE) {
            int r = i / ATT_TILE, c = i % ATT_TILE, key = k0 + warp * 16 + r, q = q0 + c;
            float p = 0.0f, ds = 0.0f;
            if (key <= q && q < T) {
                p = exp2f(St[r * LDF + c] * scale_log2 - sL[c]);
                ds = p * (dPt[r * LDF + c] - sD[c]);
            }
            Pt[r * LDH + c] = dsc_f32_bf16(p);
            dSt[r * LDH + c] = dsc_f32_bf16(ds);
        }
        dsc_syncwarp();
        for (int n = 0; n < 4; n++) {
            for (int k = 0; k < 4; k++) {
                frag_a pa, sa;
                frag_b_row ob, qb;
                load_a(pa, Pt + k * 16, LDH);
                load_b(ob, sdO + k * 16 * LDH + n * 16, LDH);
                mma(dV[n], pa, ob);
                load_a(sa, dSt + k * 16, LDH);
                load_b(qb, sQ + k * 16 * LDH + n * 16, LDH);
                mma(dK[n], sa, qb);
            }
        }
    }
    int valid = T - (k0 + warp * 16);
    uint16_t *g = dqkv + ((size_t)b * T + k0 + warp * 16) * C3 + (size_t)h * ATT_HS;
    dsc_syncwarp();
    for (int n = 0; n < 4; n++) {
        mul(dK[n], sm_scale);
        store(St + n * 16, LDF, dK[n]);
    }
    dsc_syncwarp();
    store_rows(g + C, C3, St, valid);
    dsc_syncwarp();
    for (int n = 0; n < 4; n++)
        store(St + n * 16, LDF, dV[n]);
    dsc_syncwarp();
    store_rows(g + 2 * C, C3, St, valid);
}

// dQ of one query tile: loop over the key tiles it sees. S = Q K^T, dP = dO
// V^T, dQ += dS K.
__global__ void __launch_bounds__(ATT_WARPS *DSC_WARP_SIZE)
    att_bwd_dq_kernel(uint16_t *dqkv, const uint16_t *qkv, const uint16_t *dout, const float *lse,
                      const float *Dv, int T, int C, int NH, float scale_log2, float sm_scale) {
    extern __shared__ __align__(128) unsigned char smem[];
    uint16_t *sQ = (uint16_t *)smem, *sdO = sQ + TILE_H, *sK = sdO + TILE_H, *sV = sK + TILE_H;
    float *sS = (float *)(sV + TILE_H), *sdP = sS + ATT_WARPS * WARP_F;
    uint16_t *sdS = (uint16_t *)(sdP + ATT_WARPS * WARP_F);
    float *sL = (float *)(sdS + ATT_WARPS * WARP_H), *sD = sL + ATT_TILE;

    int nt = (T + ATT_TILE - 1) / ATT_TILE,
        qt = nt - 1 - blockIdx.x; // most key tiles first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int warp = threadIdx.x / DSC_WARP_SIZE, lane = threadIdx.x % DSC_WARP_SIZE;
    size_t C3 = 3 * (size_t)C;
    const uint16_t *base = qkv + (size_t)b * T * C3 + (size_t)h * ATT_HS;
    int q0 = qt * ATT_TILE;
    float *S = sS + warp * WARP_F, *dP = sdP + warp * WARP_F;
    uint16_t *dS = sdS + warp * WARP_H;

    load_tile(sQ, base + q0 * C3, C3, min(ATT_TILE, T - q0));
    load_tile(sdO, dout + ((size_t)b * T + q0) * C + (size_t)h * ATT_HS, C, min(ATT_TILE, T - q0));
    load_row_stats(sL, sD, lse + (size_t)bh * T, Dv + (size_t)bh * T, q0, T);
    __syncthreads();
    frag_a qf[4], of[4];
    for (int k = 0; k < 4; k++) {
        load_a(qf[k], sQ + warp * 16 * LDH + k * 16, LDH);
        load_a(of[k], sdO + warp * 16 * LDH + k * 16, LDH);
    }
    frag_c dQ[4];
    for (int n = 0; n < 4; n++)
        zero(dQ[n]);
    for (int kt = 0; kt <= qt; kt++) {
        int k0 = kt * ATT_TILE;
        __syncthreads(); // every warp is done with the previous K, V
        load_tile(sK, base + C + k0 * C3, C3, min(ATT_TILE, T - k0));
        load_tile(sV, base + 2 * C + k0 * C3, C3, min(ATT_TILE, T - k0));
        __syncthreads();
        rows_times_bt(S, qf, sK);
        rows_times_bt(dP, of, sV);
        dsc_syncwarp();
        for (int i = lane; i < 16 * ATT_TILE; i += DSC_WARP_SIZE) {
            int r = i / ATT_TILE, c = i % ATT_TILE, q = q0 + warp * 16 + r, key = k0 + c;
            float ds = 0.0f;
            if (key <= q && q < T) {
                float p = exp2f(S[r * LDF + c] * scale_log2 - sL[warp * 16 + r]);
                ds = p * (dP[r * LDF + c] - sD[warp * 16 + r]);
            }
            dS[r * LDH + c] = dsc_f32_bf16(ds);
        }
        dsc_syncwarp();
        for (int n = 0; n < 4; n++) {
            for (int k = 0; k < 4; k++) {
                frag_a sa;
                frag_b_row kb;
                load_a(sa, dS + k * 16, LDH);
                load_b(kb, sK + k * 16 * LDH + n * 16, LDH);
                mma(dQ[n], sa, kb);
            }
        }
    }
    dsc_syncwarp();
    for (int n = 0; n < 4; n++) {
        mul(dQ[n], sm_scale);
        store(S + n * 16, LDF, dQ[n]);
    }
    dsc_syncwarp();
    store_rows(dqkv + ((size_t)b * T + q0 + warp * 16) * C3 + (size_t)h * ATT_HS, C3, S,
               T - (q0 + warp * 16));
}

#endif // !ATT_MMA

// ---- launchers ----

static dsc_status att_check(const char *what, int B, int T, int C, int NH, const void *a,
                            const void *b, const void *c) {
    DSC_CUDA_ARG(B > 0 && T > 0 && NH > 0 && C == NH * ATT_HS,
                 "%s: head size C / NH = %d / %d must be %d", what, C, NH, ATT_HS);
    DSC_CUDA_ARG((int64_t)B * NH <= DSC_CUDA_ATT_MAX_BH,
                 "%s: batch %d x %d heads = %lld (batch, head) pairs, more than the %d one launch "
                 "takes; use a smaller micro-batch",
                 what, B, NH, (long long)B * NH, DSC_CUDA_ATT_MAX_BH);
    DSC_CUDA_ARG(dsc__aligned16(a) && dsc__aligned16(b) && dsc__aligned16(c),
                 "%s: tensors must be 16-byte aligned", what);
    return DSC_OK;
}

// Kernels past 48 KB of dynamic shared memory must say so before their launch.
template <typename K> static dsc_status raise_smem(K kernel, int bytes, const char *name) {
    DSC_CUDA_CHECK_AS(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), name);
    return DSC_OK;
}

// fp16 operands need the register-tile kernels (attention_mma.cuh, NVIDIA builds); the portable
// kernels of this file are bf16 only.
static dsc_status need_mma(bool fp16, const char *what) {
    if (!fp16 || ATT_MMA) return DSC_OK;
    return dsc__fail(DSC_ERR_UNSUPPORTED,
                     "%s: fp16 attention is built for NVIDIA GPUs only (this build's portable "
                     "kernels take bf16); train with \"bf16\": {\"enabled\": true}",
                     what);
}

#if ATT_MMA
// GQA false: GPT-2's layout (NKV = NH), whose kernels also make the bias column sums. NP: the head
// size in 64-column panels (1 or 2).
template <bool F16, bool GQA, int NP>
static dsc_status mma_forward(uint16_t *out, float *lse, const uint16_t *qkv, int T, int NH,
                              int NKV, dim3 grid, cudaStream_t st) {
    DSC_TRY(raise_smem(dsc_att::fwd_kernel<F16, GQA, NP>, MMA_FWD_SMEM(NP),
                       "attention forward: shared memory limit"));
    dsc_att::fwd_kernel<F16, GQA, NP><<<grid, 128, MMA_FWD_SMEM(NP), st>>>(
        out, lse, qkv, T, NH, NKV, LOG2E / sqrtf((float)(ATT_HS * NP)));
    DSC_CUDA_LAUNCHED("attention forward kernel");
    return DSC_OK;
}

// grid: (query tiles, B NH), the dQ kernel's; the dK dV kernel has a block per (key tile, batch,
// kv head).
template <bool F16, bool GQA, int NP>
static dsc_status mma_backward(uint16_t *dqkv, const float *Dv, const uint16_t *dout,
                               const uint16_t *qkv, const float *lse, int T, int NH, int NKV,
                               float *bpart, dim3 grid, cudaStream_t st) {
    float scale = 1.0f / sqrtf((float)(ATT_HS * NP)), scale_log2 = scale * LOG2E;
    dim3 kv_grid(grid.x, grid.y / NH * NKV);
    DSC_TRY(raise_smem(dsc_att::dkdv_kernel<F16, GQA, NP>, MMA_DKDV_SMEM(NP),
                       "attention backward: shared memory limit"));
    dsc_att::dkdv_kernel<F16, GQA, NP><<<kv_grid, 128, MMA_DKDV_SMEM(NP), st>>>(
        dqkv, qkv, dout, lse, Dv, T, NH, NKV, scale_log2, scale, bpart);
    DSC_CUDA_LAUNCHED("attention backward dK dV kernel");
    DSC_TRY(raise_smem(dsc_att::dq_kernel<F16, GQA, NP>, MMA_DQ_SMEM(NP),
                       "attention backward: shared memory limit"));
    dsc_att::dq_kernel<F16, GQA, NP><<<grid, 128, MMA_DQ_SMEM(NP), st>>>(
        dqkv, qkv, dout, lse, Dv, T, NH, NKV, scale_log2, scale, bpart);
    DSC_CUDA_LAUNCHED("attention backward dQ kernel");
    return DSC_OK;
}
#endif

extern "C" dsc_status dsc__cuda_attention_forward_h(uint16_t *out, float *lse, const uint16_t *qkv,
                                                    int B, int T, int C, int NH, bool fp16,
                                                    void *stream) {
    DSC_TRY(att_check("attention forward", B, T, C, NH, out, qkv, qkv));
    DSC_CUDA_ARG(lse != NULL, "attention forward: lse is NULL");
    DSC_TRY(need_mma(fp16, "attention forward"));
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid((T + ATT_TILE - 1) / ATT_TILE, B * NH);
#if ATT_MMA
    return fp16 ? mma_forward<true, false, 1>(out, lse, qkv, T, NH, NH, grid, st)
                : mma_forward<false, false, 1>(out, lse, qkv, T, NH, NH, grid, st);
#else
    DSC_TRY(raise_smem(att_fwd_kernel, FWD_SMEM, "attention forward: shared memory limit"));
    int threads = ATT_WARPS * dsc__host_warp_size();
    att_fwd_kernel<<<grid, threads, FWD_SMEM, st>>>(out, lse, qkv, T, C, NH,
                                                    LOG2E / sqrtf((float)ATT_HS));
    DSC_CUDA_LAUNCHED("att_fwd_kernel");
    return DSC_OK;
#endif
}

extern "C" dsc_status dsc__cuda_attention_forward(uint16_t *out, float *lse, const uint16_t *qkv,
                                                  int B, int T, int C, int NH, void *stream) {
    return dsc__cuda_attention_forward_h(out, lse, qkv, B, T, C, NH, false, stream);
}

extern "C" size_t dsc__cuda_attention_backward_scratch(int B, int T, int NH) {
    return (size_t)B * NH * T;
}

extern "C" int dsc__cuda_attention_bias_chunks(int B, int T) {
    return B * ((T + ATT_TILE - 1) / ATT_TILE);
}

#if !ATT_MMA
// The column sums of dqkv per chunk of ATT_TILE rows of one sequence (the register kernels make
// them as they store): part (B * ceil(T / ATT_TILE), 3C), thread per (chunk, column), rows in
// order.
template <bool F16>
__global__ void att_bias_part_kernel(float *part, const uint16_t *dqkv, int T, int C3, int nt) {
    int chunk = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C3) return;
    int b = chunk / nt, r0 = (chunk % nt) * ATT_TILE, r1 = min(T, r0 + ATT_TILE);
    const uint16_t *g = dqkv + ((size_t)b * T) * C3 + c;
    float s = 0.0f;
    for (int r = r0; r < r1; r++)
        s += dsc_16_f32<F16>(g[(size_t)r * C3]);
    part[(size_t)chunk * C3 + c] = s;
}
#endif

extern "C" dsc_status dsc__cuda_attention_backward_h(uint16_t *dqkv, float *scratch,
                                                     float *bias_part, const uint16_t *dout,
                                                     const uint16_t *qkv, const uint16_t *out,
                                                     const float *lse, int B, int T, int C, int NH,
                                                     bool fp16, void *stream) {
    DSC_TRY(att_check("attention backward", B, T, C, NH, dqkv, dout, qkv));
    DSC_CUDA_ARG(out && lse && scratch && dsc__aligned16(out), "attention backward: bad arguments");
    DSC_TRY(need_mma(fp16, "attention backward"));
    cudaStream_t st = (cudaStream_t)stream;
    unsigned dot_blocks = dsc__blocks((long long)B * T, 256 / dsc__host_warp_size());
    if (fp16)
        att_bwd_dot_kernel<true><<<dot_blocks, 256, 0, st>>>(scratch, dout, out, B * T, T, C, NH);
    else
        att_bwd_dot_kernel<false><<<dot_blocks, 256, 0, st>>>(scratch, dout, out, B * T, T, C, NH);
    DSC_CUDA_LAUNCHED("att_bwd_dot_kernel");
    dim3 grid((T + ATT_TILE - 1) / ATT_TILE, B * NH);
#if ATT_MMA
    return fp16 ? mma_backward<true, false, 1>(dqkv, scratch, dout, qkv, lse, T, NH, NH,
                                               bias_part, grid, st)
                : mma_backward<false, false, 1>(dqkv, scratch, dout, qkv, lse, T, NH, NH,
                                                bias_part, grid, st);
#else
    float scale = 1.0f / sqrtf((float)ATT_HS), scale_log2 = scale * LOG2E;
    int threads = ATT_WARPS * dsc__host_warp_size();
    DSC_TRY(raise_smem(att_bwd_dkdv_kernel, DKDV_SMEM, "attention backward: shared memory limit"));
    att_bwd_dkdv_kernel<<<grid, threads, DKDV_SMEM, st>>>(dqkv, qkv, dout, lse, scratch, T, C, NH,
                                                          scale_log2, scale);
    DSC_CUDA_LAUNCHED("att_bwd_dkdv_kernel");
    DSC_TRY(raise_smem(att_bwd_dq_kernel, DQ_SMEM, "attention backward: shared memory limit"));
    att_bwd_dq_kernel<<<grid, threads, DQ_SMEM, st>>>(dqkv, qkv, dout, lse, scratch, T, C, NH,
                                                      scale_log2, scale);
    DSC_CUDA_LAUNCHED("att_bwd_dq_kernel");
    if (!bias_part) return DSC_OK;
    int nt = (T + ATT_TILE - 1) / ATT_TILE;
    dim3 pgrid((3 * C + 255) / 256, B * nt);
    if (fp16)
        att_bias_part_kernel<true><<<pgrid, 256, 0, st>>>(bias_part, dqkv, T, 3 * C, nt);
    else
        att_bias_part_kernel<false><<<pgrid, 256, 0, st>>>(bias_part, dqkv, T, 3 * C, nt);
    DSC_CUDA_LAUNCHED("att_bias_part_kernel");
    return DSC_OK;
#endif
}

extern "C" dsc_status dsc__cuda_attention_backward(uint16_t *dqkv, float *scratch,
                                                   const uint16_t *dout, const uint16_t *qkv,
                                                   const uint16_t *out, const float *lse, int B,
                                                   int T, int C, int NH, void *stream) {
    return dsc__cuda_attention_backward_h(dqkv, scratch, NULL, dout, qkv, out, lse, B, T, C, NH,
                                          false, stream);
}

// ---- grouped-query attention ----

static dsc_status gqa_check(const char *what, int B, int T, int NH, int NKV, int HS, const void *a,
                            const void *b, const void *c) {
    DSC_CUDA_ARG(HS == ATT_HS || HS == 2 * ATT_HS,
                 "%s: head size HS = %d is not supported; it must be %d or %d", what, HS, ATT_HS,
                 2 * ATT_HS);
    DSC_CUDA_ARG(B > 0 && T > 0 && NH > 0 && NKV > 0,
                 "%s: B %d, T %d, NH %d, NKV %d must all be positive", what, B, T, NH, NKV);
    DSC_CUDA_ARG(NH % NKV == 0, "%s: NKV = %d kv heads must divide NH = %d query heads", what, NKV,
                 NH);
    DSC_CUDA_ARG((int64_t)B * NH <= DSC_CUDA_ATT_MAX_BH,
                 "%s: batch %d x %d heads = %lld (batch, head) pairs, more than the %d one launch "
                 "takes (DSC_CUDA_ATT_MAX_BH); use a smaller micro-batch",
                 what, B, NH, (long long)B * NH, DSC_CUDA_ATT_MAX_BH);
    DSC_CUDA_ARG(dsc__aligned16(a) && dsc__aligned16(b) && dsc__aligned16(c),
                 "%s: tensors must be 16-byte aligned", what);
#if ATT_MMA
    return DSC_OK;
#else
    return dsc__fail(DSC_ERR_UNSUPPORTED,
                     "%s: grouped-query attention is built for NVIDIA GPUs only (its kernels are "
                     "the register-tile ones); this build has the portable GPT-2 kernels only",
                     what);
#endif
}

extern "C" dsc_status dsc__cuda_gqa_forward(uint16_t *out, float *lse, const uint16_t *qkv, int B,
                                            int T, int NH, int NKV, int HS, bool fp16,
                                            void *stream) {
    DSC_TRY(gqa_check("grouped-query attention forward", B, T, NH, NKV, HS, out, qkv, qkv));
    DSC_CUDA_ARG(lse != NULL, "grouped-query attention forward: lse is NULL");
#if ATT_MMA
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid((T + ATT_TILE - 1) / ATT_TILE, B * NH);
    if (HS == ATT_HS)
        return fp16 ? mma_forward<true, true, 1>(out, lse, qkv, T, NH, NKV, grid, st)
                    : mma_forward<false, true, 1>(out, lse, qkv, T, NH, NKV, grid, st);
    return fp16 ? mma_forward<true, true, 2>(out, lse, qkv, T, NH, NKV, grid, st)
                : mma_forward<false, true, 2>(out, lse, qkv, T, NH, NKV, grid, st);
#else
    (void)fp16, (void)stream;
    return DSC_ERR_INTERNAL; // gqa_check has refused
#endif
}

extern "C" size_t dsc__cuda_gqa_backward_scratch(int B, int T, int NH) {
    return (size_t)B * NH * T;
}

extern "C" dsc_status dsc__cuda_gqa_backward(uint16_t *dqkv, float *scratch, const uint16_t *dout,
                                             const uint16_t *qkv, const uint16_t *out,
                                             const float *lse, int B, int T, int NH, int NKV,
                                             int HS, bool fp16, void *stream) {
    DSC_TRY(gqa_check("grouped-query attention backward", B, T, NH, NKV, HS, dqkv, dout, qkv));
    DSC_CUDA_ARG(out && lse && scratch && dsc__aligned16(out),
                 "grouped-query attention backward: out, lse or scratch is NULL or out is not "
                 "16-byte aligned");
#if ATT_MMA
    cudaStream_t st = (cudaStream_t)stream;
    int C = NH * HS;
    unsigned dot_blocks = dsc__blocks((long long)B * T, 256 / dsc__host_warp_size());
    if (HS == ATT_HS && fp16)
        att_bwd_dot_kernel<true><<<dot_blocks, 256, 0, st>>>(scratch, dout, out, B * T, T, C, NH);
    else if (HS == ATT_HS)
        att_bwd_dot_kernel<false><<<dot_blocks, 256, 0, st>>>(scratch, dout, out, B * T, T, C, NH);
    else if (fp16)
        att_bwd_dot_kernel<true, 16>
            <<<dot_blocks, 256, 0, st>>>(scratch, dout, out, B * T, T, C, NH);
    else
        att_bwd_dot_kernel<false, 16>
            <<<dot_blocks, 256, 0, st>>>(scratch, dout, out, B * T, T, C, NH);
    DSC_CUDA_LAUNCHED("att_bwd_dot_kernel");
    dim3 grid((T + ATT_TILE - 1) / ATT_TILE, B * NH);
    if (HS == ATT_HS)
        return fp16 ? mma_backward<true, true, 1>(dqkv, scratch, dout, qkv, lse, T, NH, NKV, NULL,
                                                  grid, st)
                    : mma_backward<false, true, 1>(dqkv, scratch, dout, qkv, lse, T, NH, NKV, NULL,
                                                   grid, st);
    return fp16 ? mma_backward<true, true, 2>(dqkv, scratch, dout, qkv, lse, T, NH, NKV, NULL, grid,
                                              st)
                : mma_backward<false, true, 2>(dqkv, scratch, dout, qkv, lse, T, NH, NKV, NULL,
                                               grid, st);
#else
    (void)fp16, (void)stream;
    return DSC_ERR_INTERNAL; // gqa_check has refused
#endif
}
