// The comm layer's fault-tolerance entry points with real processes: dsc_comm_abort from another
// thread ends a blocked collective at once, here and at the peers, with the abort's reason;
// dsc_comm_peer_info tells alive, dead (SIGKILL), stopped (SIGSTOP, heartbeat standing still)
// and departed ranks apart; dsc_comm_note_cas has exactly one winner. Each scenario forks one
// child per rank; a child reports through its exit code, the parent kills whatever outlives the
// scenario's limit.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h> // sockaddr_in
#include <pthread.h>    // pthread_create
#include <signal.h>     // kill, raise, SIGKILL, SIGSTOP
#include <stdio.h>      // fprintf
#include <string.h>     // strstr
#include <sys/mman.h>   // mmap
#include <sys/socket.h> // socket, bind
#include <sys/wait.h>   // waitpid
#include <time.h>       // nanosleep
#include <unistd.h>     // fork, _exit, getpid

#include "loopback.h" // free_port, nap
#include "base/time.h" // dsc_now
#include "dsc/comm.h"  // dsc_comm_*

// ---- harness ----

typedef int (*rank_fn)(dsc_comm *c, int rank, int world);

typedef struct scenario {
    int world;
    double timeout_s, limit_s;
    rank_fn fn;
    int codes[8]; // exit code per rank (128 + signal when killed)
    int port;
} scenario;

static int child_main(scenario *sc, int rank) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = rank;
    o.world_size = sc->world;
    o.master_addr = "127.0.0.1";
    o.master_port = sc->port;
    o.timeout_s = sc->timeout_s;
    dsc_comm *c = NULL;
    if (dsc_comm_create(&c, &o) != DSC_OK) {
        fprintf(stderr, "rank %d: create failed: %s\n", rank, dsc_last_error());
        return 90;
    }
    int code = sc->fn(c, rank, sc->world);
    dsc_comm_destroy(c);
    return code;
}

static void run(scenario *sc) {
    sc->port = free_port();
    pid_t pids[8];
    double t0 = dsc_now();
    fflush(NULL);
    for (int r = 0; r < sc->world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(child_main(sc, r));
        sc->codes[r] = -1;
    }
    for (int left = sc->world; left > 0;) {
        for (int r = 0; r < sc->world; r++) {
            int status;
            if (sc->codes[r] != -1 || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
            sc->codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            left--;
        }
        if (left && dsc_now() - t0 > sc->limit_s) {
            for (int r = 0; r < sc->world; r++)
                if (sc->codes[r] == -1) kill(pids[r], SIGKILL), kill(pids[r], SIGCONT);
            fprintf(stderr, "scenario exceeded %.0f s: killed the remaining ranks\n", sc->limit_s);
            sc->limit_s = 1e9;
        }
        if (left) nap(0.005);
    }
}

// Shared between the children of a scenario (mapped before fork).
typedef struct shared {
    double t_abort;    // when rank 0's watchdog thread aborted
    double t_fail[4];  // when each rank's collective returned
    int pid[4];
} shared;
static shared *g_sh;

// ---- abort from another thread ----

static dsc_comm *g_comm;

static void *watchdog(void *arg) {
    nap(0.3);
    g_sh->t_abort = dsc_now();
    dsc_comm_abort(g_comm, DSC_ERR_TIMEOUT, "test watchdog: step 7 took too long");
    dsc_comm_abort(g_comm, DSC_ERR_PEER, "a second reason"); // the first one wins
    return NULL;
}

// Ranks 0 and 1 enter an all_reduce that rank 2 never joins (the deadline is 30 s); rank 0's
// "watchdog" aborts after 0.3 s. Both must fail within 0.5 s of the abort, with its reason;
// rank 2 then finds the communicator broken by its peer.
static int abort_rank(dsc_comm *c, int rank, int world) {
    float x[256] = {0};
    pthread_t t;
    if (rank == 0) {
        g_comm = c;
        pthread_create(&t, NULL, watchdog, NULL);
    }
    if (rank == 2) nap(1.2);
    dsc_status st = dsc_comm_all_reduce(c, x, x, 256, DSC_DT_F32, DSC_OP_SUM, NULL);
    g_sh->t_fail[rank] = dsc_now();
    if (rank == 0) pthread_join(t, NULL);
    const char *msg = dsc_last_error(), *bmsg = NULL;
    dsc_status bst;
    if (st != DSC_ERR_TIMEOUT || !strstr(msg, "test watchdog: step 7")) {
        fprintf(stderr, "rank %d: status %d, message '%s'\n", rank, st, msg);
        return 1;
    }
    if (!dsc_comm_is_broken(c, &bst, &bmsg) || bst != DSC_ERR_TIMEOUT) return 2;
    if (rank == 0 && strstr(bmsg, "a second reason")) return 3;
    return 0;
}

static void test_abort_from_thread(void **state) {
    scenario sc = {.world = 3, .timeout_s = 30, .limit_s = 20, .fn = abort_rank};
    run(&sc);
    for (int r = 0; r < 3; r++) assert_int_equal(sc.codes[r], 0);
    assert_true(g_sh->t_abort > 0);
    for (int r = 0; r < 2; r++) {
        double dt = g_sh->t_fail[r] - g_sh->t_abort;
        fprintf(stderr, "rank %d failed %.1f ms after the abort\n", r, dt * 1e3);
        assert_true(dt >= 0 && dt < 0.5);
    }
}

// One process: an aborted communicator fails every later operation with the reason.
static void test_abort_single_rank(void **state) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = 0;
    o.world_size = 1;
    dsc_comm *c = NULL;
    assert_int_equal(dsc_comm_create(&c, &o), DSC_OK);
    assert_false(dsc_comm_is_broken(c, NULL, NULL));
    dsc_comm_abort(c, DSC_ERR_TIMEOUT, "deadline of step 3");
    assert_true(dsc_comm_is_broken(c, NULL, NULL));
    assert_int_equal(dsc_comm_barrier(c, NULL), DSC_ERR_TIMEOUT);
    assert_non_null(strstr(dsc_last_error(), "deadline of step 3"));
    dsc_comm_peer p;
    assert_int_equal(dsc_comm_peer_info(c, 0, &p), DSC_OK);
    assert_int_equal(p.state, DSC_PEER_ALIVE);
    assert_int_equal(dsc_comm_peer_info(c, 1, &p), DSC_ERR_INVALID_ARG);
    dsc_comm_destroy(c);
}

// ---- what a rank can tell about its peers ----

// Rank 0 watches: rank 1 stops itself (SIGSTOP), rank 2 kills itself, rank 3 destroys its
// communicator and lingers. Rank 0 finally kills rank 1.
static int watch_rank(dsc_comm *c, int rank, int world) {
    g_sh->pid[rank] = (int)getpid();
    if (dsc_comm_barrier(c, NULL) != DSC_OK) return 10;
    if (rank == 1) raise(SIGSTOP);
    if (rank == 2) raise(SIGKILL);
    if (rank == 3) {
        dsc_comm_destroy(c);
        nap(1.6); // alive until rank 0 has seen it departed
        _exit(0);
    }
    dsc_comm_peer p[4];
    for (int j = 0; j < 4; j++) dsc_comm_peer_info(c, j, &p[j]);
    double t0 = dsc_now();
    while (dsc_now() - t0 < 2.0) { // until rank 1's heartbeat stood still for over a second
        for (int j = 1; j < 4; j++) dsc_comm_peer_info(c, j, &p[j]);
        if (p[2].state == DSC_PEER_DEAD && p[3].state == DSC_PEER_LEFT && p[1].stopped &&
            p[1].heartbeat_age_s > 1.0)
            break;
        nap(0.02);
    }
    fprintf(stderr, "after %.2f s: rank 1 state %d stopped %d age %.2f; rank 2 state %d; "
            "rank 3 state %d\n", dsc_now() - t0, p[1].state, p[1].stopped, p[1].heartbeat_age_s,
            p[2].state, p[3].state);
    if (p[0].state != DSC_PEER_ALIVE || p[0].pid != (int)getpid()) return 1;
    if (p[1].state != DSC_PEER_ALIVE || !p[1].stopped || p[1].heartbeat_age_s <= 1.0) return 2;
    if (p[1].pid != g_sh->pid[1]) return 3;
    if (p[2].state != DSC_PEER_DEAD || p[3].state != DSC_PEER_LEFT) return 4;
    kill(p[1].pid, SIGKILL);
    for (int i = 0; i < 200 && p[1].state != DSC_PEER_DEAD; i++, nap(0.01))
        dsc_comm_peer_info(c, 1, &p[1]);
    return p[1].state == DSC_PEER_DEAD ? 0 : 5;
}

static void test_peer_info(void **state) {
    scenario sc = {.world = 4, .timeout_s = 30, .limit_s = 20, .fn = watch_rank};
    run(&sc);
    assert_int_equal(sc.codes[0], 0);
    assert_int_equal(sc.codes[1], 128 + SIGKILL);
    assert_int_equal(sc.codes[2], 128 + SIGKILL);
    assert_int_equal(sc.codes[3], 0);
}

// A live peer that only computes (no operation in flight) keeps a fresh heartbeat.
static int fresh_rank(dsc_comm *c, int rank, int world) {
    if (dsc_comm_barrier(c, NULL) != DSC_OK) return 10;
    double worst = 0, t0 = dsc_now();
    while (dsc_now() - t0 < 1.5) {
        dsc_comm_peer p;
        dsc_comm_peer_info(c, 1 - rank, &p);
        if (p.heartbeat_age_s > worst) worst = p.heartbeat_age_s;
        if (p.state != DSC_PEER_ALIVE || p.stopped) return 1;
        nap(0.01);
    }
    fprintf(stderr, "rank %d: oldest heartbeat seen %.3f s\n", rank, worst);
    if (worst > 0.5) return 2;
    return dsc_comm_barrier(c, NULL) == DSC_OK ? 0 : 3;
}

static void test_heartbeat_of_busy_peer(void **state) {
    scenario sc = {.world = 2, .timeout_s = 30, .limit_s = 20, .fn = fresh_rank};
    run(&sc);
    assert_int_equal(sc.codes[0], 0);
    assert_int_equal(sc.codes[1], 0);
}

// ---- the shared note ----

// Every rank tries to swap 0 -> its own value at once, on a broken communicator: exactly one
// wins, and every rank then reads the winner's value.
static int note_rank(dsc_comm *c, int rank, int world) {
    if (dsc_comm_barrier(c, NULL) != DSC_OK) return 10;
    dsc_comm_abort(c, DSC_ERR_PEER, "broken on purpose"); // the note works on a broken one
    uint64_t cur = 0;
    bool swapped;
    if (dsc_comm_note_cas(c, &cur, 100 + (uint64_t)rank, &swapped) != DSC_OK) return 1;
    if (swapped) __atomic_fetch_add(&g_sh->pid[3], 1, __ATOMIC_SEQ_CST);
    else if (cur < 100 || cur >= 100 + (uint64_t)world) return 2;
    nap(0.2);
    uint64_t seen = 0;
    if (dsc_comm_note_cas(c, &seen, 0, &swapped) != DSC_OK || swapped) return 3;
    g_sh->t_fail[rank] = (double)seen;
    return 0;
}

static void test_note(void **state) {
    g_sh->pid[3] = 0;
    scenario sc = {.world = 3, .timeout_s = 30, .limit_s = 20, .fn = note_rank};
    run(&sc);
    for (int r = 0; r < 3; r++) assert_int_equal(sc.codes[r], 0);
    assert_int_equal(g_sh->pid[3], 1); // one winner
    assert_true(g_sh->t_fail[0] == g_sh->t_fail[1] && g_sh->t_fail[1] == g_sh->t_fail[2]);
}

int main(void) {
    g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_abort_single_rank),
        cmocka_unit_test(test_abort_from_thread),
        cmocka_unit_test(test_peer_info),
        cmocka_unit_test(test_heartbeat_of_busy_peer),
        cmocka_unit_test(test_note),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
