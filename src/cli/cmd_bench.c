// cli/cmd_bench.c - `dsc bench`: communication benchmarks in the manner of DeepSpeed's ds_bench.
// Every rank that `dsc launch` (or torchrun, mpirun, srun) started runs the selected collectives
// over the comm backend of DSC_COMM_BACKEND (shm by default, mpi, or nccl with GPU buffers); rank
// 0 prints one table per operation with ds_bench's columns (size, description, duration,
// throughput, bus bandwidth) and, with --json, one JSON line per measurement.
//
// A measurement: the results of one call are checked against what the ranks' inputs must give
// (small integers, exact in every type); then warm-ups; then `trials` calls between two barriers,
// one after the other (--async-op: all issued, then all waited for). The duration is the slowest
// rank's mean per call. Bandwidths are DeepSpeed's (dsc_comm_log_bandwidth): throughput 2S/t for
// all_reduce, nS/t for all_gather and reduce_scatter, S/t otherwise; bus bandwidth S/t x 2(n-1)/n
// for all_reduce, nS/t x (n-1)/n for all_gather and reduce_scatter, S/t otherwise, where S is a
// rank's message (its input; reduce_scatter: its output) and n the world size.
#include <stdbool.h> // bool
#include <stdint.h>  // uint16_t, uint64_t
#include <stdio.h>   // printf, fprintf, fopen
#include <stdlib.h>  // calloc, free
#include <string.h>  // strcmp, memcpy

#include "cli/args.h"     // cli_parse, cli_int
#include "cli/commands.h" // cmd_bench
#include "dsc/base.h"     // dsc_env, dsc_now
#include "dsc/comm.h"     // dsc_comm_*
#include "dsc/device.h"   // dsc_device_select, dsc_device_alloc, dsc_device_to_* (nccl)
#include "dsc/half.h"     // dsc_fp32_to_bf16_n, ...
#include "dsc/status.h"   // dsc_fail, DSC_TRY

enum { OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_BROADCAST, OP_PT2PT, NOPS };
static const char *const op_names[NOPS] = {"all_reduce", "all_gather", "reduce_scatter",
                                           "broadcast", "pt2pt"};

typedef struct bench {
    dsc_comm *c;
    int rank, world;
    dsc_dtype dt;
    size_t es; // bytes per element
    long long trials, warmups;
    bool async, raw, gbytes; // --async-op, --raw, --bw-unit GBps
    bool device;             // nccl: the buffers are on this rank's GPU
    FILE *json;              // rank 0, --json
    void *send, *recv;       // each max_bytes * world
    float *host;             // max_bytes * world / es floats: staging of the values and the check
    uint16_t *half;          // the same in 16 bits
#ifdef DSC_WITH_CUDA
    void *bufs[3]; // device: send, recv, one float for the ranks' maximum
#endif
} bench;

// ---- buffers and values ----

static int alloc_buffers(bench *b, size_t bytes) {
    size_t n = bytes / b->es;
    b->host = calloc(n ? n : 1, sizeof *b->host);
    b->half = calloc(n ? n : 1, sizeof *b->half);
    if (!b->host || !b->half) return fprintf(stderr, "dsc bench: out of memory\n"), 1;
    if (!b->device) {
        b->send = calloc(1, bytes);
        b->recv = calloc(1, bytes);
        if (!b->send || !b->recv) return fprintf(stderr, "dsc bench: out of memory\n"), 1;
        return 0;
    }
#ifdef DSC_WITH_CUDA
    for (int k = 0; k < 3; k++)
        if (dsc_device_alloc(&b->bufs[k], k < 2 ? bytes : sizeof(float), "bench") != DSC_OK)
            return fprintf(stderr, "dsc bench: %s\n", dsc_last_error()), 1;
    b->send = b->bufs[0];
    b->recv = b->bufs[1];
#endif
    return 0;
}

static void free_buffers(bench *b) {
    free(b->host);
    free(b->half);
    if (!b->device) {
        free(b->send);
        free(b->recv);
    }
#ifdef DSC_WITH_CUDA
    for (int k = 0; k < 3; k++) {
        dsc_device_free(b->bufs[k]);
        b->bufs[k] = NULL;
    }
#endif
}

// n floats of b->host into dst (a send or receive buffer) in the benchmark's type.
static dsc_status put(bench *b, void *dst, size_t n) {
    const void *src = b->host;
    if (b->dt == DSC_DT_BF16) dsc_fp32_to_bf16_n(b->half, b->host, n);
    if (b->dt == DSC_DT_F16) dsc_fp32_to_fp16_n(b->half, b->host, n);
    if (b->dt != DSC_DT_F32) src = b->half;
#ifdef DSC_WITH_CUDA
    if (b->device) return dsc_device_to_device(dst, src, n * b->es);
#endif
    memcpy(dst, src, n * b->es);
    return DSC_OK;
}

// n values of src (a buffer) into b->host as floats.
static dsc_status get(bench *b, const void *src, size_t n) {
    void *dst = b->dt == DSC_DT_F32 ? (void *)b->host : (void *)b->half;
#ifdef DSC_WITH_CUDA
    if (b->device)
        DSC_TRY(dsc_device_to_host(dst, src, n * b->es));
    else
#endif
        memcpy(dst, src, n * b->es);
    if (b->dt == DSC_DT_BF16) dsc_bf16_to_fp32_n(b->host, b->half, n);
    if (b->dt == DSC_DT_F16) dsc_fp16_to_fp32_n(b->host, b->half, n);
    return DSC_OK;
}

// *x = the maximum of every rank's *x (with nccl through a device float).
static dsc_status ranks_max(bench *b, float *x) {
    if (!b->device) return dsc_comm_all_reduce(b->c, x, x, 1, DSC_DT_F32, DSC_OP_MAX, NULL);
#ifdef DSC_WITH_CUDA
    float *d = b->bufs[2];
    DSC_TRY(dsc_device_to_device(d, x, sizeof *x));
    DSC_TRY(dsc_comm_all_reduce(b->c, d, d, 1, DSC_DT_F32, DSC_OP_MAX, NULL));
    return dsc_device_to_host(x, d, sizeof *x);
#else
    return DSC_OK;
#endif
}

// Rank r's input value at element i: integers 1..4 that shift with the rank (an output slot
// holding another rank's data differs), so that every partial sum over up to 64 ranks is an
// integer <= 256, exact in bf16 (and over 512 ranks in fp16); beyond that the check is left out.
static float value(int r, size_t i) {
    return (float)((i + (size_t)r) % 4 + 1);
}

static bool checkable(const bench *b) {
    return b->dt == DSC_DT_F32 || b->world <= (b->dt == DSC_DT_BF16 ? 64 : 512);
}

// ---- one operation ----

// Elements per rank's message for `bytes`, and what the call moves.
typedef struct shape {
    size_t count;   // the count argument of the call
    size_t in, out; // elements of the input and output buffers
} shape;

static shape shape_of(const bench *b, int op, size_t bytes) {
    size_t n = bytes / b->es, w = (size_t)b->world;
    switch (op) {
    case OP_ALL_GATHER:
        return (shape){n, n, n * w};
    case OP_REDUCE_SCATTER:
        return (shape){n, n * w, n};
    default:
        return (shape){n, n, n};
    }
}

static dsc_status call(bench *b, int op, const shape *s, dsc_comm_req **req) {
    switch (op) {
    case OP_ALL_REDUCE:
        return dsc_comm_all_reduce(b->c, b->send, b->recv, s->count, b->dt, DSC_OP_SUM, req);
    case OP_ALL_GATHER:
        return dsc_comm_all_gather(b->c, b->send, b->recv, s->count, b->dt, req);
    case OP_REDUCE_SCATTER:
        return dsc_comm_reduce_scatter(b->c, b->send, b->recv, s->count, b->dt, DSC_OP_SUM, req);
    case OP_BROADCAST:
        return dsc_comm_broadcast(b->c, b->rank == 0 ? b->send : b->recv, s->count, b->dt, 0, req);
    default: // pt2pt: rank 0 to rank 1; the others wait at the barriers
        if (b->rank == 0) return dsc_comm_send(b->c, b->send, s->count, b->dt, 1, req);
        if (b->rank == 1) return dsc_comm_recv(b->c, b->recv, s->count, b->dt, 0, req);
        if (req) *req = NULL;
        return DSC_OK;
    }
}

// What element i of this rank's output must hold.
static float expected(const bench *b, int op, const shape *s, size_t i) {
    double sum = 0;
    switch (op) {
    case OP_ALL_REDUCE:
        for (int r = 0; r < b->world; r++)
            sum += value(r, i);
        return (float)sum;
    case OP_ALL_GATHER:
        return value((int)(i / s->count), i % s->count);
    case OP_REDUCE_SCATTER:
        for (int r = 0; r < b->world; r++)
            sum += value(r, (size_t)b->rank * s->count + i);
        return (float)sum;
    default:
        return value(0, i); // broadcast and pt2pt: rank 0's input
    }
}

// One call on fresh inputs; its output compared with the expected values. *ok: every rank's
// (true, unchecked, where the sums would not be exact in the type).
static dsc_status check(bench *b, int op, const shape *s, bool *ok) {
    for (size_t i = 0; i < s->in; i++)
        b->host[i] = value(b->rank, i);
    DSC_TRY(put(b, b->send, s->in));
    for (size_t i = 0; i < s->out; i++)
        b->host[i] = -1.0f;
    DSC_TRY(put(b, b->recv, s->out));
    DSC_TRY(call(b, op, s, NULL));
    bool receives = op != OP_PT2PT || b->rank == 1;
    bool good = true;
    if (op != OP_BROADCAST || b->rank != 0) {
        DSC_TRY(get(b, b->recv, s->out));
        for (size_t i = 0; receives && checkable(b) && good && i < s->out; i++)
            good = b->host[i] == expected(b, op, s, i);
    }
    float bad = good ? 0.0f : 1.0f;
    DSC_TRY(ranks_max(b, &bad));
    *ok = bad == 0.0f;
    return DSC_OK;
}

// Seconds per call: `trials` calls between barriers, the slowest rank's mean.
static dsc_status timed(bench *b, int op, const shape *s, double *seconds) {
    for (long long k = 0; k < b->warmups; k++)
        DSC_TRY(call(b, op, s, NULL));
    dsc_comm_req **reqs = b->async ? calloc((size_t)b->trials, sizeof *reqs) : NULL;
    if (b->async && !reqs) return dsc_fail(DSC_ERR_OOM, "dsc bench: out of memory");
    dsc_status st = dsc_comm_barrier(b->c, NULL);
    double t0 = dsc_now();
    for (long long k = 0; k < b->trials && st == DSC_OK; k++)
        st = call(b, op, s, reqs ? &reqs[k] : NULL);
    for (long long k = 0; reqs && k < b->trials; k++) {
        dsc_status w = reqs[k] ? dsc_comm_wait(reqs[k]) : DSC_OK;
        if (st == DSC_OK) st = w;
    }
    free(reqs);
    if (st == DSC_OK) st = dsc_comm_barrier(b->c, NULL);
    float mean = (float)((dsc_now() - t0) / (double)b->trials);
    if (st == DSC_OK) st = ranks_max(b, &mean);
    *seconds = mean;
    return st;
}

// ---- output (rank 0) ----

static void header(const bench *b, int op) {
    const char *unit = b->gbytes ? "GBps" : "Gbps";
    char tput[32], bus[32];
    snprintf(tput, sizeof tput, "Throughput (%s)", unit);
    snprintf(bus, sizeof bus, "BusBW (%s)", unit);
    printf("\n---- Performance of %s on %d devices "
           "---------------------------------------------------------\n",
           op_names[op], op == OP_PT2PT ? 2 : b->world);
    printf("%-20s %-25s %-20s %-20s %-20s\n", "Size (Bytes)", "Description",
           b->raw ? "Duration (us)" : "Duration", tput, bus);
    printf("----------------------------------------------------------------------------------"
           "------------------\n");
}

static void row(const bench *b, int op, size_t bytes, const shape *s, double seconds, bool ok) {
    double alg, bus;
    const char *name = op == OP_PT2PT ? "send" : op_names[op]; // pt2pt: S / t, as DeepSpeed's
    dsc_comm_log_bandwidth(name, (double)bytes, seconds * 1e3, b->world, &alg, &bus);
    if (b->gbytes) {
        alg /= 8;
        bus /= 8;
    }
    char size[32], desc[48], dur[32];
    if (b->raw)
        snprintf(size, sizeof size, "%zu", bytes);
    else
        dsc_comm_format_size(bytes, size, sizeof size);
    snprintf(desc, sizeof desc, "%zux%zu%s", s->count, b->es, ok ? "" : " (WRONG RESULT)");
    double us = seconds * 1e6;
    if (b->raw)
        snprintf(dur, sizeof dur, "%.3f", us);
    else if (us < 1e3)
        snprintf(dur, sizeof dur, "%.3f us", us);
    else
        snprintf(dur, sizeof dur, "%.3f ms", us / 1e3);
    printf("%-20s %-25s %-20s %-20.3f %-20.3f\n", size, desc, dur, alg, bus);
    fflush(stdout);
    if (b->json)
        fprintf(b->json,
                "{\"op\": \"%s\", \"backend\": \"%s\", \"world\": %d, \"dtype\": \"%s\", "
                "\"bytes\": %zu, \"count\": %zu, \"trials\": %lld, \"async\": %s, "
                "\"seconds\": %.9g, \"algbw_gbps\": %.6g, \"busbw_gbps\": %.6g, "
                "\"checked\": %s}\n",
                op_names[op], dsc_comm_backend(b->c), op == OP_PT2PT ? 2 : b->world,
                dsc_dtype_name(b->dt), bytes, s->count, b->trials, b->async ? "true" : "false",
                seconds, b->gbytes ? alg * 8 : alg, b->gbytes ? bus * 8 : bus,
                ok && checkable(b) ? "true" : "false");
}

// Every size of one operation. *wrong: some result was not what the inputs give.
static dsc_status run_op(bench *b, int op, int minp, int maxp, bool *wrong) {
    if (b->rank == 0) header(b, op);
    for (int p = minp; p <= maxp; p++) {
        size_t bytes = (size_t)1 << p;
        if (bytes < b->es) continue;
        shape s = shape_of(b, op, bytes);
        bool ok = false;
        double seconds = 0;
        DSC_TRY(check(b, op, &s, &ok));
        DSC_TRY(timed(b, op, &s, &seconds));
        if (!ok) *wrong = true;
        if (b->rank == 0) row(b, op, bytes, &s, seconds, ok);
    }
    return DSC_OK;
}

// ---- the verb ----

static bool parse_dtype(const char *s, dsc_dtype *dt) {
    static const struct {
        const char *name;
        dsc_dtype dt;
    } names[] = {{"float", DSC_DT_F32}, {"float32", DSC_DT_F32}, {"f32", DSC_DT_F32},
                 {"fp32", DSC_DT_F32},  {"half", DSC_DT_F16},    {"float16", DSC_DT_F16},
                 {"f16", DSC_DT_F16},   {"fp16", DSC_DT_F16},    {"bfloat16", DSC_DT_BF16},
                 {"bf16", DSC_DT_BF16}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(s, names[i].name)) {
            *dt = names[i].dt;
            return true;
        }
    return false;
}

// The comm backend and, for nccl, this rank's GPU.
static int open_comm(bench *b, const char *flag) {
    dsc_comm_opts o = dsc_comm_opts_default();
    const char *backend = flag ? flag : dsc_env("DSC_COMM_BACKEND");
    o.backend = backend && *backend ? backend : "shm";
    o.group_tag = "bench";
    b->device = !strcmp(o.backend, "nccl");
#ifndef DSC_WITH_CUDA
    if (b->device)
        return fprintf(stderr,
                       "dsc bench: DSC_COMM_BACKEND=nccl: this dsc was built without the "
                       "CUDA kernels, so it has no GPU buffers; rebuild with the CUDA toolkit, or "
                       "use shm or mpi\n"),
               1;
#else
    if (b->device) {
        int dev = 0;
        if (dsc_device_select(&dev) != DSC_OK)
            return fprintf(stderr, "dsc bench: DSC_COMM_BACKEND=nccl: %s\n", dsc_last_error()), 1;
        o.device = dev;
    }
#endif
    if (dsc_comm_create(&b->c, &o) != DSC_OK)
        return fprintf(stderr, "dsc bench: %s\n", dsc_last_error()), 1;
    b->rank = dsc_comm_rank(b->c);
    b->world = dsc_comm_size(b->c);
    return 0;
}

typedef struct bench_args {
    const char *trials, *warmups, *maxsize, *minsize, *dtype, *unit, *json, *backend;
    bool ops[NOPS], all_to_all, scan, async, raw;
} bench_args;

// Flags to the benchmark's settings; 2 on a usage error (printed).
static int settle_args(const bench_args *a, bench *b, int *minp, int *maxp) {
    long long v;
    b->trials = 50;
    b->warmups = 5;
    if (a->all_to_all) {
        fprintf(stderr, "dsc bench: --all-to-all: dsc's comm layer has no all-to-all (ZeRO does "
                        "not use one); choose from --all-reduce, --all-gather, --reduce-scatter, "
                        "--broadcast, --pt2pt\n");
        return 2;
    }
    if (a->trials && !cli_int("--trials", a->trials, 1, 1000000, &b->trials)) return 2;
    if (a->warmups && !cli_int("--warmups", a->warmups, 0, 1000000, &b->warmups)) return 2;
    *maxp = 24;
    if (a->maxsize && !cli_int("--maxsize", a->maxsize, 1, 34, &v)) return 2;
    if (a->maxsize) *maxp = (int)v;
    *minp = a->scan ? 6 : *maxp;
    if (a->minsize && !cli_int("--minsize", a->minsize, 1, 34, &v)) return 2;
    if (a->minsize) *minp = (int)v;
    if (*minp > *maxp) {
        fprintf(stderr, "dsc bench: --minsize %d is above --maxsize %d\n", *minp, *maxp);
        return 2;
    }
    b->dt = DSC_DT_F32;
    if (a->dtype && !parse_dtype(a->dtype, &b->dt)) {
        fprintf(stderr,
                "dsc bench: --dtype %s: expected float (float32, f32), half (float16, "
                "f16) or bfloat16 (bf16)\n",
                a->dtype);
        return 2;
    }
    b->es = b->dt == DSC_DT_F32 ? 4 : 2;
    if (a->unit && strcmp(a->unit, "Gbps") && strcmp(a->unit, "GBps")) {
        fprintf(stderr, "dsc bench: --bw-unit %s: expected Gbps or GBps\n", a->unit);
        return 2;
    }
    b->gbytes = a->unit && !strcmp(a->unit, "GBps");
    b->async = a->async;
    b->raw = a->raw;
    return 0;
}

static int run(bench *b, const bench_args *a, int minp, int maxp) {
    bool any = false, wrong = false;
    for (int op = 0; op < NOPS; op++)
        any |= a->ops[op];
    size_t need =
        ((size_t)1 << maxp) * (size_t)b->world; // all_gather's output, reduce_scatter's input
    if (alloc_buffers(b, need)) return 1;
    if (b->rank == 0)
        printf("dsc bench: %s backend, %d rank%s, %s, sizes 2^%d..2^%d bytes per rank, %lld "
               "trials after %lld warm-ups%s; duration: the slowest rank's mean per call\n",
               dsc_comm_backend(b->c), b->world, b->world == 1 ? "" : "s", dsc_dtype_name(b->dt),
               minp, maxp, b->trials, b->warmups, b->async ? " (issued asynchronously)" : "");
    if (b->rank == 0 && !checkable(b))
        printf("(results not checked: sums over %d ranks are not exact in %s)\n", b->world,
               dsc_dtype_name(b->dt));
    dsc_status st = DSC_OK;
    for (int op = 0; op < NOPS && st == DSC_OK; op++) {
        if (any && !a->ops[op]) continue;
        if (op == OP_PT2PT && b->world < 2) {
            if (b->rank == 0) printf("\n(pt2pt needs two ranks: left out at world 1)\n");
            continue;
        }
        st = run_op(b, op, minp, maxp, &wrong);
    }
    if (st != DSC_OK)
        return fprintf(stderr, "dsc bench: rank %d: %s\n", b->rank, dsc_last_error()), 1;
    if (wrong && b->rank == 0)
        fprintf(stderr,
                "dsc bench: some results were not what the inputs give (WRONG RESULT "
                "rows): the %s backend is broken on this machine\n",
                dsc_comm_backend(b->c));
    return wrong ? 1 : 0;
}

int cmd_bench(int argc, char **argv) {
    bench_args a = {0};
    const cli_flag flags[] = {
        {"--all-reduce", NULL, "run all_reduce (no operation flag: all of them)", NULL,
         &a.ops[OP_ALL_REDUCE]},
        {"--all-gather", NULL, "run all_gather", NULL, &a.ops[OP_ALL_GATHER]},
        {"--reduce-scatter", NULL, "run reduce_scatter", NULL, &a.ops[OP_REDUCE_SCATTER]},
        {"--broadcast", NULL, "run broadcast (from rank 0)", NULL, &a.ops[OP_BROADCAST]},
        {"--pt2pt", NULL, "run send/recv from rank 0 to rank 1", NULL, &a.ops[OP_PT2PT]},
        {"--all-to-all", NULL, "(ds_bench's; not in dsc's comm layer: an error)", NULL,
         &a.all_to_all},
        {"--scan", NULL, "every power of two from 2^minsize to 2^maxsize bytes", NULL, &a.scan},
        {"--maxsize", "P",
         "largest message: 2^P bytes per rank (default 24: 16 MiB); the only "
         "one without --scan",
         &a.maxsize, NULL},
        {"--minsize", "P", "smallest message with --scan: 2^P bytes (default 6)", &a.minsize, NULL},
        {"--trials", "N", "timed calls per size (default 50)", &a.trials, NULL},
        {"--warmups", "N", "untimed calls before them (default 5)", &a.warmups, NULL},
        {"--dtype", "T", "float (default), half or bfloat16", &a.dtype, NULL},
        {"--bw-unit", "U", "Gbps (default) or GBps", &a.unit, NULL},
        {"--async-op", NULL, "issue the timed calls without waiting, then wait for all", NULL,
         &a.async},
        {"--raw", NULL, "sizes in bytes and durations in microseconds, without units", NULL,
         &a.raw},
        {"--json", "FILE", "also write one JSON line per measurement (rank 0)", &a.json, NULL},
        {"--backend", "NAME", "shm, mpi or nccl (default: DSC_COMM_BACKEND, else shm)", &a.backend,
         NULL},
    };
    const cli_verb v = {"bench",
                        "dsc bench [comm] [flags]   (under dsc launch for several ranks)",
                        "Communication benchmarks, as DeepSpeed's ds_bench: every rank runs the "
                        "selected collectives over DSC_COMM_BACKEND (shm by default, mpi, or nccl "
                        "with GPU buffers); rank 0 prints one table per operation (size, "
                        "description, duration, throughput, bus bandwidth). Each size's result is "
                        "checked first; exit 1 when one is wrong. Without a launcher's "
                        "environment it runs as one rank.",
                        flags,
                        (int)(sizeof flags / sizeof flags[0]),
                        0,
                        1};
    char *pos[1];
    int npos = 0;
    int rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (npos == 1 && strcmp(pos[0], "comm")) {
        fprintf(stderr, "dsc bench: unknown benchmark '%s'; the one built is comm\n", pos[0]);
        return 2;
    }
    bench b = {0};
    int minp, maxp;
    if ((rc = settle_args(&a, &b, &minp, &maxp))) return rc;
    if (open_comm(&b, a.backend)) return 1;
    if (a.json && b.rank == 0 && !(b.json = fopen(a.json, "w"))) {
        fprintf(stderr, "dsc bench: --json %s: cannot write it\n", a.json);
        dsc_comm_destroy(b.c);
        return 1;
    }
    rc = run(&b, &a, minp, maxp);
    if (b.json && fclose(b.json) != 0 && !rc) {
        fprintf(stderr, "dsc bench: --json %s: write failed\n", a.json);
        rc = 1;
    }
    free_buffers(&b);
    dsc_comm_destroy(b.c);
    return rc;
}
