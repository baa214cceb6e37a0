// tests/unit/test_optim.c - the fused optimizer kernels against double-precision references written
// here from torch's and DeepSpeed's update rules, on every SIMD path this CPU has.
//
// Each step's expected result is computed in double from the same fp32 inputs the kernel saw (its
// own previous outputs), so errors do not compound across steps. The error of an element is
// measured relative to the magnitude of the terms that produced it (the sum of absolute values
// of the addends, carried through the formula), which is what fp32 arithmetic can promise when
// terms cancel; the bound is 1e-6.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>   // fabs, sqrt, pow, copysign, INFINITY, NAN
#include <stdio.h>  // printf
#include <stdlib.h> // malloc, aligned_alloc, free, getenv, setenv, strtoull
#include <string.h> // memcpy, strcmp

#include "dsc/half.h"           // dsc_fp32_to_bf16, dsc_fp32_to_fp16
#include "engine/optim/optim.h" // dsc_opt_*

#define TOL 1e-6

static uint64_t g_seed = 20240601;
static uint64_t g_rng;

static uint64_t rng_u64(void) { // splitmix64
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((rng_u64() >> 40) * 0x1p-24);
}

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t float_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static const char *const PATHS[] = {"scalar", "avx2", "avx512"};
static const size_t LENS[] = {0, 1, 7, 33, 1000003};
#define NPATHS (sizeof PATHS / sizeof PATHS[0])
#define NLENS (sizeof LENS / sizeof LENS[0])

// Force a path; false (with a message) when this CPU lacks it.
static bool use_path(const char *path) {
    dsc_status st = dsc_opt_simd_force(path);
    if (st == DSC_ERR_UNSUPPORTED) {
        printf("SKIP path %s: this CPU lacks it\n", path);
        return false;
    }
    assert_int_equal(st, DSC_OK);
    assert_string_equal(dsc_opt_simd_name(), path);
    return true;
}

// ---- references (double) ----

// Expected outputs of one element and the magnitudes their errors are measured against.
typedef struct {
    double p, m, v;
    double mag_p, mag_m, mag_v;
    bool p_ambiguous; // Lion: the sign of c is within rounding of zero; p is not checked
} expect;

// torch.optim.Adam / AdamW written out (L2 when not decoupled), with DeepSpeed's rule that weight
// decay acts only when > 0 and that "Adam" means AdamW unless adam_w_mode is false.
static expect ref_adam(const dsc_opt_hparams *h, int64_t t, double p, double g, double m,
                       double v, double scale) {
    double b1 = h->beta1, b2 = h->beta2, lr = h->lr, wd = h->weight_decay, eps = h->eps;
    bool decoupled = h->kind == DSC_OPT_ADAMW || h->adam_w_mode;
    double grad = g * scale, mag_g = fabs(grad);
    if (!decoupled && wd > 0) {
        grad += wd * p;
        mag_g += fabs(wd * p);
    }
    expect e = {0};
    e.m = b1 * m + (1 - b1) * grad;
    e.mag_m = b1 * fabs(m) + (1 - b1) * mag_g;
    e.v = b2 * v + (1 - b2) * grad * grad;
    e.mag_v = b2 * v + (1 - b2) * mag_g * mag_g;
    double bc1 = h->bias_correction ? 1 - pow(b1, (double)t) : 1;
    double bc2 = h->bias_correction ? 1 - pow(b2, (double)t) : 1;
    double denom = sqrt(e.v) / sqrt(bc2) + eps;
    double pd = (decoupled && wd > 0) ? p * (1 - lr * wd) : p;
    double upd = (lr / bc1) * e.m / denom;
    e.p = pd - upd;
    e.mag_p = fabs(pd) + (lr / bc1) * (e.mag_m / denom) + fabs(upd);
    return e;
}

// torch.optim.SGD written out; `buf` is ignored at the first step.
static expect ref_sgd(const dsc_opt_hparams *h, int64_t t, double p, double g, double buf,
                      double scale) {
    double lr = h->lr, wd = h->weight_decay, mu = h->momentum, damp = h->dampening;
    double grad = g * scale, mag_g = fabs(grad);
    if (wd != 0) {
        grad += wd * p;
        mag_g += fabs(wd * p);
    }
    expect e = {0};
    double u = grad, mag_u = mag_g;
    if (mu != 0) {
        e.m = t == 1 ? grad : mu * buf + (1 - damp) * grad;
        e.mag_m = t == 1 ? mag_g : mu * fabs(buf) + (1 - damp) * mag_g;
        u = h->nesterov ? grad + mu * e.m : e.m;
        mag_u = h->nesterov ? mag_g + mu * e.mag_m : e.mag_m;
    }
    e.p = p - lr * u;
    e.mag_p = fabs(p) + lr * mag_u;
    return e;
}

// Lion as DeepSpeed's CPU kernel: the update is -copysign(lr, c), so c = +0 moves p down by lr.
static expect ref_lion(const dsc_opt_hparams *h, double p, double g, double m, double scale) {
    double b1 = h->beta1, b2 = h->beta2, lr = h->lr, wd = h->weight_decay;
    double grad = g * scale;
    double c = b1 * m + (1 - b1) * grad;
    double mag_c = b1 * fabs(m) + (1 - b1) * fabs(grad);
    double pd = wd > 0 ? p * (1 - lr * wd) : p;
    expect e = {0};
    e.p = pd - copysign(lr, c);
    e.mag_p = fabs(pd) + lr;
    e.p_ambiguous = mag_c > 0 && fabs(c) <= 1e-5 * mag_c;
    e.m = b2 * m + (1 - b2) * grad;
    e.mag_m = b2 * fabs(m) + (1 - b2) * fabs(grad);
    return e;
}

// ---- the driver ----

typedef struct {
    const char *name;
    dsc_opt_hparams h;
    float scale;
    bool aligned_signs;  // gradient has p's sign (Adam L2: keeps g + wd*p away from cancellation)
    bool zero_grads;     // every 97th gradient is exactly zero
    bool vary_beta1;     // beta1 changes between steps, as OneCycle's momentum does
} opt_case;

typedef struct {
    size_t n;
    float *p, *g, *m, *v;    // (n) the kernel's arrays
    float *p0, *m0, *v0;     // (n) inputs of the current step
    uint16_t *o16;           // (n)
    double worst;            // largest error / magnitude seen
    size_t ambiguous;        // Lion elements whose sign was within rounding of zero
} run_state;

static void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    assert_non_null(p);
    return p;
}

static void state_init(run_state *s, const opt_case *c, size_t n) {
    *s = (run_state){.n = n};
    s->p = xmalloc(n * 4), s->g = xmalloc(n * 4), s->m = xmalloc(n * 4), s->v = xmalloc(n * 4);
    s->p0 = xmalloc(n * 4), s->m0 = xmalloc(n * 4), s->v0 = xmalloc(n * 4);
    s->o16 = xmalloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        float mag = c->aligned_signs ? rng_uniform(0.1f, 1.0f) : rng_uniform(-1.0f, 1.0f);
        s->p[i] = (c->aligned_signs && (rng_u64() & 1)) ? -mag : mag;
        // SGD's buffer must be ignored at step 1: start it as NaN to prove it is.
        s->m[i] = c->h.kind == DSC_OPT_SGD ? NAN : 0.0f;
        s->v[i] = 0.0f;
    }
}

static void state_free(run_state *s) {
    free(s->p), free(s->g), free(s->m), free(s->v);
    free(s->p0), free(s->m0), free(s->v0), free(s->o16);
}

static void fill_grads(run_state *s, const opt_case *c) {
    for (size_t i = 0; i < s->n; i++) {
        float g = rng_uniform(-1.0f, 1.0f) / c->scale;
        if (c->aligned_signs) g = copysignf(g, s->p[i]);
        if (c->zero_grads && i % 97 == 0) g = 0.0f;
        s->g[i] = g;
    }
}

static void fail_at(const char *what, const opt_case *c, const char *path, size_t n, int64_t t,
                    size_t i, double got, double want, double mag) {
    print_error("%s: case %s path %s n %zu step %lld element %zu: got %.9g want %.9g "
                "(error %.3g of magnitude %.3g); seed %llu (DSC_TEST_SEED)\n",
                what, c->name, path, n, (long long)t, i, got, want, fabs(got - want), mag,
                (unsigned long long)g_seed);
    fail();
}

static void check(const char *what, run_state *s, const opt_case *c, const char *path, int64_t t,
                  size_t i, double got, double want, double mag) {
    double err = fabs(got - want);
    if (err > TOL * mag || isnan(got) != isnan(want))
        fail_at(what, c, path, s->n, t, i, got, want, mag);
    if (mag > 0 && err / mag > s->worst) s->worst = err / mag;
}

static expect reference(const opt_case *c, const dsc_opt_hparams *h, int64_t t, run_state *s,
                        size_t i) {
    switch (h->kind) {
    case DSC_OPT_ADAM:
    case DSC_OPT_ADAMW: return ref_adam(h, t, s->p0[i], s->g[i], s->m0[i], s->v0[i], c->scale);
    case DSC_OPT_SGD: return ref_sgd(h, t, s->p0[i], s->g[i], s->m0[i], c->scale);
    case DSC_OPT_LION: return ref_lion(h, s->p0[i], s->g[i], s->m0[i], c->scale);
    }
    return (expect){0};
}

static void check_step(run_state *s, const opt_case *c, const dsc_opt_hparams *h, const char *path,
                       int64_t t, int out_kind) {
    bool adam = h->kind == DSC_OPT_ADAM || h->kind == DSC_OPT_ADAMW;
    bool has_m = h->kind != DSC_OPT_SGD || h->momentum != 0;
    for (size_t i = 0; i < s->n; i++) {
        expect e = reference(c, h, t, s, i);
        if (e.p_ambiguous) s->ambiguous++;
        else check("p", s, c, path, t, i, s->p[i], e.p, e.mag_p);
        if (has_m) check("m", s, c, path, t, i, s->m[i], e.m, e.mag_m);
        if (adam) check("v", s, c, path, t, i, s->v[i], e.v, e.mag_v);
        uint16_t want16 = out_kind == DSC_OPT_OUT_BF16   ? dsc_fp32_to_bf16(s->p[i])
                          : out_kind == DSC_OPT_OUT_FP16 ? dsc_fp32_to_fp16(s->p[i])
                                                         : 0;
        if (out_kind != DSC_OPT_OUT_NONE && s->o16[i] != want16)
            fail_at(out_kind == DSC_OPT_OUT_BF16 ? "bf16 copy" : "fp16 copy", c, path, s->n, t, i,
                    s->o16[i], want16, 0);
    }
}

// Hyper-parameters of step t: lr changes every step (as under a schedule), beta1 if asked.
static dsc_opt_hparams step_hparams(const opt_case *c, int64_t t) {
    dsc_opt_hparams h = c->h;
    h.lr = c->h.lr * (float)(1.0 + 0.25 * (double)(t - 1));
    if (c->vary_beta1) h.beta1 = (float)(0.85 + 0.05 * (double)((t - 1) % 3));
    return h;
}

static double run_case(const opt_case *c, const char *path, size_t n) {
    enum { STEPS = 4 };
    run_state s;
    state_init(&s, c, n);
    bool sgd_plain = c->h.kind == DSC_OPT_SGD && c->h.momentum == 0;
    for (int64_t t = 1; t <= STEPS; t++) {
        dsc_opt_hparams h = step_hparams(c, t);
        fill_grads(&s, c);
        memcpy(s.p0, s.p, n * 4), memcpy(s.m0, s.m, n * 4), memcpy(s.v0, s.v, n * 4);
        int out_kind = (int)(t % 3); // none, bf16, fp16 in turn
        bool adam = h.kind == DSC_OPT_ADAM || h.kind == DSC_OPT_ADAMW;
        dsc_opt_step(&h, t, s.p, s.g, sgd_plain ? NULL : s.m, adam ? s.v : NULL, n, c->scale,
                     out_kind ? s.o16 : NULL, out_kind);
        check_step(&s, c, &h, path, t, out_kind);
    }
    // Lion's sign is ambiguous for a handful of elements at most; more would hide a bug.
    if (s.ambiguous > 1 + n / 10000) {
        print_error("case %s path %s: %zu ambiguous signs of %zu elements; seed %llu\n", c->name,
                    path, s.ambiguous, n, (unsigned long long)g_seed);
        fail();
    }
    double worst = s.worst;
    state_free(&s);
    return worst;
}

static void run_cases(const opt_case *cases, size_t ncases) {
    for (size_t k = 0; k < NPATHS; k++) {
        if (!use_path(PATHS[k])) continue;
        double worst = 0;
        for (size_t ci = 0; ci < ncases; ci++) {
            for (size_t li = 0; li < NLENS; li++) {
                double w = run_case(&cases[ci], PATHS[k], LENS[li]);
                if (w > worst) worst = w;
            }
        }
        printf("path %-6s: largest error / magnitude %.3g (bound %.0e)\n", PATHS[k], worst, TOL);
    }
    assert_int_equal(dsc_opt_simd_force(NULL), DSC_OK);
}

static opt_case make_case(const char *name, dsc_opt_kind kind, float lr, float wd, float scale) {
    opt_case c = {.name = name, .scale = scale};
    dsc_opt_hparams_defaults(kind, &c.h);
    c.h.lr = lr;
    c.h.weight_decay = wd;
    return c;
}

// ---- tests ----

static void test_adam(void **state) {
    opt_case cases[5];
    cases[0] = make_case("adamw", DSC_OPT_ADAMW, 1e-2f, 0.1f, 1.0f / 512);
    cases[1] = make_case("adam-l2", DSC_OPT_ADAM, 1e-3f, 0.05f, 1.0f);
    cases[1].h.adam_w_mode = false;
    cases[1].aligned_signs = true;
    cases[2] = make_case("adam-default-is-adamw", DSC_OPT_ADAM, 3e-3f, 0.01f, 1.0f / 65536);
    cases[3] = make_case("adamw-no-bias-correction", DSC_OPT_ADAMW, 1e-2f, 0.0f, 1.0f);
    cases[3].h.bias_correction = false;
    cases[3].h.eps = 1e-6f;
    cases[4] = make_case("adamw-varying-beta1", DSC_OPT_ADAMW, 1e-2f, 0.02f, 0.25f);
    cases[4].vary_beta1 = true;
    run_cases(cases, 5);
}

static void test_sgd(void **state) {
    opt_case cases[4];
    cases[0] = make_case("sgd-plain", DSC_OPT_SGD, 0.1f, 0.0f, 1.0f);
    cases[1] = make_case("sgd-momentum-dampening", DSC_OPT_SGD, 0.05f, 1e-3f, 1.0f / 1024);
    cases[1].h.momentum = 0.9f;
    cases[1].h.dampening = 0.1f;
    cases[2] = make_case("sgd-nesterov", DSC_OPT_SGD, 0.05f, 1e-2f, 0.5f);
    cases[2].h.momentum = 0.9f;
    cases[2].h.nesterov = true;
    cases[3] = make_case("sgd-weight-decay", DSC_OPT_SGD, 0.2f, 0.1f, 1.0f);
    run_cases(cases, 4);
}

static void test_lion(void **state) {
    opt_case cases[2];
    cases[0] = make_case("lion", DSC_OPT_LION, 1e-3f, 0.1f, 1.0f / 256);
    cases[0].h.beta2 = 0.99f;
    cases[0].zero_grads = true;
    cases[1] = make_case("lion-defaults-no-decay", DSC_OPT_LION, 3e-4f, 0.0f, 1.0f);
    cases[1].zero_grads = true;
    run_cases(cases, 2);
}

// A zero gradient on zero momentum gives c = +0, and DeepSpeed's copysign moves p down by lr.
static void test_lion_zero_sign(void **state) {
    for (size_t k = 0; k < NPATHS; k++) {
        if (!use_path(PATHS[k])) continue;
        dsc_opt_hparams h;
        dsc_opt_hparams_defaults(DSC_OPT_LION, &h);
        float p[37], g[37] = {0}, m[37] = {0};
        for (int i = 0; i < 37; i++) p[i] = 1.0f;
        dsc_opt_step(&h, 1, p, g, m, NULL, 37, 1.0f, NULL, 0);
        for (int i = 0; i < 37; i++) assert_true(p[i] == 1.0f - h.lr && m[i] == 0.0f);
    }
    assert_int_equal(dsc_opt_simd_force(NULL), DSC_OK);
}

// 16-bit copies of special and boundary values: random bit patterns, fp16 range, exact ties. SGD
// with lr 0 and zero gradients leaves p as it is (NaNs quieted), so the copy sees them all.
static void fill_specials(float *p, size_t n) {
    static const uint32_t fixed[] = {0x00000000, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000,
                                     0x7f800001, 0xffa00000, 0x00000001, 0x807fffff, 0x477fe000,
                                     0x477ff000, 0x477fefff, 0x33000000, 0x33000001, 0x38800000,
                                     0x387fe000, 0x3f808000, 0x3f818000, 0x7f7fffff, 0xff7fffff};
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)rng_u64();
        switch (i % 4) {
        case 0: break;                                                     // any bits
        case 1: u = float_to_bits(rng_uniform(-70000.0f, 70000.0f)); break; // fp16 range
        case 2: u = (u & ~0x1fffu) | 0x1000u; break;                        // fp16 tie
        case 3: u = (u & ~0xffffu) | 0x8000u; break;                        // bf16 tie
        }
        if (i < sizeof fixed / sizeof fixed[0]) u = fixed[i];
        p[i] = bits_to_float(u);
    }
}

static void test_out16_specials(void **state) {
    enum { N = 4099 };
    float *p = xmalloc(N * 4), *p_in = xmalloc(N * 4), *g = xmalloc(N * 4);
    uint16_t *o = xmalloc(N * 2);
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_SGD, &h);
    h.lr = 0.0f;
    for (size_t k = 0; k < NPATHS; k++) {
        if (!use_path(PATHS[k])) continue;
        for (int kind = DSC_OPT_OUT_BF16; kind <= DSC_OPT_OUT_FP16; kind++) {
            fill_specials(p_in, N);
            memcpy(p, p_in, N * 4);
            memset(g, 0, N * 4);
            dsc_opt_step(&h, 1, p, g, NULL, NULL, N, 1.0f, o, kind);
            for (size_t i = 0; i < N; i++) {
                bool nan = isnan(p_in[i]);
                assert_true(nan ? isnan(p[i]) : float_to_bits(p[i]) == float_to_bits(p_in[i]));
                uint16_t want = kind == DSC_OPT_OUT_BF16 ? dsc_fp32_to_bf16(p[i])
                                                         : dsc_fp32_to_fp16(p[i]);
                if (o[i] != want) {
                    print_error("path %s kind %d element %zu bits 0x%08x: got 0x%04x want 0x%04x; "
                                "seed %llu\n", PATHS[k], kind, i, float_to_bits(p[i]), o[i], want,
                                (unsigned long long)g_seed);
                    fail();
                }
            }
        }
    }
    assert_int_equal(dsc_opt_simd_force(NULL), DSC_OK);
    free(p), free(p_in), free(g), free(o);
}

// Large calls write the 16-bit copy with streaming stores where it is aligned. Over 2^20 elements,
// from an aligned and a misaligned copy buffer, every path must give the same p, m, v bits as the
// same step without a copy, and exactly the rounded copy of p.
static void check_stream_case(size_t n, int kind, size_t offset, float *init, float *g,
                              float *st[6], uint16_t *o16) {
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAMW, &h);
    h.weight_decay = 0.01f;
    for (int k = 0; k < 6; k++) memcpy(st[k], init, n * 4);
    uint16_t *o = o16 + offset;
    dsc_opt_step(&h, 3, st[0], g, st[1], st[2], n, 0.5f, NULL, DSC_OPT_OUT_NONE);
    dsc_opt_step(&h, 3, st[3], g, st[4], st[5], n, 0.5f, o, kind);
    for (int k = 0; k < 3; k++) assert_memory_equal(st[k], st[k + 3], n * 4);
    for (size_t i = 0; i < n; i++) {
        uint16_t want = kind == DSC_OPT_OUT_BF16 ? dsc_fp32_to_bf16(st[3][i])
                                                 : dsc_fp32_to_fp16(st[3][i]);
        if (o[i] != want) {
            print_error("streamed copy: path %s kind %d offset %zu element %zu: got 0x%04x want "
                        "0x%04x; seed %llu\n", dsc_opt_simd_name(), kind, offset, i, o[i], want,
                        (unsigned long long)g_seed);
            fail();
        }
    }
}

static void test_out16_stream(void **state) {
    const size_t n = ((size_t)1 << 20) + 37;
    float *init = xmalloc(n * 4), *g = xmalloc(n * 4), *st[6];
    uint16_t *o16 = aligned_alloc(64, ((n + 1) * 2 + 63) / 64 * 64); // offset 0: aligned
    assert_non_null(o16);
    for (int k = 0; k < 6; k++) st[k] = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) init[i] = rng_uniform(-1.0f, 1.0f);
    for (size_t i = 0; i < n; i++) g[i] = rng_uniform(-1.0f, 1.0f);
    for (size_t k = 0; k < NPATHS; k++) {
        if (!use_path(PATHS[k])) continue;
        for (int kind = DSC_OPT_OUT_BF16; kind <= DSC_OPT_OUT_FP16; kind++)
            for (size_t offset = 0; offset < 2; offset++)
                check_stream_case(n, kind, offset, init, g, st, o16);
    }
    assert_int_equal(dsc_opt_simd_force(NULL), DSC_OK);
    for (int k = 0; k < 6; k++) free(st[k]);
    free(init), free(g), free(o16);
}

static double ref_sumsq(const float *g, size_t n, float scale) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)g[i] * scale) * ((double)g[i] * scale);
    return s;
}

static void check_nonfinite(float *g, size_t n, float bad) {
    size_t where[3] = {0, n / 2, n - 1};
    for (int w = 0; w < 3; w++) {
        float keep = g[where[w]];
        g[where[w]] = bad;
        bool flag = false;
        double s = dsc_opt_sumsq(g, n, 0.5f, &flag);
        assert_true(flag);
        assert_false(isfinite(s));
        g[where[w]] = keep;
    }
}

static void test_sumsq(void **state) {
    size_t nmax = LENS[NLENS - 1];
    float *g = xmalloc(nmax * 4);
    for (size_t k = 0; k < NPATHS; k++) {
        if (!use_path(PATHS[k])) continue;
        for (size_t li = 0; li < NLENS; li++) {
            size_t n = LENS[li];
            for (size_t i = 0; i < n; i++) g[i] = rng_uniform(-1000.0f, 1000.0f);
            float scale = 1.0f / 1024;
            double want = ref_sumsq(g, n, scale);
            bool flag = false;
            double got = dsc_opt_sumsq(g, n, scale, &flag);
            assert_false(flag);
            if (fabs(got - want) > 1e-12 * want) {
                print_error("sumsq path %s n %zu: got %.17g want %.17g; seed %llu\n", PATHS[k], n,
                            got, want, (unsigned long long)g_seed);
                fail();
            }
            flag = true; // a set flag is never cleared
            dsc_opt_sumsq(g, n, scale, &flag);
            assert_true(flag);
            dsc_opt_sumsq(g, n, scale, NULL);
            if (n == 0) continue;
            check_nonfinite(g, n, INFINITY);
            check_nonfinite(g, n, -INFINITY);
            check_nonfinite(g, n, NAN);
        }
    }
    assert_int_equal(dsc_opt_simd_force(NULL), DSC_OK);
    free(g);
}

static void test_force_and_validate(void **state) {
    assert_int_equal(dsc_opt_simd_force("sse9"), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_opt_simd_force("scalar"), DSC_OK);
    assert_string_equal(dsc_opt_simd_name(), "scalar");
    assert_int_equal(dsc_opt_simd_force("auto"), DSC_OK);

    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAM, &h);
    assert_true(h.adam_w_mode && h.bias_correction); // DeepSpeed: "Adam" is AdamW by default
    assert_true(h.lr == 1e-3f && h.beta1 == 0.9f && h.beta2 == 0.999f && h.eps == 1e-8f);
    dsc_opt_hparams_defaults(DSC_OPT_LION, &h);
    assert_true(h.beta1 == 0.9f && h.beta2 == 0.999f); // DeepSpeed's Lion, not the paper's 0.99
    dsc_opt_hparams_defaults(DSC_OPT_SGD, &h);
    assert_int_equal(dsc_opt_hparams_validate(&h), DSC_OK);
    h.nesterov = true;
    assert_int_equal(dsc_opt_hparams_validate(&h), DSC_ERR_CONFIG); // needs momentum
    assert_non_null(strstr(dsc_last_error(), "optimizer.params.nesterov"));
    h.momentum = 0.9f;
    assert_int_equal(dsc_opt_hparams_validate(&h), DSC_OK);
    h.dampening = 0.1f;
    assert_int_equal(dsc_opt_hparams_validate(&h), DSC_ERR_CONFIG); // needs zero dampening
    h.nesterov = false;
    h.weight_decay = -1.0f;
    assert_int_equal(dsc_opt_hparams_validate(&h), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "optimizer.params.weight_decay"));
}

// ---- bf16 master weights and optimizer states ----

static float bf16_round(double x) { return dsc_bf16_to_fp32(dsc_fp32_to_bf16((float)x)); }
static bool is_bf16(float x) { return (float_to_bits(x) & 0xffffu) == 0; }
// One bf16 unit in the last place at x (x finite, nonzero or zero: 2^-133 at zero is fine).
static double bf16_ulp(double x) {
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 8);
}

// dsc_opt_step_bf16 (AdamW, bf16 moments) on every path: p, m, v stay bf16 values; they are the
// fp32 step's results rounded to nearest even (bitwise), and within one bf16 ulp of the double
// reference rounded to bf16 (equal to it but for the rare fp32 result next to a midpoint).
static void test_adam_bf16(void **state) {
    (void)state;
    const size_t n = 4099;
    float *p = xmalloc(n * 4), *g = xmalloc(n * 4), *m = xmalloc(n * 4), *v = xmalloc(n * 4);
    float *pf = xmalloc(n * 4), *mf = xmalloc(n * 4), *vf = xmalloc(n * 4);
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAMW, &h);
    h.lr = 1e-2f;
    h.weight_decay = 0.01f;
    for (size_t k = 0; k < 3; k++) {
        if (!use_path(PATHS[k])) continue;
        for (size_t i = 0; i < n; i++) {
            p[i] = bf16_round(rng_uniform(-1, 1));
            m[i] = bf16_round(rng_uniform(-0.1f, 0.1f));
            v[i] = bf16_round(rng_uniform(0, 0.01f));
        }
        size_t exact = 0, total = 0;
        for (int64_t t = 1; t <= 5; t++) {
            for (size_t i = 0; i < n; i++) g[i] = rng_uniform(-1, 1);
            memcpy(pf, p, n * 4);
            memcpy(mf, m, n * 4);
            memcpy(vf, v, n * 4);
            dsc_opt_step(&h, t, pf, g, mf, vf, n, 0.5f, NULL, DSC_OPT_OUT_NONE);
            float *p0 = xmalloc(n * 4), *m0 = xmalloc(n * 4), *v0 = xmalloc(n * 4);
            memcpy(p0, p, n * 4);
            memcpy(m0, m, n * 4);
            memcpy(v0, v, n * 4);
            dsc_opt_step_bf16(&h, t, p, g, m, v, n, 0.5f, true, UINT64_MAX);
            for (size_t i = 0; i < n; i++) {
                expect e = ref_adam(&h, t, p0[i], g[i], m0[i], v0[i], 0.5);
                const float got[3] = {p[i], m[i], v[i]}, f32[3] = {pf[i], mf[i], vf[i]};
                const double ref[3] = {e.p, e.m, e.v};
                for (int j = 0; j < 3; j++) {
                    if (!is_bf16(got[j]) || got[j] != bf16_round(f32[j]) ||
                        fabs(got[j] - bf16_round(ref[j])) > bf16_ulp(ref[j])) {
                        printf("path %s step %lld element %zu value %d: got %.9g, fp32 %.9g, "
                               "reference %.17g (seed %llu)\n", PATHS[k], (long long)t, i, j,
                               got[j], f32[j], ref[j], (unsigned long long)g_seed);
                        fail();
                    }
                    exact += got[j] == bf16_round(ref[j]);
                    total++;
                }
            }
            free(p0);
            free(m0);
            free(v0);
        }
        assert_true(exact * 1000 >= total * 999); // midpoint ties of fp32 vs double are rare
    }
    free(p);
    free(g);
    free(m);
    free(v);
    free(pf);
    free(mf);
    free(vf);
}

// bf16_master_rounding "stochastic": every result is one of the two bf16 neighbours of the fp32
// step's value, the rounding is unbiased (a weight a quarter ulp above a bf16 value, updated by
// SGD with a zero gradient, rounds up in a quarter of the elements, within 5 sigma), the bits
// depend only on (step, index) (a split call gives the same bits), and another step draws others.
static void test_bf16_stochastic(void **state) {
    (void)state;
    const size_t n = 1 << 16;
    float *p = xmalloc(n * 4), *q = xmalloc(n * 4), *r = xmalloc(n * 4), *g = xmalloc(n * 4);
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_SGD, &h);
    h.lr = 0.0f; // p stays its fp32 value: only the rounding acts
    const float x = 1.0f + 0x1p-9f; // bf16 neighbours 1 and 1 + 2^-7: up with probability 1/4
    for (size_t i = 0; i < n; i++) p[i] = q[i] = r[i] = x, g[i] = 0.0f;
    dsc_opt_step_bf16(&h, 7, p, g, NULL, NULL, n, 1.0f, false, 1000);
    dsc_opt_step_bf16(&h, 7, q, g, NULL, NULL, n / 2, 1.0f, false, 1000);
    dsc_opt_step_bf16(&h, 7, q + n / 2, g, NULL, NULL, n - n / 2, 1.0f, false, 1000 + n / 2);
    dsc_opt_step_bf16(&h, 8, r, g, NULL, NULL, n, 1.0f, false, 1000);
    size_t up = 0, differ = 0;
    for (size_t i = 0; i < n; i++) {
        assert_true(p[i] == 1.0f || p[i] == 1.0f + 0x1p-7f);
        assert_true(float_to_bits(p[i]) == float_to_bits(q[i]));
        up += p[i] > 1.0f;
        differ += p[i] != r[i];
    }
    double mean = 0.25 * (double)n, sigma = sqrt((double)n * 0.25 * 0.75);
    printf("stochastic rounding: %zu of %zu up (expected %.0f +- %.0f); %zu differ at the next "
           "step\n", up, n, mean, sigma, differ);
    assert_true(fabs((double)up - mean) < 5 * sigma);
    assert_true(differ > n / 8);
    // nearest even (UINT64_MAX) rounds every element down
    for (size_t i = 0; i < n; i++) r[i] = x;
    dsc_opt_step_bf16(&h, 7, r, g, NULL, NULL, n, 1.0f, false, UINT64_MAX);
    for (size_t i = 0; i < n; i++) r[i] == 1.0f ? (void)0 : fail();
    free(p);
    free(q);
    free(r);
    free(g);
}

int main(void) {
    const char *seed = getenv("DSC_TEST_SEED");
    if (seed != NULL) g_seed = strtoull(seed, NULL, 10);
    g_rng = g_seed;
    // DSC_SIMD is read at the first use: set before any kernel runs, it must pick that path.
    setenv("DSC_SIMD", "scalar", 1);
    if (strcmp(dsc_opt_simd_name(), "scalar") != 0) {
        printf("DSC_SIMD=scalar was not honoured (got %s)\n", dsc_opt_simd_name());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_force_and_validate), cmocka_unit_test(test_adam),
        cmocka_unit_test(test_sgd),                cmocka_unit_test(test_lion),
        cmocka_unit_test(test_lion_zero_sign),     cmocka_unit_test(test_out16_specials),
        cmocka_unit_test(test_out16_stream), cmocka_unit_test(test_sumsq),
        cmocka_unit_test(test_adam_bf16), cmocka_unit_test(test_bf16_stochastic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
