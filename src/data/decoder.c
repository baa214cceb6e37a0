// data/decoder.c - tokenizer.json decoders: Replace, ByteFallback, Fuse, Strip, Metaspace and
// Sequences of them (see decoder.h).
#include "data/decoder.h"

#include <stdlib.h> // calloc, free, malloc, realloc
#include <string.h> // memcmp, memcpy, strcmp, strlen, strpbrk

#include "base/status.h"  // dsc__fail, DSC_TRY
#include "data/unicode.h" // dsc__utf8_decode, DSC_UTF8_INVALID

#define MAX_STEPS 8
#define MAX_TEXT 64 // bytes of a Replace/Strip/Metaspace string: published files use one character

enum { D_REPLACE, D_BYTE_FALLBACK, D_FUSE, D_STRIP, D_METASPACE };

typedef struct step {
    int kind;
    size_t npat, nrep;
    uint8_t pat[MAX_TEXT], rep[MAX_TEXT]; // D_STRIP, D_METASPACE: the character in pat
    long start, stop;                     // D_STRIP
    bool drop_first;                      // D_METASPACE: prepend_scheme is not "never"
} step;

struct dsc__dec {
    bool join_space; // no decoder: the tokens joined with " "
    int nsteps;
    step st[MAX_STEPS];
};

// A list of token strings: token k is b[off[k] .. off[k + 1]); tokens are appended with put()
// and closed with end().
typedef struct tlist {
    uint8_t *b;
    size_t nb, capb;
    size_t *off; // n + 1 entries
    size_t n, capn;
} tlist;

// ---- internal: token lists ----

static bool put(tlist *l, const uint8_t *s, size_t n) {
    if (l->nb + n > l->capb) {
        size_t cap = l->capb ? l->capb : 4096;
        while (cap < l->nb + n) cap *= 2;
        uint8_t *b = realloc(l->b, cap + 1); // + 1: room for the final NUL
        if (!b) return false;
        l->b = b;
        l->capb = cap;
    }
    if (n) memcpy(l->b + l->nb, s, n);
    l->nb += n;
    return true;
}

static bool end(tlist *l) {
    if (l->n + 2 > l->capn) {
        size_t cap = l->capn ? 2 * l->capn : 1024;
        size_t *off = realloc(l->off, cap * sizeof *off);
        if (!off) return false;
        l->off = off;
        l->capn = cap;
    }
    l->off[++l->n] = l->nb;
    return true;
}

static void list_free(tlist *l);

static bool list_init(tlist *l) {
    *l = (tlist){.capb = 4096, .capn = 1024};
    l->b = malloc(l->capb + 1); // + 1: room for the final NUL
    l->off = malloc(l->capn * sizeof *l->off);
    if (!l->b || !l->off) {
        list_free(l);
        return false;
    }
    l->off[0] = 0;
    return true;
}

static void list_free(tlist *l) {
    free(l->b);
    free(l->off);
}

// ---- internal: the steps ----

// s[0..n) with every pat replaced by rep appended to the open token (Replace; Metaspace with
// drop: its replacement removed instead).
static bool put_replaced(tlist *o, const uint8_t *s, size_t n, const step *st, bool drop) {
    size_t from = 0;
    for (size_t i = 0; i + st->npat <= n;) {
        if (s[i] != st->pat[0] || memcmp(s + i, st->pat, st->npat)) {
            i++;
            continue;
        }
        if (!put(o, s + from, i - from) || (!drop && !put(o, st->rep, st->nrep))) return false;
        i += st->npat;
        from = i;
    }
    return put(o, s + from, n - from);
}

static int hex(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') return (c | 0x20) - 'a' + 10;
    return -1;
}

// "<0xNN>" -> NN, else -1. Two hex digits, or a '+' and one (the reference parses the two
// characters with from_str_radix, which takes a sign).
static int byte_token(const uint8_t *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int hi = s[3] == '+' ? 0 : hex(s[3]), lo = hex(s[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

static bool valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += dsc__utf8_decode(s + i, n - i, &cp);
        if (cp == DSC_UTF8_INVALID) return false;
    }
    return true;
}

// The pending bytes as one token when they are UTF-8, else one U+FFFD token per byte.
static bool flush_bytes(tlist *o, const uint8_t *bytes, size_t n) {
    if (n == 0) return true;
    if (valid_utf8(bytes, n)) return put(o, bytes, n) && end(o);
    for (size_t i = 0; i < n; i++)
        if (!put(o, (const uint8_t *)"\xef\xbf\xbd", 3) || !end(o)) return false;
    return true;
}

static bool byte_fallback(const tlist *in, tlist *o) {
    uint8_t *bytes = malloc(in->n + 1);
    if (!bytes) return false;
    size_t nb = 0;
    bool ok = true;
    for (size_t k = 0; ok && k < in->n; k++) {
        const uint8_t *s = in->b + in->off[k];
        size_t n = in->off[k + 1] - in->off[k];
        int b = byte_token(s, n);
        if (b >= 0) {
            bytes[nb++] = (uint8_t)b;
            continue;
        }
        ok = flush_bytes(o, bytes, nb) && put(o, s, n) && end(o);
        nb = 0;
    }
    ok = ok && flush_bytes(o, bytes, nb);
    free(bytes);
    return ok;
}

// Characters c at the start (up to st->start) and end (up to st->stop) of s[0..n) removed.
static bool strip(tlist *o, const uint8_t *s, size_t n, const step *st) {
    size_t a = 0, z = n, c = st->npat;
    for (long i = 0; i < st->start && a + c <= n && !memcmp(s + a, st->pat, c); i++) a += c;
    for (long i = 0; i < st->stop && z >= a + c && !memcmp(s + z - c, st->pat, c); i++) z -= c;
    return put(o, s + a, z - a) && end(o);
}

static bool apply_step(const step *st, const tlist *in, tlist *o) {
    if (st->kind == D_BYTE_FALLBACK) return byte_fallback(in, o);
    if (st->kind == D_FUSE) return put(o, in->b, in->nb) && end(o);
    for (size_t k = 0; k < in->n; k++) {
        const uint8_t *s = in->b + in->off[k];
        size_t n = in->off[k + 1] - in->off[k];
        bool ok = st->kind == D_STRIP
                      ? strip(o, s, n, st)
                      : put_replaced(o, s, n, st, st->kind == D_METASPACE && k == 0 &&
                                                      st->drop_first) && end(o);
        if (!ok) return false;
    }
    return true;
}

// ---- internal: reading the JSON ----

static dsc_status text_copy(const char *s, const char *what, uint8_t *out, size_t *n,
                            bool nonempty, const char *file) {
    size_t len = s ? strlen(s) : 0;
    if (!s || len >= MAX_TEXT || (nonempty && len == 0))
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder %s must be a string of %s1 to %d bytes",
                         file, what, nonempty ? "" : "0 or ", MAX_TEXT - 1);
    memcpy(out, s, len);
    *n = len;
    return DSC_OK;
}

static dsc_status read_replace(step *st, const json_t *o, const char *file) {
    const json_t *pat = json_object_get(o, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    if (re && strpbrk(re, "\\()[]{}|?*+.^$"))
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder Replace with the regex \"%s\" is not "
                         "supported; dsc reads Replace with a plain string (as Llama 2, Mistral "
                         "and Gemma use)", file, re);
    const char *str = re ? re : json_string_value(json_object_get(pat, "String"));
    DSC_TRY(text_copy(str, "Replace's pattern", st->pat, &st->npat, true, file));
    return text_copy(json_string_value(json_object_get(o, "content")), "Replace's content",
                     st->rep, &st->nrep, false, file);
}

static dsc_status read_strip(step *st, const json_t *o, const char *file) {
    const char *c = json_string_value(json_object_get(o, "content"));
    const json_t *a = json_object_get(o, "start"), *z = json_object_get(o, "stop");
    uint32_t cp;
    if (!c || !*c || dsc__utf8_decode((const uint8_t *)c, strlen(c), &cp) != strlen(c) ||
        !json_is_integer(a) || !json_is_integer(z) || json_integer_value(a) < 0 ||
        json_integer_value(z) < 0)
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder Strip needs \"content\" (one character) "
                         "and non-negative integers \"start\" and \"stop\"", file);
    DSC_TRY(text_copy(c, "Strip's content", st->pat, &st->npat, true, file));
    st->start = (long)json_integer_value(a);
    st->stop = (long)json_integer_value(z);
    return DSC_OK;
}

static dsc_status read_metaspace(step *st, const json_t *o, const char *file) {
    const char *r = json_string_value(json_object_get(o, "replacement"));
    const char *scheme = json_string_value(json_object_get(o, "prepend_scheme"));
    const json_t *legacy = json_object_get(o, "add_prefix_space");
    uint32_t cp;
    if (!r || !*r || dsc__utf8_decode((const uint8_t *)r, strlen(r), &cp) != strlen(r))
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder Metaspace needs \"replacement\", one "
                         "character (\"\xe2\x96\x81\")", file);
    if (scheme && strcmp(scheme, "always") && strcmp(scheme, "first") && strcmp(scheme, "never"))
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder Metaspace prepend_scheme \"%s\" is not one "
                         "of always, first, never", file, scheme);
    DSC_TRY(text_copy(r, "Metaspace's replacement", st->pat, &st->npat, true, file));
    st->rep[0] = ' ';
    st->nrep = 1;
    st->drop_first = scheme ? strcmp(scheme, "never") != 0 : !json_is_false(legacy);
    return DSC_OK;
}

static dsc_status read_step(dsc__dec *d, const json_t *o, const char *file) {
    const char *type = json_string_value(json_object_get(o, "type"));
    if (d->nsteps == MAX_STEPS)
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder has more than %d steps", file, MAX_STEPS);
    step *st = &d->st[d->nsteps];
    *st = (step){0};
    static const char *const names[] = {"Replace", "ByteFallback", "Fuse", "Strip", "Metaspace"};
    int k = 0;
    while (type && k < 5 && strcmp(type, names[k])) k++;
    if (!type || k == 5)
        return dsc__fail(DSC_ERR_CONFIG, "%s: decoder \"%s\" is not supported; dsc reads "
                         "ByteLevel (byte-level BPE), and Replace, ByteFallback, Fuse, Strip, "
                         "Metaspace and a Sequence of them (SentencePiece-style BPE)", file,
                         type ? type : "(no type)");
    st->kind = k;
    if (k == D_REPLACE) DSC_TRY(read_replace(st, o, file));
    if (k == D_STRIP) DSC_TRY(read_strip(st, o, file));
    if (k == D_METASPACE) DSC_TRY(read_metaspace(st, o, file));
    d->nsteps++;
    return DSC_OK;
}

// ---- library-internal API ----

dsc_status dsc__dec_create(dsc__dec **out, const json_t *decoder, const char *file) {
    *out = NULL;
    dsc__dec *d = calloc(1, sizeof *d);
    if (!d) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", file);
    const char *type = json_string_value(json_object_get(decoder, "type"));
    dsc_status st = DSC_OK;
    if (!decoder || json_is_null(decoder)) {
        d->join_space = true;
    } else if (type && !strcmp(type, "Sequence")) {
        size_t i;
        const json_t *o;
        json_array_foreach(json_object_get(decoder, "decoders"), i, o) {
            if ((st = read_step(d, o, file)) != DSC_OK) break;
        }
    } else {
        st = read_step(d, decoder, file);
    }
    if (st != DSC_OK) {
        free(d);
        return st;
    }
    *out = d;
    return DSC_OK;
}

void dsc__dec_destroy(dsc__dec *d) { free(d); }

bool dsc__dec_apply(const dsc__dec *d, const uint8_t *bytes, const uint32_t *off,
                    const int32_t *id, size_t n, char **text, size_t *len) {
    tlist cur, next;
    if (!list_init(&cur)) return false;
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        ok = (!d->join_space || i == 0 || put(&cur, (const uint8_t *)" ", 1)) &&
             put(&cur, bytes + off[id[i]], off[id[i] + 1] - off[id[i]]) &&
             (d->join_space || end(&cur));
    }
    if (d->join_space) ok = ok && end(&cur); // joined already: one token
    for (int k = 0; ok && k < d->nsteps; k++) {
        ok = list_init(&next);
        ok = ok && apply_step(&d->st[k], &cur, &next);
        list_free(&cur);
        cur = next;
    }
    if (!ok) {
        list_free(&cur);
        return false;
    }
    cur.b[cur.nb] = '\0'; // put() keeps a byte of room past nb
    *text = (char *)cur.b;
    *len = cur.nb;
    free(cur.off);
    return true;
}
