// dsc/data.h - training data: tokenizers (text <-> token ids), token shards (the .bin files of a
// tokenized dataset), the loader that cuts shards into (inputs, targets) batches, and the
// building of a dataset folder from text and JSONL files. No engine needed.
//
// `dsc data prepare`, `dsc data decode`, `dsc train --data` and `dsc generate` use these calls; a
// program that embeds libdsc feeds its own model the same batches with them (docs/data.md).
// Errors are a dsc_status with a sentence in dsc_last_error() naming the file, line or spec.
#ifndef DSC_DATA_H
#define DSC_DATA_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, int64_t, uint8_t, uint64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// ---- tokenizers ----
//
// Specs accepted by dsc_tokenizer_create:
//   "hf:DIR", or a path ending in ".json"
//               a Hugging Face tokenizer.json BPE, byte-level (the GPT-2, Llama 3, Qwen2 and
//               SmolLM2 families) or SentencePiece-style (Llama 2, Mistral, TinyLlama, Gemma:
//               byte_fallback, Metaspace): DIR/tokenizer.json (or the file named), and
//               tokenizer_config.json beside it when present (add_bos_token, add_eos_token,
//               bos_token, eos_token).
//               Encoding reproduces Hugging Face's tokenizers library: added and special tokens
//               are matched first (leftmost, longest); the text between them is normalized (NFC,
//               Prepend, Replace when the file says so), split by the file's pre-tokenizer, and
//               merged by BPE rank; the post-processor's BOS/EOS ids go around it
//               (tokenizer_config.json's add_bos_token / add_eos_token, when given, decide
//               instead). End of text: the config's eos_token, else <|endoftext|>,
//               <|end_of_text|> or </s>, else none.
//               Ids are 32-bit (Llama 3's and Qwen2's vocabularies pass 65536). Decoding gives
//               special tokens as their text; SentencePiece-style files decode with their
//               decoder (ByteFallback, Metaspace, Strip...). Unsupported settings are refused by
//               name.
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

// ---- chat templates ----
//
// A model's chat template (the Jinja text of tokenizer_config.json's "chat_template", or of
// chat_template.jinja), rendered as Hugging Face's apply_chat_template renders it: the variables
// are messages, tools (null when none), documents (null), add_generation_prompt and the special
// tokens of tokenizer_config.json (bos_token, eos_token, ...). The Jinja subset is listed in
// docs/data.md; a template beyond it is refused when loaded, naming the construct and its line.

typedef struct dsc_chat_template dsc_chat_template;

// Where the assistant's text lies in a rendering: bytes [begin, end).
typedef struct dsc_chat_span {
    size_t begin, end;
} dsc_chat_span;

// spec: "chatml" (dsc's built-in ChatML), a tokenizer_config.json (its chat_template: a string,
// or the list of named templates' "default"), a folder (its chat_template.jinja, else its
// tokenizer_config.json's), or a file of Jinja text (special tokens then from an hf:DIR
// tokenizer's folder). spec NULL: the folder of tokenizer_spec (hf:DIR or DIR/tokenizer.json)
// when it holds a template, else ChatML. note (cap bytes) says which was used. Errors:
// DSC_ERR_IO (a file given cannot be read), DSC_ERR_CORRUPT (bad JSON), DSC_ERR_CONFIG (no
// template where one was asked for, or one beyond the supported subset). Caller owns *out.
dsc_status dsc_chat_template_load(const char *spec, const char *tokenizer_spec,
                                  dsc_chat_template **out, char *note, size_t cap);
// From Jinja text, with bos_token / eos_token (NULL: undefined in the template).
dsc_status dsc_chat_template_create(const char *jinja, const char *bos, const char *eos,
                                    dsc_chat_template **out);
void dsc_chat_template_destroy(dsc_chat_template *t); // NULL is a no-op

// Render a conversation given as JSON text: an array of {"role", "content", ...} messages, or
// an object with "messages" (and optionally "tools"). *text is caller-owned (free()). With spans
// (not NULL) and add_generation_prompt false, *spans (caller-owned) gets each assistant message's
// span: its text and the template's end of its turn (docs/data.md says how they are found).
// Errors: DSC_ERR_INVALID_ARG naming what the template or the conversation got wrong.
dsc_status dsc_chat_apply(const dsc_chat_template *t, const char *conversation,
                          bool add_generation_prompt, char **text, size_t *len,
                          dsc_chat_span **spans, int *nspans);

// The text the template closes an assistant turn with ("<|im_end|>", "<|eot_id|>", ...: what it
// writes after an assistant message, white space dropped); "" when it writes nothing. Borrowed.
const char *dsc_chat_template_end_of_turn(const dsc_chat_template *t);

// ---- token shards ----
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

// ---- the loader ----
//
// The data (one shard file, or every <split>*.bin in a folder, concatenated in sorted name
// order) is cut into W = (ntok - 1) / T non-overlapping windows: window w covers tokens
// [w*T, w*T + T]; its first T tokens are the inputs and the T after the first are the targets.
// Packed data (shards with a row length R = T + 1, above) has W = ntok / R windows, one per
// row: window w covers [w*R, w*R + T]. A target whose token's flags lack DSC_TOK_TARGET (a prompt
// token, padding) is DSC_LOADER_IGNORE, which the loss leaves out (as PyTorch's ignore_index).
// Global sample g belongs to epoch e = g / W and is window perm_e[g % W], where perm_e is a
// Fisher-Yates shuffle of 0..W-1 driven by a counter-based generator keyed by (seed, e), or the
// identity when shuffling is off. A sample therefore depends only on (data, T, seed, g): every
// rank of any world size that reads global samples g = step * global_batch + rank * micro + i
// sees the same global batches, and a resumed run continues exactly.

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

// ---- dataset folders ----
//
// A dataset folder holds
//   train.bin     token shard (above) with the first (1 - val_fraction) of the tokens
//   val.bin       token shard with the rest (may hold 0 tokens)
//   dataset.json  what was built: tokenizer spec, vocab size, end-of-text id, token counts,
//                 the source documents and, for the built-in data, where the text came from.
// Documents are tokenized (on several threads when asked) and joined in order with the
// tokenizer's end-of-text token between them (none after a document that already ends with it).
// The output is a pure function of the inputs: same files, same tokenizer -> same bytes.
enum { DSC_BAD_LINE_ERROR, DSC_BAD_LINE_SKIP }; // dsc_prepare_opts.on_bad_line: `--on-bad-line`

#define DSC_PREPARE_VAL_FRACTION 0.05 // default for --val-fraction

// `dsc data prepare --input FILES --tokenizer SPEC --out DIR [--val-fraction F] [--threads N]`.
typedef struct dsc_prepare_opts {
    const char *const *inputs; // text files, one document each, or JSONL files, in this order
    int ninputs;
    const char *tokenizer;     // "byte", "gpt2:DIR", "hf:DIR", ... (the specs above)
    const char *out_dir;       // created if missing; train.bin / val.bin / dataset.json replaced
    double val_fraction;       // in [0, 1)
    const char *format;        // NULL/"auto": files named *.jsonl are JSONL (docs/data.md), others
                               // text; "text" or "jsonl": every input
    const char *chat_template; // for "messages" lines: "chatml", a tokenizer_config.json (its
                               // chat_template), a folder holding one, or a file of Jinja
                               // text (docs/data.md); NULL: the hf:DIR tokenizer's
                               // tokenizer_config.json, else ChatML
    int seq_len;               // > 0: pack the examples into rows of seq_len + 1 tokens
    int on_bad_line;           // DSC_BAD_LINE_ERROR (0) or DSC_BAD_LINE_SKIP
    int threads;               // documents tokenized at once; <= 1: one (same output either way)
} dsc_prepare_opts;

// Tokenize, split, write the folder, and print a one-line summary to stdout.
// With JSONL input or seq_len > 0 the data is examples with loss-mask flags (shard versions 3-4):
// each example ends with the end-of-text token, and the
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

#ifdef __cplusplus
}
#endif
#endif
