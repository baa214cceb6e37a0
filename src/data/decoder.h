// data/decoder.h - the decoder of a Hugging Face tokenizer.json: token strings -> text, for the
// SentencePiece-style files (Llama 2, Mistral, TinyLlama, Gemma), as the reference decodes
// them: each step maps the list of token strings to a new list, and the text is the last list
// joined.
//
// Accepted "decoder" values, alone or in a {"type": "Sequence", "decoders": [...]}:
//   {"type": "Replace", "pattern": {"String": P}, "content": C}   P -> C in each token
//   {"type": "ByteFallback"}   runs of "<0xNN>" tokens become their bytes: one token when they
//                              are UTF-8, else one U+FFFD per byte
//   {"type": "Fuse"}           all tokens joined into one
//   {"type": "Strip", "content": C, "start": N, "stop": M}
//                              up to N leading and M trailing characters C removed per token
//   {"type": "Metaspace", "replacement": R, "prepend_scheme": S}
//                              R -> " ", except that the first token drops its R when S is not
//                              "never" (files without prepend_scheme: add_prefix_space)
// null (no decoder) joins the tokens with a space. ByteLevel is the byte-level files' decoder,
// read by tokenizer_json.c, not here. Anything else is refused by name.
#ifndef DSC_DATA_DECODER_H
#define DSC_DATA_DECODER_H

#include <jansson.h> // json_t
#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint8_t, uint32_t

#include "dsc/status.h" // dsc_status

typedef struct dsc__dec dsc__dec;

// Build from the "decoder" value of file (named in errors); NULL and json null give the
// space-joining decoder. Errors: DSC_ERR_CONFIG naming the unsupported type or setting.
dsc_status dsc__dec_create(dsc__dec **out, const json_t *decoder, const char *file);
void dsc__dec_destroy(dsc__dec *d); // NULL is a no-op

// Decode n tokens: token i is the string bytes + off[id[i]] .. bytes + off[id[i] + 1] (the
// tokenizer's string table, borrowed). *text: NUL-terminated, caller owns (free()); *len its
// length. false on OOM.
bool dsc__dec_apply(const dsc__dec *d, const uint8_t *bytes, const uint32_t *off,
                    const int32_t *id, size_t n, char **text, size_t *len);

#endif
