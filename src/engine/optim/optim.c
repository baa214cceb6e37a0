// engine/optim/optim.c - optimizer step: per-step constants, path selection, OpenMP split and the
// scalar kernels (also the tails of the SIMD paths).
//
// Update rules, per element, after g *= grad_scale (t = step, 1-based):
//   Adam/AdamW, as DeepSpeed's CPU Adam (csrc/includes/cpu_adam.h, Step_AVX and Step_1):
//     Adam (L2):   g += wd*p                                   (only when wd > 0)
//     m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//     denom = sqrt(v) * 1/sqrt(1-b2^t) + eps                   (eps after sqrt(v_hat), as torch)
//     AdamW:       p = p*(1 - lr*wd)                           (only when wd > 0)
//     p = p - lr/(1-b1^t) * m/denom                            (no bias correction: both factors 1)
//   SGD, as torch.optim.SGD: g += wd*p; buf = g at the first step, else
//     buf = momentum*buf + (1-dampening)*g; u = nesterov ? g + momentum*buf : buf (u = g without
//     momentum); p = p - lr*u.
//   Lion, as DeepSpeed's CPU Lion (csrc/lion/cpu_lion_impl.cpp, Step_1):
//     c = b1*m + (1-b1)*g;  p = p*(1 - lr*wd) - copysign(lr, c)   (decay only when wd > 0)
//     m = b2*m + (1-b2)*g
//   copysign means an exact zero c still moves p by lr (sign of the zero), unlike the paper's
//   sign(0) = 0; we keep DeepSpeed's CPU behaviour.
#include "engine/optim/optim.h"

#include <math.h>   // pow, sqrt, sqrtf, copysignf, fabsf
#include <omp.h>    // omp_get_max_threads, omp_get_thread_num
#include <stdlib.h> // getenv
#include <string.h> // strcmp

#include "base/env.h"    // dsc__env, DSC_ENV_*
#include "base/log.h"    // DSC_WARN
#include "base/status.h" // dsc__fail, DSC_ASSERT
#include "dsc/half.h"    // dsc_fp32_to_bf16, dsc_fp32_to_fp16
#include "engine/optim/sround.h" // dsc__sr_bits, dsc__bf16_sr

#if DSC__OPT_X86
#include <cpuid.h> // __get_cpuid, bit_F16C
#endif

// Below this many elements per thread the fork/join costs more than it saves.
#define PAR_MIN_PER_THREAD ((size_t)1 << 14)
// Thread ranges start on multiples of this many elements (one 64-byte line of fp32).
#define PAR_ALIGN ((size_t)16)
// From this many elements on, the SIMD paths write the 16-bit copy with non-temporal stores. The
// copy is read next by the transfer to the device, not by this core, and an ordinary store to an
// array larger than the caches first reads each line (read for ownership): 2 more bytes per
// element on a step that moves 30. Below it the copy may still be in cache when it is read.
#define OUT16_STREAM_MIN ((size_t)1 << 20)

// ---- scalar kernels ----

static inline void store16(const dsc__opt_args *a, size_t i, float p) {
    if (a->out16_kind == DSC_OPT_OUT_BF16) a->out16[i] = dsc_fp32_to_bf16(p);
    else if (a->out16_kind == DSC_OPT_OUT_FP16) a->out16[i] = dsc_fp32_to_fp16(p);
}

static void adam_scalar(const dsc__opt_args *a, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        float p = a->p[i];
        float g = a->g[i] * a->grad_scale;
        if (a->l2 != 0.0f) g = p * a->l2 + g;
        float m = a->m[i] * a->beta1 + g * a->one_minus_beta1;
        float v = a->v[i] * a->beta2 + (g * g) * a->one_minus_beta2;
        float denom = sqrtf(v) * a->bias2 + a->eps;
        p = p * a->decay + (m / denom) * a->step_size;
        a->p[i] = p;
        a->m[i] = m;
        a->v[i] = v;
        store16(a, i, p);
    }
}

static void sgd_scalar(const dsc__opt_args *a, size_t lo, size_t hi) {
    for (size_t i = lo; i < hi; i++) {
        float p = a->p[i];
        float g = a->g[i] * a->grad_scale;
        if (a->l2 != 0.0f) g = p * a->l2 + g;
        float u = g;
        if (a->sgd_mode != DSC__SGD_PLAIN) {
            float buf = g;
            if (a->sgd_mode == DSC__SGD_MOMENTUM)
                buf = a->m[i] * a->momentum + g * a->one_minus_dampening;
            a->m[i] = buf;
            u = a->nesterov ? buf * a->momentum + g : buf;
        }
        p = u * a->step_size + p;
        a->p[i] = p;
        store16(a, i, p);
    }
}

static void lion_scalar(const dsc__opt_args *a, size_t lo, size_t hi) {
    float lr = fabsf(a->step_size);
    for (size_t i = lo; i < hi; i++) {
        float p = a->p[i];
        float g = a->g[i] * a->grad_scale;
        float m = a->m[i];
        float c = m * a->beta1 + g * a->one_minus_beta1;
        p = p * a->decay + copysignf(lr, -c);
        a->p[i] = p;
        a->m[i] = m * a->beta2 + g * a->one_minus_beta2;
        store16(a, i, p);
    }
}

static double sumsq_scalar(const float *g, size_t n, float scale) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, sc = scale;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        double x0 = g[i] * sc, x1 = g[i + 1] * sc, x2 = g[i + 2] * sc, x3 = g[i + 3] * sc;
        s0 += x0 * x0;
        s1 += x1 * x1;
        s2 += x2 * x2;
        s3 += x3 * x3;
    }
    for (; i < n; i++) {
        double x = g[i] * sc;
        s0 += x * x;
    }
    return (s0 + s1) + (s2 + s3);
}

const dsc__opt_kernels dsc__opt_scalar = {
    .name = "scalar",
    .adam = adam_scalar,
    .sgd = sgd_scalar,
    .lion = lion_scalar,
    .sumsq = sumsq_scalar,
};

// ---- path selection ----

#if DSC__OPT_X86
// F16C (fp16 conversions), from CPUID leaf 1; not every compiler's __builtin_cpu_supports knows it.
static bool has_f16c(void) {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

static bool path_available(const dsc__opt_kernels *k) {
    if (k == &dsc__opt_scalar) return true;
#if DSC__OPT_X86
    // __builtin_cpu_supports also checks that the OS saves the wider registers.
    __builtin_cpu_init();
    if (k == &dsc__opt_avx512) return __builtin_cpu_supports("avx512f");
    if (k == &dsc__opt_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#endif
    return false;
}

static const dsc__opt_kernels *best_path(void) {
    if (path_available(&dsc__opt_avx512)) return &dsc__opt_avx512;
    if (path_available(&dsc__opt_avx2)) return &dsc__opt_avx2;
    return &dsc__opt_scalar;
}

static const dsc__opt_kernels *path_by_name(const char *name) {
    if (strcmp(name, "scalar") == 0) return &dsc__opt_scalar;
    if (strcmp(name, "avx2") == 0) return &dsc__opt_avx2;
    if (strcmp(name, "avx512") == 0) return &dsc__opt_avx512;
    return NULL;
}

// DSC_SIMD, read at the first use; a bad value warns and falls back to the best path.
static const dsc__opt_kernels *path_from_env(void) {
    const char *env = dsc__env(DSC_ENV_SIMD);
    if (env == NULL || env[0] == '\0' || strcmp(env, "auto") == 0) return best_path();
    const dsc__opt_kernels *k = path_by_name(env);
    if (k == NULL) {
        DSC_WARN("optim", "DSC_SIMD=%s is not one of scalar, avx2, avx512, auto; using %s", env,
                 best_path()->name);
        return best_path();
    }
    if (!path_available(k)) {
        DSC_WARN("optim", "DSC_SIMD=%s: this CPU lacks it; using %s", env, best_path()->name);
        return best_path();
    }
    return k;
}

static const dsc__opt_kernels *g_path; // resolved once; written with release, read with acquire

static const dsc__opt_kernels *path(void) {
    const dsc__opt_kernels *k = __atomic_load_n(&g_path, __ATOMIC_ACQUIRE);
    if (k != NULL) return k;
    k = path_from_env(); // racing first callers compute the same answer
    __atomic_store_n(&g_path, k, __ATOMIC_RELEASE);
    return k;
}

const char *dsc_opt_simd_name(void) { return path()->name; }

dsc_status dsc_opt_simd_force(const char *name) {
    if (name == NULL || strcmp(name, "auto") == 0) {
        __atomic_store_n(&g_path, best_path(), __ATOMIC_RELEASE);
        return DSC_OK;
    }
    const dsc__opt_kernels *k = path_by_name(name);
    if (k == NULL)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "SIMD path '%s' is unknown; use scalar, avx2, avx512 or auto", name);
    if (!path_available(k))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "SIMD path '%s' is not supported by this CPU", name);
    __atomic_store_n(&g_path, k, __ATOMIC_RELEASE);
    return DSC_OK;
}

// ---- OpenMP split ----

typedef void (*range_fn)(const dsc__opt_args *a, size_t lo, size_t hi);

static int threads_for(size_t n) {
    size_t want = n / PAR_MIN_PER_THREAD;
    int max = omp_get_max_threads();
    return want < 1 ? 1 : (want < (size_t)max ? (int)want : max);
}

// Thread t of nt gets one contiguous range, so that each thread streams its own memory.
static void thread_range(size_t n, int t, int nt, size_t *lo, size_t *hi) {
    size_t per = (n + (size_t)nt - 1) / (size_t)nt;
    per = (per + PAR_ALIGN - 1) / PAR_ALIGN * PAR_ALIGN;
    *lo = (size_t)t * per < n ? (size_t)t * per : n;
    *hi = *lo + per < n ? *lo + per : n;
}

static void run_split(range_fn fn, const dsc__opt_args *a, size_t n) {
    int nt = threads_for(n);
    if (nt == 1) {
        fn(a, 0, n);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t lo, hi;
        thread_range(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
        if (lo < hi) fn(a, lo, hi);
    }
}

// ---- per-step constants ----

static void args_adam(const dsc_opt_hparams *h, int64_t step, dsc__opt_args *a) {
    // DeepSpeed: effective_adam_w_mode = (name == "AdamW") or adam_w_mode.
    bool decoupled = h->kind == DSC_OPT_ADAMW || h->adam_w_mode;
    double bc1 = 1.0, bc2 = 1.0;
    if (h->bias_correction) {
        bc1 = 1.0 - pow(h->beta1, (double)step);
        bc2 = 1.0 / sqrt(1.0 - pow(h->beta2, (double)step));
    }
    a->beta1 = h->beta1;
    a->one_minus_beta1 = 1.0f - h->beta1;
    a->beta2 = h->beta2;
    a->one_minus_beta2 = 1.0f - h->beta2;
    a->eps = h->eps;
    a->bias2 = (float)bc2;
    a->step_size = (float)(-(double)h->lr / bc1);
    // DeepSpeed's CPU Adam applies weight decay only when it is > 0.
    bool wd = h->weight_decay > 0;
    a->l2 = (wd && !decoupled) ? h->weight_decay : 0.0f;
    a->decay = (wd && decoupled) ? (float)(1.0 - (double)h->lr * h->weight_decay) : 1.0f;
}

static void args_sgd(const dsc_opt_hparams *h, int64_t step, dsc__opt_args *a) {
    a->l2 = h->weight_decay; // torch adds wd*p only when wd != 0; the kernels skip 0 too
    a->step_size = -h->lr;
    a->momentum = h->momentum;
    a->one_minus_dampening = 1.0f - h->dampening;
    a->nesterov = h->nesterov;
    if (h->momentum == 0.0f) a->sgd_mode = DSC__SGD_PLAIN;
    else a->sgd_mode = step <= 1 ? DSC__SGD_FIRST : DSC__SGD_MOMENTUM;
    a->decay = 1.0f;
}

static void args_lion(const dsc_opt_hparams *h, dsc__opt_args *a) {
    a->beta1 = h->beta1;
    a->one_minus_beta1 = 1.0f - h->beta1;
    a->beta2 = h->beta2;
    a->one_minus_beta2 = 1.0f - h->beta2;
    a->step_size = -h->lr;
    // DeepSpeed's CPU Lion decays only when weight_decay > 0.
    a->decay = h->weight_decay > 0 ? (float)(1.0 - (double)h->lr * h->weight_decay) : 1.0f;
}

// ---- public API ----

void dsc_opt_hparams_defaults(dsc_opt_kind kind, dsc_opt_hparams *h) {
    *h = (dsc_opt_hparams){
        .kind = kind,
        .lr = 1e-3f,
        .beta1 = 0.9f,
        .beta2 = 0.999f,
        .eps = 1e-8f,
        .weight_decay = 0.0f,
        .momentum = 0.0f,
        .dampening = 0.0f,
        .adam_w_mode = true,
        .bias_correction = true,
        .nesterov = false,
    };
}

dsc_status dsc_opt_hparams_validate(const dsc_opt_hparams *h) {
    if (h->kind != DSC_OPT_SGD) return DSC_OK;
    if (!(h->lr >= 0.0f))
        return dsc__fail(DSC_ERR_CONFIG, "optimizer.params.lr = %g: must be >= 0", h->lr);
    if (!(h->momentum >= 0.0f))
        return dsc__fail(DSC_ERR_CONFIG, "optimizer.params.momentum = %g: must be >= 0",
                         h->momentum);
    if (!(h->weight_decay >= 0.0f))
        return dsc__fail(DSC_ERR_CONFIG, "optimizer.params.weight_decay = %g: must be >= 0",
                         h->weight_decay);
    if (h->nesterov && (h->momentum <= 0.0f || h->dampening != 0.0f))
        return dsc__fail(DSC_ERR_CONFIG,
                         "optimizer.params.nesterov = true needs optimizer.params.momentum > 0 "
                         "and optimizer.params.dampening = 0 (got %g and %g)",
                         h->momentum, h->dampening);
    return DSC_OK;
}

void dsc_opt_step(const dsc_opt_hparams *h, int64_t step, float *p, const float *g, float *m,
                  float *v, size_t n, float grad_scale, uint16_t *out16, int out16_kind) {
    if (n == 0) return;
    DSC_ASSERT(h != NULL && p != NULL && g != NULL);
    dsc__opt_args a = {.p = p, .g = g, .m = m, .v = v, .grad_scale = grad_scale};
    a.out16_kind = out16 != NULL ? out16_kind : DSC_OPT_OUT_NONE;
    a.out16 = a.out16_kind != DSC_OPT_OUT_NONE ? out16 : NULL;
    a.out16_stream = a.out16 != NULL && n >= OUT16_STREAM_MIN;
    DSC_ASSERT(a.out16_kind >= DSC_OPT_OUT_NONE && a.out16_kind <= DSC_OPT_OUT_FP16);
    const dsc__opt_kernels *k = path();
    switch (h->kind) {
    case DSC_OPT_ADAM:
    case DSC_OPT_ADAMW:
        DSC_ASSERT(m != NULL && v != NULL);
        args_adam(h, step, &a);
        run_split(k->adam, &a, n);
        return;
    case DSC_OPT_SGD:
        args_sgd(h, step, &a);
        DSC_ASSERT(a.sgd_mode == DSC__SGD_PLAIN || m != NULL);
        run_split(k->sgd, &a, n);
        return;
    case DSC_OPT_LION:
        DSC_ASSERT(m != NULL);
        args_lion(h, &a);
        run_split(k->lion, &a, n);
        return;
    }
    DSC_ASSERT(!"unknown dsc_opt_kind");
}

// x (n) rounded to nearest even bf16, in place.
static void round_bf16(float *x, size_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++) x[i] = dsc_bf16_to_fp32(dsc_fp32_to_bf16(x[i]));
}

// x (n) rounded to bf16 stochastically, element k with the random bits of (step, index + k).
static void round_bf16_sr(float *x, size_t n, int64_t step, uint64_t index) {
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        x[i] = dsc_bf16_to_fp32(dsc__bf16_sr(x[i], dsc__sr_bits(step, index + i)));
}

void dsc_opt_step_bf16(const dsc_opt_hparams *h, int64_t step, float *p, const float *g, float *m,
                       float *v, size_t n, float grad_scale, bool states_bf16, uint64_t sr_index) {
    dsc_opt_step(h, step, p, g, m, v, n, grad_scale, NULL, DSC_OPT_OUT_NONE);
    if (sr_index == UINT64_MAX) round_bf16(p, n);
    else round_bf16_sr(p, n, step, sr_index);
    if (!states_bf16) return;
    if (m) round_bf16(m, n);
    if (v && (h->kind == DSC_OPT_ADAM || h->kind == DSC_OPT_ADAMW)) round_bf16(v, n);
}

double dsc_opt_sumsq(const float *g, size_t n, float scale, bool *nonfinite) {
    if (n == 0) return 0.0;
    const dsc__opt_kernels *k = path();
    double sum = 0.0;
    int nt = threads_for(n);
    if (nt == 1) {
        sum = k->sumsq(g, n, scale);
    } else {
#pragma omp parallel num_threads(nt) reduction(+ : sum)
        {
            size_t lo, hi;
            thread_range(n, omp_get_thread_num(), omp_get_num_threads(), &lo, &hi);
            if (lo < hi) sum += k->sumsq(g + lo, hi - lo, scale);
        }
    }
    // Each square is at most (2^128 * 2^128)^2 and n < 2^64, so a finite sum cannot overflow.
    if (!isfinite(sum) && nonfinite != NULL) *nonfinite = true;
    return sum;
}
