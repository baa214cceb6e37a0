// cuda/attention_mma.cuh - the NVIDIA kernels of attention.cu: score and output tiles held in
// registers.
//
// Included by attention.cu in CUDA builds only (inline PTX: wgmma on sm_90a; mma.sync m16n8k16
// and ldmatrix elsewhere, sm_80 and newer; cp.async). The contracts are attention.h's; the HIP
// build keeps the portable kernels of attention.cu.
//
// Shape of the work: a block is 4 warps (one warpgroup) and 64 rows of one (batch, head); each
// warp owns 16 rows and keeps its score tiles and its output tile in registers as mma fragments.
// The operand tiles (Q, K, V, dO: 64 rows x 64 16-bit values; a head of 128 is two such panels)
// sit in shared memory; the streamed ones are double-buffered with cp.async so the next tile
// loads while this one is multiplied.
// A score accumulator's layout (row g / g + 8, columns 2t, 2t + 1 of each
// 8-column slice) is exactly the layout of an A operand once packed to 16-bit pairs, so P and dS
// go from one product to the next without touching memory.
//
// Shared tiles are dense (128 bytes a row) with the 128-byte swizzle: the 16-byte chunk c of row
// r sits at chunk c ^ (r & 7), and every tile starts on a 1024-byte boundary. That is the layout
// Hopper's warpgroup products (wgmma) read their B operand from, and it keeps ldmatrix free of
// bank conflicts as the padded rows did before.
//
// Products: on sm_90a (the build's Hopper target) each product is a warpgroup product, m64 n64
// k16, reading the shared tiles straight into the tensor cores (once for the four warps, where
// ldmatrix read them once a warp): both operands of the score products (Q K^T and the like) from
// shared memory, the packed P or dS of the output products from registers, with fp32
// accumulators in the same registers and layout as the mma.sync path below. Other targets (the
// compute_90 PTX, which later GPUs compile) use mma.sync m16n8k16 with ldmatrix.
//
// Fragment conventions (PTX ISA, mma.m16n8k16 with .row.col, and wgmma's register fragments of
// a warp's 16 rows): lane = 4 g + t.
//   A (16 x 16): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)
//   B (16 x 8):  b0 (k 2t..2t+1, n g), b1 (k 2t+8.., n g)
//   C (16 x 8):  c0 c1 (g, 2t..2t+1), c2 c3 (g+8, 2t..2t+1)
// B from a tile stored as (n rows, k contiguous) is a plain ldmatrix (wgmma: K-major); from (k
// rows, n contiguous) it is ldmatrix.trans (wgmma: MN-major, transposed B).
#ifndef DSC_CUDA_ATTENTION_MMA_CUH
#define DSC_CUDA_ATTENTION_MMA_CUH

#include <cuda_bf16.h> // __floats2bfloat162_rn
#include <cuda_fp16.h> // __floats2half2_rn

namespace dsc_att {

// Blocks per multiprocessor the kernels are compiled for (registers
// per thread: 65536 / (128 x blocks)); the shared memory of that many fits.
#ifndef DSC_ATT_DKDV_BLOCKS
#define DSC_ATT_DKDV_BLOCKS 3
#endif
#ifndef DSC_ATT_DQ_BLOCKS
#define DSC_ATT_DQ_BLOCKS 4
#endif
#ifndef DSC_ATT_FWD_BLOCKS
#define DSC_ATT_FWD_BLOCKS 5
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DSC_ATT_WGMMA 1 // warpgroup products (sm_90a)
#else
#define DSC_ATT_WGMMA 0
#endif

#define MMA_TILE_ELEMS (64 * 64) // one 64 x 64 tile, 8 KB
#define MMA_SMEM_ALIGN 1024      // tiles start on the swizzle pattern's period

__device__ static inline uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// Element offset of 16-byte chunk c (0..7) of row r in a swizzled tile.
__device__ static inline int swz(int r, int c) {
    return r * 64 + ((c ^ (r & 7)) << 3);
}

// The block's dynamic shared memory from its first 1024-byte boundary (the launch asks for
// MMA_SMEM_ALIGN bytes more than the tiles need).
__device__ static inline uint16_t *aligned_smem(unsigned char *raw) {
    uint32_t a = smem_addr(raw);
    return (uint16_t *)(raw +
                        ((MMA_SMEM_ALIGN - (a & (MMA_SMEM_ALIGN - 1))) & (MMA_SMEM_ALIGN - 1)));
}

// Two floats as a pair of 16-bit values (first in the low half), rounded to
// nearest even.
template <bool F16> __device__ static inline uint32_t pack2(float lo, float hi) {
    if (F16) {
        __half2 v = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&v;
    }
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}

// 2^x with the hardware's approximation (2 ulp), subnormal results flushed to zero: what exp2f
// computes for the softmax's range without its subnormal handling around it.
__device__ static inline float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// c (16 x 8) += a (16 x 16) b (16 x 8), fp32 accumulation.
template <bool F16>
__device__ static inline void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ static inline void ldsm4(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ static inline void ldsm4_t(uint32_t r[4], const uint16_t *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// 16 bytes global -> shared without passing through registers; ok false writes
// zeros.
__device__ static inline void cp16(void *s, const void *g, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(s)), "l"(g),
                 "r"(ok ? 16 : 0));
}
__device__ static inline void cp4(void *s, const void *g, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(s)), "l"(g),
                 "r"(ok ? 4 : 0));
}
__device__ static inline void cp_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
// Wait until at most one committed group is still in flight (the prefetch of the next tile).
// With warpgroup products the landed tile is then made visible to the async proxy, through
// which wgmma reads shared memory (the barrier that follows orders it for the other threads).
__device__ static inline void cp_wait_prev() {
    asm volatile("cp.async.wait_group 1;\n" ::);
#if DSC_ATT_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
__device__ static inline void cp_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::);
}

// Rows [0, nvalid) of a 64 x 64 tile (global row stride gld) into shared memory; the rest zeros.
// The kernels' 128 threads each copy 16 bytes of rows r, r + 16, r + 32, r + 48 (the swizzle
// repeats every 8 rows, so the four share one pattern).
__device__ static inline void tile_async(uint16_t *s, const uint16_t *g, size_t gld, int nvalid) {
    int r = threadIdx.x >> 3, c = threadIdx.x & 7;
    const uint16_t *gp = g + (size_t)r * gld + c * 8;
    uint16_t *sp = s + swz(r, c);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        bool ok = r + 16 * j < nvalid;
        cp16(sp + j * 16 * 64, ok ? gp + (size_t)j * 16 * gld : g, ok);
    }
}

// The same for a 64 x 64 NP tile stored as NP 64 x 64 panels, one after the other.
template <int NP>
__device__ static inline void panels_async(uint16_t *s, const uint16_t *g, size_t gld, int nvalid) {
    for (int p = 0; p < NP; p++)
        tile_async(s + p * MMA_TILE_ELEMS, g + p * 64, gld, nvalid);
}

// 64 floats of row statistics (rows past nvalid: zeros).
__device__ static inline void stats_async(float *s, const float *g, int nvalid) {
    int i = threadIdx.x;
    if (i < 64) cp4(s + i, i < nvalid ? g + i : g, i < nvalid);
}

// The warp's 16 rows starting at row0 of a shared tile as four A fragments
// (columns 0..63).
__device__ static inline void load_a_rows(uint32_t f[4][4], const uint16_t *tile, int row0) {
    int lane = threadIdx.x & 31, r = row0 + (lane & 7) + ((lane >> 3) & 1) * 8;
    for (int k = 0; k < 4; k++)
        ldsm4(f[k], tile + swz(r, 2 * k + (lane >> 4)));
}

#if DSC_ATT_WGMMA
// ---- warpgroup products (sm_90a) ----

// Shared-memory descriptor of a swizzled tile (or of a k-step inside one): start address,
// leading-dimension offset 16 bytes (unused by these layouts), stride 1024 bytes between groups
// of eight 128-byte rows, 128-byte swizzle.
__device__ static inline uint64_t wg_desc(const uint16_t *p) {
    uint64_t a = smem_addr(p);
    return ((a & 0x3ffff) >> 4) | (1ull << 16) | ((uint64_t)(1024 >> 4) << 32) | (1ull << 62);
}

// d (64 x 64 over the warpgroup; this warp's 16 rows) (+)= a (16 x 16) times the B operand that
// desc names (16 x 64); TB 0: B stored n-major (K-major), 1: k-major (MN-major, transposed).
#define DSC_WG_D(n) "+f"(d[n][0]), "+f"(d[n][1]), "+f"(d[n][2]), "+f"(d[n][3])
#define DSC_WG_DS                                                                                  \
    DSC_WG_D(0), DSC_WG_D(1), DSC_WG_D(2), DSC_WG_D(3), DSC_WG_D(4), DSC_WG_D(5), DSC_WG_D(6),     \
        DSC_WG_D(7)
#define DSC_WG_REGS                                                                                \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                      \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
template <bool F16, int TB>
__device__ static inline void wg_mma_rs(float d[8][4], const uint32_t a[4], uint64_t desc,
                                        int accumulate) {
#define DSC_WG_BODY(TY)                                                                            \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"                                                   \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " DSC_WG_REGS                        \
    "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
    if (F16)
        asm volatile(DSC_WG_BODY("f16")
                     : DSC_WG_DS
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TB),
                       "r"(accumulate));
    else
        asm volatile(DSC_WG_BODY("bf16")
                     : DSC_WG_DS
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "n"(TB),
                       "r"(accumulate));
#undef DSC_WG_BODY
}

// The same with A (the warpgroup's 64 rows) read from shared memory too, K-major.
template <bool F16>
__device__ static inline void wg_mma_ss(float d[8][4], uint64_t adesc, uint64_t bdesc,
                                        int accumulate) {
#define DSC_WG_BODY(TY)                                                                            \
    "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                   \
    "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " DSC_WG_REGS                        \
    "%32, %33, p, 1, 1, 0, 0;\n}\n"
    if (F16)
        asm volatile(DSC_WG_BODY("f16") : DSC_WG_DS : "l"(adesc), "l"(bdesc), "r"(accumulate));
    else
        asm volatile(DSC_WG_BODY("bf16") : DSC_WG_DS : "l"(adesc), "l"(bdesc), "r"(accumulate));
#undef DSC_WG_BODY
}
#undef DSC_WG_REGS
#undef DSC_WG_DS
#undef DSC_WG_D
#endif // DSC_ATT_WGMMA

// ---- mma.sync products (other targets) ----

// acc (16 x 64) = A (16 x 64, fragments) times B^T, B a shared tile of 64 rows x 64 (row n of B
// is column n of the product).
template <bool F16>
__device__ static inline void rows_bt_mma(float acc[8][4], const uint32_t a[4][4],
                                          const uint16_t *tile, bool zero = true) {
    int lane = threadIdx.x & 31;
    if (zero)
        for (int n = 0; n < 8; n++)
            acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int n = 0; n < 8; n++) {
        for (int h = 0; h < 2; h++) {
            uint32_t b[4];
            ldsm4(b, tile + swz(n * 8 + (lane & 7), h * 4 + (lane >> 3)));
            mma<F16>(acc[n], a[2 * h], b[0], b[1]);
            mma<F16>(acc[n], a[2 * h + 1], b[2], b[3]);
        }
    }
}

// out (16 x 64) += P (16 x 64, packed: a[kc] is columns 16 kc .. 16 kc + 15, pack_acc's layout)
// times a shared tile of 64 rows x 64 (row k of the tile is row k of the right operand).
template <bool F16>
__device__ static inline void packed_times_mma(float out[8][4], const uint32_t a[4][4],
                                               const uint16_t *tile) {
    int lane = threadIdx.x & 31, r = (lane & 7) + ((lane >> 3) & 1) * 8;
    for (int kc = 0; kc < 4; kc++) {
        for (int d = 0; d < 4; d++) {
            uint32_t b[4];
            ldsm4_t(b, tile + swz(kc * 16 + r, 2 * d + (lane >> 4)));
            mma<F16>(out[2 * d], a[kc], b[0], b[1]);
            mma<F16>(out[2 * d + 1], a[kc], b[2], b[3]);
        }
    }
}

// ---- the products the kernels call ----
//
// bt and times start a product; with wgmma it runs asynchronously: prod_begin() comes before a
// batch of them (after the registers they use were written), prod_commit() closes a group, and
// prod_wait<N>() returns once at most N of the committed groups are unfinished (groups finish in
// order); pin() then keeps the compiler from using an accumulator early. With mma.sync every
// product is complete when it returns and the rest do nothing. DSC_ATT_WG (default 1) set to 0
// builds the mma.sync products on sm_90a too, which is how that path is tested on Hopper.
#ifndef DSC_ATT_WG
#define DSC_ATT_WG 1
#endif
#if DSC_ATT_WGMMA && DSC_ATT_WG
#define DSC_ATT_ASYNC 1
#else
#define DSC_ATT_ASYNC 0
#endif

__device__ static inline void prod_begin() {
#if DSC_ATT_ASYNC
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ static inline void prod_commit() {
#if DSC_ATT_ASYNC
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ static inline void prod_wait() {
#if DSC_ATT_ASYNC
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
__device__ static inline void pin(float d[8][4]) {
#if DSC_ATT_ASYNC
    for (int n = 0; n < 8; n++)
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(d[n][e])::"memory");
#else
    (void)d;
#endif
}

// acc (this warp's 16 x 64) = rows 16 warp .. 16 warp + 15 of the shared tile A (64 x 64) times
// B^T, B a shared tile of 64 rows x 64 (row n of B is column n of the product): Q K^T, dO V^T,
// K Q^T, V dO^T. With wgmma both operands are read from shared memory (a k-step is 32 bytes
// along the rows).
// With NP > 1 the rows are NP 64-column panels (NP tiles one after the other, head size 64 NP),
// summed over.
template <bool F16, int NP = 1>
__device__ static inline void bt(float acc[8][4], const uint16_t *tileA, const uint16_t *tileB) {
#if DSC_ATT_ASYNC
    for (int p = 0; p < NP; p++) {
        uint64_t da = wg_desc(tileA + p * MMA_TILE_ELEMS), db = wg_desc(tileB + p * MMA_TILE_ELEMS);
        for (int k = 0; k < 4; k++)
            wg_mma_ss<F16>(acc, da + 2 * k, db + 2 * k, p > 0 || k > 0);
    }
#else
    for (int p = 0; p < NP; p++) {
        uint32_t af[4][4];
        load_a_rows(af, tileA + p * MMA_TILE_ELEMS, (threadIdx.x >> 5) * 16);
        rows_bt_mma<F16>(acc, af, tileB + p * MMA_TILE_ELEMS, p == 0);
    }
#endif
}

// out (16 x 64) += P (16 x 64, packed: a[kc] is columns 16 kc .. 16 kc + 15, pack_acc's layout)
// times a shared tile of 64 rows x 64 (row k of the tile is row k of the right operand): P V,
// P^T dO, dS^T Q, dS K. With wgmma a k-step is 16 rows, 2048 bytes, and a must stay unchanged
// until the product is waited for.
template <bool F16>
__device__ static inline void times(float out[8][4], const uint32_t a[4][4], const uint16_t *tile) {
#if DSC_ATT_ASYNC
    uint64_t db = wg_desc(tile);
    for (int kc = 0; kc < 4; kc++)
        wg_mma_rs<F16, 1>(out, a[kc], db + 128 * kc, 1);
#else
    packed_times_mma<F16>(out, a, tile);
#endif
}

// A 16 x 64 accumulator as four A fragments of 16-bit pairs.
template <bool F16> __device__ static inline void pack_acc(uint32_t a[4][4], const float p[8][4]) {
    for (int kc = 0; kc < 4; kc++) {
        a[kc][0] = pack2<F16>(p[2 * kc][0], p[2 * kc][1]);
        a[kc][1] = pack2<F16>(p[2 * kc][2], p[2 * kc][3]);
        a[kc][2] = pack2<F16>(p[2 * kc + 1][0], p[2 * kc + 1][1]);
        a[kc][3] = pack2<F16>(p[2 * kc + 1][2], p[2 * kc + 1][3]);
    }
}

// The low (hi false) or high 16-bit value of a packed pair as a float.
template <bool F16> __device__ static inline float unpack1(uint32_t v, bool hi) {
    uint16_t h = (uint16_t)(hi ? v >> 16 : v & 0xffffu);
    if (F16) return __half2float(__ushort_as_half(h));
    return __uint_as_float((uint32_t)h << 16);
}

// Rows row0 (values [0..1] of each slice) and row0 + 8 ([2..3]) of a 16 x 64
// accumulator, times scale, as 16-bit pairs into global rows of stride gld
// (rows at or past T skipped).
template <bool F16>
__device__ static inline void store_acc(uint16_t *g, size_t gld, const float acc[8][4], float s0,
                                        float s1, int row0, int T) {
    int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    for (int half = 0; half < 2; half++) {
        int r = row0 + gi + 8 * half;
        if (r >= T) continue;
        float s = half ? s1 : s0;
        uint16_t *row = g + (size_t)r * gld + 2 * t;
        for (int n = 0; n < 8; n++)
            *(uint32_t *)(row + n * 8) = pack2<F16>(acc[n][2 * half] * s, acc[n][2 * half + 1] * s);
    }
}

// store_acc, and the column sums of the 16-bit values it stored, over the block's 64 rows (its
// four warps' 16 each), into part (64 floats): each lane adds its two rows, the eight lanes that
// share columns add in a fixed tree, then thread c adds the four warps' sums in order (through
// red, 256 floats of shared memory no longer in use). Deterministic. Every thread of the block
// must call it.
template <bool F16>
__device__ static inline void store_acc_colsum(uint16_t *g, size_t gld, const float acc[8][4],
                                               float s0, float s1, int row0, int T, float *red,
                                               float *part) {
    int lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3, warp = threadIdx.x >> 5;
    float cs[8][2];
    for (int n = 0; n < 8; n++)
        cs[n][0] = cs[n][1] = 0.0f;
    for (int half = 0; half < 2; half++) {
        int r = row0 + gi + 8 * half;
        if (r >= T) continue;
        float s = half ? s1 : s0;
        uint16_t *row = g + (size_t)r * gld + 2 * t;
        for (int n = 0; n < 8; n++) {
            uint32_t p = pack2<F16>(acc[n][2 * half] * s, acc[n][2 * half + 1] * s);
            *(uint32_t *)(row + n * 8) = p;
            cs[n][0] += unpack1<F16>(p, false);
            cs[n][1] += unpack1<F16>(p, true);
        }
    }
    for (int n = 0; n < 8; n++)
        for (int j = 0; j < 2; j++) {
            float v = cs[n][j];
            v += __shfl_xor_sync(0xffffffffu, v, 4);
            v += __shfl_xor_sync(0xffffffffu, v, 8);
            v += __shfl_xor_sync(0xffffffffu, v, 16);
            if (gi == 0) red[warp * 64 + n * 8 + 2 * t + j] = v;
        }
    __syncthreads();
    if (threadIdx.x < 64)
        part[threadIdx.x] = red[threadIdx.x] + red[64 + threadIdx.x] + red[128 + threadIdx.x] +
                            red[192 + threadIdx.x];
    __syncthreads(); // red may be written again by a next call
}

// ---- where a head's operands lie ----
//
// A qkv row holds q (NH heads of HS = 64 NP values), then k and v (NKV heads each):
// (NH + 2 NKV) HS values, and query head h reads kv head h / (NH / NKV). GQA false is GPT-2's
// layout (NKV = NH, rows of 3C, HS 64), with the group of one query head per kv head known at
// compile time. A head's 64 NP columns are held as NP shared tiles of 64 columns (panels): the
// score products sum over them, and each output accumulator is NP register tiles.
template <bool GQA> __device__ static inline int kv_head(int h, int NH, int NKV) {
    return GQA ? h / (NH / NKV) : h;
}

template <bool GQA, int NP> struct head_cols {
    size_t C;  // q values of a row: NH HS (also the rows of out and dout)
    size_t ld; // values of a qkv row
    size_t k;  // first column of kv head hk's k
    size_t kv; // from a kv head's k to its v: NKV HS
    __device__ head_cols(int NH, int NKV, int hk) {
        C = (size_t)NH * 64 * NP;
        kv = GQA ? (size_t)NKV * 64 * NP : C;
        ld = C + 2 * kv;
        k = C + (size_t)hk * 64 * NP;
    }
};

// Blocks per multiprocessor: the head size 64 counts above; with 128 two (shared memory).
#define MMA_BLOCKS(np, n) ((np) == 1 ? (n) : 2)

// ---- forward ----

#define MMA_FWD_SMEM(np) (5 * (np) * MMA_TILE_ELEMS * 2 + MMA_SMEM_ALIGN)

template <bool F16, bool GQA, int NP>
__global__ void __launch_bounds__(128, MMA_BLOCKS(NP, DSC_ATT_FWD_BLOCKS))
    fwd_kernel(uint16_t *out, float *lse, const uint16_t *qkv, int T, int NH, int NKV,
               float scale_log2) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int TE = NP * MMA_TILE_ELEMS, HS = 64 * NP; // one 64 x HS tile
    uint16_t *sQ = aligned_smem(smem_raw);
    uint16_t *sK = sQ + TE, *sV = sQ + 3 * TE; // two buffers each

    int nt = (T + 63) / 64, qt = nt - 1 - blockIdx.x; // longest rows first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    head_cols<GQA, NP> hc(NH, NKV, kv_head<GQA>(h, NH, NKV));
    size_t C = hc.C, C3 = hc.ld;
    const uint16_t *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const uint16_t *kbase = qkv + (size_t)b * T * C3 + hc.k, *vbase = kbase + hc.kv;
    int q0 = qt * 64, row0 = q0 + warp * 16 + gi, row1 = row0 + 8;

    panels_async<NP>(sQ, base + (size_t)q0 * C3, C3, min(64, T - q0));
    panels_async<NP>(sK, kbase, C3, min(64, T));
    panels_async<NP>(sV, vbase, C3, min(64, T));
    cp_commit();

    float o[NP][8][4], s[8][4];
    for (int p = 0; p < NP; p++)
        for (int n = 0; n < 8; n++)
            o[p][n][0] = o[p][n][1] = o[p][n][2] = o[p][n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        int cur = kt & 1, k0 = kt * 64;
        if (kt < qt) {
            int nk = k0 + 64;
            panels_async<NP>(sK + (cur ^ 1) * TE, kbase + (size_t)nk * C3, C3, min(64, T - nk));
            panels_async<NP>(sV + (cur ^ 1) * TE, vbase + (size_t)nk * C3, C3, min(64, T - nk));
        }
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        prod_begin();
        bt<F16, NP>(s, sQ, sK + cur * TE);
        prod_commit();
        prod_wait<0>();
        pin(s);
        if (kt == qt) // the diagonal tile: keys past the row are masked
            for (int n = 0; n < 8; n++)
                for (int e = 0; e < 4; e++)
                    if (k0 + n * 8 + 2 * t + (e & 1) > (e < 2 ? row0 : row1)) s[n][e] = -INFINITY;
        float mx0 = -INFINITY, mx1 = -INFINITY;
        for (int n = 0; n < 8; n++) {
            mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
            mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
        }
        for (int x = 1; x < 4; x <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
        }
        // Finite: key 0 is visible to every row, and each later tile either shows a
        // row some key or lies wholly below its diagonal. Scores are scaled inside the
        // exponent (scale_log2 > 0, so the maximum of the scaled scores is the scaled maximum).
        float mn0 = fmaxf(m0, mx0 * scale_log2), mn1 = fmaxf(m1, mx1 * scale_log2);
        float a0 = ex2(m0 - mn0), a1 = ex2(m1 - mn1), ls0 = 0.0f, ls1 = 0.0f;
        for (int n = 0; n < 8; n++) {
            s[n][0] = ex2(fmaf(s[n][0], scale_log2, -mn0));
            s[n][1] = ex2(fmaf(s[n][1], scale_log2, -mn0));
            s[n][2] = ex2(fmaf(s[n][2], scale_log2, -mn1));
            s[n][3] = ex2(fmaf(s[n][3], scale_log2, -mn1));
            ls0 += s[n][0] + s[n][1];
            ls1 += s[n][2] + s[n][3];
            for (int p = 0; p < NP; p++)
                o[p][n][0] *= a0, o[p][n][1] *= a0, o[p][n][2] *= a1, o[p][n][3] *= a1;
        }
        l0 = l0 * a0 + ls0,
        l1 = l1 * a1 + ls1; // this lane's columns; summed over the quad below
        m0 = mn0, m1 = mn1;
        {
            uint32_t pa[4][4];
            pack_acc<F16>(pa, s);
            for (int p = 0; p < NP; p++)
                pin(o[p]);
            prod_begin();
            for (int p = 0; p < NP; p++)
                times<F16>(o[p], pa, sV + cur * TE + p * MMA_TILE_ELEMS);
            prod_commit();
            prod_wait<0>();
            for (int p = 0; p < NP; p++)
                pin(o[p]);
        }
        __syncthreads(); // every warp is done with this buffer before it is
                         // refilled
    }
    cp_wait_all();
    for (int x = 1; x < 4; x <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, x);
        l1 += __shfl_xor_sync(0xffffffffu, l1, x);
    }
    for (int p = 0; p < NP; p++)
        store_acc<F16>(out + (size_t)b * T * C + (size_t)h * HS + p * 64, C, o[p], 1.0f / l0,
                       1.0f / l1, q0 + warp * 16, T);
    if (t == 0) {
        const float ln2 = 0.6931471805599453f;
        if (row0 < T) lse[(size_t)bh * T + row0] = (m0 + log2f(l0)) * ln2;
        if (row1 < T) lse[(size_t)bh * T + row1] = (m1 + log2f(l1)) * ln2;
    }
}

// ---- backward ----

// dK, dV of one 64-key tile (a warp: 16 keys), looping over the query tiles
// that see it: S^T = K Q^T, P^T (packed to 16 bits at once), dV += P^T dO; then
// dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q. K and V stay in shared
// memory and P^T is held packed, so that three blocks fit on a multiprocessor (166 registers
// with wgmma) instead of two. dS is formed from the 16-bit P that the dV product also uses.
// With grouped-query attention the block's key tile belongs to one kv head, and the loop runs
// over each of its query heads in turn, adding into the same registers.
#define MMA_DKDV_SMEM(np) (6 * (np) * MMA_TILE_ELEMS * 2 + 4 * 64 * 4 + MMA_SMEM_ALIGN)

template <bool F16, bool GQA, int NP>
__global__ void __launch_bounds__(128, MMA_BLOCKS(NP, DSC_ATT_DKDV_BLOCKS))
    dkdv_kernel(uint16_t *dqkv, const uint16_t *qkv, const uint16_t *dout, const float *lse,
                const float *Dv, int T, int NH, int NKV, float scale_log2, float sm_scale,
                float *bpart) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int TE = NP * MMA_TILE_ELEMS, HS = 64 * NP; // one 64 x HS tile
    uint16_t *sK = aligned_smem(smem_raw), *sV = sK + TE;
    uint16_t *sQ = sK + 2 * TE, *sdO = sK + 4 * TE; // two buffers each
    float *sL = (float *)(sK + 6 * TE),
          *sD = sL + 128; // two rows of 64 each

    if (!GQA) NKV = NH;
    int nt = (T + 63) / 64, kt = blockIdx.x; // most query tiles first
    int bh = blockIdx.y, b = bh / NKV, h = bh % NKV; // h: the kv head
    int G = GQA ? NH / NKV : 1, h0 = h * G;          // its query heads h0 .. h0 + G - 1
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    head_cols<GQA, NP> hc(NH, NKV, h);
    size_t C = hc.C, C3 = hc.ld;
    const uint16_t *base = qkv + (size_t)b * T * C3 + (size_t)h0 * HS; // query head h0's q
    const uint16_t *kbase = qkv + (size_t)b * T * C3 + hc.k, *vbase = kbase + hc.kv;
    const uint16_t *dbase = dout + (size_t)b * T * C + (size_t)h0 * HS;
    const float *L = lse + ((size_t)b * NH + h0) * T, *D = Dv + ((size_t)b * NH + h0) * T;
    int k0 = kt * 64, key0 = k0 + warp * 16 + gi, key1 = key0 + 8;

    panels_async<NP>(sK, kbase + (size_t)k0 * C3, C3, min(64, T - k0));
    panels_async<NP>(sV, vbase + (size_t)k0 * C3, C3, min(64, T - k0));
    panels_async<NP>(sQ, base + (size_t)k0 * C3, C3, min(64, T - k0));
    panels_async<NP>(sdO, dbase + (size_t)k0 * C, C, min(64, T - k0));
    stats_async(sL, L + k0, T - k0);
    stats_async(sD, D + k0, T - k0);
    cp_commit();

    float dk[NP][8][4], dv[NP][8][4], s[8][4];
    for (int p = 0; p < NP; p++)
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++)
                dk[p][n][e] = dv[p][n][e] = 0.0f;
    const float log2e = 1.4426950408889634f;

    // Step i is query head h0 + i / nq's query tile kt + i % nq: the group's heads in order, each
    // over the query tiles that see this key tile, with the next step's tiles loading meanwhile.
    int nq = nt - kt;
    for (int i = 0; i < G * nq; i++) {
        int cur = i & 1, qt = kt + (GQA ? i % nq : i), q0 = qt * 64;
        if (i + 1 < G * nq) {
            int ng = GQA ? (i + 1) / nq : 0, nq0 = (kt + (GQA ? (i + 1) % nq : i + 1)) * 64;
            size_t hq = (size_t)ng * HS, hs = (size_t)ng * T;
            panels_async<NP>(sQ + (cur ^ 1) * TE, base + hq + (size_t)nq0 * C3, C3,
                             min(64, T - nq0));
            panels_async<NP>(sdO + (cur ^ 1) * TE, dbase + hq + (size_t)nq0 * C, C,
                             min(64, T - nq0));
            stats_async(sL + (cur ^ 1) * 64, L + hs + nq0, T - nq0);
            stats_async(sD + (cur ^ 1) * 64, D + hs + nq0, T - nq0);
        }
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        const uint16_t *tQ = sQ + cur * TE, *tdO = sdO + cur * TE;
        const float *tL = sL + cur * 64, *tD = sD + cur * 64;
        // S^T and dP^T start together; P^T is formed while dP^T is still being multiplied, and
        // dV's product runs while dS^T is formed.
        float dp[8][4];
        pin(s);
        pin(dp);
        prod_begin();
        bt<F16, NP>(s, sK, tQ); // S^T = K Q^T
        prod_commit();
        bt<F16, NP>(dp, sV, tdO); // dP^T = V dO^T
        prod_commit();
        prod_wait<1>();
        pin(s);
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++)
                s[n][e] = ex2(fmaf(s[n][e], scale_log2, -tL[n * 8 + 2 * t + (e & 1)] * log2e));
        if (q0 < k0 + 64 || q0 + 64 > T) // a tile with masked columns
            for (int n = 0; n < 8; n++)
                for (int e = 0; e < 4; e++) {
                    int q = q0 + n * 8 + 2 * t + (e & 1), key = e < 2 ? key0 : key1;
                    if (!(key <= q && q < T)) s[n][e] = 0.0f;
                }
        uint32_t pf[4][4], df[4][4]; // P^T and dS^T, packed
        pack_acc<F16>(pf, s);
        for (int p = 0; p < NP; p++)
            pin(dv[p]);
        prod_begin();
        for (int p = 0; p < NP; p++)
            times<F16>(dv[p], pf, tdO + p * MMA_TILE_ELEMS); // dV += P^T dO
        prod_commit();
        prod_wait<1>();
        pin(dp);
        for (int kc = 0; kc < 4; kc++) {
            for (int j = 0; j < 2; j++) {
                int n = 2 * kc + j;
                for (int e = 0; e < 4; e++) {
                    int c = n * 8 + 2 * t + (e & 1);
                    float p = unpack1<F16>(pf[kc][2 * j + (e >> 1)], e & 1);
                    dp[n][e] = p * (dp[n][e] - tD[c]);
                }
            }
        }
        pack_acc<F16>(df, dp);
        for (int p = 0; p < NP; p++)
            pin(dk[p]);
        prod_begin();
        for (int p = 0; p < NP; p++)
            times<F16>(dk[p], df, tQ + p * MMA_TILE_ELEMS); // dK += dS^T Q
        prod_commit();
        prod_wait<0>();
        for (int p = 0; p < NP; p++) {
            pin(dv[p]);
            pin(dk[p]);
        }
        __syncthreads();
    }
    cp_wait_all();
    uint16_t *g = dqkv + (size_t)b * T * C3 + (size_t)h * HS;
    if (GQA || !bpart) { // the bias column sums are GPT-2's only
        uint16_t *gk = dqkv + (size_t)b * T * C3 + hc.k;
        for (int p = 0; p < NP; p++) {
            store_acc<F16>(gk + p * 64, C3, dk[p], sm_scale, sm_scale, k0 + warp * 16, T);
            store_acc<F16>(gk + hc.kv + p * 64, C3, dv[p], 1.0f, 1.0f, k0 + warp * 16, T);
        }
        return;
    }
    __syncthreads(); // every warp is past its last read of the tiles: red reuses them
    float *part = bpart + ((size_t)b * nt + kt) * C3 + (size_t)h * 64;
    store_acc_colsum<F16>(g + C, C3, dk[0], sm_scale, sm_scale, k0 + warp * 16, T, (float *)sK,
                          part + C);
    store_acc_colsum<F16>(g + 2 * C, C3, dv[0], 1.0f, 1.0f, k0 + warp * 16, T, (float *)sK,
                          part + 2 * C);
}

// dQ of one 64-query tile, looping over the key tiles it sees: S = Q K^T, dP =
// dO V^T, dS = P (dP - D), dQ += dS K. Q and dO stay in shared memory.
#define MMA_DQ_SMEM(np) (6 * (np) * MMA_TILE_ELEMS * 2 + MMA_SMEM_ALIGN)

template <bool F16, bool GQA, int NP>
__global__ void __launch_bounds__(128, MMA_BLOCKS(NP, DSC_ATT_DQ_BLOCKS))
    dq_kernel(uint16_t *dqkv, const uint16_t *qkv, const uint16_t *dout, const float *lse,
              const float *Dv, int T, int NH, int NKV, float scale_log2, float sm_scale,
              float *bpart) {
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const int TE = NP * MMA_TILE_ELEMS, HS = 64 * NP; // one 64 x HS tile
    uint16_t *sQ = aligned_smem(smem_raw), *sdO = sQ + TE;
    uint16_t *sK = sQ + 2 * TE, *sV = sQ + 4 * TE; // two buffers each

    int nt = (T + 63) / 64, qt = nt - 1 - blockIdx.x; // most key tiles first
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gi = lane >> 2, t = lane & 3;
    head_cols<GQA, NP> hc(NH, NKV, kv_head<GQA>(h, NH, NKV));
    size_t C = hc.C, C3 = hc.ld;
    const uint16_t *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const uint16_t *kbase = qkv + (size_t)b * T * C3 + hc.k, *vbase = kbase + hc.kv;
    int q0 = qt * 64, row0 = q0 + warp * 16 + gi, row1 = row0 + 8;

    panels_async<NP>(sQ, base + (size_t)q0 * C3, C3, min(64, T - q0));
    panels_async<NP>(sdO, dout + ((size_t)b * T + q0) * C + (size_t)h * HS, C, min(64, T - q0));
    panels_async<NP>(sK, kbase, C3, min(64, T));
    panels_async<NP>(sV, vbase, C3, min(64, T));
    cp_commit();

    const float log2e = 1.4426950408889634f;
    const float *L = lse + (size_t)bh * T, *D = Dv + (size_t)bh * T;
    float L0 = row0 < T ? L[row0] * log2e : 0.0f, L1 = row1 < T ? L[row1] * log2e : 0.0f;
    float D0 = row0 < T ? D[row0] : 0.0f, D1 = row1 < T ? D[row1] : 0.0f;

    float dq[NP][8][4], s[8][4], dp[8][4];
    for (int p = 0; p < NP; p++)
        for (int n = 0; n < 8; n++)
            dq[p][n][0] = dq[p][n][1] = dq[p][n][2] = dq[p][n][3] = 0.0f;

    for (int kt = 0; kt <= qt; kt++) {
        int cur = kt & 1, k0 = kt * 64;
        if (kt < qt) {
            int nk = k0 + 64;
            panels_async<NP>(sK + (cur ^ 1) * TE, kbase + (size_t)nk * C3, C3, min(64, T - nk));
            panels_async<NP>(sV + (cur ^ 1) * TE, vbase + (size_t)nk * C3, C3, min(64, T - nk));
        }
        cp_commit();
        cp_wait_prev();
        __syncthreads();
        pin(s);
        pin(dp);
        prod_begin();
        bt<F16, NP>(s, sQ, sK + cur * TE); // S = Q K^T
        prod_commit();
        bt<F16, NP>(dp, sdO, sV + cur * TE); // dP = dO V^T
        prod_commit();
        prod_wait<1>(); // P while dP is still being multiplied
        pin(s);
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++)
                s[n][e] = ex2(fmaf(s[n][e], scale_log2, -(e < 2 ? L0 : L1)));
        if (kt == qt) // the only tile with masked keys (rows past T give zeros below)
            for (int n = 0; n < 8; n++)
                for (int e = 0; e < 4; e++)
                    if (k0 + n * 8 + 2 * t + (e & 1) > (e < 2 ? row0 : row1)) s[n][e] = 0.0f;
        prod_wait<0>();
        pin(dp);
        for (int n = 0; n < 8; n++)
            for (int e = 0; e < 4; e++)
                dp[n][e] = s[n][e] * (dp[n][e] - (e < 2 ? D0 : D1));
        {
            uint32_t df[4][4];
            pack_acc<F16>(df, dp);
            for (int p = 0; p < NP; p++)
                pin(dq[p]);
            prod_begin();
            for (int p = 0; p < NP; p++)
                times<F16>(dq[p], df, sK + cur * TE + p * MMA_TILE_ELEMS); // dQ += dS K
            prod_commit();
            prod_wait<0>();
            for (int p = 0; p < NP; p++)
                pin(dq[p]);
        }
        __syncthreads();
    }
    cp_wait_all();
    uint16_t *g = dqkv + (size_t)b * T * C3 + (size_t)h * HS;
    if (GQA || !bpart) {
        for (int p = 0; p < NP; p++)
            store_acc<F16>(g + p * 64, C3, dq[p], sm_scale, sm_scale, q0 + warp * 16, T);
        return;
    }
    __syncthreads(); // every warp is past its last read of the tiles: red reuses them
    store_acc_colsum<F16>(g, C3, dq[0], sm_scale, sm_scale, q0 + warp * 16, T, (float *)sQ,
                          bpart + ((size_t)b * nt + qt) * C3 + (size_t)h * 64);
}

} // namespace dsc_att

#endif
