// data/jinja_lib.c - the Jinja subset's filters, tests, string and dict methods and global
// functions, each as jinja2 3.1 and Python 3 define it (Hugging Face's tojson: json.dumps with
// ensure_ascii=False). Case changes (upper, lower, title, capitalize) take ASCII text only: other
// text is refused rather than cased differently from Python.
#include "data/jinja_impl.h"

#include <ctype.h>  // isspace, tolower, toupper
#include <stdio.h>  // snprintf
#include <stdlib.h> // free, strtod, strtoll
#include <string.h> // memcmp, memcpy, strcmp, strlen
#include <time.h>   // localtime_r, strftime, time

#include "base/status.h" // DSC_TRY

// ---- arguments ----

typedef struct spec {
    const char *name;
    const char *params[4]; // parameter names in order (NULL-terminated)
    int required;          // how many of them must be given
} spec;

// a's arguments bound to s's parameters: p[i] undefined when not given.
static dsc_status bind(jrender *r, int line, const char *kind, const spec *s, const jargs *a,
                       jv *p) {
    int np = 0;
    while (np < 4 && s->params[np]) np++;
    for (int i = 0; i < np; i++) p[i] = dsc__jv_undef;
    if (a->npos > np)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "%s %s takes at most %d arguments",
                               kind, s->name, np);
    for (int i = 0; i < a->npos; i++) p[i] = a->v[i];
    for (int i = a->npos; i < a->n; i++) {
        int k = 0;
        while (k < np && strcmp(s->params[k], a->kw[i])) k++;
        if (k == np)
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "%s %s has no argument %s=",
                                   kind, s->name, a->kw[i]);
        p[k] = a->v[i];
    }
    for (int i = 0; i < s->required; i++)
        if (p[i].kind == JV_UNDEF)
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "%s %s needs its argument %s",
                                   kind, s->name, s->params[i]);
    return DSC_OK;
}

static dsc_status oom(jrender *r, int line) {
    return dsc__jinja_fail(r, line, DSC_ERR_OOM, "out of memory");
}

static dsc_status mkstr(jrender *r, int line, const char *s, size_t n, jv *out) {
    *out = dsc__jv_str(dsc__jinja_arena(r), s, n);
    return out->kind == JV_STR ? DSC_OK : oom(r, line);
}

static dsc_status from_buf(jrender *r, int line, jbuf *b, jv *out) {
    dsc_status st = b->oom ? oom(r, line) : mkstr(r, line, b->s ? b->s : "", b->n, out);
    free(b->s);
    return st;
}

static dsc_status need(jrender *r, int line, const char *what, jv x, jkind k) {
    if (x.kind == k) return DSC_OK;
    if (x.kind == JV_UNDEF && x.u.name)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "'%s' is undefined", x.u.name);
    return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "%s needs a %s, not a %s", what,
                           k == JV_STR ? "string" : k == JV_LIST ? "list" : "dict",
                           dsc__jv_type(x));
}

// ---- strings ----

static dsc_status ascii_only(jrender *r, int line, const char *what, jv x) {
    for (size_t i = 0; i < x.u.s->n; i++)
        if ((unsigned char)x.u.s->c[i] >= 0x80)
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "%s of non-ASCII text is not "
                                   "supported", what);
    return DSC_OK;
}

// mode: 'u' upper, 'l' lower, 'c' capitalize, 't' str.title, 'T' jinja2's title filter.
static dsc_status recase(jrender *r, int line, const char *what, jv x, char mode, jv *out) {
    DSC_TRY(need(r, line, what, x, JV_STR));
    DSC_TRY(ascii_only(r, line, what, x));
    DSC_TRY(mkstr(r, line, x.u.s->c, x.u.s->n, out));
    char *c = out->u.s->c;
    for (size_t i = 0; i < out->u.s->n; i++) {
        bool first = mode == 'c' ? i == 0
                     : mode == 't' ? i == 0 || !isalpha((unsigned char)c[i - 1])
                     : mode == 'T' ? i == 0 || strchr("-({[< \t\n\r\f\v", c[i - 1]) != NULL
                                   : mode == 'u';
        c[i] = (char)(first ? toupper((unsigned char)c[i]) : tolower((unsigned char)c[i]));
    }
    return DSC_OK;
}

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    for (size_t k = 0; k + nn <= hn; k++)
        if (!memcmp(h + k, nd, nn)) return h + k;
    return NULL;
}

// Python's strip: white space, or any of the code points of chars; *len: the bytes to drop.
static bool strip_at(const char *s, size_t n, jv chars, bool back, size_t *len) {
    if (chars.kind != JV_STR) {
        *len = back ? dsc__ws_suffix(s, n) : dsc__ws_prefix(s, n);
        return *len > 0;
    }
    size_t at = back ? n - 1 : 0; // the first or last code point: [at, at + cl)
    while (back && at > 0 && n - at < 4 && ((unsigned char)s[at] & 0xC0) == 0x80) at--;
    size_t cl = back ? n - at : dsc__utf8_offset(s, n, 1);
    // UTF-8 synchronises itself: a whole code point found in chars is one of chars' code points
    *len = cl;
    return find_sub(chars.u.s->c, chars.u.s->n, s + at, cl) != NULL;
}

static dsc_status strip(jrender *r, int line, jv x, jv chars, bool left, bool right, jv *out) {
    DSC_TRY(need(r, line, "strip", x, JV_STR));
    const char *s = x.u.s->c;
    size_t n = x.u.s->n, len;
    if (chars.kind == JV_NONE) chars = dsc__jv_undef;
    while (left && n && strip_at(s, n, chars, false, &len)) s += len, n -= len;
    while (right && n && strip_at(s, n, chars, true, &len)) n -= len;
    return mkstr(r, line, s, n, out);
}

static dsc_status replace(jrender *r, int line, jv x, jv old, jv new, jv count, jv *out) {
    DSC_TRY(need(r, line, "replace", x, JV_STR));
    DSC_TRY(need(r, line, "replace", old, JV_STR));
    DSC_TRY(need(r, line, "replace", new, JV_STR));
    if (old.u.s->n == 0)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "replace of an empty string is not "
                               "supported");
    int64_t left = count.kind == JV_INT && count.u.i >= 0 ? count.u.i : INT64_MAX;
    jbuf b = {0};
    const char *s = x.u.s->c, *end = s + x.u.s->n, *hit;
    while (left-- > 0 && (hit = find_sub(s, (size_t)(end - s), old.u.s->c, old.u.s->n))) {
        dsc__jbuf_add(&b, s, (size_t)(hit - s));
        dsc__jbuf_add(&b, new.u.s->c, new.u.s->n);
        s = hit + old.u.s->n;
    }
    dsc__jbuf_add(&b, s, (size_t)(end - s));
    return from_buf(r, line, &b, out);
}

static dsc_status push_str(jrender *r, int line, jv *list, int *n, const char *s, size_t len) {
    if (*n == list->u.l->n) {
        jv bigger = dsc__jv_list(dsc__jinja_arena(r), 2 * *n + 4);
        if (bigger.kind != JV_LIST) return oom(r, line);
        for (int k = 0; k < *n; k++) bigger.u.l->v[k] = list->u.l->v[k];
        *list = bigger;
    }
    return mkstr(r, line, s, len, &list->u.l->v[(*n)++]);
}

// Python's str.split(sep=None, maxsplit=-1).
static dsc_status split(jrender *r, int line, jv x, jv sep, jv maxsplit, jv *out) {
    DSC_TRY(need(r, line, "split", x, JV_STR));
    int64_t left = maxsplit.kind == JV_INT && maxsplit.u.i >= 0 ? maxsplit.u.i : INT64_MAX;
    const char *s = x.u.s->c, *end = s + x.u.s->n;
    int n = 0;
    *out = dsc__jv_list(dsc__jinja_arena(r), 0);
    if (out->kind != JV_LIST) return oom(r, line);
    if (sep.kind == JV_STR && sep.u.s->n == 0)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "split: empty separator");
    if (sep.kind == JV_STR) {
        const char *hit;
        while (left-- > 0 && (hit = find_sub(s, (size_t)(end - s), sep.u.s->c, sep.u.s->n))) {
            DSC_TRY(push_str(r, line, out, &n, s, (size_t)(hit - s)));
            s = hit + sep.u.s->n;
        }
        DSC_TRY(push_str(r, line, out, &n, s, (size_t)(end - s)));
    } else {
        for (;;) {
            s += dsc__ws_prefix(s, (size_t)(end - s));
            if (s == end) break;
            if (left-- <= 0) {
                DSC_TRY(push_str(r, line, out, &n, s, (size_t)(end - s)));
                break;
            }
            const char *w = s;
            while (w < end && !dsc__ws_prefix(w, (size_t)(end - w))) w++;
            DSC_TRY(push_str(r, line, out, &n, s, (size_t)(w - s)));
            s = w;
        }
    }
    out->u.l->n = n;
    return DSC_OK;
}

// startswith / endswith of a string or any of a tuple's.
static dsc_status affix(jrender *r, int line, jv x, jv what, bool end, jv *out) {
    DSC_TRY(need(r, line, end ? "endswith" : "startswith", x, JV_STR));
    int n = what.kind == JV_LIST ? what.u.l->n : 1;
    bool hit = false;
    for (int k = 0; k < n && !hit; k++) {
        jv w = what.kind == JV_LIST ? what.u.l->v[k] : what;
        DSC_TRY(need(r, line, end ? "endswith" : "startswith", w, JV_STR));
        size_t wn = w.u.s->n, xn = x.u.s->n;
        hit = wn <= xn && !memcmp(x.u.s->c + (end ? xn - wn : 0), w.u.s->c, wn);
    }
    *out = dsc__jv_bool(hit);
    return DSC_OK;
}

static dsc_status join(jrender *r, int line, jv items, jv sep, jv attr, bool strict, jv *out) {
    if (items.kind == JV_UNDEF && !items.u.name) items = dsc__jv_list(dsc__jinja_arena(r), 0);
    DSC_TRY(need(r, line, "join", items, JV_LIST));
    jbuf b = {0};
    for (int k = 0; k < items.u.l->n; k++) {
        jv v = items.u.l->v[k];
        if (attr.kind == JV_STR) DSC_TRY(dsc__jinja_getattr(r, line, v, attr.u.s->c, &v));
        if (strict && v.kind != JV_STR) {
            free(b.s);
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "join: item %d is a %s, not a "
                                   "string", k, dsc__jv_type(v));
        }
        if (k && sep.kind == JV_STR) dsc__jbuf_add(&b, sep.u.s->c, sep.u.s->n);
        dsc__jv_to_str(&b, v);
    }
    return from_buf(r, line, &b, out);
}

// ---- collections ----

static dsc_status pairs(jrender *r, int line, jv d, int what, jv *out) {
    if (d.kind == JV_UNDEF && what == 2) return *out = dsc__jv_list(dsc__jinja_arena(r), 0), DSC_OK;
    DSC_TRY(need(r, line, "items", d, JV_DICT));
    jarena *a = dsc__jinja_arena(r);
    *out = dsc__jv_list(a, d.u.d->n);
    for (int k = 0; out->kind == JV_LIST && k < d.u.d->n; k++) {
        jv key = {.kind = JV_STR, .u.s = d.u.d->k[k]}, pair = dsc__jv_list(a, 2);
        if (pair.kind != JV_LIST) return oom(r, line);
        pair.u.l->v[0] = key, pair.u.l->v[1] = d.u.d->v[k];
        pair.u.l->tuple = true;
        out->u.l->v[k] = what == 0 ? key : what == 1 ? d.u.d->v[k] : pair;
    }
    return out->kind == JV_LIST ? DSC_OK : oom(r, line);
}

static dsc_status to_list(jrender *r, int line, jv x, jv *out) {
    jarena *a = dsc__jinja_arena(r);
    if (x.kind == JV_LIST) return *out = x, DSC_OK;
    if (x.kind == JV_UNDEF) return *out = dsc__jv_list(a, 0), DSC_OK;
    if (x.kind == JV_DICT) return pairs(r, line, x, 0, out);
    DSC_TRY(need(r, line, "list", x, JV_STR));
    size_t n = dsc__utf8_count(x.u.s->c, x.u.s->n);
    *out = dsc__jv_list(a, (int)n);
    if (out->kind != JV_LIST) return oom(r, line);
    for (size_t k = 0; k < n; k++) {
        size_t from = dsc__utf8_offset(x.u.s->c, x.u.s->n, k);
        size_t to = dsc__utf8_offset(x.u.s->c, x.u.s->n, k + 1);
        DSC_TRY(mkstr(r, line, x.u.s->c + from, to - from, &out->u.l->v[k]));
    }
    return DSC_OK;
}

static dsc_status length(jrender *r, int line, jv x, jv *out) {
    if (x.kind == JV_STR) *out = dsc__jv_int((int64_t)dsc__utf8_count(x.u.s->c, x.u.s->n));
    else if (x.kind == JV_LIST) *out = dsc__jv_int(x.u.l->n);
    else if (x.kind == JV_DICT || x.kind == JV_NS) *out = dsc__jv_int(x.u.d->n);
    else if (x.kind == JV_UNDEF) *out = dsc__jv_int(0);
    else return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "a %s has no length",
                                dsc__jv_type(x));
    return DSC_OK;
}

static dsc_status reverse(jrender *r, int line, jv x, jv *out) {
    jv items;
    DSC_TRY(to_list(r, line, x, &items));
    jv rev = dsc__jv_list(dsc__jinja_arena(r), items.u.l->n);
    if (rev.kind != JV_LIST) return oom(r, line);
    for (int k = 0; k < items.u.l->n; k++) rev.u.l->v[k] = items.u.l->v[items.u.l->n - 1 - k];
    if (x.kind != JV_STR) return *out = rev, DSC_OK;
    return join(r, line, rev, dsc__jv_undef, dsc__jv_undef, false, out);
}

// An attribute path "a.b" of an item, as jinja2's attribute getters read it.
static dsc_status attr_path(jrender *r, int line, jv item, jv path, jv *out) {
    DSC_TRY(need(r, line, "attribute", path, JV_STR));
    const char *s = path.u.s->c;
    *out = item;
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strlen(s);
        jv part;
        DSC_TRY(mkstr(r, line, s, n, &part));
        DSC_TRY(dsc__jinja_getattr(r, line, *out, part.u.s->c, out));
        if (!dot) return DSC_OK;
        s = dot + 1;
    }
}

// select / reject / selectattr / rejectattr: p[0] test name (or attribute, p[1] test), rest args.
static dsc_status select_items(jrender *r, int line, jv x, const jargs *a, bool attr, bool keep,
                         jv *out) {
    jv items;
    DSC_TRY(to_list(r, line, x, &items));
    int first = attr ? 1 : 0;
    if (attr && a->npos < 1)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "selectattr needs an attribute");
    jv test = a->npos > first ? a->v[first] : dsc__jv_undef;
    if (test.kind != JV_UNDEF) DSC_TRY(need(r, line, "select's test", test, JV_STR));
    if (test.kind == JV_STR && !dsc__jinja_has_test(test.u.s->c))
        return dsc__jinja_fail(r, line, DSC_ERR_CONFIG, "the test '%s' is not supported",
                               test.u.s->c);
    jargs rest = {a->v + first + 1, a->kw + first + 1, 0, 0};
    if (a->npos > first + 1) rest.n = rest.npos = a->npos - first - 1;
    *out = dsc__jv_list(dsc__jinja_arena(r), items.u.l->n);
    if (out->kind != JV_LIST) return oom(r, line);
    int n = 0;
    for (int k = 0; k < items.u.l->n; k++) {
        jv v = items.u.l->v[k];
        bool t;
        if (attr) DSC_TRY(attr_path(r, line, v, a->v[0], &v));
        if (test.kind == JV_STR) DSC_TRY(dsc__jinja_test(r, line, test.u.s->c, v, &rest, &t));
        else t = dsc__jv_truthy(v);
        if (t == keep) out->u.l->v[n++] = items.u.l->v[k];
    }
    out->u.l->n = n;
    return DSC_OK;
}

static dsc_status map(jrender *r, int line, jv x, const jargs *a, jv *out) {
    jv items, attr = dsc__jv_undef, dflt = dsc__jv_undef;
    DSC_TRY(to_list(r, line, x, &items));
    for (int i = a->npos; i < a->n; i++) {
        if (!strcmp(a->kw[i], "attribute")) attr = a->v[i];
        else if (!strcmp(a->kw[i], "default")) dflt = a->v[i];
        else return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "map has no argument %s=",
                                    a->kw[i]);
    }
    if (attr.kind == JV_UNDEF && (a->npos < 1 || a->v[0].kind != JV_STR))
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "map needs a filter name or "
                               "attribute=");
    if (attr.kind == JV_UNDEF && !dsc__jinja_has_filter(a->v[0].u.s->c))
        return dsc__jinja_fail(r, line, DSC_ERR_CONFIG, "the filter '%s' is not supported",
                               a->v[0].u.s->c);
    int nrest = a->npos > 1 ? a->npos - 1 : 0;
    jargs rest = {a->v + 1, a->kw + 1, nrest, nrest};
    *out = dsc__jv_list(dsc__jinja_arena(r), items.u.l->n);
    if (out->kind != JV_LIST) return oom(r, line);
    for (int k = 0; k < items.u.l->n; k++) {
        jv *v = &out->u.l->v[k];
        if (attr.kind != JV_UNDEF) {
            DSC_TRY(attr_path(r, line, items.u.l->v[k], attr, v));
            if (v->kind == JV_UNDEF && dflt.kind != JV_UNDEF) *v = dflt;
        } else {
            DSC_TRY(dsc__jinja_filter(r, line, a->v[0].u.s->c, items.u.l->v[k], &rest, v));
        }
    }
    return DSC_OK;
}

// ---- numbers ----

static dsc_status to_int(jrender *r, int line, jv x, jv dflt, jv *out) {
    (void)r, (void)line;
    *out = dflt.kind == JV_UNDEF ? dsc__jv_int(0) : dflt;
    if (x.kind == JV_INT) *out = x;
    else if (x.kind == JV_BOOL) *out = dsc__jv_int(x.u.b);
    else if (x.kind == JV_FLOAT) *out = dsc__jv_int((int64_t)x.u.f);
    else if (x.kind == JV_STR) {
        char *end;
        long long i = strtoll(x.u.s->c, &end, 10);
        if (end != x.u.s->c && dsc__ws_prefix(end, strlen(end)) == strlen(end))
            *out = dsc__jv_int(i);
        else {
            double f = strtod(x.u.s->c, &end);
            if (end != x.u.s->c && dsc__ws_prefix(end, strlen(end)) == strlen(end))
                *out = dsc__jv_int((int64_t)f);
        }
    }
    return DSC_OK;
}

static dsc_status to_float(jrender *r, int line, jv x, jv dflt, jv *out) {
    (void)r, (void)line;
    *out = dflt.kind == JV_UNDEF ? dsc__jv_float(0) : dflt;
    if (x.kind == JV_INT || x.kind == JV_BOOL)
        *out = dsc__jv_float(x.kind == JV_INT ? (double)x.u.i : x.u.b);
    else if (x.kind == JV_FLOAT) *out = x;
    else if (x.kind == JV_STR) {
        char *end;
        double f = strtod(x.u.s->c, &end);
        if (end != x.u.s->c && dsc__ws_prefix(end, strlen(end)) == strlen(end))
            *out = dsc__jv_float(f);
    }
    return DSC_OK;
}

// ---- filters ----

static const spec filters[] = {
    {"trim", {"chars"}, 0},          {"tojson", {"indent"}, 0},
    {"length", {NULL}, 0},           {"count", {NULL}, 0},
    {"upper", {NULL}, 0},            {"lower", {NULL}, 0},
    {"capitalize", {NULL}, 0},       {"title", {NULL}, 0},
    {"join", {"d", "attribute"}, 0}, {"default", {"default_value", "boolean"}, 0},
    {"d", {"default_value", "boolean"}, 0}, {"first", {NULL}, 0},
    {"last", {NULL}, 0},             {"replace", {"old", "new", "count"}, 2},
    {"items", {NULL}, 0},            {"list", {NULL}, 0},
    {"string", {NULL}, 0},           {"int", {"default"}, 0},
    {"float", {"default"}, 0},       {"abs", {NULL}, 0},
    {"reverse", {NULL}, 0},          {"safe", {NULL}, 0},
    {"selectattr", {NULL}, 0},       {"rejectattr", {NULL}, 0},
    {"select", {NULL}, 0},           {"reject", {NULL}, 0},
    {"map", {NULL}, 0},
};

bool dsc__jinja_has_filter(const char *name) {
    for (size_t k = 0; k < sizeof filters / sizeof filters[0]; k++)
        if (!strcmp(filters[k].name, name)) return true;
    return false;
}

static dsc_status tojson(jrender *r, int line, jv x, jv indent, jv *out) {
    jbuf b = {0};
    const char *bad = NULL;
    int ind = indent.kind == JV_INT ? (int)indent.u.i : -1;
    if (!dsc__jv_to_json(&b, x, ind, 0, &bad)) {
        free(b.s);
        if (x.kind == JV_UNDEF && x.u.name)
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "'%s' is undefined", x.u.name);
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "tojson: a %s has no JSON form",
                               bad);
    }
    return from_buf(r, line, &b, out);
}

static dsc_status edge(jrender *r, int line, jv x, bool last, jv *out) {
    jv items;
    DSC_TRY(to_list(r, line, x, &items));
    *out = items.u.l->n ? items.u.l->v[last ? items.u.l->n - 1 : 0] : dsc__jv_undef;
    return DSC_OK;
}

// Filters whose arguments are free-form (a test or filter name and its arguments).
static bool free_form(const char *name, jrender *r, int line, jv x, const jargs *a, jv *out,
                      dsc_status *st) {
    if (!strcmp(name, "selectattr") || !strcmp(name, "rejectattr"))
        *st = select_items(r, line, x, a, true, name[0] == 's', out);
    else if (!strcmp(name, "select") || !strcmp(name, "reject"))
        *st = select_items(r, line, x, a, false, name[2] == 'l', out);
    else if (!strcmp(name, "map"))
        *st = map(r, line, x, a, out);
    else
        return false;
    return true;
}

dsc_status dsc__jinja_filter(jrender *r, int line, const char *name, jv x, const jargs *a,
                             jv *out) {
    dsc_status st;
    if (free_form(name, r, line, x, a, out, &st)) return st;
    const spec *s = NULL;
    for (size_t k = 0; k < sizeof filters / sizeof filters[0]; k++)
        if (!strcmp(filters[k].name, name)) s = &filters[k];
    if (!s)
        return dsc__jinja_fail(r, line, DSC_ERR_CONFIG, "the filter '%s' is not supported", name);
    jv p[4];
    DSC_TRY(bind(r, line, "filter", s, a, p));
    if (!strcmp(name, "trim")) return strip(r, line, x, p[0], true, true, out);
    if (!strcmp(name, "tojson")) return tojson(r, line, x, p[0], out);
    if (!strcmp(name, "length") || !strcmp(name, "count")) return length(r, line, x, out);
    if (!strcmp(name, "upper")) return recase(r, line, "upper", x, 'u', out);
    if (!strcmp(name, "lower")) return recase(r, line, "lower", x, 'l', out);
    if (!strcmp(name, "capitalize")) return recase(r, line, "capitalize", x, 'c', out);
    if (!strcmp(name, "title")) return recase(r, line, "title", x, 'T', out);
    if (!strcmp(name, "join")) return join(r, line, x, p[0], p[1], false, out);
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        bool use = x.kind == JV_UNDEF || (dsc__jv_truthy(p[1]) && !dsc__jv_truthy(x));
        if (!use) return *out = x, DSC_OK;
        if (p[0].kind == JV_UNDEF) return mkstr(r, line, "", 0, out);
        return *out = p[0], DSC_OK;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last"))
        return edge(r, line, x, name[0] == 'l', out);
    if (!strcmp(name, "replace")) return replace(r, line, x, p[0], p[1], p[2], out);
    if (!strcmp(name, "items")) return pairs(r, line, x, 2, out);
    if (!strcmp(name, "list")) return to_list(r, line, x, out);
    if (!strcmp(name, "string")) {
        jbuf b = {0};
        dsc__jv_to_str(&b, x);
        return from_buf(r, line, &b, out);
    }
    if (!strcmp(name, "int")) return to_int(r, line, x, p[0], out);
    if (!strcmp(name, "float")) return to_float(r, line, x, p[0], out);
    if (!strcmp(name, "abs")) {
        if (x.kind == JV_INT) return *out = dsc__jv_int(x.u.i < 0 ? -x.u.i : x.u.i), DSC_OK;
        if (x.kind == JV_FLOAT) return *out = dsc__jv_float(x.u.f < 0 ? -x.u.f : x.u.f), DSC_OK;
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "abs of a %s", dsc__jv_type(x));
    }
    if (!strcmp(name, "reverse")) return reverse(r, line, x, out);
    *out = x; // safe
    return DSC_OK;
}

// ---- tests ----

static const spec tests[] = {
    {"defined", {NULL}, 0},  {"undefined", {NULL}, 0}, {"none", {NULL}, 0},
    {"boolean", {NULL}, 0},  {"true", {NULL}, 0},      {"false", {NULL}, 0},
    {"integer", {NULL}, 0},  {"float", {NULL}, 0},     {"number", {NULL}, 0},
    {"string", {NULL}, 0},   {"mapping", {NULL}, 0},   {"iterable", {NULL}, 0},
    {"sequence", {NULL}, 0}, {"callable", {NULL}, 0},  {"odd", {NULL}, 0},
    {"even", {NULL}, 0},     {"lower", {NULL}, 0},     {"upper", {NULL}, 0},
    {"eq", {"b"}, 1},        {"equalto", {"b"}, 1},    {"==", {"b"}, 1},
    {"ne", {"b"}, 1},        {"!=", {"b"}, 1},         {"lt", {"b"}, 1},
    {"lessthan", {"b"}, 1},  {"<", {"b"}, 1},          {"le", {"b"}, 1},
    {"<=", {"b"}, 1},        {"gt", {"b"}, 1},         {"greaterthan", {"b"}, 1},
    {">", {"b"}, 1},         {"ge", {"b"}, 1},         {">=", {"b"}, 1},
    {"in", {"seq"}, 1},      {"divisibleby", {"num"}, 1}, {"sameas", {"other"}, 1},
};

bool dsc__jinja_has_test(const char *name) {
    for (size_t k = 0; k < sizeof tests / sizeof tests[0]; k++)
        if (!strcmp(tests[k].name, name)) return true;
    return false;
}

static bool kind_test(const char *name, jv x, bool *out) {
    static const struct {
        const char *name;
        unsigned kinds; // bit per jkind
    } t[] = {{"undefined", 1u << JV_UNDEF}, {"none", 1u << JV_NONE}, {"boolean", 1u << JV_BOOL},
             {"integer", 1u << JV_INT}, {"float", 1u << JV_FLOAT},
             {"number", 1u << JV_BOOL | 1u << JV_INT | 1u << JV_FLOAT}, {"string", 1u << JV_STR},
             {"mapping", 1u << JV_DICT},
             {"iterable", 1u << JV_UNDEF | 1u << JV_STR | 1u << JV_LIST | 1u << JV_DICT},
             {"sequence", 1u << JV_STR | 1u << JV_LIST | 1u << JV_DICT},
             {"callable", 1u << JV_MACRO | 1u << JV_FUNC | 1u << JV_METHOD}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
        if (!strcmp(t[k].name, name)) {
            *out = (t[k].kinds >> x.kind) & 1;
            return true;
        }
    if (!strcmp(name, "defined")) *out = x.kind != JV_UNDEF;
    else if (!strcmp(name, "true") || !strcmp(name, "false"))
        *out = x.kind == JV_BOOL && x.u.b == (name[0] == 't');
    else return false;
    return true;
}

static dsc_status compare_test(jrender *r, int line, const char *name, jv x, jv b, bool *out) {
    static const struct {
        const char *name, *op;
    } ops[] = {{"eq", "=="}, {"equalto", "=="}, {"==", "=="}, {"ne", "!="}, {"!=", "!="},
               {"lt", "<"}, {"lessthan", "<"}, {"<", "<"}, {"le", "<="}, {"<=", "<="},
               {"gt", ">"}, {"greaterthan", ">"}, {">", ">"}, {"ge", ">="}, {">=", ">="},
               {"in", "in"}};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        if (strcmp(ops[k].name, name)) continue;
        jv v;
        DSC_TRY(dsc__jinja_binop(r, line, ops[k].op, x, b, &v));
        *out = dsc__jv_truthy(v);
        return DSC_OK;
    }
    return DSC_ERR_INTERNAL;
}

dsc_status dsc__jinja_test(jrender *r, int line, const char *name, jv x, const jargs *a,
                           bool *out) {
    const spec *s = NULL;
    for (size_t k = 0; k < sizeof tests / sizeof tests[0]; k++)
        if (!strcmp(tests[k].name, name)) s = &tests[k];
    if (!s) return dsc__jinja_fail(r, line, DSC_ERR_CONFIG, "the test '%s' is not supported", name);
    jv p[4];
    DSC_TRY(bind(r, line, "test", s, a, p));
    if (kind_test(name, x, out)) return DSC_OK;
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        int64_t m = !strcmp(name, "divisibleby") ? (p[0].kind == JV_INT ? p[0].u.i : 0) : 2;
        if (x.kind != JV_INT || m == 0)
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "test %s needs integers", name);
        *out = (x.u.i % m == 0) == (name[0] != 'o');
        return DSC_OK;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        DSC_TRY(need(r, line, name, x, JV_STR));
        DSC_TRY(ascii_only(r, line, name, x));
        bool cased = false, ok = true;
        for (size_t i = 0; i < x.u.s->n; i++) {
            char c = x.u.s->c[i];
            if (!isalpha((unsigned char)c)) continue;
            cased = true;
            ok = ok && (name[0] == 'l' ? islower((unsigned char)c) : isupper((unsigned char)c));
        }
        *out = cased && ok;
        return DSC_OK;
    }
    if (!strcmp(name, "sameas")) {
        bool scalar = x.kind <= JV_INT && x.kind == p[0].kind;
        *out = scalar ? dsc__jv_equal(x, p[0])
                      : x.kind == p[0].kind && x.kind >= JV_STR && x.u.s == p[0].u.s;
        return DSC_OK;
    }
    return compare_test(r, line, name, x, p[0], out);
}

// ---- methods ----

static const spec methods[] = {
    {"strip", {"chars"}, 0},       {"lstrip", {"chars"}, 0},
    {"rstrip", {"chars"}, 0},      {"startswith", {"prefix"}, 1},
    {"endswith", {"suffix"}, 1},   {"split", {"sep", "maxsplit"}, 0},
    {"replace", {"old", "new", "count"}, 2}, {"upper", {NULL}, 0},
    {"lower", {NULL}, 0},          {"title", {NULL}, 0},
    {"capitalize", {NULL}, 0},     {"find", {"sub"}, 1},
    {"count", {"sub"}, 1},         {"join", {"iterable"}, 1},
    {"get", {"key", "default"}, 1}, {"items", {NULL}, 0},
    {"keys", {NULL}, 0},           {"values", {NULL}, 0},
};

bool dsc__jinja_has_method(const char *name) {
    for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++)
        if (!strcmp(methods[k].name, name)) return true;
    return false;
}

static dsc_status find_count(jrender *r, int line, jv x, jv sub, bool count, jv *out) {
    DSC_TRY(need(r, line, count ? "count" : "find", sub, JV_STR));
    const char *s = x.u.s->c, *end = s + x.u.s->n, *hit;
    int64_t n = 0;
    if (!count) {
        hit = find_sub(s, x.u.s->n, sub.u.s->c, sub.u.s->n);
        *out = dsc__jv_int(hit ? (int64_t)dsc__utf8_count(s, (size_t)(hit - s)) : -1);
        return DSC_OK;
    }
    if (sub.u.s->n == 0)
        return *out = dsc__jv_int((int64_t)dsc__utf8_count(s, x.u.s->n) + 1), DSC_OK;
    while ((hit = find_sub(s, (size_t)(end - s), sub.u.s->c, sub.u.s->n)))
        n++, s = hit + sub.u.s->n;
    *out = dsc__jv_int(n);
    return DSC_OK;
}

dsc_status dsc__jinja_method(jrender *r, int line, const jmethod *m, const jargs *a, jv *out) {
    const spec *s = NULL;
    for (size_t k = 0; k < sizeof methods / sizeof methods[0]; k++)
        if (!strcmp(methods[k].name, m->name)) s = &methods[k];
    jv p[4], x = m->self;
    DSC_TRY(bind(r, line, "method", s, a, p));
    const char *n = m->name;
    if (x.kind == JV_DICT) {
        if (!strcmp(n, "get")) {
            if (p[0].kind == JV_STR && dsc__jv_dict_get(x.u.d, p[0].u.s->c, p[0].u.s->n, out))
                return DSC_OK;
            *out = p[1].kind == JV_UNDEF ? dsc__jv_none : p[1];
            return DSC_OK;
        }
        return pairs(r, line, x, !strcmp(n, "keys") ? 0 : !strcmp(n, "values") ? 1 : 2, out);
    }
    if (!strcmp(n, "strip") || !strcmp(n, "lstrip") || !strcmp(n, "rstrip"))
        return strip(r, line, x, p[0], n[0] != 'r', n[0] != 'l', out);
    if (!strcmp(n, "startswith") || !strcmp(n, "endswith"))
        return affix(r, line, x, p[0], n[0] == 'e', out);
    if (!strcmp(n, "split")) return split(r, line, x, p[0], p[1], out);
    if (!strcmp(n, "replace")) return replace(r, line, x, p[0], p[1], p[2], out);
    if (!strcmp(n, "upper") || !strcmp(n, "lower"))
        return recase(r, line, n, x, n[0], out);
    if (!strcmp(n, "title")) return recase(r, line, "title", x, 't', out);
    if (!strcmp(n, "capitalize")) return recase(r, line, "capitalize", x, 'c', out);
    if (!strcmp(n, "find") || !strcmp(n, "count"))
        return find_count(r, line, x, p[0], n[0] == 'c', out);
    jv items;
    DSC_TRY(to_list(r, line, p[0], &items));
    return join(r, line, items, x, dsc__jv_undef, true, out); // str.join
}

// ---- global functions ----

int dsc__jinja_global(const char *name) {
    static const char *g[] = {"raise_exception", "namespace", "range", "strftime_now", "dict"};
    for (int k = 0; k < 5; k++)
        if (!strcmp(g[k], name)) return k;
    return -1;
}

static dsc_status kw_dict(jrender *r, int line, const jargs *a, bool ns, jv *out) {
    jarena *ar = dsc__jinja_arena(r);
    *out = dsc__jv_dict(ar);
    if (out->kind != JV_DICT) return oom(r, line);
    if (ns) out->kind = JV_NS;
    if (a->npos > 1 || (a->npos == 1 && a->v[0].kind != JV_DICT))
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "%s() takes a dict or name=value "
                               "arguments", ns ? "namespace" : "dict");
    for (int i = 0; a->npos && i < a->v[0].u.d->n; i++)
        if (!dsc__jv_dict_set(ar, out->u.d, a->v[0].u.d->k[i]->c, a->v[0].u.d->k[i]->n,
                              a->v[0].u.d->v[i]))
            return oom(r, line);
    for (int i = a->npos; i < a->n; i++)
        if (!dsc__jv_dict_set(ar, out->u.d, a->kw[i], strlen(a->kw[i]), a->v[i]))
            return oom(r, line);
    return DSC_OK;
}

static dsc_status range(jrender *r, int line, const jargs *a, jv *out) {
    int64_t v[3] = {0, 0, 1};
    if (a->npos < 1 || a->npos > 3 || a->n != a->npos)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "range() takes 1 to 3 integers");
    for (int k = 0; k < a->npos; k++) {
        if (a->v[k].kind != JV_INT)
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "range() takes integers");
        v[a->npos == 1 ? 1 : k] = a->v[k].u.i;
    }
    if (v[2] == 0) return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "range() step is 0");
    int64_t n = v[2] > 0 ? (v[1] > v[0] ? (v[1] - v[0] + v[2] - 1) / v[2] : 0)
                         : (v[0] > v[1] ? (v[0] - v[1] - v[2] - 1) / -v[2] : 0);
    if (n > 1000000)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "range() of %lld items is too long",
                               (long long)n);
    *out = dsc__jv_list(dsc__jinja_arena(r), (int)n);
    if (out->kind != JV_LIST) return oom(r, line);
    for (int64_t k = 0; k < n; k++) out->u.l->v[k] = dsc__jv_int(v[0] + k * v[2]);
    return DSC_OK;
}

dsc_status dsc__jinja_call_global(jrender *r, int line, int func, const jargs *a, jv *out) {
    if (func == JF_NAMESPACE || func == JF_DICT)
        return kw_dict(r, line, a, func == JF_NAMESPACE, out);
    if (func == JF_RANGE) return range(r, line, a, out);
    jbuf b = {0};
    if (a->n) dsc__jv_to_str(&b, a->v[0]);
    if (func == JF_RAISE) {
        dsc_status st = dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "the template raised an "
                                        "error: %s", b.s ? b.s : "");
        free(b.s);
        return st;
    }
    char text[256] = ""; // strftime_now(format): the local time now, as transformers gives it
    time_t now = time(NULL);
    struct tm tm;
    if (b.s && localtime_r(&now, &tm)) strftime(text, sizeof text, b.s, &tm);
    free(b.s);
    return mkstr(r, line, text, strlen(text), out);
}
