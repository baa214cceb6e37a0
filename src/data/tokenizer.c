// data/tokenizer.c - byte-level tokenizer and GPT-2 byte-level BPE (see tokenizer.h).
#include "data/tokenizer.h"

#include <errno.h>   // errno
#include <jansson.h> // json_loadf, json_object_foreach
#include <stdbool.h> // bool
#include <stdio.h>   // FILE, fopen, getline, snprintf
#include <stdlib.h>  // malloc, calloc, realloc, free
#include <string.h>  // memchr, memcmp, memcpy, strcmp, strerror, strlen, strncmp, strrchr
#include <unistd.h>  // access

#include "base/hash.h"    // dsc_hash64
#include "base/io.h"      // dsc__mkdirs, dsc__fopen_regular
#include "base/log.h"     // DSC_WARN
#include "base/status.h"  // dsc__fail, DSC_TRY
#include "data/tokenizer_impl.h" // struct dsc_tokenizer, dsc__encoder
#include "data/unicode.h"        // dsc__utf8_decode, dsc__unicode_is_*

// Words longer than this are not cached: they rarely repeat and would bloat the cache.
#define CACHE_MAX_WORD 64
#define CACHE_MAX_SLOTS (1u << 22)
#define BYTE_MAP_CPS DSC__BYTE_MAP_CPS

typedef dsc__pair_slot pair_slot;
typedef dsc__ibuf ibuf;
#define PAIR_EMPTY DSC__PAIR_EMPTY
#define TOK_BYTE DSC__TOK_BYTE
#define TOK_GPT2 DSC__TOK_GPT2
#define TOK_IDS DSC__TOK_IDS
#define TOK_JSON DSC__TOK_JSON

// ---- internal: tables ----

// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order, so no token contains a space or a
// control character.
void dsc__tok_byte_to_cp(uint32_t enc[256]) {
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        enc[b] = keep ? b : 256 + extra++;
    }
}

static uint64_t mix64(uint64_t x) { // splitmix64 finalizer
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t dsc__tok_table_mask(size_t n) { // power of two >= 2n, minus one
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)n) cap <<= 1;
    return cap - 1;
}

static const uint8_t *tok_bytes(const dsc_tokenizer *t, int32_t id, size_t *n) {
    *n = t->off[id + 1] - t->off[id];
    return t->bytes + t->off[id];
}

int32_t dsc__tok_index_find(const dsc_tokenizer *t, const uint8_t *w, size_t n) {
    for (uint64_t i = dsc_hash64(w, n) & t->index_mask;; i = (i + 1) & t->index_mask) {
        int32_t id = t->index[i];
        if (id < 0) return -1;
        size_t m;
        const uint8_t *b = tok_bytes(t, id, &m);
        if (m == n && memcmp(b, w, n) == 0) return id;
    }
}

static const pair_slot *pair_find(const dsc_tokenizer *t, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t i = mix64(key) & t->pair_mask;; i = (i + 1) & t->pair_mask) {
        const pair_slot *p = &t->pairs[i];
        if (p->key == key) return p;
        if (p->key == PAIR_EMPTY) return NULL;
    }
}

// Raw bytes of a vocab.json / merges.txt token written in GPT-2's printable alphabet.
// Returns the byte count, or -1 when a character is outside the alphabet.
static long unprintable(const char *s, size_t len, const int16_t dec[BYTE_MAP_CPS], uint8_t *out) {
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        i += dsc__utf8_decode((const uint8_t *)s + i, len - i, &cp);
        if (cp >= BYTE_MAP_CPS || dec[cp] < 0) return -1;
        out[n++] = (uint8_t)dec[cp];
    }
    return (long)n;
}

void dsc__tok_byte_decoder(int16_t dec[BYTE_MAP_CPS]) {
    uint32_t enc[256];
    dsc__tok_byte_to_cp(enc);
    for (int i = 0; i < BYTE_MAP_CPS; i++) dec[i] = -1;
    for (int b = 0; b < 256; b++) dec[enc[b]] = (int16_t)b;
}

// ---- internal: loading vocab.json and merges.txt ----

// First pass over vocab.json: check ids are dense 0..n-1 and size each token.
static dsc_status vocab_sizes(json_t *vocab, const char *path, const int16_t *dec, uint32_t *len) {
    int n = (int)json_object_size(vocab);
    const char *key;
    json_t *val;
    uint8_t buf[1024];
    json_object_foreach(vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        size_t klen = strlen(key);
        if (id < 0 || id >= n || len[id] != UINT32_MAX)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: entry \"%.40s\" has id %lld: ids must be the "
                             "distinct integers 0..%d", path, key, (long long)id, n - 1);
        long m = klen < sizeof buf ? unprintable(key, klen, dec, buf) : -1;
        if (m < 0)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: entry \"%.40s\" is not in GPT-2's byte "
                             "alphabet; is this a GPT-2 vocab.json?", path, key);
        len[id] = (uint32_t)m;
    }
    return DSC_OK;
}

static dsc_status vocab_fill(dsc_tokenizer *t, json_t *vocab, const char *path,
                             const int16_t *dec) {
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        (void)unprintable(key, strlen(key), dec, t->bytes + t->off[id]);
        size_t n;
        const uint8_t *w = tok_bytes(t, id, &n);
        if (dsc__tok_index_find(t, w, n) >= 0)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: two entries spell \"%.40s\"", path, key);
        dsc__tok_index_add(t, id);
    }
    return DSC_OK;
}

void dsc__tok_index_add(dsc_tokenizer *t, int32_t id) {
    size_t n;
    const uint8_t *w = tok_bytes(t, id, &n);
    uint64_t i = dsc_hash64(w, n) & t->index_mask;
    while (t->index[i] >= 0) i = (i + 1) & t->index_mask;
    t->index[i] = id;
}

static dsc_status vocab_tables(dsc_tokenizer *t, json_t *vocab, const char *path) {
    int16_t dec[BYTE_MAP_CPS];
    dsc__tok_byte_decoder(dec);
    int n = (int)json_object_size(vocab);
    t->vocab_size = n;
    t->off = malloc(((size_t)n + 1) * sizeof *t->off);
    uint32_t *len = malloc((size_t)n * sizeof *len);
    t->index_mask = dsc__tok_table_mask((size_t)n);
    t->index = malloc((t->index_mask + 1) * sizeof *t->index);
    dsc_status st = DSC_ERR_OOM;
    if (!t->off || !len || !t->index) goto fail;
    memset(len, 0xFF, (size_t)n * sizeof *len);
    memset(t->index, 0xFF, (t->index_mask + 1) * sizeof *t->index);
    DSC_TRY_GOTO(vocab_sizes(vocab, path, dec, len), st, fail);
    t->off[0] = 0;
    for (int i = 0; i < n; i++) t->off[i + 1] = t->off[i] + len[i];
    t->bytes = malloc(t->off[n] + 1);
    if (!t->bytes) goto fail;
    DSC_TRY_GOTO(vocab_fill(t, vocab, path, dec), st, fail);
    free(len);
    return DSC_OK;
fail:
    free(len);
    if (st == DSC_ERR_OOM) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", path);
    return st;
}

static dsc_status load_vocab(dsc_tokenizer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    FILE *f;
    if (dsc__fopen_regular(path, &f) != DSC_OK) {
        dsc__error_prefix("tokenizer gpt2 (the folder must hold GPT-2's vocab.json and "
                          "merges.txt): ");
        return DSC_ERR_IO;
    }
    json_error_t err;
    json_t *vocab = json_loadf(f, 0, &err);
    fclose(f);
    if (!vocab)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: line %d: %s; expected GPT-2's vocab.json", path,
                         err.line, err.text);
    if (!json_is_object(vocab) || json_object_size(vocab) == 0) {
        json_decref(vocab);
        return dsc__fail(DSC_ERR_CORRUPT, "%s: not a JSON object of token -> id; expected "
                         "GPT-2's vocab.json", path);
    }
    dsc_status st = vocab_tables(t, vocab, path);
    json_decref(vocab);
    if (st != DSC_OK) return st;
    uint8_t one[1];
    for (int b = 0; b < 256; b++) {
        one[0] = (uint8_t)b;
        t->byte_id[b] = dsc__tok_index_find(t, one, 1);
        if (t->byte_id[b] < 0)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: byte 0x%02x has no token; is this a GPT-2 "
                             "vocab.json?", path, b);
    }
    t->eot = dsc__tok_index_find(t, (const uint8_t *)"<|endoftext|>", 13);
    if (t->eot < 0)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: no \"<|endoftext|>\" token", path);
    return DSC_OK;
}

// One "left right" line of merges.txt -> ids of left, right and their concatenation (-1 when
// vocab.json lacks that token). DSC_ERR_CORRUPT when the line is not two tokens.
static dsc_status merge_line(const dsc_tokenizer *t, char *line, size_t len, const int16_t *dec,
                             int32_t ids[3]) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    char *sp = memchr(line, ' ', len);
    uint8_t buf[512];
    if (!sp || len >= sizeof buf) return DSC_ERR_CORRUPT;
    long a = unprintable(line, (size_t)(sp - line), dec, buf);
    long b = a < 0 ? -1 : unprintable(sp + 1, len - (size_t)(sp - line) - 1, dec, buf + a);
    if (a <= 0 || b <= 0) return DSC_ERR_CORRUPT;
    ids[0] = dsc__tok_index_find(t, buf, (size_t)a);
    ids[1] = dsc__tok_index_find(t, buf + a, (size_t)b);
    ids[2] = dsc__tok_index_find(t, buf, (size_t)(a + b));
    return DSC_OK;
}

void dsc__tok_pair_insert(dsc_tokenizer *t, const int32_t ids[3], int32_t rank) {
    uint64_t key = (uint64_t)(uint32_t)ids[0] << 32 | (uint32_t)ids[1];
    uint64_t i = mix64(key) & t->pair_mask;
    for (; t->pairs[i].key != PAIR_EMPTY; i = (i + 1) & t->pair_mask)
        if (t->pairs[i].key == key) return; // a repeated merge keeps its first (best) rank
    t->pairs[i] = (pair_slot){key, rank, ids[2]};
}

// A merge naming a token that vocab.json lacks can never fire; a handful are tolerated (some
// published copies of GPT-2's vocab.json drop a token but keep its merge), more mean the two
// files do not belong together.
static dsc_status check_skipped(const char *path, long skipped, int32_t kept) {
    if (skipped == 0) return DSC_OK;
    if (skipped > 16 && skipped * 100 > kept)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: %ld of %ld merges name tokens missing from "
                         "vocab.json; the two files must come from the same tokenizer", path,
                         skipped, skipped + kept);
    DSC_WARN("data", "%s: %ld merge(s) name tokens missing from vocab.json; ignoring them", path,
             skipped);
    return DSC_OK;
}

static dsc_status load_merges(dsc_tokenizer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/merges.txt", dir);
    FILE *f;
    if (dsc__fopen_regular(path, &f) != DSC_OK) {
        dsc__error_prefix("tokenizer gpt2 (the folder must hold GPT-2's vocab.json and "
                          "merges.txt): ");
        return DSC_ERR_IO;
    }
    int16_t dec[BYTE_MAP_CPS];
    dsc__tok_byte_decoder(dec);
    // each merge creates a token: at most vocab_size merges
    t->pair_mask = dsc__tok_table_mask((size_t)t->vocab_size);
    t->pairs = malloc((t->pair_mask + 1) * sizeof *t->pairs);
    dsc_status st = t->pairs ? DSC_OK : dsc__fail(DSC_ERR_OOM, "%s: out of memory", path);
    for (uint64_t i = 0; st == DSC_OK && i <= t->pair_mask; i++) t->pairs[i].key = PAIR_EMPTY;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int32_t rank = 0;
    long skipped = 0;
    for (long lineno = 1; st == DSC_OK && (len = getline(&line, &cap, f)) >= 0; lineno++) {
        if (strncmp(line, "#version", 8) == 0 || line[0] == '\n' || line[0] == '\r') continue;
        int32_t ids[3];
        if (merge_line(t, line, (size_t)len, dec, ids) != DSC_OK)
            st = dsc__fail(DSC_ERR_CORRUPT, "%s:%ld: expected two tokens separated by a space; is "
                           "this GPT-2's merges.txt?", path, lineno);
        else if (rank >= t->vocab_size)
            st = dsc__fail(DSC_ERR_CORRUPT, "%s: more merges than vocabulary entries", path);
        else if (ids[0] < 0 || ids[1] < 0 || ids[2] < 0)
            skipped++;
        else
            dsc__tok_pair_insert(t, ids, rank++);
    }
    free(line);
    fclose(f);
    if (st == DSC_OK) st = check_skipped(path, skipped, rank);
    return st;
}

// ---- internal: pre-tokenization (GPT-2's split pattern, by hand) ----

enum { C_SPACE, C_LETTER, C_NUMBER, C_OTHER };

static int char_class(const uint8_t *s, size_t len, size_t pos, size_t *next) {
    uint32_t cp;
    *next = pos + dsc__utf8_decode(s + pos, len - pos, &cp);
    if (dsc__unicode_is_space(cp)) return C_SPACE;
    if (dsc__unicode_is_letter(cp)) return C_LETTER;
    if (dsc__unicode_is_number(cp)) return C_NUMBER;
    return C_OTHER;
}

// 's 't 're 've 'm 'll 'd (ASCII apostrophe, lower case only, as in the reference).
static size_t contraction_len(const uint8_t *s, size_t len, size_t pos) {
    if (s[pos] != '\'' || pos + 1 >= len) return 0;
    uint8_t c = s[pos + 1], d = pos + 2 < len ? s[pos + 2] : 0;
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return 2;
    if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return 3;
    return 0;
}

// End of the piece that starts at pos (pos < len). Mirrors the pattern's alternatives in order:
// contractions; an optional single space then a run of letters, of numbers, or of other
// characters; else whitespace, which gives its last character to the following word
// (\s+(?!\S)) unless the run is a single character or ends the text.
static size_t piece_end(const uint8_t *s, size_t len, size_t pos) {
    size_t k = contraction_len(s, len, pos);
    if (k) return pos + k;
    size_t q = (s[pos] == ' ' && pos + 1 < len) ? pos + 1 : pos, next;
    int c = char_class(s, len, q, &next);
    if (c != C_SPACE) {
        while (next < len) {
            size_t after;
            if (char_class(s, len, next, &after) != c) break;
            next = after;
        }
        return next;
    }
    size_t p = pos, last = pos, count = 0;
    while (p < len && char_class(s, len, p, &next) == C_SPACE) {
        last = p;
        p = next;
        count++;
    }
    return (p == len || count == 1) ? p : last;
}

// ---- internal: BPE with a per-call word cache ----

bool dsc__ibuf_reserve(ibuf *b, size_t extra) {
    if (b->n + extra <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra) cap *= 2;
    int32_t *v = realloc(b->v, cap * sizeof *v);
    if (!v) return false;
    b->v = v;
    b->cap = cap;
    return true;
}

typedef struct cache_slot {
    const uint8_t *word; // borrowed from the text being encoded; NULL = free
    uint64_t hash;
    uint32_t len, ids_at, nids; // ids live in encoder.cached
} cache_slot;

// BPE of long words (see bpe_long): symbols as a linked list over their first byte's position,
// and a min-heap of candidate merges ordered by (rank, position).
typedef struct bpe_node {
    int32_t id;         // -1 once merged into its left neighbour
    int32_t prev, next; // -1 at the ends
} bpe_node;

typedef struct bpe_cand {
    int32_t rank, pos;   // heap order
    int32_t left, right; // the pair when queued; stale once either side has changed
    int32_t merged;
} bpe_cand;

typedef struct bpe_scratch {
    bpe_node *nodes;
    bpe_cand *heap, *round;
    size_t nheap, cap; // cap: entries allocated in nodes; heap and round hold 3 * cap
} bpe_scratch;

typedef struct dsc__encoder {
    const dsc_tokenizer *t;
    ibuf out, sym, cached;
    cache_slot *slots;
    size_t mask, used;
    bpe_scratch bs;
} dsc__encoder;
typedef dsc__encoder encoder;

// Words up to this many bytes use the quadratic scan, longer ones the heap: same result.
#define BPE_SCAN_MAX 64

// Merge the pair of lowest rank everywhere it occurs, left to right, until no pair merges (the
// reference algorithm; quadratic in the word length).
static void bpe(const dsc_tokenizer *t, int32_t *sym, size_t *nsym) {
    size_t m = *nsym;
    while (m > 1) {
        const pair_slot *best = NULL;
        for (size_t i = 0; i + 1 < m; i++) {
            const pair_slot *p = pair_find(t, sym[i], sym[i + 1]);
            if (p && (!best || p->rank < best->rank)) best = p;
        }
        if (!best) break;
        int32_t a = (int32_t)(best->key >> 32), b = (int32_t)(uint32_t)best->key;
        size_t j = 0;
        for (size_t i = 0; i < m;) { // j <= i, so merging in place is safe
            if (i + 1 < m && sym[i] == a && sym[i + 1] == b) {
                sym[j++] = best->merged;
                i += 2;
            } else {
                sym[j++] = sym[i++];
            }
        }
        m = j;
    }
    *nsym = m;
}

static bool cand_less(const bpe_cand *x, const bpe_cand *y) {
    return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void heap_push(bpe_scratch *b, bpe_cand c) {
    size_t i = b->nheap++;
    while (i > 0 && cand_less(&c, &b->heap[(i - 1) / 2])) {
        b->heap[i] = b->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    b->heap[i] = c;
}

static bpe_cand heap_pop(bpe_scratch *b) {
    bpe_cand top = b->heap[0], last = b->heap[--b->nheap];
    size_t i = 0, n = b->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && cand_less(&b->heap[c + 1], &b->heap[c])) c++;
        if (!cand_less(&b->heap[c], &last)) break;
        b->heap[i] = b->heap[c];
        i = c;
    }
    if (n > 0) b->heap[i] = last;
    return top;
}

// Queue the pair starting at node pos, if it has a right neighbour and the pair merges.
static void push_pair(const dsc_tokenizer *t, bpe_scratch *b, int32_t pos) {
    int32_t nx = pos < 0 ? -1 : b->nodes[pos].next;
    if (nx < 0) return;
    int32_t l = b->nodes[pos].id, r = b->nodes[nx].id;
    const pair_slot *p = pair_find(t, l, r);
    if (p) heap_push(b, (bpe_cand){p->rank, pos, l, r, p->merged});
}

static bool cand_valid(const bpe_scratch *b, const bpe_cand *c) {
    const bpe_node *n = &b->nodes[c->pos];
    return n->id == c->left && n->next >= 0 && b->nodes[n->next].id == c->right;
}

static bool scratch_reserve(bpe_scratch *b, size_t n) {
    if (n <= b->cap) return true;
    bpe_node *nodes = realloc(b->nodes, n * sizeof *nodes);
    if (nodes) b->nodes = nodes;
    bpe_cand *heap = nodes ? realloc(b->heap, 3 * n * sizeof *heap) : NULL;
    if (heap) b->heap = heap;
    bpe_cand *round = heap ? realloc(b->round, 3 * n * sizeof *round) : NULL;
    if (round) b->round = round;
    if (!round) return false;
    b->cap = n;
    return true;
}

// Same result as bpe() in O(n log n). Each round takes every queued occurrence of the
// lowest-ranked pair (a rank names one pair) in position order and merges those still intact:
// the reference's left-to-right pass. Pairs formed by a merge never have the round's rank, so
// they wait for later rounds. The heap holds at most 3n entries: n-1 initial pairs plus two per
// merge.
static bool bpe_long(const dsc_tokenizer *t, bpe_scratch *b, int32_t *sym, size_t *nsym) {
    size_t n = *nsym;
    if (!scratch_reserve(b, n)) return false;
    for (size_t i = 0; i < n; i++)
        b->nodes[i] = (bpe_node){sym[i], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1};
    b->nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) push_pair(t, b, (int32_t)i);
    while (b->nheap > 0) {
        int32_t rank = b->heap[0].rank;
        size_t nround = 0;
        while (b->nheap > 0 && b->heap[0].rank == rank) b->round[nround++] = heap_pop(b);
        for (size_t k = 0; k < nround; k++) {
            const bpe_cand *c = &b->round[k];
            if (!cand_valid(b, c)) continue; // stale, or consumed earlier in this round
            bpe_node *node = &b->nodes[c->pos], *gone = &b->nodes[node->next];
            node->id = c->merged;
            node->next = gone->next;
            if (gone->next >= 0) b->nodes[gone->next].prev = c->pos;
            gone->id = -1;
            push_pair(t, b, node->prev);
            push_pair(t, b, c->pos);
        }
    }
    size_t m = 0; // node 0 always survives: a merge keeps its left node
    for (int32_t i = 0; i >= 0; i = b->nodes[i].next) sym[m++] = b->nodes[i].id;
    *nsym = m;
    return true;
}

static cache_slot *cache_find(encoder *e, const uint8_t *w, size_t n, uint64_t h) {
    for (size_t i = h & e->mask;; i = (i + 1) & e->mask) {
        cache_slot *c = &e->slots[i];
        if (!c->word || (c->hash == h && c->len == n && memcmp(c->word, w, n) == 0)) return c;
    }
}

static bool cache_grow(encoder *e) {
    size_t cap = e->slots ? 2 * (e->mask + 1) : 4096;
    cache_slot *slots = calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; e->slots && i <= e->mask; i++) {
        cache_slot *c = &e->slots[i];
        if (!c->word) continue;
        size_t j = c->hash & (cap - 1);
        while (slots[j].word) j = (j + 1) & (cap - 1);
        slots[j] = *c;
    }
    free(e->slots);
    e->slots = slots;
    e->mask = cap - 1;
    return true;
}

static bool encode_word(encoder *e, const uint8_t *w, size_t n) {
    bool cacheable = n <= CACHE_MAX_WORD;
    uint64_t h = cacheable ? dsc_hash64(w, n) : 0;
    cache_slot *c = cacheable && e->slots ? cache_find(e, w, n, h) : NULL;
    if (c && c->word) {
        if (!dsc__ibuf_reserve(&e->out, c->nids)) return false;
        memcpy(e->out.v + e->out.n, e->cached.v + c->ids_at, c->nids * sizeof(int32_t));
        e->out.n += c->nids;
        return true;
    }
    e->sym.n = 0;
    if (!dsc__ibuf_reserve(&e->sym, n) || !dsc__ibuf_reserve(&e->out, n)) return false;
    int32_t whole = e->t->ignore_merges ? dsc__tok_index_find(e->t, w, n) : -1;
    size_t m = 0;
    if (whole >= 0) e->sym.v[m++] = whole;
    else if (e->t->char_level) m = dsc__tokjson_symbols(e->t, w, n, e->sym.v);
    else
        for (size_t i = 0; i < n; i++) // a byte without a token is dropped
            if (e->t->byte_id[w[i]] >= 0) e->sym.v[m++] = e->t->byte_id[w[i]];
    bool merge = whole < 0 && m > 1;
    if (merge && m <= BPE_SCAN_MAX) bpe(e->t, e->sym.v, &m);
    else if (merge && !bpe_long(e->t, &e->bs, e->sym.v, &m)) return false;
    memcpy(e->out.v + e->out.n, e->sym.v, m * sizeof(int32_t));
    e->out.n += m;
    if (!cacheable) return true;
    if ((e->used + 1) * 2 > (e->slots ? e->mask + 1 : 0)) {
        if ((e->slots && e->mask + 1 >= CACHE_MAX_SLOTS) || !cache_grow(e)) return true;
    }
    if (!dsc__ibuf_reserve(&e->cached, m)) return true; // the cache is optional
    c = cache_find(e, w, n, h);
    *c = (cache_slot){w, h, (uint32_t)n, (uint32_t)e->cached.n, (uint32_t)m};
    memcpy(e->cached.v + e->cached.n, e->sym.v, m * sizeof(int32_t));
    e->cached.n += m;
    e->used++;
    return true;
}

static void encoder_free(encoder *e) {
    free(e->sym.v);
    free(e->cached.v);
    free(e->slots);
    free(e->bs.nodes);
    free(e->bs.heap);
    free(e->bs.round);
}

dsc__encoder *dsc__encoder_create(const dsc_tokenizer *t) {
    encoder *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->t = t;
    if (!dsc__ibuf_reserve(&e->out, 16)) { // the output is an allocation even when empty
        free(e);
        return NULL;
    }
    return e;
}

bool dsc__encoder_word(dsc__encoder *e, const uint8_t *w, size_t n) {
    return encode_word(e, w, n);
}

bool dsc__encoder_put(dsc__encoder *e, const int32_t *ids, size_t n) {
    if (n == 0) return true;
    if (!dsc__ibuf_reserve(&e->out, n)) return false;
    memcpy(e->out.v + e->out.n, ids, n * sizeof *ids);
    e->out.n += n;
    return true;
}

void dsc__encoder_finish(dsc__encoder *e, dsc__ibuf *b) {
    *b = e->out;
    encoder_free(e);
    free(e);
}

void dsc__encoder_destroy(dsc__encoder *e) {
    if (!e) return;
    free(e->out.v);
    encoder_free(e);
    free(e);
}

static dsc_status encode_gpt2(const dsc_tokenizer *t, const uint8_t *s, size_t len, ibuf *out) {
    encoder *e = dsc__encoder_create(t);
    bool ok = e && dsc__ibuf_reserve(&e->out, len / 3 + 16);
    for (size_t pos = 0, end; ok && pos < len; pos = end) {
        end = piece_end(s, len, pos);
        ok = encode_word(e, s + pos, end - pos);
    }
    if (!ok) {
        dsc__encoder_destroy(e);
        return dsc__fail(DSC_ERR_OOM, "tokenizer: out of memory encoding %zu bytes", len);
    }
    dsc__encoder_finish(e, out);
    return DSC_OK;
}

// ---- token ids as text ----

// "ids" (vocabulary 65536) or "ids:N" (N >= 1); -1 when spec is neither.
static int ids_vocab(const char *spec) {
    if (!strcmp(spec, "ids")) return 65536;
    if (strncmp(spec, "ids:", 4) || !spec[4]) return -1;
    long long v = 0;
    for (const char *c = spec + 4; *c; c++) {
        if (*c < '0' || *c > '9' || v > INT32_MAX) return -1;
        v = v * 10 + (*c - '0');
    }
    return v >= 1 && v <= INT32_MAX ? (int)v : -1;
}

static bool ids_sep(char c) { return c == ' ' || c == ',' || c == '\t' || c == '\n' || c == '\r'; }

// The word at s[start..] up to the next separator (at most 20 bytes) for a message, with bytes
// that are not printable ASCII written as \xNN, so that binary input does not reach the terminal.
static void word_text(const char *s, size_t len, size_t start, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = start; i < len && i < start + 20 && !ids_sep(s[i]) && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, cap - o, "\\x%02x", c);
    }
    if (start + 20 < len && o + 4 < cap && !ids_sep(s[start + 20]))
        o += (size_t)snprintf(out + o, cap - o, "...");
    out[o] = '\0';
}

// Decimal ids separated by white space or commas.
static dsc_status encode_ids(const dsc_tokenizer *t, const char *s, size_t len, int32_t **tokens,
                             size_t *ntok) {
    int32_t *v = malloc((len / 2 + 1) * sizeof *v);
    if (!v) return dsc__fail(DSC_ERR_OOM, "tokenizer: out of memory encoding %zu bytes", len);
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        if (s[i] == ' ' || s[i] == ',' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
            i++;
            continue;
        }
        long long x = 0;
        size_t start = i;
        while (i < len && s[i] >= '0' && s[i] <= '9' && x < t->vocab_size)
            x = x * 10 + (s[i++] - '0');
        bool sep = i == len || s[i] == ' ' || s[i] == ',' || s[i] == '\t' || s[i] == '\n' ||
                   s[i] == '\r';
        if (i == start || !sep || x >= t->vocab_size) {
            free(v);
            char word[128];
            word_text(s, len, start, word, sizeof word);
            return dsc__fail(DSC_ERR_INVALID_ARG, "tokenizer %s: \"%s\" at byte %zu is not "
                             "a token id below %d; write ids as decimal numbers separated by "
                             "spaces", t->spec, word, start, t->vocab_size);
        }
        v[n++] = (int32_t)x;
    }
    *tokens = v;
    *ntok = n;
    return DSC_OK;
}

// ---- public API ----

// The tokenizer.json a spec names ("hf:DIR" or a path ending in ".json"), written into path;
// false when the spec is neither.
static bool json_spec(const char *spec, char *path, size_t cap) {
    size_t n = strlen(spec);
    if (!strncmp(spec, "hf:", 3) && spec[3]) {
        snprintf(path, cap, "%s/tokenizer.json", spec + 3);
        return true;
    }
    if (n > 5 && !strcmp(spec + n - 5, ".json")) {
        snprintf(path, cap, "%s", spec);
        return true;
    }
    return false;
}

// A bare folder ("llama") that holds a tokenizer: say which prefix takes it.
static dsc_status folder_hint(const char *spec) {
    static const struct {
        const char *file, *prefix;
    } kinds[] = {{"tokenizer.json", "hf:"}, {"vocab.json", "gpt2:"}};
    char path[4200];
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", spec, kinds[i].file);
        if (access(path, R_OK) == 0)
            return dsc__fail(DSC_ERR_INVALID_ARG, "tokenizer \"%s\" is a folder holding %s: "
                             "give it as \"%s%s\"", spec, kinds[i].file, kinds[i].prefix, spec);
    }
    return DSC_OK;
}

dsc_status dsc_tokenizer_create(dsc_tokenizer **out, const char *spec) {
    *out = NULL;
    if (!spec) return dsc__fail(DSC_ERR_INVALID_ARG, "tokenizer: no spec given");
    if (strlen(spec) >= 4000)
        return dsc__fail(DSC_ERR_INVALID_ARG, "tokenizer spec too long: %.80s...", spec);
    char json_path[4200];
    bool byte = strcmp(spec, "byte") == 0, gpt2 = strncmp(spec, "gpt2:", 5) == 0 && spec[5];
    bool json = json_spec(spec, json_path, sizeof json_path);
    int ids = ids_vocab(spec);
    if (!byte && !gpt2 && !json && ids < 0) DSC_TRY(folder_hint(spec));
    if (!byte && !gpt2 && !json && ids < 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "tokenizer \"%s\": unknown; use \"byte\" or "
                         "\"gpt2:DIR\" (DIR holding GPT-2's vocab.json and merges.txt), "
                         "\"hf:DIR\" (DIR holding a Hugging Face tokenizer.json), a path to a "
                         "tokenizer.json, or \"ids\" / \"ids:VOCAB\" (token ids written as "
                         "numbers)", spec);
    dsc_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return dsc__fail(DSC_ERR_OOM, "tokenizer: out of memory");
    snprintf(t->spec, sizeof t->spec, "%s", spec);
    t->kind = byte ? TOK_BYTE : gpt2 ? TOK_GPT2 : json ? TOK_JSON : TOK_IDS;
    t->vocab_size = ids > 0 ? ids : 256;
    t->eot = ids > 0 ? -1 : 0;
    dsc_status st = DSC_OK;
    if (gpt2) {
        DSC_TRY_GOTO(load_vocab(t, spec + 5), st, fail);
        DSC_TRY_GOTO(load_merges(t, spec + 5), st, fail);
    }
    if (json) DSC_TRY_GOTO(dsc__tokjson_load(t, json_path), st, fail);
    *out = t;
    return DSC_OK;
fail:
    dsc_tokenizer_destroy(t);
    return st;
}

void dsc_tokenizer_destroy(dsc_tokenizer *t) {
    if (!t) return;
    free(t->bytes);
    free(t->off);
    free(t->index);
    free(t->pairs);
    dsc__tokjson_free(t->json);
    free(t);
}

// ---- saving with a checkpoint ----

int dsc_tokenizer_files(const dsc_tokenizer *t, dsc_tokenizer_file *out) {
    if (t->kind == TOK_GPT2) {
        out[0].name = "vocab.json";
        snprintf(out[0].path, sizeof out[0].path, "%s/vocab.json", t->spec + 5);
        out[1].name = "merges.txt";
        snprintf(out[1].path, sizeof out[1].path, "%s/merges.txt", t->spec + 5);
        return 2;
    }
    if (t->kind != TOK_JSON) return 0; // nothing but the spec
    out[0].name = "tokenizer.json";
    json_spec(t->spec, out[0].path, sizeof out[0].path);
    char dir[sizeof out[0].path - 32]; // tokenizer_config.json lies beside tokenizer.json
    snprintf(dir, sizeof dir, "%.*s", (int)sizeof dir - 1, out[0].path);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = '\0';
    else dir[0] = '\0';
    out[1].name = "tokenizer_config.json";
    snprintf(out[1].path, sizeof out[1].path, "%stokenizer_config.json", dir);
    return access(out[1].path, R_OK) == 0 ? 2 : 1;
}

bool dsc_tokenizer_find(const char *dir, char *spec, size_t cap) {
    char path[4300];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) == 0) {
        snprintf(spec, cap, "hf:%s", dir);
        return true;
    }
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    if (access(path, R_OK) == 0) {
        snprintf(spec, cap, "gpt2:%s", dir);
        return true;
    }
    return false;
}

int dsc_tokenizer_vocab_size(const dsc_tokenizer *t) { return t->vocab_size; }
int32_t dsc_tokenizer_eot(const dsc_tokenizer *t) { return t->eot; }
const char *dsc_tokenizer_spec(const dsc_tokenizer *t) { return t->spec; }

dsc_status dsc_tokenizer_encode(const dsc_tokenizer *t, const char *text, size_t len,
                                int32_t **tokens, size_t *ntok) {
    *tokens = NULL;
    *ntok = 0;
    const uint8_t *s = (const uint8_t *)text;
    if (t->kind == TOK_IDS) return encode_ids(t, text, len, tokens, ntok);
    if (t->kind == TOK_GPT2 || t->kind == TOK_JSON) {
        ibuf b = {0};
        DSC_TRY(t->kind == TOK_GPT2 ? encode_gpt2(t, s, len, &b)
                                    : dsc__tokjson_encode(t, s, len, &b));
        *tokens = b.v;
        *ntok = b.n;
        return DSC_OK;
    }
    int32_t *v = malloc((len ? len : 1) * sizeof *v);
    if (!v) return dsc__fail(DSC_ERR_OOM, "tokenizer: out of memory encoding %zu bytes", len);
    for (size_t i = 0; i < len; i++) v[i] = s[i];
    *tokens = v;
    *ntok = len;
    return DSC_OK;
}

dsc_status dsc_tokenizer_decode(const dsc_tokenizer *t, const int32_t *tokens, size_t n,
                                char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= t->vocab_size)
            return dsc__fail(DSC_ERR_INVALID_ARG, "tokenizer %s: token %zu is %d, outside the "
                             "vocabulary [0, %d)", t->spec, i, tokens[i], t->vocab_size);
        bool bpe = t->kind == TOK_GPT2 || t->kind == TOK_JSON;
        total += bpe                  ? t->off[tokens[i] + 1] - t->off[tokens[i]]
                 : t->kind == TOK_IDS ? 12 // " " and at most 10 digits, and the NUL
                                      : 1;
    }
    if (t->kind == TOK_JSON && dsc__tokjson_has_decoder(t))
        return dsc__tokjson_decode(t, tokens, n, text, len);
    char *s = malloc(total + 1);
    if (!s) return dsc__fail(DSC_ERR_OOM, "tokenizer: out of memory decoding %zu tokens", n);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (t->kind == TOK_BYTE) {
            s[at++] = (char)tokens[i];
            continue;
        }
        if (t->kind == TOK_IDS) {
            at += (size_t)snprintf(s + at, total + 1 - at, " %d", tokens[i]);
            continue;
        }
        size_t m;
        const uint8_t *b = tok_bytes(t, tokens[i], &m);
        memcpy(s + at, b, m);
        at += m;
    }
    s[at] = '\0';
    *text = s;
    *len = at;
    return DSC_OK;
}
