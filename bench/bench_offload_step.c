// bench/bench_offload_step.c - the CPU side of a ZeRO-Offload optimizer step, dsc against an
// externally built competitor on the same buffers and OpenMP threads, interleaved.
//
// Two measurements, each timed per call over n fp32 elements:
//   adam: one plain AdamW step (p, g, m, v), no scaling, no 16-bit copy.
//   step: the whole offloaded step from loss-scaled gradients: overflow check, global gradient
//         norm, unscale and clip, AdamW, and the bf16/fp16 copy of the parameters for the device.
//         dsc makes two passes (dsc_opt_sumsq: norm + overflow; dsc_opt_step with the combined
//         factor and the 16-bit output); the competitor does what it does.
//
// The competitor is a shared library given with --competitor PATH (or DSC_BENCH_COMPETITOR) that
// exports, with C linkage:
//   const char *bench_competitor_name(void);
//   int bench_competitor_adam(float *p, float *g, float *m, float *v, size_t n, long step,
//                             float lr, float beta1, float beta2, float eps, float weight_decay,
//                             int adamw_mode, int bias_correction);
//   int bench_competitor_offload_step(<the same arguments>, float loss_scale, float clip,
//                                     uint16_t *out16, int out16_kind, int *overflow,
//                                     double *grad_norm);
// out16_kind is 1 for bf16, 2 for fp16; the gradients may be modified in place (they are restored
// from a pristine copy, outside the timing, before every call of either side). Without a
// competitor only dsc's numbers are printed.
//
// Usage: bench_offload_step [--n ELEMENTS] [--rounds R] [--out16 bf16|fp16] [--competitor PATH]
#include <dlfcn.h>  // dlopen, dlsym, dlerror
#include <errno.h>  // errno
#include <math.h>   // sqrt, fabs
#include <omp.h>    // omp_get_max_threads
#include <stdbool.h>
#include <stdint.h> // uint16_t
#include <stdio.h>  // printf, fprintf
#include <stdlib.h> // aligned_alloc, free, getenv, qsort, strtoull
#include <string.h> // memcpy, strcmp

#include "base/time.h"          // dsc_now
#include "engine/optim/optim.h" // dsc_opt_step, dsc_opt_sumsq

#define MAX_ROUNDS 64
#define LOSS_SCALE 1024.0f
#define CLIP 1.0f

typedef int (*comp_adam_fn)(float *, float *, float *, float *, size_t, long, float, float, float,
                            float, float, int, int);
typedef int (*comp_step_fn)(float *, float *, float *, float *, size_t, long, float, float, float,
                            float, float, int, int, float, float, uint16_t *, int, int *,
                            double *);

typedef struct competitor {
    const char *name;
    comp_adam_fn adam;
    comp_step_fn step;
} competitor;

// The arrays one side steps; both sides share them in the timed runs.
typedef struct bufs {
    float *p, *g, *m, *v;
    uint16_t *out16;
    size_t n;
} bufs;

typedef struct opts {
    size_t n;
    int rounds;
    int out16_kind;
    const char *lib;
} opts;

static dsc_opt_hparams hparams(void) {
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAMW, &h);
    h.weight_decay = 0.01f;
    return h;
}

// ---- the two sides ----

static void ours_adam(bufs *b, long step) {
    dsc_opt_hparams h = hparams();
    dsc_opt_step(&h, step, b->p, b->g, b->m, b->v, b->n, 1.0f, NULL, DSC_OPT_OUT_NONE);
}

// DeepSpeed's clipping rule (unscale_and_clip_grads): clip = (norm + 1e-6) / max_norm, at least 1;
// the gradients are multiplied by 1 / (clip * loss_scale). Computed in float, as torch does.
static float combined_inverse(float norm) {
    float clip = (norm + 1e-6f) / CLIP;
    if (clip < 1.0f) clip = 1.0f;
    return 1.0f / (clip * LOSS_SCALE);
}

// Pass 1 reads the gradients once for the norm and the overflow flag; pass 2 is everything else.
static bool ours_step(bufs *b, long step, int kind, double *norm) {
    bool overflow = false;
    double sumsq = dsc_opt_sumsq(b->g, b->n, 1.0f / LOSS_SCALE, &overflow);
    *norm = sqrt(sumsq);
    if (overflow) return false;
    dsc_opt_hparams h = hparams();
    dsc_opt_step(&h, step, b->p, b->g, b->m, b->v, b->n, combined_inverse((float)*norm), b->out16,
                 kind);
    return true;
}

static void comp_adam(const competitor *c, bufs *b, long step) {
    dsc_opt_hparams h = hparams();
    c->adam(b->p, b->g, b->m, b->v, b->n, step, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 1,
            1);
}

static bool comp_step(const competitor *c, bufs *b, long step, int kind, double *norm) {
    dsc_opt_hparams h = hparams();
    int overflow = 0;
    c->step(b->p, b->g, b->m, b->v, b->n, step, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, 1,
            1, LOSS_SCALE, CLIP, b->out16, kind, &overflow, norm);
    return overflow == 0;
}

// ---- setup ----

static bool parse_size(const char *s, size_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v == 0) return false;
    *out = (size_t)v;
    return true;
}

static bool parse_args(int argc, char **argv, opts *o) {
    *o = (opts){.n = (size_t)64 << 20, .rounds = 7, .out16_kind = DSC_OPT_OUT_BF16};
    o->lib = getenv("DSC_BENCH_COMPETITOR");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        size_t r;
        if (val == NULL) return false;
        if (strcmp(a, "--n") == 0 && parse_size(val, &o->n)) i++;
        else if (strcmp(a, "--rounds") == 0 && parse_size(val, &r) && r <= MAX_ROUNDS) {
            o->rounds = (int)r;
            i++;
        } else if (strcmp(a, "--out16") == 0 && strcmp(val, "bf16") == 0) {
            o->out16_kind = DSC_OPT_OUT_BF16;
            i++;
        } else if (strcmp(a, "--out16") == 0 && strcmp(val, "fp16") == 0) {
            o->out16_kind = DSC_OPT_OUT_FP16;
            i++;
        } else if (strcmp(a, "--competitor") == 0) {
            o->lib = val;
            i++;
        } else return false;
    }
    if (o->lib != NULL && o->lib[0] == '\0') o->lib = NULL;
    return true;
}

static bool load_competitor(const char *path, competitor *c) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        fprintf(stderr, "competitor %s: %s\n", path, dlerror());
        return false;
    }
    const char *(*name)(void) = (const char *(*)(void))dlsym(h, "bench_competitor_name");
    c->adam = (comp_adam_fn)dlsym(h, "bench_competitor_adam");
    c->step = (comp_step_fn)dlsym(h, "bench_competitor_offload_step");
    if (c->adam == NULL || c->step == NULL) {
        fprintf(stderr, "competitor %s lacks bench_competitor_adam or "
                        "bench_competitor_offload_step\n", path);
        return false;
    }
    c->name = name != NULL ? name() : path;
    return true;
}

// Loss-scaled gradients of a plausible size (|g| ~ 1e-3 before scaling) so that clipping acts.
static void fill(bufs *b, float *g0) {
    for (size_t i = 0; i < b->n; i++) {
        float u = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f; // [-1, 1]
        b->p[i] = 0.02f * u;
        g0[i] = 1e-3f * u * LOSS_SCALE;
        b->m[i] = 0.0f;
        b->v[i] = 0.0f;
    }
}

static bool alloc_bufs(bufs *b, size_t n) {
    *b = (bufs){.n = n};
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    b->p = aligned_alloc(64, bytes), b->g = aligned_alloc(64, bytes);
    b->m = aligned_alloc(64, bytes), b->v = aligned_alloc(64, bytes);
    b->out16 = aligned_alloc(64, (n * 2 + 63) / 64 * 64);
    return b->p && b->g && b->m && b->v && b->out16;
}

static void free_bufs(bufs *b) {
    free(b->p), free(b->g), free(b->m), free(b->v), free(b->out16);
}

static void restore_grads(bufs *b, const float *g0) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < b->n; i++) b->g[i] = g0[i];
}

// ---- agreement ----

// One whole step on each side from identical states (n elements): the largest difference of p in
// units of the learning rate (an Adam update moves p by about lr) and the number of 16-bit copies
// that differ. Both work in fp32; the norms are summed in different orders and precisions, so the
// clipping factors, and with them the results, may differ in the last bits.
static void agreement(const competitor *c, size_t n, int kind) {
    bufs a, b;
    float *g0 = malloc(n * sizeof(float));
    if (!g0 || !alloc_bufs(&a, n) || !alloc_bufs(&b, n)) {
        fprintf(stderr, "agreement: out of memory\n");
        exit(1);
    }
    fill(&a, g0), fill(&b, g0);
    double worst = 0, na = 0, nb = 0, lr = hparams().lr;
    size_t diff16 = 0;
    for (long t = 1; t <= 3; t++) {
        restore_grads(&a, g0), restore_grads(&b, g0);
        ours_step(&a, t, kind, &na);
        comp_step(c, &b, t, kind, &nb);
        for (size_t i = 0; i < n; i++) {
            double d = fabs((double)a.p[i] - b.p[i]) / lr;
            if (d > worst) worst = d;
            diff16 += a.out16[i] != b.out16[i];
        }
    }
    printf("agreement over 3 steps, %zu elements: norm %.9g vs %.9g, largest |p difference| / lr "
           "%.3g, 16-bit copies differing %zu\n", n, na, nb, worst, diff16);
    free_bufs(&a), free_bufs(&b), free(g0);
}

// ---- timing ----

enum { OURS_ADAM, COMP_ADAM, OURS_STEP, COMP_STEP, NSERIES };

typedef struct series {
    double t[MAX_ROUNDS];
} series;

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *x, int k) {
    double s[MAX_ROUNDS];
    memcpy(s, x, (size_t)k * sizeof(double));
    qsort(s, (size_t)k, sizeof(double), cmp_double);
    return k % 2 ? s[k / 2] : 0.5 * (s[k / 2 - 1] + s[k / 2]);
}

static double minmax(const double *x, int k, bool want_max) {
    double r = x[0];
    for (int i = 1; i < k; i++) r = want_max ? (x[i] > r ? x[i] : r) : (x[i] < r ? x[i] : r);
    return r;
}

// One timed call of series s; gradients restored first, outside the timing.
static double time_one(int s, const competitor *c, bufs *b, const float *g0, long *steps,
                       int kind) {
    restore_grads(b, g0);
    double norm, t0 = dsc_now();
    switch (s) {
    case OURS_ADAM: ours_adam(b, ++steps[s]); break;
    case COMP_ADAM: comp_adam(c, b, ++steps[s]); break;
    case OURS_STEP: ours_step(b, ++steps[s], kind, &norm); break;
    case COMP_STEP: comp_step(c, b, ++steps[s], kind, &norm); break;
    }
    return dsc_now() - t0;
}

// Rounds alternate the order (ours first, then the competitor first) so that drift in the
// machine's load falls on both sides alike. Round 0 is a warm-up and is not kept.
static void run_rounds(const opts *o, const competitor *c, bufs *b, const float *g0,
                       series *out) {
    long steps[NSERIES] = {0};
    for (int r = 0; r <= o->rounds; r++) {
        for (int k = 0; k < NSERIES; k++) {
            int s = k;
            if (c != NULL && r % 2 == 1) s = k ^ 1; // competitor first in odd rounds
            if (c == NULL && (s == COMP_ADAM || s == COMP_STEP)) continue;
            double t = time_one(s, c, b, g0, steps, o->out16_kind);
            if (r > 0) out[s].t[r - 1] = t;
        }
    }
}

static void print_row(const char *what, const char *who, const series *s, int k, size_t n) {
    double med = median(s->t, k), lo = minmax(s->t, k, false), hi = minmax(s->t, k, true);
    printf("| %s | %s | %.1f | %.1f-%.1f | %.0f |\n", what, who, med * 1e3, lo * 1e3, hi * 1e3,
           (double)n / med / 1e6);
}

// Per-round ratios competitor/ours (paired, so a slow round counts against both sides).
static void print_ratio(const char *what, const series *ours, const series *comp, int k) {
    double r[MAX_ROUNDS] = {0};
    for (int i = 0; i < k; i++) r[i] = comp->t[i] / ours->t[i];
    printf("%s: competitor time / dsc time: median of medians %.2fx, per round median %.2fx "
           "(range %.2f-%.2f)\n", what, median(comp->t, k) / median(ours->t, k), median(r, k),
           minmax(r, k, false), minmax(r, k, true));
}

static void report(const opts *o, const competitor *c, const series *s) {
    printf("| measurement | side | median ms | range ms | M elements/s |\n|---|---|---|---|---|\n");
    print_row("adam", "dsc", &s[OURS_ADAM], o->rounds, o->n);
    if (c) print_row("adam", "competitor", &s[COMP_ADAM], o->rounds, o->n);
    print_row("step", "dsc", &s[OURS_STEP], o->rounds, o->n);
    if (c) print_row("step", "competitor", &s[COMP_STEP], o->rounds, o->n);
    if (c == NULL) {
        printf("competitor: not given (--competitor PATH or DSC_BENCH_COMPETITOR); dsc only\n");
        return;
    }
    print_ratio("adam", &s[OURS_ADAM], &s[COMP_ADAM], o->rounds);
    print_ratio("step", &s[OURS_STEP], &s[COMP_STEP], o->rounds);
}

int main(int argc, char **argv) {
    opts o;
    if (!parse_args(argc, argv, &o)) {
        fprintf(stderr, "usage: %s [--n ELEMENTS] [--rounds R<=%d] [--out16 bf16|fp16] "
                        "[--competitor PATH]\n", argv[0], MAX_ROUNDS);
        return 2;
    }
    competitor comp, *c = NULL;
    if (o.lib != NULL) {
        if (!load_competitor(o.lib, &comp)) return 1;
        c = &comp;
    }
    printf("n %zu, %d OpenMP threads, dsc path %s, 16-bit copy %s, loss scale %g, clip %g, "
           "%d rounds%s%s\n", o.n, omp_get_max_threads(), dsc_opt_simd_name(),
           o.out16_kind == DSC_OPT_OUT_BF16 ? "bf16" : "fp16", LOSS_SCALE, CLIP, o.rounds,
           c ? ", competitor: " : "", c ? c->name : "");
    if (c) agreement(c, (size_t)1 << 20 | 13, o.out16_kind);
    bufs b;
    float *g0 = aligned_alloc(64, (o.n * sizeof(float) + 63) / 64 * 64);
    if (!g0 || !alloc_bufs(&b, o.n)) {
        fprintf(stderr, "out of memory for %zu elements\n", o.n);
        return 1;
    }
    fill(&b, g0);
    series s[NSERIES];
    run_rounds(&o, c, &b, g0, s);
    report(&o, c, s);
    free_bufs(&b), free(g0);
    return 0;
}
