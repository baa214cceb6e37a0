// model/gpt2/gpt2_decode.cu - GPT-2 prefill and KV-cached decode steps on one GPU (see
// gpt2_decode.h).
//
// Cache layout, per layer: keys then values, each (batch, n_head, max_len, 64) bf16, so that the
// positions of one (row, head) are contiguous 128-byte rows that a step's attention streams.
// A step's rows live in one slab of `batch` rows (x, ln, qkv, att, fc pre-activation, GELU, fp32
// statistics and logits, the token/position inputs and the chosen tokens); the prefill has its
// own slab of n x T rows, made at the first prefill and grown when needed.
#include "model/gpt2/gpt2_decode.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, malloc

#include "base/env.h" // dsc__env (a C header with its own extern "C")
#include "dsc/half.h" // dsc_fp32_to_bf16_n

#include "cuda/attention.h"          // dsc__cuda_attention_forward
#include "cuda/common.cuh"           // DSC_CUDA_TRY, dsc_unpack8, dsc_block_sum, ...
#include "cuda/decode_common.h"      // dsc__cuda_decode_argmax, dsc__cuda_decode_*_read, ...
#include "cuda/devbuf.h"             // dsc__cuda_buf_*
#include "cuda/device_model.h"       // dsc__cuda_table_check
#include "model/gpt2/gpt2_cuda.h"    // dsc__gpt2_device_ops (recompute mode)
#include "model/gpt2/gpt2_kernels.h" // dsc__cuda_layernorm_forward, dsc__cuda_encoder_forward
#include "cuda/matmul.h"             // dsc__cuda_mm_forward

#define HS 64            // head size the kernels take
#define ATT_THREADS 256  // decode attention: threads per (row, head); a multiple of 64
#define ATT_GROUP 8      // lanes per key row: 8 x 8 bf16 = 64 channels, one 16-byte load each
#define ATT_UNROLL 4     // key rows per lane group and iteration (loads in flight)
#define ELEM_THREADS 256 // gathers, embeddings, cache stores

// The twelve tensors of a layer, in table order (as model/gpt2/gpt2.c).
// clang-format off
enum {
    K_LN1W, K_LN1B, K_ATTW, K_ATTB, K_APROJW, K_APROJB,
    K_LN2W, K_LN2B, K_FCW, K_FCB, K_MPROJW, K_MPROJB, PER_LAYER
};
// clang-format on

typedef struct rows_bufs { // activations of R rows
    uint16_t *x, *ln, *qkv, *att, *fch, *fcg; // (R, C / C / 3C / C / 4C / 4C)
    float *mean, *rstd;                       // (R)
} rows_bufs;

struct dsc_gpt2_decode {
    dsc_gpt2_config c;
    int B, max_len, Vp, nt;
    int n;         // rows of the last prefill or step; 0 before the first
    bool recompute, use_graph, own_stream;
    bool unfused_gelu; // the BLAS had no GELU epilogue for a product: separate GELU kernel
    cudaStream_t st;
    dsc_mem_pool *pool;
    dsc_cuda_blas *blas;
    dsc_cuda_buf kv;   // (L, 2, B, NH, max_len, 64) bf16
    dsc_cuda_buf slab; // a step's buffers, below
    rows_bufs s;       // (B rows)
    float *logits;     // (B, Vp) fp32
    int32_t *io;       // (2B): tokens, then positions
    int32_t *chosen;   // (B) argmax of each row's logits
    // the prefill's slab
    dsc_cuda_buf pre;
    size_t pre_rows; // rows it holds
    rows_bufs p;
    float *lse;      // (rows, NH)
    int32_t *ptok;   // (rows)
    int32_t *h_tok;  // (rows) pinned: the padded prompts on their way to ptok
    // pinned host staging
    int32_t *h_io;    // (3B): tokens, positions, chosen tokens
    float *h_logits;  // (B, Vp)
    cudaEvent_t io_ev; // recorded after the inputs' copy; h_io is rewritten only after it
    bool io_pending;
    // the step graph
    cudaGraphExec_t exec;
    int graph_n, graph_state; // rows it serves; 0 none, 1 an eager step ran, 2 captured
    const uint16_t **graph_params; // (nt) the weights it was made with
    long replays;
    // recompute mode
    void *full; // the training model's device passes (dsc__gpt2_device_ops)
    int32_t *h_seq, *h_in; // (B, max_len) every row's tokens; (B * max_len) packed input
};

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

static int layer_tensor(int l, int k) { return 2 + l * PER_LAYER + k; }

// ---- kernels ----

// x (n, C) = wte[tokens[b]] + wpe[pos[b]]; one thread per 8 channels.
__global__ void embed_rows_kernel(uint4 *x, const int32_t *tokens, const int32_t *pos,
                                  const uint4 *wte, const uint4 *wpe, int n, int C8) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * C8) return;
    int b = i / C8, c8 = i % C8;
    float e[8], p[8];
    dsc_unpack8(wte[(size_t)tokens[b] * C8 + c8], e);
    dsc_unpack8(wpe[(size_t)pos[b] * C8 + c8], p);
#pragma unroll
    for (int k = 0; k < 8; k++)
        e[k] += p[k];
    x[i] = dsc_pack8(e);
}

// Keys and values of qkv (n, T, 3C) into the cache rows b < n, positions t < T; one thread per
// 16 bytes, in the cache's order so that the writes are contiguous.
__global__ void kv_store_kernel(uint4 *kc, uint4 *vc, const uint16_t *qkv, int n, int T, int C,
                                int NH, int max_len) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)n * NH * T * (HS / 8);
    if (i >= total) return;
    int e = (int)(i % (HS / 8));
    long long r = i / (HS / 8);
    int t = (int)(r % T);
    r /= T;
    int h = (int)(r % NH), b = (int)(r / NH);
    const uint16_t *row = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * HS + e * 8;
    size_t at = (((size_t)b * NH + h) * max_len + t) * (HS / 8) + e;
    kc[at] = *(const uint4 *)(row + C);
    vc[at] = *(const uint4 *)(row + 2 * C);
}

// dst (n, C) = src row (b, pos[b]) of (n, T, C); one thread per 8 channels.
__global__ void gather_rows_kernel(uint4 *dst, const uint4 *src, const int32_t *pos, int n, int T,
                                   int C8) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * C8) return;
    int b = i / C8, c8 = i % C8;
    dst[i] = src[((size_t)b * T + pos[b]) * C8 + c8];
}

// dst (n, ldd) fp32 = bf16 row (b, pos[b]) of src (n, T, lds), columns [0, V).
__global__ void gather_logits_kernel(float *dst, const uint16_t *src, const int32_t *pos, int n,
                                     int T, int V, int lds, int ldd) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)n * V) return;
    int b = (int)(i / V), v = (int)(i % V);
    dst[(size_t)b * ldd + v] = dsc_bf16_f32(src[((size_t)b * T + pos[b]) * lds + v]);
}

// Shared memory of the decode attention: scores (max_len, padded), partial outputs of every lane
// group (groups x 64), the block reductions' scratch.
static size_t att_smem(int max_len) {
    return ((size_t)(max_len + 3) / 4 * 4 + (size_t)(ATT_THREADS / ATT_GROUP) * HS +
            DSC_MAX_WARPS) *
           sizeof(float);
}

// One block per (head, row): this step's key and value of the row go into the cache at pos[b],
// then out (n, C) = softmax(q K^T / 8) V over positions 0 .. pos[b], fp32 throughout. Lanes work
// in groups of ATT_GROUP on one key row (each lane 8 channels), ATT_UNROLL rows per group at once.
// Every loop runs the same trip count on every thread, so whole warps take part in the shuffles.
__global__ void decode_attention_kernel(uint16_t *out, uint16_t *kc, uint16_t *vc,
                                        const uint16_t *qkv, const int32_t *pos, int C, int NH,
                                        int max_len) {
    extern __shared__ float sm[];
    const int ngroups = ATT_THREADS / ATT_GROUP, step = ngroups * ATT_UNROLL;
    int h = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
    int g = tid / ATT_GROUP, sub = tid % ATT_GROUP;
    int p = pos[b];
    float *s = sm, *part = sm + (max_len + 3) / 4 * 4, *red = part + ngroups * HS;
    const uint16_t *row = qkv + (size_t)b * 3 * C + (size_t)h * HS;
    size_t head = ((size_t)b * NH + h) * (size_t)max_len * (HS / 8); // in 16-byte units
    uint4 *K = (uint4 *)kc + head, *Vv = (uint4 *)vc + head;
    if (tid < HS / 8) K[(size_t)p * (HS / 8) + tid] = ((const uint4 *)(row + C))[tid];
    else if (tid < HS / 4)
        Vv[(size_t)p * (HS / 8) + tid - HS / 8] = ((const uint4 *)(row + 2 * C))[tid - HS / 8];
    __syncthreads(); // the block's own writes are visible to it after the barrier

    float q[8];
    dsc_unpack8(((const uint4 *)row)[sub], q);
#pragma unroll
    for (int k = 0; k < 8; k++)
        q[k] *= 0.125f; // 1 / sqrt(64), exact
    for (int j0 = 0; j0 <= p; j0 += step) {
        uint4 kr[ATT_UNROLL];
#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            int j = j0 + u * ngroups + g;
            kr[u] = j <= p ? K[(size_t)j * (HS / 8) + sub] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            float kf[8], dot = 0.0f;
            dsc_unpack8(kr[u], kf);
#pragma unroll
            for (int k = 0; k < 8; k++)
                dot += q[k] * kf[k];
            for (int o = ATT_GROUP / 2; o > 0; o >>= 1)
                dot += dsc_shfl_xor(dot, o);
            int j = j0 + u * ngroups + g;
            if (sub == 0 && j <= p) s[j] = dot;
        }
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = tid; j <= p; j += ATT_THREADS)
        m = fmaxf(m, s[j]);
    m = dsc_block_max(m, red);
    float z = 0.0f;
    for (int j = tid; j <= p; j += ATT_THREADS) {
        float e = expf(s[j] - m);
        s[j] = e;
        z += e;
    }
    z = dsc_block_sum(z, red); // its barriers also publish s[]
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j0 = 0; j0 <= p; j0 += step) {
        uint4 vr[ATT_UNROLL];
#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            int j = j0 + u * ngroups + g;
            vr[u] = j <= p ? Vv[(size_t)j * (HS / 8) + sub] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < ATT_UNROLL; u++) {
            int j = j0 + u * ngroups + g;
            if (j > p) continue;
            float vf[8], w = s[j];
            dsc_unpack8(vr[u], vf);
#pragma unroll
            for (int k = 0; k < 8; k++)
                acc[k] += w * vf[k];
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        part[g * HS + sub * 8 + k] = acc[k];
    __syncthreads();
    if (tid < HS) { // the groups' partial sums, in group order
        float y = 0.0f;
        for (int gg = 0; gg < ngroups; gg++)
            y += part[gg * HS + tid];
        out[(size_t)b * C + (size_t)h * HS + tid] = dsc_f32_bf16(y / z);
    }
}

// ---- launchers ----

static dsc_status embed_rows(dsc_gpt2_decode *d, const uint16_t *const *params, int n) {
    int C8 = d->c.n_embd / 8;
    embed_rows_kernel<<<dsc__blocks((long long)n * C8, ELEM_THREADS), ELEM_THREADS, 0, d->st>>>(
        (uint4 *)d->s.x, d->io, d->io + d->B, (const uint4 *)params[0], (const uint4 *)params[1],
        n, C8);
    DSC_CUDA_LAUNCHED("embed_rows_kernel");
    return DSC_OK;
}

static uint16_t *cache_of(dsc_gpt2_decode *d, int l, int which) {
    size_t per = (size_t)d->B * d->max_len * d->c.n_embd;
    return (uint16_t *)d->kv.ptr + ((size_t)l * 2 + (size_t)which) * per;
}

static dsc_status decode_attention(dsc_gpt2_decode *d, int l, int n) {
    dim3 grid((unsigned)d->c.n_head, (unsigned)n);
    decode_attention_kernel<<<grid, ATT_THREADS, att_smem(d->max_len), d->st>>>(
        d->s.att, cache_of(d, l, 0), cache_of(d, l, 1), d->s.qkv, d->io + d->B, d->c.n_embd,
        d->c.n_head, d->max_len);
    DSC_CUDA_LAUNCHED("decode_attention_kernel");
    return DSC_OK;
}

static dsc_status kv_store(dsc_gpt2_decode *d, int l, const uint16_t *qkv, int n, int T) {
    long long total = (long long)n * d->c.n_head * T * (HS / 8);
    kv_store_kernel<<<dsc__blocks(total, ELEM_THREADS), ELEM_THREADS, 0, d->st>>>(
        (uint4 *)cache_of(d, l, 0), (uint4 *)cache_of(d, l, 1), qkv, n, T, d->c.n_embd,
        d->c.n_head, d->max_len);
    DSC_CUDA_LAUNCHED("kv_store_kernel");
    return DSC_OK;
}

static dsc_status argmax(dsc_gpt2_decode *d, int n) {
    return dsc__cuda_decode_argmax(d->chosen, d->logits, n, d->c.vocab_size, d->Vp, d->st);
}

// ---- products ----

// out (rows, OC) = inp (rows, IC) @ w (IC, OC) + bias [+ resid, which may be out]; GELU_BIAS
// puts the pre-activation in aux. epi is BIAS or GELU_BIAS (the training forward's product, bf16).
static dsc_status mm(dsc_gpt2_decode *d, uint16_t *out, const uint16_t *inp, const uint16_t *w,
                     const uint16_t *bias, const uint16_t *resid, int rows, int IC, int OC,
                     int epi, uint16_t *aux) {
    return dsc__cuda_mm_forward(d->blas, out, OC, inp, IC, w, bias, resid, rows, IC, OC, epi, aux,
                                0, d->st);
}

// fcg = GELU(ln @ w_fc + b_fc) with the pre-activation in fch: the GELU in the product's epilogue
// (as the training forward), or, where the BLAS has no such algorithm for a shape (a small row
// count, say), the product with its bias and then the GELU kernel, from then on.
static dsc_status mlp_up(dsc_gpt2_decode *d, const uint16_t *const *p, const rows_bufs &a,
                         int rows) {
    int C = d->c.n_embd;
    if (!d->unfused_gelu) {
        dsc_status st = mm(d, a.fcg, a.ln, p[K_FCW], p[K_FCB], NULL, rows, C, 4 * C,
                           DSC_CUDA_EPI_GELU_BIAS, a.fch);
        if (st != DSC_ERR_UNSUPPORTED) return st;
        dsc_clear_error();
        d->unfused_gelu = true;
    }
    DSC_TRY(mm(d, a.fch, a.ln, p[K_FCW], p[K_FCB], NULL, rows, C, 4 * C, DSC_CUDA_EPI_BIAS, NULL));
    return dsc__cuda_gelu_forward(a.fcg, a.fch, (int64_t)rows * 4 * C, d->st);
}

// One layer over the rows of a (x is the residual stream, updated in place); attention is the
// caller's `attend` between the qkv product and the output projection.
template <typename Attend>
static dsc_status layer_forward(dsc_gpt2_decode *d, const uint16_t *const *params, int l,
                                const rows_bufs &a, int rows, Attend attend) {
    int C = d->c.n_embd;
    const uint16_t *const *p = params + layer_tensor(l, 0);
    DSC_TRY(dsc__cuda_layernorm_forward(a.ln, a.mean, a.rstd, a.x, p[K_LN1W], p[K_LN1B], rows, C,
                                        d->st));
    DSC_TRY(mm(d, a.qkv, a.ln, p[K_ATTW], p[K_ATTB], NULL, rows, C, 3 * C, DSC_CUDA_EPI_BIAS,
               NULL));
    DSC_TRY(attend());
    DSC_TRY(mm(d, a.x, a.att, p[K_APROJW], p[K_APROJB], a.x, rows, C, C, DSC_CUDA_EPI_BIAS, NULL));
    DSC_TRY(dsc__cuda_layernorm_forward(a.ln, a.mean, a.rstd, a.x, p[K_LN2W], p[K_LN2B], rows, C,
                                        d->st));
    DSC_TRY(mlp_up(d, p, a, rows));
    return mm(d, a.x, a.fcg, p[K_MPROJW], p[K_MPROJB], a.x, rows, 4 * C, C, DSC_CUDA_EPI_BIAS,
              NULL);
}

// ln_f on the step rows' x, the tied head into fp32 logits (n, Vp), and each row's argmax.
static dsc_status head(dsc_gpt2_decode *d, const uint16_t *const *params, int n) {
    int C = d->c.n_embd, lnf = layer_tensor(d->c.n_layer, 0);
    DSC_TRY(dsc__cuda_layernorm_forward(d->s.ln, d->s.mean, d->s.rstd, d->s.x, params[lnf],
                                        params[lnf + 1], n, C, d->st));
    DSC_TRY(dsc__cuda_decode_head(d->blas, d->logits, d->Vp, d->s.ln, params[0], n, C,
                                  d->c.vocab_size, d->st));
    return argmax(d, n);
}

// Everything of one step after its inputs are on the device (what a graph captures).
static dsc_status enqueue_step(dsc_gpt2_decode *d, const uint16_t *const *params, int n) {
    DSC_TRY(embed_rows(d, params, n));
    for (int l = 0; l < d->c.n_layer; l++)
        DSC_TRY(layer_forward(d, params, l, d->s, n, [&] { return decode_attention(d, l, n); }));
    return head(d, params, n);
}

// ---- allocation ----

// Views of R rows carved from base (NULL: only count); returns the bytes.
static size_t carve_rows(rows_bufs *a, char *base, size_t R, int C) {
    size_t bytes[] = {R * C * 2, R * C * 2, R * 3 * C * 2, R * C * 2, R * 4 * C * 2, R * 4 * C * 2,
                      R * 4,     R * 4};
    void **views[] = {(void **)&a->x,   (void **)&a->ln,  (void **)&a->qkv,  (void **)&a->att,
                      (void **)&a->fch, (void **)&a->fcg, (void **)&a->mean, (void **)&a->rstd};
    size_t off = 0;
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        if (base) *views[i] = base + off;
        off += align256(bytes[i]);
    }
    return off;
}

static size_t carve_step(dsc_gpt2_decode *d, char *base) {
    size_t B = (size_t)d->B;
    size_t off = carve_rows(&d->s, base, B, d->c.n_embd);
    if (base) {
        d->logits = (float *)(base + off);
        d->io = (int32_t *)(base + off + align256(B * d->Vp * 4));
        d->chosen = (int32_t *)(base + off + align256(B * d->Vp * 4) + align256(B * 2 * 4));
    }
    return off + align256(B * d->Vp * 4) + align256(B * 2 * 4) + align256(B * 4);
}

// The prefill's slab for `rows` rows: grown (never shrunk) when a larger prompt batch comes.
static dsc_status prefill_bufs(dsc_gpt2_decode *d, size_t rows) {
    if (rows <= d->pre_rows) return DSC_OK;
    DSC_CUDA_TRY(cudaStreamSynchronize(d->st)); // the old slab may still be read
    dsc__cuda_buf_free(&d->pre);
    if (d->h_tok) (void)cudaFreeHost(d->h_tok);
    d->h_tok = NULL;
    d->pre_rows = 0;
    DSC_CUDA_TRY(cudaMallocHost((void **)&d->h_tok, rows * sizeof(int32_t)));
    size_t NH = (size_t)d->c.n_head, bytes = carve_rows(&d->p, NULL, rows, d->c.n_embd);
    bytes += align256(rows * NH * 4) + align256(rows * 4);
    DSC_TRY(dsc__cuda_buf_alloc(&d->pre, d->pool, bytes, "gpu.prefill"));
    char *base = (char *)d->pre.ptr;
    size_t off = carve_rows(&d->p, base, rows, d->c.n_embd);
    d->lse = (float *)(base + off);
    d->ptok = (int32_t *)(base + off + align256(rows * NH * 4));
    d->pre_rows = rows;
    return DSC_OK;
}

extern "C" size_t dsc_gpt2_decode_kv_bytes(const dsc_gpt2_config *c, int batch, int max_len) {
    return (size_t)c->n_layer * 2 * (size_t)batch * (size_t)max_len * (size_t)c->n_embd * 2;
}

static dsc_status check_create(const dsc_gpt2_config *c, const dsc_gpt2_decode_opts *o) {
    DSC_CUDA_ARG(c->n_layer > 0 && c->n_head > 0 && c->n_embd == HS * c->n_head &&
                     c->vocab_size > 0 && c->max_seq_len > 0,
                 "gpt2 decode: the GPU decoder needs head size 64 (n_embd %d, n_head %d); give "
                 "--heads n_embd / 64",
                 c->n_embd, c->n_head);
    DSC_CUDA_ARG(o->batch >= 1 && o->max_len >= 1 && o->max_len <= c->max_seq_len &&
                     (int64_t)o->batch * o->max_len <= (1 << 24),
                 "gpt2 decode: %d sequences of %d positions is invalid (positions 1 .. the "
                 "context %d, sequences x positions <= 16M)",
                 o->batch, o->max_len, c->max_seq_len);
    DSC_CUDA_ARG((int64_t)o->batch * c->n_head <= DSC_CUDA_ATT_MAX_BH,
                 "gpt2 decode: %d sequences x %d heads is more than the %d (sequence, head) "
                 "pairs attention takes in one launch; generate fewer prompts at once",
                 o->batch, c->n_head, DSC_CUDA_ATT_MAX_BH);
    return DSC_OK;
}

static dsc_status attention_smem_limit(int max_len) {
    return dsc__cuda_decode_smem_limit((const void *)decode_attention_kernel, att_smem(max_len),
                                       "gpt2 decode", max_len);
}

static dsc_status create_buffers(dsc_gpt2_decode *d) {
    size_t B = (size_t)d->B;
    DSC_CUDA_TRY(cudaMallocHost((void **)&d->h_io, 3 * B * sizeof(int32_t)));
    DSC_CUDA_TRY(cudaMallocHost((void **)&d->h_logits, B * d->Vp * sizeof(float)));
    DSC_CUDA_TRY(cudaEventCreate(&d->io_ev));
    DSC_TRY(dsc__cuda_buf_alloc(&d->slab, d->pool, carve_step(d, NULL), "gpu.decode"));
    carve_step(d, (char *)d->slab.ptr);
    DSC_TRY(dsc__cuda_blas_create_in(&d->blas, 0, d->pool));
    if (d->recompute) {
        d->h_seq = (int32_t *)calloc(B * d->max_len, sizeof(int32_t));
        d->h_in = (int32_t *)calloc(B * d->max_len, sizeof(int32_t));
        if (!d->h_seq || !d->h_in)
            return dsc__fail(DSC_ERR_OOM, "gpt2 decode: out of host memory for the sequences");
        return dsc__gpt2_device_ops.create(&d->c, d->B, d->max_len, d->st, d->pool, &d->full);
    }
    DSC_TRY(attention_smem_limit(d->max_len));
    return dsc__cuda_buf_alloc(&d->kv, d->pool, dsc_gpt2_decode_kv_bytes(&d->c, d->B, d->max_len),
                               "gpu.kv_cache");
}

extern "C" dsc_status dsc_gpt2_decode_create(dsc_gpt2_decode **out, const dsc_gpt2_config *c,
                                             const dsc_gpt2_decode_opts *o) {
    DSC_CUDA_ARG(out && c && o, "gpt2 decode create: out, config and options must be set");
    *out = NULL;
    DSC_TRY(check_create(c, o));
    dsc_gpt2_decode *d = (dsc_gpt2_decode *)calloc(1, sizeof *d);
    if (!d) return dsc__fail(DSC_ERR_OOM, "gpt2 decode create: out of host memory");
    d->c = *c;
    d->B = o->batch, d->max_len = o->max_len;
    d->Vp = dsc__cuda_decode_logits_ld(c->vocab_size);
    d->nt = dsc_gpt2_num_tensors(c);
    d->recompute = o->recompute;
    const char *env = dsc__env(DSC_ENV_GEN_GRAPH);
    d->use_graph = !o->no_graph && !o->recompute && !(env && env[0] == '0');
    d->pool = o->pool;
    d->st = (cudaStream_t)o->stream;
    dsc_status st = DSC_OK;
    d->graph_params = (const uint16_t **)calloc((size_t)d->nt, sizeof *d->graph_params);
    if (!d->graph_params) st = dsc__fail(DSC_ERR_OOM, "gpt2 decode create: out of host memory");
    if (st == DSC_OK && !d->st) { // a graph cannot be captured on the legacy default stream
        cudaError_t e = cudaStreamCreateWithFlags(&d->st, cudaStreamNonBlocking);
        d->own_stream = e == cudaSuccess;
        if (e != cudaSuccess) st = dsc__cuda_fail(e, "cudaStreamCreate", __FILE__, __LINE__);
    }
    if (st == DSC_OK) st = create_buffers(d);
    if (st != DSC_OK) {
        dsc__error_prefix("gpt2 decode for %d sequences x %d positions: ", o->batch, o->max_len);
        dsc_gpt2_decode_destroy(d);
        return st;
    }
    *out = d;
    return DSC_OK;
}

extern "C" void dsc_gpt2_decode_destroy(dsc_gpt2_decode *d) {
    if (!d) return;
    if (d->st) (void)cudaStreamSynchronize(d->st);
    if (d->exec) (void)cudaGraphExecDestroy(d->exec);
    if (d->full) dsc__gpt2_device_ops.destroy(d->full);
    dsc__cuda_blas_destroy(d->blas);
    dsc__cuda_buf_free(&d->pre);
    dsc__cuda_buf_free(&d->slab);
    dsc__cuda_buf_free(&d->kv);
    if (d->io_ev) (void)cudaEventDestroy(d->io_ev);
    if (d->h_io) (void)cudaFreeHost(d->h_io);
    if (d->h_logits) (void)cudaFreeHost(d->h_logits);
    if (d->h_tok) (void)cudaFreeHost(d->h_tok);
    if (d->own_stream) (void)cudaStreamDestroy(d->st);
    free(d->graph_params);
    free(d->h_seq);
    free(d->h_in);
    free(d);
}

extern "C" long dsc_gpt2_decode_graph_replays(const dsc_gpt2_decode *d) {
    return d ? d->replays : 0;
}

// ---- inputs ----

static void tensor_name(const void *cfg, int i, char *buf, int cap) {
    dsc_gpt2_tensor_info info;
    dsc_gpt2_tensor_info_get((const dsc_gpt2_config *)cfg, i, &info);
    snprintf(buf, (size_t)cap, "%s", info.name);
}

static dsc_status check_params(const dsc_gpt2_decode *d, const uint16_t *const *params) {
    return dsc__cuda_table_check((const void *const *)params, d->nt, "gpt2 decode", "params",
                                 tensor_name, &d->c, NULL);
}

static dsc_status check_token(const dsc_gpt2_decode *d, int32_t tok, int b, int t) {
    return dsc__cuda_decode_check_token("gpt2 decode", tok, d->c.vocab_size, b, t);
}

// The pinned input buffer is rewritten only once the previous inputs' copy has run.
static dsc_status io_ready(dsc_gpt2_decode *d) {
    if (d->io_pending) DSC_CUDA_TRY(cudaEventSynchronize(d->io_ev));
    d->io_pending = false;
    return DSC_OK;
}

// h_io's tokens and positions (n rows) to the device.
static dsc_status upload_io(dsc_gpt2_decode *d, int n) {
    DSC_CUDA_TRY(cudaMemcpyAsync(d->io, d->h_io, sizeof(int32_t) * n, cudaMemcpyHostToDevice,
                                 d->st));
    DSC_CUDA_TRY(cudaMemcpyAsync(d->io + d->B, d->h_io + d->B, sizeof(int32_t) * n,
                                 cudaMemcpyHostToDevice, d->st));
    DSC_CUDA_TRY(cudaEventRecord(d->io_ev, d->st));
    d->io_pending = true;
    return DSC_OK;
}

// ---- recompute mode ----

// The training forward over rows 0 .. n-1 up to the furthest position, then the logits of each
// row's position pos[b] (in h_io) as fp32 and its argmax.
static dsc_status recompute(dsc_gpt2_decode *d, const uint16_t *const *params, int n) {
    int T = 1, L = d->max_len;
    for (int b = 0; b < n; b++)
        T = d->h_io[d->B + b] + 1 > T ? d->h_io[d->B + b] + 1 : T;
    for (int b = 0; b < n; b++)
        memcpy(d->h_in + (size_t)b * T, d->h_seq + (size_t)b * L, sizeof(int32_t) * T);
    DSC_TRY(upload_io(d, n));
    DSC_TRY(dsc__gpt2_device_ops.forward(d->full, params, d->h_in, NULL, n, T, NULL));
    int ld = 0;
    const uint16_t *lg = dsc__gpt2_cuda_logits(d->full, &ld);
    long long total = (long long)n * d->c.vocab_size;
    gather_logits_kernel<<<dsc__blocks(total, ELEM_THREADS), ELEM_THREADS, 0, d->st>>>(
        d->logits, lg, d->io + d->B, n, T, d->c.vocab_size, ld, d->Vp);
    DSC_CUDA_LAUNCHED("gather_logits_kernel");
    d->n = n;
    return argmax(d, n);
}

// ---- prefill ----

static dsc_status prefill_cached(dsc_gpt2_decode *d, const uint16_t *const *params, int n, int T) {
    int C = d->c.n_embd, NH = d->c.n_head, R = n * T, C8 = C / 8;
    rows_bufs &a = d->p;
    DSC_TRY(dsc__cuda_encoder_forward(a.x, d->ptok, params[0], params[1], n, T, C, d->st));
    for (int l = 0; l < d->c.n_layer; l++) {
        auto attend = [&]() -> dsc_status {
            DSC_TRY(dsc__cuda_attention_forward(a.att, d->lse, a.qkv, n, T, C, NH, d->st));
            return kv_store(d, l, a.qkv, n, T);
        };
        DSC_TRY(layer_forward(d, params, l, a, R, attend));
    }
    gather_rows_kernel<<<dsc__blocks((long long)n * C8, ELEM_THREADS), ELEM_THREADS, 0, d->st>>>(
        (uint4 *)d->s.x, (const uint4 *)a.x, d->io + d->B, n, T, C8);
    DSC_CUDA_LAUNCHED("gather_rows_kernel");
    return head(d, params, n);
}

extern "C" dsc_status dsc_gpt2_decode_prefill(dsc_gpt2_decode *d, const uint16_t *const *params,
                                              const int32_t *const *tokens, const int *lens,
                                              int n) {
    DSC_CUDA_ARG(d && tokens && lens, "gpt2 decode prefill: decoder, tokens and lengths must be "
                                      "set");
    DSC_CUDA_ARG(n >= 1 && n <= d->B, "gpt2 decode prefill: %d rows, the decoder holds 1 .. %d",
                 n, d->B);
    DSC_TRY(check_params(d, params));
    int T = 0;
    for (int b = 0; b < n; b++) {
        DSC_CUDA_ARG(tokens[b] && lens[b] >= 1 && lens[b] <= d->max_len,
                     "gpt2 decode prefill: prompt %d has %d tokens; 1 .. %d fit the cache", b,
                     lens[b], d->max_len);
        for (int t = 0; t < lens[b]; t++)
            DSC_TRY(check_token(d, tokens[b][t], b, t));
        T = lens[b] > T ? lens[b] : T;
    }
    DSC_TRY(io_ready(d));
    for (int b = 0; b < n; b++)
        d->h_io[d->B + b] = lens[b] - 1;
    d->n = 0;
    if (d->recompute) {
        for (int b = 0; b < n; b++)
            memcpy(d->h_seq + (size_t)b * d->max_len, tokens[b], sizeof(int32_t) * lens[b]);
        return recompute(d, params, n);
    }
    DSC_TRY(prefill_bufs(d, (size_t)n * T));
    memset(d->h_tok, 0, sizeof(int32_t) * n * T); // right-padded with token 0
    for (int b = 0; b < n; b++)
        memcpy(d->h_tok + (size_t)b * T, tokens[b], sizeof(int32_t) * lens[b]);
    DSC_CUDA_TRY(cudaMemcpyAsync(d->ptok, d->h_tok, sizeof(int32_t) * n * T,
                                 cudaMemcpyHostToDevice, d->st));
    DSC_TRY(upload_io(d, n));
    DSC_TRY(prefill_cached(d, params, n, T));
    d->n = n;
    return DSC_OK;
}

// ---- steps ----

static bool same_params(const dsc_gpt2_decode *d, const uint16_t *const *params) {
    return memcmp(d->graph_params, params, sizeof(*params) * d->nt) == 0;
}

// Capture the step's kernels into a graph and instantiate it. Anything the runtime refuses
// leaves graphs off for this decoder: the step then runs eagerly, with the same results (and a
// real fault shows up there).
static void capture(dsc_gpt2_decode *d, const uint16_t *const *params, int n) {
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamBeginCapture(d->st, cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        dsc_status st = enqueue_step(d, params, n);
        e = cudaStreamEndCapture(d->st, &graph);
        if (st != DSC_OK && e == cudaSuccess) e = cudaErrorUnknown;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&d->exec, graph, 0);
    if (graph) (void)cudaGraphDestroy(graph);
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();
    dsc_clear_error();
    d->exec = NULL;
    d->use_graph = false;
}

static dsc_status run_step(dsc_gpt2_decode *d, const uint16_t *const *params, int n) {
    if (!d->use_graph) return enqueue_step(d, params, n);
    if (d->graph_state > 0 && (d->graph_n != n || !same_params(d, params))) {
        if (d->exec) (void)cudaGraphExecDestroy(d->exec);
        d->exec = NULL;
        d->graph_state = 0;
    }
    if (d->graph_state == 0) { // the first step of this shape runs eagerly: the products'
        DSC_TRY(enqueue_step(d, params, n)); // algorithm choices are made and cached
        memcpy(d->graph_params, params, sizeof(*params) * d->nt);
        d->graph_n = n, d->graph_state = 1;
        return DSC_OK;
    }
    if (d->graph_state == 1) {
        capture(d, params, n);
        d->graph_state = 2;
        if (!d->exec) return enqueue_step(d, params, n);
    }
    DSC_CUDA_TRY(cudaGraphLaunch(d->exec, d->st));
    d->replays++;
    return DSC_OK;
}

extern "C" dsc_status dsc_gpt2_decode_step(dsc_gpt2_decode *d, const uint16_t *const *params,
                                           const int32_t *tokens, const int32_t *pos, int n) {
    DSC_CUDA_ARG(d && tokens && pos, "gpt2 decode step: decoder, tokens and positions must be "
                                     "set");
    DSC_CUDA_ARG(n >= 1 && n <= d->B, "gpt2 decode step: %d rows, the decoder holds 1 .. %d", n,
                 d->B);
    DSC_TRY(check_params(d, params));
    for (int b = 0; b < n; b++) {
        DSC_CUDA_ARG(pos[b] >= 0 && pos[b] < d->max_len,
                     "gpt2 decode step: row %d at position %d is outside the cache's %d "
                     "positions",
                     b, pos[b], d->max_len);
        DSC_TRY(check_token(d, tokens[b], b, pos[b]));
    }
    DSC_TRY(io_ready(d));
    memcpy(d->h_io, tokens, sizeof(int32_t) * n);
    memcpy(d->h_io + d->B, pos, sizeof(int32_t) * n);
    d->n = 0;
    if (d->recompute) {
        for (int b = 0; b < n; b++)
            d->h_seq[(size_t)b * d->max_len + pos[b]] = tokens[b];
        return recompute(d, params, n);
    }
    DSC_TRY(upload_io(d, n));
    DSC_TRY(run_step(d, params, n));
    d->n = n;
    return DSC_OK;
}

// ---- results ----

extern "C" dsc_status dsc_gpt2_decode_argmax(dsc_gpt2_decode *d, int32_t *tokens) {
    DSC_CUDA_ARG(d && tokens, "gpt2 decode argmax: decoder and output must be set");
    DSC_CUDA_ARG(d->n > 0, "gpt2 decode argmax: no prefill or step has run (or the last failed)");
    DSC_TRY(dsc__cuda_decode_tokens_read(tokens, d->h_io + 2 * d->B, d->chosen, d->n, d->st));
    d->io_pending = false; // the read waited for the stream
    return DSC_OK;
}

extern "C" dsc_status dsc_gpt2_decode_logits(dsc_gpt2_decode *d, float *logits) {
    DSC_CUDA_ARG(d && logits, "gpt2 decode logits: decoder and output must be set");
    DSC_CUDA_ARG(d->n > 0, "gpt2 decode logits: no prefill or step has run (or the last failed)");
    DSC_TRY(dsc__cuda_decode_logits_read(logits, d->h_logits, d->logits, d->n, d->c.vocab_size,
                                         d->Vp, d->st));
    d->io_pending = false; // the read waited for the stream
    return DSC_OK;
}

// ---- weights ----

struct dsc_gpt2_decode_weights {
    dsc_cuda_buf buf;
    const uint16_t **params; // (tensors) views into buf
};

extern "C" dsc_status dsc_gpt2_decode_weights_upload(dsc_gpt2_decode_weights **out,
                                                     const dsc_gpt2_config *c,
                                                     const float *const *host,
                                                     dsc_mem_pool *pool) {
    DSC_CUDA_ARG(out && c && host, "gpt2 weights upload: out, config and tensors must be set");
    *out = NULL;
    int nt = dsc_gpt2_num_tensors(c);
    size_t total = 0, most = 0;
    for (int i = 0; i < nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(c, i, &ti);
        DSC_CUDA_ARG(host[i] != NULL, "gpt2 weights upload: tensor %d (%s) is NULL", i, ti.name);
        total += align256((size_t)ti.numel * 2);
        most = (size_t)ti.numel > most ? (size_t)ti.numel : most;
    }
    dsc_gpt2_decode_weights *w = (dsc_gpt2_decode_weights *)calloc(1, sizeof *w);
    uint16_t *stage = (uint16_t *)malloc(most * 2);
    if (w) w->params = (const uint16_t **)calloc((size_t)nt, sizeof *w->params);
    dsc_status st = w && w->params && stage
                        ? DSC_OK
                        : dsc__fail(DSC_ERR_OOM, "gpt2 weights upload: out of host memory");
    if (st == DSC_OK) st = dsc__cuda_buf_alloc(&w->buf, pool, total, "gpu.bf16_weights");
    size_t off = 0;
    for (int i = 0; st == DSC_OK && i < nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(c, i, &ti);
        uint16_t *dst = (uint16_t *)((char *)w->buf.ptr + off);
        dsc_fp32_to_bf16_n(stage, host[i], (size_t)ti.numel);
        cudaError_t e = cudaMemcpy(dst, stage, (size_t)ti.numel * 2, cudaMemcpyHostToDevice);
        if (e != cudaSuccess) st = dsc__cuda_fail(e, ti.name, __FILE__, __LINE__);
        w->params[i] = dst;
        off += align256((size_t)ti.numel * 2);
    }
    free(stage);
    if (st != DSC_OK) {
        dsc_gpt2_decode_weights_destroy(w);
        return st;
    }
    *out = w;
    return DSC_OK;
}

extern "C" const uint16_t *const *
dsc_gpt2_decode_weights_params(const dsc_gpt2_decode_weights *w) {
    return w ? w->params : NULL;
}

extern "C" void dsc_gpt2_decode_weights_destroy(dsc_gpt2_decode_weights *w) {
    if (!w) return;
    dsc__cuda_buf_free(&w->buf);
    free(w->params);
    free(w);
}

// ---- the model interface's decoder (struct dsc_model_decode_ops) ----

// Host code only: hipcc's device pass would otherwise emit the table too, and then miss the
// host functions it points to.
#ifndef __HIP_DEVICE_COMPILE__

static dsc_status ops_create(const void *cfg, const dsc_model_decode_opts *o, void **dec) {
    dsc_gpt2_decode *d = NULL;
    DSC_TRY(dsc_gpt2_decode_create(&d, (const dsc_gpt2_config *)cfg, o));
    *dec = d;
    return DSC_OK;
}

static void ops_destroy(void *dec) { dsc_gpt2_decode_destroy((dsc_gpt2_decode *)dec); }

static size_t ops_kv_bytes(const void *cfg, int batch, int max_len) {
    return dsc_gpt2_decode_kv_bytes((const dsc_gpt2_config *)cfg, batch, max_len);
}

static dsc_status ops_prefill(void *dec, const uint16_t *const *params,
                              const int32_t *const *tokens, const int *lens, int n) {
    return dsc_gpt2_decode_prefill((dsc_gpt2_decode *)dec, params, tokens, lens, n);
}

static dsc_status ops_step(void *dec, const uint16_t *const *params, const int32_t *tokens,
                           const int32_t *pos, int n) {
    return dsc_gpt2_decode_step((dsc_gpt2_decode *)dec, params, tokens, pos, n);
}

static dsc_status ops_argmax(void *dec, int32_t *tokens) {
    return dsc_gpt2_decode_argmax((dsc_gpt2_decode *)dec, tokens);
}

static dsc_status ops_logits(void *dec, float *logits) {
    return dsc_gpt2_decode_logits((dsc_gpt2_decode *)dec, logits);
}

static long ops_graph_replays(const void *dec) {
    return dsc_gpt2_decode_graph_replays((const dsc_gpt2_decode *)dec);
}

extern "C" const struct dsc_model_decode_ops dsc__gpt2_decode_ops = {
    ops_create, ops_destroy, ops_kv_bytes, ops_prefill,      ops_step,
    ops_argmax, ops_logits,  ops_graph_replays,
};
#endif
