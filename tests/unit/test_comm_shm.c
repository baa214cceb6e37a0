// Tests of the shm communicator with real processes: every collective x dtype x size x world
// against a serial rank-order fp32 reference (bitwise), all_reduce == reduce_scatter + all_gather,
// chunking through a small segment, send/recv, barrier, mismatch detection, deadlines, dead
// peers, overlap, and that /dev/shm is left clean. Each scenario forks one child per rank; a
// child reports through its exit code, the parent kills whatever outlives the scenario's limit.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>     // opendir, readdir
#include <errno.h>      // errno
#include <fcntl.h>      // O_CREAT
#include <sys/stat.h>   // futimens
#include <math.h>       // ldexpf
#include <netinet/in.h> // sockaddr_in
#include <signal.h>     // kill, SIGKILL
#include <stdio.h>      // fprintf, snprintf
#include <stdlib.h>     // malloc, free, setenv
#include <string.h>     // memcmp, memcpy, strstr
#include <sys/mman.h>   // mmap
#include <sys/socket.h> // socket, bind
#include <sys/wait.h>   // waitpid
#include <time.h>       // nanosleep
#include <unistd.h>     // fork, _exit

#include "loopback.h" // free_port, nap
#include "base/time.h" // dsc_now
#include "comm/shm.h"  // DSC_SHM_NAME_PREFIX
#include "dsc/comm.h"  // dsc_comm_*
#include "dsc/half.h"  // dsc_fp32_to_fp16, ...

#define SEED 0x5eed2024u

// ---- harness ----

typedef int (*rank_fn)(dsc_comm *c, int rank, int world, void *arg);

typedef struct scenario {
    int world;
    double timeout_s;  // communicator deadline
    double limit_s;    // the parent kills children still running after this
    rank_fn fn;
    void *arg;
    int codes[8];      // exit code per rank (128 + signal when killed)
    double seconds;    // wall time of the scenario
    int port;
} scenario;

static int child_main(scenario *sc, int rank) {
    dsc_clear_error(); // not the parent's
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
    int code = sc->fn(c, rank, sc->world, sc->arg);
    dsc_comm_destroy(c);
    return code;
}

// Number of segments of this scenario's port still named in /dev/shm.
static int leftover_segments(int port) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, DSC_SHM_NAME_PREFIX "%d-", port);
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strncmp(e->d_name, prefix, strlen(prefix))) n++;
    closedir(d);
    return n;
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
    int left = sc->world;
    while (left > 0) {
        for (int r = 0; r < sc->world; r++) {
            int status;
            if (sc->codes[r] != -1 || waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
            sc->codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            left--;
        }
        if (left && dsc_now() - t0 > sc->limit_s) {
            for (int r = 0; r < sc->world; r++)
                if (sc->codes[r] == -1) kill(pids[r], SIGKILL);
            fprintf(stderr, "scenario exceeded %.0f s: killed the remaining ranks\n", sc->limit_s);
            sc->limit_s = 1e9; // reap them in the next rounds
        }
        if (left) nap(0.005);
    }
    sc->seconds = dsc_now() - t0;
    assert_int_equal(leftover_segments(sc->port), 0);
}

static void expect_all_zero(const scenario *sc) {
    for (int r = 0; r < sc->world; r++)
        if (sc->codes[r] != 0) fail_msg("rank %d of %d exited %d (seed 0x%x)", r, sc->world,
                                        sc->codes[r], SEED);
}

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "rank %d: check failed at line %d: %s: ", rank, __LINE__, #cond);  \
            fprintf(stderr, __VA_ARGS__);                                                      \
            fprintf(stderr, " [%s]\n", dsc_last_error());                                      \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

// ---- data and the serial reference ----

static uint64_t mix(uint64_t x) { // splitmix64
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t esz(dsc_dtype dt) { return dt == DSC_DT_F32 ? 4 : 2; }

static float to_f(const void *a, size_t i, dsc_dtype dt) {
    if (dt == DSC_DT_F32) return ((const float *)a)[i];
    uint16_t h = ((const uint16_t *)a)[i];
    return dt == DSC_DT_F16 ? dsc_fp16_to_fp32(h) : dsc_bf16_to_fp32(h);
}

static void from_f(void *a, size_t i, float v, dsc_dtype dt) {
    if (dt == DSC_DT_F32) ((float *)a)[i] = v;
    else if (dt == DSC_DT_F16) ((uint16_t *)a)[i] = dsc_fp32_to_fp16(v);
    else ((uint16_t *)a)[i] = dsc_fp32_to_bf16(v);
}

// n values of mixed magnitude (so that rounding order matters), representable in dt.
static void *make_input(size_t n, dsc_dtype dt, uint64_t key) {
    void *a = malloc(n * esz(dt) + 1);
    for (size_t i = 0; i < n; i++) {
        uint64_t r = mix(key * 0x100000001b3ull + i);
        float v = (float)((double)(r >> 40) / (double)(1ull << 24) - 0.5);
        v = ldexpf(v, (int)((r >> 8) % 9) - 3); // 2^-3 .. 2^5
        from_f(a, i, v, dt);
    }
    return a;
}

static uint64_t input_key(int case_id, int rank) {
    return mix(SEED ^ ((uint64_t)case_id << 20) ^ (uint64_t)rank);
}

// out[i] = x_0[off+i] (op) x_1[off+i] ... in fp32, rounded once to dt.
static void reference(void *out, void *const *in, int world, size_t off, size_t n, dsc_dtype dt,
                      dsc_red_op red) {
    for (size_t i = 0; i < n; i++) {
        float acc = to_f(in[0], off + i, dt);
        for (int j = 1; j < world; j++) {
            float x = to_f(in[j], off + i, dt);
            acc = red == DSC_OP_SUM ? acc + x : (x > acc ? x : acc);
        }
        from_f(out, i, acc, dt);
    }
}

static int same_bits(int rank, const char *what, const void *got, const void *want, size_t n,
                     dsc_dtype dt) {
    if (!memcmp(got, want, n * esz(dt))) return 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp((const char *)got + i * esz(dt), (const char *)want + i * esz(dt), esz(dt))) {
            fprintf(stderr,
                    "rank %d: %s (%zu %s): element %zu is %.9g, reference %.9g (seed 0x%x)\n",
                    rank, what, n, dsc_dtype_name(dt), i, to_f(got, i, dt), to_f(want, i, dt),
                    SEED);
            break;
        }
    return 1;
}

// ---- the collectives matrix ----

static const size_t SIZES[] = {0, 1, 7, 1000003};
static const dsc_dtype DTYPES[] = {DSC_DT_F32, DSC_DT_F16, DSC_DT_BF16};

// One collective of the matrix on this rank, checked against the reference. case_id keys the data.
static int check_case(dsc_comm *c, int rank, int world, int kind, dsc_dtype dt, size_t n,
                      dsc_red_op red, int root, int case_id) {
    size_t in_n = kind == 1 ? (size_t)world * n : n; // reduce_scatter takes (world, n)
    void *in[8];
    for (int j = 0; j < world; j++) in[j] = make_input(in_n, dt, input_key(case_id, j));
    size_t out_n = kind == 2 ? (size_t)world * n : n;
    char *got = malloc(out_n * esz(dt) + 1), *want = malloc(out_n * esz(dt) + 1);
    dsc_status st = DSC_OK;
    const char *name = "?";
    switch (kind) {
    case 0:
        name = "all_reduce";
        st = dsc_comm_all_reduce(c, in[rank], got, n, dt, red, NULL);
        reference(want, in, world, 0, n, dt, red);
        break;
    case 1:
        name = "reduce_scatter";
        st = dsc_comm_reduce_scatter(c, in[rank], got, n, dt, red, NULL);
        reference(want, in, world, (size_t)rank * n, n, dt, red);
        break;
    case 2:
        name = "all_gather";
        st = dsc_comm_all_gather(c, in[rank], got, n, dt, NULL);
        for (int j = 0; j < world; j++) memcpy(want + (size_t)j * n * esz(dt), in[j], n * esz(dt));
        break;
    case 3:
        name = "broadcast";
        memcpy(got, rank == root ? in[root] : in[(root + 1) % world], n * esz(dt));
        st = dsc_comm_broadcast(c, got, n, dt, root, NULL);
        memcpy(want, in[root], n * esz(dt));
        break;
    case 4:
        name = "reduce";
        memset(got, 0, n * esz(dt));
        st = dsc_comm_reduce(c, in[rank], rank == root ? got : NULL, n, dt, red, root, NULL);
        if (rank == root) reference(want, in, world, 0, n, dt, red);
        else memset(want, 0, n * esz(dt));
        break;
    }
    int bad = st != DSC_OK;
    if (bad) fprintf(stderr, "rank %d: %s failed: %s\n", rank, name, dsc_last_error());
    else bad = same_bits(rank, name, got, want, out_n, dt);
    for (int j = 0; j < world; j++) free(in[j]);
    free(got);
    free(want);
    return bad;
}

static int matrix_rank(dsc_comm *c, int rank, int world, void *arg) {
    int case_id = 0;
    for (size_t si = 0; si < sizeof SIZES / sizeof SIZES[0]; si++)
        for (size_t di = 0; di < 3; di++)
            for (int kind = 0; kind < 5; kind++) {
                size_t n = SIZES[si];
                // rooted collectives: every root for small sizes, the last rank for large ones
                int lo = 0, hi = 0;
                if (kind >= 3) {
                    hi = world - 1;
                    lo = n > 1000 ? hi : 0;
                }
                for (int root = lo; root <= hi; root++) {
                    dsc_red_op red = (case_id % 4 == 3) ? DSC_OP_MAX : DSC_OP_SUM;
                    if (check_case(c, rank, world, kind, DTYPES[di], n, red, root, case_id++))
                        return 1;
                }
            }
    // MAX on every dtype at an odd size, and the in-place forms
    for (size_t di = 0; di < 3; di++) {
        if (check_case(c, rank, world, 0, DTYPES[di], 7, DSC_OP_MAX, 0, 1000 + (int)di)) return 1;
        void *x = make_input(1001, DTYPES[di], input_key(2000 + (int)di, rank));
        void *in[8];
        for (int j = 0; j < world; j++)
            in[j] = make_input(1001, DTYPES[di], input_key(2000 + (int)di, j));
        char want[1001 * 4];
        reference(want, in, world, 0, 1001, DTYPES[di], DSC_OP_SUM);
        dsc_status st = dsc_comm_all_reduce(c, x, x, 1001, DTYPES[di], DSC_OP_SUM, NULL);
        int bad = st != DSC_OK || same_bits(rank, "in-place all_reduce", x, want, 1001, DTYPES[di]);
        for (int j = 0; j < world; j++) free(in[j]);
        free(x);
        if (bad) return 1;
    }
    return 0;
}

static void test_matrix(void **state) {
    for (int world = 1; world <= 4; world++) {
        scenario sc = {.world = world, .timeout_s = 30, .limit_s = 60, .fn = matrix_rank};
        run(&sc);
        expect_all_zero(&sc);
        print_message("collectives matrix, world %d: %.2f s\n", world, sc.seconds);
    }
}

// ---- all_reduce == reduce_scatter + all_gather, bitwise ----

static int rs_ag_rank(dsc_comm *c, int rank, int world, void *arg) {
    size_t n = 333337; // per rank: odd, several chunks
    for (size_t di = 0; di < 3; di++) {
        dsc_dtype dt = DTYPES[di];
        void *x = make_input((size_t)world * n, dt, input_key(3000 + (int)di, rank));
        char *ar = malloc((size_t)world * n * esz(dt)), *ag = malloc((size_t)world * n * esz(dt));
        char *rs = malloc(n * esz(dt));
        CHECK(dsc_comm_all_reduce(c, x, ar, (size_t)world * n, dt, DSC_OP_SUM, NULL) == DSC_OK,
              "ar");
        CHECK(dsc_comm_reduce_scatter(c, x, rs, n, dt, DSC_OP_SUM, NULL) == DSC_OK, "rs");
        CHECK(dsc_comm_all_gather(c, rs, ag, n, dt, NULL) == DSC_OK, "ag");
        CHECK(!memcmp(ar, ag, (size_t)world * n * esz(dt)), "all_reduce != rs+ag for %s",
              dsc_dtype_name(dt));
        free(x);
        free(ar);
        free(ag);
        free(rs);
    }
    return 0;
}

static void test_allreduce_equals_rs_ag(void **state) {
    scenario sc = {.world = 3, .timeout_s = 30, .limit_s = 60, .fn = rs_ag_rank};
    run(&sc);
    expect_all_zero(&sc);
}

// ---- buffers much larger than the segment ----

static int big_rank(dsc_comm *c, int rank, int world, void *arg) {
    size_t n = 16u << 20; // 64 MB of f32 through 64 KiB slots
    float *x = make_input(n, DSC_DT_F32, input_key(4000, rank));
    float *in0 = make_input(n, DSC_DT_F32, input_key(4000, 0));
    float *in1 = make_input(n, DSC_DT_F32, input_key(4000, 1));
    CHECK(dsc_comm_all_reduce(c, x, x, n, DSC_DT_F32, DSC_OP_SUM, NULL) == DSC_OK, "ar");
    for (size_t i = 0; i < n; i++) CHECK(x[i] == in0[i] + in1[i], "element %zu", i);
    if (rank == 1) memset(x, 0, n * 4); // and a broadcast of the same size
    CHECK(dsc_comm_broadcast(c, x, n, DSC_DT_F32, 0, NULL) == DSC_OK, "bcast");
    for (size_t i = 0; i < n; i++) CHECK(x[i] == in0[i] + in1[i], "bcast element %zu", i);
    free(x);
    free(in0);
    free(in1);
    return 0;
}

static void test_large_buffer_small_segment(void **state) {
    setenv("DSC_SHM_SLOT_BYTES", "65536", 1);
    scenario sc = {.world = 2, .timeout_s = 30, .limit_s = 60, .fn = big_rank};
    run(&sc);
    unsetenv("DSC_SHM_SLOT_BYTES");
    expect_all_zero(&sc);
    print_message("64 MB all_reduce + broadcast through 64 KiB slots: %.2f s\n", sc.seconds);
}

// The matrix again with tiny slots: many chunks, same bits.
static void test_matrix_tiny_slots(void **state) {
    setenv("DSC_SHM_SLOT_BYTES", "4096", 1);
    setenv("DSC_SHM_CHAN_BYTES", "256", 1);
    scenario sc = {.world = 3, .timeout_s = 30, .limit_s = 60, .fn = matrix_rank};
    run(&sc);
    unsetenv("DSC_SHM_SLOT_BYTES");
    unsetenv("DSC_SHM_CHAN_BYTES");
    expect_all_zero(&sc);
    print_message("collectives matrix with 4 KiB slots, world 3: %.2f s\n", sc.seconds);
}

// ---- send / recv ----

static int ring_rank(dsc_comm *c, int rank, int world, void *arg) {
    size_t n = (3u << 20) / 4 + 5; // larger than a ring: wraps around
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    for (int round = 0; round < 3; round++) {
        float *out = make_input(n, DSC_DT_F32, input_key(5000 + round, rank));
        float *in = malloc(n * 4);
        float *want = make_input(n, DSC_DT_F32, input_key(5000 + round, prev));
        dsc_comm_req *rs, *rr;
        CHECK(dsc_comm_send(c, out, n, DSC_DT_F32, next, &rs) == DSC_OK, "send");
        CHECK(dsc_comm_recv(c, in, n, DSC_DT_F32, prev, &rr) == DSC_OK, "recv");
        CHECK(dsc_comm_wait(rs) == DSC_OK, "wait send");
        CHECK(dsc_comm_wait(rr) == DSC_OK, "wait recv");
        CHECK(!memcmp(in, want, n * 4), "ring round %d data", round);
        free(out);
        free(in);
        free(want);
    }
    // several small messages to one peer arrive in order; bf16 payloads move untouched
    if (rank == 0) {
        for (uint16_t k = 0; k < 20; k++) {
            uint16_t v[3] = {k, (uint16_t)(k * 7), 0x7fc1};
            CHECK(dsc_comm_send(c, v, 3, DSC_DT_BF16, 1, NULL) == DSC_OK, "send %d", k);
        }
    } else if (rank == 1) {
        for (uint16_t k = 0; k < 20; k++) {
            uint16_t v[3];
            CHECK(dsc_comm_recv(c, v, 3, DSC_DT_BF16, 0, NULL) == DSC_OK, "recv %d", k);
            CHECK(v[0] == k && v[1] == k * 7 && v[2] == 0x7fc1, "message %d out of order", k);
        }
    }
    return dsc_comm_barrier(c, NULL) != DSC_OK;
}

static void test_send_recv_ring(void **state) {
    setenv("DSC_SHM_CHAN_BYTES", "100000", 1); // odd size: wrap-around in the middle of elements
    scenario sc = {.world = 3, .timeout_s = 30, .limit_s = 60, .fn = ring_rank};
    run(&sc);
    unsetenv("DSC_SHM_CHAN_BYTES");
    expect_all_zero(&sc);
}

// A size mismatch between send and recv is reported, not silently truncated.
static int p2p_mismatch_rank(dsc_comm *c, int rank, int world, void *arg) {
    float v[8] = {0};
    dsc_status st = rank == 0 ? dsc_comm_send(c, v, 8, DSC_DT_F32, 1, NULL)
                              : dsc_comm_recv(c, v, 4, DSC_DT_F32, 0, NULL);
    if (rank == 1) {
        CHECK(st == DSC_ERR_INVALID_ARG, "status %d", st);
        CHECK(strstr(dsc_last_error(), "sent 32 bytes"), "message");
    }
    return 0;
}

static void test_send_recv_mismatch(void **state) {
    scenario sc = {.world = 2, .timeout_s = 2, .limit_s = 30, .fn = p2p_mismatch_rank};
    run(&sc);
    assert_int_equal(sc.codes[1], 0);
}

// ---- barrier: nobody leaves before the last one arrived ----

static double *g_times; // (2, world) shared between the children: arrival, departure

static int barrier_rank(dsc_comm *c, int rank, int world, void *arg) {
    for (int round = 0; round < 3; round++) {
        nap(0.03 * ((rank + round) % world));
        g_times[rank] = dsc_now();
        CHECK(dsc_comm_barrier(c, NULL) == DSC_OK, "barrier");
        g_times[8 + rank] = dsc_now();
        for (int j = 0; j < world; j++)
            CHECK(g_times[j] <= g_times[8 + rank], "left before rank %d arrived", j);
        CHECK(dsc_comm_barrier(c, NULL) == DSC_OK, "barrier 2");
    }
    return 0;
}

static void test_barrier(void **state) {
    g_times = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    scenario sc = {.world = 4, .timeout_s = 10, .limit_s = 30, .fn = barrier_rank};
    run(&sc);
    munmap(g_times, 4096);
    expect_all_zero(&sc);
}

// ---- mismatched collectives are detected ----

static int mismatch_rank(dsc_comm *c, int rank, int world, void *arg) {
    float v[16] = {0};
    dsc_status st = rank == 0 ? dsc_comm_all_reduce(c, v, v, 16, DSC_DT_F32, DSC_OP_SUM, NULL)
                              : dsc_comm_all_gather(c, v, v, 8, DSC_DT_F32, NULL);
    CHECK(st == DSC_ERR_INVALID_ARG, "status %d", st);
    CHECK(strstr(dsc_last_error(), "mismatch"), "message");
    // broken: later operations fail at once
    double t0 = dsc_now();
    st = dsc_comm_barrier(c, NULL);
    CHECK(st != DSC_OK && dsc_now() - t0 < 0.5, "broken communicator accepted a barrier");
    CHECK(strstr(dsc_last_error(), "broken"), "message");
    return 0;
}

static void test_mismatch(void **state) {
    scenario sc = {.world = 2, .timeout_s = 5, .limit_s = 30, .fn = mismatch_rank};
    run(&sc);
    expect_all_zero(&sc);
}

// ---- deadlines and dead peers ----

typedef struct fault {
    int mode; // 0 never calls, 1 _exit before, 2 SIGKILL before, 3 sleeps 0.5 s
} fault;

static int fault_rank(dsc_comm *c, int rank, int world, void *arg) {
    const fault *f = arg;
    float v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (float)rank;
    if (rank == world - 1) {
        if (f->mode == 0) {
            nap(2.0); // never calls the collective; leaves after the others gave up
            return 0;
        }
        if (f->mode == 1) _exit(0);
        if (f->mode == 2) kill(getpid(), SIGKILL);
        nap(0.5);
    }
    double t0 = dsc_now();
    dsc_status st = dsc_comm_all_reduce(c, v, v, 1000, DSC_DT_F32, DSC_OP_SUM, NULL);
    double dt = dsc_now() - t0;
    const char *msg = dsc_last_error();
    if (f->mode == 0) {
        CHECK(st == DSC_ERR_TIMEOUT, "status %d", st);
        CHECK(dt >= 0.95 && dt < 2.0, "timed out after %.2f s", dt);
        CHECK(strstr(msg, "all_reduce of 1000 f32") && strstr(msg, "ranks 2"), "message");
        fprintf(stderr, "  [rank %d, %.2f s] %s\n", rank, dt, msg);
    } else if (f->mode == 1 || f->mode == 2) {
        CHECK(st == DSC_ERR_PEER, "status %d", st);
        CHECK(dt < 3.0, "noticed the death after %.2f s", dt); // ~ms; slack for sanitizers
        CHECK(strstr(msg, "rank 2") && strstr(msg, "died"), "message");
        fprintf(stderr, "  [rank %d, %.3f s] %s\n", rank, dt, msg);
    } else {
        CHECK(st == DSC_OK, "slow peer caused an error");
        CHECK(v[0] == (float)(world * (world - 1) / 2), "sum %g", v[0]);
        return 0;
    }
    t0 = dsc_now(); // broken afterwards: fails fast
    CHECK(dsc_comm_barrier(c, NULL) != DSC_OK && dsc_now() - t0 < 0.5, "not broken");
    return 0;
}

static void run_fault(int mode, double timeout, int world) {
    fault f = {mode};
    scenario sc = {.world = world, .timeout_s = timeout, .limit_s = 30, .fn = fault_rank,
                   .arg = &f};
    run(&sc);
    for (int r = 0; r < world - 1; r++)
        if (sc.codes[r] != 0) fail_msg("mode %d: rank %d exited %d", mode, r, sc.codes[r]);
    if (mode == 2) assert_int_equal(sc.codes[world - 1], 128 + SIGKILL);
}

static void test_timeout(void **state) { run_fault(0, 1.0, 3); }
static void test_dead_peer_exit(void **state) { run_fault(1, 10.0, 3); }
static void test_dead_peer_sigkill(void **state) { run_fault(2, 10.0, 3); }
static void test_slow_peer(void **state) { run_fault(3, 2.0, 2); }

// ---- overlap: several asynchronous operations in flight ----

static int overlap_rank(dsc_comm *c, int rank, int world, void *arg) {
    enum { K = 8 };
    size_t n = 100003;
    float *x[K];
    dsc_comm_req *req[K];
    for (int k = 0; k < K; k++) {
        x[k] = make_input(n, DSC_DT_F32, input_key(6000 + k, rank));
        CHECK(dsc_comm_all_reduce(c, x[k], x[k], n, DSC_DT_F32, DSC_OP_SUM, &req[k]) == DSC_OK,
              "issue %d", k);
    }
    bool done = false; // poll the last one while "computing"
    while (!done) CHECK(dsc_comm_test(req[K - 1], &done) == DSC_OK, "test");
    for (int k = 0; k < K - 1; k++) CHECK(dsc_comm_wait(req[k]) == DSC_OK, "wait %d", k);
    for (int k = 0; k < K; k++) {
        void *in[8];
        for (int j = 0; j < world; j++) in[j] = make_input(n, DSC_DT_F32, input_key(6000 + k, j));
        float *want = malloc(n * 4);
        reference(want, in, world, 0, n, DSC_DT_F32, DSC_OP_SUM);
        CHECK(!memcmp(want, x[k], n * 4), "op %d", k);
        for (int j = 0; j < world; j++) free(in[j]);
        free(want);
        free(x[k]);
    }
    dsc_comm_stats st;
    dsc_comm_get_stats(c, &st);
    CHECK(st.ops == K && st.bytes == K * n * 4 && st.seconds > 0, "stats %llu ops %llu bytes",
          (unsigned long long)st.ops, (unsigned long long)st.bytes);
    return 0;
}

static void test_overlap(void **state) {
    scenario sc = {.world = 2, .timeout_s = 30, .limit_s = 30, .fn = overlap_rank};
    run(&sc);
    expect_all_zero(&sc);
}

// ---- several communicators of one job ----

static int two_comms_rank(dsc_comm *c, int rank, int world, void *arg) {
    int port = *(int *)arg;
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = world - 1 - rank; // renumbered
    o.world_size = world;
    o.master_addr = "127.0.0.1";
    o.master_port = port;
    o.group_tag = "after-shrink";
    dsc_comm *c2 = NULL;
    CHECK(dsc_comm_create(&c2, &o) == DSC_OK, "second communicator");
    CHECK(dsc_comm_rank(c2) == world - 1 - rank && !strcmp(dsc_comm_backend(c2), "shm"), "rank");
    float a = (float)rank, b = (float)(rank * 10);
    dsc_comm_req *r1, *r2;
    CHECK(dsc_comm_all_reduce(c, &a, &a, 1, DSC_DT_F32, DSC_OP_MAX, &r1) == DSC_OK, "a");
    CHECK(dsc_comm_all_reduce(c2, &b, &b, 1, DSC_DT_F32, DSC_OP_SUM, &r2) == DSC_OK, "b");
    CHECK(dsc_comm_wait(r2) == DSC_OK && dsc_comm_wait(r1) == DSC_OK, "waits");
    CHECK(a == (float)(world - 1) && b == 10.0f * (float)(world * (world - 1) / 2), "values");
    dsc_comm_destroy(c2);
    return 0;
}

static void test_two_communicators(void **state) {
    int port2 = free_port();
    scenario sc = {.world = 3, .timeout_s = 10, .limit_s = 30, .fn = two_comms_rank,
                   .arg = &port2};
    run(&sc);
    expect_all_zero(&sc);
    assert_int_equal(leftover_segments(port2), 0);
}

// Destroying with requests in flight fails and frees them (the sanitizer build checks leaks).
static int pending_rank(dsc_comm *c, int rank, int world, void *arg) {
    static float x[3][50000];
    dsc_comm_req *r[3];
    for (int k = 0; k < 3; k++)
        CHECK(dsc_comm_all_reduce(c, x[k], x[k], 50000, DSC_DT_F32, DSC_OP_SUM, &r[k]) == DSC_OK,
              "issue");
    float v = 1;
    dsc_comm_req *rv;
    if (rank == 0) // a recv whose message never comes
        CHECK(dsc_comm_recv(c, &v, 1, DSC_DT_F32, 1, &rv) == DSC_OK, "recv");
    return 0; // child_main destroys the communicator
}

static void test_destroy_with_pending(void **state) {
    scenario sc = {.world = 2, .timeout_s = 5, .limit_s = 30, .fn = pending_rank};
    run(&sc);
    expect_all_zero(&sc);
}

static int two_ranks_noop(dsc_comm *c, int rank, int world, void *arg) {
    return dsc_comm_barrier(c, NULL) != DSC_OK;
}

// ---- arguments ----

static void test_bad_arguments(void **state) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = 0;
    o.world_size = 1;
    dsc_comm *c = NULL;
    assert_int_equal(dsc_comm_create(&c, &o), DSC_OK);
    float x[4] = {1, 2, 3, 4}, y[4];
    assert_int_equal(dsc_comm_all_reduce(c, x, y, 4, DSC_DT_F32, DSC_OP_SUM, NULL), DSC_OK);
    assert_true(y[3] == 4.0f);
    assert_int_equal(dsc_comm_all_reduce(c, NULL, y, 4, DSC_DT_F32, DSC_OP_SUM, NULL),
                     DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_comm_broadcast(c, x, 4, DSC_DT_F32, 1, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "root 1"));
    assert_int_equal(dsc_comm_send(c, x, 4, DSC_DT_F32, 0, NULL), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_comm_all_reduce(c, x, y, 4, (dsc_dtype)7, DSC_OP_SUM, NULL),
                     DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_comm_barrier(c, NULL), DSC_OK);
    dsc_comm_destroy(c);
    dsc_comm_destroy(NULL);
    o.backend = "nccl";
    assert_int_equal(dsc_comm_create(&c, &o), DSC_ERR_UNSUPPORTED);
    o.backend = "shm";
    o.rank = 3;
    o.world_size = 2;
    assert_int_equal(dsc_comm_create(&c, &o), DSC_ERR_INVALID_ARG);
}

// A rank whose peers never show up fails at create, within its deadline.
static void test_create_timeout(void **state) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = 0;
    o.world_size = 2;
    o.master_addr = "127.0.0.1";
    o.master_port = free_port();
    o.timeout_s = 0.5;
    dsc_comm *c = NULL;
    double t0 = dsc_now();
    assert_int_equal(dsc_comm_create(&c, &o), DSC_ERR_TIMEOUT);
    assert_true(dsc_now() - t0 < 2.0);
    assert_non_null(strstr(dsc_last_error(), "ranks 1 had not joined"));
    assert_int_equal(leftover_segments(o.master_port), 0);
}

// A segment left by a rank 0 that crashed mid-rendezvous (dead pid, old) is removed by the next
// create; a recent one, or one whose creator lives, is left alone.
static void test_stale_segment_sweep(void **state) {
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    char stale[128], young[128], alive[128];
    const char *fmt = "/" DSC_SHM_NAME_PREFIX "1-default-%d-00000000000000%s";
    snprintf(stale, sizeof stale, fmt, (int)dead, "aa");
    snprintf(young, sizeof young, fmt, (int)dead, "bb");
    snprintf(alive, sizeof alive, fmt, (int)getpid(), "cc");
    const char *names[] = {stale, young, alive};
    for (int i = 0; i < 3; i++) {
        int fd = shm_open(names[i], O_CREAT | O_RDWR, 0600);
        assert_true(fd >= 0);
        if (i != 1) {
            struct timespec old[2] = {{time(NULL) - 3600, 0}, {time(NULL) - 3600, 0}};
            assert_int_equal(futimens(fd, old), 0);
        }
        close(fd);
    }
    scenario sc = {.world = 2, .timeout_s = 10, .limit_s = 30, .fn = two_ranks_noop};
    run(&sc);
    expect_all_zero(&sc);
    assert_true(shm_open(stale, O_RDONLY, 0) < 0 && errno == ENOENT);
    for (int i = 1; i < 3; i++) {
        int fd = shm_open(names[i], O_RDONLY, 0);
        assert_true(fd >= 0);
        close(fd);
        shm_unlink(names[i]);
    }
}

int main(void) {
    alarm(240); // the last line of defence against a hang of the whole program
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_create_timeout),
        cmocka_unit_test(test_matrix),
        cmocka_unit_test(test_matrix_tiny_slots),
        cmocka_unit_test(test_allreduce_equals_rs_ag),
        cmocka_unit_test(test_large_buffer_small_segment),
        cmocka_unit_test(test_send_recv_ring),
        cmocka_unit_test(test_send_recv_mismatch),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_dead_peer_exit),
        cmocka_unit_test(test_dead_peer_sigkill),
        cmocka_unit_test(test_slow_peer),
        cmocka_unit_test(test_overlap),
        cmocka_unit_test(test_two_communicators),
        cmocka_unit_test(test_stale_segment_sweep),
        cmocka_unit_test(test_destroy_with_pending),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
