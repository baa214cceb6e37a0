// engine/gpu/train_gpu_dp.h - data parallelism across GPUs for `dsc train --device cuda`: each rank
// has a GPU of its own, the gradients are reduced among the devices through the nccl comm backend
// and the optimizer runs on the device over this rank's ZeRO partition. Chosen when
// DSC_COMM_BACKEND=nccl and no two ranks of the job share a GPU; also at world 1 with nccl (the
// collectives then have one rank), which is how one GPU tests it.
//
// One optimizer step (gradients accumulated on the device over the micro-steps):
//   1. reduction, per parameter group, started during the last micro-step's backward: the
//      backward's hook (dsc__train_dp_backward_hook) is called as each group's gradients are
//      complete and enqueues, on the compute stream, the group's fp16 rounding (fp16 training)
//      and DeepSpeed's pre-scaling (divide by gradient_predivide_factor) or 16-bit staging
//      (communication_data_type), records the group's event, and issues the group's collective
//      on the communicator's stream behind that event: stage 0 an all-reduce of the group's
//      range in place, stages 1-3 a reduce-scatter into this rank's partition (the engine's
//      layout). So the reduction of the last layers overlaps the backward of the first. At the
//      step, groups not started yet (no hook) are started, all are waited for, and the result
//      is multiplied by factor / world (or converted back from 16 bits).
//   2. --dump-grads at step 1: the reduced gradients go to the engine's host accumulator and the
//      trainer's observer runs as under dsc_step.
//   3. global norm: stage 0 sums the whole (identical) reduced gradient on every rank and takes
//      rank 0's; stages 1-3 sum their partition and add the ranks' sums in rank order (an
//      all-gather of (sum, overflow flag) pairs); the engine decides the step from it
//      (dsc__engine_device_step: fp16 skip, scaler, clipping, lr).
//   4. the optimizer on the device: stage 0 over the whole state (every rank the same update);
//      stages 1-3 over this rank's slices, writing the bf16 copy of its slices, then one
//      all-gather of bf16 per group rebuilds every rank's whole bf16 model.
// Stages 0-2 reduce the gradients once per optimizer step, not per micro-step as the host engine
// does: the same sum, rounded differently.
// Stage 3 (unless DSC_GPU_STAGE3_PARTITION=0, which runs it as stage 2) partitions the 16-bit
// weights too: each device keeps its slice of every layer's weights; the model's layer hook
// all-gathers a layer into one of two device slots one layer ahead of use
// (engine/gpu/layer_slots.h), in forward and again in backward, so the gather of the next layer
// overlaps this layer's compute. The layers' gradients pass through two gradient slots: each
// layer's are reduce-scattered in place as soon as its backward is done, every micro-step, and
// added into this rank's partition (whose sum over the micro-steps is then post-scaled, and
// in fp16 training rounded to fp16 values, at the step). The embeddings and ln_f stay whole on
// every device and are reduced once per step as at stage 2; after the optimizer only they are
// all-gathered. The host waits for the pass's gathers and reductions (dsc__train_dp_pass_done)
// before it reads the loss: a stream that waits on NCCL waits as long as a hung peer does, and
// the request waits are where comm_timeout_s is enforced.
// The engine's host copies of master and moments are refreshed (store) for checkpoints and
// exports, a collective; load uploads them. The device state is the only current one, so a fault
// is not recovered in place: the job restarts from its last checkpoint.
#ifndef DSC_ENGINE_GPU_TRAIN_GPU_DP_H
#define DSC_ENGINE_GPU_TRAIN_GPU_DP_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint16_t

#include "dsc/model.h"  // dsc_model, dsc_model_device, dsc_model_grad_hook
#include "dsc/engine.h" // dsc_engine, dsc_step_info
#include "dsc/memory.h" // dsc_mem_pool

typedef struct train_dp train_dp;
struct dsc_cuda_state; // engine/gpu/train_state.h

// Is DSC_COMM_BACKEND nccl? (The choice of `dsc train`, made before anything else.)
bool dsc__train_dp_selected(void);

// Whether this run takes the path: nccl selected, and no two ranks on one GPU (each rank's device
// `device` is named by host and PCI bus id, all-gathered over the engine's communicator, so every
// rank decides the same). When not, why (for the banner) says so, e.g. "ranks 0 and 1 share
// cuda:0". A collective on several ranks.
dsc_status dsc__train_dp_wanted(dsc_engine *eng, int device, bool *use, char *why, size_t cap);

// The nccl communicator (group "gpu-dp", the engine's rank and world, comm_timeout_s, the
// thread's current device) and the device state, master and moments of this rank's partition
// (*st: borrowed, owned by dp). model: the model (stage 3 lays out its slots by its layers).
dsc_status dsc__train_dp_create(train_dp **out, dsc_engine *eng, const dsc_model *model,
                                dsc_mem_pool *pool, bool timed, struct dsc_cuda_state **st);
void dsc__train_dp_destroy(train_dp *dp); // NULL ok
// A step failed (before dsc_engine_recover): the communicator is aborted, the requests and the
// streams end, the snapshot copy in flight is dropped (its slot stays untagged).
void dsc__train_dp_fault(train_dp *dp);
// After the engine recovered (dsc_engine_recover, on the survivors or at the same world): the
// faulted communicator goes, the device buffers are made again for the engine's new layout (the
// state keeps its stream), and a new nccl communicator of the new ranks is formed through a store
// the new rank 0 hosts (tag "gpu-dp<recoveries>"). Collective; the state is uploaded after it
// (dsc__train_dp_load).
dsc_status dsc__train_dp_recovered(train_dp *dp, const dsc_model *model);

// LoRA's frozen base at stage 3 (the weights partitioned, as they are by default): this rank's
// slice of each layer's frozen range on its GPU in 16 bits, all-gathered beside the layer's
// weights into two frozen slots one layer ahead of use; the end groups' frozen tensors
// (embeddings, head) whole. Into the state's frozen array: [end groups | two slots | this rank's
// slices]. *done false (nothing made) at stages 0-2, without frozen tensors, and where the host
// holds no slices to start from: the caller keeps the base whole on the GPU. Collective where the
// host's base is partitioned (the end groups are gathered); again after a recovery (the slices
// change with the world).
dsc_status dsc__train_dp_frozen(train_dp *dp, bool *done);

// The engine's host state -> the device (collective: the full weights are gathered).
dsc_status dsc__train_dp_load(train_dp *dp);
// The device state -> the engine's host buffers (collective at ZeRO 1-3).
dsc_status dsc__train_dp_store(train_dp *dp);
// Stage 3: the trainer's per-tensor views (the resident groups' tensors, the layers' in the
// slots) and the model's layer hook that streams the layers; false (nothing done) at stages 0-2,
// where the views are the state's whole arrays at the engine's offsets.
bool dsc__train_dp_views(train_dp *dp, dsc_model_device *dev, const uint16_t **p16,
                         float **grad);
// The gradient hook the next micro-step's backward should carry (dsc_model_device_set_grad_hook):
// on the last micro-step of an optimizer step (at stage 3 on every one), *fn starts each group's
// reduction as the backward completes it (*user: dp); on the others *fn and *user are NULL. Call
// before every micro-step. Without it the step starts every group itself, after the backward:
// the same result (stage 3 needs it).
void dsc__train_dp_backward_hook(train_dp *dp, dsc_model_grad_hook *fn, void **user);
// After every pass of the model (a micro-step's forward + backward, an evaluation's forward),
// before the host waits for the model's stream: stage 3's slot results are added in and the
// pass's collectives waited for (with the communicator's deadline). A no-op at stages 0-2.
dsc_status dsc__train_dp_pass_done(train_dp *dp);
// After every micro-step, in place of dsc_step (same contract and info).
dsc_status dsc__train_dp_step(train_dp *dp, dsc_step_info *info);
// "nccl data-parallel over 4 GPUs, ZeRO stage 2 (optimizer partitioned), reduced in bf16".
void dsc__train_dp_describe(const train_dp *dp, char *buf, size_t cap);

#endif
