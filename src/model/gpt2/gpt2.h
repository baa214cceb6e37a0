// model/gpt2/gpt2.h - the reference GPT-2 model on the CPU: configuration, parameter table,
// initialisation, forward with fused cross-entropy, and backward that accumulates gradients.
//
// Parameters live outside the model, one buffer per tensor, named and shaped as Hugging Face's
// GPT-2 (Conv1D weights are (in, out)), so that an export needs no transposes. The model owns only
// activations and scratch for the largest batch it was created for. The engine gathers and
// releases parameters per layer group through hooks; the model never assumes they stay resident.
//
// Threads: all parallel work runs on OpenMP threads. dsc_gpt2_create (and each pass) sets
// OpenBLAS to a single thread, because OpenBLAS's own thread pool and OpenMP's, both spinning on
// the same cores, slow each other down; matrix products are instead split into fixed chunks,
// one single-threaded OpenBLAS call per OpenMP task. Results are bitwise identical from run to
// run, and since every split depends only on the shapes, also for any OpenMP thread count.
#ifndef DSC_MODEL_GPT2_H
#define DSC_MODEL_GPT2_H

#include <stdbool.h> // bool
#include <stdint.h> // int32_t, int64_t, uint64_t

#include "dsc/memory.h" // dsc_mem_pool
#include "dsc/model.h"  // dsc_model_hooks, dsc_model_module
#include "dsc/status.h" // dsc_status

typedef struct dsc_gpt2_config {
    int n_layer, n_head, n_embd, vocab_size, max_seq_len;
    // activation checkpointing: keep each layer's input only, recompute the rest in the backward
    // (not a shape: the weights and the math are the same); 2: the device passes keep those
    // inputs on the host (cpu_checkpointing)
    int recompute;
    const struct dsc_lora *lora; // LoRA adapters (dsc_model_set_lora; borrowed), or NULL
} dsc_gpt2_config;

// spec: "gpt2-124M" (12 layers, 12 heads, 768 channels), "gpt2-350M" (24, 16, 1024), "gpt2-774M"
// (36, 20, 1280), "gpt2-1558M" (48, 25, 1600), or "dN" (N layers, N heads, 64N channels, N in
// 1..256). vocab_size and max_seq_len come from the caller (GPT-2: 50257 and 1024).
// A bad spec gives DSC_ERR_INVALID_ARG with a message listing the valid forms.
dsc_status dsc_gpt2_config_parse(const char *spec, int vocab_size, int max_seq_len,
                                 dsc_gpt2_config *out);

// Tensors in their fixed order: wte.weight (V, C), wpe.weight (maxT, C); per layer i the twelve
// h.i.* tensors (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj; weight then bias);
// then ln_f.weight, ln_f.bias. Groups: 0 = wte + wpe, 1 + i = layer i, n_layer + 1 = ln_f.
int dsc_gpt2_num_tensors(const dsc_gpt2_config *c);
int dsc_gpt2_num_groups(const dsc_gpt2_config *c); // n_layer + 2

typedef struct dsc_gpt2_tensor_info {
    char name[64];    // Hugging Face name, e.g. "h.3.attn.c_attn.weight"
    int ndim;         // 1 or 2
    int64_t shape[2]; // shape[1] is 0 when ndim == 1
    int64_t numel;
    int group;
} dsc_gpt2_tensor_info;

// i in [0, dsc_gpt2_num_tensors(c)); out is fully written.
void dsc_gpt2_tensor_info_get(const dsc_gpt2_config *c, int i, dsc_gpt2_tensor_info *out);
int64_t dsc_gpt2_num_params(const dsc_gpt2_config *c); // total elements of all tensors

// GPT-2 initialisation: weights normal(0, 0.02), the two residual projections (attn.c_proj and
// mlp.c_proj weights) normal(0, 0.02 / sqrt(2 * n_layer)), biases 0, layernorm weights 1.
// Counter-based and so order-free: element k of tensor i is a function of (seed, i, k) only
// (a splitmix64 hash of the three gives two uniforms per element pair, Box-Muller turns them
// into two normals), so any slice of any tensor can be initialised on its own, on any thread.
void dsc_gpt2_init_weights(const dsc_gpt2_config *c, float *const *params, uint64_t seed);
// Elements [begin, begin + count) of tensor i into dst[0 .. count); same values as above.
void dsc_gpt2_init_tensor(const dsc_gpt2_config *c, int i, float *dst, int64_t begin,
                          int64_t count, uint64_t seed);

// Hooks, all optional (NULL = none). forward calls gather(g) before it reads group g's parameters
// and release(g) after; backward does the same around its own reads of parameters (ZeRO-3 needs
// them there too), and calls grads_ready(g) once group g's gradients are complete, in the order
// ln_f, layer n_layer-1, ..., layer 0, embeddings. A hook's failure stops the pass and is returned.
// With a gather hook, the model reads params[i] (and, in backward, grads[i]) of group g only
// after gather(g) returned, so the hook may fill those entries of the arrays (ZeRO-3 gathers each
// group into a fresh buffer); without one, every entry must be valid for the whole pass.
typedef dsc_model_hooks dsc_gpt2_hooks; // {user, gather, release, grads_ready}

typedef struct dsc_gpt2 dsc_gpt2; // activations and scratch for up to B x T tokens

// Allocates everything for batches up to B sequences of up to T tokens (T <= max_seq_len).
// Caller owns *out; free it with dsc_gpt2_destroy.
dsc_status dsc_gpt2_create(dsc_gpt2 **out, const dsc_gpt2_config *c, int B, int T);
// The same with the activations as one block of `pool` (tag gpt2.activations; borrowed, it must
// outlive the model), e.g. the engine's (dsc_engine_mem_pool), so that they count and move with
// the engine's buffers. Each pass re-reads the block's address when the pool moved blocks since
// the last one; a move between a forward and its backward keeps the activations (they move with
// the block). A move must not happen during a pass.
dsc_status dsc_gpt2_create_in(dsc_gpt2 **out, const dsc_gpt2_config *c, int B, int T,
                              dsc_mem_pool *pool);
// Bytes of the host activations of dsc_gpt2_create_in for B x T tokens (a memory plan's count).
size_t dsc_gpt2_activation_bytes(const dsc_gpt2_config *c, int B, int T);

void dsc_gpt2_destroy(dsc_gpt2 *m); // NULL ok

// params[i] / grads[i]: tensor i (borrowed for the call). inputs, targets: (B, T) token ids in
// [0, vocab_size), copied; a negative target (DSC_GPT2_IGNORE, or any negative id: PyTorch's
// ignore_index) is left out of the loss and its gradient, and the loss is the mean over the
// targets that are not ignored (0 when all are). targets may be NULL: then no loss (*loss
// untouched), logits only. loss may be NULL. B, T may be smaller than at create.
dsc_status dsc_gpt2_forward(dsc_gpt2 *m, float *const *params, const int32_t *inputs,
                            const int32_t *targets, int B, int T, const dsc_gpt2_hooks *hooks,
                            float *loss);

// The same with position ids (B, T) in [0, max_seq_len), copied: token (b, t) adds wpe row
// positions[b, t] instead of t (e.g. restarting at 0 at each document of a packed row); NULL is
// dsc_gpt2_forward. The backward that follows scatters wpe's gradient to those rows.
dsc_status dsc_gpt2_forward_pos(dsc_gpt2 *m, float *const *params, const int32_t *inputs,
                                const int32_t *positions, const int32_t *targets, int B, int T,
                                const dsc_gpt2_hooks *hooks, float *loss);

#define DSC_GPT2_IGNORE (-1) // a target that does not count (e.g. a masked prompt token)

// Adds (+=) the gradients of loss_scale * mean loss to grads, so that gradient accumulation and
// loss scaling work. Must follow a forward with targets; overwrites the logits with their
// gradients (dsc_gpt2_logits is valid between a forward and the next backward).
dsc_status dsc_gpt2_backward(dsc_gpt2 *m, float *const *params, float *const *grads,
                             float loss_scale, const dsc_gpt2_hooks *hooks);

// (B, T, V) logits of the last forward; borrowed, see dsc_gpt2_backward.
const float *dsc_gpt2_logits(const dsc_gpt2 *m);

// Training FLOPs (forward + backward) per token at sequence length T: 6 N + 12 L C T, where N
// counts every parameter except wpe (a lookup, not a product; wte counts once, as lm_head) and
// the second term is attention's two T x T products, counted in full as PaLM's MFU does.
double dsc_gpt2_flops_per_token(const dsc_gpt2_config *c, int T);

// ---- profiling (the flops profiler) ----

// Forward timing slots, one per leaf module: 0 the embedding, then for layer l 1 + 4l ln_1,
// 2 + 4l attn, 3 + 4l ln_2, 4 + 4l mlp, then ln_f, then lm_head (logits and loss).
int dsc_gpt2_timing_slots(const dsc_gpt2_config *c); // 3 + 4 n_layer
// With times non-NULL (dsc_gpt2_timing_slots entries) each forward adds the seconds it spends
// in each leaf module to its slot (hooks excluded); NULL stops. times is borrowed until then.
void dsc_gpt2_set_timing(dsc_gpt2 *m, double *times);

// One module of the model's tree, Hugging Face's names and nesting, for B x T tokens.
// params: elements of the tensors it owns (lm_head: 0, it is tied to wte). fwd_flops: analytic,
// 2 per parameter per token used in a product (wpe and the wte lookup: 0; wte as lm_head: 2VC)
// plus attention's 4 T C per token. slot: timing slot of a leaf, or -1 (the sum of its children).
typedef dsc_model_module dsc_gpt2_module;
// The tree in print order (each parent before its children); returns the number of modules,
// which is also how many out must hold (out NULL: only the count). The fwd_flops of the root
// times 3 is dsc_gpt2_flops_per_token(c, T) * B * T, the trainer's MFU numerator.
int dsc_gpt2_modules(const dsc_gpt2_config *c, int B, int T, dsc_gpt2_module *out);

#endif
