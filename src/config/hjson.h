// config/hjson.h - the config file syntax DeepSpeed accepts (Hjson), parsed into a jansson tree.
//
// DeepSpeed reads config files with the hjson reader (version 3.1.0), not a strict JSON reader, so
// dsc takes exactly what that reader takes: comments (# // /* */), unquoted keys, quoteless and
// '''multi-line''' strings, single quotes, optional commas, a top-level object without braces.
// Values come out as hjson makes them: a number with a fraction or exponent that is whole and
// below 1e10 in magnitude is an integer (5e8 -> 500000000, 2.0 -> 2); a quoteless value that is
// not exactly a number or true/false/null is a string.
#ifndef DSC_CONFIG_HJSON_H
#define DSC_CONFIG_HJSON_H

#include <jansson.h> // json_t
#include <stddef.h>  // size_t

#include "dsc/status.h" // dsc_status

// Deepest nesting of objects and lists accepted (the hjson reader stops at Python's recursion
// limit, a little deeper).
#define DSC_HJSON_MAX_DEPTH 200

// Parse `len` bytes of UTF-8 text (NUL bytes allowed) into *out (caller owns; json_decref).
// Duplicate keys in one object are an error, as in DeepSpeed. Strings are stored as UTF-8; the
// rare code points a C string cannot carry are stored so that they never equal a real key: U+0000
// as the bytes C0 80, an unpaired surrogate from a \u escape as its 3-byte form.
// Errors: DSC_ERR_CONFIG, message "config <source>: line L, column C: what was wrong".
dsc_status dsc__hjson_parse(const char *text, size_t len, const char *source, json_t **out);

#endif
