// Unit tests of model/llama: every layer's forward against a float64 reference written here and
// its backward against float64 central differences of that reference (RMSNorm, rotary
// embeddings and their tables, SwiGLU, grouped-query attention, linear layers, cross-entropy
// with ignored targets), and the model's contracts (config parsing and the published shapes'
// parameter counts, parameter table, init, determinism across thread counts, accumulation,
// hooks, checks). The whole model is compared with Hugging Face's in tests/model/test_llama_hf.c.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // exp, log, sqrt, fabs, cos, sin, pow
#include <stdio.h>  // printf, snprintf
#include <stdlib.h> // malloc, calloc, free
#include <string.h> // memcmp, memcpy, strstr
#ifdef _OPENMP
#include <omp.h> // omp_set_num_threads
#endif

#include "dsc/memory.h"          // dsc_mem_*
#include "dsc/status.h"          // dsc_last_error
#include "model/llama/kernels.h" // dsc__llama_*
#include "model/kernels.h"       // dsc__model_xent_*
#include "model/linear.h"        // dsc__linear_*
#include "model/llama/llama.h"   // dsc_llama_*

// ---- random numbers and comparisons ----

static const uint64_t seed_base = 20241204;
static uint64_t rng_state;

static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void rng_seed(uint64_t s) { rng_state = seed_base * 1000003u + s; }

static double uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1.0p-53;
}

static float *rand_floats(size_t n, double lo, double hi) {
    float *x = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) x[i] = (float)uniform(lo, hi);
    return x;
}

static double *to_double(const float *x, size_t n) {
    double *d = malloc(sizeof(double) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

// max |got - want| / max |want|: the error relative to the tensor's scale.
static double rel_err(const float *got, const double *want, size_t n) {
    double num = 0.0, den = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return num / den;
}

static void expect_close(const char *what, const float *got, const double *want, size_t n,
                         double tol) {
    double e = rel_err(got, want, n);
    printf("  %-30s rel err %.3g (tol %.0e)\n", what, e, tol);
    if (!(e <= tol))
        fail_msg("%s: relative error %.3g > %.1g (seed %llu)", what, e, tol,
                 (unsigned long long)seed_base);
}

typedef double (*objective_fn)(void *ctx);

// Central difference of J with respect to *x, in float64.
static double central_diff(objective_fn J, void *ctx, double *x, double h) {
    double keep = *x;
    *x = keep + h;
    double jp = J(ctx);
    *x = keep - h;
    double jm = J(ctx);
    *x = keep;
    return (jp - jm) / (2.0 * h);
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

// ---- RMSNorm ----

typedef struct rms_ctx {
    int N, C;
    double eps, *x, *w, *dout, *out;
} rms_ctx;

static double rms_objective(void *p) {
    rms_ctx *k = p;
    for (int r = 0; r < k->N; r++) {
        const double *x = k->x + (size_t)r * k->C;
        double s = 0.0;
        for (int c = 0; c < k->C; c++) s += x[c] * x[c];
        double rs = 1.0 / sqrt(s / k->C + k->eps);
        for (int c = 0; c < k->C; c++) k->out[(size_t)r * k->C + c] = k->w[c] * x[c] * rs;
    }
    return dot(k->out, k->dout, (size_t)k->N * k->C);
}

static void test_rmsnorm(void **state) {
    (void)state;
    rng_seed(1);
    int N = 70, C = 19; // crosses a 32-row partial-sum chunk; C not a vector multiple
    size_t n = (size_t)N * C;
    float *x = rand_floats(n, -2, 3), *w = rand_floats(C, 0.5, 1.5), *dout = rand_floats(n, -1, 1);
    float *out = malloc(sizeof(float) * n), *rstd = malloc(sizeof(float) * N);
    float *dx = rand_floats(n, -1, 1), *dw = rand_floats(C, -1, 1); // += onto these
    float *dx0 = malloc(sizeof(float) * n), *dw0 = malloc(sizeof(float) * C);
    memcpy(dx0, dx, sizeof(float) * n), memcpy(dw0, dw, sizeof(float) * C);
    float *scratch = malloc(sizeof(float) * dsc__llama_rmsnorm_scratch(N, C));
    dsc__llama_rmsnorm_forward(out, rstd, x, w, 1e-5f, N, C);
    dsc__llama_rmsnorm_backward(dx, dw, scratch, dout, x, w, rstd, N, C);
    float *again = malloc(sizeof(float) * n); // backward's recomputation: the same bits
    dsc__llama_rmsnorm_apply(again, x, rstd, w, N, C);
    assert_memory_equal(again, out, sizeof(float) * n);

    rms_ctx k = {N, C, 1e-5, to_double(x, n), to_double(w, C), to_double(dout, n),
                 malloc(sizeof(double) * n)};
    rms_objective(&k);
    expect_close("rmsnorm forward", out, k.out, n, 1e-6);
    double *nx = malloc(sizeof(double) * n), *nw = malloc(sizeof(double) * C);
    for (size_t i = 0; i < n; i++) nx[i] = dx0[i] + central_diff(rms_objective, &k, &k.x[i], 1e-5);
    for (int c = 0; c < C; c++) nw[c] = dw0[c] + central_diff(rms_objective, &k, &k.w[c], 1e-5);
    expect_close("rmsnorm dinp (+=)", dx, nx, n, 1e-5);
    expect_close("rmsnorm dweight (+=)", dw, nw, C, 1e-5);
    free(x), free(w), free(dout), free(out), free(rstd), free(dx), free(dw), free(dx0), free(dw0);
    free(scratch), free(again), free(k.x), free(k.w), free(k.dout), free(k.out), free(nx), free(nw);
}

// ---- per-head RMSNorm of q and k (Qwen3) ----

// The norms of x (N rows of ld floats: nq heads of hd, then nk), weights wq then wk (2 hd),
// dotted with dout (the same layout).
typedef struct head_norm_ctx {
    int N, ld, nq, nk, hd;
    double eps, *x, *w, *dout;
} head_norm_ctx;

static double head_norm_objective(void *p) {
    head_norm_ctx *k = p;
    double J = 0.0;
    for (int r = 0; r < k->N; r++)
        for (int h = 0; h < k->nq + k->nk; h++) {
            const double *x = k->x + (size_t)r * k->ld + (size_t)h * k->hd;
            const double *w = k->w + (h < k->nq ? 0 : k->hd);
            double s = 0.0;
            for (int c = 0; c < k->hd; c++) s += x[c] * x[c];
            double rs = 1.0 / sqrt(s / k->hd + k->eps);
            for (int c = 0; c < k->hd; c++)
                J += w[c] * x[c] * rs * k->dout[(size_t)r * k->ld + (size_t)h * k->hd + c];
        }
    return J;
}

static void test_head_norm(void **state) {
    (void)state;
    rng_seed(11);
    // 3 query heads and 1 key head of 6, then 5 untouched floats per row (v's place); 40 rows
    // cross a 32-row partial-sum chunk.
    int N = 40, nq = 3, nk = 1, hd = 6, ld = (nq + nk) * hd + 5, nh = nq + nk;
    size_t n = (size_t)N * ld;
    float *x = rand_floats(n, -2, 3), *w = rand_floats(2 * (size_t)hd, 0.5, 1.5);
    float *y = malloc(sizeof(float) * n), *raw = malloc(sizeof(float) * (size_t)N * nh * hd);
    float *rstd = malloc(sizeof(float) * (size_t)N * nh), *plain = malloc(sizeof(float) * n);
    memcpy(y, x, sizeof(float) * n), memcpy(plain, x, sizeof(float) * n);
    dsc__llama_head_norm_forward(y, ld, raw, rstd, w, w + hd, 1e-6f, N, nq, nk, hd);
    dsc__llama_head_norm_forward(plain, ld, NULL, NULL, w, w + hd, 1e-6f, N, nq, nk, hd);
    assert_memory_equal(plain, y, sizeof(float) * n); // inference's in-place pass: the same bits
    head_norm_ctx k = {N, ld, nq, nk, hd, 1e-6, to_double(x, n), to_double(w, 2 * (size_t)hd),
                       malloc(sizeof(double) * n)};
    double *want = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) { // each output as J's derivative along one dout element
        memset(k.dout, 0, sizeof(double) * n);
        k.dout[i] = 1.0;
        want[i] = (int)(i % (size_t)ld) < nh * hd ? head_norm_objective(&k) : x[i];
    }
    expect_close("head norm forward (v untouched)", y, want, n, 1e-6);
    float *d = rand_floats(n, -1, 1), *dw = rand_floats(2 * (size_t)hd, -1, 1); // dw +=
    for (size_t i = 0; i < n; i++) k.dout[i] = d[i];
    float *dw0 = malloc(sizeof(float) * 2 * hd);
    memcpy(dw0, dw, sizeof(float) * 2 * hd);
    float *scratch = malloc(sizeof(float) * dsc__llama_head_norm_scratch(N, hd));
    dsc__llama_head_norm_backward(d, ld, dw, dw + hd, scratch, raw, rstd, w, w + hd, N, nq, nk, hd);
    double *nx = malloc(sizeof(double) * n), *nw = malloc(sizeof(double) * 2 * hd);
    for (size_t i = 0; i < n; i++)
        nx[i] = (int)(i % (size_t)ld) < nh * hd
                    ? central_diff(head_norm_objective, &k, &k.x[i], 1e-5)
                    : k.dout[i]; // v's gradient passes through
    for (int c = 0; c < 2 * hd; c++)
        nw[c] = dw0[c] + central_diff(head_norm_objective, &k, &k.w[c], 1e-5);
    expect_close("head norm dinp (in place)", d, nx, n, 1e-5);
    expect_close("head norm dq_norm, dk_norm (+=)", dw, nw, 2 * (size_t)hd, 1e-5);
    free(x), free(w), free(y), free(raw), free(rstd), free(plain), free(k.x), free(k.w);
    free(k.dout), free(want), free(d), free(dw), free(dw0), free(scratch), free(nx), free(nw);
}

// ---- rotary embeddings ----

// inv_freq as Hugging Face defines it, in float64 (the kernel's fp32 steps differ by ulps).
static double ref_inv_freq(int i, int hd, double theta, int scaling, double factor, double low,
                           double high, int old_len) {
    double inv = 1.0 / pow(theta, 2.0 * i / hd);
    if (scaling == DSC_LLAMA_ROPE_LINEAR) return inv / factor;
    if (scaling != DSC_LLAMA_ROPE_LLAMA3) return inv;
    double wavelen = 2.0 * M_PI / inv;
    if (wavelen > old_len / low) return inv / factor;
    if (wavelen < old_len / high) return inv;
    double s = (old_len / wavelen - low) / (high - low);
    return (1.0 - s) * inv / factor + s * inv;
}

static void check_rope_tables(int scaling, const char *what) {
    int T = 50, hd = 32, half = hd / 2;
    double theta = 5e5, factor = 8.0, low = 1.0, high = 4.0;
    int old_len = 64; // wavelengths of hd 32 at theta 5e5 span 6 .. 4e5: all three llama3 bands
    float *c = malloc(sizeof(float) * T * half), *s = malloc(sizeof(float) * T * half);
    dsc__llama_rope_tables(c, s, T, hd, theta, scaling, factor, low, high, old_len);
    double *wc = malloc(sizeof(double) * T * half), *ws = malloc(sizeof(double) * T * half);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double a = t * ref_inv_freq(i, hd, theta, scaling, factor, low, high, old_len);
            wc[t * half + i] = cos(a), ws[t * half + i] = sin(a);
        }
    char name[64];
    snprintf(name, sizeof name, "rope table cos (%s)", what);
    expect_close(name, c, wc, (size_t)T * half, 2e-5); // fp32 angles up to 50 rad
    snprintf(name, sizeof name, "rope table sin (%s)", what);
    expect_close(name, s, ws, (size_t)T * half, 2e-5);
    free(c), free(s), free(wc), free(ws);
}

static void test_rope(void **state) {
    (void)state;
    check_rope_tables(DSC_LLAMA_ROPE_NONE, "none");
    check_rope_tables(DSC_LLAMA_ROPE_LINEAR, "linear");
    check_rope_tables(DSC_LLAMA_ROPE_LLAMA3, "llama3");
    // Apply: x (B, T, ld) with 3 heads of 10 channels and 2 spare columns left alone.
    rng_seed(2);
    int B = 2, T = 7, nh = 3, hd = 10, half = 5, ld = nh * hd + 2;
    size_t n = (size_t)B * T * ld;
    float *c = malloc(sizeof(float) * T * half), *s = malloc(sizeof(float) * T * half);
    dsc__llama_rope_tables(c, s, T, hd, 1e4, DSC_LLAMA_ROPE_NONE, 1, 0, 0, 0);
    float *x = rand_floats(n, -2, 2), *y = malloc(sizeof(float) * n);
    memcpy(y, x, sizeof(float) * n);
    dsc__llama_rope(y, ld, c, s, B, T, nh, hd, 0);
    double *want = to_double(x, n);
    for (int bt = 0; bt < B * T; bt++) // rotate_half: pairs (i, i + half)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < half; i++) {
                int t = bt % T;
                size_t a = (size_t)bt * ld + h * hd + i, b = a + half;
                double ca = cos(t * pow(1e4, -2.0 * i / hd)), sa = sin(t * pow(1e4, -2.0 * i / hd));
                want[a] = x[a] * ca - x[b] * sa;
                want[b] = x[b] * ca + x[a] * sa;
            }
    expect_close("rope forward", y, want, n, 1e-6);
    dsc__llama_rope(y, ld, c, s, B, T, nh, hd, 1); // the backward: the inverse rotation
    double *orig = to_double(x, n);
    expect_close("rope inverse (backward)", y, orig, n, 1e-6);
    free(c), free(s), free(x), free(y), free(want), free(orig);
}

// ---- SwiGLU ----

typedef struct swiglu_ctx {
    size_t n;
    double *g, *u, *dh, *out;
} swiglu_ctx;

static double swiglu_objective(void *p) {
    swiglu_ctx *k = p;
    for (size_t i = 0; i < k->n; i++) k->out[i] = k->g[i] / (1.0 + exp(-k->g[i])) * k->u[i];
    return dot(k->out, k->dh, k->n);
}

static void test_swiglu(void **state) {
    (void)state;
    rng_seed(3);
    size_t n = 9000; // crosses an 8192-element task
    float *g = rand_floats(n, -9, 9), *u = rand_floats(n, -2, 2), *dh = rand_floats(n, -1, 1);
    g[0] = -100.0f, g[1] = 100.0f; // saturated ends
    float *h = malloc(sizeof(float) * n), *dg = malloc(sizeof(float) * n);
    float *du = malloc(sizeof(float) * n);
    dsc__llama_swiglu_forward(h, g, u, (int64_t)n);
    dsc__llama_swiglu_backward(dg, du, dh, g, u, (int64_t)n);
    swiglu_ctx k = {n, to_double(g, n), to_double(u, n), to_double(dh, n),
                    malloc(sizeof(double) * n)};
    swiglu_objective(&k);
    expect_close("swiglu forward", h, k.out, n, 1e-6);
    // One element at a time: the objective is a sum of independent terms, so perturbing g[i]
    // moves only term i; differentiate that term alone.
    double *ng = malloc(sizeof(double) * n), *nu = malloc(sizeof(double) * n);
    for (size_t i = 0; i < n; i++) {
        double gi = k.g[i], ui = k.u[i], e = 1e-6;
        double fp = (gi + e) / (1 + exp(-(gi + e))) * ui, fm = (gi - e) / (1 + exp(-(gi - e))) * ui;
        ng[i] = k.dh[i] * (fp - fm) / (2 * e);
        nu[i] = k.dh[i] * gi / (1 + exp(-gi));
    }
    expect_close("swiglu dgate", dg, ng, n, 1e-5);
    expect_close("swiglu dup", du, nu, n, 1e-6);
    dsc__llama_swiglu_backward(dh, du, dh, g, u, (int64_t)n); // dgate may alias dh
    assert_memory_equal(dh, dg, sizeof(float) * n);
    free(g), free(u), free(dh), free(h), free(dg), free(du), free(k.g), free(k.u), free(k.dh);
    free(k.out), free(ng), free(nu);
}

// ---- grouped-query attention ----

typedef struct att_ctx {
    int B, T, NH, NKV, hd;
    double *qkv, *dout, *out;
} att_ctx;

static void ref_attention(double *out, const double *qkv, int B, int T, int NH, int NKV, int hd) {
    int ld = (NH + 2 * NKV) * hd, group = NH / NKV;
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * ld + h * hd;
                size_t koff = (size_t)(NH + h / group) * hd, voff = koff + (size_t)NKV * hd;
                double m = -INFINITY, s = 0.0;
                for (int j = 0; j <= t; j++) {
                    p[j] = dot(q, qkv + ((size_t)b * T + j) * ld + koff, hd) / sqrt((double)hd);
                    if (p[j] > m) m = p[j];
                }
                for (int j = 0; j <= t; j++) s += (p[j] = exp(p[j] - m));
                double *o = out + ((size_t)b * T + t) * NH * hd + h * hd;
                for (int d = 0; d < hd; d++) o[d] = 0.0;
                for (int j = 0; j <= t; j++) {
                    const double *v = qkv + ((size_t)b * T + j) * ld + voff;
                    for (int d = 0; d < hd; d++) o[d] += p[j] / s * v[d];
                }
            }
    free(p);
}

static double att_objective(void *p) {
    att_ctx *k = p;
    ref_attention(k->out, k->qkv, k->B, k->T, k->NH, k->NKV, k->hd);
    return dot(k->out, k->dout, (size_t)k->B * k->T * k->NH * k->hd);
}

static void check_attention(int B, int T, int NH, int NKV, int hd, int stride) {
    int ld = (NH + 2 * NKV) * hd;
    size_t n3 = (size_t)B * T * ld, n1 = (size_t)B * T * NH * hd;
    float *qkv = rand_floats(n3, -2, 2), *dout = rand_floats(n1, -1, 1);
    float *out = malloc(sizeof(float) * n1), *dqkv = malloc(sizeof(float) * n3);
    float *stats = malloc(sizeof(float) * 2 * (size_t)B * NH * T);
    int slots = 3;
    float *scratch = malloc(sizeof(float) * dsc__llama_attention_scratch(T, slots));
    dsc__llama_attention_forward(out, stats, qkv, scratch, slots, B, T, NH, NKV, hd);
    dsc__llama_attention_backward(dqkv, dout, qkv, stats, scratch, slots, B, T, NH, NKV, hd);
    att_ctx k = {B, T, NH, NKV, hd, to_double(qkv, n3), to_double(dout, n1),
                 malloc(sizeof(double) * n1)};
    att_objective(&k);
    char what[64];
    snprintf(what, sizeof what, "attention fwd T=%d NH=%d NKV=%d", T, NH, NKV);
    expect_close(what, out, k.out, n1, 1e-6);
    size_t ns = (n3 + stride - 1) / stride;
    double *num = malloc(sizeof(double) * ns);
    float *got = malloc(sizeof(float) * ns);
    for (size_t i = 0, j = 0; i < n3; i += stride, j++) {
        num[j] = central_diff(att_objective, &k, &k.qkv[i], 1e-5);
        got[j] = dqkv[i];
    }
    snprintf(what, sizeof what, "attention dqkv T=%d NH=%d NKV=%d", T, NH, NKV);
    expect_close(what, got, num, ns, 1e-5);
    free(qkv), free(dout), free(out), free(dqkv), free(stats), free(scratch), free(k.qkv);
    free(k.dout), free(k.out), free(num), free(got);
}

static void test_attention(void **state) {
    (void)state;
    rng_seed(4);
    check_attention(2, 5, 4, 2, 6, 1);   // GQA, every entry
    check_attention(2, 6, 3, 1, 4, 1);   // MQA
    check_attention(1, 70, 4, 2, 8, 7);  // two 64-row tiles; stride 7 samples q, k and v
    check_attention(1, 131, 2, 2, 4, 5); // plain multi-head, three tiles
}

// ---- linear layers ----

typedef struct lin_ctx {
    int N, IN, OUT;
    double *x, *w, *b, *resid, *dout, *out;
} lin_ctx;

static double lin_objective(void *p) {
    lin_ctx *k = p;
    for (int r = 0; r < k->N; r++)
        for (int o = 0; o < k->OUT; o++) {
            double s = k->b[o] + k->resid[(size_t)r * k->OUT + o];
            for (int i = 0; i < k->IN; i++)
                s += k->x[(size_t)r * k->IN + i] * k->w[(size_t)o * k->IN + i];
            k->out[(size_t)r * k->OUT + o] = s;
        }
    return dot(k->out, k->dout, (size_t)k->N * k->OUT);
}

static void test_linear(void **state) {
    (void)state;
    rng_seed(5);
    int N = 37, IN = 13, OUT = 11, ldo = 17; // out is a column slice of wider rows
    float *x = rand_floats((size_t)N * IN, -1, 1), *w = rand_floats((size_t)OUT * IN, -1, 1);
    float *b = rand_floats(OUT, -1, 1), *resid = rand_floats((size_t)N * OUT, -1, 1);
    float *dout = rand_floats((size_t)N * ldo, -1, 1);
    float *out = rand_floats((size_t)N * ldo, -1, 1), *out0 = malloc(sizeof(float) * N * ldo);
    memcpy(out0, out, sizeof(float) * N * ldo);
    dsc__linear lin = {.w = w, .bias = b, .in = IN, .out = OUT};
    dsc__linear_forward(lin, out, ldo, x, IN, resid, N);
    lin_ctx k = {N, IN, OUT, to_double(x, (size_t)N * IN), to_double(w, (size_t)OUT * IN),
                 to_double(b, OUT), to_double(resid, (size_t)N * OUT),
                 calloc((size_t)N * OUT, sizeof(double)), malloc(sizeof(double) * N * OUT)};
    for (int r = 0; r < N; r++) // the slice of dout the layer sees
        for (int o = 0; o < OUT; o++) k.dout[(size_t)r * OUT + o] = dout[(size_t)r * ldo + o];
    lin_objective(&k);
    float *slice = malloc(sizeof(float) * N * OUT);
    for (int r = 0; r < N; r++) {
        memcpy(slice + (size_t)r * OUT, out + (size_t)r * ldo, sizeof(float) * OUT);
        assert_memory_equal(out + (size_t)r * ldo + OUT, out0 + (size_t)r * ldo + OUT,
                            sizeof(float) * (ldo - OUT)); // the rest of the row untouched
    }
    expect_close("linear forward (bias, resid)", slice, k.out, (size_t)N * OUT, 1e-6);
    float *dx = rand_floats((size_t)N * IN, -1, 1), *dw = calloc((size_t)OUT * IN, sizeof(float));
    float *db = calloc(OUT, sizeof(float));
    double *base = to_double(dx, (size_t)N * IN);
    dsc__linear_backward(lin, dx, true, dw, db, dout, ldo, x, IN, N);
    double *nx = malloc(sizeof(double) * N * IN), *nw = malloc(sizeof(double) * OUT * IN);
    double *nb = malloc(sizeof(double) * OUT);
    for (int i = 0; i < N * IN; i++)
        nx[i] = base[i] + central_diff(lin_objective, &k, &k.x[i], 1e-5);
    for (int i = 0; i < OUT * IN; i++) nw[i] = central_diff(lin_objective, &k, &k.w[i], 1e-5);
    for (int i = 0; i < OUT; i++) nb[i] = central_diff(lin_objective, &k, &k.b[i], 1e-5);
    expect_close("linear dinp (accumulate)", dx, nx, (size_t)N * IN, 1e-5);
    expect_close("linear dweight", dw, nw, (size_t)OUT * IN, 1e-5);
    expect_close("linear dbias", db, nb, OUT, 1e-5);
    free(x), free(w), free(b), free(resid), free(dout), free(out), free(out0), free(slice);
    free(dx), free(dw), free(db), free(base), free(nx), free(nw), free(nb);
    free(k.x), free(k.w), free(k.b), free(k.resid), free(k.dout), free(k.out);
}

// ---- cross-entropy with ignored targets ----

static void test_xent_ignored(void **state) {
    (void)state;
    rng_seed(6);
    int N = 9, V = 23;
    float *l = rand_floats((size_t)N * V, -5, 5), *losses = malloc(sizeof(float) * N);
    float *lse = malloc(sizeof(float) * N), *d = malloc(sizeof(float) * N * V);
    int32_t tg[9] = {3, -100, 0, 22, -1, 7, 7, -100, 11};
    dsc__model_xent_forward(losses, lse, l, tg, N, V);
    dsc__model_xent_backward(d, l, lse, tg, 0.5f, N, V);
    double wl[9], *wd = calloc((size_t)N * V, sizeof(double));
    for (int r = 0; r < N; r++) {
        const float *row = l + (size_t)r * V;
        double m = -INFINITY, s = 0.0;
        for (int j = 0; j < V; j++) m = row[j] > m ? row[j] : m;
        for (int j = 0; j < V; j++) s += exp(row[j] - m);
        double z = m + log(s);
        wl[r] = tg[r] < 0 ? 0.0 : z - row[tg[r]];
        for (int j = 0; j < V && tg[r] >= 0; j++)
            wd[(size_t)r * V + j] = 0.5 * (exp(row[j] - z) - (j == tg[r]));
    }
    expect_close("xent losses (ignored = 0)", losses, wl, N, 1e-6);
    expect_close("xent dlogits (ignored rows 0)", d, wd, (size_t)N * V, 1e-6);
    for (int j = 0; j < V; j++) assert_true(d[V + j] == 0.0f && d[4 * V + j] == 0.0f);
    free(l), free(losses), free(lse), free(d), free(wd);
}

// ---- the model ----

typedef struct model {
    dsc_llama_config c;
    int n;
    float **p, **g;
    int64_t *numel;
} model;

static model model_new(const dsc_llama_config *c, uint64_t seed) {
    model m = {.c = *c, .n = dsc_llama_num_tensors(c)};
    m.p = calloc(m.n, sizeof(float *));
    m.g = calloc(m.n, sizeof(float *));
    m.numel = calloc(m.n, sizeof(int64_t));
    for (int i = 0; i < m.n; i++) {
        dsc_llama_tensor_info info;
        dsc_llama_tensor_info_get(c, i, &info);
        m.numel[i] = info.numel;
        m.p[i] = malloc(sizeof(float) * info.numel);
        m.g[i] = calloc(info.numel, sizeof(float));
    }
    dsc_llama_init_weights(c, m.p, seed);
    for (int i = 0; i < m.n; i++) { // wider weights (std 0.1), norms and biases off 1 and 0
        dsc_llama_tensor_info info;
        dsc_llama_tensor_info_get(c, i, &info);
        for (int64_t j = 0; j < m.numel[i]; j++)
            m.p[i][j] = info.ndim == 2 ? m.p[i][j] * 5.0f : m.p[i][j] + (float)uniform(-0.2, 0.2);
    }
    return m;
}

static void model_zero_grads(model *m) {
    for (int i = 0; i < m->n; i++) memset(m->g[i], 0, sizeof(float) * m->numel[i]);
}

static void model_free(model *m) {
    for (int i = 0; i < m->n; i++) free(m->p[i]), free(m->g[i]);
    free(m->p), free(m->g), free(m->numel);
}

// A small GQA model with Qwen2's biases, untied, llama3 scaling, and an odd intermediate size.
static dsc_llama_config small_config(int tied) {
    dsc_llama_config c = {.n_layer = 2, .hidden = 32, .n_head = 4, .n_kv_head = 2, .head_dim = 8,
                          .intermediate = 45, .vocab_size = 37, .max_seq_len = 80,
                          .rms_eps = 1e-5f, .rope_theta = 5e5,
                          .rope_scaling = DSC_LLAMA_ROPE_LLAMA3, .rope_factor = 8,
                          .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                          .rope_original_max_pos = 32, .tied = tied, .qkv_bias = 1};
    return c;
}

static void random_tokens(int32_t *t, int n, int V) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rng_next() % (uint64_t)V);
}

static void test_model_determinism_accumulation(void **state) {
    (void)state;
    dsc_llama_config c = small_config(0);
    model m = model_new(&c, 21);
    int B = 3, T = 70; // two attention tiles, several chunks
    int32_t in[210], tg[210];
    rng_seed(22);
    random_tokens(in, B * T, c.vocab_size);
    random_tokens(tg, B * T, c.vocab_size);
    for (int i = 0; i < B * T; i += 5) tg[i] = -100;
    dsc_llama *net = NULL;
    assert_int_equal(dsc_llama_create(&net, &c, B, T), DSC_OK);
    size_t nl = (size_t)B * T * c.vocab_size;
    float *logits1 = malloc(sizeof(float) * nl);
    float **g1 = calloc(m.n, sizeof(float *));
    float loss[4];
    for (int run = 0; run < 4; run++) {
#ifdef _OPENMP
        omp_set_num_threads(run == 1 ? 1 : 2); // run 1 single-threaded
#endif
        model_zero_grads(&m);
        assert_int_equal(dsc_llama_forward(net, m.p, in, tg, B, T, NULL, &loss[run]), DSC_OK);
        if (run == 0) memcpy(logits1, dsc_llama_logits(net), sizeof(float) * nl);
        else assert_memory_equal(logits1, dsc_llama_logits(net), sizeof(float) * nl);
        float scale = run == 2 ? 4.0f : 1.0f;
        assert_int_equal(dsc_llama_backward(net, m.p, m.g, scale, NULL), DSC_OK);
        if (run == 3) { // a second micro-step accumulates
            assert_int_equal(dsc_llama_forward(net, m.p, in, tg, B, T, NULL, &loss[run]), DSC_OK);
            assert_int_equal(dsc_llama_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
        }
        for (int i = 0; i < m.n; i++) {
            if (run == 0) {
                g1[i] = malloc(sizeof(float) * m.numel[i]);
                memcpy(g1[i], m.g[i], sizeof(float) * m.numel[i]);
                double norm = 0.0;
                for (int64_t j = 0; j < m.numel[i]; j++) norm += fabs(g1[i][j]);
                if (!(norm > 0.0)) fail_msg("tensor %d has no gradient", i);
            } else if (run == 1) {
                assert_memory_equal(g1[i], m.g[i], sizeof(float) * m.numel[i]);
            } else {
                double *want = malloc(sizeof(double) * m.numel[i]);
                double factor = run == 2 ? 4.0 : 2.0;
                for (int64_t j = 0; j < m.numel[i]; j++) want[j] = factor * g1[i][j];
                double e = rel_err(m.g[i], want, m.numel[i]);
                if (!(e <= 1e-6)) fail_msg("run %d tensor %d: rel err %.3g", run, i, e);
                free(want);
            }
        }
        assert_true(memcmp(&loss[0], &loss[run], sizeof(float)) == 0);
    }
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    // All targets ignored: loss 0 and no gradient at all.
    for (int i = 0; i < B * T; i++) tg[i] = -100;
    model_zero_grads(&m);
    float l = 1.0f;
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg, B, T, NULL, &l), DSC_OK);
    assert_true(l == 0.0f);
    assert_int_equal(dsc_llama_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
    for (int i = 0; i < m.n; i++)
        for (int64_t j = 0; j < m.numel[i]; j++) assert_true(m.g[i][j] == 0.0f);
    for (int i = 0; i < m.n; i++) free(g1[i]);
    free(g1), free(logits1);
    dsc_llama_destroy(net);
    model_free(&m);
}

// The mean is over the targets not ignored: masking a position changes the loss to the mean of
// the others, which a forward on only the unmasked ones (same sequence) confirms.
static void test_model_masked_mean(void **state) {
    (void)state;
    dsc_llama_config c = small_config(1);
    model m = model_new(&c, 5);
    int T = 12;
    int32_t in[12], tg[12], tg2[12];
    rng_seed(7);
    random_tokens(in, T, c.vocab_size);
    random_tokens(tg, T, c.vocab_size);
    dsc_llama *net = NULL;
    assert_int_equal(dsc_llama_create(&net, &c, 1, T), DSC_OK);
    float loss_all;
    int nslots = dsc_llama_timing_slots(&c);
    double *times = calloc(nslots, sizeof(double));
    dsc_llama_set_timing(net, times);
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg, 1, T, NULL, &loss_all), DSC_OK);
    dsc_llama_set_timing(net, NULL);
    for (int k = 0; k < nslots; k++) // every leaf module took some time
        if (!(times[k] > 0.0)) fail_msg("timing slot %d got %g s", k, times[k]);
    free(times);
    const float *lg = dsc_llama_logits(net);
    double per[12], sum = 0.0;
    for (int t = 0; t < T; t++) {
        const float *row = lg + (size_t)t * c.vocab_size;
        double mx = -INFINITY, s = 0.0;
        for (int j = 0; j < c.vocab_size; j++) mx = row[j] > mx ? row[j] : mx;
        for (int j = 0; j < c.vocab_size; j++) s += exp(row[j] - mx);
        per[t] = mx + log(s) - row[tg[t]];
    }
    memcpy(tg2, tg, sizeof tg);
    for (int t = 0; t < T; t += 3) tg2[t] = -100;
    int kept = 0;
    for (int t = 0; t < T; t++)
        if (tg2[t] >= 0) sum += per[t], kept++;
    float loss_masked;
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg2, 1, T, NULL, &loss_masked), DSC_OK);
    printf("  masked mean %.7f, reference %.7f (%d of %d kept)\n", loss_masked, sum / kept, kept,
           T);
    assert_true(fabs(loss_masked - sum / kept) <= 1e-5 * fabs(sum / kept));
    assert_true(fabs(loss_masked - loss_all) > 1e-6);
    dsc_llama_destroy(net);
    model_free(&m);
}

// Activations in a pool block: the same bits as a private slab, also when the pool compacts
// (moving the block) between a forward and its backward.
static void test_model_in_pool(void **state) {
    (void)state;
    dsc_llama_config c = small_config(1);
    model m = model_new(&c, 41);
    int B = 2, T = 9;
    int32_t in[18], tg[18];
    rng_seed(42);
    random_tokens(in, B * T, c.vocab_size);
    random_tokens(tg, B * T, c.vocab_size);
    dsc_llama *plain = NULL, *pooled = NULL;
    assert_int_equal(dsc_llama_create(&plain, &c, B, T), DSC_OK);
    float lp, lq;
    assert_int_equal(dsc_llama_forward(plain, m.p, in, tg, B, T, NULL, &lp), DSC_OK);
    assert_int_equal(dsc_llama_backward(plain, m.p, m.g, 1.0f, NULL), DSC_OK);
    float **g1 = calloc(m.n, sizeof(float *));
    for (int i = 0; i < m.n; i++) {
        g1[i] = malloc(sizeof(float) * m.numel[i]);
        memcpy(g1[i], m.g[i], sizeof(float) * m.numel[i]);
    }
    dsc_mem_pool *pool = NULL;
    assert_int_equal(dsc_mem_pool_create(&pool, DSC_MEM_HOST, 0, NULL), DSC_OK);
    dsc_mem_handle hole;
    assert_int_equal(dsc_mem_alloc(pool, 1 << 20, "test.hole", &hole), DSC_OK);
    assert_int_equal(dsc_llama_create_in(&pooled, &c, B, T, pool), DSC_OK);
    dsc_mem_free(pool, hole); // a hole below the activations for compaction to close
    model_zero_grads(&m);
    assert_int_equal(dsc_llama_forward(pooled, m.p, in, tg, B, T, NULL, &lq), DSC_OK);
    uint64_t gen = dsc_mem_generation(pool);
    size_t moved = 0;
    assert_int_equal(dsc_mem_defragment(pool, &moved), DSC_OK);
    assert_true(moved > 0 && dsc_mem_generation(pool) != gen);
    dsc_mem_handle junk; // takes the space the activations left and fills it with NaNs
    assert_int_equal(dsc_mem_alloc(pool, 4 << 20, "test.junk", &junk), DSC_OK);
    memset(dsc_mem_ptr(pool, junk), 0xff, 4 << 20);
    assert_int_equal(dsc_llama_backward(pooled, m.p, m.g, 1.0f, NULL), DSC_OK);
    assert_true(memcmp(&lp, &lq, sizeof lp) == 0);
    for (int i = 0; i < m.n; i++) assert_memory_equal(g1[i], m.g[i], sizeof(float) * m.numel[i]);
    for (int i = 0; i < m.n; i++) free(g1[i]);
    free(g1);
    dsc_llama_destroy(pooled);
    dsc_llama_destroy(plain);
    dsc_mem_pool_destroy(pool);
    model_free(&m);
}

// ---- the whole model in float64 ----

// out (N, OUT) = x (N, IN) @ w^T (w (OUT, IN)) + bias (may be NULL).
static void ref_linear(double *out, const double *x, const double *w, const double *bias, int N,
                       int IN, int OUT) {
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OUT; o++)
            out[(size_t)r * OUT + o] =
                (bias ? bias[o] : 0.0) + dot(x + (size_t)r * IN, w + (size_t)o * IN, IN);
}

static void ref_rms(double *out, const double *x, const double *w, double eps, int N, int C) {
    for (int r = 0; r < N; r++) {
        const double *xr = x + (size_t)r * C;
        double rs = 1.0 / sqrt(dot(xr, xr, C) / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = w[c] * xr[c] * rs;
    }
}

// In place on nh heads of hd channels per row (row stride ld), rotate_half at position t.
static void ref_rope(double *x, int ld, const dsc_llama_config *c, int B, int T, int nh) {
    int hd = c->head_dim, half = hd / 2;
    for (int bt = 0; bt < B * T; bt++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < half; i++) {
                double a = (bt % T) * ref_inv_freq(i, hd, c->rope_theta, c->rope_scaling,
                                                   c->rope_factor, c->rope_low_freq_factor,
                                                   c->rope_high_freq_factor,
                                                   c->rope_original_max_pos);
                double *p = x + (size_t)bt * ld + (size_t)h * hd + i, x1 = p[0], x2 = p[half];
                p[0] = x1 * cos(a) - x2 * sin(a);
                p[half] = x2 * cos(a) + x1 * sin(a);
            }
}

// Mean cross-entropy over the targets not ignored; P in dsc's table order.
static double ref_model_loss(const dsc_llama_config *c, double **P, const int32_t *in,
                             const int32_t *tg, int B, int T) {
    int C = c->hidden, V = c->vocab_size, BT = B * T, hd = c->head_dim, I = c->intermediate;
    int Q = c->n_head * hd, KV = c->n_kv_head * hd, ld = Q + 2 * KV;
    int per = c->qkv_bias ? 12 : 9, b = c->qkv_bias;
    double *x = malloc(sizeof(double) * BT * C), *h = malloc(sizeof(double) * BT * C);
    double *qkv = malloc(sizeof(double) * BT * ld), *a = malloc(sizeof(double) * BT * Q);
    double *tmp = malloc(sizeof(double) * BT * (Q > C ? Q : C));
    double *g = malloc(sizeof(double) * BT * I), *u = malloc(sizeof(double) * BT * I);
    double *logits = malloc(sizeof(double) * BT * V);
    for (int r = 0; r < BT; r++)
        memcpy(x + (size_t)r * C, P[0] + (size_t)in[r] * C, sizeof(double) * C);
    for (int l = 0; l < c->n_layer; l++) {
        double **p = P + 1 + per * l; // ln1, q, [qb], k, [kb], v, [vb], o, ln2, gate, up, down
        ref_rms(h, x, p[0], c->rms_eps, BT, C);
        double *sec[3] = {tmp, tmp, tmp};
        int width[3] = {Q, KV, KV}, off[3] = {0, Q, Q + KV};
        for (int j = 0; j < 3; j++) {
            double *w = p[1 + j * (1 + b)], *bias = b ? p[2 + j * (1 + b)] : NULL;
            ref_linear(sec[j], h, w, bias, BT, C, width[j]);
            for (int r = 0; r < BT; r++)
                memcpy(qkv + (size_t)r * ld + off[j], sec[j] + (size_t)r * width[j],
                       sizeof(double) * width[j]);
        }
        ref_rope(qkv, ld, c, B, T, c->n_head + c->n_kv_head);
        ref_attention(a, qkv, B, T, c->n_head, c->n_kv_head, hd);
        ref_linear(tmp, a, p[4 + 3 * b], NULL, BT, Q, C);
        for (int i = 0; i < BT * C; i++) x[i] += tmp[i];
        ref_rms(h, x, p[5 + 3 * b], c->rms_eps, BT, C);
        ref_linear(g, h, p[6 + 3 * b], NULL, BT, C, I);
        ref_linear(u, h, p[7 + 3 * b], NULL, BT, C, I);
        for (int i = 0; i < BT * I; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        ref_linear(tmp, g, p[8 + 3 * b], NULL, BT, I, C);
        for (int i = 0; i < BT * C; i++) x[i] += tmp[i];
    }
    int norm = 1 + per * c->n_layer;
    ref_rms(h, x, P[norm], c->rms_eps, BT, C);
    ref_linear(logits, h, P[c->tied ? 0 : norm + 1], NULL, BT, C, V);
    double sum = 0.0;
    int kept = 0;
    for (int r = 0; r < BT; r++) {
        if (tg[r] < 0) continue;
        const double *row = logits + (size_t)r * V;
        double m = -INFINITY, z = 0.0;
        for (int v = 0; v < V; v++) m = row[v] > m ? row[v] : m;
        for (int v = 0; v < V; v++) z += exp(row[v] - m);
        sum += m + log(z) - row[tg[r]];
        kept++;
    }
    free(x), free(h), free(qkv), free(a), free(tmp), free(g), free(u), free(logits);
    return kept ? sum / kept : 0.0;
}

typedef struct model_ctx {
    const dsc_llama_config *c;
    double **P;
    const int32_t *in, *tg;
    int B, T;
} model_ctx;

static double model_objective(void *p) {
    model_ctx *k = p;
    return ref_model_loss(k->c, k->P, k->in, k->tg, k->B, k->T);
}

// head_dim 12 with 4 heads on hidden 40 (NH hd = 48 != hidden), 2 kv heads, qkv biases, untied,
// llama3 scaling, ignored targets: the loss against the float64 model, and gradients of a random
// sample of every tensor's elements against its central differences. transformers 4.44 cannot
// build this shape (it derives head_dim from hidden), so this is its only oracle.
static void test_model_gradcheck(void **state) {
    (void)state;
    dsc_llama_config c = small_config(0);
    c.hidden = 40, c.head_dim = 12, c.intermediate = 37, c.vocab_size = 29;
    model m = model_new(&c, 13);
    int B = 2, T = 7;
    int32_t in[14], tg[14];
    rng_seed(14);
    random_tokens(in, B * T, c.vocab_size);
    random_tokens(tg, B * T, c.vocab_size);
    tg[2] = tg[9] = -100;
    dsc_llama *net = NULL;
    assert_int_equal(dsc_llama_create(&net, &c, B, T + 2), DSC_OK);
    float loss = 0.0f;
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg, B, T, NULL, &loss), DSC_OK);
    assert_int_equal(dsc_llama_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
    double **P = calloc(m.n, sizeof(double *));
    for (int i = 0; i < m.n; i++) P[i] = to_double(m.p[i], m.numel[i]);
    model_ctx k = {&c, P, in, tg, B, T};
    double want = model_objective(&k), loss_err = fabs(loss - want) / fabs(want);
    printf("  model loss %.7f, float64 %.7f, rel err %.2g\n", loss, want, loss_err);
    if (!(loss_err < 1e-6))
        fail_msg("model loss rel err %.3g (seed %llu)", loss_err, (unsigned long long)seed_base);
    double worst = 0.0;
    for (int i = 0; i < m.n; i++) {
        dsc_llama_tensor_info info;
        dsc_llama_tensor_info_get(&c, i, &info);
        double scale = 1e-30;
        for (int64_t j = 0; j < m.numel[i]; j++) scale = fmax(scale, fabs(m.g[i][j]));
        for (int s = 0; s < 4; s++) {
            int64_t j = (int64_t)(rng_next() % (uint64_t)m.numel[i]);
            if (i == 0) j = (int64_t)in[s] * c.hidden + (int64_t)(rng_next() % c.hidden);
            double num = central_diff(model_objective, &k, &P[i][j], 1e-4);
            double e = fabs(m.g[i][j] - num) / scale;
            worst = fmax(worst, e);
            if (!(e < 1e-5))
                fail_msg("model grad %s[%lld]: got %.8g want %.8g (rel to max %.3g = %.3g, "
                         "seed %llu)",
                         info.name, (long long)j, m.g[i][j], num, scale, e,
                         (unsigned long long)seed_base);
        }
    }
    printf("  model gradients: worst sampled rel err %.3g (tol 1e-5)\n", worst);
    for (int i = 0; i < m.n; i++) free(P[i]);
    free(P);
    dsc_llama_destroy(net);
    model_free(&m);
}

// ---- hooks ----

typedef struct hook_log {
    char seq[256];
    int len, fail_at; // fail the call with this index (-1: never)
} hook_log;

static dsc_status log_call(void *user, char kind, int group) {
    hook_log *h = user;
    if (h->len + 3 < (int)sizeof h->seq) {
        h->seq[h->len++] = kind;
        h->seq[h->len++] = (char)('0' + group);
        h->seq[h->len] = '\0';
    }
    if (h->len / 2 - 1 == h->fail_at) return DSC_ERR_PEER;
    return DSC_OK;
}
static dsc_status on_gather(void *u, int g) { return log_call(u, 'G', g); }
static dsc_status on_release(void *u, int g) { return log_call(u, 'R', g); }
static dsc_status on_ready(void *u, int g) { return log_call(u, 'D', g); }

static void test_hooks(void **state) {
    (void)state;
    for (int tied = 0; tied <= 1; tied++) {
        dsc_llama_config c = small_config(tied);
        model m = model_new(&c, 31);
        int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8] = {2, 3, 4, -100, 6, 7, 8, 9};
        dsc_llama *net = NULL;
        assert_int_equal(dsc_llama_create(&net, &c, 1, 8), DSC_OK);
        hook_log log = {.fail_at = -1};
        dsc_llama_hooks hooks = {&log, on_gather, on_release, on_ready};
        float loss;
        assert_int_equal(dsc_llama_forward(net, m.p, in, tg, 1, 8, &hooks, &loss), DSC_OK);
        assert_string_equal(log.seq, tied ? "G0R0G1R1G2R2G3R3G0R0" : "G0R0G1R1G2R2G3R3");
        log.len = 0;
        assert_int_equal(dsc_llama_backward(net, m.p, m.g, 1.0f, &hooks), DSC_OK);
        assert_string_equal(log.seq, tied ? "G0R0G3R3D3G2R2D2G1R1D1D0"
                                          : "G3R3D3G2R2D2G1R1D1G0R0D0");
        log.len = 0;
        log.fail_at = 2; // the gather of group 1
        assert_int_equal(dsc_llama_forward(net, m.p, in, tg, 1, 8, &hooks, &loss), DSC_ERR_PEER);
        assert_string_equal(log.seq, "G0R0G1");
        assert_non_null(strstr(dsc_last_error(), "group 1"));
        assert_int_equal(dsc_llama_backward(net, m.p, m.g, 1.0f, &hooks), DSC_ERR_INVALID_ARG);
        dsc_llama_destroy(net);
        model_free(&m);
    }
}

// ---- configuration, table, init, argument checks ----

static void test_config_parse(void **state) {
    (void)state;
    static const struct {
        const char *name;
        int L, C, NH, NKV, hd, I, V, tied, bias, scaling;
        double theta;
        int64_t params;
    } want[] = {
        {"smollm2-135M", 30, 576, 9, 3, 64, 1536, 49152, 1, 0, 0, 1e5, 134515008},
        {"smollm2-360M", 32, 960, 15, 5, 64, 2560, 49152, 1, 0, 0, 1e5, 361821120},
        {"llama-3.2-1B", 16, 2048, 32, 8, 64, 8192, 128256, 1, 0, 2, 5e5, 1235814400},
        {"llama-3.2-3B", 28, 3072, 24, 8, 128, 8192, 128256, 1, 0, 2, 5e5, 3212749824},
        {"qwen2.5-0.5B", 24, 896, 14, 2, 64, 4864, 151936, 1, 1, 0, 1e6, 494032768},
        {"llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 0, 0, 2, 5e5, 8030261248},
        {"qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, 0, 1, 0, 1e6, 7615616512},
        {"mistral-7B", 32, 4096, 32, 8, 128, 14336, 32768, 0, 0, 0, 1e6, 7248023552},
        {"qwen3-0.6B", 28, 1024, 16, 8, 128, 3072, 151936, 1, 0, 0, 1e6, 596049920},
        {"qwen3-1.7B", 28, 2048, 16, 8, 128, 6144, 151936, 1, 0, 0, 1e6, 1720574976},
        {"qwen3-4B", 36, 2560, 32, 8, 128, 9728, 151936, 1, 0, 0, 1e6, 4022468096},
        {"qwen3-8B", 36, 4096, 32, 8, 128, 12288, 151936, 0, 0, 0, 1e6, 8190735360},
    };
    dsc_llama_config c;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        assert_int_equal(dsc_llama_config_parse(want[i].name, 0, 2048, &c), DSC_OK);
        assert_int_equal(c.n_layer, want[i].L), assert_int_equal(c.hidden, want[i].C);
        assert_int_equal(c.n_head, want[i].NH), assert_int_equal(c.n_kv_head, want[i].NKV);
        assert_int_equal(c.head_dim, want[i].hd), assert_int_equal(c.intermediate, want[i].I);
        assert_int_equal(c.vocab_size, want[i].V), assert_int_equal(c.tied, want[i].tied);
        assert_int_equal(c.qkv_bias, want[i].bias);
        assert_int_equal(c.qk_norm, !strncmp(want[i].name, "qwen3-", 6));
        assert_int_equal(c.rope_scaling, want[i].scaling);
        assert_true(c.rope_theta == want[i].theta);
        assert_int_equal(c.max_seq_len, 2048);
        assert_int_equal(dsc_llama_num_params(&c), want[i].params);
    }
    assert_int_equal(dsc_llama_config_parse("llama-3.2-1B", 0, 64, &c), DSC_OK);
    assert_true(c.rope_factor == 32 && c.rope_low_freq_factor == 1 &&
                c.rope_high_freq_factor == 4 && c.rope_original_max_pos == 8192);
    assert_true(fabs(c.rms_eps - 1e-5) < 1e-12);
    assert_int_equal(dsc_llama_config_parse("llama-3.1-8B", 0, 64, &c), DSC_OK);
    assert_true(c.rope_factor == 8);
    assert_int_equal(dsc_llama_config_parse("qwen2.5-0.5B", 0, 64, &c), DSC_OK);
    assert_true(fabs(c.rms_eps - 1e-6) < 1e-12);
    assert_int_equal(dsc_llama_config_parse("smollm2-135M", 50257, 64, &c), DSC_OK);
    assert_int_equal(c.vocab_size, 50257); // a tokenizer's vocabulary replaces the model's
    assert_int_equal(dsc_llama_config_parse("llama-d4", 256, 128, &c), DSC_OK);
    assert_int_equal(c.n_layer, 4), assert_int_equal(c.n_head, 4);
    assert_int_equal(c.n_kv_head, 2), assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.hidden, 256), assert_int_equal(c.intermediate, 704);
    assert_int_equal(c.tied, 1), assert_int_equal(c.vocab_size, 256);
    assert_int_equal(dsc_llama_config_parse("llama-d3", 100, 16, &c), DSC_OK);
    assert_int_equal(c.n_kv_head, 3);
    assert_int_equal(dsc_llama_config_parse("qwen3-d4", 256, 128, &c), DSC_OK);
    assert_int_equal(c.n_layer, 4), assert_int_equal(c.n_head, 4);
    assert_int_equal(c.n_kv_head, 2), assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.hidden, 256), assert_int_equal(c.intermediate, 768);
    assert_int_equal(c.qk_norm, 1), assert_int_equal(c.tied, 1);
    assert_true(c.rope_theta == 1e6 && fabs(c.rms_eps - 1e-6) < 1e-12);
    assert_int_equal(dsc_llama_config_parse("qwen3-0.6B", 0, 64, &c), DSC_OK);
    assert_true(fabs(c.rms_eps - 1e-6) < 1e-12);
    const char *bad[] = {"", "llama", "llama-d", "llama-d0", "llama-d257", "llama-d4x", "d4",
                         "Llama-3.2-1B", "llama-3.2-1b", "gpt2-124M"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(dsc_llama_config_parse(bad[i], 100, 16, &c), DSC_ERR_INVALID_ARG);
        assert_non_null(strstr(dsc_last_error(), "llama-d"));
    }
    assert_int_equal(dsc_llama_config_parse("llama-d2", 0, 16, &c), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "vocab_size"));
    assert_int_equal(dsc_llama_config_parse("llama-d2", 10, 0, &c), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_llama_config_parse(NULL, 10, 16, &c), DSC_ERR_INVALID_ARG);
}

static void test_tensor_table(void **state) {
    (void)state;
    dsc_llama_config c = small_config(0); // biases, untied
    assert_int_equal(dsc_llama_num_tensors(&c), 1 + 2 * 12 + 2);
    assert_int_equal(dsc_llama_num_groups(&c), 4);
    dsc_llama_tensor_info info;
    dsc_llama_tensor_info_get(&c, 0, &info);
    assert_string_equal(info.name, "model.embed_tokens.weight");
    assert_int_equal(info.shape[0], 37), assert_int_equal(info.shape[1], 32);
    assert_int_equal(info.group, 0);
    dsc_llama_tensor_info_get(&c, 1 + 12 + 3, &info); // layer 1's k_proj.weight
    assert_string_equal(info.name, "model.layers.1.self_attn.k_proj.weight");
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.shape[0], 16), assert_int_equal(info.shape[1], 32); // (out, in)
    assert_int_equal(info.group, 2);
    dsc_llama_tensor_info_get(&c, 1 + 4, &info);
    assert_string_equal(info.name, "model.layers.0.self_attn.k_proj.bias");
    assert_int_equal(info.ndim, 1), assert_int_equal(info.numel, 16);
    dsc_llama_tensor_info_get(&c, 1 + 7, &info);
    assert_string_equal(info.name, "model.layers.0.self_attn.o_proj.weight");
    assert_int_equal(info.shape[0], 32), assert_int_equal(info.shape[1], 32);
    dsc_llama_tensor_info_get(&c, 1 + 11, &info);
    assert_string_equal(info.name, "model.layers.0.mlp.down_proj.weight");
    assert_int_equal(info.shape[0], 32), assert_int_equal(info.shape[1], 45);
    dsc_llama_tensor_info_get(&c, 25, &info);
    assert_string_equal(info.name, "model.norm.weight");
    assert_int_equal(info.group, 3);
    dsc_llama_tensor_info_get(&c, 26, &info);
    assert_string_equal(info.name, "lm_head.weight");
    assert_int_equal(info.group, 3), assert_int_equal(info.shape[0], 37);
    c.tied = 1, c.qkv_bias = 0;
    assert_int_equal(dsc_llama_num_tensors(&c), 1 + 2 * 9 + 1);
    dsc_llama_tensor_info_get(&c, 1 + 9 + 2, &info);
    assert_string_equal(info.name, "model.layers.1.self_attn.k_proj.weight");
    dsc_llama_tensor_info_get(&c, 19, &info);
    assert_string_equal(info.name, "model.norm.weight");
    // FLOPs: 6 N (the untied lookup table excluded) + 12 L NH hd T, and the profiler's tree
    // agrees with it.
    for (int tied = 0; tied <= 1; tied++) {
        c = small_config(tied);
        double N = (double)dsc_llama_num_params(&c) - (tied ? 0 : 37.0 * 32);
        double want = 6 * N + 12.0 * 2 * 4 * 8 * 50;
        assert_true(fabs(dsc_llama_flops_per_token(&c, 50) - want) < 1e-6 * want);
        int nm = dsc_llama_modules(&c, 3, 50, NULL);
        dsc_llama_module *mods = calloc(nm, sizeof *mods);
        assert_int_equal(dsc_llama_modules(&c, 3, 50, mods), nm);
        assert_true(fabs(3 * mods[0].fwd_flops - want * 150) < 1e-6 * want * 150);
        assert_int_equal(mods[0].params, dsc_llama_num_params(&c));
        int slots = 0;
        for (int i = 0; i < nm; i++) slots += mods[i].slot >= 0;
        assert_int_equal(slots, dsc_llama_timing_slots(&c));
        free(mods);
    }
}

static void test_init(void **state) {
    (void)state;
    dsc_llama_config c = small_config(0);
    model m = model_new(&c, 11);
    dsc_llama_init_weights(&c, m.p, 11); // plain init, without model_new's spreading
    for (int i = 0; i < m.n; i++) {
        dsc_llama_tensor_info info;
        dsc_llama_tensor_info_get(&c, i, &info);
        if (info.ndim == 1) {
            float v = strstr(info.name, "bias") ? 0.0f : 1.0f;
            for (int64_t j = 0; j < info.numel; j++) assert_true(m.p[i][j] == v);
            continue;
        }
        double s = 0.0, s2 = 0.0;
        for (int64_t j = 0; j < info.numel; j++)
            s += m.p[i][j], s2 += (double)m.p[i][j] * m.p[i][j];
        double mean = s / info.numel, sd = sqrt(s2 / info.numel - mean * mean);
        if (!(fabs(sd - 0.02) < 0.003 && fabs(mean) < 0.002))
            fail_msg("%s: mean %.4f std %.4f, want 0 and 0.02", info.name, mean, sd);
        float part[7]; // any slice on its own gives the same values (odd and even ends)
        dsc_llama_init_tensor(&c, i, part, 5, 7, 11);
        assert_memory_equal(part, m.p[i] + 5, sizeof part);
        dsc_llama_init_tensor(&c, i, part, 6, 6, 11);
        assert_memory_equal(part, m.p[i] + 6, 6 * sizeof(float));
        dsc_llama_init_tensor(&c, i, part, 3, 1, 11);
        assert_memory_equal(part, m.p[i] + 3, sizeof(float));
    }
    float a[4], b[4];
    dsc_llama_init_tensor(&c, 2, a, 0, 4, 11); // q_proj.weight
    dsc_llama_init_tensor(&c, 2, b, 0, 4, 12);
    assert_true(memcmp(a, b, sizeof a) != 0); // the seed matters
    model_free(&m);
}

static void test_argument_checks(void **state) {
    (void)state;
    dsc_llama_config c = small_config(1);
    model m = model_new(&c, 3);
    dsc_llama *net = NULL;
    assert_int_equal(dsc_llama_create(&net, &c, 2, 81), DSC_ERR_INVALID_ARG); // T > max_seq_len
    dsc_llama_config bad = c;
    bad.n_kv_head = 3; // does not divide 4
    assert_int_equal(dsc_llama_create(&net, &bad, 1, 8), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "n_kv_head"));
    bad = c;
    bad.rope_high_freq_factor = 0.5; // below low_freq_factor
    assert_int_equal(dsc_llama_create(&net, &bad, 1, 8), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "rope"));
    assert_int_equal(dsc_llama_create(&net, &c, 2, 8), DSC_OK);
    int32_t in[16] = {0}, tg[16] = {0};
    float loss;
    tg[5] = 37; // == vocab_size
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg, 2, 8, NULL, &loss), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "targets[b=0, t=5] = 37"));
    tg[5] = -100;
    in[9] = -1; // inputs are never ignored
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg, 2, 8, NULL, &loss), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "inputs[b=1, t=1]"));
    in[9] = 0;
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg, 3, 8, NULL, &loss), DSC_ERR_INVALID_ARG);
    float *keep = m.p[4];
    m.p[4] = NULL;
    assert_int_equal(dsc_llama_forward(net, m.p, in, tg, 2, 8, NULL, &loss), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "model.layers.0"));
    m.p[4] = keep;
    assert_int_equal(dsc_llama_forward(net, m.p, in, NULL, 2, 8, NULL, NULL), DSC_OK);
    assert_int_equal(dsc_llama_backward(net, m.p, m.g, 1.0f, NULL), DSC_ERR_INVALID_ARG);
    dsc_llama_destroy(net);
    dsc_llama_destroy(NULL);
    model_free(&m);
}

int main(void) {
#ifdef _OPENMP
    omp_set_num_threads(2);
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_parse),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_head_norm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_xent_ignored),
        cmocka_unit_test(test_model_gradcheck),
        cmocka_unit_test(test_model_determinism_accumulation),
        cmocka_unit_test(test_model_masked_mean),
        cmocka_unit_test(test_model_in_pool),
        cmocka_unit_test(test_hooks),
        cmocka_unit_test(test_argument_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
