// launch/strv.c - string vectors, buffers, shell quoting and splitting, `.deepspeed_env` files.
#define _GNU_SOURCE // asprintf, vasprintf
#include "launch/strv.h"

#include <errno.h>  // errno
#include <stdarg.h> // va_list
#include <stdbool.h> // bool
#include <stdio.h>  // vsnprintf, fopen, fread
#include <stdlib.h> // malloc, realloc, free
#include <string.h> // strlen, strchr, memcpy, strerror

#include "base/io.h"     // dsc__fopen_regular
#include "base/status.h" // dsc__fail

// ---- vectors ----

static dsc_status strv_reserve(dsc__strv *s, int extra) {
    if (s->n + extra + 1 <= s->cap) return DSC_OK;
    int cap = s->cap ? s->cap : 8;
    while (cap < s->n + extra + 1) cap *= 2;
    char **v = realloc(s->v, (size_t)cap * sizeof *v);
    if (!v) return dsc__fail(DSC_ERR_OOM, "out of memory growing a string list to %d", cap);
    s->v = v;
    s->cap = cap;
    return DSC_OK;
}

// Takes ownership of x (already allocated).
static dsc_status strv_take(dsc__strv *s, char *x) {
    dsc_status st = strv_reserve(s, 1);
    if (st != DSC_OK) {
        free(x);
        return st;
    }
    s->v[s->n++] = x;
    s->v[s->n] = NULL;
    return DSC_OK;
}

dsc_status dsc__strv_push(dsc__strv *s, const char *x) {
    char *c = strdup(x);
    if (!c) return dsc__fail(DSC_ERR_OOM, "out of memory copying a string");
    return strv_take(s, c);
}

dsc_status dsc__strv_pushf(dsc__strv *s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *c = NULL;
    int len = vasprintf(&c, fmt, ap);
    va_end(ap);
    if (len < 0) return dsc__fail(DSC_ERR_OOM, "out of memory formatting a string");
    return strv_take(s, c);
}

dsc_status dsc__strv_extend(dsc__strv *s, char *const *xs, int n) {
    for (int i = 0; i < n; i++) DSC_TRY(dsc__strv_push(s, xs[i]));
    return DSC_OK;
}

void dsc__strv_free(dsc__strv *s) {
    for (int i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    *s = (dsc__strv){0};
}

static int env_find(const dsc__strv *env, const char *key) {
    size_t k = strlen(key);
    for (int i = 0; i < env->n; i++)
        if (!strncmp(env->v[i], key, k) && env->v[i][k] == '=') return i;
    return -1;
}

dsc_status dsc__strv_setenv(dsc__strv *env, const char *key, const char *value) {
    char *c = NULL;
    if (asprintf(&c, "%s=%s", key, value) < 0)
        return dsc__fail(DSC_ERR_OOM, "out of memory setting %s", key);
    int i = env_find(env, key);
    if (i < 0) return strv_take(env, c);
    free(env->v[i]);
    env->v[i] = c;
    return DSC_OK;
}

const char *dsc__strv_getenv(const dsc__strv *env, const char *key) {
    int i = env_find(env, key);
    return i < 0 ? NULL : env->v[i] + strlen(key) + 1;
}

// ---- buffers ----

static dsc_status sbuf_reserve(dsc__sbuf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return DSC_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return dsc__fail(DSC_ERR_OOM, "out of memory growing a buffer to %zu bytes", cap);
    b->p = p;
    b->cap = cap;
    return DSC_OK;
}

dsc_status dsc__sbuf_add(dsc__sbuf *b, const char *s, size_t len) {
    DSC_TRY(sbuf_reserve(b, len));
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
    return DSC_OK;
}

dsc_status dsc__sbuf_addf(dsc__sbuf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int len = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    dsc_status st = len < 0 ? dsc__fail(DSC_ERR_INTERNAL, "bad format string") : DSC_OK;
    if (st == DSC_OK) st = sbuf_reserve(b, (size_t)len);
    if (st == DSC_OK) {
        vsnprintf(b->p + b->n, (size_t)len + 1, fmt, ap2);
        b->n += (size_t)len;
    }
    va_end(ap2);
    return st;
}

void dsc__sbuf_free(dsc__sbuf *b) {
    free(b->p);
    *b = (dsc__sbuf){0};
}

// ---- shell words ----

static bool shell_safe(const char *w) {
    if (!*w) return false;
    for (const char *p = w; *p; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  strchr("_./:=,+@%-", c);
        if (!ok) return false;
    }
    return true;
}

dsc_status dsc__launch_shell_quote(dsc__sbuf *b, const char *word) {
    if (shell_safe(word)) return dsc__sbuf_add(b, word, strlen(word));
    DSC_TRY(dsc__sbuf_add(b, "'", 1));
    for (const char *p = word; *p; p++) {
        if (*p == '\'') DSC_TRY(dsc__sbuf_add(b, "'\\''", 4));
        else DSC_TRY(dsc__sbuf_add(b, p, 1));
    }
    return dsc__sbuf_add(b, "'", 1);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// One word starting at *pp (not at a space); appends it to w and advances *pp past it.
static dsc_status split_one(const char **pp, const char *all, dsc__sbuf *w) {
    const char *p = *pp;
    char quote = 0;
    for (; *p && (quote || !is_space(*p)); p++) {
        if (quote == '\'') {
            if (*p == '\'') quote = 0;
            else DSC_TRY(dsc__sbuf_add(w, p, 1));
        } else if (*p == '\\' && quote != '\'') {
            if (!p[1])
                return dsc__fail(DSC_ERR_INVALID_ARG, "'%s' ends with a lone backslash", all);
            // Inside double quotes a backslash only escapes the characters the shell lets it.
            if (quote == '"' && !strchr("\"\\$`", p[1])) DSC_TRY(dsc__sbuf_add(w, p, 1));
            DSC_TRY(dsc__sbuf_add(w, ++p, 1));
        } else if (quote == '"') {
            if (*p == '"') quote = 0;
            else DSC_TRY(dsc__sbuf_add(w, p, 1));
        } else if (*p == '\'' || *p == '"') {
            quote = *p;
            DSC_TRY(dsc__sbuf_add(w, "", 0)); // "" is a word of its own
        } else {
            DSC_TRY(dsc__sbuf_add(w, p, 1));
        }
    }
    if (quote)
        return dsc__fail(DSC_ERR_INVALID_ARG, "'%s' has an unterminated %c quote", all, quote);
    *pp = p;
    return DSC_OK;
}

dsc_status dsc__launch_split_words(const char *s, dsc__strv *out) {
    const char *p = s;
    dsc__sbuf w = {0};
    dsc_status st = DSC_OK;
    for (;;) {
        while (is_space(*p)) p++;
        if (!*p) break;
        w.n = 0;
        DSC_TRY_GOTO(split_one(&p, s, &w), st, done);
        DSC_TRY_GOTO(dsc__strv_push(out, w.p ? w.p : ""), st, done);
    }
done:
    dsc__sbuf_free(&w);
    return st;
}

// ---- .deepspeed_env ----

static bool env_key_ok(const char *k, size_t len) {
    if (!len || (k[0] >= '0' && k[0] <= '9')) return false;
    for (size_t i = 0; i < len; i++) {
        char c = k[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_'))
            return false;
    }
    return true;
}

static dsc_status envfile_line(const char *line, size_t len, const char *origin, int lineno,
                               dsc__strv *kv) {
    while (len && is_space(*line)) line++, len--;
    while (len && is_space(line[len - 1])) len--;
    if (!len || line[0] == '#') return DSC_OK;
    const char *eq = memchr(line, '=', len);
    if (!eq)
        return dsc__fail(DSC_ERR_CONFIG, "%s line %d: expected KEY=VALUE, got '%.*s'", origin,
                         lineno, (int)len, line);
    size_t klen = (size_t)(eq - line);
    if (!env_key_ok(line, klen))
        return dsc__fail(DSC_ERR_CONFIG,
                         "%s line %d: '%.*s' is not a variable name (letters, digits, _)", origin,
                         lineno, (int)klen, line);
    char key[256];
    if (klen >= sizeof key)
        return dsc__fail(DSC_ERR_CONFIG, "%s line %d: variable name longer than %zu characters",
                         origin, lineno, sizeof key - 1);
    memcpy(key, line, klen);
    key[klen] = '\0';
    char *value = strndup(eq + 1, len - klen - 1);
    if (!value) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", origin);
    dsc_status st = dsc__strv_setenv(kv, key, value);
    free(value);
    return st;
}

dsc_status dsc__launch_envfile_parse(const char *text, const char *origin, dsc__strv *kv) {
    int lineno = 1;
    for (const char *p = text; *p; lineno++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        DSC_TRY(envfile_line(p, len, origin, lineno, kv));
        p += len + (nl ? 1 : 0);
    }
    return DSC_OK;
}

dsc_status dsc__launch_read_file(const char *path, size_t max, char **out) {
    FILE *f;
    DSC_TRY(dsc__fopen_regular(path, &f));
    char *buf = malloc(max + 1);
    if (!buf) {
        fclose(f);
        return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    }
    size_t n = fread(buf, 1, max + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err || n > max) {
        free(buf);
        return err ? dsc__fail(DSC_ERR_IO, "cannot read %s", path)
                   : dsc__fail(DSC_ERR_IO, "%s is larger than %zu bytes; is it the right file?",
                               path, max);
    }
    buf[n] = '\0';
    if (strlen(buf) != n) {
        free(buf);
        return dsc__fail(DSC_ERR_CONFIG, "%s contains a NUL byte; it should be a text file", path);
    }
    *out = buf;
    return DSC_OK;
}
