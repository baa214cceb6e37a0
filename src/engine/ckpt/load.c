// ckpt/load.c - load a checkpoint into an engine of any world size and ZeRO stage, with the
// resume fallback to the newest checkpoint that verifies.
//
// Resharding: the saved flat layout is rebuilt on demand from the shards (group g of the saved
// layout is the concatenation of slice g of ranks 0..N-1); every parameter is found by name and
// copied from its saved offset to its offset in this engine's layout, element range by element
// range, for exactly the part that falls into this rank's new slice. Padding stays zero.
#include <stdio.h>  // snprintf
#include <stdlib.h> // malloc, free
#include <string.h> // strcmp, memset, strstr

#include "base/log.h"           // DSC_WARN, DSC_INFO
#include "base/status.h"        // dsc__fail
#include "dsc/checkpoint.h"     // dsc_load_checkpoint
#include "dsc/comm.h"           // dsc_comm_broadcast
#include "engine/ckpt/deepspeed.h" // dsc__ds_load
#include "engine/ckpt/reader.h" // struct dsc_ckpt, dsc__ckpt_read_flat
#include "engine/state.h"       // dsc__state_*

// ---- compatibility ----

static bool same_moments(const char *a, const char *b) {
    bool adam_a = !strcmp(a, "adam") || !strcmp(a, "adamw");
    bool adam_b = !strcmp(b, "adam") || !strcmp(b, "adamw");
    return adam_a == adam_b && (adam_a || !strcmp(a, b));
}

static dsc_status check_params(const dsc_ckpt *ck, dsc_engine *eng, int *map) {
    const dsc__manifest *m = &ck->m;
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    if (L.nparams != m->nparams)
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint %s has %d parameter tensors, this model "
                         "%d; it was saved from another model (check --model)", ck->path,
                         m->nparams, L.nparams);
    for (int i = 0; i < L.nparams; i++) {
        dsc_state_param p;
        dsc__state_param(eng, i, &p);
        int j = dsc_ckpt_find_param(ck, p.name);
        if (j < 0)
            return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint %s has no parameter %s; it was saved "
                             "from another model (check --model)", ck->path, p.name);
        const dsc__mparam *q = &m->params[j];
        bool same = q->ndim == p.ndim;
        for (int d = 0; same && d < p.ndim; d++) same = q->shape[d] == p.shape[d];
        if (!same)
            return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint %s: parameter %s has shape "
                             "[%lld, %lld, ...] there and [%lld, %lld, ...] in this model (check "
                             "--model, --seq-len and the vocabulary)", ck->path, p.name,
                             (long long)q->shape[0], (long long)(q->ndim > 1 ? q->shape[1] : 0),
                             (long long)p.shape[0], (long long)(p.ndim > 1 ? p.shape[1] : 0));
        map[i] = j;
    }
    return DSC_OK;
}

// A checkpoint whose master weights or moments were kept in another precision: bf16 widens to
// fp32 exactly; fp32 is rounded to nearest even bf16 as it is loaded (dsc__state_load_slice).
static void note_state_precision(const char *path, const char *what, const char *saved,
                                 const char *now, int rank) {
    if (!strcmp(saved, now) || rank != 0) return;
    DSC_WARN("ckpt", "checkpoint %s: %s saved in %s continue in %s (%s)", path, what, saved, now,
             !strcmp(now, "bf16") ? "rounded to nearest even bf16 on load" : "widened exactly");
}

static dsc_status check_compatible(const dsc_ckpt *ck, dsc_engine *eng) {
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    const dsc__manifest *m = &ck->m;
    if (!same_moments(m->optimizer, L.optimizer) || m->nmoments != L.nmoments)
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint %s was trained with optimizer %s, this "
                         "run uses %s: their states differ; use the same optimizer.type (Adam and "
                         "AdamW may be swapped)", ck->path, m->optimizer, L.optimizer);
    if (strcmp(m->optimizer, L.optimizer) != 0 && L.rank == 0)
        DSC_WARN("ckpt", "checkpoint %s: optimizer %s continues as %s (same moments)", ck->path,
                 m->optimizer, L.optimizer);
    if (strcmp(m->precision, L.precision) != 0 && L.rank == 0)
        DSC_WARN("ckpt", "checkpoint %s was trained in %s, this run uses %s: the fp32 master "
                 "weights and moments carry over; the loss scaler starts from the config",
                 ck->path, m->precision, L.precision);
    note_state_precision(ck->path, "master weights", m->master_precision, L.master_precision,
                         L.rank);
    note_state_precision(ck->path, "moments", m->moments_precision, L.moments_precision, L.rank);
    return DSC_OK;
}

// ---- resharding ----

// Elements [b0, b1) of this rank's slice of group g of the engine's layout, for every kind, from
// the checkpoint.
static void fill_slice(const dsc_ckpt *ck, dsc_engine *eng, const int *map, int g, size_t b0,
                       size_t b1, float **dst, int nkinds) {
    dsc_state_group G;
    dsc__state_group(eng, g, &G);
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    size_t lo = G.off + (size_t)L.rank * G.slice + b0, hi = lo + (b1 - b0);
    for (int k = 0; k < nkinds; k++) memset(dst[k], 0, (b1 - b0) * sizeof(float));
    for (int i = 0; i < L.nparams; i++) {
        dsc_state_param p;
        dsc__state_param(eng, i, &p);
        size_t a = p.off > lo ? p.off : lo, b = p.off + (size_t)p.numel < hi ? p.off + (size_t)p.numel : hi;
        if (p.group != g || a >= b) continue;
        uint64_t src = ck->m.params[map[i]].off + (a - p.off);
        for (int k = 0; k < nkinds; k++) dsc__ckpt_read_flat(ck, k, src, b - a, dst[k] + (a - lo));
    }
}

static dsc_status load_scalars(const dsc_ckpt *ck, dsc_engine *eng) {
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    dsc_state_scalars s;
    dsc__state_scalars_get(eng, &s); // the loss scaler of the config, unless fp16 -> fp16
    s.global_steps = ck->m.scalars.global_steps;
    s.applied_steps = ck->m.scalars.applied_steps;
    s.skipped_steps = ck->m.scalars.skipped_steps;
    if (!strcmp(ck->m.precision, "fp16") && !strcmp(L.precision, "fp16")) {
        s.cur_scale = ck->m.scalars.cur_scale;
        s.cur_iter = ck->m.scalars.cur_iter;
        s.last_overflow_iter = ck->m.scalars.last_overflow_iter;
        s.cur_hysteresis = ck->m.scalars.cur_hysteresis;
    }
    return dsc__state_scalars_set(eng, &s);
}

typedef struct slice_src {
    const dsc_ckpt *ck;
    dsc_engine *eng;
    const int *map;
    int nkinds;
} slice_src;

static dsc_status fill_piece(void *user, int g, size_t b0, size_t b1, float **dst) {
    const slice_src *s = user;
    fill_slice(s->ck, s->eng, s->map, g, b0, b1, dst, s->nkinds);
    return DSC_OK;
}

static dsc_status load_into(const dsc_ckpt *ck, dsc_engine *eng) {
    DSC_TRY(check_compatible(ck, eng));
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    int *map = calloc((size_t)L.nparams, sizeof *map);
    if (!map) return dsc__fail(DSC_ERR_OOM, "out of memory loading a checkpoint");
    dsc_status st = check_params(ck, eng, map);
    // The checks above fail alike on every rank (same files, same model): then no rank enters
    // the collective below. From here on every rank reaches it, even after a local failure, so
    // that none waits alone.
    if (st != DSC_OK) {
        free(map);
        return st;
    }
    st = load_scalars(ck, eng);
    slice_src src = {ck, eng, map, 1 + L.nmoments};
    if (st == DSC_OK) st = dsc__state_load_pieces(eng, src.nkinds, fill_piece, &src);
    free(map);
    dsc_status done = dsc__state_load_done(eng);
    return st != DSC_OK ? st : done;
}

// ---- agreement between ranks ----

// Every rank verified the same files and so chose the same tag; check it, since loading
// different checkpoints on different ranks would silently corrupt training.
dsc_status dsc__ckpt_agree_on_tag(dsc_engine *eng, const char *tag, bool ok) {
    struct dsc_comm *c = dsc__state_comm(eng);
    if (!c) return DSC_OK;
    char mine[DSC_CKPT_TAG_MAX + 4] = {0}, root[DSC_CKPT_TAG_MAX + 4] = {0};
    snprintf(mine, sizeof mine, "%c%s", ok ? '+' : '-', tag);
    memcpy(root, mine, sizeof root);
    DSC_TRY(dsc_comm_broadcast(c, root, sizeof root / 4, DSC_DT_F32, 0, NULL));
    if (memcmp(root, mine, sizeof root) != 0)
        return dsc__fail(DSC_ERR_CORRUPT, "rank %d chose checkpoint %s (%s) but rank 0 chose %s "
                         "(%s): the ranks see different files; check that every rank reads the "
                         "same save directory", dsc_comm_rank(c), tag, ok ? "ok" : "failed",
                         root + 1, root[0] == '+' ? "ok" : "failed");
    return DSC_OK;
}

// ---- public ----

// ck: opened by the caller (NULL when opening failed with open_st); closed here.
static dsc_status load_opened(dsc_engine *eng, dsc_ckpt *ck, dsc_status open_st, const char *tag,
                              char *loaded, size_t cap) {
    dsc_status st = open_st;
    dsc_status agree = dsc__ckpt_agree_on_tag(eng, tag, st == DSC_OK);
    if (st == DSC_OK) st = agree;
    if (st == DSC_OK) st = load_into(ck, eng);
    if (st == DSC_OK && loaded) snprintf(loaded, cap, "%s", tag);
    dsc_ckpt_close(ck);
    return st;
}

dsc_status dsc_load_checkpoint(dsc_engine *eng, const char *dir, const char *tag, char *loaded,
                               size_t cap) {
    char latest[DSC_CKPT_TAG_MAX];
    dsc_status st = DSC_OK;
    if (dsc_ds_ckpt_detect(dir, tag)) return dsc__ds_load(eng, dir, tag, loaded, cap);
    if (!tag) {
        st = dsc_ckpt_latest(dir, latest, sizeof latest);
        tag = st == DSC_OK ? latest : "(latest)";
    }
    dsc_ckpt *ck = NULL;
    if (st == DSC_OK) st = dsc_ckpt_open(&ck, dir, tag);
    return load_opened(eng, ck, st, tag, loaded, cap);
}

static dsc_status fall_back(dsc_engine *eng, const char *dir, const char *failed, char *loaded,
                            size_t cap) {
    dsc_ckpt_entry *v;
    int n;
    DSC_TRY(dsc_ckpt_list(dir, &v, &n));
    int rank = dsc_engine_rank(eng);
    dsc_status st = DSC_ERR_IO;
    for (int i = 0; i < n; i++) {
        if (v[i].state != DSC_CKPT_COMPLETE || !strcmp(v[i].name, failed)) continue;
        dsc_ckpt *ck;
        if (dsc_ckpt_open(&ck, dir, v[i].name) != DSC_OK) {
            if (rank == 0) DSC_WARN("ckpt", "resume: skipping %s: %s", v[i].name, dsc_last_error());
            continue;
        }
        if (rank == 0) DSC_WARN("ckpt", "resume: falling back to %s (step %lld), the newest "
                                "checkpoint that verifies", v[i].name, (long long)v[i].step);
        st = load_opened(eng, ck, DSC_OK, v[i].name, loaded, cap);
        break;
    }
    free(v);
    if (st == DSC_ERR_IO)
        return dsc__fail(DSC_ERR_CORRUPT, "resume: no checkpoint in %s verifies (dsc ckpt ls %s "
                         "lists them)", dir, dir);
    return st;
}

dsc_status dsc_resume_checkpoint(dsc_engine *eng, const char *dir, const char *tag, char *loaded,
                                 size_t cap, bool *none) {
    *none = false;
    if (dsc_ds_ckpt_detect(dir, tag)) return dsc__ds_load(eng, dir, tag, loaded, cap);
    if (tag) return dsc_load_checkpoint(eng, dir, tag, loaded, cap);
    dsc_ckpt_entry *v;
    int n;
    DSC_TRY(dsc_ckpt_list(dir, &v, &n));
    int saved = 0, leftovers = 0; // saved: renamed into place; leftovers: interrupted saves
    for (int i = 0; i < n; i++) {
        bool left = strstr(v[i].name, ".tmp.") != NULL || strstr(v[i].name, ".del.") != NULL;
        leftovers += left;
        saved += !left;
    }
    free(v);
    char latest[DSC_CKPT_TAG_MAX] = "";
    bool has_latest = dsc_ckpt_latest(dir, latest, sizeof latest) == DSC_OK;
    if (saved == 0 && !has_latest) { // a job killed in its first save starts from step 0
        if (leftovers && dsc_engine_rank(eng) == 0)
            DSC_WARN("ckpt", "resume: %s holds no complete checkpoint, only %d leftover%s of an "
                     "interrupted save (*.tmp.*, *.del.*), which the next save removes", dir,
                     leftovers, leftovers == 1 ? "" : "s");
        *none = true;
        return DSC_OK;
    }
    if (has_latest) {
        dsc_status st = dsc_load_checkpoint(eng, dir, latest, loaded, cap);
        if (st != DSC_ERR_CORRUPT && st != DSC_ERR_IO) return st; // ok, or not a damaged file
        if (dsc_engine_rank(eng) == 0)
            DSC_WARN("ckpt", "resume: the latest checkpoint %s failed verification: %s", latest,
                     dsc_last_error());
    } else if (dsc_engine_rank(eng) == 0) {
        DSC_WARN("ckpt", "resume: %s has no readable `latest` file", dir);
    }
    return fall_back(eng, dir, latest, loaded, cap);
}
