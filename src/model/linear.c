// model/linear.c - the one linear product of the host families (see linear.h).
#include "model/linear.h"

#include <cblas.h>  // cblas_sgemm
#include <string.h> // memcpy

#include "model/blas.h"    // dsc__model_sgemm, dsc__model_chunk
#include "model/kernels.h" // dsc__model_colsum, DSC_CLONES

// One row of y = bias + resid, so that the product can accumulate onto it while it is in cache.
DSC_CLONES static void fill_row(float *o, const float *bias, const float *resid, int n) {
    if (resid && bias) {
#pragma omp simd
        for (int c = 0; c < n; c++) o[c] = resid[c] + bias[c];
    } else {
        memcpy(o, resid ? resid : bias, sizeof(float) * (size_t)n);
    }
}

// (in, out) weights: fixed chunks of rows, each filled and multiplied by one task.
static void forward_in_out(const dsc__linear *l, float *y, int ldy, const float *x, int ldx,
                           const float *resid, int64_t N) {
    int chunk = dsc__model_chunk(N), OC = l->out;
    int64_t nchunks = (N + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < nchunks; i++) {
        int64_t r0 = i * chunk, rn = N - r0 < chunk ? N - r0 : chunk;
        float beta = 0.0f;
        if (l->bias || resid) {
            for (int64_t r = r0; r < r0 + rn; r++)
                fill_row(y + (size_t)r * ldy, l->bias, resid ? resid + (size_t)r * OC : NULL, OC);
            beta = 1.0f;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rn, OC, l->in, 1.0f,
                    x + (size_t)r0 * ldx, ldx, l->w, OC, beta, y + (size_t)r0 * ldy, ldy);
    }
}

// (out, in) weights: every row filled, then one product (dsc__model_sgemm cuts it).
static void forward_out_in(const dsc__linear *l, float *y, int ldy, const float *x, int ldx,
                           const float *resid, int64_t N) {
    float beta = 0.0f;
    if (l->bias || resid) {
#pragma omp parallel for schedule(dynamic, 16)
        for (int64_t r = 0; r < N; r++)
            fill_row(y + (size_t)r * ldy, l->bias, resid ? resid + (size_t)r * l->out : NULL,
                     l->out);
        beta = 1.0f;
    }
    dsc__model_sgemm(0, 1, (int)N, l->out, l->in, 1.0f, x, ldx, l->w, l->in, beta, y, ldy);
}

void dsc__linear_forward(dsc__linear l, float *y, int ldy, const float *x, int ldx,
                         const float *resid, int64_t N) {
    if (l.in_out) forward_in_out(&l, y, ldy, x, ldx, resid, N);
    else forward_out_in(&l, y, ldy, x, ldx, resid, N);
    if (l.lora) dsc_lora_forward(l.lora, l.tensor, y, ldy, x, ldx, N);
}

void dsc__linear_backward(dsc__linear lin, float *dx, bool accumulate, float *dw,
                          float *dbias, const float *dy, int ldy, const float *x, int ldx,
                          int64_t N) {
    const dsc__linear *l = &lin;
    int IN = l->in, OUT = l->out;
    if (l->lora) dsc_lora_backward_weights(l->lora, l->tensor, dy, ldy, x, ldx, N);
    if (dw && l->in_out) // dw (in, out) += x^T dy
        dsc__model_sgemm(1, 0, IN, OUT, (int)N, 1.0f, x, ldx, dy, ldy, 1.0f, dw, OUT);
    else if (dw) // dw (out, in) += dy^T x
        dsc__model_sgemm(1, 0, OUT, IN, (int)N, 1.0f, dy, ldy, x, ldx, 1.0f, dw, IN);
    if (dbias) dsc__model_colsum(dbias, dy, N, OUT, ldy);
    if (!dx) return;
    float beta = accumulate ? 1.0f : 0.0f;
    if (l->in_out) // dx = dy W^T with W (in, out)
        dsc__model_sgemm(0, 1, (int)N, IN, OUT, 1.0f, dy, ldy, l->w, OUT, beta, dx, IN);
    else // dx = dy W with W (out, in)
        dsc__model_sgemm(0, 0, (int)N, IN, OUT, 1.0f, dy, ldy, l->w, IN, beta, dx, IN);
    if (l->lora) dsc_lora_backward_input(l->lora, l->tensor, dx, IN, N);
}
