// bench/bench_adam.c - the fused AdamW step's elements/s and its share of this machine's
// in-place read-modify-write bandwidth, measured in the same run (a[i] += b[i] over the same
// size: a plain copy would undercount because of write-allocate). AdamW moves 28 bytes/element
// (p, g, m, v read; p, m, v written).
#include <stdio.h>  // printf
#include <stdlib.h> // aligned_alloc, atol
#include <string.h> // memset

#include "base/time.h"          // dsc_now
#include "engine/optim/optim.h" // dsc_opt_step

static double best_of(int reps, void (*fn)(void *), void *arg) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = dsc_now();
        fn(arg);
        double dt = dsc_now() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

typedef struct job {
    float *p, *g, *m, *v;
    size_t n;
    int64_t step;
} job;

static void adam(void *arg) {
    job *j = arg;
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAMW, &h);
    h.weight_decay = 0.01f;
    dsc_opt_step(&h, ++j->step, j->p, j->g, j->m, j->v, j->n, 1.0f, NULL, DSC_OPT_OUT_NONE);
}

static void add(void *arg) {
    job *j = arg;
    float *a = j->m;
    const float *b = j->g;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < j->n; i++) a[i] += b[i];
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : (size_t)64 << 20;
    job j = {.n = n};
    float **bufs[4] = {&j.p, &j.g, &j.m, &j.v};
    for (int b = 0; b < 4; b++) {
        *bufs[b] = aligned_alloc(64, n * sizeof(float));
        if (!*bufs[b]) return 1;
        for (size_t i = 0; i < n; i++) (*bufs[b])[i] = b == 3 ? 0.01f : 0.001f * (float)(i % 997);
    }
    double t_adam = best_of(5, adam, &j), t_add = best_of(5, add, &j);
    double eps = n / t_adam, adam_bw = 28.0 * n / t_adam, add_bw = 12.0 * n / t_add;
    printf("| elements | AdamW path | AdamW M elem/s | AdamW GB/s | a+=b GB/s | AdamW / a+=b |\n");
    printf("|---|---|---|---|---|---|\n");
    printf("| %zu | %s | %.0f | %.1f | %.1f | %.2f |\n", n, dsc_opt_simd_name(), eps / 1e6,
           adam_bw / 1e9, add_bw / 1e9, adam_bw / add_bw);
    return 0;
}
