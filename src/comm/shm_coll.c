// comm/shm_coll.c - the shm backend's collectives, run chunk by chunk on the progress thread.
//
// A chunk moves through two buffers per rank: a staging slot where the rank places its input,
// and (for reductions) a result slot. For a reduction every rank reduces one slice of the chunk,
// reading the slices of all ranks in rank order, so each output element is computed exactly once,
// by one rank, as ((x_0 + x_1) + x_2) + ... in fp32: the same bits whatever the timing, and the
// same for all_reduce as for reduce_scatter + all_gather. Staging of chunk g+1 overlaps the
// wait for the peers' reductions of chunk g (two buffers alternate). Small all_reduces let every
// rank compute the whole (identical) result instead.
#include <stdint.h> // uintptr_t
#include <stdio.h>  // snprintf
#include <string.h> // memcpy, memmove

#if defined(__x86_64__)
#include <emmintrin.h> // _mm_stream_si128, _mm_sfence (SSE2: every x86-64)
#endif

#include "base/status.h"   // DSC_TRY
#include "comm/reduce.h"   // dsc__reduce
#include "comm/shm_impl.h" // shm, shm__*

typedef struct coll {
    shm *s;
    const dsc__comm_op *op;
    shm_wait_ctx *w;
    size_t es; // element size in bytes
} coll;

static size_t min_sz(size_t a, size_t b) { return a < b ? a : b; }

// Operations at least this large write the caller's buffer with non-temporal stores: it cannot
// stay in cache anyway, and streaming spares the memory bus the read-for-ownership of every line.
#define STREAM_MIN_BYTES (16u << 20)

static bool streaming(const coll *c, size_t total_bytes) {
    (void)c;
    return total_bytes >= STREAM_MIN_BYTES;
}

// memcpy, or a streaming copy (non-overlapping buffers) fenced before the caller can look.
static void copy_out(void *dst, const void *src, size_t n, bool stream) {
#if defined(__x86_64__)
    if (stream && n >= 1024) {
        uint8_t *d = dst;
        const uint8_t *s = src;
        size_t head = (16 - ((uintptr_t)d & 15)) & 15;
        memcpy(d, s, head);
        d += head;
        s += head;
        n -= head;
        size_t body = n & ~(size_t)63;
        for (size_t i = 0; i < body; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i f = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), e);
            _mm_stream_si128((__m128i *)(d + i + 48), f);
        }
        memcpy(d + body, s + body, n - body);
        _mm_sfence(); // streamed lines are globally visible before the next counter store
        return;
    }
#endif
    memcpy(dst, src, n);
}

// Reserve the operation's chunk numbers and record its descriptor; returns the first chunk.
static uint64_t begin(shm *s, const dsc__comm_op *op, size_t nchunks) {
    uint64_t g0 = s->chunk + 1;
    s->chunk += nchunks;
    uint64_t seq = ++s->seq;
    shm_desc *d = &s->ctrl[s->rank].desc[seq % SHM_DESC_RING];
    *d = (shm_desc){.seq = seq, .count = op->count, .kind = (int32_t)op->kind,
                    .dt = (int32_t)op->dt, .red = (int32_t)op->red, .root = op->root};
    return g0; // published with the first staged counter
}

// After every (or rank `only`'s) staged counter reached the first chunk: did they call the same
// collective? A mismatch would otherwise corrupt data or hang.
static dsc_status check_descs(shm *s, shm_wait_ctx *w, int only) {
    const shm_desc *mine = &s->ctrl[s->rank].desc[s->seq % SHM_DESC_RING];
    for (int j = 0; j < s->world; j++) {
        if (j == s->rank || (only >= 0 && j != only)) continue;
        const shm_desc *d = &s->ctrl[j].desc[s->seq % SHM_DESC_RING];
        if (d->seq == mine->seq && d->count == mine->count && d->kind == mine->kind &&
            d->dt == mine->dt && d->red == mine->red && d->root == mine->root)
            continue;
        dsc__comm_op theirs = {.kind = (dsc__op_kind)d->kind, .count = d->count,
                               .dt = (dsc_dtype)d->dt, .red = (dsc_red_op)d->red, .root = d->root};
        char desc[128];
        dsc__op_describe(&theirs, desc, sizeof desc);
        dsc__comm_msg(w->msg,
                 "rank %d: collective mismatch: this rank's collective #%llu is %s (op %d, root "
                 "%d), rank %d's #%llu is %s (op %d, root %d); every rank must issue the same "
                 "collectives in the same order",
                 s->rank, (unsigned long long)mine->seq, w->what, mine->red, mine->root, j,
                 (unsigned long long)d->seq, desc, d->red, d->root);
        return DSC_ERR_INVALID_ARG;
    }
    return DSC_OK;
}

// ---- all_reduce and reduce ----

// Rank j reduces elements [a, b) of an m-element chunk (64-byte aligned slices, some empty).
static void slice_of(size_t m, int world, int j, size_t *a, size_t *b) {
    size_t q = (m + (size_t)world - 1) / (size_t)world;
    q = (q + 15) & ~(size_t)15;
    *a = min_sz(m, (size_t)j * q);
    *b = min_sz(m, (size_t)(j + 1) * q);
}

// Stage chunk g (src: m elements): every slice but this rank's own, which it reads in place.
static dsc_status ar_stage(coll *c, uint64_t g, const uint8_t *src, size_t m) {
    shm *s = c->s;
    if (g > 2) DSC_TRY(shm__wait(s, c->w, F_DONE, g - 2, -1));
    uint8_t *slot = shm__slot(s, s->rank, g);
    size_t a, b;
    slice_of(m, s->world, s->rank, &a, &b);
    memcpy(slot, src, a * c->es);
    memcpy(slot + b * c->es, src + b * c->es, (m - b) * c->es);
    shm__publish(s, F_STAGED, g);
    return DSC_OK;
}

// This rank's slice of chunk g, over all ranks in rank order, into the result slot.
static void ar_reduce(coll *c, uint64_t g, const uint8_t *src, size_t m) {
    shm *s = c->s;
    size_t a, b;
    slice_of(m, s->world, s->rank, &a, &b);
    if (a >= b) return;
    for (int j = 0; j < s->world; j++)
        s->srcs[j] = j == s->rank ? src + a * c->es : shm__slot(s, j, g) + a * c->es;
    dsc__reduce(shm__result(s, g) + a * c->es, s->srcs, s->world, b - a, c->op->dt, c->op->red);
}

// Small buffers: every rank stages all of its input and reduces the whole vector itself (the
// same rank-order formula, so the same bits): one synchronisation instead of two.
#define SMALL_REDUCE_BYTES (64u << 10) // world * count * element size up to this

static dsc_status all_reduce_small(coll *c) {
    shm *s = c->s;
    const dsc__comm_op *op = c->op;
    size_t n = op->count, es = c->es;
    bool want = op->kind == DSC__OP_ALL_REDUCE || s->rank == op->root;
    uint64_t g = begin(s, op, 1);
    if (g > 2) DSC_TRY(shm__wait(s, c->w, F_DONE, g - 2, -1));
    memcpy(shm__slot(s, s->rank, g), op->send, n * es);
    shm__publish(s, F_STAGED, g);
    if (want) {
        DSC_TRY(shm__wait(s, c->w, F_STAGED, g, -1));
        DSC_TRY(check_descs(s, c->w, -1));
        for (int j = 0; j < s->world; j++)
            s->srcs[j] = j == s->rank ? op->send : shm__slot(s, j, g);
        dsc__reduce(op->recv, s->srcs, s->world, n, op->dt, op->red);
    }
    shm__publish(s, F_DONE, g);
    return DSC_OK;
}

static dsc_status all_reduce(coll *c) {
    shm *s = c->s;
    const dsc__comm_op *op = c->op;
    size_t es = c->es, E = s->slot_bytes / es, n = op->count, K = (n + E - 1) / E;
    if (n <= E && (size_t)s->world * n * es <= SMALL_REDUCE_BYTES) return all_reduce_small(c);
    bool want = op->kind == DSC__OP_ALL_REDUCE || s->rank == op->root;
    bool stream = streaming(c, n * es);
    const uint8_t *src = op->send;
    uint8_t *dst = op->recv; // (n) on ranks that want the result
    uint64_t g0 = begin(s, op, K);
    DSC_TRY(ar_stage(c, g0, src, min_sz(E, n)));
    for (size_t k = 0; k < K; k++) {
        uint64_t g = g0 + k;
        size_t off = k * E, m = min_sz(E, n - off);
        DSC_TRY(shm__wait(s, c->w, F_STAGED, g, -1));
        if (k == 0) DSC_TRY(check_descs(s, c->w, -1));
        ar_reduce(c, g, src + off * es, m);
        shm__publish(s, F_REDUCED, g);
        if (k + 1 < K) DSC_TRY(ar_stage(c, g + 1, src + (off + E) * es, min_sz(E, n - off - E)));
        if (want) {
            DSC_TRY(shm__wait(s, c->w, F_REDUCED, g, -1));
            copy_out(dst + off * es, shm__result(s, g), m * es, stream);
        }
        shm__publish(s, F_DONE, g);
    }
    return DSC_OK;
}

// ---- reduce_scatter ----

// Where block j sits in the staging slot of rank `owner` (which does not stage its own block).
static size_t block_pos(int j, int owner) { return (size_t)(j < owner ? j : j - 1); }

// Stage elements [off, off + m) of every other rank's block of send (world, n).
static dsc_status rs_stage(coll *c, uint64_t g, size_t off, size_t m, size_t E) {
    shm *s = c->s;
    const uint8_t *send = c->op->send;
    size_t n = c->op->count, es = c->es;
    if (g > 2) DSC_TRY(shm__wait(s, c->w, F_DONE, g - 2, -1));
    uint8_t *slot = shm__slot(s, s->rank, g);
    for (int j = 0; j < s->world; j++)
        if (j != s->rank)
            memcpy(slot + block_pos(j, s->rank) * E * es, send + ((size_t)j * n + off) * es,
                   m * es);
    shm__publish(s, F_STAGED, g);
    return DSC_OK;
}

static dsc_status reduce_scatter(coll *c) {
    shm *s = c->s;
    const dsc__comm_op *op = c->op;
    size_t es = c->es, n = op->count, E = s->slot_bytes / ((size_t)(s->world - 1) * es);
    size_t K = (n + E - 1) / E;
    const uint8_t *mine = (const uint8_t *)op->send + (size_t)s->rank * n * es; // (n)
    uint8_t *dst = op->recv;                                                      // (n)
    uint64_t g0 = begin(s, op, K);
    DSC_TRY(rs_stage(c, g0, 0, min_sz(E, n), E));
    for (size_t k = 0; k < K; k++) {
        uint64_t g = g0 + k;
        size_t off = k * E, m = min_sz(E, n - off);
        DSC_TRY(shm__wait(s, c->w, F_STAGED, g, -1));
        if (k == 0) DSC_TRY(check_descs(s, c->w, -1));
        if (k + 1 < K) DSC_TRY(rs_stage(c, g + 1, off + E, min_sz(E, n - off - E), E));
        for (int i = 0; i < s->world; i++)
            s->srcs[i] = i == s->rank ? mine + off * es
                                      : shm__slot(s, i, g) + block_pos(s->rank, i) * E * es;
        dsc__reduce(dst + off * es, s->srcs, s->world, m, op->dt, op->red);
        shm__publish(s, F_DONE, g);
    }
    return DSC_OK;
}

// ---- all_gather ----

static dsc_status ag_stage(coll *c, uint64_t g, size_t off, size_t m) {
    shm *s = c->s;
    if (g > 2) DSC_TRY(shm__wait(s, c->w, F_DONE, g - 2, -1));
    memcpy(shm__slot(s, s->rank, g), (const uint8_t *)c->op->send + off * c->es, m * c->es);
    shm__publish(s, F_STAGED, g);
    return DSC_OK;
}

static dsc_status all_gather(coll *c) {
    shm *s = c->s;
    const dsc__comm_op *op = c->op;
    size_t es = c->es, E = s->slot_bytes / es, n = op->count, K = (n + E - 1) / E;
    uint8_t *recv = op->recv; // (world, n)
    bool stream = streaming(c, (size_t)s->world * n * es);
    uint64_t g0 = begin(s, op, K);
    DSC_TRY(ag_stage(c, g0, 0, min_sz(E, n)));
    for (size_t k = 0; k < K; k++) {
        uint64_t g = g0 + k;
        size_t off = k * E, m = min_sz(E, n - off);
        DSC_TRY(shm__wait(s, c->w, F_STAGED, g, -1));
        if (k == 0) DSC_TRY(check_descs(s, c->w, -1));
        if (k + 1 < K) DSC_TRY(ag_stage(c, g + 1, off + E, min_sz(E, n - off - E)));
        for (int j = 0; j < s->world; j++) {
            uint8_t *to = recv + ((size_t)j * n + off) * es;
            const uint8_t *from = j == s->rank ? (const uint8_t *)op->send + off * es
                                               : shm__slot(s, j, g);
            if (to == from) continue; // in place: send == recv + rank * n
            if (j == s->rank) memmove(to, from, m * es);
            else copy_out(to, from, m * es, stream);
        }
        shm__publish(s, F_DONE, g);
    }
    return DSC_OK;
}

// ---- broadcast ----

static dsc_status broadcast(coll *c) {
    shm *s = c->s;
    const dsc__comm_op *op = c->op;
    size_t es = c->es, E = s->slot_bytes / es, n = op->count, K = (n + E - 1) / E;
    uint8_t *buf = op->recv; // (n)
    uint64_t g0 = begin(s, op, K);
    for (size_t k = 0; k < K; k++) {
        uint64_t g = g0 + k;
        size_t off = k * E, m = min_sz(E, n - off);
        if (s->rank == op->root) {
            if (g > 2) DSC_TRY(shm__wait(s, c->w, F_DONE, g - 2, -1));
            memcpy(shm__slot(s, s->rank, g), buf + off * es, m * es);
            atomic_store(shm__counter(s, s->rank, F_STAGED), g);
        } else {
            DSC_TRY(shm__wait(s, c->w, F_STAGED, g, op->root));
            if (k == 0) DSC_TRY(check_descs(s, c->w, op->root));
            copy_out(buf + off * es, shm__slot(s, op->root, g), m * es, streaming(c, n * es));
        }
        shm__publish(s, F_DONE, g);
    }
    return DSC_OK;
}

// ---- barrier ----

static dsc_status barrier(coll *c) {
    shm *s = c->s;
    uint64_t g = begin(s, c->op, 1);
    shm__publish(s, F_STAGED, g);
    DSC_TRY(shm__wait(s, c->w, F_STAGED, g, -1));
    DSC_TRY(check_descs(s, c->w, -1));
    shm__publish(s, F_DONE, g);
    return DSC_OK;
}

dsc_status shm__collective(shm *s, dsc_comm_req *r, shm_wait_ctx *w) {
    coll c = {s, &r->op, w, dsc_dtype_size(r->op.dt)};
    switch (r->op.kind) {
    case DSC__OP_ALL_REDUCE:
    case DSC__OP_REDUCE: return all_reduce(&c);
    case DSC__OP_REDUCE_SCATTER: return reduce_scatter(&c);
    case DSC__OP_ALL_GATHER: return all_gather(&c);
    case DSC__OP_BROADCAST: return broadcast(&c);
    case DSC__OP_BARRIER: return barrier(&c);
    default:
        dsc__comm_msg(w->msg, "shm: %s is not a collective", w->what);
        return DSC_ERR_INTERNAL;
    }
}
