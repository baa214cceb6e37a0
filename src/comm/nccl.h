// comm/nccl.h - the nccl backend's host-side decisions, apart from NCCL so that every build tests
// them (tests/unit/test_comm_nccl.c), its test hook, and its two entry points beyond dsc/comm.h
// (dsc__nccl_after_event, dsc__nccl_record_event).
//
// An NCCL operation of dsc is done when the CUDA event recorded after it on the communicator's
// stream has been reached. NCCL itself never gives up on a peer that hangs, so the host polls
// these together, in this precedence:
//   1. an event query failed (a CUDA error: a kernel fault, a lost device)    -> CUDA error
//   2. ncclCommGetAsyncError reports an error (a peer failed, a network error) -> NCCL error
//      (also when the event was reached: NCCL's kernels leave early on an error, so the data
//      are not the result)
//   3. the event was reached                                                   -> done
//   4. the operation is still held by a wait on another stream (issued after
//      dsc__nccl_after_event, whose event is not reached yet)                  -> running, with
//      no deadline: it has not started, and the caller's kernels are not communication
//   5. the request is older than the deadline (fault_tolerance.comm_timeout_s)  -> timeout
//   otherwise it is still running. The age counts from when NCCL took the operation, from when
//   the operation before it finished, or from when the poll first saw its wait passed, the latest
//   of these.
// On 1, 2 and 5 the backend aborts the NCCL communicator (ncclCommAbort: kernels waiting for
// peers exit) and the dsc communicator is broken with the message made here.
//
// Test hook (docs/comm.md): DSC_NCCL_INJECT_DELAY="K:S" makes the K-th operation (1-based) of
// every nccl communicator of the process hold its stream for S seconds after NCCL's work and
// before the completion event (a host function), which stands for a peer that does not arrive:
// with S above comm_timeout_s the deadline fires on one GPU, after the NCCL kernel has finished,
// so the abort that follows is safe there.
#ifndef DSC_COMM_NCCL_H
#define DSC_COMM_NCCL_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/comm.h" // dsc_comm, dsc_status

typedef enum dsc__nccl_verdict {
    DSC__NCCL_RUNNING = 0,
    DSC__NCCL_DONE,
    DSC__NCCL_CUDA_ERROR,
    DSC__NCCL_NCCL_ERROR,
    DSC__NCCL_TIMEOUT,
} dsc__nccl_verdict;

typedef struct dsc__nccl_probe {
    int event;        // cudaEventQuery: 1 reached, 0 not yet, -1 failed
    int async;        // ncclCommGetAsyncError: 0 ncclSuccess, 1 ncclInProgress, -1 an error
    double elapsed_s; // since the deadline started counting (see above)
    double timeout_s; // the communicator's deadline
    int held;         // the wait before it (dsc__nccl_after_event): 0 none or passed, 1 not yet
                      // passed, -1 its event query failed
} dsc__nccl_probe;

dsc__nccl_verdict dsc__nccl_judge(const dsc__nccl_probe *p);

// Where an operation ran: this rank, the world and the device (for the messages below).
typedef struct dsc__nccl_site {
    int rank, world, device;
} dsc__nccl_site;

// The broken communicator's message (DSC__COMM_MSG_MAX bytes, cut to fit) for a verdict other
// than running/done. what: "all_reduce of 1000 f32"; detail: the CUDA or NCCL error text (NULL
// for a timeout). Names the operation, the ranks and what to do.
void dsc__nccl_fault_msg(char *msg, size_t cap, const dsc__nccl_site *at, const char *what,
                         dsc__nccl_verdict v, double elapsed_s, double timeout_s,
                         const char *detail);

// DSC_NCCL_INJECT_DELAY parsed: *op (0: none) and *seconds. false when it is set but malformed.
bool dsc__nccl_inject_parse(const char *spec, long *op, double *seconds);

// Operations issued on c after this call start on the device only once cuda_event (a cudaEvent_t
// the caller recorded, on any stream, before the call) is reached: the communicator's stream
// waits for it (cudaStreamWaitEvent); the host does not wait. Sends and receives posted before
// the call are issued first, so they stay ahead of the wait. The first operation issued after
// the call is not timed while the wait holds it (rule 4 above). c must be an nccl communicator;
// DSC_ERR_INVALID_ARG otherwise, DSC_ERR_UNSUPPORTED in a build without NCCL, the broken reason
// when c is broken, DSC_ERR_CUDA when the wait cannot be enqueued.
dsc_status dsc__nccl_after_event(dsc_comm *c, void *cuda_event);

// The reverse: records cuda_event (a cudaEvent_t of the caller's) on the communicator's stream
// after every operation issued on c so far (sends and receives posted are issued first), so that
// another stream can wait for them (cudaStreamWaitEvent) without the host waiting. The
// operations must still be waited for with dsc_comm_wait, which is where a failed or late peer is
// detected: a stream that waits on the event waits as long as NCCL does, so the caller waits for
// the requests before it waits for such a stream on the host. Errors as dsc__nccl_after_event.
dsc_status dsc__nccl_record_event(dsc_comm *c, void *cuda_event);

#endif
