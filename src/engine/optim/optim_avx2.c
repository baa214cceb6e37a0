// engine/optim/optim_avx2.c - AVX2 + FMA + F16C kernels: 8 fp32 lanes per vector; the formulas are
// those documented in optim.c. Tails shorter than one vector go to the scalar kernels.
#include "engine/optim/optim.h" // dsc__opt_args, dsc__opt_kernels

#if DSC__OPT_X86

#include <immintrin.h> // AVX2, FMA, F16C intrinsics
#include <math.h>      // fabsf
#include <stdint.h>    // uintptr_t

// Every function here is compiled for the ISA; only the dispatcher decides whether they run.
#define ISA __attribute__((target("avx2,fma,f16c")))

#define W 8 // lanes per vector

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet bit set), as dsc_fp32_to_bf16.
ISA static inline __m128i to_bf16(__m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i bias = _mm256_add_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(1)),
                                    _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
    __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000)); // both non-negative
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
    // Values fit 16 bits, so the saturating pack is exact; it works per 128-bit lane, and the
    // permute brings the two lanes' low halves together.
    __m256i packed = _mm256_packus_epi32(r, r);
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// Whether [lo, ...) may use non-temporal 16-bit stores: the caller allows it and the vectors
// land on 16-byte boundaries, as the streaming store requires. The kernel then ends with a fence.
static inline bool stream16(const dsc__opt_args *a, size_t lo) {
    return a->out16_stream && ((uintptr_t)(a->out16 + lo) & 15) == 0;
}

ISA static inline void store16(const dsc__opt_args *a, size_t i, __m256 p, bool stream) {
    if (a->out16_kind == DSC_OPT_OUT_NONE) return;
    __m128i h = a->out16_kind == DSC_OPT_OUT_BF16
                    ? to_bf16(p)
                    : _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT);
    if (stream) _mm_stream_si128((__m128i *)(a->out16 + i), h);
    else _mm_storeu_si128((__m128i *)(a->out16 + i), h);
}

ISA static void adam(const dsc__opt_args *a, size_t lo, size_t hi) {
    const __m256 gs = _mm256_set1_ps(a->grad_scale), l2 = _mm256_set1_ps(a->l2);
    const __m256 b1 = _mm256_set1_ps(a->beta1), ob1 = _mm256_set1_ps(a->one_minus_beta1);
    const __m256 b2 = _mm256_set1_ps(a->beta2), ob2 = _mm256_set1_ps(a->one_minus_beta2);
    const __m256 bias2 = _mm256_set1_ps(a->bias2), eps = _mm256_set1_ps(a->eps);
    const __m256 decay = _mm256_set1_ps(a->decay), step = _mm256_set1_ps(a->step_size);
    const bool stream = stream16(a, lo);
    size_t i = lo;
    for (; i + W <= hi; i += W) {
        __m256 p = _mm256_loadu_ps(a->p + i);
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(a->g + i), gs);
        if (a->l2 != 0.0f) g = _mm256_fmadd_ps(p, l2, g);
        __m256 m = _mm256_fmadd_ps(g, ob1, _mm256_mul_ps(_mm256_loadu_ps(a->m + i), b1));
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(a->v + i), b2);
        v = _mm256_fmadd_ps(_mm256_mul_ps(g, g), ob2, v);
        __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), bias2, eps);
        p = _mm256_fmadd_ps(_mm256_div_ps(m, denom), step, _mm256_mul_ps(p, decay));
        _mm256_storeu_ps(a->p + i, p);
        _mm256_storeu_ps(a->m + i, m);
        _mm256_storeu_ps(a->v + i, v);
        store16(a, i, p, stream);
    }
    if (stream) _mm_sfence(); // order the streaming stores before the caller reads out16
    if (i < hi) dsc__opt_scalar.adam(a, i, hi);
}

ISA static void sgd(const dsc__opt_args *a, size_t lo, size_t hi) {
    const __m256 gs = _mm256_set1_ps(a->grad_scale), l2 = _mm256_set1_ps(a->l2);
    const __m256 mom = _mm256_set1_ps(a->momentum), odamp = _mm256_set1_ps(a->one_minus_dampening);
    const __m256 step = _mm256_set1_ps(a->step_size);
    const bool stream = stream16(a, lo);
    size_t i = lo;
    for (; i + W <= hi; i += W) {
        __m256 p = _mm256_loadu_ps(a->p + i);
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(a->g + i), gs);
        if (a->l2 != 0.0f) g = _mm256_fmadd_ps(p, l2, g);
        __m256 u = g;
        if (a->sgd_mode != DSC__SGD_PLAIN) {
            __m256 buf = g;
            if (a->sgd_mode == DSC__SGD_MOMENTUM)
                buf = _mm256_fmadd_ps(g, odamp, _mm256_mul_ps(_mm256_loadu_ps(a->m + i), mom));
            _mm256_storeu_ps(a->m + i, buf);
            u = a->nesterov ? _mm256_fmadd_ps(buf, mom, g) : buf;
        }
        p = _mm256_fmadd_ps(u, step, p);
        _mm256_storeu_ps(a->p + i, p);
        store16(a, i, p, stream);
    }
    if (stream) _mm_sfence(); // order the streaming stores before the caller reads out16
    if (i < hi) dsc__opt_scalar.sgd(a, i, hi);
}

ISA static void lion(const dsc__opt_args *a, size_t lo, size_t hi) {
    const __m256 gs = _mm256_set1_ps(a->grad_scale);
    const __m256 b1 = _mm256_set1_ps(a->beta1), ob1 = _mm256_set1_ps(a->one_minus_beta1);
    const __m256 b2 = _mm256_set1_ps(a->beta2), ob2 = _mm256_set1_ps(a->one_minus_beta2);
    const __m256 decay = _mm256_set1_ps(a->decay);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    // -|lr| with its sign flipped by c's sign bit is -copysign(lr, c).
    const __m256 neg_lr = _mm256_set1_ps(-fabsf(a->step_size));
    const bool stream = stream16(a, lo);
    size_t i = lo;
    for (; i + W <= hi; i += W) {
        __m256 p = _mm256_loadu_ps(a->p + i);
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(a->g + i), gs);
        __m256 m = _mm256_loadu_ps(a->m + i);
        __m256 c = _mm256_fmadd_ps(g, ob1, _mm256_mul_ps(m, b1));
        __m256 u = _mm256_xor_ps(_mm256_and_ps(c, sign), neg_lr);
        p = _mm256_fmadd_ps(p, decay, u);
        m = _mm256_fmadd_ps(g, ob2, _mm256_mul_ps(m, b2));
        _mm256_storeu_ps(a->p + i, p);
        _mm256_storeu_ps(a->m + i, m);
        store16(a, i, p, stream);
    }
    if (stream) _mm_sfence(); // order the streaming stores before the caller reads out16
    if (i < hi) dsc__opt_scalar.lion(a, i, hi);
}

// Each float is widened to double before scaling and squaring: no rounding but the additions.
ISA static double sumsq(const float *g, size_t n, float scale) {
    const __m256d sc = _mm256_set1_pd(scale);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        __m256 x = _mm256_loadu_ps(g + i), y = _mm256_loadu_ps(g + i + W);
        __m256d x0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), sc);
        __m256d x1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), sc);
        __m256d y0 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(y)), sc);
        __m256d y1 = _mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(y, 1)), sc);
        s0 = _mm256_fmadd_pd(x0, x0, s0);
        s1 = _mm256_fmadd_pd(x1, x1, s1);
        s2 = _mm256_fmadd_pd(y0, y0, s2);
        s3 = _mm256_fmadd_pd(y1, y1, s3);
    }
    __m256d s = _mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3));
    double lanes[4];
    _mm256_storeu_pd(lanes, s);
    double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    if (i < n) sum += dsc__opt_scalar.sumsq(g + i, n - i, scale);
    return sum;
}

const dsc__opt_kernels dsc__opt_avx2 = {
    .name = "avx2",
    .adam = adam,
    .sgd = sgd,
    .lion = lion,
    .sumsq = sumsq,
};

#else

const dsc__opt_kernels dsc__opt_avx2 = {.name = "avx2"}; // never chosen off x86

#endif
