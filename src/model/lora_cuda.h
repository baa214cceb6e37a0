// model/lora_cuda.h - the LoRA adapters' device passes (model/lora.h's table; the host passes are
// in model/lora.c), for a family's GPU code to call beside each of its linear products.
//
// An adapter on W (out x in) is A (r x in) and B (out x r), bf16 (or fp16) on the device like
// every weight. The forward adds scale (x A^T) B^T to the product's output and keeps x A^T
// (N x r) per adapter; the backward makes t = scale dout B, then B's gradient += scale dout^T
// (x A^T), A's += t^T x and the input's gradient += t A. With lora_dropout the adapter's input is
// dropped out with the host's mask (dsc__lora_kept: the same seed, pass and element), so a GPU
// pass drops the elements a CPU pass drops. Every product is a cuBLASLt product with fp32
// accumulation on the family's stream; the gradients are fp32 (= when fresh, else +=).
#ifndef DSC_MODEL_LORA_CUDA_H
#define DSC_MODEL_LORA_CUDA_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint16_t, int64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

struct dsc_lora;
struct dsc_cuda_blas;

typedef struct dsc__lora_dev {
    const struct dsc_lora *lo; // borrowed; NULL: no adapters (every call does nothing)
    struct dsc_cuda_blas *blas;
    void *stream;
    bool fp16;
    int64_t maxN;
    uint16_t *xa; // (n_adapters, maxN, r) x A^T of the forward
    uint16_t *t;  // (maxN, r) scale dout B of the backward
    uint16_t *xd; // (maxN, max_in) the dropped-out input (and its gradient), or NULL
} dsc__lora_dev;

// Whether a step with these adapters (NULL: none) may be captured as a CUDA graph: not with
// lora_dropout, whose masks take a pass count from the host that changes every forward.
bool dsc__lora_dev_graph_ok(const struct dsc_lora *lo);
// Device bytes of the buffers for passes of up to N tokens (0 without adapters).
size_t dsc__lora_dev_bytes(const struct dsc_lora *lo, int64_t N);
// Point d's buffers into base (dsc__lora_dev_bytes of them; base NULL: only the size).
void dsc__lora_dev_carve(dsc__lora_dev *d, const struct dsc_lora *lo, int64_t N, char *base);

// After the product of tensor `tensor` (its input inp: N rows of in, row stride ldi; its output
// out: N rows of out, row stride ldo): out += scale (inp A^T) B^T.
dsc_status dsc__lora_dev_forward(const dsc__lora_dev *d, const uint16_t *const *params,
                                 int tensor, uint16_t *out, int ldo, const uint16_t *inp, int ldi,
                                 int64_t N);
// After the product's input gradient (dinp: N rows of in, row stride lddi; NULL: not wanted) was
// written from dout (N rows of out, row stride ldd): the adapters' gradients and dinp += t A.
dsc_status dsc__lora_dev_backward(const dsc__lora_dev *d, const uint16_t *const *params,
                                  float *const *grads, int tensor, uint16_t *dinp, int lddi,
                                  const uint16_t *dout, int ldd, const uint16_t *inp, int ldi,
                                  int64_t N, bool fresh);

#ifdef __cplusplus
}
#endif
#endif
