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
//              model's stream waits for every up[g] before its next kernel (..._fence)
// Parameter offload (zero_optimization.offload_param) adds device slots that hold one layer's
// 16-bit weights each, two events per slot:
//   ready[k]   recorded on the up stream after a layer's weights were copied into slot k; the
//              model's stream waits for it before the layer's kernels
//   free[k]    recorded on the model's stream after the last kernel reading slot k; the next copy
//              into slot k waits for it
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

// For ngroups groups and nslots weight slots (0 without parameter offload); model_stream: the
// cudaStream_t the model's kernels run on (borrowed).
dsc_status dsc__cuda_offload_create(dsc_cuda_offload **out, int ngroups, int nslots,
                                    void *model_stream);
void dsc__cuda_offload_destroy(dsc_cuda_offload *o); // NULL ok; waits for its copies first

// Group g's gradients are complete on the model's stream: copy n floats dev -> host (page-locked
// for speed) on the down stream, once the model's stream has reached this point.
dsc_status dsc__cuda_offload_grads_out(dsc_cuda_offload *o, int g, float *host, const float *dev,
                                       size_t n);
// The same in two halves, for a host that hands out its page-locked slots as they free up:
// _done marks (on the model's stream) that group g's gradients are complete; _copy enqueues the
// copy of n floats into host on the down stream, behind that mark (any number of times: a
// second copy of the same gradients reads them again).
dsc_status dsc__cuda_offload_grads_done(dsc_cuda_offload *o, int g);
dsc_status dsc__cuda_offload_grads_copy(dsc_cuda_offload *o, int g, float *host, const float *dev,
                                        size_t n);
// Waits (host) until group g's gradients are on the host.
dsc_status dsc__cuda_offload_grads_wait(dsc_cuda_offload *o, int g);
// Waits (host) until group g's last upload (dsc__cuda_offload_weights_in) has read its host
// buffer, which may then be written again.
dsc_status dsc__cuda_offload_weights_wait(dsc_cuda_offload *o, int g);
// Group g's new 16-bit weights: n values host -> dev on the up stream (host page-locked; it must
// not change until the copy is done: dsc__cuda_offload_fence, then the model stream's next work).
dsc_status dsc__cuda_offload_weights_in(dsc_cuda_offload *o, int g, uint16_t *dev,
                                        const uint16_t *host, size_t n);
// Slot k receives n 16-bit values from host (page-locked, unchanged until the copy is done), on
// the up stream, once the model's stream passed slot k's release; and n2 more from host2 into
// slot2 (n2 0: none; LoRA's frozen base beside the trained weights), ready together.
dsc_status dsc__cuda_offload_fetch(dsc_cuda_offload *o, int k, uint16_t *slot, const uint16_t *host,
                                   size_t n, uint16_t *slot2, const uint16_t *host2, size_t n2);
// The model's stream waits for slot k's last fetch; dsc__cuda_offload_release: its kernels
// enqueued so far are the last readers of slot k's contents.
dsc_status dsc__cuda_offload_use(dsc_cuda_offload *o, int k);
dsc_status dsc__cuda_offload_release(dsc_cuda_offload *o, int k);
// The model's stream waits until group g's gradients have left for the host (their device
// buffer may be reused after), then zeroes n floats at dev (NULL: only the wait).
dsc_status dsc__cuda_offload_reuse_grads(dsc_cuda_offload *o, int g, float *dev, size_t n);

// The model's stream waits for every upload enqueued so far (no host wait).
dsc_status dsc__cuda_offload_fence(dsc_cuda_offload *o);
// Waits (host) for every copy enqueued so far, both directions.
dsc_status dsc__cuda_offload_sync(dsc_cuda_offload *o);

#ifdef __cplusplus
}
#endif
#endif
