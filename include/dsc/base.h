// dsc/base.h - what the library's base layer has that a program built on libdsc shares with it:
// the monotonic clock the library times itself with, dsc's environment switches as the library
// reads them, and mkdir -p with dsc's errors. Errors are a dsc_status with a sentence for
// dsc_last_error() (dsc/status.h).
#ifndef DSC_BASE_H
#define DSC_BASE_H

#include <stdio.h> // FILE

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

// ---- reading files ----

// Open path for reading, refusing whatever is not a regular file (after symbolic links) before
// anything waits on it: a FIFO or a socket would block the first read (or the open itself) for
// ever, a device may never end, and a directory fails later with an obscure reason ("No such
// device" from mmap). DSC_ERR_IO naming the path: "PATH is a directory", "PATH is a FIFO (named
// pipe), not a regular file", ..., or why it cannot be opened. *fd is close-on-exec, caller
// closes; -1 on failure.
dsc_status dsc_open_regular(const char *path, int *fd);
// The same as a stdio stream ("rb"), caller fcloses; NULL on failure.
dsc_status dsc_fopen_regular(const char *path, FILE **f);

#ifdef __cplusplus
}
#endif
#endif
