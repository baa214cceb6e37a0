// model/linear.h - the one linear product of the host families: y = x W (+ bias) (+ resid), with
// a LoRA adapter beside it and a frozen weight's gradient skipped, forward and backward. Every
// family (GPT-2, the Llama family) and both their training passes and cached decoders compute
// every weight product through it; what comes next for a product (another input precision, a
// fused epilogue) is added here once.
//
// A weight is stored one of two ways:
//   nn.Linear's (out, in): y = x W^T (the Llama family, the output heads);
//   GPT-2's Conv1D (in, out): y = x W (in_out).
// Deterministic and independent of the thread count, as every host kernel (model/kernels.h).
#ifndef DSC_MODEL_LINEAR_H
#define DSC_MODEL_LINEAR_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/model.h" // dsc_lora

typedef struct dsc__linear {
    const float *w;       // the weight (see above)
    const float *bias;    // (out) or NULL
    int in, out;          // its sizes
    bool in_out;          // stored (in, out), GPT-2's Conv1D
    const dsc_lora *lora; // the model's adapters (NULL: none): the one of tensor `tensor`, if any
    int tensor;           // W's index among the model's tensors
} dsc__linear;

// y (N rows of ldy) = bias + resid, then + x (N rows of ldx) W, then + the adapter's term (kept
// for the backward). resid: (N, out) dense or NULL; it must not alias y.
void dsc__linear_forward(dsc__linear l, float *y, int ldy, const float *x, int ldx,
                         const float *resid, int64_t N);
// From dy (N rows of ldy), in this order: the adapter's gradients; dw += the weight's gradient
// (dw NULL: a frozen weight, skipped); dbias += the column sums of dy (NULL: none); dx (N, in)
// dense = dy W^T, or += with accumulate (dx NULL: not wanted); then the adapter's part added to
// dx. x is read before dx is written, so dx may alias x (a recomputed input); not dy.
void dsc__linear_backward(dsc__linear l, float *dx, bool accumulate, float *dw,
                          float *dbias, const float *dy, int ldy, const float *x, int ldx,
                          int64_t N);

#endif
