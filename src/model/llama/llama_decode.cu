// model/llama/llama_decode.cu - Llama-family prefill and decode steps through a grouped-query
// key/value cache on one GPU (see llama_decode.h).
//
// Buffers: the cache (one block); a fixed slab of `batch` output rows (the gathered last rows,
// their norm, fp32 logits, the chosen tokens) and the rotary tables; a rows slab (activations of
// every row of a pass and its inputs: tokens, sequences, positions, output rows), grown when a
// pass has more rows than any before. Pinned host staging for the inputs and the results.
#include "model/llama/llama_decode.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, malloc
#include <string.h> // memcpy, memset

#include "cuda/common.cuh"             // DSC_CUDA_TRY, DSC_CUDA_ARG, dsc_block_*, dsc_warp_sum
#include "cuda/decode_common.h"        // dsc__cuda_decode_argmax, dsc__cuda_decode_*_read, ...
#include "cuda/devbuf.h"               // dsc__cuda_buf_*
#include "cuda/device_model.h"         // dsc__cuda_table_check
#include "cuda/kernels.h"              // dsc__cuda_embed_forward_h
#include "model/llama/llama_cuda.h"    // dsc__llama_cuda_rope_upload
#include "model/llama/llama_kernels.h" // dsc__cuda_rmsnorm_forward_h, ...
#include "cuda/matmul.h"               // dsc__cuda_linear_forward

#define ATT_THREADS 128  // row attention: threads per (row, query head)
#define ELEM_THREADS 256 // gathers, cache stores

struct dsc_llama_decode {
    dsc_llama_config c;
    int B, max_len, Vp, nt;
    int QD, KD, QKV; // q columns (NH hd), k and v columns each (NKV hd), a qkv row
    int n;           // sequences of the last pass's result; 0 before the first (or after a failure)
    bool recompute, own_stream;
    cudaStream_t st;
    dsc_mem_pool *pool;
    dsc_cuda_blas *blas;
    dsc_cuda_buf kv; // (L, 2, B, max_len, KD) bf16
    // the fixed slab
    dsc_cuda_buf fixed;
    float *rope_cos, *rope_sin; // (max_len, hd / 2)
    uint16_t *xo, *lno;         // (B, C): each sequence's last row, its final norm
    float *rstdo;               // (B)
    float *logits;              // (B, Vp)
    int32_t *chosen;            // (B)
    // the rows slab
    dsc_cuda_buf rows;
    size_t cap; // rows it holds
    uint16_t *x, *ln, *qkv, *y, *gu, *h; // (R, C / C / QKV / QD / 2 I / I)
    float *rstd;                         // (R)
    int32_t *io;     // (3 cap + B): tokens, sequences, positions of the rows; output rows
    int32_t *h_io;   // pinned, the same
    float *h_logits; // pinned (B, Vp)
    int32_t *h_chosen; // pinned (B)
    int32_t *h_seq;    // recompute mode: (B, max_len) every sequence's tokens
};

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

static int lt(const dsc_llama_decode *d, int l, int k) {
    return dsc__llama_layer_tensor(&d->c, l, k);
}

// ---- kernels ----

// The key and value of every row (n, QKV) into the cache at (seq[i], pos[i]); one thread per 16
// bytes of a row's KD keys or values.
static __global__ void kv_store_kernel(uint4 *kc, uint4 *vc, const uint16_t *qkv,
                                       const int32_t *seq, const int32_t *pos, int n, int QD,
                                       int KD, int QKV, int max_len) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int K8 = KD / 8;
    if (i >= (long long)n * K8) return;
    int r = (int)(i / K8), e = (int)(i % K8);
    const uint16_t *row = qkv + (size_t)r * QKV + QD + (size_t)e * 8;
    size_t at = ((size_t)seq[r] * max_len + (size_t)pos[r]) * K8 + e;
    kc[at] = *(const uint4 *)row;
    vc[at] = *(const uint4 *)(row + KD);
}

// One block per (row i, query head h): y (n, QD) = softmax(q K^T scale) V over positions 0 ..
// pos[i] of sequence seq[i], reading kv head h / group. Scores, softmax and the weighted sum in
// fp32: each warp takes every nwarps-th key (its lanes split the channels), then each thread one
// channel of the output over the positions in order.
static __global__ void row_attention_kernel(uint16_t *y, const uint16_t *kc,
                                            const uint16_t *vc, const uint16_t *qkv,
                                            const int32_t *seq, const int32_t *pos, int NH,
                                            int group, int HD, int QD, int KD, int QKV,
                                            int max_len, float scale) {
    extern __shared__ float sm[];
    int i = blockIdx.x / NH, h = blockIdx.x % NH, tid = threadIdx.x;
    int lane = tid % DSC_WARP_SIZE, warp = tid / DSC_WARP_SIZE;
    int nwarps = blockDim.x / DSC_WARP_SIZE, p = pos[i];
    float *s = sm, *q = sm + (max_len + 3) / 4 * 4, *red = q + HD;
    const uint16_t *qr = qkv + (size_t)i * QKV + (size_t)h * HD;
    for (int c = tid; c < HD; c += blockDim.x)
        q[c] = dsc_bf16_f32(qr[c]);
    __syncthreads();
    size_t head = (size_t)seq[i] * max_len * KD + (size_t)(h / group) * HD;
    const uint16_t *K = kc + head, *V = vc + head;
    for (int j = warp; j <= p; j += nwarps) {
        const uint16_t *k = K + (size_t)j * KD;
        float dot = 0.0f;
        for (int c = lane; c < HD; c += DSC_WARP_SIZE)
            dot += q[c] * dsc_bf16_f32(k[c]);
        dot = dsc_warp_sum(dot);
        if (lane == 0) s[j] = dot * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = tid; j <= p; j += blockDim.x)
        m = fmaxf(m, s[j]);
    m = dsc_block_max(m, red);
    float z = 0.0f;
    for (int j = tid; j <= p; j += blockDim.x) {
        float e = expf(s[j] - m);
        s[j] = e;
        z += e;
    }
    z = dsc_block_sum(z, red); // its barriers also publish s[]
    for (int c = tid; c < HD; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j <= p; j++)
            acc += s[j] * dsc_bf16_f32(V[(size_t)j * KD + c]);
        y[(size_t)i * QD + (size_t)h * HD + c] = dsc_f32_bf16(acc / z);
    }
}

// dst (n, C) = src row out[b] of (R, C); one thread per 8 channels.
static __global__ void gather_rows_kernel(uint4 *dst, const uint4 *src, const int32_t *out,
                                          int n, int C8) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * C8) return;
    int b = i / C8, c8 = i % C8;
    dst[i] = src[(size_t)out[b] * C8 + c8];
}

// Shared memory of the row attention: scores (max_len, padded), q (HD), reduction scratch.
static size_t att_smem(int max_len, int HD) {
    return ((size_t)(max_len + 3) / 4 * 4 + (size_t)HD + DSC_MAX_WARPS) * sizeof(float);
}

// ---- products (nn.Linear: w is (out, in)) ----

// out (rows, OUT; stride ldo) = inp (rows, IN) @ w^T [+ bias] [+ resid, which may be out].
static dsc_status linear(dsc_llama_decode *d, uint16_t *out, int ldo, const uint16_t *inp,
                         const uint16_t *w, const uint16_t *bias, const uint16_t *resid, int rows,
                         int IN, int OUT) {
    return dsc__cuda_linear_forward(d->blas, out, ldo, inp, IN, w, bias, resid, rows, IN, OUT, 0,
                                    d->st);
}

static const uint16_t *bias_of(const dsc_llama_decode *d, const uint16_t *const *p, int l,
                               int k) {
    int i = lt(d, l, k);
    return i >= 0 ? p[i] : NULL;
}

// ---- a pass ----

static uint16_t *cache_of(dsc_llama_decode *d, int l, int which) {
    size_t per = (size_t)d->B * d->max_len * d->KD;
    return (uint16_t *)d->kv.ptr + ((size_t)l * 2 + (size_t)which) * per;
}

static dsc_status attend(dsc_llama_decode *d, int l, int R) {
    const dsc_llama_config *c = &d->c;
    int32_t *seq = d->io + d->cap, *pos = d->io + 2 * d->cap;
    long long total = (long long)R * (d->KD / 8);
    kv_store_kernel<<<dsc__blocks(total, ELEM_THREADS), ELEM_THREADS, 0, d->st>>>(
        (uint4 *)cache_of(d, l, 0), (uint4 *)cache_of(d, l, 1), d->qkv, seq, pos, R, d->QD, d->KD,
        d->QKV, d->max_len);
    DSC_CUDA_LAUNCHED("kv_store_kernel");
    float scale = 1.0f / sqrtf((float)c->head_dim);
    row_attention_kernel<<<(unsigned)((long long)R * c->n_head), ATT_THREADS,
                           att_smem(d->max_len, c->head_dim), d->st>>>(
        d->y, cache_of(d, l, 0), cache_of(d, l, 1), d->qkv, seq, pos, c->n_head,
        c->n_head / c->n_kv_head, c->head_dim, d->QD, d->KD, d->QKV, d->max_len, scale);
    DSC_CUDA_LAUNCHED("row_attention_kernel");
    return DSC_OK;
}

// Layer l on the R rows; x is the residual stream, updated in place.
static dsc_status layer(dsc_llama_decode *d, const uint16_t *const *p, int l, int R) {
    const dsc_llama_config *c = &d->c;
    int C = c->hidden, I = c->intermediate, QD = d->QD, KD = d->KD, QKV = d->QKV;
    int32_t *pos = d->io + 2 * d->cap;
    DSC_TRY(dsc__cuda_rmsnorm_forward_h(d->ln, d->rstd, d->x, p[lt(d, l, DSC_LLAMA_LN1)],
                                        c->rms_eps, R, C, false, d->st));
    DSC_TRY(linear(d, d->qkv, QKV, d->ln, p[lt(d, l, DSC_LLAMA_QW)],
                   bias_of(d, p, l, DSC_LLAMA_QB), NULL, R, C, QD));
    DSC_TRY(linear(d, d->qkv + QD, QKV, d->ln, p[lt(d, l, DSC_LLAMA_KW)],
                   bias_of(d, p, l, DSC_LLAMA_KB), NULL, R, C, KD));
    DSC_TRY(linear(d, d->qkv + QD + KD, QKV, d->ln, p[lt(d, l, DSC_LLAMA_VW)],
                   bias_of(d, p, l, DSC_LLAMA_VB), NULL, R, C, KD));
    // the rows as one sequence of R tokens whose position ids are the rows' positions
    if (c->qk_norm) // Qwen3: each head's q and k normed, then rotated, in one pass
        DSC_TRY(dsc__cuda_qk_norm_rope_h(d->qkv, QKV, NULL, NULL, p[lt(d, l, DSC_LLAMA_QN)],
                                         p[lt(d, l, DSC_LLAMA_KN)], c->rms_eps, d->rope_cos,
                                         d->rope_sin, pos, 1, R, c->n_head, c->n_kv_head,
                                         c->head_dim, false, d->st));
    else
        DSC_TRY(dsc__cuda_rope_h(d->qkv, QKV, d->rope_cos, d->rope_sin, pos, 1, R,
                                 c->n_head + c->n_kv_head, c->head_dim, false, false, d->st));
    DSC_TRY(attend(d, l, R));
    DSC_TRY(linear(d, d->x, C, d->y, p[lt(d, l, DSC_LLAMA_OW)], NULL, d->x, R, QD, C));
    DSC_TRY(dsc__cuda_rmsnorm_forward_h(d->ln, d->rstd, d->x, p[lt(d, l, DSC_LLAMA_LN2)],
                                        c->rms_eps, R, C, false, d->st));
    DSC_TRY(linear(d, d->gu, 2 * I, d->ln, p[lt(d, l, DSC_LLAMA_GATE)], NULL, NULL, R, C, I));
    DSC_TRY(linear(d, d->gu + I, 2 * I, d->ln, p[lt(d, l, DSC_LLAMA_UP)], NULL, NULL, R, C, I));
    DSC_TRY(dsc__cuda_swiglu_forward_h(d->h, d->gu, R, I, false, d->st));
    return linear(d, d->x, C, d->h, p[lt(d, l, DSC_LLAMA_DOWN)], NULL, d->x, R, I, C);
}

// The final norm and the head on each sequence's last row: fp32 logits (n, Vp), their argmax.
static dsc_status head(dsc_llama_decode *d, const uint16_t *const *p, int n) {
    const dsc_llama_config *c = &d->c;
    int C = c->hidden, C8 = C / 8;
    gather_rows_kernel<<<dsc__blocks((long long)n * C8, ELEM_THREADS), ELEM_THREADS, 0, d->st>>>(
        (uint4 *)d->xo, (const uint4 *)d->x, d->io + 3 * d->cap, n, C8);
    DSC_CUDA_LAUNCHED("gather_rows_kernel");
    DSC_TRY(dsc__cuda_rmsnorm_forward_h(d->lno, d->rstdo, d->xo, p[dsc__llama_norm_tensor(c)],
                                        c->rms_eps, n, C, false, d->st));
    DSC_TRY(dsc__cuda_decode_head(d->blas, d->logits, d->Vp, d->lno,
                                  p[dsc__llama_head_tensor(c)], n, C, c->vocab_size, d->st));
    return dsc__cuda_decode_argmax(d->chosen, d->logits, n, c->vocab_size, d->Vp, d->st);
}

// ---- allocation ----

// Views of the rows slab for R rows (base NULL: only count); returns the bytes.
static size_t carve_rows(dsc_llama_decode *d, char *base, size_t R) {
    size_t C = (size_t)d->c.hidden, I = (size_t)d->c.intermediate, B = (size_t)d->B;
    size_t bytes[] = {R * C * 2,  R * C * 2,     R * (size_t)d->QKV * 2, R * (size_t)d->QD * 2,
                      R * 2 * I * 2, R * I * 2, R * 4, (3 * R + B) * 4};
    void **views[] = {(void **)&d->x,  (void **)&d->ln, (void **)&d->qkv,  (void **)&d->y,
                      (void **)&d->gu, (void **)&d->h,  (void **)&d->rstd, (void **)&d->io};
    size_t off = 0;
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        if (base) *views[i] = base + off;
        off += align256(bytes[i]);
    }
    return off;
}

static size_t carve_fixed(dsc_llama_decode *d, char *base) {
    size_t C = (size_t)d->c.hidden, B = (size_t)d->B;
    size_t half = (size_t)d->max_len * (size_t)(d->c.head_dim / 2);
    size_t bytes[] = {half * 4, half * 4, B * C * 2, B * C * 2, B * 4, B * (size_t)d->Vp * 4,
                      B * 4};
    void **views[] = {(void **)&d->rope_cos, (void **)&d->rope_sin, (void **)&d->xo,
                      (void **)&d->lno,      (void **)&d->rstdo,    (void **)&d->logits,
                      (void **)&d->chosen};
    size_t off = 0;
    for (size_t i = 0; i < sizeof bytes / sizeof bytes[0]; i++) {
        if (base) *views[i] = base + off;
        off += align256(bytes[i]);
    }
    return off;
}

// The rows slab and its pinned staging for R rows: grown (never shrunk) when a pass has more.
static dsc_status rows_bufs(dsc_llama_decode *d, size_t R) {
    if (R <= d->cap) return DSC_OK;
    DSC_CUDA_TRY(cudaStreamSynchronize(d->st)); // the old slab may still be read
    dsc__cuda_buf_free(&d->rows);
    if (d->h_io) (void)cudaFreeHost(d->h_io);
    d->h_io = NULL;
    d->cap = 0;
    DSC_CUDA_TRY(cudaMallocHost((void **)&d->h_io, (3 * R + (size_t)d->B) * sizeof(int32_t)));
    DSC_TRY(dsc__cuda_buf_alloc(&d->rows, d->pool, carve_rows(d, NULL, R), "gpu.decode"));
    carve_rows(d, (char *)d->rows.ptr, R);
    d->cap = R;
    return DSC_OK;
}

// The rotary tables of the cache's positions.
static dsc_status upload_rope(dsc_llama_decode *d) {
    return dsc__llama_cuda_rope_upload(d->rope_cos, d->rope_sin, &d->c, d->max_len,
                                       "llama decode");
}

static dsc_status attention_smem_limit(const dsc_llama_decode *d) {
    return dsc__cuda_decode_smem_limit((const void *)row_attention_kernel,
                                       att_smem(d->max_len, d->c.head_dim), "llama decode",
                                       d->max_len);
}

extern "C" size_t dsc_llama_decode_kv_bytes(const dsc_llama_config *c, int batch, int max_len) {
    return (size_t)c->n_layer * 2 * (size_t)batch * (size_t)max_len * (size_t)c->n_kv_head *
           (size_t)c->head_dim * 2;
}

static dsc_status check_create(const dsc_llama_config *c, const dsc_model_decode_opts *o) {
    DSC_CUDA_ARG(c->head_dim == 64 || c->head_dim == 128,
                 "--device cuda: this Llama-family model has head_dim %d; the GPU decoder takes "
                 "head_dim 64 or 128: generate on the CPU (--device cpu)",
                 c->head_dim);
    DSC_CUDA_ARG(c->hidden % 8 == 0 && c->intermediate % 8 == 0,
                 "llama decode: hidden_size %d and intermediate_size %d must be multiples of 8 "
                 "on the GPU; generate on the CPU (--device cpu)",
                 c->hidden, c->intermediate);
    DSC_CUDA_ARG(o->batch >= 1 && o->max_len >= 1 && o->max_len <= c->max_seq_len &&
                     (int64_t)o->batch * o->max_len <= (1 << 24),
                 "llama decode: %d sequences of %d positions is invalid (positions 1 .. the "
                 "context %d, sequences x positions <= 16M)",
                 o->batch, o->max_len, c->max_seq_len);
    return DSC_OK;
}

static dsc_status create_buffers(dsc_llama_decode *d) {
    size_t B = (size_t)d->B;
    DSC_CUDA_TRY(cudaMallocHost((void **)&d->h_logits, B * d->Vp * sizeof(float)));
    DSC_CUDA_TRY(cudaMallocHost((void **)&d->h_chosen, B * sizeof(int32_t)));
    DSC_TRY(dsc__cuda_buf_alloc(&d->fixed, d->pool, carve_fixed(d, NULL), "gpu.decode"));
    carve_fixed(d, (char *)d->fixed.ptr);
    DSC_TRY(upload_rope(d));
    DSC_TRY(dsc__cuda_blas_create_in(&d->blas, 0, d->pool));
    DSC_TRY(attention_smem_limit(d));
    if (d->recompute) {
        d->h_seq = (int32_t *)calloc(B * d->max_len, sizeof(int32_t));
        if (!d->h_seq)
            return dsc__fail(DSC_ERR_OOM, "llama decode: out of host memory for the sequences");
    }
    return dsc__cuda_buf_alloc(&d->kv, d->pool, dsc_llama_decode_kv_bytes(&d->c, d->B, d->max_len),
                               "gpu.kv_cache");
}

extern "C" dsc_status dsc_llama_decode_create(dsc_llama_decode **out, const dsc_llama_config *c,
                                              const dsc_model_decode_opts *o) {
    DSC_CUDA_ARG(out && c && o, "llama decode create: out, config and options must be set");
    *out = NULL;
    DSC_TRY(check_create(c, o));
    dsc_llama_decode *d = (dsc_llama_decode *)calloc(1, sizeof *d);
    if (!d) return dsc__fail(DSC_ERR_OOM, "llama decode create: out of host memory");
    d->c = *c;
    d->B = o->batch, d->max_len = o->max_len;
    d->Vp = dsc__cuda_decode_logits_ld(c->vocab_size);
    d->nt = dsc_llama_num_tensors(c);
    d->QD = c->n_head * c->head_dim, d->KD = c->n_kv_head * c->head_dim;
    d->QKV = d->QD + 2 * d->KD;
    d->recompute = o->recompute;
    d->pool = o->pool;
    d->st = (cudaStream_t)o->stream;
    dsc_status st = DSC_OK;
    if (!d->st) {
        cudaError_t e = cudaStreamCreateWithFlags(&d->st, cudaStreamNonBlocking);
        d->own_stream = e == cudaSuccess;
        if (e != cudaSuccess) st = dsc__cuda_fail(e, "cudaStreamCreate", __FILE__, __LINE__);
    }
    if (st == DSC_OK) st = create_buffers(d);
    if (st != DSC_OK) {
        dsc__error_prefix("llama decode for %d sequences x %d positions: ", o->batch, o->max_len);
        dsc_llama_decode_destroy(d);
        return st;
    }
    *out = d;
    return DSC_OK;
}

extern "C" void dsc_llama_decode_destroy(dsc_llama_decode *d) {
    if (!d) return;
    if (d->st) (void)cudaStreamSynchronize(d->st);
    dsc__cuda_blas_destroy(d->blas);
    dsc__cuda_buf_free(&d->rows);
    dsc__cuda_buf_free(&d->fixed);
    dsc__cuda_buf_free(&d->kv);
    if (d->h_io) (void)cudaFreeHost(d->h_io);
    if (d->h_logits) (void)cudaFreeHost(d->h_logits);
    if (d->h_chosen) (void)cudaFreeHost(d->h_chosen);
    if (d->own_stream) (void)cudaStreamDestroy(d->st);
    free(d->h_seq);
    free(d);
}

// ---- inputs ----

static void tensor_name(const void *cfg, int i, char *buf, int cap) {
    dsc_llama_tensor_info info;
    dsc_llama_tensor_info_get((const dsc_llama_config *)cfg, i, &info);
    snprintf(buf, (size_t)cap, "%s", info.name);
}

static dsc_status check_params(const dsc_llama_decode *d, const uint16_t *const *params) {
    return dsc__cuda_table_check((const void *const *)params, d->nt, "llama decode", "params",
                                 tensor_name, &d->c, NULL);
}

static dsc_status check_token(const dsc_llama_decode *d, int32_t tok, int b, int t) {
    return dsc__cuda_decode_check_token("llama decode", tok, d->c.vocab_size, b, t);
}

// Rows (b, t) for t in [from[b], upto[b]] of each sequence b < n, tokens from tok(b, t); each
// sequence's last row is its output. Uploads them and runs the pass.
template <typename Tok>
static dsc_status run_rows(dsc_llama_decode *d, const uint16_t *const *params, const int *from,
                           const int *upto, int n, Tok tok) {
    size_t R = 0;
    for (int b = 0; b < n; b++)
        R += (size_t)(upto[b] - from[b] + 1);
    DSC_TRY(rows_bufs(d, R));
    DSC_CUDA_TRY(cudaStreamSynchronize(d->st)); // h_io may still be on its way to the device
    size_t cap = d->cap, r = 0;
    int32_t *h = d->h_io;
    for (int b = 0; b < n; b++) {
        for (int t = from[b]; t <= upto[b]; t++, r++)
            h[r] = tok(b, t), h[cap + r] = b, h[2 * cap + r] = t;
        h[3 * cap + b] = (int32_t)r - 1;
    }
    // the three row arrays and the outputs, each at its place in io
    for (int k = 0; k < 3; k++)
        DSC_CUDA_TRY(cudaMemcpyAsync(d->io + k * cap, h + k * cap, sizeof(int32_t) * R,
                                     cudaMemcpyHostToDevice, d->st));
    DSC_CUDA_TRY(cudaMemcpyAsync(d->io + 3 * cap, h + 3 * cap, sizeof(int32_t) * n,
                                 cudaMemcpyHostToDevice, d->st));
    const dsc_llama_config *c = &d->c;
    DSC_TRY(dsc__cuda_embed_forward_h(d->x, d->io, params[0], (int64_t)R, c->hidden, false,
                                      d->st));
    for (int l = 0; l < c->n_layer; l++)
        DSC_TRY(layer(d, params, l, (int)R));
    DSC_TRY(head(d, params, n));
    d->n = n;
    return DSC_OK;
}

// Recompute mode: every sequence's whole prefix 0 .. last[b] again.
static dsc_status recompute(dsc_llama_decode *d, const uint16_t *const *params, const int *last,
                            int n) {
    int *from = (int *)calloc((size_t)n, sizeof(int));
    if (!from) return dsc__fail(DSC_ERR_OOM, "llama decode: out of host memory");
    const int32_t *seq = d->h_seq;
    size_t L = (size_t)d->max_len;
    dsc_status st = run_rows(d, params, from, last, n,
                             [&](int b, int t) { return seq[(size_t)b * L + (size_t)t]; });
    free(from);
    return st;
}

extern "C" dsc_status dsc_llama_decode_prefill(dsc_llama_decode *d, const uint16_t *const *params,
                                               const int32_t *const *tokens, const int *lens,
                                               int n) {
    DSC_CUDA_ARG(d && tokens && lens, "llama decode prefill: decoder, tokens and lengths must be "
                                      "set");
    DSC_CUDA_ARG(n >= 1 && n <= d->B, "llama decode prefill: %d rows, the decoder holds 1 .. %d",
                 n, d->B);
    DSC_TRY(check_params(d, params));
    for (int b = 0; b < n; b++) {
        DSC_CUDA_ARG(tokens[b] && lens[b] >= 1 && lens[b] <= d->max_len,
                     "llama decode prefill: prompt %d has %d tokens; 1 .. %d fit the cache", b,
                     lens[b], d->max_len);
        for (int t = 0; t < lens[b]; t++)
            DSC_TRY(check_token(d, tokens[b][t], b, t));
    }
    d->n = 0;
    int *from = (int *)calloc((size_t)n, sizeof(int));
    int *last = (int *)calloc((size_t)n, sizeof(int));
    dsc_status st = from && last ? DSC_OK
                                 : dsc__fail(DSC_ERR_OOM, "llama decode: out of host memory");
    for (int b = 0; st == DSC_OK && b < n; b++) {
        last[b] = lens[b] - 1;
        if (d->recompute)
            memcpy(d->h_seq + (size_t)b * d->max_len, tokens[b], sizeof(int32_t) * lens[b]);
    }
    if (st == DSC_OK)
        st = run_rows(d, params, from, last, n, [&](int b, int t) { return tokens[b][t]; });
    free(from);
    free(last);
    return st;
}

extern "C" dsc_status dsc_llama_decode_step(dsc_llama_decode *d, const uint16_t *const *params,
                                            const int32_t *tokens, const int32_t *pos, int n) {
    DSC_CUDA_ARG(d && tokens && pos, "llama decode step: decoder, tokens and positions must be "
                                     "set");
    DSC_CUDA_ARG(n >= 1 && n <= d->B, "llama decode step: %d rows, the decoder holds 1 .. %d", n,
                 d->B);
    DSC_TRY(check_params(d, params));
    for (int b = 0; b < n; b++) {
        DSC_CUDA_ARG(pos[b] >= 0 && pos[b] < d->max_len,
                     "llama decode step: row %d at position %d is outside the cache's %d "
                     "positions",
                     b, pos[b], d->max_len);
        DSC_TRY(check_token(d, tokens[b], b, pos[b]));
    }
    d->n = 0;
    int *at = (int *)malloc(sizeof(int) * (size_t)n);
    if (!at) return dsc__fail(DSC_ERR_OOM, "llama decode: out of host memory");
    for (int b = 0; b < n; b++) {
        at[b] = pos[b];
        if (d->recompute) d->h_seq[(size_t)b * d->max_len + pos[b]] = tokens[b];
    }
    dsc_status st = d->recompute ? recompute(d, params, at, n)
                                 : run_rows(d, params, at, at, n,
                                            [&](int b, int t) {
                                                (void)t; // one row per sequence
                                                return tokens[b];
                                            });
    free(at);
    return st;
}

// ---- results ----

extern "C" dsc_status dsc_llama_decode_argmax(dsc_llama_decode *d, int32_t *tokens) {
    DSC_CUDA_ARG(d && tokens, "llama decode argmax: decoder and output must be set");
    DSC_CUDA_ARG(d->n > 0, "llama decode argmax: no prefill or step has run (or the last "
                           "failed)");
    return dsc__cuda_decode_tokens_read(tokens, d->h_chosen, d->chosen, d->n, d->st);
}

extern "C" dsc_status dsc_llama_decode_logits(dsc_llama_decode *d, float *logits) {
    DSC_CUDA_ARG(d && logits, "llama decode logits: decoder and output must be set");
    DSC_CUDA_ARG(d->n > 0, "llama decode logits: no prefill or step has run (or the last "
                           "failed)");
    return dsc__cuda_decode_logits_read(logits, d->h_logits, d->logits, d->n, d->c.vocab_size,
                                        d->Vp, d->st);
}

// ---- the model interface's decoder (struct dsc_model_decode_ops) ----

// Host code only: hipcc's device pass would otherwise emit the table too, and then miss the
// host functions it points to.
#ifndef __HIP_DEVICE_COMPILE__

static dsc_status ops_create(const void *cfg, const dsc_model_decode_opts *o, void **dec) {
    dsc_llama_decode *d = NULL;
    DSC_TRY(dsc_llama_decode_create(&d, (const dsc_llama_config *)cfg, o));
    *dec = d;
    return DSC_OK;
}

static void ops_destroy(void *dec) { dsc_llama_decode_destroy((dsc_llama_decode *)dec); }

static size_t ops_kv_bytes(const void *cfg, int batch, int max_len) {
    return dsc_llama_decode_kv_bytes((const dsc_llama_config *)cfg, batch, max_len);
}

static dsc_status ops_prefill(void *dec, const uint16_t *const *params,
                              const int32_t *const *tokens, const int *lens, int n) {
    return dsc_llama_decode_prefill((dsc_llama_decode *)dec, params, tokens, lens, n);
}

static dsc_status ops_step(void *dec, const uint16_t *const *params, const int32_t *tokens,
                           const int32_t *pos, int n) {
    return dsc_llama_decode_step((dsc_llama_decode *)dec, params, tokens, pos, n);
}

static dsc_status ops_argmax(void *dec, int32_t *tokens) {
    return dsc_llama_decode_argmax((dsc_llama_decode *)dec, tokens);
}

static dsc_status ops_logits(void *dec, float *logits) {
    return dsc_llama_decode_logits((dsc_llama_decode *)dec, logits);
}

extern "C" const struct dsc_model_decode_ops dsc__llama_decode_ops = {
    ops_create, ops_destroy, ops_kv_bytes, ops_prefill, ops_step, ops_argmax, ops_logits, NULL,
};
#endif
