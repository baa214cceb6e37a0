// bench_comm - bus bandwidth of dsc's shm all_reduce and reduce_scatter at world 2, and of Open
// MPI's MPI_Allreduce / MPI_Reduce_scatter_block in the same run (mpirun -np 2 of this program),
// for sizes 1 KiB .. 256 MiB of f32. One table, with the shm/MPI ratio.
//
//   busbw = algbw * 2(N-1)/N for all-reduce, algbw * (N-1)/N for reduce-scatter, where
//   algbw = size / time and size is the whole buffer (reduce_scatter: world * count elements),
//   as nccl-tests define them. Time: the slowest rank's mean over a timed loop, best of 3 loops.
//   Open MPI runs with --bind-to core (its busy-polling ranks suffer badly when unbound); set
//   DSC_BENCH_MPIRUN to replace "mpirun --allow-run-as-root --bind-to core".
//
// Usage: bench_comm [--max-mib M] [--min-time S]   (defaults 256, 0.25)
#include <stdio.h>      // printf, popen
#include <stdlib.h>     // malloc, strtol, getenv
#include <string.h>     // strcmp, memset
#include <sys/mman.h>   // mmap
#include <sys/socket.h> // socket
#include <netinet/in.h> // sockaddr_in
#include <sys/wait.h>   // waitpid
#include <unistd.h>     // fork

#include "base/time.h"      // dsc_now
#include "dsc/comm.h"       // dsc_comm_*
#include "dsc_build_info.h" // DSC_FEATURE_MPI

#if DSC_FEATURE_MPI
#include <mpi.h> // MPI_Allreduce, MPI_Reduce_scatter_block
#endif

#define WORLD 2
#define MAXSIZES 16
#define TRIALS 3

typedef struct result {
    double ar[MAXSIZES], rs[MAXSIZES]; // seconds per operation; < 0: not measured
} result;

static size_t g_sizes[MAXSIZES];
static int g_nsizes;
static double g_min_time = 0.25;

// Iterations of one timed loop: TRIALS loops fill about min_time.
static int iters_for(double one) {
    int it = one > 0 ? (int)(g_min_time / TRIALS / one) : 1000;
    return it < 3 ? 3 : it > 1000 ? 1000 : it;
}

// ---- shm, through dsc ----

typedef dsc_status (*op_fn)(dsc_comm *c, const float *x, float *y, size_t bytes);

static dsc_status do_ar(dsc_comm *c, const float *x, float *y, size_t bytes) {
    return dsc_comm_all_reduce(c, x, y, bytes / 4, DSC_DT_F32, DSC_OP_SUM, NULL);
}

static dsc_status do_rs(dsc_comm *c, const float *x, float *y, size_t bytes) {
    return dsc_comm_reduce_scatter(c, x, y, bytes / 4 / WORLD, DSC_DT_F32, DSC_OP_SUM, NULL);
}

// Seconds per call: the best of TRIALS timed loops (mean of each loop, slowest rank), so that a
// burst of unrelated load on the machine does not decide the result. Every rank runs the same
// number of iterations (agreed through a MAX all_reduce).
static double time_shm(dsc_comm *c, op_fn f, const float *x, float *y, size_t bytes) {
    f(c, x, y, bytes); // warm-up
    dsc_comm_barrier(c, NULL);
    double t0 = dsc_now();
    f(c, x, y, bytes);
    float one = (float)(dsc_now() - t0);
    dsc_comm_all_reduce(c, &one, &one, 1, DSC_DT_F32, DSC_OP_MAX, NULL);
    int iters = iters_for(one);
    double best = 1e30;
    for (int trial = 0; trial < TRIALS; trial++) {
        dsc_comm_barrier(c, NULL);
        t0 = dsc_now();
        for (int i = 0; i < iters; i++)
            if (f(c, x, y, bytes) != DSC_OK) return -1;
        float mean = (float)((dsc_now() - t0) / iters);
        dsc_comm_all_reduce(c, &mean, &mean, 1, DSC_DT_F32, DSC_OP_MAX, NULL);
        best = mean < best ? mean : best;
    }
    return best;
}

static int shm_rank(int rank, int port, result *out) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = rank;
    o.world_size = WORLD;
    o.master_addr = "127.0.0.1";
    o.master_port = port;
    dsc_comm *c = NULL;
    if (dsc_comm_create(&c, &o) != DSC_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, dsc_last_error());
        return 1;
    }
    size_t maxb = g_sizes[g_nsizes - 1];
    float *x = malloc(maxb), *y = malloc(maxb);
    for (size_t i = 0; i < maxb / 4; i++) x[i] = (float)(i % 1000) * 0.001f;
    memset(y, 0, maxb);
    for (int s = 0; s < g_nsizes; s++) {
        double ar = time_shm(c, do_ar, x, y, g_sizes[s]);
        double rs = time_shm(c, do_rs, x, y, g_sizes[s]);
        if (rank == 0) {
            out->ar[s] = ar;
            out->rs[s] = rs;
        }
    }
    free(x);
    free(y);
    dsc_comm_destroy(c);
    return 0;
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static int run_shm(result *res) {
    result *shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                          -1, 0);
    int port = free_port(), bad = 0;
    pid_t pids[WORLD];
    fflush(NULL);
    for (int r = 0; r < WORLD; r++)
        if ((pids[r] = fork()) == 0) _exit(shm_rank(r, port, shared));
    for (int r = 0; r < WORLD; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st);
    }
    *res = *shared;
    munmap(shared, sizeof *shared);
    return bad;
}

// ---- Open MPI, run as `mpirun -np 2 bench_comm --mpi-worker` ----

#if DSC_FEATURE_MPI
static void mpi_op(int rs, const float *x, float *y, int n) {
    if (rs) MPI_Reduce_scatter_block(x, y, n / WORLD, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else MPI_Allreduce(x, y, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static double time_mpi(int rs, const float *x, float *y, size_t bytes) {
    int n = (int)(bytes / 4);
    mpi_op(rs, x, y, n); // warm-up
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    mpi_op(rs, x, y, n);
    double one = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &one, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    int iters = iters_for(one);
    double best = 1e30;
    for (int trial = 0; trial < TRIALS; trial++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int i = 0; i < iters; i++) mpi_op(rs, x, y, n);
        double mean = (MPI_Wtime() - t0) / iters;
        MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        best = mean < best ? mean : best;
    }
    return best;
}

static int mpi_worker(void) {
    MPI_Init(NULL, NULL);
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    size_t maxb = g_sizes[g_nsizes - 1];
    float *x = malloc(maxb), *y = malloc(maxb);
    for (size_t i = 0; i < maxb / 4; i++) x[i] = (float)(i % 1000) * 0.001f;
    memset(y, 0, maxb);
    for (int s = 0; s < g_nsizes; s++) {
        double ar = time_mpi(0, x, y, g_sizes[s]), rs = time_mpi(1, x, y, g_sizes[s]);
        if (rank == 0) printf("mpi %zu %.9g %.9g\n", g_sizes[s], ar, rs);
        fflush(stdout);
    }
    free(x);
    free(y);
    MPI_Finalize();
    return 0;
}
#endif

// Run the MPI half under mpirun and parse its lines; false when unavailable.
static int run_mpi(result *res, int argc, char **argv) {
    for (int s = 0; s < g_nsizes; s++) res->ar[s] = res->rs[s] = -1;
#if DSC_FEATURE_MPI
    char cmd[1024];
    const char *mpirun = getenv("DSC_BENCH_MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun --allow-run-as-root --bind-to core";
    int n = snprintf(cmd, sizeof cmd, "%s -np %d /proc/%d/exe --mpi-worker", mpirun, WORLD,
                     (int)getpid());
    for (int i = 1; i < argc && n < (int)sizeof cmd - 64; i++)
        n += snprintf(cmd + n, sizeof cmd - n, " %s", argv[i]);
    snprintf(cmd + n, sizeof cmd - n, " 2>&1");
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[512];
    int got = 0;
    while (fgets(line, sizeof line, p)) {
        size_t bytes;
        double ar, rs;
        if (sscanf(line, "mpi %zu %lf %lf", &bytes, &ar, &rs) != 3) {
            fputs(line, stderr);
            continue;
        }
        for (int s = 0; s < g_nsizes; s++)
            if (g_sizes[s] == bytes) {
                res->ar[s] = ar;
                res->rs[s] = rs;
                got++;
            }
    }
    return pclose(p) == 0 && got == g_nsizes;
#else
    (void)argc;
    (void)argv;
    return 0;
#endif
}

// ---- report ----

static void human(size_t b, char *buf, size_t len) {
    if (b >= (1u << 20)) snprintf(buf, len, "%zu MiB", b >> 20);
    else snprintf(buf, len, "%zu KiB", b >> 10);
}

static void cell(double sec, size_t bytes, double factor, char *buf, size_t len) {
    if (sec <= 0) snprintf(buf, len, "%9s", "n/a");
    else snprintf(buf, len, "%9.2f", (double)bytes / sec * factor / 1e9);
}

static void ratio(double a, double b, char *buf, size_t len) {
    if (a <= 0 || b <= 0) snprintf(buf, len, "%6s", "-");
    else snprintf(buf, len, "%6.2f", b / a); // time ratio = bandwidth ratio shm/mpi
}

static void report(const result *shm, const result *mpi, int have_mpi) {
    double far = 2.0 * (WORLD - 1) / WORLD, frs = (double)(WORLD - 1) / WORLD;
    printf("bus bandwidth, GB/s (world %d, f32, out of place)%s\n", WORLD,
           have_mpi ? "" : "  [Open MPI not measured]");
    printf("%9s | %9s %9s %6s | %9s %9s %6s\n", "size", "AR shm", "AR mpi", "ratio", "RS shm",
           "RS mpi", "ratio");
    for (int s = 0; s < g_nsizes; s++) {
        char sz[32], a[32], b[32], r1[32], c[32], d[32], r2[32];
        human(g_sizes[s], sz, sizeof sz);
        cell(shm->ar[s], g_sizes[s], far, a, sizeof a);
        cell(mpi->ar[s], g_sizes[s], far, b, sizeof b);
        ratio(shm->ar[s], mpi->ar[s], r1, sizeof r1);
        cell(shm->rs[s], g_sizes[s], frs, c, sizeof c);
        cell(mpi->rs[s], g_sizes[s], frs, d, sizeof d);
        ratio(shm->rs[s], mpi->rs[s], r2, sizeof r2);
        printf("%9s | %9s %9s %6s | %9s %9s %6s\n", sz, a, b, r1, c, d, r2);
    }
}

int main(int argc, char **argv) {
    long max_mib = 256;
    int worker = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max-mib") && i + 1 < argc) max_mib = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--min-time") && i + 1 < argc)
            g_min_time = strtod(argv[++i], NULL);
        else if (!strcmp(argv[i], "--mpi-worker")) worker = 1;
        else {
            fprintf(stderr, "usage: bench_comm [--max-mib M] [--min-time S]\n");
            return 2;
        }
    }
    for (size_t b = 1024; b <= (size_t)max_mib << 20 && g_nsizes < MAXSIZES; b *= 4)
        g_sizes[g_nsizes++] = b;
    if (!g_nsizes) return 2;
#if DSC_FEATURE_MPI
    if (worker) return mpi_worker();
#else
    if (worker) return 2;
#endif
    result shm, mpi;
    if (run_shm(&shm)) {
        fprintf(stderr, "bench_comm: the shm ranks failed\n");
        return 1;
    }
    int have_mpi = run_mpi(&mpi, argc, argv);
    report(&shm, &mpi, have_mpi);
    return 0;
}
