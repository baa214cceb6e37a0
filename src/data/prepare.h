// data/prepare.h - building a dataset folder: train.bin, val.bin and dataset.json.
//
// A dataset folder holds
//   train.bin     token shard (see shard.h) with the first (1 - val_fraction) of the tokens
//   val.bin       token shard with the rest (may hold 0 tokens)
//   dataset.json  what was built: tokenizer spec, vocab size, end-of-text id, token counts,
//                 the source documents and, for the built-in data, where the text came from.
// Documents are tokenized (on several threads when asked) and joined in order with the
// tokenizer's end-of-text token between them (none after a document that already ends with it).
// The output is a pure function of the inputs: same files, same tokenizer -> same bytes.
#ifndef DSC_DATA_PREPARE_H
#define DSC_DATA_PREPARE_H

#include <stddef.h> // size_t
#include <stdint.h> // uint64_t

#include "dsc/status.h" // dsc_status

#define DSC_PREPARE_VAL_FRACTION 0.05 // default for --val-fraction

// `dsc data prepare --input FILES --tokenizer SPEC --out DIR [--val-fraction F] [--threads N]`.
typedef struct dsc_prepare_opts {
    const char *const *inputs; // text files, one document each, or JSONL files, in this order
    int ninputs;
    const char *tokenizer;     // "byte", "gpt2:DIR", "hf:DIR", ... (see tokenizer.h)
    const char *out_dir;       // created if missing; train.bin / val.bin / dataset.json replaced
    double val_fraction;       // in [0, 1)
    const char *format;        // NULL/"auto": files named *.jsonl are JSONL (jsonl.h), others
                               // text; "text" or "jsonl": every input
    const char *chat_template; // for "messages" lines: see dsc_chat_template_load (NULL: the
                               // hf:DIR tokenizer's tokenizer_config.json, else ChatML)
    int seq_len;               // > 0: pack the examples into rows of seq_len + 1 tokens (pack.h)
    int on_bad_line;           // DSC_BAD_LINE_ERROR (0) or DSC_BAD_LINE_SKIP (jsonl.h)
    int threads;               // documents tokenized at once; <= 1: one (same output either way)
} dsc_prepare_opts;

// Tokenize, split, write the folder, and print a one-line summary to stdout.
// With JSONL input or seq_len > 0 the data is examples with loss-mask flags (shard versions 3-4,
// written by dsc__prepare_examples): each example ends with the end-of-text token, and the
// validation split is the last val_fraction of the rows (packed) or tokens (a stream).
// Plain text files without seq_len give plain shards exactly as before (versions 1-2).
// Nothing in out_dir changes unless every input was read and tokenized.
// Errors: DSC_ERR_IO naming a missing/unreadable input or an unwritable output,
// DSC_ERR_INVALID_ARG for bad options, inputs that hold no text (nothing is written then) and
// bad JSONL lines (file:line), tokenizer errors.
dsc_status dsc_data_prepare(const dsc_prepare_opts *o);

// The built-in dataset, needing no download: the license texts every Debian-family system ships
// in DSC_DEFAULT_TEXT_DIR (regular files, sorted by name, one document each), byte-tokenized,
// with the last DSC_PREPARE_VAL_FRACTION as validation. When that folder is missing or holds
// less than DSC_DEFAULT_MIN_BYTES, DSC_DEFAULT_GENERATED_DOCS documents of generated text
// (dsc_data_generate_text, seeds derived from DSC_DEFAULT_SEED) are used instead, and
// dataset.json says so. source_dir NULL means DSC_DEFAULT_TEXT_DIR (tests
// pass another). Writes to out_dir like dsc_data_prepare; prints nothing (logs at info level).
#define DSC_DEFAULT_TEXT_DIR "/usr/share/common-licenses"
#define DSC_DEFAULT_MIN_BYTES (50 * 1024)
#define DSC_DEFAULT_SEED 20240520u
#define DSC_DEFAULT_GENERATED_DOCS 40
#define DSC_DEFAULT_GENERATED_DOC_BYTES (10 * 1024)
dsc_status dsc_data_default(const char *out_dir, const char *source_dir);

// Deterministic English-like text (one document of about nbytes bytes, in paragraphs) from a
// small built-in grammar and list of common English words. *text is caller-owned (free()),
// NUL-terminated; *len excludes the NUL.
dsc_status dsc_data_generate_text(uint64_t seed, size_t nbytes, char **text, size_t *len);

#endif
