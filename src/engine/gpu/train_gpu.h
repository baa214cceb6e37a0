// engine/gpu/train_gpu.h - the GPU half of `dsc train` (--device cuda).
//
// The engine keeps what the config decides and what checkpoints record (engine/device.h); the GPU
// runs forward and backward in bf16, or in fp16 under fp16.enabled (the model's device passes, dsc/model.h). On one
// rank it also runs the optimizer step, unless the config offloads it
// (zero_optimization.offload_optimizer.device "cpu").
// Several ranks (each on device LOCAL_RANK % visible devices, so several may share one GPU) are
// host-staged by default: every micro-step's gradients go to the engine's host buffers, the
// engine's ZeRO reduction and CPU optimizer run as on the CPU path, and the new weights come
// back. With DSC_COMM_BACKEND=nccl and a GPU per rank, the GPUs reduce the gradients among
// themselves and run the optimizer on their ZeRO partitions (engine/gpu/train_gpu_dp.h); at world 1
// with nccl that path runs with one-rank collectives.
#ifndef DSC_ENGINE_GPU_TRAIN_GPU_H
#define DSC_ENGINE_GPU_TRAIN_GPU_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t

#include "dsc/engine.h"      // dsc_engine, dsc_step_info
#include "dsc/memory.h"      // dsc_mem_stats
#include "dsc/model.h"       // dsc_model

typedef struct train_gpu train_gpu;

// What --device means here. flag: NULL or "auto" (the GPU when this build has the CUDA kernels,
// a device is visible and the run has one rank or DSC_COMM_BACKEND=nccl; otherwise the CPU),
// "cpu" or "cuda" (any number of ranks; an error naming the missing piece when it cannot run).
// DSC_COMM_BACKEND=nccl with --device cpu, without a device or in a build without NCCL is an
// error. *cuda receives the choice.
dsc_status dsc__train_pick_device(const char *flag, int world, bool *cuda);

// Whether the GPU trainer can train this model (GPT-2 only for now; false in a build without the
// CUDA kernels).
bool dsc__train_gpu_model_ok(const dsc_model *model);

// Device state and model for micro batches up to B x T, loaded from the engine's host state.
// model: the run's model (borrowed for the call); the device passes drive GPT-2's CUDA model
// directly until they go through the model interface, so another family is DSC_ERR_UNSUPPORTED.
dsc_status dsc__train_gpu_create(train_gpu **out, dsc_engine *eng, const dsc_model *model, int B,
                                 int T);
void dsc__train_gpu_destroy(train_gpu *g); // NULL ok

// One line for the start-up banner (device, mode, precision) and the peak FLOP/s of MFU (0 when
// the device is not in the table: MFU is then reported as 0).
const char *dsc__train_gpu_describe(const train_gpu *g, double *peak_flops);
// The 16-bit type the GPU computes in: "fp16" (fp16.enabled) or "bf16" (bf16.enabled, or an fp32
// config, which the GPU kernels cannot compute in).
const char *dsc__train_gpu_compute(const train_gpu *g);
// Extra metrics.jsonl fields of the last step (", \"key\": value" ...; empty when none):
// ZeRO-Offload's host times (offload_grad_wait_ms, offload_cpu_ms, offload_overlapped).
void dsc__train_gpu_metrics(const train_gpu *g, char *buf, size_t cap);

// The engine's host state (weights, moments) -> the device: after initialisation or a resume.
dsc_status dsc__train_gpu_load(train_gpu *g);
// The device state -> the engine's host buffers, before a checkpoint or an export reads them.
// A collective with nccl on several ranks (every rank calls it at the same steps).
dsc_status dsc__train_gpu_store(train_gpu *g);
// A step failed: before dsc_engine_recover, the device's work of that step is ended (nccl: the
// communicator aborted, the streams drained).
void dsc__train_gpu_fault(train_gpu *g);
// After the engine recovered from a fault in place (dsc_engine_recover: a snapshot restored,
// perhaps on fewer ranks): the device takes the restored state. Host-staged runs rebuild their
// staging for the engine's new layout (a different world pads the groups differently), zero the
// device gradients, and upload the gathered weights (a collective among the survivors); nccl
// runs also make their device buffers and communicator again for the new ranks and upload the
// restored partition (engine/gpu/train_gpu_dp.h). B: the
// micro-batch from now on (at most the one the model was made for).
dsc_status dsc__train_gpu_recovered(train_gpu *g, int B);

// Forward + backward of one micro-batch (host tokens (B, T)), gradients accumulated on the device
// with the engine's backward scale; *loss: its mean loss. With the config's wall_clock_breakdown
// the host waits for the device after each phase and adds their seconds to *fwd_s and *bwd_s
// (the step then waits too, so the breakdown's step time is the device's optimizer time);
// otherwise the device runs ahead and the two are left alone.
dsc_status dsc__train_gpu_micro(train_gpu *g, const int32_t *in, const int32_t *tg, int B, int T,
                                float *loss, double *fwd_s, double *bwd_s);
// The last micro-step of a step may leave its loss on the device (*loss 0 then), to be read with
// the step's other results: the trainer adds it to its sum here, after the step (or before, where
// it needs the sum earlier; the loss is then read at once). Nothing pending: nothing added.
dsc_status dsc__train_gpu_take_loss(train_gpu *g, double *loss_sum);
// The run's device pool (every device buffer of the run is a block of it) and the bytes in use on
// the device (cudaMemGetInfo: total - free).
dsc_status dsc__train_gpu_memory(const train_gpu *g, dsc_mem_stats *pool, size_t *device_used);
// After every micro-step, in place of dsc_step (same contract and info).
dsc_status dsc__train_gpu_step(train_gpu *g, dsc_step_info *info);
// Mean loss of a batch without gradients (validation).
dsc_status dsc__train_gpu_loss(train_gpu *g, const int32_t *in, const int32_t *tg, int B, int T,
                               float *loss);

#endif
