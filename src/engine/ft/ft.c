// engine/ft/ft.c - an engine's fault-tolerance state: configuration, the step watchdog, fault
// events, phase markers and test fault injection (DSC_FT_INJECT).
#define _GNU_SOURCE // pthread_condattr_setclock
#include "engine/ft/ft.h"

#include <pthread.h> // pthread_*
#include <signal.h>  // raise, SIGKILL, SIGSTOP
#include <stdio.h>   // snprintf, fprintf
#include <stdlib.h>  // calloc, free, getenv, strtod, strtoll
#include <string.h>  // strcmp, strchr
#include <time.h>    // clock_gettime, nanosleep
#include <unistd.h>  // getpid, _exit

#include "base/env.h"          // dsc__env, DSC_ENV_*
#include "base/log.h"          // DSC_WARN
#include "base/status.h"       // dsc__fail
#include "base/time.h"         // dsc_now, dsc_wall_time
#include "engine/ft/ft_impl.h" // struct dsc__ft

// ---- the watchdog ----

static void timed_wait(struct dsc__ft *ft, double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double s = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + seconds;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&ft->cv, &ft->mu, &ts);
}

// The step deadline passed (mu held): count it, say so, and abort the communicator so that a
// call blocked in a collective returns DSC_ERR_TIMEOUT (the peers' calls fail too, so that every
// rank goes to recovery at once instead of waiting for its own deadline).
static void fire(struct dsc__ft *ft, int rank) {
    ft->armed = false;
    ft->fired = true;
    atomic_fetch_add(&ft->events, 1);
    char msg[512];
    snprintf(msg, sizeof msg,
             "rank %d: step %lld exceeded fault_tolerance.step_timeout_s = %g s (%.1f s "
             "elapsed, in %s)",
             rank, (long long)ft->step, ft->step_timeout, dsc_now() - ft->step_t0,
             atomic_load(&ft->phase));
    DSC_WARN("ft", "%s; aborting the step's collectives", msg);
    if (ft->watch_comm) dsc_comm_abort(ft->watch_comm, DSC_ERR_TIMEOUT, msg);
}

static void *watchdog_main(void *arg) {
    struct dsc__ft *ft = arg;
    pthread_mutex_lock(&ft->mu);
    while (!ft->stop) {
        if (!ft->armed) {
            pthread_cond_wait(&ft->cv, &ft->mu);
            continue;
        }
        double left = ft->deadline - dsc_now();
        if (left > 0) timed_wait(ft, left);
        else fire(ft, ft->orig_rank);
    }
    pthread_mutex_unlock(&ft->mu);
    return NULL;
}

static dsc_status watchdog_start(struct dsc__ft *ft) {
    if (ft->step_timeout <= 0) return DSC_OK;
    if (pthread_create(&ft->thread, NULL, watchdog_main, ft) != 0)
        return dsc__fail(DSC_ERR_SYSTEM, "fault tolerance: cannot start the watchdog thread");
    ft->thread_started = true;
    return DSC_OK;
}

void dsc__ft_disarm(struct dsc__ft *ft) {
    pthread_mutex_lock(&ft->mu);
    ft->armed = false;
    pthread_mutex_unlock(&ft->mu);
}

void dsc__ft_set_comm(struct dsc__ft *ft, dsc_comm *c) {
    pthread_mutex_lock(&ft->mu);
    ft->watch_comm = c;
    pthread_mutex_unlock(&ft->mu);
}

// ---- fault injection (tests) ----

// "RANK:STEP:POINT[:ACTION]" entries separated by commas; STEP may be "*".
static void parse_inject(struct dsc__ft *ft, const char *spec) {
    while (spec && *spec && ft->ninject < FT_MAX_INJECT) {
        const char *end = strchr(spec, ',');
        size_t n = end ? (size_t)(end - spec) : strlen(spec);
        char item[96], step[32] = "";
        snprintf(item, sizeof item, "%.*s", (int)(n < 95 ? n : 95), spec);
        ft_inject *in = &ft->inject[ft->ninject];
        *in = (ft_inject){.fired_step = -2};
        snprintf(in->action, sizeof in->action, "kill");
        int got = sscanf(item, "%d:%31[^:]:%23[^:]:%23s", &in->rank, step, in->point, in->action);
        if (got >= 3) {
            in->step = !strcmp(step, "*") ? -1 : strtoll(step, NULL, 10);
            ft->ninject++;
        } else {
            DSC_WARN("ft", "DSC_FT_INJECT entry \"%s\" is not RANK:STEP:POINT[:ACTION]; ignored",
                     item);
        }
        spec = end ? end + 1 : NULL;
    }
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void announce(int rank, int64_t step, const char *point, const char *action) {
    fprintf(stderr, "dsc: fault injection: rank %d (pid %d) %s at step %lld (%s), unix time %.3f\n",
            rank, (int)getpid(), action, (long long)step, point, dsc_wall_time());
    fflush(stderr);
}

static void act(int rank, int64_t step, const char *point, const char *action) {
    if (!strncmp(action, "sleep=", 6)) {
        sleep_s(strtod(action + 6, NULL));
    } else if (!strcmp(action, "stop")) {
        announce(rank, step, point, "stops itself");
        raise(SIGSTOP);
    } else if (!strcmp(action, "exit")) {
        announce(rank, step, point, "exits with code 3");
        _exit(3); // a rank failing on its own; test-only, never without DSC_FT_INJECT
    } else {
        announce(rank, step, point, "kills itself");
        raise(SIGKILL);
    }
}

typedef struct random_kill {
    int rank;
    int64_t step;
    double delay;
} random_kill;

static void *random_kill_main(void *arg) {
    random_kill k = *(random_kill *)arg;
    free(arg);
    sleep_s(k.delay);
    act(k.rank, k.step, "random moment", "kill");
    return NULL;
}

// POINT "random": a thread kills the process after a random fraction of the last step's time,
// so the fault lands anywhere in the step (compute, a collective, the optimizer, a snapshot).
static void arm_random_kill(struct dsc__ft *ft) {
    random_kill *k = malloc(sizeof *k);
    if (!k) return;
    uint64_t x = (uint64_t)dsc_now_ns() ^ ((uint64_t)getpid() << 20);
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33;
    double u = (double)(x >> 11) / 9007199254740992.0;
    *k = (random_kill){ft->orig_rank, ft->step, u * (ft->last_step_s > 0 ? ft->last_step_s : 0.01)};
    pthread_t t;
    if (pthread_create(&t, NULL, random_kill_main, k) != 0) return free(k);
    pthread_detach(t);
}

static void maybe_inject(struct dsc__ft *ft, const char *phase) {
    for (int k = 0; k < ft->ninject; k++) {
        ft_inject *in = &ft->inject[k];
        if (in->rank != ft->orig_rank || (in->step >= 0 && in->step != ft->step)) continue;
        bool random = !strcmp(in->point, "random");
        if (strcmp(random ? "begin" : in->point, phase) || in->fired_step == ft->step) continue;
        in->fired_step = ft->step; // once per step, whatever the number of groups
        if (random) arm_random_kill(ft);
        else act(ft->orig_rank, ft->step, phase, in->action);
    }
}

void dsc__ft_point(dsc_engine *e, const char *phase) {
    struct dsc__ft *ft = e->ft;
    if (!ft) return;
    atomic_store(&ft->phase, phase);
    if (ft->ninject) maybe_inject(ft, phase);
}

// ---- steps ----

void dsc__ft_step_begin(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (!ft) return;
    double now = dsc_now();
    pthread_mutex_lock(&ft->mu);
    if (ft->step_t0 > 0 && ft->step == e->global_steps) ft->last_step_s = now - ft->step_t0;
    ft->step = e->global_steps + 1;
    ft->acked = e->global_steps;
    ft->step_t0 = now;
    ft->deadline = now + ft->step_timeout;
    ft->armed = ft->thread_started;
    ft->fired = false;
    pthread_cond_signal(&ft->cv);
    pthread_mutex_unlock(&ft->mu);
    dsc__ft_point(e, "begin");
}

void dsc__ft_step_end(dsc_engine *e) {
    if (e->ft) dsc__ft_disarm(e->ft);
}

bool dsc__ft_keeps_state(const dsc_engine *e) {
    return e->ft && e->ft->policy != FT_ABORT;
}

bool dsc__ft_replicates(const dsc_engine *e) {
    return e->ft && e->ft->ring;
}

int64_t dsc__ft_events(const dsc_engine *e) { return e->ft ? atomic_load(&e->ft->events) : 0; }

// ---- create / destroy ----

static int policy_of(const char *s) {
    return !strcmp(s, "restart") ? FT_RESTART : !strcmp(s, "abort") ? FT_ABORT : FT_DEGRADE;
}

dsc_status dsc__ft_create(dsc_engine *e) {
    if (!e->comm) return DSC_OK;
    struct dsc__ft *ft = calloc(1, sizeof *ft);
    if (!ft) return dsc__fail(DSC_ERR_OOM, "out of memory for the fault-tolerance state");
    e->ft = ft;
    pthread_mutex_init(&ft->mu, NULL);
    pthread_condattr_t ca; // the deadline is on the monotonic clock, as dsc_now
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&ft->cv, &ca);
    pthread_condattr_destroy(&ca);
    const dsc_config *c = &e->cfg;
    ft->comm_timeout = c->fault_tolerance.comm_timeout_s;
    ft->step_timeout = c->fault_tolerance.step_timeout_s;
    ft->policy = policy_of(c->fault_tolerance.on_failure);
    ft->ring = c->fault_tolerance.replicate && e->stage >= 1;
    ft->orig_rank = e->rank;
    ft->retried_step = -1;
    ft->acked = INT64_MAX;
    ft->watch_comm = e->comm;
    atomic_store(&ft->phase, "setup");
    ft->orig_of = calloc((size_t)e->world, sizeof *ft->orig_of);
    if (!ft->orig_of) return dsc__fail(DSC_ERR_OOM, "out of memory for the fault-tolerance state");
    for (int r = 0; r < e->world; r++) ft->orig_of[r] = r;
    parse_inject(ft, dsc__env(DSC_ENV_FT_INJECT));
    DSC_TRY(dsc__ft_slots_alloc(e));
    return watchdog_start(ft);
}

void dsc__ft_destroy(dsc_engine *e) {
    struct dsc__ft *ft = e->ft;
    if (!ft) return;
    if (ft->thread_started) {
        pthread_mutex_lock(&ft->mu);
        ft->stop = true;
        pthread_cond_signal(&ft->cv);
        pthread_mutex_unlock(&ft->mu);
        pthread_join(ft->thread, NULL);
    }
    dsc__ft_ring_drain(e);
    dsc__ft_report_cost(ft);
    dsc__ft_slots_free(e);
    pthread_cond_destroy(&ft->cv);
    pthread_mutex_destroy(&ft->mu);
    free(ft->orig_of);
    free(ft);
    e->ft = NULL;
}
