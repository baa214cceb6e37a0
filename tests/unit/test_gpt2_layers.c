// Unit tests of model/gpt2: every layer's backward against float64 central differences of a
// float64 reference forward written here, a whole tiny model the same way, and the model's
// contracts (config parsing, parameter table, init, determinism, accumulation, hooks, checks).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // tanh, exp, log, sqrt, fabs
#include <stdbool.h> // bool
#include <stdio.h>  // printf, snprintf
#include <stdlib.h> // malloc, calloc, free, getenv, strtoull
#include <string.h> // memcmp, memcpy, strstr
#ifdef _OPENMP
#include <omp.h> // omp_set_num_threads, omp_get_max_threads
#endif

#include "dsc/status.h"         // dsc_last_error
#include "model/gpt2/gpt2.h"    // dsc_gpt2_*
#include "model/blas.h"         // dsc__model_sgemm, dsc__model_blas_single_thread
#include "model/gpt2/kernels.h" // dsc__gpt2_*
#include "model/kernels.h"      // dsc__model_xent_*
#include "model/linear.h"       // dsc__linear_* (GPT-2's Conv1D layout)

// ---- random numbers and comparisons ----

static uint64_t seed_base = 20240601;
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
    printf("  %-28s rel err %.3g (tol %.0e)\n", what, e, tol);
    if (!(e <= tol))
        fail_msg("%s: relative error %.3g > %.1g (seed %llu)", what, e, tol,
                 (unsigned long long)seed_base);
}

// Central difference of J with respect to x[i], in float64. J is evaluated at x +- h.
typedef double (*objective_fn)(void *ctx);

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

// ---- float64 reference layers ----

static void ref_layernorm(double *out, const double *x, const double *w, const double *b, int N,
                          int C) {
    for (int r = 0; r < N; r++) {
        const double *xr = x + (size_t)r * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += xr[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (xr[c] - m) * (xr[c] - m);
        double rs = 1.0 / sqrt(v / C + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)r * C + c] = (xr[c] - m) * rs * w[c] + b[c];
    }
}

// out (N, OC) = x (N, IC) @ w (IC, OC) + bias + resid (bias, resid may be NULL)
static void ref_matmul(double *out, const double *x, const double *w, const double *bias,
                       const double *resid, int N, int IC, int OC) {
    for (int r = 0; r < N; r++)
        for (int o = 0; o < OC; o++) {
            double s = (bias ? bias[o] : 0.0) + (resid ? resid[(size_t)r * OC + o] : 0.0);
            for (int i = 0; i < IC; i++) s += x[(size_t)r * IC + i] * w[(size_t)i * OC + o];
            out[(size_t)r * OC + o] = s;
        }
}

static void ref_attention(double *out, const double *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double *p = malloc(sizeof(double) * T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, s = 0.0;
                for (int j = 0; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * 3 * C + C + h * hs;
                    p[j] = dot(q, k, hs) / sqrt((double)hs);
                    if (p[j] > m) m = p[j];
                }
                for (int j = 0; j <= t; j++) s += (p[j] = exp(p[j] - m));
                double *o = out + ((size_t)b * T + t) * C + h * hs;
                for (int d = 0; d < hs; d++) o[d] = 0.0;
                for (int j = 0; j <= t; j++) {
                    const double *v = qkv + ((size_t)b * T + j) * 3 * C + 2 * C + h * hs;
                    for (int d = 0; d < hs; d++) o[d] += p[j] / s * v[d];
                }
            }
    free(p);
}

static double ref_gelu(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// pos: position ids (B, T), or NULL for t.
static void ref_encoder(double *out, const int32_t *tok, const int32_t *pos, const double *wte,
                        const double *wpe, int B, int T, int C) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] =
                    wte[(size_t)tok[b * T + t] * C + c] +
                    wpe[(size_t)(pos ? pos[b * T + t] : t) * C + c];
}

static double ref_xent_sum(const double *logits, const int32_t *tgt, int N, int V) {
    double sum = 0.0;
    for (int r = 0; r < N; r++) {
        const double *l = logits + (size_t)r * V;
        double m = -INFINITY, s = 0.0;
        for (int j = 0; j < V; j++) m = l[j] > m ? l[j] : m;
        for (int j = 0; j < V; j++) s += exp(l[j] - m);
        if (tgt[r] >= 0) sum += m + log(s) - l[tgt[r]]; // negative: ignored
    }
    return sum;
}

// ---- per-layer gradient checks ----

typedef struct ln_ctx {
    int N, C;
    double *x, *w, *b, *dout, *out;
} ln_ctx;

static double ln_objective(void *p) {
    ln_ctx *k = p;
    ref_layernorm(k->out, k->x, k->w, k->b, k->N, k->C);
    return dot(k->out, k->dout, (size_t)k->N * k->C);
}

static void test_layernorm(void **state) {
    rng_seed(1);
    int N = 70, C = 19; // crosses a 32-row partial-sum chunk; C not a vector multiple
    size_t n = (size_t)N * C;
    float *x = rand_floats(n, -2, 3), *w = rand_floats(C, 0.5, 1.5), *b = rand_floats(C, -1, 1);
    float *dout = rand_floats(n, -1, 1), *out = malloc(sizeof(float) * n);
    float *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N);
    float *dx = calloc(n, sizeof(float)), *dw = calloc(C, sizeof(float));
    float *db = calloc(C, sizeof(float));
    float *scratch = malloc(sizeof(float) * dsc__gpt2_layernorm_scratch(N, C));
    dsc__gpt2_layernorm_forward(out, mean, rstd, x, w, b, N, C);
    dsc__gpt2_layernorm_backward(dx, dw, db, scratch, dout, x, w, mean, rstd, N, C);
    float *again = malloc(sizeof(float) * n); // backward's recomputation: the same bits
    dsc__gpt2_layernorm_apply(again, x, mean, rstd, w, b, N, C);
    assert_memory_equal(again, out, sizeof(float) * n);
    free(again);

    ln_ctx k = {N, C, to_double(x, n), to_double(w, C), to_double(b, C), to_double(dout, n),
                malloc(sizeof(double) * n)};
    ln_objective(&k);
    expect_close("layernorm forward", out, k.out, n, 1e-6);
    double *nx = malloc(sizeof(double) * n), *nw = malloc(sizeof(double) * C);
    double *nb = malloc(sizeof(double) * C);
    for (size_t i = 0; i < n; i++) nx[i] = central_diff(ln_objective, &k, &k.x[i], 1e-5);
    for (int c = 0; c < C; c++) nw[c] = central_diff(ln_objective, &k, &k.w[c], 1e-5);
    for (int c = 0; c < C; c++) nb[c] = central_diff(ln_objective, &k, &k.b[c], 1e-5);
    expect_close("layernorm dinp", dx, nx, n, 1e-5);
    expect_close("layernorm dweight", dw, nw, C, 1e-5);
    expect_close("layernorm dbias", db, nb, C, 1e-5);
    free(x), free(w), free(b), free(dout), free(out), free(mean), free(rstd), free(dx), free(dw);
    free(db), free(scratch), free(k.x), free(k.w), free(k.b), free(k.dout), free(k.out);
    free(nx), free(nw), free(nb);
}

typedef struct mm_ctx {
    int N, IC, OC;
    double *x, *w, *bias, *resid, *dout, *out;
} mm_ctx;

static double mm_objective(void *p) {
    mm_ctx *k = p;
    ref_matmul(k->out, k->x, k->w, k->bias, k->resid, k->N, k->IC, k->OC);
    return dot(k->out, k->dout, (size_t)k->N * k->OC);
}

// matmul + bias, with the residual added in the same pass; the residual's gradient is dout.
static void test_matmul_residual(void **state) {
    rng_seed(2);
    int N = 70, IC = 13, OC = 150; // two row chunks, three column-sum blocks
    size_t nx = (size_t)N * IC, nw = (size_t)IC * OC, no = (size_t)N * OC;
    float *x = rand_floats(nx, -1, 1), *w = rand_floats(nw, -1, 1), *bias = rand_floats(OC, -1, 1);
    float *resid = rand_floats(no, -1, 1), *dout = rand_floats(no, -1, 1);
    float *out = malloc(sizeof(float) * no), *dx = malloc(sizeof(float) * nx);
    float *dw = rand_floats(nw, -1, 1), *dbias = rand_floats(OC, -1, 1); // += onto these
    double *dw0 = to_double(dw, nw), *db0 = to_double(dbias, OC);
    dsc__linear conv1d = {.w = w, .bias = bias, .in = IC, .out = OC, .in_out = true};
    dsc__linear_forward(conv1d, out, OC, x, IC, resid, N);
    dsc__linear_backward(conv1d, dx, false, dw, dbias, dout, OC, x, IC, N);

    mm_ctx k = {N,
                IC,
                OC,
                to_double(x, nx),
                to_double(w, nw),
                to_double(bias, OC),
                to_double(resid, no),
                to_double(dout, no),
                malloc(sizeof(double) * no)};
    mm_objective(&k);
    expect_close("matmul+bias+residual fwd", out, k.out, no, 1e-6);
    double *gx = malloc(sizeof(double) * nx), *gw = malloc(sizeof(double) * nw);
    double *gb = malloc(sizeof(double) * OC), *gr = malloc(sizeof(double) * no);
    float *dres = malloc(sizeof(float) * no);
    for (size_t i = 0; i < nx; i++) gx[i] = central_diff(mm_objective, &k, &k.x[i], 1e-4);
    for (size_t i = 0; i < nw; i++)
        gw[i] = dw0[i] + central_diff(mm_objective, &k, &k.w[i], 1e-4);
    for (int i = 0; i < OC; i++)
        gb[i] = db0[i] + central_diff(mm_objective, &k, &k.bias[i], 1e-4);
    for (size_t i = 0; i < no; i += 7) { // a sample: the residual path is the identity
        gr[i / 7] = central_diff(mm_objective, &k, &k.resid[i], 1e-4);
        dres[i / 7] = dout[i];
    }
    expect_close("matmul dinp", dx, gx, nx, 1e-5);
    expect_close("matmul dweight (+=)", dw, gw, nw, 1e-5);
    expect_close("matmul dbias (+=)", dbias, gb, OC, 1e-5);
    expect_close("residual dinp", dres, gr, (no + 6) / 7, 1e-6);
    free(x), free(w), free(bias), free(resid), free(dout), free(out), free(dx), free(dw);
    free(dbias), free(dw0), free(db0), free(k.x), free(k.w), free(k.bias), free(k.resid);
    free(k.dout), free(k.out), free(gx), free(gw), free(gb), free(gr), free(dres);
}

// The chunked product against a plain float64 one, for every transpose and both split axes.
static void test_sgemm_chunks(void **state) {
    rng_seed(3);
    int shapes[2][3] = {{300, 70, 33}, {40, 200, 17}}; // split along M, then along N
    for (int s = 0; s < 2; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                int lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 2, ldc = N + 5;
                float *A = rand_floats((size_t)lda * (ta ? K : M), -1, 1);
                float *B = rand_floats((size_t)ldb * (tb ? N : K), -1, 1);
                float *Cm = rand_floats((size_t)ldc * M, -1, 1);
                double *want = malloc(sizeof(double) * M * N);
                float *got = malloc(sizeof(float) * M * N);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double acc = 0.0;
                        for (int p = 0; p < K; p++)
                            acc += (double)(ta ? A[p * lda + i] : A[i * lda + p]) *
                                   (tb ? B[j * ldb + p] : B[p * ldb + j]);
                        want[i * N + j] = 0.5 * acc + 0.25 * Cm[i * ldc + j];
                    }
                dsc__model_sgemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 0.25f, Cm, ldc);
                for (int i = 0; i < M; i++) memcpy(got + i * N, Cm + i * ldc, sizeof(float) * N);
                char what[64];
                snprintf(what, sizeof what, "sgemm %dx%dx%d ta%d tb%d", M, N, K, ta, tb);
                expect_close(what, got, want, (size_t)M * N, 1e-6);
                free(A), free(B), free(Cm), free(want), free(got);
            }
}

typedef struct att_ctx {
    int B, T, C, NH;
    double *qkv, *dout, *out;
} att_ctx;

static double att_objective(void *p) {
    att_ctx *k = p;
    ref_attention(k->out, k->qkv, k->B, k->T, k->C, k->NH);
    return dot(k->out, k->dout, (size_t)k->B * k->T * k->C);
}

// T = 131 spans three 64-row tiles (the last partial); T = 5 is below one tile.
static void check_attention(int B, int T, int C, int NH, int stride) {
    size_t n3 = (size_t)B * T * 3 * C, n1 = (size_t)B * T * C;
    float *qkv = rand_floats(n3, -2, 2), *dout = rand_floats(n1, -1, 1);
    float *out = malloc(sizeof(float) * n1), *dqkv = malloc(sizeof(float) * n3);
    float *stats = malloc(sizeof(float) * 2 * (size_t)B * NH * T);
    int slots = 4;
    float *scratch = malloc(sizeof(float) * dsc__gpt2_attention_scratch(T, slots));
    dsc__gpt2_attention_forward(out, stats, qkv, scratch, slots, B, T, C, NH);
    dsc__gpt2_attention_backward(dqkv, dout, qkv, stats, scratch, slots, B, T, C, NH);
    att_ctx k = {B, T, C, NH, to_double(qkv, n3), to_double(dout, n1), malloc(sizeof(double) * n1)};
    att_objective(&k);
    char what[64];
    snprintf(what, sizeof what, "attention fwd T=%d", T);
    expect_close(what, out, k.out, n1, 1e-6);
    size_t ns = (n3 + stride - 1) / stride;
    double *num = malloc(sizeof(double) * ns);
    float *got = malloc(sizeof(float) * ns);
    for (size_t i = 0, j = 0; i < n3; i += stride, j++) { // every stride-th entry, all rows
        num[j] = central_diff(att_objective, &k, &k.qkv[i], 1e-5);
        got[j] = dqkv[i];
    }
    snprintf(what, sizeof what, "attention dqkv T=%d", T);
    expect_close(what, got, num, ns, 1e-5);
    free(qkv), free(dout), free(out), free(dqkv), free(stats), free(scratch), free(k.qkv);
    free(k.dout), free(k.out), free(num), free(got);
}

static void test_attention(void **state) {
    rng_seed(4);
    check_attention(2, 5, 8, 2, 1);
    check_attention(2, 131, 16, 2, 11); // stride 11 is prime to 3C = 48: all of q, k, v sampled
}

static void test_gelu(void **state) {
    rng_seed(5);
    size_t n = 9000; // two 8192-element blocks
    float *x = rand_floats(n, -6, 6), *dout = rand_floats(n, -1, 1);
    float *out = malloc(sizeof(float) * n), *dx = malloc(sizeof(float) * n);
    double *want = malloc(sizeof(double) * n), *num = malloc(sizeof(double) * n);
    dsc__gpt2_gelu_forward(out, x, n);
    memcpy(dx, dout, sizeof(float) * n);
    dsc__gpt2_gelu_backward(dx, dx, x, n); // in place, as the model calls it
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], h = 1e-5;
        want[i] = ref_gelu(xi);
        num[i] = dout[i] * (ref_gelu(xi + h) - ref_gelu(xi - h)) / (2 * h);
    }
    expect_close("gelu forward", out, want, n, 1e-6);
    expect_close("gelu backward", dx, num, n, 1e-6);
    free(x), free(dout), free(out), free(dx), free(want), free(num);
}

typedef struct xent_ctx {
    int N, V;
    double *logits, g;
    const int32_t *tgt;
} xent_ctx;

static double xent_objective(void *p) {
    xent_ctx *k = p;
    return k->g * ref_xent_sum(k->logits, k->tgt, k->N, k->V);
}

static void test_softmax_xent(void **state) {
    rng_seed(6);
    int N = 6, V = 301;
    size_t n = (size_t)N * V;
    float *logits = rand_floats(n, -8, 8), *losses = malloc(sizeof(float) * N);
    float *lse = malloc(sizeof(float) * N), *d = malloc(sizeof(float) * n);
    int32_t tgt[6];
    for (int r = 0; r < N; r++) tgt[r] = (int32_t)(rng_next() % V);
    logits[(size_t)2 * V + tgt[2]] = 30.0f; // a confident row: p(target) ~ 1
    dsc__model_xent_forward(losses, lse, logits, tgt, N, V);
    dsc__model_xent_backward(d, logits, lse, tgt, 0.7f, N, V);
    xent_ctx k = {N, V, to_double(logits, n), 0.7, tgt};
    double want_loss[6], *num = malloc(sizeof(double) * n);
    for (int r = 0; r < N; r++)
        want_loss[r] = ref_xent_sum(k.logits + (size_t)r * V, tgt + r, 1, V);
    expect_close("softmax-xent losses", losses, want_loss, N, 1e-6);
    for (size_t i = 0; i < n; i++) num[i] = central_diff(xent_objective, &k, &k.logits[i], 1e-5);
    expect_close("softmax-xent dlogits", d, num, n, 1e-6);
    dsc__model_xent_backward(logits, logits, lse, tgt, 0.7f, N, V); // in place, as the model
    assert_memory_equal(logits, d, sizeof(float) * n);
    free(logits), free(losses), free(lse), free(d), free(k.logits), free(num);
}

typedef struct enc_ctx {
    int B, T, C;
    const int32_t *tok;
    double *wte, *wpe, *dout, *out;
} enc_ctx;

static double enc_objective(void *p) {
    enc_ctx *k = p;
    ref_encoder(k->out, k->tok, NULL, k->wte, k->wpe, k->B, k->T, k->C);
    return dot(k->out, k->dout, (size_t)k->B * k->T * k->C);
}

static void test_embedding(void **state) {
    rng_seed(7);
    int B = 3, T = 5, C = 70, V = 4, maxT = 6; // tokens repeat; C spans two channel blocks
    int32_t tok[15];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(rng_next() % V);
    size_t ne = (size_t)V * C, np = (size_t)maxT * C, no = (size_t)B * T * C;
    float *wte = rand_floats(ne, -1, 1), *wpe = rand_floats(np, -1, 1);
    float *dout = rand_floats(no, -1, 1), *out = malloc(sizeof(float) * no);
    float *dwte = calloc(ne, sizeof(float)), *dwpe = calloc(np, sizeof(float));
    dsc__gpt2_encoder_forward(out, tok, NULL, wte, wpe, B, T, C);
    dsc__gpt2_encoder_backward(dwte, dwpe, dout, tok, NULL, B, T, C);
    enc_ctx k = {B, T, C, tok, to_double(wte, ne), to_double(wpe, np), to_double(dout, no),
                 malloc(sizeof(double) * no)};
    enc_objective(&k);
    expect_close("embedding forward", out, k.out, no, 2e-7); // one rounding
    double *ge = malloc(sizeof(double) * ne), *gp = malloc(sizeof(double) * np);
    for (size_t i = 0; i < ne; i++) ge[i] = central_diff(enc_objective, &k, &k.wte[i], 1e-4);
    for (size_t i = 0; i < np; i++) gp[i] = central_diff(enc_objective, &k, &k.wpe[i], 1e-4);
    expect_close("embedding dwte", dwte, ge, ne, 1e-6);
    expect_close("embedding dwpe", dwpe, gp, np, 1e-6);
    free(wte), free(wpe), free(dout), free(out), free(dwte), free(dwpe), free(k.wte);
    free(k.wpe), free(k.dout), free(k.out), free(ge), free(gp);
}

// ---- whole model ----

typedef struct model {
    dsc_gpt2_config c;
    int n;
    float **p, **g; // params, grads (one buffer per tensor)
    int64_t *numel;
} model;

static model model_new(const char *spec, int V, int maxT, uint64_t seed) {
    model m = {0};
    assert_int_equal(dsc_gpt2_config_parse(spec, V, maxT, &m.c), DSC_OK);
    m.n = dsc_gpt2_num_tensors(&m.c);
    m.p = calloc(m.n, sizeof(float *));
    m.g = calloc(m.n, sizeof(float *));
    m.numel = calloc(m.n, sizeof(int64_t));
    for (int i = 0; i < m.n; i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&m.c, i, &info);
        m.numel[i] = info.numel;
        m.p[i] = malloc(sizeof(float) * info.numel);
        m.g[i] = calloc(info.numel, sizeof(float));
    }
    dsc_gpt2_init_weights(&m.c, m.p, seed);
    // Biases and layernorm parameters start at 0 and 1; move them so their gradients matter.
    rng_seed(seed);
    for (int i = 0; i < m.n; i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&m.c, i, &info);
        if (info.ndim == 1)
            for (int64_t j = 0; j < info.numel; j++) m.p[i][j] += (float)uniform(-0.1, 0.1);
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

// Float64 GPT-2 loss, written from the layer references above; P[i] is tensor i.
static double ref_model_loss(const dsc_gpt2_config *c, double **P, const int32_t *in,
                             const int32_t *pos, const int32_t *tg, int B, int T) {
    int C = c->n_embd, V = c->vocab_size, BT = B * T;
    double *x = malloc(sizeof(double) * BT * C), *h = malloc(sizeof(double) * BT * C);
    double *big = malloc(sizeof(double) * BT * 4 * C), *a = malloc(sizeof(double) * BT * C);
    double *logits = malloc(sizeof(double) * BT * V);
    ref_encoder(x, in, pos, P[0], P[1], B, T, C);
    for (int l = 0; l < c->n_layer; l++) {
        double **p = P + 2 + 12 * l;
        ref_layernorm(h, x, p[0], p[1], BT, C);
        ref_matmul(big, h, p[2], p[3], NULL, BT, C, 3 * C);
        ref_attention(a, big, B, T, C, c->n_head);
        ref_matmul(h, a, p[4], p[5], x, BT, C, C);
        memcpy(x, h, sizeof(double) * BT * C);
        ref_layernorm(h, x, p[6], p[7], BT, C);
        ref_matmul(big, h, p[8], p[9], NULL, BT, C, 4 * C);
        for (int i = 0; i < BT * 4 * C; i++) big[i] = ref_gelu(big[i]);
        ref_matmul(h, big, p[10], p[11], x, BT, 4 * C, C);
        memcpy(x, h, sizeof(double) * BT * C);
    }
    int lnf = 2 + 12 * c->n_layer;
    ref_layernorm(h, x, P[lnf], P[lnf + 1], BT, C);
    for (int r = 0; r < BT; r++)
        for (int v = 0; v < V; v++)
            logits[(size_t)r * V + v] = dot(h + (size_t)r * C, P[0] + (size_t)v * C, C);
    int counted = 0; // the mean runs over the targets that are not ignored
    for (int r = 0; r < BT; r++) counted += tg[r] >= 0;
    double loss = counted ? ref_xent_sum(logits, tg, BT, V) / counted : 0.0;
    free(x), free(h), free(big), free(a), free(logits);
    return loss;
}

typedef struct model_ctx {
    const dsc_gpt2_config *c;
    double **P;
    const int32_t *in, *tg, *pos;
    int B, T;
} model_ctx;

static double model_objective(void *p) {
    model_ctx *k = p;
    return ref_model_loss(k->c, k->P, k->in, k->pos, k->tg, k->B, k->T);
}

static void random_tokens(int32_t *t, int n, int V) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)(rng_next() % V);
}

// d2 (2 layers, 2 heads, 128 channels), V 64, B 2, T 8 (< maxT 12): loss against the float64
// model, and gradients of a random sample of every tensor's elements against central differences.
// masked: 11 of the 16 targets are ignored (-1), so the loss is the mean over the other 5.
// positions: position ids restart at two document starts (as packed rows with restarts do).
static void model_gradcheck(bool masked, bool positions) {
    model m = model_new("d2", 64, 12, 11);
    int B = 2, T = 8;
    int32_t in[16], tg[16];
    rng_seed(12);
    random_tokens(in, B * T, 64);
    random_tokens(tg, B * T, 64);
    for (int i = 0; masked && i < B * T; i++)
        if (i % 3 != 1) tg[i] = DSC_GPT2_IGNORE;
    int32_t pos[16];
    for (int i = 0; i < B * T; i++) { // documents start at t = 3 (row 0) and t = 5 (row 1)
        int t = i % T, start = i < T ? 3 : 5;
        pos[i] = t < start ? t : t - start;
    }
    dsc_gpt2 *net = NULL;
    assert_int_equal(dsc_gpt2_create(&net, &m.c, B, T + 1), DSC_OK);
    float loss = 0.0f;
    assert_int_equal(dsc_gpt2_forward_pos(net, m.p, in, positions ? pos : NULL, tg, B, T, NULL,
                                          &loss), DSC_OK);
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);

    double **P = calloc(m.n, sizeof(double *));
    for (int i = 0; i < m.n; i++) P[i] = to_double(m.p[i], m.numel[i]);
    model_ctx k = {&m.c, P, in, tg, positions ? pos : NULL, B, T};
    double want = model_objective(&k);
    double loss_err = fabs(loss - want) / fabs(want);
    printf("  model loss %.7f, float64 %.7f, rel err %.2g\n", loss, want, loss_err);
    if (!(loss_err < 1e-6)) fail_msg("model loss rel err %.3g (seed %llu)", loss_err,
                                     (unsigned long long)seed_base);
    double worst = 0.0;
    for (int i = 0; i < m.n; i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&m.c, i, &info);
        double scale = 1e-30;
        for (int64_t j = 0; j < m.numel[i]; j++)
            scale = fmax(scale, fabs(m.g[i][j]));
        for (int s = 0; s < 4; s++) {
            int64_t j = (int64_t)(rng_next() % (uint64_t)m.numel[i]);
            if (i == 1) j = (int64_t)(rng_next() % (uint64_t)(T * m.c.n_embd)); // used rows
            double num = central_diff(model_objective, &k, &P[i][j], 1e-4);
            double e = fabs(m.g[i][j] - num) / scale;
            worst = fmax(worst, e);
            if (!(e < 1e-5))
                fail_msg("model grad %s[%lld]: got %.8g want %.8g (rel to max %.3g = %.3g, "
                         "seed %llu)",
                         info.name, (long long)j, m.g[i][j], num, scale, e,
                         (unsigned long long)seed_base);
        }
        // wpe rows at or past T are unused: exactly zero gradient
        if (i == 1)
            for (int64_t j = (int64_t)T * m.c.n_embd; j < m.numel[1]; j++)
                assert_true(m.g[1][j] == 0.0f);
    }
    printf("  model gradients: worst sampled rel err %.3g (tol 1e-5)\n", worst);
    for (int i = 0; i < m.n; i++) free(P[i]);
    free(P);
    dsc_gpt2_destroy(net);
    model_free(&m);
}

static void test_model_gradcheck(void **state) { model_gradcheck(false, false); }

// Position ids: the loss and every gradient (wpe's rows now shared by several positions) against
// the float64 model; identity positions are bitwise the plain forward; bad ids are errors.
static void test_model_positions(void **state) {
    model_gradcheck(true, true);
    model m = model_new("d1", 32, 8, 17);
    int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    int32_t pos[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    dsc_gpt2 *net = NULL;
    assert_int_equal(dsc_gpt2_create(&net, &m.c, 1, 8), DSC_OK);
    float a, b;
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 1, 8, NULL, &a), DSC_OK);
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
    float *g1 = malloc(sizeof(float) * m.numel[1]);
    memcpy(g1, m.g[1], sizeof(float) * m.numel[1]);
    model_zero_grads(&m);
    assert_int_equal(dsc_gpt2_forward_pos(net, m.p, in, pos, tg, 1, 8, NULL, &b), DSC_OK);
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
    assert_true(a == b);
    assert_memory_equal(g1, m.g[1], sizeof(float) * m.numel[1]);
    pos[3] = 8; // wpe has max_seq_len = 8 rows
    assert_int_equal(dsc_gpt2_forward_pos(net, m.p, in, pos, tg, 1, 8, NULL, &b),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "position id [b=0, t=3] = 8"));
    free(g1);
    dsc_gpt2_destroy(net);
    model_free(&m);
}

// Ignored targets leave the loss and the gradients: both against the float64 model's mean over
// the targets that count. All targets ignored: loss 0 and no gradient at all.
static void test_model_gradcheck_masked(void **state) {
    model_gradcheck(true, false);
    model m = model_new("d1", 32, 8, 13);
    int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8];
    for (int i = 0; i < 8; i++) tg[i] = -1 - i; // any negative id is ignored
    dsc_gpt2 *net = NULL;
    assert_int_equal(dsc_gpt2_create(&net, &m.c, 1, 8), DSC_OK);
    float loss = 1.0f;
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 1, 8, NULL, &loss), DSC_OK);
    assert_true(loss == 0.0f);
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
    for (int i = 0; i < m.n; i++)
        for (int64_t j = 0; j < m.numel[i]; j++) assert_true(m.g[i][j] == 0.0f);
    dsc_gpt2_destroy(net);
    model_free(&m);
}

// Same inputs give bitwise the same loss, logits and gradients, with 1 or 2 threads; backward
// accumulates (twice = 2x) and scales by loss_scale.
static void test_model_determinism_accumulation(void **state) {
    model m = model_new("d2", 96, 64, 21);
    int B = 3, T = 64; // several tiles and chunks
    int32_t in[192], tg[192];
    rng_seed(22);
    random_tokens(in, B * T, 96);
    random_tokens(tg, B * T, 96);
    dsc_gpt2 *net = NULL;
    assert_int_equal(dsc_gpt2_create(&net, &m.c, B, T), DSC_OK);
    size_t nl = (size_t)B * T * 96;
    float *logits1 = malloc(sizeof(float) * nl);
    float **g1 = calloc(m.n, sizeof(float *));
    float loss[4];
    for (int run = 0; run < 4; run++) {
#ifdef _OPENMP
        omp_set_num_threads(run == 1 ? 1 : 2); // run 1 single-threaded
#endif
        model_zero_grads(&m);
        assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, B, T, NULL, &loss[run]), DSC_OK);
        if (run == 0) memcpy(logits1, dsc_gpt2_logits(net), sizeof(float) * nl);
        else assert_memory_equal(logits1, dsc_gpt2_logits(net), sizeof(float) * nl);
        float scale = run == 2 ? 4.0f : 1.0f;
        assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, scale, NULL), DSC_OK);
        if (run == 3) { // a second micro-step accumulates
            assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, B, T, NULL, &loss[run]), DSC_OK);
            assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
        }
        for (int i = 0; i < m.n; i++) {
            if (run == 0) {
                g1[i] = malloc(sizeof(float) * m.numel[i]);
                memcpy(g1[i], m.g[i], sizeof(float) * m.numel[i]);
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
    for (int i = 0; i < m.n; i++) free(g1[i]);
    free(g1), free(logits1);
    dsc_gpt2_destroy(net);
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
    model m = model_new("d2", 32, 8, 31);
    int32_t in[8] = {1, 2, 3, 4, 5, 6, 7, 8}, tg[8] = {2, 3, 4, 5, 6, 7, 8, 9};
    dsc_gpt2 *net = NULL;
    assert_int_equal(dsc_gpt2_create(&net, &m.c, 1, 8), DSC_OK);
    hook_log log = {.fail_at = -1};
    dsc_gpt2_hooks hooks = {&log, on_gather, on_release, on_ready};
    float loss;
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 1, 8, &hooks, &loss), DSC_OK);
    assert_string_equal(log.seq, "G0R0G1R1G2R2G3R3G0R0");
    log.len = 0;
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, &hooks), DSC_OK);
    assert_string_equal(log.seq, "G0R0G3R3D3G2R2D2G1R1D1D0");
    // A failing hook stops the pass and its status comes back, with the group named.
    log.len = 0;
    log.fail_at = 2; // the gather of group 1
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 1, 8, &hooks, &loss), DSC_ERR_PEER);
    assert_string_equal(log.seq, "G0R0G1");
    assert_non_null(strstr(dsc_last_error(), "group 1"));
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, &hooks), DSC_ERR_INVALID_ARG);
    dsc_gpt2_destroy(net);
    model_free(&m);
}

// ---- configuration, table, init, argument checks ----

static void test_config_parse(void **state) {
    dsc_gpt2_config c;
    assert_int_equal(dsc_gpt2_config_parse("gpt2-124M", 50257, 1024, &c), DSC_OK);
    assert_int_equal(c.n_layer, 12), assert_int_equal(c.n_head, 12);
    assert_int_equal(c.n_embd, 768), assert_int_equal(c.vocab_size, 50257);
    assert_int_equal(c.max_seq_len, 1024);
    assert_int_equal(dsc_gpt2_num_params(&c), 124439808);
    assert_int_equal(dsc_gpt2_config_parse("gpt2-1558M", 50257, 1024, &c), DSC_OK);
    assert_int_equal(c.n_layer, 48), assert_int_equal(c.n_head, 25);
    assert_int_equal(c.n_embd, 1600);
    assert_int_equal(dsc_gpt2_config_parse("gpt2-350M", 50257, 1024, &c), DSC_OK);
    assert_int_equal(c.n_embd, 1024);
    assert_int_equal(dsc_gpt2_config_parse("gpt2-774M", 50257, 1024, &c), DSC_OK);
    assert_int_equal(c.n_head, 20);
    assert_int_equal(dsc_gpt2_config_parse("d6", 256, 512, &c), DSC_OK);
    assert_int_equal(c.n_layer, 6), assert_int_equal(c.n_head, 6);
    assert_int_equal(c.n_embd, 384), assert_int_equal(c.max_seq_len, 512);
    assert_int_equal(dsc_gpt2_config_parse("d1", 10, 4, &c), DSC_OK);
    const char *bad[] = {"", "d", "d0", "d257", "d6x", "D6", "d-3", "d 6", "gpt2", "gpt2-124m"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsc_clear_error();
        assert_int_equal(dsc_gpt2_config_parse(bad[i], 50257, 1024, &c), DSC_ERR_INVALID_ARG);
        assert_non_null(strstr(dsc_last_error(), "gpt2-124M"));
        assert_non_null(strstr(dsc_last_error(), "dN"));
    }
    assert_int_equal(dsc_gpt2_config_parse(NULL, 50257, 1024, &c), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_gpt2_config_parse("d2", 0, 1024, &c), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_gpt2_config_parse("d2", 10, -1, &c), DSC_ERR_INVALID_ARG);
}

static void test_tensor_table(void **state) {
    dsc_gpt2_config c;
    assert_int_equal(dsc_gpt2_config_parse("d2", 100, 16, &c), DSC_OK);
    assert_int_equal(dsc_gpt2_num_tensors(&c), 28);
    assert_int_equal(dsc_gpt2_num_groups(&c), 4);
    struct {
        int i;
        const char *name;
        int ndim;
        int64_t s0, s1;
        int group;
    } want[] = {
        {0, "wte.weight", 2, 100, 128, 0},
        {1, "wpe.weight", 2, 16, 128, 0},
        {2, "h.0.ln_1.weight", 1, 128, 0, 1},
        {4, "h.0.attn.c_attn.weight", 2, 128, 384, 1},
        {5, "h.0.attn.c_attn.bias", 1, 384, 0, 1},
        {6, "h.0.attn.c_proj.weight", 2, 128, 128, 1},
        {10, "h.0.mlp.c_fc.weight", 2, 128, 512, 1},
        {12, "h.0.mlp.c_proj.weight", 2, 512, 128, 1},
        {13, "h.0.mlp.c_proj.bias", 1, 128, 0, 1},
        {25, "h.1.mlp.c_proj.bias", 1, 128, 0, 2},
        {26, "ln_f.weight", 1, 128, 0, 3},
        {27, "ln_f.bias", 1, 128, 0, 3},
    };
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&c, want[k].i, &info);
        assert_string_equal(info.name, want[k].name);
        assert_int_equal(info.ndim, want[k].ndim);
        assert_int_equal(info.shape[0], want[k].s0);
        assert_int_equal(info.shape[1], want[k].s1);
        assert_int_equal(info.numel, want[k].s1 ? want[k].s0 * want[k].s1 : want[k].s0);
        assert_int_equal(info.group, want[k].group);
    }
    // 6N + 12 L C T, N without wpe
    double n = (double)dsc_gpt2_num_params(&c) - 16.0 * 128;
    assert_true(fabs(dsc_gpt2_flops_per_token(&c, 16) - (6 * n + 12.0 * 2 * 128 * 16)) < 1e-6);
}

static void moments(const float *x, int64_t n, double *mean, double *std) {
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
    *mean = s / n;
    *std = sqrt(s2 / n - *mean * *mean);
}

static void test_init(void **state) {
    model m = model_new("d4", 1000, 64, 5); // model_new perturbs vectors: re-init here
    dsc_gpt2_init_weights(&m.c, m.p, 5);
    double mean, std;
    moments(m.p[0], m.numel[0], &mean, &std); // wte: 256k samples
    printf("  wte mean %.2e std %.5f\n", mean, std);
    assert_true(fabs(mean) < 3e-4 && fabs(std - 0.02) < 2e-4);
    moments(m.p[2 + 12 * 2 + 10], m.numel[2 + 12 * 2 + 10], &mean, &std); // h.2.mlp.c_proj
    assert_true(fabs(mean) < 3e-4 && fabs(std - 0.02 / sqrt(8.0)) < 1e-4);
    moments(m.p[2 + 4], m.numel[2 + 4], &mean, &std); // h.0.attn.c_proj
    assert_true(fabs(std - 0.02 / sqrt(8.0)) < 2e-4);
    moments(m.p[2 + 2], m.numel[2 + 2], &mean, &std); // h.0.attn.c_attn
    assert_true(fabs(std - 0.02) < 2e-4);
    for (int i = 2; i < m.n; i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&m.c, i, &info);
        int is_ln_w = strstr(info.name, "ln_") && strstr(info.name, "weight");
        if (info.ndim == 1)
            for (int64_t j = 0; j < info.numel; j++)
                assert_true(m.p[i][j] == (is_ln_w ? 1.0f : 0.0f));
    }
    // Any slice on its own equals the same slice of the whole; another seed differs.
    float slice[333];
    dsc_gpt2_init_tensor(&m.c, 4, slice, 1001, 333, 5);
    assert_memory_equal(slice, m.p[4] + 1001, sizeof slice);
    dsc_gpt2_init_tensor(&m.c, 4, slice, 1001, 333, 6);
    assert_true(memcmp(slice, m.p[4] + 1001, sizeof slice) != 0);
    model_free(&m);
}

static void test_argument_checks(void **state) {
    model m = model_new("d1", 50, 8, 41);
    dsc_gpt2 *net = NULL;
    assert_int_equal(dsc_gpt2_create(&net, &m.c, 2, 9), DSC_ERR_INVALID_ARG); // T > max_seq_len
    assert_null(net);
    assert_int_equal(dsc_gpt2_create(&net, &m.c, 2, 4), DSC_OK);
    int32_t in[8] = {0, 1, 2, 3, 4, 5, 6, 49}, tg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float loss = 0.0f;
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 3, 4, NULL, &loss), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 1, 5, NULL, &loss), DSC_ERR_INVALID_ARG);
    in[6] = 50;
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 2, 4, NULL, &loss), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "inputs[b=1, t=2] = 50"));
    in[6] = 6;
    tg[1] = 50; // negative targets are ignored ones; ids at or past the vocabulary are errors
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 2, 4, NULL, &loss), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "targets[b=0, t=1] = 50"));
    // Without targets: logits only, and backward refuses.
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, NULL, 2, 4, NULL, NULL), DSC_OK);
    assert_non_null(dsc_gpt2_logits(net));
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_ERR_INVALID_ARG);
    tg[1] = 2;
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 2, 3, NULL, &loss), DSC_OK); // smaller T
    assert_true(loss > 0.0f);
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_OK);
    assert_int_equal(dsc_gpt2_backward(net, m.p, m.g, 1.0f, NULL), DSC_ERR_INVALID_ARG);
    float *keep = m.p[6];
    m.p[6] = NULL;
    assert_int_equal(dsc_gpt2_forward(net, m.p, in, tg, 2, 4, NULL, &loss), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "h.0.attn.c_proj.weight"));
    m.p[6] = keep;
    dsc_gpt2_destroy(net);
    dsc_gpt2_destroy(NULL);
    model_free(&m);
}

int main(void) {
    const char *s = getenv("DSC_TEST_SEED");
    if (s) seed_base = strtoull(s, NULL, 10);
    printf("test_gpt2_layers: seed %llu (set DSC_TEST_SEED to change)\n",
           (unsigned long long)seed_base);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_parse),
        cmocka_unit_test(test_tensor_table),
        cmocka_unit_test(test_init),
        cmocka_unit_test(test_sgemm_chunks),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul_residual),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_softmax_xent),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_model_gradcheck),
        cmocka_unit_test(test_model_gradcheck_masked),
        cmocka_unit_test(test_model_positions),
        cmocka_unit_test(test_model_determinism_accumulation),
        cmocka_unit_test(test_hooks),
        cmocka_unit_test(test_argument_checks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
