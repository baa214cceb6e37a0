// base/io.c - see io.h.
#include "base/io.h"

#include <errno.h>    // errno, EINTR, ENOSPC, EEXIST
#include <fcntl.h>    // open, fcntl, O_*
#include <stdio.h>    // snprintf
#include <string.h>   // strerror, strlen, memcpy
#include <stdint.h>   // uintptr_t
#include <sys/mman.h> // madvise
#include <sys/stat.h> // mkdir, stat
#include <unistd.h>   // write, close

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

// What a file that is not a regular one is, for the message.
static const char *not_regular(mode_t m) {
    if (S_ISDIR(m)) return "is a directory";
    if (S_ISFIFO(m)) return "is a FIFO (named pipe), not a regular file";
    if (S_ISSOCK(m)) return "is a socket, not a regular file";
    if (S_ISCHR(m) || S_ISBLK(m)) return "is a device, not a regular file";
    return "is not a regular file";
}

dsc_status dsc_open_regular(const char *path, int *out) {
    *out = -1;
    struct stat sb;
    // stat before open: opening a FIFO for reading waits for a writer, a device may act on open
    if (stat(path, &sb) != 0)
        return dsc__fail(DSC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) return dsc__fail(DSC_ERR_IO, "%s %s", path, not_regular(sb.st_mode));
    // O_NONBLOCK: the path may have been replaced by a FIFO since; fstat says what was opened
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) return dsc__fail(DSC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return dsc__fail(DSC_ERR_IO, "%s %s", path, not_regular(sb.st_mode));
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *out = fd;
    return DSC_OK;
}

dsc_status dsc_fopen_regular(const char *path, FILE **out) {
    *out = NULL;
    int fd;
    DSC_TRY(dsc_open_regular(path, &fd));
    if (!(*out = fdopen(fd, "rb"))) {
        int e = errno;
        close(fd);
        return dsc__fail(DSC_ERR_IO, "cannot open %s: %s", path, strerror(e));
    }
    return DSC_OK;
}

void dsc__map_drop(const void *p, size_t n) {
    if (!p || !n) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p / page * page, hi = ((uintptr_t)p + n + page - 1) / page * page;
    (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); // advice: a failure only keeps the pages
}
