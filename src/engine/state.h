// engine/state.h - what a checkpoint needs of the engine: its layout, this rank's partition of
// the training state, the scalar state; and the way back in.
//
// Every rank saves the same thing at every ZeRO stage: slice `rank` of every layer group of the
// fp32 master weights and of the optimizer moments (at stage 0 every rank holds everything, and
// still saves only its slice), so a checkpoint's format does not depend on the stage. Group g is
// the padded range [off, off + padded) of the flat layout; slice r of it is
// [off + r * slice, off + (r + 1) * slice). Parameter p lives at [p.off, p.off + numel).
#ifndef DSC_ENGINE_STATE_H
#define DSC_ENGINE_STATE_H

#include <stdbool.h> // bool
#include <stddef.h> // size_t
#include <stdint.h> // int64_t

#include "dsc/engine.h" // dsc_engine

typedef struct dsc_state_param {
    const char *name; // borrowed from the engine
    int ndim;
    int64_t shape[DSC_PARAM_MAX_DIMS];
    int64_t numel;
    int group;
    size_t off; // in the flat layout
} dsc_state_param;

typedef struct dsc_state_group {
    size_t off, padded, slice;
} dsc_state_group;

typedef struct dsc_state_layout {
    int world, rank, stage;
    const char *precision;   // "fp32", "fp16", "bf16"
    const char *optimizer;   // "adam", "adamw", "sgd", "lion"
    const char *master_precision;  // "fp32", or "bf16" (bf16.bf16_master_weights_and_grads)
    const char *moments_precision; // "fp32", or "bf16" (bf16.bf16_optimizer_states)
    int nmoments;            // 2 (Adam/AdamW: exp_avg, exp_avg_sq), 1 (SGD momentum, Lion)
    int nparams, ngroups;
    size_t total;            // flat layout length
} dsc_state_layout;

// The scalars that, with the partitions, make training continue bitwise.
typedef struct dsc_state_scalars {
    int64_t global_steps, applied_steps, skipped_steps;
    // loss scaler
    double cur_scale;
    int64_t cur_iter, last_overflow_iter;
    int cur_hysteresis;
} dsc_state_scalars;

void dsc__state_layout(const dsc_engine *e, dsc_state_layout *out);
void dsc__state_param(const dsc_engine *e, int i, dsc_state_param *out);
void dsc__state_group(const dsc_engine *e, int g, dsc_state_group *out);

// This rank's slice of group g: master weights and moment k (0 <= k < nmoments); `slice`
// elements each; borrowed. Valid between optimizer steps; the caller copies them out.
// NULL where the state lives on the device (dsc__state_on_host false): read it with
// dsc__state_read.
const float *dsc__state_master_slice(dsc_engine *e, int g);
const float *dsc__state_moment_slice(dsc_engine *e, int g, int k);
// Whether the slices above are host memory (false: one GPU holds master and moments,
// dsc_engine_opts.device_state).
bool dsc__state_on_host(const dsc_engine *e);
// Elements [begin, begin + n) of this rank's slice of group g of kind (0 master, 1 + k moment k)
// into dst, as fp32, wherever the state lives (from the device in one copy of n elements).
dsc_status dsc__state_read(dsc_engine *e, int kind, int g, size_t begin, size_t n, float *dst);

void dsc__state_scalars_get(const dsc_engine *e, dsc_state_scalars *out);

// Loading. Call at a step boundary (no micro-step in progress), on every rank:
//   1. dsc__state_scalars_set
//   2. for every group g: dsc__state_load_slice(e, g, master, moments) with this rank's slice of
//      group g in the engine's (new) layout, taken from the full flat tensors the caller
//      rebuilt from the checkpoint's shards (any world size / stage); `moments` holds nmoments
//      pointers. All `slice` elements are copied; with bf16 master weights (optimizer states)
//      they are rounded to nearest even bf16 as they are copied (exact for a bf16 checkpoint).
//   3. dsc__state_load_done: re-derives compute copies and gathers (a collective).
dsc_status dsc__state_scalars_set(dsc_engine *e, const dsc_state_scalars *in);
dsc_status dsc__state_load_slice(dsc_engine *e, int g, const float *master, const float *const *moments);
// The same for elements [begin, begin + n) of the slice only (a large group in pieces).
dsc_status dsc__state_load_range(dsc_engine *e, int g, size_t begin, size_t n,
                                 const float *master, const float *const *moments);
dsc_status dsc__state_load_done(dsc_engine *e);
// Step 2 for every group, in pieces of at most 16 Mi elements of each kind (a vocabulary's group
// is gigabytes, and the state may live on a device: no whole copy on the host): fill writes
// elements [b0, b1) of this rank's slice of group g for nkinds kinds (master, then the moments;
// nkinds >= 1 + nmoments) into dst[k], which are then loaded. Stops at the first failure.
typedef dsc_status (*dsc__state_fill_fn)(void *user, int g, size_t b0, size_t b1, float **dst);
dsc_status dsc__state_load_pieces(dsc_engine *e, int nkinds, dsc__state_fill_fn fill, void *user);

// The engine's communicator (NULL on one rank), for checkpoint barriers and checksum exchange.
struct dsc_comm *dsc__state_comm(dsc_engine *e);

#endif
