// data/pretok.h - the pre-tokenizer of a Hugging Face tokenizer.json: text -> pieces that BPE
// merges within.
//
// Accepted "pre_tokenizer" values (what the byte-level BPE families GPT-2, Llama 3, Qwen2 and
// SmolLM2 and the SentencePiece-style ones use), alone or in a
// {"type": "Sequence", "pretokenizers": [...]}:
//   {"type": "ByteLevel", "add_prefix_space": true|false, "use_regex": true|false}
//       use_regex: split by GPT-2's pattern (below). The byte-to-character mapping itself needs no
//       step here: BPE works on the raw bytes. add_prefix_space true only as the first step.
//   {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"|"first"|"never",
//    "split": true|false}
//       the first step only: spaces become the replacement, which is prepended (see
//       dsc__pretok_prepare); split: each replacement starts a piece.
//   {"type": "Split", "pattern": {"Regex": P}, "behavior": "Isolated", "invert": false}
//   {"type": "Digits", "individual_digits": true|false}
//       every \p{N} character its own piece, or each run of them one piece (here \p{N} includes
//       the digits Unicode 15.0 added, as the reference's Digits does).
// A stage splits every piece of the stage before it; the pattern never looks past a piece.
//
// Patterns are matched as the reference does (leftmost-first alternation, repeated from the end
// of each match; text between matches is a piece too). A pattern is a '|'-list of alternatives,
// each of which must be one of these (the building blocks of GPT-2's, Llama 3's and Qwen2's
// patterns):
//   a literal such as 's        (?i:'s|'t|'re|'ve|'m|'ll|'d)    ?\p{L}+    ?\p{N}+
//    ?[^\s\p{L}\p{N}]+    ?[^\s\p{L}\p{N}]+[\r\n]*    [^\r\n\p{L}\p{N}]?\p{L}+    \p{N}
//   \p{N}{1,K}    \s*[\r\n]+    \s+(?!\S)    \s+
// Any other alternative is refused, naming it. \p{L}, \p{N} are the General_Category classes
// and \s is White_Space (data/unicode.h). Bytes that are not UTF-8 count as [^\s\p{L}\p{N}].
#ifndef DSC_DATA_PRETOK_H
#define DSC_DATA_PRETOK_H

#include <jansson.h> // json_t
#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint8_t

#include "dsc/status.h" // dsc_status

typedef struct dsc__pretok dsc__pretok;

// Build from the "pre_tokenizer" value of file (named in errors). *byte_level: whether a
// ByteLevel stage is present. Errors: DSC_ERR_CONFIG naming the unsupported type, setting or
// pattern alternative.
dsc_status dsc__pretok_create(dsc__pretok **out, const json_t *pre, const char *file,
                              bool *byte_level);
void dsc__pretok_destroy(dsc__pretok *p); // NULL is a no-op

// The rewrite the first step makes of s[0..len): Metaspace replaces spaces by its replacement
// and prepends it per prepend_scheme (at_start: s begins the input, for "first"); ByteLevel with
// add_prefix_space prepends a space unless s starts with one. *out
// is s itself when nothing changes, else a buffer the caller owns (free()). false on OOM.
bool dsc__pretok_prepare(const dsc__pretok *p, const uint8_t *s, size_t len, bool at_start,
                         uint8_t **out, size_t *olen);

// Called with each piece in order; returning false stops the split (and makes it return false).
typedef bool (*dsc__piece_fn)(void *ctx, const uint8_t *piece, size_t n);
bool dsc__pretok_split(const dsc__pretok *p, const uint8_t *s, size_t len, dsc__piece_fn fn,
                       void *ctx);

#endif
