// dsc/model.h - models behind one interface: a family is a table of functions (struct
// dsc_model_ops), a model is a handle made from a spec string ("d4", "gpt2-124M") or from a
// table of tensors (a checkpoint's, a safetensors file's), and everything that needs a model -
// `dsc train`, dsc_generate, `dsc generate`, the flops profiler - goes through the dsc_model_*
// calls below, never through a family's own functions.
//
// A model describes its parameters as the engine wants them (Hugging Face names, shapes, layer
// groups in forward order: dsc_model_param_descs gives dsc_engine_opts.params directly),
// initialises them, runs forward and backward on the host with the engine's hooks (gather before
// a group's weights are read, release after, grads_ready when a group's gradients are complete),
// gives its training FLOPs per token and its module tree for the flops profiler, and runs
// inference with a key/value cache (prefill and decode steps are calls with rows of tokens).
//
// Parameters live outside the model, one fp32 buffer per tensor, in the model's tensor order,
// passed to each call (the engine owns them). The model owns its configuration and, after
// dsc_model_reserve, the activations of host passes.
//
// A family may also train on a GPU: its table then points to a second table of device passes
// (struct dsc_model_device_ops: 16-bit weights, fp32 gradients, every kernel on one stream), and
// the GPU trainer drives any such model through the dsc_model_device_* calls below. That table
// may point to a third, the family's GPU decoder (struct dsc_model_decode_ops: prefill, decode
// steps, cache size), which `dsc generate --device cuda` drives through dsc_model_decode_*.
#ifndef DSC_MODEL_H
#define DSC_MODEL_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint16_t, uint64_t

#include "dsc/comm.h"   // dsc_comm
#include "dsc/engine.h" // dsc_param_desc, DSC_PARAM_NAME_MAX, DSC_PARAM_MAX_DIMS
#include "dsc/memory.h" // dsc_mem_pool
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_model dsc_model;       // a family's configuration (+ host activations)
typedef struct dsc_model_kv dsc_model_kv; // a key/value cache of a model

typedef struct dsc_model_opts {
    int vocab_size;  // tokens of the vocabulary; 0: the family's own (GPT-2: 50257)
    int max_seq_len; // the context; 0: the family's own (GPT-2: 1024)
    int n_head;      // from a tensor table only: attention heads; 0: the family's rule
} dsc_model_opts;

// The model's shape in the terms every decoder family shares (family-specific details stay in
// the family's configuration).
typedef struct dsc_model_info {
    const char *family; // "gpt2" (static)
    int n_layer, n_head, n_embd, vocab_size, max_seq_len;
    int num_tensors; // parameter tensors
    int num_groups;  // layer groups: the embeddings, each layer, the head
    int64_t num_params; // elements of all tensors
} dsc_model_info;

typedef struct dsc_model_param {
    char name[DSC_PARAM_NAME_MAX]; // Hugging Face name, e.g. "h.3.attn.c_attn.weight"
    int ndim;
    int64_t shape[DSC_PARAM_MAX_DIMS]; // entries past ndim are 0
    int64_t numel;
    int group; // layer group, in the order forward uses them
    bool frozen; // not trained (LoRA's base): no gradient, no master, no optimizer state
} dsc_model_param;

// ---- LoRA (low-rank adapters beside a frozen base; docs/lora.md) ----
//
// dsc_model_set_lora gives each targeted linear weight W (out x in) two tensors appended after
// the family's own, A (r x in, "<module>.lora_A.weight") and B (out x r, "<module>.lora_B.weight"),
// in W's layer group, and marks every other tensor frozen except those of modules_to_save. The
// layer then computes y = x W^T (+ bias) + scale * (x A^T) B^T, scale = alpha / r (alpha /
// sqrt(r) with rslora). A family calls dsc_lora_forward right after each linear product of its
// forward and dsc_lora_backward right after the matching product of its backward (a tensor
// without an adapter: nothing happens), and skips the gradient of a frozen tensor (its grads
// entry is NULL).
typedef struct dsc_model_lora {
    int r;
    double alpha;
    bool rslora;
    const char *const *targets; // module names ("q_proj", "c_attn"); NULL: "all-linear"
    int ntargets;
    const char *const *save;    // modules_to_save ("lm_head", "embed_tokens")
    int nsave;
    int init;                   // 0 PEFT's default (A Kaiming-uniform, B zero), 1 gaussian A,
                                // 2 both random (init_lora_weights false)
    double dropout;             // lora_dropout: on each adapter's input while training, [0, 1)
    uint64_t seed;              // of the dropout masks (give each rank its own)
} dsc_model_lora;
typedef struct dsc_lora dsc_lora; // a model's adapters and their activations

// Adds the adapter's term to out (N rows of ldo) for the input inp (N rows of ldi) of base
// tensor `tensor`, keeping x A^T for the backward.
void dsc_lora_forward(const dsc_lora *lo, int tensor, float *out, int ldo, const float *inp,
                      int ldi, int64_t N);
// dout (N rows of ldd) is the gradient of the product's output, inp its input as in the forward:
// the adapter's gradients are added, and so is its part of the input gradient into dinp (N rows
// of lddi), unless dinp is NULL. Call before dinp's buffer is reused as inp's.
void dsc_lora_backward(const dsc_lora *lo, int tensor, float *dinp, int lddi, const float *dout,
                       int ldd, const float *inp, int ldi, int64_t N);
// The two halves of dsc_lora_backward, for a family that overwrites the product's input with
// its gradient: weights first (while inp is intact), then the input gradient.
void dsc_lora_backward_weights(const dsc_lora *lo, int tensor, const float *dout, int ldd,
                               const float *inp, int ldi, int64_t N);
void dsc_lora_backward_input(const dsc_lora *lo, int tensor, float *dinp, int lddi, int64_t N);

// The engine's hooks around a pass, all optional (NULL = none). forward calls gather(g) before it
// reads group g's parameters and release(g) after; backward does the same around its own reads,
// and calls grads_ready(g) once group g's gradients are complete (groups in reverse order). With
// a gather hook the model reads params[i] (and grads[i]) of group g only after gather(g)
// returned, so the hook may fill those entries (ZeRO-3 gathers into fresh buffers); without one
// every entry must be valid for the whole pass. A hook's failure stops the pass and is returned.
typedef struct dsc_model_hooks {
    void *user;
    dsc_status (*gather)(void *user, int group);
    dsc_status (*release)(void *user, int group);
    dsc_status (*grads_ready)(void *user, int group);
} dsc_model_hooks;

// One module of the model's tree for the flops profiler (Hugging Face's names and nesting).
typedef struct dsc_model_module {
    char name[64];    // "transformer.h.3.attn"
    char type[32];    // "GPT2Attention"
    int depth;        // 0 for the whole model
    int64_t params;   // elements of the tensors it owns
    double fwd_flops; // analytic forward FLOPs for the B x T tokens asked for
    int slot;         // timing slot of a leaf (dsc_model_set_timing), or -1 (sum of children)
} dsc_model_module;

// Tensor parallelism of inference: each rank of the group holds its slice of the weights.
typedef struct dsc_model_tp {
    int rank, size; // size 1: none
    dsc_comm *comm; // borrowed; the group's ranks in rank order (NULL when size is 1)
} dsc_model_tp;

// Rows of an inference call, each one token of one sequence at one position. A prompt is one
// call with all its rows (prefill); each generated token is one more row (a decode step).
// Sequences of different lengths share calls. See dsc_model_infer.
typedef struct dsc_model_rows {
    int n;                 // rows
    const int32_t *seq;    // (n) sequence of each row, 0 .. nseq-1
    const int32_t *pos;    // (n) position, 0 .. max_len-1
    const int32_t *tokens; // (n) token ids
    int nout;              // rows whose logits are wanted
    const int32_t *out;    // (nout) indices into the rows
} dsc_model_rows;

// ---- a family: the table it implements ----
//
// cfg is the family's configuration (made by config_parse or config_from_params, freed by
// config_free); state its host activations (host_create / host_destroy); kv its cache. Every
// slot is required unless it says otherwise.
struct dsc_model_ops {
    const char *family; // "gpt2"
    const char *specs;  // the specs it takes, for messages ("gpt2-124M, ..., or dN (...)")
    // Whether spec names a model of this family (the registry asks each family in turn).
    bool (*claims)(const char *spec);
    // The shape from a spec string; DSC_ERR_INVALID_ARG naming the spec and the valid forms.
    dsc_status (*config_parse)(const char *spec, const dsc_model_opts *o, void **cfg);
    // The shape from a table of tensors (names, shapes; any order), with order[k] = the table
    // index of the model's tensor k. DSC_ERR_UNSUPPORTED when the table is not this family's,
    // DSC_ERR_INVALID_ARG (naming `what` and the tensor) when it is but does not fit together.
    dsc_status (*config_from_params)(const dsc_param_desc *t, int count, const dsc_model_opts *o,
                                     const char *what, void **cfg, int *order);
    void (*config_free)(void *cfg);
    void (*describe)(const void *cfg, dsc_model_info *out);
    void (*param)(const void *cfg, int i, dsc_model_param *out);
    // Elements [begin, begin + count) of tensor i's initial value; order-free (any slice alone).
    void (*init)(const void *cfg, int i, float *dst, int64_t begin, int64_t count, uint64_t seed);
    double (*flops_per_token)(const void *cfg, int T); // training (forward + backward)
    int (*modules)(const void *cfg, int B, int T, dsc_model_module *out);
    int (*timing_slots)(const void *cfg);

    // Host passes (fp32).
    dsc_status (*host_create)(const void *cfg, int B, int T, dsc_mem_pool *pool, void **state);
    void (*host_destroy)(void *state);
    // pos: (B, T) position ids, or NULL for 0 .. T-1 in every row (see dsc_model_forward_pos);
    // a family without positions of its own may ignore them.
    dsc_status (*forward)(void *state, float *const *params, const int32_t *inputs,
                          const int32_t *pos, const int32_t *targets, int B, int T,
                          const dsc_model_hooks *hooks, float *loss);
    dsc_status (*backward)(void *state, float *const *params, float *const *grads,
                           float loss_scale, const dsc_model_hooks *hooks);
    const float *(*logits)(void *state);
    void (*set_timing)(void *state, double *times);

    // Passes on a GPU (optional; NULL: the family trains on the host only). See
    // struct dsc_model_device_ops below.
    const struct dsc_model_device_ops *device;

    // Inference with a key/value cache, optionally tensor-parallel.
    dsc_status (*tp_check)(const void *cfg, int size);
    int64_t (*tp_numel)(const void *cfg, int i, int size);
    void (*tp_slice)(const void *cfg, int i, int rank, int size, const float *full, float *dst);
    size_t (*kv_bytes)(const void *cfg, int tp_size, int nseq, int max_len);
    dsc_status (*kv_create)(const void *cfg, int tp_size, int nseq, int max_len, void **kv);
    void (*kv_destroy)(void *kv);
    bool (*kv_fits)(const void *kv, const void *cfg, int tp_size, int nseq, int max_len);
    dsc_status (*infer)(void *kv, float *const *params, const dsc_model_tp *tp,
                        const dsc_model_rows *rows, const dsc_model_hooks *hooks, float *logits);

    // Hugging Face folders (optional; NULL: the family reads and writes none).
    // The shape from a folder's config.json (path: the file): DSC_ERR_UNSUPPORTED when it names
    // another family's architecture; otherwise an error naming the field, its value and what the
    // family supports.
    dsc_status (*config_from_hf)(const char *path, const dsc_model_opts *o, void **cfg);
    // The config.json (and generation_config.json) text of the model, malloc'd (caller frees),
    // as transformers writes them for its architecture.
    dsc_status (*hf_config)(const void *cfg, char **config_json, char **generation_json);

    // Bytes host_create takes for B x T tokens (optional; NULL: dsc_model_activation_bytes
    // estimates them from the shape), so that a memory plan counts them before allocating.
    size_t (*act_bytes)(const void *cfg, int B, int T);

    // Activation checkpointing (optional; NULL: the family keeps every layer's activations):
    // with on, the passes made from cfg afterwards keep only each layer's input and run the
    // layer's forward again in the backward; act_bytes counts the smaller activations. The
    // gradients must equal those without it bit for bit (the same kernels run again).
    void (*set_recompute)(void *cfg, bool on);
    // With set_recompute on (optional; NULL: the kept inputs stay where the passes run): the
    // device passes made from cfg afterwards keep each layer's input in host memory instead
    // (activation_checkpointing.cpu_checkpointing), copied out on a side stream as the forward
    // goes and back one layer ahead of the backward; the host passes' inputs are on the host
    // already. Gradients equal those without it bit for bit.
    void (*set_recompute_host)(void *cfg, bool on);

    // LoRA (optional; NULL: the family takes no adapters): the passes made from cfg afterwards
    // call dsc_lora_forward / dsc_lora_backward with lora (borrowed; NULL: none) around their
    // linear products and accept NULL gradient entries for frozen tensors.
    void (*set_lora)(void *cfg, const dsc_lora *lora);
    // Linear weights are stored (in, out) (GPT-2's Conv1D) rather than (out, in).
    bool weights_in_out;

    // FP8 products (optional; NULL: the family computes in 16-bit only): the device passes made
    // from cfg afterwards run their transformer layers' linear products with FP8 operands,
    // format DSC_MODEL_FP8_HYBRID (E4M3 forward, E5M2 gradients) or DSC_MODEL_FP8_E4M3
    // (E4M3 throughout), 0 off; each operand scaled per tensor by its format's largest value /
    // its absolute maximum / 2^margin just before its product (docs/fp8.md). The output head,
    // norms, attention and LoRA's adapters stay in 16-bit; the host passes ignore it.
    void (*set_fp8)(void *cfg, int format, int margin);
};

enum { DSC_MODEL_FP8_OFF = 0, DSC_MODEL_FP8_HYBRID = 1, DSC_MODEL_FP8_E4M3 = 2 };

// ---- a family on a GPU ----
//
// The device passes of a family: the same model as its host passes, computing in 16-bit (bf16,
// or IEEE fp16 after set_fp16) with fp32 statistics, on one stream. The caller keeps the fp32
// master weights and hands each pass a 16-bit copy of every tensor (params[i], device memory,
// the model's tensor order) and an fp32 gradient buffer per tensor (grads[i]). Activations are
// kept from forward to backward. The only host synchronisation of a pass is a loss read.
//
// Layer groups: the device trainer lays a model out as n_layer + 2 groups (dsc_model_info's
// num_groups == n_layer + 2, n_layer >= 0): group 0 before the layers and group n_layer + 1
// after them stay on the device whole, groups 1 .. n_layer are the layers (layer l is group
// l + 1), which ZeRO-3 over nccl and parameter offload stream through two slots. Any model fits
// it: a model without repeated layers has n_layer 0 (two groups) or counts its middle groups as
// layers. dsc_device_trainer_create refuses another layout, naming the counts.
//
// Hooks, called on the host while a pass is being enqueued:
// - grad hook: once per layer group, right after the last kernel that writes that group's
//   gradients was enqueued, in the order backward completes them (the last group first, group
//   0 last); it typically records an event and starts reductions or copies on another stream.
// - layer hook: before each layer's kernels, pass 0 (forward) for layers 0 .. n_layer - 1 and then
//   n_layer, pass 1 (backward) for layers n_layer - 1 .. 0 and then -1. It may repoint that
//   layer's entries of params (and in backward grads): the model reads them after the hook
//   (ZeRO-3 and parameter offload stream layer weights through a few buffers this way).
// A hook's failure ends the pass with its status.
typedef dsc_status (*dsc_model_grad_hook)(void *user, int group);
typedef dsc_status (*dsc_model_layer_hook)(void *user, int pass, int layer);

struct dsc_model_device_ops {
    // Activations and scratch for up to B x T tokens on the current device; every device buffer
    // from pool (a device pool that never moves blocks) or cudaMalloc when pool is NULL; stream
    // is the cudaStream_t of every pass (borrowed).
    dsc_status (*create)(const void *cfg, int B, int T, void *stream, dsc_mem_pool *pool,
                         void **dev);
    void (*destroy)(void *dev); // waits for the stream first
    void (*set_fp16)(void *dev, bool on);
    // on: backward writes (=) the gradients instead of adding (+=) to them (a step's first
    // micro-step), so that nobody zeroes them between steps.
    void (*set_grads_fresh)(void *dev, bool on);
    void (*set_grad_hook)(void *dev, dsc_model_grad_hook fn, void *user);
    void (*set_layer_hook)(void *dev, dsc_model_layer_hook fn, void *user);
    // inputs, targets: HOST (B, T) token ids, checked and copied; a negative target is ignored
    // (the loss is the mean over the others); targets NULL: logits only. loss: NULL, or the mean
    // loss read now (the host waits for the stream).
    dsc_status (*forward)(void *dev, const uint16_t *const *params, const int32_t *inputs,
                          const int32_t *targets, int B, int T, float *loss);
    // grads += the gradients of loss_scale * mean loss (= when fresh); follows a forward with
    // targets.
    dsc_status (*backward)(void *dev, const uint16_t *const *params, float *const *grads,
                           float loss_scale);
    // forward with targets and backward in one call (bitwise the same as the two), loss read at
    // the end (NULL: not read; read_loss reads it later).
    dsc_status (*train_step)(void *dev, const uint16_t *const *params, float *const *grads,
                             const int32_t *inputs, const int32_t *targets, int B, int T,
                             float loss_scale, float *loss);
    dsc_status (*read_loss)(void *dev, float *loss); // the last forward's mean loss (waits)
    // The same mean as a device float (*loss_dev, valid until the next forward), not read.
    dsc_status (*loss_enqueue)(void *dev, const float **loss_dev);

    // Generation on the GPU (optional; NULL: the family generates on the host only). See
    // struct dsc_model_decode_ops below.
    const struct dsc_model_decode_ops *decode;
    // Bytes create takes for B x T tokens (optional; NULL: dsc_model_activation_bytes
    // estimates them from the shape), so that a memory plan counts them before allocating.
    size_t (*act_bytes)(const void *cfg, int B, int T);
    // The device passes honour the family's set_recompute (activation checkpointing): each
    // layer recomputed in the backward from its kept input, gradients bitwise those without.
    bool recomputes;
    // The device passes apply the LoRA adapters the family's set_lora gave its config (beside
    // every adapted product) and take NULL gradient entries for frozen tensors, computing no
    // weight gradient for them. false: a model with adapters trains on the CPU only.
    bool adapters;
    // Position ids for the passes that follow (optional; NULL: the family's passes take none, and
    // a run with --restart-positions is refused on the GPU): pos HOST (B, T) of the next
    // forward / train_step, each in [0, T of create), read at that call; NULL: 0 .. T-1 in every
    // row (the default). The backward uses the forward's.
    void (*set_positions)(void *dev, const int32_t *pos);
    // Host bytes create takes for B x T tokens (optional; NULL: none): the layer inputs kept on
    // the host under the family's set_recompute_host, for a memory plan.
    size_t (*act_host_bytes)(const void *cfg, int B, int T);
    // The device passes honour the family's set_fp8 (act_bytes counts the FP8 scratch), and
    // create refuses a GPU without FP8 tensor cores.
    bool fp8;
};

// ---- a family's decoder on a GPU ----
//
// Generation with a key/value cache on one GPU, in bf16 with fp32 logits: a prompt pass
// (prefill) that fills the cache, then one token per sequence per step. Sequences are the rows
// 0 .. n-1 of the decoder (n <= batch), each with its own length. Weights are the bf16 device
// copies of every tensor (params[i], the model's tensor order, borrowed for each call). prefill
// and step only enqueue work on the decoder's stream; argmax and logits wait for it once.
typedef struct dsc_model_decode_opts {
    int batch;          // rows (sequences) at most, >= 1
    int max_len;        // positions per row the cache holds, 1 .. max_seq_len
    bool recompute;     // no cache reuse: every pass recomputes the rows' whole sequences (the
                        // reference the cache is compared against; slow)
    bool no_graph;      // launch a step's kernels one by one (a family without graphs ignores it)
    void *stream;       // cudaStream_t to run on (borrowed); NULL: the decoder makes its own
    dsc_mem_pool *pool; // device pool of every buffer (it must never move blocks); NULL: cudaMalloc
} dsc_model_decode_opts;

struct dsc_model_decode_ops {
    // The cache and a step's buffers on the current device; DSC_ERR_INVALID_ARG naming what the
    // family's kernels do not take (head size, sizes).
    dsc_status (*create)(const void *cfg, const dsc_model_decode_opts *o, void **dec);
    void (*destroy)(void *dec); // waits for the stream first
    // Bytes of the cache for batch rows of max_len positions (the family's layout).
    size_t (*kv_bytes)(const void *cfg, int batch, int max_len);
    // The prompts of rows 0 .. n-1: tokens[b] (HOST, lens[b] ids, 1 <= lens[b] <= max_len),
    // copied. Afterwards the cache holds positions 0 .. lens[b]-1 of row b; the result is the
    // logits of position lens[b]-1.
    dsc_status (*prefill)(void *dec, const uint16_t *const *params, const int32_t *const *tokens,
                          const int *lens, int n);
    // One token per row b < n: tokens[b] at position pos[b] (HOST, copied); positions before it
    // were written by the prefill or earlier steps. The result is that position's logits. A row
    // whose sequence ended may be fed its last token again at its last position: rows are
    // independent.
    dsc_status (*step)(void *dec, const uint16_t *const *params, const int32_t *tokens,
                       const int32_t *pos, int n);
    // The last pass's result for its n rows, waiting for the stream: each row's most likely
    // token (the lowest id on ties), or the logits, (n, vocab_size) fp32 row-major.
    dsc_status (*argmax)(void *dec, int32_t *tokens);
    dsc_status (*logits)(void *dec, float *logits);
    // Steps so far that replayed a captured CUDA graph (optional; NULL: the family has none).
    long (*graph_replays)(const void *dec);
};

// ---- the registry ----

// Add a family (borrowed: it must outlive every model made from it); its specs are tried before
// the built-in families'. DSC_ERR_INVALID_ARG when a required slot is missing (naming it), or
// the family's name is taken.
dsc_status dsc_model_register(const struct dsc_model_ops *ops);
// The families, registered ones first: i in [0, dsc_model_num_families()).
int dsc_model_num_families(void);
const struct dsc_model_ops *dsc_model_family(int i);

// ---- a model ----

// The model a spec names (the first family that claims it); opts may be NULL (the family's
// defaults). "hf:DIR" is a Hugging Face model folder: DIR/config.json gives the architecture
// and the shape (opts' vocab_size and max_seq_len are then ignored); its weights are not read
// here (dsc_model_hf_weights names them). DSC_ERR_INVALID_ARG naming the spec and every family's
// valid specs. Caller owns *out.
dsc_status dsc_model_create(dsc_model **out, const char *spec, const dsc_model_opts *opts);
// The model whose parameters a table holds (a checkpoint's, a file's): the first family that
// recognises it. order[k] (num_tensors entries, at least count) receives the table index of the
// model's tensor k. what names the source in errors.
dsc_status dsc_model_create_from_params(dsc_model **out, const dsc_param_desc *table, int count,
                                        const dsc_model_opts *opts, const char *what, int *order);
void dsc_model_destroy(dsc_model *m); // NULL ok; also frees the host activations

// The Hugging Face folder a model was made from ("hf:DIR" -> "DIR"), or NULL.
const char *dsc_model_hf_dir(const dsc_model *m);
// The model's config.json and generation_config.json texts (malloc'd, caller frees), as
// transformers would save them: what an export puts beside the weights. A model made from a
// folder (hf:DIR) gives DIR's own config.json with every field kept, in the transformers 4.x and
// 5.x spellings at once. DSC_ERR_UNSUPPORTED when the family writes none.
dsc_status dsc_model_hf_config(const dsc_model *m, char **config_json, char **generation_json);

const dsc_model_info *dsc_model_describe(const dsc_model *m); // borrowed from m
const char *dsc_model_spec(const dsc_model *m); // as created ("d4"), or "(tensors)"
// Tensor i in [0, num_tensors): borrowed from m.
const dsc_model_param *dsc_model_param_get(const dsc_model *m, int i);
// The engine's parameter table: out[0 .. num_tensors), names borrowed from m.
void dsc_model_param_descs(const dsc_model *m, dsc_param_desc *out);

// Initial weights: params[i] (num_tensors entries, each numel floats) are written.
void dsc_model_init_weights(const dsc_model *m, float *const *params, uint64_t seed);
// Elements [begin, begin + count) of tensor i; the same values as dsc_model_init_weights.
void dsc_model_init_tensor(const dsc_model *m, int i, float *dst, int64_t begin, int64_t count,
                           uint64_t seed);

// Training FLOPs (forward + backward) per token at sequence length T (MFU's numerator).
double dsc_model_flops_per_token(const dsc_model *m, int T);
// The module tree in print order (each parent before its children) for B x T tokens; returns
// the number of modules, which is how many out must hold (out NULL: only the count).
int dsc_model_modules(const dsc_model *m, int B, int T, dsc_model_module *out);
int dsc_model_timing_slots(const dsc_model *m); // entries of dsc_model_set_timing's array

// ---- host passes ----

// Activations and scratch for host passes of up to B sequences of T tokens, as one block of pool
// (borrowed; it must outlive the model), or malloc'd when pool is NULL. Once per model.
dsc_status dsc_model_reserve(dsc_model *m, int B, int T, dsc_mem_pool *pool);
// params[i] / grads[i]: tensor i (borrowed for the call). inputs, targets: (B, T) token ids,
// copied; targets NULL: logits only (*loss untouched). loss may be NULL. B, T up to the reserve.
// A negative target is ignored (a masked prompt token): the loss is the mean over the others.
dsc_status dsc_model_forward(dsc_model *m, float *const *params, const int32_t *inputs,
                             const int32_t *targets, int B, int T, const dsc_model_hooks *hooks,
                             float *loss);
// The same with position ids pos (B, T) in [0, max_seq_len), copied (e.g. restarting at 0 at each
// document of a packed row); NULL is dsc_model_forward. The backward that follows uses them too.
dsc_status dsc_model_forward_pos(dsc_model *m, float *const *params, const int32_t *inputs,
                                 const int32_t *pos, const int32_t *targets, int B, int T,
                                 const dsc_model_hooks *hooks, float *loss);
// Adds (+=) the gradients of loss_scale * mean loss into grads; follows a forward with targets
// (one backward per such forward: it consumes the logits).
dsc_status dsc_model_backward(dsc_model *m, float *const *params, float *const *grads,
                              float loss_scale, const dsc_model_hooks *hooks);
// (B, T, V) logits of the last forward (borrowed; valid until the next backward or forward).
const float *dsc_model_logits(dsc_model *m);
// With times non-NULL (dsc_model_timing_slots entries) each forward adds the seconds spent in
// each leaf module to its slot; NULL stops. times is borrowed until then.
void dsc_model_set_timing(dsc_model *m, double *times);

// Activation checkpointing (DeepSpeed's activation_checkpointing section): each transformer
// layer's activations are recomputed in the backward from the layer's saved input, so that only
// the inputs are kept between the passes. Before dsc_model_reserve / dsc_model_device_create.
// DSC_ERR_UNSUPPORTED naming the family when it cannot recompute its layers (on false: DSC_OK).
dsc_status dsc_model_set_recompute(dsc_model *m, bool on);
// Whether the model's passes recompute their layers (dsc_model_set_recompute).
bool dsc_model_recomputes(const dsc_model *m);
// activation_checkpointing.cpu_checkpointing: with recompute on, the device passes keep the
// layers' inputs in host memory (see dsc_model_ops.set_recompute_host). Before
// dsc_model_device_create. DSC_ERR_UNSUPPORTED naming the family when it cannot (on false: DSC_OK).
dsc_status dsc_model_set_recompute_host(dsc_model *m, bool on);
// Whether the model's device passes can keep the inputs on the host (set_recompute_host).
bool dsc_model_device_recomputes_host(const dsc_model *m);

// FP8 products on the GPU (dsc's fp8 section): format DSC_MODEL_FP8_* (0 off), margin >= 0 (see
// dsc_model_ops.set_fp8). Before dsc_model_device_create. DSC_ERR_UNSUPPORTED naming the family
// when its device passes have no FP8 products (format 0: DSC_OK).
dsc_status dsc_model_set_fp8(dsc_model *m, int format, int margin);
// The FP8 format the device passes use (0: none).
int dsc_model_fp8(const dsc_model *m);

// Training mode (the default, as torch's modules start) or evaluation: LoRA's dropout acts in the
// forwards of training mode only. A forward and the backward after it use the same masks.
void dsc_model_set_training(dsc_model *m, bool on);

// LoRA: adapters on the linear modules named in o (see dsc_model_lora), before
// dsc_model_reserve. Afterwards dsc_model_describe and dsc_model_param_get list the adapters
// after the family's tensors, and the passes take params/grads arrays of all of them (grads of
// frozen tensors NULL). DSC_ERR_CONFIG naming the module and what exists when a name matches
// nothing; DSC_ERR_UNSUPPORTED when the family takes no adapters.
dsc_status dsc_model_set_lora(dsc_model *m, const dsc_model_lora *o);
// The model's adapters (NULL: none), and the base tensor index of adapter tensor i (A or B), or -1.
const dsc_lora *dsc_model_lora_of(const dsc_model *m);
int dsc_lora_base_of(const dsc_lora *lo, int i);
int dsc_lora_rank(const dsc_lora *lo);
double dsc_lora_scale(const dsc_lora *lo);
double dsc_lora_alpha(const dsc_lora *lo); // lora_alpha as given
bool dsc_lora_rslora(const dsc_lora *lo);
double dsc_lora_dropout(const dsc_lora *lo);

// The host layer loop of the built-in families, for a family of one's own: layer l is hook
// group 1 + l. Forward runs layer(state, params, l) for l = 0 .. L-1, each between its group's
// gather and release; backward runs L-1 .. 0 the same way, calling grads_ready after each, and
// with recompute non-NULL (activation checkpointing: the family's layer forward, which then
// writes into one activation block shared by all layers) runs recompute(state, params, l)
// first, inside the same gather. A hook's failure stops the loop, its message prefixed with
// family, hook and group.
dsc_status dsc_model_layers_forward(const dsc_model_hooks *hooks, const char *family, int L,
                                    void (*layer)(void *state, float *const *params, int l),
                                    void *state, float *const *params);
dsc_status dsc_model_layers_backward(const dsc_model_hooks *hooks, const char *family, int L,
                                     void (*layer)(void *state, float *const *params,
                                                   float *const *grads, int l),
                                     void (*recompute)(void *state, float *const *params, int l),
                                     void *state, float *const *params, float *const *grads);
// Whether the model's device passes can recompute their layers (dsc_model_device_ops.recomputes).
bool dsc_model_device_recomputes(const dsc_model *m);

// Bytes of the activations and scratch of a micro-batch of B sequences of T tokens: of host
// passes (dsc_model_reserve) or, with device, of device passes (dsc_model_device_create); the
// family's own count, else an estimate from the shape (a decoder's usual buffers per token and
// layer, and the logits). Used by the memory plan (dsc/memplan.h).
size_t dsc_model_activation_bytes(const dsc_model *m, int B, int T, bool device);
// Host bytes the device passes take for B x T tokens (the layer inputs kept on the host under
// dsc_model_set_recompute_host; 0 otherwise).
size_t dsc_model_activation_host_bytes(const dsc_model *m, int B, int T);

// ---- device passes ----

typedef struct dsc_model_device dsc_model_device; // a model's device activations on one GPU

// Whether the model's family has device passes (in this build).
bool dsc_model_has_device(const dsc_model *m);
// Whether its device passes apply LoRA adapters (struct dsc_model_device_ops, adapters).
bool dsc_model_has_device_adapters(const dsc_model *m);
// Whether its device passes take position ids (struct dsc_model_device_ops, set_positions).
bool dsc_model_has_device_positions(const dsc_model *m);
// Device activations for up to B x T tokens (see struct dsc_model_device_ops.create).
// DSC_ERR_UNSUPPORTED naming the model when its family has no device passes. Caller owns *out.
dsc_status dsc_model_device_create(dsc_model_device **out, const dsc_model *m, int B, int T,
                                   void *stream, dsc_mem_pool *pool);
void dsc_model_device_destroy(dsc_model_device *d); // NULL ok
void dsc_model_device_set_fp16(dsc_model_device *d, bool on);
void dsc_model_device_set_grads_fresh(dsc_model_device *d, bool on);
void dsc_model_device_set_grad_hook(dsc_model_device *d, dsc_model_grad_hook fn, void *user);
void dsc_model_device_set_layer_hook(dsc_model_device *d, dsc_model_layer_hook fn, void *user);
// Position ids of the passes that follow (see set_positions above; NULL: 0 .. T-1).
// DSC_ERR_UNSUPPORTED for ids when the family's device passes take none.
dsc_status dsc_model_device_set_positions(dsc_model_device *d, const int32_t *pos);
dsc_status dsc_model_device_forward(dsc_model_device *d, const uint16_t *const *params,
                                    const int32_t *inputs, const int32_t *targets, int B, int T,
                                    float *loss);
dsc_status dsc_model_device_backward(dsc_model_device *d, const uint16_t *const *params,
                                     float *const *grads, float loss_scale);
dsc_status dsc_model_device_train_step(dsc_model_device *d, const uint16_t *const *params,
                                       float *const *grads, const int32_t *inputs,
                                       const int32_t *targets, int B, int T, float loss_scale,
                                       float *loss);
dsc_status dsc_model_device_read_loss(dsc_model_device *d, float *loss);
dsc_status dsc_model_device_loss_enqueue(dsc_model_device *d, const float **loss_dev);

// ---- the device layer driver, for a family of one's own ----
//
// The loop the built-in families' device passes run on (the host passes' twin is
// dsc_model_layers_forward / _backward). A family gives its passes as callbacks (fam: its device
// state; each enqueues kernels on the driver's stream); the driver owns what is the same for
// every decoder:
// - the order of the layers and the hooks around them (the layer hook before each layer's forward
//   and backward, the grad hook when a group's gradients are complete: group L + 1 after the
//   head's backward, layer l's group l + 1 after its backward, group 0 after the embeddings');
// - the residual stream between the layers, each layer's input (rows x width 16-bit values):
//   dsc_model_dev_layers_input(d, l), kept for every layer on the device (recompute 0 and 1) or,
//   with recompute 2, in page-locked host memory (copied out on a side stream as the forward
//   goes and back one layer ahead of the backward), the device keeping three blocks;
// - activation checkpointing as a policy: with recompute 1 or 2 a family keeps one block of its
//   other per-layer activations for all layers (dsc_model_dev_layers_block) and the driver reruns
//   layer l's forward right before its backward, so the same kernels give the same bits;
// - the training step as one CUDA graph (dsc_model_dev_layers_step): the first step of a key
//   (the key's fields, and the params and grads addresses) runs eagerly, the second is captured,
//   the rest replay it; never with hooks, recompute 2, DSC_GPU_GRAPH=0, or where graph_ok says
//   no (a pass that takes values from the host that change between steps must say no).
typedef struct dsc_model_dev_layers_ops {
    // the tokens' embeddings into layer 0's input (dsc_model_dev_layers_input(d, 0))
    dsc_status (*embed)(void *fam, const uint16_t *const *params);
    // layer l: input(l) -> input(l + 1)
    dsc_status (*layer_forward)(void *fam, const uint16_t *const *params, int l);
    // the final norm and the logits from input(L)
    dsc_status (*head)(void *fam, const uint16_t *const *params);
    // the training step's loss and the logits' gradients (dsc_model_dev_layers_step only)
    dsc_status (*loss)(void *fam, float loss_scale);
    // from the logits' gradients to the gradient of input(L), in the family's own buffer
    dsc_status (*head_backward)(void *fam, const uint16_t *const *params, float *const *grads);
    // layer l: the gradient of input(l + 1) -> that of input(l)
    dsc_status (*layer_backward)(void *fam, const uint16_t *const *params, float *const *grads,
                                 int l);
    // the embeddings' gradients from that of input(0)
    dsc_status (*embed_backward)(void *fam, const uint16_t *const *params, float *const *grads);
    // optional: the forwards that follow are recomputes (on) or not (off)
    void (*recomputing)(void *fam, bool on);
    // optional: whether this step may run as a CUDA graph (NULL: yes)
    bool (*graph_ok)(const void *fam);
} dsc_model_dev_layers_ops;

enum { DSC_MODEL_DEV_KEY_EXTRA = 16 }; // a family's own graph key bytes, at most

// What a captured step depends on besides the params and grads addresses: the batch, the loss
// scale, the precision, whether the gradients are written fresh, whether position ids are given,
// and up to DSC_MODEL_DEV_KEY_EXTRA bytes of the family's own (zero what it does not use).
typedef struct dsc_model_dev_step_key {
    int B, T, ntargets;
    float loss_scale;
    bool fp16, fresh, pos;
    unsigned char extra[DSC_MODEL_DEV_KEY_EXTRA];
} dsc_model_dev_step_key;

typedef struct dsc_model_dev_layers dsc_model_dev_layers;

// Bytes of the residual blocks for L layers of rows x width 16-bit values under recompute
// (0 off; 1 the layers' inputs on the device; 2 on the host): the family allocates them and
// passes their address to dsc_model_dev_layers_create.
size_t dsc_model_dev_layers_res_bytes(int recompute, int L, int64_t rows, int width);
// How many blocks of its other per-layer activations a family keeps (one for all layers when
// they are recomputed), and which of them layer l uses.
size_t dsc_model_dev_layers_blocks(int recompute, int L);
size_t dsc_model_dev_layers_block(int recompute, int l);
// A driver for a family (ops, fam) of L layers and ntensors tensors (the length of params and
// grads), residual blocks of rows_cap x width at res, on stream (a cudaStream_t). recompute 2
// allocates the host copies, their stream and events. DSC_ERR_UNSUPPORTED in a build without
// the CUDA kernels; DSC_ERR_INVALID_ARG naming a bad argument; a CUDA error names what failed.
dsc_status dsc_model_dev_layers_create(dsc_model_dev_layers **out,
                                       const dsc_model_dev_layers_ops *ops, void *fam, int L,
                                       int ntensors, int recompute, int64_t rows_cap, int width,
                                       uint16_t *res, void *stream);
void dsc_model_dev_layers_destroy(dsc_model_dev_layers *d); // NULL ok; waits for its copies
// The hooks (see above; NULL: none), as a family's set_grad_hook / set_layer_hook receive them.
void dsc_model_dev_layers_set_grad_hook(dsc_model_dev_layers *d, dsc_model_grad_hook fn,
                                        void *user);
void dsc_model_dev_layers_set_layer_hook(dsc_model_dev_layers *d, dsc_model_layer_hook fn,
                                         void *user);
// The rows of the batch that follows (at most rows_cap; what the host copies move).
void dsc_model_dev_layers_set_rows(dsc_model_dev_layers *d, int64_t rows);
// Layer l's input (l = L: the head's), on the device.
uint16_t *dsc_model_dev_layers_input(const dsc_model_dev_layers *d, int l);
// The forward (embedding, the layers, the head) and the backward from the logits' gradients.
dsc_status dsc_model_dev_layers_forward(dsc_model_dev_layers *d, const uint16_t *const *params);
dsc_status dsc_model_dev_layers_backward(dsc_model_dev_layers *d, const uint16_t *const *params,
                                         float *const *grads);
// The training step (forward, ops->loss, backward) through the graph of its key (see above).
dsc_status dsc_model_dev_layers_step(dsc_model_dev_layers *d, const uint16_t *const *params,
                                     float *const *grads, const dsc_model_dev_step_key *key);

// ---- generation on a GPU ----

typedef struct dsc_model_decode dsc_model_decode; // a model's decoder (cache, buffers) on one GPU

// Whether the model's family has a GPU decoder (in this build).
bool dsc_model_has_decode(const dsc_model *m);
// A decoder for the model (see struct dsc_model_decode_ops.create). DSC_ERR_UNSUPPORTED naming
// the model and its family when the family has none; DSC_ERR_INVALID_ARG when o's sizes do not
// fit the model's context. Caller owns *out.
dsc_status dsc_model_decode_create(dsc_model_decode **out, const dsc_model *m,
                                   const dsc_model_decode_opts *o);
void dsc_model_decode_destroy(dsc_model_decode *d); // NULL ok; waits for the stream first
// Bytes of the decoder's cache for these sizes; 0 when the family has no decoder.
size_t dsc_model_decode_kv_bytes(const dsc_model *m, int batch, int max_len);
dsc_status dsc_model_decode_prefill(dsc_model_decode *d, const uint16_t *const *params,
                                    const int32_t *const *tokens, const int *lens, int n);
dsc_status dsc_model_decode_step(dsc_model_decode *d, const uint16_t *const *params,
                                 const int32_t *tokens, const int32_t *pos, int n);
dsc_status dsc_model_decode_argmax(dsc_model_decode *d, int32_t *tokens);
dsc_status dsc_model_decode_logits(dsc_model_decode *d, float *logits);
long dsc_model_decode_graph_replays(const dsc_model_decode *d); // 0 when the family has none

// ---- inference ----

// Whether the model splits over size tensor-parallel ranks (DSC_ERR_INVALID_ARG saying which
// sizes would).
dsc_status dsc_model_tp_check(const dsc_model *m, int size);
// Elements of tensor i in the local layout of a group of size ranks, and rank's slice of it
// from the whole tensor.
int64_t dsc_model_tp_numel(const dsc_model *m, int i, int size);
void dsc_model_tp_slice(const dsc_model *m, int i, int rank, int size, const float *full,
                        float *dst);

// A cache for nseq sequences of up to max_len positions, for the local part of a group of
// tp_size ranks; it takes exactly dsc_model_kv_bytes (its layout is the family's).
dsc_status dsc_model_kv_create(dsc_model_kv **out, const dsc_model *m, int tp_size, int nseq,
                               int max_len);
void dsc_model_kv_destroy(dsc_model_kv *kv); // NULL ok
size_t dsc_model_kv_bytes(const dsc_model *m, int tp_size, int nseq, int max_len);
// True when kv serves this model and group size for at least nseq x max_len (kv NULL: false).
bool dsc_model_kv_fits(const dsc_model_kv *kv, const dsc_model *m, int tp_size, int nseq,
                       int max_len);
// Run rows through the model (prefill: a prompt's rows; decode: one row per sequence), writing
// each row's keys and values into the cache at (sequence, position) before any row attends to
// positions 0..pos of its own sequence. params in the local layout of tp (tp NULL: none); with a
// gather hook the hook fills group g's entries. logits (nout, V) of rows out[0 .. nout). Every
// rank of a tensor-parallel group calls it with the same rows.
dsc_status dsc_model_infer(const dsc_model *m, dsc_model_kv *kv, float *const *params,
                           const dsc_model_tp *tp, const dsc_model_rows *rows,
                           const dsc_model_hooks *hooks, float *logits);

#ifdef __cplusplus
}
#endif
#endif
