// engine/device.h - the engine's side of training whose arithmetic runs on a device
// (`dsc train --device cuda`, any ZeRO stage). On one rank every stage keeps the whole flat layout
// and the device may own the state (dsc__engine_flat_state). On several ranks sharing devices
// (host-staged) the device only runs forward and backward: each micro-step's gradients are handed
// to the engine (dsc__engine_add_grads), the engine's own dsc_step reduces them and runs the
// optimizer on the host, and dsc__engine_gather_master gives the device its new weights. On
// several ranks with a GPU each and the nccl backend (data-parallel on the devices), the devices
// reduce the gradients among themselves and own this rank's optimizer state, laid out as the
// engine's partitions (dsc__engine_dp_layout); the engine's host copies are refreshed for
// checkpoints.
//
// The engine stays the owner of everything the config decides and everything a checkpoint
// records: optimizer hyper-parameters, the LR schedule, clipping, the loss scaler and the step
// counters. The device holds the working copies of the weights, gradients and moments and runs the
// arithmetic; at each optimizer-step boundary it reports the gradients' sum of squares, and
// dsc__engine_device_step makes exactly the decisions dsc_step makes (skip on fp16 overflow,
// scaler update, clipping coefficient, this step's lr and betas) and returns them. The engine's
// host buffers hold the same flat layout and are refreshed from the device when a checkpoint or
// an export needs them.
#ifndef DSC_ENGINE_DEVICE_H
#define DSC_ENGINE_DEVICE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t

#include "dsc/comm.h"           // dsc_dtype
#include "dsc/engine.h"         // dsc_engine, dsc_step_info
#include "engine/optim/optim.h" // dsc_opt_hparams

// Streamed ZeRO-Offload on one GPU (offload_optimizer "cpu", one rank, a model on a device,
// DSC_OFFLOAD_STREAM not 0; with offload_param only at one micro-step per step without clipping
// or fp16): the device trainer hands each group's gradients from the device to the CPU optimizer
// through a few page-locked slots, so the engine keeps no gradient buffers (4 bytes per parameter
// less; 8 at stages 0-1 with accumulation). The memory plan asks the same question. device: the
// model computes on a device (no_compute_copy).
bool dsc__engine_grads_streamed(const dsc_config *c, int world, bool device);
// The engine keeps no host gradient buffer: the streamed ZeRO-Offload above, or (with
// dsc_engine_opts.device_grads, as dsc train sets it) one GPU with the optimizer on it (no
// offload_optimizer, not the nccl path), whose gradients never leave the device but for
// --dump-grads (copied into a temporary buffer then). The memory plan asks the same question
// (for dsc train).
bool dsc__engine_keeps_no_grads(const dsc_config *c, int world, bool device);
// With dsc_engine_opts.device_state: the engine keeps no master weights or moments either (the
// one-GPU case above with the optimizer on the device, not streamed ZeRO-Offload), unless
// DSC_DEVICE_STATE=0 asks for the host copy. The memory plan asks the same question (for dsc
// train).
bool dsc__engine_keeps_no_state(const dsc_config *c, int world, bool device);

// Where the state lives when the engine keeps none (dsc__engine_keeps_no_state): kind 0 is the
// master weights, 1 + k moment k; off and n are elements of the flat layout. read gives n fp32
// values (bf16 state widened exactly); write takes n fp32 values (rounded to nearest even where
// the state is bf16) and, for the master, makes the device's 16-bit copy of them. Kind
// DSC__STATE_FROZEN is LoRA's frozen base (off: in the frozen store's layout, kept in the compute
// type: written rounded to it, read widened exactly). Both are
// done when they return. The device trainer registers it at its creation (user: the trainer);
// until then the engine's readers and writers of the state fail, naming the order to call in.
// Two more kinds: the frozen tensors (offsets in their own store), and the step's accumulated
// gradients (flat offsets, carrying the loss scale; read only, between the backward and the step).
enum { DSC__STATE_FROZEN = -1, DSC__STATE_GRAD = -2 };
typedef struct dsc__state_source {
    void *user;
    dsc_status (*read)(void *user, int kind, size_t off, size_t n, float *dst);
    dsc_status (*write)(void *user, int kind, size_t off, size_t n, const float *src);
} dsc__state_source;
void dsc__engine_set_state_source(dsc_engine *e, const dsc__state_source *src); // NULL: none

// The engine's flat host state (borrowed; stable for the engine's life on one rank).
typedef struct dsc__engine_flat {
    size_t total;         // elements incl. padding
    float *master;        // (total) fp32 master weights; NULL (and m, v) when the engine keeps
                          // no state (dsc__engine_keeps_no_state)
    float *acc;           // (total) accumulated gradients that dsc_step's optimizer reads; NULL
                          // when dsc__engine_grads_streamed
    float *m, *v;         // (total) optimizer moments; v NULL for SGD and Lion
} dsc__engine_flat;

// DSC_ERR_UNSUPPORTED (naming what to change) unless the engine runs on one rank. Gradients
// written into acc before the last micro-step's dsc_step (with no gathers or dsc_grads_ready in
// that step) are what dsc_step reduces, clips and applies.
dsc_status dsc__engine_flat_state(dsc_engine *e, dsc__engine_flat *out);
// Element offset of tensor i (the caller's index) in the flat layout; SIZE_MAX for a frozen
// tensor (LoRA's base), which is not in it.
size_t dsc__engine_param_offset(const dsc_engine *e, int i);
// The frozen tensors' values (LoRA's base; rounded to the compute type once, never changed): the
// engine's host store of *len elements (NULL, 0 when none is frozen), whole on every rank, and
// tensor i's offset in it (SIZE_MAX for a trained tensor). With the state on the device the
// store is NULL and *len its size: the device keeps them (DSC__STATE_FROZEN).
const float *dsc__engine_frozen_store(const dsc_engine *e, size_t *len);
// Partitioned frozen tensors (ZeRO stage 3 on several ranks, zero/frozen.c: the store above is
// then NULL): every layer group's frozen range gathered in turn (collective) and handed to put
// (off, n: a range of the frozen layout), which a device trainer uploads; nothing otherwise.
bool dsc__engine_frozen_parted(const dsc_engine *e);
int64_t dsc__engine_tensor_numel(const dsc_engine *e, int i); // trainable or frozen
typedef dsc_status (*dsc__frozen_put_fn)(void *user, size_t off, size_t n, float *values);
dsc_status dsc__engine_frozen_gathered(dsc_engine *e, dsc__frozen_put_fn put, void *user);
size_t dsc__engine_frozen_offset(const dsc_engine *e, int i);
// Group g's frozen range whole (padded, from its offset in the frozen layout) to put: from the
// whole store, or at stage 3 on several ranks all-gathered (a collective: every rank asks for the
// same groups in the same order). Fails where the host holds no form of it (the device does).
dsc_status dsc__engine_frozen_group(dsc_engine *e, int g, dsc__frozen_put_fn put, void *user);
// This rank's slice of group g's frozen range on the host, in the compute type: *len elements,
// which the world's slices, rank by rank, lay out as the padded range (stage 3 on several ranks:
// this rank's partition; one rank: the whole range). NULL (and *len 0) where the host holds no
// such slice: the store is whole on several ranks (ranks that would all-gather it would get
// world copies), or the device keeps the base.
const float *dsc__engine_frozen_own(const dsc_engine *e, int g, size_t *len);
// Group g's range of the frozen store's layout (zero/frozen.c: the groups in order, each padded):
// *off and *padded elements (0, 0 when nothing is frozen).
void dsc__engine_frozen_span(const dsc_engine *e, int g, size_t *off, size_t *padded);
// The fp16 loss scale the next backward carries (1 without fp16).
double dsc__engine_loss_scale(const dsc_engine *e);
// The master weights were written from outside (device -> host): refresh the compute copy.
dsc_status dsc__engine_master_changed(dsc_engine *e);
// The device is at PHASE ("forward", "backward": a static string) of the current micro-step: what
// the step deadline's report names, and where DSC_FT_INJECT's points of that name act (the device
// paths do not call dsc_gather, which marks them on the host path).
void dsc__engine_phase(dsc_engine *e, const char *phase);

// Several ranks (host-staged). Elements of the full flat layout (padding included), the same on
// every rank; tensor i starts at dsc__engine_param_offset(e, i).
size_t dsc__engine_layout_len(const dsc_engine *e);
// One micro-step's gradients, full layout (len elements, scaled as dsc_backward_scale says),
// given to the engine as a backward would give them: every group is gathered, its tensors'
// gradients added into dsc_param_grad and its reduction started (dsc_grads_ready), last group
// first. Call once per micro-step, before that micro-step's dsc_step. A collective at stage 3
// (the gathers) and wherever the reductions are.
dsc_status dsc__engine_add_grads(dsc_engine *e, const float *grads);
// The full fp32 master weights into out (len elements, padding included): a copy at stage 0,
// one all-gather per group at stages 1-3 (a collective: every rank calls it).
dsc_status dsc__engine_gather_master(dsc_engine *e, float *out);

// ---- data-parallel on the devices (several ranks, one GPU each, nccl) ----

// Where group g's optimizer state of this rank lies: in the full layout the group spans
// [off, off + padded) and rank r owns [off + r * slice, off + (r + 1) * slice); this rank's
// master, m and v of the group are state_len elements at state_off of the state arrays (stage 0:
// the whole group at its full-layout offset; stages 1-3: its slice at the partition offset).
typedef struct dsc__engine_span {
    size_t off, padded, slice;
    size_t state_off, state_len;
} dsc__engine_span;

typedef struct dsc__engine_dp {
    int stage, rank, world, ngroups;
    size_t total;      // full layout length (padding included)
    size_t state_len;  // this rank's master / m / v: total at stage 0, the partition at 1-3
    float *m, *v;      // (state_len) the engine's host moments (borrowed; v NULL for SGD, Lion)
    dsc_dtype comm_dt; // communication_data_type (default: the training dtype)
    double pre, post;  // DeepSpeed's scaling of the reduction: divide by pre before the sum,
                       // multiply by post (= pre / world) after
} dsc__engine_dp;

// The layout above; group g's span from dsc__engine_span_of.
dsc_status dsc__engine_dp_layout(dsc_engine *e, dsc__engine_dp *out);
void dsc__engine_span_of(const dsc_engine *e, int g, dsc__engine_span *out);
// This rank's fp32 master of group g (state_len elements of the span; borrowed). Host buffer.
float *dsc__engine_master_of(dsc_engine *e, int g);
// The backend the engine's own (host) communicator uses: DSC_COMM_BACKEND, or with "nccl" there,
// DSC_HOST_COMM_BACKEND, else "shm".
const char *dsc__engine_host_backend(void);

// Fault tolerance on a device path that keeps the training state on the device (nccl
// data-parallel), as dsc_step does it on the host, with the copy off the critical path:
//   after the optimizer of step s: buf = dsc__engine_ft_reserve (NULL: no fault tolerance), and
//     the device copies its packed state into buf asynchronously: this rank's master, then the
//     moments, each the partition's (state_len) elements, which is the device layout;
//   in step s + 1, before the norm's collective, once that copy is complete:
//     dsc__engine_ft_commit_end (the replicas of step s - 1 are whole everywhere before any rank
//     passes the collective), then dsc__engine_ft_publish (boundary s tagged, its replica sent to
//     the buddy rank).
// After a fault the caller stops its copy and calls dsc__engine_ft_cancel before recovering.
// dsc__engine_ft_floats: the floats of one snapshot (0: several ranks with on_failure other
// than abort are needed). dsc__engine_ft_own_external: the two own snapshots live in the
// caller's buffers (page-locked, for the copy; each dsc__engine_ft_floats long) or, with NULL,
// in the engine's pool again (their contents copied); a recovery on fewer ranks moves them back
// into the pool itself.
size_t dsc__engine_ft_floats(const dsc_engine *e);
dsc_status dsc__engine_ft_own_external(dsc_engine *e, float *const bufs[2]);
// On one node the engine's own slots are shared with the buddy (its replica is the snapshot
// itself, nothing is sent): true and their addresses (page-aligned, stable until the next
// recovery or the engine's end), which the caller page-locks and copies into instead of bringing
// buffers of its own (unlock them before a recovery and before dsc_engine_destroy).
bool dsc__engine_ft_own_shared(dsc_engine *e, float *bufs[2]);
// At the end of a run: the caller's own slots are forgotten (after the exchange reading them),
// so that it may free them; no copy back (the engine snapshots nothing more).
void dsc__engine_ft_own_drop(dsc_engine *e);
dsc_status dsc__engine_ft_commit_end(dsc_engine *e);
float *dsc__engine_ft_reserve(dsc_engine *e);
dsc_status dsc__engine_ft_publish(dsc_engine *e);
void dsc__engine_ft_cancel(dsc_engine *e);
// DSC_FT_SAVE_STATE (a test hook, docs/fault-tolerance.md): whether it is set, and the file of
// this boundary from the engine's host buffers (the caller copies the device state there first).
bool dsc__engine_save_state_wanted(void);
dsc_status dsc__engine_save_state(dsc_engine *e);

// --dump-grads on a device path: whether a gradient observer (dsc_engine_observe_grads) waits
// for this step; the host accumulator that dsc_engine_full_grad reads (*len elements: the full
// layout at stages 0-1, this rank's partition at 2-3), into which the caller copies the step's
// reduced, accumulated gradients (carrying the loss scale); then the observer runs as dsc_step
// would run it (a collective at ZeRO 2-3) and the accumulator is zeroed again.
bool dsc__engine_grads_observed(const dsc_engine *e);
float *dsc__engine_grad_acc(dsc_engine *e, size_t *len);
dsc_status dsc__engine_observe_device_grads(dsc_engine *e);
// The same for a caller that keeps the step's gradients in that accumulator (dsc_step's host
// step; ZeRO-Offload from a device: the CPU optimizer reads them next): the observer runs, the
// accumulator stays.
dsc_status dsc__engine_observe_host_grads(dsc_engine *e);
// The same for an engine without gradient buffers (dsc__engine_grads_streamed): grads holds the
// step's accumulated gradients in the flat layout (total elements, carrying the loss scale) for
// the observer's reads; the engine keeps no pointer to it after. grads NULL with the state on the
// device: the observer's reads come from there, one tensor at a time (DSC__STATE_GRAD).
dsc_status dsc__engine_observe_grads_in(dsc_engine *e, float *grads);

// ---- one step routine for host and device ----
//
// dsc_step is the one step call: with a device trainer attached (dsc_device_trainer_create
// attaches itself, destroy detaches it) it runs the trainer's step, which makes its decisions
// here; otherwise the host step. A device path that steps on the host (several ranks staged
// through host buffers, the whole-gradient offload) calls dsc__engine_host_step itself.
// attach: fn NULL detaches. detach: only where user is the one attached.
typedef dsc_status (*dsc__engine_device_fn)(void *user, dsc_step_info *info);
void dsc__engine_attach_device(dsc_engine *e, dsc__engine_device_fn fn, void *user);
void dsc__engine_detach_device(dsc_engine *e, const void *user);
bool dsc__engine_device_attached(const dsc_engine *e);
dsc_status dsc__engine_host_step(dsc_engine *e, dsc_step_info *info);
//
// The engine keeps the accumulation position (which micro-step of the optimizer step runs) for
// dsc_step and every device path alike; a recovery or a loaded state puts it back to 0.
// dsc__engine_micro: the position, 0 .. gradient_accumulation_steps - 1 (0: the step's first
// micro-step, whose gradients overwrite rather than add); dsc__engine_micro_last: whether the
// micro-step running is the step's last (its backward starts the reductions, its gradients go
// to the host). dsc__engine_micro_done, after each micro-step: info cleared; true at the step's
// boundary (the position back to 0: the caller steps now), else false with info->step the
// global step (info is then complete).
int64_t dsc__engine_micro(const dsc_engine *e);
bool dsc__engine_micro_last(const dsc_engine *e);
bool dsc__engine_micro_done(dsc_engine *e, dsc_step_info *info);
// fp16 training (fp16.enabled): at the boundary the accumulated gradients become fp16 values
// (dsc__round_fp16 on the host; the device applies the same rule in its kernel) and a step whose
// gradients hold inf/NaN is skipped. Elsewhere no step is ever skipped.
bool dsc__engine_fp16(const dsc_engine *e);
// bf16.bf16_master_weights_and_grads is on (bf16 training): the master holds bf16 values and the
// gradients are rounded to bf16 before the norm and the step; *states (may be NULL):
// bf16.bf16_optimizer_states too (the moments hold bf16 values).
bool dsc__engine_master_bf16(const dsc_engine *e, bool *states);
// bf16_master_rounding "stochastic" with bf16 master weights (engine/optim/sround.h).
bool dsc__engine_bf16_sr(const dsc_engine *e);
// dst[i] = src[i] rounded to the nearest fp16 value (beyond fp16's range: inf), as a float;
// dst == src allowed.
void dsc__round_fp16(float *dst, const float *src, size_t n);
// The global norm and inf/NaN flag from n ranks' (sum of squares, flag != 0) pairs (parts: 2n
// doubles, in rank order): the sums added in rank order, or with replicated (every rank summed
// the same vector) the first one's; *nonfinite when a rank flagged or the sum is not finite.
void dsc__step_global_norm(const double *parts, int n, bool replicated, double *sumsq,
                           bool *nonfinite);
// Whether nothing of the step's update depends on the gradients' norm (no fp16 skip, no
// clipping: gradient_clipping is read here and in the step's plan only), so that the optimizer
// may run before the norm is known (dsc__engine_device_step_begin).
bool dsc__engine_norm_free(const dsc_engine *e);

// What the device applies at this optimizer step.
typedef struct dsc__device_step {
    bool apply;          // false: fp16 overflow, nothing changes
    dsc_opt_hparams hp;  // this step's optimizer (lr and, for OneCycle, betas filled in)
    int64_t opt_step;    // 1-based count of applied steps, this one included
    float grad_scale;    // multiply the accumulated gradients by this: 1 / (loss scale * clip)
} dsc__device_step;

// At a step boundary. sumsq: sum of squares of the accumulated gradients divided by the loss scale
// they carry (over every rank: the global norm); nonfinite: some gradient was inf/NaN. Updates
// the engine's counters and scaler exactly as dsc_step does and fills info as dsc_step does;
// ends the step for the fault-tolerance watchdog. DSC_INJECT_OVERFLOW is honoured.
dsc_status dsc__engine_device_step(dsc_engine *e, double sumsq, bool nonfinite,
                                   dsc__device_step *out, dsc_step_info *info);

// The same in two halves, for a device that divides the gradients by a divisor it computes from
// the norm itself (dsc__step_divisor of the norm and div), so that the optimizer step is queued
// before the norm reaches the host. Only where no step is ever skipped (bf16, fp32): begin fills
// out (grad_scale 1) and info but for the norm, and ends the step for the watchdog; end, with
// the norm read, fills info->grad_norm and warns about inf/NaN as dsc__engine_device_step does.
// What the accumulated gradients are divided by: the loss scale, times norm / clipping where the
// true norm is above the clipping threshold (clipping 0: none). prev and scale: the loss scale
// before and after this step's update. dsc__cuda_opt_divisor computes the same on a device.
double dsc__step_divisor(double norm, double prev, double scale, double clipping);
typedef struct dsc__device_divisor {
    double prev, scale, clipping; // dsc__step_divisor's arguments but the norm
} dsc__device_divisor;
dsc_status dsc__engine_device_step_begin(dsc_engine *e, dsc__device_step *out,
                                         dsc_step_info *info, dsc__device_divisor *div);
void dsc__engine_device_step_end(dsc_engine *e, double sumsq, bool nonfinite,
                                 dsc_step_info *info);

#endif
