// data/tokenizer_impl.h - the tokenizer's state and BPE core, shared by tokenizer.c (byte, GPT-2
// vocab.json/merges.txt, ids) and tokenizer_json.c (Hugging Face tokenizer.json). Internal to
// data/.
#ifndef DSC_DATA_TOKENIZER_IMPL_H
#define DSC_DATA_TOKENIZER_IMPL_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t, uint8_t, uint32_t, uint64_t

#include "data/tokenizer.h" // dsc_tokenizer

enum { DSC__TOK_BYTE, DSC__TOK_GPT2, DSC__TOK_IDS, DSC__TOK_JSON };

typedef struct dsc__pair_slot {
    uint64_t key;   // (left id << 32) | right id; DSC__PAIR_EMPTY when free
    int32_t rank;   // merge priority: lower merges first (order of the merges list)
    int32_t merged; // id of the concatenation
} dsc__pair_slot;
#define DSC__PAIR_EMPTY UINT64_MAX

typedef struct dsc__tokjson dsc__tokjson; // tokenizer_json.c

struct dsc_tokenizer {
    int kind;
    int vocab_size;
    int32_t eot;
    char spec[4200];
    // BPE (GPT-2 and tokenizer.json). Token i's bytes are bytes[off[i] .. off[i+1]): what it
    // decodes to.
    uint8_t *bytes;
    uint32_t *off;      // vocab_size + 1
    int32_t *index;     // open addressing: raw bytes -> id, -1 = free; index_mask + 1 slots
    uint64_t index_mask;
    dsc__pair_slot *pairs; // open addressing: (left, right) -> merge; pair_mask + 1 slots
    uint64_t pair_mask;
    int32_t byte_id[256]; // id of each single-byte token; -1: none (the byte is dropped)
    bool ignore_merges;   // a word that is a token as a whole is that token (Llama 3)
    // SentencePiece-style BPE (a tokenizer.json without a ByteLevel step): BPE starts from the
    // characters of each piece, not from its bytes, and token strings are kept as written.
    bool char_level;
    bool fuse_unk;            // consecutive unknown characters become one unk
    int32_t unk;              // model.unk_token's id; -1: none (unknown characters are dropped)
    int32_t fallback_id[256]; // model.byte_fallback: the id of "<0xNN>"; -1: none
    dsc__tokjson *json;   // tokenizer.json only: added tokens, pre-tokenizer, post-processor
};

// GPT-2's byte <-> printable-character map covers code points below this bound.
#define DSC__BYTE_MAP_CPS 324

// enc[b]: the printable code point byte b is written as in vocabularies.
void dsc__tok_byte_to_cp(uint32_t enc[256]);
// dec[cp]: the byte code point cp stands for, -1 for code points outside the map.
void dsc__tok_byte_decoder(int16_t dec[DSC__BYTE_MAP_CPS]);
uint64_t dsc__tok_table_mask(size_t n); // power of two >= 2n, minus one
int32_t dsc__tok_index_find(const dsc_tokenizer *t, const uint8_t *w, size_t n);
void dsc__tok_index_add(dsc_tokenizer *t, int32_t id); // token id's bytes must be unique
void dsc__tok_pair_insert(dsc_tokenizer *t, const int32_t ids[3], int32_t rank);

// Growable id buffer.
typedef struct dsc__ibuf {
    int32_t *v;
    size_t n, cap;
} dsc__ibuf;
bool dsc__ibuf_reserve(dsc__ibuf *b, size_t extra);

// One encoding call's BPE state: the output ids and a word -> ids cache whose keys are borrowed
// from the text being encoded (so that text must outlive the encoder).
typedef struct dsc__encoder dsc__encoder;
dsc__encoder *dsc__encoder_create(const dsc_tokenizer *t); // NULL on OOM
// Append the BPE ids of the word w[0..n). false on OOM.
bool dsc__encoder_word(dsc__encoder *e, const uint8_t *w, size_t n);
// Append ids as they are. false on OOM.
bool dsc__encoder_put(dsc__encoder *e, const int32_t *ids, size_t n);
// Hand the output over (caller owns b->v) and free the encoder.
void dsc__encoder_finish(dsc__encoder *e, dsc__ibuf *b);
void dsc__encoder_destroy(dsc__encoder *e); // also frees the output; NULL is a no-op

// tokenizer_json.c: load spec's tokenizer.json (and tokenizer_config.json beside it) into t.
// path: the tokenizer.json file.
dsc_status dsc__tokjson_load(dsc_tokenizer *t, const char *path);
void dsc__tokjson_free(dsc__tokjson *j);
dsc_status dsc__tokjson_encode(const dsc_tokenizer *t, const uint8_t *s, size_t len,
                               dsc__ibuf *out);
// char_level: the symbols BPE starts from for the word w[0..n) (at most n, into sym).
size_t dsc__tokjson_symbols(const dsc_tokenizer *t, const uint8_t *w, size_t n, int32_t *sym);
// Whether decoding runs the file's decoder (else token strings are bytes, concatenated).
bool dsc__tokjson_has_decoder(const dsc_tokenizer *t);
// Decode ids (each in the vocabulary) with the file's decoder; *text caller owns.
dsc_status dsc__tokjson_decode(const dsc_tokenizer *t, const int32_t *ids, size_t n, char **text,
                               size_t *len);

#endif
