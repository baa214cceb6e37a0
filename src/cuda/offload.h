// cuda/offload.h - the bus side of ZeRO-Offload on one GPU: gradients streamed to the host group
// by group while the backward still runs, and the optimizer's new 16-bit weights streamed back
// group by group while the CPU updates the next group.
//
// Two copy streams, one per direction (the bus is full duplex, and a stream is a queue: weights
// going up must not wait behind gradients still coming down), and three events per group:
//   done[g]    recorded on the model's stream when group g's gradients are complete (from the
//              backward's hook); the down stream waits for it, then copies them to the host
//   landed[g]  recorded on the down stream after that copy: the host waits for it before reading
//   up[g]      recorded on the up stream after group g's new weights went to the device; the
//              model's stream waits for every up[g] before its next kernel (dsc__cuda_offload_fence)
// Nothing here waits on the host except dsc__cuda_offload_grads_wait.
#ifndef DSC_CUDA_OFFLOAD_H
#define DSC_CUDA_OFFLOAD_H

#include <stddef.h> // size_t
#include <stdint.h> // uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_cuda_offload dsc_cuda_offload;

// For ngroups groups; model_stream: the cudaStream_t the model's kernels run on (borrowed).
dsc_status dsc__cuda_offload_create(dsc_cuda_offload **out, int ngroups, void *model_stream);
void dsc__cuda_offload_destroy(dsc_cuda_offload *o); // NULL ok; waits for its copies first

// Group g's gradients are complete on the model's stream: copy n floats dev -> host (page-locked
// for speed) on the down stream, once the model's stream has reached this point.
dsc_status dsc__cuda_offload_grads_out(dsc_cuda_offload *o, int g, float *host, const float *dev,
                                       size_t n);
// Waits (host) until group g's gradients are on the host.
dsc_status dsc__cuda_offload_grads_wait(dsc_cuda_offload *o, int g);
// Group g's new 16-bit weights: n values host -> dev on the up stream (host page-locked; it must
// not change until the copy is done: dsc__cuda_offload_fence, then the model stream's next work).
dsc_status dsc__cuda_offload_weights_in(dsc_cuda_offload *o, int g, uint16_t *dev,
                                        const uint16_t *host, size_t n);
// The model's stream waits for every upload enqueued so far (no host wait).
dsc_status dsc__cuda_offload_fence(dsc_cuda_offload *o);
// Waits (host) for every copy enqueued so far, both directions.
dsc_status dsc__cuda_offload_sync(dsc_cuda_offload *o);

#ifdef __cplusplus
}
#endif
#endif
