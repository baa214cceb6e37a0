// comm/backend.h - what a communication backend implements, and the request both sides share.
#ifndef DSC_COMM_BACKEND_H
#define DSC_COMM_BACKEND_H

#include <stdatomic.h> // _Atomic
#include <stdbool.h>   // bool
#include <stddef.h>    // size_t
#include <stdint.h>    // uint64_t

#include "dsc/comm.h"        // dsc_comm_*, dsc_dtype, dsc_red_op
#include "dsc_build_info.h" // DSC_FEATURE_MPI

typedef enum dsc__op_kind {
    DSC__OP_ALL_REDUCE = 0,
    DSC__OP_REDUCE_SCATTER,
    DSC__OP_ALL_GATHER,
    DSC__OP_BROADCAST,
    DSC__OP_REDUCE,
    DSC__OP_BARRIER,
    DSC__OP_SEND,
    DSC__OP_RECV,
} dsc__op_kind;

// One operation as the caller described it. Buffers are borrowed until the request completes.
typedef struct dsc__comm_op {
    dsc__op_kind kind;
    const void *send; // all_reduce, reduce_scatter (world, count), all_gather, reduce, send
    void *recv;       // all_reduce, reduce_scatter, all_gather (world, count), broadcast, recv
    size_t count;
    dsc_dtype dt;
    dsc_red_op red;
    int root; // broadcast/reduce root, or the peer of send/recv
} dsc__comm_op;

#define DSC__COMM_MSG_MAX 512

struct dsc_comm_req {
    dsc_comm *comm;
    dsc__comm_op op;
    struct dsc_comm_req *next; // backend's queue link
    struct dsc_comm_req *live_prev, *live_next; // comm.c's list of requests not yet released
    void *impl;                // backend's per-request state
    double t_start, t_end;     // dsc_now() when the backend started / finished it
    double t_clock;            // backend's use: when the deadline started counting (nccl: when the
                               // operation became the oldest one NCCL holds for this rank)
    bool blocking;             // the caller waits right after submit (req == NULL)
    dsc_status st;             // valid once done
    char msg[DSC__COMM_MSG_MAX];
    _Atomic int done; // set last (release) by the backend; the request is then the caller's
};

// A backend: a table of functions, one registry row each (comm.c). `impl` is the backend's
// context; requests reach the backend fully validated.
typedef struct dsc__comm_ops {
    const char *name;
    // Set *rank and *size (resolved from the options or the backend's own runtime) and *impl.
    dsc_status (*create)(dsc_comm *c, const dsc_comm_opts *o, int *rank, int *size, void **impl);
    void (*destroy)(void *impl);
    // Start the request; on DSC_OK the backend owns it until it sets done.
    dsc_status (*submit)(void *impl, dsc_comm_req *r);
    // Block until r->done (the backend enforces the deadline).
    void (*wait)(void *impl, dsc_comm_req *r);
    // Poll once; true when r->done.
    bool (*test)(void *impl, dsc_comm_req *r);
    // Optional. Another thread aborted the communicator (already marked broken with st, msg):
    // make operations in flight fail promptly, here and, where the backend can, at the peers.
    void (*abort)(void *impl, dsc_status st, const char *msg);
    // Optional. What this process can tell about rank j (0 <= j < size); NULL: "unknown".
    void (*peer)(void *impl, int j, dsc_comm_peer *out);
    // Optional. Compare-and-swap the communicator's shared note (see dsc_comm_note_cas).
    bool (*note_cas)(void *impl, uint64_t *expected, uint64_t desired);
    // Optional. dsc_comm_shrink: the context of a new communicator nc (not yet usable: comm.c
    // fills it in after) without the excluded ranks; *rank, *size and *impl as create sets them.
    dsc_status (*shrink)(void *impl, dsc_comm *nc, const int *exclude, int n, int *rank,
                         int *size, void **impl_out);
} dsc__comm_ops;

// Shared by backends (comm.c).
const char *dsc__op_name(dsc__op_kind k);
// Set the request's outcome and publish it (done = 1). The request must not be touched after.
void dsc__req_finish(dsc_comm_req *r, dsc_status st, const char *msg);
// Mark the communicator broken with this reason (the first reason wins); thread-safe.
void dsc__comm_break(dsc_comm *c, dsc_status st, const char *msg);
// True and the first reason when broken.
bool dsc__comm_broken(dsc_comm *c, dsc_status *st, const char **msg);
// Deadline of the communicator, seconds.
double dsc__comm_timeout(const dsc_comm *c);
// printf into a DSC__COMM_MSG_MAX buffer (messages are cut to fit).
void dsc__comm_msg(char *msg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// "all_reduce of 1000 f32" into buf.
void dsc__op_describe(const dsc__comm_op *op, char *buf, size_t len);
// Payload size in bytes as dsc_comm_stats counts it.
size_t dsc__op_bytes(const dsc__comm_op *op, int world);

// The comms logger (comm/logger.c): one completed operation on a communicator of `world` ranks.
void dsc__comm_log_record(const dsc__comm_op *op, int world, double seconds);

#if DSC_FEATURE_MPI
extern const dsc__comm_ops dsc__mpi_ops; // comm/mpi.c
#endif
#ifdef DSC_WITH_NCCL
extern const dsc__comm_ops dsc__nccl_ops; // comm/nccl.c
#endif

#endif
