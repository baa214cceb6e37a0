// tests/cuda/cuda_test.h - what the GPU test programs share: a clean SKIP (exit 77) when no GPU is
// visible, fatal checks of CUDA calls and dsc statuses, seeded random data, relative errors
// against float64 references, bf16 and fp16 rounding on the host, and a PASS/FAIL tally.
//
// Each program prints one line per check ("PASS name err=... tol=...") and exits 1 if any
// failed, 77 if there is no device, 0 otherwise. DSC_TEST_SEED overrides the seed (printed).
#ifndef DSC_TESTS_CUDA_TEST_H
#define DSC_TESTS_CUDA_TEST_H

#include <math.h>   // sqrt, fabs, isfinite
#include <stdint.h> // uint64_t, uint16_t
#include <stdio.h>  // printf, fprintf
#include <stdlib.h> // exit, getenv, strtoull
#include <string.h> // memcpy

#include <vector> // std::vector

#include "cuda/vendor.h" // cuda* names

extern "C" {
#include "dsc/half.h"   // dsc_fp32_to_bf16, dsc_bf16_to_fp32, dsc_fp32_to_fp16, ...
#include "dsc/status.h" // dsc_status_name, dsc_last_error
}

#define SKIP_EXIT 77

static int g_failures = 0;
static uint64_t g_seed = 20251203;
static uint64_t g_rng;

// Exit 77 with a SKIP line when no device is usable; otherwise print which one runs.
static inline void require_device(const char *prog) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device (%s)\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 found");
        exit(SKIP_EXIT);
    }
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess)
        printf("%s: device %s, %d SMs\n", prog, p.name, p.multiProcessorCount);
    const char *s = getenv("DSC_TEST_SEED");
    if (s && *s) g_seed = strtoull(s, NULL, 10);
    printf("%s: seed %llu (set DSC_TEST_SEED to repeat)\n", prog, (unsigned long long)g_seed);
    g_rng = g_seed;
}

#define CK(expr)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                    \
                    cudaGetErrorString(e_));                                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define DS(expr)                                                                                   \
    do {                                                                                           \
        dsc_status s_ = (expr);                                                                    \
        if (s_ != DSC_OK) {                                                                        \
            fprintf(stderr, "FATAL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,              \
                    dsc_status_name(s_), dsc_last_error());                                        \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// Kernel faults surface at the next synchronisation: check it right after each tested call.
#define SYNC() CK(cudaDeviceSynchronize())

static inline uint64_t rng_next(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline double uniform(double lo, double hi) {
    return lo + (hi - lo) * (double)(rng_next() >> 11) * 0x1.0p-53;
}

static inline double normal(void) {
    double u1 = ((double)(rng_next() >> 11) + 1.0) * 0x1.0p-53, u2 = uniform(0, 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static inline std::vector<float> randn(size_t n, double scale, double offset = 0.0) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++)
        v[i] = (float)(offset + scale * normal());
    return v;
}

// Round every element to bf16 in place (so the host reference sees exactly the device's
// inputs) and return the bf16 bits.
static inline std::vector<uint16_t> to_bf16(std::vector<float> &v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); i++) {
        b[i] = dsc_fp32_to_bf16(v[i]);
        v[i] = dsc_bf16_to_fp32(b[i]);
    }
    return b;
}

static inline std::vector<float> from_bf16(const std::vector<uint16_t> &b) {
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); i++)
        v[i] = dsc_bf16_to_fp32(b[i]);
    return v;
}

// The same for either 16-bit type: IEEE fp16 when fp16 is set, bf16 otherwise.
static inline std::vector<uint16_t> to_16(std::vector<float> &v, bool fp16) {
    if (!fp16) return to_bf16(v);
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); i++) {
        b[i] = dsc_fp32_to_fp16(v[i]);
        v[i] = dsc_fp16_to_fp32(b[i]);
    }
    return b;
}

static inline std::vector<float> from_16(const std::vector<uint16_t> &b, bool fp16) {
    if (!fp16) return from_bf16(b);
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); i++)
        v[i] = dsc_fp16_to_fp32(b[i]);
    return v;
}

// " [fp16]" after the names of checks that ran in fp16 (bf16 checks keep their names).
static inline const char *type_tag(bool fp16) {
    return fp16 ? " [fp16]" : "";
}

// Device copies. Buffers are poisoned first where a kernel must write every element.
template <typename T> static inline T *dev_alloc(size_t n) {
    T *p = NULL;
    CK(cudaMalloc((void **)&p, n * sizeof(T) + 16));
    CK(cudaMemset(p, 0xff, n * sizeof(T) + 16)); // NaN bits for floats and bf16
    return p;
}

template <typename T> static inline T *dev_upload(const std::vector<T> &h) {
    T *p = dev_alloc<T>(h.size());
    CK(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}

template <typename T> static inline std::vector<T> dev_download(const T *p, size_t n) {
    std::vector<T> h(n);
    CK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}

// ||got - ref|| / ||ref|| over n elements (NaN gives inf, so it never passes).
template <typename G, typename R>
static inline double rel_err(const G *got, const R *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i], r = (double)ref[i];
        if (!isfinite(g)) return INFINITY;
        num += (g - r) * (g - r);
        den += r * r;
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static inline void check(const char *name, double err, double tol) {
    bool ok = err <= tol; // NaN fails
    if (!ok) g_failures++;
    printf("%s %-44s err=%.3e tol=%.1e\n", ok ? "PASS" : "FAIL", name, err, tol);
}

static inline void check_true(const char *name, bool ok) {
    if (!ok) g_failures++;
    printf("%s %s\n", ok ? "PASS" : "FAIL", name);
}

static inline int finish(const char *prog) {
    printf("%s: %s (%d failure%s, seed %llu)\n", prog, g_failures ? "FAILED" : "ok", g_failures,
           g_failures == 1 ? "" : "s", (unsigned long long)g_seed);
    return g_failures ? 1 : 0;
}

// Median of a few timed runs of fn on the default stream, in milliseconds (after warm-ups).
template <typename F> static inline double time_ms(F fn, int warm, int reps) {
    for (int i = 0; i < warm; i++)
        fn();
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> t(reps);
    for (int i = 0; i < reps; i++) {
        CK(cudaEventRecord(a, 0));
        fn();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t[i], a, b));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    for (int i = 1; i < reps; i++) // insertion sort: reps is small
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            float x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[reps / 2];
}

static inline bool small_mode(void) {
    const char *s = getenv("DSC_TEST_SMALL"); // smaller shapes, no timings (compute-sanitizer)
    return s && *s && *s != '0';
}

#endif
