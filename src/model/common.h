// model/common.h - what every family's host model shares: the engine's hooks around a pass, the
// check of a pass's token ids, the weights' normal initialisation, the module tree the flops
// profiler prints, OpenMP's thread count.
#ifndef DSC_MODEL_COMMON_H
#define DSC_MODEL_COMMON_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint64_t

#include "dsc/engine.h" // dsc_param_desc
#include "dsc/memory.h" // dsc_mem_pool, dsc_mem_handle
#include "dsc/model.h"  // dsc_model_hooks, dsc_model_module
#include "dsc/status.h" // dsc_status

#ifdef _OPENMP
#include <omp.h> // omp_get_max_threads, omp_get_thread_num
#endif

// The OpenMP threads a parallel region may use, and this thread's number in it (1 and 0 in a
// build without OpenMP): the host kernels size per-thread scratch and pick slots with them.
static inline int dsc__model_max_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static inline int dsc__model_thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

enum dsc__hook_kind { DSC__HOOK_GATHER, DSC__HOOK_RELEASE, DSC__HOOK_GRADS_READY };

// Call one of the hooks (none set: DSC_OK); a failure is returned with the family, the hook and
// the group put before its message.
dsc_status dsc__model_hook(const dsc_model_hooks *h, enum dsc__hook_kind kind, int group,
                           const char *family);

// The layers' part of a host pass is the public loop, dsc_model_layers_forward / _backward
// (dsc/model.h), implemented in common.c: layer l is hook group 1 + l, each layer between its
// group's gather and release, grads_ready after each in backward.
//
// Activation checkpointing is the loop's policy: with recompute (non-NULL: the family's layer
// forward), backward first runs layer l's forward again, between the same gather and release,
// then its backward. The family then keeps only the residual stream into each layer and lays
// every other per-layer activation in one shared block (dsc__model_act_blocks/_block): the
// recompute refills it for the layer whose backward comes next. The same kernels on the same
// inputs give the same activations, so the gradients equal a run without recompute bit for bit.

// Blocks of a family's per-layer activations (besides the residual stream) for L layers: L, or
// one shared block when the layers are recomputed in the backward.
static inline size_t dsc__model_act_blocks(bool recompute, int L) {
    return recompute ? 1 : (size_t)L;
}
// The block layer l's activations live in.
static inline size_t dsc__model_act_block(bool recompute, int l) {
    return recompute ? 0 : (size_t)l;
}

// Ids (B, T) in [0, V); with ignored_ok, negative ids (ignored targets) pass too. The error names
// the family, the array (what), the position and the value.
dsc_status dsc__model_check_tokens(const int32_t *tok, const char *family, const char *what,
                                   int B, int T, int V, bool ignored_ok);

// A pass's tensor array t (what: "params" or "grads") of the family of ops, shape cfg, n tensors:
// not NULL, and, without a gather hook (one fills a group's entries itself, as ZeRO-3 does),
// every entry set, except those `required` marks false (NULL: all are required; a LoRA run's
// gradients: only its trainable tensors have one). The error names the family, the array, the
// index and the tensor.
dsc_status dsc__model_check_tensors(const struct dsc_model_ops *ops, const void *cfg, int n,
                                    float *const *t, const char *what,
                                    const dsc_model_hooks *hooks, const bool *required);

// A create's batch B x T: B >= 1, 1 <= T <= max_seq_len, B T <= 16M tokens.
dsc_status dsc__model_check_create(const char *family, int B, int T, int max_seq_len);

// A forward's batch B x T within the maxB x maxT the model was created for.
dsc_status dsc__model_check_batch(const char *family, int B, int T, int maxB, int maxT);

// A backward's model (has_model) and its forward: one with targets whose logits no backward has
// consumed yet (after_loss).
dsc_status dsc__model_check_backward(const char *family, bool has_model, bool after_loss);

// The mean of losses (n) over the positions whose target is not ignored (negative; their loss
// is 0), summed in order in double; 0 when every target is ignored. *counted: those positions.
float dsc__model_mean_loss(const float *losses, const int32_t *targets, int64_t n,
                           int64_t *counted);

// An inference call's rows against a cache of nseq sequences x max_len positions and a
// vocabulary of V: every row in range, every output row a row. Errors name the family and row.
dsc_status dsc__model_check_rows(const dsc_model_rows *r, int nseq, int max_len, int V,
                                 const char *family);

// The entry of a file's tensor table t (count entries) named want, or -1; with strip non-NULL a
// name may also carry that prefix (some exports put one before every name).
int dsc__model_find_param(const dsc_param_desc *t, int count, const char *want,
                          const char *strip);
// Each of the n tensors of a family's table (param: its dsc_model_ops.param, over cfg) found in t
// by name (dsc__model_find_param), with its shape: order[k] = the entry of tensor k. The errors
// name what (the file) and the tensor, and say what the family's shape wants: `whole` for a
// missing tensor ("a GPT-2 of 12 layers"), `shape` for a misshapen one ("GPT-2 with 768 channels
// and vocabulary 50257").
dsc_status dsc__model_match_params(const dsc_param_desc *t, int count, const char *strip,
                                   void (*param)(const void *cfg, int i, dsc_model_param *out),
                                   const void *cfg, int n, const char *what, const char *whole,
                                   const char *shape, int *order);

// An inference cache's shape: nseq >= 1 sequences of 1 <= max_len <= context positions.
dsc_status dsc__model_check_kv(const char *family, int nseq, int max_len, int context);
// The cache's block: bytes from the host's default pool (tag infer.kv_cache); *pool is that pool
// once it is known, *block the block.
dsc_status dsc__model_kv_alloc(size_t bytes, dsc_mem_pool **pool, dsc_mem_handle *block);
// An inference call's scratch for n rows, nfloats of views: *slab (aligned_alloc's, the caller's
// to free) is replaced by a larger one when n exceeds *cap, the rows it was made for.
dsc_status dsc__model_rows_slab(float **slab, int *cap, int n, size_t nfloats, const char *family);

// What a family's KV cache begins with (its member k): its shape, the cache block (laid out by
// the family), the attention scores' rows, one per thread, and the rows' scratch slab.
typedef struct dsc__kv {
    int tp, nseq, max_len;
    dsc_mem_pool *pool;   // borrowed: dsc's default host pool
    dsc_mem_handle block; // the cache
    float *slab;          // row scratch (dsc__model_rows_slab)
    int rows_cap;         // rows the slab holds
    float *att;           // (att_slots, max_len) attention scores
    int att_slots;
} dsc__kv;
// k for tp ranks and nseq sequences of max_len positions, with its attention rows and a cache
// block of bytes; an error is prefixed with the family and the shape (k is then for
// dsc__kv_free). The shape's checks (dsc__model_check_kv) come before, in the family's create.
dsc_status dsc__kv_init(dsc__kv *k, const char *family, int tp, int nseq, int max_len,
                        size_t bytes);
void dsc__kv_free(dsc__kv *k);
// Whether k was made for tp ranks and holds nseq x max_len.
static inline bool dsc__kv_holds(const dsc__kv *k, int tp, int nseq, int max_len) {
    return k->tp == tp && k->nseq >= nseq && k->max_len >= max_len;
}

// One buffer of a family's activations: where its address goes and how many floats it holds.
typedef struct dsc__view {
    float **view;
    size_t n;
} dsc__view;
// Lay the n views one after another in slab, each rounded up to 16 floats (64 bytes); with slab
// NULL only the size is computed. Returns the floats all of them take.
size_t dsc__carve(const dsc__view *v, size_t n, float *slab);

// The block of a family's host activations: nfloats from pool (tag names it in the pool's
// accounting; the pool may move it between passes, see dsc__slab_moved), or, without a pool,
// from aligned_alloc.
typedef struct dsc__slab {
    float *p;           // every float buffer of the activations is a view of it
    dsc_mem_pool *pool; // borrowed; NULL: p is aligned_alloc's
    dsc_mem_handle h;   // p's block in pool
    uint64_t gen;       // the pool's generation when p was read
} dsc__slab;
// DSC_ERR_OOM when there is no room (the pool's message recorded, else none); the caller says
// what for, with dsc__slab_fail.
dsc_status dsc__slab_alloc(dsc__slab *s, dsc_mem_pool *pool, size_t nfloats, const char *tag);
// Whether the pool moved the block since p was read; p is then its new address, and the caller
// carves its views again (contents move with the block).
bool dsc__slab_moved(dsc__slab *s);
void dsc__slab_free(dsc__slab *s); // also after a failed dsc__slab_alloc (a zeroed slab)
// The error of a family's create that got no activations from pool (NULL: aligned_alloc; st:
// dsc__slab_alloc's, DSC_OK when another buffer failed): the pool's message, which names its
// largest users, or one of its own; both name the batch and what to lower.
dsc_status dsc__slab_fail(dsc_status st, const dsc_mem_pool *pool, const char *family,
                          size_t nfloats, int B, int T);

// ---- a family's host model ----

enum { DSC__PASS_NONE, DSC__PASS_LOGITS, DSC__PASS_LOSS }; // what the last forward left

// What every family's host model state begins with (its member h): the batch it was made for,
// the last forward's batch and what it left for a backward, the activation slab and the token
// copies, the attention scratch's thread slots, the per-module clock, and what checks a pass's
// tensor arrays (the family's ops over its config, n tensors, and which have gradients).
typedef struct dsc__host {
    const char *family;
    const struct dsc_model_ops *ops;
    const void *cfg;         // the family's config inside its state
    int ntensors, vocab;
    const bool *grads_required; // NULL: every tensor has a gradient (LoRA: its trainable ones)
    int maxB, maxT;
    int B, T;                // of the last forward
    int pass;                // DSC__PASS_*
    int att_slots;           // threads the attention scratch serves: at most B n_head
    dsc__slab acts;          // every activation is a view of acts.p, carved again after a move
    int32_t *tokens;         // the last forward's inputs (at 0) and targets (at BT), and its
                             // position ids at 2 maxB maxT
    bool has_pos;            // the last forward had position ids
    int64_t ntargets;        // targets of the last forward that count: the mean's divisor
    double *times;           // per-module forward seconds, or NULL
    void (*layer_forward)(void *state, float *const *params, int l); // for dsc__host_recompute
} dsc__host;

// h for batches up to B x T (checked by the create: dsc__model_check_create) of a model of
// n_head heads; no buffers yet. ops, cfg, ntensors, vocab, grads_required: as above (cfg must
// live as long as h).
void dsc__host_init(dsc__host *h, const char *family, const struct dsc_model_ops *ops,
                    const void *cfg, int ntensors, int vocab, const bool *grads_required, int B,
                    int T, int n_head);
// The activation slab (nfloats from pool, tag) and the token copies; the error names the batch.
dsc_status dsc__host_alloc(dsc__host *h, dsc_mem_pool *pool, size_t nfloats, const char *tag);
void dsc__host_free(dsc__host *h);
// The bytes dsc__host_alloc takes for nfloats (a memory plan's count).
size_t dsc__host_bytes(const dsc__host *h, size_t nfloats);
// A pass's tensor array (what: "params" or "grads"), as dsc__model_check_tensors.
dsc_status dsc__host_check_tensors(const dsc__host *h, float *const *t, const char *what,
                                   const dsc_model_hooks *hooks);
// A forward's start: the batch, the parameters, the token ids and position ids in
// [0, pos_limit) (pos_what says what the limit is) checked, then the ids copied and the pass
// reset. h NULL is an error naming the family.
dsc_status dsc__host_forward_begin(dsc__host *h, const char *family, float *const *params,
                                   const int32_t *inputs, const int32_t *pos,
                                   const int32_t *targets, int B, int T,
                                   const dsc_model_hooks *hooks, int pos_limit,
                                   const char *pos_what);
// A layer's forward again in the backward (activation checkpointing) for dsc_model_layers_
// backward: the family's h.layer_forward with the per-module clock off, so that the profiler's
// forward times are the forward's. state: the family's state, whose first member is its h.
void dsc__host_recompute(void *state, float *const *params, int l);
// The elements of a family's n tensors (ops->param over cfg), and every tensor initialised whole
// (ops->init; params[i] holds tensor i).
int64_t dsc__model_numel(const struct dsc_model_ops *ops, const void *cfg, int n);
void dsc__model_init_all(const struct dsc_model_ops *ops, const void *cfg, int n,
                         float *const *params, uint64_t seed);
// The engine's hook of kind for group g around a pass of h's family (dsc__model_hook).
static inline dsc_status dsc__host_hook(const dsc__host *h, const dsc_model_hooks *hooks,
                                        enum dsc__hook_kind kind, int g) {
    return dsc__model_hook(hooks, kind, g, h->family);
}
// A forward's loss: each row's cross-entropy of the logits (BT x V) against targets into losses
// and lse, their mean over the targets that count (h->ntargets) into *loss (NULL: not asked),
// the clock's slot `slot` timing it.
void dsc__host_loss(dsc__host *h, float *losses, float *lse, const float *logits,
                    const int32_t *targets, int64_t BT, int V, float *loss, int slot);
// A forward's end: what it leaves for a backward.
static inline void dsc__host_forward_end(dsc__host *h, bool targets) {
    h->pass = targets ? DSC__PASS_LOSS : DSC__PASS_LOGITS;
}
// A backward's start: a forward with targets before it, both tensor arrays checked; the pass
// is consumed.
dsc_status dsc__host_backward_begin(dsc__host *h, const char *family, float *const *params,
                                    float *const *grads, const dsc_model_hooks *hooks);
// The last forward's position ids, or NULL (0 .. T-1 in every sequence).
static inline const int32_t *dsc__host_positions(const dsc__host *h) {
    return h->has_pos ? h->tokens + 2 * (int64_t)h->maxB * h->maxT : NULL;
}

// A forward's per-module clock, off (and free) while times is NULL: dsc__model_lap_start starts
// it, dsc__model_lap adds the seconds since *t0 to times[slot] and starts it again.
double dsc__model_lap_start(const double *times);
void dsc__model_lap(double *times, double *t0, int slot);

// Elements [begin, begin + count) of tensor i's normal(0, std) stream into dst[0 .. count).
// Counter-based and so order-free: element e is a function of (seed, i, e) only (a splitmix64
// hash of the three gives two uniforms per element pair, Box-Muller turns them into two
// normals), so any slice of any tensor can be initialised on its own, on any thread.
void dsc__model_init_normal(float *dst, int i, int64_t begin, int64_t count, double std,
                            uint64_t seed);

// The profiler's module tree, built in print order: out NULL only counts.
typedef struct dsc__tree {
    dsc_model_module *out;
    int n;
} dsc__tree;
// Append a module; returns its index.
int dsc__tree_add(dsc__tree *t, int depth, const char *type, int64_t params, double flops,
                  int slot, const char *name);
// Add a child's parameters and FLOPs to its parent's (aggregates grow as children arrive).
void dsc__tree_roll_up(dsc__tree *t, int parent, int child);
// Append a module under parent and add its numbers to the parent's; returns its index.
int dsc__tree_child(dsc__tree *t, int parent, int depth, const char *type, int64_t params,
                    double flops, int slot, const char *name);

#endif
