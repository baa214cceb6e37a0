// ckpt/ds_load.c - continue a DeepSpeed run: its checkpoint loaded into an engine of any world
// size and ZeRO stage.
//
// The same resharding as dsc's own checkpoints (load.c), fed from DeepSpeed's files: every
// engine parameter is found by name among DeepSpeed's (the Hugging Face name, with or without
// the model's prefix such as GPT2LMHeadModel's "transformer."), and the part of it that falls
// into this rank's slice of each layer group is read, fp32 master weights and Adam's two
// moments, straight from the ranks' flat partitions (dsc_ds_ckpt_read_state). No rank holds more
// than its own slice and one group's buffers.
#include <stdio.h>   // snprintf
#include <stdlib.h>  // malloc, calloc, free
#include <string.h>  // strcmp, strlen, memchr, memset
#include <strings.h> // strncasecmp

#include "base/log.h"              // DSC_WARN
#include "base/status.h"           // dsc__fail
#include "dsc/checkpoint.h"        // dsc_ds_ckpt_*
#include "engine/ckpt/deepspeed.h" // dsc__ds_load, dsc__ckpt_agree_on_tag
#include "engine/ckpt/fs.h"        // DSC_CKPT_PATH_MAX
#include "engine/state.h"          // dsc__state_*

typedef struct ds_loader {
    dsc_ds_ckpt *ds;
    dsc_ds_ckpt_info in;
    dsc_ds_ckpt_state st;
    char what[DSC_CKPT_PATH_MAX + DSC_CKPT_TAG_MAX + 8]; // DIR/TAG, for messages
    int *map;                                            // engine parameter -> DeepSpeed's
} ds_loader;

// ---- names ----

// DeepSpeed's parameter for the engine's `name`: the same name, or one prefix component before
// it ("transformer.wte.weight" for "wte.weight"). -1: none; -2: more than one.
static int find_name(const dsc_ds_ckpt *ds, int n, const char *name) {
    int i = dsc_ds_ckpt_find_param(ds, name), found = -1;
    if (i >= 0) return i;
    size_t len = strlen(name);
    for (int j = 0; j < n; j++) {
        dsc_ckpt_param p;
        dsc_ds_ckpt_get_param(ds, j, &p);
        size_t m = strlen(p.name), pre = m > len ? m - len - 1 : 0;
        if (m <= len + 1 || strcmp(p.name + pre + 1, name) || p.name[pre] != '.' ||
            memchr(p.name, '.', pre))
            continue;
        if (found >= 0) return -2;
        found = j;
    }
    return found;
}

static dsc_status map_one(ds_loader *l, const dsc_state_param *p, int i, bool *used) {
    int j = find_name(l->ds, l->in.nparams, p->name);
    if (j < 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "DeepSpeed checkpoint %s: %s parameter %s (its "
                         "param_shapes): it was saved from another model (check --model: dsc "
                         "maps DeepSpeed's Hugging Face names to its own, with or without a "
                         "prefix such as transformer.)", l->what, j == -2 ? "more than one "
                         "name ends in" : "no", p->name);
    dsc_ckpt_param q;
    dsc_ds_ckpt_get_param(l->ds, j, &q);
    bool same = q.ndim == p->ndim;
    for (int d = 0; same && d < p->ndim; d++) same = q.shape[d] == p->shape[d];
    if (!same)
        return dsc__fail(DSC_ERR_INVALID_ARG, "DeepSpeed checkpoint %s: parameter %s has shape "
                         "[%lld, %lld, ...] there and [%lld, %lld, ...] in this model (check "
                         "--model, --seq-len and the vocabulary)", l->what, q.name,
                         (long long)q.shape[0], (long long)(q.ndim > 1 ? q.shape[1] : 0),
                         (long long)p->shape[0], (long long)(p->ndim > 1 ? p->shape[1] : 0));
    l->map[i] = j;
    used[j] = true;
    return DSC_OK;
}

static dsc_status map_params(ds_loader *l, dsc_engine *eng) {
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    bool *used = calloc((size_t)l->in.nparams + 1, sizeof *used);
    if (!used) return dsc__fail(DSC_ERR_OOM, "out of memory loading %s", l->what);
    dsc_status st = DSC_OK;
    for (int i = 0; i < L.nparams && st == DSC_OK; i++) {
        dsc_state_param p;
        dsc__state_param(eng, i, &p);
        st = map_one(l, &p, i, used);
    }
    for (int j = 0; j < l->in.nparams && st == DSC_OK; j++) {
        if (used[j]) continue;
        dsc_ckpt_param q;
        dsc_ds_ckpt_get_param(l->ds, j, &q);
        st = dsc__fail(DSC_ERR_INVALID_ARG, "DeepSpeed checkpoint %s has parameter %s, which this "
                       "model lacks (%d parameters there, %d here): it was saved from another "
                       "model (check --model)", l->what, q.name, l->in.nparams, L.nparams);
    }
    free(used);
    return st;
}

// ---- what carries over ----

static bool adam_like(const char *type) {
    return !type || !strncasecmp(type, "adam", 4) || !strcasecmp(type, "fusedadam") ||
           !strcasecmp(type, "cpuadam") || !strcasecmp(type, "deepspeedcpuadam");
}

static dsc_status check_optimizer(const ds_loader *l, dsc_engine *eng) {
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    if (!adam_like(l->st.optimizer))
        return dsc__fail(DSC_ERR_INVALID_ARG, "DeepSpeed checkpoint %s was trained with optimizer "
                         "%s: dsc continues Adam and AdamW runs only; start from its weights "
                         "alone with --init-weights %s", l->what, l->st.optimizer, l->what);
    if (strcmp(L.optimizer, "adam") && strcmp(L.optimizer, "adamw"))
        return dsc__fail(DSC_ERR_INVALID_ARG, "DeepSpeed checkpoint %s holds Adam's moments, this "
                         "run uses optimizer %s: use optimizer.type Adam or AdamW (the DeepSpeed "
                         "run's config), or --init-weights %s for the weights alone", l->what,
                         L.optimizer, l->what);
    if (!l->st.has_moments)
        return dsc__fail(DSC_ERR_INVALID_ARG, "DeepSpeed checkpoint %s: its optimizer files hold "
                         "no Adam moments (exp_avg, exp_avg_sq)%s; start from its weights alone "
                         "with --init-weights %s", l->what, l->in.nfiles > 1 ? "" : " (it has "
                         "no ZeRO optimizer files at all)", l->what);
    if (strcmp(l->in.precision, L.precision) && L.rank == 0)
        DSC_WARN("ckpt", "DeepSpeed checkpoint %s was trained in %s, this run uses %s: the fp32 "
                 "master weights and moments carry over; the loss scaler starts from the config",
                 l->what, l->in.precision, L.precision);
    return DSC_OK;
}

// The count of applied optimizer steps: Adam's own, else DeepSpeed's steps less the skipped.
static int64_t applied_steps(const ds_loader *l) {
    return l->st.adam_step >= 0 ? l->st.adam_step : l->in.global_steps - l->in.skipped_steps;
}

static dsc_status load_scalars(const ds_loader *l, dsc_engine *eng) {
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    dsc_state_scalars s;
    dsc__state_scalars_get(eng, &s);
    s.global_steps = l->in.global_steps;
    s.skipped_steps = l->in.skipped_steps;
    s.applied_steps = applied_steps(l);
    if (l->st.dynamic_scale && !strcmp(L.precision, "fp16")) {
        s.cur_scale = l->st.cur_scale;
        s.cur_iter = l->st.cur_iter;
        s.last_overflow_iter = l->st.last_overflow_iter;
        s.cur_hysteresis = l->st.cur_hysteresis;
    }
    // The schedule is a function of the applied steps from the config's last_batch_iteration
    // (lr_schedule.h); DeepSpeed's saved iteration says where its run stands.
    double from = dsc_engine_config(eng)->scheduler.last_batch_iteration;
    if (l->st.has_scheduler && dsc_engine_config(eng)->scheduler.type[0] &&
        l->st.last_batch_iteration != from + (double)s.applied_steps && L.rank == 0)
        DSC_WARN("ckpt", "DeepSpeed checkpoint %s: lr_scheduler.last_batch_iteration is %g after "
                 "%lld applied steps, but this config's schedule starts from %g: set "
                 "scheduler.params.last_batch_iteration to %g (where the DeepSpeed run started) "
                 "for its learning rates", l->what, l->st.last_batch_iteration,
                 (long long)s.applied_steps, from,
                 l->st.last_batch_iteration - (double)s.applied_steps);
    return dsc__state_scalars_set(eng, &s);
}

// ---- resharding ----

// Elements [b0, b1) of this rank's slice of group g of the engine's layout: master weights,
// exp_avg, exp_avg_sq.
static dsc_status fill_slice(ds_loader *l, dsc_engine *eng, int g, size_t b0, size_t b1,
                             float **dst) {
    dsc_state_group G;
    dsc__state_group(eng, g, &G);
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    size_t lo = G.off + (size_t)L.rank * G.slice + b0, hi = lo + (b1 - b0);
    for (int k = 0; k < 3; k++) memset(dst[k], 0, (b1 - b0) * sizeof(float));
    for (int i = 0; i < L.nparams; i++) {
        dsc_state_param p;
        dsc__state_param(eng, i, &p);
        size_t end = p.off + (size_t)p.numel;
        size_t a = p.off > lo ? p.off : lo, b = end < hi ? end : hi;
        if (p.group != g || a >= b) continue;
        for (int k = 0; k < 3; k++)
            DSC_TRY(dsc_ds_ckpt_read_state(l->ds, l->map[i], k, (int64_t)(a - p.off),
                                           (int64_t)(b - a), dst[k] + (a - lo)));
    }
    return DSC_OK;
}

typedef struct piece_src {
    ds_loader *l;
    dsc_engine *eng;
} piece_src;

static dsc_status fill_piece(void *user, int g, size_t b0, size_t b1, float **dst) {
    piece_src *p = user;
    return fill_slice(p->l, p->eng, g, b0, b1, dst);
}

static dsc_status load_groups(ds_loader *l, dsc_engine *eng) {
    dsc_status st = load_scalars(l, eng);
    piece_src p = {l, eng};
    if (st == DSC_OK) st = dsc__state_load_pieces(eng, 3, fill_piece, &p); // master, both moments
    // Every rank reaches the collective, even after a local failure, so that none waits alone.
    dsc_status done = dsc__state_load_done(eng);
    return st != DSC_OK ? st : done;
}

// ---- public (library) ----

dsc_status dsc__ds_load(dsc_engine *eng, const char *dir, const char *tag, char *loaded,
                        size_t cap) {
    ds_loader l = {0};
    dsc_status st = dsc_ds_ckpt_open(&l.ds, dir, tag);
    if (st == DSC_OK) {
        dsc_ds_ckpt_get_info(l.ds, &l.in);
        dsc_ds_ckpt_get_state(l.ds, &l.st);
        size_t n = strlen(dir), m = strlen(l.in.tag); // dir may be the tag's directory itself
        while (n > 1 && dir[n - 1] == '/') n--;
        bool is_tag = n >= m && !strncmp(dir + n - m, l.in.tag, m) && (n == m || dir[n - m - 1] == '/');
        snprintf(l.what, sizeof l.what, "%.*s%s%s", (int)n, dir, is_tag ? "" : "/",
                 is_tag ? "" : l.in.tag);
        dsc_state_layout L;
        dsc__state_layout(eng, &L);
        if (!(l.map = calloc((size_t)L.nparams + 1, sizeof *l.map)))
            st = dsc__fail(DSC_ERR_OOM, "out of memory loading %s", dir);
    }
    // The checks fail alike on every rank (same files, same model); agree first all the same.
    if (st == DSC_OK) st = check_optimizer(&l, eng);
    if (st == DSC_OK) st = map_params(&l, eng);
    dsc_status agree = dsc__ckpt_agree_on_tag(eng, l.ds ? l.in.tag : "(deepspeed)", st == DSC_OK);
    if (st == DSC_OK) st = agree;
    if (st == DSC_OK) st = load_groups(&l, eng);
    if (st == DSC_OK && loaded) snprintf(loaded, cap, "%s", l.in.tag);
    free(l.map);
    dsc_ds_ckpt_close(l.ds);
    return st;
}
