// data/pack.c - tokenizing examples into a stream or packed rows (see pack.h).
#include "data/pack.h"

#include <stdlib.h> // free, realloc
#include <string.h> // memcpy, memset

#include "base/status.h" // dsc__fail, DSC_TRY
#include "data/shard.h"  // DSC_TOK_*

// ---- internal ----

static dsc_status reserve(dsc_packed *p, int64_t more) {
    if (p->n + more <= p->cap) return DSC_OK;
    int64_t cap = p->cap ? p->cap : 1 << 14;
    while (cap < p->n + more) cap *= 2;
    int32_t *t = realloc(p->tok, (size_t)cap * sizeof *t);
    if (t) p->tok = t;
    uint8_t *f = t ? realloc(p->flags, (size_t)cap) : NULL;
    if (f) p->flags = f;
    if (!t || !f) return dsc__fail(DSC_ERR_OOM, "data: out of memory for %lld tokens",
                                   (long long)cap);
    p->cap = cap;
    return DSC_OK;
}

static dsc_status append(dsc_packed *p, const int32_t *tok, const uint8_t *fl, int64_t n) {
    DSC_TRY(reserve(p, n));
    memcpy(p->tok + p->n, tok, (size_t)n * sizeof *tok);
    memcpy(p->flags + p->n, fl, (size_t)n);
    for (int64_t i = 0; i < n; i++) p->targets += (fl[i] & DSC_TOK_TARGET) != 0;
    p->n += n;
    return DSC_OK;
}

// One example's tokens and flags (with its separator) into e (reset first).
static dsc_status tokenize(const dsc_tokenizer *tk, const dsc_example *ex, dsc_packed *e) {
    e->n = 0;
    e->targets = 0;
    for (int s = 0; s < ex->nseg; s++) {
        int32_t *ids;
        size_t n;
        DSC_TRY(dsc_tokenizer_encode(tk, ex->seg[s].text, ex->seg[s].len, &ids, &n));
        dsc_status st = reserve(e, (int64_t)n);
        if (st == DSC_OK && n) {
            memcpy(e->tok + e->n, ids, n * sizeof *ids);
            memset(e->flags + e->n, ex->seg[s].train ? DSC_TOK_TARGET : 0, n);
            e->n += (int64_t)n;
        }
        free(ids);
        DSC_TRY(st);
    }
    int32_t eot = dsc_tokenizer_eot(tk);
    if (eot >= 0) {
        DSC_TRY(reserve(e, 1));
        e->tok[e->n] = eot;
        e->flags[e->n++] = ex->nseg && ex->seg[ex->nseg - 1].train ? DSC_TOK_TARGET : 0;
    }
    if (e->n) e->flags[0] |= DSC_TOK_DOC;
    return DSC_OK;
}

static dsc_status pad(dsc_packed *p, int32_t id, int64_t n) {
    DSC_TRY(reserve(p, n));
    for (int64_t i = 0; i < n; i++) {
        p->tok[p->n + i] = id;
        p->flags[p->n + i] = 0;
    }
    p->n += n;
    p->padding += n;
    return DSC_OK;
}

// Place e at the end of p's rows of `row` tokens (see pack.h).
static dsc_status place(dsc_packed *p, const dsc_packed *e, int row, int32_t pad_id) {
    int64_t left = row - p->n % row; // room in the current row (row when it is full or empty)
    if (e->n <= left) return append(p, e->tok, e->flags, e->n);
    if (e->n <= row) {
        DSC_TRY(pad(p, pad_id, left));
        return append(p, e->tok, e->flags, e->n);
    }
    p->split_examples++;
    return append(p, e->tok, e->flags, e->n);
}

// ---- public API ----

dsc_status dsc_pack_examples(const dsc_tokenizer *tk, const dsc_examples *ex, int row,
                             dsc_packed *out) {
    if (row < 0) return dsc__fail(DSC_ERR_INVALID_ARG, "data: row length %d < 0", row);
    int32_t eot = dsc_tokenizer_eot(tk), pad_id = eot >= 0 ? eot : 0;
    dsc_packed e = {0};
    dsc_status st = DSC_OK;
    for (int64_t i = 0; i < ex->n && st == DSC_OK; i++) {
        st = tokenize(tk, &ex->v[i], &e);
        if (st == DSC_OK && e.n) st = row ? place(out, &e, row, pad_id)
                                          : append(out, e.tok, e.flags, e.n);
    }
    if (st == DSC_OK && row && out->n % row) st = pad(out, pad_id, row - out->n % row);
    dsc_packed_free(&e);
    return st;
}

void dsc_packed_free(dsc_packed *p) {
    free(p->tok);
    free(p->flags);
    *p = (dsc_packed){0};
}
