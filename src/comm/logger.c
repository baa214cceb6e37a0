// comm/logger.c - the comms logger: per (operation, message size, world) counts and latencies of
// every completed operation, recorded by the dsc_comm_* wrappers so that every backend is covered.
#include <pthread.h>   // pthread_mutex_*
#include <stdatomic.h> // atomic_bool
#include <stdint.h>  // uint64_t
#include <stdio.h>   // FILE, fprintf
#include <stdlib.h>  // realloc, free, qsort
#include <string.h>  // strcmp, memmove

#include "base/status.h"  // dsc__fail
#include "comm/backend.h" // dsc__comm_op, dsc__op_name

// Latencies kept per entry for the trimmed mean; beyond that only count and total grow (the
// mean then describes the first samples, which a run of that length has plenty of).
#define MAX_SAMPLES (1u << 20)

typedef struct log_entry {
    dsc__op_kind kind;
    uint64_t bytes;
    int world;
    uint64_t count;
    double total_ms;
    double *ms; // the first min(count, MAX_SAMPLES) latencies
    size_t nms, cap;
} log_entry;

static struct {
    pthread_mutex_t mu;
    atomic_bool enabled; // read without the lock: an operation costs nothing while off
    unsigned ops;
    log_entry *e;
    size_t n, cap;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const struct {
    const char *name;
    unsigned bit;
} op_names[] = {
    {"all_reduce", DSC_COMM_LOG_ALL_REDUCE},
    {"reduce_scatter", DSC_COMM_LOG_REDUCE_SCATTER},
    {"reduce_scatter_tensor", DSC_COMM_LOG_REDUCE_SCATTER},
    {"all_gather", DSC_COMM_LOG_ALL_GATHER},
    {"all_gather_into_tensor", DSC_COMM_LOG_ALL_GATHER},
    {"broadcast", DSC_COMM_LOG_BROADCAST},
    {"reduce", DSC_COMM_LOG_REDUCE},
    {"barrier", DSC_COMM_LOG_BARRIER},
    {"send", DSC_COMM_LOG_SEND},
    {"isend", DSC_COMM_LOG_SEND},
    {"recv", DSC_COMM_LOG_RECV},
    {"irecv", DSC_COMM_LOG_RECV},
};

dsc_status dsc_comm_log_op_bit(const char *name, unsigned *bit) {
    for (size_t i = 0; name && i < sizeof op_names / sizeof op_names[0]; i++) {
        if (strcmp(op_names[i].name, name) != 0) continue;
        *bit = op_names[i].bit;
        return DSC_OK;
    }
    return dsc__fail(DSC_ERR_INVALID_ARG, "comms logger: unknown operation '%s'; known: "
                     "all_reduce, reduce_scatter(_tensor), all_gather(_into_tensor), broadcast, "
                     "reduce, barrier, (i)send, (i)recv", name ? name : "(null)");
}

void dsc_comm_logger_configure(bool enabled, unsigned ops) {
    pthread_mutex_lock(&g.mu);
    g.enabled = enabled;
    g.ops = ops;
    pthread_mutex_unlock(&g.mu);
}

void dsc_comm_logger_reset(void) {
    pthread_mutex_lock(&g.mu);
    for (size_t i = 0; i < g.n; i++) free(g.e[i].ms);
    free(g.e);
    g.e = NULL;
    g.n = g.cap = 0;
    pthread_mutex_unlock(&g.mu);
}

// Per-rank message size: what one rank contributes (all_gather) or receives (reduce_scatter).
static uint64_t msg_bytes(const dsc__comm_op *op) {
    return op->kind == DSC__OP_BARRIER ? 0 : (uint64_t)op->count * dsc_dtype_size(op->dt);
}

// The entry of (kind, bytes, world), kept sorted so that the summary needs no sort; NULL when
// out of memory (the sample is then dropped).
static log_entry *find_entry(dsc__op_kind kind, uint64_t bytes, int world) {
    size_t i = 0;
    for (; i < g.n; i++) {
        log_entry *e = &g.e[i];
        if (e->kind == kind && e->bytes == bytes && e->world == world) return e;
        if (e->kind > kind || (e->kind == kind && (e->bytes > bytes ||
                                                   (e->bytes == bytes && e->world > world))))
            break;
    }
    if (g.n == g.cap) {
        size_t cap = g.cap ? 2 * g.cap : 16;
        log_entry *ne = realloc(g.e, cap * sizeof *ne);
        if (!ne) return NULL;
        g.e = ne;
        g.cap = cap;
    }
    memmove(&g.e[i + 1], &g.e[i], (g.n - i) * sizeof *g.e);
    g.n++;
    g.e[i] = (log_entry){.kind = kind, .bytes = bytes, .world = world};
    return &g.e[i];
}

void dsc__comm_log_record(const dsc__comm_op *op, int world, double seconds) {
    if (!atomic_load_explicit(&g.enabled, memory_order_relaxed)) return;
    pthread_mutex_lock(&g.mu);
    bool wanted = g.enabled && (g.ops & (1u << op->kind));
    log_entry *e = wanted ? find_entry(op->kind, msg_bytes(op), world) : NULL;
    if (e) {
        double ms = seconds * 1e3;
        e->count++;
        e->total_ms += ms;
        if (e->nms == e->cap && e->cap < MAX_SAMPLES) {
            size_t cap = e->cap ? 2 * e->cap : 8;
            double *nm = realloc(e->ms, cap * sizeof *nm);
            if (nm) e->ms = nm, e->cap = cap;
        }
        if (e->nms < e->cap) e->ms[e->nms++] = ms;
    }
    pthread_mutex_unlock(&g.mu);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// scipy's trim_mean(v, 0.1): drop int(0.1 n) values at each end of the sorted samples.
static double trim_mean(double *v, size_t n) {
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t cut = n / 10;
    double s = 0;
    for (size_t i = cut; i < n - cut; i++) s += v[i];
    return s / (double)(n - 2 * cut);
}

void dsc_comm_log_bandwidth(const char *op, double msg_bytes, double ms, int world,
                            double *algbw_gbps, double *busbw_gbps) {
    double n = world > 0 ? world : 1, rate = ms > 0 ? msg_bytes / ms : 0, alg = rate, bus = rate;
    if (!strcmp(op, "all_reduce")) {
        alg = 2 * rate;
        bus = rate * 2 * (n - 1) / n;
    } else if (!strcmp(op, "all_gather") || !strcmp(op, "reduce_scatter")) {
        alg = n * rate;
        bus = n * rate * (n - 1) / n;
    }
    // bytes per ms -> bits per s / 1e9
    *algbw_gbps = alg * 8 / 1e6;
    *busbw_gbps = bus * 8 / 1e6;
}

size_t dsc_comm_logger_entries(dsc_comm_log_entry *out, size_t cap) {
    pthread_mutex_lock(&g.mu);
    for (size_t i = 0; i < g.n && i < cap; i++) {
        log_entry *e = &g.e[i];
        dsc_comm_log_entry *o = &out[i];
        *o = (dsc_comm_log_entry){.op = dsc__op_name(e->kind), .msg_bytes = e->bytes,
                                  .world = e->world, .count = e->count, .total_ms = e->total_ms};
        o->avg_ms = trim_mean(e->ms, e->nms);
        dsc_comm_log_bandwidth(o->op, (double)e->bytes, o->avg_ms, e->world, &o->algbw_gbps,
                               &o->busbw_gbps);
    }
    size_t n = g.n;
    pthread_mutex_unlock(&g.mu);
    return n;
}

void dsc_comm_format_size(uint64_t b, char *buf, size_t cap) {
    static const char *const names[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
    if (b == 0) {
        snprintf(buf, cap, "0B");
        return;
    }
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 6) v /= 1024, i++;
    char num[32];
    snprintf(num, sizeof num, "%.2f", v);
    size_t len = strlen(num); // Python prints 4.0, 4.5, 4.25: trailing zeros go, one stays
    while (len > 0 && num[len - 1] == '0' && num[len - 2] != '.') num[--len] = '\0';
    snprintf(buf, cap, "%s %s", num, names[i]);
}

void dsc_comm_logger_print(void *out) {
    FILE *f = out;
    size_t n = dsc_comm_logger_entries(NULL, 0);
    dsc_comm_log_entry *e = calloc(n ? n : 1, sizeof *e);
    if (!e) return;
    n = dsc_comm_logger_entries(e, n);
    fprintf(f, "%-20s%-20s%-20s%-20s%-20s%-20s%-20s\n", "Comm. Op", "Message Size", "Count",
            "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(e[i].op, e[i - 1].op) != 0) fprintf(f, "%s\n", e[i].op);
        char size[32];
        dsc_comm_format_size(e[i].msg_bytes, size, sizeof size);
        fprintf(f, "%-20s%-20s%-20llu%-20.2f%-20.2f%-20.2f%-20.2f\n", "", size,
                (unsigned long long)e[i].count, e[i].total_ms, e[i].avg_ms, e[i].algbw_gbps,
                e[i].busbw_gbps);
    }
    free(e);
}
