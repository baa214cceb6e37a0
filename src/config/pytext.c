// config/pytext.c - Python's and pydantic's text rules, as DeepSpeed's config readers apply them.
#include "config/pytext.h"

#include <math.h>    // INFINITY, NAN
#include <stdlib.h>  // strtod
#include <string.h>  // memcpy, strlen
#include <strings.h> // strcasecmp, strncasecmp

// ---- code points ----

bool dsc__py_isspace(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
           cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

size_t dsc__py_utf8_decode(const char *s, size_t n, uint32_t *cp) {
    const unsigned char *u = (const unsigned char *)s;
    size_t len = u[0] < 0x80 ? 1 : u[0] < 0xe0 ? 2 : u[0] < 0xf0 ? 3 : 4;
    if (len > n) len = n; // only for invalid input; callers validate first
    uint32_t c = len == 1 ? u[0] : u[0] & (0x3f >> (len - 1));
    for (size_t k = 1; k < len; k++) c = (c << 6) | (u[k] & 0x3f);
    *cp = c;
    return len;
}

// Length of the valid sequence at s (n bytes left), 0 when invalid.
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len = c >= 0xc2 && c <= 0xdf   ? 2
                 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4
                                          : 0;
    if (len == 0 || len > n) return 0;
    for (size_t k = 1; k < len; k++)
        if ((s[k] & 0xc0) != 0x80) return 0;
    // The second byte's range rules out overlong forms, surrogates and code points > U+10FFFF.
    if (c == 0xe0 && s[1] < 0xa0) return 0;
    if (c == 0xed && s[1] > 0x9f) return 0;
    if (c == 0xf0 && s[1] < 0x90) return 0;
    if (c == 0xf4 && s[1] > 0x8f) return 0;
    return len;
}

size_t dsc__py_utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t len = utf8_seq(u + i, n - i);
        if (len == 0) return i;
        i += len;
    }
    return n;
}

// ---- strip ----

// Start of the code point that ends at s[end - 1] (s is valid UTF-8).
static size_t cp_start_before(const char *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80) i--;
    return i;
}

void dsc__py_rstrip(const char *s, size_t *n) {
    while (*n > 0) {
        size_t start = cp_start_before(s, *n);
        uint32_t cp;
        dsc__py_utf8_decode(s + start, *n - start, &cp);
        if (!dsc__py_isspace(cp)) return;
        *n = start;
    }
}

void dsc__py_strip(const char **s, size_t *n) {
    while (*n > 0) {
        uint32_t cp;
        size_t len = dsc__py_utf8_decode(*s, *n, &cp);
        if (!dsc__py_isspace(cp)) break;
        *s += len;
        *n -= len;
    }
    dsc__py_rstrip(*s, n);
}

// ---- numbers as pydantic and Python read them ----

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// digitpart := digit ('_'? digit)*, copied without the underscores into out. Returns the
// number of characters consumed (0: no digitpart).
static size_t digitpart(const char *s, size_t n, char *out, size_t *olen, size_t cap) {
    size_t i = 0;
    while (i < n && is_digit(s[i])) {
        if (*olen + 1 < cap) out[(*olen)++] = s[i];
        i++;
        if (i + 1 < n && s[i] == '_' && is_digit(s[i + 1])) i++;
    }
    return i;
}

// Copy s without Python spaces around into a NUL-terminated buffer; false when too long.
static bool stripped_copy(const char *s, char *buf, size_t cap, size_t *len) {
    size_t n = strlen(s);
    dsc__py_strip(&s, &n);
    if (n + 1 > cap) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    *len = n;
    return true;
}

bool dsc__lax_bool(const char *s, bool *out) {
    static const char *const yes[] = {"1", "true", "yes", "on", "t", "y"};
    static const char *const no[] = {"0", "false", "no", "off", "f", "n"};
    for (size_t k = 0; k < sizeof yes / sizeof yes[0]; k++) {
        if (!strcasecmp(s, yes[k])) return *out = true, true;
        if (!strcasecmp(s, no[k])) return *out = false, true;
    }
    return false;
}

bool dsc__lax_int(const char *s, double *out) {
    char buf[512], num[512];
    size_t n, i = 0, k = 0;
    if (!stripped_copy(s, buf, sizeof buf, &n)) return false;
    if (i < n && (buf[i] == '+' || buf[i] == '-')) num[k++] = buf[i++];
    size_t d = digitpart(buf + i, n - i, num, &k, sizeof num);
    if (d == 0) return false;
    i += d;
    if (i < n && buf[i] == '.') { // "2.000" is an integer to pydantic; "2." is not
        size_t zeros = 0;
        for (i++; i < n && buf[i] == '0'; i++) zeros++;
        if (zeros == 0) return false;
    }
    if (i != n) return false;
    num[k] = '\0';
    *out = strtod(num, NULL);
    return true;
}

static bool special_float(const char *s, double *out) {
    const char *t = s + (s[0] == '+' || s[0] == '-');
    double sign = s[0] == '-' ? -1.0 : 1.0;
    if (!strcasecmp(t, "inf") || !strcasecmp(t, "infinity")) return *out = sign * INFINITY, true;
    if (!strcasecmp(t, "nan")) return *out = NAN, true;
    return false;
}

bool dsc__lax_float(const char *s, double *out) {
    char buf[512], num[512];
    size_t n, i = 0, k = 0;
    if (!stripped_copy(s, buf, sizeof buf, &n)) return false;
    if (special_float(buf, out)) return true;
    if (i < n && (buf[i] == '+' || buf[i] == '-')) num[k++] = buf[i++];
    size_t whole = digitpart(buf + i, n - i, num, &k, sizeof num), frac = 0;
    i += whole;
    if (i < n && buf[i] == '.') {
        num[k++] = buf[i++];
        frac = digitpart(buf + i, n - i, num, &k, sizeof num);
        i += frac;
    }
    if (whole == 0 && frac == 0) return false;
    if (i < n && (buf[i] == 'e' || buf[i] == 'E')) {
        num[k++] = buf[i++];
        if (i < n && (buf[i] == '+' || buf[i] == '-')) num[k++] = buf[i++];
        size_t e = digitpart(buf + i, n - i, num, &k, sizeof num);
        if (e == 0) return false;
        i += e;
    }
    if (i != n || k + 1 > sizeof num) return false;
    num[k] = '\0';
    *out = strtod(num, NULL);
    return true;
}

// ---- int(text, 16) ----

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

bool dsc__py_int16(const char *s, size_t n, long *out) {
    for (size_t k = 0; k < n; k++)
        if ((unsigned char)s[k] >= 0x80) return false;
    dsc__py_strip(&s, &n);
    size_t i = 0;
    long sign = 1, v = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) sign = s[i++] == '-' ? -1 : 1;
    if (i + 1 < n && s[i] == '0' && (s[i + 1] == 'x' || s[i + 1] == 'X')) {
        i += 2;
        if (i < n && s[i] == '_') i++; // Python allows "0x_1f"
    }
    if (i >= n || hex_value(s[i]) < 0) return false;
    while (i < n) {
        if (s[i] == '_') i++; // one underscore, then a digit must follow
        if (i >= n || hex_value(s[i]) < 0) return false;
        v = v * 16 + hex_value(s[i++]);
    }
    *out = sign * v;
    return true;
}
