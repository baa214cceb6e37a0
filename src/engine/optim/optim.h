// engine/optim/optim.h - fused CPU optimizer kernels (Adam, AdamW, SGD, Lion) on flat fp32 arrays.
//
// One pass per step: each element's gradient is read once, multiplied by `grad_scale` (the
// inverse loss scale times the clipping coefficient, so unscaling and clipping cost no extra pass),
// the optimizer state and the parameter are updated, and optionally a 16-bit copy of the new
// parameter is written (with non-temporal stores on large calls: nothing here reads it back).
// Three code paths are chosen at run time: AVX-512, AVX2+FMA+F16C and a scalar fallback;
// DSC_SIMD=scalar|avx2|avx512 (read once) or dsc_opt_simd_force() picks one.
// Large arrays are split into contiguous per-thread ranges with OpenMP.
#ifndef DSC_ENGINE_OPTIM_OPTIM_H
#define DSC_ENGINE_OPTIM_OPTIM_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t, uint16_t

#include "dsc/status.h" // dsc_status

typedef enum { DSC_OPT_ADAM, DSC_OPT_ADAMW, DSC_OPT_SGD, DSC_OPT_LION } dsc_opt_kind;

// Values for dsc_opt_step's out16_kind.
enum { DSC_OPT_OUT_NONE = 0, DSC_OPT_OUT_BF16 = 1, DSC_OPT_OUT_FP16 = 2 };

// Hyper-parameters of one step. lr, betas and weight decay may change between steps (LR
// schedules, OneCycle momentum); the kernels keep no hidden state besides m and v.
typedef struct dsc_opt_hparams {
    dsc_opt_kind kind;
    float lr;
    float beta1, beta2;  // Adam/AdamW; Lion's two interpolation factors
    float eps;           // Adam/AdamW, added after sqrt(v_hat)
    float weight_decay;  // Adam: L2 added to the gradient; AdamW, Lion: decoupled; SGD: L2
    float momentum;      // SGD
    float dampening;     // SGD
    bool adam_w_mode;    // DSC_OPT_ADAM only: decoupled decay (DeepSpeed's default is true)
    bool bias_correction; // Adam/AdamW
    bool nesterov;       // SGD
} dsc_opt_hparams;

// DeepSpeed 0.18.4's defaults for the optimizer built from config `optimizer.type`:
//   Adam/AdamW (DeepSpeedCPUAdam, FusedAdam): lr 1e-3, betas (0.9, 0.999), eps 1e-8,
//     weight_decay 0, bias_correction true; adam_w_mode true even for "Adam", because the engine
//     sets adam_w_mode=True unless the config says "adam_w_mode": false.
//   SGD (torch.optim.SGD): lr 1e-3, momentum 0, dampening 0, weight_decay 0, nesterov false.
//   Lion (DeepSpeedCPULion, FusedLion): lr 1e-3, betas (0.9, 0.999) (not the paper's 0.99),
//     weight_decay 0.
void dsc_opt_hparams_defaults(dsc_opt_kind kind, dsc_opt_hparams *h);

// The checks torch.optim.SGD makes at construction (lr, momentum, weight_decay >= 0; nesterov needs
// momentum > 0 and dampening == 0). DeepSpeed's Adam and Lion check nothing, so neither do we.
// Messages name the key as optimizer.params.<name>.
dsc_status dsc_opt_hparams_validate(const dsc_opt_hparams *h);

// One optimizer step over n elements, in place.
//   p: (n) parameters, updated.   g: (n) gradients, read only, multiplied by grad_scale first.
//   Adam/AdamW: m, v (n) first and second moments, updated (start at zero).
//   SGD: m (n) momentum buffer (unused and may be NULL when momentum == 0; its contents are
//        ignored at step 1, where torch initialises the buffer to the gradient); v unused.
//   Lion: m (n) momentum; v unused.
//   step: 1-based count of steps applied to these parameters, including this one (skipped
//         overflow steps do not count, as DeepSpeed's state['step']).
//   out16: NULL, or (n) receives the updated parameter as bf16 (out16_kind DSC_OPT_OUT_BF16) or
//          fp16 (DSC_OPT_OUT_FP16), rounded to nearest even exactly as dsc_fp32_to_bf16/fp16.
// Arrays must not overlap.
void dsc_opt_step(const dsc_opt_hparams *h, int64_t step, float *p, const float *g, float *m,
                  float *v, size_t n, float grad_scale, uint16_t *out16, int out16_kind);

// bf16 master weights (bf16.bf16_master_weights_and_grads): the same step over p, whose values
// are bf16, computed in fp32 per element (exactly as dsc_opt_step), then the new p rounded to
// nearest even bf16 in place; with states_bf16 (bf16.bf16_optimizer_states) m and v (where the
// optimizer has them) too. The arrays stay fp32 storage holding bf16 values.
// sr_index: UINT64_MAX rounds p to nearest even (DeepSpeed's); otherwise p is rounded
// stochastically (engine/optim/sround.h, bf16_master_rounding "stochastic") with p[k]'s random
// bits drawn for the element index sr_index + k of the engine's flat layout at this step.
void dsc_opt_step_bf16(const dsc_opt_hparams *h, int64_t step, float *p, const float *g, float *m,
                       float *v, size_t n, float grad_scale, bool states_bf16, uint64_t sr_index);

// Sum of squares of g[i]*scale, accumulated in double (for the global gradient norm). Sets
// *nonfinite to true if any g[i]*scale is inf or NaN and leaves it unchanged otherwise, so one flag
// can collect several calls; nonfinite may be NULL. (Squares of finite floats cannot overflow a
// double sum, so the sum is non-finite exactly when some element is.)
double dsc_opt_sumsq(const float *g, size_t n, float scale, bool *nonfinite);

// The path that runs: "avx512", "avx2" or "scalar".
const char *dsc_opt_simd_name(void);

// Force a path ("scalar", "avx2", "avx512"); NULL or "auto" returns to the best the CPU has.
// DSC_ERR_UNSUPPORTED if this CPU lacks the path, DSC_ERR_INVALID_ARG for an unknown name; the
// current path is kept on failure. Not thread-safe against concurrent dsc_opt_step calls.
dsc_status dsc_opt_simd_force(const char *name);

// ---- internal: shared by optim.c and the per-ISA files ----

// The SIMD paths exist on x86 only; elsewhere their tables have no kernels and are never chosen.
#if defined(__x86_64__) || defined(__i386__)
#define DSC__OPT_X86 1
#else
#define DSC__OPT_X86 0
#endif

// Per-step constants, computed once in float by dsc_opt_step, and the arrays of one call.
typedef struct dsc__opt_args {
    float *p;
    const float *g;
    float *m, *v;
    uint16_t *out16; // NULL when out16_kind == DSC_OPT_OUT_NONE
    int out16_kind;
    bool out16_stream; // SIMD paths may store out16 with non-temporal stores (large calls)
    float grad_scale;
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float eps;
    float bias2;     // Adam: 1/sqrt(1 - beta2^t), or 1 without bias correction
    float step_size; // Adam: -lr/(1 - beta1^t); SGD, Lion: -lr
    float l2;        // weight decay added to the gradient (Adam, SGD); 0: not applied
    float decay;     // decoupled decay factor 1 - lr*wd (AdamW, Lion), else 1
    float momentum, one_minus_dampening; // SGD
    int sgd_mode;    // DSC__SGD_PLAIN, DSC__SGD_FIRST or DSC__SGD_MOMENTUM
    bool nesterov;
} dsc__opt_args;

enum { DSC__SGD_PLAIN = 0, DSC__SGD_FIRST = 1, DSC__SGD_MOMENTUM = 2 };

// Kernels of one instruction set over the element range [lo, hi); single-threaded.
typedef struct dsc__opt_kernels {
    const char *name;
    void (*adam)(const dsc__opt_args *a, size_t lo, size_t hi);
    void (*sgd)(const dsc__opt_args *a, size_t lo, size_t hi);
    void (*lion)(const dsc__opt_args *a, size_t lo, size_t hi);
    double (*sumsq)(const float *g, size_t n, float scale); // over [0, n)
} dsc__opt_kernels;

extern const dsc__opt_kernels dsc__opt_scalar;
extern const dsc__opt_kernels dsc__opt_avx2;
extern const dsc__opt_kernels dsc__opt_avx512;

#endif
