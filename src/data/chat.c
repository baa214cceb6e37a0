// data/chat.c - recognising simple Jinja chat templates (see chat.h for the accepted shape) and
// rendering the text around each message.
#include "data/chat.h"

#include <ctype.h>    // isalnum, isspace
#include <errno.h>    // errno
#include <jansson.h>  // json_*
#include <stdbool.h>  // bool
#include <stdio.h>    // FILE, fopen, fread, snprintf
#include <stdlib.h>   // calloc, free, malloc, realloc
#include <string.h>   // memcpy, strcmp, strerror, strlen, strncmp
#include <sys/stat.h> // stat, S_ISDIR

#include "base/io.h"     // dsc__fopen_regular
#include "base/status.h" // dsc__fail, DSC_TRY

enum { P_TEXT, P_ROLE, P_CONTENT }; // parts of a message's rendering

typedef struct part {
    int kind;
    char *text; // P_TEXT: the literal (NUL-terminated)
} part;

struct dsc_chat_template {
    char *begin, *end; // around the whole conversation
    part *parts;       // the loop body
    int nparts;
};

// ---- internal: growing strings ----

typedef struct str {
    char *s;
    size_t n, cap;
} str;

static bool str_add(str *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) return false;
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
    return true;
}

// ---- internal: lexing ----

enum { I_TEXT, I_EXPR, I_STMT, I_COMMENT };

typedef struct item {
    int kind;
    const char *s; // I_TEXT: the text; tags: the inside, without delimiters and "-" markers
    size_t n;
    bool dash_left, dash_right; // {%- and -%}
} item;

typedef struct lexed {
    const char *base; // the template
    item *v;
    int n, cap;
} lexed;

static bool lex_push(lexed *x, item it) {
    if (x->n == x->cap) {
        int cap = x->cap ? 2 * x->cap : 32;
        item *v = realloc(x->v, (size_t)cap * sizeof *v);
        if (!v) return false;
        x->v = v;
        x->cap = cap;
    }
    x->v[x->n++] = it;
    return true;
}

static const char *find(const char *s, const char *end, const char *what) {
    size_t w = strlen(what);
    for (const char *p = s; p + w <= end; p++)
        if (!memcmp(p, what, w)) return p;
    return NULL;
}

// Split the template into text and tags.
static dsc_status lex(const char *t, size_t len, lexed *x) {
    const char *p = t, *end = t + len;
    x->base = t;
    while (p < end) {
        const char *open = find(p, end, "{");
        while (open && open + 1 < end && open[1] != '{' && open[1] != '%' && open[1] != '#')
            open = find(open + 1, end, "{");
        if (!open || open + 1 >= end) open = end;
        if (open > p && !lex_push(x, (item){I_TEXT, p, (size_t)(open - p), false, false}))
            return dsc__fail(DSC_ERR_OOM, "chat template: out of memory");
        if (open == end) break;
        char c = open[1];
        const char *close = find(open + 2, end, c == '{' ? "}}" : c == '%' ? "%}" : "#}");
        if (!close) return dsc__fail(DSC_ERR_CONFIG, "chat template: unclosed {%c", c);
        item it = {c == '{' ? I_EXPR : c == '%' ? I_STMT : I_COMMENT, open + 2,
                   (size_t)(close - open - 2), false, false};
        if (it.n && it.s[0] == '-') it.dash_left = true, it.s++, it.n--;
        if (it.n && it.s[it.n - 1] == '-') it.dash_right = true, it.n--;
        while (it.n && isspace((unsigned char)it.s[0])) it.s++, it.n--;
        while (it.n && isspace((unsigned char)it.s[it.n - 1])) it.n--;
        if (!lex_push(x, it)) return dsc__fail(DSC_ERR_OOM, "chat template: out of memory");
        p = close + 2;
    }
    return DSC_OK;
}

// Hugging Face renders with trim_blocks and lstrip_blocks; "-" markers strip all whitespace.
static void apply_whitespace(lexed *x) {
    for (int i = 0; i < x->n; i++) {
        item *it = &x->v[i];
        if (it->kind == I_TEXT) continue;
        item *prev = i > 0 && x->v[i - 1].kind == I_TEXT ? &x->v[i - 1] : NULL;
        item *next = i + 1 < x->n && x->v[i + 1].kind == I_TEXT ? &x->v[i + 1] : NULL;
        bool block = it->kind != I_EXPR;
        if (prev && it->dash_left)
            while (prev->n && isspace((unsigned char)prev->s[prev->n - 1])) prev->n--;
        else if (prev && block) { // lstrip_blocks: spaces from the line's start to the tag
            size_t k = prev->n;
            while (k && (prev->s[k - 1] == ' ' || prev->s[k - 1] == '\t')) k--;
            bool line_start =
                k ? prev->s[k - 1] == '\n' : prev->s == x->base || prev->s[-1] == '\n';
            if (line_start) prev->n = k;
        }
        if (next && it->dash_right)
            while (next->n && isspace((unsigned char)next->s[0])) next->s++, next->n--;
        else if (next && block && next->n && next->s[0] == '\n') // trim_blocks
            next->s++, next->n--;
    }
}

// ---- internal: statements and expressions ----

// Whether the statement's words are exactly `want` (single spaces in want).
static bool stmt_is(const item *it, const char *want) {
    const char *s = it->s, *e = it->s + it->n;
    while (*want) {
        if (*want == ' ') {
            if (s == e || !isspace((unsigned char)*s)) return false;
            while (s < e && isspace((unsigned char)*s)) s++;
            want++;
        } else if (s == e || *s++ != *want++) {
            return false;
        }
    }
    return s == e;
}

typedef struct ctx {
    const char *bos, *eos;
    bool in_loop;
    str *out;   // outside the loop: the text rendered
    part *parts; // in the loop
    int nparts, cap;
} ctx;

static dsc_status add_part(ctx *c, int kind, const char *s, size_t n) {
    if (!c->in_loop) {
        if (kind != P_TEXT)
            return dsc__fail(DSC_ERR_CONFIG, "chat template: message used outside the loop");
        return str_add(c->out, s, n) ? DSC_OK : dsc__fail(DSC_ERR_OOM, "out of memory");
    }
    if (c->nparts == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        part *v = realloc(c->parts, (size_t)cap * sizeof *v);
        if (!v) return dsc__fail(DSC_ERR_OOM, "chat template: out of memory");
        c->parts = v;
        c->cap = cap;
    }
    part p = {kind, NULL};
    if (kind == P_TEXT) {
        if (!(p.text = malloc(n + 1))) return dsc__fail(DSC_ERR_OOM, "out of memory");
        memcpy(p.text, s, n);
        p.text[n] = '\0';
    }
    c->parts[c->nparts++] = p;
    return DSC_OK;
}

// A quoted string literal at *p (advanced past it), unescaped into b.
static dsc_status parse_string(const char **p, const char *e, str *b) {
    char q = *(*p)++;
    while (*p < e && **p != q) {
        char ch = *(*p)++;
        if (ch == '\\' && *p < e) {
            char x = *(*p)++;
            ch = x == 'n' ? '\n' : x == 't' ? '\t' : x == 'r' ? '\r' : x;
        }
        if (!str_add(b, &ch, 1)) return dsc__fail(DSC_ERR_OOM, "out of memory");
    }
    if (*p >= e) return dsc__fail(DSC_ERR_CONFIG, "chat template: unterminated string");
    (*p)++;
    return DSC_OK;
}

static bool word_at(const char *p, const char *e, const char *w) {
    size_t n = strlen(w);
    return (size_t)(e - p) >= n && !strncmp(p, w, n) &&
           (p + n == e || !(isalnum((unsigned char)p[n]) || p[n] == '_'));
}

// message['role'], message["content"], message.role, ... at *p: P_ROLE / P_CONTENT, or -1.
static int parse_field(const char **p, const char *e) {
    const char *s = *p + strlen("message");
    const char *names[2] = {"role", "content"};
    for (int k = 0; k < 2; k++) {
        char sq[16], dq[16], dot[16];
        snprintf(sq, sizeof sq, "['%s']", names[k]);
        snprintf(dq, sizeof dq, "[\"%s\"]", names[k]);
        snprintf(dot, sizeof dot, ".%s", names[k]);
        const char *forms[3] = {sq, dq, dot};
        for (int f = 0; f < 3; f++) {
            size_t m = strlen(forms[f]);
            if ((size_t)(e - s) >= m && !strncmp(s, forms[f], m) &&
                (f < 2 || s + m == e || !(isalnum((unsigned char)s[m]) || s[m] == '_'))) {
                *p = s + m;
                return k == 0 ? P_ROLE : P_CONTENT;
            }
        }
    }
    return -1;
}

// One term of a "+" chain at *p.
static dsc_status parse_term(ctx *c, const char **p, const char *e) {
    if (**p == '\'' || **p == '"') {
        str b = {0};
        dsc_status st = parse_string(p, e, &b);
        if (st == DSC_OK) st = add_part(c, P_TEXT, b.s ? b.s : "", b.n);
        free(b.s);
        return st;
    }
    const char *tok[2] = {"bos_token", "eos_token"}, *val[2] = {c->bos, c->eos};
    for (int k = 0; k < 2; k++)
        if (word_at(*p, e, tok[k])) {
            *p += strlen(tok[k]);
            return add_part(c, P_TEXT, val[k] ? val[k] : "", val[k] ? strlen(val[k]) : 0);
        }
    int kind = word_at(*p, e, "message") || !strncmp(*p, "message[", 8) ? parse_field(p, e) : -1;
    if (kind < 0)
        return dsc__fail(DSC_ERR_CONFIG, "chat template: expression {{ %.*s }} is not a string, "
                         "message role/content or bos/eos token", (int)(e - *p), *p);
    return add_part(c, kind, NULL, 0);
}

static dsc_status parse_expr(ctx *c, const item *it) {
    const char *p = it->s, *e = it->s + it->n;
    for (;;) {
        while (p < e && isspace((unsigned char)*p)) p++;
        if (p == e) return dsc__fail(DSC_ERR_CONFIG, "chat template: empty term in {{ %.*s }}",
                                     (int)it->n, it->s);
        DSC_TRY(parse_term(c, &p, e));
        while (p < e && isspace((unsigned char)*p)) p++;
        if (p == e) return DSC_OK;
        if (*p++ != '+')
            return dsc__fail(DSC_ERR_CONFIG, "chat template: {{ %.*s }} is more than a \"+\" "
                             "chain of strings and message fields", (int)it->n, it->s);
    }
}

// Items after {% if add_generation_prompt %}: skipped up to its {% endif %}.
static dsc_status skip_if(const lexed *x, int *i) {
    for ((*i)++; *i < x->n; (*i)++) {
        if (x->v[*i].kind != I_STMT) continue;
        if (stmt_is(&x->v[*i], "endif")) return DSC_OK;
        return dsc__fail(DSC_ERR_CONFIG, "chat template: {%% %.*s %%} inside the generation "
                         "prompt's if", (int)x->v[*i].n, x->v[*i].s);
    }
    return dsc__fail(DSC_ERR_CONFIG, "chat template: {%% if add_generation_prompt %%} without "
                     "{%% endif %%}");
}

// The structure of chat.h: text, one loop, optional generation-prompt ifs, text.
static dsc_status parse_items(ctx *c, const lexed *x, str *begin, str *end) {
    int loops = 0;
    c->out = begin;
    for (int i = 0; i < x->n; i++) {
        const item *it = &x->v[i];
        if (it->kind == I_COMMENT) continue;
        if (it->kind == I_TEXT) DSC_TRY(add_part(c, P_TEXT, it->s, it->n));
        else if (it->kind == I_EXPR) DSC_TRY(parse_expr(c, it));
        else if (!c->in_loop && loops == 0 && stmt_is(it, "for message in messages"))
            c->in_loop = true, loops++;
        else if (c->in_loop && stmt_is(it, "endfor")) c->in_loop = false, c->out = end;
        else if (!c->in_loop && stmt_is(it, "if add_generation_prompt")) DSC_TRY(skip_if(x, &i));
        else
            return dsc__fail(DSC_ERR_CONFIG, "chat template: {%% %.*s %%}%s is not supported",
                             (int)it->n, it->s, c->in_loop ? " inside the loop" : "");
    }
    if (loops != 1 || c->in_loop)
        return dsc__fail(DSC_ERR_CONFIG, "chat template: no complete {%% for message in "
                         "messages %%} ... {%% endfor %%} loop");
    int contents = 0;
    for (int k = 0; k < c->nparts; k++) contents += c->parts[k].kind == P_CONTENT;
    if (contents != 1)
        return dsc__fail(DSC_ERR_CONFIG, "chat template: the loop uses message content %d "
                         "times; exactly once is supported", contents);
    return DSC_OK;
}

// ---- internal: loading ----

static dsc_status slurp(const char *path, char **out) {
    FILE *f;
    if (dsc__fopen_regular(path, &f) != DSC_OK) {
        dsc__error_prefix("chat template: ");
        return DSC_ERR_IO;
    }
    str b = {0};
    char buf[4096];
    size_t n;
    bool ok = str_add(&b, "", 0);
    while (ok && (n = fread(buf, 1, sizeof buf, f)) > 0) ok = str_add(&b, buf, n);
    fclose(f);
    if (!ok) {
        free(b.s);
        return dsc__fail(DSC_ERR_OOM, "chat template %s: out of memory", path);
    }
    *out = b.s;
    return DSC_OK;
}

// A special token in tokenizer_config.json: a string, or an object with "content".
static const char *token_text(json_t *j, const char *key) {
    json_t *v = json_object_get(j, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_string_value(v);
}

// "chat_template": a string, or a list of {"name", "template"} (the one named "default").
static const char *template_text(json_t *j) {
    json_t *v = json_object_get(j, "chat_template");
    if (json_is_string(v)) return json_string_value(v);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && !strcmp(name, "default"))
            return json_string_value(json_object_get(e, "template"));
    }
    return NULL;
}

// Parse the template of a tokenizer_config.json; not recognised: ChatML and a note.
static dsc_status load_config(const char *path, dsc_chat_template **out, char *note, size_t cap) {
    json_error_t e;
    FILE *f;
    DSC_TRY(dsc__fopen_regular(path, &f));
    json_t *j = json_loadf(f, 0, &e);
    fclose(f);
    if (!j) return dsc__fail(DSC_ERR_CORRUPT, "%s: line %d: %s", path, e.line, e.text);
    const char *text = template_text(j);
    dsc_status st = DSC_OK;
    if (!text) st = dsc__fail(DSC_ERR_CORRUPT, "%s has no \"chat_template\" string; pass "
                              "--chat-template chatml or a template file", path);
    else if (dsc_chat_template_parse(text, token_text(j, "bos_token"), token_text(j, "eos_token"),
                                     out) == DSC_OK)
        snprintf(note, cap, "chat_template of %s", path);
    else {
        snprintf(note, cap, "chatml (default): the chat_template of %s is not a simple "
                 "role/content template (%s)", path, dsc_last_error());
        st = dsc_chat_template_chatml(out);
    }
    json_decref(j);
    return st;
}

// ---- public API ----

dsc_status dsc_chat_template_parse(const char *jinja, const char *bos, const char *eos,
                                   dsc_chat_template **out) {
    *out = NULL;
    lexed x = {0};
    str begin = {0}, end = {0};
    ctx c = {.bos = bos, .eos = eos};
    dsc_status st = lex(jinja, strlen(jinja), &x);
    if (st == DSC_OK) {
        apply_whitespace(&x);
        st = parse_items(&c, &x, &begin, &end);
    }
    dsc_chat_template *t = st == DSC_OK ? calloc(1, sizeof *t) : NULL;
    if (st == DSC_OK && (!t || !str_add(&begin, "", 0) || !str_add(&end, "", 0)))
        st = dsc__fail(DSC_ERR_OOM, "chat template: out of memory");
    free(x.v);
    if (st != DSC_OK) {
        for (int k = 0; k < c.nparts; k++) free(c.parts[k].text);
        free(c.parts);
        free(begin.s);
        free(end.s);
        free(t);
        return st;
    }
    *t = (dsc_chat_template){begin.s, end.s, c.parts, c.nparts};
    *out = t;
    return DSC_OK;
}

dsc_status dsc_chat_template_chatml(dsc_chat_template **out) {
    return dsc_chat_template_parse("{% for message in messages %}{{'<|im_start|>' + "
                                   "message['role'] + '\\n' + message['content'] + "
                                   "'<|im_end|>' + '\\n'}}{% endfor %}", NULL, NULL, out);
}

dsc_status dsc_chat_template_load(const char *spec, const char *tokenizer_spec,
                                  dsc_chat_template **out, char *note, size_t cap) {
    *out = NULL;
    char path[4200];
    struct stat sb;
    snprintf(note, cap, "chatml (default)");
    if (!spec || !strcmp(spec, "chatml")) {
        if (!spec && tokenizer_spec && !strncmp(tokenizer_spec, "hf:", 3)) {
            snprintf(path, sizeof path, "%s/tokenizer_config.json", tokenizer_spec + 3);
            if (stat(path, &sb) == 0) return load_config(path, out, note, cap);
        }
        return dsc_chat_template_chatml(out);
    }
    if (stat(spec, &sb) != 0)
        return dsc__fail(DSC_ERR_IO, "--chat-template %s: %s; give chatml, a "
                         "tokenizer_config.json, its folder or a Jinja file", spec, strerror(errno));
    if (S_ISDIR(sb.st_mode)) snprintf(path, sizeof path, "%s/tokenizer_config.json", spec);
    else snprintf(path, sizeof path, "%s", spec);
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) return load_config(path, out, note, cap);
    char *text = NULL;
    DSC_TRY(slurp(path, &text));
    dsc_status st = dsc_chat_template_parse(text, NULL, NULL, out);
    free(text);
    if (st == DSC_OK) {
        snprintf(note, cap, "%s", path);
        return DSC_OK;
    }
    snprintf(note, cap, "chatml (default): %s is not a simple role/content template (%s)", path,
             dsc_last_error());
    return dsc_chat_template_chatml(out);
}

void dsc_chat_template_destroy(dsc_chat_template *t) {
    if (!t) return;
    for (int k = 0; k < t->nparts; k++) free(t->parts[k].text);
    free(t->parts);
    free(t->begin);
    free(t->end);
    free(t);
}

const char *dsc_chat_template_begin(const dsc_chat_template *t) { return t->begin; }
const char *dsc_chat_template_end(const dsc_chat_template *t) { return t->end; }

dsc_status dsc_chat_render(const dsc_chat_template *t, const char *role, char **prefix,
                           char **suffix) {
    str b[2] = {{0}, {0}};
    int side = 0;
    bool ok = str_add(&b[0], "", 0) && str_add(&b[1], "", 0);
    for (int k = 0; ok && k < t->nparts; k++) {
        const part *p = &t->parts[k];
        if (p->kind == P_CONTENT) side = 1;
        else if (p->kind == P_ROLE) ok = str_add(&b[side], role, strlen(role));
        else ok = str_add(&b[side], p->text, strlen(p->text));
    }
    if (!ok) {
        free(b[0].s);
        free(b[1].s);
        return dsc__fail(DSC_ERR_OOM, "chat template: out of memory");
    }
    *prefix = b[0].s;
    *suffix = b[1].s;
    return DSC_OK;
}
