// model/gpt2/kernels.c - CPU kernels of the GPT-2 layers (see kernels.h for the contracts).
#include "model/gpt2/kernels.h"

#include "model/blas.h"    // dsc__exp_fast
#include "model/common.h"  // dsc__model_max_threads, dsc__model_thread_id
#include "model/kernels.h" // dsc__model_colsum, dsc__model_softmax_*, DSC_CLONES

#include <cblas.h>  // cblas_sgemm
#include <math.h>   // sqrtf, logf, INFINITY
#include <string.h> // memcpy, memset
// Parallel loops hand out fixed tasks dynamically: a thread that the OS preempts (the machine
// may be shared) does not hold the others at the barrier, and since the tasks themselves never
// depend on the thread count, neither do the results.
#define LN_EPS 1e-5f
#define LN_CHUNK 32     // rows per partial sum of the layernorm parameter gradients
#define ELEM_BLOCK 8192 // elements per task of an elementwise pass
#define ATT_TILE 64     // query rows per attention tile; keys beyond the tile's end are skipped

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- math ----

#define GELU_K 0.79788456080286536f // sqrt(2 / pi)
#define GELU_A 0.044715f

// ---- layernorm ----

// Shared by the forward and the backward's recomputation, so both produce the same bits.
static inline __attribute__((always_inline)) void ln_apply(float *out, const float *x, float m,
                                                           float r, const float *w,
                                                           const float *b, int C) {
#pragma omp simd
    for (int c = 0; c < C; c++) out[c] = (x[c] - m) * r * w[c] + b[c];
}

DSC_CLONES static void ln_row(float *out, float *mean, float *rstd, const float *x, const float *w,
                              const float *b, int C) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c];
    float m = s / (float)C;
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(v / (float)C + LN_EPS);
    ln_apply(out, x, m, r, w, b, C);
    *mean = m;
    *rstd = r;
}

DSC_CLONES static void ln_apply_row(float *out, const float *x, float m, float r, const float *w,
                                    const float *b, int C) {
    ln_apply(out, x, m, r, w, b, C);
}

void dsc__gpt2_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                 const float *w, const float *b, int64_t N, int C) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < N; r++)
        ln_row(out + (size_t)r * C, mean + r, rstd + r, inp + (size_t)r * C, w, b, C);
}

void dsc__gpt2_layernorm_apply(float *out, const float *inp, const float *mean, const float *rstd,
                               const float *w, const float *b, int64_t N, int C) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < N; r++)
        ln_apply_row(out + (size_t)r * C, inp + (size_t)r * C, mean[r], rstd[r], w, b, C);
}

// dx += rstd (g - mean(g) - xhat mean(g xhat)) with g = dy w; pw += dy xhat; pb += dy.
DSC_CLONES static void ln_bwd_row(float *dx, float *pw, float *pb, const float *dy, const float *x,
                                  const float *w, float mean, float rstd, int C) {
    float s1 = 0.0f, s2 = 0.0f;
#pragma omp simd reduction(+ : s1, s2)
    for (int c = 0; c < C; c++) {
        float g = dy[c] * w[c];
        s1 += g;
        s2 += g * ((x[c] - mean) * rstd);
    }
    s1 /= (float)C;
    s2 /= (float)C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
        float xh = (x[c] - mean) * rstd;
        float g = dy[c] * w[c];
        dx[c] += rstd * (g - s1 - xh * s2);
        pw[c] += dy[c] * xh;
        pb[c] += dy[c];
    }
}

size_t dsc__gpt2_layernorm_scratch(int64_t N, int C) {
    return (size_t)((N + LN_CHUNK - 1) / LN_CHUNK) * 2 * (size_t)C;
}

void dsc__gpt2_layernorm_backward(float *dinp, float *dw, float *db, float *scratch,
                                  const float *dout, const float *inp, const float *w,
                                  const float *mean, const float *rstd, int64_t N, int C) {
    int64_t nchunks = (N + LN_CHUNK - 1) / LN_CHUNK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < nchunks; k++) {
        float *pw = scratch + (size_t)k * 2 * C; // (nchunks, 2, C) partial sums
        float *pb = pw + C;
        memset(pw, 0, sizeof(float) * 2 * (size_t)C);
        for (int64_t r = k * LN_CHUNK; r < min64(N, (k + 1) * LN_CHUNK); r++)
            ln_bwd_row(dinp + (size_t)r * C, pw, pb, dout + (size_t)r * C, inp + (size_t)r * C, w,
                       mean[r], rstd[r], C);
    }
    if (!dw || !db) return; // frozen (LoRA)
#pragma omp parallel for schedule(dynamic, 64)
    for (int c = 0; c < C; c++) {
        float sw = 0.0f, sb = 0.0f;
        for (int64_t k = 0; k < nchunks; k++) {
            sw += scratch[(size_t)k * 2 * C + c];
            sb += scratch[(size_t)k * 2 * C + C + c];
        }
        dw[c] += sw;
        db[c] += sb;
    }
}

// ---- GELU (tanh approximation) ----

// GELU(x) = 0.5 x (1 + tanh u), u = k (x + a x^3), rewritten with e = exp(2u) and s = 1 / (e + 1)
// as x e s: 1 + tanh u = 2 e s and 1 - tanh u = 2 s keep full relative precision where tanh u
// is near -1 or 1, which 1 + tanh u computed directly does not. e saturates at exp(88), so
// e s stays finite and rounds to 1.
DSC_CLONES static void gelu_fwd_block(float *out, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float e = dsc__exp_fast(2.0f * GELU_K * (x[i] + GELU_A * x[i] * x[i] * x[i]));
        out[i] = x[i] * (e / (e + 1.0f));
    }
}

// d GELU / dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u' = e s (1 + 2 x s u').
DSC_CLONES static void gelu_bwd_block(float *dx, const float *dy, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float e = dsc__exp_fast(2.0f * GELU_K * (xi + GELU_A * xi * xi * xi));
        float s = 1.0f / (e + 1.0f);
        float du = GELU_K * (1.0f + 3.0f * GELU_A * xi * xi);
        dx[i] = dy[i] * (e * s) * (1.0f + 2.0f * xi * s * du);
    }
}

void dsc__gpt2_gelu_forward(float *out, const float *inp, int64_t n) {
    int64_t nblocks = (n + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < nblocks; k++)
        gelu_fwd_block(out + k * ELEM_BLOCK, inp + k * ELEM_BLOCK,
                       min64(ELEM_BLOCK, n - k * ELEM_BLOCK));
}

void dsc__gpt2_gelu_backward(float *dinp, const float *dout, const float *inp, int64_t n) {
    int64_t nblocks = (n + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < nblocks; k++)
        gelu_bwd_block(dinp + k * ELEM_BLOCK, dout + k * ELEM_BLOCK, inp + k * ELEM_BLOCK,
                       min64(ELEM_BLOCK, n - k * ELEM_BLOCK));
}

// ---- causal self-attention ----

// One (batch, head): q, k, v (T, hs) with row stride 3C, y (T, hs) with row stride C,
// S (T, T) scratch. Query tile [r0, r1) only needs keys [0, r1).
static void att_forward_bh(float *y, float *stats, const float *q, const float *k, const float *v,
                           float *S, int T, int C, int hs, float scale) {
    int ld3 = 3 * C;
    for (int r0 = 0; r0 < T; r0 += ATT_TILE) {
        int r1 = (int)min64(T, r0 + ATT_TILE), nr = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, scale,
                    q + (size_t)r0 * ld3, ld3, k, ld3, 0.0f, S + (size_t)r0 * T, T);
        for (int t = r0; t < r1; t++) dsc__model_softmax_row(S + (size_t)t * T, t + 1, r1, stats + 2 * t);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, 1.0f,
                    S + (size_t)r0 * T, T, v, ld3, 0.0f, y + (size_t)r0 * C, C);
    }
}

size_t dsc__gpt2_attention_scratch(int T, int slots) {
    return (size_t)slots * 2 * (size_t)T * (size_t)T;
}

void dsc__gpt2_attention_forward(float *out, float *stats, const float *qkv, float *scratch,
                                 int slots, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    int nthreads = dsc__model_max_threads() < slots ? dsc__model_max_threads() : slots;
#pragma omp parallel num_threads(nthreads)
    {
        float *S = scratch + (size_t)dsc__model_thread_id() * 2 * T * T; // (T, T) of this thread's slot
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            const float *q = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
            att_forward_bh(out + (size_t)b * T * C + (size_t)h * hs, stats + (size_t)bh * T * 2, q,
                           q + C, q + 2 * C, S, T, C, hs, scale);
        }
    }
}

// Backward of one (batch, head); P, dP (T, T) scratch. Query tiles give P, dS and dQ; then key
// tiles [j0, j1) give dV and dK from the rows t >= j0 that can see them.
static void att_backward_bh(float *dq, const float *dy, const float *q, const float *stats,
                            float *P, float *dP, int T, int C, int hs, float scale) {
    int ld3 = 3 * C;
    const float *k = q + C, *v = q + 2 * C;
    float *dk = dq + C, *dv = dq + 2 * C;
    for (int r0 = 0; r0 < T; r0 += ATT_TILE) {
        int r1 = (int)min64(T, r0 + ATT_TILE), nr = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, scale,
                    q + (size_t)r0 * ld3, ld3, k, ld3, 0.0f, P + (size_t)r0 * T, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hs, 1.0f,
                    dy + (size_t)r0 * C, C, v, ld3, 0.0f, dP + (size_t)r0 * T, T);
        for (int t = r0; t < r1; t++)
            dsc__model_softmax_grad_row(P + (size_t)t * T, dP + (size_t)t * T, t + 1, r1, stats + 2 * t);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hs, r1, scale,
                    dP + (size_t)r0 * T, T, k, ld3, 0.0f, dq + (size_t)r0 * ld3, ld3);
    }
    for (int j0 = 0; j0 < T; j0 += ATT_TILE) {
        int nk = (int)min64(ATT_TILE, T - j0), depth = T - j0;
        size_t at = (size_t)j0 * T + j0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, depth, 1.0f, P + at, T,
                    dy + (size_t)j0 * C, C, 0.0f, dv + (size_t)j0 * ld3, ld3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hs, depth, scale, dP + at, T,
                    q + (size_t)j0 * ld3, ld3, 0.0f, dk + (size_t)j0 * ld3, ld3);
    }
}

void dsc__gpt2_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                  const float *stats, float *scratch, int slots, int B, int T,
                                  int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    int nthreads = dsc__model_max_threads() < slots ? dsc__model_max_threads() : slots;
#pragma omp parallel num_threads(nthreads)
    {
        float *P = scratch + (size_t)dsc__model_thread_id() * 2 * T * T; // (T, T) twice per slot
        float *dP = P + (size_t)T * T;
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH;
            size_t off3 = (size_t)b * T * 3 * C + (size_t)h * hs;
            att_backward_bh(dqkv + off3, dout + (size_t)b * T * C + (size_t)h * hs, qkv + off3,
                            stats + (size_t)bh * T * 2, P, dP, T, C, hs, scale);
        }
    }
}

// ---- token and position embeddings ----

void dsc__gpt2_encoder_forward(float *out, const int32_t *inputs, const int32_t *pos,
                               const float *wte, const float *wpe, int B, int T, int C) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        const float *e = wte + (size_t)inputs[bt] * C;
        const float *p = wpe + (size_t)(pos ? pos[bt] : bt % T) * C;
        float *o = out + (size_t)bt * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

void dsc__gpt2_encoder_backward(float *dwte, float *dwpe, const float *dout,
                                const int32_t *inputs, const int32_t *pos, int B, int T, int C) {
    if (dwte) dsc__model_scatter_rows(dwte, dout, inputs, (int64_t)B * T, C); // NULL: frozen
    if (!dwpe) return;
    if (pos) { // each wpe row still sums its positions in (b, t) order, as below
        dsc__model_scatter_rows(dwpe, dout, pos, (int64_t)B * T, C);
        return;
    }
#pragma omp parallel for schedule(dynamic, 8)
    for (int t = 0; t < T; t++) {
        float *g = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++) {
            const float *d = dout + ((size_t)b * T + t) * C;
#pragma omp simd
            for (int c = 0; c < C; c++) g[c] += d[c];
        }
    }
}
