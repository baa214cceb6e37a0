// data/normalize.h - the normalizer of a Hugging Face tokenizer.json: the text between added
// tokens is rewritten before it is split (NFC for Qwen2; "▁" prepended and spaces replaced by
// "▁" for the SentencePiece-style files of Llama 2, Mistral, TinyLlama and Gemma).
//
// Accepted "normalizer" values, alone or in a {"type": "Sequence", "normalizers": [...]}:
//   null                                  the text as it is
//   {"type": "NFC"}                       Unicode NFC (data/unicode.h)
//   {"type": "Prepend", "prepend": S}     S before a text that is not empty
//   {"type": "Replace", "pattern": {"String": P}, "content": C}
//                                         every P (left to right, not overlapping) becomes C; a
//                                         {"Regex": P} pattern only when P is plain text
// Anything else (NFKC, Lowercase, Precompiled, Strip, BertNormalizer, ...) is refused by name.
#ifndef DSC_DATA_NORMALIZE_H
#define DSC_DATA_NORMALIZE_H

#include <jansson.h> // json_t
#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint8_t

#include "dsc/status.h" // dsc_status

typedef struct dsc__norm dsc__norm;

// Build from the "normalizer" value of file (named in errors); NULL and json null give the
// identity. Errors: DSC_ERR_CONFIG naming the unsupported type or setting.
dsc_status dsc__norm_create(dsc__norm **out, const json_t *normalizer, const char *file);
void dsc__norm_destroy(dsc__norm *n); // NULL is a no-op
bool dsc__norm_identity(const dsc__norm *n); // no step changes any text

// Normalize s[0..len). *out is s itself when nothing changed, else a buffer the caller owns
// (free()); *olen its length. false on OOM.
bool dsc__norm_apply(const dsc__norm *n, const uint8_t *s, size_t len, uint8_t **out,
                     size_t *olen);

// Replace every pat[0..np) in s[0..len) by rep[0..nr) into a new buffer (caller owns), or
// NULL on OOM. np >= 1. Shared with the pre-tokenizer (Metaspace) and the decoders (Replace).
uint8_t *dsc__replace(const uint8_t *s, size_t len, const uint8_t *pat, size_t np,
                      const uint8_t *rep, size_t nr, size_t *olen);

#endif
