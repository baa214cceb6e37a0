// ckpt/shard.h - one rank's shard: a safetensors file with this rank's slice of every group of
// the fp32 master weights and of each optimizer moment, written in one pass that also computes
// the file's XXH3 checksum.
//
// Tensor order (and byte order) in the file: master.g0 .. master.g<G-1>, then <moment0>.g0 ..,
// then <moment1>.g0 ..; each (slice,) F32. The snapshot buffer is laid out the same way, so the
// writer streams it out as one block after the header.
#ifndef DSC_CKPT_SHARD_H
#define DSC_CKPT_SHARD_H

#include <stddef.h> // size_t
#include <stdint.h> // uint64_t

#include "engine/ckpt/manifest.h" // dsc__manifest

#define DSC_CKPT_SHARD_FORMAT "dsc-checkpoint-shard"
#define DSC_SHARD_ALIGN 4096 // header + padding end here; O_DIRECT's alignment

// Tensor name of kind (0 master, 1 + k moment k) and group g.
void dsc__shard_tensor_name(const dsc__manifest *m, int kind, int g, char *out, size_t cap);
// Elements of one rank's slices of all groups (one kind).
size_t dsc__shard_part(const dsc__manifest *m);

// The file's first bytes: 8-byte header length, header JSON (metadata with the tag, step, rank
// and scalars), padded with spaces to a multiple of DSC_SHARD_ALIGN bytes in all. *out
// caller-owned (free()), aligned to DSC_SHARD_ALIGN.
dsc_status dsc__shard_header(const dsc__manifest *m, int rank, char **out, size_t *len);

// Write header + data to path (created, not replaced), fsync it, drop it from the page cache
// (so that a later re-read comes from the disk), and return its size and XXH3. With an aligned
// header and data (DSC_SHARD_ALIGN) the data bypasses the page cache (O_DIRECT).
dsc_status dsc__shard_write(const char *path, const void *header, size_t hlen, const void *data,
                            size_t n, uint64_t *bytes, uint64_t *xxh3);

// One piece of a shard's data where it lies (e.g. a group's master slice in the engine).
typedef struct dsc__shard_seg {
    const void *p;
    size_t bytes;
} dsc__shard_seg;

// The same file from nseg pieces in order (the same bytes and XXH3 as one block of their
// concatenation), written through the page cache: no snapshot copy is needed.
dsc_status dsc__shard_write_segs(const char *path, const void *header, size_t hlen,
                                 const dsc__shard_seg *segs, int nseg, uint64_t *bytes,
                                 uint64_t *xxh3);

// The same file from n bytes of data that pull(user, dst, off, k) gives piece by piece (bytes
// [off, off + k) of the data; e.g. copied from a device), through one bounded staging buffer.
typedef dsc_status (*dsc__shard_pull_fn)(void *user, void *dst, size_t off, size_t k);
dsc_status dsc__shard_write_pull(const char *path, const void *header, size_t hlen, size_t n,
                                 dsc__shard_pull_fn pull, void *user, uint64_t *bytes,
                                 uint64_t *xxh3);

#endif
