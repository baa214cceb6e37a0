// ckpt/save.c - saving: the per-engine checkpointing state, the snapshot, the writer thread and
// the periodic trigger (see saver.h for the two halves of a save).
#include <inttypes.h> // PRIx64
#include <stdio.h>    // snprintf
#include <stdlib.h>   // calloc, free, aligned_alloc, getenv, strtod
#include <string.h>   // memcpy, strcmp
#include <sys/mman.h> // madvise
#include <time.h>     // nanosleep
#include <unistd.h>   // getpid

#include "base/env.h" // dsc__env, DSC_ENV_*
#include "base/io.h" // dsc__mkdirs
#include "base/log.h"          // DSC_WARN, DSC_INFO
#include "base/status.h"       // dsc__fail
#include "base/time.h"         // dsc_now, dsc_now_ns
#include "dsc/comm.h"          // dsc_comm_*
#include "engine/ckpt/saver.h" // dsc__saver
#include "engine/ckpt/shard.h" // dsc__shard_*
#include "engine/state.h"      // dsc__state_*

// ---- the engines being checkpointed ----

// The engine's struct belongs to the engine; its checkpointing state is found through this
// small table (a process has one engine or a few).
#define MAX_SAVERS 16
static pthread_mutex_t savers_lock = PTHREAD_MUTEX_INITIALIZER;
static dsc__saver *savers[MAX_SAVERS];

static dsc__saver *find_saver(const dsc_engine *eng) {
    dsc__saver *s = NULL;
    pthread_mutex_lock(&savers_lock);
    for (int i = 0; i < MAX_SAVERS && !s; i++)
        if (savers[i] && savers[i]->eng == eng) s = savers[i];
    pthread_mutex_unlock(&savers_lock);
    return s;
}

static bool add_saver(dsc__saver *s) {
    bool ok = false;
    pthread_mutex_lock(&savers_lock);
    for (int i = 0; i < MAX_SAVERS && !ok; i++)
        if (!savers[i]) savers[i] = s, ok = true;
    pthread_mutex_unlock(&savers_lock);
    return ok;
}

static void remove_saver(dsc__saver *s) {
    pthread_mutex_lock(&savers_lock);
    for (int i = 0; i < MAX_SAVERS; i++)
        if (savers[i] == s) savers[i] = NULL;
    pthread_mutex_unlock(&savers_lock);
}

// ---- small collectives ----

dsc_status dsc__ckpt_bcast(dsc_engine *eng, void *buf, size_t bytes, int root) {
    dsc_comm *c = dsc__state_comm(eng);
    return c ? dsc_comm_broadcast(c, buf, bytes / 4, DSC_DT_F32, root, NULL) : DSC_OK;
}

dsc_status dsc__ckpt_max(dsc_engine *eng, float *v, int n) {
    dsc_comm *c = dsc__state_comm(eng);
    return c ? dsc_comm_all_reduce(c, v, v, (size_t)n, DSC_DT_F32, DSC_OP_MAX, NULL) : DSC_OK;
}

// ---- the snapshot buffer ----

// Snapshot buffers are large and written once per save: 2 MiB-aligned (huge pages where the
// kernel gives them, fewer faults) and touched once, ahead of time.
static float *alloc_snapshot(size_t floats) {
    size_t bytes = (floats * sizeof(float) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, bytes ? bytes : (2u << 20)) != 0) return NULL;
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

static size_t snapshot_floats(dsc_engine *eng) {
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    size_t part = 0;
    for (int g = 0; g < L.ngroups; g++) {
        dsc_state_group G;
        dsc__state_group(eng, g, &G);
        part += G.slice;
    }
    return part * (size_t)(1 + L.nmoments);
}

typedef struct prefault_job {
    dsc__saver *s;
    size_t floats;
} prefault_job;

static void *prefault_main(void *arg) {
    prefault_job *j = arg;
    j->s->buf = alloc_snapshot(j->floats);
    j->s->buf_cap = j->s->buf ? j->floats : 0;
    free(j);
    return NULL;
}

// The first save should not pay for faulting in a buffer as large as the rank's state.
static void start_prefault(dsc__saver *s) {
    prefault_job *j = malloc(sizeof *j);
    if (!j) return;
    *j = (prefault_job){s, snapshot_floats(s->eng)};
    if (pthread_create(&s->prefault, NULL, prefault_main, j) == 0) s->prefault_live = true;
    else free(j);
}

static void join_prefault(dsc__saver *s) {
    if (s->prefault_live) pthread_join(s->prefault, NULL);
    s->prefault_live = false;
}

static dsc_status ensure_buffer(dsc__saver *s) {
    join_prefault(s);
    const dsc__manifest *m = &s->m;
    size_t need = dsc__shard_part(m) * (size_t)(1 + m->nmoments);
    s->data_bytes = need * sizeof(float);
    if (need <= s->buf_cap) return DSC_OK;
    free(s->buf);
    s->buf = alloc_snapshot(need);
    s->buf_cap = s->buf ? need : 0;
    if (!s->buf)
        return dsc__fail(DSC_ERR_OOM, "out of memory for the checkpoint snapshot (%.1f MiB)",
                         need * 4.0 / (1 << 20));
    return DSC_OK;
}

// This rank's slice of group g of kind (0 master, 1 + k moment k) in the engine.
static const float *state_slice(dsc__saver *s, int kind, int g) {
    return kind == 0 ? dsc__state_master_slice(s->eng, g)
                     : dsc__state_moment_slice(s->eng, g, kind - 1);
}

// This rank's slices and moments, in the shard's order. Only reads the engine's state, which
// stays put until the next optimizer step.
static void copy_state(dsc__saver *s) {
    double t0 = dsc_now();
    const dsc__manifest *m = &s->m;
    float *dst = s->buf;
    for (int kind = 0; kind <= m->nmoments; kind++) {
        for (int g = 0; g < m->ngroups; g++) {
            memcpy(dst, state_slice(s, kind, g), m->groups[g].slice * sizeof(float));
            dst += m->groups[g].slice;
        }
    }
    s->w_snapshot_s = dsc_now() - t0;
}

// The state on a device (dsc__state_on_host false): bytes [off, off + k) of the shard's data,
// which lays out kind by kind, group by group, each this rank's slice, read where they live.
static dsc_status pull_state(void *user, void *dst, size_t off, size_t k) {
    dsc__saver *s = user;
    const dsc__manifest *m = &s->m;
    size_t at = off / sizeof(float), left = k / sizeof(float), pos = 0;
    float *out = dst;
    for (int kind = 0; kind <= m->nmoments && left; kind++) {
        for (int g = 0; g < m->ngroups && left; g++) {
            size_t n = m->groups[g].slice;
            if (at < pos + n) {
                size_t b = at - pos, c = n - b < left ? n - b : left;
                DSC_TRY(dsc__state_read(s->eng, kind, g, b, c, out));
                out += c, at += c, left -= c;
            }
            pos += n;
        }
    }
    return DSC_OK;
}

// checkpoint.async false: the shard is written in line from the engine's own slices, which no
// step changes until the save is done, so no snapshot buffer (this rank's master and moments
// once more) is needed. Adjacent slices become one piece.
static dsc_status write_live(dsc__saver *s, const char *path) {
    const dsc__manifest *m = &s->m;
    if (!dsc__state_on_host(s->eng))
        return dsc__shard_write_pull(path, s->header, s->hlen,
                                     dsc__shard_part(m) * (size_t)(1 + m->nmoments) * sizeof(float),
                                     pull_state, s, &s->wbytes, &s->wxxh3);
    dsc__shard_seg *segs = calloc((size_t)(1 + m->nmoments) * (size_t)m->ngroups + 1, sizeof *segs);
    if (!segs) return dsc__fail(DSC_ERR_OOM, "out of memory for a checkpoint's piece list");
    int n = 0;
    for (int kind = 0; kind <= m->nmoments; kind++) {
        for (int g = 0; g < m->ngroups; g++) {
            const float *src = state_slice(s, kind, g);
            size_t b = m->groups[g].slice * sizeof(float);
            if (n > 0 && (const char *)segs[n - 1].p + segs[n - 1].bytes == (const char *)src)
                segs[n - 1].bytes += b;
            else
                segs[n++] = (dsc__shard_seg){src, b};
        }
    }
    dsc_status st = dsc__shard_write_segs(path, s->header, s->hlen, segs, n, &s->wbytes,
                                          &s->wxxh3);
    free(segs);
    return st;
}

static void snapshot_done(dsc__saver *s) {
    pthread_mutex_lock(&s->snap_lock);
    s->snap_waiting = false;
    pthread_cond_broadcast(&s->snap_cond);
    pthread_mutex_unlock(&s->snap_lock);
}

// ---- options ----

void dsc_ckpt_opts_from_config(const dsc_config *cfg, dsc_ckpt_opts *out) {
    *out = (dsc_ckpt_opts){.interval_s = cfg->checkpoint.interval_s,
                           .interval_steps = cfg->checkpoint.interval_steps,
                           .async = cfg->checkpoint.async,
                           .validate = cfg->checkpoint.validate,
                           .keep_last = cfg->checkpoint.keep_last};
}

dsc_status dsc_checkpointing_start(dsc_engine *eng, const char *save_dir, const dsc_ckpt_opts *o) {
    if (!save_dir || !save_dir[0])
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpointing needs a save directory");
    if (find_saver(eng))
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpointing of this engine was already started");
    dsc__saver *s = calloc(1, sizeof *s);
    if (!s) return dsc__fail(DSC_ERR_OOM, "out of memory for checkpointing");
    s->eng = eng;
    if (snprintf(s->dir, sizeof s->dir, "%s", save_dir) >= (int)sizeof s->dir - 160) {
        free(s);
        return dsc__fail(DSC_ERR_INVALID_ARG, "save directory %s: path too long", save_dir);
    }
    if (o) s->o = *o;
    else dsc_ckpt_opts_from_config(dsc_engine_config(eng), &s->o);
    // The state on a device: a snapshot would be a whole host copy of it; the shard is written
    // in line from the device, piece by piece, instead.
    if (!dsc__state_on_host(eng) && s->o.async) {
        s->o.async = false;
        DSC_INFO("ckpt", "checkpoint.async: the training state lives on the device "
                 "(one GPU), so each save is written in line from it, piece by piece "
                 "(a host snapshot would be a whole copy of it)");
    }
    s->last_save_time = dsc_now();
    s->last_save_step = -1;
    // A test hook (docs/checkpoint-format.md): a slow disk, so that a test can fault a rank while a
    // save is still being written.
    const char *delay = dsc__env(DSC_ENV_CKPT_TEST_WRITE_DELAY_S);
    s->test_delay_s = delay ? strtod(delay, NULL) : 0;
    pthread_mutex_init(&s->snap_lock, NULL);
    pthread_cond_init(&s->snap_cond, NULL);
    dsc_status st = dsc__mkdirs(save_dir);
    if (st == DSC_OK && !add_saver(s))
        st = dsc__fail(DSC_ERR_INVALID_ARG, "checkpointing: more than %d engines", MAX_SAVERS);
    if (st != DSC_OK) {
        free(s);
        return st;
    }
    if (s->o.async) start_prefault(s);
    return DSC_OK;
}

dsc_status dsc_checkpointing_configure(dsc_engine *eng, double interval_s,
                                       dsc_ckpt_validate_fn validate_fn, void *user) {
    dsc__saver *s = find_saver(eng);
    if (!s)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_checkpointing_configure: call "
                         "dsc_checkpointing_start (which names the save directory) first");
    if (interval_s < 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint interval %g s: must be >= 0", interval_s);
    s->o.interval_s = interval_s;
    s->o.validate_fn = validate_fn;
    s->o.validate_user = user;
    return DSC_OK;
}

dsc_status dsc_checkpoint_attach(dsc_engine *eng, const char *name, const void *data,
                                 size_t len) {
    dsc__saver *s = find_saver(eng);
    if (!s)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_checkpoint_attach: call "
                         "dsc_checkpointing_start (which names the save directory) first");
    if (!dsc__ckpt_attachment_name_ok(name))
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint attachment \"%s\": a plain file name "
                         "of under 96 bytes, other than manifest.json, BAD and shard files", name);
    int i = 0;
    while (i < s->nattach && strcmp(s->attach[i].name, name)) i++;
    if (i == s->nattach) {
        struct dsc__attachment *a = realloc(s->attach, (size_t)(i + 1) * sizeof *a);
        if (!a) return dsc__fail(DSC_ERR_OOM, "out of memory attaching %s", name);
        s->attach = a;
        a[i] = (struct dsc__attachment){0};
        snprintf(a[i].name, sizeof a[i].name, "%s", name);
        s->nattach++;
    }
    void *copy = malloc(len ? len : 1);
    if (!copy) return dsc__fail(DSC_ERR_OOM, "out of memory attaching %s", name);
    if (len) memcpy(copy, data, len);
    free(s->attach[i].data);
    s->attach[i].data = copy;
    s->attach[i].len = len;
    return DSC_OK;
}

// ---- begin: agreement, snapshot, writer ----

typedef struct agreement {
    uint64_t nonce;
    int64_t step;
    char tag[DSC_CKPT_TAG_MAX];
} agreement; // broadcast from rank 0 as floats: a multiple of 4 bytes

// Rank 0 cleans leftovers before it announces the save: the others create the new directory
// only after they received the announcement, so the cleaning never removes it.
static dsc_status agree(dsc__saver *s, const char *tag, int64_t step, agreement *out) {
    int rank = dsc_engine_rank(s->eng);
    agreement mine = {.nonce = dsc_now_ns() ^ ((uint64_t)getpid() << 32), .step = step};
    snprintf(mine.tag, sizeof mine.tag, "%s", tag);
    *out = mine;
    if (rank == 0) dsc__saver_clean(s->dir);
    DSC_TRY(dsc__ckpt_bcast(s->eng, out, sizeof *out, 0));
    if (out->step == step && !strcmp(out->tag, tag)) return DSC_OK;
    const char *policy = dsc_engine_config(s->eng)->checkpoint.tag_validation;
    if (!strcmp(policy, "Fail"))
        return dsc__fail(DSC_ERR_INVALID_ARG, "rank %d saves tag %s (step %lld) but rank 0 saves "
                         "%s (step %lld) (checkpoint.tag_validation = Fail)", rank, tag,
                         (long long)step, out->tag, (long long)out->step);
    if (!strcmp(policy, "Warn"))
        DSC_WARN("ckpt", "rank %d would save tag %s but rank 0 saves %s; using rank 0's", rank,
                 tag, out->tag);
    return DSC_OK;
}

static void *writer_main(void *arg) {
    dsc__saver *s = arg;
    if (s->snap_waiting) { // background snapshot: copy first, then let training update
        copy_state(s);
        snapshot_done(s);
    }
    if (s->test_delay_s > 0)
        nanosleep(&(struct timespec){(time_t)s->test_delay_s,
                                     (long)((s->test_delay_s - (double)(time_t)s->test_delay_s) * 1e9)},
                  NULL);
    double t0 = dsc_now();
    char tmp[DSC_CKPT_PATH_MAX], path[DSC_CKPT_PATH_MAX], name[96];
    int rank = dsc_engine_rank(s->eng);
    dsc__ckpt_shard_name(name, sizeof name, rank, s->m.world);
    dsc_status st = dsc__ckpt_join(tmp, sizeof tmp, s->dir, s->tmp_name);
    if (st == DSC_OK) st = dsc__mkdirs(tmp);
    if (st == DSC_OK) st = dsc__ckpt_join(path, sizeof path, tmp, name);
    if (st == DSC_OK && !s->o.async) st = write_live(s, path);
    else if (st == DSC_OK)
        st = dsc__shard_write(path, s->header, s->hlen, s->buf, s->data_bytes, &s->wbytes, &s->wxxh3);
    s->wst = st;
    snprintf(s->werr, sizeof s->werr, "%s", st == DSC_OK ? "" : dsc_last_error());
    s->w_write_s = dsc_now() - t0;
    atomic_store(&s->writer_done, true);
    return NULL;
}

static void start_writer(dsc__saver *s) {
    atomic_store(&s->writer_done, false);
    s->snap_waiting = s->o.async && s->o.background_snapshot;
    if (!s->snap_waiting && s->o.async) copy_state(s); // in line: written from the live state
    if (s->o.async && pthread_create(&s->thread, NULL, writer_main, s) == 0) {
        s->thread_live = true;
        return;
    }
    if (s->o.async) DSC_WARN("ckpt", "cannot start the checkpoint writer thread; writing in line");
    writer_main(s); // copies first when snap_waiting
}

static void fence(dsc__saver *s) {
    double t0 = dsc_now();
    pthread_mutex_lock(&s->snap_lock);
    bool waited = s->snap_waiting;
    while (s->snap_waiting) pthread_cond_wait(&s->snap_cond, &s->snap_lock);
    pthread_mutex_unlock(&s->snap_lock);
    if (waited) s->stats.fence_s += dsc_now() - t0;
}

static void drop_pending(dsc__saver *s) {
    dsc__manifest_free(&s->m);
    free(s->header);
    s->header = NULL;
    s->pending = false;
}

static dsc_status begin_save(dsc__saver *s, const char *tag_in) {
    int64_t step = dsc_engine_global_steps(s->eng);
    char tag[DSC_CKPT_TAG_MAX];
    if (tag_in) snprintf(tag, sizeof tag, "%s", tag_in);
    else snprintf(tag, sizeof tag, "global_step%lld", (long long)step);
    agreement a;
    DSC_TRY(agree(s, tag, step, &a));
    DSC_TRY(dsc__manifest_from_engine(&s->m, s->eng, a.tag));
    s->pending = true;
    snprintf(s->nonce, sizeof s->nonce, "%016" PRIx64, a.nonce);
    snprintf(s->tmp_name, sizeof s->tmp_name, "%s.tmp.%s", a.tag, s->nonce);
    snprintf(s->last_tag, sizeof s->last_tag, "%s", a.tag);
    dsc_status st = s->o.async ? ensure_buffer(s) : DSC_OK;
    if (st == DSC_OK) st = dsc__shard_header(&s->m, dsc_engine_rank(s->eng), &s->header, &s->hlen);
    s->last_save_step = step;
    s->last_save_time = dsc_now();
    if (st == DSC_OK) {
        start_writer(s);
    } else {
        // A rank-local failure (memory) is this rank's writer failing: the completion, which
        // every rank reaches at the same point, then fails the save on all of them.
        s->wst = st;
        snprintf(s->werr, sizeof s->werr, "%s", dsc_last_error());
        atomic_store(&s->writer_done, true);
    }
    return s->o.async ? DSC_OK : dsc__saver_complete(s);
}

// ---- public ----

static dsc_status need_saver(dsc_engine *eng, dsc__saver **out) {
    *out = find_saver(eng);
    if (!*out)
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpointing was not started for this engine "
                         "(dsc_checkpointing_start)");
    return DSC_OK;
}

dsc_status dsc_checkpoint_fence(dsc_engine *eng) {
    dsc__saver *s = find_saver(eng);
    if (s) fence(s);
    return DSC_OK;
}

dsc_status dsc_checkpoint_wait(dsc_engine *eng) {
    dsc__saver *s;
    DSC_TRY(need_saver(eng, &s));
    return s->pending ? dsc__saver_complete(s) : DSC_OK;
}

dsc_status dsc_save_checkpoint(dsc_engine *eng, const char *tag) {
    dsc__saver *s;
    DSC_TRY(need_saver(eng, &s));
    if (s->pending) {
        dsc_status st = dsc__saver_complete(s);
        if (st != DSC_OK) DSC_WARN("ckpt", "the previous save failed: %s", dsc_last_error());
    }
    // The state of this step was saved already (e.g. periodically, then at the end).
    if (!tag && s->last_save_step == dsc_engine_global_steps(eng)) return DSC_OK;
    return begin_save(s, tag);
}

// A periodic save that fails is reported and training goes on; the next one may succeed.
static dsc_status periodic(dsc__saver *s, dsc_status st) {
    if (st == DSC_ERR_IO || st == DSC_ERR_CORRUPT || st == DSC_ERR_OOM) {
        DSC_WARN("ckpt", "checkpoint not saved: %s; training continues", dsc_last_error());
        return DSC_OK;
    }
    return st;
}

dsc_status dsc_checkpoint_step_end(dsc_engine *eng, bool stop_requested, dsc_ckpt_tick *out) {
    memset(out, 0, sizeof *out);
    dsc__saver *s = find_saver(eng);
    if (!s) {
        out->stop = stop_requested;
        return DSC_OK;
    }
    fence(s); // callers that do not fence themselves are safe too
    int64_t step = dsc_engine_global_steps(eng);
    bool due_steps = s->o.interval_steps > 0 && step % s->o.interval_steps == 0;
    bool busy = s->pending && !atomic_load(&s->writer_done);
    float flags[3] = {s->o.interval_s > 0 && dsc_now() - s->last_save_time >= s->o.interval_s,
                      stop_requested, busy};
    DSC_TRY(dsc__ckpt_max(eng, flags, 3)); // any rank's clock, stop request or busy writer
    if (flags[1] != 0) {
        out->stop = true;
        DSC_TRY(dsc_save_checkpoint(eng, NULL));
        snprintf(out->tag, sizeof out->tag, "%s", s->last_tag);
        out->saved = true;
        DSC_TRY(dsc_checkpoint_wait(eng));
        out->finalised = true;
        return DSC_OK;
    }
    if ((due_steps || flags[0] != 0) && step != s->last_save_step) {
        dsc_status st = dsc_save_checkpoint(eng, NULL);
        out->saved = st == DSC_OK;
        if (st == DSC_OK) snprintf(out->tag, sizeof out->tag, "%s", s->last_tag);
        out->finalised = st == DSC_OK && !s->pending;
        return periodic(s, st);
    }
    if (s->pending && flags[2] == 0) {
        snprintf(out->tag, sizeof out->tag, "%s", s->last_tag);
        out->finalised = true;
        return periodic(s, dsc__saver_complete(s));
    }
    return DSC_OK;
}

dsc_status dsc_checkpointing_stop(dsc_engine *eng, bool finish) {
    dsc__saver *s = find_saver(eng);
    if (!s) return DSC_OK;
    dsc_status st = DSC_OK;
    if (s->pending && finish) {
        st = dsc__saver_complete(s);
    } else if (s->pending) {
        if (s->thread_live) pthread_join(s->thread, NULL);
        s->thread_live = false;
        drop_pending(s);
    }
    join_prefault(s);
    remove_saver(s);
    pthread_mutex_destroy(&s->snap_lock);
    pthread_cond_destroy(&s->snap_cond);
    for (int i = 0; i < s->nattach; i++) free(s->attach[i].data);
    free(s->attach);
    free(s->buf);
    free(s);
    return st;
}

void dsc_checkpointing_stats(dsc_engine *eng, dsc_ckpt_stats *out) {
    dsc__saver *s = find_saver(eng);
    if (s) *out = s->stats;
    else memset(out, 0, sizeof *out);
}

void dsc__saver_forget(dsc__saver *s) { drop_pending(s); }
