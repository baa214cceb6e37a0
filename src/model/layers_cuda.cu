// model/layers_cuda.cu - the layer driver of the device passes (see layers_cuda.h).
#include "model/layers_cuda.h"

#include <stdlib.h> // calloc, free
#include <string.h> // memcmp, memcpy, memset

extern "C" {
#include "base/env.h" // dsc__env_is (a C header with its own extern "C")
#include "base/log.h" // DSC_WARN
}

#include "cuda/common.cuh" // DSC_CUDA_TRY, DSC_TRY

static cudaStream_t stream_of(const dsc__dev_layers *d) { return (cudaStream_t)d->st; }

extern "C" size_t dsc__dev_layers_res_bytes(int recompute, int L, int64_t rows, int width) {
    return dsc_model_dev_layers_res_bytes(recompute, L, rows, width); // (layers_dev.c)
}

extern "C" dsc_status dsc__dev_layers_init(dsc__dev_layers *d, const dsc__dev_layers_ops *ops,
                                           void *fam, int L, int ntensors, int recompute,
                                           int64_t rows_cap, int width, uint16_t *res,
                                           void *stream) {
    memset(d, 0, sizeof *d);
    d->ops = ops, d->fam = fam, d->st = stream;
    d->n_layer = L, d->ntensors = ntensors, d->recompute = recompute;
    d->rows_cap = rows_cap, d->width = width, d->rows = rows_cap, d->res = res;
    d->use_graph = !dsc__env_is(DSC_ENV_GPU_GRAPH, "0");
    for (int k = 0; k < 2; k++) {
        d->graphs[k].ptrs = (const void **)calloc(2 * (size_t)ntensors, sizeof(void *));
        if (!d->graphs[k].ptrs) d->use_graph = false;
    }
    if (recompute != 2) return DSC_OK;
    size_t bytes = (size_t)L * rows_cap * width * 2;
    DSC_CUDA_TRY(cudaMallocHost((void **)&d->hres, bytes ? bytes : 2));
    DSC_CUDA_TRY(cudaStreamCreateWithFlags((cudaStream_t *)&d->cst, cudaStreamNonBlocking));
    DSC_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&d->ev_main, cudaEventDisableTiming));
    for (int k = 0; k < 3; k++) {
        DSC_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&d->ev_out[k],
                                              cudaEventDisableTiming));
        DSC_CUDA_TRY(cudaEventCreateWithFlags((cudaEvent_t *)&d->ev_in[k],
                                              cudaEventDisableTiming));
    }
    return DSC_OK;
}

extern "C" void dsc__dev_layers_destroy(dsc__dev_layers *d) {
    if (!d) return;
    for (int k = 0; k < 2; k++) {
        if (d->graphs[k].exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)d->graphs[k].exec);
        free(d->graphs[k].ptrs);
    }
    if (d->cst) (void)cudaStreamSynchronize((cudaStream_t)d->cst);
    if (d->hres) (void)cudaFreeHost(d->hres);
    if (d->cst) (void)cudaStreamDestroy((cudaStream_t)d->cst);
    if (d->ev_main) (void)cudaEventDestroy((cudaEvent_t)d->ev_main);
    for (int k = 0; k < 3; k++) {
        if (d->ev_out[k]) (void)cudaEventDestroy((cudaEvent_t)d->ev_out[k]);
        if (d->ev_in[k]) (void)cudaEventDestroy((cudaEvent_t)d->ev_in[k]);
    }
    memset(d, 0, sizeof *d);
}

extern "C" void dsc__dev_layers_set_rows(dsc__dev_layers *d, int64_t rows) { d->rows = rows; }

static uint16_t *block(const dsc__dev_layers *d, int k) {
    return d->res + (size_t)k * d->rows_cap * d->width;
}

extern "C" uint16_t *dsc__dev_layers_input(const dsc__dev_layers *d, int l) {
    return block(d, d->recompute == 2 ? l % 3 : l);
}

// ---- the layers' inputs on the host (recompute 2) ----

static uint16_t *host_input(const dsc__dev_layers *d, int j) {
    return d->hres + (size_t)j * d->rows_cap * d->width;
}

// The side stream starts after what the main stream has enqueued so far.
static dsc_status side_after_main(dsc__dev_layers *d) {
    DSC_CUDA_TRY(cudaEventRecord((cudaEvent_t)d->ev_main, stream_of(d)));
    DSC_CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)d->cst, (cudaEvent_t)d->ev_main, 0));
    return DSC_OK;
}

// Layer j's input between residual block j % 3 and its host copy, on the side stream once the
// main stream has enqueued what it needs done first: out (forward: input(j) is complete) or back
// in (backward: the main stream is done with that block).
static dsc_status copy_input(dsc__dev_layers *d, int j, bool out) {
    if (d->recompute != 2 || j < 0) return DSC_OK;
    int k = j % 3;
    void *dev = block(d, k), *host = host_input(d, j);
    DSC_TRY(side_after_main(d));
    DSC_CUDA_TRY(cudaMemcpyAsync(out ? host : dev, out ? dev : host,
                                 (size_t)d->rows * d->width * 2,
                                 out ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                 (cudaStream_t)d->cst));
    DSC_CUDA_TRY(cudaEventRecord((cudaEvent_t)(out ? d->ev_out[k] : d->ev_in[k]),
                                 (cudaStream_t)d->cst));
    (out ? d->out_pending : d->in_pending)[k] = true;
    return DSC_OK;
}

// Residual block k is about to be written on the main stream: its copies must be done.
static dsc_status block_free(dsc__dev_layers *d, int k) {
    if (d->recompute != 2) return DSC_OK;
    if (d->out_pending[k])
        DSC_CUDA_TRY(cudaStreamWaitEvent(stream_of(d), (cudaEvent_t)d->ev_out[k], 0));
    if (d->in_pending[k])
        DSC_CUDA_TRY(cudaStreamWaitEvent(stream_of(d), (cudaEvent_t)d->ev_in[k], 0));
    d->out_pending[k] = d->in_pending[k] = false;
    return DSC_OK;
}

// Before layer j's backward: its input is back.
static dsc_status input_back(dsc__dev_layers *d, int j) {
    int k = j % 3;
    if (d->recompute != 2 || !d->in_pending[k]) return DSC_OK;
    DSC_CUDA_TRY(cudaStreamWaitEvent(stream_of(d), (cudaEvent_t)d->ev_in[k], 0));
    d->in_pending[k] = false;
    return DSC_OK;
}

// ---- the passes ----

static dsc_status before_layer(const dsc__dev_layers *d, int pass, int layer) {
    return d->layer_hook ? d->layer_hook(d->layer_user, pass, layer) : DSC_OK;
}

static dsc_status group_done(const dsc__dev_layers *d, int group) {
    return d->hook ? d->hook(d->hook_user, group) : DSC_OK;
}

extern "C" dsc_status dsc__dev_layers_forward(dsc__dev_layers *d, const uint16_t *const *params) {
    int L = d->n_layer;
    DSC_TRY(block_free(d, 0));
    DSC_TRY(d->ops->embed(d->fam, params));
    if (L > 0) DSC_TRY(copy_input(d, 0, true));
    for (int l = 0; l < L; l++) {
        DSC_TRY(before_layer(d, 0, l));
        DSC_TRY(block_free(d, (l + 1) % 3)); // (recompute 2: input(l - 2) was there)
        DSC_TRY(d->ops->layer_forward(d->fam, params, l));
        if (l + 1 < L) DSC_TRY(copy_input(d, l + 1, true));
    }
    DSC_TRY(before_layer(d, 0, L));
    return d->ops->head(d->fam, params);
}

extern "C" dsc_status dsc__dev_layers_backward(dsc__dev_layers *d, const uint16_t *const *params,
                                               float *const *grads) {
    int L = d->n_layer;
    DSC_TRY(d->ops->head_backward(d->fam, params, grads));
    DSC_TRY(group_done(d, L + 1));
    for (int l = L - 1; l >= 0; l--) {
        DSC_TRY(before_layer(d, 1, l));
        // activation checkpointing: the layer's forward again, into the shared block, from its
        // kept input; the same kernels give the same activations (recompute 2: the input came
        // back from the host, and input(l + 1) is rewritten with its own bits)
        DSC_TRY(input_back(d, l));
        DSC_TRY(block_free(d, (l + 1) % 3));
        if (d->recompute) {
            if (d->ops->recomputing) d->ops->recomputing(d->fam, true);
            dsc_status st = d->ops->layer_forward(d->fam, params, l);
            if (d->ops->recomputing) d->ops->recomputing(d->fam, false);
            DSC_TRY(st);
        }
        DSC_TRY(d->ops->layer_backward(d->fam, params, grads, l));
        DSC_TRY(copy_input(d, l - 2, false)); // into block (l + 1) % 3, which l no longer reads
        DSC_TRY(group_done(d, l + 1));
    }
    DSC_TRY(before_layer(d, 1, -1));
    DSC_TRY(d->ops->embed_backward(d->fam, params, grads));
    return group_done(d, 0);
}

// ---- the training step as a CUDA graph ----

static dsc_status enqueue_step(dsc__dev_layers *d, const uint16_t *const *params,
                               float *const *grads, float loss_scale) {
    DSC_TRY(dsc__dev_layers_forward(d, params));
    DSC_TRY(d->ops->loss(d->fam, loss_scale));
    return dsc__dev_layers_backward(d, params, grads);
}

// Hooks run host code between kernels (collectives, gathers), and the host copies of
// recompute 2 wait on events across streams: those steps stay eager.
static bool graph_allowed(const dsc__dev_layers *d) {
    return d->use_graph && !d->hook && !d->layer_hook && d->recompute != 2 &&
           (!d->ops->graph_ok || d->ops->graph_ok(d->fam));
}

static bool same_key(const dsc__dev_layers *d, const dsc__dev_graph *g,
                     const dsc__dev_graph_key *k, const uint16_t *const *params,
                     float *const *grads) {
    size_t nt = (size_t)d->ntensors;
    return memcmp(&g->key, k, sizeof *k) == 0 &&
           memcmp(g->ptrs, params, nt * sizeof(void *)) == 0 &&
           memcmp(g->ptrs + nt, grads, nt * sizeof(void *)) == 0;
}

// Capture the step into g->exec. Anything the runtime refuses leaves graphs off for this
// model: the caller then runs the step eagerly, with the same results.
static void capture(dsc__dev_layers *d, dsc__dev_graph *g, const uint16_t *const *params,
                    float *const *grads, float loss_scale) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamBeginCapture(stream_of(d), cudaStreamCaptureModeThreadLocal);
    if (e == cudaSuccess) {
        dsc_status st = enqueue_step(d, params, grads, loss_scale);
        e = cudaStreamEndCapture(stream_of(d), &graph);
        if (st != DSC_OK && e == cudaSuccess) e = cudaErrorUnknown;
    }
    if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (graph) (void)cudaGraphDestroy(graph);
    g->exec = e == cudaSuccess ? (void *)exec : NULL;
    if (e == cudaSuccess) return;
    DSC_WARN("gpu", "the training step could not be captured as a CUDA graph (%s); each step "
             "launches its kernels one by one from now on (same results, a little slower)",
             cudaGetErrorString(e));
    (void)cudaGetLastError();
    dsc_clear_error();
    d->use_graph = false;
}

extern "C" dsc_status dsc__dev_layers_step(dsc__dev_layers *d, const uint16_t *const *params,
                                           float *const *grads, const dsc__dev_graph_key *key) {
    if (!graph_allowed(d)) return enqueue_step(d, params, grads, key->loss_scale);
    dsc__dev_graph_key k;
    memset(&k, 0, sizeof k); // padding too: keys are compared with memcmp
    k.B = key->B, k.T = key->T, k.ntargets = key->ntargets, k.loss_scale = key->loss_scale;
    k.fp16 = key->fp16, k.fresh = key->fresh, k.pos = key->pos;
    memcpy(k.extra, key->extra, sizeof k.extra);
    dsc__dev_graph *g = &d->graphs[k.fresh];
    if (g->state > 0 && !same_key(d, g, &k, params, grads)) {
        if (g->exec) (void)cudaGraphExecDestroy((cudaGraphExec_t)g->exec);
        g->exec = NULL;
        g->state = 0;
    }
    if (g->state == 0) { // eagerly: the products' algorithm choices are made and cached
        DSC_TRY(enqueue_step(d, params, grads, k.loss_scale));
        size_t nt = (size_t)d->ntensors;
        memcpy(g->ptrs, params, nt * sizeof(void *));
        memcpy(g->ptrs + nt, grads, nt * sizeof(void *));
        g->key = k, g->state = 1;
        return DSC_OK;
    }
    if (g->state == 1) {
        capture(d, g, params, grads, k.loss_scale);
        g->state = 2;
        if (!g->exec) return enqueue_step(d, params, grads, k.loss_scale);
    }
    DSC_CUDA_TRY(cudaGraphLaunch((cudaGraphExec_t)g->exec, stream_of(d)));
    return DSC_OK;
}
