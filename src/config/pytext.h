// config/pytext.h - the text rules DeepSpeed's config readers inherit from Python and pydantic.
//
// DeepSpeed is Python: its config loader strips "whitespace" as str.strip() does, and its
// pydantic-checked sections (zero_optimization, fp16, bf16, ...) coerce strings to booleans and
// numbers the way pydantic 2 does in lax mode. dsc reproduces those rules here, for ASCII text
// (non-ASCII digits, which Python also accepts, are not numbers to dsc).
#ifndef DSC_CONFIG_PYTEXT_H
#define DSC_CONFIG_PYTEXT_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint32_t

// str.isspace() for one code point.
bool dsc__py_isspace(uint32_t cp);

// Decode the code point of valid UTF-8 at s (n > 0 bytes left); returns its length in bytes.
size_t dsc__py_utf8_decode(const char *s, size_t n, uint32_t *cp);

// Length in bytes of the valid UTF-8 prefix of s[0, n); == n when all of it is valid. Strict as
// Python's decoder: no overlong forms, no surrogates, nothing above U+10FFFF.
size_t dsc__py_utf8_valid_prefix(const char *s, size_t n);

// str.strip() / str.rstrip() on s[0, *n): moves *s and shortens *n.
void dsc__py_strip(const char **s, size_t *n);
void dsc__py_rstrip(const char *s, size_t *n);

// pydantic 2 (lax mode) reading a string as a bool: "1/0, true/false, yes/no, on/off, t/f, y/n",
// any case, no surrounding spaces.
bool dsc__lax_bool(const char *s, bool *out);

// ... as an int: Python spaces around, a sign, decimal digits with single '_' between them, and
// optionally '.' followed by zeros only ("2.00"). *out may be beyond int64 (then approximate).
bool dsc__lax_int(const char *s, double *out);

// ... as a float: Python's float() syntax (digits with '_', '.', exponent, inf, nan).
bool dsc__lax_float(const char *s, double *out);

// Python's int(text, 16) for ASCII text: spaces around, a sign, an optional 0x prefix, hex digits
// with single '_' between them. Returns false when Python would raise.
bool dsc__py_int16(const char *s, size_t n, long *out);

#endif
