// engine/ft/state_io.c - this rank's slices from whole parameters (shared by recovery and the
// state files), and the whole training state to and from one safetensors file.
//
// The state files are a test hook (DSC_FT_SAVE_STATE, DSC_FT_LOAD_STATE; see
// docs/fault-tolerance.md): a reference run continues from exactly the state a fault-tolerant run
// restored, on any world size and stage, through a path independent of the replicas. One file
// holds, per parameter, "master.<name>", "exp_avg.<name>" and (Adam) "exp_avg_sq.<name>" in fp32,
// and the step counters and loss-scaler state as metadata.
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, strtod, strtoll
#include <string.h> // memcpy

#include "base/status.h"             // dsc__fail, DSC_TRY
#include "engine/ckpt/safetensors.h" // dsc_st_*
#include "engine/ft/ft.h"            // dsc__ft_*
#include "engine/ft/ft_impl.h"       // ft_param_src
#include "engine/state.h"            // dsc_state_scalars

static const char *const vec_names[3] = {"master", "exp_avg", "exp_avg_sq"};

static float *vec_of(dsc_engine *e, int k) { return k == 0 ? e->master : k == 1 ? e->m : e->v; }

// This rank's slice of group g of vector k (the whole group at stage 0).
static float *slice_of(dsc_engine *e, int k, int g) {
    const group *gr = &e->groups[g];
    if (e->stage == 0) return vec_of(e, k) + gr->off;
    return k == 0 ? dsc__zero_master_slice(e, g) : vec_of(e, k) + gr->part_off;
}

void dsc__ft_fill_slices(dsc_engine *e, ft_param_src src, void *user) {
    int nvec = e->v ? 3 : 2;
    for (int k = 0; k < nvec; k++) {
        for (int i = 0; i < e->nparams; i++) {
            const float *x = src(user, k, i); // (numel)
            const param *p = &e->params[i];
            const group *gr = &e->groups[p->group];
            if (!x) continue;
            size_t lo = gr->off, hi = gr->off + gr->padded; // what this rank keeps of the group
            if (e->stage > 0) {
                lo = gr->off + (size_t)e->rank * gr->slice;
                hi = lo + gr->slice;
            }
            size_t a = p->off > lo ? p->off : lo, b = p->off + (size_t)p->numel;
            b = b < hi ? b : hi;
            if (a < b)
                memcpy(slice_of(e, k, p->group) + (a - lo), x + (a - p->off),
                       (b - a) * sizeof(float));
        }
    }
}

// ---- saving ----

// Group g of vector k, whole: (padded) into out. A collective at stages 1-3.
static dsc_status whole_group(dsc_engine *e, int k, int g, float *out) {
    const group *gr = &e->groups[g];
    if (e->stage == 0 || !e->comm) {
        memcpy(out + (e->stage == 0 ? 0 : (size_t)e->rank * gr->slice), slice_of(e, k, g),
               (e->stage == 0 ? gr->padded : gr->slice) * sizeof(float));
        return DSC_OK;
    }
    return dsc_comm_all_gather(e->comm, slice_of(e, k, g), out, gr->slice, DSC_DT_F32, NULL);
}

static dsc_status write_state(dsc_engine *e, const char *path, float **vals, char **names) {
    int nvec = e->v ? 3 : 2, n = nvec * e->nparams;
    dsc_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    if (!ts) return dsc__fail(DSC_ERR_OOM, "out of memory writing %s", path);
    for (int t = 0; t < n; t++) {
        const param *p = &e->params[t % e->nparams];
        ts[t] = (dsc_st_tensor){.name = names[t], .dtype = "F32", .ndim = p->ndim,
                                .data = vals[t], .nbytes = (size_t)p->numel * sizeof(float)};
        memcpy(ts[t].shape, p->shape, sizeof p->shape);
    }
    dsc_state_scalars sc;
    dsc__state_scalars_get(e, &sc);
    char v[7][40];
    snprintf(v[0], 40, "%lld", (long long)sc.global_steps);
    snprintf(v[1], 40, "%lld", (long long)sc.applied_steps);
    snprintf(v[2], 40, "%lld", (long long)sc.skipped_steps);
    snprintf(v[3], 40, "%.17g", sc.cur_scale);
    snprintf(v[4], 40, "%lld", (long long)sc.cur_iter);
    snprintf(v[5], 40, "%lld", (long long)sc.last_overflow_iter);
    snprintf(v[6], 40, "%d", sc.cur_hysteresis);
    const char *meta[] = {"format", "dsc-ft-state-1", "global_steps", v[0], "applied_steps", v[1],
                          "skipped_steps", v[2], "cur_scale", v[3], "cur_iter", v[4],
                          "last_overflow_iter", v[5], "cur_hysteresis", v[6]};
    dsc_status st = dsc_st_write(path, ts, n, meta, 8);
    free(ts);
    return st;
}

dsc_status dsc__ft_save_state(dsc_engine *e, const char *path) {
    int nvec = e->v ? 3 : 2, n = nvec * e->nparams;
    float **vals = calloc((size_t)n, sizeof *vals);
    char **names = calloc((size_t)n, sizeof *names);
    float *tmp = NULL;
    size_t maxpad = 0;
    for (int g = 0; g < e->ngroups; g++)
        if (e->groups[g].padded > maxpad) maxpad = e->groups[g].padded;
    tmp = calloc(maxpad ? maxpad : 1, sizeof(float));
    dsc_status st = DSC_OK;
    if (!vals || !names || !tmp) st = dsc__fail(DSC_ERR_OOM, "out of memory saving the state");
    for (int k = 0; k < nvec && st == DSC_OK; k++)
        for (int g = 0; g < e->ngroups && st == DSC_OK; g++) {
            st = whole_group(e, k, g, tmp);
            for (int i = 0; st == DSC_OK && i < e->nparams; i++) {
                const param *p = &e->params[i];
                if (p->group != g || e->rank != 0) continue;
                int t = k * e->nparams + i;
                vals[t] = malloc((size_t)p->numel * sizeof(float));
                names[t] = malloc(strlen(p->name) + 16);
                if (!vals[t] || !names[t]) {
                    st = dsc__fail(DSC_ERR_OOM, "out of memory saving the state");
                    break;
                }
                memcpy(vals[t], tmp + (p->off - e->groups[g].off),
                       (size_t)p->numel * sizeof(float));
                snprintf(names[t], strlen(p->name) + 16, "%s.%s", vec_names[k], p->name);
            }
        }
    if (st == DSC_OK && e->rank == 0) st = write_state(e, path, vals, names);
    for (int t = 0; vals && names && t < n; t++) {
        free(vals[t]);
        free(names[t]);
    }
    free(vals);
    free(names);
    free(tmp);
    return st;
}

// ---- loading ----

typedef struct file_src {
    const dsc_st_file *f;
    const dsc_engine *e;
    const char *bad; // the first tensor that was missing or of the wrong size
} file_src;

static const float *from_file(void *user, int k, int i) {
    file_src *s = user;
    const param *p = &s->e->params[i];
    char name[DSC_PARAM_NAME_MAX + 16];
    snprintf(name, sizeof name, "%s.%s", vec_names[k], p->name);
    const dsc_st_tensor *t = dsc_st_find(s->f, name);
    if (!t || strcmp(t->dtype, "F32") || t->nbytes != (size_t)p->numel * sizeof(float)) {
        if (!s->bad) s->bad = p->name;
        return NULL;
    }
    return t->data;
}

static int64_t meta_int(const dsc_st_file *f, const char *key) {
    const char *v = dsc_st_meta(f, key);
    return v ? strtoll(v, NULL, 10) : 0;
}

dsc_status dsc__ft_load_state(dsc_engine *e, const char *path) {
    dsc_st_file *f;
    DSC_TRY(dsc_st_open(&f, path));
    const char *fmt = dsc_st_meta(f, "format");
    if (!fmt || strcmp(fmt, "dsc-ft-state-1")) {
        dsc_st_close(f);
        return dsc__fail(DSC_ERR_CORRUPT, "%s is not a dsc state file (format %s)", path,
                         fmt ? fmt : "missing");
    }
    file_src src = {f, e, NULL};
    dsc__ft_fill_slices(e, from_file, &src);
    dsc_state_scalars sc = {
        .global_steps = meta_int(f, "global_steps"), .applied_steps = meta_int(f, "applied_steps"),
        .skipped_steps = meta_int(f, "skipped_steps"),
        .cur_scale = dsc_st_meta(f, "cur_scale") ? strtod(dsc_st_meta(f, "cur_scale"), NULL) : 1,
        .cur_iter = meta_int(f, "cur_iter"),
        .last_overflow_iter = meta_int(f, "last_overflow_iter"),
        .cur_hysteresis = (int)meta_int(f, "cur_hysteresis")};
    dsc_st_close(f);
    if (src.bad)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: the state of parameter %s is missing or has another "
                         "size; was it saved for this model?", path, src.bad);
    e->micro = 0;
    DSC_TRY(dsc__state_scalars_set(e, &sc));
    DSC_TRY(dsc__state_load_done(e));
    return DSC_OK;
}
