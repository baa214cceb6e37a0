// data/shard.c - reading (mmap) and writing (tmp + fsync + rename) token shards.
#include "data/shard.h"

#include <errno.h>    // errno
#include <fcntl.h>    // open, O_*
#include <stdio.h>    // snprintf, rename
#include <stdlib.h>   // malloc, free
#include <string.h>   // memset, strerror, strlen
#include <sys/mman.h> // mmap, munmap
#include <sys/stat.h> // fstat
#include <unistd.h>   // close, fsync, unlink

#include "base/io.h"     // dsc__write_all
#include "base/status.h" // dsc__fail

// ---- internal ----

static uint32_t le32(const uint8_t *p) {
    return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

// Check the header against the file size; the message tells the user how to get a good shard.
static dsc_status check_header(const char *path, const uint8_t *h, int64_t file_bytes,
                               int *version, int64_t *ntok, int *row) {
    int32_t magic = (int32_t)le32(h), ver = (int32_t)le32(h + 4), n = (int32_t)le32(h + 8);
    int32_t r = ver >= 3 ? (int32_t)le32(h + 12) : 0;
    if (magic != DSC_SHARD_MAGIC)
        return dsc__fail(DSC_ERR_CORRUPT,
                         "data shard %s: bad magic %d (expected %d): not a dsc/llm.c token shard; "
                         "create shards with `dsc data prepare`",
                         path, magic, DSC_SHARD_MAGIC);
    if (ver < 1 || ver > 4)
        return dsc__fail(DSC_ERR_CORRUPT,
                         "data shard %s: unsupported version %d (this dsc reads 1-2 = "
                         "uint16/uint32 tokens, 3-4 = the same with loss-mask flags); re-create "
                         "it with `dsc data prepare`", path, ver);
    if (n < 0)
        return dsc__fail(DSC_ERR_CORRUPT, "data shard %s: negative token count %d in header; "
                         "re-create it with `dsc data prepare`", path, n);
    if (r < 0 || (r > 0 && n % r != 0))
        return dsc__fail(DSC_ERR_CORRUPT, "data shard %s: row length %d does not divide the %d "
                         "tokens; re-create it with `dsc data prepare`", path, r, n);
    int64_t want = DSC_SHARD_HEADER_BYTES + (int64_t)n * (ver % 2 ? 2 : 4) + (ver >= 3 ? n : 0);
    if (file_bytes != want)
        return dsc__fail(DSC_ERR_CORRUPT,
                         "data shard %s: %s: header says %d tokens, so %lld bytes expected, but "
                         "the file has %lld bytes; re-create it with `dsc data prepare`",
                         path, file_bytes < want ? "truncated" : "trailing bytes", n,
                         (long long)want, (long long)file_bytes);
    *version = ver;
    *ntok = n;
    *row = r;
    return DSC_OK;
}

static dsc_status map_file(dsc_shard *s, int fd, int64_t bytes) {
    void *m = mmap(NULL, (size_t)bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED)
        return dsc__fail(DSC_ERR_IO, "data shard %s: mmap of %lld bytes failed: %s", s->path,
                         (long long)bytes, strerror(errno));
    s->map = m;
    s->map_bytes = (size_t)bytes;
    return DSC_OK;
}

static dsc_status open_fd(dsc_shard *s, int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0)
        return dsc__fail(DSC_ERR_IO, "data shard %s: stat: %s", s->path, strerror(errno));
    int64_t bytes = st.st_size;
    if (bytes < DSC_SHARD_HEADER_BYTES)
        return dsc__fail(DSC_ERR_CORRUPT,
                         "data shard %s: truncated: the file has %lld bytes, less than the "
                         "%d-byte header; re-create it with `dsc data prepare`",
                         s->path, (long long)bytes, DSC_SHARD_HEADER_BYTES);
    DSC_TRY(map_file(s, fd, bytes));
    const uint8_t *h = s->map;
    DSC_TRY(check_header(s->path, h, bytes, &s->version, &s->ntok, &s->row));
    s->body = h + DSC_SHARD_HEADER_BYTES;
    if (s->version >= 3) s->flags = s->body + s->ntok * (s->version == 3 ? 2 : 4);
    return DSC_OK;
}

static dsc_status check_tokens(const char *path, const int32_t *tokens, int64_t n,
                               int vocab_size) {
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab_size)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "data shard %s: token %lld is %d, outside the vocabulary [0, %d); "
                             "the tokenizer and vocab size disagree",
                             path, (long long)i, tokens[i], vocab_size);
    return DSC_OK;
}

// Header and body, encoded in chunks so that a large shard needs no second full-size buffer.
static dsc_status write_body(int fd, const char *tmp, const int32_t *tokens, int64_t n,
                             int version, int row) {
    uint8_t header[DSC_SHARD_HEADER_BYTES] = {0};
    put_le32(header, DSC_SHARD_MAGIC);
    put_le32(header + 4, (uint32_t)version);
    put_le32(header + 8, (uint32_t)n);
    put_le32(header + 12, (uint32_t)row);
    DSC_TRY(dsc__write_all(fd, header, sizeof header, tmp));
    enum { CHUNK = 1 << 16 };
    size_t width = version % 2 ? 2 : 4;
    uint8_t *buf = malloc(CHUNK * width);
    if (!buf) return dsc__fail(DSC_ERR_OOM, "data shard %s: out of memory", tmp);
    dsc_status st = DSC_OK;
    for (int64_t at = 0; at < n && st == DSC_OK; at += CHUNK) {
        int64_t m = n - at < CHUNK ? n - at : CHUNK;
        for (int64_t i = 0; i < m; i++) {
            uint32_t v = (uint32_t)tokens[at + i];
            if (width == 2) {
                buf[2 * i] = (uint8_t)v;
                buf[2 * i + 1] = (uint8_t)(v >> 8);
            } else {
                put_le32(buf + 4 * i, v);
            }
        }
        st = dsc__write_all(fd, buf, (size_t)m * width, tmp);
    }
    free(buf);
    return st;
}

// ---- public API ----

dsc_status dsc_shard_open(dsc_shard *s, const char *path) {
    memset(s, 0, sizeof *s);
    if (strlen(path) >= sizeof s->path)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data shard path is longer than %zu bytes: %.80s...",
                         sizeof s->path - 1, path);
    snprintf(s->path, sizeof s->path, "%s", path);
    int fd;
    if (dsc__open_regular(path, &fd) != DSC_OK) {
        dsc__error_prefix("data shard: ");
        return DSC_ERR_IO;
    }
    dsc_status st = open_fd(s, fd);
    close(fd); // the mapping keeps the file alive
    if (st != DSC_OK) dsc_shard_close(s);
    return st;
}

void dsc_shard_close(dsc_shard *s) {
    if (!s) return;
    if (s->map) munmap(s->map, s->map_bytes);
    s->map = NULL;
    s->map_bytes = 0;
    s->body = NULL;
    s->flags = NULL;
    s->ntok = 0;
    s->row = 0;
}

void dsc_shard_read(const dsc_shard *s, int64_t first, int64_t n, int32_t *out) {
    if (s->version == 1 || s->version == 3) {
        const uint8_t *p = s->body + 2 * first;
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)(p[2 * i] | (uint32_t)p[2 * i + 1] << 8);
    } else {
        const uint8_t *p = s->body + 4 * first;
        for (int64_t i = 0; i < n; i++) out[i] = (int32_t)le32(p + 4 * i);
    }
}

void dsc_shard_read_flags(const dsc_shard *s, int64_t first, int64_t n, uint8_t *out) {
    if (s->flags) memcpy(out, s->flags + first, (size_t)n);
    else memset(out, DSC_TOK_TARGET, (size_t)n);
}

dsc_status dsc_shard_write(const char *path, const int32_t *tokens, int64_t n, int vocab_size) {
    return dsc_shard_write_flags(path, tokens, NULL, n, vocab_size, 0);
}

dsc_status dsc_shard_write_flags(const char *path, const int32_t *tokens, const uint8_t *flags,
                                 int64_t n, int vocab_size, int row) {
    if (row < 0 || (row > 0 && (!flags || n % row != 0)))
        return dsc__fail(DSC_ERR_INVALID_ARG, "data shard %s: row length %d needs flags and must "
                         "divide the %lld tokens", path, row, (long long)n);
    if (n < 0 || n > DSC_SHARD_MAX_TOKENS)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "data shard %s: %lld tokens do not fit one shard (at most %d); split the "
                         "data into several train*.bin shards",
                         path, (long long)n, DSC_SHARD_MAX_TOKENS);
    if (vocab_size <= 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data shard %s: vocab size %d must be positive",
                         path, vocab_size);
    DSC_TRY(check_tokens(path, tokens, n, vocab_size));
    for (int64_t i = 0; flags && i < n; i++)
        if (flags[i] & ~(DSC_TOK_TARGET | DSC_TOK_DOC))
            return dsc__fail(DSC_ERR_INVALID_ARG, "data shard %s: flag byte %lld is 0x%02x; only "
                             "DSC_TOK_TARGET and DSC_TOK_DOC are defined", path, (long long)i,
                             flags[i]);
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data shard path too long: %.80s...", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return dsc__fail(DSC_ERR_IO, "data shard %s: cannot create: %s; check that the folder "
                         "exists and is writable", tmp, strerror(errno));
    int version = (vocab_size <= 65536 ? 1 : 2) + (flags ? 2 : 0);
    dsc_status st = write_body(fd, tmp, tokens, n, version, row);
    if (st == DSC_OK && flags) st = dsc__write_all(fd, flags, (size_t)n, tmp);
    if (st == DSC_OK && fsync(fd) != 0)
        st = dsc__fail(DSC_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
    if (close(fd) != 0 && st == DSC_OK)
        st = dsc__fail(DSC_ERR_IO, "close %s: %s", tmp, strerror(errno));
    if (st == DSC_OK && rename(tmp, path) != 0)
        st = dsc__fail(DSC_ERR_IO, "rename %s to %s: %s", tmp, path, strerror(errno));
    if (st != DSC_OK) unlink(tmp);
    return st;
}
