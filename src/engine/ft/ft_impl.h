// engine/ft/ft_impl.h - the fault-tolerance state of one engine, shared by the files of
// engine/ft/ (ft.c: watchdog, events, injection; replica.c: snapshots and the buddy ring;
// recover.c: recovery; state_io.c: whole-state files for tests).
#ifndef DSC_ENGINE_FT_IMPL_H
#define DSC_ENGINE_FT_IMPL_H

#include <pthread.h>   // pthread_t, pthread_mutex_t, pthread_cond_t
#include <stdatomic.h> // _Atomic
#include <stdbool.h>   // bool
#include <stdint.h>    // int64_t

#include "dsc/comm.h"           // dsc_comm, dsc_comm_req
#include "engine/engine_impl.h" // struct dsc_engine
#include "engine/state.h"       // dsc_state_scalars

enum { FT_DEGRADE = 0, FT_RESTART = 1, FT_ABORT = 2 };

// One packed copy of a rank's state at a step boundary: nvec vectors of len floats (the fp32
// master, then the moments), each in the partition's order (group by group, this rank's slice),
// or the full buffers at stage 0.
typedef struct ft_slot {
    float *buf;           // (nvec, len): the block h of the engine's pool
    dsc_mem_handle h;
    int64_t tag;          // the step boundary it holds (global steps), -1: empty or invalid
    dsc_state_scalars sc; // own slots: the scalars of that boundary
    bool external;        // own slots: buf is the caller's (dsc__ft_own_external), h is 0
    // On one node (the shm backend) the own slots live in a segment of this rank's that the
    // buddy maps, so the replica is the snapshot itself and nothing is sent: shared is then the
    // tag the segment publishes (an own slot's, mirroring tag; a replica slot's, the sender's),
    // map the mapped slot, and frozen (a replica slot during a recovery) a private copy of it,
    // which buf and tag then describe. NULL otherwise.
    _Atomic int64_t *shared;
    float *map;
    float *frozen;
} ft_slot;

#define FT_MAX_INJECT 8

// DSC_FT_INJECT entries: "RANK:STEP:POINT[:ACTION]" (STEP may be *).
typedef struct ft_inject {
    int rank;
    int64_t step; // -1: every step
    char point[24];
    char action[24]; // "kill" (default), "stop", "exit", "sleep=S"
    int64_t fired_step;
} ft_inject;

struct dsc__ft {
    // configuration
    double comm_timeout, step_timeout;
    int policy;    // FT_DEGRADE, FT_RESTART, FT_ABORT
    bool ring;     // replicate this rank's state to the buddy (stages 1-3, replicate on)
    // identity across recoveries
    int orig_rank; // the rank this process started as
    int *orig_of;  // (world) original rank of every current rank
    int gen;       // recoveries so far
    // snapshots (replica.c)
    size_t len;    // floats per vector: the partition (stages 1-3) or the whole layout (stage 0)
    int nvec;      // 1 + moments
    ft_slot own[2], rep[2]; // own: this rank; rep: the replica of rank - 1 (the ring's sender)
    void *seg, *peer;       // this rank's shared segment (own slots), rank - 1's mapped; or NULL
    size_t seg_bytes, peer_bytes;
    bool peer_maps;         // rank + 1 maps our segment: the exchange sends nothing
    dsc_comm_req *send_req, *recv_req;
    ft_slot *recv_slot;     // receiving the replica of this boundary
    int64_t recv_tag;
    ft_slot *pending;       // reserved for a device's copy (dsc__ft_snapshot_reserve), or NULL
    int64_t pending_tag;
    double pack_s, wait_s;  // time on the caller's thread: packing, waiting for the exchange
    int64_t commits;
    // watchdog (ft.c)
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu; // guards everything below up to `events`
    pthread_cond_t cv;
    bool armed, stop, fired;
    double deadline, step_t0, last_step_s;
    int64_t step;         // the optimizer step in progress (set by dsc_step_begin)
    dsc_comm *watch_comm; // the communicator the watchdog aborts
    _Atomic(const char *) phase;
    _Atomic int64_t events;
    // retries (recover.c): the step whose transient fault was already retried, or -1
    int64_t retried_step;
    // The newest boundary the caller has gone past (dsc_step_begin of the step after it);
    // INT64_MAX while the caller never calls dsc_step_begin. A recovery restores no later
    // boundary: a step whose state was committed but whose caller met the fault before its next
    // dsc_step_begin (in the loss mean, say, before it reported the step) is redone.
    int64_t acked;
    // fault injection (tests)
    ft_inject inject[FT_MAX_INJECT];
    int ninject;
};

// ft.c
void dsc__ft_disarm(struct dsc__ft *ft);
void dsc__ft_set_comm(struct dsc__ft *ft, dsc_comm *c); // the communicator the watchdog aborts

// replica.c
dsc_status dsc__ft_slots_alloc(dsc_engine *e); // for the current layout; every tag -1
void dsc__ft_slots_free(dsc_engine *e);
void dsc__ft_report_cost(const struct dsc__ft *ft); // DSC_LOG=info: time spent per step
void dsc__ft_ring_drain(dsc_engine *e);           // wait (and forget) the exchange in flight
void dsc__ft_pack(dsc_engine *e, float *buf);     // live state -> (nvec, len)
void dsc__ft_unpack(dsc_engine *e, const float *buf); // (nvec, len) -> live state (same layout)
ft_slot *dsc__ft_own_at(struct dsc__ft *ft, int64_t tag); // NULL when not held
void dsc__ft_set_tag(ft_slot *s, int64_t tag); // an own slot's tag (published when shared)
// At a recovery's start: each mapped replica slot that holds a whole boundary is copied out of
// the sender's segment (which a rank thought dead may still write), the copy then being the
// slot; the next exchange maps it again.
void dsc__ft_rep_freeze(struct dsc__ft *ft);
ft_slot *dsc__ft_rep_at(struct dsc__ft *ft, int64_t tag);

// state_io.c: fill this rank's slices of the current layout from a source of whole parameters
// (vector k of parameter i: `numel` floats from src(user, k, i)).
typedef const float *(*ft_param_src)(void *user, int k, int i);
void dsc__ft_fill_slices(dsc_engine *e, ft_param_src src, void *user);

#endif
