// Unit tests of the torch.save writer (engine/ckpt/ptwrite.c, ptzipw.c): files holding every kind
// of value, fixed and random (the seed is printed on a failure), are read back with dsc_pt_open
// and compared bit for bit; the pickle's bytes are compared with what Python's pickler writes for
// the same values (less its memo); the archive's layout is walked (names, order, 64-byte
// alignment, CRCs, ZIP64 fields); misuse and unwritable paths fail and leave no file behind.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>         // INFINITY, NAN
#include <signal.h>       // signal, SIGXFSZ
#include <stdio.h>        // snprintf, fopen
#include <stdlib.h>       // calloc, free, getenv, mkdtemp
#include <string.h>       // memcmp, strlen, strstr
#include <sys/resource.h> // setrlimit, RLIMIT_FSIZE
#include <sys/stat.h>     // mkdir
#include <time.h>         // time
#include <unistd.h>       // rmdir

#include "dsc/status.h"            // dsc_last_error
#include "engine/ckpt/fs.h"        // dsc__ckpt_rmtree, dsc__ckpt_exists, dsc__ckpt_read_file
#include "engine/ckpt/ptwrite.h"   // dsc__ptw_*
#include "engine/ckpt/ptzip.h"     // dsc__zip_index
#include "engine/ckpt/torchfile.h" // dsc_pt_*

static char tmpdir[512];

static int setup_dir(void **state) {
    (void)state;
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dsc_test_ptwrite_XXXXXX", base && *base ? base : "/tmp");
    return mkdtemp(tmpdir) ? 0 : -1;
}

static int teardown_dir(void **state) {
    (void)state;
    dsc__ckpt_rmtree(tmpdir);
    return 0;
}

static void path_of(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

// ---- values as the test knows them ----

typedef enum nkind {
    N_NONE, N_BOOL, N_INT, N_FLOAT, N_STR, N_LIST, N_TUPLE, N_DICT, N_ODICT, N_TENSOR, N_OBJECT,
} nkind;

typedef struct node {
    nkind kind;
    int64_t i;
    double f;
    char *s, *name;         // STR; OBJECT: module and class
    struct node **kid;      // LIST, TUPLE; DICT: key, value...; OBJECT: its state (0 or 1)
    int n;
    dsc_pt_dtype dtype;     // TENSOR
    int ndim;
    int64_t shape[DSC_PT_MAX_DIMS];
    uint8_t *data;
    size_t bytes;
} node;

static node **all_nodes;
static int nall, capall;

static node *mk(nkind kind) {
    if (nall == capall) {
        capall = capall ? 2 * capall : 256;
        all_nodes = realloc(all_nodes, (size_t)capall * sizeof *all_nodes);
        assert_non_null(all_nodes);
    }
    node *x = calloc(1, sizeof *x);
    assert_non_null(x);
    x->kind = kind;
    return all_nodes[nall++] = x;
}

static void free_nodes(void) {
    for (int k = 0; k < nall; k++) {
        free(all_nodes[k]->s);
        free(all_nodes[k]->name);
        free(all_nodes[k]->kid);
        free(all_nodes[k]->data);
        free(all_nodes[k]);
    }
    free(all_nodes);
    all_nodes = NULL;
    nall = capall = 0;
}

static node *NONE(void) { return mk(N_NONE); }
static node *B(bool b) { node *x = mk(N_BOOL); x->i = b; return x; }
static node *I(int64_t v) { node *x = mk(N_INT); x->i = v; return x; }
static node *F(double v) { node *x = mk(N_FLOAT); x->f = v; return x; }
static node *S(const char *s) { node *x = mk(N_STR); x->s = strdup(s); return x; }

static void add(node *c, node *k) {
    c->kid = realloc(c->kid, (size_t)(c->n + 1) * sizeof *c->kid);
    assert_non_null(c->kid);
    c->kid[c->n++] = k;
}

// A container of n values (a dict's: key, value, key, value...).
static node *C(nkind kind, int n, ...) {
    node *x = mk(kind);
    va_list ap;
    va_start(ap, n);
    for (int k = 0; k < n; k++) add(x, va_arg(ap, node *));
    va_end(ap);
    return x;
}

// Tensor bytes both the test and the check in tests/ckpt compute: byte j of a tensor with this
// seed; bools hold 0 or 1.
static uint8_t pattern(int seed, size_t j, dsc_pt_dtype dtype) {
    uint8_t b = (uint8_t)(j * 131 + (size_t)seed * 71 + 7);
    return dtype == DSC_PT_BOOL8 ? b & 1 : b;
}

static node *T(dsc_pt_dtype dtype, int seed, int ndim, ...) {
    node *x = mk(N_TENSOR);
    x->dtype = dtype;
    x->ndim = ndim;
    size_t numel = 1;
    va_list ap;
    va_start(ap, ndim);
    for (int d = 0; d < ndim; d++) numel *= (size_t)(x->shape[d] = va_arg(ap, int64_t));
    va_end(ap);
    x->bytes = numel * dsc_pt_dtype_size(dtype);
    x->data = malloc(x->bytes ? x->bytes : 1);
    for (size_t j = 0; j < x->bytes; j++) x->data[j] = pattern(seed, j, dtype);
    return x;
}

static node *OBJ(const char *module, const char *name, node *state) {
    node *x = mk(N_OBJECT);
    x->s = strdup(module);
    x->name = strdup(name);
    if (state) add(x, state);
    return x;
}

static void write_node(dsc__ptw *w, const node *x) {
    switch (x->kind) {
    case N_NONE: dsc__ptw_none(w); return;
    case N_BOOL: dsc__ptw_bool(w, x->i); return;
    case N_INT: dsc__ptw_int(w, x->i); return;
    case N_FLOAT: dsc__ptw_float(w, x->f); return;
    case N_STR: dsc__ptw_str(w, x->s); return;
    case N_TENSOR: dsc__ptw_tensor(w, x->dtype, x->ndim, x->shape, x->data); return;
    case N_LIST: dsc__ptw_list_begin(w); break;
    case N_TUPLE: dsc__ptw_tuple_begin(w); break;
    case N_DICT: dsc__ptw_dict_begin(w); break;
    case N_ODICT: dsc__ptw_ordered_dict_begin(w); break;
    case N_OBJECT: dsc__ptw_object_begin(w, x->s, x->name); break;
    }
    for (int k = 0; k < x->n; k++) write_node(w, x->kid[k]);
    switch (x->kind) {
    case N_LIST: dsc__ptw_list_end(w); break;
    case N_TUPLE: dsc__ptw_tuple_end(w); break;
    case N_OBJECT: dsc__ptw_object_end(w); break;
    default: dsc__ptw_dict_end(w); break;
    }
}

// ---- comparing what was read with what was written ----

static const dsc_pt_kind read_kind[] = {
    [N_NONE] = DSC_PT_NONE, [N_BOOL] = DSC_PT_BOOL,   [N_INT] = DSC_PT_INT,
    [N_FLOAT] = DSC_PT_FLOAT, [N_STR] = DSC_PT_STR,   [N_LIST] = DSC_PT_LIST,
    [N_TUPLE] = DSC_PT_TUPLE, [N_DICT] = DSC_PT_DICT, [N_ODICT] = DSC_PT_DICT,
    [N_TENSOR] = DSC_PT_TENSOR, [N_OBJECT] = DSC_PT_OBJECT,
};

static void same(const dsc_pt_value *v, const node *x, const char *at, int *key, uint64_t seed);

static void same_tensor(const dsc_pt_tensor *t, const node *x, const char *at, int *key,
                        uint64_t seed) {
    char want_key[16];
    snprintf(want_key, sizeof want_key, "%d", (*key)++);
    bool ok = t->dtype == x->dtype && t->ndim == x->ndim && t->offset == 0 &&
              !strcmp(t->key, want_key) && t->numel * (int64_t)dsc_pt_dtype_size(x->dtype) ==
              (int64_t)x->bytes && t->storage_numel == t->numel;
    int64_t stride = 1;
    for (int d = x->ndim; ok && d-- > 0;) { // contiguous, as torch counts a size-0 dim as 1
        ok = t->shape[d] == x->shape[d] && t->stride[d] == stride;
        stride *= x->shape[d] > 1 ? x->shape[d] : 1;
    }
    if (ok && x->bytes) ok = !memcmp(t->storage, x->data, x->bytes);
    if (!ok) fail_msg("seed %llu, %s: the tensor read back differs", (unsigned long long)seed, at);
}

static void same_items(const dsc_pt_value *v, const node *x, const char *at, int *key,
                       uint64_t seed) {
    if (v->n != x->n)
        fail_msg("seed %llu, %s: %d items read, %d written", (unsigned long long)seed, at, v->n,
                 x->n);
    for (int k = 0; k < x->n; k++) {
        char sub[512];
        snprintf(sub, sizeof sub, "%.400s[%d]", at, k);
        same(v->items[k], x->kid[k], sub, key, seed);
    }
}

static void same(const dsc_pt_value *v, const node *x, const char *at, int *key, uint64_t seed) {
    if (!v || v->kind != read_kind[x->kind])
        fail_msg("seed %llu, %s: read kind %d, wrote kind %d", (unsigned long long)seed, at,
                 v ? (int)v->kind : -1, (int)x->kind);
    bool ok = true;
    switch (x->kind) {
    case N_BOOL: case N_INT: ok = v->i == x->i; break;
    case N_FLOAT: ok = !memcmp(&v->f, &x->f, sizeof x->f); break;
    case N_STR: ok = v->len == strlen(x->s) && !memcmp(v->s, x->s, v->len); break;
    case N_TENSOR: same_tensor(v->t, x, at, key, seed); break;
    case N_OBJECT: {
        char want[256];
        snprintf(want, sizeof want, "%s.%s", x->s, x->name);
        ok = !strcmp(v->s, want) && (x->n ? v->state != NULL : v->state == NULL);
        if (ok && x->n) same(v->state, x->kid[0], at, key, seed);
        break;
    }
    case N_LIST: case N_TUPLE: case N_DICT: case N_ODICT: same_items(v, x, at, key, seed); break;
    default: break;
    }
    if (!ok) fail_msg("seed %llu, %s: the value read back differs", (unsigned long long)seed, at);
}

static uint8_t *slurp(const char *path, size_t *len) {
    char *b = NULL;
    if (dsc__ckpt_read_file(path, &b, len) != DSC_OK) fail_msg("%s", dsc_last_error());
    return (uint8_t *)b;
}

static uint32_t u16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t u32(const uint8_t *p) { return u16(p) | u16(p + 2) << 16; }
static uint64_t u64(const uint8_t *p) { return u32(p) | (uint64_t)u32(p + 4) << 32; }

// zip's CRC-32 a bit at a time: an oracle independent of the writer's tables.
static uint32_t crc_bitwise(const uint8_t *p, uint64_t n) {
    uint32_t c = 0xffffffffu;
    for (uint64_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

// One entry's local header at *at: its name, ZIP64 field (required when zip64), the "FB"
// padding field, 64-byte aligned data and a right CRC; *at moves past the data.
static void check_entry(const uint8_t *b, size_t len, size_t *at, const char *name, bool zip64,
                        const uint8_t **data, uint64_t *size) {
    const uint8_t *h = b + *at;
    assert_true(*at + 30 <= len);
    assert_int_equal(u32(h), 0x04034b50);
    size_t nlen = u16(h + 26), xlen = u16(h + 28);
    if (nlen != strlen(name) || memcmp(h + 30, name, nlen))
        fail_msg("entry at %zu: '%.*s', expected '%s'", *at, (int)nlen, h + 30, name);
    const uint8_t *x = h + 30 + nlen;
    *size = u32(h + 22);
    assert_int_equal(u32(h + 18), *size); // stored: compressed size = size
    bool had64 = false;
    for (size_t i = 0; i < xlen;) { // the ZIP64 field, then "FB" padding with 'Z's to the end
        size_t id = u16(x + i), n = u16(x + i + 2);
        assert_true(i + 4 + n <= xlen);
        if (id == 1) {
            assert_int_equal(*size, 0xffffffffu);
            assert_int_equal(n, 16);
            *size = u64(x + i + 4);
            assert_int_equal(u64(x + i + 12), *size);
            had64 = true;
        } else {
            assert_int_equal(id, 'F' | 'B' << 8);
            assert_int_equal(i + 4 + n, xlen);
            for (size_t k = 0; k < n; k++) assert_int_equal(x[i + 4 + k], 'Z');
        }
        i += 4 + n;
    }
    assert_int_equal(had64, zip64);
    size_t start = *at + 30 + nlen + xlen;
    assert_int_equal(start % 64, 0);
    assert_true(*size <= len - start);
    assert_int_equal(u32(h + 14), crc_bitwise(b + start, *size));
    *data = b + start;
    *at = start + (size_t)*size;
}

// The archive's entries, in torch's order, with their contents; nst storages.
static void check_layout(const char *path, const char *arch, int nst, bool zip64) {
    size_t len, at = 0;
    uint8_t *b = slurp(path, &len);
    dsc__zip z;
    if (dsc__zip_index(&z, b, len, path) != DSC_OK) fail_msg("%s", dsc_last_error());
    assert_int_equal(z.n, nst + 4);
    for (int i = 0; i < nst + 4; i++) {
        char name[300], rel[32];
        if (i == 0) snprintf(rel, sizeof rel, "data.pkl");
        else if (i == 1) snprintf(rel, sizeof rel, "byteorder");
        else if (i < nst + 2) snprintf(rel, sizeof rel, "data/%d", i - 2);
        else snprintf(rel, sizeof rel, i == nst + 2 ? "version" : ".data/serialization_id");
        snprintf(name, sizeof name, "%s/%s", arch, rel);
        const uint8_t *data;
        uint64_t size;
        check_entry(b, len, &at, name, zip64, &data, &size);
        assert_string_equal(z.e[i].name, name); // the directory agrees, in the same order
        assert_ptr_equal(z.e[i].data, data);
        assert_int_equal(z.e[i].size, size);
        if (i == 1) assert_true(size == 6 && !memcmp(data, "little", 6));
        if (i == nst + 2) assert_true(size == 2 && !memcmp(data, "3\n", 2));
        if (i == nst + 3) {
            assert_int_equal(size, 40);
            for (int k = 0; k < 40; k++) assert_true(data[k] >= '0' && data[k] <= '9');
        }
    }
    assert_int_equal(u32(b + at), 0x02014b50); // the central directory follows the last entry
    assert_int_equal(u16(b + len - 22 + 10), zip64 ? 0xffff : (uint32_t)nst + 4);
    dsc__zip_free(&z);
    free(b);
}

// Write x, read it back, compare; the layout too.
static void round_trip(const node *x, const char *name, const char *arch, bool zip64,
                       uint64_t seed) {
    char path[600];
    path_of(path, sizeof path, name);
    dsc__ptw *w = NULL;
    assert_int_equal(dsc__ptw_new(&w), DSC_OK);
    dsc__ptw_force_zip64(w, zip64);
    write_node(w, x);
    if (dsc__ptw_save(w, path, arch) != DSC_OK) fail_msg("%s", dsc_last_error());
    dsc__ptw_free(w);
    dsc_pt_file *f = NULL;
    if (dsc_pt_open(&f, path) != DSC_OK) fail_msg("seed %llu: %s", (unsigned long long)seed,
                                                  dsc_last_error());
    int key = 0;
    same(dsc_pt_root(f), x, "root", &key, seed);
    dsc_pt_close(f);
    check_layout(path, arch, key, zip64);
}

// ---- fixed values ----

static node *every_value(void) {
    const char *big = "a string longer than 255 bytes, so that no short form could hold it: "
                      "0123456789012345678901234567890123456789012345678901234567890123456789"
                      "0123456789012345678901234567890123456789012345678901234567890123456789"
                      "0123456789012345678901234567890123456789012345678901234567890123456789";
    node *ints = C(N_LIST, 0), *shapes = C(N_ODICT, 0);
    const int64_t iv[] = {0, 1, 255, 256, 65535, 65536, -1, -128, -129, -32768, -65536,
                          INT32_MAX, INT32_MIN, (int64_t)INT32_MAX + 1, (int64_t)INT32_MIN - 1,
                          UINT32_MAX, (int64_t)1 << 39, -((int64_t)1 << 39),
                          -((int64_t)1 << 39) - 1, ((int64_t)1 << 47) - 1, (int64_t)1 << 47,
                          (int64_t)1 << 55, -((int64_t)1 << 55) - 1, INT64_MAX, INT64_MIN,
                          INT64_MIN + 1};
    for (size_t k = 0; k < sizeof iv / sizeof iv[0]; k++) add(ints, I(iv[k]));
    const dsc_pt_dtype dts[] = {DSC_PT_F32, DSC_PT_BF16, DSC_PT_F16, DSC_PT_I64};
    for (int k = 0; k < 4; k++) { // 0 to 4 dimensions, scalars and empty ones
        add(shapes, S(dsc_pt_dtype_name(dts[k])));
        add(shapes, C(N_LIST, 7, T(dts[k], 10 * k, 0), T(dts[k], 10 * k + 1, 1, (int64_t)5),
                      T(dts[k], 10 * k + 2, 2, (int64_t)3, (int64_t)4),
                      T(dts[k], 10 * k + 3, 3, (int64_t)2, (int64_t)1, (int64_t)3),
                      T(dts[k], 10 * k + 4, 4, (int64_t)2, (int64_t)3, (int64_t)1, (int64_t)2),
                      T(dts[k], 10 * k + 5, 2, (int64_t)0, (int64_t)3),
                      T(dts[k], 10 * k + 6, 3, (int64_t)3, (int64_t)0, (int64_t)2)));
    }
    node *others = C(N_LIST, 0); // the remaining dtypes
    const dsc_pt_dtype rest[] = {DSC_PT_F64, DSC_PT_I32, DSC_PT_I16, DSC_PT_I8, DSC_PT_U8,
                                 DSC_PT_BOOL8};
    for (int k = 0; k < 6; k++) add(others, T(rest[k], 50 + k, 2, (int64_t)2, (int64_t)5));
    node *floats = C(N_TUPLE, 9, F(0.0), F(-0.0), F(1.5), F(-2.25e300), F(INFINITY),
                     F(-INFINITY), F(NAN), F(4.9e-324), F(0.1));
    node *strs = C(N_LIST, 7, S(""), S("ascii"), S("ünïcödé"), S("日本語"), S("emoji 😀"),
                   S("quotes \" ' and a\nnewline"), S(big));
    node *tuples = C(N_LIST, 6, C(N_TUPLE, 0), C(N_TUPLE, 1, I(1)), C(N_TUPLE, 2, I(1), S("b")),
                     C(N_TUPLE, 3, I(1), I(2), NONE()), C(N_TUPLE, 4, I(1), I(2), I(3), I(4)),
                     C(N_TUPLE, 2, C(N_TUPLE, 0), C(N_TUPLE, 1, C(N_TUPLE, 0))));
    node *empties = C(N_LIST, 5, C(N_DICT, 0), C(N_LIST, 0), C(N_TUPLE, 0), C(N_ODICT, 0),
                      C(N_LIST, 1, C(N_DICT, 0)));
    node *od = C(N_ODICT, 6, S("z"), I(1), S("a"), C(N_LIST, 1, I(2)), I(3), S("three"));
    node *nested = C(N_DICT, 2, S("a"), C(N_DICT, 2, S("b"), C(N_LIST, 1, C(N_DICT, 2, S("c"),
                     C(N_TUPLE, 1, NONE())))));
    node *scaler = OBJ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler",
                       C(N_DICT, 6, S("cur_scale"), F(65536.0), S("cur_iter"), I(10),
                         S("scale_window"), I(1000)));
    node *bare = OBJ("argparse", "Namespace", NULL);
    node *keys = C(N_DICT, 8, I(7), S("int key"), C(N_TUPLE, 2, I(1), I(2)), S("tuple key"),
                   B(true), S("bool key"), NONE(), S("None key"));
    return C(N_DICT, 34, S("none"), NONE(), S("true"), B(true), S("false"), B(false),
             S("ints"), ints, S("floats"), floats, S("strs"), strs, S("tuples"), tuples,
             S("empties"), empties, S("od"), od, S("nested"), nested, S("tensors"), shapes,
             S("other dtypes"), others, S("scaler"), scaler, S("bare object"), bare,
             S("keys"), keys, S("scalar"), T(DSC_PT_F32, 99, 0), S("ünï"), S("key"));
}

static void test_every_value(void **state) {
    (void)state;
    node *x = every_value();
    round_trip(x, "every.pt", "every", false, 0);
    round_trip(x, "every64.pt", "archive", true, 0);
    // Each value alone at the top: a tensor, a scalar, a container.
    round_trip(T(DSC_PT_BF16, 3, 2, (int64_t)4, (int64_t)4), "t.pt", "t", false, 0);
    round_trip(I(-5), "i.pt", "i", false, 0);
    round_trip(C(N_TUPLE, 0), "e.pt", "e", true, 0);
    free_nodes();
}

// What CPython's pickler (the C one, which torch.save runs) writes for n items: a list of
// i & 0xff, a dict or an OrderedDict of i & 0xff: i & 0x7f. Batches of 1000 items, MARK ...
// APPENDS / SETITEMS; one item alone without MARK; a dict's loop runs until a batch is not full
// (an empty batch after a multiple of 1000); an OrderedDict's lone last item is SETITEM.
static size_t python_batches(uint8_t *out, int n, nkind kind) {
    static const char od[] = "ccollections\nOrderedDict\n)R";
    size_t at = 0;
    out[at++] = 0x80;
    out[at++] = 2;
    if (kind == N_ODICT) {
        memcpy(out + at, od, sizeof od - 1);
        at += sizeof od - 1;
    } else {
        out[at++] = kind == N_LIST ? ']' : '}';
    }
    bool single = n == 1;
    for (int i = 0, batch = 0; n > 1;) {
        batch = n - i < 1000 ? n - i : 1000;
        if (kind == N_ODICT && batch <= 1) {
            single = batch == 1;
            break;
        }
        out[at++] = '(';
        for (int k = 0; k < batch; k++, i++) {
            out[at++] = 'K';
            out[at++] = (uint8_t)(i & 0xff);
            if (kind != N_LIST) {
                out[at++] = 'K';
                out[at++] = (uint8_t)(i & 0x7f);
            }
        }
        out[at++] = kind == N_LIST ? 'e' : 'u';
        if (kind == N_DICT ? batch < 1000 : i == n) break;
    }
    if (single) { // the last item
        out[at++] = 'K';
        out[at++] = (uint8_t)((n - 1) & 0xff);
        if (kind != N_LIST) {
            out[at++] = 'K';
            out[at++] = (uint8_t)((n - 1) & 0x7f);
        }
        out[at++] = kind == N_LIST ? 'a' : 's';
    }
    out[at++] = '.';
    return at;
}

static void same_pickle(const node *x, const char *want, size_t want_len);

// Batches of 1000 items per SETITEMS / APPENDS, bytes and read back.
static void test_batches(void **state) {
    (void)state;
    const int sizes[] = {0, 1, 2, 3, 999, 1000, 1001, 1002, 2000, 2001, 2500};
    uint8_t *want = malloc(5 * 2500 + 64);
    for (int k = 0; k < 11; k++) {
        node *c[3] = {C(N_LIST, 0), C(N_DICT, 0), C(N_ODICT, 0)};
        for (int i = 0; i < sizes[k]; i++)
            for (int j = 0; j < 3; j++) {
                add(c[j], I(i & 0xff));
                if (j) add(c[j], I(i & 0x7f));
            }
        for (int j = 0; j < 3; j++)
            same_pickle(c[j], (const char *)want, python_batches(want, sizes[k], c[j]->kind));
        round_trip(C(N_TUPLE, 3, c[0], c[1], c[2]), "batches.pt", "batches", false,
                   (uint64_t)sizes[k]);
    }
    free(want);
    free_nodes();
}

// ---- random values ----

static uint64_t rng;

static uint64_t next(void) { // xorshift64
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int below(int n) { return (int)(next() % (uint64_t)n); }

static void put_utf8(char *s, size_t *at, uint32_t cp) {
    if (cp < 0x80) {
        s[(*at)++] = (char)cp;
    } else if (cp < 0x800) {
        s[(*at)++] = (char)(0xc0 | cp >> 6);
        s[(*at)++] = (char)(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
        s[(*at)++] = (char)(0xe0 | cp >> 12);
        s[(*at)++] = (char)(0x80 | (cp >> 6 & 0x3f));
        s[(*at)++] = (char)(0x80 | (cp & 0x3f));
    } else {
        s[(*at)++] = (char)(0xf0 | cp >> 18);
        s[(*at)++] = (char)(0x80 | (cp >> 12 & 0x3f));
        s[(*at)++] = (char)(0x80 | (cp >> 6 & 0x3f));
        s[(*at)++] = (char)(0x80 | (cp & 0x3f));
    }
}

static node *rand_str(int unique) {
    char s[128];
    size_t at = (size_t)snprintf(s, sizeof s, unique >= 0 ? "k%d" : "", unique);
    for (int n = below(12); n-- > 0;) {
        const uint32_t lo[] = {1, 0x80, 0x800, 0xe000, 0x10000}, span[] = {0x7f, 0x780, 0xd000,
                                                                           0x2000, 0x100000};
        int r = below(5);
        put_utf8(s, &at, lo[r] + (uint32_t)(next() % span[r])); // no surrogates, no NUL
    }
    s[at] = 0;
    return S(s);
}

static node *rand_int(void) {
    const int64_t edge[] = {0, 255, 256, 65535, 65536, -1, INT32_MAX, INT32_MIN,
                            (int64_t)INT32_MAX + 1, (int64_t)INT32_MIN - 1, INT64_MAX, INT64_MIN};
    if (below(3) == 0) return I(edge[below(12)]);
    int bits = 1 + below(64);
    uint64_t v = next() >> (64 - bits);
    return I(below(2) ? (int64_t)v : -(int64_t)(v >> 1));
}

static node *rand_tensor(void) {
    int ndim = below(5);
    int64_t s[4] = {1, 1, 1, 1};
    for (int d = 0; d < ndim; d++) s[d] = below(8) ? 1 + below(4) : 0;
    return T((dsc_pt_dtype)below(10), below(1000), ndim, s[0], s[1], s[2], s[3]);
}

static node *rand_value(int depth);

static node *rand_container(int depth) {
    int kind = below(5), n = below(6);
    if (kind == 4) return OBJ("argparse", "Namespace", below(4) ? rand_value(depth + 1) : NULL);
    node *c = C((nkind[]){N_LIST, N_TUPLE, N_DICT, N_ODICT}[kind], 0);
    for (int k = 0; k < n; k++) {
        if (c->kind == N_DICT || c->kind == N_ODICT) // keys: unique, of the hashable kinds
            add(c, below(3) ? rand_str(k) : below(2) ? I(1000 * k - below(1000))
                                                     : C(N_TUPLE, 2, I(k), rand_str(-1)));
        add(c, rand_value(depth + 1));
    }
    return c;
}

static node *rand_value(int depth) {
    switch (below(depth < 4 ? 9 : 7)) {
    case 0: return NONE();
    case 1: return B(below(2));
    case 2: return rand_int();
    case 3: { // any bit pattern: NaNs with payloads, subnormals, infinities
        uint64_t bits = next();
        double f;
        memcpy(&f, &bits, sizeof f);
        return F(f);
    }
    case 4: return rand_str(-1);
    case 5: case 6: return rand_tensor();
    default: return rand_container(depth);
    }
}

static void test_random_values(void **state) {
    (void)state;
    const char *env = getenv("DSC_TEST_SEED"); // to replay a failure's seed
    uint64_t base = env ? strtoull(env, NULL, 10) : 0x9e3779b97f4a7c15u ^ (uint64_t)time(NULL);
    for (int k = 0; k < 40; k++) {
        uint64_t seed = base + (uint64_t)k;
        rng = seed | 1;
        node *x = rand_container(0);
        round_trip(x, "random.pt", "random", seed % 8 == 7, seed); // ZIP64 by the seed too
        free_nodes();
    }
}

// ---- the pickle's bytes ----

static uint8_t *pickle_of(const char *path, const char *arch, size_t *len) {
    size_t flen;
    uint8_t *b = slurp(path, &flen);
    dsc__zip z;
    if (dsc__zip_index(&z, b, flen, path) != DSC_OK) fail_msg("%s", dsc_last_error());
    char name[300];
    snprintf(name, sizeof name, "%s/data.pkl", arch);
    const dsc__zip_entry *e = dsc__zip_find(&z, name);
    assert_non_null(e);
    uint8_t *p = malloc(e->size);
    memcpy(p, e->data, e->size);
    *len = e->size;
    dsc__zip_free(&z);
    free(b);
    return p;
}

// x's pickle must be want's bytes: what Python 3.11's pickle.dumps(value, protocol=2) writes,
// less its memo (pickletools.optimize), for the same value.
static void same_pickle(const node *x, const char *want, size_t want_len) {
    char path[600];
    path_of(path, sizeof path, "golden.pt");
    dsc__ptw *w = NULL;
    assert_int_equal(dsc__ptw_new(&w), DSC_OK);
    write_node(w, x);
    if (dsc__ptw_save(w, path, "golden") != DSC_OK) fail_msg("%s", dsc_last_error());
    dsc__ptw_free(w);
    size_t len;
    uint8_t *p = pickle_of(path, "golden", &len);
    if (len != want_len || memcmp(p, want, len)) {
        size_t at = 0;
        while (at < len && at < want_len && p[at] == (uint8_t)want[at]) at++;
        fail_msg("pickle of %zu bytes differs from Python's (%zu bytes) at byte %zu", len,
                 want_len, at);
    }
    free(p);
}

#define SAME_PICKLE(x, lit) same_pickle((x), (lit), sizeof(lit) - 1)

static void test_pickle_bytes(void **state) {
    (void)state;
    // [0, 255, 256, 65535, 65536, -1, 2**31-1, -2**31, 2**31, -2**31-1, 2**39, -2**39,
    //  -2**39-1, 2**63-1, -2**63]
    SAME_PICKLE(C(N_LIST, 15, I(0), I(255), I(256), I(65535), I(65536), I(-1), I(INT32_MAX),
                  I(INT32_MIN), I((int64_t)INT32_MAX + 1), I((int64_t)INT32_MIN - 1),
                  I((int64_t)1 << 39), I(-((int64_t)1 << 39)), I(-((int64_t)1 << 39) - 1),
                  I(INT64_MAX), I(INT64_MIN)),
                "\x80\x02](K\x00K\xffM\x00\x01M\xff\xffJ\x00\x00\x01\x00J\xff\xff\xff\xffJ\xff"
                "\xff\xff\x7fJ\x00\x00\x00\x80\x8a\x05\x00\x00\x00\x80\x00\x8a\x05\xff\xff\xff"
                "\x7f\xff\x8a\x06\x00\x00\x00\x00\x80\x00\x8a\x05\x00\x00\x00\x00\x80\x8a\x06"
                "\xff\xff\xff\xff\x7f\xff\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f\x8a\x08\x00"
                "\x00\x00\x00\x00\x00\x00\x80" "e.");
    // [{'a': 1}, {'b': 1, 'c': 2}, [1], [1, 2], [], (), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4),
    //  OrderedDict(d=None), -0.0, True, False, None, 'é', 1.5]
    SAME_PICKLE(C(N_LIST, 17, C(N_DICT, 2, S("a"), I(1)), C(N_DICT, 4, S("b"), I(1), S("c"),
                  I(2)), C(N_LIST, 1, I(1)), C(N_LIST, 2, I(1), I(2)), C(N_LIST, 0),
                  C(N_TUPLE, 0), C(N_TUPLE, 1, I(1)), C(N_TUPLE, 2, I(1), I(2)),
                  C(N_TUPLE, 3, I(1), I(2), I(3)), C(N_TUPLE, 4, I(1), I(2), I(3), I(4)),
                  C(N_ODICT, 2, S("d"), NONE()), F(-0.0), B(true), B(false), NONE(), S("é"),
                  F(1.5)),
                "\x80\x02](}X\x01\x00\x00\x00" "aK\x01s}(X\x01\x00\x00\x00" "bK\x01X\x01"
                "\x00\x00\x00" "cK\x02u]K\x01" "a](K\x01K\x02" "e])K\x01\x85K\x01K\x02\x86K"
                "\x01K\x02K\x03\x87(K\x01K\x02K\x03K\x04tccollections\nOrderedDict\n)RX\x01"
                "\x00\x00\x00" "dNsG\x80\x00\x00\x00\x00\x00\x00\x00\x88\x89NX\x02\x00\x00\x00"
                "\xc3\xa9G\x3f\xf8\x00\x00\x00\x00\x00\x00" "e.");
    SAME_PICKLE(C(N_ODICT, 0), "\x80\x02" "ccollections\nOrderedDict\n)R.");
    // torch.save(torch.arange(6.).reshape(2, 3)) (torch 1.13), its data.pkl less the memo
    SAME_PICKLE(T(DSC_PT_F32, 0, 2, (int64_t)2, (int64_t)3),
                "\x80\x02" "ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch"
                "\nFloatStorage\nX\x01\x00\x00\x00" "0X\x03\x00\x00\x00" "cpuK\x06tQK\x00K\x02K"
                "\x03\x86K\x03K\x01\x86\x89" "ccollections\nOrderedDict\n)RtR.");
    // an object of a plain class with cur_scale = 65536.0, cur_iter = 10
    SAME_PICKLE(OBJ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler",
                    C(N_DICT, 4, S("cur_scale"), F(65536.0), S("cur_iter"), I(10))),
                "\x80\x02" "cdeepspeed.runtime.fp16.loss_scaler\nDynamicLossScaler\n)\x81}(X"
                "\x09\x00\x00\x00" "cur_scaleG@\xf0\x00\x00\x00\x00\x00\x00X\x08\x00\x00\x00"
                "cur_iterK\nub.");
    free_nodes();
}

// torch.Size and a torch dtype (what DeepSpeed's param_shapes and a loss scaler's dtype hold):
// Python's bytes, and read back as the shape's tuple and the dtype's global.
static void test_calls_and_globals(void **state) {
    (void)state;
    char path[600];
    path_of(path, sizeof path, "calls.pt");
    dsc__ptw *w = NULL;
    assert_int_equal(dsc__ptw_new(&w), DSC_OK);
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "shape");
    dsc__ptw_call_begin(w, "torch", "Size");
    dsc__ptw_tuple_begin(w);
    dsc__ptw_int(w, 2);
    dsc__ptw_int(w, 3);
    dsc__ptw_tuple_end(w);
    dsc__ptw_call_end(w);
    dsc__ptw_str(w, "dtype");
    dsc__ptw_global(w, "torch", "float16");
    dsc__ptw_dict_end(w);
    if (dsc__ptw_save(w, path, "calls") != DSC_OK) fail_msg("%s", dsc_last_error());
    dsc__ptw_free(w);
    // pickletools.optimize(pickle.dumps({'shape': torch.Size([2, 3]), 'dtype': torch.float16}, 2))
    static const char want[] = "\x80\x02}(X\x05\x00\x00\x00shapectorch\nSize\nK\x02K\x03\x86"
                               "\x85RX\x05\x00\x00\x00" "dtypectorch\nfloat16\nu.";
    size_t len;
    uint8_t *p = pickle_of(path, "calls", &len);
    assert_int_equal(len, sizeof want - 1);
    assert_memory_equal(p, want, len);
    free(p);
    dsc_pt_file *f = NULL;
    if (dsc_pt_open(&f, path) != DSC_OK) fail_msg("%s", dsc_last_error());
    const dsc_pt_value *shape = dsc_pt_dict_get(dsc_pt_root(f), "shape");
    const dsc_pt_value *dtype = dsc_pt_dict_get(dsc_pt_root(f), "dtype");
    int64_t x;
    assert_int_equal(shape->kind, DSC_PT_TUPLE);
    assert_true(shape->n == 2 && dsc_pt_int(shape->items[1], &x) && x == 3);
    assert_int_equal(dtype->kind, DSC_PT_GLOBAL);
    assert_string_equal(dtype->s, "torch.float16");
    dsc_pt_close(f);
    // a call left open, a call closed as a tuple, a bad name
    const char *bad[] = {"open", "mismatch", "name"};
    for (int k = 0; k < 3; k++) {
        assert_int_equal(dsc__ptw_new(&w), DSC_OK);
        dsc__ptw_call_begin(w, "torch", k == 2 ? "Size\nos" : "Size");
        if (k == 1) dsc__ptw_tuple_end(w);
        assert_int_not_equal(dsc__ptw_save(w, path, bad[k]), DSC_OK);
        dsc__ptw_free(w);
    }
}

// ---- misuse and failures ----

static bool exists(const char *path) { return dsc__ckpt_exists(path); }

// Saving must fail with st and a message holding needle, leaving neither path nor path.tmp.
static void refused(dsc__ptw *w, const char *name, const char *arch, dsc_status st,
                    const char *needle) {
    char path[600], tmp[610];
    path_of(path, sizeof path, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(dsc__ptw_save(w, path, arch), st);
    if (!strstr(dsc_last_error(), needle))
        fail_msg("%s: '%s' lacks '%s'", name, dsc_last_error(), needle);
    assert_false(exists(path));
    assert_false(exists(tmp));
    dsc__ptw_free(w);
}

static dsc__ptw *fresh(void) {
    dsc__ptw *w = NULL;
    assert_int_equal(dsc__ptw_new(&w), DSC_OK);
    return w;
}

static void test_misuse(void **state) {
    (void)state;
    dsc__ptw *w = fresh();
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "no value");
    w = fresh();
    dsc__ptw_dict_end(w);
    assert_int_equal(dsc__ptw_status(w), DSC_ERR_INVALID_ARG);
    dsc__ptw_int(w, 1); // ignored after the failure, as is everything after it
    dsc__ptw_list_end(w);
    dsc__ptw_tensor(w, DSC_PT_F32, 99, NULL, NULL);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "no container open");
    w = fresh();
    dsc__ptw_list_begin(w);
    dsc__ptw_dict_end(w);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "closes a list");
    w = fresh();
    dsc__ptw_ordered_dict_begin(w);
    dsc__ptw_tuple_end(w);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "closes an ordered dict");
    w = fresh();
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "key");
    dsc__ptw_dict_end(w);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "key without its value");
    w = fresh();
    dsc__ptw_dict_begin(w);
    dsc__ptw_list_begin(w);
    dsc__ptw_list_end(w);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "cannot hash");
    w = fresh();
    dsc__ptw_int(w, 1);
    dsc__ptw_int(w, 2);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "second value at the top");
    w = fresh();
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "a");
    dsc__ptw_list_begin(w);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "a list (inside 1 more containers)");
    w = fresh();
    dsc__ptw_object_begin(w, "argparse", "Namespace");
    dsc__ptw_dict_begin(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_none(w);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "more than one state value");
    w = fresh();
    dsc__ptw_object_begin(w, "os\nsystem", "x");
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "dotted Python identifiers");
    w = fresh();
    dsc__ptw_str(w, "\xff\xfe");
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "not UTF-8");
    w = fresh();
    dsc__ptw_str(w, "\xed\xa0\x80"); // an encoded surrogate
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "not UTF-8");
    w = fresh();
    dsc__ptw_str(w, NULL);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "NULL string");
    int64_t shape[9] = {2, -1};
    w = fresh();
    dsc__ptw_tensor(w, DSC_PT_F32, 9, shape, NULL);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "at most 8 dimensions");
    w = fresh();
    dsc__ptw_tensor(w, (dsc_pt_dtype)99, 1, shape, NULL);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "dtype 99");
    w = fresh();
    dsc__ptw_tensor(w, DSC_PT_F32, 2, shape, NULL);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "dimension 1 of size -1");
    w = fresh();
    dsc__ptw_tensor(w, DSC_PT_F32, 1, shape, NULL);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "without data");
    int64_t huge[3] = {INT64_MAX, 2, 0};
    w = fresh();
    dsc__ptw_tensor(w, DSC_PT_F32, 2, huge, NULL);
    refused(w, "m.pt", NULL, DSC_ERR_INVALID_ARG, "past 2^63");
    w = fresh();
    dsc__ptw_int(w, 1);
    refused(w, "m.pt", "a/b", DSC_ERR_INVALID_ARG, "archive folder name");
    w = fresh();
    dsc__ptw_int(w, 1);
    refused(w, "m.pt", "", DSC_ERR_INVALID_ARG, "archive folder name");
    dsc__ptw_free(NULL);
    assert_int_equal(dsc__ptw_status(NULL), DSC_ERR_INVALID_ARG);
}

static void write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void assert_text(const char *path, const char *want) {
    size_t n;
    char *b = (char *)slurp(path, &n);
    assert_string_equal(b, want);
    free(b);
}

static dsc__ptw *with_tensor(size_t floats) {
    dsc__ptw *w = fresh();
    float *v = calloc(floats, sizeof *v);
    int64_t shape[1] = {(int64_t)floats};
    dsc__ptw_tensor(w, DSC_PT_F32, 1, shape, v);
    free(v);
    return w;
}

static void test_unwritable(void **state) {
    (void)state;
    char path[600], tmp[610], sub[600];
    // No such directory.
    dsc__ptw *w = with_tensor(4);
    refused(w, "no/such/dir.pt", NULL, DSC_ERR_IO, "no/such/dir.pt.tmp: No such file");
    // A directory in the way of the rename: it stays, the .tmp goes.
    path_of(sub, sizeof sub, "adir");
    assert_int_equal(mkdir(sub, 0755), 0);
    w = with_tensor(4);
    assert_int_equal(dsc__ptw_save(w, sub, NULL), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "adir"));
    assert_true(dsc__ckpt_is_dir(sub));
    snprintf(tmp, sizeof tmp, "%s.tmp", sub);
    assert_false(exists(tmp));
    dsc__ptw_free(w);
    // An existing file survives a failed save; a .tmp in the way is not ours to remove.
    path_of(path, sizeof path, "keep.pt");
    write_text(path, "old");
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(mkdir(tmp, 0755), 0);
    w = with_tensor(4);
    assert_int_equal(dsc__ptw_save(w, path, NULL), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "keep.pt.tmp"));
    assert_text(path, "old");
    assert_int_equal(rmdir(tmp), 0);
    // A write that fails in the middle (as on a full disk: a file size limit here).
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = old;
    lim.rlim_cur = 4096;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    dsc_status st = dsc__ptw_save(w, path, NULL); // 4 floats: fits
    dsc__ptw *big = with_tensor(16384);
    dsc_status st_big = dsc__ptw_save(big, path, NULL);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, was);
    assert_int_equal(st, DSC_OK);
    assert_int_equal(st_big, DSC_ERR_IO);
    if (!strstr(dsc_last_error(), "keep.pt.tmp") || !strstr(dsc_last_error(), "too large"))
        fail_msg("'%s' names neither the file nor the cause", dsc_last_error());
    assert_false(exists(tmp));
    dsc_pt_file *f = NULL; // the good save stayed
    assert_int_equal(dsc_pt_open(&f, path), DSC_OK);
    assert_int_equal(dsc_pt_root(f)->t->numel, 4);
    dsc_pt_close(f);
    // Saved again, the same writer replaces the file with the big one.
    assert_int_equal(dsc__ptw_save(big, path, NULL), DSC_OK);
    assert_false(exists(tmp));
    assert_int_equal(dsc_pt_open(&f, path), DSC_OK);
    assert_int_equal(dsc_pt_root(f)->t->numel, 16384);
    dsc_pt_close(f);
    dsc__ptw_free(w);
    dsc__ptw_free(big);
}

// The folder inside the zip, from the file's name as torch.save names it.
static void test_archive_names(void **state) {
    (void)state;
    const char *names[][2] = {{"fp32.pt", "fp32"}, {"a.b.pt", "a.b"}, {"noext", "noext"},
                              {".pt", "archive"}, {"mp_rank_00_model_states.pt",
                              "mp_rank_00_model_states"}};
    for (int k = 0; k < 5; k++) {
        char path[600];
        path_of(path, sizeof path, names[k][0]);
        dsc__ptw *w = fresh();
        dsc__ptw_int(w, k);
        assert_int_equal(dsc__ptw_save(w, path, NULL), DSC_OK);
        dsc__ptw_free(w);
        check_layout(path, names[k][1], 0, false);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_value),   cmocka_unit_test(test_batches),
        cmocka_unit_test(test_random_values), cmocka_unit_test(test_pickle_bytes),
        cmocka_unit_test(test_misuse),        cmocka_unit_test(test_unwritable),
        cmocka_unit_test(test_archive_names), cmocka_unit_test(test_calls_and_globals),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
