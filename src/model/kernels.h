// model/kernels.h - the CPU kernels every family runs the same: column sums, the rows of a causal
// softmax (forward and gradient), softmax cross-entropy, and rows scattered into a table (an
// embedding's gradient). Each result is independent of the OpenMP thread count, as the families'
// own kernels are.
#ifndef DSC_MODEL_KERNELS_H
#define DSC_MODEL_KERNELS_H

#include <stdint.h> // int32_t, int64_t

// Row kernels that do arithmetic rather than move memory are compiled for three instruction sets
// (SSE2, AVX2+FMA, AVX-512) and chosen once at load time, so that a portable build still uses
// wide vectors. OpenMP regions stay in plain functions that call these per row or per block: an
// outlined parallel body would not inherit the clone's instruction set.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DSC_CLONES __attribute__((target_clones("default", "arch=x86-64-v3", "arch=x86-64-v4")))
#else
#define DSC_CLONES
#endif

// acc (ncols) += column sums of d (rows, ncols) with row stride ld, each column in row order.
void dsc__model_colsum(float *acc, const float *d, int64_t rows, int ncols, int ld);

// Attention scores row (first n_valid = t + 1 entries live) -> probabilities, zero up to n_row
// (the tile's key range, which the next product reads). stats = {row max, 1 / sum}.
void dsc__model_softmax_row(float *row, int n_valid, int n_row, float *stats);
// p: scores in, probabilities out (bitwise those of dsc__model_softmax_row, from its stats); dp:
// dP in, dS = P (dP - P.dP) out; both zero past n_valid up to n_row.
void dsc__model_softmax_grad_row(float *p, float *dp, int n_valid, int n_row, const float *stats);

// The cached decoders' attention of one row and one (query) head: y (hd) = softmax(q K^T /
// sqrt(hd)) V over positions 0 .. npos-1, with K, V rows of stride ld and s (npos) scratch; the
// softmax as the training forward's (max subtracted, dsc__exp_fast).
void dsc__model_attend_row(float *y, const float *q, const float *K, const float *V, float *s,
                           int npos, int ld, int hd);

// losses (N) = logsumexp(logits row) - logits[target]; lse (N) kept for backward. A negative
// target (an ignored position, any negative id) is ignored: its loss and lse are 0.
void dsc__model_xent_forward(float *losses, float *lse, const float *logits,
                             const int32_t *targets, int64_t N, int V);
// dlogits (N, V) = g * (softmax(logits) - onehot(target)); may alias logits. Rows whose target
// is negative get 0.
void dsc__model_xent_backward(float *dlogits, const float *logits, const float *lse,
                              const int32_t *targets, float g, int64_t N, int V);

// Rows of dout (N, C) added into the rows idx[r] of dtab (C wide). Indices repeat, so rows of
// dtab are shared between positions: split by channel block instead, each block visiting the
// positions in order.
void dsc__model_scatter_rows(float *dtab, const float *dout, const int32_t *idx, int64_t N, int C);

#endif
