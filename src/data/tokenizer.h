// data/tokenizer.h - text <-> token ids: a byte-level tokenizer and byte-level BPE (GPT-2's
// vocab.json/merges.txt, Hugging Face tokenizer.json).
//
// Specs accepted by dsc_tokenizer_create:
//   "hf:DIR", or a path ending in ".json"
//               a Hugging Face tokenizer.json byte-level BPE (the GPT-2, Llama 3, Qwen2 and
//               SmolLM2 families): DIR/tokenizer.json (or the file named), and
//               tokenizer_config.json beside it when present (add_bos_token, add_eos_token,
//               bos_token, eos_token).
//               Encoding reproduces Hugging Face's tokenizers library: added and special tokens
//               are matched first (leftmost, longest); the text between them is normalized (NFC
//               when the file says so), split by the pre-tokenizer (data/pretok.h), and merged by
//               BPE rank; the post-processor's BOS/EOS ids go around it (tokenizer_config.json's
//               add_bos_token / add_eos_token, when given, decide instead). End of text: the
//               config's eos_token, else <|endoftext|>, <|end_of_text|> or </s>, else none.
//               Ids are 32-bit (Llama 3's and Qwen2's vocabularies pass 65536). Decoding gives
//               special tokens as their text. Unsupported settings are refused by name.
//   "byte"      one token per byte: vocabulary 256, id = byte value. The end-of-text token is
//               id 0 (the NUL byte, which text files do not contain); a NUL byte in the input is
//               therefore indistinguishable from a document boundary.
//   "gpt2:DIR"  GPT-2's tokenizer from DIR/vocab.json and DIR/merges.txt (the files published
//               with the GPT-2 model): vocabulary 50257, end-of-text "<|endoftext|>" = 50256.
//               Both numbers are read from vocab.json (its size, and the id of "<|endoftext|>"),
//               so a copy that lacks a token reports its own. Merges naming a token vocab.json
//               lacks are skipped with a warning when they are a handful (a known defect of some
//               copies); more than that is an error.
//   "ids", "ids:N"  no text at all: token ids written as decimal numbers separated by spaces
//               (or commas) are encoded as those ids, and ids decode to " id" each (so a
//               continuation reads on after its prompt). Vocabulary N (ids: 65536, what a token
//               shard holds); no end-of-text token (dsc_tokenizer_eot gives -1). For models whose
//               tokenizer files are not at hand (benchmarks, tests).
//
// GPT-2 encoding reproduces the reference tokenizer: bytes are mapped to printable characters,
// text is split by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (implemented by hand, with Unicode 14.0 letter/number classes), and each piece is merged by
// BPE rank. Limits: code points assigned after Unicode 14.0 count as punctuation; bytes that are
// not valid UTF-8 are tokenized one by one as punctuation (the reference cannot take them at
// all); the text "<|endoftext|>" is encoded as ordinary text, never as the special token.
#ifndef DSC_DATA_TOKENIZER_H
#define DSC_DATA_TOKENIZER_H

#include <stdbool.h> // bool
#include <stddef.h> // size_t
#include <stdint.h> // int32_t

#include "dsc/status.h" // dsc_status

typedef struct dsc_tokenizer dsc_tokenizer;

// Errors: DSC_ERR_INVALID_ARG (unknown spec), DSC_ERR_IO (missing files), DSC_ERR_CORRUPT
// (malformed vocab.json / merges.txt).
dsc_status dsc_tokenizer_create(dsc_tokenizer **out, const char *spec);
void dsc_tokenizer_destroy(dsc_tokenizer *t); // NULL is a no-op

int dsc_tokenizer_vocab_size(const dsc_tokenizer *t);
int32_t dsc_tokenizer_eot(const dsc_tokenizer *t);
// The spec the tokenizer was created from ("byte", "gpt2:DIR"); borrowed.
const char *dsc_tokenizer_spec(const dsc_tokenizer *t);

// Encode len bytes of text (need not be NUL-terminated). *tokens is caller-owned (free());
// it is a valid allocation even when *ntok == 0. Safe to call from several threads at once.
dsc_status dsc_tokenizer_encode(const dsc_tokenizer *t, const char *text, size_t len,
                                int32_t **tokens, size_t *ntok);
// Decode n ids into bytes. *text is caller-owned (free()), NUL-terminated for convenience;
// *len excludes the NUL. The bytes may be partial UTF-8 when the ids cut a character.
// Errors: DSC_ERR_INVALID_ARG for an id outside the vocabulary.
dsc_status dsc_tokenizer_decode(const dsc_tokenizer *t, const int32_t *tokens, size_t n,
                                char **text, size_t *len);

// The tokenizer's files, so that a run's checkpoints carry the tokenizer it was trained with
// (dsc_checkpoint_attach): tokenizer.json (+ tokenizer_config.json when there is one) for a
// tokenizer.json spec, vocab.json + merges.txt for "gpt2:DIR"; "byte" and "ids" have none.
// Returns how many entries of out it filled (at most DSC_TOKENIZER_MAX_FILES).
#define DSC_TOKENIZER_MAX_FILES 2
typedef struct dsc_tokenizer_file {
    const char *name; // the file's name in a folder ("tokenizer.json"), static
    char path[4300];  // where it is now
} dsc_tokenizer_file;
int dsc_tokenizer_files(const dsc_tokenizer *t, dsc_tokenizer_file *out);
// The spec of the tokenizer whose files lie in dir (a checkpoint's folder, a Hugging Face
// folder): "hf:DIR" (tokenizer.json) or "gpt2:DIR" (vocab.json) into spec; false when none.
bool dsc_tokenizer_find(const char *dir, char *spec, size_t cap);

#endif
