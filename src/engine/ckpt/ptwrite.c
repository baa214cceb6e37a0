// ckpt/ptwrite.c - torch.save's files written: a pickle of protocol 2 built call by call, tensors'
// storages, and the entries of the zip archive around them (ptzipw.c writes it; see ptwrite.h).
#include "engine/ckpt/ptwrite.h"

#include <stdarg.h> // va_list
#include <stdio.h>  // snprintf, vsnprintf
#include <stdlib.h> // calloc, free, malloc, realloc
#include <string.h> // memcpy, memmove, strlen, strrchr

#include "base/status.h"        // dsc__fail
#include "engine/ckpt/ptzipw.h" // dsc__zipw_*, dsc__crc32

// ---- the pickle's opcodes (Python's pickle module names them so) ----

enum {
    OP_PROTO = 0x80, OP_STOP = '.', OP_MARK = '(', OP_NONE = 'N', OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89, OP_BININT1 = 'K', OP_BININT2 = 'M', OP_BININT = 'J', OP_LONG1 = 0x8a,
    OP_BINFLOAT = 'G', OP_BINUNICODE = 'X', OP_EMPTY_DICT = '}', OP_EMPTY_LIST = ']',
    OP_EMPTY_TUPLE = ')', OP_TUPLE = 't', OP_TUPLE1 = 0x85, OP_SETITEMS = 'u', OP_SETITEM = 's',
    OP_APPENDS = 'e', OP_APPEND = 'a', OP_GLOBAL = 'c', OP_REDUCE = 'R', OP_BINPERSID = 'Q',
    OP_NEWOBJ = 0x81, OP_BUILD = 'b',
};

// torch's storage class for each dsc_pt_dtype (torchfile.h's order).
static const char *const storage_class[] = {
    "FloatStorage", "DoubleStorage", "HalfStorage", "BFloat16Storage", "LongStorage",
    "IntStorage",   "ShortStorage",  "CharStorage", "ByteStorage",     "BoolStorage",
};
#define NDTYPES ((int)(sizeof storage_class / sizeof storage_class[0]))

// ---- the writer ----

typedef enum frame_kind { F_DICT, F_ODICT, F_LIST, F_TUPLE, F_OBJECT, F_CALL } frame_kind;
static const char *const frame_names[] = {"a dict", "an ordered dict", "a list", "a tuple",
                                           "an object", "a call"};

typedef struct frame {  // a container being written
    frame_kind kind;
    size_t mark_at;     // where its MARK is in the pickle (dicts, lists, tuples)
    int64_t n;          // values written in it so far
} frame;

typedef struct storage { // one tensor's bytes: the archive's data/<index>
    uint8_t *data;       // NULL when empty
    uint64_t bytes;
    uint32_t crc;
} storage;

struct dsc__ptw {
    uint8_t *pkl;        // the pickle so far, without its STOP
    size_t len, cap;
    frame *frames;       // open containers, innermost last
    int depth, fcap;
    storage *st;
    int nst, stcap;
    int nroots;          // values completed at the top (one makes a file)
    bool zip64;          // dsc__ptw_force_zip64
    dsc_status err;      // the first building failure
    char why[512];
};

static void fail(dsc__ptw *w, dsc_status st, const char *fmt, ...) DSC_PRINTF_LIKE(3, 4);
static void fail(dsc__ptw *w, dsc_status st, const char *fmt, ...) {
    if (w->err != DSC_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->why, sizeof w->why, fmt, ap);
    va_end(ap);
    w->err = st;
    dsc__fail(st, "torch file writer: %s", w->why);
}

static bool live(const dsc__ptw *w) { return w && w->err == DSC_OK; }

// Room for `more` bytes after the pickle's end.
static bool reserve(dsc__ptw *w, size_t more) {
    if (w->err != DSC_OK) return false;
    if (more <= w->cap - w->len) return true;
    size_t n = w->cap ? w->cap : 256;
    while (n - w->len < more) {
        if (n > SIZE_MAX / 4) {
            fail(w, DSC_ERR_OOM, "the pickle outgrows memory");
            return false;
        }
        n *= 2;
    }
    uint8_t *p = realloc(w->pkl, n);
    if (!p) {
        fail(w, DSC_ERR_OOM, "out of memory for a pickle of %zu bytes", n);
        return false;
    }
    w->pkl = p;
    w->cap = n;
    return true;
}

static void put(dsc__ptw *w, const void *p, size_t n) {
    if (!reserve(w, n)) return;
    memcpy(w->pkl + w->len, p, n);
    w->len += n;
}

static void put1(dsc__ptw *w, uint8_t op) { put(w, &op, 1); }

// op followed by the low `bytes` bytes of x, little-endian.
static void put_op_le(dsc__ptw *w, uint8_t op, uint64_t x, int bytes) {
    uint8_t b[9] = {op};
    for (int i = 0; i < bytes; i++) b[1 + i] = (uint8_t)(x >> (8 * i));
    put(w, b, 1 + (size_t)bytes);
}

// ---- scalars ----

// Python's choice: BININT1 / BININT2 for small non-negative values, BININT for 32-bit signed,
// LONG1 with the fewest two's-complement bytes beyond.
static void put_int(dsc__ptw *w, int64_t x) {
    if (x >= 0 && x <= 0xff) {
        put_op_le(w, OP_BININT1, (uint64_t)x, 1);
    } else if (x >= 0 && x <= 0xffff) {
        put_op_le(w, OP_BININT2, (uint64_t)x, 2);
    } else if (x >= INT32_MIN && x <= INT32_MAX) {
        put_op_le(w, OP_BININT, (uint64_t)x, 4);
    } else {
        int n = 5;
        while (n < 8 && x >> (8 * n - 1) != 0 && x >> (8 * n - 1) != -1) n++; // sign bit fits
        uint8_t b[10] = {OP_LONG1, (uint8_t)n};
        for (int i = 0; i < n; i++) b[2 + i] = (uint8_t)((uint64_t)x >> (8 * i));
        put(w, b, 2 + (size_t)n);
    }
}

static bool utf8_ok(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t c = s[i];
        size_t len = c < 0x80 ? 1 : c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
        if (!len || c > 0xf4 || len > n - i) return false;
        uint32_t cp = len == 1 ? c : c & (0x7fu >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3fu);
        }
        // overlong forms, surrogates and code points past U+10FFFF are not UTF-8
        if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += len;
    }
    return true;
}

static void put_str(dsc__ptw *w, const char *s) {
    size_t n = strlen(s);
    if (n > UINT32_MAX) {
        fail(w, DSC_ERR_INVALID_ARG, "a string of %zu bytes (over 4 GiB)", n);
        return;
    }
    put_op_le(w, OP_BINUNICODE, n, 4);
    put(w, s, n);
}

// A module or class name: a dotted Python identifier (GLOBAL ends each with a newline).
static bool name_ok(const char *s) {
    if (!s || !*s || strlen(s) > 200) return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '.'))
            return false;
    return true;
}

static void put_global(dsc__ptw *w, const char *module, const char *name) {
    put1(w, OP_GLOBAL);
    put(w, module, strlen(module));
    put1(w, '\n');
    put(w, name, strlen(name));
    put1(w, '\n');
}

// GLOBAL module\nname\n of a live writer, after checking both names; false (and a failure
// naming what: "callable", "global", "object class") when the writer is dead or a name is bad.
static bool put_global_checked(dsc__ptw *w, const char *what, const char *module,
                               const char *name) {
    if (!live(w)) return false;
    if (!name_ok(module) || !name_ok(name)) {
        fail(w, DSC_ERR_INVALID_ARG, "%s '%s.%s': module and name must be dotted Python "
             "identifiers", what, module ? module : "(null)", name ? name : "(null)");
        return false;
    }
    put_global(w, module, name);
    return true;
}

// ---- containers ----

// Python's pickler (the C one, which torch.save runs) adds a dict's or a list's items 1000 at a
// time, MARK ... SETITEMS / APPENDS; see end_items for the last batch. In values: a dict's item
// is a key and a value.
enum { BATCH = 1000 };

static int64_t batch_values(frame_kind kind) { return kind == F_LIST ? BATCH : 2 * BATCH; }

// Remove the frame's MARK: the bytes after it move back one (no memo entry points into the
// pickle, so nothing else refers to where they are).
static void drop_mark(dsc__ptw *w, const frame *f) {
    memmove(w->pkl + f->mark_at, w->pkl + f->mark_at + 1, w->len - f->mark_at - 1);
    w->len--;
}

// A value is complete: it counts in its container (a full batch of a dict's or a list's items
// is added, and the next batch's MARK written), or is the file's value.
static void done(dsc__ptw *w, bool hashable) {
    if (!live(w)) return;
    if (w->depth == 0) {
        if (++w->nroots > 1)
            fail(w, DSC_ERR_INVALID_ARG, "a second value at the top: a file holds one value "
                 "(put several in a dict)");
        return;
    }
    frame *f = &w->frames[w->depth - 1];
    bool dict = f->kind == F_DICT || f->kind == F_ODICT;
    if (dict && f->n % 2 == 0 && !hashable) {
        fail(w, DSC_ERR_INVALID_ARG, "a list or a dict as a dict's key (Python cannot hash it)");
        return;
    }
    if (f->kind == F_OBJECT && f->n >= 1) {
        fail(w, DSC_ERR_INVALID_ARG, "an object given more than one state value");
        return;
    }
    f->n++;
    if ((dict || f->kind == F_LIST) && f->n % batch_values(f->kind) == 0) {
        put1(w, dict ? OP_SETITEMS : OP_APPENDS);
        f->mark_at = w->len;
        put1(w, OP_MARK);
    }
}

static void open_frame(dsc__ptw *w, frame_kind kind, bool mark) {
    if (!live(w)) return;
    if (w->depth == w->fcap) {
        int n = w->fcap ? 2 * w->fcap : 16;
        frame *f = n < (1 << 20) ? realloc(w->frames, (size_t)n * sizeof *f) : NULL;
        if (!f) {
            fail(w, DSC_ERR_OOM, "out of memory for %d nested containers", n);
            return;
        }
        w->frames = f;
        w->fcap = n;
    }
    w->frames[w->depth++] = (frame){kind, w->len, 0};
    if (mark) put1(w, OP_MARK);
}

// The innermost container, closed by `call`; NULL (and a failure) if it is not of that kind.
static const frame *close_frame(dsc__ptw *w, frame_kind kind, const char *call) {
    if (!live(w)) return NULL;
    if (w->depth == 0) {
        fail(w, DSC_ERR_INVALID_ARG, "%s with no container open", call);
        return NULL;
    }
    const frame *f = &w->frames[w->depth - 1];
    if (f->kind != kind && !(kind == F_DICT && f->kind == F_ODICT)) {
        fail(w, DSC_ERR_INVALID_ARG, "%s closes %s", call, frame_names[f->kind]);
        return NULL;
    }
    w->depth--; // the frame's memory stays valid until the next open_frame
    return f;
}

// The last batch, as CPython's pickler ends it. A list or a dict of one item: APPEND / SETITEM,
// no MARK. Otherwise each batch is MARK ... APPENDS / SETITEMS, even a last one of a single item,
// and a dict of a multiple of 1000 items ends with an empty batch. An OrderedDict's items come
// from an iterator instead: a lone last item is SETITEM, and no batch is empty. With no items
// the MARK (then the pickle's last byte) goes.
static void end_items(dsc__ptw *w, const frame *f) {
    bool list = f->kind == F_LIST;
    int64_t items = list ? f->n : f->n / 2, left = items % BATCH;
    if (items == 1 || (f->kind == F_ODICT && left == 1)) {
        drop_mark(w, f);
        put1(w, list ? OP_APPEND : OP_SETITEM);
    } else if (items == 0 || (left == 0 && f->kind != F_DICT)) {
        w->len = f->mark_at;
    } else {
        put1(w, list ? OP_APPENDS : OP_SETITEMS);
    }
}

void dsc__ptw_dict_begin(dsc__ptw *w) {
    if (!live(w)) return;
    put1(w, OP_EMPTY_DICT);
    open_frame(w, F_DICT, true);
}

// OrderedDict pickles as OrderedDict() (its class applied to no arguments), then its items.
void dsc__ptw_ordered_dict_begin(dsc__ptw *w) {
    if (!live(w)) return;
    put_global(w, "collections", "OrderedDict");
    put1(w, OP_EMPTY_TUPLE);
    put1(w, OP_REDUCE);
    open_frame(w, F_ODICT, true);
}

void dsc__ptw_dict_end(dsc__ptw *w) {
    const frame *f = close_frame(w, F_DICT, "dsc__ptw_dict_end");
    if (!f) return;
    if (f->n % 2) {
        fail(w, DSC_ERR_INVALID_ARG, "a dict closed after a key without its value");
        return;
    }
    end_items(w, f);
    done(w, false);
}

void dsc__ptw_list_begin(dsc__ptw *w) {
    if (!live(w)) return;
    put1(w, OP_EMPTY_LIST);
    open_frame(w, F_LIST, true);
}

void dsc__ptw_list_end(dsc__ptw *w) {
    const frame *f = close_frame(w, F_LIST, "dsc__ptw_list_end");
    if (!f) return;
    end_items(w, f);
    done(w, false);
}

void dsc__ptw_tuple_begin(dsc__ptw *w) { open_frame(w, F_TUPLE, true); }

// Python writes (), (a,), (a, b), (a, b, c) without a MARK: EMPTY_TUPLE, TUPLE1..3.
static void end_tuple(dsc__ptw *w, const frame *f) {
    if (f->n == 0) {
        w->len = f->mark_at;
        put1(w, OP_EMPTY_TUPLE);
    } else if (f->n <= 3) {
        drop_mark(w, f);
        put1(w, (uint8_t)(OP_TUPLE1 + f->n - 1));
    } else {
        put1(w, OP_TUPLE);
    }
}

void dsc__ptw_tuple_end(dsc__ptw *w) {
    const frame *f = close_frame(w, F_TUPLE, "dsc__ptw_tuple_end");
    if (!f) return;
    end_tuple(w, f);
    done(w, true);
}

// module.name(*args) as pickle's REDUCE: the callable, its arguments as a tuple, REDUCE.
void dsc__ptw_call_begin(dsc__ptw *w, const char *module, const char *name) {
    if (put_global_checked(w, "callable", module, name)) open_frame(w, F_CALL, true);
}

void dsc__ptw_call_end(dsc__ptw *w) {
    const frame *f = close_frame(w, F_CALL, "dsc__ptw_call_end");
    if (!f) return;
    end_tuple(w, f);
    put1(w, OP_REDUCE);
    done(w, true);
}

void dsc__ptw_global(dsc__ptw *w, const char *module, const char *name) {
    if (put_global_checked(w, "global", module, name)) done(w, true);
}

// copyreg.__newobj__'s form: the class, no arguments, NEWOBJ; the state follows, then BUILD.
void dsc__ptw_object_begin(dsc__ptw *w, const char *module, const char *name) {
    if (!put_global_checked(w, "object class", module, name)) return;
    put1(w, OP_EMPTY_TUPLE);
    put1(w, OP_NEWOBJ);
    open_frame(w, F_OBJECT, false);
}

void dsc__ptw_object_end(dsc__ptw *w) {
    const frame *f = close_frame(w, F_OBJECT, "dsc__ptw_object_end");
    if (!f) return;
    if (f->n) put1(w, OP_BUILD);
    done(w, true);
}

// ---- scalars, public ----

void dsc__ptw_none(dsc__ptw *w) {
    if (!live(w)) return;
    put1(w, OP_NONE);
    done(w, true);
}

void dsc__ptw_bool(dsc__ptw *w, bool b) {
    if (!live(w)) return;
    put1(w, b ? OP_NEWTRUE : OP_NEWFALSE);
    done(w, true);
}

void dsc__ptw_int(dsc__ptw *w, int64_t x) {
    if (!live(w)) return;
    put_int(w, x);
    done(w, true);
}

// BINFLOAT: the IEEE double, big-endian (bit for bit: -0.0, infinities and NaNs kept).
void dsc__ptw_float(dsc__ptw *w, double x) {
    if (!live(w)) return;
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    uint8_t b[9] = {OP_BINFLOAT};
    for (int i = 0; i < 8; i++) b[1 + i] = (uint8_t)(bits >> (56 - 8 * i));
    put(w, b, sizeof b);
    done(w, true);
}

void dsc__ptw_str(dsc__ptw *w, const char *s) {
    if (!live(w)) return;
    if (!s || !utf8_ok((const uint8_t *)s, strlen(s))) {
        fail(w, DSC_ERR_INVALID_ARG, s ? "a string that is not UTF-8" : "a NULL string");
        return;
    }
    put_str(w, s);
    done(w, true);
}

// ---- tensors ----

// numel and bytes of a tensor, checked; false (and a failure) for anything torch cannot hold.
static bool tensor_size(dsc__ptw *w, dsc_pt_dtype dtype, int ndim, const int64_t *shape,
                        uint64_t *numel, uint64_t *bytes) {
    if ((int)dtype < 0 || (int)dtype >= NDTYPES || ndim < 0 || ndim > DSC_PT_MAX_DIMS ||
        (ndim > 0 && !shape)) {
        fail(w, DSC_ERR_INVALID_ARG, "a tensor of dtype %d with %d dimensions (dtypes 0-%d, at "
             "most %d dimensions)", (int)dtype, ndim, NDTYPES - 1, DSC_PT_MAX_DIMS);
        return false;
    }
    uint64_t n = 1;
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0 || __builtin_mul_overflow(n, (uint64_t)shape[d], &n) || n > INT64_MAX) {
            fail(w, DSC_ERR_INVALID_ARG, "a tensor with dimension %d of size %lld (negative, or "
                 "an element count past 2^63)", d, (long long)shape[d]);
            return false;
        }
    if (__builtin_mul_overflow(n, (uint64_t)dsc_pt_dtype_size(dtype), bytes)) {
        fail(w, DSC_ERR_INVALID_ARG, "a tensor of %llu elements whose bytes overflow",
             (unsigned long long)n);
        return false;
    }
    *numel = n;
    return true;
}

// The tensor's bytes become storage w->nst.
static bool add_storage(dsc__ptw *w, const void *data, uint64_t bytes) {
    if (bytes && !data) {
        fail(w, DSC_ERR_INVALID_ARG, "a tensor of %llu bytes without data",
             (unsigned long long)bytes);
        return false;
    }
    if (w->nst == w->stcap) {
        int n = w->stcap ? 2 * w->stcap : 8;
        storage *s = n < (1 << 28) ? realloc(w->st, (size_t)n * sizeof *s) : NULL;
        if (!s) {
            fail(w, DSC_ERR_OOM, "out of memory for %d tensors", n);
            return false;
        }
        w->st = s;
        w->stcap = n;
    }
    storage s = {NULL, bytes, 0};
    if (bytes && !(s.data = malloc((size_t)bytes))) {
        fail(w, DSC_ERR_OOM, "out of memory for a tensor of %llu bytes",
             (unsigned long long)bytes);
        return false;
    }
    if (bytes) memcpy(s.data, data, (size_t)bytes);
    s.crc = dsc__crc32(s.data, bytes);
    w->st[w->nst++] = s;
    return true;
}

// A tuple of integers as Python writes one.
static void put_int_tuple(dsc__ptw *w, const int64_t *x, int n) {
    if (n == 0) {
        put1(w, OP_EMPTY_TUPLE);
        return;
    }
    if (n > 3) put1(w, OP_MARK);
    for (int d = 0; d < n; d++) put_int(w, x[d]);
    put1(w, n > 3 ? OP_TUPLE : (uint8_t)(OP_TUPLE1 + n - 1));
}

// _rebuild_tensor_v2(storage, 0, shape, stride, False, OrderedDict()), the storage named by the
// persistent id ('storage', torch.<Type>Storage, '<key>', 'cpu', numel).
void dsc__ptw_tensor(dsc__ptw *w, dsc_pt_dtype dtype, int ndim, const int64_t *shape,
                     const void *data) {
    uint64_t numel = 0, bytes = 0;
    if (!live(w) || !tensor_size(w, dtype, ndim, shape, &numel, &bytes) ||
        !add_storage(w, data, bytes))
        return;
    int64_t stride[DSC_PT_MAX_DIMS], s = 1;
    for (int d = ndim; d-- > 0;) { // torch's contiguous strides: a size-0 dim counts as 1
        stride[d] = s;
        if (__builtin_mul_overflow(s, shape[d] > 1 ? shape[d] : 1, &s)) s = INT64_MAX;
    }
    char key[16];
    snprintf(key, sizeof key, "%d", w->nst - 1);
    put_global(w, "torch._utils", "_rebuild_tensor_v2");
    put1(w, OP_MARK);
    put1(w, OP_MARK);
    put_str(w, "storage");
    put_global(w, "torch", storage_class[dtype]);
    put_str(w, key);
    put_str(w, "cpu");
    put_int(w, (int64_t)numel);
    put1(w, OP_TUPLE);
    put1(w, OP_BINPERSID);
    put_int(w, 0); // storage offset
    put_int_tuple(w, shape, ndim);
    put_int_tuple(w, stride, ndim);
    put1(w, OP_NEWFALSE); // requires_grad
    put_global(w, "collections", "OrderedDict"); // backward hooks: none
    put1(w, OP_EMPTY_TUPLE);
    put1(w, OP_REDUCE);
    put1(w, OP_TUPLE);
    put1(w, OP_REDUCE);
    done(w, true);
}

// ---- the archive's entries ----

enum { ARCHIVE_MAX = 200 }; // the folder's name, in bytes

// torch 2 ends its archives with .data/serialization_id, 40 digits: 20 from a hash of the
// entries' names, 20 from their CRCs (torch.load only logs it). The same ingredients here, with
// hashes of our own.
static void serialization_id(const dsc__zipw_entry *e, int n, char *out, size_t cap) {
    uint64_t h = 0xcbf29ce484222325u, c = 0;
    for (int i = 0; i < n; i++) {
        for (const char *p = e[i].name; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3u;
        c = (c ^ e[i].crc) * 0x100000001b3u + 0x9e3779b97f4a7c15u;
    }
    snprintf(out, cap, "%020llu%020llu", (unsigned long long)h, (unsigned long long)c);
}

static void set_entry(dsc__zipw_entry *e, const char *archive, const char *name,
                      const void *data, uint64_t size, uint32_t crc) {
    snprintf(e->name, sizeof e->name, "%s/%s", archive, name);
    e->data = data;
    e->size = size;
    e->crc = crc;
}

// The entries in torch's order: data.pkl, byteorder, data/0..., version, .data/serialization_id
// (n = nst + 4). The pickle's STOP is already past its end; id receives the id's 40 digits.
// torch >= 2.5 also writes .format_version and .storage_alignment, which let its loader compute
// storages' offsets from the layout its zip writer makes (a data descriptor after each entry);
// this archive has none, so they are left out, and torch reads each offset from the entry's local
// header, as it does for files of older versions.
static void fill_entries(const dsc__ptw *w, const char *archive, dsc__zipw_entry *e, char *id,
                         size_t cap) {
    int n = 0;
    set_entry(&e[n++], archive, "data.pkl", w->pkl, w->len + 1, dsc__crc32(w->pkl, w->len + 1));
    set_entry(&e[n++], archive, "byteorder", "little", 6, dsc__crc32("little", 6));
    for (int k = 0; k < w->nst; k++) {
        char name[32];
        snprintf(name, sizeof name, "data/%d", k);
        set_entry(&e[n++], archive, name, w->st[k].data, w->st[k].bytes, w->st[k].crc);
    }
    set_entry(&e[n++], archive, "version", "3\n", 2, dsc__crc32("3\n", 2));
    serialization_id(e, n, id, cap);
    set_entry(&e[n], archive, ".data/serialization_id", id, strlen(id), dsc__crc32(id, strlen(id)));
}

static bool archive_ok(const char *s, size_t n) {
    if (n == 0 || n > ARCHIVE_MAX || !utf8_ok((const uint8_t *)s, n)) return false;
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] < 0x20 || s[i] == '/' || s[i] == '\\') return false;
    return true;
}

// The folder inside the zip: archive, or as torch.save names it, the file's name without its
// directory and extension ("archive" when that leaves nothing usable).
static dsc_status archive_name(const char *path, const char *archive, char *out, size_t cap) {
    if (archive) {
        if (!archive_ok(archive, strlen(archive)))
            return dsc__fail(DSC_ERR_INVALID_ARG, "%s: archive folder name '%.60s': 1 to %d "
                             "bytes of UTF-8, no '/', '\\' or control characters", path, archive,
                             ARCHIVE_MAX);
        snprintf(out, cap, "%s", archive);
        return DSC_OK;
    }
    const char *base = strrchr(path, '/'), *dot;
    base = base ? base + 1 : path;
    dot = strrchr(base, '.');
    size_t n = dot ? (size_t)(dot - base) : strlen(base);
    if (archive_ok(base, n)) snprintf(out, cap, "%.*s", (int)n, base);
    else snprintf(out, cap, "archive");
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc__ptw_new(dsc__ptw **out) {
    *out = NULL;
    dsc__ptw *w = calloc(1, sizeof *w);
    if (!w) return dsc__fail(DSC_ERR_OOM, "out of memory for a torch file writer");
    put_op_le(w, OP_PROTO, 2, 1);
    if (w->err != DSC_OK) {
        dsc__ptw_free(w);
        return DSC_ERR_OOM;
    }
    *out = w;
    return DSC_OK;
}

void dsc__ptw_free(dsc__ptw *w) {
    if (!w) return;
    for (int k = 0; k < w->nst; k++) free(w->st[k].data);
    free(w->st);
    free(w->frames);
    free(w->pkl);
    free(w);
}

dsc_status dsc__ptw_status(const dsc__ptw *w) { return w ? w->err : DSC_ERR_INVALID_ARG; }

void dsc__ptw_force_zip64(dsc__ptw *w, bool on) {
    if (w) w->zip64 = on;
}

dsc_status dsc__ptw_save(dsc__ptw *w, const char *path, const char *archive) {
    if (!w || !path || !*path)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc__ptw_save: no writer or no path");
    if (w->err != DSC_OK) return dsc__fail(w->err, "%s: not written: %s", path, w->why);
    if (w->depth)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: not written: %s (inside %d more containers) "
                         "was begun and not ended", path,
                         frame_names[w->frames[w->depth - 1].kind], w->depth - 1);
    if (w->nroots != 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: not written: no value was given", path);
    char arch[ARCHIVE_MAX + 1], id[48];
    DSC_TRY(archive_name(path, archive, arch, sizeof arch));
    if (!reserve(w, 1)) return dsc__fail(w->err, "%s: not written: %s", path, w->why);
    w->pkl[w->len] = OP_STOP; // past the end, in the buffer: the writer stays as it was
    int n = w->nst + 4;
    dsc__zipw_entry *e = calloc((size_t)n, sizeof *e);
    if (!e) return dsc__fail(DSC_ERR_OOM, "%s: out of memory for %d zip entries", path, n);
    fill_entries(w, arch, e, id, sizeof id);
    dsc_status st = dsc__zipw_write(path, e, n, w->zip64);
    free(e);
    return st;
}
