// dsc/half.h - IEEE fp16 and bfloat16 conversions (round to nearest, ties to even).
#ifndef DSC_HALF_H
#define DSC_HALF_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

float dsc_fp16_to_fp32(uint16_t h);
uint16_t dsc_fp32_to_fp16(float f);  // overflow -> inf, NaN stays NaN (quiet)
float dsc_bf16_to_fp32(uint16_t b);
uint16_t dsc_fp32_to_bf16(float f);  // NaN stays NaN (quiet)

// Array forms (n elements; buffers must not overlap).
void dsc_fp32_to_fp16_n(uint16_t *dst, const float *src, size_t n);
void dsc_fp16_to_fp32_n(float *dst, const uint16_t *src, size_t n);
void dsc_fp32_to_bf16_n(uint16_t *dst, const float *src, size_t n);
void dsc_bf16_to_fp32_n(float *dst, const uint16_t *src, size_t n);

#ifdef __cplusplus
}
#endif
#endif
