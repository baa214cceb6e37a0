// base/status.h - internal error helpers: recording messages and propagating status codes.
#ifndef DSC_BASE_STATUS_H
#define DSC_BASE_STATUS_H

#include "dsc/status.h"

// Record a message for dsc_last_error() and return `st`, so that call sites read
// `return dsc__fail(DSC_ERR_IO, "open %s: %s", path, strerror(errno));`
dsc_status dsc__fail(dsc_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// Prepend context to the message already recorded ("config foo.json: " + "...").
void dsc__error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Propagate a failure to the caller.
#define DSC_TRY(expr)                                                                          \
    do {                                                                                       \
        dsc_status dsc__st_ = (expr);                                                          \
        if (dsc__st_ != DSC_OK) return dsc__st_;                                               \
    } while (0)

// Store a failure in `st` and jump to the function's cleanup label.
#define DSC_TRY_GOTO(expr, st, label)                                                          \
    do {                                                                                       \
        (st) = (expr);                                                                         \
        if ((st) != DSC_OK) goto label;                                                        \
    } while (0)

// Broken invariants only (programming errors), never bad input.
#define DSC_ASSERT(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) dsc__assert_fail(#cond, __FILE__, __LINE__);                             \
    } while (0)
void dsc__assert_fail(const char *what, const char *file, int line) __attribute__((noreturn));

#endif
