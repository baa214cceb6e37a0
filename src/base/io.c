// base/io.c - see io.h.
#include "base/io.h"

#include <errno.h>  // errno, EINTR, ENOSPC
#include <string.h> // strerror
#include <unistd.h> // write

#include "base/status.h" // dsc__fail

dsc_status dsc__write_all(int fd, const void *buf, size_t n, const char *path) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = w < 0 ? errno : ENOSPC; // a write of 0 bytes: the device took nothing
            return dsc__fail(DSC_ERR_IO, "write %s: %s; check free disk space and permissions",
                             path, strerror(err));
        }
        p += w;
        n -= (size_t)w;
    }
    return DSC_OK;
}
