// monitor/flops_profiler.c - the flops profiler's report, laid out as DeepSpeed's
// FlopsProfiler.print_model_profile: summary, top modules per depth, detailed tree.
#include "dsc/monitor.h"

#include <errno.h>  // errno
#include <stdlib.h> // calloc, free
#include <string.h> // strcmp, strrchr, strerror

#include "base/status.h" // dsc__fail

// "124.44 M", "3.14 G": value with an SI prefix, two decimals (DeepSpeed's number_to_string).
static const char *si(double v, const char *unit, char *buf, size_t cap) {
    static const struct {
        double scale;
        const char *prefix;
    } p[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (v >= p[i].scale) {
            snprintf(buf, cap, "%.2f %s%s", v / p[i].scale, p[i].prefix, unit);
            return buf;
        }
    snprintf(buf, cap, *unit ? "%.2f %s" : "%.2f", v, unit);
    return buf;
}

static const char *duration(double s, char *buf, size_t cap) {
    if (s >= 1) snprintf(buf, cap, "%.2f s", s);
    else if (s >= 1e-3) snprintf(buf, cap, "%.2f ms", s * 1e3);
    else snprintf(buf, cap, "%.2f us", s * 1e6);
    return buf;
}

// Index just past the subtree of module i.
static int subtree_end(const dsc_prof_module *m, int n, int i) {
    int j = i + 1;
    while (j < n && m[j].depth > m[i].depth) j++;
    return j;
}

// A parent's latency: the sum of its leaves (parents of this tree do no work of their own).
static void fill_latency(dsc_prof_module *m, int n) {
    for (int i = n - 1; i >= 0; i--) {
        int end = subtree_end(m, n, i);
        if (end == i + 1) continue;
        m[i].latency_s = 0;
        for (int j = i + 1; j < end; j++)
            if (m[j].depth == m[i].depth + 1) m[i].latency_s += m[j].latency_s;
    }
}

static void row(FILE *f, const char *label, const char *value) {
    fprintf(f, "%-60s  %s\n", label, value);
}

static void summary(FILE *f, const dsc_prof_summary *s, const dsc_prof_module *root) {
    char b[64];
    double fl = root->fwd_flops, fb = s->fwd_s + s->bwd_s;
    fprintf(f, "\n-------------------------- DeepSpeed Flops Profiler "
               "--------------------------\n");
    fprintf(f, "Profile Summary at step %lld:\n", (long long)s->step);
    fprintf(f, "Notations:\ndata parallel size (dp_size), model parallel size(mp_size),\n"
               "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
               "number of floating-point operations (flops), floating-point operations per "
               "second (FLOPS),\nfwd latency (forward propagation latency), bwd latency "
               "(backward propagation latency),\nstep (weights update latency), iter latency "
               "(sum of fwd, bwd and step latency)\n\n");
    snprintf(b, sizeof b, "%d", s->world), row(f, "world size:", b);
    snprintf(b, sizeof b, "%d", s->dp), row(f, "data parallel size:", b);
    snprintf(b, sizeof b, "%d", s->mp), row(f, "model parallel size:", b);
    snprintf(b, sizeof b, "%lld", (long long)s->batch_per_rank), row(f, "batch size per GPU:", b);
    row(f, "params per GPU:", si((double)root->params, "", b, sizeof b));
    row(f, "params of model = params per GPU * mp_size:",
        si((double)root->params * s->mp, "", b, sizeof b));
    row(f, "fwd MACs per GPU:", si(fl / 2, "MACs", b, sizeof b));
    row(f, "fwd flops per GPU:", si(fl, "", b, sizeof b));
    row(f, "fwd flops of model = fwd flops per GPU * mp_size:", si(fl * s->mp, "", b, sizeof b));
    row(f, "fwd latency:", duration(s->fwd_s, b, sizeof b));
    row(f, "fwd FLOPS per GPU = fwd flops per GPU / fwd latency:",
        si(s->fwd_s > 0 ? fl / s->fwd_s : 0, "FLOPS", b, sizeof b));
    row(f, "bwd latency:", duration(s->bwd_s, b, sizeof b));
    row(f, "bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency:",
        si(s->bwd_s > 0 ? 2 * fl / s->bwd_s : 0, "FLOPS", b, sizeof b));
    row(f, "fwd+bwd FLOPS per GPU = 3 * fwd flops per GPU / (fwd+bwd latency):",
        si(fb > 0 ? 3 * fl / fb : 0, "FLOPS", b, sizeof b));
    row(f, "step latency:", duration(s->step_s, b, sizeof b));
    row(f, "iter latency:", duration(s->iter_s, b, sizeof b));
    row(f, "FLOPS per GPU = 3 * fwd flops per GPU / iter latency:",
        si(s->iter_s > 0 ? 3 * fl / s->iter_s : 0, "FLOPS", b, sizeof b));
    double samples = (double)s->batch_per_rank * s->dp;
    snprintf(b, sizeof b, "%.2f", s->iter_s > 0 ? samples / s->iter_s : 0);
    row(f, "samples/second:", b);
}

// Modules of one depth merged by type, as DeepSpeed aggregates them.
typedef struct agg {
    const char *type;
    double params, flops, latency;
} agg;

static int cmp_by(const agg *a, const agg *b, int key) {
    double x = key == 0 ? a->params : key == 1 ? a->flops : a->latency;
    double y = key == 0 ? b->params : key == 1 ? b->flops : b->latency;
    return (x < y) - (x > y); // descending
}

static void top_list(FILE *f, agg *a, int na, int key, int64_t top) {
    static const char *const label[] = {"params     ", "MACs       ", "fwd latency"};
    // selection of the top entries; na is small (module types of one depth)
    bool *used = calloc((size_t)na + 1, sizeof *used);
    if (!used) return;
    fprintf(f, "    %s - {", label[key]);
    for (int64_t k = 0; k < top && k < na; k++) {
        int best = -1;
        for (int i = 0; i < na; i++)
            if (!used[i] && (best < 0 || cmp_by(&a[i], &a[best], key) < 0)) best = i;
        used[best] = true;
        char b[64];
        if (key == 0) si(a[best].params, "", b, sizeof b);
        else if (key == 1) si(a[best].flops / 2, "MACs", b, sizeof b);
        else duration(a[best].latency, b, sizeof b);
        fprintf(f, "%s'%s': '%s'", k ? ", " : "", a[best].type, b);
    }
    fprintf(f, "}\n");
    free(used);
}

static void aggregated(FILE *f, const dsc_prof_module *m, int n, const dsc_prof_opts *o) {
    int maxd = 0;
    for (int i = 0; i < n; i++) maxd = m[i].depth > maxd ? m[i].depth : maxd;
    if (o->module_depth >= 0 && o->module_depth < maxd) maxd = (int)o->module_depth;
    agg *a = calloc((size_t)n, sizeof *a);
    if (!a) return;
    fprintf(f, "\n----------------------------- Aggregated Profile per GPU "
               "-----------------------------\n");
    fprintf(f, "Top %lld modules in terms of params, MACs or fwd latency at different model "
               "depths:\n", (long long)o->top_modules);
    for (int d = 0; d <= maxd; d++) {
        int na = 0;
        for (int i = 0; i < n; i++) {
            if (m[i].depth != d) continue;
            int k = 0;
            while (k < na && strcmp(a[k].type, m[i].type) != 0) k++;
            if (k == na) a[na++] = (agg){.type = m[i].type};
            a[k].params += (double)m[i].params;
            a[k].flops += m[i].fwd_flops;
            a[k].latency += m[i].latency_s;
        }
        fprintf(f, "depth %d:\n", d);
        for (int key = 0; key < 3; key++) top_list(f, a, na, key, o->top_modules);
    }
    free(a);
}

static void detailed(FILE *f, const dsc_prof_module *m, int n, const dsc_prof_opts *o) {
    const dsc_prof_module *r = &m[0];
    fprintf(f, "\n------------------------------ Detailed Profile per GPU "
               "------------------------------\n");
    fprintf(f, "Each module profile is listed after its name in the following order:\nparams, "
               "percentage of total params, MACs, percentage of total MACs, fwd latency, "
               "percentage of total fwd latency, fwd FLOPS\n\n");
    for (int i = 0; i < n; i++) {
        if (o->module_depth >= 0 && m[i].depth > o->module_depth) continue;
        const char *dot = strrchr(m[i].name, '.'), *shortname = dot ? dot + 1 : m[i].name;
        char p[64], mac[64], lat[64], fl[64];
        double pp = r->params ? 100.0 * (double)m[i].params / (double)r->params : 0;
        double pf = r->fwd_flops > 0 ? 100.0 * m[i].fwd_flops / r->fwd_flops : 0;
        double pl = r->latency_s > 0 ? 100.0 * m[i].latency_s / r->latency_s : 0;
        int ind = 2 * m[i].depth;
        if (i == 0) fprintf(f, "%s(\n", m[i].type);
        else fprintf(f, "%*s(%s): %s(\n", ind, "", shortname, m[i].type);
        fprintf(f, "%*s%s, %.2f%% Params, %s, %.2f%% MACs, %s, %.2f%% latency, %s,\n", ind + 2,
                "", si((double)m[i].params, "", p, sizeof p), pp,
                si(m[i].fwd_flops / 2, "MACs", mac, sizeof mac), pf,
                duration(m[i].latency_s, lat, sizeof lat), pl,
                si(m[i].latency_s > 0 ? m[i].fwd_flops / m[i].latency_s : 0, "FLOPS", fl,
                   sizeof fl));
    }
    fprintf(f, ")\n");
}

dsc_status dsc_flops_profile_write(FILE *f, const dsc_prof_summary *s, dsc_prof_module *mods,
                                   int n, const dsc_prof_opts *o) {
    if (!f || !s || !mods || n < 1 || !o)
        return dsc__fail(DSC_ERR_INVALID_ARG, "flops profiler: nothing to report");
    fill_latency(mods, n);
    summary(f, s, &mods[0]);
    if (o->top_modules > 0) aggregated(f, mods, n, o);
    if (o->detailed) detailed(f, mods, n, o);
    fprintf(f, "------------------------------------------------------------------------------\n");
    if (fflush(f) != 0 || ferror(f))
        return dsc__fail(DSC_ERR_IO, "flops profiler: cannot write the profile: %s",
                         strerror(errno));
    return DSC_OK;
}
