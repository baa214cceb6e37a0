// data/jinja_eval.c - rendering a compiled template: scopes, expressions with Python's semantics
// (as jinja2 evaluates them), statements, macros; and the public calls of data/jinja.h.
//
// Scopes follow jinja2: every for-loop iteration and every macro call has its own, so a `set`
// there is not seen outside it (hence namespace()); a macro sees the template's top level.
#include "data/jinja_impl.h"

#include <math.h>   // floor, fmod, pow
#include <stdarg.h> // va_list
#include <stdio.h>  // snprintf, vsnprintf
#include <stdlib.h> // calloc, free
#include <string.h> // memcmp, memcpy, strcmp, strlen

#include "base/status.h" // dsc__fail, DSC_TRY

#define MAX_DEPTH 64 // macro calls inside macro calls

typedef struct frame {
    struct frame *parent;
    jdict vars;
} frame;

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

struct jrender {
    const struct dsc_jinja *t;
    jarena a;   // every value made while rendering
    jbuf *out;  // where text goes (a macro call or block set redirects it)
    frame *top; // the innermost scope
    frame *root;
    int ctl; // a pending break / continue
    int depth;
};

// ---- errors ----

jarena *dsc__jinja_arena(jrender *r) { return &r->a; }

dsc_status dsc__jinja_fail(jrender *r, int line, dsc_status st, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return dsc__fail(st, "%s: line %d: %s", r->t->name, line, msg);
}

static dsc_status oom(jrender *r) {
    return dsc__fail(DSC_ERR_OOM, "%s: out of memory while rendering", r->t->name);
}

static dsc_status undefined(jrender *r, int line, jv v) {
    if (v.u.name)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "'%s' is undefined", v.u.name);
    return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "a value used here is undefined");
}

// ---- scopes ----

static frame *push_frame(jrender *r, frame *parent) {
    frame *f = dsc__jarena_alloc(&r->a, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static bool lookup(const jrender *r, const char *name, jv *out) {
    for (const frame *f = r->top; f; f = f->parent)
        if (dsc__jv_dict_get(&f->vars, name, strlen(name), out)) return true;
    return false;
}

static dsc_status assign(jrender *r, const char *name, jv v) {
    return dsc__jv_dict_set(&r->a, &r->top->vars, name, strlen(name), v) ? DSC_OK : oom(r);
}

// ---- attributes and items ----

static bool str_method(const char *name) {
    static const char *m[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split",
                              "rsplit", "replace", "upper", "lower", "title", "capitalize",
                              "find", "count", "join", "splitlines", "isdigit", "isalpha",
                              "isspace", "isalnum", "isupper", "islower", NULL};
    for (int k = 0; m[k]; k++)
        if (!strcmp(m[k], name)) return true;
    return false;
}

static bool dict_method(const char *name) {
    return !strcmp(name, "get") || !strcmp(name, "items") || !strcmp(name, "keys") ||
           !strcmp(name, "values");
}

static jv method(jrender *r, jv self, const char *name) {
    jmethod *m = dsc__jarena_alloc(&r->a, sizeof *m);
    if (!m) return dsc__jv_undef;
    m->self = self;
    m->name = name;
    return (jv){.kind = JV_METHOD, .u.m = m};
}

dsc_status dsc__jinja_getattr(jrender *r, int line, jv a, const char *name, jv *out) {
    *out = (jv){.kind = JV_UNDEF, .u.name = name};
    if (a.kind == JV_UNDEF) return undefined(r, line, a);
    if ((a.kind == JV_STR && str_method(name)) || (a.kind == JV_DICT && dict_method(name))) {
        *out = method(r, a, name);
        return out->kind == JV_METHOD ? DSC_OK : oom(r);
    }
    if (a.kind == JV_DICT || a.kind == JV_NS) dsc__jv_dict_get(a.u.d, name, strlen(name), out);
    return DSC_OK;
}

// Python's index i of a sequence of n (negative from the end); false when out of range.
static bool index_of(int64_t i, size_t n, size_t *at) {
    if (i < 0) i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n) return false;
    *at = (size_t)i;
    return true;
}

static dsc_status getitem(jrender *r, int line, jv a, jv k, jv *out) {
    *out = dsc__jv_undef;
    if (a.kind == JV_UNDEF) return undefined(r, line, a);
    size_t at;
    if ((a.kind == JV_DICT || a.kind == JV_NS) && k.kind == JV_STR) {
        if (dsc__jv_dict_get(a.u.d, k.u.s->c, k.u.s->n, out)) return DSC_OK;
        return dsc__jinja_getattr(r, line, a, k.u.s->c, out);
    }
    if (k.kind == JV_STR) return dsc__jinja_getattr(r, line, a, k.u.s->c, out);
    if (k.kind != JV_INT) return DSC_OK;
    if (a.kind == JV_LIST && index_of(k.u.i, (size_t)a.u.l->n, &at)) *out = a.u.l->v[at];
    if (a.kind == JV_STR && index_of(k.u.i, dsc__utf8_count(a.u.s->c, a.u.s->n), &at)) {
        size_t from = dsc__utf8_offset(a.u.s->c, a.u.s->n, at);
        size_t to = dsc__utf8_offset(a.u.s->c, a.u.s->n, at + 1);
        *out = dsc__jv_str(&r->a, a.u.s->c + from, to - from);
        if (out->kind != JV_STR) return oom(r);
    }
    return DSC_OK;
}

// Python's slice.indices(n) and the items it selects.
static dsc_status slice(jrender *r, int line, jv a, jv b, jv c, jv d, jv *out) {
    bool str = a.kind == JV_STR;
    if (!str && a.kind != JV_LIST)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "a %s cannot be sliced",
                               dsc__jv_type(a));
    int64_t n = str ? (int64_t)dsc__utf8_count(a.u.s->c, a.u.s->n) : a.u.l->n;
    int64_t step = d.kind == JV_INT ? d.u.i : 1;
    if (step == 0) return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "slice step cannot be 0");
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t start = step < 0 ? hi : lo, stop = step < 0 ? lo : hi;
    if (b.kind == JV_INT) start = b.u.i < 0 ? (b.u.i + n < lo ? lo : b.u.i + n)
                                            : (b.u.i > hi ? hi : b.u.i);
    if (c.kind == JV_INT) stop = c.u.i < 0 ? (c.u.i + n < lo ? lo : c.u.i + n)
                                           : (c.u.i > hi ? hi : c.u.i);
    int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                             : (start > stop ? (start - stop - step - 1) / -step : 0);
    if (!str) {
        *out = dsc__jv_list(&r->a, (int)count);
        for (int64_t k = 0; out->kind == JV_LIST && k < count; k++)
            out->u.l->v[k] = a.u.l->v[start + k * step];
        return out->kind == JV_LIST ? DSC_OK : oom(r);
    }
    jbuf s = {0};
    for (int64_t k = 0; k < count; k++) {
        size_t from = dsc__utf8_offset(a.u.s->c, a.u.s->n, (size_t)(start + k * step));
        size_t to = dsc__utf8_offset(a.u.s->c, a.u.s->n, (size_t)(start + k * step + 1));
        dsc__jbuf_add(&s, a.u.s->c + from, to - from);
    }
    *out = dsc__jv_str(&r->a, s.s ? s.s : "", s.n);
    free(s.s);
    return s.oom || out->kind != JV_STR ? oom(r) : DSC_OK;
}

// ---- operators ----

static bool num(jv v, double *f, bool *is_int, int64_t *i) {
    *is_int = v.kind != JV_FLOAT;
    if (v.kind == JV_BOOL) *i = v.u.b, *f = v.u.b;
    else if (v.kind == JV_INT) *i = v.u.i, *f = (double)v.u.i;
    else if (v.kind == JV_FLOAT) *f = v.u.f, *i = 0;
    else return false;
    return true;
}

static dsc_status type_error(jrender *r, int line, const char *op, jv a, jv b) {
    if (a.kind == JV_UNDEF) return undefined(r, line, a);
    if (b.kind == JV_UNDEF) return undefined(r, line, b);
    return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "unsupported operand types for %s: "
                           "'%s' and '%s'", op, dsc__jv_type(a), dsc__jv_type(b));
}

static dsc_status concat(jrender *r, jv a, jv b, jv *out) {
    if (a.kind == JV_STR) {
        jstr *s = dsc__jarena_alloc(&r->a, sizeof *s + a.u.s->n + b.u.s->n + 1);
        if (!s) return oom(r);
        s->n = a.u.s->n + b.u.s->n;
        memcpy(s->c, a.u.s->c, a.u.s->n);
        memcpy(s->c + a.u.s->n, b.u.s->c, b.u.s->n);
        *out = (jv){.kind = JV_STR, .u.s = s};
        return DSC_OK;
    }
    *out = dsc__jv_list(&r->a, a.u.l->n + b.u.l->n);
    if (out->kind != JV_LIST) return oom(r);
    for (int k = 0; k < a.u.l->n; k++) out->u.l->v[k] = a.u.l->v[k];
    for (int k = 0; k < b.u.l->n; k++) out->u.l->v[a.u.l->n + k] = b.u.l->v[k];
    return DSC_OK;
}

static dsc_status arith(jrender *r, int line, const char *op, jv a, jv b, jv *out) {
    double x, y;
    int64_t i, j;
    bool ia, ib;
    if (a.kind == JV_STR && !strcmp(op, "%"))
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "printf-style formatting "
                               "('...' %% x) is not supported; use ~ or +");
    if (!num(a, &x, &ia, &i) || !num(b, &y, &ib, &j)) return type_error(r, line, op, a, b);
    bool ints = ia && ib;
    char o = op[0];
    if ((o == '/' || o == '%') && (ints ? j == 0 : y == 0))
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "division by zero");
    if (!strcmp(op, "//")) {
        *out = ints ? dsc__jv_int(i / j - ((i % j != 0) && ((i < 0) != (j < 0))))
                    : dsc__jv_float(floor(x / y));
    } else if (o == '/') {
        *out = dsc__jv_float(x / y);
    } else if (o == '%') {
        int64_t m = ints ? i % j : 0;
        double fm = fmod(x, y);
        *out = ints ? dsc__jv_int(m && ((m < 0) != (j < 0)) ? m + j : m)
                    : dsc__jv_float(fm && ((fm < 0) != (y < 0)) ? fm + y : fm);
    } else if (!strcmp(op, "**")) {
        *out = ints && j >= 0 ? dsc__jv_int((int64_t)pow((double)i, (double)j))
                              : dsc__jv_float(pow(x, y));
    } else {
        *out = ints ? dsc__jv_int(o == '+' ? i + j : o == '-' ? i - j : i * j)
                    : dsc__jv_float(o == '+' ? x + y : o == '-' ? x - y : x * y);
    }
    return DSC_OK;
}

// str * int and list * int.
static dsc_status repeat(jrender *r, jv a, int64_t times, jv *out) {
    jv acc = a.kind == JV_STR ? dsc__jv_str(&r->a, "", 0) : dsc__jv_list(&r->a, 0);
    for (int64_t k = 0; k < times && acc.kind != JV_UNDEF; k++) DSC_TRY(concat(r, acc, a, &acc));
    *out = acc;
    return acc.kind == JV_UNDEF ? oom(r) : DSC_OK;
}

static int compare(jv a, jv b, bool *ok) {
    double x, y;
    int64_t i, j;
    bool ia, ib;
    *ok = true;
    if (num(a, &x, &ia, &i) && num(b, &y, &ib, &j)) {
        if (ia && ib) return i < j ? -1 : i > j;
        return x < y ? -1 : x > y;
    }
    if (a.kind == JV_STR && b.kind == JV_STR) { // UTF-8 byte order is code point order
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int c = memcmp(a.u.s->c, b.u.s->c, n);
        return c ? (c < 0 ? -1 : 1) : a.u.s->n < b.u.s->n ? -1 : a.u.s->n > b.u.s->n;
    }
    *ok = false;
    return 0;
}

static dsc_status contains(jrender *r, int line, jv item, jv in, bool *out) {
    *out = false;
    if (in.kind == JV_UNDEF) return DSC_OK;
    if (in.kind == JV_STR) {
        if (item.kind != JV_STR)
            return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "'in <string>' requires a "
                                   "string, not a %s", dsc__jv_type(item));
        size_t n = item.u.s->n, h = in.u.s->n;
        for (size_t k = 0; !*out && k + n <= h; k++) *out = !memcmp(in.u.s->c + k, item.u.s->c, n);
        return DSC_OK;
    }
    if (in.kind == JV_LIST) {
        for (int k = 0; !*out && k < in.u.l->n; k++) *out = dsc__jv_equal(item, in.u.l->v[k]);
        return DSC_OK;
    }
    if (in.kind == JV_DICT) {
        jv v;
        *out = item.kind == JV_STR && dsc__jv_dict_get(in.u.d, item.u.s->c, item.u.s->n, &v);
        return DSC_OK;
    }
    return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "'in' needs a string, list or dict, "
                           "not a %s", dsc__jv_type(in));
}

dsc_status dsc__jinja_binop(jrender *r, int line, const char *op, jv a, jv b, jv *out) {
    bool ok, in;
    if (!strcmp(op, "~")) {
        jbuf s = {0};
        dsc__jv_to_str(&s, a);
        dsc__jv_to_str(&s, b);
        *out = dsc__jv_str(&r->a, s.s ? s.s : "", s.n);
        free(s.s);
        return s.oom || out->kind != JV_STR ? oom(r) : DSC_OK;
    }
    if (!strcmp(op, "==") || !strcmp(op, "!=")) {
        *out = dsc__jv_bool(dsc__jv_equal(a, b) == (op[0] == '='));
        return DSC_OK;
    }
    if (!strcmp(op, "in") || !strcmp(op, "notin")) {
        DSC_TRY(contains(r, line, a, b, &in));
        *out = dsc__jv_bool(in == (op[0] == 'i'));
        return DSC_OK;
    }
    if (op[0] == '<' || op[0] == '>') {
        int c = compare(a, b, &ok);
        if (!ok) return type_error(r, line, op, a, b);
        *out = dsc__jv_bool(op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0));
        return DSC_OK;
    }
    if (!strcmp(op, "+") && a.kind == b.kind && (a.kind == JV_STR || a.kind == JV_LIST))
        return concat(r, a, b, out);
    if (!strcmp(op, "*") && (a.kind == JV_STR || a.kind == JV_LIST) && b.kind == JV_INT)
        return repeat(r, a, b.u.i, out);
    if (!strcmp(op, "*") && (b.kind == JV_STR || b.kind == JV_LIST) && a.kind == JV_INT)
        return repeat(r, b, a.u.i, out);
    return arith(r, line, op, a, b, out);
}

// ---- expressions ----

static dsc_status eval(jrender *r, const jexpr *e, jv *out);
static dsc_status call_macro(jrender *r, int line, const jnode *m, const jargs *a, jv *out);

static dsc_status eval_args(jrender *r, const jexpr *e, jargs *a) {
    a->n = e->nargs;
    a->npos = 0;
    a->kw = e->kw;
    a->v = e->nargs ? dsc__jarena_alloc(&r->a, (size_t)e->nargs * sizeof *a->v) : NULL;
    if (e->nargs && !a->v) return oom(r);
    for (int k = 0; k < e->nargs; k++) {
        DSC_TRY(eval(r, e->args[k], &a->v[k]));
        if (!e->kw[k]) a->npos++;
    }
    return DSC_OK;
}

static dsc_status eval_call(jrender *r, const jexpr *e, jv *out) {
    jv f;
    jargs a;
    DSC_TRY(eval(r, e->a, &f));
    DSC_TRY(eval_args(r, e, &a));
    if (f.kind == JV_METHOD) return dsc__jinja_method(r, e->line, f.u.m, &a, out);
    if (f.kind == JV_MACRO) return call_macro(r, e->line, f.u.macro, &a, out);
    if (f.kind == JV_FUNC) return dsc__jinja_call_global(r, e->line, f.u.func, &a, out);
    if (e->a->kind == E_ATTR && f.kind == JV_UNDEF) {
        jv self;
        DSC_TRY(eval(r, e->a->a, &self));
        return dsc__jinja_fail(r, e->line, DSC_ERR_INVALID_ARG, "a %s has no method .%s()",
                               dsc__jv_type(self), e->a->name);
    }
    if (f.kind == JV_UNDEF) return undefined(r, e->line, f);
    return dsc__jinja_fail(r, e->line, DSC_ERR_INVALID_ARG, "a %s cannot be called",
                           dsc__jv_type(f));
}

static dsc_status eval_seq(jrender *r, const jexpr *e, jv *out) {
    bool dict = e->kind == E_DICT;
    *out = dict ? dsc__jv_dict(&r->a) : dsc__jv_list(&r->a, e->nargs);
    if (out->kind == JV_UNDEF) return oom(r);
    if (!dict) out->u.l->tuple = e->negate;
    for (int k = 0; k < e->nargs; k += dict ? 2 : 1) {
        jv key, v;
        DSC_TRY(eval(r, e->args[k], &key));
        if (!dict) {
            out->u.l->v[k] = key;
            continue;
        }
        DSC_TRY(eval(r, e->args[k + 1], &v));
        if (key.kind != JV_STR)
            return dsc__jinja_fail(r, e->line, DSC_ERR_INVALID_ARG, "dict keys must be strings");
        if (!dsc__jv_dict_set(&r->a, out->u.d, key.u.s->c, key.u.s->n, v)) return oom(r);
    }
    return DSC_OK;
}

static dsc_status eval_name(jrender *r, const jexpr *e, jv *out) {
    if (lookup(r, e->name, out)) return DSC_OK;
    int g = dsc__jinja_global(e->name);
    *out = g >= 0 ? (jv){.kind = JV_FUNC, .u.func = g} : (jv){.kind = JV_UNDEF, .u.name = e->name};
    return DSC_OK;
}

static dsc_status eval_logic(jrender *r, const jexpr *e, jv *out) {
    jv a;
    DSC_TRY(eval(r, e->a, &a));
    bool t = dsc__jv_truthy(a);
    switch (e->kind) {
    case E_NOT: *out = dsc__jv_bool(!t); return DSC_OK;
    case E_AND: return t ? eval(r, e->b, out) : (*out = a, DSC_OK);
    case E_OR: return t ? (*out = a, DSC_OK) : eval(r, e->b, out);
    default: // E_COND
        if (t) return eval(r, e->b, out);
        if (e->c) return eval(r, e->c, out);
        *out = dsc__jv_undef;
        return DSC_OK;
    }
}

static dsc_status eval_sign(jrender *r, const jexpr *e, jv *out) {
    jv a;
    DSC_TRY(eval(r, e->a, &a));
    if (e->kind == E_POS && (a.kind == JV_INT || a.kind == JV_FLOAT)) return *out = a, DSC_OK;
    if (a.kind == JV_INT || a.kind == JV_BOOL)
        return *out = dsc__jv_int(-(a.kind == JV_INT ? a.u.i : a.u.b)), DSC_OK;
    if (a.kind == JV_FLOAT) return *out = dsc__jv_float(-a.u.f), DSC_OK;
    if (a.kind == JV_UNDEF) return undefined(r, e->line, a);
    return dsc__jinja_fail(r, e->line, DSC_ERR_INVALID_ARG, "bad operand type for unary %s: '%s'",
                           e->kind == E_NEG ? "-" : "+", dsc__jv_type(a));
}

static dsc_status eval(jrender *r, const jexpr *e, jv *out) {
    jv a, b, c, d;
    jargs args;
    bool t;
    switch (e->kind) {
    case E_LIT: *out = e->lit; return DSC_OK;
    case E_NAME: return eval_name(r, e, out);
    case E_ATTR:
        DSC_TRY(eval(r, e->a, &a));
        return dsc__jinja_getattr(r, e->line, a, e->name, out);
    case E_ITEM:
        DSC_TRY(eval(r, e->a, &a));
        DSC_TRY(eval(r, e->b, &b));
        return getitem(r, e->line, a, b, out);
    case E_SLICE:
        DSC_TRY(eval(r, e->a, &a));
        b = c = d = dsc__jv_none;
        if (e->b) DSC_TRY(eval(r, e->b, &b));
        if (e->c) DSC_TRY(eval(r, e->c, &c));
        if (e->d) DSC_TRY(eval(r, e->d, &d));
        return slice(r, e->line, a, b, c, d, out);
    case E_CALL: return eval_call(r, e, out);
    case E_FILTER:
        DSC_TRY(eval(r, e->a, &a));
        DSC_TRY(eval_args(r, e, &args));
        return dsc__jinja_filter(r, e->line, e->name, a, &args, out);
    case E_TEST:
        DSC_TRY(eval(r, e->a, &a));
        DSC_TRY(eval_args(r, e, &args));
        DSC_TRY(dsc__jinja_test(r, e->line, e->name, a, &args, &t));
        *out = dsc__jv_bool(t != e->negate);
        return DSC_OK;
    case E_BIN:
        DSC_TRY(eval(r, e->a, &a));
        DSC_TRY(eval(r, e->b, &b));
        return dsc__jinja_binop(r, e->line, e->name, a, b, out);
    case E_NEG:
    case E_POS: return eval_sign(r, e, out);
    case E_LIST:
    case E_DICT: return eval_seq(r, e, out);
    default: return eval_logic(r, e, out);
    }
}

// ---- statements ----

static dsc_status exec(jrender *r, jnode *const *v, int n);

static dsc_status out_value(jrender *r, jv v) {
    dsc__jv_to_str(r->out, v);
    return r->out->oom ? oom(r) : DSC_OK;
}

// The items a for loop walks: a list's, a dict's keys, a string's characters.
static dsc_status iterable(jrender *r, int line, jv v, jv *items) {
    if (v.kind == JV_LIST) return *items = v, DSC_OK;
    if (v.kind == JV_UNDEF) return *items = dsc__jv_list(&r->a, 0), DSC_OK;
    if (v.kind == JV_DICT) {
        *items = dsc__jv_list(&r->a, v.u.d->n);
        for (int k = 0; items->kind == JV_LIST && k < v.u.d->n; k++)
            items->u.l->v[k] = (jv){.kind = JV_STR, .u.s = v.u.d->k[k]};
        return items->kind == JV_LIST ? DSC_OK : oom(r);
    }
    if (v.kind == JV_STR) return dsc__jinja_filter(r, line, "list", v, &(jargs){0}, items);
    return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "a %s is not iterable", dsc__jv_type(v));
}

static dsc_status bind(jrender *r, const jnode *s, jv item) {
    if (s->nnames == 1) return assign(r, s->names[0], item);
    if (item.kind != JV_LIST || item.u.l->n != s->nnames)
        return dsc__jinja_fail(r, s->line, DSC_ERR_INVALID_ARG, "cannot unpack a %s into %d "
                               "names", dsc__jv_type(item), s->nnames);
    for (int k = 0; k < s->nnames; k++) DSC_TRY(assign(r, s->names[k], item.u.l->v[k]));
    return DSC_OK;
}

// The items that pass the loop's `if` (seen with the loop's names bound, without `loop`).
static dsc_status filter_items(jrender *r, const jnode *s, jv *items) {
    if (!s->cond) return DSC_OK;
    jv kept = dsc__jv_list(&r->a, items->u.l->n);
    if (kept.kind != JV_LIST) return oom(r);
    int n = 0;
    frame *outer = r->top;
    for (int k = 0; k < items->u.l->n; k++) {
        jv c;
        if (!(r->top = push_frame(r, outer))) return oom(r);
        dsc_status st = bind(r, s, items->u.l->v[k]);
        if (st == DSC_OK) st = eval(r, s->cond, &c);
        r->top = outer;
        DSC_TRY(st);
        if (dsc__jv_truthy(c)) kept.u.l->v[n++] = items->u.l->v[k];
    }
    kept.u.l->n = n;
    *items = kept;
    return DSC_OK;
}

static dsc_status loop_vars(jrender *r, const jlist *l, int k) {
    jv loop = dsc__jv_dict(&r->a);
    if (loop.kind != JV_DICT) return oom(r);
    int n = l->n;
    struct {
        const char *k;
        jv v;
    } f[] = {{"index", dsc__jv_int(k + 1)},       {"index0", dsc__jv_int(k)},
             {"revindex", dsc__jv_int(n - k)},    {"revindex0", dsc__jv_int(n - k - 1)},
             {"first", dsc__jv_bool(k == 0)},     {"last", dsc__jv_bool(k == n - 1)},
             {"length", dsc__jv_int(n)},          {"depth", dsc__jv_int(1)},
             {"depth0", dsc__jv_int(0)},
             {"previtem", k > 0 ? l->v[k - 1] : dsc__jv_undef},
             {"nextitem", k + 1 < n ? l->v[k + 1] : dsc__jv_undef}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].v.kind != JV_UNDEF &&
            !dsc__jv_dict_set(&r->a, loop.u.d, f[i].k, strlen(f[i].k), f[i].v))
            return oom(r);
    return assign(r, "loop", loop);
}

static dsc_status exec_for(jrender *r, const jnode *s) {
    jv v, items;
    DSC_TRY(eval(r, s->e, &v));
    DSC_TRY(iterable(r, s->line, v, &items));
    DSC_TRY(filter_items(r, s, &items));
    frame *outer = r->top;
    dsc_status st = DSC_OK;
    for (int k = 0; st == DSC_OK && k < items.u.l->n; k++) {
        if (!(r->top = push_frame(r, outer))) st = oom(r);
        if (st == DSC_OK) st = bind(r, s, items.u.l->v[k]);
        if (st == DSC_OK) st = loop_vars(r, items.u.l, k);
        if (st == DSC_OK) st = exec(r, s->body, s->nbody);
        r->top = outer;
        if (r->ctl == CTL_BREAK) k = items.u.l->n;
        r->ctl = CTL_NONE;
    }
    DSC_TRY(st);
    return items.u.l->n == 0 ? exec(r, s->els, s->nels) : DSC_OK;
}

static dsc_status exec_set(jrender *r, const jnode *s) {
    jv v, ns;
    DSC_TRY(eval(r, s->e, &v));
    if (!s->attr) return bind(r, s, v);
    if (!lookup(r, s->names[0], &ns) || ns.kind != JV_NS)
        return dsc__jinja_fail(r, s->line, DSC_ERR_INVALID_ARG, "{%% set %s.%s %%}: %s is not a "
                               "namespace()", s->names[0], s->attr, s->names[0]);
    return dsc__jv_dict_set(&r->a, ns.u.d, s->attr, strlen(s->attr), v) ? DSC_OK : oom(r);
}

// Render nodes into a string of their own (block set, macro body).
static dsc_status capture(jrender *r, jnode *const *v, int n, jv *out) {
    jbuf b = {0}, *saved = r->out;
    r->out = &b;
    dsc_status st = exec(r, v, n);
    r->out = saved;
    r->ctl = CTL_NONE;
    if (st == DSC_OK) {
        *out = dsc__jv_str(&r->a, b.s ? b.s : "", b.n);
        if (b.oom || out->kind != JV_STR) st = oom(r);
    }
    free(b.s);
    return st;
}

static dsc_status call_macro(jrender *r, int line, const jnode *m, const jargs *a, jv *out) {
    int nparams = m->nnames - 1;
    if (a->npos > nparams)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "macro %s takes %d arguments, %d "
                               "given", m->names[0], nparams, a->npos);
    if (r->depth >= MAX_DEPTH)
        return dsc__jinja_fail(r, line, DSC_ERR_INVALID_ARG, "macro calls nested deeper than %d",
                               MAX_DEPTH);
    frame *saved = r->top;
    if (!(r->top = push_frame(r, r->root))) return oom(r);
    dsc_status st = DSC_OK;
    for (int k = 0; st == DSC_OK && k < nparams; k++) {
        jv v = dsc__jv_undef;
        bool given = k < a->npos;
        if (given) v = a->v[k];
        for (int i = a->npos; i < a->n; i++)
            if (!strcmp(a->kw[i], m->names[k + 1])) v = a->v[i], given = true;
        if (!given && m->defaults[k]) st = eval(r, m->defaults[k], &v);
        if (st == DSC_OK) st = assign(r, m->names[k + 1], v);
    }
    r->depth++;
    if (st == DSC_OK) st = capture(r, m->body, m->nbody, out);
    r->depth--;
    r->top = saved;
    return st;
}

static dsc_status exec_one(jrender *r, const jnode *s) {
    jv v;
    switch (s->kind) {
    case S_TEXT:
        dsc__jbuf_add(r->out, s->text, s->n);
        return r->out->oom ? oom(r) : DSC_OK;
    case S_OUT:
        DSC_TRY(eval(r, s->e, &v));
        return out_value(r, v);
    case S_IF:
        DSC_TRY(eval(r, s->e, &v));
        return dsc__jv_truthy(v) ? exec(r, s->body, s->nbody) : exec(r, s->els, s->nels);
    case S_FOR: return exec_for(r, s);
    case S_SET: return exec_set(r, s);
    case S_BLOCK_SET:
        DSC_TRY(capture(r, s->body, s->nbody, &v));
        return assign(r, s->names[0], v);
    case S_MACRO: return assign(r, s->names[0], (jv){.kind = JV_MACRO, .u.macro = (jnode *)s});
    case S_BREAK: r->ctl = CTL_BREAK; return DSC_OK;
    case S_CONTINUE: r->ctl = CTL_CONTINUE; return DSC_OK;
    default: return exec(r, s->body, s->nbody); // S_BODY
    }
}

static dsc_status exec(jrender *r, jnode *const *v, int n) {
    for (int k = 0; k < n && r->ctl == CTL_NONE; k++) DSC_TRY(exec_one(r, v[k]));
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc_jinja_compile(const char *src, const char *name, dsc_jinja **out) {
    *out = NULL;
    struct dsc_jinja *t = calloc(1, sizeof *t);
    if (!t) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", name);
    snprintf(t->name, sizeof t->name, "%s", name);
    jtok *tok = NULL;
    int ntok = 0;
    dsc_status st = dsc__jinja_lex(&t->arena, src, t->name, &tok, &ntok);
    if (st == DSC_OK) st = dsc__jinja_parse(t, tok, ntok);
    free(tok);
    if (st != DSC_OK) {
        dsc_jinja_destroy(t);
        return st;
    }
    *out = t;
    return DSC_OK;
}

void dsc_jinja_destroy(dsc_jinja *t) {
    if (!t) return;
    dsc__jarena_free(&t->arena);
    free(t);
}

static dsc_status set_vars(jrender *r, json_t *vars) {
    const char *k;
    json_t *v;
    json_object_foreach(vars, k, v) {
        jv x = dsc__jv_from_json(&r->a, v);
        if (x.kind == JV_UNDEF) return oom(r);
        DSC_TRY(assign(r, k, x));
    }
    return DSC_OK;
}

dsc_status dsc_jinja_render(const dsc_jinja *t, json_t *vars, char **out, size_t *len) {
    jbuf b = {0};
    jrender r = {.t = t, .out = &b};
    dsc_status st = (r.root = r.top = push_frame(&r, NULL)) ? DSC_OK : oom(&r);
    if (st == DSC_OK && vars) st = set_vars(&r, vars);
    if (st == DSC_OK) st = exec(&r, t->body, t->nbody);
    if (st == DSC_OK) dsc__jbuf_add(&b, "", 0);
    if (st == DSC_OK && !b.s && !(b.s = calloc(1, 1))) st = oom(&r);
    if (st == DSC_OK && b.oom) st = oom(&r);
    dsc__jarena_free(&r.a);
    if (st != DSC_OK) {
        free(b.s);
        return st;
    }
    *out = b.s;
    *len = b.n;
    return DSC_OK;
}
