// engine/optim/optim_avx512.c - AVX-512F kernels: 16 fp32 lanes per vector, FMA, fp16 and bf16
// stores; the formulas are those documented in optim.c. Tails shorter than one vector go to the
// scalar kernels.
#include "engine/optim/optim.h" // dsc__opt_args, dsc__opt_kernels

#if DSC__OPT_X86

#include <immintrin.h> // AVX-512F intrinsics
#include <math.h>      // fabsf
#include <stdint.h>    // uintptr_t

// Every function here is compiled for the ISA; only the dispatcher decides whether they run.
#define ISA __attribute__((target("avx512f")))

#define W 16 // lanes per vector

// fp32 -> bf16, round to nearest even; NaN stays NaN (quiet bit set), as dsc_fp32_to_bf16.
ISA static inline __m256i to_bf16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i bias = _mm512_add_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(1)),
                                    _mm512_set1_epi32(0x7fff));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
    __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

// Whether [lo, ...) may use non-temporal 16-bit stores: the caller allows it and the vectors
// land on 32-byte boundaries, as the streaming store requires. The kernel then ends with a fence.
static inline bool stream16(const dsc__opt_args *a, size_t lo) {
    return a->out16_stream && ((uintptr_t)(a->out16 + lo) & 31) == 0;
}

ISA static inline void store16(const dsc__opt_args *a, size_t i, __m512 p, bool stream) {
    if (a->out16_kind == DSC_OPT_OUT_NONE) return;
    __m256i h = a->out16_kind == DSC_OPT_OUT_BF16
                    ? to_bf16(p)
                    : _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if (stream) _mm256_stream_si256((__m256i *)(a->out16 + i), h);
    else _mm256_storeu_si256((__m256i *)(a->out16 + i), h);
}

ISA static void adam(const dsc__opt_args *a, size_t lo, size_t hi) {
    const __m512 gs = _mm512_set1_ps(a->grad_scale), l2 = _mm512_set1_ps(a->l2);
    const __m512 b1 = _mm512_set1_ps(a->beta1), ob1 = _mm512_set1_ps(a->one_minus_beta1);
    const __m512 b2 = _mm512_set1_ps(a->beta2), ob2 = _mm512_set1_ps(a->one_minus_beta2);
    const __m512 bias2 = _mm512_set1_ps(a->bias2), eps = _mm512_set1_ps(a->eps);
    const __m512 decay = _mm512_set1_ps(a->decay), step = _mm512_set1_ps(a->step_size);
    const bool stream = stream16(a, lo);
    size_t i = lo;
    for (; i + W <= hi; i += W) {
        __m512 p = _mm512_loadu_ps(a->p + i);
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(a->g + i), gs);
        if (a->l2 != 0.0f) g = _mm512_fmadd_ps(p, l2, g);
        __m512 m = _mm512_fmadd_ps(g, ob1, _mm512_mul_ps(_mm512_loadu_ps(a->m + i), b1));
        __m512 v = _mm512_mul_ps(_mm512_loadu_ps(a->v + i), b2);
        v = _mm512_fmadd_ps(_mm512_mul_ps(g, g), ob2, v);
        __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), bias2, eps);
        p = _mm512_fmadd_ps(_mm512_div_ps(m, denom), step, _mm512_mul_ps(p, decay));
        _mm512_storeu_ps(a->p + i, p);
        _mm512_storeu_ps(a->m + i, m);
        _mm512_storeu_ps(a->v + i, v);
        store16(a, i, p, stream);
    }
    if (stream) _mm_sfence(); // order the streaming stores before the caller reads out16
    if (i < hi) dsc__opt_scalar.adam(a, i, hi);
}

ISA static void sgd(const dsc__opt_args *a, size_t lo, size_t hi) {
    const __m512 gs = _mm512_set1_ps(a->grad_scale), l2 = _mm512_set1_ps(a->l2);
    const __m512 mom = _mm512_set1_ps(a->momentum), odamp = _mm512_set1_ps(a->one_minus_dampening);
    const __m512 step = _mm512_set1_ps(a->step_size);
    const bool stream = stream16(a, lo);
    size_t i = lo;
    for (; i + W <= hi; i += W) {
        __m512 p = _mm512_loadu_ps(a->p + i);
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(a->g + i), gs);
        if (a->l2 != 0.0f) g = _mm512_fmadd_ps(p, l2, g);
        __m512 u = g;
        if (a->sgd_mode != DSC__SGD_PLAIN) {
            __m512 buf = g;
            if (a->sgd_mode == DSC__SGD_MOMENTUM)
                buf = _mm512_fmadd_ps(g, odamp, _mm512_mul_ps(_mm512_loadu_ps(a->m + i), mom));
            _mm512_storeu_ps(a->m + i, buf);
            u = a->nesterov ? _mm512_fmadd_ps(buf, mom, g) : buf;
        }
        p = _mm512_fmadd_ps(u, step, p);
        _mm512_storeu_ps(a->p + i, p);
        store16(a, i, p, stream);
    }
    if (stream) _mm_sfence(); // order the streaming stores before the caller reads out16
    if (i < hi) dsc__opt_scalar.sgd(a, i, hi);
}

ISA static void lion(const dsc__opt_args *a, size_t lo, size_t hi) {
    const __m512 gs = _mm512_set1_ps(a->grad_scale);
    const __m512 b1 = _mm512_set1_ps(a->beta1), ob1 = _mm512_set1_ps(a->one_minus_beta1);
    const __m512 b2 = _mm512_set1_ps(a->beta2), ob2 = _mm512_set1_ps(a->one_minus_beta2);
    const __m512 decay = _mm512_set1_ps(a->decay);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    // -|lr| with its sign flipped by c's sign bit is -copysign(lr, c).
    const __m512i neg_lr = _mm512_castps_si512(_mm512_set1_ps(-fabsf(a->step_size)));
    const bool stream = stream16(a, lo);
    size_t i = lo;
    for (; i + W <= hi; i += W) {
        __m512 p = _mm512_loadu_ps(a->p + i);
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(a->g + i), gs);
        __m512 m = _mm512_loadu_ps(a->m + i);
        __m512 c = _mm512_fmadd_ps(g, ob1, _mm512_mul_ps(m, b1));
        __m512i csign = _mm512_and_si512(_mm512_castps_si512(c), sign);
        __m512 u = _mm512_castsi512_ps(_mm512_xor_si512(csign, neg_lr));
        p = _mm512_fmadd_ps(p, decay, u);
        m = _mm512_fmadd_ps(g, ob2, _mm512_mul_ps(m, b2));
        _mm512_storeu_ps(a->p + i, p);
        _mm512_storeu_ps(a->m + i, m);
        store16(a, i, p, stream);
    }
    if (stream) _mm_sfence(); // order the streaming stores before the caller reads out16
    if (i < hi) dsc__opt_scalar.lion(a, i, hi);
}

// Each float is widened to double before scaling and squaring: no rounding but the additions.
ISA static double sumsq(const float *g, size_t n, float scale) {
    const __m512d sc = _mm512_set1_pd(scale);
    __m512d s0 = _mm512_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 2 * W <= n; i += 2 * W) {
        __m512 x = _mm512_loadu_ps(g + i), y = _mm512_loadu_ps(g + i + W);
        __m512d x0 = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), sc);
        __m512d x1 = _mm512_mul_pd(
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))), sc);
        __m512d y0 = _mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(y)), sc);
        __m512d y1 = _mm512_mul_pd(
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1))), sc);
        s0 = _mm512_fmadd_pd(x0, x0, s0);
        s1 = _mm512_fmadd_pd(x1, x1, s1);
        s2 = _mm512_fmadd_pd(y0, y0, s2);
        s3 = _mm512_fmadd_pd(y1, y1, s3);
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(s0, s1), _mm512_add_pd(s2, s3)));
    if (i < n) sum += dsc__opt_scalar.sumsq(g + i, n - i, scale);
    return sum;
}

const dsc__opt_kernels dsc__opt_avx512 = {
    .name = "avx512",
    .adam = adam,
    .sgd = sgd,
    .lion = lion,
    .sumsq = sumsq,
};

#else

const dsc__opt_kernels dsc__opt_avx512 = {.name = "avx512"}; // never chosen off x86

#endif
