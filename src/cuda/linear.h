// cuda/linear.h - one linear layer on the device: its forward product and both gradients, in
// nn.Linear's layout (w (OUT, IN)) or GPT-2's Conv1D layout (w (IN, OUT): in_out), in 16-bit, or
// with FP8 operands (the `fp8` config section, docs/fp8.md) where the shapes allow it (nn.Linear's
// layout only). The families' device passes call these for every linear product of a transformer
// layer; the output head and LoRA's adapters stay in 16-bit. Epilogues: a bias, a residual added,
// GELU (its pre-activation kept) and, in the input gradient, GELU's derivative (16-bit, Conv1D).
//
// FP8 products quantize each operand just before the product with its own scale (current
// scaling, cuda/fp8.h) into the scratch this struct owns, and accumulate in fp32:
//   forward   out = inp @ w^T        inp E4M3, w E4M3 (fast accumulation)
//   input     dinp = dout @ w        dout E5M2 (hybrid) or E4M3, w E4M3 (transposed copy)
//   weight    dw = dout^T @ inp      dout^T and inp^T, the same formats, fp32 result
// A product whose sizes are not multiples of 16 (or whose operands are not 16-byte aligned)
// runs in 16-bit, as without fp8.
#ifndef DSC_CUDA_LINEAR_H
#define DSC_CUDA_LINEAR_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint16_t, uint8_t, int64_t

#include "cuda/matmul.h" // dsc_cuda_blas
#include "dsc/status.h"  // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// fp8 modes (dsc__cuda_lin.fp8): the fp8 section's fp8_format.
enum { DSC_FP8_OFF = 0, DSC_FP8_HYBRID = 1, DSC_FP8_E4M3 = 2 };

typedef struct dsc__cuda_lin {
    dsc_cuda_blas *blas; // borrowed
    void *stream;        // cudaStream_t, borrowed
    int fp16;            // the 16-bit type: IEEE fp16 (no FP8 then), else bf16
    bool in_out;         // weights stored (IN, OUT) (GPT-2's Conv1D; 16-bit products only)
    int fp8, margin;     // DSC_FP8_*; scales over 2^margin
    // The caller's flag: the forwards that follow recompute a layer (activation checkpointing),
    // so their inputs and weights have the absolute maxima their slots hold already.
    bool recompute;
    // FP8 scratch (dsc__cuda_lin_carve): the quantized operands of one product (qa, qb), the
    // output gradient's transpose kept from the input gradient for the weight gradient (qc),
    // the scales (sc), and per slot the absolute maxima of a product's input and weight (tab)
    uint8_t *qa, *qb, *qc;
    float *sc, *tab;
    int64_t qa_cap, qb_cap; // elements (qc: qa_cap)
    int nslots;
    unsigned char *seen; // host, per slot: a forward measured its maxima (in this step or before)
    // qc holds dout^T of this (pointer, rows, OUT, row stride); NULL: nothing
    const void *kept;
    int kept_rows, kept_cols, kept_ld;
} dsc__cuda_lin;

// Bytes of the FP8 scratch for products with at most `rows` rows, inputs and outputs at most
// max_dim wide, weights of at most max_w elements and nslots slots (0 when fp8 is DSC_FP8_OFF).
size_t dsc__cuda_lin_scratch_bytes(int fp8, int64_t rows, int64_t max_dim, int64_t max_w,
                                   int nslots);
// Point L's scratch into base (that many bytes, 256-byte aligned; NULL with fp8 off).
// DSC_ERR_OOM when the slots' host flags cannot be allocated; dsc__cuda_lin_release frees them.
dsc_status dsc__cuda_lin_carve(dsc__cuda_lin *L, void *base, int64_t rows, int64_t max_dim,
                               int64_t max_w, int nslots);
void dsc__cuda_lin_release(dsc__cuda_lin *L);

// Slots: a product's calls name one slot (0 .. nslots - 1; the model's weight index does), so
// that the absolute maxima of its input and weight, measured by its forward, serve its
// recomputed forward and its gradients (the same values: the weights change only between
// steps). A forward outside L->recompute measures both; slot -1 measures everything each call,
// and so does a gradient whose slot no forward has measured in FP8 yet.

// out (rows, OUT; row stride ldo) = inp (rows, IN; stride ldi) @ w^T [+ bias (OUT)] [+ resid,
// with out's row stride] (in_out: @ w).
dsc_status dsc__cuda_lin_forward(dsc__cuda_lin *L, int slot, uint16_t *out, int ldo,
                                 const uint16_t *inp, int ldi, const uint16_t *w,
                                 const uint16_t *bias, const uint16_t *resid, int rows, int IN,
                                 int OUT);
// The same with GELU in the epilogue: out = GELU(product + bias), its argument into aux (rows,
// OUT); 16-bit, the Conv1D layout only (DSC_ERR_INVALID_ARG otherwise).
dsc_status dsc__cuda_lin_forward_gelu(dsc__cuda_lin *L, int slot, uint16_t *out, int ldo,
                                      const uint16_t *inp, int ldi, const uint16_t *w,
                                      const uint16_t *bias, uint16_t *aux, int rows, int IN,
                                      int OUT);
// dinp (rows, IN; stride ldo) = dout (rows, OUT; stride ldd) @ w, or += when acc. Keeps dout's
// quantized transpose for a dsc__cuda_lin_dw of the same dout that comes next.
dsc_status dsc__cuda_lin_dinp(dsc__cuda_lin *L, int slot, uint16_t *dinp, int ldo,
                              const uint16_t *dout, int ldd, const uint16_t *w, int rows, int IN,
                              int OUT, bool acc);
// The same times GELU's derivative at aux (rows, IN: the forward's kept argument); 16-bit, the
// Conv1D layout only.
dsc_status dsc__cuda_lin_dinp_dgelu(dsc__cuda_lin *L, int slot, uint16_t *dinp, int ldo,
                                    const uint16_t *dout, int ldd, const uint16_t *w, int rows,
                                    int IN, int OUT, uint16_t *aux);
// dw (OUT, IN) fp32 += dout^T @ inp (= when fresh).
dsc_status dsc__cuda_lin_dw(dsc__cuda_lin *L, int slot, float *dw, const uint16_t *dout, int ldd,
                            const uint16_t *inp, int ldi, int rows, int IN, int OUT, bool fresh);

#ifdef __cplusplus
}
#endif
#endif
