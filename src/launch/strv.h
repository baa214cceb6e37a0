// launch/strv.h - the launcher's strings: growable vectors (argv, environments), a growable
// buffer, POSIX shell quoting and splitting, `.deepspeed_env` files.
#ifndef DSC_LAUNCH_STRV_H
#define DSC_LAUNCH_STRV_H

#include <stddef.h> // size_t

#include "dsc/status.h" // dsc_status

// A NULL-terminated vector of owned strings, usable directly as argv or envp. Zero-initialize.
// Invariant: v == NULL (n == 0) or v[n] == NULL.
typedef struct dsc__strv {
    char **v;
    int n, cap;
} dsc__strv;

dsc_status dsc__strv_push(dsc__strv *s, const char *x); // copies x
dsc_status dsc__strv_pushf(dsc__strv *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
dsc_status dsc__strv_extend(dsc__strv *s, char *const *xs, int n); // copies xs[0..n)
void dsc__strv_free(dsc__strv *s);                                  // leaves s zeroed

// Environment vectors of "KEY=VALUE": set replaces an existing KEY (or appends); get returns
// the value borrowed from env, or NULL.
dsc_status dsc__strv_setenv(dsc__strv *env, const char *key, const char *value);
const char *dsc__strv_getenv(const dsc__strv *env, const char *key);

// A growable, always NUL-terminated character buffer. Zero-initialize; p stays NULL until the
// first append.
typedef struct dsc__sbuf {
    char *p;
    size_t n, cap;
} dsc__sbuf;

dsc_status dsc__sbuf_add(dsc__sbuf *b, const char *s, size_t len);
dsc_status dsc__sbuf_addf(dsc__sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dsc__sbuf_free(dsc__sbuf *b);

// Append `word` quoted for a POSIX shell: unchanged when made only of safe characters
// ([A-Za-z0-9_./:=,+@%-]), otherwise in single quotes with each ' written as '\''.
dsc_status dsc__launch_shell_quote(dsc__sbuf *b, const char *word);

// Split a command-line fragment the way a shell would split words (whitespace separates; '...'
// and "..." quote; backslash escapes outside single quotes); no expansions. Appends to out.
// DSC_ERR_INVALID_ARG on an unterminated quote or a trailing backslash.
dsc_status dsc__launch_split_words(const char *s, dsc__strv *out);

// Parse a `.deepspeed_env` file: one KEY=VALUE per line (the value is the rest of the line, as
// written; surrounding whitespace of the line is dropped), blank lines and lines starting with #
// are skipped. Appends "KEY=VALUE" strings to kv (a later KEY replaces an earlier one). `origin`
// names the file in messages. DSC_ERR_CONFIG on a line without '=' or with a bad KEY.
dsc_status dsc__launch_envfile_parse(const char *text, const char *origin, dsc__strv *kv);

// Read a whole file (at most max bytes) into a NUL-terminated string; caller frees.
dsc_status dsc__launch_read_file(const char *path, size_t max, char **out);

#endif
