// model/llama/kernels.c - CPU kernels of the Llama layers (see kernels.h for the contracts).
#include "model/llama/kernels.h"

#include <cblas.h>  // cblas_sgemm
#include <math.h>   // sqrtf, logf, cos, sin, pow, INFINITY
#include <string.h> // memcpy, memset

#include "model/blas.h"    // dsc__exp_fast
#include "model/common.h"  // dsc__model_max_threads, dsc__model_thread_id
#include "model/kernels.h" // dsc__model_colsum, dsc__model_softmax_*, DSC_CLONES
#define NORM_CHUNK 32   // rows per partial sum of the RMSNorm weight gradient
#define ELEM_BLOCK 8192 // elements per task of an elementwise pass
#define ATT_TILE 64     // query rows per attention tile; keys beyond the tile's end are skipped

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- RMSNorm ----

// Shared by the forward and the backward's recomputation, so both produce the same bits.
// Hugging Face's order: w * (x * rstd).
static inline __attribute__((always_inline)) void rms_apply(float *out, const float *x, float r,
                                                            const float *w, int C) {
#pragma omp simd
    for (int c = 0; c < C; c++) out[c] = w[c] * (x[c] * r);
}

DSC_CLONES static void rms_row(float *out, float *rstd, const float *x, const float *w, float eps,
                               int C) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += x[c] * x[c];
    float r = 1.0f / sqrtf(s / (float)C + eps);
    rms_apply(out, x, r, w, C);
    *rstd = r;
}

DSC_CLONES static void rms_apply_row(float *out, const float *x, float r, const float *w, int C) {
    rms_apply(out, x, r, w, C);
}

void dsc__llama_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w,
                                float eps, int64_t N, int C) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < N; r++)
        rms_row(out + (size_t)r * C, rstd + r, inp + (size_t)r * C, w, eps, C);
}

void dsc__llama_rmsnorm_apply(float *out, const float *inp, const float *rstd, const float *w,
                              int64_t N, int C) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < N; r++)
        rms_apply_row(out + (size_t)r * C, inp + (size_t)r * C, rstd[r], w, C);
}

// With xh = x rstd and g = dy w: dx += rstd (g - xh mean(g xh)); pw += dy xh.
DSC_CLONES static void rms_bwd_row(float *dx, float *pw, const float *dy, const float *x,
                                   const float *w, float rstd, int C) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < C; c++) s += dy[c] * w[c] * (x[c] * rstd);
    s /= (float)C;
#pragma omp simd
    for (int c = 0; c < C; c++) {
        float xh = x[c] * rstd;
        dx[c] += rstd * (dy[c] * w[c] - xh * s);
        pw[c] += dy[c] * xh;
    }
}

size_t dsc__llama_rmsnorm_scratch(int64_t N, int C) {
    return (size_t)((N + NORM_CHUNK - 1) / NORM_CHUNK) * (size_t)C;
}

void dsc__llama_rmsnorm_backward(float *dinp, float *dw, float *scratch, const float *dout,
                                 const float *inp, const float *w, const float *rstd, int64_t N,
                                 int C) {
    int64_t nchunks = (N + NORM_CHUNK - 1) / NORM_CHUNK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < nchunks; k++) {
        float *pw = scratch + (size_t)k * C; // (nchunks, C) partial sums
        memset(pw, 0, sizeof(float) * (size_t)C);
        for (int64_t r = k * NORM_CHUNK; r < min64(N, (k + 1) * NORM_CHUNK); r++)
            rms_bwd_row(dinp + (size_t)r * C, pw, dout + (size_t)r * C, inp + (size_t)r * C, w,
                        rstd[r], C);
    }
    if (!dw) return; // a frozen weight (LoRA)
#pragma omp parallel for schedule(dynamic, 64)
    for (int c = 0; c < C; c++) {
        float sw = 0.0f;
        for (int64_t k = 0; k < nchunks; k++) sw += scratch[(size_t)k * C + c];
        dw[c] += sw;
    }
}

// ---- per-head RMSNorm of q and k (Qwen3) ----

void dsc__llama_head_norm_forward(float *x, int ld, float *raw, float *rstd, const float *wq,
                                  const float *wk, float eps, int64_t N, int nq, int nk, int hd) {
    int nh = nq + nk;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < N; r++) {
        for (int h = 0; h < nh; h++) {
            float *v = x + (size_t)r * ld + (size_t)h * hd;
            float r_unused, *rs = rstd ? rstd + r * nh + h : &r_unused;
            if (raw) {
                float *in = raw + ((size_t)r * nh + (size_t)h) * hd;
                memcpy(in, v, sizeof(float) * (size_t)hd);
                rms_row(v, rs, in, h < nq ? wq : wk, eps, hd);
            } else {
                // in place: rms_row reads each element before it writes it
                rms_row(v, rs, v, h < nq ? wq : wk, eps, hd);
            }
        }
    }
}

// rms_bwd_row's arithmetic with the input gradient replacing the output's in place.
DSC_CLONES static void head_bwd_row(float *d, float *pw, const float *x, const float *w,
                                    float rstd, int hd) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int c = 0; c < hd; c++) s += d[c] * w[c] * (x[c] * rstd);
    s /= (float)hd;
#pragma omp simd
    for (int c = 0; c < hd; c++) {
        float xh = x[c] * rstd;
        pw[c] += d[c] * xh;
        d[c] = rstd * (d[c] * w[c] - xh * s);
    }
}

size_t dsc__llama_head_norm_scratch(int64_t N, int hd) {
    return (size_t)((N + NORM_CHUNK - 1) / NORM_CHUNK) * 2 * (size_t)hd;
}

void dsc__llama_head_norm_backward(float *dx, int ld, float *dwq, float *dwk, float *scratch,
                                   const float *raw, const float *rstd, const float *wq,
                                   const float *wk, int64_t N, int nq, int nk, int hd) {
    int nh = nq + nk;
    int64_t nchunks = (N + NORM_CHUNK - 1) / NORM_CHUNK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < nchunks; k++) {
        float *pw = scratch + (size_t)k * 2 * hd; // (nchunks, 2, hd): q's then k's partial sums
        memset(pw, 0, sizeof(float) * 2 * (size_t)hd);
        for (int64_t r = k * NORM_CHUNK; r < min64(N, (k + 1) * NORM_CHUNK); r++)
            for (int h = 0; h < nh; h++)
                head_bwd_row(dx + (size_t)r * ld + (size_t)h * hd, pw + (h < nq ? 0 : hd),
                             raw + ((size_t)r * nh + (size_t)h) * hd, h < nq ? wq : wk,
                             rstd[r * nh + h], hd);
    }
    if (!dwq || !dwk) return; // frozen weights (LoRA)
#pragma omp parallel for schedule(static)
    for (int c = 0; c < 2 * hd; c++) {
        float sw = 0.0f;
        for (int64_t k = 0; k < nchunks; k++) sw += scratch[(size_t)k * 2 * hd + c];
        if (c < hd) dwq[c] += sw;
        else dwk[c - hd] += sw;
    }
}

// ---- rotary position embeddings ----

// Each step in fp32 as Hugging Face's float32 tensors do it (python scalars become fp32 operands).
static float llama3_inv_freq(float inv, double factor, double low, double high, int old_len) {
    float f = (float)factor;
    float wavelen = (float)(2.0 * 3.141592653589793) / inv;
    float low_wavelen = (float)((double)old_len / low);
    float high_wavelen = (float)((double)old_len / high);
    if (wavelen > low_wavelen) return inv / f; // long wavelengths: interpolated
    if (wavelen < high_wavelen) return inv;    // short wavelengths: as they are
    float smooth = ((float)old_len / wavelen - (float)low) / (float)(high - low);
    return (1.0f - smooth) * inv / f + smooth * inv;
}

void dsc__llama_rope_tables(float *cos_t, float *sin_t, int maxT, int hd, double theta,
                            int scaling, double factor, double low_freq, double high_freq,
                            int original_max_pos) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)hd;
        float inv = 1.0f / (float)pow((double)(float)theta, (double)e);
        if (scaling == 1) inv = inv / (float)factor; // DSC_LLAMA_ROPE_LINEAR
        if (scaling == 2)                            // DSC_LLAMA_ROPE_LLAMA3
            inv = llama3_inv_freq(inv, factor, low_freq, high_freq, original_max_pos);
        for (int t = 0; t < maxT; t++) {
            float a = (float)t * inv;
            cos_t[(size_t)t * half + i] = (float)cos((double)a);
            sin_t[(size_t)t * half + i] = (float)sin((double)a);
        }
    }
}

// One head: x1 = x[:half], x2 = x[half:]; out = (x1 c - x2 s, x2 c + x1 s), or with s -> -s.
DSC_CLONES static void rope_head(float *x, const float *c, const float *s, int half, float sign) {
#pragma omp simd
    for (int i = 0; i < half; i++) {
        float x1 = x[i], x2 = x[i + half], si = sign * s[i];
        x[i] = x1 * c[i] - x2 * si;
        x[i + half] = x2 * c[i] + x1 * si;
    }
}

void dsc__llama_rope_pos(float *x, int ld, const float *cos_t, const float *sin_t,
                         const int32_t *pos, int B, int T, int nh, int hd, int inverse) {
    int half = hd / 2;
    float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int64_t t = pos ? pos[bt] : bt % T;
        float *row = x + (size_t)bt * ld;
        for (int h = 0; h < nh; h++)
            rope_head(row + (size_t)h * hd, cos_t + (size_t)t * half, sin_t + (size_t)t * half,
                      half, sign);
    }
}

void dsc__llama_rope(float *x, int ld, const float *cos_t, const float *sin_t, int B, int T,
                     int nh, int hd, int inverse) {
    dsc__llama_rope_pos(x, ld, cos_t, sin_t, NULL, B, T, nh, hd, inverse);
}

// ---- SwiGLU ----

DSC_CLONES static void swiglu_fwd_block(float *h, const float *g, const float *u, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + dsc__exp_fast(-g[i])) * u[i];
}

// silu(g) = g s, s = sigmoid(g); silu'(g) = s (1 + g (1 - s)).
DSC_CLONES static void swiglu_bwd_block(float *dg, float *du, const float *dh, const float *g,
                                        const float *u, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) {
        float s = 1.0f / (1.0f + dsc__exp_fast(-g[i]));
        float d = dh[i];
        du[i] = d * (g[i] * s);
        dg[i] = d * u[i] * (s * (1.0f + g[i] * (1.0f - s)));
    }
}

void dsc__llama_swiglu_forward(float *h, const float *gate, const float *up, int64_t n) {
    int64_t nblocks = (n + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < nblocks; k++) {
        int64_t o = k * ELEM_BLOCK;
        swiglu_fwd_block(h + o, gate + o, up + o, min64(ELEM_BLOCK, n - o));
    }
}

void dsc__llama_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
                                const float *up, int64_t n) {
    int64_t nblocks = (n + ELEM_BLOCK - 1) / ELEM_BLOCK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t k = 0; k < nblocks; k++) {
        int64_t o = k * ELEM_BLOCK;
        swiglu_bwd_block(dgate + o, dup + o, dh + o, gate + o, up + o, min64(ELEM_BLOCK, n - o));
    }
}

// ---- causal grouped-query attention ----

// Row strides and the shape of one attention call.
typedef struct att_shape {
    int T, hd, ld, ldy; // ld: of qkv rows; ldy: of out rows (NH hd)
    float scale;
} att_shape;

// One (batch, query head): q, k, v (T, hd) with row stride ld, y (T, hd) with row stride ldy,
// S (T, T) scratch. Query tile [r0, r1) only needs keys [0, r1).
static void att_forward_bh(float *y, float *stats, const float *q, const float *k, const float *v,
                           float *S, const att_shape *s) {
    int T = s->T;
    for (int r0 = 0; r0 < T; r0 += ATT_TILE) {
        int r1 = (int)min64(T, r0 + ATT_TILE), nr = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, s->hd, s->scale,
                    q + (size_t)r0 * s->ld, s->ld, k, s->ld, 0.0f, S + (size_t)r0 * T, T);
        for (int t = r0; t < r1; t++) dsc__model_softmax_row(S + (size_t)t * T, t + 1, r1, stats + 2 * t);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, s->hd, r1, 1.0f,
                    S + (size_t)r0 * T, T, v, s->ld, 0.0f, y + (size_t)r0 * s->ldy, s->ldy);
    }
}

size_t dsc__llama_attention_scratch(int T, int slots) {
    return (size_t)slots * 2 * (size_t)T * (size_t)T;
}

void dsc__llama_attention_forward(float *out, float *stats, const float *qkv, float *scratch,
                                  int slots, int B, int T, int NH, int NKV, int hd) {
    att_shape s = {T, hd, (NH + 2 * NKV) * hd, NH * hd, 1.0f / sqrtf((float)hd)};
    int group = NH / NKV;
    int nthreads = dsc__model_max_threads() < slots ? dsc__model_max_threads() : slots;
#pragma omp parallel num_threads(nthreads)
    {
        float *S = scratch + (size_t)dsc__model_thread_id() * 2 * T * T; // (T, T) of this thread's slot
#pragma omp for schedule(dynamic, 1)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH, kvh = h / group;
            const float *row = qkv + (size_t)b * T * s.ld;
            const float *k = row + (size_t)(NH + kvh) * hd;
            att_forward_bh(out + (size_t)b * T * s.ldy + (size_t)h * hd,
                           stats + (size_t)bh * T * 2, row + (size_t)h * hd, k,
                           k + (size_t)NKV * hd, S, &s);
        }
    }
}

// Backward of one (batch, query head); P, dP (T, T) scratch. Query tiles give P, dS and dQ; then
// key tiles [j0, j1) give dV and dK from the rows t >= j0 that can see them, added to what the
// earlier heads of the group left there when beta is 1.
static void att_backward_bh(float *dq, float *dk, float *dv, const float *dy, const float *q,
                            const float *k, const float *v, const float *stats, float *P,
                            float *dP, const att_shape *s, float beta) {
    int T = s->T, hd = s->hd, ld = s->ld;
    for (int r0 = 0; r0 < T; r0 += ATT_TILE) {
        int r1 = (int)min64(T, r0 + ATT_TILE), nr = r1 - r0;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hd, s->scale,
                    q + (size_t)r0 * ld, ld, k, ld, 0.0f, P + (size_t)r0 * T, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, nr, r1, hd, 1.0f,
                    dy + (size_t)r0 * s->ldy, s->ldy, v, ld, 0.0f, dP + (size_t)r0 * T, T);
        for (int t = r0; t < r1; t++)
            dsc__model_softmax_grad_row(P + (size_t)t * T, dP + (size_t)t * T, t + 1, r1, stats + 2 * t);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nr, hd, r1, s->scale,
                    dP + (size_t)r0 * T, T, k, ld, 0.0f, dq + (size_t)r0 * ld, ld);
    }
    for (int j0 = 0; j0 < T; j0 += ATT_TILE) {
        int nk = (int)min64(ATT_TILE, T - j0), depth = T - j0;
        size_t at = (size_t)j0 * T + j0;
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, depth, 1.0f, P + at, T,
                    dy + (size_t)j0 * s->ldy, s->ldy, beta, dv + (size_t)j0 * ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, hd, depth, s->scale, dP + at, T,
                    q + (size_t)j0 * ld, ld, beta, dk + (size_t)j0 * ld, ld);
    }
}

void dsc__llama_attention_backward(float *dqkv, const float *dout, const float *qkv,
                                   const float *stats, float *scratch, int slots, int B, int T,
                                   int NH, int NKV, int hd) {
    att_shape s = {T, hd, (NH + 2 * NKV) * hd, NH * hd, 1.0f / sqrtf((float)hd)};
    int group = NH / NKV;
    int nthreads = dsc__model_max_threads() < slots ? dsc__model_max_threads() : slots;
#pragma omp parallel num_threads(nthreads)
    {
        float *P = scratch + (size_t)dsc__model_thread_id() * 2 * T * T; // (T, T) twice per slot
        float *dP = P + (size_t)T * T;
#pragma omp for schedule(dynamic, 1)
        for (int bk = 0; bk < B * NKV; bk++) {
            int b = bk / NKV, kvh = bk % NKV;
            size_t base = (size_t)b * T * s.ld, koff = (size_t)(NH + kvh) * hd;
            size_t voff = koff + (size_t)NKV * hd;
            for (int j = 0; j < group; j++) {
                int h = kvh * group + j;
                size_t qoff = (size_t)h * hd;
                att_backward_bh(dqkv + base + qoff, dqkv + base + koff, dqkv + base + voff,
                                dout + (size_t)b * T * s.ldy + qoff, qkv + base + qoff,
                                qkv + base + koff, qkv + base + voff,
                                stats + ((size_t)b * NH + h) * T * 2, P, dP, &s,
                                j ? 1.0f : 0.0f);
            }
        }
    }
}

// ---- token embeddings ----

void dsc__llama_embed_forward(float *out, const int32_t *inputs, const float *emb, int64_t N,
                              int C) {
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t r = 0; r < N; r++)
        memcpy(out + (size_t)r * C, emb + (size_t)inputs[r] * C, sizeof(float) * (size_t)C);
}

void dsc__llama_embed_backward(float *demb, const float *dout, const int32_t *inputs, int64_t N,
                               int C) {
    dsc__model_scatter_rows(demb, dout, inputs, N, C);
}
