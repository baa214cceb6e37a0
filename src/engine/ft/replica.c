// engine/ft/replica.c - snapshots of this rank's training state and the buddy ring.
//
// At every step boundary, after the optimizer, each rank packs its state (the fp32 master and the
// moments of its partition, or of everything at stage 0) into one of two snapshot slots, tagged
// with the step, and sends it to rank + 1, which keeps it in one of two replica slots. The send
// reads the snapshot, not the live state, so it can run on during the next step's compute; it is
// waited for at the next boundary, and the slot is not overwritten before that. Two of
// each, because ranks may be one step apart when a fault strikes: a rank that already committed
// step s and one still inside it can then both restore step s - 1 (or both s), and so can the
// replica of a dead rank. A slot's tag is cleared before it is overwritten and set only once the
// copy (or the receive) is complete, so a slot never claims a state it does not hold entirely.
//
// On one node (the shm backend) nothing is sent: each rank's own slots live in a shared-memory
// segment of its own, which rank + 1 maps at set-up, so the replica of rank r is r's snapshot
// itself, readable by its buddy after r is gone. The segment's header publishes each slot's tag
// (cleared before the slot is overwritten, set with release order once it is whole), and that
// tag is the replica's: a replica is whole the moment its snapshot is. A recovery copies the
// mapped slots it may use out of the segment first (dsc__ft_rep_freeze). Ranks whose segment
// cannot be made or mapped (a small /dev/shm, say) fall back to sending, edge by edge.
#include <errno.h>     // errno
#include <fcntl.h>     // O_*, posix_fallocate
#include <stdatomic.h> // atomic_load_explicit, atomic_store_explicit, atomic_thread_fence
#include <stdint.h>    // uintptr_t
#include <stdio.h>     // snprintf
#include <stdlib.h>    // malloc, free
#include <string.h>    // memcpy, strcmp, strerror
#include <sys/mman.h>  // shm_open, shm_unlink, mmap, munmap
#include <sys/stat.h>  // fstat
#include <unistd.h>    // close, getpid

#if defined(__x86_64__)
#include <emmintrin.h> // _mm_stream_si128, _mm_sfence (SSE2: every x86-64)
#endif

#include "base/env.h"          // dsc__env, DSC_ENV_FT_SEND_REPLICAS
#include "base/log.h"          // DSC_INFO, DSC_WARN
#include "base/status.h"       // dsc__fail, DSC_TRY
#include "base/time.h"         // dsc_now
#include "engine/ft/ft.h"      // dsc__ft_*
#include "engine/ft/ft_impl.h" // struct dsc__ft, ft_slot

// ---- slots ----

void dsc__ft_report_cost(const struct dsc__ft *ft) {
    if (!ft->commits) return;
    double n = (double)ft->commits;
    DSC_INFO("ft", "rank %d: snapshots and replicas: %lld commits of %.2f MiB, %.3f ms per step "
             "(copy %.3f ms, waiting for the exchange %.3f ms; replica %s)", ft->orig_rank,
             (long long)ft->commits, (double)ft->len * (double)ft->nvec * 4 / (1 << 20),
             (ft->pack_s + ft->wait_s) / n * 1e3, ft->pack_s / n * 1e3, ft->wait_s / n * 1e3,
             !ft->ring ? "none" : ft->peer_maps ? "shared with the buddy" : "sent to the buddy");
}

// ---- shared segments (one node) ----

enum { SEG_PAGE = 4096 };
#define SEG_MAGIC 0x3170616e73667464ull // "dtfsnap1"

// A segment: this header on its first page, then the two own slots, each page-aligned.
typedef struct seg_head {
    uint64_t magic;
    uint64_t floats;         // per slot
    _Atomic int64_t tag[2];  // the boundary slot k holds whole, -1 none
} seg_head;

static size_t seg_slot_bytes(size_t floats) {
    size_t b = (floats ? floats : 1) * sizeof(float);
    return (b + SEG_PAGE - 1) / SEG_PAGE * SEG_PAGE;
}

static float *seg_slot(void *seg, size_t floats, int k) {
    return (float *)((char *)seg + SEG_PAGE + (size_t)k * seg_slot_bytes(floats));
}

void dsc__ft_set_tag(ft_slot *s, int64_t tag) {
    s->tag = tag;
    if (s->shared) atomic_store_explicit(s->shared, tag, memory_order_release);
}

// This rank's segment under a fresh name (name[0] = 0 when none could be made: the own slots then
// come from the pool). The pages are reserved at once, so a full /dev/shm is a refusal here and
// never a fault later.
static void seg_create(struct dsc__ft *ft, size_t floats, char *name, size_t cap) {
    static _Atomic unsigned serial;
    snprintf(name, cap, "/dsc-ft-%d-%u", (int)getpid(), atomic_fetch_add(&serial, 1));
    size_t bytes = SEG_PAGE + 2 * seg_slot_bytes(floats);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    int err = fd < 0 ? errno : 0;
    if (!err) err = posix_fallocate(fd, 0, (off_t)bytes);
    void *p = MAP_FAILED;
    if (!err) p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!err && p == MAP_FAILED) err = errno;
    if (fd >= 0) close(fd);
    if (err) {
        if (fd >= 0) shm_unlink(name);
        DSC_WARN("ft", "rank %d: no shared snapshot segment of %.1f MiB (%s): the replicas are "
                 "sent to the buddy instead (a larger /dev/shm avoids the copy)", ft->orig_rank,
                 (double)bytes / (1 << 20), strerror(err));
        name[0] = 0;
        return;
    }
    seg_head *h = p;
    h->magic = SEG_MAGIC;
    h->floats = floats;
    for (int k = 0; k < 2; k++) {
        atomic_store_explicit(&h->tag[k], -1, memory_order_relaxed);
        ft->own[k].buf = seg_slot(p, floats, k);
        ft->own[k].shared = &h->tag[k];
    }
    ft->seg = p;
    ft->seg_bytes = bytes;
}

// Map rank - 1's segment read-only; false when it cannot be (its slots are then received).
static bool seg_map(struct dsc__ft *ft, size_t floats, const char *name) {
    if (!name[0]) return false;
    int fd = shm_open(name, O_RDONLY | O_CLOEXEC, 0);
    if (fd < 0) return false;
    struct stat sb;
    void *p = MAP_FAILED;
    size_t bytes = SEG_PAGE + 2 * seg_slot_bytes(floats);
    if (fstat(fd, &sb) == 0 && (size_t)sb.st_size == bytes)
        p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return false;
    seg_head *h = p;
    if (h->magic != SEG_MAGIC || h->floats != floats) {
        munmap(p, bytes);
        return false;
    }
    for (int k = 0; k < 2; k++) {
        ft->rep[k].buf = ft->rep[k].map = seg_slot(p, floats, k);
        ft->rep[k].shared = &h->tag[k];
    }
    ft->peer = p;
    ft->peer_bytes = bytes;
    return true;
}

// Collective over the ring: each rank makes its segment, sends its name to rank + 1, maps rank -
// 1's and says whether it could; then the names go (the mappings stay, so a segment lives as
// long as its owner or its buddy, and a killed rank leaves nothing behind).
static dsc_status seg_setup(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    enum { NAME = 64 };
    union { char s[NAME]; float f[NAME / sizeof(float)]; } mine = {{0}}, theirs = {{0}};
    float ack_out = 0, ack_in = 0;
    int next = (e->rank + 1) % e->world, prev = (e->rank + e->world - 1) % e->world;
    size_t nf = NAME / sizeof(float);
    seg_create(ft, ft->len * (size_t)ft->nvec, mine.s, sizeof mine.s);
    dsc_comm_req *rq = NULL, *sq = NULL;
    dsc_status st = dsc_comm_recv(e->comm, theirs.f, nf, DSC_DT_F32, prev, &rq);
    if (st == DSC_OK) st = dsc_comm_send(e->comm, mine.f, nf, DSC_DT_F32, next, &sq);
    dsc_status w1 = rq ? dsc_comm_wait(rq) : DSC_OK, w2 = sq ? dsc_comm_wait(sq) : DSC_OK;
    if (st == DSC_OK) st = w1 != DSC_OK ? w1 : w2;
    theirs.s[NAME - 1] = 0;
    if (st == DSC_OK) ack_out = seg_map(ft, ft->len * (size_t)ft->nvec, theirs.s) ? 1.0f : 0.0f;
    rq = sq = NULL;
    if (st == DSC_OK) st = dsc_comm_recv(e->comm, &ack_in, 1, DSC_DT_F32, next, &rq);
    if (st == DSC_OK) st = dsc_comm_send(e->comm, &ack_out, 1, DSC_DT_F32, prev, &sq);
    w1 = rq ? dsc_comm_wait(rq) : DSC_OK, w2 = sq ? dsc_comm_wait(sq) : DSC_OK;
    if (st == DSC_OK) st = w1 != DSC_OK ? w1 : w2;
    if (mine.s[0]) shm_unlink(mine.s);
    ft->peer_maps = st == DSC_OK && ack_in == 1.0f && ft->seg;
    return st;
}

static void seg_free(struct dsc__ft *ft) {
    if (ft->seg) munmap(ft->seg, ft->seg_bytes);
    if (ft->peer) munmap(ft->peer, ft->peer_bytes);
    ft->seg = ft->peer = NULL;
    ft->seg_bytes = ft->peer_bytes = 0;
    ft->peer_maps = false;
}

void dsc__ft_rep_freeze(struct dsc__ft *ft) {
    size_t n = ft->len * (size_t)ft->nvec;
    for (int k = 0; k < 2; k++) {
        ft_slot *r = &ft->rep[k];
        if (!r->map || r->frozen) continue;
        int64_t t = atomic_load_explicit(r->shared, memory_order_acquire);
        r->tag = -1;
        if (t < 0 || !(r->frozen = malloc((n ? n : 1) * sizeof(float)))) continue;
        memcpy(r->frozen, r->map, n * sizeof(float));
        // A sender that was only thought dead may have started overwriting the slot meanwhile.
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(r->shared, memory_order_relaxed) == t) r->tag = t;
        r->buf = r->frozen;
    }
}

// After a recovery: the replica slots are the mapped ones again.
static void rep_thaw(struct dsc__ft *ft) {
    for (int k = 0; k < 2; k++) {
        ft_slot *r = &ft->rep[k];
        if (!r->frozen) continue;
        free(r->frozen);
        r->frozen = NULL;
        r->buf = r->map;
        r->tag = -1;
    }
}

// ---- slots ----

// Slots are blocks of the engine's pool (tags ft.snapshot, ft.replica): they move with the
// engine's buffers between steps and show in its accounting. On one node the own slots are the
// shared segment's and the replica slots are the buddy's, mapped (neither in the pool).
void dsc__ft_slots_free(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    ft->pending = NULL;
    for (int k = 0; k < 2; k++) {
        dsc__engine_free(e, &ft->own[k].h); // an external slot has none: it stays the caller's
        dsc__engine_free(e, &ft->rep[k].h);
        free(ft->rep[k].frozen);
        ft->own[k] = (ft_slot){.tag = -1};
        ft->rep[k] = (ft_slot){.tag = -1};
    }
    seg_free(ft);
}

void dsc__ft_resolve(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    for (int k = 0; k < 2; k++) {
        if (ft->own[k].h && !ft->own[k].external)
            ft->own[k].buf = dsc_mem_ptr(e->pool, ft->own[k].h);
        if (ft->rep[k].h) ft->rep[k].buf = dsc_mem_ptr(e->pool, ft->rep[k].h);
    }
}

dsc_status dsc__ft_slots_alloc(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    dsc__ft_slots_free(e);
    ft->len = e->stage == 0 ? e->total : e->part;
    ft->nvec = e->v ? 3 : 2;
    size_t n = ft->len * (size_t)ft->nvec;
    dsc_status st = DSC_OK;
    const char *send = dsc__env(DSC_ENV_FT_SEND_REPLICAS);
    if (ft->ring && e->world >= 2 && !strcmp(dsc_comm_backend(e->comm), "shm") &&
        !(send && !strcmp(send, "1")) && (st = seg_setup(e)) != DSC_OK) {
        // a peer failed while the ring agreed on its segments: a fault like any other
        dsc__error_prefix("fault tolerance: sharing the snapshot segments with the buddy "
                          "ranks: ");
        return st;
    }
    void *p; // written whole before a slot is read (packing or receiving sets its tag)
    size_t bytes = (n ? n : 1) * sizeof(float);
    for (int k = 0; k < 2 && st == DSC_OK; k++) {
        if (!ft->own[k].buf)
            st = dsc__engine_alloc_raw(e, bytes, "ft.snapshot", &ft->own[k].h, &p);
        if (st == DSC_OK && ft->ring && !ft->rep[k].map)
            st = dsc__engine_alloc_raw(e, bytes, "ft.replica", &ft->rep[k].h, &p);
    }
    if (st != DSC_OK)
        dsc__error_prefix("fault tolerance: the state snapshots need %.1f MiB (set "
                          "fault_tolerance.replicate to false to save half): ",
                          (double)n * 4 * (ft->ring ? 4 : 2) / (1 << 20));
    dsc__ft_resolve(e); // a compaction for a later slot moved the earlier ones
    return st;
}

ft_slot *dsc__ft_own_at(struct dsc__ft *ft, int64_t tag) {
    for (int k = 0; k < 2; k++)
        if (tag >= 0 && ft->own[k].tag == tag) return &ft->own[k];
    return NULL;
}

ft_slot *dsc__ft_rep_at(struct dsc__ft *ft, int64_t tag) {
    for (int k = 0; k < 2; k++)
        if (tag >= 0 && ft->rep[k].tag == tag) return &ft->rep[k];
    return NULL;
}

// The slot to overwrite with the state of boundary `tag`: the one holding it already, else the
// older one.
static ft_slot *slot_for(ft_slot s[2], int64_t tag) {
    if (s[0].tag == tag) return &s[0];
    if (s[1].tag == tag) return &s[1];
    return s[0].tag <= s[1].tag ? &s[0] : &s[1];
}

// ---- packing ----

// memcpy with non-temporal stores: a snapshot is not read again soon, so writing it around the
// cache spares the memory bus the read-for-ownership of every destination line (a third of the
// copy's traffic) and keeps the training data in cache.
static void stream_copy(float *dst, const float *src, size_t n) {
#if defined(__x86_64__)
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    size_t bytes = n * sizeof(float), head = (16 - ((uintptr_t)d & 15)) & 15;
    if (bytes >= 4096 && head % 4 == 0) {
        memcpy(d, s, head);
        size_t body = (bytes - head) & ~(size_t)63;
        for (size_t i = head; i < head + body; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
            _mm_stream_si128((__m128i *)(d + i), a);
            _mm_stream_si128((__m128i *)(d + i + 16), b);
            _mm_stream_si128((__m128i *)(d + i + 32), c);
            _mm_stream_si128((__m128i *)(d + i + 48), e);
        }
        memcpy(d + head + body, s + head + body, bytes - head - body);
        _mm_sfence(); // the streamed lines are visible before the slot's tag is set or it is sent
        return;
    }
#endif
    memcpy(dst, src, n * sizeof(float));
}

// Vector k of the live state: 0 the fp32 master, 1 and 2 the moments.
static float *vec_of(dsc_engine *e, int k) { return k == 0 ? e->master : k == 1 ? e->m : e->v; }

void dsc__ft_pack(dsc_engine *e, float *buf) {
    struct dsc__ft *ft = e->ft;
    size_t len = ft->len;
    for (int k = 0; k < ft->nvec; k++) {
        float *dst = buf + (size_t)k * len; // (len)
        if (k == 1) dsc__ft_point(e, "snapshot"); // half-way through the copy
        if (k > 0 || e->stage == 0) {
            stream_copy(dst, vec_of(e, k), len);
            continue;
        }
        for (int g = 0; g < e->ngroups; g++) { // fp32 stages 1-2 keep the master inside `work`
            const group *gr = &e->groups[g];
            stream_copy(dst + gr->part_off, dsc__zero_master_slice(e, g), gr->slice);
        }
    }
}

void dsc__ft_unpack(dsc_engine *e, const float *buf) {
    struct dsc__ft *ft = e->ft;
    size_t len = ft->len;
    for (int k = 0; k < ft->nvec; k++) {
        const float *src = buf + (size_t)k * len; // (len)
        if (k > 0 || e->stage == 0) {
            memcpy(vec_of(e, k), src, len * sizeof(float));
            continue;
        }
        for (int g = 0; g < e->ngroups; g++) {
            const group *gr = &e->groups[g];
            memcpy(dsc__zero_master_slice(e, g), src + gr->part_off, gr->slice * sizeof(float));
        }
    }
}

// ---- the ring ----

void dsc__ft_ring_drain(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (ft->send_req) dsc_comm_wait(ft->send_req);
    // A replica that arrived whole before a fault still counts: recovery can use it.
    if (ft->recv_req && dsc_comm_wait(ft->recv_req) == DSC_OK && ft->recv_slot)
        ft->recv_slot->tag = ft->recv_tag;
    ft->send_req = ft->recv_req = NULL;
    ft->recv_slot = NULL;
}

// Send own (boundary tag, whole) to rank + 1 and receive rank - 1's replica of the same boundary;
// the exchange runs on the communicator's progress thread until dsc__ft_commit_end. A mapped
// edge moves nothing: the snapshot's tag, published with it, is the replica's.
static dsc_status start_exchange(dsc_engine *e, ft_slot *own, int64_t tag) {
    struct dsc__ft *ft = e->ft;
    // A ring of one (the lone survivor of a shrink) has no neighbour: rank + 1 is the rank
    // itself, whose own snapshots already hold everything a replica would.
    if (!ft->ring || e->world < 2) return DSC_OK;
    rep_thaw(ft);
    int next = (e->rank + 1) % e->world, prev = (e->rank + e->world - 1) % e->world;
    size_t n = ft->len * (size_t)ft->nvec;
    dsc_status st = DSC_OK;
    if (!ft->peer) {
        ft_slot *rep = slot_for(ft->rep, tag);
        rep->tag = -1;
        ft->recv_slot = rep;
        ft->recv_tag = tag;
        st = dsc_comm_recv(e->comm, rep->buf, n, DSC_DT_F32, prev, &ft->recv_req);
    }
    if (st == DSC_OK && !ft->peer_maps)
        st = dsc_comm_send(e->comm, own->buf, n, DSC_DT_F32, next, &ft->send_req);
    if (st != DSC_OK) {
        dsc__ft_ring_drain(e); // the replica slot keeps tag -1
        return st;
    }
    dsc__ft_point(e, "ring");
    return DSC_OK;
}

dsc_status dsc__ft_commit_begin(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (!ft) return DSC_OK;
    dsc__ft_ring_drain(e); // normally nothing: the last exchange was waited
    double t0 = dsc_now();
    ft_slot *own = slot_for(ft->own, e->global_steps);
    if (own == ft->pending) ft->pending = NULL;
    dsc__ft_set_tag(own, -1);
    dsc__ft_pack(e, own->buf);
    dsc__state_scalars_get(e, &own->sc);
    dsc__ft_set_tag(own, e->global_steps);
    ft->pack_s += dsc_now() - t0;
    ft->commits++;
    return start_exchange(e, own, e->global_steps);
}

// ---- snapshots a device fills ----

float *dsc__ft_snapshot_reserve(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (!ft) return NULL;
    // The older slot: its exchange was waited for at this boundary's commit_end (the newer one's
    // may still be in flight).
    ft_slot *own = slot_for(ft->own, e->global_steps);
    dsc__ft_set_tag(own, -1);
    dsc__state_scalars_get(e, &own->sc);
    ft->pending = own;
    ft->pending_tag = e->global_steps;
    return own->buf;
}

dsc_status dsc__ft_snapshot_publish(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (!ft || !ft->pending) return DSC_OK;
    ft_slot *own = ft->pending;
    ft->pending = NULL;
    dsc__ft_ring_drain(e); // normally nothing: commit_end came first
    dsc__ft_set_tag(own, ft->pending_tag);
    ft->commits++;
    return start_exchange(e, own, own->tag);
}

void dsc__ft_snapshot_cancel(dsc_engine *e) {
    if (e->ft) e->ft->pending = NULL; // the reserved slot keeps tag -1
}

size_t dsc__ft_snapshot_floats(const dsc_engine *e) {
    return e->ft ? e->ft->len * (size_t)e->ft->nvec : 0;
}

void dsc__ft_own_drop(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (!ft) return;
    dsc__ft_ring_drain(e); // a send may be reading an own slot
    ft->pending = NULL;
    for (int k = 0; k < 2; k++)
        if (ft->own[k].external) ft->own[k] = (ft_slot){.tag = -1};
}

bool dsc__ft_own_shared(dsc_engine *e, float *bufs[2]) {
    struct dsc__ft *ft = e->ft;
    if (!ft || !ft->seg) return false;
    bufs[0] = ft->own[0].buf;
    bufs[1] = ft->own[1].buf;
    return true;
}

dsc_status dsc__ft_own_external(dsc_engine *e, float *const bufs[2]) {
    struct dsc__ft *ft = e->ft;
    if (!ft || ft->seg) return DSC_OK; // the shared segment's slots stay where they are
    dsc__ft_ring_drain(e); // a send may be reading an own slot
    ft->pending = NULL;
    size_t n = ft->len * (size_t)ft->nvec;
    for (int k = 0; k < 2; k++) {
        ft_slot *o = &ft->own[k];
        float *to = bufs ? bufs[k] : NULL;
        if (!to && !o->external) continue; // already in the pool
        dsc_mem_handle h = 0;
        void *p = NULL;
        if (!to) { // back into the pool
            DSC_TRY(dsc__engine_alloc_raw(e, (n ? n : 1) * sizeof(float), "ft.snapshot", &h, &p));
            dsc__ft_resolve(e); // the allocation may have moved the pool's other slots
            to = p;
        }
        if (o->tag >= 0 && o->buf)
            memcpy(to, o->buf, n * sizeof(float));
        else
            dsc__ft_set_tag(o, -1);
        dsc__engine_free(e, &o->h);
        o->h = h;
        o->buf = to;
        o->external = bufs != NULL;
    }
    dsc__ft_resolve(e);
    return DSC_OK;
}

dsc_status dsc__ft_commit_end(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (!ft || (!ft->recv_slot && !ft->send_req)) return DSC_OK;
    double t0 = dsc_now();
    dsc_status st = ft->send_req ? dsc_comm_wait(ft->send_req) : DSC_OK;
    dsc_status rst = ft->recv_req ? dsc_comm_wait(ft->recv_req) : DSC_OK;
    ft->wait_s += dsc_now() - t0;
    ft->send_req = ft->recv_req = NULL;
    if (rst == DSC_OK && ft->recv_slot) ft->recv_slot->tag = ft->recv_tag;
    ft->recv_slot = NULL;
    return st != DSC_OK ? st : rst;
}

dsc_status dsc__ft_state_changed(dsc_engine *e) {
    DSC_TRY(dsc__ft_commit_begin(e));
    return dsc__ft_commit_end(e);
}
