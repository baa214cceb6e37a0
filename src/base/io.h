// base/io.h - file-system steps several layers need: mkdir -p, opening input files that are
// regular files, and the loop every writer of a file descriptor needs.
#ifndef DSC_BASE_IO_H
#define DSC_BASE_IO_H

#include <stddef.h> // size_t

#include "dsc/base.h"   // dsc_mkdirs
#include "dsc/status.h" // dsc_status

// mkdir -p: the public dsc_mkdirs (dsc/base.h) under the name the library's files call it by.
#define dsc__mkdirs dsc_mkdirs
// Reading regular files only (FIFOs, sockets, devices and directories refused): dsc/base.h.
#define dsc__open_regular dsc_open_regular
#define dsc__fopen_regular dsc_fopen_regular

// Write all n bytes of buf to fd (retrying short writes and EINTR, at most 1 GiB a call).
// DSC_ERR_IO naming path (what the message calls the file) and the reason on failure.
dsc_status dsc__write_all(int fd, const void *buf, size_t n, const char *path);

#endif
