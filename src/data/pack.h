// data/pack.h - examples -> token ids with DSC_TOK_* flags (shard.h): one stream, or rows.
//
// Each example's segments are tokenized one by one (so no token straddles a trained/untrained
// boundary); a token is a target (DSC_TOK_TARGET) when its segment is trained, and the example's
// first token starts a document (DSC_TOK_DOC). The end-of-text token follows every example as
// its separator, a target when the example's last segment is trained (so that the model learns
// to stop after a completion).
//
// Packing into rows of R tokens (row > 0): examples go in order into the current row while they
// fit; one that does not fit in what is left of the row starts the next row, and the rest of the
// row is padding (end-of-text tokens, or id 0 for a tokenizer without one; never targets). An
// example longer than a whole row fills the rest of the current row and continues in the next
// rows (its tokens at the start of a continuation row have no context before them). Rows are
// therefore full but for padding, and no example shorter than a row is cut.
#ifndef DSC_DATA_PACK_H
#define DSC_DATA_PACK_H

#include <stdint.h> // int32_t, int64_t, uint8_t

#include "data/jsonl.h"     // dsc_examples
#include "data/tokenizer.h" // dsc_tokenizer
#include "dsc/status.h"     // dsc_status

typedef struct dsc_packed {
    int32_t *tok;   // (n) token ids, owned
    uint8_t *flags; // (n) DSC_TOK_* bits, owned
    int64_t n, cap;
    int64_t targets;        // tokens flagged DSC_TOK_TARGET
    int64_t padding;        // padding tokens (rows only)
    int64_t split_examples; // examples longer than a row, continued over rows
} dsc_packed;

// Append ex's examples, as a stream (row 0) or in rows of row tokens.
dsc_status dsc_pack_examples(const dsc_tokenizer *tk, const dsc_examples *ex, int row,
                             dsc_packed *out);

void dsc_packed_free(dsc_packed *p); // zeroes p

#endif
