// ckpt/fs.c - durable file-system steps for checkpoints (see fs.h).
#include "engine/ckpt/fs.h"

#include <dirent.h>   // opendir, readdir
#include <errno.h>    // errno
#include <fcntl.h>    // open
#include <stdio.h>    // snprintf, rename
#include <stdlib.h>   // malloc, free, qsort
#include <string.h>   // strcmp, strerror, strdup
#include <sys/stat.h> // mkdir, stat
#include <unistd.h>   // fsync, close, unlink, rmdir, getpid

#include "base/io.h"     // dsc__write_all
#include "base/status.h" // dsc__fail

dsc_status dsc__ckpt_join(char *out, size_t cap, const char *a, const char *b) {
    int n = snprintf(out, cap, "%s/%s", a, b);
    if (n < 0 || (size_t)n >= cap)
        return dsc__fail(DSC_ERR_INVALID_ARG, "path %s/%s is longer than %zu bytes", a, b, cap - 1);
    return DSC_OK;
}

dsc_status dsc__ckpt_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dsc__fail(DSC_ERR_IO, "cannot open %s to fsync it: %s", path, strerror(errno));
    int rc = fsync(fd), err = errno;
    close(fd);
    if (rc != 0) return dsc__fail(DSC_ERR_IO, "fsync %s: %s", path, strerror(err));
    return DSC_OK;
}

// The directory part of path ("." when there is none).
static void parent_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, cap, ".");
    else if (slash == path) snprintf(out, cap, "/");
    else snprintf(out, cap, "%.*s", (int)(slash - path), path);
}

dsc_status dsc__ckpt_write_file(const char *path, const void *data, size_t n, bool atomic) {
    char tmp[DSC_CKPT_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    const char *target = atomic ? tmp : path;
    int fd = open(target, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dsc__fail(DSC_ERR_IO, "cannot create %s: %s", target, strerror(errno));
    dsc_status st = dsc__write_all(fd, data, n, target);
    if (st == DSC_OK && fsync(fd) != 0) st = dsc__fail(DSC_ERR_IO, "fsync %s: %s", target, strerror(errno));
    close(fd);
    if (st != DSC_OK || !atomic) {
        if (st != DSC_OK && atomic) unlink(tmp);
        return st;
    }
    if (rename(tmp, path) != 0) {
        st = dsc__fail(DSC_ERR_IO, "rename %s to %s: %s", tmp, path, strerror(errno));
        unlink(tmp);
        return st;
    }
    char dir[DSC_CKPT_PATH_MAX];
    parent_of(path, dir, sizeof dir);
    return dsc__ckpt_fsync_path(dir);
}

dsc_status dsc__ckpt_read_file(const char *path, char **out, size_t *n) {
    *out = NULL;
    *n = 0;
    int fd;
    DSC_TRY(dsc__open_regular(path, &fd));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return dsc__fail(DSC_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    if (!buf) {
        close(fd);
        return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    }
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)sb.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *n = got;
    return DSC_OK;
}

bool dsc__ckpt_is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

bool dsc__ckpt_exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

dsc_status dsc__ckpt_rmtree(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) != 0) return DSC_OK;
    if (!S_ISDIR(sb.st_mode)) {
        if (unlink(path) != 0 && errno != ENOENT)
            return dsc__fail(DSC_ERR_IO, "cannot remove %s: %s", path, strerror(errno));
        return DSC_OK;
    }
    char **names;
    int n;
    DSC_TRY(dsc__ckpt_list_dir(path, &names, &n));
    dsc_status st = DSC_OK;
    for (int i = 0; i < n && st == DSC_OK; i++) {
        char child[DSC_CKPT_PATH_MAX];
        st = dsc__ckpt_join(child, sizeof child, path, names[i]);
        if (st == DSC_OK) st = dsc__ckpt_rmtree(child);
    }
    dsc__ckpt_free_names(names, n);
    if (st == DSC_OK && rmdir(path) != 0 && errno != ENOENT)
        st = dsc__fail(DSC_ERR_IO, "cannot remove directory %s: %s", path, strerror(errno));
    return st;
}

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

dsc_status dsc__ckpt_list_dir(const char *dir, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOENT) return DSC_OK;
        return dsc__fail(DSC_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    }
    int cap = 0;
    char **v = NULL;
    dsc_status st = DSC_OK;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) {
                st = dsc__fail(DSC_ERR_OOM, "out of memory listing %s", dir);
                break;
            }
            v = nv;
        }
        if (!(v[*n] = strdup(e->d_name))) {
            st = dsc__fail(DSC_ERR_OOM, "out of memory listing %s", dir);
            break;
        }
        (*n)++;
    }
    closedir(d);
    if (st != DSC_OK) {
        dsc__ckpt_free_names(v, *n);
        *n = 0;
        return st;
    }
    if (*n > 1) qsort(v, (size_t)*n, sizeof *v, cmp_names);
    *names = v;
    return DSC_OK;
}

void dsc__ckpt_free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}
