// data/loader.h - deterministic (inputs, targets) batches from token shards, with prefetching.
//
// The data (one shard file, or every <split>*.bin in a folder, concatenated in sorted name
// order) is cut into W = (ntok - 1) / T non-overlapping windows: window w covers tokens
// [w*T, w*T + T]; its first T tokens are the inputs and the T after the first are the targets.
// Packed data (shards with a row length R = T + 1, see shard.h) has W = ntok / R windows, one per
// row: window w covers [w*R, w*R + T]. A target whose token's flags lack DSC_TOK_TARGET (a prompt
// token, padding) is DSC_LOADER_IGNORE, which the loss leaves out (as PyTorch's ignore_index).
// Global sample g belongs to epoch e = g / W and is window perm_e[g % W], where perm_e is a
// Fisher-Yates shuffle of 0..W-1 driven by a counter-based generator keyed by (seed, e), or the
// identity when shuffling is off. A sample therefore depends only on (data, T, seed, g): every
// rank of any world size that reads global samples g = step * global_batch + rank * micro + i
// sees the same global batches, and a resumed run continues exactly.
#ifndef DSC_DATA_LOADER_H
#define DSC_DATA_LOADER_H

#include <stdbool.h> // bool
#include <stdint.h>  // int32_t, int64_t, uint64_t

#include "dsc/status.h" // dsc_status

typedef struct dsc_loader dsc_loader;

typedef struct dsc_loader_opts {
    const char *path;  // a folder (reads <split>*.bin) or one shard file; copied
    const char *split; // "train" or "val" (any file-name prefix works); ignored for a file
    int T;             // sequence length
    uint64_t seed;
    bool shuffle;      // false: epoch order is window order
    int prefetch;      // batches computed ahead on a background thread; 0 = synchronous
    bool restart_positions; // positions restart at 0 at each document start (needs flagged
                            // shards: `dsc data prepare --seq-len`); false: 0..T-1 per window
} dsc_loader_opts;

#define DSC_LOADER_IGNORE (-1) // an ignored target (the model's loss leaves it out)

// Opens and validates every shard and scans it once for the largest token and its flags.
// Errors: DSC_ERR_IO / DSC_ERR_CORRUPT from the shards, DSC_ERR_INVALID_ARG when the data holds
// fewer than T+1 tokens, a folder holds no matching shard, packed rows are not T + 1 tokens long,
// or restart_positions is asked of shards without document starts.
dsc_status dsc_loader_create(dsc_loader **out, const dsc_loader_opts *o);
void dsc_loader_destroy(dsc_loader *l); // NULL is a no-op

int64_t dsc_loader_num_samples(const dsc_loader *l); // windows per epoch, W
int64_t dsc_loader_num_tokens(const dsc_loader *l);
// Largest token id in the data (-1 for no tokens); compare it with the model's vocabulary.
int dsc_loader_max_token(const dsc_loader *l);
// Whether some target is ignored (the data carries a loss mask that leaves tokens out).
bool dsc_loader_masked(const dsc_loader *l);
// Whether the data is packed rows (one window per row).
bool dsc_loader_packed(const dsc_loader *l);

// The distance between consecutive calls' `first` that prefetching should assume (for example
// the global batch size when each rank reads its slice of it). 0, the default, means "the n of
// the last call".
void dsc_loader_set_stride(dsc_loader *l, int64_t stride);

// Calls of dsc_loader_get answered from a batch queued ahead of the call (0 when synchronous):
// a low count next to the number of calls means the stride guess is wrong.
int64_t dsc_loader_prefetch_hits(dsc_loader *l);

// Fill inputs and targets (each n*T int32, row k = global sample first + k) for global samples
// first .. first+n-1; epochs wrap. The result never depends on prefetching. Not for concurrent
// use from several threads on one loader.
dsc_status dsc_loader_get(dsc_loader *l, int64_t first, int n, int32_t *inputs, int32_t *targets);
// The same, and positions (n*T int32, NULL = not wanted): the position id of each input token,
// 0..T-1 along the window, or restarting at 0 at each document start with restart_positions.
dsc_status dsc_loader_get_pos(dsc_loader *l, int64_t first, int n, int32_t *inputs,
                              int32_t *targets, int32_t *positions);

#endif
