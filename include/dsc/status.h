// dsc/status.h - status codes and the last-error message of the calling thread.
#ifndef DSC_STATUS_H
#define DSC_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

// Categories, so that a caller can tell whose fault a failure is. Append-only.
typedef enum dsc_status {
    DSC_OK = 0,
    DSC_ERR_INVALID_ARG = 1, // the caller passed something impossible
    DSC_ERR_CONFIG = 2,      // the configuration is malformed or inconsistent
    DSC_ERR_OOM = 3,         // an allocation failed
    DSC_ERR_IO = 4,          // a file could not be read or written
    DSC_ERR_SYSTEM = 5,      // an operating-system call failed
    DSC_ERR_TIMEOUT = 6,     // a deadline passed
    DSC_ERR_PEER = 7,        // another rank died or misbehaved
    DSC_ERR_CUDA = 8,
    DSC_ERR_NCCL = 9,
    DSC_ERR_MPI = 10,
    DSC_ERR_CORRUPT = 11,    // data failed a format or checksum check
    DSC_ERR_INTERNAL = 12,   // a broken invariant: a bug in dsc
    DSC_ERR_UNSUPPORTED = 13, // asked for something this build or version does not do
    DSC_ERR_ABORTED = 14     // another rank stopped the job with an error of its own
                             // (dsc_engine_abort): not a fault to recover from
} dsc_status;

// Short stable name of a status code ("DSC_ERR_CONFIG").
const char *dsc_status_name(dsc_status st);

// The sentence recorded by the most recent failure on this thread: what failed, which
// file/key/rank, and what to do. Empty string when nothing has failed. Borrowed; valid until the
// next dsc call on this thread.
const char *dsc_last_error(void);

// Forget the recorded message (e.g. after handling an expected failure).
void dsc_clear_error(void);

// ---- for code that returns dsc_status itself ----
// A program's own functions (a model family's table, a fill callback, wiring around the
// library's calls) report failures the library's way with these.

#if defined(__GNUC__) || defined(__clang__)
#define DSC_PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define DSC_PRINTF_LIKE(f, a)
#endif

// Record a sentence for dsc_last_error() (printf's format) and return st, so that a failure
// reads `return dsc_fail(DSC_ERR_IO, "open %s: %s", path, strerror(errno));`.
dsc_status dsc_fail(dsc_status st, const char *fmt, ...) DSC_PRINTF_LIKE(2, 3);

// Put context before the sentence already recorded ("config foo.json: " + "..."); the whole
// stays within the recorded message's 1023 bytes.
void dsc_error_prefix(const char *fmt, ...) DSC_PRINTF_LIKE(1, 2);

// Return a failure to the caller.
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

#ifdef __cplusplus
}
#endif
#endif
