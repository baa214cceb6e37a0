// cuda/kernels.cu - the GPU kernels that every model and the trainer share (see kernels.h for the
// contracts): conversions, the token sort, column sums, softmax + cross-entropy, sums.
#include "cuda/kernels.h"

#include "cuda/common.cuh" // DSC_CUDA_TRY, dsc_unpack8_16, dsc_block_sum, ...

// Threads per block of each family; all multiples of 64 so that AMD wavefronts divide them.
#define ELEM_THREADS 256 // elementwise passes
#define COLSUM_THREADS 256
#define COLSUM_ROWS 256  // rows per partial column sum
#define XENT_THREADS 512 // one block per row of logits
#define SUM_THREADS 1024 // dsc__cuda_sum: one block
#define ENC_CHUNK 1024   // positions per block of the token sort (enc_: the embeddings' backward)
#define ENC_THREADS 256

static cudaStream_t as_stream(void *s) { return (cudaStream_t)s; }

// ---- conversions ----

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

// ---- token sort ----

// A stable counting sort of positions by token (dsc__cuda_token_sort), in four steps.

// Step 1: each position's rank among the earlier positions of its chunk that hold the
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

// ---- token embeddings (every family) ----

// The embedding passes move rows as 16-byte vectors: C a positive multiple of 8, rows aligned.
static dsc_status embed_check(const char *what, int C, int64_t N, const void *a, const void *b) {
    DSC_CUDA_ARG(C > 0 && C % 8 == 0, "%s: C = %d must be a positive multiple of 8", what, C);
    DSC_CUDA_ARG(N > 0, "%s: N = %lld rows; it must be positive", what, (long long)N);
    DSC_CUDA_ARG(dsc__aligned16(a) && dsc__aligned16(b),
                 "%s: tensors must be 16-byte aligned (whole rows of cudaMalloc'd buffers)", what);
    return DSC_OK;
}

// One thread per 8 channels of one position: a copy of the bits, whatever the 16-bit type.
__global__ void embed_fwd_kernel(uint4 *out, const int32_t *inp, const uint4 *emb, long long N,
                                 int C8) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N * C8) return;
    out[i] = emb[(size_t)inp[i / C8] * C8 + (int)(i % C8)];
}

extern "C" dsc_status dsc__cuda_embed_forward_h(uint16_t *out, const int32_t *inp,
                                                const uint16_t *emb, int64_t N, int C, bool fp16,
                                                void *stream) {
    (void)fp16; // rows are copied bit for bit
    DSC_TRY(embed_check("embedding forward", C, N, out, emb));
    DSC_CUDA_ARG(out && inp && emb, "embedding forward: NULL tensor");
    long long n = (long long)N * (C / 8);
    embed_fwd_kernel<<<dsc__blocks(n, ELEM_THREADS), ELEM_THREADS, 0, as_stream(stream)>>>(
        (uint4 *)out, inp, (const uint4 *)emb, N, C / 8);
    DSC_CUDA_LAUNCHED("embed_fwd_kernel");
    return DSC_OK;
}

// The first thread of each token's run (positions sorted by token) sums the run's rows (8
// channels) in position order and adds them to (add) or writes them over (!add) the token's row
// of demb: one writer per (token, channel group), hence no atomics; rows of tokens absent from
// the batch have no run and are not touched.
template <bool F16>
__global__ void embed_grad_kernel(float *demb, const uint4 *dout, const int *sorted,
                                  const int32_t *inp, int N, int C8, bool add) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long long)N * C8) return;
    int i = (int)(idx / C8), c8 = (int)(idx % C8);
    int v = inp[sorted[i]];
    if (i > 0 && inp[sorted[i - 1]] == v) return;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, x[8];
    for (int j = i; j < N; j++) {
        int p = sorted[j];
        if (inp[p] != v) break;
        dsc_unpack8_16<F16>(dout[(size_t)p * C8 + c8], x);
#pragma unroll
        for (int k = 0; k < 8; k++)
            acc[k] += x[k];
    }
    float4 *g = (float4 *)(demb + ((size_t)v * C8 + c8) * 8);
    if (add) {
        float4 g0 = g[0], g1 = g[1];
        acc[0] += g0.x, acc[1] += g0.y, acc[2] += g0.z, acc[3] += g0.w;
        acc[4] += g1.x, acc[5] += g1.y, acc[6] += g1.z, acc[7] += g1.w;
    }
    g[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    g[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
}

extern "C" size_t dsc__cuda_embed_backward_scratch(int64_t N, int V) {
    return dsc__cuda_token_sort_scratch(N, V);
}

extern "C" dsc_status dsc__cuda_embed_backward_h(float *demb, void *scratch, const uint16_t *dout,
                                                 const int32_t *inp, int64_t N, int C, int V,
                                                 bool add, bool fp16, void *stream) {
    DSC_TRY(embed_check("embedding backward", C, N, demb, dout));
    DSC_CUDA_ARG(demb && scratch && dout && inp && V > 0 && N < (1ll << 31),
                 "embedding backward: bad arguments (N %lld, V %d)", (long long)N, V);
    int *sorted = NULL, C8 = C / 8;
    DSC_TRY(dsc__cuda_token_sort(&sorted, scratch, inp, N, V, stream));
    unsigned blocks = dsc__blocks(N * C8, ELEM_THREADS);
    cudaStream_t st = as_stream(stream);
    const uint4 *d = (const uint4 *)dout;
    if (fp16)
        embed_grad_kernel<true>
            <<<blocks, ELEM_THREADS, 0, st>>>(demb, d, sorted, inp, (int)N, C8, add);
    else
        embed_grad_kernel<false>
            <<<blocks, ELEM_THREADS, 0, st>>>(demb, d, sorted, inp, (int)N, C8, add);
    DSC_CUDA_LAUNCHED("embed_grad_kernel");
    return DSC_OK;
}

// ---- column sums (bias gradients) ----

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

extern "C" dsc_status dsc__cuda_reduce_columns_split(float *const *dest, int ndest, int width,
                                                     const float *part, int nchunks, bool add,
                                                     void *stream) {
    DSC_CUDA_ARG(dest && ndest >= 1 && ndest <= 3 && width > 0 && part && nchunks > 0,
                 "reduce columns: bad arguments");
    red_dests d = {{dest[0], ndest > 1 ? dest[1] : NULL, ndest > 2 ? dest[2] : NULL}, add};
    reduce_partials_to(d, width, part, nchunks, (size_t)ndest * width, ndest * width,
                       as_stream(stream));
    DSC_CUDA_LAUNCHED("reduce_partials_kernel");
    return DSC_OK;
}

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
