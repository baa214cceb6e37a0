// ckpt/publish.c - the second half of a save (see saver.h): exchange of shard sizes and
// checksums, the manifest, the rename into place, validation, `latest`, pruning.
//
// Crash safety, step by step (a crash between any two leaves `latest` on a complete checkpoint):
//   1. every rank's shard is written and fsynced inside <tag>.tmp.<nonce>/ (not a tag yet)
//   2. rank 0 writes manifest.json there, fsyncs it and the directory
//   3. rename <tag>.tmp.<nonce> -> <tag>, fsync the save directory (a complete checkpoint that
//      `latest` does not name yet)
//   4. validation; a failure writes <tag>/BAD and stops here
//   5. `latest` replaced atomically (latest.tmp.<pid>, fsync, rename, fsync the directory)
//   6. tags beyond keep_last renamed to *.del.* (atomic) and removed
// Leftovers of interrupted saves (*.tmp.*, *.del.*) are removed by rank 0 at the next save.
#include <errno.h>  // errno
#include <stdio.h>  // snprintf, rename
#include <stdlib.h> // calloc, free, malloc
#include <string.h> // strcmp, strstr, memcpy, strerror

#include "base/hash.h"          // dsc_hash64
#include "base/log.h"           // DSC_ERROR, DSC_WARN, DSC_INFO
#include "base/status.h"        // dsc__fail
#include "base/time.h"          // dsc_now
#include "dsc/comm.h"           // dsc_comm_all_gather
#include "engine/ckpt/reader.h" // struct dsc_ckpt
#include "engine/ckpt/saver.h"  // dsc__saver
#include "engine/device.h"      // dsc__engine_frozen_parted
#include "engine/state.h"       // dsc__state_comm

typedef struct shard_report {
    uint64_t ok, bytes, xxh3;
} shard_report; // exchanged as 6 floats

#define WHY_MAX 512

// ---- leftovers ----

static bool leftover(const char *name) {
    return strstr(name, ".tmp.") != NULL || strstr(name, ".del.") != NULL;
}

void dsc__saver_clean(const char *dir) {
    char **names;
    int n;
    if (dsc__ckpt_list_dir(dir, &names, &n) != DSC_OK) return;
    for (int i = 0; i < n; i++) {
        char path[DSC_CKPT_PATH_MAX];
        if (!leftover(names[i]) || dsc__ckpt_join(path, sizeof path, dir, names[i]) != DSC_OK) continue;
        if (dsc__ckpt_rmtree(path) != DSC_OK)
            DSC_WARN("ckpt", "cannot remove the leftover %s: %s", path, dsc_last_error());
    }
    dsc__ckpt_free_names(names, n);
}

// Rename a directory aside (atomic), then remove it: a crash leaves a *.del.* leftover, never a
// half-removed tag.
static dsc_status remove_tag(const dsc__saver *s, const char *tag) {
    char path[DSC_CKPT_PATH_MAX], aside[DSC_CKPT_PATH_MAX], name[DSC_CKPT_TAG_MAX + 64];
    snprintf(name, sizeof name, "%s.del.%s", tag, s->nonce);
    DSC_TRY(dsc__ckpt_join(path, sizeof path, s->dir, tag));
    DSC_TRY(dsc__ckpt_join(aside, sizeof aside, s->dir, name));
    if (rename(path, aside) != 0)
        return dsc__fail(DSC_ERR_IO, "cannot rename %s to %s: %s", path, aside, strerror(errno));
    return dsc__ckpt_rmtree(aside);
}

// ---- exchange ----

static dsc_status exchange(dsc__saver *s, shard_report *all) {
    shard_report mine = {s->wst == DSC_OK, s->wbytes, s->wxxh3};
    dsc_comm *c = dsc__state_comm(s->eng);
    if (!c) {
        all[0] = mine;
        return DSC_OK;
    }
    return dsc_comm_all_gather(c, &mine, all, sizeof mine / 4, DSC_DT_F32, NULL);
}

// Combine a per-rank verdict: *ok on every rank becomes the AND over ranks, and why the reason
// of the lowest failing rank.
static dsc_status agree_ok(dsc__saver *s, bool *ok, char *why) {
    int world = dsc_engine_world_size(s->eng), rank = dsc_engine_rank(s->eng);
    float worst = *ok ? 0.0f : (float)(world - rank);
    DSC_TRY(dsc__ckpt_max(s->eng, &worst, 1));
    if (worst == 0) return DSC_OK;
    *ok = false;
    return dsc__ckpt_bcast(s->eng, why, WHY_MAX, world - (int)worst);
}

// ---- rank 0: manifest and rename ----

// The attached files into the checkpoint's temporary directory, listed in the manifest.
static dsc_status write_attachments(dsc__saver *s, const char *tmp) {
    free(s->m.attach);
    s->m.attach = calloc((size_t)s->nattach + 1, sizeof *s->m.attach);
    s->m.nattach = 0;
    if (!s->m.attach) return dsc__fail(DSC_ERR_OOM, "out of memory for checkpoint attachments");
    for (int i = 0; i < s->nattach; i++) {
        const struct dsc__attachment *a = &s->attach[i];
        char path[DSC_CKPT_PATH_MAX];
        DSC_TRY(dsc__ckpt_join(path, sizeof path, tmp, a->name));
        DSC_TRY(dsc__ckpt_write_file(path, a->data, a->len, false));
        dsc__mfile *f = &s->m.attach[s->m.nattach++];
        snprintf(f->name, sizeof f->name, "%s", a->name);
        f->rank = -1;
        f->bytes = a->len;
        f->xxh3 = dsc_hash64(a->data, a->len);
    }
    return DSC_OK;
}

static dsc_status publish(dsc__saver *s, const shard_report *all) {
    for (int r = 0; r < s->m.nfiles; r++) {
        s->m.files[r].bytes = all[r].bytes;
        s->m.files[r].xxh3 = all[r].xxh3;
    }
    char tmpdir[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(tmpdir, sizeof tmpdir, s->dir, s->tmp_name));
    DSC_TRY(write_attachments(s, tmpdir));
    char *text = dsc__manifest_render(&s->m, dsc_engine_config(s->eng));
    if (!text) return dsc__fail(DSC_ERR_OOM, "out of memory rendering the checkpoint manifest");
    char tmp[DSC_CKPT_PATH_MAX], path[DSC_CKPT_PATH_MAX], final[DSC_CKPT_PATH_MAX];
    dsc_status st = dsc__ckpt_join(tmp, sizeof tmp, s->dir, s->tmp_name);
    if (st == DSC_OK) st = dsc__ckpt_join(path, sizeof path, tmp, DSC_CKPT_MANIFEST);
    if (st == DSC_OK) st = dsc__ckpt_join(final, sizeof final, s->dir, s->m.tag);
    if (st == DSC_OK) st = dsc__ckpt_write_file(path, text, strlen(text), false);
    free(text);
    if (st == DSC_OK) st = dsc__ckpt_fsync_path(tmp);
    // The same tag saved again (e.g. after resuming from an older one): the old copy goes.
    if (st == DSC_OK && dsc__ckpt_exists(final)) st = remove_tag(s, s->m.tag);
    if (st == DSC_OK && rename(tmp, final) != 0)
        st = dsc__fail(DSC_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    if (st == DSC_OK) st = dsc__ckpt_fsync_path(s->dir);
    return st;
}

// ---- validation ----

// The saved training state, whole on every rank: all-gather of the snapshot's master slices
// (an in-line save, checkpoint.async false, has none: the engine's own, which no step changed).
static dsc_status gather_live(dsc__saver *s, float *flat) {
    const dsc__manifest *m = &s->m;
    dsc_comm *c = dsc__state_comm(s->eng);
    size_t goff = 0;
    for (int g = 0; g < m->ngroups; g++) {
        const dsc_state_group *G = &m->groups[g];
        const float *src = s->o.async ? s->buf + goff : dsc__state_master_slice(s->eng, g);
        if (c) DSC_TRY(dsc_comm_all_gather(c, src, flat + G->off, G->slice, DSC_DT_F32, NULL));
        else memcpy(flat + G->off, src, G->slice * sizeof(float));
        goff += G->slice;
    }
    return DSC_OK;
}

typedef struct vbufs {
    float *flat;    // (total) live
    float **loaded; // (nparams) each (numel)
    const float **live;
} vbufs;

static void vbufs_free(vbufs *b, int n) {
    for (int i = 0; b->loaded && i < n; i++) free(b->loaded[i]);
    free(b->loaded);
    free(b->live);
    free(b->flat);
}

static dsc_status call_validate(dsc__saver *s, const dsc_ckpt *ck, bool *ok, char *why) {
    const dsc__manifest *m = &s->m;
    // The arrays are in the caller's tensor order: a frozen tensor (not in the checkpoint) is
    // its live values on both sides.
    int n = dsc_engine_num_params(s->eng);
    vbufs b = {malloc(m->total * sizeof(float) + 64), calloc((size_t)n, sizeof(float *)),
               calloc((size_t)n, sizeof(float *))};
    if (!b.flat || !b.loaded || !b.live) { // the peers then time out in the gather below
        vbufs_free(&b, n);
        return dsc__fail(DSC_ERR_OOM, "out of memory validating checkpoint %s (%.1f MiB)", m->tag,
                         m->total * 8.0 / (1 << 20));
    }
    dsc_status st = gather_live(s, b.flat);
    for (int i = 0, k = 0; i < n && st == DSC_OK; i++) {
        if (dsc_param_frozen(s->eng, i)) { // partitioned (stage 3): gathered whole here
            b.live[i] = dsc_param_data(s->eng, i);
            if (b.live[i] && !dsc__engine_frozen_parted(s->eng)) continue;
            int64_t numel = dsc__engine_tensor_numel(s->eng, i);
            b.loaded[i] = malloc((size_t)numel * sizeof(float));
            if (!b.loaded[i]) st = dsc__fail(DSC_ERR_OOM, "out of memory validating a checkpoint");
            else st = dsc_engine_full_param(s->eng, i, b.loaded[i]);
            b.live[i] = b.loaded[i];
            continue;
        }
        b.live[i] = b.flat + m->params[k].off;
        b.loaded[i] = malloc((size_t)m->params[k].numel * sizeof(float));
        if (!b.loaded[i]) st = dsc__fail(DSC_ERR_OOM, "out of memory validating a checkpoint");
        else st = dsc_ckpt_read_param(ck, k, 0, b.loaded[i]);
        k++;
    }
    const float **loaded = calloc((size_t)n, sizeof *loaded);
    if (!loaded && st == DSC_OK) st = dsc__fail(DSC_ERR_OOM, "out of memory validating a checkpoint");
    for (int i = 0; loaded && i < n; i++) loaded[i] = b.loaded[i] ? b.loaded[i] : b.live[i];
    bool all_ok = st == DSC_OK;
    if (!all_ok) snprintf(why, WHY_MAX, "%s", dsc_last_error());
    DSC_TRY(agree_ok(s, &all_ok, why));
    if (all_ok) {
        dsc_ckpt_validation v = {s->dir, m->tag, m->step, ck, n, b.live, loaded};
        st = s->o.validate_fn(s->o.validate_user, s->eng, &v, ok, why, WHY_MAX);
        if (st != DSC_OK) {
            *ok = false;
            snprintf(why, WHY_MAX, "validation function failed: %s", dsc_last_error());
        }
    } else {
        *ok = false;
    }
    free(loaded);
    vbufs_free(&b, n);
    return DSC_OK;
}

// The state on a device (one rank): every tensor read back equals the device's, compared in
// pieces of 16 Mi elements (two pieces on the host at once). The validation function, which
// takes whole copies of the weights, is not called then (docs/checkpoint-format.md).
static dsc_status compare_on_device(dsc__saver *s, const dsc_ckpt *ck, bool *ok, char *why) {
    enum { PIECE = 16 << 20 };
    const dsc__manifest *m = &s->m;
    size_t cap = 1;
    for (int k = 0; k < m->nparams; k++)
        if ((size_t)m->params[k].numel > cap) cap = (size_t)m->params[k].numel;
    if (cap > PIECE) cap = PIECE;
    float *live = malloc(cap * sizeof *live), *back = malloc(cap * sizeof *back);
    if (!live || !back) {
        free(live);
        free(back);
        *ok = false;
        snprintf(why, WHY_MAX, "out of memory validating it (%zu MiB)", 2 * cap * 4 >> 20);
        return DSC_OK;
    }
    for (int k = 0; k < m->nparams && *ok; k++) {
        const dsc__mparam *p = &m->params[k];
        size_t at = p->off - m->groups[p->group].off; // in the group's slice: one rank
        for (size_t b = 0; b < (size_t)p->numel && *ok; b += cap) {
            size_t n = (size_t)p->numel - b < cap ? (size_t)p->numel - b : cap;
            dsc_status st = dsc__state_read(s->eng, 0, p->group, at + b, n, live);
            if (st == DSC_OK) dsc__ckpt_read_flat(ck, 0, p->off + b, n, back);
            if (st != DSC_OK) snprintf(why, WHY_MAX, "%s", dsc_last_error());
            else if (memcmp(live, back, n * sizeof *live) != 0)
                snprintf(why, WHY_MAX, "tensor %s read back differs from the saved state",
                         p->name);
            *ok = st == DSC_OK && !why[0];
        }
    }
    free(live);
    free(back);
    return DSC_OK;
}

// Re-open the checkpoint from disk (every checksum), then the user's function.
static dsc_status validate(dsc__saver *s, bool *ok, char *why) {
    double t0 = dsc_now();
    dsc_ckpt *ck = NULL;
    *ok = dsc_ckpt_open(&ck, s->dir, s->m.tag) == DSC_OK;
    if (!*ok) snprintf(why, WHY_MAX, "re-reading it failed: %s", dsc_last_error());
    DSC_TRY(agree_ok(s, ok, why));
    if (*ok && !dsc__state_on_host(s->eng)) {
        why[0] = '\0';
        DSC_TRY(compare_on_device(s, ck, ok, why));
    } else if (*ok && s->o.validate_fn) {
        dsc_status st = call_validate(s, ck, ok, why);
        if (st == DSC_OK) st = agree_ok(s, ok, why);

        if (st != DSC_OK) {
            dsc_ckpt_close(ck);
            return st;
        }
    }
    dsc_ckpt_close(ck);
    s->stats.validate_s = dsc_now() - t0;
    return DSC_OK;
}

// ---- rank 0: after validation ----

static void mark_bad(dsc__saver *s, const char *why) {
    char dir[DSC_CKPT_PATH_MAX], path[DSC_CKPT_PATH_MAX], text[WHY_MAX + 2];
    snprintf(text, sizeof text, "%s\n", why);
    if (dsc__ckpt_join(dir, sizeof dir, s->dir, s->m.tag) != DSC_OK ||
        dsc__ckpt_join(path, sizeof path, dir, DSC_CKPT_BAD_MARKER) != DSC_OK ||
        dsc__ckpt_write_file(path, text, strlen(text), false) != DSC_OK ||
        dsc__ckpt_fsync_path(dir) != DSC_OK)
        DSC_ERROR("ckpt", "cannot mark %s bad: %s", dir, dsc_last_error());
}

static void prune(dsc__saver *s) {
    if (s->o.keep_last <= 0) return;
    dsc_ckpt_entry *v;
    int n;
    if (dsc_ckpt_list(s->dir, &v, &n) != DSC_OK) return;
    int64_t kept = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].state != DSC_CKPT_COMPLETE) continue; // BAD ones stay for inspection
        if (v[i].latest || kept < s->o.keep_last) {
            kept++;
            continue;
        }
        if (remove_tag(s, v[i].name) != DSC_OK)
            DSC_WARN("ckpt", "keep_last: cannot remove %s: %s", v[i].name, dsc_last_error());
    }
    free(v);
}

static dsc_status set_latest(dsc__saver *s) {
    char path[DSC_CKPT_PATH_MAX], text[DSC_CKPT_TAG_MAX + 2];
    DSC_TRY(dsc__ckpt_join(path, sizeof path, s->dir, DSC_CKPT_LATEST));
    snprintf(text, sizeof text, "%s\n", s->m.tag);
    DSC_TRY(dsc__ckpt_write_file(path, text, strlen(text), true));
    prune(s);
    return DSC_OK;
}

// ---- completion ----

static dsc_status write_failed(dsc__saver *s, const shard_report *all) {
    int world = s->m.world, rank = dsc_engine_rank(s->eng), failing = 0;
    while (failing < world && all[failing].ok) failing++;
    if (s->wst != DSC_OK)
        DSC_ERROR("ckpt", "checkpoint %s: this rank could not write its shard: %s", s->m.tag, s->werr);
    if (rank == 0) {
        char tmp[DSC_CKPT_PATH_MAX];
        if (dsc__ckpt_join(tmp, sizeof tmp, s->dir, s->tmp_name) == DSC_OK) dsc__ckpt_rmtree(tmp);
    }
    s->stats.failed++;
    return dsc__fail(DSC_ERR_IO, "checkpoint %s was not saved: rank %d could not write its shard "
                     "(%s); `latest` stays at %s", s->m.tag, failing,
                     failing == rank ? s->werr : "see that rank's log",
                     s->stats.latest[0] ? s->stats.latest : "(none)");
}

static dsc_status finish(dsc__saver *s, const shard_report *all) {
    int rank = dsc_engine_rank(s->eng);
    int32_t pub[2] = {DSC_OK, 0};
    char why[WHY_MAX] = "";
    if (rank == 0) pub[0] = publish(s, all);
    if (pub[0] != DSC_OK) snprintf(why, sizeof why, "%s", dsc_last_error());
    DSC_TRY(dsc__ckpt_bcast(s->eng, pub, sizeof pub, 0));
    DSC_TRY(dsc__ckpt_bcast(s->eng, why, sizeof why, 0));
    if (pub[0] != DSC_OK) {
        s->stats.failed++;
        return dsc__fail(pub[0], "checkpoint %s was not published: %s", s->m.tag, why);
    }
    bool ok = true;
    if (s->o.validate) DSC_TRY(validate(s, &ok, why));
    if (!ok) {
        if (rank == 0) mark_bad(s, why);
        DSC_ERROR("ckpt", "CHECKPOINT %s FAILED VALIDATION: %s. It is marked BAD; `latest` stays "
                  "at %s", s->m.tag, why, s->stats.latest[0] ? s->stats.latest : "(none)");
        s->stats.bad++;
        return dsc__fail(DSC_ERR_CORRUPT, "checkpoint %s failed validation: %s", s->m.tag, why);
    }
    if (rank == 0) pub[0] = set_latest(s);
    if (pub[0] != DSC_OK) snprintf(why, sizeof why, "%s", dsc_last_error());
    DSC_TRY(dsc__ckpt_bcast(s->eng, pub, sizeof pub, 0)); // `latest` moved on every rank's word
    if (pub[0] != DSC_OK) return dsc__fail(pub[0], "checkpoint %s: cannot update latest: %s", s->m.tag, rank == 0 ? why : "see rank 0's log");
    snprintf(s->stats.latest, sizeof s->stats.latest, "%s", s->m.tag);
    s->stats.saves++;
    s->stats.shard_bytes = s->wbytes;
    DSC_INFO("ckpt", "checkpoint %s saved (step %lld)", s->m.tag, (long long)s->m.step);
    return DSC_OK;
}

dsc_status dsc__saver_complete(dsc__saver *s) {
    if (!s->pending) return DSC_OK;
    double t0 = dsc_now();
    if (s->thread_live) pthread_join(s->thread, NULL);
    s->thread_live = false;
    s->stats.snapshot_s = s->w_snapshot_s;
    s->stats.write_s = s->w_write_s;
    if (dsc_engine_world_size(s->eng) != s->m.world) { // fault tolerance re-formed the world
        // The old world's shards cannot be completed by the new one: the save is dropped, not
        // the run (its directory is a leftover that the next save removes), and the step it
        // held may be saved again.
        if (dsc_engine_rank(s->eng) == 0)
            DSC_WARN("ckpt", "checkpoint %s: the world changed from %d to %d ranks during the "
                     "save; it is dropped and training continues", s->m.tag, s->m.world,
                     dsc_engine_world_size(s->eng));
        s->last_save_step = -1;
        dsc__saver_forget(s);
        return DSC_OK;
    }
    dsc_status st;
    shard_report *all = calloc((size_t)s->m.world, sizeof *all);
    if (!all)
        st = dsc__fail(DSC_ERR_OOM, "out of memory completing a checkpoint");
    else
        st = exchange(s, all);
    if (st == DSC_OK) {
        bool failed = false;
        for (int r = 0; r < s->m.world; r++) failed |= !all[r].ok;
        st = failed ? write_failed(s, all) : finish(s, all);
    }
    free(all);
    s->stats.finalise_s = dsc_now() - t0;
    dsc__saver_forget(s);
    return st;
}
