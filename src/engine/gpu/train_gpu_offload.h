// engine/gpu/train_gpu_offload.h - ZeRO-Offload on one GPU (offload_optimizer.device "cpu"),
// streamed: the GPU keeps the 16-bit weights and the fp32 gradients; the host keeps the fp32 master
// and the optimizer moments (the engine's flat state) and runs the engine's CPU optimizer.
//
// One optimizer step, on its last micro-step:
//   1. backward: as the backward completes each parameter group (the model's gradient hook,
//      in backward order: the final norm, the layers from the last to the first, then the
//      embeddings), that group's gradients go to the engine's host accumulator on a copy stream,
//      while the GPU computes the rest;
//   2. the host takes the groups as they land: fp16 rounding (fp16 runs), the group's sum of
//      squares for the global norm; when nothing in the step depends on the whole gradient (no
//      gradient_clipping and no fp16 loss scaling) the CPU optimizer also updates the group right
//      away, while the GPU is still computing the backward of the groups before it;
//   3. otherwise, once every group has landed: the engine decides (norm, clipping, overflow skip,
//      lr) exactly as dsc_step does, and the CPU optimizer updates group after group, writing
//      the new 16-bit weights into a page-locked buffer; each group goes up to the GPU on a second
//      copy stream while the CPU updates the next;
//   4. the GPU's next kernels wait for the uploads (no host wait).
// The host holds no gradient buffer and no 16-bit copy of the weights: the gradients land in two
// page-locked slots of the largest group's size in turn (the copy of the group after next starts
// as soon as the CPU is done with a slot), and the new 16-bit weights leave through two more; so
// the host keeps the fp32 master and the moments (12 bytes per parameter with Adam) and four
// group-sized slots. When the norm is needed first (step 3), the gradients, still on the device,
// come down through the slots a second time, in group order.
// The arithmetic is dsc_step's, group by group in its order (the norm's partial sums in group
// order, the same dsc_opt_step per group), so the results are bitwise those of the engine's own
// step on the same gradients.
//
// Parameter offload (zero_optimization.offload_param.device "cpu", stage 3): the 16-bit weights
// of the layers live only on the host (the page-locked buffer the CPU optimizer writes); the GPU
// keeps the embeddings and ln_f and two layer-sized slots, through which the layers' weights are
// fetched one layer ahead of use in the forward and again in the backward (the model's layer
// hook), and two gradient slots: each layer's gradients go to the host as soon as its backward
// is done, every micro-step (the host adds later micro-steps into the accumulator). GPU memory
// is then activations plus two layers, whatever the depth.
#ifndef DSC_ENGINE_GPU_TRAIN_GPU_OFFLOAD_H
#define DSC_ENGINE_GPU_TRAIN_GPU_OFFLOAD_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, uint16_t

#include "dsc/engine.h" // dsc_engine, dsc_step_info

#ifdef DSC_WITH_CUDA

#include "dsc/model.h"              // dsc_model, dsc_model_device
#include "engine/gpu/train_state.h" // dsc_cuda_state
#include "engine/device.h"          // dsc__engine_flat

typedef struct train_off train_off;

// What the last optimizer step spent on the host (seconds), for metrics.jsonl.
typedef struct train_off_times {
    double grad_wait; // waiting for gradients to land (the GPU was still computing or copying)
    double cpu;       // rounding, norm and the CPU optimizer
    bool overlapped;  // the optimizer ran while the backward was still running (step 2 above)
} train_off_times;

// st: an offload state (engine/gpu/train_state.h) of the engine's flat layout; host: the engine's
// flat state (its accumulator gets page-locked); dev: the model's device passes, whose backward
// hands over the groups; model: the model (its tensors' groups). *pinned false (reason in why) when
// the host refused to page-lock the buffers. params: parameter offload; st must then have been
// created for dsc__train_off_device_len elements (the resident groups and the slots), otherwise for
// the engine's whole layout.
dsc_status dsc__train_off_create(train_off **out, dsc_engine *eng, dsc_cuda_state *st,
                                 const dsc__engine_flat *host, dsc_model_device *dev,
                                 const dsc_model *model, bool fp16, bool params, bool *pinned,
                                 char *why, size_t cap);
// Parameter offload: elements of the device state (the resident groups and two layer slots).
size_t dsc__train_off_device_len(dsc_engine *eng, const dsc_model *model);
// Parameter offload: fill the per-tensor view tables the model is called with (ntensors each;
// kept and repointed layer by layer while the model runs) and set the model's layer hook.
void dsc__train_off_views(train_off *o, const uint16_t **p16, float **grad);
// Parameter offload: the engine's master weights -> the host 16-bit copy and the resident
// groups on the device (after initialisation or a resume).
dsc_status dsc__train_off_load(train_off *o);
void dsc__train_off_destroy(train_off *o); // NULL ok; waits for its copies, unpins

// One micro-step (forward + backward, gradients +=). On the last micro-step of a step it also
// does steps 1-2 above. timed: wait for the device after the forward and the backward and add
// the two times to *fwd_s and *bwd_s (wall_clock_breakdown).
dsc_status dsc__train_off_micro(train_off *o, const uint16_t *const *p16, float *const *grad,
                                const int32_t *in, const int32_t *tg, int B, int T, float scale,
                                bool timed, float *loss, double *fwd_s, double *bwd_s);
// After each micro-step, as dsc_step: at the step boundary steps 3-4 above.
dsc_status dsc__train_off_step(train_off *o, dsc_step_info *info);
void dsc__train_off_times(const train_off *o, train_off_times *out);

#endif // DSC_WITH_CUDA
#endif
