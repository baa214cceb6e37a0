// data/jinja.h - the subset of the Jinja template language that published chat templates use,
// rendered as Hugging Face's apply_chat_template renders them (jinja2 with trim_blocks,
// lstrip_blocks, the loop controls and its own tojson, raise_exception and strftime_now).
//
// Supported (docs/data.md lists it for users):
//   statements  for (tuple targets, `if` filter, else, loop.index/index0/revindex/revindex0/
//               first/last/length/previtem/nextitem, break, continue), if/elif/else, set (names,
//               tuples, ns.attr, block set), macro (parameters with defaults), generation
//   expressions literals (strings, numbers, true/false/none, lists, dicts, tuples), names,
//               a.b, a[b], slices a[b:c:d], calls, filters, tests, + - * / // % ** ~, comparisons,
//               in / not in, and / or / not, `x if c else y`
//   filters, tests, methods and globals: see jinja_lib.c's tables
// Anything else ({% call %}, {% include %}, an unknown filter, test, method or function) is
// refused when the template is compiled, naming the construct and its line.
#ifndef DSC_DATA_JINJA_H
#define DSC_DATA_JINJA_H

#include <jansson.h> // json_t
#include <stddef.h>  // size_t

#include "dsc/status.h" // dsc_status

typedef struct dsc_jinja dsc_jinja;

// Compile a template; name says what it is in messages ("chat template of X"). Errors:
// DSC_ERR_CONFIG naming the line and the construct. Caller owns *out.
dsc_status dsc_jinja_compile(const char *src, const char *name, dsc_jinja **out);
void dsc_jinja_destroy(dsc_jinja *t); // NULL is a no-op

// Render with the variables of vars (a JSON object, borrowed). *out is caller-owned (free()),
// NUL-terminated; *len excludes the NUL. Errors: DSC_ERR_INVALID_ARG for what the data makes go
// wrong (raise_exception's message, a type error, an undefined value used), naming the line.
dsc_status dsc_jinja_render(const dsc_jinja *t, json_t *vars, char **out, size_t *len);

#endif
