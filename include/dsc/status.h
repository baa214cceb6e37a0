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
    DSC_ERR_UNSUPPORTED = 13 // asked for something this build or version does not do
} dsc_status;

// Short stable name of a status code ("DSC_ERR_CONFIG").
const char *dsc_status_name(dsc_status st);

// The sentence recorded by the most recent failure on this thread: what failed, which
// file/key/rank, and what to do. Empty string when nothing has failed. Borrowed; valid until the
// next dsc call on this thread.
const char *dsc_last_error(void);

// Forget the recorded message (e.g. after handling an expected failure).
void dsc_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
