// comm/nccl.c - the nccl backend: GPU buffers, non-blocking NCCL communicators, host deadlines.
// Contract in dsc/comm.h; the polling rules and the test hook in comm/nccl.h.
//
// - Create (collective): the communicator's CUDA device is opts.device, or LOCAL_RANK modulo the
//   visible devices; the calling thread's current device is left as it was.
//   Rank 0 makes the ncclUniqueId and publishes it in the rendezvous store under
//   "dsc/comm/<tag>/nccl/<k>" (k counts the nccl communicators of that tag this rank created
//   before, the same on every rank since creation is collective, so a later communicator never
//   reads an older id; counted per rank so that ranks may also be threads of one process); the
//   others read it, reconnecting when they reached an older store that is going away.
//   ncclCommInitRankConfig runs non-blocking (config.blocking = 0) and is polled against the
//   deadline; rank 0 keeps the store until its init completes, which needs every rank's.
// - Every NCCL and CUDA call of a communicator happens under its lock, so that an abort from
//   another thread (dsc_comm_abort, a watchdog) never finds a thread inside NCCL: with a
//   non-blocking communicator no such call waits for peers. Waits for NCCL's background work
//   (ncclInProgress) release the lock between polls.
// - Operations run on the communicator's own stream in issue order. After each, a CUDA event is
//   recorded; the request is done when the event is reached. Sends and receives wait in a
//   pending list and are issued together in one ncclGroupStart/End when the next collective,
//   wait or test comes, so that a ring of send-then-receive cannot deadlock.
// - dsc__nccl_after_event (comm/nccl.h) makes the stream wait for an event of another stream and
//   records a start event (the gate) after the wait; the next operation carries it, and its
//   deadline does not count until the poll sees the gate reached.
// - A failed or late operation (comm/nccl.h) breaks the dsc communicator, aborts the NCCL one
//   (ncclCommAbort) and fails every request still pending or in flight with the first reason.
// - A process-wide list of the live contexts lets dsc__nccl_after_event find a communicator's.
// - Destroy: a healthy communicator is finalized (ncclCommFinalize, polled) and destroyed; a
//   broken one, or one whose finalize misses the deadline, is aborted.
// - dsc_comm_shrink: ncclCommShrink (NCCL >= 2.27.3) on the survivors, NCCL_SHRINK_ABORT when
//   the parent has work in flight or is broken; the parent's NCCL communicator must still exist.
#include "dsc_build_info.h" // (DSC_WITH_NCCL comes from CMake when NCCL is found)

#ifdef DSC_WITH_NCCL
#include <cuda_runtime_api.h> // cuda*
#include <nccl.h>             // nccl*
#include <pthread.h>          // pthread_mutex_*
#include <sched.h>            // sched_yield
#include <stdatomic.h>        // atomic_load
#include <stdio.h>            // snprintf
#include <stdlib.h>           // calloc, free, getenv
#include <string.h>           // strcmp, memcpy
#include <time.h>             // nanosleep

#include "base/env.h"     // dsc__env, DSC_ENV_*
#include "base/log.h"     // DSC_DEBUG, DSC_WARN
#include "base/status.h"  // dsc__fail, DSC_TRY
#include "base/time.h"    // dsc_now
#include "comm/backend.h" // dsc__comm_ops, dsc_comm_req
#include "comm/nccl.h"    // dsc__nccl_judge, dsc__nccl_fault_msg
#include "comm/store.h"   // dsc_store_*

#define EVENT_POOL 64 // completion events kept for reuse

// An operation in flight (r->impl).
typedef struct flight {
    cudaEvent_t done;  // recorded after the operation: reached when it finished
    cudaEvent_t start; // recorded before it, after a wait on another stream (the gate of
                       // dsc__nccl_after_event); NULL: no such wait, or the poll saw it passed
} flight;

typedef struct ncb {
    struct ncb *next;    // the list of live contexts (dsc__nccl_after_event)
    dsc_comm *comm;
    ncclComm_t nc;       // NULL once aborted or destroyed
    dsc__nccl_site at;   // rank, world, device
    double timeout;
    cudaStream_t stream; // every operation of the communicator, in issue order
    float *scratch;      // one device float: the barrier's all_reduce
    pthread_mutex_t mu;  // every NCCL and CUDA call of this communicator, and the lists below
    dsc_comm_req *pend_head, *pend_tail; // sends/receives not yet issued
    dsc_comm_req *fly_head, *fly_tail;   // issued, in issue order; r->impl is a flight
    bool settling;       // a thread waits out ncclInProgress with the lock released
    cudaEvent_t gate;    // recorded after the last dsc__nccl_after_event wait, for the next
                         // operation to carry (NULL: none waiting)
    cudaEvent_t pool[EVENT_POOL];
    int npool;
    long issued;         // operations issued (the inject hook counts them)
    long inject_op;      // DSC_NCCL_INJECT_DELAY: the operation that pauses (0: none)
} ncb;

static double inject_s; // DSC_NCCL_INJECT_DELAY's pause (one per process; read by the stream)

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static ncb *live_head; // every context between create (or shrink) and destroy

// ---- error translation ----

static dsc_status nccl_fail(ncclResult_t r, ncclComm_t nc, const char *what, const char *file,
                            int line) {
    const char *base = strrchr(file, '/');
    const char *last = ncclGetLastError(nc);
    return dsc__fail(DSC_ERR_NCCL, "nccl: %s failed (%s:%d): %s%s%s%s", what,
                     base ? base + 1 : file, line, ncclGetErrorString(r), last && *last ? " (" : "",
                     last ? last : "", last && *last ? ")" : "");
}

static dsc_status cuda_fail(cudaError_t e, const char *what, const char *file, int line) {
    const char *base = strrchr(file, '/');
    (void)cudaGetLastError();
    return dsc__fail(DSC_ERR_CUDA, "nccl: %s failed (%s:%d): %s; check that this rank's GPU "
                     "is visible (nvidia-smi, CUDA_VISIBLE_DEVICES)", what, base ? base + 1 : file,
                     line, cudaGetErrorString(e));
}

// The generator of the check macros: evaluate, translate a failure with file and line.
#define CHECK_AS(type, ok, fail, expr, ...)                                                       \
    do {                                                                                          \
        type r_ = (expr);                                                                         \
        if (r_ != (ok)) return fail(r_, __VA_ARGS__, __FILE__, __LINE__);                         \
    } while (0)
#define CUDA_TRY(expr) CHECK_AS(cudaError_t, cudaSuccess, cuda_fail, expr, #expr)
#define NCCL_TRY(nc, expr) CHECK_AS(ncclResult_t, ncclSuccess, nccl_fail, expr, nc, #expr)

// ---- small helpers ----

static void nap(int k) {
    if (k < 16) {
        sched_yield();
        return;
    }
    long ns = k < 64 ? 20000 : k < 256 ? 100000 : 1000000; // 20 us, then 0.1 ms, then 1 ms
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

// The communicator's device becomes the thread's current one for the duration of a call.
static int dev_enter(ncb *b) {
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (prev != b->at.device) (void)cudaSetDevice(b->at.device);
    return prev;
}

static void dev_leave(ncb *b, int prev) {
    if (prev >= 0 && prev != b->at.device) (void)cudaSetDevice(prev);
}

static ncclDataType_t nccl_type(dsc_dtype dt) {
    return dt == DSC_DT_F32 ? ncclFloat32 : dt == DSC_DT_F16 ? ncclFloat16 : ncclBfloat16;
}

static ncclRedOp_t nccl_op(dsc_red_op op) { return op == DSC_OP_MAX ? ncclMax : ncclSum; }

static bool is_p2p(const dsc_comm_req *r) {
    return r->op.kind == DSC__OP_SEND || r->op.kind == DSC__OP_RECV;
}

// The state of NCCL's background work on nc: ncclSuccess, ncclInProgress or an error.
static ncclResult_t async_state(ncclComm_t nc) {
    ncclResult_t st = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(nc, &st);
    return q != ncclSuccess ? q : st;
}

// Wait until nc leaves ncclInProgress or the deadline passes (then *res stays ncclInProgress).
// With release (nc is b's live communicator), the lock is dropped while napping, so that an
// abort can come in; if one did, *res is ncclInvalidUsage and b->nc is NULL.
static void settle(ncb *b, ncclComm_t nc, double deadline, bool release, ncclResult_t *res) {
    b->settling = release;
    for (int k = 0;; k++) {
        *res = async_state(nc);
        if (*res != ncclInProgress || dsc_now() >= deadline) break;
        if (release) pthread_mutex_unlock(&b->mu);
        nap(k);
        if (release) pthread_mutex_lock(&b->mu);
        if (release && b->nc != nc) {
            *res = ncclInvalidUsage;
            break;
        }
    }
    b->settling = false;
}

// NCCL takes no other call on a communicator whose state is ncclInProgress: wait until the
// thread settling it is done (lock held on entry and exit). False when it was aborted meanwhile.
static bool wait_idle(ncb *b) {
    for (int k = 0; b->settling; k++) {
        pthread_mutex_unlock(&b->mu);
        nap(k);
        pthread_mutex_lock(&b->mu);
    }
    return b->nc != NULL;
}

// ---- the request lists (lock held) ----

static void push(dsc_comm_req **head, dsc_comm_req **tail, dsc_comm_req *r) {
    r->next = NULL;
    if (*tail) (*tail)->next = r;
    else *head = r;
    *tail = r;
}

static dsc_comm_req *pop(dsc_comm_req **head, dsc_comm_req **tail) {
    dsc_comm_req *r = *head;
    if (!r) return NULL;
    *head = r->next;
    if (!*head) *tail = NULL;
    r->next = NULL;
    return r;
}

static cudaError_t event_take(ncb *b, cudaEvent_t *ev) {
    if (b->npool > 0) {
        *ev = b->pool[--b->npool];
        return cudaSuccess;
    }
    return cudaEventCreateWithFlags(ev, cudaEventDisableTiming);
}

static void event_give(ncb *b, cudaEvent_t ev) {
    if (!ev) return;
    if (b->npool < EVENT_POOL) b->pool[b->npool++] = ev;
    else (void)cudaEventDestroy(ev);
}

// r leaves the flight list: its events back to the pool (the stream may still reach them:
// harmless reuse).
static void flight_end(ncb *b, dsc_comm_req *r) {
    flight *f = r->impl;
    if (f) {
        event_give(b, f->done);
        event_give(b, f->start);
        free(f);
    }
    r->impl = NULL;
}

// 1 reached, 0 not yet, -1 the query failed (*err says why).
static int reached(cudaEvent_t ev, cudaError_t *err) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady)
        (void)cudaGetLastError(); // not an error: keep it out of the next launch check
    if (e != cudaErrorNotReady) *err = e;
    return e == cudaSuccess ? 1 : e == cudaErrorNotReady ? 0 : -1;
}

// Finish every pending and in-flight request with (st, msg).
static void fail_all(ncb *b, dsc_status st, const char *msg) {
    dsc_comm_req *r;
    while ((r = pop(&b->pend_head, &b->pend_tail))) dsc__req_finish(r, st, msg);
    while ((r = pop(&b->fly_head, &b->fly_tail))) {
        flight_end(b, r);
        dsc__req_finish(r, st, msg);
    }
}

static void kill_nccl(ncb *b) {
    if (!b->nc) return;
    ncclResult_t r = ncclCommAbort(b->nc);
    b->nc = NULL;
    if (r != ncclSuccess)
        DSC_WARN("comm", "rank %d: ncclCommAbort: %s", b->at.rank, ncclGetErrorString(r));
}

// This rank's operation failed or is late: break the dsc communicator (the first reason wins),
// abort the NCCL one, fail everything still queued with the first reason.
static void fault(ncb *b, dsc_status st, const char *msg) {
    dsc__comm_break(b->comm, st, msg);
    kill_nccl(b);
    dsc_status bst = st;
    const char *bmsg = msg;
    dsc__comm_broken(b->comm, &bst, &bmsg);
    fail_all(b, bst, bmsg);
}

static dsc_status broken_error(ncb *b, const char *what) {
    dsc_status st = DSC_ERR_INTERNAL;
    const char *msg = "the NCCL communicator was aborted";
    dsc__comm_broken(b->comm, &st, &msg);
    return dsc__fail(st, "rank %d: %s: the communicator is broken (%s); create a new one",
                     b->at.rank, what, msg);
}

// ---- issuing (lock held, device entered) ----

static ncclResult_t issue(ncb *b, const dsc__comm_op *op) {
    ncclComm_t nc = b->nc;
    cudaStream_t s = b->stream;
    ncclDataType_t t = nccl_type(op->dt);
    ncclRedOp_t red = nccl_op(op->red);
    switch (op->kind) {
    case DSC__OP_ALL_REDUCE: return ncclAllReduce(op->send, op->recv, op->count, t, red, nc, s);
    case DSC__OP_REDUCE_SCATTER:
        return ncclReduceScatter(op->send, op->recv, op->count, t, red, nc, s);
    case DSC__OP_ALL_GATHER: return ncclAllGather(op->send, op->recv, op->count, t, nc, s);
    case DSC__OP_BROADCAST:
        return ncclBroadcast(op->recv, op->recv, op->count, t, op->root, nc, s);
    case DSC__OP_REDUCE: // recv may be NULL off the root: NCCL reads it at the root only
        return ncclReduce(op->send, op->recv, op->count, t, red, op->root, nc, s);
    case DSC__OP_BARRIER:
        return ncclAllReduce(b->scratch, b->scratch, 1, ncclFloat32, ncclSum, nc, s);
    case DSC__OP_SEND: return ncclSend(op->send, op->count, t, op->root, nc, s);
    default: return ncclRecv(op->recv, op->count, t, op->root, nc, s);
    }
}

// The test hook's pause: the stream waits for this host function.
static void inject_sleep(void *user) {
    double s = *(const double *)user;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// The completion event after an operation (and before it the test hook's pause, if this is the
// operation it names).
static dsc_status mark_done(ncb *b, cudaEvent_t *out) {
    cudaEvent_t ev = NULL;
    CUDA_TRY(event_take(b, &ev));
    if (++b->issued == b->inject_op) {
        fprintf(stderr, "dsc: nccl fault injection: operation %ld of rank %d holds its stream "
                "%.1f s (DSC_NCCL_INJECT_DELAY)\n", b->issued, b->at.rank, inject_s);
        cudaError_t e = cudaLaunchHostFunc(b->stream, inject_sleep, &inject_s);
        if (e != cudaSuccess) {
            event_give(b, ev);
            return cuda_fail(e, "cudaLaunchHostFunc (DSC_NCCL_INJECT_DELAY)", __FILE__, __LINE__);
        }
    }
    cudaError_t e = cudaEventRecord(ev, b->stream);
    if (e != cudaSuccess) {
        event_give(b, ev);
        return cuda_fail(e, "cudaEventRecord after an NCCL operation", __FILE__, __LINE__);
    }
    *out = ev;
    return DSC_OK;
}

// After NCCL took the operation: its completion event, the start event of a wait before it (if
// one is open), and the request joins the flight list.
static dsc_status record(ncb *b, dsc_comm_req *r) {
    flight *f = calloc(1, sizeof *f);
    if (!f) return dsc__fail(DSC_ERR_OOM, "nccl: out of memory for an operation in flight");
    dsc_status st = mark_done(b, &f->done);
    if (st != DSC_OK) {
        free(f);
        return st;
    }
    f->start = b->gate; // the operation is behind that wait, and so is everything after it
    b->gate = NULL;
    r->impl = f;
    r->t_clock = dsc_now(); // the deadline counts from NCCL's taking it (see progress, probe)
    push(&b->fly_head, &b->fly_tail, r);
    return DSC_OK;
}

// An NCCL call's result, settled (non-blocking mode may answer ncclInProgress first). On failure
// the communicator breaks with a message naming `what` and DSC_ERR_NCCL / DSC_ERR_TIMEOUT.
static dsc_status settled(ncb *b, ncclResult_t res, double t0, const char *what) {
    if (res == ncclInProgress) settle(b, b->nc, t0 + b->timeout, true, &res);
    if (res == ncclSuccess) return DSC_OK;
    char msg[DSC__COMM_MSG_MAX];
    if (!b->nc) return broken_error(b, what); // aborted from another thread meanwhile
    if (res == ncclInProgress) {
        dsc__nccl_fault_msg(msg, sizeof msg, &b->at, what, DSC__NCCL_TIMEOUT, dsc_now() - t0,
                            b->timeout, NULL);
        fault(b, DSC_ERR_TIMEOUT, msg);
        return dsc__fail(DSC_ERR_TIMEOUT, "%s", msg);
    }
    char detail[320];
    snprintf(detail, sizeof detail, "%s: %s", ncclGetErrorString(res), ncclGetLastError(b->nc));
    dsc__nccl_fault_msg(msg, sizeof msg, &b->at, what, DSC__NCCL_NCCL_ERROR, dsc_now() - t0,
                        b->timeout, detail);
    fault(b, DSC_ERR_NCCL, msg);
    return dsc__fail(DSC_ERR_NCCL, "%s", msg);
}

// Finish the requests of a detached list with the communicator's first failure.
static void fail_list(ncb *b, dsc_comm_req *head) {
    dsc_status st = DSC_ERR_INTERNAL;
    const char *msg = "the NCCL communicator was aborted";
    dsc__comm_broken(b->comm, &st, &msg);
    dsc_comm_req *tail = NULL, *r;
    while ((r = pop(&head, &tail))) dsc__req_finish(r, st, msg);
}

// Issue every pending send/receive as one group. The list is detached first: settling the group
// may release the lock, and a send another thread submits meanwhile belongs to the next group.
static dsc_status flush(ncb *b) {
    if (!b->pend_head) return DSC_OK;
    if (!wait_idle(b)) return broken_error(b, "send/recv");
    dsc_comm_req *head = b->pend_head, *tail = b->pend_tail, *r;
    b->pend_head = b->pend_tail = NULL;
    char what[160];
    dsc__op_describe(&head->op, what, sizeof what);
    int n = 0;
    double t0 = dsc_now();
    ncclResult_t res = ncclGroupStart(), r2;
    for (r = head; r && res == ncclSuccess; r = r->next, n++)
        if ((r2 = issue(b, &r->op)) != ncclSuccess && r2 != ncclInProgress) res = r2;
    r2 = ncclGroupEnd();
    if (res == ncclSuccess) res = r2;
    if (n > 1) {
        size_t len = strlen(what);
        snprintf(what + len, sizeof what - len, " and %d more sends/receives", n - 1);
    }
    dsc_status st = settled(b, res, t0, what);
    if (st != DSC_OK) {
        fail_list(b, head);
        return st;
    }
    while ((r = pop(&head, &tail))) {
        st = record(b, r);
        if (st != DSC_OK) {
            char msg[DSC__COMM_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", dsc_last_error());
            dsc__req_finish(r, st, msg);
            fault(b, st, msg);
            fail_list(b, head);
            return st;
        }
    }
    return DSC_OK;
}

// A collective: issue it (after the pending sends/receives, to keep the issue order).
static dsc_status launch(ncb *b, dsc_comm_req *r) {
    DSC_TRY(flush(b));
    char what[128];
    dsc__op_describe(&r->op, what, sizeof what);
    if (!wait_idle(b)) return broken_error(b, what);
    DSC_TRY(settled(b, issue(b, &r->op), dsc_now(), what));
    dsc_status st = record(b, r);
    if (st != DSC_OK) { // NCCL has the operation but nothing would tell its end: give up
        char msg[DSC__COMM_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", dsc_last_error());
        fault(b, st, msg);
    }
    return st;
}

// ---- completion (lock held, device entered) ----

// The head of the flight list, judged (comm/nccl.h). An operation behind a wait on another stream
// is not timed until the poll sees that wait passed: its clock restarts at every poll until then.
static dsc__nccl_verdict probe(ncb *b, dsc_comm_req *r, char *detail, size_t cap) {
    flight *f = r->impl;
    cudaError_t e = cudaSuccess;
    dsc__nccl_probe p = {.timeout_s = b->timeout};
    if (f->start) {
        int passed = reached(f->start, &e);
        p.held = passed < 0 ? -1 : !passed;
        if (passed >= 0) r->t_clock = dsc_now();
        if (passed > 0) {
            event_give(b, f->start);
            f->start = NULL;
        }
    }
    if (p.held >= 0) p.event = reached(f->done, &e);
    p.elapsed_s = dsc_now() - r->t_clock;
    if (p.held < 0 || p.event < 0) {
        snprintf(detail, cap, "%s", cudaGetErrorString(e));
        (void)cudaGetLastError();
    }
    ncclResult_t as = async_state(b->nc);
    p.async = as == ncclSuccess ? 0 : as == ncclInProgress ? 1 : -1;
    if (p.async < 0 && p.event >= 0 && p.held >= 0)
        snprintf(detail, cap, "%s: %s", ncclGetErrorString(as), ncclGetLastError(b->nc));
    return dsc__nccl_judge(&p);
}

// Finish what completed, in issue order, up to the first request still running; a fault ends
// everything. True when r is done.
static bool progress(ncb *b, dsc_comm_req *r) {
    if (atomic_load(&r->done)) return true;
    if (b->nc && b->pend_head && flush(b) != DSC_OK) return atomic_load(&r->done) != 0;
    while (b->nc && b->fly_head) {
        dsc_comm_req *h = b->fly_head;
        char detail[320] = "", what[128], msg[DSC__COMM_MSG_MAX];
        dsc__nccl_verdict v = probe(b, h, detail, sizeof detail);
        if (v == DSC__NCCL_RUNNING) break;
        if (v == DSC__NCCL_DONE) {
            pop(&b->fly_head, &b->fly_tail);
            flight_end(b, h);
            dsc__req_finish(h, DSC_OK, NULL);
            // The next one waited behind h on the stream: its deadline counts from now.
            if (b->fly_head && b->fly_head->t_clock < dsc_now())
                b->fly_head->t_clock = dsc_now();
            if (h == r) return true; // r belongs to the caller from here
            continue;
        }
        dsc__op_describe(&h->op, what, sizeof what);
        dsc__nccl_fault_msg(msg, sizeof msg, &b->at, what, v, dsc_now() - h->t_clock,
                            b->timeout, detail);
        fault(b, v == DSC__NCCL_TIMEOUT ? DSC_ERR_TIMEOUT
                 : v == DSC__NCCL_CUDA_ERROR ? DSC_ERR_CUDA : DSC_ERR_NCCL, msg);
    }
    return atomic_load(&r->done) != 0;
}

static bool nccl_test(void *impl, dsc_comm_req *r) {
    ncb *b = impl;
    pthread_mutex_lock(&b->mu);
    int prev = dev_enter(b);
    bool done = progress(b, r);
    dev_leave(b, prev);
    pthread_mutex_unlock(&b->mu);
    return done;
}

static void nccl_wait(void *impl, dsc_comm_req *r) {
    for (int k = 0; !nccl_test(impl, r); k++) nap(k);
}

static dsc_status nccl_submit(void *impl, dsc_comm_req *r) {
    ncb *b = impl;
    char what[128];
    pthread_mutex_lock(&b->mu);
    int prev = dev_enter(b);
    dsc_status st = DSC_OK;
    if (!b->nc) {
        dsc__op_describe(&r->op, what, sizeof what);
        st = broken_error(b, what);
    } else if (is_p2p(r)) {
        push(&b->pend_head, &b->pend_tail, r); // issued with the next collective, wait or test
    } else {
        st = launch(b, r);
    }
    dev_leave(b, prev);
    pthread_mutex_unlock(&b->mu);
    return st;
}

static void nccl_abort(void *impl, dsc_status st, const char *msg) {
    ncb *b = impl;
    pthread_mutex_lock(&b->mu);
    int prev = dev_enter(b);
    kill_nccl(b);
    fail_all(b, st, msg);
    dev_leave(b, prev);
    pthread_mutex_unlock(&b->mu);
}

// ---- waiting for another stream ----

static void live_add(ncb *b) {
    pthread_mutex_lock(&live_mu);
    b->next = live_head;
    live_head = b;
    pthread_mutex_unlock(&live_mu);
}

static void live_remove(ncb *b) {
    pthread_mutex_lock(&live_mu);
    ncb **p = &live_head;
    while (*p && *p != b) p = &(*p)->next;
    if (*p) *p = b->next;
    pthread_mutex_unlock(&live_mu);
}

static ncb *live_find(const dsc_comm *c) {
    pthread_mutex_lock(&live_mu);
    ncb *b = live_head;
    while (b && b->comm != c) b = b->next;
    pthread_mutex_unlock(&live_mu);
    return b;
}

// The stream waits for ev, then the gate is recorded (lock held, device entered). Pending sends
// and receives go out first; an NCCL call settling on another thread finishes first, so that the
// wait lands between whole operations.
static dsc_status hold(ncb *b, cudaEvent_t ev) {
    const char *what = "waiting for another stream (dsc__nccl_after_event)";
    if (!b->nc) return broken_error(b, what);
    DSC_TRY(flush(b));
    if (!wait_idle(b)) return broken_error(b, what);
    if (!b->gate) CUDA_TRY(event_take(b, &b->gate));
    CUDA_TRY(cudaStreamWaitEvent(b->stream, ev, 0));
    CUDA_TRY(cudaEventRecord(b->gate, b->stream)); // a gate not yet carried moves to here
    return DSC_OK;
}

// ev is recorded after every operation issued so far, whole (as hold).
static dsc_status mark(ncb *b, cudaEvent_t ev) {
    const char *what = "recording an event after its operations (dsc__nccl_record_event)";
    if (!b->nc) return broken_error(b, what);
    DSC_TRY(flush(b));
    if (!wait_idle(b)) return broken_error(b, what);
    CUDA_TRY(cudaEventRecord(ev, b->stream));
    return DSC_OK;
}

// fn on c's context with its lock held and its device entered; `who` names the entry point.
static dsc_status on_stream(dsc_comm *c, void *cuda_event, const char *who,
                            dsc_status (*fn)(ncb *, cudaEvent_t)) {
    if (!c || !cuda_event)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: NULL %s", who, c ? "event" : "communicator");
    ncb *b = live_find(c);
    if (!b)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: the communicator's backend is %s; only nccl "
                         "communicators run on a CUDA stream", who, dsc_comm_backend(c));
    pthread_mutex_lock(&b->mu);
    int prev = dev_enter(b);
    dsc_status st = fn(b, (cudaEvent_t)cuda_event);
    dev_leave(b, prev);
    pthread_mutex_unlock(&b->mu);
    return st;
}

dsc_status dsc__nccl_after_event(dsc_comm *c, void *cuda_event) {
    return on_stream(c, cuda_event, "dsc__nccl_after_event", hold);
}

dsc_status dsc__nccl_record_event(dsc_comm *c, void *cuda_event) {
    return on_stream(c, cuda_event, "dsc__nccl_record_event", mark);
}

// ---- create / destroy ----

static dsc_status resolve(const dsc_comm_opts *o, int *rank, int *world, char *addr, size_t alen,
                          int *port) {
    dsc_comm_env_info env = {0};
    if (o->rank < 0 || o->world_size < 0 || !o->master_addr || o->master_port <= 0)
        DSC_TRY(dsc_comm_env(&env));
    *rank = o->rank >= 0 ? o->rank : env.rank;
    *world = o->world_size >= 0 ? o->world_size : env.world_size;
    snprintf(addr, alen, "%s", o->master_addr ? o->master_addr : env.master_addr);
    *port = o->master_port > 0 ? o->master_port : env.master_port;
    if (*world < 1 || *rank < 0 || *rank >= *world)
        return dsc__fail(DSC_ERR_INVALID_ARG, "nccl: rank %d of world %d is impossible", *rank,
                         *world);
    if (*port > 65535)
        return dsc__fail(DSC_ERR_INVALID_ARG, "nccl: master port %d is out of range", *port);
    return DSC_OK;
}

// The device of this rank: opts.device, or the local rank (the launcher's LOCAL_RANK, else the
// rank) modulo the visible devices.
static dsc_status pick_device(const dsc_comm_opts *o, int rank, int *dev) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        (void)cudaGetLastError();
        return dsc__fail(DSC_ERR_UNSUPPORTED, "nccl: no CUDA device is usable here (%s); the "
                         "nccl backend moves GPU buffers: run where every rank has a GPU (check "
                         "nvidia-smi and CUDA_VISIBLE_DEVICES), or use backend shm or mpi",
                         e != cudaSuccess ? cudaGetErrorString(e) : "the driver sees 0 devices");
    }
    if (o->device >= n)
        return dsc__fail(DSC_ERR_INVALID_ARG, "nccl: device %d asked for, %d visible (check "
                         "CUDA_VISIBLE_DEVICES)", o->device, n);
    if (o->device >= 0) {
        *dev = o->device;
        return DSC_OK;
    }
    dsc_comm_env_info env;
    DSC_TRY(dsc_comm_env(&env));
    int local = strcmp(env.source, "default") ? env.local_rank : rank;
    *dev = local % n;
    return DSC_OK;
}

// How many nccl communicators of this tag, rank and world this process created before (the
// same number on every rank of the group).
static long next_seq(const char *tag, int rank, int world) {
    enum { SEEN = 64 };
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static struct {
        char tag[64];
        int rank, world;
        long n;
    } seen[SEEN];
    static int nseen;
    pthread_mutex_lock(&mu);
    int k = 0;
    while (k < nseen && (seen[k].rank != rank || seen[k].world != world ||
                         strncmp(seen[k].tag, tag, sizeof seen[k].tag - 1)))
        k++;
    if (k == nseen && nseen < SEEN) {
        snprintf(seen[k].tag, sizeof seen[k].tag, "%s", tag);
        seen[k].rank = rank;
        seen[k].world = world;
        nseen++;
    }
    long n = k < SEEN ? seen[k].n++ : 0;
    pthread_mutex_unlock(&mu);
    return n;
}

// Rank 0's ncclUniqueId to every rank, through the store (given, or hosted by rank 0 on
// addr:port for the duration of create: *own).
static dsc_status exchange_id(ncb *b, const dsc_comm_opts *o, const char *addr, int port,
                              ncclUniqueId *id, dsc_store **own, char *key, size_t klen) {
    const char *tag = o->group_tag && *o->group_tag ? o->group_tag : "default";
    snprintf(key, klen, "dsc/comm/%s/nccl/%ld", tag, next_seq(tag, b->at.rank, b->at.world));
    if (b->at.rank == 0) NCCL_TRY(NULL, ncclGetUniqueId(id));
    if (b->at.world == 1) return DSC_OK;
    dsc_store *store = o->store;
    if (!store) {
        DSC_TRY(dsc_store_create(&store, addr, port, b->at.rank == 0, b->timeout));
        *own = store;
    }
    if (b->at.rank == 0) return dsc_store_set(store, key, id, sizeof *id);
    double deadline = dsc_now() + b->timeout;
    void *v = NULL;
    size_t len = 0;
    dsc_status st;
    for (int k = 0;; k++) { // an older store of rank 0 may still be closing: reconnect
        st = dsc_store_get(store, key, &v, &len);
        if (st != DSC_ERR_PEER || dsc_now() >= deadline) break;
        nap(k + 64);
    }
    DSC_TRY(st);
    bool ok = len == sizeof *id;
    if (ok) memcpy(id, v, sizeof *id);
    free(v);
    if (!ok) return dsc__fail(DSC_ERR_CORRUPT, "nccl: store key %s holds %zu bytes, not an "
                              "ncclUniqueId (%zu)", key, len, sizeof *id);
    return DSC_OK;
}

static ncclConfig_t nonblocking_config(const char *tag) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3)
    cfg.commName = tag;
#else
    (void)tag;
#endif
    return cfg;
}

// A new NCCL communicator's result, settled (the lock is not released: nobody else knows nc).
static dsc_status settle_new(ncb *b, ncclComm_t nc, ncclResult_t res, const char *call) {
    double t0 = dsc_now();
    if (res == ncclInProgress && nc) settle(b, nc, t0 + b->timeout, false, &res);
    if (res == ncclSuccess) return DSC_OK;
    if (res == ncclInProgress)
        return dsc__fail(DSC_ERR_TIMEOUT, "nccl: rank %d of %d (cuda:%d): %s was not done after "
                         "%.1f s (comm_timeout_s): a rank did not join; check that all %d ranks "
                         "started and see the same MASTER_ADDR:MASTER_PORT and group", b->at.rank,
                         b->at.world, b->at.device, call, b->timeout, b->at.world);
    const char *last = ncclGetLastError(nc);
    return dsc__fail(DSC_ERR_NCCL, "nccl: rank %d of %d (cuda:%d): %s failed: %s (%s)%s",
                     b->at.rank, b->at.world, b->at.device, call, ncclGetErrorString(res),
                     last ? last : "",
                     res == ncclInvalidUsage
                         ? "; NCCL refuses two ranks of one communicator on one GPU: give each "
                           "rank its own device (LOCAL_RANK % visible devices, "
                           "CUDA_VISIBLE_DEVICES)"
                         : "");
}

static dsc_status init_comm(ncb *b, const ncclUniqueId *id, const char *tag) {
    ncclConfig_t cfg = nonblocking_config(tag);
    ncclComm_t nc = NULL;
    ncclResult_t res = ncclCommInitRankConfig(&nc, b->at.world, *id, b->at.rank, &cfg);
    dsc_status st = settle_new(b, nc, res, "ncclCommInitRankConfig");
    if (st != DSC_OK) {
        if (nc) (void)ncclCommAbort(nc);
        return st;
    }
    b->nc = nc;
    return DSC_OK;
}

// What every communicator has besides the NCCL one: its stream and the barrier's float.
static dsc_status resources(ncb *b) {
    CUDA_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
    CUDA_TRY(cudaMalloc((void **)&b->scratch, sizeof(float)));
    CUDA_TRY(cudaMemsetAsync(b->scratch, 0, sizeof(float), b->stream));
    return DSC_OK;
}

static ncb *ncb_alloc(dsc_comm *c, int rank, int world, int device, double timeout) {
    ncb *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    b->comm = c;
    b->at = (dsc__nccl_site){rank, world, device};
    b->timeout = timeout;
    pthread_mutex_init(&b->mu, NULL);
    double pause = 0;
    if (!dsc__nccl_inject_parse(dsc__env(DSC_ENV_NCCL_INJECT_DELAY), &b->inject_op, &pause))
        DSC_WARN("comm", "DSC_NCCL_INJECT_DELAY=\"%s\" is not K:SECONDS; ignored",
                 dsc__env(DSC_ENV_NCCL_INJECT_DELAY));
    if (b->inject_op) inject_s = pause;
    return b;
}

// Everything but the NCCL communicator, which the caller has ended (or never had).
static void ncb_free(ncb *b) {
    if (!b) return;
    if (b->stream) { // a pause of the test hook may still hold it: wait, within the deadline
        double until = dsc_now() + b->timeout + (b->inject_op ? inject_s : 0);
        for (int k = 0; cudaStreamQuery(b->stream) == cudaErrorNotReady && dsc_now() < until; k++)
            nap(k + 64);
        (void)cudaGetLastError();
    }
    for (int k = 0; k < b->npool; k++) (void)cudaEventDestroy(b->pool[k]);
    if (b->gate) (void)cudaEventDestroy(b->gate);
    if (b->scratch) (void)cudaFree(b->scratch);
    if (b->stream) (void)cudaStreamDestroy(b->stream);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static dsc_status nccl_create(dsc_comm *c, const dsc_comm_opts *o, int *rank_out, int *size_out,
                              void **impl) {
    int rank = 0, world = 1, port = 0, dev = 0;
    char addr[256], key[256];
    DSC_TRY(resolve(o, &rank, &world, addr, sizeof addr, &port));
    DSC_TRY(pick_device(o, rank, &dev));
    ncb *b = ncb_alloc(c, rank, world, dev, o->timeout_s);
    if (!b) return dsc__fail(DSC_ERR_OOM, "nccl: out of memory");
    int prev = dev_enter(b); // NCCL takes the current device as the communicator's
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    dsc_store *own = NULL;
    dsc_status st = exchange_id(b, o, addr, port, &id, &own, key, sizeof key);
    if (st == DSC_OK) st = init_comm(b, &id, o->group_tag ? o->group_tag : "default");
    if (st == DSC_OK && rank == 0 && world > 1) { // every rank has read the id by now
        bool existed;
        dsc_store_delete(own ? own : o->store, key, &existed);
    }
    dsc_store_destroy(own);
    if (st == DSC_OK) st = resources(b);
    if (st != DSC_OK) {
        dsc__error_prefix("rank %d of %d: ", rank, world);
        if (b->nc) (void)ncclCommAbort(b->nc);
        ncb_free(b);
        if (prev >= 0 && prev != dev) (void)cudaSetDevice(prev);
        return st;
    }
    dev_leave(b, prev);
    live_add(b);
    DSC_DEBUG("comm", "nccl communicator: rank %d of %d on cuda:%d (NCCL %d)", rank, world, dev,
              NCCL_VERSION_CODE);
    *rank_out = rank;
    *size_out = world;
    *impl = b;
    return DSC_OK;
}

// Finalize (flush and quiesce with the peers) within the deadline, then destroy; else abort.
static void end_nccl(ncb *b) {
    if (!b->nc) return;
    if (dsc__comm_broken(b->comm, NULL, NULL)) {
        kill_nccl(b);
        return;
    }
    ncclResult_t res = ncclCommFinalize(b->nc);
    if (res == ncclInProgress) settle(b, b->nc, dsc_now() + b->timeout, false, &res);
    if (res != ncclSuccess) {
        DSC_WARN("comm", "rank %d: ncclCommFinalize: %s; aborting the communicator instead",
                 b->at.rank, res == ncclInProgress ? "not done within comm_timeout_s"
                                                   : ncclGetErrorString(res));
        kill_nccl(b);
        return;
    }
    (void)ncclCommDestroy(b->nc);
    b->nc = NULL;
}

static void nccl_destroy(void *impl) {
    ncb *b = impl;
    live_remove(b);
    pthread_mutex_lock(&b->mu);
    wait_idle(b);
    int prev = dev_enter(b), dev = b->at.device;
    fail_all(b, DSC_ERR_INVALID_ARG, "nccl: the communicator was destroyed first");
    end_nccl(b);
    pthread_mutex_unlock(&b->mu);
    ncb_free(b);
    if (prev >= 0 && prev != dev) (void)cudaSetDevice(prev);
}

// ---- shrink ----

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3)
static dsc_status nccl_shrink(void *impl, dsc_comm *nc_comm, const int *exclude, int n,
                              int *rank, int *size, void **impl_out) {
    ncb *b = impl;
    pthread_mutex_lock(&b->mu);
    wait_idle(b);
    int prev = dev_enter(b);
    dsc_status st = DSC_OK;
    ncb *nb = NULL;
    int *ex = calloc((size_t)(n > 0 ? n : 1), sizeof *ex);
    const char *why = NULL;
    if (!ex) st = dsc__fail(DSC_ERR_OOM, "dsc_comm_shrink: out of memory");
    else if (!b->nc && dsc__comm_broken(b->comm, NULL, &why))
        st = dsc__fail(DSC_ERR_UNSUPPORTED, "dsc_comm_shrink: rank %d's NCCL communicator was "
                       "already aborted (%s); build a new communicator over the survivors "
                       "(dsc_comm_create with another group_tag)", b->at.rank, why);
    if (st == DSC_OK) {
        if (n > 0) memcpy(ex, exclude, (size_t)n * sizeof *ex);
        bool busy = b->pend_head || b->fly_head || dsc__comm_broken(b->comm, NULL, NULL);
        int flags = busy ? NCCL_SHRINK_ABORT : NCCL_SHRINK_DEFAULT;
        nb = ncb_alloc(nc_comm, 0, 0, b->at.device, b->timeout);
        if (!nb) st = dsc__fail(DSC_ERR_OOM, "dsc_comm_shrink: out of memory");
        ncclConfig_t cfg = nonblocking_config("shrunk");
        ncclComm_t newc = NULL;
        if (st == DSC_OK) {
            ncclResult_t res = ncclCommShrink(b->nc, ex, n, &newc, &cfg, flags);
            st = settle_new(b, newc, res, "ncclCommShrink");
            if (st != DSC_OK && newc) (void)ncclCommAbort(newc);
        }
        if (busy && !newc) kill_nccl(b); // shrink never ran: end the parent's work ourselves
        if (busy) { // the parent's operations were ended: its requests fail, it stays broken
            char msg[DSC__COMM_MSG_MAX];
            dsc__comm_msg(msg, "rank %d: the operation was ended by dsc_comm_shrink", b->at.rank);
            dsc__comm_break(b->comm, DSC_ERR_PEER, msg);
            fail_all(b, DSC_ERR_PEER, msg);
        }
        if (st == DSC_OK) {
            nb->nc = newc;
            int r = -1, w = 0;
            (void)ncclCommUserRank(newc, &r);
            (void)ncclCommCount(newc, &w);
            nb->at.rank = r;
            nb->at.world = w;
            st = resources(nb);
        }
    }
    if (st == DSC_OK) {
        *rank = nb->at.rank;
        *size = nb->at.world;
        *impl_out = nb;
        live_add(nb);
    } else if (nb) {
        if (nb->nc) (void)ncclCommAbort(nb->nc);
        ncb_free(nb);
    }
    free(ex);
    dev_leave(b, prev);
    pthread_mutex_unlock(&b->mu);
    return st;
}
#endif

const dsc__comm_ops dsc__nccl_ops = {
    .name = "nccl",
    .create = nccl_create,
    .destroy = nccl_destroy,
    .submit = nccl_submit,
    .wait = nccl_wait,
    .test = nccl_test,
    .abort = nccl_abort,
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3)
    .shrink = nccl_shrink,
#endif
};

#else // a build without NCCL: the entry point exists and says why it cannot work

#include "base/status.h" // dsc__fail
#include "comm/nccl.h"   // dsc__nccl_after_event

static dsc_status no_nccl(const char *who) {
    return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: this dsc was built without NCCL, so it has no nccl "
                     "communicators; install NCCL (libnccl-dev) and rebuild", who);
}

dsc_status dsc__nccl_after_event(dsc_comm *c, void *cuda_event) {
    (void)c;
    (void)cuda_event;
    return no_nccl("dsc__nccl_after_event");
}

dsc_status dsc__nccl_record_event(dsc_comm *c, void *cuda_event) {
    (void)c;
    (void)cuda_event;
    return no_nccl("dsc__nccl_record_event");
}

#endif // DSC_WITH_NCCL
