// cuda/convert.h - flat fp32 arrays on the device: scaling, 16-bit staging of gradient
// reductions (communication_data_type), the copies between host and device that the GPU
// trainer's data-parallel path makes, and the events by which it hands a range of gradients from
// its compute stream to the communicator's stream.
//
// Conversions round to nearest even exactly as dsc/half.h does on the CPU (bf16: NaN kept quiet;
// fp16: overflow to inf, subnormals), so a value staged on the device equals the CPU engine's
// staging of the same value bit for bit. Each element takes one rounded product (x * scale, never
// fused with anything) and then the rounding to 16 bits.
//
// Pointers are device memory unless named host; stream is a cudaStream_t (NULL: the default
// stream). The kernels only enqueue; the copies wait for the stream.
#ifndef DSC_CUDA_CONVERT_H
#define DSC_CUDA_CONVERT_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint16_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// x (n) *= s.
dsc_status dsc__cuda_scale(float *x, size_t n, float s, void *stream);
// dst (n) = round16(src * scale): bf16, or fp16 when fp16 is true.
dsc_status dsc__cuda_to16(uint16_t *dst, const float *src, size_t n, float scale, bool fp16,
                          void *stream);
// dst (n) = float(src) * scale (scale 1: exact).
dsc_status dsc__cuda_from16(float *dst, const uint16_t *src, size_t n, float scale, bool fp16,
                            void *stream);

// dst (n) += src (fp32); dst (n) += float(src16) (bf16 bits, or fp16 when fp16 is true). One
// rounded addition per element: accumulating partial sums so gives the bits of adding them in
// place.
dsc_status dsc__cuda_add(float *dst, const float *src, size_t n, void *stream);
dsc_status dsc__cuda_add_from16(float *dst, const uint16_t *src, size_t n, bool fp16,
                                void *stream);
// dst (n bf16) = bf16(src) when first, else bf16(float(dst) + src): one rounded fp32 addition and
// one rounding to nearest even per element (gradients accumulated in bf16).
dsc_status dsc__cuda_acc_bf16(uint16_t *dst, const float *src, size_t n, bool first,
                              void *stream);
// bytes from one device buffer to another, and bytes set to zero, enqueued (nothing waits).
dsc_status dsc__cuda_copy(void *dst, const void *src, size_t bytes, void *stream);
dsc_status dsc__cuda_zero(void *dst, size_t bytes, void *stream);

// bytes from the device to host memory, or from host memory to the device, in the order of
// `stream`; both wait for it.
dsc_status dsc__cuda_to_host(void *host, const void *dev, size_t bytes, void *stream);
dsc_status dsc__cuda_to_device(void *dev, const void *host, size_t bytes, void *stream);

// A CUDA event (*ev: a cudaEvent_t, caller owns; destroy(NULL) is a no-op), and its recording on
// `stream`: the event is reached once the work enqueued there before it is done. Nothing waits.
dsc_status dsc__cuda_event_create(void **ev);
void dsc__cuda_event_destroy(void *ev);
dsc_status dsc__cuda_event_record(void *ev, void *stream);
// Work enqueued on `stream` after this call starts once ev's last recording is reached (an event
// never recorded: at once). The host does not wait.
dsc_status dsc__cuda_stream_wait_event(void *stream, void *ev);
// The host waits until ev's last recording is reached.
dsc_status dsc__cuda_event_wait(void *ev);
// bytes from the device to (page-locked) host memory in the order of `stream`; nothing waits.
dsc_status dsc__cuda_to_host_async(void *host, const void *dev, size_t bytes, void *stream);
// A non-blocking stream of its own (*stream: a cudaStream_t, caller owns; destroy waits for it
// first, NULL ok), and page-locked host memory (free(NULL) ok).
dsc_status dsc__cuda_stream_create(void **stream);
void dsc__cuda_stream_destroy(void *stream);
dsc_status dsc__cuda_host_alloc(void **p, size_t bytes);
void dsc__cuda_host_free(void *p);

#ifdef __cplusplus
}
#endif
#endif
