// comm/mpi.c - Open MPI backend: nonblocking MPI collectives polled against the deadline.
//
// - MPI is initialised here (MPI_THREAD_SERIALIZED) unless the program did it, and finalised at
//   exit in that case. Every dsc call into MPI holds the backend's lock, so the serialized level
//   suffices even when several threads use one communicator.
// - Each communicator duplicates MPI_COMM_WORLD and sets MPI_ERRORS_RETURN on it: an MPI failure
//   becomes DSC_ERR_MPI with MPI's own message instead of killing the process.
// - fp16/bf16 reductions: MPI has no such types, so the inputs are converted to fp32 in a staging
//   buffer, reduced in fp32 and rounded back once (round to nearest even). Copies (all_gather,
//   broadcast, send/recv) move the 16-bit values untouched.
// - Not deterministic in the shm sense: MPI picks its own summation order (algorithm, message
//   size, placement), so results may differ from shm's rank-order sum in the last bits.
// - Deadlines: MPI collectives cannot be cancelled. A request still pending after timeout_s
//   (counted from its start) fails with DSC_ERR_TIMEOUT and the communicator is broken for good:
//   its staging buffers are kept (MPI may still write them) and MPI is not finalised. Open MPI 4
//   has no ULFM, so the recovery is a restart of the job.
#include "dsc_build_info.h" // DSC_FEATURE_MPI

#if DSC_FEATURE_MPI
#include <mpi.h>       // MPI_*
#include <pthread.h>   // pthread_mutex_*
#include <stdatomic.h> // atomic_load
#include <stdio.h>     // snprintf
#include <stdlib.h>    // calloc, free, atexit
#include <string.h>    // memcpy
#include <time.h>      // nanosleep

#include "base/log.h"     // DSC_WARN
#include "base/status.h"  // dsc__fail
#include "base/time.h"    // dsc_now
#include "comm/backend.h" // dsc__comm_ops, dsc_comm_req
#include "comm/reduce.h"  // dsc__to_f32, dsc__from_f32

typedef struct mpib {
    dsc_comm *comm;
    MPI_Comm mc;
    int rank, world;
    double timeout;
    pthread_mutex_t mu; // one thread in MPI at a time (MPI_THREAD_SERIALIZED)
    dsc_comm_req *inflight; // linked through r->next
} mpib;

typedef struct mreq {
    MPI_Request mr;
    float *stage_in, *stage_out; // fp32 staging of 16-bit reductions, else NULL
    void *copy_in;               // private copy of send when it overlaps recv, else NULL
} mreq;

static _Atomic int mpi_we_initialized, mpi_any_broken;

static void finalize_at_exit(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin && !atomic_load(&mpi_any_broken)) MPI_Finalize();
}

static dsc_status mpi_fail(int err, const char *what) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(err, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", err);
    return dsc__fail(DSC_ERR_MPI, "mpi: %s failed: %s", what, s);
}

static dsc_status ensure_init(void) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (inited) {
        MPI_Query_thread(&provided);
        if (provided < MPI_THREAD_SERIALIZED)
            DSC_WARN("comm", "MPI was initialised with thread level %d; dsc's mpi backend wants "
                     "MPI_THREAD_SERIALIZED: do not call MPI from other threads meanwhile",
                     provided);
        return DSC_OK;
    }
    int err = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (err != MPI_SUCCESS) return mpi_fail(err, "MPI_Init_thread");
    if (!atomic_exchange(&mpi_we_initialized, 1)) atexit(finalize_at_exit);
    return DSC_OK;
}

static dsc_status mpi_create(dsc_comm *c, const dsc_comm_opts *o, int *rank, int *size,
                             void **impl) {
    DSC_TRY(ensure_init());
    mpib *b = calloc(1, sizeof *b);
    if (!b) return dsc__fail(DSC_ERR_OOM, "mpi: out of memory");
    b->comm = c;
    b->timeout = o->timeout_s;
    pthread_mutex_init(&b->mu, NULL);
    int err = MPI_Comm_dup(MPI_COMM_WORLD, &b->mc);
    if (err != MPI_SUCCESS) {
        free(b);
        return mpi_fail(err, "MPI_Comm_dup");
    }
    MPI_Comm_set_errhandler(b->mc, MPI_ERRORS_RETURN);
    if (o->group_tag) MPI_Comm_set_name(b->mc, (char *)o->group_tag);
    MPI_Comm_rank(b->mc, &b->rank);
    MPI_Comm_size(b->mc, &b->world);
    if ((o->rank >= 0 && o->rank != b->rank) || (o->world_size >= 0 && o->world_size != b->world)) {
        dsc_status st = dsc__fail(DSC_ERR_CONFIG,
                                  "mpi: asked for rank %d of %d but MPI says rank %d of %d; "
                                  "leave rank/world_size at -1 with the mpi backend",
                                  o->rank, o->world_size, b->rank, b->world);
        MPI_Comm_free(&b->mc);
        free(b);
        return st;
    }
    *rank = b->rank;
    *size = b->world;
    *impl = b;
    return DSC_OK;
}

static void mreq_free(mreq *m) {
    if (!m) return;
    free(m->stage_in);
    free(m->stage_out);
    free(m->copy_in);
    free(m);
}

static void unlink_inflight(mpib *b, dsc_comm_req *r) {
    for (dsc_comm_req **p = &b->inflight; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            return;
        }
}

static void mpi_destroy(void *impl) {
    mpib *b = impl;
    pthread_mutex_lock(&b->mu);
    for (dsc_comm_req *r = b->inflight, *next; r; r = next) {
        next = r->next;
        mreq *m = r->impl;
        int flag = 0;
        MPI_Test(&m->mr, &flag, MPI_STATUS_IGNORE);
        if (flag) mreq_free(m); // else MPI may still write the staging buffers: keep them
        r->impl = NULL;
        dsc__req_finish(r, DSC_ERR_INVALID_ARG, "mpi: the communicator was destroyed first");
    }
    if (!dsc__comm_broken(b->comm, NULL, NULL)) MPI_Comm_free(&b->mc);
    pthread_mutex_unlock(&b->mu);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

// ---- submit ----

static MPI_Datatype wire_type(dsc_dtype dt, bool reduce) {
    if (dt == DSC_DT_F32 || reduce) return MPI_FLOAT;
    return MPI_UINT16_T;
}

static bool overlaps(const void *a, size_t alen, const void *b, size_t blen) {
    const char *x = a, *y = b;
    return x < y + blen && y < x + alen;
}

// Stage 16-bit reduction inputs as fp32 (in: n_in elements, out: n_out).
static dsc_status stage_half(mreq *m, const dsc__comm_op *op, size_t n_in, size_t n_out) {
    m->stage_in = malloc(n_in * sizeof(float));
    m->stage_out = malloc((n_out ? n_out : 1) * sizeof(float));
    if (!m->stage_in || !m->stage_out) return dsc__fail(DSC_ERR_OOM, "mpi: out of memory");
    dsc__to_f32(m->stage_in, op->send, n_in, op->dt);
    return DSC_OK;
}

static int start_reduction(mpib *b, const dsc__comm_op *op, mreq *m, const void *send,
                           void *recv) {
    MPI_Op mop = op->red == DSC_OP_SUM ? MPI_SUM : MPI_MAX;
    int n = (int)op->count;
    if (op->kind == DSC__OP_ALL_REDUCE)
        return MPI_Iallreduce(send, recv, n, MPI_FLOAT, mop, b->mc, &m->mr);
    if (op->kind == DSC__OP_REDUCE_SCATTER)
        return MPI_Ireduce_scatter_block(send, recv, n, MPI_FLOAT, mop, b->mc, &m->mr);
    return MPI_Ireduce(send, recv, n, MPI_FLOAT, mop, op->root, b->mc, &m->mr);
}

static dsc_status submit_reduction(mpib *b, const dsc__comm_op *op, mreq *m) {
    size_t n_in = op->count * (op->kind == DSC__OP_REDUCE_SCATTER ? (size_t)b->world : 1);
    bool root_recv = op->kind != DSC__OP_REDUCE || b->rank == op->root;
    size_t n_out = root_recv ? op->count : 0;
    const void *send = op->send;
    void *recv = op->recv;
    if (op->dt != DSC_DT_F32) {
        DSC_TRY(stage_half(m, op, n_in, n_out));
        send = m->stage_in;
        recv = m->stage_out;
    } else if (send == recv && op->kind != DSC__OP_REDUCE_SCATTER && root_recv) {
        send = MPI_IN_PLACE;
    } else if (root_recv && overlaps(send, n_in * 4, recv, n_out * 4)) {
        m->copy_in = malloc(n_in * 4);
        if (!m->copy_in) return dsc__fail(DSC_ERR_OOM, "mpi: out of memory");
        memcpy(m->copy_in, send, n_in * 4);
        send = m->copy_in;
    }
    int err = start_reduction(b, op, m, send, recv);
    return err == MPI_SUCCESS ? DSC_OK : mpi_fail(err, dsc__op_name(op->kind));
}

static int start_other(mpib *b, const dsc__comm_op *op, mreq *m) {
    int n = (int)op->count;
    MPI_Datatype t = wire_type(op->dt, false);
    size_t es = dsc_dtype_size(op->dt);
    switch (op->kind) {
    case DSC__OP_ALL_GATHER: {
        const void *send = op->send == (char *)op->recv + (size_t)b->rank * op->count * es
                               ? MPI_IN_PLACE
                               : op->send;
        return MPI_Iallgather(send, n, t, op->recv, n, t, b->mc, &m->mr);
    }
    case DSC__OP_BROADCAST: return MPI_Ibcast(op->recv, n, t, op->root, b->mc, &m->mr);
    case DSC__OP_BARRIER: return MPI_Ibarrier(b->mc, &m->mr);
    case DSC__OP_SEND: return MPI_Isend(op->send, n, t, op->root, 0, b->mc, &m->mr);
    default: return MPI_Irecv(op->recv, n, t, op->root, 0, b->mc, &m->mr);
    }
}

static bool is_reduction(dsc__op_kind k) {
    return k == DSC__OP_ALL_REDUCE || k == DSC__OP_REDUCE_SCATTER || k == DSC__OP_REDUCE;
}

static dsc_status mpi_submit(void *impl, dsc_comm_req *r) {
    mpib *b = impl;
    const dsc__comm_op *op = &r->op;
    if (op->count > 0x7fffffff / (size_t)b->world)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "mpi: %s of %zu elements exceeds MPI's int counts",
                         dsc__op_name(op->kind), op->count);
    mreq *m = calloc(1, sizeof *m);
    if (!m) return dsc__fail(DSC_ERR_OOM, "mpi: out of memory");
    pthread_mutex_lock(&b->mu);
    dsc_status st = DSC_OK;
    if (is_reduction(op->kind)) {
        st = submit_reduction(b, op, m);
    } else {
        int err = start_other(b, op, m);
        if (err != MPI_SUCCESS) st = mpi_fail(err, dsc__op_name(op->kind));
    }
    if (st == DSC_OK) {
        r->impl = m;
        r->next = b->inflight;
        b->inflight = r;
    }
    pthread_mutex_unlock(&b->mu);
    if (st != DSC_OK) mreq_free(m);
    return st;
}

// ---- completion ----

// Poll once (lock held). True when the request finished (successfully or not).
static bool poll_req(mpib *b, dsc_comm_req *r) {
    mreq *m = r->impl;
    int flag = 0;
    char msg[DSC__COMM_MSG_MAX], what[128];
    int err = MPI_Test(&m->mr, &flag, MPI_STATUS_IGNORE);
    dsc__op_describe(&r->op, what, sizeof what);
    if (err != MPI_SUCCESS) {
        char es[MPI_MAX_ERROR_STRING];
        int len = 0;
        MPI_Error_string(err, es, &len);
        dsc__comm_msg(msg, "rank %d: %s: MPI failed: %s", b->rank, what, es);
        dsc__comm_break(b->comm, DSC_ERR_MPI, msg);
        atomic_store(&mpi_any_broken, 1);
        unlink_inflight(b, r);
        dsc__req_finish(r, DSC_ERR_MPI, msg); // m is leaked on purpose: MPI may hold it
        return true;
    }
    dsc_status bst;
    const char *bmsg;
    if (!flag && dsc__comm_broken(b->comm, &bst, &bmsg)) { // dsc_comm_abort from another thread
        dsc__comm_msg(msg, "rank %d: %s: the communicator was aborted (%s)", b->rank, what, bmsg);
        atomic_store(&mpi_any_broken, 1);
        unlink_inflight(b, r);
        dsc__req_finish(r, bst, msg); // m is leaked on purpose: MPI may still write its buffers
        return true;
    }
    if (!flag) {
        double elapsed = dsc_now() - r->t_start;
        if (elapsed < b->timeout) return false;
        dsc__comm_msg(msg,
                 "rank %d: %s: not complete after %.1f s (comm_timeout_s %.1f); MPI cannot "
                 "cancel it, so this communicator is unusable: restart the job",
                 b->rank, what, elapsed, b->timeout);
        dsc__comm_break(b->comm, DSC_ERR_TIMEOUT, msg);
        atomic_store(&mpi_any_broken, 1);
        unlink_inflight(b, r);
        dsc__req_finish(r, DSC_ERR_TIMEOUT, msg);
        return true;
    }
    bool root_recv = r->op.kind != DSC__OP_REDUCE || b->rank == r->op.root;
    if (m->stage_out && root_recv) dsc__from_f32(r->op.recv, m->stage_out, r->op.count, r->op.dt);
    unlink_inflight(b, r);
    mreq_free(m);
    r->impl = NULL;
    dsc__req_finish(r, DSC_OK, NULL);
    return true;
}

static bool mpi_test(void *impl, dsc_comm_req *r) {
    mpib *b = impl;
    pthread_mutex_lock(&b->mu);
    bool done = atomic_load(&r->done) || poll_req(b, r);
    pthread_mutex_unlock(&b->mu);
    return done;
}

// MPI progresses only inside MPI calls: poll, with short sleeps once it takes a while.
static void mpi_wait(void *impl, dsc_comm_req *r) {
    double t0 = dsc_now();
    while (!mpi_test(impl, r)) {
        if (dsc_now() - t0 < 1e-3) continue;
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

const dsc__comm_ops dsc__mpi_ops = {
    .name = "mpi",
    .create = mpi_create,
    .destroy = mpi_destroy,
    .submit = mpi_submit,
    .wait = mpi_wait,
    .test = mpi_test,
};

#endif // DSC_FEATURE_MPI
