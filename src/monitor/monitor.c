// monitor/monitor.c - the registry of named scalars, threshold actions, and the sinks it feeds.
//
// Every dsc_monitor_log updates the registry (latest value per name), evaluates the actions on
// that name, and hands the event to each sink. Sinks buffer; the registry flushes them every
// `flush_every` distinct indices or `flush_every_s` seconds. One mutex guards the registry and
// the sinks, since the Prometheus thread reads the registry while training writes it.
#include <math.h>    // NAN, isnan
#include <pthread.h> // pthread_mutex_*
#include <stdio.h>   // snprintf
#include <stdlib.h>  // calloc, realloc, free, getenv, strtol
#include <string.h>  // strcmp, strdup, strlen

#include "base/env.h"           // dsc__env, DSC_ENV_*
#include "base/hash.h"          // dsc_hash64
#include "base/log.h"           // DSC_WARN, DSC_INFO
#include "base/status.h"        // dsc__fail, DSC_TRY
#include "base/time.h"          // dsc_now, dsc_wall_time
#include "dsc/monitor.h"        // dsc_monitor_*
#include "monitor/actions.h"    // dsc__actions_parse, dsc__action_run
#include "monitor/prometheus.h" // dsc__prom_*
#include "monitor/sink.h"       // dsc__sink, dsc__sink_*_open, dsc__host_mem

enum { MAX_SINKS = 2, MAX_ACTIONS = 64 };

typedef struct entry {
    char *name; // owned
    uint64_t hash;
    double value;
    int64_t step;
} entry;

typedef struct action {
    char *metric;     // as given (owned)
    char *target;     // the logged name it watches (owned)
    double scale;     // logged value * scale = the value in the metric's units
    double threshold; // in the metric's units
    bool above;       // the last value seen was above the threshold
    dsc_monitor_action_fn fn;
    void *user;
} action;

// One entry of the config's monitor_actions, the user pointer of its action.
typedef struct cfg_action {
    dsc__cfg_action spec;
    struct dsc_monitor *m;
} cfg_action;

struct dsc_monitor {
    pthread_mutex_t mu;
    int rank;
    bool writes; // this rank writes files / serves Prometheus
    // registry: entries in first-logged order; index is an open-addressing table of entry
    // positions (-1 = empty), always at most half full
    entry *entries;
    int n, cap;
    int *index;
    int index_cap; // a power of two
    dsc__sink sinks[MAX_SINKS];
    int nsinks;
    dsc__prom *prom;
    char tb_dir[4096], csv_dir[4096];
    action actions[MAX_ACTIONS];
    int nactions;
    cfg_action cfg_actions[MAX_ACTIONS]; // the config's monitor_actions
    dsc_monitor_action_hooks hooks;
    // flushing
    int64_t last_index, indices_since_flush, flush_every;
    double last_flush, flush_every_s;
    // snapshot bookkeeping
    int64_t global_step, samples;
    double last_host_sample;
};

// ---- registry ----

static dsc_status grow_index(dsc_monitor *m) {
    int cap = m->index_cap ? 2 * m->index_cap : 64;
    int *index = malloc((size_t)cap * sizeof *index);
    if (!index) return dsc__fail(DSC_ERR_OOM, "out of memory growing the metric registry");
    for (int i = 0; i < cap; i++) index[i] = -1;
    for (int e = 0; e < m->n; e++) {
        size_t slot = m->entries[e].hash & (size_t)(cap - 1);
        while (index[slot] >= 0) slot = (slot + 1) & (size_t)(cap - 1);
        index[slot] = e;
    }
    free(m->index);
    m->index = index;
    m->index_cap = cap;
    return DSC_OK;
}

static entry *find(const dsc_monitor *m, const char *name, uint64_t h) {
    if (!m->index_cap) return NULL;
    size_t mask = (size_t)(m->index_cap - 1);
    for (size_t slot = h & mask;; slot = (slot + 1) & mask) {
        int e = m->index[slot];
        if (e < 0) return NULL;
        if (m->entries[e].hash == h && !strcmp(m->entries[e].name, name)) return &m->entries[e];
    }
}

static dsc_status upsert(dsc_monitor *m, const char *name, entry **out) {
    uint64_t h = dsc_hash64(name, strlen(name));
    if ((*out = find(m, name, h))) return DSC_OK;
    if (2 * (m->n + 1) > m->index_cap) DSC_TRY(grow_index(m));
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 32;
        entry *grown = realloc(m->entries, (size_t)cap * sizeof *grown);
        if (!grown) return dsc__fail(DSC_ERR_OOM, "out of memory growing the metric registry");
        m->entries = grown;
        m->cap = cap;
    }
    char *copy = strdup(name);
    if (!copy) return dsc__fail(DSC_ERR_OOM, "out of memory");
    m->entries[m->n] = (entry){copy, h, NAN, -1};
    size_t slot = h & (size_t)(m->index_cap - 1);
    while (m->index[slot] >= 0) slot = (slot + 1) & (size_t)(m->index_cap - 1);
    m->index[slot] = m->n;
    *out = &m->entries[m->n++];
    return DSC_OK;
}

static double latest(const dsc_monitor *m, const char *name, double scale) {
    const entry *e = find(m, name, dsc_hash64(name, strlen(name)));
    return e ? e->value * scale : NAN;
}

// ---- actions ----

// Snapshot field names accepted by dsc_monitor_add_action, and the logged name behind each.
static const struct alias {
    const char *field, *target;
    double scale;
} aliases[] = {
    {"loss", DSC_METRIC_TRAIN_LOSS, 1},     {"val_loss", DSC_METRIC_EVAL_LOSS, 1},
    {"lr", DSC_METRIC_LR, 1},               {"loss_scale", DSC_METRIC_LOSS_SCALE, 1},
    {"grad_norm", DSC_METRIC_GRAD_NORM, 1}, {"gpu_mem", DSC_METRIC_GPU_MEM, 1},
    {"host_mem", DSC_METRIC_HOST_MEM, 1},   {"tokens_per_s", DSC_METRIC_TOKENS_PER_S, 1},
    {"mfu", DSC_METRIC_MFU, 1},             {"step_time", DSC_METRIC_ITER_MS, 1e-3},
    {"comm_bytes", DSC_METRIC_COMM_BYTES, 1}, {"comm_time", DSC_METRIC_COMM_MS, 1e-3},
};

// Update the crossing state of the actions watching `name`; return those to fire in fire[].
static int crossings(dsc_monitor *m, const char *name, double value, int *fire) {
    int nfire = 0;
    for (int i = 0; i < m->nactions; i++) {
        action *a = &m->actions[i];
        if (strcmp(a->target, name)) continue;
        double v = value * a->scale;
        if (v > a->threshold) {
            if (!a->above) fire[nfire++] = i;
            a->above = true;
        } else if (v <= a->threshold) { // NaN changes nothing
            a->above = false;
        }
    }
    return nfire;
}

// Runs with the lock released, so that an action may log or read metrics itself. Actions are
// never removed, so the entries stay valid.
static void run_actions(dsc_monitor *m, const int *fire, int nfire, double value) {
    for (int k = 0; k < nfire; k++) {
        action *a = &m->actions[fire[k]];
        a->fn(a->user, a->metric, value * a->scale);
    }
}

dsc_status dsc_monitor_add_action(dsc_monitor *m, const char *metric, double threshold,
                                  dsc_monitor_action_fn fn, void *user) {
    if (!m || !metric || !*metric || !fn)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_monitor_add_action: needs a monitor, a metric "
                         "name and a function");
    const char *target = metric;
    double scale = 1;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(aliases[i].field, metric)) {
            target = aliases[i].target;
            scale = aliases[i].scale;
        }
    pthread_mutex_lock(&m->mu);
    dsc_status st = DSC_OK;
    if (m->nactions == MAX_ACTIONS) {
        st = dsc__fail(DSC_ERR_INVALID_ARG, "monitor: more than %d threshold actions", MAX_ACTIONS);
    } else {
        action *a = &m->actions[m->nactions];
        *a = (action){strdup(metric), strdup(target), scale, threshold, false, fn, user};
        if (!a->metric || !a->target) {
            free(a->metric);
            free(a->target);
            st = dsc__fail(DSC_ERR_OOM, "out of memory");
        } else {
            m->nactions++;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

// ---- logging ----

static dsc_status flush_locked(dsc_monitor *m) {
    dsc_status st = DSC_OK;
    for (int i = 0; i < m->nsinks; i++) {
        dsc_status s = m->sinks[i].ops->flush(m->sinks[i].ctx);
        if (st == DSC_OK) st = s;
    }
    m->indices_since_flush = 0;
    m->last_flush = dsc_now();
    return st;
}

// A new index counts towards the flush policy; the clock is read only then.
static bool due_for_flush(dsc_monitor *m, int64_t step) {
    if (!m->nsinks || step == m->last_index) return false;
    m->last_index = step;
    if (++m->indices_since_flush >= m->flush_every) return true;
    return dsc_now() - m->last_flush >= m->flush_every_s;
}

static dsc_status write_sinks(dsc_monitor *m, const char *name, double value, int64_t step) {
    dsc_status st = DSC_OK;
    double wall = m->nsinks ? dsc_wall_time() : 0;
    for (int i = 0; i < m->nsinks; i++) {
        dsc_status s = m->sinks[i].ops->write(m->sinks[i].ctx, name, value, step, wall);
        if (st == DSC_OK) st = s;
    }
    return st;
}

dsc_status dsc_monitor_log(dsc_monitor *m, const char *name, double value, int64_t step) {
    if (!m || !name || !*name)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_monitor_log: needs a monitor and a name");
    int fire[MAX_ACTIONS];
    pthread_mutex_lock(&m->mu);
    entry *e;
    dsc_status st = upsert(m, name, &e);
    int nfire = 0;
    if (st == DSC_OK) {
        e->value = value;
        e->step = step;
        m->samples = step;
        nfire = crossings(m, name, value, fire);
        bool flush = due_for_flush(m, step);
        st = write_sinks(m, name, value, step);
        if (flush) {
            dsc_status fs = flush_locked(m);
            if (st == DSC_OK) st = fs;
        }
    }
    pthread_mutex_unlock(&m->mu);
    run_actions(m, fire, nfire, value);
    return st;
}

// Log when finite (NaN marks "not this step").
static dsc_status log_if(dsc_monitor *m, const char *name, double v, int64_t step, dsc_status st) {
    if (isnan(v)) return st;
    dsc_status s = dsc_monitor_log(m, name, v, step);
    return st == DSC_OK ? s : st;
}

dsc_status dsc_monitor_log_step(dsc_monitor *m, const dsc_monitor_step *s) {
    if (!m || !s) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_monitor_log_step: NULL argument");
    int64_t x = s->samples;
    pthread_mutex_lock(&m->mu);
    m->global_step = s->step;
    bool sample_host = dsc_now() - m->last_host_sample >= 1.0;
    if (sample_host) m->last_host_sample = dsc_now();
    pthread_mutex_unlock(&m->mu);
    dsc_status st = DSC_OK;
    st = log_if(m, DSC_METRIC_TRAIN_LOSS, s->loss, x, st);
    st = log_if(m, DSC_METRIC_LR, s->lr, x, st);
    st = log_if(m, DSC_METRIC_LOSS_SCALE, s->loss_scale, x, st);
    st = log_if(m, DSC_METRIC_GRAD_NORM, s->grad_norm, x, st);
    st = log_if(m, DSC_METRIC_TOKENS_PER_S, s->tokens_per_s, x, st);
    st = log_if(m, DSC_METRIC_MFU, s->mfu, x, st);
    st = log_if(m, DSC_METRIC_ITER_MS, s->step_time_s * 1e3, x, st);
    st = log_if(m, DSC_METRIC_EVAL_LOSS, s->val_loss, x, st);
    double used, rss;
    if (sample_host && dsc__host_mem(&used, &rss) == DSC_OK) {
        st = log_if(m, DSC_METRIC_HOST_MEM, used, x, st);
        st = log_if(m, DSC_METRIC_HOST_RSS, rss, x, st);
    }
    return st;
}

dsc_status dsc_monitor_flush(dsc_monitor *m) {
    if (!m) return DSC_OK;
    pthread_mutex_lock(&m->mu);
    dsc_status st = flush_locked(m);
    pthread_mutex_unlock(&m->mu);
    return st;
}

void dsc_monitor_set_flush_policy(dsc_monitor *m, int64_t every_steps, double every_s) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->flush_every = every_steps > 0 ? every_steps : 1;
    m->flush_every_s = every_s > 0 ? every_s : 0;
    pthread_mutex_unlock(&m->mu);
}

// ---- snapshot ----

dsc_status dsc_monitor_get_metrics(dsc_monitor *m, dsc_metrics *out) {
    if (!m || !out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_monitor_get_metrics: NULL argument");
    double host = NAN, rss = NAN;
    dsc_status st = dsc__host_mem(&host, &rss);
    pthread_mutex_lock(&m->mu);
    *out = (dsc_metrics){
        .step = m->global_step,
        .samples = m->samples,
        .loss = latest(m, DSC_METRIC_TRAIN_LOSS, 1),
        .val_loss = latest(m, DSC_METRIC_EVAL_LOSS, 1),
        .lr = latest(m, DSC_METRIC_LR, 1),
        .loss_scale = latest(m, DSC_METRIC_LOSS_SCALE, 1),
        .grad_norm = latest(m, DSC_METRIC_GRAD_NORM, 1),
        .gpu_mem = latest(m, DSC_METRIC_GPU_MEM, 1),
        .host_mem = host,
        .host_rss_bytes = rss,
        .tokens_per_s = latest(m, DSC_METRIC_TOKENS_PER_S, 1),
        .mfu = latest(m, DSC_METRIC_MFU, 1),
        .step_time_s = latest(m, DSC_METRIC_ITER_MS, 1e-3),
        .comm_bytes = latest(m, DSC_METRIC_COMM_BYTES, 1),
        .comm_time_s = latest(m, DSC_METRIC_COMM_MS, 1e-3),
    };
    int fire[MAX_ACTIONS], nfire = st == DSC_OK ? crossings(m, DSC_METRIC_HOST_MEM, host, fire) : 0;
    pthread_mutex_unlock(&m->mu);
    run_actions(m, fire, nfire, host);
    return st;
}

// ---- Prometheus ----

// Runs on the HTTP thread: copy the latest values under the lock, format outside it.
static char *render_metrics(void *user, size_t *len) {
    dsc_monitor *m = user;
    pthread_mutex_lock(&m->mu);
    int n = m->n;
    dsc__prom_gauge *g = malloc((size_t)(n + 2) * sizeof *g);
    if (g) {
        g[0] = (dsc__prom_gauge){"step", (double)m->global_step};
        g[1] = (dsc__prom_gauge){"samples", (double)m->samples};
        for (int i = 0; i < n; i++)
            g[i + 2] = (dsc__prom_gauge){m->entries[i].name, m->entries[i].value};
    }
    pthread_mutex_unlock(&m->mu);
    if (!g) return NULL;
    // names stay valid: entries are freed only after the server has stopped
    char *text = dsc__prom_render(g, n + 2, m->rank, len);
    free(g);
    return text;
}

// ---- create / destroy ----

// <output_path or run_dir>/<job_name>[_rank<N>]
static dsc_status sink_dir(char *out, size_t cap, const char *output_path, const char *job_name,
                           const char *run_dir, int rank) {
    const char *base = output_path[0] ? output_path : run_dir ? run_dir : ".";
    const char *sep = job_name[0] ? "/" : "";
    int k = rank > 0 ? snprintf(out, cap, "%s%s%s_rank%d", base, sep, job_name, rank)
                     : snprintf(out, cap, "%s%s%s", base, sep, job_name);
    if (k < 0 || (size_t)k >= cap)
        return dsc__fail(DSC_ERR_CONFIG, "monitor output directory too long: %.80s...", base);
    return DSC_OK;
}

static dsc_status open_sinks(dsc_monitor *m, const dsc_config *cfg, const char *run_dir) {
    if (cfg->tensorboard.enabled) {
        DSC_TRY(sink_dir(m->tb_dir, sizeof m->tb_dir, cfg->tensorboard.output_path,
                         cfg->tensorboard.job_name, run_dir, m->rank));
        DSC_TRY(dsc__sink_tensorboard_open(&m->sinks[m->nsinks], m->tb_dir));
        m->nsinks++;
    }
    if (cfg->csv_monitor.enabled) {
        DSC_TRY(sink_dir(m->csv_dir, sizeof m->csv_dir, cfg->csv_monitor.output_path,
                         cfg->csv_monitor.job_name, run_dir, m->rank));
        DSC_TRY(dsc__sink_csv_open(&m->sinks[m->nsinks], m->csv_dir));
        m->nsinks++;
    }
    if (cfg->prometheus.enabled) {
        int port = cfg->prometheus.port ? (int)cfg->prometheus.port + m->rank : 0;
        DSC_TRY(dsc__prom_start(&m->prom, port, render_metrics, m));
        DSC_INFO("monitor", "Prometheus metrics at http://127.0.0.1:%d/metrics",
                 dsc__prom_port(m->prom));
    }
    return DSC_OK;
}

// ---- the config's monitor_actions ----

void dsc_monitor_set_action_hooks(dsc_monitor *m, const dsc_monitor_action_hooks *h) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->hooks = h ? *h : (dsc_monitor_action_hooks){0};
    pthread_mutex_unlock(&m->mu);
}

static void run_config_action(void *user, const char *metric, double value) {
    cfg_action *a = user;
    pthread_mutex_lock(&a->m->mu);
    dsc_monitor_action_hooks h = a->m->hooks;
    pthread_mutex_unlock(&a->m->mu);
    const char *name = dsc__action_name(a->spec.kind);
    size_t bytes = 0;
    dsc_status st = DSC_OK;
    if (a->spec.kind != DSC__ACTION_LOG && h.before) st = h.before(h.user, name);
    if (st == DSC_OK) st = dsc__action_run(a->spec.kind, &bytes);
    if (st != DSC_OK) {
        DSC_WARN("monitor", "monitor_actions: %s on %s = %g failed: %s", name, metric, value,
                 dsc_last_error());
        return;
    }
    if (h.after) h.after(h.user, name, metric, value, a->spec.above, bytes);
    else DSC_WARN("monitor", "monitor_actions: %s rose to %g, above %g: %s (%zu bytes)", metric,
                  value, a->spec.above, name, bytes);
}

static dsc_status add_config_actions(dsc_monitor *m, const dsc_config *cfg) {
    dsc__cfg_action spec[MAX_ACTIONS];
    int n;
    DSC_TRY(dsc__actions_parse(cfg->monitor_actions, spec, MAX_ACTIONS, &n));
    for (int i = 0; i < n; i++) {
        m->cfg_actions[i] = (cfg_action){spec[i], m};
        DSC_TRY(dsc_monitor_add_action(m, spec[i].metric, spec[i].above, run_config_action,
                                       &m->cfg_actions[i]));
    }
    return DSC_OK;
}

dsc_status dsc_monitor_create(dsc_monitor **out, const dsc_config *cfg, const char *run_dir,
                              int rank) {
    if (!out || !cfg || rank < 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_monitor_create: needs an out pointer, a "
                         "config and a rank >= 0");
    *out = NULL;
    dsc_monitor *m = calloc(1, sizeof *m);
    if (!m) return dsc__fail(DSC_ERR_OOM, "out of memory creating the monitor");
    pthread_mutex_init(&m->mu, NULL);
    const char *all = dsc__env(DSC_ENV_MONITOR_ALL_RANKS);
    m->rank = rank;
    m->writes = rank == 0 || (all && strcmp(all, "0") && *all);
    m->global_step = -1;
    m->samples = -1;
    m->last_index = -1;
    m->flush_every = 100;
    m->flush_every_s = 10;
    m->last_flush = dsc_now();
    m->last_host_sample = -1e9;
    dsc_status ast = add_config_actions(m, cfg);
    if (ast != DSC_OK) {
        dsc_monitor_destroy(m);
        return ast;
    }
    if (m->writes) {
        if (cfg->wandb.enabled)
            DSC_WARN("monitor", "wandb.enabled: Weights & Biases is unsupported offline; ignored");
        if (cfg->comet.enabled)
            DSC_WARN("monitor", "comet.enabled: Comet is unsupported offline; ignored");
        dsc_status st = open_sinks(m, cfg, run_dir);
        if (st != DSC_OK) {
            dsc_monitor_destroy(m);
            return st;
        }
    }
    *out = m;
    return DSC_OK;
}

static int env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end;
    long v = strtol(s, &end, 10);
    return *end || v < 0 || v > 1 << 20 ? fallback : (int)v;
}

dsc_status dsc_monitor_create_from_config(dsc_monitor **out, const char *config_path) {
    if (!out || !config_path)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_monitor_create_from_config: NULL argument");
    dsc_config *cfg = malloc(sizeof *cfg);
    if (!cfg) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", config_path);
    // world size 0: the monitor needs no batch sizes, so none are resolved (or required)
    dsc_status st = dsc_config_load_file(cfg, config_path, 0, NULL, NULL);
    if (st == DSC_OK) st = dsc_monitor_create(out, cfg, NULL, env_int("RANK", 0));
    free(cfg);
    return st;
}

void dsc_monitor_destroy(dsc_monitor *m) {
    if (!m) return;
    dsc__prom_stop(m->prom); // first: its thread reads the registry
    for (int i = 0; i < m->nsinks; i++) m->sinks[i].ops->destroy(m->sinks[i].ctx);
    for (int i = 0; i < m->n; i++) free(m->entries[i].name);
    for (int i = 0; i < m->nactions; i++) {
        free(m->actions[i].metric);
        free(m->actions[i].target);
    }
    free(m->entries);
    free(m->index);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int dsc_monitor_prometheus_port(const dsc_monitor *m) { return m ? dsc__prom_port(m->prom) : 0; }

const char *dsc_monitor_tensorboard_dir(const dsc_monitor *m) {
    return m && m->tb_dir[0] ? m->tb_dir : NULL;
}

const char *dsc_monitor_csv_dir(const dsc_monitor *m) {
    return m && m->csv_dir[0] ? m->csv_dir : NULL;
}
