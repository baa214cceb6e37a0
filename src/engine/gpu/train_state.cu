// engine/gpu/train_state.cu - the device side of `dsc train --device cuda` (see train_state.h).
#include "engine/gpu/train_state.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, getenv, strtod
#include <string.h> // strstr

#include "cuda/common.cuh"    // DSC_CUDA_TRY
#include "cuda/kernels.h"     // dsc__cuda_f32_to_16, dsc__cuda_round_fp16
#include "cuda/convert.h"     // dsc__cuda_from16
#include "engine/gpu/optim.h" // dsc__cuda_opt_step, dsc__cuda_opt_sumsq

#include "base/env.h" // dsc__env (a C header with its own extern "C")
#include "dsc/half.h" // dsc_fp32_to_bf16_n, dsc_fp32_to_fp16_n

extern "C" {
#ifdef DSC_WITH_CUDA
#include "mem/cuda.h" // dsc__mem_cuda_host_register
#endif

// Page-locking the host state: through the memory layer's CUDA back end, which keeps the
// registrations in its accounting; the HIP build (no such back end) registers directly.
#ifdef DSC_WITH_CUDA
static bool host_register(void *p, size_t bytes, char *why, size_t cap) {
    return dsc__mem_cuda_host_register(p, bytes, why, cap);
}
static void host_unregister(void *p) { dsc__mem_cuda_host_unregister(p); }
#else
static bool host_register(void *p, size_t bytes, char *why, size_t cap) {
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
    if (e == cudaSuccess) return true;
    (void)cudaGetLastError();
    snprintf(why, cap, "%s", cudaGetErrorString(e));
    return false;
}
static void host_unregister(void *p) { (void)cudaHostUnregister(p); }
#endif
}

extern "C" bool dsc__cuda_host_pin(void *p, size_t bytes, char *why, size_t cap) {
    return host_register(p, bytes, why, cap);
}
extern "C" void dsc__cuda_host_unpin(void *p) {
    if (p) host_unregister(p);
}

// ---- the device ----

// Dense bf16 tensor-core peaks (FLOP/s, fp32 accumulation) from the vendors' data sheets. The
// first entry whose every word occurs in the device name wins, so the specific names come first.
static const struct {
    const char *words[2];
    double peak;
} peaks[] = {
    {{"H200", NULL}, 989e12},  {{"GH200", NULL}, 989e12}, {{"H100", "PCIe"}, 756e12},
    {{"H100", "NVL"}, 835e12}, {{"H100", NULL}, 989e12},  {{"H800", NULL}, 989e12},
    {{"A100", NULL}, 312e12},  {{"A800", NULL}, 312e12},  {{"L40S", NULL}, 362e12},
};

static double peak_of(const char *name) {
    const char *env = dsc__env(DSC_ENV_GPU_PEAK_TFLOPS);
    if (env && *env) {
        double v = strtod(env, NULL);
        if (v > 0) return v * 1e12;
    }
    for (size_t k = 0; k < sizeof peaks / sizeof peaks[0]; k++)
        if (strstr(name, peaks[k].words[0]) &&
            (!peaks[k].words[1] || strstr(name, peaks[k].words[1])))
            return peaks[k].peak;
    return 0; // unknown: the caller reports MFU as not available
}

extern "C" dsc_status dsc__cuda_device_info(char *name, size_t cap, double *peak_flops) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        return dsc__fail(DSC_ERR_UNSUPPORTED, "no CUDA device is usable here (%s)",
                         e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees 0 devices");
    }
    int dev = 0;
    DSC_CUDA_TRY(cudaGetDevice(&dev));
    cudaDeviceProp p;
    DSC_CUDA_TRY(cudaGetDeviceProperties(&p, dev));
    snprintf(name, cap, "%s", p.name);
    *peak_flops = peak_of(p.name);
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_select_device(int local_rank, int *device, int *count) {
    DSC_CUDA_TRY(cudaGetDeviceCount(count));
    if (*count < 1) return dsc__fail(DSC_ERR_UNSUPPORTED, "no CUDA device is visible");
    *device = (local_rank < 0 ? 0 : local_rank) % *count;
    DSC_CUDA_TRY(cudaSetDevice(*device));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_device_pci(int device, char *buf, size_t cap) {
    DSC_CUDA_ARG(cap >= 16, "PCI bus id: buffer of %zu bytes", cap);
    DSC_CUDA_TRY(cudaDeviceGetPCIBusId(buf, (int)(cap < 64 ? cap : 64), device));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_current_device(int *device) {
    DSC_CUDA_TRY(cudaGetDevice(device));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_device_used(size_t *bytes) {
    size_t fr = 0, tot = 0;
    DSC_CUDA_TRY(cudaMemGetInfo(&fr, &tot));
    *bytes = tot - fr;
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    DSC_CUDA_TRY(cudaMemGetInfo(free_bytes, total_bytes));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_stream_wait(void *stream) {
    DSC_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)stream));
    return DSC_OK;
}

// ---- the state ----

// Buffer k of the state: bytes from the pool (or cudaMalloc) into *view.
static dsc_status alloc(dsc_cuda_state *s, dsc_mem_pool *pool, int k, void **view, size_t bytes,
                        const char *tag) {
    DSC_TRY(dsc__cuda_buf_alloc(&s->bufs[k], pool, bytes, tag));
    *view = s->bufs[k].ptr;
    return DSC_OK;
}

static dsc_status state_alloc(dsc_cuda_state *s, int moments, dsc_mem_pool *pool) {
    size_t n = s->n, ns = s->nstate;
    cudaStream_t st;
    DSC_CUDA_TRY(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    s->stream = st;
    // An offload state keeps no master: the host's comes up through the gradient buffer
    // (dsc__cuda_state_upload), which is zero between steps.
    // bf16 master weights: the 16-bit copy is the master.
    if (!s->offload && !s->master16)
        DSC_TRY(alloc(s, pool, 0, (void **)&s->master, ns * 4, "gpu.master"));
    DSC_TRY(alloc(s, pool, 1, (void **)&s->grad, s->grad_len * 4,
                  s->master16 ? "gpu.grad_scratch" : "gpu.grads"));
    DSC_TRY(alloc(s, pool, 2, (void **)&s->p16, n * 2,
                  s->master16 ? "gpu.bf16_master" : "gpu.bf16_weights"));
    if (s->master16) {
        DSC_TRY(dsc__cuda_buf_alloc(&s->g16_buf, pool, n * 2, "gpu.grads"));
        s->g16 = (uint16_t *)s->g16_buf.ptr;
        DSC_CUDA_TRY(cudaMemsetAsync(s->g16, 0, n * 2, st));
    }
    size_t mb = s->states16 ? 2 : 4; // bytes per moment
    void **mv[2] = {s->states16 ? (void **)&s->m16 : (void **)&s->m,
                    s->states16 ? (void **)&s->v16 : (void **)&s->v};
    for (int k = 0; k < 2; k++)
        if (!s->offload && moments >= k + 1) {
            DSC_TRY(alloc(s, pool, 3 + k, mv[k], ns * mb, "gpu.moments"));
            DSC_CUDA_TRY(cudaMemsetAsync(*mv[k], 0, ns * mb, st));
        }
    // sumsq, then the divisor's float (step_div) in the same buffer
    DSC_TRY(alloc(s, pool, 5, (void **)&s->sumsq, 2 * sizeof(double), "gpu.norm"));
    s->dev_scale = (float *)(s->sumsq + 1);
    DSC_CUDA_TRY(cudaMallocHost((void **)&s->results, sizeof *s->results));
    DSC_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&s->results_ready,
                                          cudaEventDisableTiming));
    DSC_TRY(alloc(s, pool, 6, (void **)&s->nonfinite, sizeof(int), "gpu.norm"));
    DSC_TRY(alloc(s, pool, 7, (void **)&s->scratch, DSC_CUDA_SUMSQ_SCRATCH * sizeof(double),
                  "gpu.norm"));
    DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, s->grad_len * 4, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

// master16 / states16: see dsc__cuda_state_create_bf16.
static dsc_status state_create(dsc_cuda_state **out, size_t n, size_t nstate, int moments,
                               bool offload, dsc_mem_pool *pool, bool master16 = false,
                               bool states16 = false, size_t grad_len = 0) {
    *out = NULL;
    dsc_cuda_state *s = (dsc_cuda_state *)calloc(1, sizeof *s);
    if (!s) return dsc__fail(DSC_ERR_OOM, "out of memory for the GPU training state");
    s->n = n;
    s->nstate = nstate;
    s->offload = offload;
    s->master16 = master16;
    s->states16 = states16;
    s->grad_len = master16 ? grad_len : n;
    dsc_status st = state_alloc(s, moments, pool);
    if (st != DSC_OK) {
        dsc__cuda_state_destroy(s);
        return st;
    }
    *out = s;
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_create(dsc_cuda_state **out, size_t n, int moments,
                                             bool offload, dsc_mem_pool *pool) {
    return state_create(out, n, n, moments, offload, pool);
}

extern "C" dsc_status dsc__cuda_state_create_bf16(dsc_cuda_state **out, size_t n,
                                                  size_t grad_len, int moments, bool states16,
                                                  dsc_mem_pool *pool) {
    DSC_CUDA_ARG(grad_len > 0, "GPU state: a bf16 master needs gradient scratch");
    return state_create(out, n, n, moments, false, pool, true, states16, grad_len);
}

extern "C" dsc_status dsc__cuda_state_create_dp(dsc_cuda_state **out, size_t n, size_t nstate,
                                                int moments, dsc_mem_pool *pool) {
    return state_create(out, n, nstate, moments, false, pool);
}

static dsc_status frozen_io(dsc_cuda_state *s, size_t off, size_t n, float *host, bool up);

extern "C" dsc_status dsc__cuda_state_frozen(dsc_cuda_state *s, const float *host, size_t n,
                                             dsc_mem_pool *pool) {
    DSC_CUDA_ARG(s != NULL, "GPU state: no state for the frozen weights");
    if (s->frozen16 && n != s->nfrozen) { // another layout (a recovery changed the world)
        DSC_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s->stream));
        dsc__cuda_buf_free(&s->frozen_buf);
        s->frozen16 = NULL;
    }
    if (!s->frozen16) {
        DSC_TRY(dsc__cuda_buf_alloc(&s->frozen_buf, pool, n * 2, "gpu.frozen_weights"));
        s->frozen16 = (uint16_t *)s->frozen_buf.ptr;
        s->nfrozen = n;
    }
    // their values now, or later (dsc__cuda_state_io, DSC__STATE_FROZEN)
    return host ? frozen_io(s, 0, n, (float *)host, true) : DSC_OK;
}

extern "C" void dsc__cuda_state_destroy(dsc_cuda_state *s) {
    if (!s) return;
    if (s->stream) (void)cudaStreamSynchronize((cudaStream_t)s->stream);
    for (int k = 0; k < 2; k++)
        if (s->pinned[k]) host_unregister(s->pinned[k]);
    for (int k = 0; k < DSC_CUDA_STATE_BUFS; k++) dsc__cuda_buf_free(&s->bufs[k]);
    dsc__cuda_buf_free(&s->g16_buf);
    dsc__cuda_buf_free(&s->frozen_buf);
    if (s->results) (void)cudaFreeHost(s->results);
    if (s->results_ready) (void)cudaEventDestroy((cudaEvent_t)s->results_ready);
    if (s->stream) (void)cudaStreamDestroy((cudaStream_t)s->stream);
    free(s);
}

extern "C" dsc_status dsc__cuda_state_resize(dsc_cuda_state *s, size_t n) {
    DSC_CUDA_ARG(s && s->offload, "GPU state resize: only an offload (host-staged) state");
    DSC_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s->stream));
    for (int k = 0; k < 2; k++)
        if (s->pinned[k]) host_unregister(s->pinned[k]);
    s->pinned[0] = s->pinned[1] = NULL;
    dsc_mem_pool *pool = s->bufs[1].pool;
    for (int k = 0; k < 3; k++) dsc__cuda_buf_free(&s->bufs[k]);
    s->master = s->grad = NULL;
    s->p16 = NULL;
    s->n = s->nstate = s->grad_len = n;
    DSC_TRY(alloc(s, pool, 1, (void **)&s->grad, n * 4, "gpu.grads"));
    DSC_TRY(alloc(s, pool, 2, (void **)&s->p16, n * 2, "gpu.bf16_weights"));
    DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, n * 4, (cudaStream_t)s->stream));
    DSC_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s->stream));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_resize_dp(dsc_cuda_state *s, size_t n, size_t nstate,
                                                int moments) {
    DSC_CUDA_ARG(s && !s->offload, "GPU state resize_dp: only a device (nccl) state");
    cudaStream_t st = (cudaStream_t)s->stream;
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    dsc_mem_pool *pool = s->bufs[1].pool;
    for (int k = 0; k < 5; k++)
        dsc__cuda_buf_free(&s->bufs[k]);
    s->master = s->grad = s->m = s->v = NULL;
    s->p16 = NULL;
    s->n = s->grad_len = n;
    s->nstate = nstate;
    DSC_TRY(alloc(s, pool, 0, (void **)&s->master, nstate * 4, "gpu.master"));
    DSC_TRY(alloc(s, pool, 1, (void **)&s->grad, n * 4, "gpu.grads"));
    DSC_TRY(alloc(s, pool, 2, (void **)&s->p16, n * 2, "gpu.bf16_weights"));
    if (moments >= 1) DSC_TRY(alloc(s, pool, 3, (void **)&s->m, nstate * 4, "gpu.moments"));
    if (moments >= 2) DSC_TRY(alloc(s, pool, 4, (void **)&s->v, nstate * 4, "gpu.moments"));
    DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, n * 4, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

extern "C" void dsc__cuda_state_pin(dsc_cuda_state *s, float *a, float *b, size_t n, bool *pinned,
                                    char *why, size_t cap) {
    float *ranges[2] = {a, b};
    *pinned = true;
    for (int k = 0; k < 2; k++) {
        if (!ranges[k] || (k == 1 && b == a)) continue;
        if (host_register(ranges[k], n * 4, why, cap)) s->pinned[k] = ranges[k];
        else *pinned = false;
    }
}

// ---- copies ----

static dsc_status copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       cudaStream_t st) {
    if (!dst || !src) return DSC_OK;
    DSC_CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, st));
    return DSC_OK;
}

// Between n fp32 host values and n bf16 values on the device (up: host -> dev16, rounded; else
// dev16 -> host, widened exactly) through the gradient scratch, grad_len at a time (the host
// waits for each piece, so the scratch can take the next), zero again after.
static dsc_status stage_range(dsc_cuda_state *s, float *host, uint16_t *dev16, size_t n,
                              bool up) {
    cudaStream_t st = (cudaStream_t)s->stream;
    for (size_t at = 0; at < n; at += s->grad_len) {
        size_t k = n - at < s->grad_len ? n - at : s->grad_len;
        if (up) {
            DSC_TRY(copy(s->grad, host + at, k * 4, cudaMemcpyHostToDevice, st));
            DSC_TRY(dsc__cuda_f32_to_16(dev16 + at, s->grad, (int64_t)k, false, st));
        } else {
            DSC_TRY(dsc__cuda_from16(s->grad, dev16 + at, k, 1.0f, false, st));
            DSC_TRY(copy(host + at, s->grad, k * 4, cudaMemcpyDeviceToHost, st));
        }
        DSC_CUDA_TRY(cudaStreamSynchronize(st));
    }
    DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, (n < s->grad_len ? n : s->grad_len) * 4, st));
    return DSC_OK;
}

// The whole layout; NULL host or dev16: nothing.
static dsc_status stage(dsc_cuda_state *s, float *host, uint16_t *dev16, bool up) {
    return dev16 && host ? stage_range(s, host, dev16, s->n, up) : DSC_OK;
}

// LoRA's frozen weights (kind -1), n from off: converted on the host in pieces (exact for values
// already rounded to the 16-bit type), to the device (up) or back, widened.
static dsc_status frozen_io(dsc_cuda_state *s, size_t off, size_t n, float *host, bool up) {
    DSC_CUDA_ARG(s->frozen16 && off + n <= s->nfrozen, "GPU state: no frozen range [%zu, +%zu) "
                 "in %zu frozen weights", off, n, s->nfrozen);
    const size_t CHUNK = (size_t)1 << 24;
    uint16_t *buf = (uint16_t *)malloc((n < CHUNK ? n : CHUNK) * 2 + 2);
    if (!buf) return dsc__fail(DSC_ERR_OOM, "GPU state: out of host memory for the frozen weights");
    cudaStream_t st = (cudaStream_t)s->stream;
    dsc_status rc = DSC_OK;
    for (size_t at = 0; at < n && rc == DSC_OK; at += CHUNK) {
        size_t c = n - at < CHUNK ? n - at : CHUNK;
        if (up) {
            if (s->fp16) dsc_fp32_to_fp16_n(buf, host + at, c);
            else dsc_fp32_to_bf16_n(buf, host + at, c);
            rc = copy(s->frozen16 + off + at, buf, c * 2, cudaMemcpyHostToDevice, st);
        } else {
            rc = copy(buf, s->frozen16 + off + at, c * 2, cudaMemcpyDeviceToHost, st);
        }
        cudaError_t e = cudaStreamSynchronize(st); // buf is reused (and pageable)
        if (rc == DSC_OK && e != cudaSuccess)
            rc = dsc__cuda_fail(e, "GPU state: the frozen weights", __FILE__, __LINE__);
        for (size_t k = 0; !up && rc == DSC_OK && k < c; k++)
            host[at + k] = s->fp16 ? dsc_fp16_to_fp32(buf[k]) : dsc_bf16_to_fp32(buf[k]);
    }
    free(buf);
    return rc;
}

extern "C" dsc_status dsc__cuda_state_io(dsc_cuda_state *s, int kind, size_t off, size_t n,
                                         float *host, bool up) {
    if (kind == -1) return frozen_io(s, off, n, host, up);
    if (kind == -2) { // the accumulated gradients, read only (bf16 ones widened)
        DSC_CUDA_ARG(!up && off + n <= s->n, "GPU state: no gradient range [%zu, +%zu) to read",
                     off, n);
        if (s->master16) DSC_TRY(stage_range(s, host, s->g16 + off, n, false));
        else DSC_TRY(copy(host, s->grad + off, n * 4, cudaMemcpyDeviceToHost,
                          (cudaStream_t)s->stream));
        DSC_CUDA_TRY(cudaStreamSynchronize((cudaStream_t)s->stream));
        return DSC_OK;
    }
    DSC_CUDA_ARG(!s->offload && s->nstate == s->n && off + n <= s->n && kind >= 0 && kind <= 2,
                 "GPU state: no range [%zu, +%zu) of kind %d in a device state of %zu elements",
                 off, n, kind, s->n);
    cudaStream_t st = (cudaStream_t)s->stream;
    cudaMemcpyKind dir = up ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    if (kind == 0 && s->master16) {
        DSC_TRY(stage_range(s, host, s->p16 + off, n, up));
    } else if (kind == 0) {
        DSC_TRY(up ? copy(s->master + off, host, n * 4, dir, st)
                   : copy(host, s->master + off, n * 4, dir, st));
        if (up)
            DSC_TRY(dsc__cuda_f32_to_16(s->p16 + off, s->master + off, (int64_t)n, s->fp16, st));
    } else if (s->states16) {
        uint16_t *m16 = kind == 1 ? s->m16 : s->v16;
        DSC_CUDA_ARG(m16 != NULL, "GPU state: no moment %d", kind - 1);
        DSC_TRY(stage_range(s, host, m16 + off, n, up));
    } else {
        float *mom = kind == 1 ? s->m : s->v;
        DSC_CUDA_ARG(mom != NULL, "GPU state: no moment %d", kind - 1);
        DSC_TRY(up ? copy(mom + off, host, n * 4, dir, st) : copy(host, mom + off, n * 4, dir, st));
    }
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

extern "C" void dsc__cuda_state_set_fp16(dsc_cuda_state *s, bool on) {
    s->fp16 = on;
}

extern "C" dsc_status dsc__cuda_state_upload(dsc_cuda_state *s, const float *master,
                                             const float *m, const float *v) {
    DSC_CUDA_ARG(s->nstate == s->n, "GPU state upload: the state is a partition (upload_dp)");
    cudaStream_t st = (cudaStream_t)s->stream;
    size_t b = s->n * 4;
    if (s->master16) { // bf16 values, through the gradient scratch in pieces
        DSC_TRY(stage(s, (float *)master, s->p16, true));
        if (s->states16) {
            DSC_TRY(stage(s, (float *)m, s->m16, true));
            DSC_TRY(stage(s, (float *)v, s->v16, true));
        } else {
            DSC_TRY(copy(s->m, m, b, cudaMemcpyHostToDevice, st));
            DSC_TRY(copy(s->v, v, b, cudaMemcpyHostToDevice, st));
        }
        DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, s->grad_len * 4, st));
        DSC_CUDA_TRY(cudaStreamSynchronize(st));
        return DSC_OK;
    }
    if (s->offload) { // through the gradient buffer, zero again after
        DSC_TRY(copy(s->grad, master, b, cudaMemcpyHostToDevice, st));
        DSC_TRY(dsc__cuda_f32_to_16(s->p16, s->grad, (int64_t)s->n, s->fp16, st));
        DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, b, st));
        DSC_CUDA_TRY(cudaStreamSynchronize(st));
        return DSC_OK;
    }
    DSC_TRY(copy(s->master, master, b, cudaMemcpyHostToDevice, st));
    DSC_TRY(copy(s->m, m, b, cudaMemcpyHostToDevice, st));
    DSC_TRY(copy(s->v, v, b, cudaMemcpyHostToDevice, st));
    DSC_TRY(dsc__cuda_f32_to_16(s->p16, s->master, (int64_t)s->n, s->fp16, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_upload_dp(dsc_cuda_state *s, const float *weights,
                                                const float *master, const float *m,
                                                const float *v) {
    cudaStream_t st = (cudaStream_t)s->stream;
    size_t b = s->nstate * 4;
    DSC_TRY(copy(s->grad, weights, s->n * 4, cudaMemcpyHostToDevice, st));
    if (weights) DSC_TRY(dsc__cuda_f32_to_16(s->p16, s->grad, (int64_t)s->n, s->fp16, st));
    DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, s->n * 4, st));
    DSC_TRY(copy(s->master, master, b, cudaMemcpyHostToDevice, st));
    DSC_TRY(copy(s->m, m, b, cudaMemcpyHostToDevice, st));
    DSC_TRY(copy(s->v, v, b, cudaMemcpyHostToDevice, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_download(dsc_cuda_state *s, float *master, float *m,
                                               float *v) {
    cudaStream_t st = (cudaStream_t)s->stream;
    size_t b = s->nstate * 4;
    if (s->master16) { // widened exactly through the gradient scratch, zero again after
        DSC_TRY(stage(s, master, s->p16, false));
        if (s->states16) {
            DSC_TRY(stage(s, m, s->m16, false));
            DSC_TRY(stage(s, v, s->v16, false));
        } else {
            DSC_TRY(copy(m, s->m, b, cudaMemcpyDeviceToHost, st));
            DSC_TRY(copy(v, s->v, b, cudaMemcpyDeviceToHost, st));
        }
        DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, s->grad_len * 4, st));
        DSC_CUDA_TRY(cudaStreamSynchronize(st));
        return DSC_OK;
    }
    if (!s->offload) DSC_TRY(copy(master, s->master, b, cudaMemcpyDeviceToHost, st));
    DSC_TRY(copy(m, s->m, b, cudaMemcpyDeviceToHost, st));
    DSC_TRY(copy(v, s->v, b, cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_grads_to_host(dsc_cuda_state *s, float *dst) {
    cudaStream_t st = (cudaStream_t)s->stream;
    if (s->master16) { // the bf16 gradients, widened (the scratch is free between steps)
        DSC_TRY(stage(s, dst, s->g16, false));
        DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, s->grad_len * 4, st));
        DSC_CUDA_TRY(cudaStreamSynchronize(st));
        return DSC_OK;
    }
    DSC_TRY(copy(dst, s->grad, s->n * 4, cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_bf16_to_host(float *dst, const uint16_t *src, size_t n,
                                             void *stream) {
    return dsc__cuda_16_to_host(dst, src, n, false, stream);
}

extern "C" dsc_status dsc__cuda_16_to_host(float *dst, const uint16_t *src, size_t n, bool fp16,
                                           void *stream) {
    uint16_t *bits = (uint16_t *)malloc(n * sizeof *bits);
    if (!bits) return dsc__fail(DSC_ERR_OOM, "out of memory for %zu logits", n);
    cudaStream_t st = (cudaStream_t)stream; // a non-blocking stream: the default one would not wait
    cudaError_t e = cudaMemcpyAsync(bits, src, n * sizeof *bits, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess) e = cudaStreamSynchronize(st);
    for (size_t i = 0; e == cudaSuccess && i < n; i++)
        dst[i] = fp16 ? dsc_fp16_f32(bits[i]) : dsc_bf16_f32(bits[i]);
    free(bits);
    DSC_CUDA_CHECK_AS(e, "cudaMemcpy of logits to the host");
    return DSC_OK;
}

// ---- the step ----

// The device scalars of the norm just enqueued, to the host (waits).
static dsc_status read_norm(dsc_cuda_state *s, double *sumsq, bool *nonfinite) {
    cudaStream_t st = (cudaStream_t)s->stream;
    int flag = 0;
    DSC_CUDA_TRY(cudaMemcpyAsync(sumsq, s->sumsq, sizeof(double), cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaMemcpyAsync(&flag, s->nonfinite, sizeof(int), cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaStreamSynchronize(st));
    *nonfinite = flag != 0;
    return DSC_OK;
}

// The step kernels' sr_index: the flat layout starts at 0 on one rank.
static uint64_t sr_index(const dsc_cuda_state *s) { return s->sr16 ? 0 : UINT64_MAX; }

extern "C" void dsc__cuda_state_set_sr(dsc_cuda_state *s, bool on) { s->sr16 = on; }

// Moment k (0: m, 1: v) as the step kernels take it: fp32 or, with states16, bf16 storage.
static void *moment(const dsc_cuda_state *s, int k) {
    if (s->states16) return k == 0 ? (void *)s->m16 : (void *)s->v16;
    return k == 0 ? (void *)s->m : (void *)s->v;
}

extern "C" dsc_status dsc__cuda_state_zero_grads(dsc_cuda_state *s) {
    DSC_CUDA_TRY(cudaMemsetAsync(s->grad, 0, s->grad_len * 4, (cudaStream_t)s->stream));
    if (s->g16) DSC_CUDA_TRY(cudaMemsetAsync(s->g16, 0, s->n * 2, (cudaStream_t)s->stream));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_acc_grads(dsc_cuda_state *s, size_t off, size_t from,
                                                size_t count, bool first) {
    DSC_CUDA_ARG(s->master16 && off + count <= s->n && from + count <= s->grad_len,
                 "GPU state: bf16 gradients %zu + %zu from scratch %zu outside %zu / %zu", off,
                 count, from, s->n, s->grad_len);
    if (!count) return DSC_OK; // a group with nothing trained (LoRA: the embeddings' group)
    return dsc__cuda_acc_bf16(s->g16 + off, s->grad + from, count, first, s->stream);
}

extern "C" dsc_status dsc__cuda_state_round_grads_fp16(dsc_cuda_state *s) {
    return dsc__cuda_state_round_grads_fp16_range(s, 0, s->n);
}

extern "C" dsc_status dsc__cuda_state_round_grads_fp16_range(dsc_cuda_state *s, size_t off,
                                                             size_t n) {
    DSC_CUDA_ARG(off <= s->n && n <= s->n - off, "round to fp16: range %zu + %zu outside the %zu "
                 "gradients", off, n, s->n);
    return dsc__cuda_round_fp16(s->grad + off, (int64_t)n, s->stream);
}

extern "C" dsc_status dsc__cuda_state_grad_sumsq(dsc_cuda_state *s, float scale, double *sumsq,
                                                 bool *nonfinite) {
    if (s->g16) { // the bf16 gradients
        DSC_TRY(dsc__cuda_state_grad_sumsq_enqueue(s, scale));
        return read_norm(s, sumsq, nonfinite);
    }
    return dsc__cuda_state_sumsq(s, s->grad, s->n, scale, sumsq, nonfinite);
}

extern "C" dsc_status dsc__cuda_state_grad_sumsq_enqueue(dsc_cuda_state *s, float scale) {
    cudaStream_t st = (cudaStream_t)s->stream;
    DSC_CUDA_TRY(cudaMemsetAsync(s->sumsq, 0, sizeof(double), st));
    DSC_CUDA_TRY(cudaMemsetAsync(s->nonfinite, 0, sizeof(int), st));
    if (s->g16)
        return dsc__cuda_opt_sumsq_bf16(s->sumsq, s->nonfinite, s->scratch, s->g16, s->n, scale,
                                        st);
    return dsc__cuda_opt_sumsq(s->sumsq, s->nonfinite, s->scratch, s->grad, s->n, scale, st);
}

extern "C" dsc_status dsc__cuda_state_results_enqueue(dsc_cuda_state *s, const float *loss_dev) {
    cudaStream_t st = (cudaStream_t)s->stream;
    dsc_cuda_step_results *r = s->results;
    if (loss_dev)
        DSC_CUDA_TRY(cudaMemcpyAsync(&r->loss, loss_dev, sizeof r->loss, cudaMemcpyDeviceToHost,
                                     st));
    DSC_CUDA_TRY(
        cudaMemcpyAsync(&r->sumsq, s->sumsq, sizeof r->sumsq, cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaMemcpyAsync(&r->nonfinite, s->nonfinite, sizeof r->nonfinite,
                                 cudaMemcpyDeviceToHost, st));
    DSC_CUDA_TRY(cudaEventRecord((cudaEvent_t)s->results_ready, st));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_results_wait(dsc_cuda_state *s, float *loss, double *sumsq,
                                                   bool *nonfinite) {
    DSC_CUDA_TRY(cudaEventSynchronize((cudaEvent_t)s->results_ready));
    if (loss) *loss = s->results->loss;
    *sumsq = s->results->sumsq;
    *nonfinite = s->results->nonfinite != 0;
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_state_step_div(dsc_cuda_state *s, const dsc_opt_hparams *h,
                                               int64_t step, double prev, double scale,
                                               double clipping) {
    DSC_CUDA_ARG(!s->offload && s->nstate == s->n,
                 "GPU optimizer step: the state is offloaded or a partition");
    DSC_TRY(dsc__cuda_opt_divisor(s->dev_scale, s->sumsq, prev, scale, clipping, s->stream));
    if (s->master16)
        return dsc__cuda_opt_step_bf16(h, step, s->p16, s->g16, moment(s, 0),
                                       moment(s, 1), s->states16, s->n, 1.0f, s->dev_scale,
                                       sr_index(s), s->stream);
    return dsc__cuda_opt_step(h, step, s->master, s->grad, s->m, s->v, s->n, 1.0f, s->dev_scale,
                              s->p16, s->fp16 ? DSC_OPT_OUT_FP16 : DSC_OPT_OUT_BF16, s->stream);
}

extern "C" dsc_status dsc__cuda_state_sumsq(dsc_cuda_state *s, const float *x, size_t n,
                                            float scale, double *sumsq, bool *nonfinite) {
    cudaStream_t st = (cudaStream_t)s->stream;
    DSC_CUDA_TRY(cudaMemsetAsync(s->sumsq, 0, sizeof(double), st));
    DSC_CUDA_TRY(cudaMemsetAsync(s->nonfinite, 0, sizeof(int), st));
    DSC_TRY(dsc__cuda_opt_sumsq(s->sumsq, s->nonfinite, s->scratch, x, n, scale, st));
    return read_norm(s, sumsq, nonfinite);
}

extern "C" dsc_status dsc__cuda_state_step(dsc_cuda_state *s, const dsc_opt_hparams *h,
                                           int64_t step, float grad_scale) {
    DSC_CUDA_ARG(!s->offload, "GPU optimizer step: the state is offloaded (the CPU steps)");
    DSC_CUDA_ARG(s->nstate == s->n, "GPU optimizer step: the state is a partition (step_range)");
    if (s->master16)
        return dsc__cuda_opt_step_bf16(h, step, s->p16, s->g16, moment(s, 0),
                                       moment(s, 1), s->states16, s->n, grad_scale, NULL,
                                       sr_index(s), s->stream);
    return dsc__cuda_opt_step(h, step, s->master, s->grad, s->m, s->v, s->n, grad_scale, NULL,
                              s->p16, s->fp16 ? DSC_OPT_OUT_FP16 : DSC_OPT_OUT_BF16, s->stream);
}

extern "C" dsc_status dsc__cuda_state_step_range(dsc_cuda_state *s, const dsc_opt_hparams *h,
                                                 int64_t step, float grad_scale, const float *g,
                                                 size_t off, size_t count, uint16_t *out16) {
    DSC_CUDA_ARG(!s->offload, "GPU optimizer step: the state is offloaded (the CPU steps)");
    DSC_CUDA_ARG(!s->master16, "GPU optimizer step over a range: not with bf16 master weights");
    DSC_CUDA_ARG(off + count <= s->nstate, "GPU optimizer step: range %zu + %zu outside the "
                 "%zu state elements", off, count, s->nstate);
    if (count == 0) return DSC_OK;
    return dsc__cuda_opt_step(h, step, s->master + off, g, s->m ? s->m + off : NULL,
                              s->v ? s->v + off : NULL, count, grad_scale, NULL, out16,
                              s->fp16 ? DSC_OPT_OUT_FP16 : DSC_OPT_OUT_BF16, s->stream);
}
