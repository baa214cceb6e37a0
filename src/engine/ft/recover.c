// engine/ft/recover.c - recovery after a communication fault (docs/fault-tolerance.md).
//
//   1. Classify the ranks of the failed communicator: dead (process gone), hung (stopped, or no
//      heartbeat for a while), alive. Policy abort stops here with a message naming them; policy
//      restart, and the mpi backend (no in-place shrink without ULFM), ask for a restart.
//   2. Membership: the first survivor to get there hosts a store on a free loopback port and
//      posts it in the failed communicator's shared note (compare-and-swap: exactly one hosts).
//      Every survivor posts which step boundaries it can restore, for itself and for the rank
//      whose replica it keeps. The host waits until every rank it believes alive has posted (or
//      the comm deadline passed) and publishes the members: a rank that did not post in time is
//      out.
//   3. Plan, computed identically by every member from the same posts: the latest boundary that
//      every member holds for itself and, for every lost rank, the rank after it holds as a
//      replica; the micro batch and gradient accumulation that keep the global batch.
//   4. A new communicator of the members (group_tag "ft<generation>"); the packed states of the
//      old ranks are broadcast from whoever holds them, every member rebuilds the full flat state
//      of the old layout, re-lays the engine out for the new world and keeps its new slices.
//      A transient fault (every rank alive and joined) restores each rank's own snapshot instead.
#include <stdio.h>  // snprintf, sscanf
#include <stdlib.h> // calloc, free
#include <string.h> // memcpy, strcmp
#include <time.h>   // nanosleep
#include <unistd.h> // getpid

#include "base/log.h"          // DSC_WARN
#include "base/status.h"       // dsc__fail, DSC_TRY
#include "base/time.h"         // dsc_now, dsc_wall_time
#include "comm/store.h"        // dsc_store_*
#include "engine/ft/ft.h"      // dsc__ft_*
#include "engine/ft/ft_impl.h" // struct dsc__ft

#define FT_TEXT 1024

enum { OK_RANK = 0, DEAD_RANK = 1, HUNG_RANK = 2 };

// ---- 1. who failed ----

typedef struct ft_view {
    unsigned char *failed; // (world) OK_RANK, DEAD_RANK or HUNG_RANK
    int nfailed;
    char text[FT_TEXT]; // "rank 2 (pid 123) died; rank 3 (pid 456) hung (stopped)"
} ft_view;

// A live process whose heartbeat stood still this long is hung: well above the 0.1 s a live
// rank's progress thread takes between beats, well below the deadlines that brought us here.
static double stale_after(const struct dsc__ft *ft) {
    double t = ft->comm_timeout / 2;
    return t < 1 ? 1 : t > 10 ? 10 : t;
}

static int peer_status(dsc_engine *e, int j, dsc_comm_peer *p) {
    if (dsc_comm_peer_info(e->comm, j, p) != DSC_OK) return OK_RANK;
    if (p->state == DSC_PEER_DEAD) return DEAD_RANK;
    if (p->state == DSC_PEER_ALIVE && j != e->rank &&
        (p->stopped || p->heartbeat_age_s >= stale_after(e->ft)))
        return HUNG_RANK;
    return OK_RANK; // alive, departed (rebuilding already), or unknown
}

static void classify(dsc_engine *e, ft_view *v) {
    struct dsc__ft *ft = e->ft;
    size_t n = 0;
    v->text[0] = '\0';
    v->nfailed = 0;
    for (int j = 0; j < e->world; j++) {
        dsc_comm_peer p;
        v->failed[j] = (unsigned char)peer_status(e, j, &p);
        if (v->failed[j] == OK_RANK || n + 96 >= sizeof v->text) continue;
        v->nfailed++;
        if (v->failed[j] == DEAD_RANK)
            n += (size_t)snprintf(v->text + n, sizeof v->text - n, "%srank %d (pid %d) died",
                                  n ? "; " : "", ft->orig_of[j], p.pid);
        else if (p.stopped)
            n += (size_t)snprintf(v->text + n, sizeof v->text - n,
                                  "%srank %d (pid %d) hung (its process is stopped)",
                                  n ? "; " : "", ft->orig_of[j], p.pid);
        else
            n += (size_t)snprintf(v->text + n, sizeof v->text - n,
                                  "%srank %d (pid %d) hung (no heartbeat for %.1f s)",
                                  n ? "; " : "", ft->orig_of[j], p.pid, p.heartbeat_age_s);
    }
}

// ---- 2. membership ----

typedef struct ft_info { // what a member posts
    int rank, orig, pid;  // rank in the failed communicator
    int64_t own[2], rep[2];
    int64_t acked; // dsc__ft's acked: restore no boundary past it
} ft_info;

typedef struct ft_group {
    int n;         // members
    int *ranks;    // (n) their ranks in the failed communicator, ascending
    ft_info *info; // (n)
    dsc_store *store;
    bool host;
    bool joined;   // this rank is a member
    bool left_out; // the members were published without this rank
    char addr[256];
    int port;
} ft_group;

static void group_free(ft_group *g) {
    free(g->ranks);
    free(g->info);
    dsc_store_destroy(g->store);
    memset(g, 0, sizeof *g);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// The host: wait until every rank not known failed has posted, or the deadline; then publish.
static dsc_status host_decide(dsc_engine *e, int gen, dsc_store *st) {
    double deadline = dsc_now() + e->ft->comm_timeout;
    unsigned char *in = calloc((size_t)e->world, 1);
    if (!in) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory");
    char key[96], list[4096];
    dsc_status s = DSC_OK;
    for (;;) {
        bool waiting = false;
        for (int j = 0; j < e->world && s == DSC_OK; j++) {
            bool present = in[j];
            snprintf(key, sizeof key, "dsc/ft/%d/info/%d", gen, j);
            if (!present) s = dsc_store_check(st, key, &present);
            in[j] = present;
            dsc_comm_peer p;
            if (!present && peer_status(e, j, &p) == OK_RANK) waiting = true;
        }
        if (s != DSC_OK || !waiting || dsc_now() > deadline) break;
        sleep_s(0.01);
    }
    size_t n = 0;
    for (int j = 0; j < e->world && n + 8 < sizeof list; j++)
        if (in[j]) n += (size_t)snprintf(list + n, sizeof list - n, "%d ", j);
    free(in);
    snprintf(key, sizeof key, "dsc/ft/%d/members", gen);
    if (s == DSC_OK) s = dsc_store_set(st, key, list, n);
    return s;
}

static dsc_status parse_members(dsc_engine *e, ft_group *g, const char *list) {
    g->ranks = calloc((size_t)e->world, sizeof *g->ranks);
    g->info = calloc((size_t)e->world, sizeof *g->info);
    if (!g->ranks || !g->info) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory");
    const char *p = list;
    int r, used;
    while (g->n < e->world && sscanf(p, "%d%n", &r, &used) == 1) {
        if (r >= 0 && r < e->world) g->ranks[g->n++] = r;
        p += used;
    }
    return DSC_OK;
}

static dsc_status read_info(ft_group *g, int gen, int k) {
    char key[96];
    snprintf(key, sizeof key, "dsc/ft/%d/info/%d", gen, g->ranks[k]);
    void *v = NULL;
    size_t len = 0;
    DSC_TRY(dsc_store_get(g->store, key, &v, &len));
    ft_info *in = &g->info[k];
    long long t[5];
    int got = sscanf(v, "%d %d %lld %lld %lld %lld %lld", &in->orig, &in->pid, &t[0], &t[1],
                     &t[2], &t[3], &t[4]);
    free(v);
    if (got != 7)
        return dsc__fail(DSC_ERR_CORRUPT, "fault tolerance: store key %s is malformed", key);
    in->rank = g->ranks[k];
    in->own[0] = t[0], in->own[1] = t[1], in->rep[0] = t[2], in->rep[1] = t[3];
    in->acked = t[4];
    return DSC_OK;
}

// Where the survivors meet: the first to get here hosts a store on a free loopback port and
// posts (generation, port) in the failed communicator's shared note, by compare-and-swap, so
// exactly one hosts; the others read the note and connect. A rank arriving after the group has
// moved on finds the note of its generation and a store that is gone, and fails.
static dsc_status connect_store(dsc_engine *e, int gen, ft_group *g) {
    double tmo = 2 * e->ft->comm_timeout + 2, deadline = dsc_now() + tmo;
    uint64_t note = 0, mine = 0;
    bool swapped;
    snprintf(g->addr, sizeof g->addr, "127.0.0.1"); // one node: shm is the only backend here
    DSC_TRY(dsc_comm_note_cas(e->comm, &note, 0, &swapped)); // read
    bool first = note >> 32 != (uint64_t)gen;
    if (first && dsc_store_create(&g->store, g->addr, 0, true, tmo) == DSC_OK) {
        mine = (uint64_t)gen << 32 | (uint64_t)dsc_store_port(g->store);
        DSC_TRY(dsc_comm_note_cas(e->comm, &note, mine, &swapped));
        if (swapped) {
            g->host = true;
            g->port = dsc_store_port(g->store);
            return DSC_OK;
        }
        dsc_store_destroy(g->store); // another survivor was first
        g->store = NULL;
    }
    while (note >> 32 != (uint64_t)gen && dsc_now() < deadline) { // nobody hosts yet
        sleep_s(0.01);
        DSC_TRY(dsc_comm_note_cas(e->comm, &note, 0, &swapped));
    }
    if (note >> 32 != (uint64_t)gen)
        return dsc__fail(DSC_ERR_TIMEOUT, "fault tolerance: no survivor hosted the regrouping "
                         "within %.1f s", tmo);
    g->port = (int)(note & 0xffff);
    return dsc_store_create(&g->store, g->addr, g->port, false, deadline - dsc_now());
}

static dsc_status membership(dsc_engine *e, int gen, ft_group *g) {
    struct dsc__ft *ft = e->ft;
    DSC_TRY(connect_store(e, gen, g));
    char key[96], val[256];
    snprintf(key, sizeof key, "dsc/ft/%d/info/%d", gen, e->rank);
    int n = snprintf(val, sizeof val, "%d %d %lld %lld %lld %lld %lld", ft->orig_rank,
                     (int)getpid(), (long long)ft->own[0].tag, (long long)ft->own[1].tag,
                     (long long)(ft->ring ? ft->rep[0].tag : -1),
                     (long long)(ft->ring ? ft->rep[1].tag : -1), (long long)ft->acked);
    DSC_TRY(dsc_store_set(g->store, key, val, (size_t)n));
    if (g->host) DSC_TRY(host_decide(e, gen, g->store));
    snprintf(key, sizeof key, "dsc/ft/%d/members", gen);
    void *list = NULL;
    size_t len = 0;
    DSC_TRY(dsc_store_get(g->store, key, &list, &len));
    dsc_status st = parse_members(e, g, list);
    free(list);
    DSC_TRY(st);
    bool in = false;
    for (int k = 0; k < g->n; k++) in |= g->ranks[k] == e->rank;
    g->left_out = !in;
    if (!in)
        return dsc__fail(DSC_ERR_PEER, "rank %d was left out of the group that formed after the "
                         "fault (it joined too late, or looked hung to the others)",
                         ft->orig_rank);
    g->joined = true;
    for (int k = 0; k < g->n; k++) DSC_TRY(read_info(g, gen, k));
    snprintf(key, sizeof key, "dsc/ft/%d/read/%d", gen, e->rank);
    return dsc_store_set(g->store, key, "1", 1);
}

// The host's store must outlive every member's reads of it. On success the new communicator's
// barrier guarantees that; when the plan fails (every member reaches the same verdict from the
// same posts) the host would otherwise close the store under a member still reading, which
// would then report a closed connection instead of the reason. Wait for the members' read marks
// (a member that died meanwhile is not waited for; the deadline bounds the rest).
static void host_linger(dsc_engine *e, int gen, ft_group *g) {
    if (!g->host || !g->joined || !g->store) return;
    double deadline = dsc_now() + e->ft->comm_timeout;
    char key[96];
    for (int k = 0; k < g->n; k++) {
        snprintf(key, sizeof key, "dsc/ft/%d/read/%d", gen, g->ranks[k]);
        for (;;) {
            bool present = false;
            dsc_comm_peer p;
            if (dsc_store_check(g->store, key, &present) != DSC_OK || present) break;
            if (peer_status(e, g->ranks[k], &p) != OK_RANK || dsc_now() > deadline) break;
            sleep_s(0.005);
        }
    }
}

// ---- 3. plan ----

typedef struct ft_plan {
    int64_t b;      // the boundary every member restores
    int world, rank; // new
    int64_t micro, gas; // the batch split of the new world (split: it exists)
    bool split;
    char why_not[256];  // !split: why
    int *provider;  // (old world) new rank that broadcasts old rank r's packed state
} ft_plan;

static bool holds(const int64_t t[2], int64_t b) { return b >= 0 && (t[0] == b || t[1] == b); }

static int member_index(const ft_group *g, int old_rank) {
    for (int k = 0; k < g->n; k++)
        if (g->ranks[k] == old_rank) return k;
    return -1;
}

// Can boundary b be restored? Fills the providers.
static bool plan_at(const dsc_engine *e, const ft_group *g, int64_t b, int *provider) {
    for (int k = 0; k < g->n; k++)
        if (!holds(g->info[k].own, b)) return false;
    for (int r = 0; r < e->world; r++) {
        int k = member_index(g, r);
        if (k >= 0) {
            provider[r] = k;
            continue;
        }
        if (e->stage == 0) { // every member holds everything
            provider[r] = -1;
            continue;
        }
        int h = member_index(g, (r + 1) % e->world); // the ring sends rank r's state to r + 1
        if (h < 0 || !holds(g->info[h].rep, b)) return false;
        provider[r] = h;
    }
    return true;
}

// The micro batch and accumulation of the new world that keep train_batch_size: the largest
// micro batch not above the current one that divides the per-rank share.
static void batch_split(const dsc_engine *e, ft_plan *p) {
    int64_t G = e->cfg.train_batch_size, m0 = e->cfg.train_micro_batch_size_per_gpu;
    p->split = G % p->world == 0;
    p->micro = m0;
    p->gas = e->cfg.gradient_accumulation_steps;
    if (!p->split) {
        snprintf(p->why_not, sizeof p->why_not, "train_batch_size %lld does not split over the "
                 "%d surviving ranks", (long long)G, p->world);
        return;
    }
    int64_t per = G / p->world, m = m0 < per ? m0 : per;
    while (per % m) m--;
    p->micro = m;
    p->gas = per / m;
}

static dsc_status make_plan(dsc_engine *e, const ft_group *g, ft_plan *p) {
    p->provider = calloc((size_t)e->world, sizeof *p->provider);
    if (!p->provider) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory");
    p->world = g->n;
    p->rank = member_index(g, e->rank);
    p->b = -1;
    int64_t acked = INT64_MAX; // the members' oldest: the same limit for every member
    for (int k = 0; k < g->n; k++)
        if (g->info[k].acked < acked) acked = g->info[k].acked;
    for (int k = 0; k < 2; k++) { // candidates: this rank's own boundaries, latest first
        int64_t b = e->ft->own[k].tag;
        if (b > p->b && b <= acked && plan_at(e, g, b, p->provider)) p->b = b;
    }
    if (p->b >= 0) plan_at(e, g, p->b, p->provider);
    if (p->b < 0 && e->stage > 0 && !e->ft->ring)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "fault_tolerance.replicate is off, so the lost "
                         "ranks' partitions exist nowhere in memory");
    if (p->b < 0)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "no step boundary is held by every survivor and by "
                         "the replicas of every lost rank (were two neighbouring ranks lost?)");
    batch_split(e, p);
    return DSC_OK;
}

// ---- 4. rebuild ----

static dsc_status new_comm(dsc_engine *e, const ft_group *g, const ft_plan *p, int gen,
                           dsc_comm **out) {
    char tag[32];
    snprintf(tag, sizeof tag, "ft%d", gen);
    dsc_comm_opts co = dsc_comm_opts_default();
    co.backend = dsc_comm_backend(e->comm);
    co.rank = p->rank;
    co.world_size = p->world;
    co.master_addr = g->addr;
    co.master_port = g->port;
    co.timeout_s = e->ft->comm_timeout;
    co.group_tag = tag;
    co.store = g->store;
    DSC_TRY(dsc_comm_create(out, &co));
    // The new rank 0 deletes its rendezvous key from the store before its create returns: the
    // barrier keeps the host's store up until then.
    return dsc_comm_barrier(*out, NULL);
}

// Every old rank's packed state at the boundary into the full flat state of the old layout:
// (nvec, total). At stage 0 this rank's own snapshot is already that.
static dsc_status old_full_state(dsc_engine *e, const ft_plan *p, dsc_comm *nc, float *full) {
    struct dsc__ft *ft = e->ft;
    size_t len = ft->len, n = len * (size_t)ft->nvec;
    if (e->stage == 0) {
        memcpy(full, dsc__ft_own_at(ft, p->b)->buf, n * sizeof(float));
        return DSC_OK;
    }
    float *tmp = malloc(n * sizeof(float));
    if (!tmp) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory rebuilding the state");
    dsc_status st = DSC_OK;
    for (int r = 0; r < e->world && st == DSC_OK; r++) {
        float *buf = tmp;
        if (p->provider[r] == p->rank)
            buf = r == e->rank ? dsc__ft_own_at(ft, p->b)->buf : dsc__ft_rep_at(ft, p->b)->buf;
        st = dsc_comm_broadcast(nc, buf, n, DSC_DT_F32, p->provider[r], NULL);
        for (int k = 0; st == DSC_OK && k < ft->nvec; k++)
            for (int g = 0; g < e->ngroups; g++) {
                const group *gr = &e->groups[g];
                memcpy(full + (size_t)k * e->total + gr->off + (size_t)r * gr->slice,
                       buf + (size_t)k * len + gr->part_off, gr->slice * sizeof(float));
            }
    }
    free(tmp);
    return st;
}

typedef struct old_src {
    const float *full; // (nvec, total) of the old layout
    size_t total;
    const size_t *off; // (nparams) old offsets
} old_src;

static const float *from_old(void *user, int k, int i) {
    const old_src *o = user;
    return o->full + (size_t)k * o->total + o->off[i];
}

// Lay the engine out for the new world and keep this rank's slices of the old full state.
static dsc_status relayout(dsc_engine *e, const ft_plan *p, dsc_comm *nc, const float *full) {
    size_t *off = malloc((size_t)e->nparams * sizeof *off);
    if (!off) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory");
    for (int i = 0; i < e->nparams; i++) off[i] = e->params[i].off;
    old_src src = {full, e->total, off};
    dsc__zero_reset(e);
    e->world = p->world;
    e->rank = p->rank;
    e->comm = nc;
    e->cfg.train_micro_batch_size_per_gpu = p->micro; // unchanged when !split: no more training
    e->cfg.gradient_accumulation_steps = p->gas;
    e->cfg.world_size = p->world;
    dsc_status st = dsc__zero_layout(e);
    if (st == DSC_OK) st = dsc__zero_alloc(e);
    e->init = e->stage == 0 ? e->master : NULL; // as dsc_params_updated left it
    if (st == DSC_OK) dsc__ft_fill_slices(e, from_old, &src);
    free(off);
    return st;
}

// The frozen tensors (LoRA's base: zero/frozen.c) are in no snapshot: they never change. Whole
// on every rank, this rank's copy is the old layout's; partitioned (stage 3), every old rank's
// slices come from whoever holds them (itself, or the buddy's replica), as old_full_state does for
// the state. *out: the whole frozen layout of the old world (NULL: no frozen tensors here).
static dsc_status old_frozen(dsc_engine *e, const ft_plan *p, dsc_comm *nc, float **out) {
    *out = NULL;
    if (!e->nfrozen || e->dev_state) return DSC_OK;
    float *full = malloc((e->frozen_total ? e->frozen_total : 1) * sizeof(float));
    float *tmp = e->frozen_parted ? malloc((e->frozen_part ? e->frozen_part : 1) * sizeof(float))
                                  : NULL;
    if (!full || (e->frozen_parted && !tmp)) {
        free(full);
        free(tmp);
        return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory rebuilding the frozen "
                         "tensors");
    }
    dsc_status st = DSC_OK;
    if (!e->frozen_parted) memcpy(full, e->fdata, e->frozen_total * sizeof(float));
    for (int r = 0; e->frozen_parted && r < e->world && st == DSC_OK; r++) {
        float *buf = tmp;
        if (p->provider[r] == p->rank) buf = r == e->rank ? e->fpart : e->frep;
        if (!buf) {
            st = dsc__fail(DSC_ERR_INTERNAL, "fault tolerance: no replica of rank %d's frozen "
                           "tensors here", r);
            break;
        }
        st = dsc_comm_broadcast(nc, buf, e->frozen_part, DSC_DT_F32, p->provider[r], NULL);
        for (int g = 0; st == DSC_OK && g < e->ngroups; g++) {
            const fgroup *fg = &e->fgroups[g];
            memcpy(full + fg->off + (size_t)r * fg->slice, buf + fg->part_off,
                   fg->slice * sizeof(float));
        }
    }
    free(tmp);
    if (st != DSC_OK) free(full);
    else *out = full;
    return st;
}

// The frozen tensors laid out for the new world (after relayout): whole, or this rank's new
// slices (gathered where persistent, replicated to the new buddy).
static dsc_status new_frozen(dsc_engine *e, const float *full, const size_t *old_off) {
    dsc__frozen_free(e);
    DSC_TRY(dsc__frozen_layout(e));
    DSC_TRY(dsc__frozen_alloc(e, true));
    for (int i = 0; i < e->nfrozen; i++)
        memcpy(e->fdata + e->frozen[i].off, full + old_off[i],
               (size_t)e->frozen[i].numel * sizeof(float));
    return dsc__frozen_ready(e);
}

static dsc_status degrade(dsc_engine *e, const ft_group *g, const ft_plan *p, dsc_comm *nc) {
    struct dsc__ft *ft = e->ft;
    float *frozen = NULL;
    size_t *foff = malloc(((size_t)e->nfrozen + 1) * sizeof *foff);
    if (!foff) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory");
    for (int i = 0; i < e->nfrozen; i++) foff[i] = e->frozen[i].off;
    dsc_status st = old_frozen(e, p, nc, &frozen);
    float *full = st == DSC_OK ? malloc((size_t)ft->nvec * e->total * sizeof(float)) : NULL;
    if (st == DSC_OK && !full)
        st = dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory rebuilding the state");
    if (st == DSC_OK) st = old_full_state(e, p, nc, full); // (nvec, total)
    if (st == DSC_OK) st = relayout(e, p, nc, full);
    free(full);
    if (st == DSC_OK && frozen) st = new_frozen(e, frozen, foff);
    free(frozen);
    free(foff);
    DSC_TRY(st);
    int *orig = calloc((size_t)p->world, sizeof *orig);
    if (!orig) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory");
    for (int k = 0; k < g->n; k++) orig[k] = ft->orig_of[g->ranks[k]];
    free(ft->orig_of);
    ft->orig_of = orig;
    return dsc__ft_slots_alloc(e);
}

// Make the restored state live: scalars, compute copies, fresh snapshots and replicas.
static dsc_status finish_restore(dsc_engine *e, const dsc_state_scalars *sc) {
    e->micro = 0;
    DSC_TRY(dsc__state_scalars_set(e, sc));
    DSC_TRY(dsc__zero_sync_params(e));
    return dsc__ft_state_changed(e);
}

// Steps 2-4: on success the engine holds the state of rep->restored_step on the members;
// *split says whether training can go on (the global batch splits over them).
// *joined: 1 this rank is a member, -1 the members were published without it, 0 no membership.
static dsc_status regroup(dsc_engine *e, const ft_view *v, dsc_ft_report *rep, bool *split,
                          int *joined, char *why_not, size_t cap) {
    struct dsc__ft *ft = e->ft;
    int gen = ft->gen + 1;
    ft_group g = {0};
    ft_plan p = {0};
    dsc_comm *nc = NULL, *old = e->comm;
    dsc_status st = membership(e, gen, &g);
    *joined = g.joined ? 1 : g.left_out ? -1 : 0;
    if (st == DSC_OK) st = make_plan(e, &g, &p);
    if (st == DSC_OK) st = new_comm(e, &g, &p, gen, &nc);
    if (st != DSC_OK) goto done;
    dsc_state_scalars sc = dsc__ft_own_at(ft, p.b)->sc;
    rep->transient = g.n == e->world;
    if (rep->transient) { // same ranks, same layout: each restores its own snapshot
        dsc__ft_unpack(e, dsc__ft_own_at(ft, p.b)->buf);
        for (int k = 0; k < 2; k++) { // states past b belong to the attempt being redone
            if (ft->own[k].tag > p.b) dsc__ft_set_tag(&ft->own[k], -1);
            if (ft->rep[k].tag > p.b) ft->rep[k].tag = -1;
        }
        e->comm = nc;
    } else {
        st = degrade(e, &g, &p, nc);
    }
    if (st == DSC_OK) st = finish_restore(e, &sc);
    if (st != DSC_OK) goto done;
    dsc__ft_set_comm(ft, nc);
    dsc_comm_destroy(old);
    nc = NULL;
    ft->gen = gen;
    rep->restored_step = p.b;
    rep->consistent = true;
    *split = p.split;
    snprintf(why_not, cap, "%s", p.why_not);
done:
    if (nc) { // failed half-way: the engine keeps the old (broken) communicator
        e->comm = old;
        dsc_comm_destroy(nc);
    }
    if (st != DSC_OK) host_linger(e, gen, &g);
    group_free(&g); // the host's store goes: every member is past its rendezvous
    free(p.provider);
    return st;
}

// ---- the entry point ----

// Every other rank of the failed communicator is gone or has left it: the group re-formed
// without this rank (it was stopped or too slow), so it must not ask for a restart of the job.
static bool others_moved_on(dsc_engine *e) {
    bool any = false;
    for (int j = 0; j < e->world; j++) {
        dsc_comm_peer p;
        if (j == e->rank || dsc_comm_peer_info(e->comm, j, &p) != DSC_OK) continue;
        if (p.state != DSC_PEER_LEFT && p.state != DSC_PEER_DEAD) return false;
        any |= p.state == DSC_PEER_LEFT;
    }
    return any;
}

static dsc_status give_up(dsc_ft_report *rep, dsc_ft_action action, dsc_status failure,
                          const char *fmt, const char *a, const char *b) {
    rep->action = action;
    return dsc__fail(failure == DSC_OK ? DSC_ERR_INTERNAL : failure, fmt, a, b);
}

// The policy, once the failed ranks are known: give up (abort, restart) or regroup.
static dsc_status decide(dsc_engine *e, const ft_view *v, dsc_status failure, const char *why,
                         dsc_ft_report *rep) {
    struct dsc__ft *ft = e->ft;
    const char *who = v->nfailed ? v->text : "every rank is alive";
    if (ft->policy == FT_ABORT)
        return give_up(rep, DSC_FT_ABORT, failure, "fault_tolerance.on_failure is abort: %s; %s",
                       who, why);
    if (strcmp(dsc_comm_backend(e->comm), "shm"))
        return give_up(rep, DSC_FT_RESTART, failure,
                       "%s; the mpi backend cannot rebuild a communicator in place (Open MPI 4.1 "
                       "has no ULFM): asking for a restart (%s)", who, why);
    if (!v->nfailed && ft->retried_step == ft->step)
        return give_up(rep, DSC_FT_RESTART, failure,
                       "a second fault in one step with %s (the retry on a fresh communicator "
                       "failed too): asking for a restart (%s)", who, why);
    bool split = false;
    int joined = 0;
    char why_not[256] = "", cause[FT_TEXT], me[16];
    dsc_status st = regroup(e, v, rep, &split, &joined, why_not, sizeof why_not);
    if (st != DSC_OK) {
        snprintf(cause, sizeof cause, "%s", dsc_last_error()); // dsc__fail rewrites that buffer
        snprintf(me, sizeof me, "%d", ft->orig_rank);
        if (joined < 0 || (joined == 0 && others_moved_on(e)))
            return give_up(rep, DSC_FT_ABORT, st, "rank %s: the other ranks continued without "
                           "this rank after it stopped responding; stopping (%s)", me, cause);
        return give_up(rep, DSC_FT_RESTART, st, "%s; falling back to a restart (%s)", cause,
                       who);
    }
    if (ft->policy == FT_RESTART) // the survivors hold a complete state: save it, then exit
        return give_up(rep, DSC_FT_RESTART, failure, "fault_tolerance.on_failure is restart: %s; "
                       "the survivors restored the last complete step (%s)", who, why);
    if (!split)
        return give_up(rep, DSC_FT_RESTART, failure, "%s; falling back to a restart (%s)", why_not,
                       who);
    rep->action = DSC_FT_CONTINUE;
    return DSC_OK;
}

dsc_status dsc__ft_recover(dsc_engine *e, dsc_status failure, dsc_ft_report *rep) {
    struct dsc__ft *ft = e->ft;
    double t0 = dsc_now();
    *rep = (dsc_ft_report){.action = DSC_FT_ABORT, .old_world = e->world, .world = e->world,
                           .generation = ft ? ft->gen : 0, .restored_step = -1};
    char why[FT_TEXT];
    snprintf(why, sizeof why, "%s", dsc_last_error());
    if (failure == DSC_OK) return DSC_OK;
    if (!ft) return dsc__fail(failure, "%s", why); // one rank: nothing to recover
    dsc_status broken = DSC_OK;
    dsc_comm_is_broken(e->comm, &broken, NULL);
    if (failure == DSC_ERR_ABORTED || broken == DSC_ERR_ABORTED) // a rank stopped on its own error
        return dsc__fail(DSC_ERR_ABORTED, "%s", why);
    // A device communicator's failure (nccl, beside this host one) is a fault of the ranks too.
    bool timeout = failure == DSC_ERR_TIMEOUT || failure == DSC_ERR_PEER || failure == DSC_ERR_NCCL;
    if (!dsc_comm_is_broken(e->comm, NULL, NULL) && !timeout) // not a communication fault
        return dsc__fail(failure, "%s", why);
    dsc_comm_abort(e->comm, failure, why); // tell the peers, if nobody has yet
    pthread_mutex_lock(&ft->mu);
    ft->armed = false;
    if (!ft->fired) atomic_fetch_add(&ft->events, 1); // a deadline that fired counted itself
    ft->fired = false;
    pthread_mutex_unlock(&ft->mu);
    dsc__zero_abandon_step(e);
    ft->pending = NULL; // a device's copy reserved for a step that will not be published
    dsc__ft_ring_drain(e);
    dsc__ft_rep_freeze(ft);
    ft_view v = {.failed = calloc((size_t)e->world, 1)};
    if (!v.failed) return dsc__fail(DSC_ERR_OOM, "fault tolerance: out of memory");
    classify(e, &v);
    DSC_WARN("ft", "rank %d: fault in step %lld (%s, %.3f s into the step): %s%s%s",
             ft->orig_rank, (long long)ft->step, atomic_load(&ft->phase), t0 - ft->step_t0, why,
             v.nfailed ? "; " : "", v.text);
    dsc_status st = decide(e, &v, failure, why, rep);
    free(v.failed);
    rep->world = e->world;
    rep->generation = ft->gen;
    rep->resume_step = rep->restored_step >= 0 ? rep->restored_step + 1 : -1;
    rep->seconds = dsc_now() - t0;
    if (st != DSC_OK) return st;
    if (rep->transient) ft->retried_step = ft->step;
    DSC_WARN("ft", "rank %d: resumed at step %lld from the state after step %lld on %d rank%s "
             "(was %d; %s; micro batch %lld, gradient accumulation %lld, generation %d) in %.3f "
             "s, unix time %.3f", ft->orig_rank, (long long)rep->resume_step,
             (long long)rep->restored_step, rep->world, rep->world == 1 ? "" : "s", rep->old_world,
             rep->transient ? "transient fault: retry on a fresh communicator" : "degraded",
             (long long)e->cfg.train_micro_batch_size_per_gpu,
             (long long)e->cfg.gradient_accumulation_steps, ft->gen, rep->seconds, dsc_wall_time());
    return DSC_OK;
}
