// model/layers_dev.c - the device layer driver's public face (dsc/model.h, dsc_model_dev_layers_*):
// a handle around the driver the built-in families run on (model/layers_cuda.{h,cu}), and in a
// build without the CUDA kernels the same functions refusing by name.
#include <stdlib.h> // calloc, free

#include "base/status.h" // dsc__fail, DSC_TRY
#include "dsc/model.h"   // dsc_model_dev_layers_*

size_t dsc_model_dev_layers_blocks(int recompute, int L) { return recompute ? 1 : (size_t)L; }
size_t dsc_model_dev_layers_block(int recompute, int l) { return recompute ? 0 : (size_t)l; }
// The residual blocks: every layer's input and the head's, or with recompute 2 (the inputs on the
// host) three (two in flight and the head's).
size_t dsc_model_dev_layers_res_bytes(int recompute, int L, int64_t rows, int width) {
    return (size_t)(recompute == 2 ? 3 : L + 1) * (size_t)rows * (size_t)width * 2;
}

#ifdef DSC_WITH_CUDA

#include "model/layers_cuda.h" // dsc__dev_layers_*

struct dsc_model_dev_layers {
    dsc__dev_layers d;
};

// What a family must give: every pass but the optional two, a stream, blocks of a size.
static dsc_status check(const dsc_model_dev_layers_ops *ops, int L, int ntensors, int recompute,
                        int64_t rows_cap, int width, const uint16_t *res, const void *stream) {
    if (!ops || !ops->embed || !ops->layer_forward || !ops->head || !ops->loss ||
        !ops->head_backward || !ops->layer_backward || !ops->embed_backward)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_dev_layers_create: ops must give embed, "
                         "layer_forward, head, loss, head_backward, layer_backward and "
                         "embed_backward (recomputing and graph_ok may be NULL)");
    if (L < 0 || ntensors < 1 || recompute < 0 || recompute > 2 || rows_cap < 1 || width < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_dev_layers_create: L %d, ntensors %d, "
                         "recompute %d, rows_cap %lld, width %d (expected L >= 0, ntensors >= 1, "
                         "recompute 0, 1 or 2, rows_cap and width >= 1)", L, ntensors, recompute,
                         (long long)rows_cap, width);
    if (!res || !stream)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_dev_layers_create: %s is NULL (the "
                         "residual blocks, dsc_model_dev_layers_res_bytes of them; the family's "
                         "cudaStream_t)", !res ? "res" : "stream");
    return DSC_OK;
}

dsc_status dsc_model_dev_layers_create(dsc_model_dev_layers **out,
                                       const dsc_model_dev_layers_ops *ops, void *fam, int L,
                                       int ntensors, int recompute, int64_t rows_cap, int width,
                                       uint16_t *res, void *stream) {
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_dev_layers_create: out is NULL");
    *out = NULL;
    DSC_TRY(check(ops, L, ntensors, recompute, rows_cap, width, res, stream));
    dsc_model_dev_layers *h = calloc(1, sizeof *h);
    if (!h) return dsc__fail(DSC_ERR_OOM, "dsc_model_dev_layers_create: out of memory");
    dsc_status st = dsc__dev_layers_init(&h->d, ops, fam, L, ntensors, recompute, rows_cap, width,
                                         res, stream);
    if (st != DSC_OK) {
        dsc__dev_layers_destroy(&h->d);
        free(h);
        return st;
    }
    *out = h;
    return DSC_OK;
}

void dsc_model_dev_layers_destroy(dsc_model_dev_layers *h) {
    if (!h) return;
    dsc__dev_layers_destroy(&h->d);
    free(h);
}

void dsc_model_dev_layers_set_grad_hook(dsc_model_dev_layers *h, dsc_model_grad_hook fn,
                                        void *user) {
    h->d.hook = fn;
    h->d.hook_user = user;
}

void dsc_model_dev_layers_set_layer_hook(dsc_model_dev_layers *h, dsc_model_layer_hook fn,
                                         void *user) {
    h->d.layer_hook = fn;
    h->d.layer_user = user;
}

void dsc_model_dev_layers_set_rows(dsc_model_dev_layers *h, int64_t rows) {
    dsc__dev_layers_set_rows(&h->d, rows);
}

uint16_t *dsc_model_dev_layers_input(const dsc_model_dev_layers *h, int l) {
    return dsc__dev_layers_input(&h->d, l);
}

dsc_status dsc_model_dev_layers_forward(dsc_model_dev_layers *h, const uint16_t *const *params) {
    return dsc__dev_layers_forward(&h->d, params);
}

dsc_status dsc_model_dev_layers_backward(dsc_model_dev_layers *h, const uint16_t *const *params,
                                         float *const *grads) {
    return dsc__dev_layers_backward(&h->d, params, grads);
}

dsc_status dsc_model_dev_layers_step(dsc_model_dev_layers *h, const uint16_t *const *params,
                                     float *const *grads, const dsc_model_dev_step_key *key) {
    if (!key) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_dev_layers_step: key is NULL");
    return dsc__dev_layers_step(&h->d, params, grads, key);
}

#else // no CUDA kernels in this build

struct dsc_model_dev_layers {
    int unused;
};

static dsc_status no_cuda(void) {
    return dsc__fail(DSC_ERR_UNSUPPORTED, "dsc_model_dev_layers: this dsc was built without the "
                     "CUDA kernels; build with -DDSC_CUDA=ON (docs/gpu.md)");
}

dsc_status dsc_model_dev_layers_create(dsc_model_dev_layers **out,
                                       const dsc_model_dev_layers_ops *ops, void *fam, int L,
                                       int ntensors, int recompute, int64_t rows_cap, int width,
                                       uint16_t *res, void *stream) {
    (void)ops, (void)fam, (void)L, (void)ntensors, (void)recompute, (void)rows_cap, (void)width;
    (void)res, (void)stream;
    if (out) *out = NULL;
    return no_cuda();
}

void dsc_model_dev_layers_destroy(dsc_model_dev_layers *h) { free(h); }

void dsc_model_dev_layers_set_grad_hook(dsc_model_dev_layers *h, dsc_model_grad_hook fn,
                                        void *user) {
    (void)h, (void)fn, (void)user;
}

void dsc_model_dev_layers_set_layer_hook(dsc_model_dev_layers *h, dsc_model_layer_hook fn,
                                         void *user) {
    (void)h, (void)fn, (void)user;
}

void dsc_model_dev_layers_set_rows(dsc_model_dev_layers *h, int64_t rows) { (void)h, (void)rows; }

uint16_t *dsc_model_dev_layers_input(const dsc_model_dev_layers *h, int l) {
    (void)h, (void)l;
    return NULL;
}

dsc_status dsc_model_dev_layers_forward(dsc_model_dev_layers *h, const uint16_t *const *params) {
    (void)h, (void)params;
    return no_cuda();
}

dsc_status dsc_model_dev_layers_backward(dsc_model_dev_layers *h, const uint16_t *const *params,
                                         float *const *grads) {
    (void)h, (void)params, (void)grads;
    return no_cuda();
}

dsc_status dsc_model_dev_layers_step(dsc_model_dev_layers *h, const uint16_t *const *params,
                                     float *const *grads, const dsc_model_dev_step_key *key) {
    (void)h, (void)params, (void)grads, (void)key;
    return no_cuda();
}

#endif
