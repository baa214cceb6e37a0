// launch/hosts.c - hostfiles, include/exclude filters, node and slot limits, SLURM host lists.
#include "launch/hosts.h"

#include <stdbool.h> // bool
#include <stdio.h>   // snprintf
#include <stdlib.h>  // malloc, calloc, free, strtol
#include <string.h>  // strlen, strchr, strncmp, memcpy

#include "base/status.h" // dsc__fail, DSC_TRY
#include "launch/strv.h" // dsc__sbuf, dsc__launch_read_file

#define HOSTFILE_MAX_BYTES (16u << 20)

// ---- pools ----

void dsc__launch_pool_free(dsc__launch_pool *p) {
    for (int i = 0; i < p->nhosts; i++) {
        free(p->hosts[i].name);
        free(p->hosts[i].slots);
    }
    free(p->hosts);
    *p = (dsc__launch_pool){0};
}

// Append a host with a copy of the first `len` characters of name and no slots; returns it.
static dsc_status pool_add(dsc__launch_pool *p, const char *name, size_t len,
                           dsc__launch_host **out) {
    dsc__launch_host *h = realloc(p->hosts, (size_t)(p->nhosts + 1) * sizeof *h);
    if (!h) return dsc__fail(DSC_ERR_OOM, "out of memory adding host %.*s", (int)len, name);
    p->hosts = h;
    h = &p->hosts[p->nhosts];
    *h = (dsc__launch_host){.name = strndup(name, len)};
    if (!h->name) return dsc__fail(DSC_ERR_OOM, "out of memory adding host %.*s", (int)len, name);
    p->nhosts++;
    *out = h;
    return DSC_OK;
}

// Give h the slots 0..n-1.
static dsc_status host_range(dsc__launch_host *h, int n) {
    h->slots = malloc((size_t)n * sizeof *h->slots);
    if (!h->slots) return dsc__fail(DSC_ERR_OOM, "out of memory for %d slots", n);
    for (int s = 0; s < n; s++) h->slots[s] = s;
    h->nslots = n;
    return DSC_OK;
}

int dsc__launch_pool_find(const dsc__launch_pool *p, const char *host) {
    for (int i = 0; i < p->nhosts; i++)
        if (!strcmp(p->hosts[i].name, host)) return i;
    return -1;
}

int dsc__launch_pool_size(const dsc__launch_pool *p) {
    int n = 0;
    for (int i = 0; i < p->nhosts; i++) n += p->hosts[i].nslots;
    return n;
}

dsc_status dsc__launch_pool_local(int nslots, dsc__launch_pool *out) {
    *out = (dsc__launch_pool){0};
    if (nslots < 1 || nslots > DSC_LAUNCH_MAX_SLOTS)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%d processes asked for; expected 1..%d", nslots,
                         DSC_LAUNCH_MAX_SLOTS);
    dsc__launch_host *h = NULL;
    dsc_status st = pool_add(out, "localhost", 9, &h);
    if (st == DSC_OK) st = host_range(h, nslots);
    if (st != DSC_OK) dsc__launch_pool_free(out);
    return st;
}

dsc_status dsc__launch_pool_copy(const dsc__launch_pool *in, dsc__launch_pool *out) {
    *out = (dsc__launch_pool){0};
    for (int i = 0; i < in->nhosts; i++) {
        const dsc__launch_host *src = &in->hosts[i];
        dsc__launch_host *h = NULL;
        dsc_status st = pool_add(out, src->name, strlen(src->name), &h);
        if (st == DSC_OK && !(h->slots = malloc((size_t)src->nslots * sizeof *h->slots + 1)))
            st = dsc__fail(DSC_ERR_OOM, "out of memory copying the host list");
        if (st != DSC_OK) {
            dsc__launch_pool_free(out);
            return st;
        }
        memcpy(h->slots, src->slots, (size_t)src->nslots * sizeof *h->slots);
        h->nslots = src->nslots;
    }
    return DSC_OK;
}

void dsc__launch_pool_remove(dsc__launch_pool *p, const char *host) {
    int i = dsc__launch_pool_find(p, host);
    if (i < 0) return;
    free(p->hosts[i].name);
    free(p->hosts[i].slots);
    memmove(&p->hosts[i], &p->hosts[i + 1], (size_t)(p->nhosts - i - 1) * sizeof *p->hosts);
    p->nhosts--;
}

// ---- hostfiles ----

static bool blank(char c) { return c == ' ' || c == '\t' || c == '\r'; }

// Parse a whole number made of digits only, in 1..hi; false otherwise.
static bool parse_count(const char *s, size_t len, long hi, long *out) {
    if (!len || len > 9) return false;
    long x = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        x = x * 10 + (s[i] - '0');
    }
    if (x < 1 || x > hi) return false;
    *out = x;
    return true;
}

// One hostfile line (without its newline), trailing "# comment" allowed.
static dsc_status hostfile_line(const char *line, size_t len, const char *origin, int lineno,
                                dsc__launch_pool *p) {
    const char *hash = memchr(line, '#', len);
    size_t n = hash ? (size_t)(hash - line) : len;
    while (n && blank(line[n - 1])) n--;
    size_t i = 0;
    while (i < n && blank(line[i])) i++;
    if (i == n) return DSC_OK;
    size_t h0 = i;
    while (i < n && !blank(line[i])) i++;
    size_t h1 = i;
    while (i < n && blank(line[i])) i++;
    long slots = 0;
    bool ok = h1 > h0 && n - i > 6 && !strncmp(line + i, "slots=", 6) &&
              parse_count(line + i + 6, n - i - 6, DSC_LAUNCH_MAX_SLOTS, &slots);
    if (!ok)
        return dsc__fail(DSC_ERR_CONFIG,
                         "hostfile %s line %d: expected 'HOST slots=N' (N in 1..%d), got '%.*s'",
                         origin, lineno, DSC_LAUNCH_MAX_SLOTS, (int)(n - h0), line + h0);
    const char *name = line + h0;
    size_t nlen = h1 - h0;
    if (memchr(name, ':', nlen) || memchr(name, '@', nlen) || memchr(name, ',', nlen))
        return dsc__fail(DSC_ERR_CONFIG,
                         "hostfile %s line %d: host name '%.*s' may not contain ':', '@' or ','",
                         origin, lineno, (int)nlen, name);
    for (int k = 0; k < p->nhosts; k++)
        if (strlen(p->hosts[k].name) == nlen && !strncmp(p->hosts[k].name, name, nlen))
            return dsc__fail(DSC_ERR_CONFIG,
                             "hostfile %s line %d: host '%.*s' is listed twice; give each host "
                             "once with its total slots",
                             origin, lineno, (int)nlen, name);
    dsc__launch_host *h = NULL;
    DSC_TRY(pool_add(p, name, nlen, &h));
    return host_range(h, (int)slots);
}

dsc_status dsc__launch_hostfile_parse(const char *text, const char *origin,
                                      dsc__launch_pool *out) {
    *out = (dsc__launch_pool){0};
    int lineno = 1;
    for (const char *p = text; *p; lineno++) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        dsc_status st = hostfile_line(p, len, origin, lineno, out);
        if (st != DSC_OK) {
            dsc__launch_pool_free(out);
            return st;
        }
        p += len + (nl ? 1 : 0);
    }
    if (!out->nhosts)
        return dsc__fail(DSC_ERR_CONFIG,
                         "hostfile %s lists no hosts; write one 'HOST slots=N' line per node",
                         origin);
    return DSC_OK;
}

dsc_status dsc__launch_hostfile_read(const char *path, dsc__launch_pool *out) {
    char *text = NULL;
    DSC_TRY(dsc__launch_read_file(path, HOSTFILE_MAX_BYTES, &text));
    dsc_status st = dsc__launch_hostfile_parse(text, path, out);
    free(text);
    return st;
}

// ---- filters: "host1:0,1@host2" ----

// One parsed filter entry; nslots == -1 means "every slot of the host".
typedef struct filter_entry {
    char name[256];
    int *slots;
    int nslots;
} filter_entry;

static dsc_status parse_slot_list(const char *s, size_t len, const char *flag, filter_entry *e) {
    e->nslots = 0;
    e->slots = malloc((len / 2 + 1) * sizeof *e->slots);
    if (!e->slots) return dsc__fail(DSC_ERR_OOM, "out of memory parsing %s", flag);
    size_t i = 0;
    while (i <= len) {
        size_t j = i;
        while (j < len && s[j] != ',') j++;
        long v = 0;
        bool zero = j - i == 1 && s[i] == '0';
        if (!zero && !parse_count(s + i, j - i, DSC_LAUNCH_MAX_SLOTS - 1, &v))
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "%s: slot '%.*s' of host '%s' is not a whole number in 0..%d", flag,
                             (int)(j - i), s + i, e->name, DSC_LAUNCH_MAX_SLOTS - 1);
        e->slots[e->nslots++] = (int)v;
        i = j + 1;
    }
    return DSC_OK;
}

static dsc_status parse_entry(const char *s, size_t len, const char *flag, filter_entry *e) {
    const char *colon = memchr(s, ':', len);
    size_t nlen = colon ? (size_t)(colon - s) : len;
    if (!nlen)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "%s: empty host name in '%.*s'; expected HOST or HOST:S1,S2 entries "
                         "joined by '@'",
                         flag, (int)len, s);
    if (nlen >= sizeof e->name)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: host name longer than %zu characters", flag,
                         sizeof e->name - 1);
    memcpy(e->name, s, nlen);
    e->name[nlen] = '\0';
    e->slots = NULL;
    e->nslots = -1;
    if (!colon) return DSC_OK;
    if (nlen + 1 == len)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: host '%s' has ':' but no slots after it", flag,
                         e->name);
    return parse_slot_list(colon + 1, len - nlen - 1, flag, e);
}

static void free_entries(filter_entry *es, int n) {
    for (int i = 0; i < n; i++) free(es[i].slots);
    free(es);
}

// Split "a:0,1@b" into entries; *n entries, caller frees with free_entries.
static dsc_status parse_filter(const char *spec, const char *flag, filter_entry **out, int *n) {
    int cap = 1;
    for (const char *p = spec; *p; p++) cap += *p == '@';
    filter_entry *es = calloc((size_t)cap, sizeof *es);
    if (!es) return dsc__fail(DSC_ERR_OOM, "out of memory parsing %s", flag);
    int k = 0;
    dsc_status st = DSC_OK;
    const char *p = spec;
    for (;;) {
        const char *at = strchr(p, '@');
        size_t len = at ? (size_t)(at - p) : strlen(p);
        if (!len) {
            st = dsc__fail(DSC_ERR_INVALID_ARG,
                           "%s '%s': empty entry; expected HOST or HOST:S1,S2 entries joined by "
                           "'@'",
                           flag, spec);
            break;
        }
        st = parse_entry(p, len, flag, &es[k]);
        k++;
        if (st != DSC_OK || !at) break;
        p = at + 1;
    }
    if (st != DSC_OK) {
        free_entries(es, k);
        return st;
    }
    *out = es;
    *n = k;
    return DSC_OK;
}

static bool host_has(const dsc__launch_host *h, int slot) {
    for (int s = 0; s < h->nslots; s++)
        if (h->slots[s] == slot) return true;
    return false;
}

// Check every entry against the pool: hosts and slots must exist.
static dsc_status check_entries(const dsc__launch_pool *in, const filter_entry *es, int n,
                                const char *flag) {
    for (int i = 0; i < n; i++) {
        int h = dsc__launch_pool_find(in, es[i].name);
        if (h < 0)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "%s: host '%s' is not among the %d available host(s) (first: '%s')",
                             flag, es[i].name, in->nhosts, in->nhosts ? in->hosts[0].name : "");
        const dsc__launch_host *host = &in->hosts[h];
        for (int s = 0; s < es[i].nslots; s++)
            if (!host_has(host, es[i].slots[s]))
                return dsc__fail(DSC_ERR_INVALID_ARG,
                                 "%s: host '%s' has no slot %d (it has %d slots)", flag,
                                 es[i].name, es[i].slots[s], host->nslots);
    }
    return DSC_OK;
}

// Whether slot `slot` of host `name` is named by the entries (an entry without slots names all).
static bool named(const filter_entry *es, int n, const char *name, int slot) {
    for (int i = 0; i < n; i++) {
        if (strcmp(es[i].name, name)) continue;
        if (es[i].nslots < 0) return true;
        for (int s = 0; s < es[i].nslots; s++)
            if (es[i].slots[s] == slot) return true;
    }
    return false;
}

// out = the slots of `in` that are named (include) or not named (exclude), in `in` order.
static dsc_status apply_filter(const dsc__launch_pool *in, const filter_entry *es, int n,
                               bool include, dsc__launch_pool *out) {
    for (int i = 0; i < in->nhosts; i++) {
        const dsc__launch_host *src = &in->hosts[i];
        int keep = 0;
        for (int s = 0; s < src->nslots; s++)
            keep += named(es, n, src->name, src->slots[s]) == include;
        if (!keep) continue;
        dsc__launch_host *h = NULL;
        DSC_TRY(pool_add(out, src->name, strlen(src->name), &h));
        h->slots = malloc((size_t)keep * sizeof *h->slots);
        if (!h->slots) return dsc__fail(DSC_ERR_OOM, "out of memory filtering hosts");
        for (int s = 0; s < src->nslots; s++)
            if (named(es, n, src->name, src->slots[s]) == include)
                h->slots[h->nslots++] = src->slots[s];
    }
    return DSC_OK;
}

dsc_status dsc__launch_pool_filter(const dsc__launch_pool *in, const char *include,
                                   const char *exclude, dsc__launch_pool *out) {
    *out = (dsc__launch_pool){0};
    if (include && exclude)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--include and --exclude cannot be used together; use one of them");
    if (!include && !exclude) return dsc__launch_pool_copy(in, out);
    const char *flag = include ? "--include" : "--exclude";
    filter_entry *es = NULL;
    int n = 0;
    DSC_TRY(parse_filter(include ? include : exclude, flag, &es, &n));
    dsc_status st = check_entries(in, es, n, flag);
    if (st == DSC_OK) st = apply_filter(in, es, n, include != NULL, out);
    free_entries(es, n);
    if (st == DSC_OK && !out->nhosts)
        st = dsc__fail(DSC_ERR_INVALID_ARG, "%s '%s' leaves no slot to run on", flag,
                       include ? include : exclude);
    if (st != DSC_OK) dsc__launch_pool_free(out);
    return st;
}

dsc_status dsc__launch_pool_limit(dsc__launch_pool *p, int num_nodes, int slots_per_node) {
    if (num_nodes > p->nhosts)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--num_nodes %d asks for more nodes than the %d available", num_nodes,
                         p->nhosts);
    if (num_nodes >= 0) {
        for (int i = num_nodes; i < p->nhosts; i++) {
            free(p->hosts[i].name);
            free(p->hosts[i].slots);
        }
        p->nhosts = num_nodes;
    }
    if (slots_per_node < 0) return DSC_OK;
    for (int i = 0; i < p->nhosts; i++) {
        if (slots_per_node > p->hosts[i].nslots)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "--num_gpus %d asks for more slots than host '%s' has (%d)",
                             slots_per_node, p->hosts[i].name, p->hosts[i].nslots);
        p->hosts[i].nslots = slots_per_node;
    }
    return DSC_OK;
}

// ---- the job layout string ----

dsc_status dsc__launch_pool_format(const dsc__launch_pool *p, char **out) {
    dsc__sbuf b = {0};
    dsc_status st = DSC_OK;
    for (int i = 0; i < p->nhosts && st == DSC_OK; i++) {
        st = dsc__sbuf_addf(&b, "%s%s:", i ? "@" : "", p->hosts[i].name);
        for (int s = 0; s < p->hosts[i].nslots && st == DSC_OK; s++)
            st = dsc__sbuf_addf(&b, "%s%d", s ? "," : "", p->hosts[i].slots[s]);
    }
    if (st == DSC_OK && !b.p) st = dsc__fail(DSC_ERR_INVALID_ARG, "no hosts to describe");
    if (st != DSC_OK) {
        dsc__sbuf_free(&b);
        return st;
    }
    *out = b.p;
    return DSC_OK;
}

dsc_status dsc__launch_pool_parse(const char *spec, dsc__launch_pool *out) {
    *out = (dsc__launch_pool){0};
    filter_entry *es = NULL;
    int n = 0;
    DSC_TRY(parse_filter(spec, "--world_info", &es, &n));
    dsc_status st = DSC_OK;
    for (int i = 0; i < n && st == DSC_OK; i++) {
        dsc__launch_host *h = NULL;
        if (es[i].nslots < 0 || dsc__launch_pool_find(out, es[i].name) >= 0) {
            st = dsc__fail(DSC_ERR_INVALID_ARG,
                           "--world_info '%s': host '%s' must appear once, with its slots", spec,
                           es[i].name);
            break;
        }
        st = pool_add(out, es[i].name, strlen(es[i].name), &h);
        if (st != DSC_OK) break;
        h->slots = es[i].slots; // moved
        h->nslots = es[i].nslots;
        es[i].slots = NULL;
    }
    free_entries(es, n);
    if (st != DSC_OK) dsc__launch_pool_free(out);
    return st;
}
