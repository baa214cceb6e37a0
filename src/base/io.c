// base/io.c - see io.h.
#include "base/io.h"

#include <errno.h>    // errno, EINTR, ENOSPC, EEXIST
#include <stdio.h>    // snprintf
#include <string.h>   // strerror, strlen, memcpy
#include <sys/stat.h> // mkdir, stat
#include <unistd.h>   // write

#include "base/status.h" // dsc__fail

dsc_status dsc_mkdirs(const char *path) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0) return DSC_OK;
    if (n >= sizeof buf) return dsc__fail(DSC_ERR_INVALID_ARG, "path too long: %.80s...", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) { // each prefix ending at a '/', then the whole path
        if (buf[i] != '/' && buf[i] != '\0') continue;
        char keep = buf[i];
        buf[i] = '\0';
        struct stat sb;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST)
            return dsc__fail(DSC_ERR_IO, "cannot create directory %s: %s", buf, strerror(errno));
        if (stat(buf, &sb) != 0 || !S_ISDIR(sb.st_mode))
            return dsc__fail(DSC_ERR_IO, "%s exists and is not a directory", buf);
        buf[i] = keep;
    }
    return DSC_OK;
}

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
