// data/normalize.c - tokenizer.json normalizers: NFC, Prepend, Replace and Sequences of them
// (see normalize.h).
#include "data/normalize.h"

#include <stdlib.h> // calloc, free, malloc
#include <string.h> // memcmp, memcpy, strchr, strcmp, strlen

#include "base/status.h"  // dsc__fail, DSC_TRY
#include "data/unicode.h" // dsc__nfc, dsc__nfc_quick_check

#define MAX_STEPS 8
#define MAX_TEXT 64 // bytes of a Prepend/Replace string: published files use one character

enum { N_NFC, N_PREPEND, N_REPLACE };

typedef struct step {
    int kind;
    size_t npat, nrep;
    uint8_t pat[MAX_TEXT], rep[MAX_TEXT]; // N_PREPEND: rep only
} step;

struct dsc__norm {
    int nsteps;
    step st[MAX_STEPS];
};

// ---- internal: reading the JSON ----

static dsc_status text_copy(const char *s, const char *what, uint8_t *out, size_t *n,
                            bool nonempty, const char *file) {
    size_t len = s ? strlen(s) : 0;
    if (!s || len >= MAX_TEXT || (nonempty && len == 0))
        return dsc__fail(DSC_ERR_CONFIG, "%s: normalizer %s must be a string of %s1 to %d "
                         "bytes", file, what, nonempty ? "" : "0 or ", MAX_TEXT - 1);
    memcpy(out, s, len);
    *n = len;
    return DSC_OK;
}

// A Replace pattern: {"String": P}, or {"Regex": P} when P holds no regex syntax (then it means
// the same text).
static dsc_status replace_pattern(step *st, const json_t *o, const char *file) {
    const json_t *pat = json_object_get(o, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    if (re && strpbrk(re, "\\()[]{}|?*+.^$"))
        return dsc__fail(DSC_ERR_CONFIG, "%s: normalizer Replace with the regex \"%s\" is not "
                         "supported; dsc reads Replace with a plain string (as Llama 2, "
                         "Mistral and Gemma use)", file, re);
    const char *str = re ? re : json_string_value(json_object_get(pat, "String"));
    return text_copy(str, "Replace's pattern", st->pat, &st->npat, true, file);
}

static dsc_status read_step(dsc__norm *n, const json_t *o, const char *file) {
    const char *type = json_string_value(json_object_get(o, "type"));
    if (n->nsteps == MAX_STEPS)
        return dsc__fail(DSC_ERR_CONFIG, "%s: normalizer has more than %d steps", file,
                         MAX_STEPS);
    step *st = &n->st[n->nsteps];
    *st = (step){0};
    if (type && !strcmp(type, "NFC")) {
        st->kind = N_NFC;
    } else if (type && !strcmp(type, "Prepend")) {
        st->kind = N_PREPEND;
        DSC_TRY(text_copy(json_string_value(json_object_get(o, "prepend")), "Prepend's prepend",
                          st->rep, &st->nrep, false, file));
    } else if (type && !strcmp(type, "Replace")) {
        st->kind = N_REPLACE;
        DSC_TRY(replace_pattern(st, o, file));
        DSC_TRY(text_copy(json_string_value(json_object_get(o, "content")), "Replace's content",
                          st->rep, &st->nrep, false, file));
    } else {
        return dsc__fail(DSC_ERR_CONFIG, "%s: normalizer \"%s\" is not supported; dsc reads "
                         "none, NFC, Prepend, Replace (a plain string) and a Sequence of them",
                         file, type ? type : "(no type)");
    }
    n->nsteps++;
    return DSC_OK;
}

// ---- internal: applying ----

uint8_t *dsc__replace(const uint8_t *s, size_t len, const uint8_t *pat, size_t np,
                      const uint8_t *rep, size_t nr, size_t *olen) {
    size_t count = 0;
    for (size_t i = 0; i + np <= len;) {
        if (!memcmp(s + i, pat, np)) {
            count++;
            i += np;
        } else {
            i++;
        }
    }
    uint8_t *out = malloc(len + count * nr + 1); // shrinks when nr < np: len is enough then
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        if (i + np <= len && !memcmp(s + i, pat, np)) {
            memcpy(out + o, rep, nr);
            o += nr;
            i += np;
        } else {
            out[o++] = s[i++];
        }
    }
    *olen = o;
    return out;
}

static uint8_t *apply_step(const step *st, const uint8_t *s, size_t len, size_t *olen) {
    if (st->kind == N_REPLACE) return dsc__replace(s, len, st->pat, st->npat, st->rep, st->nrep,
                                                   olen);
    if (st->kind == N_PREPEND) {
        uint8_t *out = malloc(len + st->nrep + 1);
        if (!out) return NULL;
        memcpy(out, st->rep, st->nrep);
        memcpy(out + st->nrep, s, len);
        *olen = len + st->nrep;
        return out;
    }
    uint8_t *out;
    return dsc__nfc(s, len, &out, olen) ? out : NULL;
}

// Whether the step leaves s as it is (no copy needed).
static bool unchanged(const step *st, const uint8_t *s, size_t len) {
    if (st->kind == N_NFC) return dsc__nfc_quick_check(s, len);
    if (st->kind == N_PREPEND) return len == 0 || st->nrep == 0;
    for (size_t i = 0; i + st->npat <= len; i++)
        if (s[i] == st->pat[0] && !memcmp(s + i, st->pat, st->npat)) return false;
    return true;
}

// ---- library-internal API ----

dsc_status dsc__norm_create(dsc__norm **out, const json_t *normalizer, const char *file) {
    *out = NULL;
    dsc__norm *n = calloc(1, sizeof *n);
    if (!n) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", file);
    const char *type = json_string_value(json_object_get(normalizer, "type"));
    dsc_status st = DSC_OK;
    if (!normalizer || json_is_null(normalizer)) {
        // identity
    } else if (type && !strcmp(type, "Sequence")) {
        size_t i;
        const json_t *o;
        json_array_foreach(json_object_get(normalizer, "normalizers"), i, o) {
            if ((st = read_step(n, o, file)) != DSC_OK) break;
        }
    } else {
        st = read_step(n, normalizer, file);
    }
    if (st != DSC_OK) {
        free(n);
        return st;
    }
    *out = n;
    return DSC_OK;
}

void dsc__norm_destroy(dsc__norm *n) { free(n); }

bool dsc__norm_identity(const dsc__norm *n) { return n->nsteps == 0; }

bool dsc__norm_apply(const dsc__norm *n, const uint8_t *s, size_t len, uint8_t **out,
                     size_t *olen) {
    const uint8_t *cur = s;
    uint8_t *owned = NULL;
    for (int k = 0; k < n->nsteps; k++) {
        if (unchanged(&n->st[k], cur, len)) continue;
        size_t m;
        uint8_t *next = apply_step(&n->st[k], cur, len, &m);
        free(owned);
        if (!next) return false;
        owned = next;
        cur = next;
        len = m;
    }
    *out = (uint8_t *)cur;
    *olen = len;
    return true;
}
