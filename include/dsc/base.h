// dsc/base.h - what the library's base layer has that a program built on libdsc shares with it:
// the monotonic clock the library times itself with, dsc's environment switches as the library
// reads them, and mkdir -p with dsc's errors. Errors are a dsc_status with a sentence for
// dsc_last_error() (dsc/status.h).
#ifndef DSC_BASE_H
#define DSC_BASE_H

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// ---- clocks ----

// Seconds on the monotonic clock (arbitrary origin): differences time a step, a save, a call.
double dsc_now(void);
// Seconds since the Unix epoch (the wall clock), for logs and manifests.
double dsc_wall_time(void);

// ---- environment switches ----

// The value of dsc's environment switch `name` (a row of docs/environment.md, e.g.
// "DSC_COMM_BACKEND"), read now: getenv's, borrowed until the environment changes; NULL when it
// is unset. A name that is not one of dsc's switches is NULL too, and records a sentence naming
// it for dsc_last_error(), so that a misspelt switch is told apart from an unset one.
const char *dsc_env(const char *name);

// ---- directories ----

// mkdir -p: path and every missing parent, mode 0777 less the umask ("" is fine). DSC_ERR_IO
// naming the directory that could not be made or exists as something else; DSC_ERR_INVALID_ARG
// for a path longer than 4095 bytes.
dsc_status dsc_mkdirs(const char *path);

#ifdef __cplusplus
}
#endif
#endif
