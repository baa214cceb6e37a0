// model/kernels.c - the CPU kernels every family runs the same (see kernels.h for the contracts).
#include "model/kernels.h"

#include <math.h>   // logf, sqrtf, INFINITY
#include <string.h> // memset

#include "model/blas.h" // dsc__exp_fast

// Parallel loops hand out fixed tasks dynamically: a thread that the OS preempts (the machine
// may be shared) does not hold the others at the barrier, and since the tasks themselves never
// depend on the thread count, neither do the results.
#define COL_BLOCK 64 // columns per task of a column sum

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- column sums ----

DSC_CLONES static void colsum_block(float *acc, const float *d, int64_t rows, int ld, int width) {
    float s[COL_BLOCK] = {0};
    for (int64_t r = 0; r < rows; r++) {
        const float *row = d + (size_t)r * ld;
#pragma omp simd
        for (int c = 0; c < width; c++) s[c] += row[c];
    }
    for (int c = 0; c < width; c++) acc[c] += s[c];
}

void dsc__model_colsum(float *acc, const float *d, int64_t rows, int ncols, int ld) {
    int nblocks = (ncols + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bi = 0; bi < nblocks; bi++) {
        int c0 = bi * COL_BLOCK;
        colsum_block(acc + c0, d + c0, rows, ld, (int)min64(COL_BLOCK, ncols - c0));
    }
}

// ---- causal softmax rows ----

DSC_CLONES void dsc__model_softmax_row(float *row, int n_valid, int n_row, float *stats) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < n_valid; j++) m = row[j] > m ? row[j] : m;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < n_valid; j++) {
        row[j] = dsc__exp_fast(row[j] - m);
        s += row[j];
    }
    float inv = 1.0f / s;
#pragma omp simd
    for (int j = 0; j < n_valid; j++) row[j] *= inv;
    memset(row + n_valid, 0, sizeof(float) * (size_t)(n_row - n_valid));
    stats[0] = m;
    stats[1] = inv;
}

void dsc__model_attend_row(float *y, const float *q, const float *K, const float *V, float *s,
                           int npos, int ld, int hd) {
    float scale = 1.0f / sqrtf((float)hd), m = -INFINITY, sum = 0.0f;
    for (int j = 0; j < npos; j++) {
        const float *k = K + (size_t)j * ld;
        float d = 0.0f;
        for (int c = 0; c < hd; c++) d += q[c] * k[c];
        s[j] = d * scale;
        m = s[j] > m ? s[j] : m;
    }
    for (int j = 0; j < npos; j++) sum += s[j] = dsc__exp_fast(s[j] - m);
    float inv = 1.0f / sum;
    memset(y, 0, sizeof(float) * (size_t)hd);
    for (int j = 0; j < npos; j++) {
        const float *v = V + (size_t)j * ld;
        float p = s[j] * inv;
        for (int c = 0; c < hd; c++) y[c] += p * v[c];
    }
}

DSC_CLONES void dsc__model_softmax_grad_row(float *p, float *dp, int n_valid, int n_row,
                                            const float *stats) {
    float m = stats[0], inv = stats[1];
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int j = 0; j < n_valid; j++) {
        p[j] = dsc__exp_fast(p[j] - m) * inv;
        dot += p[j] * dp[j];
    }
#pragma omp simd
    for (int j = 0; j < n_valid; j++) dp[j] = p[j] * (dp[j] - dot);
    memset(p + n_valid, 0, sizeof(float) * (size_t)(n_row - n_valid));
    memset(dp + n_valid, 0, sizeof(float) * (size_t)(n_row - n_valid));
}

// ---- softmax + cross-entropy ----

DSC_CLONES static float row_logsumexp(const float *l, int V) {
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int j = 0; j < V; j++) m = l[j] > m ? l[j] : m;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int j = 0; j < V; j++) s += dsc__exp_fast(l[j] - m);
    return m + logf(s);
}

DSC_CLONES static void xent_grad_row(float *d, const float *l, float lse, int target, float g,
                                     int V) {
    float pt = dsc__exp_fast(l[target] - lse); // read before d (which may alias l) is written
#pragma omp simd
    for (int j = 0; j < V; j++) d[j] = g * dsc__exp_fast(l[j] - lse);
    d[target] = g * (pt - 1.0f);
}

void dsc__model_xent_forward(float *losses, float *lse, const float *logits,
                             const int32_t *targets, int64_t N, int V) {
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < N; r++) {
        const float *l = logits + (size_t)r * V;
        if (targets[r] < 0) { // ignored: no loss, and backward gives the row no gradient
            lse[r] = 0.0f;
            losses[r] = 0.0f;
            continue;
        }
        lse[r] = row_logsumexp(l, V);
        losses[r] = lse[r] - l[targets[r]];
    }
}

void dsc__model_xent_backward(float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, float g, int64_t N, int V) {
#pragma omp parallel for schedule(dynamic, 8)
    for (int64_t r = 0; r < N; r++) {
        float *d = dlogits + (size_t)r * V;
        if (targets[r] < 0) memset(d, 0, (size_t)V * sizeof *d);
        else xent_grad_row(d, logits + (size_t)r * V, lse[r], targets[r], g, V);
    }
}

// ---- rows scattered into a table ----

void dsc__model_scatter_rows(float *dtab, const float *dout, const int32_t *idx, int64_t N,
                             int C) {
    int nblocks = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(dynamic, 1)
    for (int bi = 0; bi < nblocks; bi++) {
        int c0 = bi * COL_BLOCK, c1 = (int)min64(C, c0 + COL_BLOCK);
        for (int64_t r = 0; r < N; r++) {
            float *g = dtab + (size_t)idx[r] * C;
            const float *d = dout + (size_t)r * C;
            for (int c = c0; c < c1; c++) g[c] += d[c];
        }
    }
}
