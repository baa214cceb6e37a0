// model/llama/llama.h - the Llama family (Llama 3, SmolLM2, Qwen2, Qwen3) on the CPU:
// configuration, parameter table, initialisation, forward with fused cross-entropy, and backward
// that accumulates gradients; behind the model interface as the "llama" family (ops.c).
//
// A decoder block is RMSNorm, attention with rotary position embeddings (Hugging Face's
// rotate_half convention) and grouped-query heads (n_kv_head divides n_head; 1 = multi-query),
// RMSNorm, and a SwiGLU MLP (down(silu(gate(x)) * up(x))). No biases except Qwen2's q/k/v biases.
// Qwen3 adds an RMSNorm over each head's q and k vectors (weights of head_dim, shared by the
// heads) between the projections and the rotation.
//
// Parameters live outside the model, one buffer per tensor, named and shaped as Hugging Face's
// LlamaForCausalLM / Qwen2ForCausalLM (nn.Linear weights are (out, in)), so that a checkpoint
// loads and exports without transposes. The model owns only activations and scratch for the
// largest batch it was created for. The engine gathers and releases parameters per layer group
// through hooks; the model never assumes they stay resident.
//
// Threads: OpenMP tasks, each a single-threaded OpenBLAS call (model/blas.h), split by shape
// only, so results are bitwise identical from run to run and for any thread count.
//
// 16-bit training (bf16, fp16) is emulated by the engine, which rounds the weights it hands the
// model; the model computes in fp32 and needs nothing of its own for it.
#ifndef DSC_MODEL_LLAMA_H
#define DSC_MODEL_LLAMA_H

#include <stdint.h> // int32_t, int64_t, uint64_t

#include "dsc/memory.h" // dsc_mem_pool
#include "dsc/model.h"  // dsc_model_hooks, dsc_model_module
#include "dsc/status.h" // dsc_status

// rope_scaling of config.json: none, {"rope_type": "linear", "factor"} or {"rope_type": "llama3",
// "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}.
enum { DSC_LLAMA_ROPE_NONE, DSC_LLAMA_ROPE_LINEAR, DSC_LLAMA_ROPE_LLAMA3 };

typedef struct dsc_llama_config {
    int n_layer;      // num_hidden_layers
    int hidden;       // hidden_size
    int n_head;       // num_attention_heads
    int n_kv_head;    // num_key_value_heads, divides n_head
    int head_dim;     // head_dim (hidden / n_head where config.json has none)
    int intermediate; // intermediate_size
    int vocab_size;
    int max_seq_len;  // the longest sequence a model is created for (not a parameter shape)
    float rms_eps;    // rms_norm_eps
    double rope_theta;
    int rope_scaling; // DSC_LLAMA_ROPE_*
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; // llama3 uses all three
    int rope_original_max_pos; // llama3's original_max_position_embeddings
    int tied;     // tie_word_embeddings: lm_head is embed_tokens
    int qkv_bias; // q/k/v projections have biases (Qwen2)
    int qk_norm;  // per-head RMSNorm of q and k before the rotation (Qwen3), eps rms_eps
    int recompute; // activation checkpointing: keep each layer's input only, recompute the rest
                   // in the backward (not a shape: the weights and the math are the same);
                   // 2: the device passes keep those inputs in host memory (cpu_checkpointing)
    const struct dsc_lora *lora; // LoRA adapters (dsc_model_set_lora; borrowed), or NULL
    int fp8, fp8_margin; // the device passes' FP8 products (dsc_model_set_fp8; DSC_FP8_* of
                         // cuda/linear.h, 0 off) and their scales' margin (not a shape either)
} dsc_llama_config;

// spec: a published shape - "smollm2-135M", "smollm2-360M", "llama-3.2-1B", "llama-3.2-3B",
// "qwen2.5-0.5B", "llama-3.1-8B", "qwen3-0.6B", "qwen3-1.7B", "qwen3-4B", "qwen3-8B" (numbers
// from their config.json, see docs/models.md) - or "llama-dN": N layers, N heads of 64 channels
// (hidden 64N), N / 2 kv heads for even N and N for odd N, intermediate 8/3 hidden rounded up to
// a multiple of 64, theta 1e4, eps 1e-5, tied; N in 1..256; or "qwen3-dN": the same layers,
// hidden and kv heads with Qwen3's q/k norms, N heads of 128 channels (q wider than the hidden
// size, as qwen3-0.6B's), intermediate 3 hidden, theta 1e6, eps 1e-6, tied. vocab_size 0 keeps
// the published vocabulary (the tiny shapes have none: they need one); otherwise it replaces it
// (e.g. a tokenizer's). max_seq_len must be positive.
// A bad spec gives DSC_ERR_INVALID_ARG with a message listing the valid forms.
dsc_status dsc_llama_config_parse(const char *spec, int vocab_size, int max_seq_len,
                                  dsc_llama_config *out);

// Tensors in their fixed order: model.embed_tokens.weight (V, C); per layer i
// model.layers.i.input_layernorm.weight (C), self_attn.q_proj.weight (NH hd, C) [+ .bias],
// k_proj.weight (NKV hd, C) [+ .bias], v_proj.weight (NKV hd, C) [+ .bias], o_proj.weight
// (C, NH hd), [qk_norm: self_attn.q_norm.weight (hd), self_attn.k_norm.weight (hd)],
// post_attention_layernorm.weight (C), mlp.gate_proj.weight (I, C), mlp.up_proj.weight
// (I, C), mlp.down_proj.weight (C, I); then model.norm.weight (C) and, untied, lm_head.weight
// (V, C). Groups: 0 = embed_tokens, 1 + i = layer i, n_layer + 1 = norm (+ lm_head).
int dsc_llama_num_tensors(const dsc_llama_config *c);
int dsc_llama_num_groups(const dsc_llama_config *c); // n_layer + 2

typedef struct dsc_llama_tensor_info {
    char name[64];    // Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight"
    int ndim;         // 1 or 2
    int64_t shape[2]; // shape[1] is 0 when ndim == 1
    int64_t numel;
    int group;
} dsc_llama_tensor_info;

// i in [0, dsc_llama_num_tensors(c)); out is fully written.
void dsc_llama_tensor_info_get(const dsc_llama_config *c, int i, dsc_llama_tensor_info *out);
int64_t dsc_llama_num_params(const dsc_llama_config *c); // total elements of all tensors

// The tensors of a layer by kind, for code outside llama.c that reads them (inference).
enum {
    DSC_LLAMA_LN1, DSC_LLAMA_QW, DSC_LLAMA_QB, DSC_LLAMA_KW, DSC_LLAMA_KB, DSC_LLAMA_VW,
    DSC_LLAMA_VB, DSC_LLAMA_OW, DSC_LLAMA_LN2, DSC_LLAMA_GATE, DSC_LLAMA_UP, DSC_LLAMA_DOWN,
    DSC_LLAMA_QN, DSC_LLAMA_KN, // Qwen3's q_norm and k_norm (after o_proj in the table)
    DSC_LLAMA_NKINDS
};
// Table index of layer l's tensor of kind k, or -1 when the model has none (a bias without
// qkv_bias, a q/k norm without qk_norm); the final norm's index; lm_head's (0, embed_tokens,
// when tied).
int dsc__llama_layer_tensor(const dsc_llama_config *c, int l, int k);
int dsc__llama_norm_tensor(const dsc_llama_config *c);
int dsc__llama_head_tensor(const dsc_llama_config *c);
// "Qwen3", "Qwen2" or "Llama": the Hugging Face class prefix of c's model (profile.c).
const char *dsc__llama_family_name(const dsc_llama_config *c);
// The family's table (ops.c); a cfg of it starts with a dsc_llama_config.
extern const struct dsc_model_ops dsc__llama_model_ops;

// Initialisation as Hugging Face's (initializer_range 0.02): every matrix normal(0, 0.02),
// biases 0, RMSNorm weights 1. Counter-based and order-free as GPT-2's: element k of tensor i is
// a function of (seed, i, k) only, so any slice can be initialised on its own, on any thread.
void dsc_llama_init_weights(const dsc_llama_config *c, float *const *params, uint64_t seed);
// Elements [begin, begin + count) of tensor i into dst[0 .. count); same values as above.
void dsc_llama_init_tensor(const dsc_llama_config *c, int i, float *dst, int64_t begin,
                           int64_t count, uint64_t seed);

// Hooks, all optional (NULL = none), the engine's contract (dsc_model_hooks): forward calls
// gather(g) before it reads group g's parameters and release(g) after; backward does the same
// and calls grads_ready(g) once group g's gradients are complete, in the order n_layer + 1,
// layer n_layer - 1, ..., layer 0, embeddings. A hook's failure stops the pass and is returned.
typedef dsc_model_hooks dsc_llama_hooks; // {user, gather, release, grads_ready}

typedef struct dsc_llama dsc_llama; // activations and scratch for up to B x T tokens

// Allocates everything for batches up to B sequences of up to T tokens (T <= max_seq_len).
// Caller owns *out; free it with dsc_llama_destroy.
dsc_status dsc_llama_create(dsc_llama **out, const dsc_llama_config *c, int B, int T);
// The same with the activations as one block of `pool` (tag llama.activations; borrowed, it must
// outlive the model). Each pass re-reads the block's address when the pool moved blocks since the
// last one; a move between a forward and its backward keeps the activations (they move with the
// block). A move must not happen during a pass.
dsc_status dsc_llama_create_in(dsc_llama **out, const dsc_llama_config *c, int B, int T,
                               dsc_mem_pool *pool);
// Bytes of the host activations of dsc_llama_create_in for B x T tokens (a memory plan's count).
size_t dsc_llama_activation_bytes(const dsc_llama_config *c, int B, int T);

void dsc_llama_destroy(dsc_llama *m); // NULL ok

// params[i] / grads[i]: tensor i (borrowed for the call). inputs: (B, T) token ids in
// [0, vocab_size); targets: (B, T) ids in [0, vocab_size) or negative (an ignored position, as
// PyTorch's ignore_index: no loss, no gradient); both copied. Positions are 0 .. T-1 in each
// sequence. targets may be NULL: then no loss (*loss untouched), logits only. *loss is the mean
// over the positions whose target is not ignored (0 when all are). B, T may be smaller than at
// create.
dsc_status dsc_llama_forward(dsc_llama *m, float *const *params, const int32_t *inputs,
                             const int32_t *targets, int B, int T, const dsc_llama_hooks *hooks,
                             float *loss);

// The same with position ids pos (B, T) in [0, T of create), copied, choosing each token's rotary
// angle (e.g. restarting at 0 at each document of a packed row); the backward that follows uses
// them too. pos NULL is dsc_llama_forward.
dsc_status dsc_llama_forward_pos(dsc_llama *m, float *const *params, const int32_t *inputs,
                                 const int32_t *pos, const int32_t *targets, int B, int T,
                                 const dsc_llama_hooks *hooks, float *loss);

// Adds (+=) the gradients of loss_scale * mean loss to grads. Must follow a forward with
// targets; overwrites the logits with their gradients.
dsc_status dsc_llama_backward(dsc_llama *m, float *const *params, float *const *grads,
                              float loss_scale, const dsc_llama_hooks *hooks);

// (B, T, V) logits of the last forward; borrowed, valid until the next backward.
const float *dsc_llama_logits(const dsc_llama *m);

// Training FLOPs (forward + backward) per token at sequence length T:
//   6 N + 12 L NH hd T
// where N counts every parameter used in a product (the embedding table counts once when tied,
// as lm_head; untied, its lookup costs nothing and lm_head counts), and the second term is
// attention's two T x T products over NH query heads of hd channels (GQA shares K and V between
// heads but not the products), counted in full as PaLM's MFU does.
double dsc_llama_flops_per_token(const dsc_llama_config *c, int T);

// ---- profiling (the flops profiler) ----

// Forward timing slots, one per leaf module: 0 embed_tokens, then for layer l 1 + 4l
// input_layernorm, 2 + 4l self_attn, 3 + 4l post_attention_layernorm, 4 + 4l mlp, then norm,
// then lm_head (logits and loss).
int dsc_llama_timing_slots(const dsc_llama_config *c); // 3 + 4 n_layer
// With times non-NULL each forward adds the seconds it spends in each leaf module to its slot
// (hooks excluded); NULL stops. times is borrowed until then.
void dsc_llama_set_timing(dsc_llama *m, double *times);

// One module of the model's tree, Hugging Face's names and nesting, for B x T tokens: name
// ("model.layers.3.self_attn"), type ("LlamaAttention"), depth, params (a tied lm_head: 0),
// fwd_flops (2 per parameter per token used in a product, plus attention's 4 T NH hd), slot.
typedef dsc_model_module dsc_llama_module;
// The tree in print order (each parent before its children); returns the number of modules
// (out NULL: only the count). The root's fwd_flops times 3 is
// dsc_llama_flops_per_token(c, T) * B * T.
int dsc_llama_modules(const dsc_llama_config *c, int B, int T, dsc_llama_module *out);

#endif
