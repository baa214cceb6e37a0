// ckpt/safetensors.c - safetensors reader (mmap) and atomic writer.
#include "engine/ckpt/safetensors.h"

#include <errno.h>    // errno
#include <fcntl.h>    // open
#include <jansson.h>  // json_*
#include <stdbool.h> // bool
#include <stdio.h>    // snprintf
#include <stdlib.h>   // calloc, free, qsort
#include <string.h>   // strcmp, strerror
#include <sys/mman.h> // mmap
#include <sys/stat.h> // fstat
#include <unistd.h>   // fsync, close

#include "base/io.h"     // dsc__write_all
#include "base/status.h" // dsc__fail

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {{"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4},
              {"I16", 2}, {"I8", 1},  {"U8", 1},  {"U16", 2},  {"U32", 4}, {"U64", 8}, {"BOOL", 1}};

size_t dsc_st_dtype_size(const char *dtype) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, dtype)) return dtypes[i].size;
    return 0;
}

// ---- writing ----

static json_t *header_json(const dsc_st_tensor *t, int n, const char *const *meta, int nmeta) {
    json_t *h = json_object();
    if (nmeta > 0) {
        json_t *m = json_object();
        for (int i = 0; i < nmeta; i++) json_object_set_new(m, meta[2 * i], json_string(meta[2 * i + 1]));
        json_object_set_new(h, "__metadata__", m);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        json_t *shape = json_array();
        for (int d = 0; d < t[i].ndim; d++) json_array_append_new(shape, json_integer(t[i].shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I,I]}", "dtype", t[i].dtype, "shape", shape,
                              "data_offsets", (json_int_t)off, (json_int_t)(off + t[i].nbytes));
        json_object_set_new(h, t[i].name, e);
        off += t[i].nbytes;
    }
    return h;
}

// Bytes of `ndim` dimensions of `es`-byte elements; false if a dimension is negative or the
// product does not fit in a size_t (a wrapped product could otherwise match a byte count).
static bool shape_bytes(const int64_t *shape, int ndim, size_t es, size_t *out) {
    size_t bytes = es;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || __builtin_mul_overflow(bytes, (uint64_t)shape[d], &bytes)) return false;
    *out = bytes;
    return true;
}

static dsc_status check_tensor(const dsc_st_tensor *t, const char *path) {
    size_t es = dsc_st_dtype_size(t->dtype), bytes;
    if (!es)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: tensor %s: unknown dtype %s", path, t->name,
                         t->dtype);
    if (t->ndim < 0 || t->ndim > DSC_ST_MAX_DIMS || !shape_bytes(t->shape, t->ndim, es, &bytes) ||
        bytes != t->nbytes)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: tensor %s: %zu bytes do not match its shape",
                         path, t->name, t->nbytes);
    return DSC_OK;
}

// Tensor i's bytes from the caller's array (dsc_st_write's source).
static dsc_status fill_from_data(void *user, int i, void *dst, size_t nbytes) {
    memcpy(dst, ((const dsc_st_tensor *)user)[i].data, nbytes);
    return DSC_OK;
}

dsc_status dsc_st_write(const char *path, const dsc_st_tensor *t, int n, const char *const *meta,
                        int nmeta) {
    return dsc_st_write_stream(path, t, n, meta, nmeta, fill_from_data, (void *)t);
}

// Tensor i's bytes into fd: from t[i].data when there is no fill function's buffer to use.
static dsc_status write_tensor(int fd, const dsc_st_tensor *t, int i, dsc_st_fill_fn fill,
                               void *user, void **buf, size_t *cap, const char *tmp) {
    if (fill == fill_from_data) return dsc__write_all(fd, t[i].data, t[i].nbytes, tmp);
    if (t[i].nbytes > *cap) {
        void *b = realloc(*buf, t[i].nbytes);
        if (!b) return dsc__fail(DSC_ERR_OOM, "%s: out of memory for tensor %s (%zu bytes)", tmp,
                                 t[i].name, t[i].nbytes);
        *buf = b;
        *cap = t[i].nbytes;
    }
    DSC_TRY(fill(user, i, *buf, t[i].nbytes));
    return dsc__write_all(fd, *buf, t[i].nbytes, tmp);
}

dsc_status dsc_st_write_stream(const char *path, const dsc_st_tensor *t, int n,
                               const char *const *meta, int nmeta, dsc_st_fill_fn fill,
                               void *user) {
    for (int i = 0; i < n; i++) DSC_TRY(check_tensor(&t[i], path));
    json_t *h = header_json(t, n, meta, nmeta);
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!text) return dsc__fail(DSC_ERR_OOM, "%s: cannot build the header", path);
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    dsc_status st = DSC_OK;
    if (fd < 0) {
        free(text);
        return dsc__fail(DSC_ERR_IO, "create %s: %s", tmp, strerror(errno));
    }
    void *buf = NULL; // one tensor at a time, reused
    size_t cap = 0;
    uint64_t n8 = padded; // little-endian on every machine dsc supports
    DSC_TRY_GOTO(dsc__write_all(fd, &n8, 8, tmp), st, fail);
    DSC_TRY_GOTO(dsc__write_all(fd, text, len, tmp), st, fail);
    DSC_TRY_GOTO(dsc__write_all(fd, "        ", padded - len, tmp), st, fail);
    for (int i = 0; i < n; i++)
        DSC_TRY_GOTO(write_tensor(fd, t, i, fill, user, &buf, &cap, tmp), st, fail);
    if (fsync(fd) != 0) {
        st = dsc__fail(DSC_ERR_IO, "fsync %s: %s", tmp, strerror(errno));
        goto fail;
    }
    close(fd);
    free(text);
    free(buf);
    if (rename(tmp, path) != 0) return dsc__fail(DSC_ERR_IO, "rename %s: %s", tmp, strerror(errno));
    return DSC_OK;
fail:
    close(fd);
    unlink(tmp);
    free(text);
    free(buf);
    return st;
}

// ---- reading ----

struct dsc_st_file {
    char path[4096];
    void *map;
    size_t size;
    json_t *header;
    int n;
    dsc_st_tensor *t;
};

static dsc_status corrupt(const char *path, const char *what) {
    return dsc__fail(DSC_ERR_CORRUPT, "safetensors file %s: %s; the file is damaged or not a "
                     "safetensors file", path, what);
}

// One header entry: dtype, shape and data_offsets, checked against each other and the data length.
// Leaves the offsets in begin/end for the tiling check of the whole file.
static dsc_status parse_entry(dsc_st_file *f, const char *name, json_t *e, size_t data_len,
                              dsc_st_tensor *out, size_t *begin, size_t *end) {
    json_t *dt = json_object_get(e, "dtype"), *shape = json_object_get(e, "shape");
    json_t *offs = json_object_get(e, "data_offsets");
    char why[512];
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs) ||
        json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1))) {
        snprintf(why, sizeof why, "tensor %.200s: header entry needs dtype, shape and data_offsets "
                 "[begin, end]", name);
        return corrupt(f->path, why);
    }
    size_t es = dsc_st_dtype_size(json_string_value(dt)), nbytes;
    if (!es || json_array_size(shape) > DSC_ST_MAX_DIMS) {
        snprintf(why, sizeof why, "tensor %.200s: unsupported dtype or rank", name);
        return corrupt(f->path, why);
    }
    out->name = name;
    out->dtype = json_string_value(dt);
    out->ndim = (int)json_array_size(shape);
    for (int d = 0; d < out->ndim; d++) {
        json_t *s = json_array_get(shape, d);
        out->shape[d] = json_is_integer(s) ? json_integer_value(s) : -1;
    }
    if (!shape_bytes(out->shape, out->ndim, es, &nbytes)) {
        snprintf(why, sizeof why, "tensor %.200s: bad shape (a dimension is not a non-negative "
                 "integer, or the size overflows)", name);
        return corrupt(f->path, why);
    }
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t e2 = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || e2 < b || (uint64_t)e2 > data_len || (uint64_t)(e2 - b) != nbytes) {
        snprintf(why, sizeof why, "tensor %.200s: data_offsets [%lld, %lld] do not fit its shape "
                 "(%zu bytes) or the file's %zu data bytes (truncated?)", name, (long long)b,
                 (long long)e2, nbytes, data_len);
        return corrupt(f->path, why);
    }
    out->nbytes = nbytes;
    out->data = (const char *)f->map + (f->size - data_len) + b;
    *begin = (size_t)b;
    *end = (size_t)e2;
    return DSC_OK;
}

struct span {
    size_t begin, end;
    int i; // tensor index, for the message
};

static int span_cmp(const void *x, const void *y) {
    const struct span *a = x, *b = y;
    if (a->begin != b->begin) return a->begin < b->begin ? -1 : 1;
    return (a->end > b->end) - (a->end < b->end);
}

// The format's rule: the byte ranges, sorted, start at 0, each begins where the previous one
// ends, and the last ends at the end of the file. Overlaps, gaps and trailing bytes are refused.
static dsc_status check_tiling(dsc_st_file *f, struct span *s, size_t data_len) {
    qsort(s, (size_t)f->n, sizeof *s, span_cmp);
    size_t at = 0;
    char why[640];
    for (int k = 0; k < f->n; k++) {
        if (s[k].begin != at) {
            snprintf(why, sizeof why, "tensor %.200s: data_offsets begin at %zu where %zu was "
                     "expected (%s)", f->t[s[k].i].name, s[k].begin, at,
                     s[k].begin < at ? "overlapping byte ranges" : "a gap between byte ranges");
            return corrupt(f->path, why);
        }
        at = s[k].end;
    }
    if (at != data_len) {
        snprintf(why, sizeof why, "the tensors cover %zu of the file's %zu data bytes", at,
                 data_len);
        return corrupt(f->path, why);
    }
    return DSC_OK;
}

static dsc_status parse_header(dsc_st_file *f) {
    if (f->size < 8) return corrupt(f->path, "shorter than its 8-byte header length");
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);
    if (hlen > f->size - 8) return corrupt(f->path, "header length runs past the end of the file");
    json_error_t e;
    f->header = json_loadb((const char *)f->map + 8, hlen, JSON_REJECT_DUPLICATES, &e);
    if (!json_is_object(f->header)) return corrupt(f->path, "header is not a JSON object");
    size_t data_len = f->size - 8 - hlen;
    f->t = calloc(json_object_size(f->header) + 1, sizeof *f->t);
    struct span *spans = calloc(json_object_size(f->header) + 1, sizeof *spans);
    if (!f->t || !spans) {
        free(spans);
        return dsc__fail(DSC_ERR_OOM, "%s: out of memory", f->path);
    }
    dsc_status st = DSC_OK;
    const char *key;
    json_t *v;
    json_object_foreach(f->header, key, v) {
        if (!strcmp(key, "__metadata__")) continue;
        struct span *s = &spans[f->n];
        DSC_TRY_GOTO(parse_entry(f, key, v, data_len, &f->t[f->n], &s->begin, &s->end), st, out);
        s->i = f->n++;
    }
    st = check_tiling(f, spans, data_len);
out:
    free(spans);
    return st;
}

dsc_status dsc_st_open(dsc_st_file **out, const char *path) {
    *out = NULL;
    dsc_st_file *f = calloc(1, sizeof *f);
    if (!f) return dsc__fail(DSC_ERR_OOM, "out of memory opening %s", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd;
    dsc_status opened = dsc__open_regular(path, &fd); // a FIFO would hang, a folder mislead
    if (opened != DSC_OK) {
        free(f);
        return opened;
    }
    struct stat sb;
    fstat(fd, &sb);
    f->size = (size_t)sb.st_size;
    f->map = f->size ? mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0) : NULL;
    close(fd);
    if (f->map == MAP_FAILED) {
        free(f);
        return dsc__fail(DSC_ERR_IO, "cannot map %s: %s", path, strerror(errno));
    }
    dsc_status st = parse_header(f);
    if (st != DSC_OK) {
        dsc_st_close(f);
        return st;
    }
    *out = f;
    return DSC_OK;
}

void dsc_st_close(dsc_st_file *f) {
    if (!f) return;
    if (f->map && f->map != MAP_FAILED) munmap(f->map, f->size);
    json_decref(f->header);
    free(f->t);
    free(f);
}

int dsc_st_count(const dsc_st_file *f) { return f->n; }

const dsc_st_tensor *dsc_st_get(const dsc_st_file *f, int i) { return &f->t[i]; }

const dsc_st_tensor *dsc_st_find(const dsc_st_file *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

const char *dsc_st_meta(const dsc_st_file *f, const char *key) {
    json_t *m = json_object_get(f->header, "__metadata__");
    json_t *v = json_object_get(m, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}
