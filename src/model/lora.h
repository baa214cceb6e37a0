// model/lora.h - the adapters' table behind dsc_model_set_lora (model/lora.c).
#ifndef DSC_MODEL_LORA_H
#define DSC_MODEL_LORA_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t, uint64_t

#include "dsc/model.h" // dsc_lora, dsc_model_lora, dsc_model_param

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DSC__LORA_FN __host__ __device__ static inline
#else
#define DSC__LORA_FN static inline
#endif

// Whether element (row, col) of adapter k's input is kept by lora_dropout p in training pass
// `pass`: a hash (SplitMix64's finaliser) of (seed, pass, adapter, element), so that the backward,
// a recomputed forward and the GPU passes (model/lora_cuda.cu) draw the same mask as the forward.
DSC__LORA_FN bool dsc__lora_kept(uint64_t seed, uint64_t pass, int k, int64_t row, int col,
                                 float p) {
    uint64_t z = seed ^ (pass * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(k + 1) << 48) ^
                 ((uint64_t)row * 0xD1B54A32D192ED03ull) ^ ((uint64_t)col * 0x94D049BB133111EBull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * 0x1.0p-24f >= p;
}

// Adapter k is tensors n_base + 2k (A) and n_base + 2k + 1 (B) of the model.
struct dsc_lora {
    int n_base, n_adapters, r, init;
    float scale;
    double alpha;
    bool rslora;
    float dropout;    // lora_dropout (0: none)
    uint64_t seed;    // of the masks
    uint64_t pass;    // training forwards so far: the masks' key (a recompute reuses it)
    bool training;    // dropout acts (dsc_model_set_training)
    int *adapter_of;  // (n_base) adapter on the tensor, or -1
    bool *trainable;  // (n_base) a base tensor of modules_to_save
    int *base;        // (n_adapters) its base tensor
    int *in, *out;    // (n_adapters) the product's input and output widths
    // The arrays of the pass running now (every tensor of the model; entries read when used, so
    // that a gather hook may fill them).
    float *const *params;
    float *const *grads;
    int64_t maxN;
    float *xa; // (n_adapters, maxN, r) x A^T of the forward
    float *t;  // (maxN, r) dout B of the backward
    float *xd; // (maxN, max_in) the dropped-out input, or NULL without dropout
    int max_in;
};

// The adapters o asks for on the tensors ps (n, a model's table; num_groups its layer groups).
// DSC_ERR_CONFIG naming a module that matches nothing and what exists.
dsc_status dsc__lora_create(dsc_lora **out, const dsc_model_param *ps, int n, int num_groups,
                            bool weights_in_out, const dsc_model_lora *o, const char *spec);
void dsc__lora_destroy(dsc_lora *lo);
// Adapter k's A (is_b false) or B tensor entry, from its base tensor's.
void dsc__lora_param(const dsc_lora *lo, const dsc_model_param *base, int k, bool is_b,
                     dsc_model_param *out);
// Elements [begin, begin + count) of adapter k's A or B as PEFT initialises them (order-free).
void dsc__lora_init(const dsc_lora *lo, int k, bool is_b, float *dst, int64_t begin,
                    int64_t count, uint64_t seed);
// Activations for passes of up to N tokens.
dsc_status dsc__lora_reserve(dsc_lora *lo, int64_t N);
void dsc__lora_release(dsc_lora *lo);
size_t dsc__lora_act_bytes(const dsc_lora *lo, int64_t N);
// A training forward begins: the next dropout masks.
void dsc__lora_next_pass(dsc_lora *lo);

#endif
