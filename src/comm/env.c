// comm/env.c - where this process sits in the job: torch, Open MPI or SLURM variables, and SLURM
// host lists.
#include <limits.h> // INT_MAX
#include <stdio.h>  // snprintf
#include <stdlib.h> // getenv, strtol, malloc, free
#include <string.h> // memcpy, strlen, strchr

#include "base/status.h" // dsc__fail, DSC_TRY
#include "dsc/comm.h"    // dsc_comm_env_info, dsc_hostlist_expand

#define HOSTLIST_MAX 1000000

// ---- integers from the environment ----

// *present = whether the variable is set (and non-empty); the value must lie in lo..hi.
static dsc_status env_int(const char *name, long lo, long hi, int *out, bool *present) {
    const char *v = getenv(name);
    *present = v && *v;
    if (!*present) return DSC_OK;
    char *end = NULL;
    long x = strtol(v, &end, 10);
    if (end == v || *end || x < lo || x > hi)
        return dsc__fail(DSC_ERR_CONFIG,
                         "environment variable %s=\"%s\" is not an integer in %ld..%ld; fix or "
                         "unset it",
                         name, v, lo, hi);
    *out = (int)x;
    return DSC_OK;
}

// Both of a pair, or neither.
static dsc_status env_pair(const char *a, const char *b, int *va, int *vb, bool *present) {
    bool pa, pb;
    DSC_TRY(env_int(a, 0, INT_MAX - 1, va, &pa));
    DSC_TRY(env_int(b, 1, INT_MAX, vb, &pb));
    if (pa != pb)
        return dsc__fail(DSC_ERR_CONFIG, "%s is set but %s is not; set both (or neither)",
                         pa ? a : b, pa ? b : a);
    if (pa && *va >= *vb)
        return dsc__fail(DSC_ERR_CONFIG, "%s=%d is not below %s=%d", a, *va, b, *vb);
    *present = pa;
    return DSC_OK;
}

// Optional local rank/size pair; absent: one node (local = global).
static dsc_status env_local(dsc_comm_env_info *e, const char *rank_var, const char *size_var) {
    bool pr, ps;
    int lr = e->rank, lw = e->world_size;
    DSC_TRY(env_int(rank_var, 0, INT_MAX - 1, &lr, &pr));
    DSC_TRY(env_int(size_var, 1, INT_MAX, &lw, &ps));
    if (lr >= lw)
        return dsc__fail(DSC_ERR_CONFIG, "%s=%d is not below the local world size %d", rank_var,
                         lr, lw);
    e->local_rank = lr;
    e->local_world_size = lw;
    return DSC_OK;
}

// ---- SLURM ----

int dsc_slurm_tasks_on_node(const char *spec, int node) {
    const char *p = spec;
    if (!p || node < 0) return -1;
    while (*p) {
        char *end = NULL;
        long tasks = strtol(p, &end, 10), repeat = 1;
        if (end == p || tasks < 1) return -1;
        p = end;
        if (p[0] == '(' && p[1] == 'x') {
            repeat = strtol(p + 2, &end, 10);
            if (end == p + 2 || *end != ')' || repeat < 1) return -1;
            p = end + 1;
        }
        if (node < repeat) return (int)tasks;
        node -= (int)repeat;
        if (*p == ',') p++;
        else if (*p) return -1;
    }
    return -1;
}

static dsc_status slurm_local(dsc_comm_env_info *e) {
    bool pr, pn;
    int lr = 0, node = 0;
    DSC_TRY(env_int("SLURM_LOCALID", 0, INT_MAX - 1, &lr, &pr));
    DSC_TRY(env_int("SLURM_NODEID", 0, INT_MAX - 1, &node, &pn));
    int lw = e->world_size; // one node unless told otherwise
    const char *tpn = getenv("SLURM_TASKS_PER_NODE");
    if (tpn && *tpn) {
        lw = dsc_slurm_tasks_on_node(tpn, node);
        if (lw < 1)
            return dsc__fail(DSC_ERR_CONFIG,
                             "SLURM_TASKS_PER_NODE=\"%s\" has no entry for SLURM_NODEID=%d", tpn,
                             node);
    }
    if (!pr) lr = e->rank % lw;
    if (lr >= lw)
        return dsc__fail(DSC_ERR_CONFIG, "SLURM_LOCALID=%d is not below the %d tasks of its node",
                         lr, lw);
    e->local_rank = lr;
    e->local_world_size = lw;
    return DSC_OK;
}

dsc_status dsc_slurm_first_host(char *out, size_t cap) {
    const char *list = getenv("SLURM_JOB_NODELIST");
    if (!list || !*list) list = getenv("SLURM_NODELIST");
    if (!list || !*list) return DSC_OK;
    char **hosts = NULL;
    size_t n = 0;
    dsc_status st = dsc_hostlist_expand(list, &hosts, &n);
    if (st != DSC_OK) {
        dsc__error_prefix("SLURM node list (SLURM_JOB_NODELIST or SLURM_NODELIST): ");
        return DSC_ERR_CONFIG;
    }
    if (n) snprintf(out, cap, "%s", hosts[0]);
    dsc_hostlist_free(hosts, n);
    return DSC_OK;
}

// ---- public ----

dsc_status dsc_comm_env(dsc_comm_env_info *e) {
    if (!e) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_comm_env: NULL argument");
    *e = (dsc_comm_env_info){.world_size = 1, .local_world_size = 1, .master_port = 29500,
                             .source = "default"};
    snprintf(e->master_addr, sizeof e->master_addr, "127.0.0.1");
    bool found = false;
    DSC_TRY(env_pair("RANK", "WORLD_SIZE", &e->rank, &e->world_size, &found));
    if (found) {
        e->source = "torch";
        DSC_TRY(env_local(e, "LOCAL_RANK", "LOCAL_WORLD_SIZE"));
    } else {
        DSC_TRY(env_pair("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", &e->rank,
                         &e->world_size, &found));
        if (found) {
            e->source = "ompi";
            DSC_TRY(env_local(e, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"));
        } else {
            DSC_TRY(env_pair("SLURM_PROCID", "SLURM_NTASKS", &e->rank, &e->world_size, &found));
            if (found) {
                e->source = "slurm";
                DSC_TRY(slurm_local(e));
                DSC_TRY(dsc_slurm_first_host(e->master_addr, sizeof e->master_addr));
            }
        }
    }
    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) snprintf(e->master_addr, sizeof e->master_addr, "%s", addr);
    bool has_port;
    DSC_TRY(env_int("MASTER_PORT", 1, 65535, &e->master_port, &has_port));
    return DSC_OK;
}

// ---- host lists ----

typedef struct hostvec {
    char **v;
    size_t n, cap;
} hostvec;

static dsc_status hv_push(hostvec *h, const char *s, size_t len) {
    if (h->n >= HOSTLIST_MAX)
        return dsc__fail(DSC_ERR_INVALID_ARG, "host list expands to more than %d hosts",
                         HOSTLIST_MAX);
    if (h->n == h->cap) {
        size_t c = h->cap ? h->cap * 2 : 16;
        char **v = realloc(h->v, c * sizeof *v);
        if (!v) return dsc__fail(DSC_ERR_OOM, "host list: out of memory");
        h->v = v;
        h->cap = c;
    }
    char *copy = malloc(len + 1);
    if (!copy) return dsc__fail(DSC_ERR_OOM, "host list: out of memory");
    memcpy(copy, s, len);
    copy[len] = '\0';
    h->v[h->n++] = copy;
    return DSC_OK;
}

static bool all_digits(const char *s, size_t len) {
    if (!len || len > 9) return false;
    for (size_t i = 0; i < len; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

static dsc_status expand(hostvec *h, const char *item, size_t len, const char *spec);

// One "lo-hi" or "n" of a bracket: prefix + each number (zero-padded to lo's width) + rest.
static dsc_status expand_range(hostvec *h, const char *pre, size_t plen, const char *r,
                               size_t rlen, const char *rest, size_t tlen, const char *spec) {
    const char *dash = memchr(r, '-', rlen);
    size_t llen = dash ? (size_t)(dash - r) : rlen;
    const char *hi_s = dash ? dash + 1 : r;
    size_t hlen = dash ? rlen - llen - 1 : rlen;
    if (!all_digits(r, llen) || !all_digits(hi_s, hlen))
        return dsc__fail(DSC_ERR_INVALID_ARG, "host list \"%s\": bad range \"%.*s\"", spec,
                         (int)rlen, r);
    long lo = strtol(r, NULL, 10), hi = strtol(hi_s, NULL, 10);
    if (lo > hi)
        return dsc__fail(DSC_ERR_INVALID_ARG, "host list \"%s\": range \"%.*s\" runs backwards",
                         spec, (int)rlen, r);
    if (hi - lo >= HOSTLIST_MAX)
        return dsc__fail(DSC_ERR_INVALID_ARG, "host list expands to more than %d hosts",
                         HOSTLIST_MAX);
    char *buf = malloc(plen + 16 + tlen);
    if (!buf) return dsc__fail(DSC_ERR_OOM, "host list: out of memory");
    dsc_status st = DSC_OK;
    for (long v = lo; v <= hi && st == DSC_OK; v++) {
        memcpy(buf, pre, plen);
        int k = snprintf(buf + plen, 16, "%0*ld", (int)llen, v);
        memcpy(buf + plen + (size_t)k, rest, tlen);
        st = expand(h, buf, plen + (size_t)k + tlen, spec);
    }
    free(buf);
    return st;
}

// Expand the first bracket group of item, recursing for later groups.
static dsc_status expand(hostvec *h, const char *item, size_t len, const char *spec) {
    const char *lb = memchr(item, '[', len);
    if (!lb) {
        if (memchr(item, ']', len) || !len)
            return dsc__fail(DSC_ERR_INVALID_ARG, "host list \"%s\": bad host \"%.*s\"", spec,
                             (int)len, item);
        return hv_push(h, item, len);
    }
    const char *rb = memchr(lb, ']', len - (size_t)(lb - item));
    if (!rb || rb == lb + 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "host list \"%s\": unbalanced or empty brackets",
                         spec);
    size_t plen = (size_t)(lb - item), tlen = len - (size_t)(rb + 1 - item);
    for (const char *r = lb + 1;; r++) { // every item, empty ones too ("n[1,]" is an error)
        const char *comma = memchr(r, ',', (size_t)(rb - r));
        const char *end = comma ? comma : rb;
        DSC_TRY(expand_range(h, item, plen, r, (size_t)(end - r), rb + 1, tlen, spec));
        if (end == rb) return DSC_OK;
        r = end;
    }
}

dsc_status dsc_hostlist_expand(const char *spec, char ***hosts, size_t *n) {
    if (!spec || !hosts || !n) return dsc__fail(DSC_ERR_INVALID_ARG, "host list: NULL argument");
    *hosts = NULL, *n = 0;
    hostvec h = {0};
    dsc_status st = DSC_OK;
    size_t len = strlen(spec), start = 0;
    int depth = 0;
    for (size_t i = 0; i <= len && st == DSC_OK; i++) {
        char ch = spec[i];
        if (ch == '[') depth++;
        if (ch == ']') depth--;
        if (depth < 0 || depth > 1) {
            st = dsc__fail(DSC_ERR_INVALID_ARG, "host list \"%s\": unbalanced brackets", spec);
        } else if ((ch == ',' && depth == 0) || ch == '\0') {
            if (depth) st = dsc__fail(DSC_ERR_INVALID_ARG, "host list \"%s\": missing ]", spec);
            else st = expand(&h, spec + start, i - start, spec);
            start = i + 1;
        }
    }
    if (st != DSC_OK) {
        dsc_hostlist_free(h.v, h.n);
        return st;
    }
    *hosts = h.v;
    *n = h.n;
    return DSC_OK;
}

void dsc_hostlist_free(char **hosts, size_t n) {
    if (!hosts) return;
    for (size_t i = 0; i < n; i++) free(hosts[i]);
    free(hosts);
}
