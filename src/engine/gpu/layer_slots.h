// engine/gpu/layer_slots.h - two device slots through which the GPU trainer streams a model's layers'
// 16-bit weights (and, in backward, their gradients) when the device does not hold them all:
// parameter offload (the weights live on the host, train_gpu_offload.c) and ZeRO stage 3 over
// nccl (each GPU holds its slice, train_gpu_dp.c).
//
// The device layout of such a run (dsc__slots_layout): the resident groups (0: the embeddings,
// n_layer + 1: the final norm and head) in group order, then two slots of the largest layer group, for the 16-bit
// weights and the fp32 gradients alike. The model's layer hook (dsc__slots_hook, installed by
// dsc__slots_views) keeps one layer ahead: before layer l's kernels are enqueued the slot of the
// layer before is released, layer l's slot is waited for (fetched first if no slot holds it) and
// the next layer is fetched into the other slot, so the fetch overlaps layer l's compute. In
// backward layer l's gradients go to gradient slot l & 1, which the owner frees first (its last
// gradients sent on) and zeroes. How a fetch, a wait, a release and a gradient slot's reuse are
// done is the owner's (the ops below); this file only decides which and when. Host code, in
// every build.
#ifndef DSC_ENGINE_GPU_LAYER_SLOTS_H
#define DSC_ENGINE_GPU_LAYER_SLOTS_H

#include <stddef.h> // size_t
#include <stdint.h> // uint16_t

#include "dsc/engine.h" // dsc_engine
#include "dsc/model.h"  // dsc_model, dsc_model_device

typedef struct dsc__slots_ops {
    // Start bringing layer `layer`'s weights (engine group layer + 1) into weight slot k. The
    // kernels that read k before were released (below) first.
    dsc_status (*fetch)(void *user, int k, int layer);
    // The model's stream waits for weight slot k's last fetch.
    dsc_status (*use)(void *user, int k);
    // The kernels enqueued on the model's stream so far are the last readers of weight slot k.
    dsc_status (*release)(void *user, int k);
    // Backward: gradient slot j is about to take group g's gradients; `before` is the group that
    // used it last (-1: none). The owner sends `before`'s gradients on if it has not, makes the
    // model's stream wait until the slot may be overwritten, and zeroes it.
    dsc_status (*reuse)(void *user, int j, int before, int g);
} dsc__slots_ops;

typedef struct dsc__slots {
    const dsc__slots_ops *ops;
    void *user;
    int L, ntensors;
    size_t *dev_off; // (n_layer + 2) the resident groups' offsets in the device arrays
    size_t slot_len; // elements of a slot: the largest layer group, padded
    uint16_t *dev16; // the device arrays (dsc__slots_layout's length): resident groups, slots
    float *devgrad;
    uint16_t *w[2];       // weight slots (NULL: the weights are resident, see dsc__slots_init)
    float *g[2];          // gradient slots
    int held[2];          // the layer whose current weights weight slot k holds (-1: none)
    int gheld[2];         // the group whose gradients last used gradient slot j (-1: none)
    int *tgroup;          // (ntensors) each tensor's group
    size_t *tin;          // (ntensors) its offset inside its group
    const uint16_t **p16; // the trainer's view tables (dsc__slots_views), repointed per layer
    float **grad;
    // LoRA's frozen base streamed too (dsc__slots_frozen, parameter offload): a layer's frozen
    // tensors pass through two frozen slots, fetched with its weights into slot k's twin; the
    // end groups' frozen tensors stay in front of the slots in the frozen device array.
    uint16_t *fdev;  // the frozen device array (dsc__slots_frozen_layout), NULL: not streamed
    uint16_t *fw[2]; // its two slots
    size_t fslot_len;
    size_t *fin; // (ntensors) a frozen tensor's offset in its layer's slot, or in fdev
} dsc__slots;

// The device layout above for the engine's groups: its length in elements; dev_off (n_layer + 2
// entries, or NULL) receives the resident groups' offsets, *slot_len (or NULL) a slot's length.
size_t dsc__slots_layout(dsc_engine *eng, int n_layer, size_t *dev_off, size_t *slot_len);

// Slots inside the device arrays p16 and grad of dsc__slots_layout's length n (checked). ops and
// user are borrowed. p16 NULL: the weights stay where the caller keeps them (all on the device;
// bf16 master weights) and only the gradients go through the slots: the hook never fetches,
// waits for or releases weights (ops needs only reuse), and never repoints the p16 table.
dsc_status dsc__slots_init(dsc__slots *s, dsc_engine *eng, const dsc_model *model, uint16_t *p16,
                           float *grad, size_t n, const dsc__slots_ops *ops, void *user);
void dsc__slots_free(dsc__slots *s); // a zeroed or initialised s

// The trainer's per-tensor view tables (ntensors entries each): resident tensors point into the
// device arrays at their group's offset, layer tensors into slot 0 until the hook repoints them.
void dsc__slots_tables(dsc__slots *s, const uint16_t **p16, float **grad);
// The same, and the layer hook installed on the model's device passes.
void dsc__slots_views(dsc__slots *s, dsc_model_device *dev, const uint16_t **p16, float **grad);

// The frozen device array of a run whose frozen tensors stream with the layers: group 0's frozen
// range, group n_layer + 1's, then two slots of the largest layer's. Its length in elements (0
// when nothing is frozen); *slot_len a slot's, end_off[0..1] where the two end groups' ranges
// start in it.
size_t dsc__slots_frozen_layout(dsc_engine *eng, int n_layer, size_t *slot_len,
                                size_t end_off[2]);
// Stream the frozen tensors too, through the array dev of that layout's length n (checked); s
// streams weights (dsc__slots_init with p16). The owner's fetch then fills frozen slot fw[k] with
// the layer's frozen range beside weight slot k; the tables and the hook point the frozen
// tensors into dev.
dsc_status dsc__slots_frozen(dsc__slots *s, dsc_engine *eng, uint16_t *dev, size_t n);

// The model's layer hook (a dsc_model_layer_hook with user s).
dsc_status dsc__slots_hook(void *s, int pass, int layer);

// The layers' weights changed (an optimizer step, a load): no slot holds a current copy.
void dsc__slots_forget(dsc__slots *s);

// Is engine group g one of the layers (streamed through the slots)?
static inline int dsc__slots_layer_group(const dsc__slots *s, int g) {
    return g >= 1 && g <= s->L;
}

#endif
