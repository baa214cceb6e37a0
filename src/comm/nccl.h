// comm/nccl.h - the nccl backend's host-side decisions, apart from NCCL so that every build tests
// them (tests/unit/test_comm_nccl.c), and its test hook.
//
// An NCCL operation of dsc is done when the CUDA event recorded after it on the communicator's
// stream has been reached. NCCL itself never gives up on a peer that hangs, so the host polls
// three things together, in this precedence:
//   1. the event query failed (a CUDA error: a kernel fault, a lost device)   -> CUDA error
//   2. ncclCommGetAsyncError reports an error (a peer failed, a network error) -> NCCL error
//      (also when the event was reached: NCCL's kernels leave early on an error, so the data
//      are not the result)
//   3. the event was reached                                                   -> done
//   4. the request is older than the deadline (fault_tolerance.comm_timeout_s)  -> timeout
//   otherwise it is still running.
// On 1, 2 and 4 the backend aborts the NCCL communicator (ncclCommAbort: kernels waiting for
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
    double elapsed_s; // since the request was submitted
    double timeout_s; // the communicator's deadline
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

#endif
