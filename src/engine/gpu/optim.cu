// engine/gpu/optim.cu - fused optimizer steps, sum of squares, clipping coefficient (see optim.h).
//
// Per-step constants are computed on the host exactly as engine/optim/optim.c computes them (in
// double where it does, then rounded to float), and the kernels spell every operation with an
// explicitly rounded intrinsic so that the compiler cannot fuse a multiply and an add: the CPU's
// scalar path does not fuse them either, which is what makes the two bitwise equal.
#include "engine/gpu/optim.h"

#include <math.h> // pow, sqrt

#include "cuda/common.cuh"          // DSC_CUDA_TRY, dsc_f32_bf16, dsc_f32_fp16
#include "engine/optim/sround.h"     // dsc__sr_bits, dsc__bf16_sr

#define OPT_THREADS 256
#define OPT_MAX_BLOCKS 4096 // grid-stride beyond this; plenty to fill any current GPU
#define SUMSQ_THREADS 256
#define SUMSQ_BLOCKS DSC_CUDA_SUMSQ_SCRATCH // fixed, so the summation order never changes

// The constants of one step (the fields of dsc__opt_args that the kernels read).
typedef struct opt_consts {
    float grad_scale;
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps;
    float bias2, step_size, l2, decay;
    float momentum, one_minus_dampening;
    int sgd_mode, nesterov, out16_kind;
} opt_consts;

#define MUL __fmul_rn
#define ADD __fadd_rn

__device__ static inline void store16(uint16_t *out16, int kind, size_t i, float p) {
    if (kind == DSC_OPT_OUT_BF16)
        out16[i] = dsc_f32_bf16(p);
    else if (kind == DSC_OPT_OUT_FP16)
        out16[i] = dsc_f32_fp16(p);
}

// The gradients as the kernels read them: fp32, or bf16 (bf16 master weights on the GPU keep their
// accumulated gradients in bf16).
struct f32_in {
    const float *a;
    __device__ float ld(size_t i) const { return a[i]; }
};
struct bf16_in {
    const uint16_t *a;
    __device__ float ld(size_t i) const { return dsc_bf16_f32(a[i]); }
};

template <class G>
__device__ static inline float scaled_grad(G g, size_t i, const opt_consts &k,
                                           const float *dev_scale) {
    float s = dev_scale ? MUL(k.grad_scale, *dev_scale) : k.grad_scale;
    return MUL(g.ld(i), s);
}

// How an array of parameters or moments is stored: fp32, or bf16 (bf16 master weights, bf16
// optimizer states), read widened exactly and written rounded to nearest even (dsc_fp32_to_bf16,
// as the CPU's dsc_opt_step_bf16 rounds after its fp32 step). The fp32 kernels are the same
// instructions as before these wrappers.
struct f32_arr {
    float *a;
    __device__ float ld(size_t i) const { return a[i]; }
    __device__ void st(size_t i, float x) const { a[i] = x; }
};
struct bf16_arr {
    uint16_t *a;
    __device__ float ld(size_t i) const { return dsc_bf16_f32(a[i]); }
    __device__ void st(size_t i, float x) const { a[i] = dsc_f32_bf16(x); }
};
// bf16 master weights rounded stochastically (engine/optim/sround.h): element i's random bits are
// drawn for (step, index0 + i), the same as the CPU's for the same flat index.
struct bf16_sr_arr {
    uint16_t *a;
    int64_t step;
    uint64_t index0;
    __device__ float ld(size_t i) const { return dsc_bf16_f32(a[i]); }
    __device__ void st(size_t i, float x) const {
        a[i] = dsc__bf16_sr(x, dsc__sr_bits(step, index0 + i));
    }
};

// One element of Adam in fp32 (g unscaled; s: the gradient's scale), shared by both kernels.
__device__ static inline void adam1(float &p, float g, float &m, float &v, const opt_consts &k,
                                    float s) {
    float gi = MUL(g, s);
    if (k.l2 != 0.0f) gi = ADD(MUL(p, k.l2), gi);
    m = ADD(MUL(m, k.beta1), MUL(gi, k.one_minus_beta1));
    v = ADD(MUL(v, k.beta2), MUL(MUL(gi, gi), k.one_minus_beta2));
    float denom = ADD(MUL(__fsqrt_rn(v), k.bias2), k.eps);
    p = ADD(MUL(p, k.decay), MUL(__fdiv_rn(m, denom), k.step_size));
}

template <class P, class S, class G>
__global__ void adam_kernel(P p, G g, S m, S v, uint16_t *out16, size_t n,
                            opt_consts k, const float *dev_scale) {
    float s = dev_scale ? MUL(k.grad_scale, *dev_scale) : k.grad_scale;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float pi = p.ld(i), mi = m.ld(i), vi = v.ld(i);
        adam1(pi, g.ld(i), mi, vi, k, s);
        p.st(i, pi);
        m.st(i, mi);
        v.st(i, vi);
        store16(out16, k.out16_kind, i, pi);
    }
}

// fp32 Adam four elements a thread (16-byte loads and stores; the 16-bit copy in 8 bytes): the
// same operations as adam_kernel (adam1), at more of the memory's rate. n4 groups of four; the
// rest of n goes to adam_kernel.
__global__ void adam4_kernel(float4 *p, const float4 *g, float4 *m, float4 *v, uint2 *out16,
                             size_t n4, opt_consts k, const float *dev_scale) {
    float s = dev_scale ? MUL(k.grad_scale, *dev_scale) : k.grad_scale;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 pi = p[i], gi = g[i], mi = m[i], vi = v[i];
        adam1(pi.x, gi.x, mi.x, vi.x, k, s);
        adam1(pi.y, gi.y, mi.y, vi.y, k, s);
        adam1(pi.z, gi.z, mi.z, vi.z, k, s);
        adam1(pi.w, gi.w, mi.w, vi.w, k, s);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (k.out16_kind == DSC_OPT_OUT_BF16)
            out16[i] = make_uint2((uint32_t)dsc_f32_bf16(pi.x) | (uint32_t)dsc_f32_bf16(pi.y) << 16,
                                  (uint32_t)dsc_f32_bf16(pi.z) | (uint32_t)dsc_f32_bf16(pi.w) << 16);
        else if (k.out16_kind == DSC_OPT_OUT_FP16)
            out16[i] = make_uint2((uint32_t)dsc_f32_fp16(pi.x) | (uint32_t)dsc_f32_fp16(pi.y) << 16,
                                  (uint32_t)dsc_f32_fp16(pi.z) | (uint32_t)dsc_f32_fp16(pi.w) << 16);
    }
}

template <class P, class S, class G>
__global__ void sgd_kernel(P p, G g, S m, uint16_t *out16, size_t n, opt_consts k,
                           const float *dev_scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float pi = p.ld(i), gi = scaled_grad(g, i, k, dev_scale);
        if (k.l2 != 0.0f) gi = ADD(MUL(pi, k.l2), gi);
        float u = gi;
        if (k.sgd_mode != DSC__SGD_PLAIN) {
            float buf = gi;
            if (k.sgd_mode == DSC__SGD_MOMENTUM)
                buf = ADD(MUL(m.ld(i), k.momentum), MUL(gi, k.one_minus_dampening));
            m.st(i, buf);
            u = k.nesterov ? ADD(MUL(buf, k.momentum), gi) : buf;
        }
        pi = ADD(MUL(u, k.step_size), pi);
        p.st(i, pi);
        store16(out16, k.out16_kind, i, pi);
    }
}

template <class P, class S, class G>
__global__ void lion_kernel(P p, G g, S m, uint16_t *out16, size_t n, opt_consts k,
                            const float *dev_scale) {
    float lr = fabsf(k.step_size);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float pi = p.ld(i), gi = scaled_grad(g, i, k, dev_scale), mi = m.ld(i);
        float c = ADD(MUL(mi, k.beta1), MUL(gi, k.one_minus_beta1));
        pi = ADD(MUL(pi, k.decay), copysignf(lr, -c));
        p.st(i, pi);
        m.st(i, ADD(MUL(mi, k.beta2), MUL(gi, k.one_minus_beta2)));
        store16(out16, k.out16_kind, i, pi);
    }
}

// ---- per-step constants (mirrors engine/optim/optim.c) ----

static void consts_adam(const dsc_opt_hparams *h, int64_t step, opt_consts *k) {
    bool decoupled = h->kind == DSC_OPT_ADAMW || h->adam_w_mode;
    double bc1 = 1.0, bc2 = 1.0;
    if (h->bias_correction) {
        bc1 = 1.0 - pow(h->beta1, (double)step);
        bc2 = 1.0 / sqrt(1.0 - pow(h->beta2, (double)step));
    }
    k->beta1 = h->beta1;
    k->one_minus_beta1 = 1.0f - h->beta1;
    k->beta2 = h->beta2;
    k->one_minus_beta2 = 1.0f - h->beta2;
    k->eps = h->eps;
    k->bias2 = (float)bc2;
    k->step_size = (float)(-(double)h->lr / bc1);
    bool wd = h->weight_decay > 0;
    k->l2 = (wd && !decoupled) ? h->weight_decay : 0.0f;
    k->decay = (wd && decoupled) ? (float)(1.0 - (double)h->lr * h->weight_decay) : 1.0f;
}

static void consts_sgd(const dsc_opt_hparams *h, int64_t step, opt_consts *k) {
    k->l2 = h->weight_decay;
    k->step_size = -h->lr;
    k->momentum = h->momentum;
    k->one_minus_dampening = 1.0f - h->dampening;
    k->nesterov = h->nesterov;
    if (h->momentum == 0.0f)
        k->sgd_mode = DSC__SGD_PLAIN;
    else
        k->sgd_mode = step <= 1 ? DSC__SGD_FIRST : DSC__SGD_MOMENTUM;
    k->decay = 1.0f;
}

static void consts_lion(const dsc_opt_hparams *h, opt_consts *k) {
    k->beta1 = h->beta1;
    k->one_minus_beta1 = 1.0f - h->beta1;
    k->beta2 = h->beta2;
    k->one_minus_beta2 = 1.0f - h->beta2;
    k->step_size = -h->lr;
    k->decay = h->weight_decay > 0 ? (float)(1.0 - (double)h->lr * h->weight_decay) : 1.0f;
}

// The step's constants and launch shape, shared by the fp32 and bf16 entry points.
static dsc_status prepare(const dsc_opt_hparams *h, int64_t step, const void *m, const void *v,
                          float grad_scale, int out16_kind, size_t n, opt_consts *k,
                          unsigned *blocks) {
    memset(k, 0, sizeof *k);
    k->grad_scale = grad_scale;
    k->out16_kind = out16_kind;
    unsigned b = dsc__blocks((long long)((n + OPT_THREADS - 1) / OPT_THREADS), 1);
    *blocks = b > OPT_MAX_BLOCKS ? OPT_MAX_BLOCKS : b;
    switch (h->kind) {
    case DSC_OPT_ADAM:
    case DSC_OPT_ADAMW:
        DSC_CUDA_ARG(m && v, "optimizer step: Adam needs m and v");
        consts_adam(h, step, k);
        return DSC_OK;
    case DSC_OPT_SGD:
        consts_sgd(h, step, k);
        DSC_CUDA_ARG(k->sgd_mode == DSC__SGD_PLAIN || m, "optimizer step: SGD momentum needs m");
        return DSC_OK;
    case DSC_OPT_LION:
        DSC_CUDA_ARG(m != NULL, "optimizer step: Lion needs m");
        consts_lion(h, k);
        return DSC_OK;
    default: return dsc__fail(DSC_ERR_INVALID_ARG, "optimizer step: unknown kind %d", (int)h->kind);
    }
}

template <class P, class S, class G>
static dsc_status launch(const dsc_opt_hparams *h, P p, G g, S m, S v, size_t n,
                         const opt_consts &k, unsigned blocks, const float *dev_scale,
                         uint16_t *out16, cudaStream_t st) {
    if (h->kind == DSC_OPT_ADAM || h->kind == DSC_OPT_ADAMW)
        adam_kernel<<<blocks, OPT_THREADS, 0, st>>>(p, g, m, v, out16, n, k, dev_scale);
    else if (h->kind == DSC_OPT_SGD)
        sgd_kernel<<<blocks, OPT_THREADS, 0, st>>>(p, g, m, out16, n, k, dev_scale);
    else
        lion_kernel<<<blocks, OPT_THREADS, 0, st>>>(p, g, m, out16, n, k, dev_scale);
    DSC_CUDA_LAUNCHED("optimizer step kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_opt_step(const dsc_opt_hparams *h, int64_t step, float *p,
                                         const float *g, float *m, float *v, size_t n,
                                         float grad_scale, const float *dev_scale, uint16_t *out16,
                                         int out16_kind, void *stream) {
    if (n == 0) return DSC_OK;
    DSC_CUDA_ARG(h && p && g, "optimizer step: h, p and g must be set");
    DSC_CUDA_ARG(out16_kind >= DSC_OPT_OUT_NONE && out16_kind <= DSC_OPT_OUT_FP16,
                 "optimizer step: unknown 16-bit output kind %d", out16_kind);
    opt_consts k;
    unsigned blocks;
    int kind16 = out16 ? out16_kind : DSC_OPT_OUT_NONE;
    bool adam = h->kind == DSC_OPT_ADAM || h->kind == DSC_OPT_ADAMW;
    if (adam && n >= 4 && dsc__aligned16(p) && dsc__aligned16(g) && dsc__aligned16(m) &&
        dsc__aligned16(v) && ((uintptr_t)out16 % 8) == 0) {
        size_t n4 = n / 4, done = n4 * 4;
        DSC_TRY(prepare(h, step, m, v, grad_scale, kind16, n4, &k, &blocks));
        adam4_kernel<<<blocks, OPT_THREADS, 0, (cudaStream_t)stream>>>(
            (float4 *)p, (const float4 *)g, (float4 *)m, (float4 *)v, (uint2 *)out16, n4, k,
            dev_scale);
        DSC_CUDA_LAUNCHED("adam4_kernel");
        if (done == n) return DSC_OK;
        p += done, g += done, m += done, v += done, n -= done;
        if (out16) out16 += done;
    }
    DSC_TRY(prepare(h, step, m, v, grad_scale, kind16, n, &k, &blocks));
    return launch(h, f32_arr{p}, f32_in{g}, f32_arr{m}, f32_arr{v}, n, k, blocks, dev_scale,
                  out16, (cudaStream_t)stream);
}

extern "C" dsc_status dsc__cuda_opt_step_bf16(const dsc_opt_hparams *h, int64_t step, uint16_t *p,
                                              const uint16_t *g, void *m, void *v,
                                              bool states_bf16, size_t n, float grad_scale,
                                              const float *dev_scale, uint64_t sr_index,
                                              void *stream) {
    if (n == 0) return DSC_OK;
    DSC_CUDA_ARG(h && p && g, "optimizer step: h, p and g must be set");
    opt_consts k;
    unsigned blocks;
    DSC_TRY(prepare(h, step, m, v, grad_scale, DSC_OPT_OUT_NONE, n, &k, &blocks));
    cudaStream_t st = (cudaStream_t)stream;
    bf16_in gi{g};
    bf16_sr_arr ps{p, step, sr_index};
    if (sr_index != UINT64_MAX && states_bf16)
        return launch(h, ps, gi, bf16_arr{(uint16_t *)m}, bf16_arr{(uint16_t *)v}, n, k, blocks,
                      dev_scale, NULL, st);
    if (sr_index != UINT64_MAX)
        return launch(h, ps, gi, f32_arr{(float *)m}, f32_arr{(float *)v}, n, k, blocks,
                      dev_scale, NULL, st);
    if (states_bf16)
        return launch(h, bf16_arr{p}, gi, bf16_arr{(uint16_t *)m}, bf16_arr{(uint16_t *)v}, n, k,
                      blocks, dev_scale, NULL, st);
    return launch(h, bf16_arr{p}, gi, f32_arr{(float *)m}, f32_arr{(float *)v}, n, k, blocks,
                  dev_scale, NULL, st);
}

// ---- sum of squares, clipping ----

__device__ static double block_sum_d(double v, double *sh) {
    int lane = threadIdx.x % DSC_WARP_SIZE, warp = threadIdx.x / DSC_WARP_SIZE;
    int nwarps = blockDim.x / DSC_WARP_SIZE;
    for (int o = DSC_WARP_SIZE / 2; o > 0; o >>= 1)
        v += dsc_shfl_xor_d(v, o);
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    v = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < nwarps; w++)
            v += sh[w];
    return v; // valid in thread 0
}

// (a.x scale)^2 + ... + (a.w scale)^2 in double, in that order.
__device__ static inline double sumsq4(float4 a, double scale) {
    double x = (double)a.x * scale, y = (double)a.y * scale, z = (double)a.z * scale,
           w = (double)a.w * scale;
    return ((x * x + y * y) + z * z) + w * w;
}

// Each thread's share of g in a fixed order: with g 16-byte aligned, float4 loads two at a time
// (so a thread has 32 bytes in flight, enough to keep the memory busy), then the n % 4 tail.
__global__ void sumsq_partial_kernel(double *part, const float *g, size_t n, double scale) {
    __shared__ double sh[DSC_MAX_WARPS];
    double s0 = 0.0, s1 = 0.0;
    size_t tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x,
           stride = (size_t)gridDim.x * blockDim.x;
    if (((uintptr_t)g & 15) == 0) {
        const float4 *g4 = (const float4 *)g;
        size_t n4 = n / 4, i = tid;
        for (; i + stride < n4; i += 2 * stride) {
            float4 a = g4[i], b = g4[i + stride];
            s0 += sumsq4(a, scale);
            s1 += sumsq4(b, scale);
        }
        if (i < n4) s0 += sumsq4(g4[i], scale);
        for (size_t j = n4 * 4 + tid; j < n; j += stride) {
            double x = (double)g[j] * scale;
            s1 += x * x;
        }
    } else {
        for (size_t i = tid; i < n; i += stride) {
            double x = (double)g[i] * scale;
            s0 += x * x;
        }
    }
    double s = block_sum_d(s0 + s1, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(double *acc, int *nonfinite, const double *part) {
    __shared__ double sh[DSC_MAX_WARPS];
    double s = 0.0;
    for (int i = threadIdx.x; i < SUMSQ_BLOCKS; i += blockDim.x)
        s += part[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x != 0) return;
    acc[0] += s;
    if (nonfinite && !isfinite(s)) *nonfinite = 1;
}

// The same partial sums over bf16 values (one element at a time, a fixed order).
__global__ void sumsq_partial_bf16_kernel(double *part, const uint16_t *g, size_t n,
                                          double scale) {
    __shared__ double sh[DSC_MAX_WARPS];
    double s0 = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double x = (double)dsc_bf16_f32(g[i]) * scale;
        s0 += x * x;
    }
    double s = block_sum_d(s0, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" dsc_status dsc__cuda_opt_sumsq_bf16(double *acc, int *nonfinite, double *scratch,
                                               const uint16_t *g, size_t n, float scale,
                                               void *stream) {
    DSC_CUDA_ARG(acc && scratch && (g || n == 0), "sumsq: acc, scratch and g must be set");
    if (n == 0) return DSC_OK;
    cudaStream_t st = (cudaStream_t)stream;
    sumsq_partial_bf16_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, st>>>(scratch, g, n,
                                                                      (double)scale);
    DSC_CUDA_LAUNCHED("sumsq_partial_bf16_kernel");
    sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, st>>>(acc, nonfinite, scratch);
    DSC_CUDA_LAUNCHED("sumsq_final_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_opt_sumsq(double *acc, int *nonfinite, double *scratch,
                                          const float *g, size_t n, float scale, void *stream) {
    DSC_CUDA_ARG(acc && scratch && (g || n == 0), "sumsq: acc, scratch and g must be set");
    if (n == 0) return DSC_OK;
    cudaStream_t st = (cudaStream_t)stream;
    sumsq_partial_kernel<<<SUMSQ_BLOCKS, SUMSQ_THREADS, 0, st>>>(scratch, g, n, (double)scale);
    DSC_CUDA_LAUNCHED("sumsq_partial_kernel");
    sumsq_final_kernel<<<1, SUMSQ_THREADS, 0, st>>>(acc, nonfinite, scratch);
    DSC_CUDA_LAUNCHED("sumsq_final_kernel");
    return DSC_OK;
}

__global__ void clip_coef_kernel(float *coef, const double *sumsq, float max_norm) {
    double norm = sqrt(sumsq[0]);
    float c = 1.0f;
    if (max_norm > 0.0f && isfinite(norm)) {
        double q = (double)max_norm / (norm + 1e-6);
        if (q < 1.0) c = (float)q;
    }
    coef[0] = c;
}

// dsc__step_divisor (engine/device.c) in the same order and rounding: correctly rounded double
// operations on both sides, so the step equals the host-planned one bit for bit.
__global__ void divisor_kernel(float *scale_out, const double *sumsq, double prev, double scale,
                               double clipping) {
    double norm = __dsqrt_rn(*sumsq), combined = scale;
    if (clipping > 0) {
        double clip = __ddiv_rn(__dadd_rn(__ddiv_rn(__dmul_rn(norm, prev), scale), 1e-6), clipping);
        if (clip > 1) combined = __dmul_rn(clip, scale);
    }
    *scale_out = (float)__ddiv_rn(1.0, combined);
}

extern "C" dsc_status dsc__cuda_opt_divisor(float *scale_out, const double *sumsq, double prev,
                                            double scale, double clipping, void *stream) {
    DSC_CUDA_ARG(scale_out && sumsq && prev > 0 && scale > 0,
                 "step divisor: bad arguments (prev %g, scale %g)", prev, scale);
    divisor_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(scale_out, sumsq, prev, scale, clipping);
    DSC_CUDA_LAUNCHED("divisor_kernel");
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_opt_clip_coef(float *coef, const double *sumsq, float max_norm,
                                              void *stream) {
    DSC_CUDA_ARG(coef && sumsq, "clip coefficient: coef and sumsq must be set");
    clip_coef_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(coef, sumsq, max_norm);
    DSC_CUDA_LAUNCHED("clip_coef_kernel");
    return DSC_OK;
}
