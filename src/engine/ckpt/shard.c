// ckpt/shard.c - a rank's shard file: header and streaming write (see shard.h).
#define _GNU_SOURCE // O_DIRECT
#include "engine/ckpt/shard.h"

#include <errno.h>   // errno
#include <fcntl.h>   // open, posix_fadvise
#include <jansson.h> // json_*
#include <stdio.h>   // snprintf
#include <stdint.h>  // uintptr_t
#include <stdlib.h>  // posix_memalign, free
#include <string.h>  // memcpy, strerror
#include <unistd.h>  // write, fsync, close

#include "base/hash.h"   // dsc_hasher_*
#include "base/status.h" // dsc__fail

#define CHUNK (8u << 20) // bytes hashed and written per call (a multiple of DSC_SHARD_ALIGN)

void dsc__shard_tensor_name(const dsc__manifest *m, int kind, int g, char *out, size_t cap) {
    snprintf(out, cap, "%s.g%d", kind == 0 ? "master" : m->moments[kind - 1], g);
}

size_t dsc__shard_part(const dsc__manifest *m) {
    size_t part = 0;
    for (int g = 0; g < m->ngroups; g++) part += m->groups[g].slice;
    return part;
}

static json_t *shard_meta(const dsc__manifest *m, int rank) {
    char buf[12][48];
    const dsc_state_scalars *s = &m->scalars;
    snprintf(buf[0], sizeof buf[0], "%d", DSC_CKPT_FORMAT_VERSION);
    snprintf(buf[1], sizeof buf[1], "%lld", (long long)m->step);
    snprintf(buf[2], sizeof buf[2], "%d", rank);
    snprintf(buf[3], sizeof buf[3], "%d", m->world);
    snprintf(buf[4], sizeof buf[4], "%lld", (long long)s->global_steps);
    snprintf(buf[5], sizeof buf[5], "%lld", (long long)s->applied_steps);
    snprintf(buf[6], sizeof buf[6], "%lld", (long long)s->skipped_steps);
    snprintf(buf[7], sizeof buf[7], "%.17g", s->cur_scale);
    snprintf(buf[8], sizeof buf[8], "%lld", (long long)s->cur_iter);
    snprintf(buf[9], sizeof buf[9], "%lld", (long long)s->last_overflow_iter);
    snprintf(buf[10], sizeof buf[10], "%d", s->cur_hysteresis);
    snprintf(buf[11], sizeof buf[11], "%d", m->stage);
    return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s, s:s}",
                     "format", DSC_CKPT_SHARD_FORMAT, "format_version", buf[0], "tag", m->tag,
                     "step", buf[1], "rank", buf[2], "world_size", buf[3], "zero_stage", buf[11],
                     "global_steps", buf[4], "applied_steps", buf[5], "skipped_steps", buf[6],
                     "loss_scale", buf[7], "scaler_iter", buf[8], "scaler_last_overflow_iter",
                     buf[9], "scaler_hysteresis", buf[10]);
}

dsc_status dsc__shard_header(const dsc__manifest *m, int rank, char **out, size_t *len) {
    *out = NULL;
    json_t *h = json_object();
    json_object_set_new(h, "__metadata__", shard_meta(m, rank));
    size_t off = 0;
    for (int kind = 0; kind <= m->nmoments; kind++) {
        for (int g = 0; g < m->ngroups; g++) {
            char name[64];
            dsc__shard_tensor_name(m, kind, g, name, sizeof name);
            size_t nb = m->groups[g].slice * sizeof(float);
            json_object_set_new(h, name, json_pack("{s:s, s:[I], s:[I,I]}", "dtype", "F32", "shape",
                                                   (json_int_t)m->groups[g].slice, "data_offsets",
                                                   (json_int_t)off, (json_int_t)(off + nb)));
            off += nb;
        }
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!text) return dsc__fail(DSC_ERR_OOM, "out of memory for a shard header");
    // Padded with spaces (the format allows it) so that the data starts on a 4 KiB boundary:
    // the writer can then stream it with O_DIRECT.
    size_t tl = strlen(text), padded = (8 + tl + DSC_SHARD_ALIGN - 1) / DSC_SHARD_ALIGN * DSC_SHARD_ALIGN - 8;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, DSC_SHARD_ALIGN, 8 + padded) != 0) buf = NULL;
    if (!buf) {
        free(text);
        return dsc__fail(DSC_ERR_OOM, "out of memory for a shard header");
    }
    uint64_t n8 = padded; // little-endian on every machine dsc supports
    memcpy(buf, &n8, 8);
    memcpy(buf + 8, text, tl);
    memset(buf + 8 + tl, ' ', padded - tl);
    free(text);
    *out = buf;
    *len = 8 + padded;
    return DSC_OK;
}

// Hash and write n bytes from p, in chunks.
static dsc_status write_hashed(int fd, const char *p, size_t n, dsc_hasher *h, const char *path) {
    while (n > 0) {
        size_t c = n < CHUNK ? n : CHUNK;
        dsc_hasher_update(h, p, c);
        size_t done = 0;
        while (done < c) {
            ssize_t w = write(fd, p + done, c - done);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0)
                return dsc__fail(DSC_ERR_IO, "write %s: %s; check free space on the checkpoint "
                                 "disk", path, w < 0 ? strerror(errno) : "no progress");
            done += (size_t)w;
        }
        p += c;
        n -= c;
    }
    return DSC_OK;
}

static bool aligned(const void *p, size_t n) {
    return (uintptr_t)p % DSC_SHARD_ALIGN == 0 && n % DSC_SHARD_ALIGN == 0;
}

// The aligned bulk with O_DIRECT (no copy into the page cache: a fraction of the CPU time, and
// the disk's full speed), the tail through the page cache. Falls back to buffered writes where
// the file system refuses O_DIRECT.
static dsc_status write_body(int fd, const void *header, size_t hlen, const void *data, size_t n,
                             dsc_hasher *h, const char *path) {
    size_t bulk = n / DSC_SHARD_ALIGN * DSC_SHARD_ALIGN;
    int flags = fcntl(fd, F_GETFL);
    bool direct = aligned(header, hlen) && aligned(data, 0) && flags >= 0 &&
                  fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
    dsc_status st = write_hashed(fd, header, hlen, h, path);
    if (st == DSC_OK) st = write_hashed(fd, data, direct ? bulk : n, h, path);
    if (direct) {
        fcntl(fd, F_SETFL, flags);
        if (st == DSC_OK) st = write_hashed(fd, (const char *)data + bulk, n - bulk, h, path);
    }
    return st;
}

// Header + data (one block, or nseg pieces when segs is set) into a new file, fsynced.
static dsc_status write_file(const char *path, const void *header, size_t hlen, const void *data,
                             size_t n, const dsc__shard_seg *segs, int nseg, uint64_t *bytes,
                             uint64_t *xxh3) {
    dsc_hasher *h = dsc_hasher_create();
    if (!h) return dsc__fail(DSC_ERR_OOM, "out of memory for a checksum");
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        dsc_hasher_destroy(h);
        return dsc__fail(DSC_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    }
    dsc_status st;
    if (segs) {
        st = write_hashed(fd, header, hlen, h, path);
        n = 0;
        for (int k = 0; k < nseg && st == DSC_OK; k++) {
            st = write_hashed(fd, segs[k].p, segs[k].bytes, h, path);
            n += segs[k].bytes;
        }
    } else {
        st = write_body(fd, header, hlen, data, n, h, path);
    }
    if (st == DSC_OK && fsync(fd) != 0) st = dsc__fail(DSC_ERR_IO, "fsync %s: %s", path, strerror(errno));
    // Durable now: its pages need not stay cached, and validation then reads the disk.
    if (st == DSC_OK) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    *bytes = hlen + n;
    *xxh3 = dsc_hasher_digest(h);
    dsc_hasher_destroy(h);
    return st;
}

dsc_status dsc__shard_write_pull(const char *path, const void *header, size_t hlen, size_t n,
                                 dsc__shard_pull_fn pull, void *user, uint64_t *bytes,
                                 uint64_t *xxh3) {
    enum { PIECE = 64 << 20 }; // a multiple of CHUNK
    size_t cap = n < PIECE ? n : PIECE;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, DSC_SHARD_ALIGN,
                       (cap + DSC_SHARD_ALIGN - 1) / DSC_SHARD_ALIGN * DSC_SHARD_ALIGN +
                           DSC_SHARD_ALIGN) != 0)
        buf = NULL;
    if (!buf) return dsc__fail(DSC_ERR_OOM, "out of memory for a checkpoint's staging");
    dsc_hasher *h = dsc_hasher_create();
    int fd = h ? open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644) : -1;
    dsc_status st = DSC_OK;
    if (!h) st = dsc__fail(DSC_ERR_OOM, "out of memory for a checksum");
    else if (fd < 0) st = dsc__fail(DSC_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    // The aligned pieces with O_DIRECT (as write_body), a short tail through the page cache.
    int flags = fd >= 0 ? fcntl(fd, F_GETFL) : -1;
    bool direct = st == DSC_OK && aligned(header, hlen) && flags >= 0 &&
                  fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
    if (st == DSC_OK) st = write_hashed(fd, header, hlen, h, path);
    for (size_t off = 0; off < n && st == DSC_OK; off += cap) {
        size_t k = n - off < cap ? n - off : cap;
        st = pull(user, buf, off, k);
        if (direct && k % DSC_SHARD_ALIGN) direct = fcntl(fd, F_SETFL, flags) != 0;
        if (st == DSC_OK) st = write_hashed(fd, buf, k, h, path);
    }
    if (direct) fcntl(fd, F_SETFL, flags);
    if (st == DSC_OK && fsync(fd) != 0)
        st = dsc__fail(DSC_ERR_IO, "fsync %s: %s", path, strerror(errno));
    if (st == DSC_OK) posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    if (fd >= 0) close(fd);
    *bytes = hlen + n;
    *xxh3 = h ? dsc_hasher_digest(h) : 0;
    dsc_hasher_destroy(h);
    free(buf);
    return st;
}

dsc_status dsc__shard_write(const char *path, const void *header, size_t hlen, const void *data,
                            size_t n, uint64_t *bytes, uint64_t *xxh3) {
    return write_file(path, header, hlen, data, n, NULL, 0, bytes, xxh3);
}

dsc_status dsc__shard_write_segs(const char *path, const void *header, size_t hlen,
                                 const dsc__shard_seg *segs, int nseg, uint64_t *bytes,
                                 uint64_t *xxh3) {
    return write_file(path, header, hlen, NULL, 0, segs, nseg, bytes, xxh3);
}
