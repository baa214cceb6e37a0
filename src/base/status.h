// base/status.h - internal error helpers: recording messages and propagating status codes.
#ifndef DSC_BASE_STATUS_H
#define DSC_BASE_STATUS_H

#include "dsc/status.h" // dsc_fail, dsc_error_prefix, DSC_TRY, DSC_TRY_GOTO

// The public dsc_fail and dsc_error_prefix (dsc/status.h, with DSC_TRY and DSC_TRY_GOTO) under
// the names the library's files call them by.
#define dsc__fail dsc_fail
#define dsc__error_prefix dsc_error_prefix

// Broken invariants only (programming errors), never bad input.
#define DSC_ASSERT(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) dsc__assert_fail(#cond, __FILE__, __LINE__);                             \
    } while (0)
void dsc__assert_fail(const char *what, const char *file, int line) __attribute__((noreturn));

#endif
