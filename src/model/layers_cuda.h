// model/layers_cuda.h - the layer driver of the device passes: one loop over a decoder's layers
// for every family on the GPU (the host passes' twin is dsc_model_layers_forward / _backward).
//
// A family's device code supplies its passes as callbacks (embedding, one layer forward, the
// head, and their backwards); the driver owns what is the same for all of them:
// - the order of the layers and the hooks around them (the engine's layer hook before each
//   layer's forward and backward, its gradient hook when a group's gradients are complete);
// - the residual stream between the layers, i.e. each layer's input: kept on the device for
//   every layer, or (activation checkpointing with cpu_checkpointing) in page-locked host memory,
//   copied out on a side stream as the forward goes and back one layer ahead of the backward,
//   the device keeping three blocks;
// - activation checkpointing as a policy: with recompute on, a family carves one block of its
//   other activations for all layers (dsc__dev_layers_block) and the driver reruns layer l's
//   forward from its kept input right before its backward;
// - the training step as one CUDA graph: the first step of a key (batch, loss scale, precision,
//   fresh gradients, the parameter and gradient addresses, and the family's own key bytes) runs
//   eagerly, the second is captured, the rest replay it; never with hooks (they run host code
//   between kernels), where the family says no, or with DSC_GPU_GRAPH=0.
#ifndef DSC_MODEL_LAYERS_CUDA_H
#define DSC_MODEL_LAYERS_CUDA_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint16_t, int64_t

#include "dsc/model.h"  // dsc_model_dev_layers_ops, dsc_model_grad_hook, dsc_model_layer_hook
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// A family's passes and a step's graph key: the public driver's (dsc/model.h), which is this
// one (dsc_model_dev_layers_* wrap these functions).
typedef dsc_model_dev_layers_ops dsc__dev_layers_ops;
typedef dsc_model_dev_step_key dsc__dev_graph_key;
enum { DSC__DEV_KEY_EXTRA = DSC_MODEL_DEV_KEY_EXTRA };

// One captured step: state 0 no step of its key yet, 1 one eager step, 2 captured (exec, or
// NULL where the runtime refused).
typedef struct dsc__dev_graph {
    int state;
    void *exec; // cudaGraphExec_t
    dsc__dev_graph_key key;
    const void **ptrs; // (2, ntensors): the key's parameter and gradient addresses
} dsc__dev_graph;

typedef struct dsc__dev_layers {
    const dsc__dev_layers_ops *ops;
    void *fam;
    void *st; // cudaStream_t, borrowed
    int n_layer, ntensors;
    int recompute;      // 0 off; 1 keep each layer's input on the device; 2 on the host
    int64_t rows_cap;   // rows a block holds (maxB maxT)
    int width;          // the residual stream's width (hidden size)
    int64_t rows;       // the current batch's rows (dsc__dev_layers_set_rows)
    uint16_t *res;      // the residual blocks: L + 1, or 3 with recompute 2 (the family's carve)
    dsc_model_grad_hook hook;
    void *hook_user;
    dsc_model_layer_hook layer_hook;
    void *layer_user;
    // recompute 2: the layers' inputs on the host, the copies' stream and events
    uint16_t *hres;
    void *cst, *ev_main, *ev_out[3], *ev_in[3];
    bool out_pending[3], in_pending[3];
    // the training step's graphs, by fresh: accumulation's first micro-step overwrites, the
    // others add
    bool use_graph;
    dsc__dev_graph graphs[2];
} dsc__dev_layers;

// Bytes of the residual blocks for L layers of rows x width 16-bit values (the family carves
// them and passes the address to dsc__dev_layers_init).
size_t dsc__dev_layers_res_bytes(int recompute, int L, int64_t rows, int width);
// How many blocks of its other per-layer activations a family carves (one for all layers when
// they are recomputed), and which of them layer l uses.
static inline size_t dsc__dev_layers_blocks(int recompute, int L) {
    return dsc_model_dev_layers_blocks(recompute, L);
}
static inline size_t dsc__dev_layers_block(int recompute, int l) {
    return dsc_model_dev_layers_block(recompute, l);
}

// d for a family (ops, fam), L layers, ntensors tensors, the policy recompute, blocks of
// rows_cap x width at res (dsc__dev_layers_res_bytes), on stream; recompute 2 allocates the host
// copy, its stream and events. DSC_ERR_OOM / a CUDA error names what failed; destroy frees what
// init made (also after a failed init of a zeroed d).
dsc_status dsc__dev_layers_init(dsc__dev_layers *d, const dsc__dev_layers_ops *ops, void *fam,
                                int L, int ntensors, int recompute, int64_t rows_cap, int width,
                                uint16_t *res, void *stream);
void dsc__dev_layers_destroy(dsc__dev_layers *d);
void dsc__dev_layers_set_rows(dsc__dev_layers *d, int64_t rows);
// Layer l's input (l = L: the head's), on the device.
uint16_t *dsc__dev_layers_input(const dsc__dev_layers *d, int l);

// The forward: embedding, the layers, the head.
dsc_status dsc__dev_layers_forward(dsc__dev_layers *d, const uint16_t *const *params);
// The backward from the logits' gradients.
dsc_status dsc__dev_layers_backward(dsc__dev_layers *d, const uint16_t *const *params,
                                    float *const *grads);
// The training step (forward, ops->loss, backward) through the graph of its key (see above);
// key: the batch's part and the family's extra bytes (the graph part is filled here).
dsc_status dsc__dev_layers_step(dsc__dev_layers *d, const uint16_t *const *params,
                                float *const *grads, const dsc__dev_graph_key *key);

#ifdef __cplusplus
}
#endif
#endif
