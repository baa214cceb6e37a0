// comm/shm_impl.h - the shm backend's segment layout and the functions its two files share
// (shm.c: segment, waiting, progress thread, send/recv; shm_coll.c: collective algorithms).
#ifndef DSC_COMM_SHM_IMPL_H
#define DSC_COMM_SHM_IMPL_H

#include <pthread.h>   // pthread_t, pthread_mutex_t
#include <stdatomic.h> // _Atomic
#include <stdbool.h>   // bool
#include <stdint.h>    // uint64_t

#include "comm/backend.h" // dsc_comm_req, DSC__COMM_MSG_MAX

#define SHM_MAGIC 0x316d68732d637364ull // "dsc-shm1"
#define SHM_VERSION 2
#define SHM_DESC_RING 4 // collective descriptors kept per rank; peers are at most 1 op apart

// Chunk counters of a rank, in its control block. Chunks are numbered 1, 2, ... across all the
// collectives of a communicator; buffer (g & 1) holds chunk g. Invariants:
//   a rank writes its staging slot or a result slot for chunk g only once every rank has
//   done >= g - 2 (nobody still reads the previous use of that buffer);
//   every rank's staged >= g0 (first chunk of an operation) implies its done >= g0 - 1.
enum { F_STAGED = 0, F_REDUCED = 1, F_DONE = 2 };

// One collective as a rank issued it; compared across ranks to catch mismatched calls.
typedef struct shm_desc {
    uint64_t seq, count;
    int32_t kind, dt, red, root;
} shm_desc;

typedef struct shm_ctrl {
    // written by the owning rank only
    _Alignas(64) _Atomic uint64_t counter[3]; // F_STAGED, F_REDUCED, F_DONE: last chunk number
    _Atomic uint64_t heartbeat; // bumped while the rank's progress thread runs or waits
    _Atomic int32_t pid;        // 0 until the rank attached
    _Atomic int32_t left;       // 1 once the rank destroyed its communicator
    uint64_t pid_start;         // start time of pid (/proc/<pid>/stat): tells a reused pid apart
    uint64_t pidns;             // pid namespace inode: kill()/proc checks only within the same one
    // written by everybody
    _Alignas(64) _Atomic uint32_t bell; // futex word; bumped by others to wake this rank
    _Atomic uint32_t sleeping;          // threads of the rank sleeping (or about to) on bell
    _Alignas(64) shm_desc desc[SHM_DESC_RING];
} shm_ctrl;

typedef struct shm_header {
    _Atomic uint64_t magic; // written last by rank 0
    uint32_t version, world;
    uint64_t slot_bytes, chan_bytes, total_bytes;
    _Atomic int32_t attached;    // ranks that mapped the segment
    _Atomic int32_t abort_claim; // 0, then 1 for the first rank to fail
    _Atomic int32_t abort_rank;  // -1, or that rank (published after code and message)
    int32_t abort_code;
    char abort_msg[DSC__COMM_MSG_MAX];
    _Atomic uint64_t note; // dsc_comm_note_cas: a word every rank can swap, broken or not
} shm_header;

// One ring per ordered pair (sender, receiver); chan_bytes of data follow the struct.
typedef struct shm_chan {
    _Alignas(64) _Atomic uint64_t head; // bytes written by the sender
    _Alignas(64) _Atomic uint64_t tail; // bytes consumed by the receiver
} shm_chan;

// Byte offsets in the segment.
typedef struct layout {
    size_t ctrl, slots, results, chans, chan_stride, total;
} layout;

struct p2p;

typedef struct shm {
    dsc_comm *comm;
    int rank, world;
    double timeout;
    uint64_t pidns;
    // the segment
    uint8_t *base;
    layout L;
    shm_header *hdr;
    shm_ctrl *ctrl; // (world)
    size_t slot_bytes, chan_bytes;
    char name[160];
    bool linked; // this process must still shm_unlink the name
    // submission queue: callers -> progress thread
    pthread_mutex_t qmu;
    dsc_comm_req *qhead, *qtail;
    _Atomic int qcount;
    _Atomic int stop;
    _Atomic uint32_t qbell, qsleeping; // private futex of the idle progress thread: submissions
                                       // ring it, peers do not (their publishes stay syscall-free)
    pthread_mutex_t exec_mu; // held by whichever thread runs operations: the progress thread, or a
                             // caller running a blocking collective inline (no handoff)
    pthread_t thread;
    bool thread_started;
    _Atomic uint32_t completions, cwaiters; // callers sleep on completions (private futex)
    // under exec_mu
    dsc_comm_req *chead, *ctail;     // collectives in issue order
    struct p2p **sendq, **recvq;     // (world) active messages per peer, in issue order
    int np2p;
    uint64_t chunk, seq;             // last chunk number and collective sequence number used
    double next_liveness, next_p2p_check;
    const void **srcs;               // (world) reduction sources scratch
    // Heartbeat observation: the last value of each peer's heartbeat this process saw and when it
    // saw it change. Any thread (progress, caller, a fault-tolerance watchdog) may observe.
    pthread_mutex_t hb_mu;
    uint64_t *hb_seen;               // (world)
    double *hb_time;                 // (world) dsc_now() of the last change seen
} shm;

// Context of one waiting operation: its name for messages, the error sentence, deadlines.
typedef struct shm_wait_ctx {
    const char *what; // "all_reduce of 1000 f32"
    char *msg;        // DSC__COMM_MSG_MAX bytes, filled on failure
    double t_op;      // when the operation started
    double deadline;
} shm_wait_ctx;

static inline _Atomic uint64_t *shm__counter(shm *s, int rank, int field) {
    return &s->ctrl[rank].counter[field];
}
static inline uint8_t *shm__slot(shm *s, int rank, uint64_t g) {
    return s->base + s->L.slots + ((size_t)rank * 2 + (g & 1)) * s->slot_bytes;
}
static inline uint8_t *shm__result(shm *s, uint64_t g) {
    return s->base + s->L.results + (g & 1) * s->slot_bytes;
}

// shm.c
void shm__ring(shm *s, int rank);
void shm__wake_progress(shm *s);
void shm__publish(shm *s, int field, uint64_t v);
// Wait until counter `field` of every other rank (or only of rank `only` when >= 0) reaches
// target. Fails on deadline (no progress for timeout), dead or departed peer, abort, destroy.
dsc_status shm__wait(shm *s, shm_wait_ctx *w, int field, uint64_t target, int only);
dsc_status shm__check_abort(shm *s, const char *what, char *msg);
dsc_status shm__check_peer(shm *s, int j, const char *what, char *msg);
bool shm__peer_alive(shm *s, int j);
// Look at every peer's heartbeat now (thread-safe), so that its age is known when asked.
void shm__observe_heartbeats(shm *s);
void shm__fail_comm(shm *s, dsc_status st, const char *msg);
void shm__finish(shm *s, dsc_comm_req *r, dsc_status st, const char *msg);
void shm__drain_queue(shm *s);
void shm__p2p_start(shm *s, dsc_comm_req *r);
bool shm__p2p_progress(shm *s);
void shm__p2p_fail_all(shm *s, dsc_status st, const char *why);

// shm_coll.c: run one collective to completion (on the progress thread).
dsc_status shm__collective(shm *s, dsc_comm_req *r, shm_wait_ctx *w);

#endif
