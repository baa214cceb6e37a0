// comm/nccl_poll.c - the nccl backend's polling verdict and fault messages (see comm/nccl.h).
// Plain C without NCCL: compiled in every build, so the decisions are tested everywhere.
#include "comm/nccl.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // strtol, strtod

dsc__nccl_verdict dsc__nccl_judge(const dsc__nccl_probe *p) {
    if (p->event < 0 || p->held < 0) return DSC__NCCL_CUDA_ERROR;
    if (p->async < 0) return DSC__NCCL_NCCL_ERROR;
    if (p->event > 0) return DSC__NCCL_DONE;
    if (p->held > 0) return DSC__NCCL_RUNNING; // not started: the deadline does not count yet
    if (p->elapsed_s >= p->timeout_s) return DSC__NCCL_TIMEOUT;
    return DSC__NCCL_RUNNING;
}

// "ranks 0-3" or "rank 0" (the peers the operation waited on: NCCL does not say which).
static void ranks_text(char *buf, size_t cap, int world) {
    if (world <= 1) snprintf(buf, cap, "rank 0");
    else snprintf(buf, cap, "ranks 0-%d", world - 1);
}

void dsc__nccl_fault_msg(char *msg, size_t cap, const dsc__nccl_site *at, const char *what,
                         dsc__nccl_verdict v, double elapsed_s, double timeout_s,
                         const char *detail) {
    char peers[48];
    ranks_text(peers, sizeof peers, at->world);
    const char *d = detail && *detail ? detail : "no detail";
    switch (v) {
    case DSC__NCCL_TIMEOUT:
        snprintf(msg, cap,
                 "rank %d of %d (cuda:%d): %s: not complete after %.1f s (comm_timeout_s %.1f); "
                 "NCCL cannot tell which rank is missing: one of %s is stuck, dead or skipped "
                 "this operation. The NCCL communicator was aborted; check the other ranks' "
                 "logs, then restart the job or build a new communicator over the survivors",
                 at->rank, at->world, at->device, what, elapsed_s, timeout_s, peers);
        break;
    case DSC__NCCL_NCCL_ERROR:
        snprintf(msg, cap,
                 "rank %d of %d (cuda:%d): %s: NCCL reported an error (%s); a peer among %s or "
                 "the network failed. The NCCL communicator was aborted; check the other ranks' "
                 "logs (NCCL_DEBUG=WARN says more), then restart the job",
                 at->rank, at->world, at->device, what, d, peers);
        break;
    case DSC__NCCL_CUDA_ERROR:
        snprintf(msg, cap,
                 "rank %d of %d (cuda:%d): %s: the device failed (%s). The NCCL communicator "
                 "was aborted; check nvidia-smi and the kernel log, then restart the job",
                 at->rank, at->world, at->device, what, d);
        break;
    default:
        snprintf(msg, cap, "rank %d of %d (cuda:%d): %s: no fault", at->rank, at->world,
                 at->device, what);
    }
}

bool dsc__nccl_inject_parse(const char *spec, long *op, double *seconds) {
    *op = 0;
    *seconds = 0;
    if (!spec || !*spec) return true;
    char *end = NULL;
    long k = strtol(spec, &end, 10);
    if (end == spec || *end != ':' || k < 1) return false;
    const char *s = end + 1;
    double sec = strtod(s, &end);
    if (end == s || *end || !(sec > 0) || sec > 3600) return false;
    *op = k;
    *seconds = sec;
    return true;
}
