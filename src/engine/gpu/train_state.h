// engine/gpu/train_state.h - one GPU's training state for `dsc train --device cuda`: the engine's
// flat layout (every tensor at the engine's offset, padding included) held on the device as fp32
// master weights, fp32 gradients, optimizer moments and the 16-bit copy the GPU model computes
// with (bf16, or fp16 after dsc__cuda_state_set_fp16), plus the copies between that state and the
// engine's host buffers.
//
// Two modes:
//   device   master, moments, gradients and the bf16 copy live on the GPU; the optimizer step runs
//            there (engine/gpu/optim.h); the host copies are refreshed only for checkpoints and
//            exports. Data-parallel on several GPUs (dsc__cuda_state_create_dp), master and moments
//            may be this rank's ZeRO partition only (nstate elements) while gradients and the bf16
//            weights stay whole (or, at stage 3, hold the resident groups and two layer slots).
//   offload  ZeRO-Offload: the GPU keeps only the bf16 copy and the gradients. Gradients go to the
//            host after backward, the engine's CPU optimizer updates the fp32 master and moments,
//            and the new weights come back rounded to the 16-bit type.
// Host buffers handed to the offload copies are page-locked once (mem/cuda.h) so that the copies
// run at full bus speed; when the system refuses, pageable copies are used and a note says so.
#ifndef DSC_ENGINE_GPU_TRAIN_STATE_H
#define DSC_ENGINE_GPU_TRAIN_STATE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t, uint16_t

#include "cuda/devbuf.h" // dsc_cuda_buf, dsc_mem_pool
#include "dsc/status.h"  // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#include "engine/optim/optim.h" // dsc_opt_hparams

enum { DSC_CUDA_STATE_BUFS = 8 };

typedef struct dsc_cuda_step_results {
    double sumsq;
    int nonfinite;
    float loss;
} dsc_cuda_step_results;

typedef struct dsc_cuda_state {
    size_t n;          // elements of the flat layout
    size_t nstate;     // elements of master, m and v: n, or this rank's partition (create_dp)
    bool offload;      // see above
    float *master;     // (nstate) fp32 master weights; NULL in an offload state (the host has it)
    float *grad;       // (n) fp32 gradients, accumulated over the micro-steps of a step
    float *m, *v;      // (nstate) optimizer moments, or NULL (offload; v: optimizers without one)
    uint16_t *p16;     // (n) 16-bit weights the model reads (bf16; fp16 when fp16 is set)
    void *stream;      // cudaStream_t every call enqueues on
    double *sumsq;     // device scalars of the gradient norm
    int *nonfinite;
    float *dev_scale;  // device: 1 / the step's divisor (step_div)
    struct dsc_cuda_step_results *results; // pinned host copies (results_enqueue)
    void *results_ready;                   // cudaEvent_t recorded behind those copies
    double *scratch;   // DSC_CUDA_SUMSQ_SCRATCH doubles
    void *pinned[2];   // host ranges registered by dsc__cuda_state_pin (NULL: none)
    bool fp16;         // p16 holds IEEE fp16 (fp16 training) instead of bf16
    // bf16 master weights (dsc__cuda_state_create_bf16): no fp32 master, p16 is the master and
    // the optimizer updates it in place; with states16 the moments are bf16 too (m16, v16).
    bool master16, states16;
    bool sr16; // master16: stochastic rounding of the master (bf16_master_rounding)
    uint16_t *m16, *v16; // (n) bf16 moments when states16 (m, v are NULL then)
    uint16_t *g16;       // master16: (n) the step's gradients, accumulated in bf16
    size_t grad_len;     // elements of grad: n, or with master16 the fp32 scratch the model
                         // writes one micro-step's gradients into (the resident groups and two
                         // layer slots, engine/gpu/layer_slots.h), added into g16 as it goes
    dsc_cuda_buf bufs[DSC_CUDA_STATE_BUFS]; // what the pointers above are views of
    dsc_cuda_buf g16_buf;
    // LoRA's frozen base (dsc__cuda_state_frozen): its 16-bit values, outside the flat layout
    // (no master, gradient or moments), uploaded once
    uint16_t *frozen16;
    size_t nfrozen;
    dsc_cuda_buf frozen_buf;
} dsc_cuda_state;

// Device name and the dense bf16 tensor-core peak in FLOP/s that MFU is measured against (a table
// of known parts; DSC_GPU_PEAK_TFLOPS overrides it). DSC_ERR_UNSUPPORTED with the reason when no
// CUDA device is usable.
dsc_status dsc__cuda_device_info(char *name, size_t cap, double *peak_flops);

// Makes device `local_rank % count` the calling thread's current device (several ranks of a node
// share the visible devices round-robin; with one device they all share it). *device: its number,
// *count: the devices visible.
dsc_status dsc__cuda_select_device(int local_rank, int *device, int *count);

// The PCI bus id of device `device` ("0000:1b:00.0"), which names one physical GPU whatever
// CUDA_VISIBLE_DEVICES renumbers.
dsc_status dsc__cuda_device_pci(int device, char *buf, size_t cap);

// The current CUDA device's number and the bytes in use on it (total - free, every process and
// allocator included: what a leak outside the pools would raise).
dsc_status dsc__cuda_current_device(int *device);
dsc_status dsc__cuda_device_used(size_t *bytes);
dsc_status dsc__cuda_mem_info(size_t *free_bytes, size_t *total_bytes); // the current device
// Waits for the work enqueued on `stream` (a cudaStream_t).
dsc_status dsc__cuda_stream_wait(void *stream);

// Allocates the state for n elements on the current device. moments: 0, 1 (m) or 2 (m and v);
// ignored for offload. pool: the device pool every buffer comes from (tags "gpu.master",
// "gpu.grads", "gpu.moments", "gpu.bf16_weights", "gpu.norm"; it must not move blocks, see
// cuda/devbuf.h), or NULL for plain cudaMalloc. Caller owns *out.
dsc_status dsc__cuda_state_create(dsc_cuda_state **out, size_t n, int moments, bool offload,
                                  dsc_mem_pool *pool);
// Device mode with bf16 master weights (bf16.bf16_master_weights_and_grads): the 16-bit copy is
// the master (no fp32 master buffer), the step's gradients are bf16 (g16, n) and the moments are
// fp32, or bf16 with states16 (bf16.bf16_optimizer_states): 8 bytes per Adam parameter with both
// keys, plus grad_len fp32 elements of scratch (grad) into which the model writes a micro-step's
// gradients group by group; the owner adds each group into g16 (dsc__cuda_state_acc_grads) once
// the backward is done with it. Upload, download, step and step_div take and give the same fp32
// host arrays as the fp32 state (holding bf16 values; the copies are staged through grad in
// pieces of grad_len, which is zero after).
dsc_status dsc__cuda_state_create_bf16(dsc_cuda_state **out, size_t n, size_t grad_len,
                                       int moments, bool states16, dsc_mem_pool *pool);
// master16: g16[off, off + count) += grad[from, from + count) in bf16 (first: =), enqueued.
dsc_status dsc__cuda_state_acc_grads(dsc_cuda_state *s, size_t off, size_t from, size_t count,
                                     bool first);
// bf16 master weights rounded stochastically after each step (bf16_master_rounding
// "stochastic"; the same bits as the CPU engine's for the same values).
void dsc__cuda_state_set_sr(dsc_cuda_state *s, bool on);
// Device mode with master, m and v of nstate elements (a ZeRO partition) on the device; the
// gradients and the 16-bit copy have n (the whole layout, or at ZeRO stage 3 over nccl the
// resident groups and the layer slots, which may be fewer than nstate).
dsc_status dsc__cuda_state_create_dp(dsc_cuda_state **out, size_t n, size_t nstate, int moments,
                                     dsc_mem_pool *pool);
void dsc__cuda_state_destroy(dsc_cuda_state *s); // NULL ok; unpins what it pinned
// An offload state for a layout of n elements instead (a host-staged run whose engine changed its
// layout after a recovery on fewer ranks): master staging, gradients (zero) and the 16-bit copy
// made again from the same pool; the stream (which a model may have borrowed) and the scalars
// stay. The host ranges it had pinned are unpinned: pin the new ones.
dsc_status dsc__cuda_state_resize(dsc_cuda_state *s, size_t n);
// The same for a device (nccl data-parallel) state after a recovery re-laid the engine out:
// master, gradients (zero), 16-bit copy and moments for n / nstate elements, contents undefined
// until uploaded; the stream and the scalars stay.
dsc_status dsc__cuda_state_resize_dp(dsc_cuda_state *s, size_t n, size_t nstate, int moments);

// Page-lock host ranges used for offload copies (at most two); a refusal is not an error: *pinned
// says whether it worked and why not goes to `why`.
void dsc__cuda_state_pin(dsc_cuda_state *s, float *a, float *b, size_t n, bool *pinned, char *why,
                         size_t cap);

// Page-lock any host range for fast bus copies (false, with the reason in why, when the system
// refuses); unpin it before freeing it. NULL ok for unpin.
bool dsc__cuda_host_pin(void *p, size_t bytes, char *why, size_t cap);
void dsc__cuda_host_unpin(void *p);

// fp16 training: p16 holds fp16 from the next upload or step on (call before the first upload).
void dsc__cuda_state_set_fp16(dsc_cuda_state *s, bool on);

// Host -> device: master (n fp32; makes the 16-bit copy too), m and v (n each, or NULL). Waits.
// Needs nstate == n. An offload state has no device master: the values pass through the
// gradient buffer, which must hold no gradients then (between steps) and is zero after.
dsc_status dsc__cuda_state_upload(dsc_cuda_state *s, const float *master, const float *m,
                                  const float *v);
// Host -> device for create_dp's state: weights (n fp32, the whole model) become the bf16 copy
// (staged through the gradient buffer, which is zero afterwards); master, m, v (nstate each, NULL
// skips one) are copied. Waits.
dsc_status dsc__cuda_state_upload_dp(dsc_cuda_state *s, const float *weights, const float *master,
                                     const float *m, const float *v);
// Device -> host of what exists on the device (device mode: master, m, v, nstate elements each;
// NULL skips one). Waits.
dsc_status dsc__cuda_state_download(dsc_cuda_state *s, float *master, float *m, float *v);

// Device mode on one GPU (nstate == n): n fp32 host values of kind (0 master, 1 m, 2 v; -1 the
// frozen weights, at their own offset, in the compute type; -2 the accumulated gradients, read
// only) at element off, to the device (up; the master's 16-bit copy of them made too, bf16 state
// rounded to nearest even) or from it (bf16 widened exactly). bf16 values pass through the
// gradient scratch, which holds no gradients between steps and is zero after. Waits.
dsc_status dsc__cuda_state_io(dsc_cuda_state *s, int kind, size_t off, size_t n, float *host,
                              bool up);

dsc_status dsc__cuda_state_zero_grads(dsc_cuda_state *s);
// The frozen tensors' values (host, n fp32 elements already rounded to the compute type: the
// engine's frozen store) into s->frozen16 in the state's 16-bit type (set_fp16 first), taken from
// pool (tag "gpu.frozen_weights") on the first call, and again for another n (the old buffer
// goes). host NULL: only the buffer (the values come through dsc__cuda_state_io).
dsc_status dsc__cuda_state_frozen(dsc_cuda_state *s, const float *host, size_t n,
                                  dsc_mem_pool *pool);

// fp16 training, at a step boundary before the norm: the accumulated gradients rounded to fp16
// values, in place, exactly as the engine's CPU step rounds its fp16 gradients (values beyond
// fp16's range become inf, so the overflow flag below sees them).
dsc_status dsc__cuda_state_round_grads_fp16(dsc_cuda_state *s);
// The same over the n gradients at off (e.g. one parameter group's range, as soon as the backward
// has finished it): element by element the same bits as the whole-array call.
dsc_status dsc__cuda_state_round_grads_fp16_range(dsc_cuda_state *s, size_t off, size_t n);

// Sum of squares of grad * scale (double, fixed order) and whether any element was inf/NaN. Waits.
dsc_status dsc__cuda_state_grad_sumsq(dsc_cuda_state *s, float scale, double *sumsq,
                                      bool *nonfinite);
// The same over any device array x (n elements), with the state's scalars and stream. Waits.
dsc_status dsc__cuda_state_sumsq(dsc_cuda_state *s, const float *x, size_t n, float scale,
                                 double *sumsq, bool *nonfinite);

// A step whose results the host reads once, after the optimizer step is queued (one wait a step):
// grad_sumsq_enqueue queues the gradients' norm (times scale) into the device scalars; results_
// enqueue queues copies of loss_dev (a device float; NULL: none), the norm and the inf/NaN flag
// into pinned host memory and records an event behind them; results_wait waits for that event
// only (work queued after it keeps running) and returns them. step_div: the optimizer step with
// the gradients divided by dsc__step_divisor of the device's norm (engine/device.h), computed on
// the device (dsc__cuda_opt_divisor); the same step as dsc__cuda_state_step given that divisor.
dsc_status dsc__cuda_state_grad_sumsq_enqueue(dsc_cuda_state *s, float scale);
dsc_status dsc__cuda_state_results_enqueue(dsc_cuda_state *s, const float *loss_dev);
dsc_status dsc__cuda_state_results_wait(dsc_cuda_state *s, float *loss, double *sumsq,
                                        bool *nonfinite);
dsc_status dsc__cuda_state_step_div(dsc_cuda_state *s, const dsc_opt_hparams *h, int64_t step,
                                    double prev, double scale, double clipping);

// Device mode: one optimizer step over the flat state (grad multiplied by grad_scale), writing
// the 16-bit copy in the same pass. step: 1-based count of applied steps, this one included.
dsc_status dsc__cuda_state_step(dsc_cuda_state *s, const dsc_opt_hparams *h, int64_t step,
                                float grad_scale);
// The same step over count state elements at off (master, m, v + off) with gradients g (count,
// device) and the bf16 result written to out16 (count, device; e.g. this rank's slice of the bf16
// copy). The per-element arithmetic is that of dsc__cuda_state_step, so steps split into ranges
// give the same bits as one step over the whole.
dsc_status dsc__cuda_state_step_range(dsc_cuda_state *s, const dsc_opt_hparams *h, int64_t step,
                                      float grad_scale, const float *g, size_t off, size_t count,
                                      uint16_t *out16);

// Offload: gradients -> host (n fp32), waits.
dsc_status dsc__cuda_state_grads_to_host(dsc_cuda_state *s, float *dst);

// n bf16 values on the device -> host floats (e.g. a row of logits), in the order of `stream`
// (the producer's cudaStream_t); waits.
dsc_status dsc__cuda_bf16_to_host(float *dst, const uint16_t *src, size_t n, void *stream);
// The same for fp16 values when fp16 is set (e.g. the logits of an fp16 model).
dsc_status dsc__cuda_16_to_host(float *dst, const uint16_t *src, size_t n, bool fp16, void *stream);

#ifdef __cplusplus
}
#endif
#endif
