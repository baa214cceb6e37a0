// cuda/device_model.h - what the families' GPU models (model/gpt2/gpt2_cuda.cu,
// model/llama/llama_cuda.cu) share around their kernels: the batch's tokens checked, counted and
// uploaded, the parameter and gradient tables checked, the activation block laid out, and the
// mean loss over the targets that count.
#ifndef DSC_CUDA_DEVICE_MODEL_H
#define DSC_CUDA_DEVICE_MODEL_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// inputs (B, T) ids in [0, V) and targets (B, T; NULL: none) in [0, V) or negative (ignored),
// HOST arrays, checked (DSC_ERR_INVALID_ARG naming `who`, the array, the position and the id),
// then enqueued for upload on stream: tokens[0 .. BT) the inputs, tokens[BT .. 2 BT) the targets
// (device, (2, BT) int32). *ntargets: the targets that count (not negative), 0 without targets.
dsc_status dsc__cuda_tokens_upload(int32_t *tokens, const int32_t *inputs, const int32_t *targets,
                                   int B, int T, int V, const char *who, int *ntargets,
                                   void *stream);
// Position ids pos (HOST (B, T), each in [0, max_pos)) checked (DSC_ERR_INVALID_ARG naming `who`
// and the first outside) and enqueued for upload into dst (device, B T int32) on stream.
dsc_status dsc__cuda_positions_upload(int32_t *dst, const int32_t *pos, int B, int T, int max_pos,
                                      const char *who, void *stream);

// Every entry of a per-tensor table (n of them) set, or those with required[i] (required NULL:
// all; a frozen tensor has no gradient): DSC_ERR_INVALID_ARG naming `who`, the table (`what`:
// "params", "grads") and the first missing entry's index and tensor name (name(cfg, i)).
dsc_status dsc__cuda_table_check(const void *const *t, int n, const char *who, const char *what,
                                 void (*name)(const void *cfg, int i, char *buf, int cap),
                                 const void *cfg, const bool *required);

// One view of a model's block of device buffers and its bytes.
typedef struct {
    void **view;
    size_t bytes;
} dsc__cuda_carve_entry;
// Lays the n views out in table order from base, each on a 256-byte boundary (a view of 0 bytes
// is NULL); base NULL only counts. Returns the block's bytes.
size_t dsc__cuda_carve(const dsc__cuda_carve_entry *t, size_t n, char *base);

// *loss_dev = the mean of losses (n) over ntargets (0 when none count), queued on stream; the
// _read twin also copies it to the host float *loss and waits for the stream.
dsc_status dsc__cuda_mean_loss(float *loss_dev, const float *losses, int64_t n, int ntargets,
                               void *stream);
dsc_status dsc__cuda_mean_loss_read(float *loss, float *loss_dev, const float *losses, int64_t n,
                                    int ntargets, void *stream);

#ifdef __cplusplus
}
#endif
#endif
