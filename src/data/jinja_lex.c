// data/jinja_lex.c - a Jinja template -> tokens, with the whitespace control Hugging Face renders
// chat templates with: trim_blocks (the newline after a block or comment tag goes), lstrip_blocks
// (spaces and tabs between a line's start and a block or comment tag go), the "-" markers (all
// white space on that side goes) and "+" markers (no lstrip / trim there). As jinja2 does by
// default, line ends become "\n" and one newline at the very end of the template is dropped.
#include "data/jinja_impl.h"

#include <ctype.h>  // isalnum, isalpha, isdigit
#include <stdio.h>  // snprintf
#include <stdlib.h> // realloc, free, strtod
#include <string.h> // memcpy, strchr, strlen, strncmp

#include "base/status.h" // dsc__fail

typedef struct lexer {
    jarena *a;
    const char *name;
    const char *s; // the normalised template
    size_t n, pos;
    int line;
    jtok *v;
    int nv, cap;
    const char *text; // pending text [text, text + ntext)
    size_t ntext;
} lexer;

static dsc_status lex_fail(lexer *x, const char *what) {
    return dsc__fail(DSC_ERR_CONFIG, "%s: line %d: %s", x->name, x->line, what);
}

static dsc_status push(lexer *x, jtok t) {
    if (x->nv == x->cap) {
        int cap = x->cap ? 2 * x->cap : 256;
        jtok *v = realloc(x->v, (size_t)cap * sizeof *v);
        if (!v) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", x->name);
        x->v = v;
        x->cap = cap;
    }
    x->v[x->nv++] = t;
    return DSC_OK;
}

static dsc_status flush_text(lexer *x, int line) {
    if (x->ntext == 0) return DSC_OK;
    dsc_status st = push(x, (jtok){.kind = T_TEXT, .line = line, .s = x->text, .n = x->ntext});
    x->ntext = 0;
    return st;
}

// Line ends as "\n", one trailing newline dropped (jinja2's keep_trailing_newline=False).
static char *normalise(jarena *a, const char *src, size_t *n) {
    size_t len = strlen(src), k = 0;
    char *d = dsc__jarena_alloc(a, len + 1);
    if (!d) return NULL;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            d[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            d[k++] = src[i];
        }
    }
    if (k && d[k - 1] == '\n') k--;
    d[k] = '\0';
    *n = k;
    return d;
}

// The next tag's start at or after from: "{{", "{%" or "{#"; n when none.
static size_t next_tag(const lexer *x, size_t from) {
    for (size_t i = from; i + 1 < x->n; i++)
        if (x->s[i] == '{' && (x->s[i + 1] == '{' || x->s[i + 1] == '%' || x->s[i + 1] == '#'))
            return i;
    return x->n;
}

// lstrip_blocks: spaces and tabs from the line's start up to a block tag at `at` are dropped.
static void lstrip(lexer *x, size_t at) {
    size_t k = at;
    while (k > 0 && (x->s[k - 1] == ' ' || x->s[k - 1] == '\t' || x->s[k - 1] == '\v' ||
                     x->s[k - 1] == '\f'))
        k--;
    if (k > 0 && x->s[k - 1] != '\n') return;
    size_t start = (size_t)(x->text - x->s);
    if (k < start) k = start;
    x->ntext = k - start;
}

// After a tag's end: "-" eats all white space, trim (block, comment) one newline.
static void after_tag(lexer *x, bool dash, bool trim) {
    if (dash) {
        size_t w = dsc__ws_prefix(x->s + x->pos, x->n - x->pos);
        for (size_t i = 0; i < w; i++) x->line += x->s[x->pos + i] == '\n';
        x->pos += w;
    } else if (trim && x->pos < x->n && x->s[x->pos] == '\n') {
        x->pos++;
        x->line++;
    }
}

// The text before a tag (at x->pos, kind c) with the tag's left marker applied.
static dsc_status begin_tag(lexer *x, char c) {
    size_t at = x->pos;
    char mark = at + 2 < x->n ? x->s[at + 2] : 0;
    if (mark == '-')
        x->ntext -= dsc__ws_suffix(x->text, x->ntext);
    else if (mark != '+' && c != '{')
        lstrip(x, at);
    int line = x->line;
    DSC_TRY(flush_text(x, line));
    x->pos = at + 2 + (mark == '-' || mark == '+');
    return DSC_OK;
}

static dsc_status comment(lexer *x) {
    DSC_TRY(begin_tag(x, '#'));
    for (size_t i = x->pos; i + 1 < x->n; i++) {
        if (x->s[i] == '\n') x->line++;
        if (x->s[i] == '#' && x->s[i + 1] == '}') {
            bool dash = i > x->pos && x->s[i - 1] == '-', plus = i > x->pos && x->s[i - 1] == '+';
            x->pos = i + 2;
            after_tag(x, dash, !plus);
            return DSC_OK;
        }
    }
    return lex_fail(x, "a {# comment #} is not closed");
}

// ---- inside a tag ----

static int hexval(char c) {
    return isdigit((unsigned char)c) ? c - '0'
           : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10
                                                : -1;
}

static void put_utf8(jbuf *b, unsigned cp) {
    char u[4];
    size_t n;
    if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63)), n = 2;
    else if (cp < 0x10000)
        u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63)),
        u[2] = (char)(0x80 | (cp & 63)), n = 3;
    else
        u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63)),
        u[2] = (char)(0x80 | (cp >> 6 & 63)), u[3] = (char)(0x80 | (cp & 63)), n = 4;
    dsc__jbuf_add(b, u, n);
}

// One escape after a backslash at s[*i] (Python's unicode-escape); unknown ones stay as written.
static void unescape(const char *s, size_t n, size_t *i, jbuf *b) {
    static const char from[] = "ntr\\'\"abfv0", to[] = "\n\t\r\\'\"\a\b\f\v";
    char c = s[*i];
    const char *k = c ? strchr(from, c) : NULL;
    if (k && c != '0') {
        dsc__jbuf_add(b, &to[k - from], 1);
        (*i)++;
        return;
    }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    unsigned cp = 0;
    bool ok = digits && *i + (size_t)digits < n;
    for (int d = 1; ok && d <= digits; d++) {
        int h = hexval(s[*i + (size_t)d]);
        ok = h >= 0;
        cp = cp * 16 + (unsigned)(h < 0 ? 0 : h);
    }
    if (ok) {
        put_utf8(b, cp);
        *i += (size_t)digits + 1;
    } else if (c >= '0' && c <= '7') { // octal, up to three digits
        for (int d = 0; d < 3 && *i < n && s[*i] >= '0' && s[*i] <= '7'; d++)
            cp = cp * 8 + (unsigned)(s[(*i)++] - '0');
        put_utf8(b, cp);
    } else {
        dsc__jbuf_add(b, "\\", 1);
    }
}

static dsc_status string_lit(lexer *x, jtok *t) {
    char q = x->s[x->pos];
    jbuf b = {0};
    size_t i = x->pos + 1;
    while (i < x->n && x->s[i] != q) {
        if (x->s[i] == '\\' && i + 1 < x->n) {
            i++;
            unescape(x->s, x->n, &i, &b);
            continue;
        }
        x->line += x->s[i] == '\n';
        dsc__jbuf_add(&b, &x->s[i++], 1);
    }
    if (i >= x->n) {
        free(b.s);
        return lex_fail(x, "a string is not closed");
    }
    x->pos = i + 1;
    jv v = dsc__jv_str(x->a, b.s ? b.s : "", b.n);
    free(b.s);
    if (b.oom || v.kind != JV_STR) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", x->name);
    t->kind = T_STRING;
    t->s = v.u.s->c;
    t->n = v.u.s->n;
    return DSC_OK;
}

static void number(lexer *x, jtok *t) {
    const char *s = x->s;
    size_t i = x->pos;
    while (i < x->n && (isdigit((unsigned char)s[i]) || s[i] == '_')) i++;
    bool flt = false;
    if (i + 1 < x->n && s[i] == '.' && isdigit((unsigned char)s[i + 1])) {
        flt = true;
        for (i++; i < x->n && (isdigit((unsigned char)s[i]) || s[i] == '_');) i++;
    }
    if (i + 1 < x->n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1 + (s[i + 1] == '+' || s[i + 1] == '-');
        if (j < x->n && isdigit((unsigned char)s[j])) {
            flt = true;
            for (i = j; i < x->n && isdigit((unsigned char)s[i]);) i++;
        }
    }
    char buf[64];
    size_t k = 0;
    for (size_t p = x->pos; p < i && k + 1 < sizeof buf; p++)
        if (s[p] != '_') buf[k++] = s[p];
    buf[k] = '\0';
    t->kind = flt ? T_FLOAT : T_INT;
    t->f = strtod(buf, NULL);
    t->i = flt ? 0 : strtoll(buf, NULL, 10);
    x->pos = i;
}

static bool op(lexer *x, jtok *t) {
    static const char *ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%",
                                "~",  "<",  ">",  "=",  "(",  ")",  "[", "]", "{", "}", ",",
                                ".",  ":",  "|"};
    for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
        size_t n = strlen(ops[k]);
        if (x->pos + n <= x->n && !strncmp(x->s + x->pos, ops[k], n)) {
            t->kind = T_OP;
            t->s = ops[k];
            t->n = n;
            x->pos += n;
            return true;
        }
    }
    return false;
}

// Whether the tag ends at x->pos: "}}" / "%}", optionally after "-" (or "+" for a block).
static bool tag_end(lexer *x, char c, bool *dash, bool *plus) {
    const char *end = c == '{' ? "}}" : "%}";
    const char *p = x->s + x->pos;
    size_t left = x->n - x->pos;
    *dash = *plus = false;
    if (left >= 3 && (p[0] == '-' || (p[0] == '+' && c == '%')) && !strncmp(p + 1, end, 2)) {
        *dash = p[0] == '-';
        *plus = p[0] == '+';
        x->pos += 3;
        return true;
    }
    if (left >= 2 && !strncmp(p, end, 2)) {
        x->pos += 2;
        return true;
    }
    return false;
}

static dsc_status tag(lexer *x, char c) {
    bool dash, plus;
    DSC_TRY(begin_tag(x, c));
    DSC_TRY(push(x, (jtok){.kind = c == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, .line = x->line}));
    int depth = 0; // open brackets: "}}" inside {'a': {'b': 1}} does not end the tag
    for (;;) {
        while (x->pos < x->n && isspace((unsigned char)x->s[x->pos]))
            x->line += x->s[x->pos++] == '\n';
        if (x->pos >= x->n)
            return lex_fail(x, c == '{' ? "a {{ is not closed" : "a {% is not closed");
        if (depth == 0 && tag_end(x, c, &dash, &plus)) break;
        jtok t = {.line = x->line};
        char ch = x->s[x->pos];
        if (ch == '\'' || ch == '"') {
            DSC_TRY(string_lit(x, &t));
        } else if (isdigit((unsigned char)ch)) {
            number(x, &t);
        } else if (isalpha((unsigned char)ch) || ch == '_') {
            size_t i = x->pos;
            while (i < x->n && (isalnum((unsigned char)x->s[i]) || x->s[i] == '_')) i++;
            t = (jtok){.kind = T_NAME, .line = x->line, .s = x->s + x->pos, .n = i - x->pos};
            x->pos = i;
        } else if (!op(x, &t)) {
            char what[64];
            snprintf(what, sizeof what, "unexpected character '%c' in a tag", ch);
            return lex_fail(x, what);
        }
        if (t.kind == T_OP && t.n == 1 && strchr("([{", t.s[0])) depth++;
        if (t.kind == T_OP && t.n == 1 && strchr(")]}", t.s[0]) && depth > 0) depth--;
        DSC_TRY(push(x, t));
    }
    DSC_TRY(push(x, (jtok){.kind = c == '{' ? T_VAR_END : T_BLOCK_END, .line = x->line}));
    after_tag(x, dash, c == '%' && !plus);
    x->text = x->s + x->pos;
    return DSC_OK;
}

// ---- internal API ----

dsc_status dsc__jinja_lex(jarena *a, const char *src, const char *name, jtok **out, int *n) {
    lexer x = {.a = a, .name = name, .line = 1};
    if (!(x.s = normalise(a, src, &x.n))) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", name);
    dsc_status st = DSC_OK;
    while (st == DSC_OK && x.pos < x.n) {
        size_t at = next_tag(&x, x.pos);
        if (x.ntext == 0) x.text = x.s + x.pos;
        for (size_t i = x.pos; i < at; i++) x.line += x.s[i] == '\n';
        x.ntext = (size_t)(x.s + at - x.text);
        x.pos = at;
        if (at == x.n) break;
        char c = x.s[at + 1];
        st = c == '#' ? comment(&x) : tag(&x, c);
        if (st == DSC_OK) x.text = x.s + x.pos, x.ntext = 0;
    }
    if (st == DSC_OK) st = flush_text(&x, x.line);
    if (st == DSC_OK) st = push(&x, (jtok){.kind = T_EOF, .line = x.line});
    if (st != DSC_OK) {
        free(x.v);
        return st;
    }
    *out = x.v;
    *n = x.nv;
    return DSC_OK;
}
