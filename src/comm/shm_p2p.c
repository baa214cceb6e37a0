// comm/shm_p2p.c - the shm backend's send/recv: one byte ring per ordered pair of ranks in the
// segment. A message is a 16-byte header (magic, dtype, payload bytes) followed by the payload;
// the receiver checks the header against what it expects. Messages of one pair move in issue
// order; the first send and the first recv of every peer progress concurrently, on whichever
// thread runs the communicator's operations (including inside a collective's waits).
#include <stdlib.h> // calloc, free
#include <string.h> // memcpy

#include "base/time.h"     // dsc_now
#include "comm/shm_impl.h" // shm, shm__*

#define P2P_MAGIC 0x50327044u      // "Dp2P", first word of every message header
#define LIVENESS_PERIOD_S 0.020    // how often a stalled send/recv checks its peer

typedef struct p2p {
    dsc_comm_req *r;
    struct p2p *next;
    uint64_t stream, moved; // bytes of header + payload, bytes moved so far
    uint8_t hdr[16];        // u32 magic, u32 dtype, u64 payload bytes
    double last;            // dsc_now() of the last progress
} p2p;

static shm_chan *chan(shm *s, int src, int dst) {
    size_t idx = (size_t)src * (size_t)(s->world - 1) + (size_t)(dst < src ? dst : dst - 1);
    return (shm_chan *)(s->base + s->L.chans + idx * s->L.chan_stride);
}

void shm__p2p_start(shm *s, dsc_comm_req *r) {
    char what[128], msg[DSC__COMM_MSG_MAX];
    dsc__op_describe(&r->op, what, sizeof what);
    dsc_status st = shm__check_abort(s, what, msg);
    if (st != DSC_OK) dsc__comm_break(s->comm, st, msg);
    p2p *p = st == DSC_OK ? calloc(1, sizeof *p) : NULL;
    if (!p) {
        if (st == DSC_OK) dsc__comm_msg(msg, "rank %d: %s: out of memory", s->rank, what);
        shm__finish(s, r, st == DSC_OK ? DSC_ERR_OOM : st, msg);
        return;
    }
    uint64_t bytes = r->op.count * dsc_dtype_size(r->op.dt);
    uint32_t magic = P2P_MAGIC, dt = (uint32_t)r->op.dt;
    memcpy(p->hdr, &magic, 4);
    memcpy(p->hdr + 4, &dt, 4);
    memcpy(p->hdr + 8, &bytes, 8);
    p->r = r;
    p->stream = 16 + bytes;
    r->t_start = p->last = dsc_now();
    p2p **q = r->op.kind == DSC__OP_SEND ? &s->sendq[r->op.root] : &s->recvq[r->op.root];
    while (*q) q = &(*q)->next;
    *q = p;
    s->np2p++;
}

// The bytes of the message stream at position pos (header first, then payload).
static uint8_t *stream_at(p2p *p, uint64_t pos, size_t *len) {
    dsc__comm_op *op = &p->r->op;
    if (pos < 16) {
        *len = 16 - pos;
        return p->hdr + pos;
    }
    *len = p->stream - pos;
    uint8_t *payload = op->kind == DSC__OP_SEND ? (uint8_t *)op->send : (uint8_t *)op->recv;
    return payload + (pos - 16);
}

// A received header must announce exactly the message the receiver expects.
static dsc_status check_header(shm *s, p2p *p, char *msg) {
    uint32_t magic, dt;
    uint64_t bytes;
    uint8_t got[16];
    memcpy(got, p->hdr, 16);
    memcpy(&magic, got, 4);
    memcpy(&dt, got + 4, 4);
    memcpy(&bytes, got + 8, 8);
    uint64_t want = p->stream - 16;
    if (magic == P2P_MAGIC && bytes == want && dt == (uint32_t)p->r->op.dt) return DSC_OK;
    char what[128];
    dsc__op_describe(&p->r->op, what, sizeof what);
    dsc__comm_msg(msg,
             "rank %d: %s: rank %d sent %llu bytes of %s; sizes and dtypes must match", s->rank,
             what, p->r->op.root, (unsigned long long)bytes,
             magic == P2P_MAGIC ? dsc_dtype_name((dsc_dtype)dt) : "garbage");
    return DSC_ERR_INVALID_ARG;
}

// Move as much of p as the ring allows. True when bytes moved.
static bool p2p_step(shm *s, p2p *p, dsc_status *st, char *msg) {
    bool send = p->r->op.kind == DSC__OP_SEND;
    int peer = p->r->op.root;
    shm_chan *ch = send ? chan(s, s->rank, peer) : chan(s, peer, s->rank);
    uint8_t *ring = (uint8_t *)(ch + 1);
    size_t cap = s->chan_bytes;
    uint64_t head = atomic_load(&ch->head), tail = atomic_load(&ch->tail);
    uint64_t pos = send ? head : tail;
    uint64_t room = send ? cap - (head - tail) : head - tail;
    uint64_t moved0 = p->moved;
    while (room && p->moved < p->stream) {
        size_t len;
        uint8_t *mine = stream_at(p, p->moved, &len);
        size_t k = len < room ? len : (size_t)room;
        size_t at = (size_t)(pos % cap), first = k < cap - at ? k : cap - at;
        if (send) {
            memcpy(ring + at, mine, first);
            memcpy(ring, mine + first, k - first);
        } else {
            memcpy(mine, ring + at, first);
            memcpy(mine + first, ring, k - first);
        }
        pos += k;
        room -= k;
        p->moved += k;
        if (!send && p->moved == 16 && (*st = check_header(s, p, msg)) != DSC_OK) break;
    }
    if (p->moved == moved0) return false;
    atomic_store(send ? &ch->head : &ch->tail, pos);
    shm__ring(s, peer);
    p->last = dsc_now();
    return true;
}

// A stalled send/recv: broken communicator, dead or departed peer, or no progress for the
// deadline.
static dsc_status p2p_stalled(shm *s, p2p *p, double now, char *msg) {
    char what[128];
    dsc__op_describe(&p->r->op, what, sizeof what);
    dsc_status st = shm__check_abort(s, what, msg);
    if (st == DSC_OK) st = shm__check_peer(s, p->r->op.root, what, msg);
    if (st != DSC_OK || now - p->last < s->timeout) return st;
    dsc__comm_msg(msg,
             "rank %d: %s: no progress for %.1f s (comm_timeout_s %.1f): rank %d has not %s",
             s->rank, what, now - p->last, s->timeout, p->r->op.root,
             p->r->op.kind == DSC__OP_SEND ? "received it" : "sent it");
    return DSC_ERR_TIMEOUT;
}

static void p2p_done(shm *s, p2p **q, dsc_status st, const char *msg) {
    p2p *p = *q;
    *q = p->next;
    s->np2p--;
    shm__finish(s, p->r, st, msg);
    free(p);
}

void shm__p2p_fail_all(shm *s, dsc_status st, const char *why) {
    char msg[DSC__COMM_MSG_MAX], what[128];
    for (int j = 0; j < s->world && s->np2p; j++) {
        for (p2p **q = &s->sendq[j]; *q;) {
            dsc__op_describe(&(*q)->r->op, what, sizeof what);
            dsc__comm_msg(msg, "rank %d: %s: %s", s->rank, what, why);
            p2p_done(s, q, st, msg);
        }
        for (p2p **q = &s->recvq[j]; *q;) {
            dsc__op_describe(&(*q)->r->op, what, sizeof what);
            dsc__comm_msg(msg, "rank %d: %s: %s", s->rank, what, why);
            p2p_done(s, q, st, msg);
        }
    }
}

// Advance the first send and the first recv of every peer (messages of one pair stay in order).
bool shm__p2p_progress(shm *s) {
    if (!s->np2p) return false;
    bool moved = false, check = false;
    double now = dsc_now();
    if (now >= s->next_p2p_check) {
        s->next_p2p_check = now + LIVENESS_PERIOD_S;
        check = true;
    }
    char msg[DSC__COMM_MSG_MAX];
    for (int j = 0; j < s->world; j++) {
        p2p **qs[2] = {&s->sendq[j], &s->recvq[j]};
        for (int d = 0; d < 2; d++) {
            p2p **q = qs[d];
            while (*q) {
                dsc_status st = DSC_OK;
                bool m = p2p_step(s, *q, &st, msg);
                moved |= m;
                if (st == DSC_OK && (*q)->moved == (*q)->stream) {
                    p2p_done(s, q, DSC_OK, NULL);
                    continue; // the next message of this pair may start at once
                }
                if (st == DSC_OK && !m && check) st = p2p_stalled(s, *q, now, msg);
                if (st != DSC_OK) {
                    shm__fail_comm(s, st, msg);
                    p2p_done(s, q, st, msg);
                    shm__p2p_fail_all(s, st, "another send/recv of this rank failed first");
                    return true;
                }
                break;
            }
        }
    }
    return moved;
}

