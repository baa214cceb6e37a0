// The engine's snapshot protocol for device paths (engine/device.h), with real processes and no
// GPU: two ranks at ZeRO stage 2 move their own snapshot slots into caller buffers
// (dsc__engine_ft_own_external: what the slots held comes along), reserve the slot of a boundary,
// fill it as a device copy would (here: a pattern naming rank and step), complete the previous
// exchange and publish it. The buddy's replica of that boundary must then hold the pattern bit
// for bit under the boundary's tag, the own slot must carry the tag, a reserved slot that is
// cancelled must never be tagged, moving the slots back into the pool keeps their contents, and
// dropping them (the end of a run) leaves none.
// That is the protocol when the replicas are sent (DSC_FT_SEND_REPLICAS=1, as when no shared
// segment can be made). On one node they are not: the own slots are in a segment the buddy maps,
// dsc__engine_ft_own_shared hands them to the device, and the replica of a boundary is readable
// by the buddy the moment its snapshot is published - also after its owner was killed.
// Without fault tolerance (one rank, or on_failure abort) there is nothing to snapshot.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <signal.h>   // kill, raise, SIGKILL
#include <stdatomic.h> // atomic_load
#include <stdio.h>    // fprintf, snprintf
#include <stdlib.h>   // setenv, malloc
#include <string.h>   // memcmp
#include <sys/wait.h> // waitpid
#include <unistd.h>   // fork, _exit

#include "loopback.h"          // free_port, nap
#include "base/time.h"         // dsc_now
#include "dsc/engine.h"        // dsc_engine_*
#include "engine/device.h"     // dsc__engine_ft_*
#include "engine/ft/ft_impl.h" // struct dsc__ft: the slots, to look at

static const dsc_param_desc PARAMS[] = {
    {.name = "a", .ndim = 1, .shape = {40}, .group = 0},
    {.name = "b", .ndim = 2, .shape = {13, 7}, .group = 1},
    {.name = "c", .ndim = 1, .shape = {100}, .group = 2},
};

static char g_json[512];

static void make_config(const char *policy) {
    snprintf(g_json, sizeof g_json,
             "{\"train_batch_size\": 2, \"train_micro_batch_size_per_gpu\": 1,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"zero_optimization\": {\"stage\": 2},"
             " \"fault_tolerance\": {\"comm_timeout_s\": 5, \"on_failure\": \"%s\"}}",
             policy);
}

// What rank r "copies from its device" at boundary s.
static float pattern(int r, int64_t s, size_t k) {
    return (float)(r * 1000003 + s * 7919) + (float)(k % 1013) * 0.25f;
}

static int check_pattern(const float *buf, size_t n, int r, int64_t s) {
    for (size_t k = 0; k < n; k++)
        if (buf[k] != pattern(r, s, k)) return 0;
    return 1;
}

#define FAILS(cond, code)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "rank %d: line %d: %s (%s)\n", rank, __LINE__, #cond,                  \
                    dsc_last_error());                                                             \
            return code;                                                                           \
        }                                                                                          \
    } while (0)

// Shared slots (one node): the device fills the engine's own slots in place; the buddy sees each
// published boundary without any exchange; then rank 0 publishes boundary 5 and is killed, and
// rank 1 still reads it whole.
static int shared_main(dsc_engine *e, int rank, int world, size_t n) {
    struct dsc__ft *ft = e->ft;
    float *slots[2];
    FAILS(dsc__engine_ft_own_shared(e, slots), 60);
    FAILS(slots[0] != slots[1], 61);
    FAILS(dsc__engine_ft_own_external(e, NULL) == DSC_OK, 62); // keeps them
    FAILS(dsc__ft_own_at(ft, 0) && (dsc__ft_own_at(ft, 0)->buf == slots[0] ||
                                    dsc__ft_own_at(ft, 0)->buf == slots[1]), 63);
    int prev = (rank + world - 1) % world;
    for (int64_t s = 1; s <= 5; s++) {
        e->global_steps = s;
        float *buf = dsc__engine_ft_reserve(e);
        FAILS(buf == slots[0] || buf == slots[1], 64);
        for (size_t k = 0; k < n; k++)
            buf[k] = pattern(rank, s, k);
        FAILS(dsc__engine_ft_commit_end(e) == DSC_OK, 65);
        FAILS(dsc__engine_ft_publish(e) == DSC_OK, 66);
        FAILS(dsc__ft_own_at(ft, s) != NULL, 67);
        if (s == 5) break;
        FAILS(dsc__engine_ft_commit_end(e) == DSC_OK, 68); // nothing was sent: nothing to wait
        // both ranks published s before either looks at the buddy's (the loss mean's role)
        FAILS(dsc_engine_mean(e, &(double){0}, 1) == DSC_OK, 69);
        dsc__ft_rep_freeze(ft); // as a recovery does
        ft_slot *rep = dsc__ft_rep_at(ft, s);
        FAILS(rep != NULL, 70);
        FAILS(check_pattern(rep->buf, n, prev, s), 71);
        FAILS(s == 1 || dsc__ft_rep_at(ft, s - 1) != NULL, 72); // two boundaries held
        // and both looked before either overwrites its older slot (the next step's collective)
        FAILS(dsc_engine_mean(e, &(double){0}, 1) == DSC_OK, 76);
    }
    if (rank == 0) raise(SIGKILL); // published boundary 5, then gone
    ft_slot *r = NULL;
    for (double t0 = dsc_now(); dsc_now() - t0 < 20;) { // the owner's tag says it is whole
        for (int k = 0; k < 2; k++)
            if (atomic_load(ft->rep[k].shared) == 5) r = &ft->rep[k];
        if (r) break;
        nap(0.005);
    }
    FAILS(r != NULL, 73);
    nap(0.3); // rank 0 is dead by now; its segment is still mapped here
    dsc__ft_rep_freeze(ft);
    FAILS(dsc__ft_rep_at(ft, 5) && check_pattern(dsc__ft_rep_at(ft, 5)->buf, n, 0, 5), 74);
    FAILS(dsc__ft_rep_at(ft, 4) && check_pattern(dsc__ft_rep_at(ft, 4)->buf, n, 0, 4), 75);
    _exit(0); // the communicator's peer is dead: no orderly end
}

static int rank_main(int rank, int world, int port, int abort_policy) {
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", p, 1);
    dsc_engine_opts o = {
        .config_json = g_json, .params = PARAMS, .nparams = 3, .rank = rank, .world_size = world};
    dsc_engine *e;
    FAILS(dsc_engine_create(&e, &o) == DSC_OK, 10);
    FAILS(dsc_params_updated(e) == DSC_OK, 11); // the first snapshot: boundary 0
    size_t n = dsc__engine_ft_floats(e);
    if (abort_policy || world == 1) { // a fault is never recovered: a device copies nothing
        FAILS(n == 0, 12);
        dsc_engine_destroy(e);
        return 0;
    }
    FAILS(n > 0, 12);
    struct dsc__ft *ft = e->ft;
    FAILS(n == ft->len * (size_t)ft->nvec, 13);
    const char *send = getenv("DSC_FT_SEND_REPLICAS");
    if (!(send && !strcmp(send, "1"))) return shared_main(e, rank, world, n);
    float *none[2];
    FAILS(!dsc__engine_ft_own_shared(e, none), 16);
    ft_slot *first = dsc__ft_own_at(ft, 0);
    FAILS(first != NULL, 14);
    float *before = malloc(n * sizeof(float));
    float *bufs[2] = {malloc(n * sizeof(float)), malloc(n * sizeof(float))};
    FAILS(before && bufs[0] && bufs[1], 15);
    memcpy(before, first->buf, n * sizeof(float));
    // Into our buffers: boundary 0 comes along.
    FAILS(dsc__engine_ft_own_external(e, bufs) == DSC_OK, 20);
    first = dsc__ft_own_at(ft, 0);
    FAILS(first && (first->buf == bufs[0] || first->buf == bufs[1]), 21);
    FAILS(memcmp(first->buf, before, n * sizeof(float)) == 0, 22);
    int prev = (rank + world - 1) % world;
    for (int64_t s = 1; s <= 3; s++) { // three device boundaries
        e->global_steps = s;           // as dsc__engine_device_step would have advanced it
        float *buf = dsc__engine_ft_reserve(e);
        FAILS(buf == bufs[0] || buf == bufs[1], 30);
        for (size_t k = 0; k < n; k++)
            buf[k] = pattern(rank, s, k);         // "the device's copy"
        FAILS(dsc__ft_own_at(ft, s) == NULL, 31); // not before it is published
        // the next step, before its norm collective
        FAILS(dsc__engine_ft_commit_end(e) == DSC_OK, 32);
        FAILS(dsc__engine_ft_publish(e) == DSC_OK, 33);
        FAILS(dsc__ft_own_at(ft, s) != NULL, 34);
        FAILS(dsc__engine_ft_commit_end(e) == DSC_OK, 35); // the exchange of s completes
        ft_slot *rep = dsc__ft_rep_at(ft, s);
        FAILS(rep != NULL, 36);
        FAILS(check_pattern(rep->buf, n, prev, s), 37); // the buddy's, bit for bit
        FAILS(check_pattern(dsc__ft_own_at(ft, s)->buf, n, rank, s), 38);
        if (s > 1) FAILS(dsc__ft_own_at(ft, s - 1) != NULL, 39); // two boundaries held
    }
    // A reservation that a fault cancels is never tagged.
    e->global_steps = 4;
    float *buf = dsc__engine_ft_reserve(e);
    FAILS(buf != NULL, 40);
    dsc__engine_ft_cancel(e);
    FAILS(dsc__engine_ft_publish(e) == DSC_OK, 41);
    FAILS(dsc__ft_own_at(ft, 4) == NULL, 42);
    FAILS(dsc__ft_own_at(ft, 3) != NULL, 43); // the newest published boundary stays
    // Back into the pool: boundary 3 comes along, and our buffers are no longer used.
    FAILS(dsc__engine_ft_own_external(e, NULL) == DSC_OK, 50);
    ft_slot *three = dsc__ft_own_at(ft, 3);
    FAILS(three && three->buf != bufs[0] && three->buf != bufs[1], 51);
    FAILS(check_pattern(three->buf, n, rank, 3), 52);
    // The end of a run: ours again, then dropped (no copy back): nothing is held any more.
    FAILS(dsc__engine_ft_own_external(e, bufs) == DSC_OK, 53);
    dsc__engine_ft_own_drop(e);
    FAILS(dsc__ft_own_at(ft, 3) == NULL && ft->own[0].buf != bufs[0] && ft->own[1].buf != bufs[1],
          54);
    free(bufs[0]);
    free(bufs[1]);
    free(before);
    e->global_steps = 0;
    dsc_engine_destroy(e);
    return 0;
}

// expect_killed: rank 0 is expected to die of SIGKILL
static void run_expect(int world, int abort_policy, bool expect_killed) {
    int port = free_port();
    pid_t pids[2];
    int codes[2] = {-1, -1};
    fflush(NULL);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(rank_main(r, world, port, abort_policy));
    }
    double t0 = dsc_now();
    for (int left = world; left > 0;) {
        for (int r = 0; r < world; r++) {
            int status;
            if (codes[r] != -1 || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
            codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            left--;
        }
        if (left && dsc_now() - t0 > 60)
            for (int r = 0; r < world; r++)
                if (codes[r] == -1) kill(pids[r], SIGKILL);
        if (left) nap(0.005);
    }
    for (int r = 0; r < world; r++)
        assert_int_equal(codes[r], r == 0 && expect_killed ? 128 + SIGKILL : 0);
}

static void run(int world, int abort_policy) { run_expect(world, abort_policy, false); }

static void test_publish_and_replica(void **state) {
    (void)state;
    make_config("degrade");
    setenv("DSC_FT_SEND_REPLICAS", "1", 1);
    run(2, 0);
    unsetenv("DSC_FT_SEND_REPLICAS");
}

static void test_shared_replica_outlives_owner(void **state) {
    (void)state;
    make_config("degrade");
    run_expect(2, 0, true);
}

static void test_abort_copies_nothing(void **state) {
    (void)state;
    make_config("abort");
    run(2, 1);
}

static void test_one_rank_copies_nothing(void **state) {
    (void)state;
    make_config("degrade");
    run(1, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_publish_and_replica),
        cmocka_unit_test(test_shared_replica_outlives_owner),
        cmocka_unit_test(test_abort_copies_nothing),
        cmocka_unit_test(test_one_rank_copies_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
