// base/half.c - fp16/bf16 <-> fp32 by bit manipulation, round to nearest even.
#include "dsc/half.h"

#include <string.h> // memcpy

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float dsc_fp16_to_fp32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13)); // inf / NaN
    if (exp == 0) {
        // zero or subnormal: man * 2^-24, exact in fp32
        float v = (float)man * u2f(0x33800000u); // 2^-24
        return u2f(sign | f2u(v));
    }
    return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t dsc_fp32_to_fp16(float f) {
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00 | (uint16_t)((a >> 13) & 0x3ff); // NaN, quiet
    if (a >= 0x477ff000u) return sign | 0x7c00; // rounds to >= 65536 -> inf
    if (a >= 0x38800000u) {
        // normal fp16: rebias exponent (127 -> 15), round the 13 dropped bits to nearest even
        uint32_t r = a - 0x38000000u;
        uint32_t lsb = (r >> 13) & 1;
        r += 0xfff + lsb;
        return sign | (uint16_t)(r >> 13);
    }
    // subnormal or zero: value = a_float; fp16 subnormal unit is 2^-24
    if (a < 0x33000000u) return sign; // below half of the smallest subnormal -> 0
    uint32_t exp = a >> 23;
    uint32_t man = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp; // 14..24 for exp 102..112: position of 2^-24 unit
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return sign | (uint16_t)q;
}

float dsc_bf16_to_fp32(uint16_t b) { return u2f((uint32_t)b << 16); }

uint16_t dsc_fp32_to_bf16(float f) {
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040); // quiet NaN
    uint32_t lsb = (u >> 16) & 1;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}

void dsc_fp32_to_fp16_n(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dsc_fp32_to_fp16(src[i]);
}

void dsc_fp16_to_fp32_n(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dsc_fp16_to_fp32(src[i]);
}

void dsc_fp32_to_bf16_n(uint16_t *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dsc_fp32_to_bf16(src[i]);
}

void dsc_bf16_to_fp32_n(float *dst, const uint16_t *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = dsc_bf16_to_fp32(src[i]);
}
