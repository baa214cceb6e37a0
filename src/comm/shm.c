// comm/shm.c - shared-memory backend: segment and rendezvous, waiting (spin, then futex) with
// deadlines and liveness checks, and the per-communicator progress thread. The collective
// algorithms live in comm/shm_coll.c, send/recv in comm/shm_p2p.c.
#define _GNU_SOURCE // syscall, getrandom
#include "comm/shm.h"

#include <dirent.h>      // opendir, readdir
#include <errno.h>       // errno
#include <fcntl.h>       // O_*, posix_fallocate
#include <linux/futex.h> // FUTEX_WAIT, FUTEX_WAKE
#include <pthread.h>     // pthread_*
#include <sched.h>       // sched_yield
#include <signal.h>      // kill
#include <stdio.h>       // snprintf
#include <stdlib.h>      // calloc, free, getenv, strtoull
#include <string.h>      // memcpy, strerror
#include <sys/mman.h>    // shm_open, shm_unlink, mmap
#include <sys/random.h>  // getrandom
#include <sys/stat.h>    // fstat, stat
#include <sys/syscall.h> // SYS_futex
#include <time.h>        // nanosleep, time
#include <unistd.h>      // getpid, close, gethostname

#include "base/env.h"        // dsc__env, DSC_ENV_*
#include "base/log.h"        // DSC_INFO, DSC_WARN
#include "base/status.h"     // dsc__fail
#include "base/time.h"       // dsc_now
#include "comm/shm_impl.h"   // shm, shm_ctrl, layout, waiting helpers
#include "comm/store.h"      // dsc_store_*

#define SPIN_S 50e-6            // spin this long before sleeping on the doorbell
#define PAUSE_S 2e-6            // of which the first part with pause only, then yielding the
                                // core (other ranks may share it) between checks
#define NAP_S 0.010             // longest sleep inside an operation: deadlines, deaths and aborts
                                // are noticed within it
#define IDLE_NAP_S 0.100        // longest sleep of an idle progress thread (heartbeat period)
#define LIVENESS_PERIOD_S 0.020 // how often a waiter checks its peers' processes
#define HEARTBEAT_DEAD_S 5.0    // a peer in another pid namespace is dead after this silence
#define SHM_MAX_WORLD 256       // beyond this the per-pair rings and slots outgrow /dev/shm
#define STALE_AFTER_S 60        // a leftover segment of a dead creator is removed after this

// ---- futex and small helpers ----

static void futex_wait(_Atomic uint32_t *w, uint32_t v, double s, bool shared) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    syscall(SYS_futex, w, shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, v, &ts, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w, bool shared) {
    syscall(SYS_futex, w, shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// One step of a spin that began at t0: a few pauses at first, then give the core to any other
// runnable thread (ranks may outnumber cores). False once the spin budget is spent.
static bool spin_step(double t0) {
    double t = dsc_now() - t0;
    if (t >= SPIN_S) return false;
    if (t < PAUSE_S)
        for (int i = 0; i < 16; i++) cpu_relax();
    else
        sched_yield();
    return true;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// ---- doorbells ----

void shm__ring(shm *s, int j) {
    shm_ctrl *c = &s->ctrl[j];
    if (atomic_load(&c->sleeping)) {
        atomic_fetch_add(&c->bell, 1);
        futex_wake(&c->bell, true);
    }
}

// New work for this rank's progress thread, wherever it sleeps.
void shm__wake_progress(shm *s) {
    atomic_fetch_add(&s->qbell, 1);
    if (atomic_load(&s->qsleeping)) futex_wake(&s->qbell, false);
    shm__ring(s, s->rank); // it naps on the shared bell while it has sends/recvs in flight
}

static void ring_others(shm *s) {
    for (int j = 0; j < s->world; j++)
        if (j != s->rank) shm__ring(s, j);
}

// seq_cst store then loads of the peers' sleeping flags: a peer either sees the new value in its
// check before sleeping, or its flag is seen here and it is woken.
void shm__publish(shm *s, int field, uint64_t v) {
    atomic_fetch_add_explicit(&s->ctrl[s->rank].heartbeat, 1, memory_order_relaxed);
    atomic_store(shm__counter(s, s->rank, field), v);
    ring_others(s);
}

// ---- processes: liveness ----

// Fields of /proc/<pid>/stat: state (3rd) and start time (22nd). 1 alive, 0 gone, -1 unknown.
static int proc_stat(int pid, char *state, uint64_t *start) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? 0 : -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return n == 0 ? 0 : -1;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); // the command name may hold spaces and parentheses
    if (!p || p[1] != ' ') return -1;
    *state = p[2];
    p += 3;
    for (int field = 4; field <= 22 && *p; field++) {
        while (*p == ' ') p++;
        if (field == 22) *start = strtoull(p, NULL, 10);
        while (*p && *p != ' ') p++;
    }
    return 1;
}

static uint64_t self_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

// Seconds since this process last saw rank j's heartbeat change (0 for this rank).
static double heartbeat_age(shm *s, int j) {
    if (j == s->rank) return 0;
    uint64_t hb = atomic_load(&s->ctrl[j].heartbeat);
    double now = dsc_now();
    pthread_mutex_lock(&s->hb_mu);
    if (hb != s->hb_seen[j]) {
        s->hb_seen[j] = hb;
        s->hb_time[j] = now;
    }
    double age = now - s->hb_time[j];
    pthread_mutex_unlock(&s->hb_mu);
    return age;
}

void shm__observe_heartbeats(shm *s) {
    for (int j = 0; j < s->world; j++) heartbeat_age(s, j);
}

// Process state of rank j from /proc when it shares our pid namespace: 1 alive (*state set), 0
// gone (exited, zombie, or the pid now belongs to a newer process), -1 cannot tell.
static int peer_proc(shm *s, int j, char *state) {
    shm_ctrl *c = &s->ctrl[j];
    int pid = atomic_load(&c->pid);
    *state = '?';
    if (pid <= 0 || !s->pidns || c->pidns != s->pidns) return -1;
    uint64_t start = 0;
    int r = proc_stat(pid, state, &start);
    if (r == 0) return 0;
    bool same = !c->pid_start || start == c->pid_start; // not a newer process with that pid
    if (r > 0) return *state != 'Z' && *state != 'X' && *state != 'x' && same;
    return kill(pid, 0) < 0 && errno == ESRCH ? 0 : -1;
}

bool shm__peer_alive(shm *s, int j) {
    if (atomic_load(&s->ctrl[j].pid) <= 0) return true; // not attached yet: cannot tell
    char state;
    int r = peer_proc(s, j, &state);
    if (r >= 0) return r == 1;
    if (s->pidns && s->ctrl[j].pidns == s->pidns) return true; // /proc unreadable: assume alive
    return heartbeat_age(s, j) < HEARTBEAT_DEAD_S; // another pid namespace: trust the heartbeat
}

// ---- failure ----

// This rank failed an operation: break the communicator here and tell the peers, who fail their
// own pending operations with the same code.
void shm__fail_comm(shm *s, dsc_status st, const char *msg) {
    dsc__comm_break(s->comm, st, msg);
    int expect = 0;
    if (atomic_compare_exchange_strong(&s->hdr->abort_claim, &expect, 1)) {
        s->hdr->abort_code = (int32_t)st;
        snprintf(s->hdr->abort_msg, sizeof s->hdr->abort_msg, "%s", msg);
        atomic_store(&s->hdr->abort_rank, s->rank);
    }
    ring_others(s);
}

// DSC_OK, or the error that ends the operation in progress (destroyed, broken by a peer).
dsc_status shm__check_abort(shm *s, const char *what, char *msg) {
    if (atomic_load(&s->stop)) {
        dsc__comm_msg(msg,
                 "rank %d: %s: the communicator was destroyed while the operation was in flight",
                 s->rank, what);
        return DSC_ERR_INVALID_ARG;
    }
    int ar = atomic_load(&s->hdr->abort_rank);
    if (ar >= 0 && ar != s->rank) {
        dsc__comm_msg(msg, "rank %d: %s: rank %d broke the communicator: %s",
                 s->rank, what, ar, s->hdr->abort_msg);
        return (dsc_status)s->hdr->abort_code;
    }
    dsc_status bst;
    const char *bmsg;
    if (dsc__comm_broken(s->comm, &bst, &bmsg)) { // e.g. a send/recv failed meanwhile
        dsc__comm_msg(msg, "rank %d: %s: the communicator is broken (%s)", s->rank,
                 what, bmsg);
        return bst;
    }
    return DSC_OK;
}

// DSC_ERR_PEER when rank j left or died; `what` names the operation.
dsc_status shm__check_peer(shm *s, int j, const char *what, char *msg) {
    // A rank that aborted before it left or died gave its reason: that is the failure to report
    dsc_status st = shm__check_abort(s, what, msg);
    if (st != DSC_OK) return st;
    if (atomic_load(&s->ctrl[j].left)) {
        dsc__comm_msg(msg,
                 "rank %d: rank %d left (destroyed its communicator) during %s", s->rank, j, what);
        return DSC_ERR_PEER;
    }
    if (!shm__peer_alive(s, j)) {
        dsc__comm_msg(msg, "rank %d: rank %d (pid %d) died during %s", s->rank, j,
                 (int)atomic_load(&s->ctrl[j].pid), what);
        return DSC_ERR_PEER;
    }
    return DSC_OK;
}

// ---- waiting for peers' counters ----

static bool ready(shm *s, int field, uint64_t target, int only) {
    if (only >= 0) return atomic_load(shm__counter(s, only, field)) >= target;
    for (int j = 0; j < s->world; j++)
        if (j != s->rank && atomic_load(shm__counter(s, j, field)) < target) return false;
    return true;
}

// "2, 3" (the ranks whose counter is below target) into buf.
static void laggards(shm *s, int field, uint64_t target, int only, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = '\0';
    for (int j = 0; j < s->world && n + 16 < len; j++) {
        if (j == s->rank || (only >= 0 && j != only)) continue;
        if (atomic_load(shm__counter(s, j, field)) < target)
            n += (size_t)snprintf(buf + n, len - n, "%s%d", n ? ", " : "", j);
    }
}

// Everything a waiter does when spinning did not suffice: run other work, then look for reasons
// to stop (abort, dead peer, deadline).
static dsc_status slow_checks(shm *s, shm_wait_ctx *w, int field, uint64_t target, int only) {
    shm__drain_queue(s);
    shm__p2p_progress(s);
    dsc_status st = shm__check_abort(s, w->what, w->msg);
    if (st != DSC_OK) return st;
    double now = dsc_now();
    if (now >= s->next_liveness) {
        s->next_liveness = now + LIVENESS_PERIOD_S;
        atomic_fetch_add(&s->ctrl[s->rank].heartbeat, 1);
        shm__observe_heartbeats(s);
        for (int j = 0; j < s->world; j++) {
            if (j == s->rank || (only >= 0 && j != only)) continue;
            if (atomic_load(shm__counter(s, j, field)) >= target) continue;
            st = shm__check_peer(s, j, w->what, w->msg);
            if (st != DSC_OK) return st;
        }
    }
    if (now < w->deadline) return DSC_OK;
    char who[256];
    laggards(s, field, target, only, who, sizeof who);
    dsc__comm_msg(w->msg,
             "rank %d: %s: ranks %s had not arrived after %.1f s (comm_timeout_s %.1f); a rank "
             "is stuck or skipped this collective",
             s->rank, w->what, who, now - w->t_op, s->timeout);
    return DSC_ERR_TIMEOUT;
}

// Sleep on this rank's doorbell unless the condition or other work is already there.
static void nap(shm *s, int field, uint64_t target, int only, double left) {
    shm_ctrl *me = &s->ctrl[s->rank];
    atomic_fetch_add(&me->sleeping, 1);
    uint32_t v = atomic_load(&me->bell);
    if (!ready(s, field, target, only) && !atomic_load(&s->qcount) && !atomic_load(&s->stop) &&
        atomic_load(&s->hdr->abort_rank) < 0)
        futex_wait(&me->bell, v, left < NAP_S ? (left > 0 ? left : 1e-4) : NAP_S, true);
    atomic_fetch_sub(&me->sleeping, 1);
}

dsc_status shm__wait(shm *s, shm_wait_ctx *w, int field, uint64_t target, int only) {
    if (ready(s, field, target, only)) return DSC_OK;
    double t0 = dsc_now();
    w->deadline = t0 + s->timeout; // the deadline counts from the last progress
    while (spin_step(t0))
        if (ready(s, field, target, only)) return DSC_OK;
    for (;;) {
        if (ready(s, field, target, only)) return DSC_OK;
        dsc_status st = slow_checks(s, w, field, target, only);
        if (st != DSC_OK) return st;
        if (ready(s, field, target, only)) return DSC_OK;
        nap(s, field, target, only, w->deadline - dsc_now());
    }
}

// ---- requests ----

void shm__finish(shm *s, dsc_comm_req *r, dsc_status st, const char *msg) {
    dsc__req_finish(r, st, st == DSC_OK ? NULL : msg);
    atomic_fetch_add(&s->completions, 1);
    if (atomic_load(&s->cwaiters)) futex_wake(&s->completions, false);
}

static bool is_p2p(const dsc_comm_req *r) {
    return r->op.kind == DSC__OP_SEND || r->op.kind == DSC__OP_RECV;
}

// Move submitted requests to the progress thread's own lists.
void shm__drain_queue(shm *s) {
    if (!atomic_load(&s->qcount)) return;
    pthread_mutex_lock(&s->qmu);
    dsc_comm_req *r = s->qhead;
    s->qhead = s->qtail = NULL;
    atomic_store(&s->qcount, 0);
    pthread_mutex_unlock(&s->qmu);
    while (r) {
        dsc_comm_req *next = r->next;
        r->next = NULL;
        if (is_p2p(r)) {
            shm__p2p_start(s, r);
        } else {
            if (s->ctail) s->ctail->next = r;
            else s->chead = r;
            s->ctail = r;
        }
        r = next;
    }
}

// Run one collective to completion and finish it (exec_mu held).
static void run_collective(shm *s, dsc_comm_req *r) {
    char what[128], msg[DSC__COMM_MSG_MAX];
    dsc__op_describe(&r->op, what, sizeof what);
    dsc_status st = shm__check_abort(s, what, msg);
    if (st == DSC_OK) {
        r->t_start = dsc_now();
        shm_wait_ctx w = {.what = what, .msg = msg, .t_op = r->t_start};
        st = shm__collective(s, r, &w);
        if (st != DSC_OK) shm__fail_comm(s, st, msg);
    } else {
        dsc__comm_break(s->comm, st, msg); // a peer broke it: broken here too, for every caller
    }
    shm__finish(s, r, st, msg);
}

// Fail everything still queued or active (the communicator is being destroyed).
static void fail_all(shm *s) {
    shm__drain_queue(s);
    char msg[DSC__COMM_MSG_MAX];
    for (dsc_comm_req *r = s->chead, *next; r; r = next) {
        next = r->next;
        char what[128];
        dsc__op_describe(&r->op, what, sizeof what);
        dsc__comm_msg(msg, "rank %d: %s: the communicator was destroyed before it ran",
                 s->rank, what);
        shm__finish(s, r, DSC_ERR_INVALID_ARG, msg);
    }
    s->chead = s->ctail = NULL;
    shm__p2p_fail_all(s, DSC_ERR_INVALID_ARG, "the communicator was destroyed");
}

// Idle: nothing to run. With sends/recvs in flight, sleep on the shared doorbell (peers ring it
// when they move a ring); otherwise on the private one, which only submissions ring.
static void idle(shm *s) {
    shm_ctrl *me = &s->ctrl[s->rank];
    atomic_fetch_add(&me->heartbeat, 1);
    shm__observe_heartbeats(s); // keeps the peers' heartbeat ages current (dsc_comm_peer_info)
    pthread_mutex_lock(&s->exec_mu);
    bool shared = s->np2p > 0;
    pthread_mutex_unlock(&s->exec_mu);
    _Atomic uint32_t *bell = shared ? &me->bell : &s->qbell;
    _Atomic uint32_t *sleeping = shared ? &me->sleeping : &s->qsleeping;
    atomic_fetch_add(sleeping, 1);
    uint32_t v = atomic_load(bell);
    pthread_mutex_lock(&s->exec_mu);
    bool busy = atomic_load(&s->qcount) || atomic_load(&s->stop) || s->chead ||
                shm__p2p_progress(s) || (s->np2p > 0) != shared;
    pthread_mutex_unlock(&s->exec_mu);
    if (!busy) futex_wait(bell, v, shared ? NAP_S : IDLE_NAP_S, shared);
    atomic_fetch_sub(sleeping, 1);
}

// One round of work (exec_mu held); false when there was nothing to do.
static bool progress_once(shm *s) {
    shm__drain_queue(s);
    if (s->chead) {
        dsc_comm_req *r = s->chead;
        s->chead = r->next;
        if (!s->chead) s->ctail = NULL;
        r->next = NULL;
        run_collective(s, r);
        return true;
    }
    return shm__p2p_progress(s);
}

static void *progress_main(void *arg) {
    shm *s = arg;
    while (!atomic_load(&s->stop)) {
        pthread_mutex_lock(&s->exec_mu);
        bool busy = progress_once(s);
        pthread_mutex_unlock(&s->exec_mu);
        if (!busy) idle(s);
    }
    pthread_mutex_lock(&s->exec_mu);
    fail_all(s);
    pthread_mutex_unlock(&s->exec_mu);
    return NULL;
}

// A blocking collective with nothing queued before it runs on the caller's thread: no handoff
// to the progress thread and back, which dominates the latency of small operations.
static bool run_inline(shm *s, dsc_comm_req *r) {
    if (!r->blocking || is_p2p(r)) return false;
    pthread_mutex_lock(&s->exec_mu); // waits for the operation the progress thread runs, if any
    pthread_mutex_lock(&s->qmu);
    bool first = !s->qhead && !s->chead;
    pthread_mutex_unlock(&s->qmu);
    if (first) run_collective(s, r);
    bool more = s->chead || atomic_load(&s->qcount) || s->np2p;
    pthread_mutex_unlock(&s->exec_mu);
    if (more) shm__wake_progress(s); // others arrived meanwhile: the progress thread takes over
    return first;
}

// ---- segment ----

static size_t env_bytes(dsc__env_id id, size_t dflt, size_t lo, size_t hi) {
    const char *v = dsc__env(id), *name = dsc__env_row_of(id)->name;
    if (!v || !*v) return dflt;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v || *end || x < lo || x > hi) {
        DSC_WARN("comm", "%s=%s is not a byte count in %zu..%zu; using %zu", name, v, lo, hi,
                 dflt);
        return dflt;
    }
    return (size_t)x;
}

static layout layout_of(int world, size_t slot, size_t chan_bytes) {
    layout L;
    size_t off = round_up(sizeof(shm_header), 4096);
    L.ctrl = off;
    off += round_up((size_t)world * sizeof(shm_ctrl), 4096);
    L.slots = off;
    off += (size_t)world * 2 * slot;
    L.results = off;
    off += 2 * slot;
    L.chan_stride = sizeof(shm_chan) + chan_bytes;
    L.chans = off;
    off += (size_t)world * (size_t)(world - 1) * L.chan_stride;
    L.total = round_up(off, 4096);
    return L;
}

static void set_layout(shm *s, size_t slot, size_t chan_bytes) {
    s->slot_bytes = slot;
    s->chan_bytes = chan_bytes;
    s->L = layout_of(s->world, slot, chan_bytes);
}

// hostname + boot id: equal only for processes of one running kernel (one node).
static void host_id(char *buf, size_t len) {
    char host[128] = "?", boot[64] = "?";
    gethostname(host, sizeof host - 1);
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, boot, sizeof boot - 1);
        boot[n > 0 ? n : 0] = '\0';
        close(fd);
        char *nl = strchr(boot, '\n');
        if (nl) *nl = '\0';
    }
    snprintf(buf, len, "%s/%s", host, boot);
}

static dsc_status map_fd(shm *s, int fd) {
    void *p = mmap(NULL, s->L.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return dsc__fail(DSC_ERR_SYSTEM, "shm: mmap of %zu bytes: %s", s->L.total, strerror(errno));
    s->base = p;
    s->hdr = p;
    s->ctrl = (shm_ctrl *)(s->base + s->L.ctrl);
    return DSC_OK;
}

static void segment_name(shm *s, const char *tag, int port) {
    uint64_t token = 0;
    if (getrandom(&token, sizeof token, 0) != (ssize_t)sizeof token)
        token = (uint64_t)dsc_now_ns() ^ ((uint64_t)getpid() << 32);
    char clean[33];
    size_t n = 0;
    for (const char *p = tag; *p && n < sizeof clean - 1; p++) {
        char ch = *p;
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        clean[n++] = ok || ch == '_' ? ch : '_';
    }
    clean[n] = '\0';
    snprintf(s->name, sizeof s->name, "/" DSC_SHM_NAME_PREFIX "%d-%s-%d-%016llx", port, clean,
             (int)getpid(), (unsigned long long)token);
}

// A segment name still present long after its creator died was left by a crash during a
// rendezvous (afterwards names are unlinked at once): remove it.
static void sweep_stale(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return;
    size_t plen = strlen(DSC_SHM_NAME_PREFIX);
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, DSC_SHM_NAME_PREFIX, plen)) continue;
        // dsc-<port>-<tag>-<pid>-<token>: the pid is the second field from the end
        char *last = strrchr(e->d_name, '-');
        if (!last || last == e->d_name) continue;
        char *p = last - 1;
        while (p > e->d_name && *p != '-') p--;
        long pid = strtol(p + 1, NULL, 10);
        char path[300];
        struct stat st;
        snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
        if (pid <= 0 || stat(path, &st) < 0 || now - st.st_mtime < STALE_AFTER_S) continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char name[300];
        snprintf(name, sizeof name, "/%s", e->d_name);
        if (shm_unlink(name) == 0) DSC_INFO("comm", "removed stale segment %s", name);
    }
    closedir(d);
}

// Rank 0: create, size (reserving the memory, so that a full /dev/shm fails here and not with
// SIGBUS later) and initialise the segment.
static dsc_status segment_create(shm *s, const char *tag, int port) {
    size_t slot = env_bytes(DSC_ENV_SHM_SLOT_BYTES, s->world > 16 ? 256u << 10 : 1u << 20, 4096,
                            1u << 30);
    size_t pairs = (size_t)s->world * (size_t)(s->world - 1);
    size_t chan_dflt = pairs ? (32u << 20) / pairs : 4096; // about 32 MiB of rings in all
    chan_dflt = chan_dflt < 1024 ? 1024 : chan_dflt > (1u << 20) ? 1u << 20 : chan_dflt;
    size_t chan_bytes = env_bytes(DSC_ENV_SHM_CHAN_BYTES, chan_dflt, 64, 1u << 30);
    if (slot < (size_t)s->world * 256) slot = (size_t)s->world * 256; // >= 64 f32 per rank
    set_layout(s, round_up(slot, 64), round_up(chan_bytes, 64));
    sweep_stale();
    segment_name(s, tag, port);
    int fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0)
        return dsc__fail(DSC_ERR_SYSTEM, "shm: cannot create segment %s: %s", s->name,
                         strerror(errno));
    s->linked = true;
    int e = posix_fallocate(fd, 0, (off_t)s->L.total);
    if (e) {
        close(fd);
        return dsc__fail(DSC_ERR_SYSTEM,
                         "shm: cannot reserve %zu MiB in /dev/shm for %d ranks: %s; enlarge "
                         "/dev/shm (docker --shm-size) or lower DSC_SHM_SLOT_BYTES",
                         s->L.total >> 20, s->world, strerror(e));
    }
    DSC_TRY(map_fd(s, fd));
    shm_header *h = s->hdr;
    h->version = SHM_VERSION;
    h->world = (uint32_t)s->world;
    h->slot_bytes = s->slot_bytes;
    h->chan_bytes = s->chan_bytes;
    h->total_bytes = s->L.total;
    atomic_store(&h->abort_rank, -1);
    atomic_store(&h->magic, SHM_MAGIC); // last: the segment is valid from here on
    return DSC_OK;
}

static dsc_status segment_open(shm *s, const char *name) {
    snprintf(s->name, sizeof s->name, "%s", name);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0)
        return dsc__fail(errno == ENOENT ? DSC_ERR_PEER : DSC_ERR_SYSTEM,
                         "shm: rank %d cannot open segment %s published by rank 0: %s%s", s->rank,
                         name, strerror(errno),
                         errno == ENOENT ? " (rank 0 gave up waiting, or is on another node)" : "");
    struct stat st;
    if (fstat(fd, &st) < 0 || (size_t)st.st_size < sizeof(shm_header)) {
        close(fd);
        return dsc__fail(DSC_ERR_CORRUPT, "shm: segment %s is truncated", name);
    }
    shm_header h;
    if (pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h || h.magic != SHM_MAGIC ||
        h.version != SHM_VERSION || h.world != (uint32_t)s->world ||
        h.total_bytes != (uint64_t)st.st_size) {
        close(fd);
        return dsc__fail(DSC_ERR_CONFIG,
                         "shm: segment %s does not match: it is for %u ranks (version %u), this "
                         "rank expects %d; do all ranks agree on WORLD_SIZE and run the same dsc?",
                         name, h.world, h.version, s->world);
    }
    set_layout(s, h.slot_bytes, h.chan_bytes);
    return map_fd(s, fd);
}

static void attach(shm *s) {
    shm_ctrl *me = &s->ctrl[s->rank];
    char state;
    uint64_t start = 0;
    proc_stat(getpid(), &state, &start);
    me->pid_start = start;
    me->pidns = s->pidns;
    atomic_store(&me->heartbeat, 1);
    atomic_store(&me->pid, (int32_t)getpid());
    if (atomic_fetch_add(&s->hdr->attached, 1) + 1 == s->world) { // the last one hides the name
        shm_unlink(s->name);
        s->linked = false;
    }
}

static dsc_status wait_attached(shm *s) {
    double deadline = dsc_now() + s->timeout, pause = 1e-4;
    while (atomic_load(&s->hdr->attached) < s->world) {
        if (dsc_now() > deadline) {
            char who[256];
            size_t n = 0;
            who[0] = '\0';
            for (int j = 0; j < s->world && n + 16 < sizeof who; j++)
                if (!atomic_load(&s->ctrl[j].pid))
                    n += (size_t)snprintf(who + n, sizeof who - n, "%s%d", n ? ", " : "", j);
            return dsc__fail(DSC_ERR_TIMEOUT,
                             "shm: ranks %s had not joined after %.1f s (comm_timeout_s); are "
                             "all ranks started with the same WORLD_SIZE and MASTER_PORT?",
                             who, s->timeout);
        }
        sleep_s(pause);
        pause = pause < 0.01 ? pause * 2 : 0.01;
    }
    return DSC_OK;
}

// ---- rendezvous ----

// Rank 0 creates the segment and publishes "name host-id"; the others open it.
static dsc_status rendezvous(shm *s, dsc_store *store, const char *tag, int port) {
    char key[256], me_host[256], val[512];
    snprintf(key, sizeof key, "dsc/comm/%s/shm", tag);
    host_id(me_host, sizeof me_host);
    if (s->rank == 0) {
        DSC_TRY(segment_create(s, tag, port));
        int n = snprintf(val, sizeof val, "%s %s", s->name, me_host);
        DSC_TRY(dsc_store_set(store, key, val, (size_t)n));
    } else {
        void *v = NULL;
        size_t len = 0;
        DSC_TRY(dsc_store_get(store, key, &v, &len));
        char name[128] = "", host[256] = "";
        int got = sscanf(v, "%127s %255s", name, host);
        free(v);
        if (got != 2) return dsc__fail(DSC_ERR_CORRUPT, "shm: store key %s is malformed", key);
        if (strcmp(host, me_host))
            return dsc__fail(DSC_ERR_UNSUPPORTED,
                             "shm: rank %d runs on %s but rank 0 on %s; the shm backend joins "
                             "ranks of one node only: use backend \"mpi\"",
                             s->rank, me_host, host);
        DSC_TRY(segment_open(s, name));
    }
    attach(s);
    DSC_TRY(wait_attached(s));
    if (s->rank == 0) {
        if (s->linked) shm_unlink(s->name); // in case the last one to attach died right then
        s->linked = false;
        bool existed;
        dsc_store_delete(store, key, &existed); // a later communicator must not find this name
    }
    return DSC_OK;
}

// ---- backend entry points ----

static void shm_free(shm *s) {
    if (s->thread_started) {
        atomic_store(&s->stop, 1);
        shm__wake_progress(s);
        pthread_join(s->thread, NULL);
    }
    if (s->linked) shm_unlink(s->name);
    if (s->base) munmap(s->base, s->L.total);
    pthread_mutex_destroy(&s->qmu);
    pthread_mutex_destroy(&s->exec_mu);
    pthread_mutex_destroy(&s->hb_mu);
    free(s->sendq);
    free(s->recvq);
    free(s->srcs);
    free(s->hb_seen);
    free(s->hb_time);
    free(s);
}

static dsc_status resolve(const dsc_comm_opts *o, int *rank, int *world, char *addr, size_t alen,
                          int *port) {
    dsc_comm_env_info env;
    bool need_env = o->rank < 0 || o->world_size < 0 || !o->master_addr || o->master_port <= 0;
    if (need_env) DSC_TRY(dsc_comm_env(&env));
    *rank = o->rank >= 0 ? o->rank : env.rank;
    *world = o->world_size >= 0 ? o->world_size : env.world_size;
    snprintf(addr, alen, "%s", o->master_addr ? o->master_addr : env.master_addr);
    *port = o->master_port > 0 ? o->master_port : env.master_port;
    if (*world < 1 || *rank < 0 || *rank >= *world)
        return dsc__fail(DSC_ERR_INVALID_ARG, "shm: rank %d of world %d is impossible", *rank,
                         *world);
    if (*world > SHM_MAX_WORLD)
        return dsc__fail(DSC_ERR_UNSUPPORTED,
                         "shm: %d ranks is more than the %d one node's segment serves; use the "
                         "mpi backend",
                         *world, SHM_MAX_WORLD);
    if (*port > 65535)
        return dsc__fail(DSC_ERR_INVALID_ARG, "shm: master port %d is out of range", *port);
    return DSC_OK;
}

static dsc_status shm_alloc(shm **out, dsc_comm *c, int rank, int world, double timeout) {
    shm *s = calloc(1, sizeof *s);
    if (!s) return dsc__fail(DSC_ERR_OOM, "shm: out of memory");
    s->comm = c;
    s->rank = rank;
    s->world = world;
    s->timeout = timeout;
    s->pidns = self_pidns();
    pthread_mutex_init(&s->qmu, NULL);
    pthread_mutex_init(&s->exec_mu, NULL);
    pthread_mutex_init(&s->hb_mu, NULL);
    s->sendq = calloc((size_t)world, sizeof *s->sendq);
    s->recvq = calloc((size_t)world, sizeof *s->recvq);
    s->srcs = calloc((size_t)world, sizeof *s->srcs);
    s->hb_seen = calloc((size_t)world, sizeof *s->hb_seen);
    s->hb_time = calloc((size_t)world, sizeof *s->hb_time);
    *out = s;
    if (!s->sendq || !s->recvq || !s->srcs || !s->hb_seen || !s->hb_time)
        return dsc__fail(DSC_ERR_OOM, "shm: out of memory");
    for (int j = 0; j < world; j++) s->hb_time[j] = dsc_now();
    return DSC_OK;
}

static dsc_status shm_create(dsc_comm *c, const dsc_comm_opts *o, int *rank_out, int *size_out,
                             void **impl) {
    int rank, world, port;
    char addr[256];
    DSC_TRY(resolve(o, &rank, &world, addr, sizeof addr, &port));
    shm *s = NULL;
    dsc_store *store = o->store;
    dsc_status st = shm_alloc(&s, c, rank, world, o->timeout_s);
    const char *tag = o->group_tag && *o->group_tag ? o->group_tag : "default";
    if (st == DSC_OK && world > 1 && !store)
        st = dsc_store_create(&store, addr, port, rank == 0, o->timeout_s);
    if (st == DSC_OK && world > 1) st = rendezvous(s, store, tag, port);
    if (store && store != o->store) dsc_store_destroy(store); // only needed to rendezvous
    if (st == DSC_OK && world > 1) {
        if (pthread_create(&s->thread, NULL, progress_main, s) == 0) s->thread_started = true;
        else st = dsc__fail(DSC_ERR_SYSTEM, "shm: cannot start the progress thread");
    }
    if (st != DSC_OK) {
        dsc__error_prefix("rank %d of %d: ", rank, world);
        if (s) shm_free(s);
        return st;
    }
    *rank_out = rank;
    *size_out = world;
    *impl = s;
    return DSC_OK;
}

static void shm_destroy(void *impl) {
    shm *s = impl;
    if (s->base) {
        atomic_store(&s->ctrl[s->rank].left, 1);
        ring_others(s);
    }
    shm_free(s);
}

// One rank: every collective is a copy (or nothing), done at once.
static void run_alone(dsc_comm_req *r) {
    dsc__comm_op *op = &r->op;
    size_t bytes = op->count * dsc_dtype_size(op->dt);
    bool copies = op->kind == DSC__OP_ALL_REDUCE || op->kind == DSC__OP_REDUCE_SCATTER ||
                  op->kind == DSC__OP_ALL_GATHER || op->kind == DSC__OP_REDUCE;
    if (copies && op->recv != op->send) memmove(op->recv, op->send, bytes);
    dsc__req_finish(r, DSC_OK, NULL);
}

static dsc_status shm_submit(void *impl, dsc_comm_req *r) {
    shm *s = impl;
    if (s->world == 1) {
        run_alone(r);
        return DSC_OK;
    }
    if (run_inline(s, r)) return DSC_OK;
    r->next = NULL;
    pthread_mutex_lock(&s->qmu);
    if (s->qtail) s->qtail->next = r;
    else s->qhead = r;
    s->qtail = r;
    atomic_fetch_add(&s->qcount, 1);
    pthread_mutex_unlock(&s->qmu);
    shm__wake_progress(s);
    return DSC_OK;
}

static bool shm_test(void *impl, dsc_comm_req *r) { return atomic_load(&r->done) != 0; }

// Spin briefly, then sleep on the completion counter (the progress thread enforces deadlines).
static void shm_wait(void *impl, dsc_comm_req *r) {
    shm *s = impl;
    double t0 = dsc_now();
    while (!atomic_load(&r->done) && spin_step(t0)) {
    }
    while (!atomic_load(&r->done)) {
        atomic_fetch_add(&s->cwaiters, 1);
        uint32_t v = atomic_load(&s->completions);
        if (!atomic_load(&r->done)) futex_wait(&s->completions, v, IDLE_NAP_S, false);
        atomic_fetch_sub(&s->cwaiters, 1);
    }
}

// Another thread aborts (the communicator is already marked broken): tell the peers through the
// segment and wake whatever of this rank sleeps; waiters then see the broken state within a nap.
static void shm_abort(void *impl, dsc_status st, const char *msg) {
    shm *s = impl;
    if (!s->base) return;
    shm__fail_comm(s, st, msg);
    shm__wake_progress(s);
    atomic_fetch_add(&s->completions, 1);
    futex_wake(&s->completions, false);
}

static void shm_peer(void *impl, int j, dsc_comm_peer *out) {
    shm *s = impl;
    out->stopped = false;
    out->heartbeat_age_s = 0;
    out->state = DSC_PEER_ALIVE;
    out->pid = (int)getpid();
    if (!s->base || j == s->rank) return; // one rank, or this one
    shm_ctrl *c = &s->ctrl[j];
    out->pid = atomic_load(&c->pid);
    out->heartbeat_age_s = heartbeat_age(s, j);
    if (atomic_load(&c->left)) {
        out->state = DSC_PEER_LEFT;
        return;
    }
    char state;
    int r = peer_proc(s, j, &state);
    if (r < 0 && s->pidns && c->pidns == s->pidns) r = 1; // /proc unreadable: assume alive
    if (r < 0) r = out->heartbeat_age_s < HEARTBEAT_DEAD_S; // another pid namespace
    out->state = r ? DSC_PEER_ALIVE : DSC_PEER_DEAD;
    out->stopped = r == 1 && (state == 'T' || state == 't'); // SIGSTOP, or held by a debugger
}

static bool shm_note_cas(void *impl, uint64_t *expected, uint64_t desired) {
    shm *s = impl;
    if (!s->base) { // one rank: nobody else to tell
        *expected = desired;
        return true;
    }
    return atomic_compare_exchange_strong(&s->hdr->note, expected, desired);
}

const dsc__comm_ops dsc__shm_ops = {
    .name = "shm",
    .create = shm_create,
    .destroy = shm_destroy,
    .submit = shm_submit,
    .wait = shm_wait,
    .test = shm_test,
    .abort = shm_abort,
    .peer = shm_peer,
    .note_cas = shm_note_cas,
};
