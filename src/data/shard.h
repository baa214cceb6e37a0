// data/shard.h - token shards: the `.bin` files that hold a tokenized dataset.
//
// Layout (the llm.c token-shard layout, all integers little endian):
//   header: 256 int32
//     [0] magic    20240520
//     [1] version  1 = tokens are uint16 (vocabularies of at most 65536 ids)
//                  2 = tokens are uint32 (dsc's variant for vocabularies above 65536)
//                  3 = uint16 tokens, then one flag byte per token (dsc's variant)
//                  4 = uint32 tokens, then one flag byte per token (dsc's variant)
//     [2] ntok     number of tokens that follow (0 .. 2^31-1)
//     [3]          versions 3-4: row length R, or 0. R > 0: the tokens are packed rows of R
//                  tokens each (ntok is a multiple of R) and a sample is one row. Versions 1-2:
//                  zero (not read).
//     [4..255]     zero
//   body: ntok tokens, 2 bytes each (versions 1, 3) or 4 bytes each (versions 2, 4); versions 3-4
//   then ntok flag bytes: bit 0 (DSC_TOK_TARGET) set = the token counts as a target of the loss,
//   clear = it is ignored (a prompt token, padding); bit 1 (DSC_TOK_DOC) = the token starts a
//   document (positions restart there); the other bits are zero.
// A file's size is therefore exactly 1024 + ntok * (width + has_flags) bytes; anything else is
// corrupt. Version-1 files are interchangeable with llm.c's GPT-2 shards; versions 1-2 mean
// every token is a target.
#ifndef DSC_DATA_SHARD_H
#define DSC_DATA_SHARD_H

#include <stddef.h> // size_t
#include <stdint.h> // int32_t, int64_t, uint8_t

#include "dsc/status.h" // dsc_status

#define DSC_SHARD_MAGIC 20240520
#define DSC_SHARD_HEADER_INTS 256
#define DSC_SHARD_HEADER_BYTES (DSC_SHARD_HEADER_INTS * 4)
#define DSC_SHARD_MAX_TOKENS INT32_MAX // the header stores the count as int32
#define DSC_TOK_TARGET 1u // flag: the token is a target of the loss
#define DSC_TOK_DOC 2u    // flag: the token starts a document

// An open shard; the tokens are memory-mapped read-only. Fields are read-only for callers.
typedef struct dsc_shard {
    char path[4096];
    int version;          // 1, 3 (uint16 tokens) or 2, 4 (uint32 tokens)
    int64_t ntok;         // tokens in the body
    int row;              // row length of packed data (versions 3-4), else 0
    const uint8_t *body;  // ntok * width bytes, little endian; borrowed from the mapping
    const uint8_t *flags; // ntok DSC_TOK_* bytes (versions 3-4), else NULL; borrowed
    void *map;            // the whole file mapping (NULL when the file is header-only)
    size_t map_bytes;
} dsc_shard;

// Open and validate (magic, version, size). Errors: DSC_ERR_IO (cannot open/map),
// DSC_ERR_CORRUPT (bad magic or version, truncated or oversized file). On failure *s is left
// closed (dsc_shard_close on it is a harmless no-op).
dsc_status dsc_shard_open(dsc_shard *s, const char *path);
// Unmap; safe on a zeroed or already-closed shard.
void dsc_shard_close(dsc_shard *s);

// Token i (0 <= i < s->ntok).
static inline int32_t dsc_shard_token(const dsc_shard *s, int64_t i) {
    if (s->version == 1 || s->version == 3) {
        const uint8_t *p = s->body + 2 * i;
        return (int32_t)(p[0] | (uint32_t)p[1] << 8);
    }
    const uint8_t *p = s->body + 4 * i;
    return (int32_t)(p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

// Copy tokens [first, first + n) into out (n int32), widening. Bounds are the caller's duty.
void dsc_shard_read(const dsc_shard *s, int64_t first, int64_t n, int32_t *out);

// Copy flags [first, first + n) into out (n bytes): DSC_TOK_TARGET for every token of a shard
// without flags.
void dsc_shard_read_flags(const dsc_shard *s, int64_t first, int64_t n, uint8_t *out);

// Write n tokens (each in [0, vocab_size)) as a shard: version 1 when vocab_size <= 65536, else
// version 2. Writes path.tmp, fsyncs it, then renames it over path, so a reader never sees a
// half-written shard. Errors: DSC_ERR_INVALID_ARG (token out of range, too many tokens),
// DSC_ERR_IO.
dsc_status dsc_shard_write(const char *path, const int32_t *tokens, int64_t n, int vocab_size);
// The same with flags (n DSC_TOK_* bytes; NULL = the plain versions 1-2 above) and a row length
// (0, or R > 0 dividing n): version 3 when vocab_size <= 65536, else 4.
dsc_status dsc_shard_write_flags(const char *path, const int32_t *tokens, const uint8_t *flags,
                                 int64_t n, int vocab_size, int row);

#endif
