// ckpt/ptzipw.c - a zip archive of stored entries written as torch.save writes one (see ptzipw.h).
#include "engine/ckpt/ptzipw.h"

#include <errno.h>   // errno
#include <fcntl.h>   // open
#include <pthread.h> // pthread_once
#include <stdio.h>   // snprintf, rename
#include <stdlib.h>  // calloc, free, malloc
#include <string.h>  // memcpy, memset, strerror, strlen, strrchr
#include <unistd.h>  // close, fsync, unlink

#include "base/io.h"        // dsc__write_all
#include "base/status.h"    // dsc__fail
#include "engine/ckpt/fs.h" // dsc__ckpt_fsync_path

enum {
    ZIP_LOC_SIG = 0x04034b50, ZIP_CEN_SIG = 0x02014b50, ZIP_EOCD_SIG = 0x06054b50,
    ZIP_EOCD64_SIG = 0x06064b50, ZIP_LOC64_SIG = 0x07064b50,
    ZIP_LOC_LEN = 30, ZIP_CEN_LEN = 46, ZIP_EOCD_LEN = 22, ZIP_EOCD64_LEN = 56, ZIP_LOC64_LEN = 20,
    ZIP_LOC_X64 = 20,   // a local header's ZIP64 field: id, length, both sizes
    ZIP_CEN_X64 = 28,   // a central header's: id, length, both sizes, the offset
    ZIP_V2 = 20,        // version needed to extract: plain
    ZIP_V45 = 45,       // ... with ZIP64 fields
    ZIP_UTF8 = 0x0800,  // flag: names are UTF-8
    ZIP_DATE = 0x21,    // 1980-01-01 (torch writes 0, which is no DOS date)
    ZIP_ALIGN = 64,     // torch's alignment of each entry's data
};
#define ZIP_SAT32 0xffffffffu // a 32-bit field whose value is in the ZIP64 extra field

// ---- CRC-32, eight bytes a step ----

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
        crc_tab[0][i] = c;
    }
    for (int t = 1; t < 8; t++) // table t: a byte followed by t zero bytes
        for (int i = 0; i < 256; i++)
            crc_tab[t][i] = crc_tab[t - 1][i] >> 8 ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

uint32_t dsc__crc32(const void *data, uint64_t n) {
    pthread_once(&crc_once, crc_init);
    const uint8_t *p = data;
    uint32_t c = 0xffffffffu;
    for (; n >= 8; n -= 8, p += 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_tab[7][lo & 0xff] ^ crc_tab[6][lo >> 8 & 0xff] ^ crc_tab[5][lo >> 16 & 0xff] ^
            crc_tab[4][lo >> 24] ^ crc_tab[3][hi & 0xff] ^ crc_tab[2][hi >> 8 & 0xff] ^
            crc_tab[1][hi >> 16 & 0xff] ^ crc_tab[0][hi >> 24];
    }
    for (; n > 0; n--, p++) c = crc_tab[0][(c ^ *p) & 0xff] ^ c >> 8;
    return ~c;
}

// ---- records ----

// Little-endian fields into a buffer the caller sized.
typedef struct hbuf {
    uint8_t *p;
    size_t n;
} hbuf;

static void le(hbuf *b, uint64_t x, int bytes) {
    for (int i = 0; i < bytes; i++) b->p[b->n++] = (uint8_t)(x >> (8 * i));
}

static void raw(hbuf *b, const void *s, size_t n) {
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

// The local header at offset loc: both sizes in a ZIP64 field when they need one, then torch's
// "FB" field of 'Z's that pads the data's start to a multiple of 64.
static void local_header(hbuf *b, const dsc__zipw_entry *e, uint64_t loc, bool force) {
    size_t nlen = strlen(e->name), x64 = force || e->size >= ZIP_SAT32 ? ZIP_LOC_X64 : 0;
    uint64_t start = loc + ZIP_LOC_LEN + nlen + x64 + 4;
    size_t pad = (size_t)((ZIP_ALIGN - start % ZIP_ALIGN) % ZIP_ALIGN);
    le(b, ZIP_LOC_SIG, 4);
    le(b, x64 ? ZIP_V45 : ZIP_V2, 2);
    le(b, ZIP_UTF8, 2);
    le(b, 0, 2); // stored
    le(b, 0, 2); // time
    le(b, ZIP_DATE, 2);
    le(b, e->crc, 4);
    le(b, x64 ? ZIP_SAT32 : e->size, 4); // compressed
    le(b, x64 ? ZIP_SAT32 : e->size, 4); // uncompressed
    le(b, nlen, 2);
    le(b, x64 + 4 + pad, 2);
    raw(b, e->name, nlen);
    if (x64) {
        le(b, 1, 2);
        le(b, 16, 2);
        le(b, e->size, 8); // uncompressed, then compressed
        le(b, e->size, 8);
    }
    raw(b, "FB", 2);
    le(b, pad, 2);
    memset(b->p + b->n, 'Z', pad);
    b->n += pad;
}

// The central directory's entry: the sizes and the local header's offset each go to the ZIP64
// field when it needs 32 bits or more.
static void central_header(hbuf *b, const dsc__zipw_entry *e, uint64_t loc, bool force) {
    size_t nlen = strlen(e->name);
    bool big = force || e->size >= ZIP_SAT32, far = force || loc >= ZIP_SAT32;
    size_t x = (big ? 16 : 0) + (far ? 8 : 0);
    le(b, ZIP_CEN_SIG, 4);
    le(b, ZIP_V45, 2); // made by
    le(b, x ? ZIP_V45 : ZIP_V2, 2);
    le(b, ZIP_UTF8, 2);
    le(b, 0, 2); // stored
    le(b, 0, 2); // time
    le(b, ZIP_DATE, 2);
    le(b, e->crc, 4);
    le(b, big ? ZIP_SAT32 : e->size, 4);
    le(b, big ? ZIP_SAT32 : e->size, 4);
    le(b, nlen, 2);
    le(b, x ? 4 + x : 0, 2);
    le(b, 0, 2); // comment
    le(b, 0, 2); // disk
    le(b, 0, 2); // internal attributes
    le(b, 0, 4); // external attributes
    le(b, far ? ZIP_SAT32 : loc, 4);
    raw(b, e->name, nlen);
    if (!x) return;
    le(b, 1, 2);
    le(b, x, 2);
    if (big) {
        le(b, e->size, 8);
        le(b, e->size, 8);
    }
    if (far) le(b, loc, 8);
}

// The end: the ZIP64 record and its locator when a count, size or offset needs them (the end
// record's fields then all point there), and the end record.
static void end_records(hbuf *b, uint64_t cd_off, uint64_t cd_size, int n, bool force) {
    bool z64 = force || n >= 0xffff || cd_size >= ZIP_SAT32 || cd_off >= ZIP_SAT32;
    if (z64) {
        le(b, ZIP_EOCD64_SIG, 4);
        le(b, ZIP_EOCD64_LEN - 12, 8); // the record's size after this field
        le(b, ZIP_V45, 2);
        le(b, ZIP_V45, 2);
        le(b, 0, 4);
        le(b, 0, 4);
        le(b, (uint64_t)n, 8);
        le(b, (uint64_t)n, 8);
        le(b, cd_size, 8);
        le(b, cd_off, 8);
        le(b, ZIP_LOC64_SIG, 4);
        le(b, 0, 4);
        le(b, cd_off + cd_size, 8); // where the ZIP64 record is
        le(b, 1, 4);
    }
    le(b, ZIP_EOCD_SIG, 4);
    le(b, 0, 2);
    le(b, 0, 2);
    le(b, z64 ? 0xffff : (uint64_t)n, 2);
    le(b, z64 ? 0xffff : (uint64_t)n, 2);
    le(b, z64 ? ZIP_SAT32 : cd_size, 4);
    le(b, z64 ? ZIP_SAT32 : cd_off, 4);
    le(b, 0, 2);
}

// ---- the file ----

// Local headers and data; loc[i] gets entry i's offset, *off the end of the last.
static dsc_status write_entries(int fd, const dsc__zipw_entry *e, int n, bool force,
                                const char *tmp, uint64_t *loc, uint64_t *off) {
    uint8_t hdr[ZIP_LOC_LEN + DSC__ZIPW_NAME_MAX + ZIP_LOC_X64 + 4 + ZIP_ALIGN];
    for (int i = 0; i < n; i++) {
        hbuf b = {hdr, 0};
        loc[i] = *off;
        local_header(&b, &e[i], loc[i], force);
        DSC_TRY(dsc__write_all(fd, hdr, b.n, tmp));
        if (e[i].size) DSC_TRY(dsc__write_all(fd, e[i].data, (size_t)e[i].size, tmp));
        *off += b.n + e[i].size;
    }
    return DSC_OK;
}

static dsc_status write_directory(int fd, const dsc__zipw_entry *e, int n, bool force,
                                  const uint64_t *loc, uint64_t off, const char *tmp) {
    size_t cap = (size_t)n * (ZIP_CEN_LEN + DSC__ZIPW_NAME_MAX + ZIP_CEN_X64) + ZIP_EOCD64_LEN +
                 ZIP_LOC64_LEN + ZIP_EOCD_LEN;
    hbuf b = {malloc(cap), 0};
    if (!b.p) return dsc__fail(DSC_ERR_OOM, "%s: out of memory for the zip directory", tmp);
    for (int i = 0; i < n; i++) central_header(&b, &e[i], loc[i], force);
    end_records(&b, off, b.n, n, force);
    dsc_status st = dsc__write_all(fd, b.p, b.n, tmp);
    free(b.p);
    return st;
}

// The whole archive into fd, fsynced.
static dsc_status write_zip(int fd, const dsc__zipw_entry *e, int n, bool force,
                            const char *tmp) {
    uint64_t *loc = calloc((size_t)n + 1, sizeof *loc), off = 0;
    if (!loc) return dsc__fail(DSC_ERR_OOM, "%s: out of memory for %d zip entries", tmp, n);
    dsc_status st = write_entries(fd, e, n, force, tmp, loc, &off);
    if (st == DSC_OK) st = write_directory(fd, e, n, force, loc, off, tmp);
    free(loc);
    if (st == DSC_OK && fsync(fd) != 0)
        st = dsc__fail(DSC_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    return st;
}

// fsync path's directory, so that the rename survives a crash.
static dsc_status fsync_parent(const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) return dsc__ckpt_fsync_path(".");
    if (slash == path) return dsc__ckpt_fsync_path("/");
    size_t n = (size_t)(slash - path);
    char *dir = malloc(n + 1);
    if (!dir) return dsc__fail(DSC_ERR_OOM, "out of memory writing %s", path);
    memcpy(dir, path, n);
    dir[n] = 0;
    dsc_status st = dsc__ckpt_fsync_path(dir);
    free(dir);
    return st;
}

static dsc_status check_names(const char *path, const dsc__zipw_entry *e, int n) {
    for (int i = 0; i < n; i++) {
        size_t len = strnlen(e[i].name, sizeof e[i].name);
        if (len == 0 || len > DSC__ZIPW_NAME_MAX)
            return dsc__fail(DSC_ERR_INVALID_ARG, "%s: zip entry %d: a name of 1 to %d bytes, "
                             "NUL-terminated", path, i, DSC__ZIPW_NAME_MAX);
    }
    return DSC_OK;
}

dsc_status dsc__zipw_write(const char *path, const dsc__zipw_entry *e, int n, bool force_zip64) {
    DSC_TRY(check_names(path, e, n));
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return dsc__fail(DSC_ERR_OOM, "out of memory writing %s", path);
    snprintf(tmp, plen + 5, "%s.tmp", path);
    dsc_status st = DSC_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = dsc__fail(DSC_ERR_IO, "cannot create %s: %s (is its directory there and writable?)",
                       tmp, strerror(errno));
        free(tmp);
        return st;
    }
    st = write_zip(fd, e, n, force_zip64, tmp);
    if (close(fd) != 0 && st == DSC_OK) // a network file system may report a failed write here
        st = dsc__fail(DSC_ERR_IO, "close %s: %s", tmp, strerror(errno));
    if (st == DSC_OK && rename(tmp, path) != 0)
        st = dsc__fail(DSC_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != DSC_OK) unlink(tmp);
    free(tmp);
    return st == DSC_OK ? fsync_parent(path) : st;
}
