// data/tokenizer_json.c - Hugging Face tokenizer.json BPE: byte-level (GPT-2, Llama 3, Qwen2,
// SmolLM2 families) and SentencePiece-style (Llama 2, Mistral, TinyLlama, Gemma): loading, added
// tokens, post-processor, tokenizer_config.json (see tokenizer.h).
//
// Encoding a text, as the reference does: added tokens are found first (leftmost, then longest)
// and become their ids; each text between them is normalized (data/normalize.h), rewritten and
// split by the pre-tokenizer (data/pretok.h), and each piece merged by BPE rank: over its bytes
// in a byte-level file, over its characters in a SentencePiece-style one (a character without a
// token becomes its "<0xNN>" byte tokens with byte_fallback, else unk_token); the
// post-processor's (or tokenizer_config.json's) BOS/EOS ids go around the result. Decoding runs
// the file's decoder (data/decoder.h); byte-level tokens are their bytes.
#include <errno.h>   // errno
#include <jansson.h> // json_*
#include <stdio.h>   // snprintf
#include <stdlib.h>  // calloc, free, malloc, realloc
#include <string.h>  // memcmp, memcpy, strcmp, strerror, strlen, strrchr
#include <sys/stat.h> // stat

#include "base/hash.h"           // dsc_hash64
#include "base/io.h"             // dsc__fopen_regular
#include "base/status.h"         // dsc__fail, DSC_TRY
#include "data/decoder.h"        // dsc__dec_*
#include "data/normalize.h"      // dsc__norm_*
#include "data/pretok.h"         // dsc__pretok_*
#include "data/tokenizer_impl.h" // struct dsc_tokenizer, dsc__encoder_*
#include "data/unicode.h"        // dsc__utf8_decode

#define MAX_AROUND 8 // BOS/EOS ids the post-processor may add on each side

#define MAX_ADDED_LENS 64 // distinct lengths of added tokens

static const uint8_t META[3] = {0xE2, 0x96, 0x81}; // "▁", U+2581, SentencePiece's space

typedef struct added {
    const uint8_t *text; // content; points into dsc__tokjson.added_bytes
    size_t len;
    int32_t id;
    bool lstrip, rstrip; // the match takes in the white space before / after it
} added;

struct dsc__tokjson {
    dsc__pretok *pre;
    dsc__norm *norm;
    dsc__dec *dec;            // SentencePiece-style files; NULL: token bytes concatenated
    bool meta_words;          // pieces split before each "▁" that follows another character
    added *added;             // nadded entries
    int nadded;
    uint8_t *added_bytes;
    int32_t *added_index;     // open addressing over added: content -> entry, -1 = free
    uint64_t added_mask;
    size_t lens[MAX_ADDED_LENS]; // the distinct content lengths, longest first
    int nlens;
    bool first[256];          // a byte that starts some added token
    int32_t prefix[MAX_AROUND], suffix[MAX_AROUND];
    int nprefix, nsuffix;
};

// ---- internal: vocabulary ----

// A vocabulary string -> bytes: characters of GPT-2's byte alphabet become their byte, others
// stay as their UTF-8 (what the ByteLevel decoder does). Returns the byte count; *strict tells
// whether every character was in the alphabet (only such tokens can come out of BPE on bytes).
// dec NULL (SentencePiece-style files): the string as it is.
static size_t token_bytes(const char *s, const int16_t *dec, uint8_t *out, bool *strict) {
    size_t n = 0, len = strlen(s);
    *strict = true;
    if (!dec) {
        memcpy(out, s, len);
        return len;
    }
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = dsc__utf8_decode((const uint8_t *)s + i, len - i, &cp);
        if (cp < DSC__BYTE_MAP_CPS && dec[cp] >= 0) {
            out[n++] = (uint8_t)dec[cp];
        } else {
            memcpy(out + n, s + i, k);
            n += k;
            *strict = false;
        }
        i += k;
    }
    return n;
}

static dsc_status vocab_bounds(const json_t *vocab, const json_t *added_list, const char *file,
                               int *size, size_t *bytes) {
    long long max = -1;
    *bytes = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= INT32_MAX)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: model.vocab entry \"%.40s\" has no valid id "
                             "(a non-negative integer)", file, key);
        if (id > max) max = id;
        *bytes += strlen(key);
    }
    size_t i;
    json_t *a;
    json_array_foreach(added_list, i, a) {
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        const char *c = json_string_value(json_object_get(a, "content"));
        if (!c || id < 0 || id >= INT32_MAX)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: added_tokens[%zu] needs a \"content\" string "
                             "and a non-negative \"id\"", file, i);
        if (id > max) max = id;
        *bytes += strlen(c);
    }
    if (max < 0) return dsc__fail(DSC_ERR_CORRUPT, "%s: model.vocab is empty", file);
    *size = (int)(max + 1);
    return DSC_OK;
}

// Token strings by id (borrowed from the JSON): the model's vocabulary, then added tokens the
// vocabulary lacks.
static dsc_status names_by_id(const json_t *vocab, const json_t *added_list, const char *file,
                              const char **name, int n) {
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (name[id])
            return dsc__fail(DSC_ERR_CORRUPT, "%s: model.vocab gives id %lld to both \"%.40s\" "
                             "and \"%.40s\"", file, (long long)id, name[id], key);
        name[id] = key;
    }
    size_t i;
    json_t *a;
    json_array_foreach(added_list, i, a) {
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!name[id]) name[id] = json_string_value(json_object_get(a, "content"));
    }
    for (int id = 0; id < n; id++)
        if (!name[id])
            return dsc__fail(DSC_ERR_CORRUPT, "%s: no token has id %d (ids must be 0..%d without "
                             "gaps)", file, id, n - 1);
    return DSC_OK;
}

static dsc_status vocab_load(dsc_tokenizer *t, const json_t *vocab, const json_t *added_list,
                             const char *file) {
    size_t total;
    DSC_TRY(vocab_bounds(vocab, added_list, file, &t->vocab_size, &total));
    int n = t->vocab_size;
    const char **name = calloc((size_t)n, sizeof *name);
    t->off = malloc(((size_t)n + 1) * sizeof *t->off);
    t->bytes = malloc(total + 1);
    t->index_mask = dsc__tok_table_mask((size_t)n);
    t->index = malloc((t->index_mask + 1) * sizeof *t->index);
    dsc_status st = DSC_OK;
    if (!name || !t->off || !t->bytes || !t->index) {
        st = dsc__fail(DSC_ERR_OOM, "%s: out of memory for %d tokens", file, n);
        goto done;
    }
    memset(t->index, 0xFF, (t->index_mask + 1) * sizeof *t->index);
    DSC_TRY_GOTO(names_by_id(vocab, added_list, file, name, n), st, done);
    int16_t map[DSC__BYTE_MAP_CPS], *dec = t->char_level ? NULL : map;
    dsc__tok_byte_decoder(map);
    t->off[0] = 0;
    for (int id = 0; id < n; id++) {
        bool strict;
        t->off[id + 1] = t->off[id] + (uint32_t)token_bytes(name[id], dec, t->bytes + t->off[id],
                                                            &strict);
        if (!strict || !json_object_get(vocab, name[id])) continue; // not a BPE result
        if (dsc__tok_index_find(t, t->bytes + t->off[id], t->off[id + 1] - t->off[id]) >= 0) {
            st = dsc__fail(DSC_ERR_CORRUPT, "%s: two vocabulary entries spell \"%.40s\"", file,
                           name[id]);
            goto done;
        }
        dsc__tok_index_add(t, id);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t one = (uint8_t)b;
        t->byte_id[b] = dsc__tok_index_find(t, &one, 1);
    }
done:
    free(name);
    return st;
}

// "a b" (or ["a", "b"]) -> the ids of a, b and ab.
static dsc_status merge_ids(const dsc_tokenizer *t, const json_t *m, const int16_t *dec,
                            const char *file, size_t rank, int32_t ids[3]) {
    char a[1024], b[1024];
    const char *s = json_string_value(m);
    const char *sp = s ? strchr(s, ' ') : NULL;
    if (sp && (size_t)(sp - s) < sizeof a && strlen(sp + 1) < sizeof b) {
        snprintf(a, sizeof a, "%.*s", (int)(sp - s), s);
        snprintf(b, sizeof b, "%s", sp + 1);
    } else if (json_is_array(m) && json_array_size(m) == 2 &&
               json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
        snprintf(a, sizeof a, "%s", json_string_value(json_array_get(m, 0)));
        snprintf(b, sizeof b, "%s", json_string_value(json_array_get(m, 1)));
    } else {
        return dsc__fail(DSC_ERR_CORRUPT, "%s: model.merges[%zu] is not \"LEFT RIGHT\" or "
                         "[\"LEFT\", \"RIGHT\"]", file, rank);
    }
    uint8_t buf[2048];
    bool sa, sb;
    size_t na = token_bytes(a, dec, buf, &sa), nb = token_bytes(b, dec, buf + na, &sb);
    ids[0] = sa ? dsc__tok_index_find(t, buf, na) : -1;
    ids[1] = sb ? dsc__tok_index_find(t, buf + na, nb) : -1;
    ids[2] = sa && sb ? dsc__tok_index_find(t, buf, na + nb) : -1;
    if (ids[0] < 0 || ids[1] < 0 || ids[2] < 0)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: model.merges[%zu] \"%.40s\" + \"%.40s\": %s is "
                         "not in model.vocab; the merges and the vocabulary must come from the "
                         "same tokenizer", file, rank, a, b,
                         ids[0] < 0 ? "the left token" : ids[1] < 0 ? "the right token"
                                                                    : "their concatenation");
    return DSC_OK;
}

static dsc_status merges_load(dsc_tokenizer *t, const json_t *merges, const char *file) {
    size_t n = json_array_size(merges);
    t->pair_mask = dsc__tok_table_mask(n ? n : 1);
    t->pairs = malloc((t->pair_mask + 1) * sizeof *t->pairs);
    if (!t->pairs) return dsc__fail(DSC_ERR_OOM, "%s: out of memory for %zu merges", file, n);
    for (uint64_t i = 0; i <= t->pair_mask; i++) t->pairs[i].key = DSC__PAIR_EMPTY;
    int16_t map[DSC__BYTE_MAP_CPS], *dec = t->char_level ? NULL : map;
    dsc__tok_byte_decoder(map);
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        int32_t ids[3];
        DSC_TRY(merge_ids(t, m, dec, file, i, ids));
        dsc__tok_pair_insert(t, ids, (int32_t)i);
    }
    return DSC_OK;
}

static bool is_null_or(const json_t *v, const char *type_key, const char *want) {
    if (!v || json_is_null(v)) return true;
    const char *type = json_string_value(json_object_get(v, type_key));
    return type && !strcmp(type, want);
}

// The model's unknown-character handling in a SentencePiece-style file: byte_fallback's
// "<0xNN>" tokens, unk_token, fuse_unk.
static dsc_status unknowns_load(dsc_tokenizer *t, const json_t *model, const char *file) {
    bool fallback = json_is_true(json_object_get(model, "byte_fallback"));
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b); // as the reference spells them
        t->fallback_id[b] = fallback ? dsc__tok_index_find(t, (const uint8_t *)name, 6) : -1;
    }
    const json_t *unk = json_object_get(model, "unk_token");
    const char *name = json_string_value(unk);
    t->unk = name ? dsc__tok_index_find(t, (const uint8_t *)name, strlen(name)) : -1;
    if ((unk && !json_is_null(unk) && !name) || (name && t->unk < 0))
        return dsc__fail(DSC_ERR_CORRUPT, "%s: model.unk_token %s%s%s is not a token of "
                         "model.vocab", file, name ? "\"" : "", name ? name : "(not a string)",
                         name ? "\"" : "");
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    return DSC_OK;
}

// Published files write these as null or "" (GPT-2, Qwen2), dropout as null.
static dsc_status check_unset(const json_t *model, const char *file) {
    static const char *const unsupported[] = {"continuing_subword_prefix", "end_of_word_suffix",
                                              "dropout"};
    for (size_t i = 0; i < 3; i++) {
        const json_t *v = json_object_get(model, unsupported[i]);
        bool unset = !v || json_is_null(v) || (json_is_string(v) && !json_string_length(v)) ||
                     (json_is_number(v) && json_number_value(v) == 0);
        if (!unset)
            return dsc__fail(DSC_ERR_CONFIG, "%s: model.%s is set; dsc reads BPE models without "
                             "it (null)", file, unsupported[i]);
    }
    return DSC_OK;
}

// Whether BPE can never merge across a "▁" that follows another character: "▁" is a token, and
// every token of model.vocab has its "▁"s in one leading run (as SentencePiece trains, splitting
// by white space), so no merge spans such a place. A piece then splits there into words that BPE
// merges alone with the same result, and the encoder's word cache serves them (a Llama 2 text
// is one piece, as long as the text).
static bool meta_words(const dsc_tokenizer *t, const json_t *vocab) {
    if (!t->char_level || t->ignore_merges || dsc__tok_index_find(t, META, 3) < 0) return false;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        size_t n = strlen(key), i = 0;
        while (i + 3 <= n && !memcmp(key + i, META, 3)) i += 3;
        for (; i + 3 <= n; i++)
            if ((uint8_t)key[i] == META[0] && !memcmp(key + i, META, 3)) return false;
    }
    return true;
}

static dsc_status model_load(dsc_tokenizer *t, const json_t *root, const char *file) {
    const json_t *model = json_object_get(root, "model");
    const json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model,
                                                                                       "merges");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE"))
        return dsc__fail(DSC_ERR_CONFIG, "%s: model.type \"%s\" is not supported; dsc reads BPE "
                         "models: byte-level (GPT-2, Llama 3, Qwen2, SmolLM2) and "
                         "SentencePiece-style with byte_fallback (Llama 2, Mistral, TinyLlama, "
                         "Gemma)", file, type);
    if (!json_is_object(vocab) || !json_is_array(merges))
        return dsc__fail(DSC_ERR_CONFIG, "%s: model is not a BPE with a vocab object and a merges "
                         "list; dsc reads BPE models", file);
    DSC_TRY(check_unset(model, file));
    bool fallback = json_is_true(json_object_get(model, "byte_fallback"));
    if (fallback && !t->char_level)
        return dsc__fail(DSC_ERR_CONFIG, "%s: model.byte_fallback is true with a ByteLevel "
                         "pre_tokenizer; dsc reads byte_fallback in SentencePiece-style files "
                         "(no ByteLevel step) and byte-level files without it", file);
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    DSC_TRY(vocab_load(t, vocab, json_object_get(root, "added_tokens"), file));
    if (t->char_level) DSC_TRY(unknowns_load(t, model, file));
    t->json->meta_words = meta_words(t, vocab);
    const json_t *unk = json_object_get(model, "unk_token");
    for (int b = 0; b < 256 && !t->char_level && unk && !json_is_null(unk); b++)
        if (t->byte_id[b] < 0)
            return dsc__fail(DSC_ERR_CONFIG, "%s: byte 0x%02x has no token and model.unk_token "
                             "is set; dsc reads byte-level BPE with every byte in the vocabulary "
                             "or no unk_token", file, b);
    return merges_load(t, merges, file);
}

// ---- internal: added tokens ----

static const added *added_find(const dsc__tokjson *j, const uint8_t *w, size_t n) {
    for (uint64_t i = dsc_hash64(w, n) & j->added_mask;; i = (i + 1) & j->added_mask) {
        int32_t k = j->added_index[i];
        if (k < 0) return NULL;
        if (j->added[k].len == n && !memcmp(j->added[k].text, w, n)) return &j->added[k];
    }
}

static dsc_status added_add(dsc__tokjson *j, const char *c, int32_t id, bool lstrip,
                            bool rstrip, size_t *at, const char *file) {
    size_t len = strlen(c);
    if (len == 0 || added_find(j, (const uint8_t *)c, len)) return DSC_OK; // first one wins
    int l = 0;
    while (l < j->nlens && j->lens[l] > len) l++;
    if (l == j->nlens || j->lens[l] != len) {
        if (j->nlens == MAX_ADDED_LENS)
            return dsc__fail(DSC_ERR_CONFIG, "%s: added tokens come in more than %d lengths",
                             file, MAX_ADDED_LENS);
        memmove(j->lens + l + 1, j->lens + l, (size_t)(j->nlens++ - l) * sizeof *j->lens);
        j->lens[l] = len;
    }
    memcpy(j->added_bytes + *at, c, len);
    added *a = &j->added[j->nadded];
    *a = (added){j->added_bytes + *at, len, id, lstrip, rstrip};
    *at += len;
    uint64_t i = dsc_hash64(a->text, len) & j->added_mask;
    while (j->added_index[i] >= 0) i = (i + 1) & j->added_mask;
    j->added_index[i] = j->nadded++;
    j->first[(uint8_t)c[0]] = true;
    return DSC_OK;
}

// An added token with "normalized": true is found, by the reference, in the normalized text;
// dsc finds every added token in the text as given, which is the same only when normalizing
// leaves the token as it is.
static dsc_status check_normalized(const dsc__tokjson *j, const json_t *a, const char *file) {
    const char *c = json_string_value(json_object_get(a, "content"));
    if (!json_is_true(json_object_get(a, "normalized")) || dsc__norm_identity(j->norm))
        return DSC_OK;
    uint8_t *out;
    size_t n, len = strlen(c);
    if (!dsc__norm_apply(j->norm, (const uint8_t *)c, len, &out, &n))
        return dsc__fail(DSC_ERR_OOM, "%s: out of memory", file);
    bool same = n == len && !memcmp(out, c, n);
    if (out != (const uint8_t *)c) free(out);
    if (!same)
        return dsc__fail(DSC_ERR_CONFIG, "%s: added token \"%s\" has \"normalized\": true and "
                         "the normalizer changes it; dsc reads added tokens with normalized "
                         "false, or ones the normalizer leaves as they are", file, c);
    return DSC_OK;
}

static dsc_status added_load(dsc__tokjson *j, const json_t *list, const char *file) {
    size_t n = json_array_size(list), total = 0, i;
    json_t *a;
    json_array_foreach(list, i, a) total += strlen(json_string_value(json_object_get(a,
                                                                                     "content")));
    j->added = calloc(n ? n : 1, sizeof *j->added);
    j->added_bytes = malloc(total + 1);
    j->added_mask = dsc__tok_table_mask(n);
    j->added_index = malloc((j->added_mask + 1) * sizeof *j->added_index);
    if (!j->added || !j->added_bytes || !j->added_index)
        return dsc__fail(DSC_ERR_OOM, "%s: out of memory", file);
    memset(j->added_index, 0xFF, (j->added_mask + 1) * sizeof *j->added_index);
    size_t at = 0;
    json_array_foreach(list, i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (json_is_true(json_object_get(a, "single_word")))
            return dsc__fail(DSC_ERR_CONFIG, "%s: added token \"%s\" sets single_word; dsc reads "
                             "added tokens without it (lstrip and rstrip work)", file, c);
        DSC_TRY(check_normalized(j, a, file));
        DSC_TRY(added_add(j, c, (int32_t)json_integer_value(json_object_get(a, "id")),
                          json_is_true(json_object_get(a, "lstrip")),
                          json_is_true(json_object_get(a, "rstrip")), &at, file));
    }
    return DSC_OK;
}

// The longest added token at s[p..len), or NULL.
static const added *added_at(const dsc__tokjson *j, const uint8_t *s, size_t len, size_t p) {
    for (int l = 0; l < j->nlens; l++) {
        if (j->lens[l] > len - p) continue;
        const added *a = added_find(j, s + p, j->lens[l]);
        if (a) return a;
    }
    return NULL;
}

// ---- internal: post-processor and tokenizer_config.json ----

static int32_t token_id(const dsc_tokenizer *t, const char *text) {
    const dsc__tokjson *j = t->json;
    size_t n = strlen(text);
    const added *a = n ? added_find(j, (const uint8_t *)text, n) : NULL;
    if (a) return a->id;
    return n ? dsc__tok_index_find(t, (const uint8_t *)text, n) : -1;
}

// TemplateProcessing's "single" list: special tokens before and after the sequence $A.
static dsc_status template_load(dsc__tokjson *j, const json_t *pp, const char *file) {
    const json_t *single = json_object_get(pp, "single");
    const json_t *specials = json_object_get(pp, "special_tokens");
    bool after = false;
    size_t i;
    json_t *item;
    json_array_foreach(single, i, item) {
        if (json_object_get(item, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(item,
                                                                             "SpecialToken"),
                                                             "id"));
        const json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return dsc__fail(DSC_ERR_CORRUPT, "%s: post_processor TemplateProcessing single[%zu] "
                             "is neither a Sequence nor a SpecialToken listed in special_tokens",
                             file, i);
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            int *n = after ? &j->nsuffix : &j->nprefix;
            if (*n == MAX_AROUND)
                return dsc__fail(DSC_ERR_CONFIG, "%s: post_processor adds more than %d ids",
                                 file, MAX_AROUND);
            (after ? j->suffix : j->prefix)[(*n)++] = (int32_t)json_integer_value(id);
        }
    }
    return DSC_OK;
}

static dsc_status post_load(dsc__tokjson *j, const json_t *pp, const char *file) {
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (!pp || json_is_null(pp) || (type && !strcmp(type, "ByteLevel"))) return DSC_OK;
    if (type && !strcmp(type, "TemplateProcessing")) return template_load(j, pp, file);
    if (type && !strcmp(type, "Sequence")) {
        size_t i;
        json_t *p;
        json_array_foreach(json_object_get(pp, "processors"), i, p) DSC_TRY(post_load(j, p, file));
        return DSC_OK;
    }
    return dsc__fail(DSC_ERR_CONFIG, "%s: post_processor type \"%s\" is not supported; dsc reads "
                     "ByteLevel, TemplateProcessing and a Sequence of them", file,
                     type ? type : "(none)");
}

// A tokenizer_config.json token: a string or {"content": ...}.
static const char *config_token(const json_t *cfg, const char *key) {
    const json_t *v = json_object_get(cfg, key);
    return json_is_string(v) ? json_string_value(v)
                             : json_string_value(json_object_get(v, "content"));
}

// add_bos_token / add_eos_token, where given, decide whether bos_token / eos_token go around
// each text (as transformers' tokenizers that have those settings do).
static dsc_status config_flag(dsc_tokenizer *t, const json_t *cfg, const char *flag,
                              const char *token, bool bos, const char *file) {
    const json_t *v = json_object_get(cfg, flag);
    if (!json_is_boolean(v)) return DSC_OK;
    dsc__tokjson *j = t->json;
    int *n = bos ? &j->nprefix : &j->nsuffix;
    *n = 0;
    if (json_is_false(v)) return DSC_OK;
    const char *text = config_token(cfg, token);
    int32_t id = text ? token_id(t, text) : -1;
    if (id < 0)
        return dsc__fail(DSC_ERR_CONFIG, "%s: %s is true but %s %s%s%s is not a token", file,
                         flag, token, text ? "\"" : "(missing)", text ? text : "",
                         text ? "\"" : "");
    (bos ? j->prefix : j->suffix)[(*n)++] = id;
    return DSC_OK;
}

// End of text: tokenizer_config.json's eos_token, else a token named like one, else none.
static int32_t find_eot(const dsc_tokenizer *t, const json_t *cfg) {
    const char *eos = config_token(cfg, "eos_token");
    int32_t id = eos ? token_id(t, eos) : -1;
    static const char *const names[] = {"<|endoftext|>", "<|end_of_text|>", "</s>"};
    for (size_t i = 0; id < 0 && i < 3; i++) id = token_id(t, names[i]);
    return id;
}

static dsc_status config_load(dsc_tokenizer *t, const char *file) {
    char path[4200];
    const char *slash = strrchr(file, '/');
    if (slash) snprintf(path, sizeof path, "%.*s/tokenizer_config.json", (int)(slash - file), file);
    else snprintf(path, sizeof path, "tokenizer_config.json");
    json_error_t err;
    json_t *cfg = NULL;
    FILE *f = NULL;
    struct stat sb; // optional: absent means no settings; present, it must be a file
    if (stat(path, &sb) == 0) DSC_TRY(dsc__fopen_regular(path, &f));
    if (f) {
        // Reals: transformers writes model_max_length as 1000000000000000019884624838656, past
        // what a JSON integer holds here; no integer of the file is read.
        cfg = json_loadf(f, JSON_DECODE_INT_AS_REAL, &err);
        fclose(f);
        if (!cfg)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: line %d: %s; fix or remove the file", path,
                             err.line, err.text);
    }
    dsc_status st = DSC_OK;
    DSC_TRY_GOTO(config_flag(t, cfg, "add_bos_token", "bos_token", true, path), st, done);
    DSC_TRY_GOTO(config_flag(t, cfg, "add_eos_token", "eos_token", false, path), st, done);
    t->eot = find_eot(t, cfg);
done:
    json_decref(cfg);
    return st;
}

// ---- internal: loading ----

// Normalizer, pre-tokenizer, decoder and post-processor. A ByteLevel step in the pre-tokenizer
// makes a byte-level file; without one the file is SentencePiece-style (t->char_level).
static dsc_status check_parts(dsc_tokenizer *t, const json_t *root, const char *file) {
    dsc__tokjson *j = t->json;
    DSC_TRY(dsc__norm_create(&j->norm, json_object_get(root, "normalizer"), file));
    bool byte_level;
    DSC_TRY(dsc__pretok_create(&j->pre, json_object_get(root, "pre_tokenizer"), file,
                               &byte_level));
    t->char_level = !byte_level;
    const json_t *dec = json_object_get(root, "decoder");
    const char *type = json_string_value(json_object_get(dec, "type"));
    if (byte_level && !is_null_or(dec, "type", "ByteLevel"))
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder \"%s\" with a ByteLevel pre_tokenizer is "
                         "not supported; dsc decodes byte-level BPE with the ByteLevel decoder",
                         file, type ? type : "(no type)");
    if (!byte_level && type && !strcmp(type, "ByteLevel"))
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder ByteLevel without a ByteLevel step in the "
                         "pre_tokenizer; dsc reads byte-level BPE (ByteLevel in both) and "
                         "SentencePiece-style BPE (neither)", file);
    if (!byte_level) DSC_TRY(dsc__dec_create(&j->dec, dec, file));
    return post_load(j, json_object_get(root, "post_processor"), file);
}

// ---- internal: encoding ----

typedef struct piece_ctx {
    dsc__encoder *e;
    bool meta_words; // split at each "▁" after another character (see meta_words)
} piece_ctx;

static bool piece(void *ctx, const uint8_t *w, size_t n) {
    const piece_ctx *c = ctx;
    size_t start = 0;
    for (size_t i = 1; c->meta_words && i + 3 <= n; i++) {
        if (w[i] != META[0] || memcmp(w + i, META, 3)) continue;
        if (i >= 3 && !memcmp(w + i - 3, META, 3)) continue; // within a run of "▁"
        if (!dsc__encoder_word(c->e, w + start, i - start)) return false;
        start = i;
    }
    return dsc__encoder_word(c->e, w + start, n - start);
}

// Buffers of normalized text: the encoder's word cache borrows from them until the end.
typedef struct keep {
    uint8_t **v;
    size_t n, cap;
} keep;

static bool keep_add(keep *k, uint8_t *b) {
    if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 16;
        uint8_t **v = realloc(k->v, cap * sizeof *v);
        if (!v) {
            free(b);
            return false;
        }
        k->v = v;
        k->cap = cap;
    }
    k->v[k->n++] = b;
    return true;
}

static void keep_free(keep *k) {
    for (size_t i = 0; i < k->n; i++) free(k->v[i]);
    free(k->v);
}

// The text s[0..len) between added tokens (at_start: it begins the input): normalized,
// rewritten and split by the pre-tokenizer, each piece merged.
static bool encode_segment(const dsc__tokjson *j, dsc__encoder *e, keep *k, const uint8_t *s,
                           size_t len, bool at_start) {
    if (len == 0) return true; // the reference drops empty texts before normalizing
    uint8_t *a, *b;
    size_t na, nb;
    if (!dsc__norm_apply(j->norm, s, len, &a, &na)) return false;
    if (a != s && !keep_add(k, a)) return false;
    if (!dsc__pretok_prepare(j->pre, a, na, at_start, &b, &nb)) return false;
    if (b != a && !keep_add(k, b)) return false;
    piece_ctx c = {e, j->meta_words};
    return dsc__pretok_split(j->pre, b, nb, piece, &c);
}

// White space as the reference's lstrip / rstrip see it (Unicode's White_Space, as Rust's
// char::is_whitespace).
static bool is_ws(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

// The code point at s[0..avail) (valid UTF-8 assumed: the text was checked), *n its length.
static uint32_t cp_at(const uint8_t *s, size_t avail, size_t *n) {
    uint32_t c = s[0];
    *n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (*n > avail) *n = 1;
    if (*n == 1) return c;
    c &= 0xFF >> (*n + 1);
    for (size_t i = 1; i < *n; i++) c = c << 6 | (s[i] & 0x3F);
    return c;
}

// White space at the end of s[from..p) (lstrip) and at the start of s[q..len) (rstrip).
static size_t ws_before(const uint8_t *s, size_t from, size_t p) {
    size_t end = p;
    while (end > from) {
        size_t b = end - 1, n;
        while (b > from && (s[b] & 0xC0) == 0x80) b--; // the code point's first byte
        uint32_t c = cp_at(s + b, end - b, &n);
        if (!is_ws(c) || b + n != end) break;
        end = b;
    }
    return p - end;
}

static size_t ws_after(const uint8_t *s, size_t q, size_t len) {
    size_t at = q, n;
    while (at < len && is_ws(cp_at(s + at, len - at, &n))) at += n;
    return at - q;
}

static bool encode_text(const dsc_tokenizer *t, dsc__encoder *e, keep *k, const uint8_t *s,
                        size_t len) {
    const dsc__tokjson *j = t->json;
    size_t gap = 0;
    for (size_t p = 0; p < len; p++) {
        if (!j->first[s[p]]) continue;
        const added *a = added_at(j, s, len, p);
        if (!a) continue;
        size_t before = a->lstrip ? ws_before(s, gap, p) : 0;
        if (!encode_segment(j, e, k, s + gap, p - before - gap, gap == 0) ||
            !dsc__encoder_put(e, &a->id, 1))
            return false;
        gap = p + a->len;
        if (a->rstrip) gap += ws_after(s, gap, len);
        p = gap - 1;
    }
    return encode_segment(j, e, k, s + gap, len - gap, gap == 0);
}

// ---- library-internal API ----

dsc_status dsc__tokjson_load(dsc_tokenizer *t, const char *file) {
    // A file that cannot be opened is named with the system's reason (jansson would report it
    // at "line -1"); one that does not parse, with the line and column of the fault.
    json_error_t err;
    FILE *f;
    if (dsc__fopen_regular(file, &f) != DSC_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        return dsc__fail(DSC_ERR_IO, "%s; expected a Hugging Face tokenizer.json (hf:DIR reads "
                         "DIR/tokenizer.json)", why);
    }
    json_t *root = json_loadf(f, 0, &err);
    fclose(f);
    if (!root)
        return dsc__fail(DSC_ERR_CORRUPT, "%s:%d:%d: %s; expected a Hugging Face tokenizer.json",
                         file, err.line, err.column, err.text);
    dsc_status st = DSC_OK;
    t->json = calloc(1, sizeof *t->json);
    if (!t->json) {
        st = dsc__fail(DSC_ERR_OOM, "%s: out of memory", file);
        goto done;
    }
    DSC_TRY_GOTO(check_parts(t, root, file), st, done);
    DSC_TRY_GOTO(model_load(t, root, file), st, done);
    DSC_TRY_GOTO(added_load(t->json, json_object_get(root, "added_tokens"), file), st, done);
    DSC_TRY_GOTO(config_load(t, file), st, done);
done:
    json_decref(root);
    return st;
}

void dsc__tokjson_free(dsc__tokjson *j) {
    if (!j) return;
    dsc__pretok_destroy(j->pre);
    dsc__norm_destroy(j->norm);
    dsc__dec_destroy(j->dec);
    free(j->added);
    free(j->added_bytes);
    free(j->added_index);
    free(j);
}

dsc_status dsc__tokjson_encode(const dsc_tokenizer *t, const uint8_t *s, size_t len,
                               dsc__ibuf *out) {
    const dsc__tokjson *j = t->json;
    keep k = {0};
    dsc__encoder *e = dsc__encoder_create(t);
    bool ok = e && dsc__encoder_put(e, j->prefix, (size_t)j->nprefix) &&
              encode_text(t, e, &k, s, len) &&
              dsc__encoder_put(e, j->suffix, (size_t)j->nsuffix);
    if (ok) dsc__encoder_finish(e, out);
    else dsc__encoder_destroy(e);
    keep_free(&k);
    if (!ok) return dsc__fail(DSC_ERR_OOM, "tokenizer: out of memory encoding %zu bytes", len);
    return DSC_OK;
}

// As the reference's BPE::merge_word: each character's token; else, with byte_fallback, the
// "<0xNN>" tokens of its bytes when all exist; else unk_token, consecutive ones fused with
// fuse_unk (a pending unk waits past byte-fallback tokens, as there); else nothing. A byte that
// is not UTF-8 is a character of its own.
size_t dsc__tokjson_symbols(const dsc_tokenizer *t, const uint8_t *w, size_t n, int32_t *sym) {
    size_t m = 0;
    bool unk = false; // an unk is pending
    for (size_t i = 0, k; i < n; i += k) {
        uint32_t cp;
        k = dsc__utf8_decode(w + i, n - i, &cp);
        int32_t id = dsc__tok_index_find(t, w + i, k);
        if (id >= 0) {
            if (unk) sym[m++] = t->unk;
            unk = false;
            sym[m++] = id;
            continue;
        }
        bool all = true;
        for (size_t b = 0; b < k; b++) all = all && t->fallback_id[w[i + b]] >= 0;
        for (size_t b = 0; all && b < k; b++) sym[m++] = t->fallback_id[w[i + b]];
        if (all || t->unk < 0) continue;
        if (unk && !t->fuse_unk) sym[m++] = t->unk;
        unk = true;
    }
    if (unk) sym[m++] = t->unk;
    return m;
}

bool dsc__tokjson_has_decoder(const dsc_tokenizer *t) { return t->json->dec != NULL; }

dsc_status dsc__tokjson_decode(const dsc_tokenizer *t, const int32_t *ids, size_t n, char **text,
                               size_t *len) {
    if (!dsc__dec_apply(t->json->dec, t->bytes, t->off, ids, n, text, len))
        return dsc__fail(DSC_ERR_OOM, "tokenizer: out of memory decoding %zu tokens", n);
    return DSC_OK;
}
