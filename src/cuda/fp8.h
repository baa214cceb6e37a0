// cuda/fp8.h - bf16 tensors to FP8 with a per-tensor scale (current scaling): the absolute
// maximum of a tensor, then its values times scale = fmax / amax / 2^margin, rounded to the FP8
// format and saturated to its finite range; the products read 1 / scale back (cuda/matmul.h's
// a_scale, b_scale). Every argument and result lives on the device; the scale is read there, so
// a captured graph quantizes each step's values with each step's scale.
//
// Formats (OCP 8-bit floating point, as Hopper's tensor cores take them): E4M3, 4 exponent bits,
// largest finite 448 (forward activations and weights); E5M2, 5 exponent bits, largest finite
// 57344 (gradients in the "hybrid" recipe). See docs/fp8.md.
#ifndef DSC_CUDA_FP8_H
#define DSC_CUDA_FP8_H

#include <stdbool.h> // bool
#include <stdint.h>  // uint16_t, int64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// Whether the current device has FP8 tensor cores (compute capability 8.9 or later) and this
// build has the FP8 kernels; false with a message naming the device (dsc_last_error) otherwise.
dsc_status dsc__cuda_fp8_supported(void);

// *amax = max |x| over x (rows, cols; row stride ld), bf16. The call clears *amax first (on the
// stream). cols and ld multiples of 8, x 16-byte aligned. NaN values are skipped (a NaN in a
// product shows in the loss anyway).
dsc_status dsc__cuda_amax_bf16(float *amax, const uint16_t *x, int64_t rows, int cols, int64_t ld,
                               void *stream);

// q = fp8(x * s) with s = fmax / *amax / 2^margin (s = 1 where *amax is 0 or not finite), and
// *inv = 1 / s. fmt DSC_CUDA_E4M3 or DSC_CUDA_E5M2 (cuda/matmul.h). trans false: q (rows, cols),
// row stride cols; trans true: q (cols, rows), row stride rows (the transpose), rows a multiple
// of 16. cols and ld multiples of 8, x 16-byte aligned, q 16-byte aligned.
dsc_status dsc__cuda_fp8_quantize(uint8_t *q, float *inv, const uint16_t *x, int64_t rows,
                                  int cols, int64_t ld, const float *amax, int fmt, int margin,
                                  bool trans, void *stream);

// The same, with trans true and q2 non-NULL: q2 (rows, cols) gets the untransposed copy from the
// same pass (one read of x for both).
dsc_status dsc__cuda_fp8_quantize2(uint8_t *q, uint8_t *q2, float *inv, const uint16_t *x,
                                   int64_t rows, int cols, int64_t ld, const float *amax, int fmt,
                                   int margin, bool trans, void *stream);

// The largest finite value of a format (448 or 57344).
float dsc__fp8_max(int fmt);

#ifdef __cplusplus
}
#endif
#endif
