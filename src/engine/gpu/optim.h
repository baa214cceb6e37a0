// engine/gpu/optim.h - fused optimizer steps on the GPU (Adam, AdamW, SGD, Lion) over flat fp32
// master arrays, with the 16-bit parameter copy written in the same pass; the gradient norm's sum
// of squares with an overflow flag; the clipping coefficient, computed without leaving the device.
//
// Same update rules, hyper-parameters and per-step constants as the CPU kernels
// (engine/optim/optim.h, whose scalar path is the reference): every element takes the same
// sequence of correctly rounded fp32 operations (no fused multiply-adds), so the GPU step matches
// dsc_opt_step on the scalar path bit for bit.
//
// Pointers are device memory unless a comment says otherwise; stream is a cudaStream_t (NULL:
// default stream). Calls enqueue work and return at once.
#ifndef DSC_ENGINE_GPU_OPTIM_H
#define DSC_ENGINE_GPU_OPTIM_H

#include <stdbool.h> // bool (before the C block below, so that C++ sees it included once)
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t, uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/optim/optim.h" // dsc_opt_hparams, DSC_OPT_OUT_* (a C header without guards)

// One step over n elements, in place: the arguments of dsc_opt_step (h is host memory), plus
// dev_scale: NULL, or one device float that multiplies grad_scale (a clipping coefficient made
// by dsc__cuda_opt_clip_coef, so that clipping needs no host round trip).
dsc_status dsc__cuda_opt_step(const dsc_opt_hparams *h, int64_t step, float *p, const float *g,
                              float *m, float *v, size_t n, float grad_scale,
                              const float *dev_scale, uint16_t *out16, int out16_kind,
                              void *stream);

// bf16 master weights (bf16.bf16_master_weights_and_grads): the same step over p (n bf16 values,
// the weights the model reads), computed in fp32 per element exactly as dsc_opt_step_bf16 on the
// CPU and rounded to nearest even bf16 in place. g: the n bf16 gradients.
// states_bf16 (bf16.bf16_optimizer_states): m and v are bf16 arrays (uint16_t), rounded after
// the step as well; otherwise fp32 (float). v (and m where the optimizer has none) may be NULL.
// sr_index: UINT64_MAX rounds p to nearest even; otherwise stochastically, as the CPU's
// dsc_opt_step_bf16 with the same sr_index (p[0]'s index in the engine's flat layout).
dsc_status dsc__cuda_opt_step_bf16(const dsc_opt_hparams *h, int64_t step, uint16_t *p,
                                   const uint16_t *g, void *m, void *v,
                                   bool states_bf16, size_t n, float grad_scale,
                                   const float *dev_scale, uint64_t sr_index, void *stream);

// Scratch of dsc__cuda_opt_sumsq, in doubles.
#define DSC_CUDA_SUMSQ_SCRATCH 512

// acc[0] += sum of (g[i] * scale)^2 over n elements, in double, one fixed order (deterministic).
// nonfinite: NULL, or one device int set to 1 when that sum is inf or NaN (some element was),
// left alone otherwise, so one flag collects several calls. scratch: DSC_CUDA_SUMSQ_SCRATCH
// doubles. acc, nonfinite and scratch are device memory.
dsc_status dsc__cuda_opt_sumsq(double *acc, int *nonfinite, double *scratch, const float *g,
                               size_t n, float scale, void *stream);

// The same over n bf16 values.
dsc_status dsc__cuda_opt_sumsq_bf16(double *acc, int *nonfinite, double *scratch,
                                    const uint16_t *g, size_t n, float scale, void *stream);

// coef[0] = min(1, max_norm / (sqrt(sumsq[0]) + 1e-6)): DeepSpeed's clipping coefficient for a
// global norm whose square is sumsq; 1 when max_norm <= 0 or the norm is not finite.
dsc_status dsc__cuda_opt_clip_coef(float *coef, const double *sumsq, float max_norm, void *stream);

// scale_out[0] = 1 / dsc__step_divisor(sqrt(sumsq[0]), prev, scale, clipping) (engine/device.h),
// computed on the device in the host's order, for dsc__cuda_opt_step's dev_scale (with
// grad_scale 1): the clipped step queued without the norm on the host.
dsc_status dsc__cuda_opt_divisor(float *scale_out, const double *sumsq, double prev, double scale,
                                 double clipping, void *stream);

#ifdef __cplusplus
}
#endif
#endif
