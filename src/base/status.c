// base/status.c - status names and the per-thread last-error message.
#include "base/status.h"

#include <stdarg.h> // va_list
#include <stdio.h>  // vsnprintf, fprintf
#include <stdlib.h> // abort
#include <string.h> // memmove, strlen

#define DSC_ERROR_MAX 2048

static _Thread_local char last_error[DSC_ERROR_MAX];

const char *dsc_status_name(dsc_status st) {
    static const char *names[] = {
        "DSC_OK",          "DSC_ERR_INVALID_ARG", "DSC_ERR_CONFIG", "DSC_ERR_OOM",
        "DSC_ERR_IO",      "DSC_ERR_SYSTEM",      "DSC_ERR_TIMEOUT", "DSC_ERR_PEER",
        "DSC_ERR_CUDA",    "DSC_ERR_NCCL",        "DSC_ERR_MPI",     "DSC_ERR_CORRUPT",
        "DSC_ERR_INTERNAL", "DSC_ERR_UNSUPPORTED", "DSC_ERR_ABORTED",
    };
    if ((unsigned)st < sizeof(names) / sizeof(names[0])) return names[st];
    return "DSC_ERR_UNKNOWN";
}

const char *dsc_last_error(void) { return last_error; }

void dsc_clear_error(void) { last_error[0] = '\0'; }

dsc_status dsc_fail(dsc_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return st;
}

void dsc_error_prefix(const char *fmt, ...) {
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n <= 0) return;
    size_t plen = strlen(prefix);
    if (!strncmp(last_error, prefix, plen)) return; // said once already (nested callers)
    size_t elen = strlen(last_error);
    if (plen + elen + 1 > sizeof last_error) elen = sizeof last_error - plen - 1;
    memmove(last_error + plen, last_error, elen);
    memcpy(last_error, prefix, plen);
    last_error[plen + elen] = '\0';
}

void dsc__assert_fail(const char *what, const char *file, int line) {
    fprintf(stderr, "dsc: internal error: assertion `%s` failed at %s:%d; please report this\n",
            what, file, line);
    abort();
}
