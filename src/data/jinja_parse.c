// data/jinja_parse.c - tokens -> the syntax tree of a template (jinja_impl.h), by recursive
// descent with jinja2's precedence: `x if c else y` < or < and < not < comparisons and in < + - <
// ~ < * / // % < ** < unary - + < filters and tests (| name, is name) < postfix (.a [i] (args)).
// What is outside the subset is refused here, naming it and its line.
#include "data/jinja_impl.h"

#include <stdio.h>  // snprintf
#include <string.h> // memcpy, strcmp, strlen, strncmp

#include "base/status.h" // dsc__fail, DSC_TRY

#define SUBSET " (dsc renders the subset of Jinja listed in docs/data.md)"

typedef struct parser {
    struct dsc_jinja *t;
    const jtok *tok;
    int n, pos;
    const char **calls; // names called as functions, checked once every macro is known
    int *call_lines;
    int ncalls, cap_calls, cap_lines;
    const char **macros;
    int nmacros, cap_macros;
} parser;

// ---- helpers ----

static const jtok *cur(const parser *p) { return &p->tok[p->pos]; }

static bool is_op(const parser *p, const char *op) {
    const jtok *t = cur(p);
    return t->kind == T_OP && t->n == strlen(op) && !strncmp(t->s, op, t->n);
}

static bool is_name(const parser *p, const char *name) {
    const jtok *t = cur(p);
    return t->kind == T_NAME && t->n == strlen(name) && !strncmp(t->s, name, t->n);
}

static bool next_is_op(const parser *p, const char *op) {
    const jtok *t = &p->tok[p->pos + 1 < p->n ? p->pos + 1 : p->pos];
    return t->kind == T_OP && t->n == strlen(op) && !strncmp(t->s, op, t->n);
}

static dsc_status fail(parser *p, const char *what, const char *detail) {
    return dsc__fail(DSC_ERR_CONFIG, "%s: line %d: %s%s", p->t->name, cur(p)->line, what,
                     detail ? detail : "");
}

static const char *tok_text(const jtok *t, char *buf, size_t cap) {
    switch (t->kind) {
    case T_NAME:
    case T_OP: snprintf(buf, cap, "'%.*s'", (int)t->n, t->s); break;
    case T_STRING: snprintf(buf, cap, "a string"); break;
    case T_INT:
    case T_FLOAT: snprintf(buf, cap, "a number"); break;
    case T_VAR_END: snprintf(buf, cap, "'}}'"); break;
    case T_BLOCK_END: snprintf(buf, cap, "'%%}'"); break;
    case T_EOF: snprintf(buf, cap, "the end of the template"); break;
    default: snprintf(buf, cap, "text"); break;
    }
    return buf;
}

static dsc_status unexpected(parser *p, const char *wanted) {
    char buf[96], what[256];
    snprintf(what, sizeof what, "expected %s, found %s", wanted, tok_text(cur(p), buf, sizeof buf));
    return fail(p, what, NULL);
}

static dsc_status expect_op(parser *p, const char *op) {
    char want[16];
    snprintf(want, sizeof want, "'%s'", op);
    if (!is_op(p, op)) return unexpected(p, want);
    p->pos++;
    return DSC_OK;
}

static dsc_status expect_end(parser *p) {
    if (cur(p)->kind != T_BLOCK_END) return unexpected(p, "'%}'");
    p->pos++;
    return DSC_OK;
}

static const char *name_copy(parser *p, const jtok *t) {
    jv s = dsc__jv_str(&p->t->arena, t->s, t->n);
    return s.kind == JV_STR ? s.u.s->c : NULL;
}

static dsc_status oom(parser *p) { return dsc__fail(DSC_ERR_OOM, "%s: out of memory", p->t->name); }

// Append to an arena array (grown by copying; the old copy stays in the arena).
static bool grow(parser *p, void **arr, int n, int *cap, size_t size) {
    if (n < *cap) return true;
    int ncap = *cap ? 2 * *cap : 4;
    void *v = dsc__jarena_alloc(&p->t->arena, (size_t)ncap * size);
    if (!v) return false;
    if (n) memcpy(v, *arr, (size_t)n * size);
    *arr = v;
    *cap = ncap;
    return true;
}

static jexpr *new_expr(parser *p, jexpr_kind k) {
    jexpr *e = dsc__jarena_alloc(&p->t->arena, sizeof *e);
    if (e) e->kind = k, e->line = cur(p)->line;
    return e;
}

static jnode *new_node(parser *p, jnode_kind k) {
    jnode *s = dsc__jarena_alloc(&p->t->arena, sizeof *s);
    if (s) s->kind = k, s->line = cur(p)->line;
    return s;
}

// ---- expressions ----

static dsc_status expr(parser *p, bool cond, jexpr **out);
static dsc_status unary(parser *p, bool filters, jexpr **out);

static dsc_status bin(parser *p, jexpr_kind k, const char *op, jexpr *a, jexpr *b, jexpr **out) {
    jexpr *e = new_expr(p, k);
    if (!e) return oom(p);
    e->name = op, e->a = a, e->b = b;
    *out = e;
    return DSC_OK;
}

// (args) of a call, filter or test: positional, then name=value.
static dsc_status call_args(parser *p, jexpr *e) {
    DSC_TRY(expect_op(p, "("));
    int cap = 0, capk = 0;
    while (!is_op(p, ")")) {
        if (e->nargs) DSC_TRY(expect_op(p, ","));
        if (is_op(p, ")")) break; // a trailing comma
        const char *kw = NULL;
        if (cur(p)->kind == T_NAME && next_is_op(p, "=")) {
            if (!(kw = name_copy(p, cur(p)))) return oom(p);
            p->pos += 2;
        } else if (e->nargs && e->kw[e->nargs - 1]) {
            return fail(p, "a positional argument after a keyword argument", NULL);
        }
        jexpr *a;
        DSC_TRY(expr(p, true, &a));
        if (!grow(p, (void **)&e->args, e->nargs, &cap, sizeof *e->args) ||
            !grow(p, (void **)&e->kw, e->nargs, &capk, sizeof *e->kw))
            return oom(p);
        e->args[e->nargs] = a;
        e->kw[e->nargs++] = kw;
    }
    p->pos++;
    return DSC_OK;
}

static dsc_status add_item(parser *p, jexpr *e, jexpr *item, int *cap) {
    if (!grow(p, (void **)&e->args, e->nargs, cap, sizeof *e->args)) return oom(p);
    e->args[e->nargs++] = item;
    return DSC_OK;
}

// [a, b], (a, b) and {k: v}, after the opening bracket.
static dsc_status sequence(parser *p, const char *close, bool dict, jexpr *e) {
    int cap = 0;
    while (!is_op(p, close)) {
        if (e->nargs) DSC_TRY(expect_op(p, ","));
        if (is_op(p, close)) break;
        jexpr *a, *b;
        DSC_TRY(expr(p, true, &a));
        DSC_TRY(add_item(p, e, a, &cap));
        if (!dict) continue;
        DSC_TRY(expect_op(p, ":"));
        DSC_TRY(expr(p, true, &b));
        DSC_TRY(add_item(p, e, b, &cap));
    }
    p->pos++;
    return DSC_OK;
}

static dsc_status literal(parser *p, jv v, jexpr **out) {
    if (!(*out = new_expr(p, E_LIT))) return oom(p);
    (*out)->lit = v;
    p->pos++;
    return DSC_OK;
}

static dsc_status name_primary(parser *p, jexpr **out) {
    const jtok *t = cur(p);
    static const char *lits[] = {"true", "True", "false", "False", "none", "None"};
    for (int k = 0; k < 6; k++)
        if (is_name(p, lits[k])) return literal(p, k < 4 ? dsc__jv_bool(k < 2) : dsc__jv_none, out);
    jexpr *e = new_expr(p, E_NAME);
    if (!e || !(e->name = name_copy(p, t))) return oom(p);
    p->pos++;
    *out = e;
    return DSC_OK;
}

static dsc_status primary(parser *p, jexpr **out) {
    const jtok *t = cur(p);
    if (t->kind == T_NAME) return name_primary(p, out);
    if (t->kind == T_INT) return literal(p, dsc__jv_int(t->i), out);
    if (t->kind == T_FLOAT) return literal(p, dsc__jv_float(t->f), out);
    if (t->kind == T_STRING) { // adjacent strings are one
        jbuf b = {0};
        for (; cur(p)->kind == T_STRING; p->pos++) dsc__jbuf_add(&b, cur(p)->s, cur(p)->n);
        jv v = dsc__jv_str(&p->t->arena, b.s ? b.s : "", b.n);
        free(b.s);
        if (b.oom || v.kind != JV_STR) return oom(p);
        p->pos--;
        return literal(p, v, out);
    }
    bool paren = is_op(p, "("), list = is_op(p, "["), dict = is_op(p, "{");
    if (!paren && !list && !dict) return unexpected(p, "a value");
    p->pos++;
    if (paren && !is_op(p, ")")) { // (x) or a tuple (x, y)
        DSC_TRY(expr(p, true, out));
        if (is_op(p, ")")) return p->pos++, DSC_OK;
        jexpr *e = new_expr(p, E_LIST);
        int cap = 0;
        if (!e) return oom(p);
        e->negate = true; // a tuple
        DSC_TRY(add_item(p, e, *out, &cap));
        if (!is_op(p, ",")) return unexpected(p, "',' or ')'");
        DSC_TRY(sequence(p, ")", false, e)); // the rest, from the comma
        *out = e;
        return DSC_OK;
    }
    jexpr *e = new_expr(p, dict ? E_DICT : E_LIST);
    if (!e) return oom(p);
    e->negate = paren; // () is the empty tuple
    DSC_TRY(sequence(p, paren ? ")" : list ? "]" : "}", dict, e));
    *out = e;
    return DSC_OK;
}

// [b], [b:c], [b:c:d] after the "[".
static dsc_status subscript(parser *p, jexpr *obj, jexpr **out) {
    jexpr *part[3] = {NULL, NULL, NULL};
    int k = 0;
    for (;;) {
        if (!is_op(p, ":") && !is_op(p, "]")) DSC_TRY(expr(p, true, &part[k]));
        if (is_op(p, "]")) break;
        if (k == 2) return unexpected(p, "']'");
        DSC_TRY(expect_op(p, ":"));
        k++;
    }
    p->pos++;
    jexpr *e = new_expr(p, k ? E_SLICE : E_ITEM);
    if (!e) return oom(p);
    if (!k && !part[0]) return fail(p, "an empty subscript []", NULL);
    e->a = obj, e->b = part[0], e->c = part[1], e->d = part[2];
    *out = e;
    return DSC_OK;
}

static dsc_status note_call(parser *p, jexpr *callee) {
    if (callee->kind == E_ATTR) {
        if (dsc__jinja_has_method(callee->name)) return DSC_OK;
        return dsc__fail(DSC_ERR_CONFIG, "%s: line %d: the method .%s() is not supported" SUBSET,
                         p->t->name, callee->line, callee->name);
    }
    if (callee->kind != E_NAME)
        return dsc__fail(DSC_ERR_CONFIG, "%s: line %d: only functions, macros and methods can be "
                         "called", p->t->name, callee->line);
    if (!grow(p, (void **)&p->calls, p->ncalls, &p->cap_calls, sizeof *p->calls)) return oom(p);
    if (!grow(p, (void **)&p->call_lines, p->ncalls, &p->cap_lines, sizeof *p->call_lines))
        return oom(p);
    p->calls[p->ncalls] = callee->name;
    p->call_lines[p->ncalls++] = callee->line;
    return DSC_OK;
}

static dsc_status postfix(parser *p, jexpr **node) {
    for (;;) {
        jexpr *e = NULL;
        if (is_op(p, ".")) {
            p->pos++;
            const jtok *t = cur(p);
            if (t->kind == T_INT) { // a.0 is a[0]
                jexpr *idx;
                DSC_TRY(literal(p, dsc__jv_int(t->i), &idx));
                if (!(e = new_expr(p, E_ITEM))) return oom(p);
                e->a = *node, e->b = idx;
            } else {
                if (t->kind != T_NAME) return unexpected(p, "an attribute name");
                if (!(e = new_expr(p, E_ATTR)) || !(e->name = name_copy(p, t))) return oom(p);
                e->a = *node;
                p->pos++;
            }
        } else if (is_op(p, "[")) {
            p->pos++;
            DSC_TRY(subscript(p, *node, &e));
        } else if (is_op(p, "(")) {
            DSC_TRY(note_call(p, *node));
            if (!(e = new_expr(p, E_CALL))) return oom(p);
            e->a = *node;
            DSC_TRY(call_args(p, e));
        } else {
            return DSC_OK;
        }
        *node = e;
    }
}

// x is [not] name, x is name(args), x is name arg.
static dsc_status test(parser *p, jexpr **node) {
    jexpr *e = new_expr(p, E_TEST);
    if (!e) return oom(p);
    p->pos++;
    if (is_name(p, "not")) e->negate = true, p->pos++;
    if (cur(p)->kind != T_NAME) return unexpected(p, "a test name");
    if (!(e->name = name_copy(p, cur(p)))) return oom(p);
    if (!dsc__jinja_has_test(e->name))
        return dsc__fail(DSC_ERR_CONFIG, "%s: line %d: the test 'is %s' is not supported" SUBSET,
                         p->t->name, e->line, e->name);
    p->pos++;
    e->a = *node;
    const jtok *t = cur(p);
    if (is_op(p, "(")) {
        DSC_TRY(call_args(p, e));
    } else if ((t->kind == T_NAME || t->kind == T_STRING || t->kind == T_INT ||
                t->kind == T_FLOAT || is_op(p, "[") || is_op(p, "{")) &&
               !is_name(p, "else") && !is_name(p, "or") && !is_name(p, "and") &&
               !is_name(p, "if") && !is_name(p, "is")) {
        jexpr *arg;
        int cap = 0;
        DSC_TRY(primary(p, &arg));
        DSC_TRY(postfix(p, &arg));
        DSC_TRY(add_item(p, e, arg, &cap));
        if (!(e->kw = dsc__jarena_alloc(&p->t->arena, sizeof *e->kw))) return oom(p);
    }
    *node = e;
    return DSC_OK;
}

static dsc_status filters(parser *p, jexpr **node) {
    for (;;) {
        if (is_name(p, "is")) {
            DSC_TRY(test(p, node));
            continue;
        }
        if (!is_op(p, "|")) return DSC_OK;
        p->pos++;
        if (cur(p)->kind != T_NAME) return unexpected(p, "a filter name");
        jexpr *e = new_expr(p, E_FILTER);
        if (!e || !(e->name = name_copy(p, cur(p)))) return oom(p);
        if (!dsc__jinja_has_filter(e->name))
            return dsc__fail(DSC_ERR_CONFIG,
                             "%s: line %d: the filter '| %s' is not supported" SUBSET,
                             p->t->name, e->line, e->name);
        p->pos++;
        e->a = *node;
        if (is_op(p, "(")) DSC_TRY(call_args(p, e));
        *node = e;
        DSC_TRY(postfix(p, node));
    }
}

static dsc_status unary(parser *p, bool with_filters, jexpr **out) {
    if (is_op(p, "-") || is_op(p, "+")) {
        jexpr *e = new_expr(p, is_op(p, "-") ? E_NEG : E_POS);
        if (!e) return oom(p);
        p->pos++;
        DSC_TRY(unary(p, false, &e->a));
        *out = e;
    } else {
        DSC_TRY(primary(p, out));
    }
    DSC_TRY(postfix(p, out));
    return with_filters ? filters(p, out) : DSC_OK;
}

static dsc_status power(parser *p, jexpr **out) {
    DSC_TRY(unary(p, true, out));
    while (is_op(p, "**")) {
        p->pos++;
        jexpr *b;
        DSC_TRY(unary(p, true, &b));
        DSC_TRY(bin(p, E_BIN, "**", *out, b, out));
    }
    return DSC_OK;
}

// Left-associative levels: * / // %, then ~, then + -.
static dsc_status level(parser *p, int lvl, jexpr **out) {
    static const char *ops[3][4] = {{"*", "/", "//", "%"}, {"~", NULL, NULL, NULL},
                                    {"+", "-", NULL, NULL}};
    DSC_TRY(lvl == 0 ? power(p, out) : level(p, lvl - 1, out));
    for (;;) {
        const char *op = NULL;
        for (int k = 0; k < 4 && ops[lvl][k]; k++)
            if (is_op(p, ops[lvl][k])) op = ops[lvl][k];
        if (!op) return DSC_OK;
        p->pos++;
        jexpr *b;
        DSC_TRY(lvl == 0 ? power(p, &b) : level(p, lvl - 1, &b));
        DSC_TRY(bin(p, E_BIN, op, *out, b, out));
    }
}

static dsc_status compare(parser *p, jexpr **out) {
    static const char *ops[] = {"==", "!=", "<=", ">=", "<", ">"};
    DSC_TRY(level(p, 2, out));
    for (;;) {
        const char *op = NULL;
        for (int k = 0; k < 6; k++)
            if (is_op(p, ops[k])) op = ops[k];
        if (!op && is_name(p, "in")) op = "in";
        if (!op && is_name(p, "not") && p->tok[p->pos + 1].kind == T_NAME &&
            p->tok[p->pos + 1].n == 2 && !strncmp(p->tok[p->pos + 1].s, "in", 2))
            op = "notin", p->pos++;
        if (!op) return DSC_OK;
        p->pos++;
        jexpr *b;
        DSC_TRY(level(p, 2, &b));
        DSC_TRY(bin(p, E_BIN, op, *out, b, out));
    }
}

static dsc_status not_expr(parser *p, jexpr **out) {
    if (!is_name(p, "not")) return compare(p, out);
    jexpr *e = new_expr(p, E_NOT);
    if (!e) return oom(p);
    p->pos++;
    DSC_TRY(not_expr(p, &e->a));
    *out = e;
    return DSC_OK;
}

static dsc_status and_or(parser *p, bool is_or, jexpr **out) {
    DSC_TRY(is_or ? and_or(p, false, out) : not_expr(p, out));
    while (is_name(p, is_or ? "or" : "and")) {
        p->pos++;
        jexpr *b;
        DSC_TRY(is_or ? and_or(p, false, &b) : not_expr(p, &b));
        DSC_TRY(bin(p, is_or ? E_OR : E_AND, NULL, *out, b, out));
    }
    return DSC_OK;
}

// An expression; cond: with `x if c else y` (not where `if` filters a for loop).
static dsc_status expr(parser *p, bool cond, jexpr **out) {
    DSC_TRY(and_or(p, true, out));
    while (cond && is_name(p, "if")) {
        jexpr *e = new_expr(p, E_COND);
        if (!e) return oom(p);
        p->pos++;
        e->b = *out;
        DSC_TRY(and_or(p, true, &e->a));
        if (is_name(p, "else")) {
            p->pos++;
            DSC_TRY(expr(p, true, &e->c));
        }
        *out = e;
    }
    return DSC_OK;
}

// ---- statements ----

typedef struct body {
    jnode **v;
    int n, cap;
} body;

static dsc_status block(parser *p, body *b, const char *const *stops, const char **stopped);

static dsc_status push_node(parser *p, body *b, jnode *s) {
    if (!s) return oom(p);
    if (!grow(p, (void **)&b->v, b->n, &b->cap, sizeof *b->v)) return oom(p);
    b->v[b->n++] = s;
    return DSC_OK;
}

static dsc_status names(parser *p, jnode *s, bool tuple_ok) {
    int cap = 0;
    do {
        if (s->nnames) p->pos++; // the comma
        if (cur(p)->kind != T_NAME) return unexpected(p, "a name");
        if (!grow(p, (void **)&s->names, s->nnames, &cap, sizeof *s->names)) return oom(p);
        if (!(s->names[s->nnames++] = name_copy(p, cur(p)))) return oom(p);
        p->pos++;
    } while (tuple_ok && is_op(p, ","));
    return DSC_OK;
}

// The body up to one of stops (after which the end tag's name is consumed).
static dsc_status sub(parser *p, jnode ***v, int *n, const char *const *stops,
                      const char **stopped) {
    body b = {0};
    DSC_TRY(block(p, &b, stops, stopped));
    *v = b.v;
    *n = b.n;
    return DSC_OK;
}

static dsc_status stmt_for(parser *p, jnode *s) {
    static const char *const stops[] = {"endfor", "else", NULL};
    static const char *const end[] = {"endfor", NULL};
    DSC_TRY(names(p, s, true));
    if (!is_name(p, "in")) return unexpected(p, "'in'");
    p->pos++;
    DSC_TRY(expr(p, false, &s->e));
    if (is_name(p, "if")) {
        p->pos++;
        DSC_TRY(expr(p, false, &s->cond));
    }
    if (is_name(p, "recursive"))
        return fail(p, "recursive for loops are not supported" SUBSET, NULL);
    DSC_TRY(expect_end(p));
    const char *stopped;
    DSC_TRY(sub(p, &s->body, &s->nbody, stops, &stopped));
    if (!strcmp(stopped, "else")) DSC_TRY(sub(p, &s->els, &s->nels, end, &stopped));
    return DSC_OK;
}

static dsc_status stmt_if(parser *p, jnode *s) {
    static const char *const stops[] = {"endif", "elif", "else", NULL};
    static const char *const end[] = {"endif", NULL};
    DSC_TRY(expr(p, true, &s->e));
    DSC_TRY(expect_end(p));
    const char *stopped;
    DSC_TRY(sub(p, &s->body, &s->nbody, stops, &stopped));
    if (!strcmp(stopped, "else")) return sub(p, &s->els, &s->nels, end, &stopped);
    if (strcmp(stopped, "elif")) return DSC_OK;
    jnode *e = new_node(p, S_IF); // elif: an if in the else branch, which ends with this endif
    body b = {0};
    DSC_TRY(push_node(p, &b, e));
    s->els = b.v, s->nels = b.n;
    return stmt_if(p, e);
}

static dsc_status stmt_set(parser *p, jnode *s) {
    static const char *const end[] = {"endset", NULL};
    DSC_TRY(names(p, s, true));
    if (s->nnames == 1 && is_op(p, ".")) { // ns.attr
        p->pos++;
        if (cur(p)->kind != T_NAME) return unexpected(p, "an attribute name");
        if (!(s->attr = name_copy(p, cur(p)))) return oom(p);
        p->pos++;
    }
    if (cur(p)->kind == T_BLOCK_END && s->nnames == 1 && !s->attr) {
        s->kind = S_BLOCK_SET;
        p->pos++;
        const char *stopped;
        return sub(p, &s->body, &s->nbody, end, &stopped);
    }
    if (is_op(p, "|"))
        return fail(p, "a filtered block {% set x | filter %} is not supported" SUBSET, NULL);
    DSC_TRY(expect_op(p, "="));
    DSC_TRY(expr(p, true, &s->e));
    if (is_op(p, ",")) { // set a = x, y: a tuple
        jexpr *e = new_expr(p, E_LIST);
        int cap = 0;
        if (!e) return oom(p);
        e->negate = true;
        DSC_TRY(add_item(p, e, s->e, &cap));
        while (is_op(p, ",")) {
            p->pos++;
            jexpr *x;
            DSC_TRY(expr(p, true, &x));
            DSC_TRY(add_item(p, e, x, &cap));
        }
        s->e = e;
    }
    return expect_end(p);
}

static dsc_status stmt_macro(parser *p, jnode *s) {
    static const char *const end[] = {"endmacro", NULL};
    DSC_TRY(names(p, s, false));
    DSC_TRY(expect_op(p, "("));
    int cap = s->nnames, capd = 0, nd = 0;
    while (!is_op(p, ")")) {
        if (s->nnames > 1) DSC_TRY(expect_op(p, ","));
        if (cur(p)->kind != T_NAME) return unexpected(p, "a parameter name");
        if (!grow(p, (void **)&s->names, s->nnames, &cap, sizeof *s->names) ||
            !grow(p, (void **)&s->defaults, nd, &capd, sizeof *s->defaults))
            return oom(p);
        if (!(s->names[s->nnames++] = name_copy(p, cur(p)))) return oom(p);
        p->pos++;
        s->defaults[nd] = NULL;
        if (is_op(p, "=")) {
            p->pos++;
            DSC_TRY(expr(p, true, &s->defaults[nd]));
        }
        nd++;
    }
    p->pos++;
    DSC_TRY(expect_end(p));
    if (!grow(p, (void **)&p->macros, p->nmacros, &p->cap_macros, sizeof *p->macros)) return oom(p);
    p->macros[p->nmacros++] = s->names[0];
    const char *stopped;
    return sub(p, &s->body, &s->nbody, end, &stopped);
}

static dsc_status statement(parser *p, body *b) {
    const jtok *t = cur(p);
    if (t->kind != T_NAME) return unexpected(p, "a statement name");
    char word[32];
    snprintf(word, sizeof word, "%.*s", (int)(t->n < 31 ? t->n : 31), t->s);
    static const char *const gen_end[] = {"endgeneration", NULL};
    jnode *s = new_node(p, S_TEXT);
    if (!s) return oom(p);
    p->pos++;
    const char *stopped;
    if (!strcmp(word, "for")) s->kind = S_FOR;
    else if (!strcmp(word, "if")) s->kind = S_IF;
    else if (!strcmp(word, "set")) s->kind = S_SET;
    else if (!strcmp(word, "macro")) s->kind = S_MACRO;
    else if (!strcmp(word, "break")) s->kind = S_BREAK;
    else if (!strcmp(word, "continue")) s->kind = S_CONTINUE;
    else if (!strcmp(word, "generation")) s->kind = S_BODY;
    else {
        p->pos--;
        return dsc__fail(DSC_ERR_CONFIG,
                         "%s: line %d: the statement {%% %s %%} is not supported" SUBSET,
                         p->t->name, t->line, word);
    }
    switch (s->kind) {
    case S_FOR: DSC_TRY(stmt_for(p, s)); break;
    case S_IF: DSC_TRY(stmt_if(p, s)); break;
    case S_SET: DSC_TRY(stmt_set(p, s)); break;
    case S_MACRO: DSC_TRY(stmt_macro(p, s)); break;
    case S_BODY:
        DSC_TRY(expect_end(p));
        DSC_TRY(sub(p, &s->body, &s->nbody, gen_end, &stopped));
        break;
    default: DSC_TRY(expect_end(p)); break;
    }
    return push_node(p, b, s);
}

static int stop_index(const parser *p, const char *const *stops) {
    for (int k = 0; stops && stops[k]; k++)
        if (is_name(p, stops[k])) return k;
    return -1;
}

// Items up to {% STOP %} (one of stops; NULL: the end of the template).
static dsc_status block(parser *p, body *b, const char *const *stops, const char **stopped) {
    int line = cur(p)->line;
    for (;;) {
        const jtok *t = cur(p);
        if (t->kind == T_EOF) {
            if (!stops) return DSC_OK;
            return dsc__fail(DSC_ERR_CONFIG, "%s: line %d: the block opened here is not closed "
                             "with {%% %s %%}", p->t->name, line, stops[0]);
        }
        if (t->kind == T_TEXT) {
            jnode *s = new_node(p, S_TEXT);
            if (s) s->text = t->s, s->n = t->n;
            p->pos++;
            DSC_TRY(push_node(p, b, s));
        } else if (t->kind == T_VAR_BEGIN) {
            p->pos++;
            jnode *s = new_node(p, S_OUT);
            if (!s) return oom(p);
            DSC_TRY(expr(p, true, &s->e));
            if (cur(p)->kind != T_VAR_END) return unexpected(p, "'}}'");
            p->pos++;
            DSC_TRY(push_node(p, b, s));
        } else if (t->kind == T_BLOCK_BEGIN) {
            p->pos++;
            int k = stop_index(p, stops);
            if (k >= 0) {
                *stopped = stops[k];
                p->pos++;
                if (!strncmp(stops[k], "end", 3) && cur(p)->kind == T_NAME) p->pos++; // endmacro m
                return strncmp(stops[k], "el", 2) || !strcmp(stops[k], "else") ? expect_end(p)
                                                                               : DSC_OK;
            }
            if (cur(p)->kind == T_NAME && cur(p)->n > 3 && !strncmp(cur(p)->s, "end", 3))
                return unexpected(p, stops ? stops[0] : "a statement");
            DSC_TRY(statement(p, b));
        } else {
            return unexpected(p, "text or a tag");
        }
    }
}

// Every function called is a global or a macro of the template.
static dsc_status check_calls(parser *p) {
    for (int i = 0; i < p->ncalls; i++) {
        bool ok = dsc__jinja_global(p->calls[i]) >= 0;
        for (int k = 0; !ok && k < p->nmacros; k++) ok = !strcmp(p->macros[k], p->calls[i]);
        if (!ok)
            return dsc__fail(DSC_ERR_CONFIG, "%s: line %d: the function %s() is not supported "
                             "(functions: raise_exception, namespace, range, dict, "
                             "strftime_now, and the template's macros)", p->t->name,
                             p->call_lines[i], p->calls[i]);
    }
    return DSC_OK;
}

// ---- internal API ----

dsc_status dsc__jinja_parse(struct dsc_jinja *t, const jtok *tok, int ntok) {
    parser p = {.t = t, .tok = tok, .n = ntok};
    body b = {0};
    DSC_TRY(block(&p, &b, NULL, NULL));
    DSC_TRY(check_calls(&p));
    t->body = b.v;
    t->nbody = b.n;
    return DSC_OK;
}
