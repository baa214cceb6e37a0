// model/common.h - what every family's host model shares: the engine's hooks around a pass, the
// check of a pass's token ids, the weights' normal initialisation, the module tree the flops
// profiler prints, OpenMP's thread count.
#ifndef DSC_MODEL_COMMON_H
#define DSC_MODEL_COMMON_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint64_t

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

// Ids (B, T) in [0, V); with ignored_ok, negative ids (ignored targets) pass too. The error names
// the family, the array (what), the position and the value.
dsc_status dsc__model_check_tokens(const int32_t *tok, const char *family, const char *what,
                                   int B, int T, int V, bool ignored_ok);

// An inference call's rows against a cache of nseq sequences x max_len positions and a
// vocabulary of V: every row in range, every output row a row. Errors name the family and row.
dsc_status dsc__model_check_rows(const dsc_model_rows *r, int nseq, int max_len, int V,
                                 const char *family);

// One buffer of a family's activations: where its address goes and how many floats it holds.
typedef struct dsc__view {
    float **view;
    size_t n;
} dsc__view;
// Lay the n views one after another in slab, each rounded up to 16 floats (64 bytes); with slab
// NULL only the size is computed. Returns the floats all of them take.
size_t dsc__carve(const dsc__view *v, size_t n, float *slab);

// The block of a family's host activations: nfloats from pool (tag names it in the pool's
// accounting; *gen receives the pool's generation, to notice moves), or, without a pool, from
// aligned_alloc (*h 0). DSC_ERR_OOM when there is no room; the caller says what for.
dsc_status dsc__activations_alloc(dsc_mem_pool *pool, size_t nfloats, const char *tag,
                                  dsc_mem_handle *h, float **slab, uint64_t *gen);

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
