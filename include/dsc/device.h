// dsc/device.h - training on a GPU: the engine's device runtime, for any model whose family has
// device passes (dsc/model.h, struct dsc_model_device_ops).
//
// The engine keeps what the config decides and what checkpoints record; a device trainer holds
// the run's GPU side: the model's device activations, the 16-bit weights and fp32 gradients on
// the device, and, depending on the config and the ranks, the optimizer state too. What runs
// where is chosen from the engine's config as DeepSpeed chooses it, not by the caller:
//   - one rank: forward and backward in bf16 (or fp16 under fp16.enabled, with the engine's loss
//     scaler), the norm, clipping and the optimizer on the device; with
//     zero_optimization.offload_optimizer.device "cpu" (ZeRO-Offload) the host keeps the fp32
//     master and moments and runs the engine's CPU optimizer, the gradients going down and the
//     16-bit weights coming up per layer group while the backward runs; with
//     offload_param.device "cpu" as well (stage 3) the layers' weights live on the host and are
//     streamed through two device slots;
//   - several ranks with DSC_COMM_BACKEND=nccl and a GPU each: the gradients are reduced among
//     the devices over nccl (stage 0 all-reduce, stages 1-3 reduce-scatter into this rank's ZeRO
//     partition) and the optimizer runs on the device over that partition; stage 3 also
//     partitions the 16-bit weights and all-gathers each layer one layer ahead of its use;
//   - several ranks otherwise (host-staged): every micro-step's gradients go to the engine's host
//     buffers, the engine's own dsc_step reduces and steps on the CPU, the weights come back.
// Each rank uses device LOCAL_RANK % (visible devices).
//
// Use, on every rank (the calls marked collective must be made by every rank at the same step):
//   dsc_engine_create with opts.no_compute_copy on one rank (the device holds the 16-bit weights),
//   the master weights set (dsc_param_master + dsc_params_updated, or dsc_params_init), then
//   dsc_device_trainer_create(&t, eng, model, B, T) (the trainer attaches itself to the engine);
//   when dsc_engine_state_on_device(eng) (opts.device_state, unless DSC_DEVICE_STATE=0) the trainer
//   holds master and moments (and LoRA's frozen base): create it first, then dsc_params_init
//   (and any checkpoint load), which write into it; store and load have nothing to move;
//   per micro-batch: dsc_device_trainer_micro, then dsc_step(eng, &info), which runs the
//   trainer's step (info->boundary true at the optimizer steps), then
//   dsc_device_trainer_take_loss;
//   before a checkpoint or an export reads the engine: dsc_device_trainer_store; after a resume
//   (dsc_load_checkpoint): dsc_device_trainer_load;
//   on a failed step: dsc_device_trainer_fault, dsc_engine_recover, dsc_device_trainer_recovered;
//   dsc_device_trainer_destroy before dsc_engine_destroy and dsc_model_destroy.
//
// In a build without the CUDA kernels every fallible call returns DSC_ERR_UNSUPPORTED and
// dsc_last_error() says so and how to rebuild; dsc_device_pick("cuda") reports the same.
#ifndef DSC_DEVICE_H
#define DSC_DEVICE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t

#include "dsc/engine.h" // dsc_engine, dsc_step_info
#include "dsc/memory.h" // dsc_mem_stats
#include "dsc/model.h"  // dsc_model
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_device_trainer dsc_device_trainer;

// What a --device flag means. flag: NULL or "auto" (the GPU when this build has the CUDA kernels,
// a device is visible and the run has one rank or DSC_COMM_BACKEND=nccl; otherwise the CPU),
// "cpu" or "cuda" (any number of ranks; an error naming the missing piece when it cannot run).
// DSC_COMM_BACKEND=nccl with "cpu", without a device or in a build without NCCL is an error.
// world: the job's ranks. *cuda receives the choice. Call before dsc_engine_create.
dsc_status dsc_device_pick(const char *flag, int world, bool *cuda);

// Whether a device trainer can train this model: its family has device passes (false in a build
// without the CUDA kernels).
bool dsc_device_model_ok(const dsc_model *model);

// The device state and the model's device activations for micro-batches up to B x T, loaded
// from the engine's host state (dsc_device_trainer_load). eng and model: borrowed, and must
// outlive the trainer. A collective with nccl on several ranks. A model without device passes is
// DSC_ERR_UNSUPPORTED; a config the device cannot honour (offload to nvme, offload_param without
// stage 3 or without offload_optimizer) is an error naming the key.
dsc_status dsc_device_trainer_create(dsc_device_trainer **out, dsc_engine *eng,
                                     const dsc_model *model, int B, int T);
void dsc_device_trainer_destroy(dsc_device_trainer *t); // NULL ok

// One line for a start-up banner (device, mode, precision; borrowed from t) and *peak_flops, this
// rank's share of the device's peak for MFU (0 when the device is not in the table and
// DSC_GPU_PEAK_TFLOPS is unset).
const char *dsc_device_trainer_describe(const dsc_device_trainer *t, double *peak_flops);
// The 16-bit type the device computes in: "fp16" (fp16.enabled) or "bf16" (bf16.enabled, or an
// fp32 config, which the GPU kernels cannot compute in).
const char *dsc_device_trainer_compute(const dsc_device_trainer *t);
// Extra metrics of the last step as JSON members (", \"key\": value" ...; empty when none):
// ZeRO-Offload's host times (offload_grad_wait_ms, offload_cpu_ms, offload_overlapped).
void dsc_device_trainer_metrics(const dsc_device_trainer *t, char *buf, size_t cap);
// The run's device pool (every device buffer of the run is a block of it) and the bytes in use on
// the device (total - free).
dsc_status dsc_device_trainer_memory(const dsc_device_trainer *t, dsc_mem_stats *pool,
                                     size_t *device_used);

// The engine's host state (master weights, moments) -> the device: create does it; call it again
// after the engine's state changed under the trainer (a checkpoint loaded). Collective at
// ZeRO 1-3 on several ranks.
dsc_status dsc_device_trainer_load(dsc_device_trainer *t);
// The device state -> the engine's host buffers, before a checkpoint or an export reads them.
// A collective with nccl on several ranks (every rank calls it at the same steps).
dsc_status dsc_device_trainer_store(dsc_device_trainer *t);

// Forward + backward of one micro-batch (host tokens (B, T), B and T at most the create's),
// gradients accumulated on the device with the engine's backward scale (and, with nccl, the last
// micro-step of a step starting each layer group's reduction as its backward completes); *loss:
// the micro-batch's mean loss. The device runs ahead of the host: the last micro-step of a step
// may leave its loss on the device (*loss 0), for dsc_device_trainer_take_loss. With the config's
// wall_clock_breakdown the host waits for the device after each phase and adds their seconds to
// *fwd_s and *bwd_s (either may be NULL); otherwise they are left alone.
dsc_status dsc_device_trainer_micro(dsc_device_trainer *t, const int32_t *inputs,
                                    const int32_t *targets, int B, int T, float *loss,
                                    double *fwd_s, double *bwd_s);
// The trainer's step, which dsc_step(eng) runs while the trainer exists (one trainer per engine:
// a second create is DSC_ERR_INVALID_ARG; destroy detaches it): after every micro-step, with the
// engine's accumulation position; at the boundary the optimizer step the config chose (the
// device optimizer, ZeRO over nccl, the CPU optimizer of ZeRO-Offload, or the engine's host
// step), with the engine's decisions (skip, clipping, loss scaler, lr). Calling it directly is
// the same as dsc_step on its engine (kept for programs written against it).
dsc_status dsc_device_trainer_step(dsc_device_trainer *t, dsc_step_info *info);
// A loss left on the device by the step's last micro-step is added to *loss_sum (call after the
// step, or before it where the sum is needed earlier: the loss is then read at once). Nothing
// pending: nothing added.
dsc_status dsc_device_trainer_take_loss(dsc_device_trainer *t, double *loss_sum);
// Mean loss of a batch without gradients (validation).
dsc_status dsc_device_trainer_loss(dsc_device_trainer *t, const int32_t *inputs,
                                   const int32_t *targets, int B, int T, float *loss);
// Position ids (HOST (B, T), read by each call) of the micro-steps and losses that follow
// (--restart-positions); NULL: 0 .. T-1 in every row. DSC_ERR_UNSUPPORTED naming the way out
// when the model's device passes take none (dsc_model_has_device_positions).
dsc_status dsc_device_trainer_positions(dsc_device_trainer *t, const int32_t *pos);

// Fault tolerance (fault_tolerance in the config; docs/fault-tolerance.md). A step failed: call
// this before dsc_engine_recover, so that the device's work of that step ends (nccl: the
// communicator is aborted, the streams drained).
void dsc_device_trainer_fault(dsc_device_trainer *t);
// After dsc_engine_recover continued in place (a snapshot restored, perhaps on fewer ranks): the
// device takes the restored state. Host-staged runs rebuild their staging for the engine's new
// layout, nccl runs make their device buffers and communicator again for the new ranks; then the
// gradients are zeroed and the restored state uploaded (a collective among the survivors).
// B: the micro-batch from now on (at most the create's: larger is DSC_ERR_UNSUPPORTED).
dsc_status dsc_device_trainer_recovered(dsc_device_trainer *t, int B);

// ---- device buffers ----
//
// For a program that moves device memory itself, e.g. through the nccl comm backend (dsc/comm.h,
// whose collectives take device pointers). Each call is DSC_ERR_UNSUPPORTED in a build without
// the CUDA kernels.

// This rank's device, made current for the calling thread: LOCAL_RANK (dsc_comm_env) modulo the
// visible devices; *device receives its index (for dsc_comm_opts.device). DSC_ERR_UNSUPPORTED,
// naming the reason, when no device is usable.
dsc_status dsc_device_select(int *device);
// bytes of memory on the current device (*ptr, caller frees with dsc_device_free); tag names the
// buffer in errors (an out-of-memory error says how much was asked for).
dsc_status dsc_device_alloc(void **ptr, size_t bytes, const char *tag);
void dsc_device_free(void *ptr); // NULL ok
// Free and total bytes of this rank's device (selected as dsc_device_select does), as the driver
// reports them now: what a memory plan may count on before the run allocates.
dsc_status dsc_device_mem_info(int64_t *free_bytes, int64_t *total_bytes);
// Synchronous copies between host and device memory.
dsc_status dsc_device_to_device(void *dev, const void *host, size_t bytes);
dsc_status dsc_device_to_host(void *host, const void *dev, size_t bytes);

#ifdef __cplusplus
}
#endif

#endif
