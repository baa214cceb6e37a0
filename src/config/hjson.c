// config/hjson.c - Hjson text -> jansson tree, following the hjson 3.1.0 reader DeepSpeed uses.
//
// The reader's rules, as this file implements them (positions are into the text after newline
// translation, since DeepSpeed opens the file in Python's text mode: CRLF and CR become LF):
//   - Whitespace is space, tab and newline. Comments: '#' or '//' to the end of the line, and
//     '/* ... */' (unterminated: an error). They may appear wherever whitespace may.
//   - The top level is an object in braces, a list (which DeepSpeed then rejects), or the members
//     of an object without braces. An empty or comment-only file is an empty object.
//   - Members and list items need no commas between them (but a quoteless value runs to the end
//     of its line); one trailing comma is allowed.
//   - A key is a quoted string ("..." or '...') or the characters up to ':' (no {}[], inside; no
//     whitespace inside, though it may precede the colon).
//   - A value starting with a quote is a string: JSON escapes plus \' ; no raw control
//     characters. ''' starts a multi-line string whose lines lose the indentation of the '''.
//   - Any other value is scanned as a quoteless string to the end of its line, except that at
//     each ',' ']' '}' '#' '//' '/*' or newline, if the text so far is exactly true, false, null
//     or a JSON number (spaces and tabs around allowed), that is the value and scanning stops.
//   - A number with a fraction or exponent that is whole and below 1e10 in magnitude becomes an
//     integer; one that overflows a double is an error.
#include "config/hjson.h"

#include <errno.h>  // errno, ERANGE
#include <math.h>   // isinf, trunc, fabs
#include <stdarg.h> // va_list
#include <stdint.h> // int64_t, uint32_t
#include <stdio.h>  // vsnprintf
#include <stdlib.h> // malloc, realloc, free, strtod
#include <string.h> // memcpy, memcmp, memchr, strdup, strndup, strstr

#include "base/status.h"    // dsc__fail
#include "config/pytext.h"  // dsc__py_isspace, dsc__py_utf8_*

// ---- state ----

typedef struct sbuf {
    char *p;
    size_t len, cap;
} sbuf;

typedef struct hj {
    const char *s; // the text, newlines translated to LF; valid UTF-8
    size_t n;
    const char *source;
    int depth;
    sbuf sb; // the string being scanned
} hj;

static bool at_eof(const hj *p, size_t i) { return i >= p->n; }

// Line and column (1-based, in characters) of byte offset `at`.
static void position(const hj *p, size_t at, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < at && i < p->n; i++) {
        unsigned char c = (unsigned char)p->s[i];
        if (c == '\n') (*line)++, *col = 1;
        else if ((c & 0xc0) != 0x80) (*col)++;
    }
}

static dsc_status fail_at(const hj *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static dsc_status fail_at(const hj *p, size_t at, const char *fmt, ...) {
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int line, col;
    position(p, at, &line, &col);
    return dsc__fail(DSC_ERR_CONFIG, "config %s: line %d, column %d: %s", p->source, line, col,
                     what);
}

// ---- the string buffer ----

static dsc_status sb_put(sbuf *b, const char *src, size_t n) {
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return dsc__fail(DSC_ERR_OOM, "config: out of memory reading a string");
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->len, src, n);
    b->len += n;
    b->p[b->len] = '\0';
    return DSC_OK;
}

// Append a code point as UTF-8; U+0000 as C0 80 and surrogates in their 3-byte form, so that
// the result stays a C string that no real key equals (see hjson.h).
static dsc_status sb_cp(sbuf *b, uint32_t cp) {
    char u[4];
    size_t n;
    if (cp == 0) u[0] = (char)0xc0, u[1] = (char)0x80, n = 2;
    else if (cp < 0x80) u[0] = (char)cp, n = 1;
    else if (cp < 0x800) u[0] = (char)(0xc0 | cp >> 6), u[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12), u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    } else {
        u[0] = (char)(0xf0 | cp >> 18), u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    }
    return sb_put(b, u, n);
}

// Append raw text, re-encoding any U+0000 (which only quoteless and ''' strings can hold).
static dsc_status sb_text(sbuf *b, const char *s, size_t n) {
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\0') continue;
        DSC_TRY(sb_put(b, s + start, i - start));
        DSC_TRY(sb_cp(b, 0));
        start = i + 1;
    }
    return sb_put(b, s + start, n - start);
}

static json_t *sb_string(const sbuf *b) {
    return json_stringn_nocheck(b->p ? b->p : "", b->len);
}

// ---- whitespace and comments ----

static size_t end_of_line(const hj *p, size_t i) {
    while (i < p->n && p->s[i] != '\n') i++;
    return i;
}

static bool comment_at(const hj *p, size_t i) {
    return p->s[i] == '#' ||
           (p->s[i] == '/' && i + 1 < p->n && (p->s[i + 1] == '/' || p->s[i + 1] == '*'));
}

// Skip whitespace and comments from *i.
static dsc_status skip(const hj *p, size_t *i) {
    size_t k = *i;
    for (;;) {
        while (k < p->n && (p->s[k] == ' ' || p->s[k] == '\t' || p->s[k] == '\n')) k++;
        if (k >= p->n || !comment_at(p, k)) break;
        if (p->s[k] == '#' || p->s[k + 1] == '/') {
            k = end_of_line(p, k);
            continue;
        }
        size_t open = k;
        for (k += 2; k + 1 < p->n && !(p->s[k] == '*' && p->s[k + 1] == '/'); k++) {}
        if (k + 1 >= p->n) return fail_at(p, open, "unterminated /* comment");
        k += 2;
    }
    *i = k;
    return DSC_OK;
}

static bool punctuator(char c) {
    return c == '{' || c == '}' || c == '[' || c == ']' || c == ',' || c == ':';
}

// ---- quoted strings ----

static dsc_status value(hj *p, size_t *i, json_t **out);

// After `\u` at s[j]: the 4 characters that Python's int(..., 16) reads. Returns false when
// fewer than 4 characters remain or the second one is an 'x' (which the reader rejects).
static bool four_chars(const hj *p, size_t j, size_t *end) {
    size_t k = j;
    for (int c = 0; c < 4; c++) {
        if (k >= p->n) return false;
        if (c == 1 && (p->s[k] == 'x' || p->s[k] == 'X')) return false;
        uint32_t cp;
        k += dsc__py_utf8_decode(p->s + k, p->n - k, &cp);
    }
    *end = k;
    return true;
}

// \uXXXX at s[*i] (just after the 'u'), with a following low surrogate joined as Python does.
static dsc_status unicode_escape(hj *p, size_t *i) {
    size_t start = *i - 2, end;
    long v;
    if (!four_chars(p, *i, &end) || !dsc__py_int16(p->s + *i, end - *i, &v) || v < 0)
        return fail_at(p, start, "invalid \\uXXXX escape");
    *i = end;
    uint32_t cp = (uint32_t)v;
    if ((cp & 0xfc00) == 0xd800 && *i + 1 < p->n && p->s[*i] == '\\' && p->s[*i + 1] == 'u' &&
        four_chars(p, *i + 2, &end)) {
        long low;
        if (!dsc__py_int16(p->s + *i + 2, end - *i - 2, &low))
            return fail_at(p, *i, "invalid \\uXXXX escape");
        if ((low & 0xfc00) == 0xdc00) {
            cp = 0x10000 + (((cp - 0xd800) << 10) | (uint32_t)(low - 0xdc00));
            *i = end;
        }
    }
    return sb_cp(&p->sb, cp);
}

static dsc_status escape(hj *p, size_t *i) {
    static const char from[] = "\"'\\/bfnrt", to[] = "\"'\\/\b\f\n\r\t";
    if (at_eof(p, *i)) return fail_at(p, *i - 1, "unterminated string");
    char e = p->s[(*i)++];
    if (e == 'u') return unicode_escape(p, i);
    const char *hit = memchr(from, e, sizeof from - 1);
    if (!hit || e == '\0') return fail_at(p, *i - 2, "invalid escape \\%c", e);
    return sb_put(&p->sb, &to[hit - from], 1);
}

// A string in quotes; s[*i] is the opening quote. The other quote character needs no escape.
static dsc_status quoted(hj *p, size_t *i) {
    char quote = p->s[*i];
    size_t open = *i, k = *i + 1, chunk = k;
    p->sb.len = 0;
    DSC_TRY(sb_put(&p->sb, "", 0));
    for (;;) {
        if (at_eof(p, k)) return fail_at(p, open, "unterminated string");
        unsigned char c = (unsigned char)p->s[k];
        if (c != quote && c != '\\' && c >= 0x20) {
            k++;
            continue;
        }
        DSC_TRY(sb_put(&p->sb, p->s + chunk, k - chunk));
        if (c == quote) break;
        if (c < 0x20)
            return fail_at(p, k, "control character 0x%02x inside a quoted string (use an escape "
                           "such as \\n, or a '''multi-line string''')", c);
        k++;
        DSC_TRY(escape(p, &k));
        chunk = k;
    }
    *i = k + 1;
    return DSC_OK;
}

// ---- multi-line strings ----

// Characters (code points) between the previous newline and s[at]. Without a newline before it,
// the hjson reader's backwards search wraps around to the end of the text (a Python negative
// index): reproduced here; no newline at all is an error.
static bool ml_indent(const hj *p, size_t at, size_t *indent) {
    size_t chars = 0, k = at;
    while (k > 0) {
        k--;
        if (p->s[k] == '\n') return *indent = chars, true;
        if (((unsigned char)p->s[k] & 0xc0) != 0x80) chars++;
    }
    size_t last_nl = p->n, tail = 0;
    for (size_t j = p->n; j > 0; j--) {
        if (p->s[j - 1] == '\n') {
            last_nl = j - 1;
            break;
        }
        if (((unsigned char)p->s[j - 1] & 0xc0) != 0x80) tail++;
    }
    if (last_nl == p->n) return false;
    *indent = chars + tail;
    return true;
}

// Skip up to `max` of space, tab (SIZE_MAX: any number).
static size_t skip_indent(const hj *p, size_t k, size_t max) {
    while (max > 0 && k < p->n && (p->s[k] == ' ' || p->s[k] == '\t')) k++, max--;
    return k;
}

static dsc_status mlstring(hj *p, size_t *i) {
    size_t open = *i, indent, k;
    if (!ml_indent(p, open, &indent)) return fail_at(p, open, "bad multi-line string");
    k = skip_indent(p, open + 3, SIZE_MAX);
    if (at_eof(p, k)) return fail_at(p, open, "unterminated multi-line string");
    if (p->s[k] == '\n') k = skip_indent(p, k + 1, indent);
    p->sb.len = 0;
    DSC_TRY(sb_put(&p->sb, "", 0));
    int quotes = 0;
    for (;;) {
        if (at_eof(p, k)) return fail_at(p, open, "unterminated multi-line string (missing ''')");
        char c = p->s[k];
        if (c == '\'') {
            k++;
            if (++quotes == 3) break;
            continue;
        }
        for (; quotes > 0; quotes--) DSC_TRY(sb_put(&p->sb, "'", 1));
        DSC_TRY(sb_text(&p->sb, &c, 1));
        k = c == '\n' ? skip_indent(p, k + 1, indent) : k + 1;
    }
    if (p->sb.len > 0 && p->sb.p[p->sb.len - 1] == '\n') p->sb.p[--p->sb.len] = '\0';
    *i = k;
    return DSC_OK;
}

// ---- quoteless values: true, false, null, numbers, strings ----

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The reader's number pattern at s[i]: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)? then
// spaces/tabs. Returns where the match ends (i when there is none); *num_end: end of the number.
static size_t match_number(const hj *p, size_t i, size_t *num_end, bool *real) {
    const char *s = p->s;
    size_t n = p->n, k = i;
    *real = false;
    if (k < n && s[k] == '-') k++;
    if (k < n && s[k] == '0') k++;
    else if (k < n && s[k] >= '1' && s[k] <= '9')
        while (k < n && is_digit(s[k])) k++;
    else return i;
    if (k + 1 < n && s[k] == '.' && is_digit(s[k + 1])) {
        for (k += 2; k < n && is_digit(s[k]);) k++;
        *real = true;
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        size_t j = k + 1;
        if (j < n && (s[j] == '+' || s[j] == '-')) j++;
        if (j < n && is_digit(s[j])) {
            while (j < n && is_digit(s[j])) j++;
            k = j;
            *real = true;
        }
    }
    *num_end = k;
    while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
    return k;
}

static dsc_status number(const hj *p, size_t begin, size_t end, bool real, json_t **out) {
    char *text = strndup(p->s + begin, end - begin);
    if (!text) return dsc__fail(DSC_ERR_OOM, "config: out of memory");
    double x = strtod(text, NULL);
    dsc_status st = DSC_OK;
    if (!real) {
        // Integers are exact in the reader (Python ints); beyond int64 dsc keeps the nearest
        // double, which every range check in dsc then rejects.
        errno = 0;
        long long v = strtoll(text, NULL, 10);
        *out = errno != ERANGE ? json_integer(v) : json_real(x);
    } else if (isinf(x)) {
        st = fail_at(p, begin, "number %.40s is too large", text);
    } else {
        *out = trunc(x) == x && fabs(x) < 1e10 ? json_integer((json_int_t)x) : json_real(x);
    }
    free(text);
    if (st == DSC_OK && !*out) st = dsc__fail(DSC_ERR_OOM, "config: out of memory");
    return st;
}

static bool is_terminator(const hj *p, size_t k) {
    if (k >= p->n) return true;
    char c = p->s[k];
    return c == '\n' || c == ',' || c == '}' || c == ']' || comment_at(p, k);
}

// At a terminator: true/false/null or a number when the text so far is exactly that.
static dsc_status keyword_or_number(hj *p, size_t begin, size_t k, json_t **out) {
    const char *t = p->s + begin;
    size_t len = k - begin;
    dsc__py_strip(&t, &len);
    char first = p->s[begin];
    if (first == 'n' && len == 4 && !memcmp(t, "null", 4)) *out = json_null();
    else if (first == 't' && len == 4 && !memcmp(t, "true", 4)) *out = json_true();
    else if (first == 'f' && len == 5 && !memcmp(t, "false", 5)) *out = json_false();
    else if (first == '-' || is_digit(first)) {
        size_t num_end = begin;
        bool real;
        if (match_number(p, begin, &num_end, &real) == k && num_end > begin)
            return number(p, begin, num_end, real, out);
    }
    return DSC_OK;
}

static dsc_status quoteless(hj *p, size_t *i, json_t **out) {
    size_t begin = *i;
    if (at_eof(p, begin) || punctuator(p->s[begin]))
        return fail_at(p, begin, at_eof(p, begin) ? "expected a value, found the end of the text"
                                                  : "expected a value, found '%c'", p->s[begin]);
    *out = NULL;
    for (size_t k = begin;; k++) {
        if (!is_terminator(p, k)) continue;
        DSC_TRY(keyword_or_number(p, begin, k, out));
        if (*out) {
            *i = k;
            return DSC_OK;
        }
        if (k < p->n && p->s[k] != '\n') continue; // ',' '}' ... belong to a quoteless string
        const char *t = p->s + begin;
        size_t len = k - begin;
        dsc__py_strip(&t, &len);
        p->sb.len = 0;
        DSC_TRY(sb_put(&p->sb, "", 0));
        DSC_TRY(sb_text(&p->sb, t, len));
        *i = k;
        *out = sb_string(&p->sb);
        return *out ? DSC_OK : dsc__fail(DSC_ERR_OOM, "config: out of memory");
    }
}

// ---- keys, objects, lists ----

// A key: quoted, or the characters up to ':'. Leaves it NUL-terminated in p->sb.
static dsc_status key_name(hj *p, size_t *i) {
    DSC_TRY(skip(p, i));
    if (!at_eof(p, *i) && (p->s[*i] == '"' || p->s[*i] == '\'')) return quoted(p, i);
    size_t begin = *i, space = SIZE_MAX;
    for (size_t k = begin;; k++) {
        if (at_eof(p, k))
            return fail_at(p, begin, "end of the text where a key was expected (missing '}'?)");
        char c = p->s[k];
        if (c == ':') {
            if (k == begin)
                return fail_at(p, k, "':' without a key name (quote an empty key: \"\")");
            if (space != SIZE_MAX && space != k - 1)
                return fail_at(p, space, "whitespace inside a key name (quote the key)");
            size_t len = k - begin;
            if (space != SIZE_MAX) dsc__py_rstrip(p->s + begin, &len);
            p->sb.len = 0;
            DSC_TRY(sb_put(&p->sb, "", 0));
            DSC_TRY(sb_text(&p->sb, p->s + begin, len));
            *i = k;
            return DSC_OK;
        }
        if (c == ' ' || c == '\t' || c == '\n') {
            if (space == SIZE_MAX || space == k - 1) space = k;
        } else if (punctuator(c)) {
            return fail_at(p, k, "found '%c' where a key was expected (quote keys that hold "
                           "{}[],: or spaces)", c);
        }
    }
}

// One "key: value" into obj; a repeated key is an error (DeepSpeed's duplicate-key hook).
// `open` is where the object's '{' is (SIZE_MAX: an object without braces).
static dsc_status member(hj *p, size_t *i, size_t open, json_t *obj) {
    size_t key_at;
    DSC_TRY(skip(p, i));
    if (at_eof(p, *i) && open != SIZE_MAX)
        return fail_at(p, open, "this object is never closed (missing '}'? a value without "
                       "quotes runs to the end of its line)");
    key_at = *i;
    DSC_TRY(key_name(p, i));
    char *key = strdup(p->sb.p);
    if (!key) return dsc__fail(DSC_ERR_OOM, "config: out of memory");
    dsc_status st = skip(p, i);
    if (st == DSC_OK && (at_eof(p, *i) || p->s[*i] != ':'))
        st = fail_at(p, *i, "expected ':' after the key \"%s\"", key);
    json_t *v = NULL;
    if (st == DSC_OK) (*i)++, st = skip(p, i);
    if (st == DSC_OK) st = value(p, i, &v);
    if (st == DSC_OK && json_object_get(obj, key)) {
        st = fail_at(p, key_at, "duplicate key \"%s\" (DeepSpeed rejects duplicate keys)", key);
        json_decref(v);
    } else if (st == DSC_OK && json_object_set_new_nocheck(obj, key, v)) {
        st = dsc__fail(DSC_ERR_OOM, "config: out of memory");
    }
    free(key);
    return st;
}

// After a member or item: skip one optional comma; true when `close` (or, without braces, the
// end of the text) follows.
static dsc_status after_item(hj *p, size_t *i, char close, bool *done) {
    DSC_TRY(skip(p, i));
    if (!at_eof(p, *i) && p->s[*i] == ',') {
        (*i)++;
        DSC_TRY(skip(p, i));
    }
    if (close == '\0') *done = at_eof(p, *i);
    else *done = !at_eof(p, *i) && p->s[*i] == close;
    if (*done && close) (*i)++;
    return DSC_OK;
}

static dsc_status object(hj *p, size_t *i, bool braces, json_t **out) {
    size_t open = braces ? *i - 1 : SIZE_MAX;
    json_t *obj = json_object();
    if (!obj) return dsc__fail(DSC_ERR_OOM, "config: out of memory");
    dsc_status st = skip(p, i);
    bool done = st == DSC_OK && braces && !at_eof(p, *i) && p->s[*i] == '}';
    if (done) (*i)++;
    while (st == DSC_OK && !done) {
        st = member(p, i, open, obj);
        if (st == DSC_OK) st = after_item(p, i, braces ? '}' : '\0', &done);
    }
    if (st != DSC_OK) json_decref(obj);
    else *out = obj;
    return st;
}

static dsc_status array(hj *p, size_t *i, json_t **out) {
    size_t open = *i - 1;
    json_t *arr = json_array();
    if (!arr) return dsc__fail(DSC_ERR_OOM, "config: out of memory");
    dsc_status st = skip(p, i);
    bool done = st == DSC_OK && !at_eof(p, *i) && p->s[*i] == ']';
    if (done) (*i)++;
    while (st == DSC_OK && !done) {
        json_t *v = NULL;
        st = at_eof(p, *i) ? fail_at(p, open, "this list is never closed (missing ']'? a value "
                                     "without quotes runs to the end of its line)")
                           : value(p, i, &v);
        if (st == DSC_OK && json_array_append_new(arr, v))
            st = dsc__fail(DSC_ERR_OOM, "config: out of memory");
        if (st == DSC_OK) st = after_item(p, i, ']', &done);
    }
    if (st != DSC_OK) json_decref(arr);
    else *out = arr;
    return st;
}

static dsc_status nested(hj *p, size_t *i, json_t **out) {
    if (p->depth >= DSC_HJSON_MAX_DEPTH)
        return fail_at(p, *i, "nested deeper than %d levels", DSC_HJSON_MAX_DEPTH);
    p->depth++;
    char c = p->s[(*i)++];
    dsc_status st = c == '{' ? object(p, i, true, out) : array(p, i, out);
    p->depth--;
    return st;
}

// A value at s[*i] (whitespace already skipped).
static dsc_status value(hj *p, size_t *i, json_t **out) {
    if (at_eof(p, *i)) return fail_at(p, *i, "expected a value, found the end of the text");
    char c = p->s[*i];
    if (c == '{' || c == '[') return nested(p, i, out);
    if (c != '"' && c != '\'') return quoteless(p, i, out);
    bool ml = *i + 2 < p->n && !memcmp(p->s + *i, "'''", 3);
    DSC_TRY(ml ? mlstring(p, i) : quoted(p, i));
    *out = sb_string(&p->sb);
    return *out ? DSC_OK : dsc__fail(DSC_ERR_OOM, "config: out of memory");
}

// ---- the document ----

// After members without braces failed to parse: the reader then tries a single bare value, which
// DeepSpeed rejects for not being an object. Say that when it is one; else keep the first error.
static dsc_status single_value(hj *p, size_t start, dsc_status st) {
    char first[512];
    snprintf(first, sizeof first, "%s", dsc_last_error());
    json_t *v = NULL;
    size_t i = start;
    bool lone = value(p, &i, &v) == DSC_OK && skip(p, &i) == DSC_OK && at_eof(p, i);
    json_decref(v);
    if (lone)
        return fail_at(p, start, "the top level is a single value; DeepSpeed needs an object of "
                       "keys");
    return dsc__fail(st, "%s", first);
}

static dsc_status document(hj *p, json_t **out) {
    size_t i = 0;
    bool bom = p->n >= 3 && !memcmp(p->s, "\xef\xbb\xbf", 3);
    if (bom) i = 3;
    DSC_TRY(skip(p, &i));
    if (at_eof(p, i) && !bom) return (*out = json_object()) ? DSC_OK : DSC_ERR_OOM;
    if (!at_eof(p, i) && (p->s[i] == '{' || p->s[i] == '[')) {
        DSC_TRY(nested(p, &i, out));
        dsc_status st = skip(p, &i);
        if (st == DSC_OK && !at_eof(p, i))
            st = fail_at(p, i, "text after the end of the top-level %s",
                         json_is_object(*out) ? "object" : "list");
        if (st != DSC_OK) json_decref(*out), *out = NULL;
        return st;
    }
    // Members without braces.
    size_t start = i;
    dsc_status st = object(p, &i, false, out);
    return st == DSC_OK ? st : single_value(p, start, st);
}

// Python's text mode: CRLF and lone CR read as LF.
static char *translate_newlines(const char *text, size_t len, size_t *out_len) {
    char *t = malloc(len + 1);
    if (!t) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (text[i] == '\r') {
            t[k++] = '\n';
            if (i + 1 < len && text[i + 1] == '\n') i++;
        } else {
            t[k++] = text[i];
        }
    }
    t[k] = '\0';
    *out_len = k;
    return t;
}

dsc_status dsc__hjson_parse(const char *text, size_t len, const char *source, json_t **out) {
    *out = NULL;
    size_t n;
    char *t = translate_newlines(text, len, &n);
    if (!t) return dsc__fail(DSC_ERR_OOM, "config %s: out of memory", source);
    hj p = {t, n, source, 0, {NULL, 0, 0}};
    size_t valid = dsc__py_utf8_valid_prefix(t, n);
    dsc_status st = valid < n ? fail_at(&p, valid, "invalid UTF-8 byte 0x%02x (DeepSpeed reads "
                                        "config files as UTF-8)", (unsigned char)t[valid])
                              : document(&p, out);
    // A NUL byte is legal inside Hjson's quoteless strings, but in a file that fails it is the
    // likely cause (a binary or damaged file), and the parser's position is often far from it.
    const char *nul = st != DSC_OK && st != DSC_ERR_OOM ? memchr(t, '\0', n) : NULL;
    if (nul) {
        char parser[1024];
        snprintf(parser, sizeof parser, "%s", dsc_last_error());
        const char *said = strstr(parser, ": line ");
        int line, col;
        position(&p, (size_t)(nul - t), &line, &col);
        st = dsc__fail(DSC_ERR_CONFIG, "config %s: line %d, column %d: a NUL byte (0x00), which a "
                       "text file does not hold: is the file binary or damaged? (the parser then "
                       "stopped at%s)", source, line, col, said ? said + 1 : parser);
    }
    free(p.sb.p);
    free(t);
    return st;
}
