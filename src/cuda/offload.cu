// cuda/offload.cu - the bus side of ZeRO-Offload on one GPU (see offload.h).
#include "cuda/offload.h"

#include <stdlib.h> // calloc, free

#include "cuda/common.cuh" // DSC_CUDA_TRY, DSC_CUDA_ARG

enum { EV_DONE, EV_LANDED, EV_UP, EV_KINDS };
enum { SLOT_READY, SLOT_FREE, SLOT_KINDS };

struct dsc_cuda_offload {
    int ngroups, nslots;
    cudaStream_t model, down, up;
    cudaEvent_t *slot_ev; // (SLOT_KINDS * nslots), kind-major
    cudaEvent_t *ev;      // (EV_KINDS * ngroups), kind-major
    bool *uploading;      // (ngroups) up[g] recorded since the last fence
};

// Event `kind` of item i in a kind-major table of n items per kind (groups or slots).
static cudaEvent_t *at(cudaEvent_t *table, int n, int kind, int i) {
    return &table[(size_t)kind * n + i];
}

// Item i of the groups (slot false) or of the weight slots exists.
static dsc_status check(const dsc_cuda_offload *o, int i, bool slot) {
    int n = !o ? 0 : slot ? o->nslots : o->ngroups;
    DSC_CUDA_ARG(o && i >= 0 && i < n, "offload copies: %s %d of %d", slot ? "slot" : "group", i,
                 n);
    return DSC_OK;
}

static dsc_status init(dsc_cuda_offload *o) {
    o->ev = (cudaEvent_t *)calloc((size_t)EV_KINDS * o->ngroups, sizeof *o->ev);
    o->uploading = (bool *)calloc((size_t)o->ngroups, sizeof *o->uploading);
    if (!o->ev || !o->uploading) return dsc__fail(DSC_ERR_OOM, "out of memory");
    DSC_CUDA_TRY(cudaStreamCreateWithFlags(&o->down, cudaStreamNonBlocking));
    DSC_CUDA_TRY(cudaStreamCreateWithFlags(&o->up, cudaStreamNonBlocking));
    for (int k = 0; k < EV_KINDS * o->ngroups; k++)
        DSC_CUDA_TRY(cudaEventCreateWithFlags(&o->ev[k], cudaEventDisableTiming));
    if (o->nslots == 0) return DSC_OK;
    o->slot_ev = (cudaEvent_t *)calloc((size_t)SLOT_KINDS * o->nslots, sizeof *o->slot_ev);
    if (!o->slot_ev) return dsc__fail(DSC_ERR_OOM, "out of memory");
    for (int k = 0; k < SLOT_KINDS * o->nslots; k++)
        DSC_CUDA_TRY(cudaEventCreateWithFlags(&o->slot_ev[k], cudaEventDisableTiming));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_create(dsc_cuda_offload **out, int ngroups, int nslots,
                                               void *model_stream) {
    *out = NULL;
    DSC_CUDA_ARG(ngroups > 0 && nslots >= 0, "offload copies: %d groups, %d slots", ngroups,
                 nslots);
    dsc_cuda_offload *o = (dsc_cuda_offload *)calloc(1, sizeof *o);
    if (!o) return dsc__fail(DSC_ERR_OOM, "out of memory");
    o->ngroups = ngroups;
    o->nslots = nslots;
    o->model = (cudaStream_t)model_stream;
    dsc_status st = init(o);
    if (st != DSC_OK) {
        dsc__cuda_offload_destroy(o);
        return st;
    }
    *out = o;
    return DSC_OK;
}

extern "C" void dsc__cuda_offload_destroy(dsc_cuda_offload *o) {
    if (!o) return;
    if (o->down) (void)cudaStreamSynchronize(o->down);
    if (o->up) (void)cudaStreamSynchronize(o->up);
    for (int k = 0; o->ev && k < EV_KINDS * o->ngroups; k++)
        if (o->ev[k]) (void)cudaEventDestroy(o->ev[k]);
    if (o->down) (void)cudaStreamDestroy(o->down);
    if (o->up) (void)cudaStreamDestroy(o->up);
    for (int k = 0; o->slot_ev && k < SLOT_KINDS * o->nslots; k++)
        if (o->slot_ev[k]) (void)cudaEventDestroy(o->slot_ev[k]);
    free(o->slot_ev);
    free(o->ev);
    free(o->uploading);
    free(o);
}

extern "C" dsc_status dsc__cuda_offload_grads_done(dsc_cuda_offload *o, int g) {
    DSC_TRY(check(o, g, false));
    DSC_CUDA_TRY(cudaEventRecord(*at(o->ev, o->ngroups, EV_DONE, g), o->model));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_grads_copy(dsc_cuda_offload *o, int g, float *host,
                                                   const float *dev, size_t n) {
    DSC_TRY(check(o, g, false));
    DSC_CUDA_TRY(cudaStreamWaitEvent(o->down, *at(o->ev, o->ngroups, EV_DONE, g), 0));
    DSC_CUDA_TRY(cudaMemcpyAsync(host, dev, n * sizeof(float), cudaMemcpyDeviceToHost, o->down));
    DSC_CUDA_TRY(cudaEventRecord(*at(o->ev, o->ngroups, EV_LANDED, g), o->down));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_grads_out(dsc_cuda_offload *o, int g, float *host,
                                                  const float *dev, size_t n) {
    DSC_TRY(dsc__cuda_offload_grads_done(o, g));
    return dsc__cuda_offload_grads_copy(o, g, host, dev, n);
}

extern "C" dsc_status dsc__cuda_offload_weights_wait(dsc_cuda_offload *o, int g) {
    DSC_TRY(check(o, g, false));
    DSC_CUDA_TRY(cudaEventSynchronize(*at(o->ev, o->ngroups, EV_UP, g)));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_grads_wait(dsc_cuda_offload *o, int g) {
    DSC_TRY(check(o, g, false));
    DSC_CUDA_TRY(cudaEventSynchronize(*at(o->ev, o->ngroups, EV_LANDED, g)));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_weights_in(dsc_cuda_offload *o, int g, uint16_t *dev,
                                                   const uint16_t *host, size_t n) {
    DSC_TRY(check(o, g, false));
    DSC_CUDA_TRY(cudaMemcpyAsync(dev, host, n * sizeof(uint16_t), cudaMemcpyHostToDevice, o->up));
    DSC_CUDA_TRY(cudaEventRecord(*at(o->ev, o->ngroups, EV_UP, g), o->up));
    o->uploading[g] = true;
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_fetch(dsc_cuda_offload *o, int k, uint16_t *slot,
                                              const uint16_t *host, size_t n, uint16_t *slot2,
                                              const uint16_t *host2, size_t n2) {
    DSC_TRY(check(o, k, true));
    DSC_CUDA_TRY(cudaStreamWaitEvent(o->up, *at(o->slot_ev, o->nslots, SLOT_FREE, k), 0));
    DSC_CUDA_TRY(cudaMemcpyAsync(slot, host, n * sizeof(uint16_t), cudaMemcpyHostToDevice, o->up));
    if (n2)
        DSC_CUDA_TRY(cudaMemcpyAsync(slot2, host2, n2 * sizeof(uint16_t), cudaMemcpyHostToDevice,
                                     o->up));
    DSC_CUDA_TRY(cudaEventRecord(*at(o->slot_ev, o->nslots, SLOT_READY, k), o->up));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_use(dsc_cuda_offload *o, int k) {
    DSC_TRY(check(o, k, true));
    DSC_CUDA_TRY(cudaStreamWaitEvent(o->model, *at(o->slot_ev, o->nslots, SLOT_READY, k), 0));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_release(dsc_cuda_offload *o, int k) {
    DSC_TRY(check(o, k, true));
    DSC_CUDA_TRY(cudaEventRecord(*at(o->slot_ev, o->nslots, SLOT_FREE, k), o->model));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_reuse_grads(dsc_cuda_offload *o, int g, float *dev,
                                                    size_t n) {
    DSC_TRY(check(o, g, false));
    DSC_CUDA_TRY(cudaStreamWaitEvent(o->model, *at(o->ev, o->ngroups, EV_LANDED, g), 0));
    if (dev) DSC_CUDA_TRY(cudaMemsetAsync(dev, 0, n * sizeof(float), o->model));
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_fence(dsc_cuda_offload *o) {
    for (int g = 0; g < o->ngroups; g++) {
        if (!o->uploading[g]) continue;
        DSC_CUDA_TRY(cudaStreamWaitEvent(o->model, *at(o->ev, o->ngroups, EV_UP, g), 0));
        o->uploading[g] = false;
    }
    return DSC_OK;
}

extern "C" dsc_status dsc__cuda_offload_sync(dsc_cuda_offload *o) {
    DSC_CUDA_TRY(cudaStreamSynchronize(o->down));
    DSC_CUDA_TRY(cudaStreamSynchronize(o->up));
    return DSC_OK;
}
