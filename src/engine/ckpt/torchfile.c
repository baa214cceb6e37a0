// ckpt/torchfile.c - torch.save's files: the archive, a restricted unpickler, tensor access.
#include "engine/ckpt/torchfile.h"

#include <errno.h>    // errno
#include <fcntl.h>    // open
#include <stdarg.h>   // va_list
#include <stdio.h>    // vsnprintf
#include <stdlib.h>   // calloc, free, realloc
#include <string.h>   // memcpy, strcmp, strerror
#include <sys/mman.h> // mmap, madvise
#include <sys/stat.h> // fstat
#include <unistd.h>   // close

#include "base/io.h"            // dsc__open_regular
#include "base/status.h"        // dsc__fail
#include "dsc/half.h"           // dsc_bf16_to_fp32, dsc_fp16_to_fp32
#include "engine/ckpt/ptzip.h"  // dsc__zip_*

struct dsc_pt_file {
    char *path;
    void *map;             // NULL when the bytes are the caller's (dsc_pt_open_mem)
    size_t map_len;
    dsc__zip zip;
    char prefix[256];      // "<archive>/"
    dsc_pt_value **all;    // every value made, freed at close (memo entries share them)
    int nall, capall;
    dsc_pt_value *root;
};

// ---- the globals a checkpoint may name ----

typedef enum gkind {
    G_REBUILD_V2, G_REBUILD_PARAM, G_STORAGE_TYPE, G_DTYPE, G_SIZE, G_ODICT, G_ENUM_INT, G_PLAIN,
    G_SET, G_GETATTR, G_FROM_TYPE, G_TENSOR_TYPE,
} gkind;

static const struct allowed {
    const char *module, *name;
    gkind kind;
    dsc_pt_dtype dtype;
} allowed[] = {
    {"torch._utils", "_rebuild_tensor_v2", G_REBUILD_V2, 0},
    {"torch._utils", "_rebuild_parameter", G_REBUILD_PARAM, 0},
    // A tensor with Python attributes (DeepSpeed's ds_id on ZeRO-3's flat groups) pickles under
    // torch 2 as _rebuild_from_type_v2(_rebuild_tensor_v2, torch.Tensor, args, attributes).
    {"torch._tensor", "_rebuild_from_type_v2", G_FROM_TYPE, 0},
    {"torch", "Tensor", G_TENSOR_TYPE, 0},
    {"torch.nn.parameter", "Parameter", G_TENSOR_TYPE, 0},
    {"torch", "FloatStorage", G_STORAGE_TYPE, DSC_PT_F32},
    {"torch", "DoubleStorage", G_STORAGE_TYPE, DSC_PT_F64},
    {"torch", "HalfStorage", G_STORAGE_TYPE, DSC_PT_F16},
    {"torch", "BFloat16Storage", G_STORAGE_TYPE, DSC_PT_BF16},
    {"torch", "LongStorage", G_STORAGE_TYPE, DSC_PT_I64},
    {"torch", "IntStorage", G_STORAGE_TYPE, DSC_PT_I32},
    {"torch", "ShortStorage", G_STORAGE_TYPE, DSC_PT_I16},
    {"torch", "CharStorage", G_STORAGE_TYPE, DSC_PT_I8},
    {"torch", "ByteStorage", G_STORAGE_TYPE, DSC_PT_U8},
    {"torch", "BoolStorage", G_STORAGE_TYPE, DSC_PT_BOOL8},
    {"torch", "float32", G_DTYPE, DSC_PT_F32},
    {"torch", "float64", G_DTYPE, DSC_PT_F64},
    {"torch", "float16", G_DTYPE, DSC_PT_F16},
    {"torch", "bfloat16", G_DTYPE, DSC_PT_BF16},
    {"torch", "int64", G_DTYPE, DSC_PT_I64},
    {"torch", "int32", G_DTYPE, DSC_PT_I32},
    {"torch", "int16", G_DTYPE, DSC_PT_I16},
    {"torch", "int8", G_DTYPE, DSC_PT_I8},
    {"torch", "uint8", G_DTYPE, DSC_PT_U8},
    {"torch", "bool", G_DTYPE, DSC_PT_BOOL8},
    {"torch", "Size", G_SIZE, 0},
    {"collections", "OrderedDict", G_ODICT, 0},
    {"deepspeed.runtime.zero.config", "ZeroStageEnum", G_ENUM_INT, 0},
    {"deepspeed.runtime.fp16.loss_scaler", "LossScaler", G_PLAIN, 0},
    {"deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler", G_PLAIN, 0},
    {"deepspeed.utils.tensor_fragment", "fragment_address", G_PLAIN, 0},
    {"argparse", "Namespace", G_PLAIN, 0},
    // A set (DeepSpeed's sparse_tensor_module_names) pickles at protocol 2 as set(list); an
    // Enum member under Python >= 3.11 as getattr(class, name), allowed for the enums above only.
    {"__builtin__", "set", G_SET, 0},
    {"builtins", "set", G_SET, 0},
    {"__builtin__", "getattr", G_GETATTR, 0},
    {"builtins", "getattr", G_GETATTR, 0},
};

// ZeroStageEnum's members by name (deepspeed/runtime/zero/config.py).
static const struct {
    const char *name;
    int value;
} zero_stages[] = {{"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3},
                   {"max_stage", 3}};
#define NALLOWED ((int)(sizeof allowed / sizeof allowed[0]))

static const size_t dtype_sizes[] = {4, 8, 2, 2, 8, 4, 2, 1, 1, 1};
static const char *const dtype_names[] = {"F32", "F64", "F16", "BF16", "I64",
                                          "I32", "I16", "I8",  "U8",   "BOOL"};

size_t dsc_pt_dtype_size(dsc_pt_dtype d) { return dtype_sizes[d]; }
const char *dsc_pt_dtype_name(dsc_pt_dtype d) { return dtype_names[d]; }

// ---- the unpickler's state ----

typedef struct unpickler {
    dsc_pt_file *f;
    const uint8_t *p;
    size_t len, pos, op_at; // the pickle, the read position, the current opcode's offset
    dsc_pt_value **stack;
    int sp, scap;
    int *marks;
    int nmarks, mcap;
    dsc_pt_value **memo;
    size_t memo_cap;
    size_t next_memo; // MEMOIZE's index
} unpickler;

// An error at the current opcode: names the file, the offset in data.pkl and the fault.
static dsc_status bad(const unpickler *u, const char *fmt, ...) DSC_PRINTF_LIKE(2, 3);
static dsc_status bad(const unpickler *u, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return dsc__fail(DSC_ERR_CORRUPT, "%s: data.pkl byte %zu: %s", u->f->path, u->op_at, why);
}

static dsc_status grow(void **arr, int *cap, int want, size_t elem) {
    if (want <= *cap) return DSC_OK;
    int n = *cap ? *cap : 16;
    while (n < want) {
        if (n > (1 << 29)) return dsc__fail(DSC_ERR_OOM, "pickle too large");
        n *= 2;
    }
    void *p = realloc(*arr, (size_t)n * elem);
    if (!p) return dsc__fail(DSC_ERR_OOM, "out of memory reading a checkpoint's pickle");
    *arr = p;
    *cap = n;
    return DSC_OK;
}

static dsc_status new_value(unpickler *u, dsc_pt_kind kind, dsc_pt_value **out) {
    dsc_pt_file *f = u->f;
    DSC_TRY(grow((void **)&f->all, &f->capall, f->nall + 1, sizeof *f->all));
    dsc_pt_value *v = calloc(1, sizeof *v);
    if (!v) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", f->path);
    v->kind = kind;
    f->all[f->nall++] = v;
    *out = v;
    return DSC_OK;
}

static dsc_status push(unpickler *u, dsc_pt_value *v) {
    DSC_TRY(grow((void **)&u->stack, &u->scap, u->sp + 1, sizeof *u->stack));
    u->stack[u->sp++] = v;
    return DSC_OK;
}

static dsc_status push_new(unpickler *u, dsc_pt_kind kind, dsc_pt_value **out) {
    dsc_pt_value *v = NULL;
    DSC_TRY(new_value(u, kind, &v));
    if (out) *out = v;
    return push(u, v);
}

// The stack floor: values below the innermost mark belong to an enclosing construction.
static int floor_sp(const unpickler *u) { return u->nmarks ? u->marks[u->nmarks - 1] : 0; }

static dsc_status pop(unpickler *u, dsc_pt_value **out) {
    if (u->sp <= floor_sp(u)) return bad(u, "stack underflow (a damaged pickle)");
    *out = u->stack[--u->sp];
    return DSC_OK;
}

static dsc_status top(unpickler *u, dsc_pt_value **out) {
    if (u->sp <= floor_sp(u)) return bad(u, "stack underflow (a damaged pickle)");
    *out = u->stack[u->sp - 1];
    return DSC_OK;
}

static dsc_status pop_mark(unpickler *u, int *at) {
    if (!u->nmarks) return bad(u, "no mark on the stack (a damaged pickle)");
    *at = u->marks[--u->nmarks];
    return DSC_OK;
}

static dsc_status append_item(dsc_pt_value *c, dsc_pt_value *v) {
    DSC_TRY(grow((void **)&c->items, &c->cap, c->n + 1, sizeof *c->items));
    c->items[c->n++] = v;
    return DSC_OK;
}

// ---- reading the pickle's bytes ----

static dsc_status take(unpickler *u, size_t n, const uint8_t **out) {
    if (n > u->len - u->pos) return bad(u, "the pickle ends inside an opcode (a truncated file)");
    *out = u->p + u->pos;
    u->pos += n;
    return DSC_OK;
}

static dsc_status take_uint(unpickler *u, int bytes, uint64_t *out) {
    const uint8_t *b = NULL;
    DSC_TRY(take(u, (size_t)bytes, &b));
    uint64_t x = 0;
    for (int i = bytes; i-- > 0;) x = x << 8 | b[i];
    *out = x;
    return DSC_OK;
}

// ---- opcodes that build plain values ----

static dsc_status op_int(unpickler *u, int bytes, bool is_signed) {
    uint64_t x = 0;
    DSC_TRY(take_uint(u, bytes, &x));
    dsc_pt_value *v = NULL;
    DSC_TRY(push_new(u, DSC_PT_INT, &v));
    v->i = is_signed ? (int64_t)(int32_t)(uint32_t)x : (int64_t)x;
    return DSC_OK;
}

// LONG1/LONG4: a little-endian two's-complement integer of n bytes; up to 64 bits here.
static dsc_status op_long(unpickler *u, int len_bytes) {
    uint64_t n = 0;
    DSC_TRY(take_uint(u, len_bytes, &n));
    if (n > 8) return bad(u, "an integer of %llu bytes (more than 64 bits)", (unsigned long long)n);
    const uint8_t *b = NULL;
    DSC_TRY(take(u, (size_t)n, &b));
    uint64_t x = 0;
    for (size_t i = n; i-- > 0;) x = x << 8 | b[i];
    if (n > 0 && n < 8 && (b[n - 1] & 0x80)) x |= ~(uint64_t)0 << (8 * n); // sign-extend
    dsc_pt_value *v = NULL;
    DSC_TRY(push_new(u, DSC_PT_INT, &v));
    v->i = (int64_t)x;
    return DSC_OK;
}

static dsc_status op_float(unpickler *u) {
    uint64_t bits = 0;
    const uint8_t *b = NULL;
    DSC_TRY(take(u, 8, &b));
    for (int i = 0; i < 8; i++) bits = bits << 8 | b[i]; // big-endian on the wire
    dsc_pt_value *v = NULL;
    DSC_TRY(push_new(u, DSC_PT_FLOAT, &v));
    memcpy(&v->f, &bits, sizeof v->f);
    return DSC_OK;
}

static dsc_status op_string(unpickler *u, int len_bytes, dsc_pt_kind kind) {
    uint64_t n = 0;
    DSC_TRY(take_uint(u, len_bytes, &n));
    const uint8_t *b = NULL;
    DSC_TRY(take(u, (size_t)n, &b));
    dsc_pt_value *v = NULL;
    DSC_TRY(push_new(u, kind, &v));
    v->s = malloc((size_t)n + 1);
    if (!v->s) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", u->f->path);
    memcpy(v->s, b, (size_t)n);
    v->s[n] = 0;
    v->len = (size_t)n;
    return DSC_OK;
}

static dsc_status op_bool(unpickler *u, bool b) {
    dsc_pt_value *v = NULL;
    DSC_TRY(push_new(u, DSC_PT_BOOL, &v));
    v->i = b;
    return DSC_OK;
}

// TUPLE (from the mark), EMPTY_TUPLE, TUPLE1..3 (n from the stack top).
static dsc_status op_tuple(unpickler *u, int n) {
    int from = 0;
    if (n < 0) DSC_TRY(pop_mark(u, &from));
    else if (u->sp - floor_sp(u) < n) return bad(u, "stack underflow (a damaged pickle)");
    else from = u->sp - n;
    dsc_pt_value *t = NULL;
    DSC_TRY(new_value(u, DSC_PT_TUPLE, &t));
    for (int i = from; i < u->sp; i++) DSC_TRY(append_item(t, u->stack[i]));
    u->sp = from;
    return push(u, t);
}

static dsc_status op_append(unpickler *u, bool many) {
    int from = u->sp - 1;
    if (many) DSC_TRY(pop_mark(u, &from));
    else if (u->sp - floor_sp(u) < 2) return bad(u, "stack underflow (a damaged pickle)");
    if (from < 1 || u->stack[from - 1]->kind != DSC_PT_LIST)
        return bad(u, "APPEND to something that is not a list");
    for (int i = from; i < u->sp; i++) DSC_TRY(append_item(u->stack[from - 1], u->stack[i]));
    u->sp = from;
    return DSC_OK;
}

static dsc_status op_setitem(unpickler *u, bool many) {
    int from = u->sp - 2;
    if (many) DSC_TRY(pop_mark(u, &from));
    else if (u->sp - floor_sp(u) < 3) return bad(u, "stack underflow (a damaged pickle)");
    if ((u->sp - from) % 2 || from < 1 || u->stack[from - 1]->kind != DSC_PT_DICT)
        return bad(u, "SETITEM(S) on something that is not a dict, or a key without a value");
    for (int i = from; i < u->sp; i++) DSC_TRY(append_item(u->stack[from - 1], u->stack[i]));
    u->sp = from;
    return DSC_OK;
}

static dsc_status op_dict_from_mark(unpickler *u, dsc_pt_kind kind) {
    int from = 0;
    DSC_TRY(pop_mark(u, &from));
    if (kind == DSC_PT_DICT && (u->sp - from) % 2) return bad(u, "DICT with a key without value");
    dsc_pt_value *d = NULL;
    DSC_TRY(new_value(u, kind, &d));
    for (int i = from; i < u->sp; i++) DSC_TRY(append_item(d, u->stack[i]));
    u->sp = from;
    return push(u, d);
}

// ---- memo ----

static dsc_status memo_put(unpickler *u, uint64_t idx) {
    // Picklers number memo entries from 0 up, one per PUT: an index beyond the pickle's length
    // is a damaged or hostile file, and refusing it bounds the table by the input.
    if (idx > u->len) return bad(u, "memo index %llu beyond the pickle", (unsigned long long)idx);
    dsc_pt_value *v = NULL;
    DSC_TRY(top(u, &v));
    if (idx >= u->memo_cap) {
        size_t n = u->memo_cap ? u->memo_cap : 64;
        while (n <= idx) n *= 2;
        dsc_pt_value **m = realloc(u->memo, n * sizeof *m);
        if (!m) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", u->f->path);
        memset(m + u->memo_cap, 0, (n - u->memo_cap) * sizeof *m);
        u->memo = m;
        u->memo_cap = n;
    }
    u->memo[idx] = v;
    return DSC_OK;
}

static dsc_status memo_get(unpickler *u, uint64_t idx) {
    if (idx >= u->memo_cap || !u->memo[idx])
        return bad(u, "memo entry %llu was never stored", (unsigned long long)idx);
    return push(u, u->memo[idx]);
}

// ---- globals ----

static dsc_status push_global(unpickler *u, const char *mod, size_t mlen, const char *name,
                              size_t nlen) {
    for (int k = 0; k < NALLOWED; k++)
        if (strlen(allowed[k].module) == mlen && !memcmp(allowed[k].module, mod, mlen) &&
            strlen(allowed[k].name) == nlen && !memcmp(allowed[k].name, name, nlen)) {
            dsc_pt_value *v = NULL;
            DSC_TRY(push_new(u, DSC_PT_GLOBAL, &v));
            v->i = k;
            v->s = malloc(mlen + nlen + 2);
            if (!v->s) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", u->f->path);
            snprintf(v->s, mlen + nlen + 2, "%.*s.%.*s", (int)mlen, mod, (int)nlen, name);
            v->len = mlen + nlen + 1;
            return DSC_OK;
        }
    return bad(u, "global %.*s.%.*s is not one torch.save writes for tensors nor a plain value "
               "DeepSpeed stores; refused (nothing from a checkpoint is ever run)",
               (int)(mlen > 200 ? 200 : mlen), mod, (int)(nlen > 200 ? 200 : nlen), name);
}

// GLOBAL: "module\nname\n" inline.
static dsc_status op_global(unpickler *u) {
    const uint8_t *s = u->p + u->pos, *end = u->p + u->len;
    const uint8_t *nl1 = memchr(s, '\n', (size_t)(end - s));
    const uint8_t *nl2 = nl1 ? memchr(nl1 + 1, '\n', (size_t)(end - nl1 - 1)) : NULL;
    if (!nl2) return bad(u, "GLOBAL without its module and name lines (a truncated file)");
    u->pos = (size_t)(nl2 + 1 - u->p);
    return push_global(u, (const char *)s, (size_t)(nl1 - s), (const char *)nl1 + 1,
                       (size_t)(nl2 - nl1 - 1));
}

// STACK_GLOBAL: module and name strings from the stack (protocol 4).
static dsc_status op_stack_global(unpickler *u) {
    dsc_pt_value *mod = NULL, *name = NULL;
    DSC_TRY(pop(u, &name));
    DSC_TRY(pop(u, &mod));
    if (mod->kind != DSC_PT_STR || name->kind != DSC_PT_STR)
        return bad(u, "STACK_GLOBAL with a module or name that is not a string");
    return push_global(u, mod->s, mod->len, name->s, name->len);
}

static const struct allowed *global_of(const dsc_pt_value *v) {
    return v->kind == DSC_PT_GLOBAL ? &allowed[v->i] : NULL;
}

// ---- storages and tensors ----

static bool is_str(const dsc_pt_value *v, const char *s) {
    return v && v->kind == DSC_PT_STR && v->len == strlen(s) && !memcmp(v->s, s, v->len);
}

// BINPERSID: ('storage', <storage type or dtype>, key, location, numel) names data/<key>.
static dsc_status op_persid(unpickler *u) {
    dsc_pt_value *pid = NULL, *v = NULL;
    DSC_TRY(pop(u, &pid));
    if (pid->kind != DSC_PT_TUPLE || pid->n < 5 || !is_str(pid->items[0], "storage"))
        return bad(u, "a persistent id that is not a ('storage', type, key, location, size) "
                   "tuple");
    const struct allowed *g = global_of(pid->items[1]);
    const dsc_pt_value *key = pid->items[2], *numel = pid->items[4];
    if (!g || (g->kind != G_STORAGE_TYPE && g->kind != G_DTYPE) || key->kind != DSC_PT_STR ||
        numel->kind != DSC_PT_INT || numel->i < 0 || key->len > 64)
        return bad(u, "a storage reference with an unknown type, key or size");
    char name[512];
    snprintf(name, sizeof name, "%sdata/%s", u->f->prefix, key->s);
    const dsc__zip_entry *e = dsc__zip_find(&u->f->zip, name);
    size_t es = dtype_sizes[g->dtype], bytes;
    if (!e) return bad(u, "storage %s: the archive has no entry %s", key->s, name);
    if (__builtin_mul_overflow((uint64_t)numel->i, es, &bytes) || bytes != e->size)
        return bad(u, "storage %s: %lld elements of %zu bytes, but its entry holds %llu bytes "
                   "(a lying size or a truncated file)", key->s, (long long)numel->i, es,
                   (unsigned long long)e->size);
    DSC_TRY(push_new(u, DSC_PT_STORAGE, &v));
    v->t = calloc(1, sizeof *v->t);
    if (!v->t) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", u->f->path);
    v->t->dtype = g->dtype;
    v->t->storage = e->data;
    v->t->storage_numel = numel->i;
    v->t->key = key->s;
    return DSC_OK;
}

static bool int_tuple(const dsc_pt_value *v, int64_t *out, int *n) {
    if (v->kind != DSC_PT_TUPLE || v->n > DSC_PT_MAX_DIMS) return false;
    for (int d = 0; d < v->n; d++) {
        if (v->items[d]->kind != DSC_PT_INT || v->items[d]->i < 0) return false;
        out[d] = v->items[d]->i;
    }
    *n = v->n;
    return true;
}

// Every element the view reaches lies inside its storage (computed without overflow).
static dsc_status check_view(unpickler *u, const dsc_pt_tensor *t) {
    uint64_t numel = 1, last = (uint64_t)t->offset, step;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel) || numel > INT64_MAX)
            return bad(u, "storage %s: a tensor shape whose size overflows", t->key);
    if (numel == 0) return DSC_OK;
    for (int d = 0; d < t->ndim; d++)
        if (__builtin_mul_overflow((uint64_t)(t->shape[d] - 1), (uint64_t)t->stride[d], &step) ||
            __builtin_add_overflow(last, step, &last))
            return bad(u, "storage %s: strides that overflow", t->key);
    if (last >= (uint64_t)t->storage_numel)
        return bad(u, "storage %s: a tensor reaches element %llu of a storage of %lld (a lying "
                   "shape, stride or offset)", t->key, (unsigned long long)last,
                   (long long)t->storage_numel);
    return DSC_OK;
}

// _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]).
static dsc_status rebuild_tensor(unpickler *u, const dsc_pt_value *a, dsc_pt_value *out) {
    int nd, ns;
    dsc_pt_tensor t = {0};
    if (a->n < 4 || a->items[0]->kind != DSC_PT_STORAGE || a->items[1]->kind != DSC_PT_INT ||
        a->items[1]->i < 0 || !int_tuple(a->items[2], t.shape, &nd) ||
        !int_tuple(a->items[3], t.stride, &ns) || nd != ns)
        return bad(u, "_rebuild_tensor_v2 with arguments that are not (storage, offset, shape, "
                   "strides) of at most %d dimensions", DSC_PT_MAX_DIMS);
    const dsc_pt_tensor *s = a->items[0]->t;
    t.dtype = s->dtype;
    t.storage = s->storage;
    t.storage_numel = s->storage_numel;
    t.key = s->key;
    t.ndim = nd;
    t.offset = a->items[1]->i;
    DSC_TRY(check_view(u, &t));
    t.numel = 1;
    for (int d = 0; d < nd; d++) t.numel *= t.shape[d];
    out->kind = DSC_PT_TENSOR;
    out->t = malloc(sizeof *out->t);
    if (!out->t) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", u->f->path);
    *out->t = t;
    return DSC_OK;
}

static bool is_str(const dsc_pt_value *v, const char *s);

// getattr(ZeroStageEnum, "weights"): the member's value, looked up here, not in Python.
static dsc_status enum_member(unpickler *u, const dsc_pt_value *a) {
    const struct allowed *g = a->n == 2 ? global_of(a->items[0]) : NULL;
    if (g && g->kind == G_ENUM_INT)
        for (size_t k = 0; k < sizeof zero_stages / sizeof zero_stages[0]; k++)
            if (is_str(a->items[1], zero_stages[k].name)) {
                dsc_pt_value *v = NULL;
                DSC_TRY(push_new(u, DSC_PT_INT, &v));
                v->i = zero_stages[k].value;
                return DSC_OK;
            }
    return bad(u, "getattr is applied only to a member of ZeroStageEnum");
}

// REDUCE: only the allowed callables, each with the arguments torch.save gives it.
static dsc_status op_reduce(unpickler *u) {
    dsc_pt_value *args = NULL, *fn = NULL, *v = NULL;
    DSC_TRY(pop(u, &args));
    DSC_TRY(pop(u, &fn));
    const struct allowed *g = global_of(fn);
    if (!g || args->kind != DSC_PT_TUPLE)
        return bad(u, "REDUCE of %s: only the allowed torch and DeepSpeed globals are applied",
                   fn->kind == DSC_PT_GLOBAL ? fn->s : "a value that is not a global");
    switch (g->kind) {
    case G_REBUILD_V2:
        DSC_TRY(new_value(u, DSC_PT_NONE, &v));
        DSC_TRY(rebuild_tensor(u, args, v));
        return push(u, v);
    case G_REBUILD_PARAM: // (tensor, requires_grad, hooks): the tensor itself
        if (args->n < 1 || args->items[0]->kind != DSC_PT_TENSOR)
            return bad(u, "_rebuild_parameter without a tensor");
        return push(u, args->items[0]);
    case G_SIZE:
        if (args->n != 1 || args->items[0]->kind != DSC_PT_TUPLE)
            return bad(u, "torch.Size without a tuple");
        return push(u, args->items[0]);
    case G_ODICT:
        if (args->n != 0) return bad(u, "OrderedDict built from arguments");
        return push_new(u, DSC_PT_DICT, NULL);
    case G_ENUM_INT:
        if (args->n != 1 || args->items[0]->kind != DSC_PT_INT)
            return bad(u, "%s without its integer value", fn->s);
        return push(u, args->items[0]);
    case G_SET:
        if (args->n == 0) return push_new(u, DSC_PT_LIST, NULL);
        if (args->n != 1 || args->items[0]->kind != DSC_PT_LIST)
            return bad(u, "set() of something that is not a list");
        return push(u, args->items[0]);
    case G_GETATTR:
        return enum_member(u, args);
    case G_FROM_TYPE: { // (func, type, args, attributes): func(*args); the attributes are dropped
        const struct allowed *f = args->n == 4 ? global_of(args->items[0]) : NULL;
        const struct allowed *ty = f ? global_of(args->items[1]) : NULL;
        if (!f || f->kind != G_REBUILD_V2 || !ty || ty->kind != G_TENSOR_TYPE ||
            args->items[2]->kind != DSC_PT_TUPLE || args->items[3]->kind != DSC_PT_DICT)
            return bad(u, "_rebuild_from_type_v2 of something other than a tensor rebuilt by "
                       "_rebuild_tensor_v2 as torch.Tensor or torch.nn.Parameter");
        DSC_TRY(new_value(u, DSC_PT_NONE, &v));
        DSC_TRY(rebuild_tensor(u, args->items[2], v));
        return push(u, v);
    }
    default:
        return bad(u, "REDUCE of %s: it is not called, only rebuilt from its state", fn->s);
    }
}

// NEWOBJ / NEWOBJ_EX: an allowed plain class with no constructor arguments; its state comes
// from BUILD and is kept as a value.
static dsc_status op_newobj(unpickler *u, bool ex) {
    dsc_pt_value *cls = NULL, *args = NULL, *kw = NULL, *v = NULL;
    if (ex) DSC_TRY(pop(u, &kw));
    DSC_TRY(pop(u, &args));
    DSC_TRY(pop(u, &cls));
    const struct allowed *g = global_of(cls);
    if (!g || g->kind != G_PLAIN)
        return bad(u, "NEWOBJ of %s: only DeepSpeed's plain state classes are rebuilt",
                   cls->kind == DSC_PT_GLOBAL ? cls->s : "a value that is not a class");
    if (args->kind != DSC_PT_TUPLE || args->n || (kw && (kw->kind != DSC_PT_DICT || kw->n)))
        return bad(u, "NEWOBJ of %s with constructor arguments", cls->s);
    DSC_TRY(push_new(u, DSC_PT_OBJECT, &v));
    v->s = cls->s; // shared with the global (freed with it)
    v->len = cls->len;
    return DSC_OK;
}

static dsc_status op_build(unpickler *u) {
    dsc_pt_value *state = NULL, *obj = NULL;
    DSC_TRY(pop(u, &state));
    DSC_TRY(top(u, &obj));
    // A module's state_dict() is an OrderedDict with attributes (its _metadata): torch 2
    // pickles them as a BUILD of the dict; they are kept as its state and not read.
    bool attrs = obj->kind == DSC_PT_DICT && state->kind == DSC_PT_DICT;
    if ((obj->kind != DSC_PT_OBJECT && !attrs) || obj->state)
        return bad(u, "BUILD of something that is not a plain object being rebuilt");
    obj->state = state;
    return DSC_OK;
}

// ---- the loop ----

static dsc_status op_frame_or_proto(unpickler *u, uint8_t op) {
    uint64_t x = 0;
    DSC_TRY(take_uint(u, op == 0x80 ? 1 : 8, &x));
    if (op == 0x80 && (x < 2 || x > 5))
        return bad(u, "pickle protocol %llu", (unsigned long long)x);
    return DSC_OK;
}

static dsc_status op_mark(unpickler *u) {
    DSC_TRY(grow((void **)&u->marks, &u->mcap, u->nmarks + 1, sizeof *u->marks));
    u->marks[u->nmarks++] = u->sp;
    return DSC_OK;
}

static dsc_status op_memo(unpickler *u, uint8_t op) {
    uint64_t idx = 0;
    switch (op) {
    case 'q': DSC_TRY(take_uint(u, 1, &idx)); return memo_put(u, idx);
    case 'r': DSC_TRY(take_uint(u, 4, &idx)); return memo_put(u, idx);
    case 0x94: return memo_put(u, u->next_memo++);
    case 'h': DSC_TRY(take_uint(u, 1, &idx)); return memo_get(u, idx);
    default: DSC_TRY(take_uint(u, 4, &idx)); return memo_get(u, idx); // 'j'
    }
}

static dsc_status op_pop(unpickler *u) {
    dsc_pt_value *v = NULL;
    return pop(u, &v);
}

// One opcode; *stop at STOP.
static dsc_status step(unpickler *u, uint8_t op, bool *stop) {
    switch (op) {
    case 0x80: case 0x95: return op_frame_or_proto(u, op);
    case '.': *stop = true; return DSC_OK;
    case '(': return op_mark(u);
    case '0': return op_pop(u);
    case '}': return push_new(u, DSC_PT_DICT, NULL);
    case ']': return push_new(u, DSC_PT_LIST, NULL);
    case ')': return op_tuple(u, 0);
    case 't': return op_tuple(u, -1);
    case 0x85: case 0x86: case 0x87: return op_tuple(u, op - 0x84);
    case 'l': return op_dict_from_mark(u, DSC_PT_LIST);
    case 'd': return op_dict_from_mark(u, DSC_PT_DICT);
    case 'N': return push_new(u, DSC_PT_NONE, NULL);
    case 0x88: case 0x89: return op_bool(u, op == 0x88);
    case 'J': return op_int(u, 4, true);
    case 'K': return op_int(u, 1, false);
    case 'M': return op_int(u, 2, false);
    case 0x8a: return op_long(u, 1);
    case 0x8b: return op_long(u, 4);
    case 'G': return op_float(u);
    case 'X': return op_string(u, 4, DSC_PT_STR);
    case 0x8c: return op_string(u, 1, DSC_PT_STR);
    case 0x8d: return op_string(u, 8, DSC_PT_STR);
    case 'C': return op_string(u, 1, DSC_PT_BYTES);
    case 'B': return op_string(u, 4, DSC_PT_BYTES);
    case 0x8e: return op_string(u, 8, DSC_PT_BYTES);
    case 'q': case 'r': case 0x94: case 'h': case 'j': return op_memo(u, op);
    case 'a': case 'e': return op_append(u, op == 'e');
    case 's': case 'u': return op_setitem(u, op == 'u');
    case 'c': return op_global(u);
    case 0x93: return op_stack_global(u);
    case 'Q': return op_persid(u);
    case 'R': return op_reduce(u);
    case 0x81: case 0x92: return op_newobj(u, op == 0x92);
    case 'b': return op_build(u);
    default:
        return bad(u, "opcode 0x%02x is not one torch.save uses for a checkpoint; refused", op);
    }
}

static dsc_status unpickle(dsc_pt_file *f, const uint8_t *p, size_t len) {
    unpickler u = {.f = f, .p = p, .len = len};
    dsc_status st = DSC_OK;
    bool stop = false;
    while (st == DSC_OK && !stop) {
        u.op_at = u.pos;
        if (u.pos >= len) st = bad(&u, "the pickle ends without STOP (a truncated file)");
        else st = step(&u, p[u.pos++], &stop);
    }
    if (st == DSC_OK && (u.sp != 1 || u.nmarks))
        st = bad(&u, "STOP with %d values and %d marks on the stack (a damaged pickle)", u.sp,
                 u.nmarks);
    if (st == DSC_OK) f->root = u.stack[0];
    free(u.stack);
    free(u.marks);
    free(u.memo);
    return st;
}

// ---- the archive ----

// torch.save names every entry "<archive>/...": the folder holding data.pkl.
static dsc_status find_pickle(dsc_pt_file *f, const dsc__zip_entry **pkl) {
    for (int i = 0; i < f->zip.n; i++) {
        const char *n = f->zip.e[i].name, *slash = strchr(n, '/');
        if (slash && !strcmp(slash, "/data.pkl") && (size_t)(slash - n) < sizeof f->prefix - 1) {
            snprintf(f->prefix, sizeof f->prefix, "%.*s/", (int)(slash - n), n);
            *pkl = &f->zip.e[i];
            return DSC_OK;
        }
    }
    return dsc__fail(DSC_ERR_CORRUPT, "%s: a zip archive without <name>/data.pkl: not a file "
                     "written by torch.save", f->path);
}

static dsc_status check_byteorder(const dsc_pt_file *f) {
    char name[300];
    snprintf(name, sizeof name, "%sbyteorder", f->prefix);
    const dsc__zip_entry *e = dsc__zip_find(&f->zip, name);
    if (e && !(e->size == 6 && !memcmp(e->data, "little", 6)))
        return dsc__fail(DSC_ERR_CORRUPT, "%s: saved on a big-endian machine (byteorder is not "
                         "\"little\"); load and re-save it on a little-endian one", f->path);
    return DSC_OK;
}

static dsc_status parse(dsc_pt_file *f, const uint8_t *b, size_t len) {
    if (len >= 2 && b[0] == 0x80 && b[1] <= 5)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: a legacy torch.save file (written with "
                         "_use_new_zipfile_serialization=False); dsc reads the zip format: "
                         "re-save it with torch.save(torch.load(path), path)", f->path);
    DSC_TRY(dsc__zip_index(&f->zip, b, len, f->path));
    const dsc__zip_entry *pkl = NULL;
    DSC_TRY(find_pickle(f, &pkl));
    DSC_TRY(check_byteorder(f));
    return unpickle(f, pkl->data, (size_t)pkl->size);
}

static dsc_status file_new(dsc_pt_file **out, const char *path) {
    dsc_pt_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return dsc__fail(DSC_ERR_OOM, "out of memory opening %s", path);
    }
    *out = f;
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc_pt_open_mem(dsc_pt_file **out, const void *data, size_t len, const char *name) {
    *out = NULL;
    dsc_pt_file *f = NULL;
    DSC_TRY(file_new(&f, name));
    dsc_status st = parse(f, data, len);
    if (st != DSC_OK) dsc_pt_close(f);
    else *out = f;
    return st;
}

static dsc_status map_file(dsc_pt_file *f) {
    int fd;
    DSC_TRY(dsc__open_regular(f->path, &fd)); // a FIFO in its place would hang open()
    struct stat sb;
    dsc_status st = DSC_OK;
    if (fstat(fd, &sb) != 0) st = dsc__fail(DSC_ERR_IO, "stat %s: %s", f->path, strerror(errno));
    else if (sb.st_size == 0) st = dsc__fail(DSC_ERR_CORRUPT, "%s: an empty file", f->path);
    else {
        f->map_len = (size_t)sb.st_size;
        f->map = mmap(NULL, f->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            st = dsc__fail(DSC_ERR_IO, "mmap %s: %s", f->path, strerror(errno));
        }
    }
    close(fd);
    return st;
}

dsc_status dsc_pt_open(dsc_pt_file **out, const char *path) {
    *out = NULL;
    dsc_pt_file *f = NULL;
    DSC_TRY(file_new(&f, path));
    dsc_status st = map_file(f);
    if (st == DSC_OK) st = parse(f, f->map, f->map_len);
    if (st != DSC_OK) dsc_pt_close(f);
    else *out = f;
    return st;
}

void dsc_pt_close(dsc_pt_file *f) {
    if (!f) return;
    for (int i = 0; i < f->nall; i++) {
        dsc_pt_value *v = f->all[i];
        if (v->kind != DSC_PT_OBJECT) free(v->s); // an object's name is its global's
        free(v->items);
        free(v->t);
        free(v);
    }
    free(f->all);
    dsc__zip_free(&f->zip);
    if (f->map) munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

void dsc_pt_release_pages(dsc_pt_file *f) {
    if (f && f->map) (void)madvise(f->map, f->map_len, MADV_DONTNEED);
}

size_t dsc_pt_file_bytes(const dsc_pt_file *f) { return f->map ? f->map_len : 0; }

const dsc_pt_value *dsc_pt_root(const dsc_pt_file *f) { return f->root; }
const char *dsc_pt_path(const dsc_pt_file *f) { return f->path; }

const dsc_pt_value *dsc_pt_dict_get(const dsc_pt_value *v, const char *key) {
    if (!v || v->kind != DSC_PT_DICT) return NULL;
    for (int i = 0; i + 1 < v->n; i += 2)
        if (is_str(v->items[i], key)) return v->items[i + 1];
    return NULL;
}

const dsc_pt_value *dsc_pt_item(const dsc_pt_value *v, int i) {
    if (!v || (v->kind != DSC_PT_LIST && v->kind != DSC_PT_TUPLE) || i < 0 || i >= v->n)
        return NULL;
    return v->items[i];
}

const dsc_pt_value *dsc_pt_attr(const dsc_pt_value *v, const char *name) {
    return v && v->kind == DSC_PT_OBJECT ? dsc_pt_dict_get(v->state, name) : NULL;
}

bool dsc_pt_is_str(const dsc_pt_value *v, const char *s) { return is_str(v, s); }

bool dsc_pt_int(const dsc_pt_value *v, int64_t *out) {
    if (!v || (v->kind != DSC_PT_INT && v->kind != DSC_PT_BOOL)) return false;
    *out = v->i;
    return true;
}

bool dsc_pt_num(const dsc_pt_value *v, double *out) {
    if (v && v->kind == DSC_PT_FLOAT) *out = v->f;
    else if (v && (v->kind == DSC_PT_INT || v->kind == DSC_PT_BOOL)) *out = (double)v->i;
    else return false;
    return true;
}

// ---- tensor elements ----

static float element(dsc_pt_dtype d, const uint8_t *p) {
    union { float f; double d; uint16_t h; int64_t l; int32_t i; int16_t s; } x;
    memcpy(&x, p, dtype_sizes[d]); // the mapped bytes need not be aligned
    switch (d) {
    case DSC_PT_F32: return x.f;
    case DSC_PT_F64: return (float)x.d;
    case DSC_PT_F16: return dsc_fp16_to_fp32(x.h);
    case DSC_PT_BF16: return dsc_bf16_to_fp32(x.h);
    case DSC_PT_I64: return (float)x.l;
    case DSC_PT_I32: return (float)x.i;
    case DSC_PT_I16: return (float)x.s;
    case DSC_PT_I8: return (float)(int8_t)p[0];
    default: return (float)p[0];
    }
}

void dsc_pt_tensor_read(const dsc_pt_tensor *t, int64_t begin, int64_t count, float *dst) {
    int64_t idx[DSC_PT_MAX_DIMS], at = t->offset, rest = begin;
    for (int d = t->ndim; d-- > 0;) { // the first element's coordinates and storage index
        idx[d] = t->shape[d] ? rest % t->shape[d] : 0;
        rest = t->shape[d] ? rest / t->shape[d] : 0;
        at += idx[d] * t->stride[d];
    }
    const uint8_t *s = t->storage;
    size_t es = dtype_sizes[t->dtype];
    for (int64_t k = 0; k < count; k++) {
        dst[k] = element(t->dtype, s + (size_t)at * es);
        for (int d = t->ndim; d-- > 0;) { // the next coordinates: an odometer
            at += t->stride[d];
            if (++idx[d] < t->shape[d]) break;
            at -= idx[d] * t->stride[d];
            idx[d] = 0;
        }
    }
}
