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

// The pages of a read-only private file mapping that hold [p, p + n) leave this process's resident
// set (madvise MADV_DONTNEED, the range rounded out to whole pages): what was read from a mapped
// file piece by piece then never stays resident all at once. The mapping stays valid: a later read
// faults the pages in again from the file. Never for anonymous or written memory.
void dsc__map_drop(const void *p, size_t n);

#endif
