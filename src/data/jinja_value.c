// data/jinja_value.c - the Jinja subset's values: the arena they live in, Python's str() and
// repr() of them, json.dumps of them (Hugging Face's tojson), and values made from JSON.
#include "data/jinja_impl.h"

#include <jansson.h> // json_*
#include <math.h>    // isinf, isnan, floor
#include <stdio.h>   // snprintf
#include <stdlib.h>  // calloc, free, realloc, strtod
#include <string.h>  // memcmp, memcpy, strlen

// ---- arena ----

typedef struct jblock {
    struct jblock *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} jblock;

#define JBLOCK_BYTES (64 * 1024)

void *dsc__jarena_alloc(jarena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    jblock *b = a->head;
    if (!b || b->used + n > b->cap) {
        size_t cap = n > JBLOCK_BYTES ? n : JBLOCK_BYTES;
        if (!(b = malloc(sizeof *b + cap))) return NULL;
        b->next = a->head;
        b->used = 0;
        b->cap = cap;
        a->head = b;
    }
    void *p = b->data + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

void dsc__jarena_free(jarena *a) {
    for (jblock *b = a->head, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    a->head = NULL;
}

// ---- making values ----

const jv dsc__jv_undef = {.kind = JV_UNDEF}, dsc__jv_none = {.kind = JV_NONE};

jv dsc__jv_bool(bool b) { return (jv){.kind = JV_BOOL, .u.b = b}; }
jv dsc__jv_int(int64_t i) { return (jv){.kind = JV_INT, .u.i = i}; }
jv dsc__jv_float(double f) { return (jv){.kind = JV_FLOAT, .u.f = f}; }

jv dsc__jv_str(jarena *a, const char *s, size_t n) {
    jstr *p = dsc__jarena_alloc(a, sizeof *p + n + 1);
    if (!p) return dsc__jv_undef;
    p->n = n;
    if (n) memcpy(p->c, s, n);
    p->c[n] = '\0';
    return (jv){.kind = JV_STR, .u.s = p};
}

jv dsc__jv_list(jarena *a, int n) {
    jlist *l = dsc__jarena_alloc(a, sizeof *l);
    jv *v = n ? dsc__jarena_alloc(a, (size_t)n * sizeof *v) : NULL;
    if (!l || (n && !v)) return dsc__jv_undef;
    l->n = n;
    l->v = v;
    return (jv){.kind = JV_LIST, .u.l = l};
}

jv dsc__jv_dict(jarena *a) {
    jdict *d = dsc__jarena_alloc(a, sizeof *d);
    return d ? (jv){.kind = JV_DICT, .u.d = d} : dsc__jv_undef;
}

static int dict_find(const jdict *d, const char *k, size_t kn) {
    for (int i = 0; i < d->n; i++)
        if (d->k[i]->n == kn && !memcmp(d->k[i]->c, k, kn)) return i;
    return -1;
}

bool dsc__jv_dict_set(jarena *a, jdict *d, const char *k, size_t kn, jv v) {
    int i = dict_find(d, k, kn);
    if (i >= 0) {
        d->v[i] = v;
        return true;
    }
    if (d->n == d->cap) { // arena memory: grow by copying
        int cap = d->cap ? 2 * d->cap : 8;
        jstr **nk = dsc__jarena_alloc(a, (size_t)cap * sizeof *nk);
        jv *nv = dsc__jarena_alloc(a, (size_t)cap * sizeof *nv);
        if (!nk || !nv) return false;
        if (d->n) memcpy(nk, d->k, (size_t)d->n * sizeof *nk);
        if (d->n) memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        d->k = nk, d->v = nv, d->cap = cap;
    }
    jv key = dsc__jv_str(a, k, kn);
    if (key.kind != JV_STR) return false;
    d->k[d->n] = key.u.s;
    d->v[d->n++] = v;
    return true;
}

bool dsc__jv_dict_get(const jdict *d, const char *k, size_t kn, jv *out) {
    int i = dict_find(d, k, kn);
    if (i < 0) return false;
    *out = d->v[i];
    return true;
}

jv dsc__jv_from_json(jarena *a, json_t *j) {
    switch (json_typeof(j)) {
    case JSON_STRING: return dsc__jv_str(a, json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return dsc__jv_int(json_integer_value(j));
    case JSON_REAL: return dsc__jv_float(json_real_value(j));
    case JSON_TRUE: return dsc__jv_bool(true);
    case JSON_FALSE: return dsc__jv_bool(false);
    case JSON_NULL: return dsc__jv_none;
    case JSON_ARRAY: {
        jv l = dsc__jv_list(a, (int)json_array_size(j));
        for (int i = 0; l.kind == JV_LIST && i < l.u.l->n; i++)
            if ((l.u.l->v[i] = dsc__jv_from_json(a, json_array_get(j, (size_t)i))).kind == JV_UNDEF)
                return dsc__jv_undef;
        return l;
    }
    case JSON_OBJECT: {
        jv d = dsc__jv_dict(a);
        const char *k;
        json_t *v;
        json_object_foreach(j, k, v) {
            jv x = dsc__jv_from_json(a, v);
            if (d.kind != JV_DICT || x.kind == JV_UNDEF ||
                !dsc__jv_dict_set(a, d.u.d, k, strlen(k), x))
                return dsc__jv_undef;
        }
        return d;
    }
    }
    return dsc__jv_undef;
}

// ---- comparing ----

bool dsc__jv_truthy(jv v) {
    switch (v.kind) {
    case JV_UNDEF:
    case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->n != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

const char *dsc__jv_type(jv v) {
    static const char *names[] = {"undefined", "NoneType", "bool",      "int",
                                  "float",     "str",      "list",      "dict",
                                  "Namespace", "Macro",    "function", "method"};
    return names[v.kind];
}

static bool numeric(jv v, double *f) {
    if (v.kind == JV_BOOL) *f = v.u.b;
    else if (v.kind == JV_INT) *f = (double)v.u.i;
    else if (v.kind == JV_FLOAT) *f = v.u.f;
    else return false;
    return true;
}

bool dsc__jv_equal(jv a, jv b) {
    double x, y;
    if (numeric(a, &x) && numeric(b, &y)) {
        if (a.kind != JV_FLOAT && b.kind != JV_FLOAT) // exact for large ints
            return (a.kind == JV_BOOL ? a.u.b : a.u.i) == (b.kind == JV_BOOL ? b.u.b : b.u.i);
        return x == y;
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case JV_UNDEF:
    case JV_NONE: return true;
    case JV_STR: return a.u.s->n == b.u.s->n && !memcmp(a.u.s->c, b.u.s->c, a.u.s->n);
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return false;
        for (int i = 0; i < a.u.l->n; i++)
            if (!dsc__jv_equal(a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (int i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!dsc__jv_dict_get(b.u.d, a.u.d->k[i]->c, a.u.d->k[i]->n, &o) ||
                !dsc__jv_equal(a.u.d->v[i], o))
                return false;
        }
        return true;
    case JV_NS: return a.u.d == b.u.d;
    case JV_MACRO: return a.u.macro == b.u.macro;
    case JV_FUNC: return a.u.func == b.u.func;
    default: return false;
    }
}

// ---- text ----

void dsc__jbuf_add(jbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void add_cstr(jbuf *b, const char *s) { dsc__jbuf_add(b, s, strlen(s)); }

// Python's repr(float): the shortest digits that read back the same; exponent form below 1e-4
// and from 1e16 on; ".0" on integral values.
static void add_float(jbuf *b, double f) {
    if (isnan(f)) return add_cstr(b, "nan");
    if (isinf(f)) return add_cstr(b, f < 0 ? "-inf" : "inf");
    char d[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(d, sizeof d, "%.*e", prec - 1, f);
        if (strtod(d, NULL) == f) break;
    }
    char *e = strchr(d, 'e');
    int exp = (int)strtol(e + 1, NULL, 10);
    *e = '\0';
    char digits[32];
    size_t nd = 0;
    for (const char *p = d; *p; p++)
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    char out[80];
    const char *sign = f < 0 ? "-" : "";
    if (exp < -4 || exp >= 16) {
        snprintf(out, sizeof out, "%s%c%s%s%se%c%02d", sign, digits[0], nd > 1 ? "." : "",
                 digits + 1, "", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) { // 0.000ddd
        snprintf(out, sizeof out, "%s0.%.*s%s", sign, -exp - 1, "000", digits);
    } else {
        char ip[24], fp[24]; // exp < 16 here; at most 17 digits
        size_t ni = (size_t)exp + 1;
        for (size_t k = 0; k < ni; k++) ip[k] = k < nd ? digits[k] : '0';
        ip[ni] = '\0';
        snprintf(fp, sizeof fp, "%s", nd > ni ? digits + ni : "0");
        snprintf(out, sizeof out, "%s%s.%s", sign, ip, fp);
    }
    add_cstr(b, out);
}

// Code point at s (n bytes left) and its length; malformed bytes are taken one by one.
static unsigned utf8_at(const unsigned char *s, size_t n, size_t *len) {
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (k > n) k = 1;
    unsigned cp = k == 1 ? c : c & (0x3F >> (k - 1));
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return c;
        }
        cp = cp << 6 | (s[i] & 0x3F);
    }
    *len = k;
    return cp;
}

static bool py_space(unsigned cp) {
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

size_t dsc__ws_prefix(const char *s, size_t n) {
    size_t i = 0, len;
    while (i < n && py_space(utf8_at((const unsigned char *)s + i, n - i, &len))) i += len;
    return i;
}

size_t dsc__ws_suffix(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t start = end - 1, len;
        while (start > 0 && end - start < 4 && ((unsigned char)s[start] & 0xC0) == 0x80) start--;
        unsigned cp = utf8_at((const unsigned char *)s + start, end - start, &len);
        if (start + len != end || !py_space(cp)) break;
        end = start;
    }
    return n - end;
}

size_t dsc__utf8_count(const char *s, size_t n) {
    size_t k = 0, len;
    for (size_t i = 0; i < n; i += len, k++) utf8_at((const unsigned char *)s + i, n - i, &len);
    return k;
}

size_t dsc__utf8_offset(const char *s, size_t n, size_t k) {
    size_t i = 0, len;
    for (; i < n && k > 0; i += len, k--) utf8_at((const unsigned char *)s + i, n - i, &len);
    return i;
}

// Whether Python's repr() shows the code point as it is (str.isprintable), near enough: control
// characters, Unicode's separators and format characters and private use are escaped.
static bool py_printable(unsigned cp) {
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0) || cp == 0xAD) return false;
    if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
    if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF || cp == 0x1680)
        return false;
    return !(cp >= 0xE000 && cp <= 0xF8FF) && !(cp >= 0xD800 && cp <= 0xDFFF);
}

static void add_repr_str(jbuf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    dsc__jbuf_add(b, &q, 1);
    for (size_t i = 0, len; i < n; i += len) {
        unsigned cp = utf8_at((const unsigned char *)s + i, n - i, &len);
        char e[16];
        if (cp == '\\' || cp == (unsigned)q) snprintf(e, sizeof e, "\\%c", (char)cp);
        else if (cp == '\n' || cp == '\r' || cp == '\t')
            snprintf(e, sizeof e, "\\%c", cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
        else if (py_printable(cp)) {
            dsc__jbuf_add(b, s + i, len);
            continue;
        } else
            snprintf(e, sizeof e, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x",
                     cp);
        add_cstr(b, e);
    }
    dsc__jbuf_add(b, &q, 1);
}

static void add_repr(jbuf *b, jv v) {
    if (v.kind == JV_STR) add_repr_str(b, v.u.s->c, v.u.s->n);
    else if (v.kind == JV_UNDEF) add_cstr(b, "Undefined");
    else dsc__jv_to_str(b, v);
}

void dsc__jv_to_str(jbuf *b, jv v) {
    char num[32];
    switch (v.kind) {
    case JV_UNDEF: return;
    case JV_NONE: return add_cstr(b, "None");
    case JV_BOOL: return add_cstr(b, v.u.b ? "True" : "False");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); return add_cstr(b, num);
    case JV_FLOAT: return add_float(b, v.u.f);
    case JV_STR: return dsc__jbuf_add(b, v.u.s->c, v.u.s->n);
    case JV_LIST:
        add_cstr(b, v.u.l->tuple ? "(" : "[");
        for (int i = 0; i < v.u.l->n; i++) {
            if (i) add_cstr(b, ", ");
            add_repr(b, v.u.l->v[i]);
        }
        if (v.u.l->tuple && v.u.l->n == 1) add_cstr(b, ",");
        return add_cstr(b, v.u.l->tuple ? ")" : "]");
    case JV_DICT:
    case JV_NS:
        add_cstr(b, v.kind == JV_NS ? "<Namespace {" : "{");
        for (int i = 0; i < v.u.d->n; i++) {
            if (i) add_cstr(b, ", ");
            add_repr_str(b, v.u.d->k[i]->c, v.u.d->k[i]->n);
            add_cstr(b, ": ");
            add_repr(b, v.u.d->v[i]);
        }
        return add_cstr(b, v.kind == JV_NS ? "}>" : "}");
    default: return add_cstr(b, "<function>");
    }
}

// ---- JSON ----

static void add_json_str(jbuf *b, const char *s, size_t n) {
    add_cstr(b, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : NULL;
        if (!esc && c < 0x20) snprintf(e, sizeof e, "\\u%04x", c), esc = e;
        if (esc) add_cstr(b, esc);
        else dsc__jbuf_add(b, s + i, 1);
    }
    add_cstr(b, "\"");
}

static void newline(jbuf *b, int indent, int depth) {
    add_cstr(b, "\n");
    for (int k = 0; k < indent * depth; k++) add_cstr(b, " ");
}

bool dsc__jv_to_json(jbuf *b, jv v, int indent, int depth, const char **bad) {
    bool list = v.kind == JV_LIST;
    switch (v.kind) {
    case JV_NONE: add_cstr(b, "null"); return true;
    case JV_BOOL: add_cstr(b, v.u.b ? "true" : "false"); return true;
    case JV_INT: dsc__jv_to_str(b, v); return true;
    case JV_FLOAT:
        if (isnan(v.u.f)) add_cstr(b, "NaN");
        else if (isinf(v.u.f)) add_cstr(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else add_float(b, v.u.f);
        return true;
    case JV_STR: add_json_str(b, v.u.s->c, v.u.s->n); return true;
    case JV_LIST:
    case JV_DICT: break;
    default: *bad = dsc__jv_type(v); return false;
    }
    int n = list ? v.u.l->n : v.u.d->n;
    add_cstr(b, list ? "[" : "{");
    for (int i = 0; i < n; i++) {
        if (i) add_cstr(b, indent >= 0 ? "," : ", ");
        if (indent >= 0) newline(b, indent, depth + 1);
        if (!list) {
            add_json_str(b, v.u.d->k[i]->c, v.u.d->k[i]->n);
            add_cstr(b, ": ");
        }
        if (!dsc__jv_to_json(b, list ? v.u.l->v[i] : v.u.d->v[i], indent, depth + 1, bad))
            return false;
    }
    if (n && indent >= 0) newline(b, indent, depth);
    add_cstr(b, list ? "]" : "}");
    return true;
}
