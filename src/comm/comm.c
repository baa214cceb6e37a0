// comm/comm.c - the dsc_comm_* wrappers: argument checks, the backend registry, request
// lifecycle, broken state and statistics. Backends never see an invalid request.
#include <pthread.h>   // pthread_mutex_*
#include <stdarg.h>    // va_list
#include <stdatomic.h> // atomic_load_explicit
#include <stdint.h>    // SIZE_MAX
#include <stdio.h>     // snprintf, vsnprintf
#include <stdlib.h>    // calloc, free
#include <string.h>    // strcmp

#include "base/log.h"     // DSC_DEBUG, DSC_WARN
#include "base/status.h"  // dsc__fail
#include "base/time.h"    // dsc_now
#include "comm/backend.h" // dsc__comm_ops, dsc_comm_req
#include "comm/shm.h"     // dsc__shm_ops
#include "dsc/comm.h"     // dsc_comm_*

struct dsc_comm {
    const dsc__comm_ops *ops;
    void *impl;
    int rank, size;
    double timeout_s;
    pthread_mutex_t mu; // guards stats, the broken reason and the live list
    dsc_comm_stats stats;
    dsc_comm_req *live; // requests handed out and not yet released (freed by destroy)
    _Atomic int broken;
    dsc_status broken_st;
    char broken_msg[DSC__COMM_MSG_MAX];
};

// ---- registry ----

static const dsc__comm_ops *const backends[] = {
    &dsc__shm_ops,
#if DSC_FEATURE_MPI
    &dsc__mpi_ops,
#endif
#ifdef DSC_WITH_NCCL
    &dsc__nccl_ops,
#endif
};
#define NBACKENDS (sizeof backends / sizeof backends[0])

static const dsc__comm_ops *find_backend(const char *name) {
    for (size_t i = 0; i < NBACKENDS; i++)
        if (!strcmp(backends[i]->name, name)) return backends[i];
    return NULL;
}

static dsc_status unknown_backend(const char *name) {
    char avail[128] = "";
    size_t n = 0;
    for (size_t i = 0; i < NBACKENDS; i++)
        n += (size_t)snprintf(avail + n, sizeof avail - n, "%s%s", i ? ", " : "",
                              backends[i]->name);
    if (!strcmp(name, "mpi"))
        return dsc__fail(DSC_ERR_UNSUPPORTED,
                         "comm backend 'mpi': this dsc was built without MPI (available: %s); "
                         "install Open MPI (libopenmpi-dev) and rebuild",
                         avail);
    if (!strcmp(name, "nccl"))
        return dsc__fail(DSC_ERR_UNSUPPORTED,
                         "comm backend 'nccl': this dsc was built without NCCL (available: %s); "
                         "build where nvcc, nccl.h and libnccl are found (CUDA toolkit with "
                         "NCCL, or libnccl-dev), or use shm or mpi with host buffers",
                         avail);
    return dsc__fail(DSC_ERR_UNSUPPORTED, "comm backend '%s' is unknown (available: %s)", name,
                     avail);
}

bool dsc_comm_backend_available(const char *name) { return name && find_backend(name); }

// ---- helpers shared with the backends ----

const char *dsc__op_name(dsc__op_kind k) {
    static const char *names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                  "reduce",     "barrier",        "send",       "recv"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

size_t dsc_dtype_size(dsc_dtype dt) { return dt == DSC_DT_F32 ? 4 : 2; }

const char *dsc_dtype_name(dsc_dtype dt) {
    return dt == DSC_DT_F32 ? "f32" : dt == DSC_DT_F16 ? "f16" : dt == DSC_DT_BF16 ? "bf16" : "?";
}

void dsc__comm_msg(char *msg, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, DSC__COMM_MSG_MAX, fmt, ap);
    va_end(ap);
}

void dsc__op_describe(const dsc__comm_op *op, char *buf, size_t len) {
    if (op->kind == DSC__OP_BARRIER) snprintf(buf, len, "barrier");
    else if (op->kind == DSC__OP_SEND || op->kind == DSC__OP_RECV)
        snprintf(buf, len, "%s of %zu %s %s rank %d", dsc__op_name(op->kind), op->count,
                 dsc_dtype_name(op->dt), op->kind == DSC__OP_SEND ? "to" : "from", op->root);
    else
        snprintf(buf, len, "%s of %zu %s", dsc__op_name(op->kind), op->count,
                 dsc_dtype_name(op->dt));
}

size_t dsc__op_bytes(const dsc__comm_op *op, int world) {
    size_t b = op->count * dsc_dtype_size(op->dt);
    if (op->kind == DSC__OP_REDUCE_SCATTER || op->kind == DSC__OP_ALL_GATHER) b *= (size_t)world;
    return op->kind == DSC__OP_BARRIER ? 0 : b;
}

void dsc__req_finish(dsc_comm_req *r, dsc_status st, const char *msg) {
    r->st = st;
    snprintf(r->msg, sizeof r->msg, "%s", msg ? msg : "");
    r->t_end = dsc_now();
    atomic_store(&r->done, 1); // seq_cst: waiters pair it with their futex check
}

void dsc__comm_break(dsc_comm *c, dsc_status st, const char *msg) {
    pthread_mutex_lock(&c->mu);
    if (!atomic_load(&c->broken)) {
        c->broken_st = st;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", msg);
        atomic_store(&c->broken, 1);
    }
    pthread_mutex_unlock(&c->mu);
}

bool dsc__comm_broken(dsc_comm *c, dsc_status *st, const char **msg) {
    if (!atomic_load(&c->broken)) return false;
    if (st) *st = c->broken_st; // written before the flag, never after
    if (msg) *msg = c->broken_msg;
    return true;
}

double dsc__comm_timeout(const dsc_comm *c) { return c->timeout_s; }

// ---- create / destroy ----

dsc_comm_opts dsc_comm_opts_default(void) {
    dsc_comm_opts o = {.backend = "shm", .rank = -1, .world_size = -1, .timeout_s = 30,
                       .device = -1};
    return o;
}

dsc_status dsc_comm_create(dsc_comm **out, const dsc_comm_opts *o) {
    if (!out || !o) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_create: NULL argument");
    *out = NULL;
    const char *name = o->backend ? o->backend : "shm";
    const dsc__comm_ops *ops = find_backend(name);
    if (!ops) return unknown_backend(name);
    dsc_comm *c = calloc(1, sizeof *c);
    if (!c) return dsc__fail(DSC_ERR_OOM, "dsc_comm_create: out of memory");
    c->ops = ops;
    c->timeout_s = o->timeout_s > 0 ? o->timeout_s : 30;
    pthread_mutex_init(&c->mu, NULL);
    dsc_comm_opts o2 = *o;
    o2.timeout_s = c->timeout_s;
    dsc_status st = ops->create(c, &o2, &c->rank, &c->size, &c->impl);
    if (st != DSC_OK) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return st;
    }
    DSC_DEBUG("comm", "%s communicator ready: rank %d of %d", name, c->rank, c->size);
    *out = c;
    return DSC_OK;
}

void dsc_comm_destroy(dsc_comm *c) {
    if (!c) return;
    c->ops->destroy(c->impl); // fails and finishes every request still in flight
    size_t abandoned = 0;
    while (c->live) {
        dsc_comm_req *r = c->live;
        c->live = r->live_next;
        free(r);
        abandoned++;
    }
    if (abandoned)
        DSC_WARN("comm", "%zu requests were never waited; freed by dsc_comm_destroy", abandoned);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int dsc_comm_rank(const dsc_comm *c) { return c ? c->rank : -1; }
int dsc_comm_size(const dsc_comm *c) { return c ? c->size : 0; }
const char *dsc_comm_backend(const dsc_comm *c) { return c ? c->ops->name : ""; }

void dsc_comm_get_stats(const dsc_comm *c, dsc_comm_stats *s) {
    dsc_comm *m = (dsc_comm *)c; // the mutex is not part of the logical state
    pthread_mutex_lock(&m->mu);
    *s = c->stats;
    pthread_mutex_unlock(&m->mu);
}

// ---- fault tolerance ----

void dsc_comm_abort(dsc_comm *c, dsc_status st, const char *reason) {
    if (!c) return;
    char msg[DSC__COMM_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", reason && *reason ? reason : "aborted");
    bool was = atomic_load(&c->broken);
    dsc__comm_break(c, st == DSC_OK ? DSC_ERR_INTERNAL : st, msg);
    if (!was) DSC_DEBUG("comm", "rank %d: communicator aborted: %s", c->rank, msg);
    if (c->ops->abort) c->ops->abort(c->impl, c->broken_st, c->broken_msg);
}

bool dsc_comm_is_broken(dsc_comm *c, dsc_status *st, const char **msg) {
    return c && dsc__comm_broken(c, st, msg);
}

dsc_status dsc_comm_peer_info(dsc_comm *c, int rank, dsc_comm_peer *out) {
    if (!c || !out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_peer_info: NULL argument");
    if (rank < 0 || rank >= c->size)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_peer_info: rank %d is outside 0..%d",
                         rank, c->size - 1);
    *out = (dsc_comm_peer){.state = DSC_PEER_UNKNOWN, .heartbeat_age_s = -1};
    if (rank == c->rank) *out = (dsc_comm_peer){.state = DSC_PEER_ALIVE};
    if (c->ops->peer) c->ops->peer(c->impl, rank, out);
    return DSC_OK;
}

dsc_status dsc_comm_note_cas(dsc_comm *c, uint64_t *expected, uint64_t desired, bool *swapped) {
    if (!c || !expected || !swapped)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_note_cas: NULL argument");
    if (!c->ops->note_cas)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "comm backend '%s' has no shared note",
                         c->ops->name);
    *swapped = c->ops->note_cas(c->impl, expected, desired);
    return DSC_OK;
}

static dsc_status check_exclusion(const dsc_comm *c, const int *exclude, int n) {
    if (n < 0 || (n > 0 && !exclude) || n >= c->size)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_shrink: %d excluded ranks of %d (need "
                         "0 <= n < world size and a list)", n, c->size);
    for (int k = 0; k < n; k++) {
        if (exclude[k] < 0 || exclude[k] >= c->size)
            return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_shrink: excluded rank %d is outside "
                             "0..%d", exclude[k], c->size - 1);
        if (exclude[k] == c->rank)
            return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_shrink: rank %d excludes itself; "
                             "only the ranks that stay call it", c->rank);
        for (int j = 0; j < k; j++)
            if (exclude[j] == exclude[k])
                return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_shrink: rank %d is listed "
                                 "twice", exclude[k]);
    }
    return DSC_OK;
}

dsc_status dsc_comm_shrink(dsc_comm *c, const int *exclude, int n, dsc_comm **out) {
    if (!c || !out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_shrink: NULL argument");
    *out = NULL;
    DSC_TRY(check_exclusion(c, exclude, n));
    if (!c->ops->shrink)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "dsc_comm_shrink: comm backend '%s' cannot shrink "
                         "a communicator in place; create a new one over the survivors "
                         "(dsc_comm_create with another group_tag)", c->ops->name);
    dsc_comm *nc = calloc(1, sizeof *nc);
    if (!nc) return dsc__fail(DSC_ERR_OOM, "dsc_comm_shrink: out of memory");
    nc->ops = c->ops;
    nc->timeout_s = c->timeout_s;
    pthread_mutex_init(&nc->mu, NULL);
    dsc_status st = c->ops->shrink(c->impl, nc, exclude, n, &nc->rank, &nc->size, &nc->impl);
    if (st != DSC_OK) {
        pthread_mutex_destroy(&nc->mu);
        free(nc);
        return st;
    }
    DSC_DEBUG("comm", "%s communicator shrunk: rank %d of %d -> rank %d of %d", c->ops->name,
              c->rank, c->size, nc->rank, nc->size);
    *out = nc;
    return DSC_OK;
}

// ---- requests ----

static void live_link(dsc_comm *c, dsc_comm_req *r) {
    pthread_mutex_lock(&c->mu);
    r->live_next = c->live;
    if (c->live) c->live->live_prev = r;
    c->live = r;
    pthread_mutex_unlock(&c->mu);
}

// Account for a finished request, report its status on this thread, free it.
static dsc_status req_release(dsc_comm_req *r) {
    dsc_comm *c = r->comm;
    dsc_status st = r->st;
    pthread_mutex_lock(&c->mu);
    if (r->live_prev) r->live_prev->live_next = r->live_next;
    else c->live = r->live_next;
    if (r->live_next) r->live_next->live_prev = r->live_prev;
    if (st == DSC_OK) {
        c->stats.ops++;
        c->stats.bytes += dsc__op_bytes(&r->op, c->size);
        c->stats.seconds += r->t_end - r->t_start;
    }
    pthread_mutex_unlock(&c->mu);
    if (st == DSC_OK) dsc__comm_log_record(&r->op, c->size, r->t_end - r->t_start);
    if (st != DSC_OK) dsc__fail(st, "%s", r->msg);
    free(r);
    return st;
}

dsc_status dsc_comm_wait(dsc_comm_req *req) {
    if (!req) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_wait: NULL request");
    if (!atomic_load_explicit(&req->done, memory_order_acquire))
        req->comm->ops->wait(req->comm->impl, req);
    return req_release(req);
}

dsc_status dsc_comm_test(dsc_comm_req *req, bool *done) {
    if (!req || !done) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_test: NULL argument");
    *done = atomic_load_explicit(&req->done, memory_order_acquire) ||
            req->comm->ops->test(req->comm->impl, req);
    return *done ? req_release(req) : DSC_OK;
}

static bool valid_kind_args(const dsc_comm *c, const dsc__comm_op *op) {
    if (op->count == 0) return true;
    switch (op->kind) {
    case DSC__OP_ALL_REDUCE:
    case DSC__OP_REDUCE_SCATTER:
    case DSC__OP_ALL_GATHER: return op->send && op->recv;
    case DSC__OP_BROADCAST:
    case DSC__OP_RECV: return op->recv != NULL;
    case DSC__OP_SEND: return op->send != NULL;
    case DSC__OP_REDUCE: return op->send && (op->recv || c->rank != op->root);
    default: return true;
    }
}

static dsc_status check_op(const dsc_comm *c, const dsc__comm_op *op) {
    const char *name = dsc__op_name(op->kind);
    if ((unsigned)op->dt > DSC_DT_BF16)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: unknown dtype %d", name, (int)op->dt);
    if ((unsigned)op->red > DSC_OP_MAX)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: unknown reduction op %d", name, (int)op->red);
    if (!valid_kind_args(c, op))
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s of %zu elements: NULL buffer", name, op->count);
    if (op->count > SIZE_MAX / 4 / (size_t)c->size)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: count %zu is too large", name, op->count);
    bool rooted = op->kind == DSC__OP_BROADCAST || op->kind == DSC__OP_REDUCE;
    bool p2p = op->kind == DSC__OP_SEND || op->kind == DSC__OP_RECV;
    if ((rooted || p2p) && (op->root < 0 || op->root >= c->size))
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: %s %d is outside 0..%d", name,
                         rooted ? "root" : "peer", op->root, c->size - 1);
    if (p2p && op->root == c->rank)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: rank %d cannot message itself", name, c->rank);
    return DSC_OK;
}

// Validate, hand to the backend, and either return the request or wait for it.
static dsc_status submit(dsc_comm *c, const dsc__comm_op *op, dsc_comm_req **out) {
    if (out) *out = NULL;
    if (!c) return dsc__fail(DSC_ERR_INVALID_ARG, "%s: NULL communicator", dsc__op_name(op->kind));
    DSC_TRY(check_op(c, op));
    dsc_status bst;
    const char *bmsg;
    if (dsc__comm_broken(c, &bst, &bmsg))
        return dsc__fail(bst, "%s: the communicator is broken (%s); create a new one",
                         dsc__op_name(op->kind), bmsg);
    dsc_comm_req *r = calloc(1, sizeof *r);
    if (!r) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", dsc__op_name(op->kind));
    r->comm = c;
    r->op = *op;
    r->t_start = dsc_now();
    r->blocking = out == NULL;
    live_link(c, r);
    bool empty = op->count == 0 && op->kind != DSC__OP_BARRIER; // same on every rank: skip
    if (empty || (c->size == 1 && op->kind == DSC__OP_BARRIER)) {
        dsc__req_finish(r, DSC_OK, NULL);
    } else {
        dsc_status st = c->ops->submit(c->impl, r);
        if (st != DSC_OK) {
            dsc__req_finish(r, st, dsc_last_error());
            return req_release(r);
        }
    }
    if (out) {
        *out = r;
        return DSC_OK;
    }
    return dsc_comm_wait(r);
}

// ---- public operations ----

dsc_status dsc_comm_all_reduce(dsc_comm *c, const void *send, void *recv, size_t count,
                               dsc_dtype dt, dsc_red_op op, dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_ALL_REDUCE, send, recv, count, dt, op, 0};
    return submit(c, &o, req);
}

dsc_status dsc_comm_reduce_scatter(dsc_comm *c, const void *send, void *recv, size_t count,
                                   dsc_dtype dt, dsc_red_op op, dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_REDUCE_SCATTER, send, recv, count, dt, op, 0};
    return submit(c, &o, req);
}

dsc_status dsc_comm_all_gather(dsc_comm *c, const void *send, void *recv, size_t count,
                               dsc_dtype dt, dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_ALL_GATHER, send, recv, count, dt, DSC_OP_SUM, 0};
    return submit(c, &o, req);
}

dsc_status dsc_comm_broadcast(dsc_comm *c, void *buf, size_t count, dsc_dtype dt, int root,
                              dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_BROADCAST, buf, buf, count, dt, DSC_OP_SUM, root};
    return submit(c, &o, req);
}

dsc_status dsc_comm_reduce(dsc_comm *c, const void *send, void *recv, size_t count, dsc_dtype dt,
                           dsc_red_op op, int root, dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_REDUCE, send, recv, count, dt, op, root};
    return submit(c, &o, req);
}

dsc_status dsc_comm_barrier(dsc_comm *c, dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_BARRIER, NULL, NULL, 0, DSC_DT_F32, DSC_OP_SUM, 0};
    return submit(c, &o, req);
}

dsc_status dsc_comm_send(dsc_comm *c, const void *buf, size_t count, dsc_dtype dt, int peer,
                         dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_SEND, buf, NULL, count, dt, DSC_OP_SUM, peer};
    return submit(c, &o, req);
}

dsc_status dsc_comm_recv(dsc_comm *c, void *buf, size_t count, dsc_dtype dt, int peer,
                         dsc_comm_req **req) {
    dsc__comm_op o = {DSC__OP_RECV, NULL, buf, count, dt, DSC_OP_SUM, peer};
    return submit(c, &o, req);
}
