// engine/engine_mem.c - the engine's memory: every large buffer (parameter, gradient and
// optimizer partitions, gathered groups, reduction buffers, fault-tolerance snapshots) is a block
// of one pool, named by a handle. Pointers into the blocks are cached everywhere (the zero code,
// the per-parameter tables, the model), so blocks move only where nothing is in flight and every
// cached address is re-read afterwards: inside dsc_engine_create, dsc_engine_maintain (between
// optimizer steps) and dsc_engine_recover. Inside a step an allocation never moves a block.
#include <math.h>    // isnan
#include <pthread.h> // pthread_mutex_lock
#include <string.h>  // memset, strcmp

#include "base/log.h"           // DSC_INFO
#include "base/status.h"        // dsc__fail, DSC_TRY
#include "base/time.h"          // dsc_now
#include "dsc/checkpoint.h"     // dsc_checkpoint_fence
#include "engine/engine_impl.h" // struct dsc_engine
#include "engine/ft/ft.h"       // dsc__ft_resolve
#include "mem/pool_impl.h"      // struct dsc_mem_pool: capacity, defrag_on_oom

dsc_status dsc__engine_pool_init(dsc_engine *e, dsc_mem_pool *given) {
    if (given) {
        if (given->device != DSC_MEM_HOST || given->defrag_on_oom)
            return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_opts.pool %s: the engine needs a "
                             "host pool created with opts.no_defrag_on_oom = true (it moves blocks "
                             "only between steps)", dsc_mem_pool_name(given));
        e->pool = given;
    } else {
        dsc_mem_opts o = {.name = "engine host pool", .no_defrag_on_oom = true};
        DSC_TRY(dsc_mem_pool_create(&e->pool, DSC_MEM_HOST, 0, &o));
        e->own_pool = true;
    }
    e->mem_gen = dsc_mem_generation(e->pool);
    return DSC_OK;
}

dsc_status dsc__engine_alloc_raw(dsc_engine *e, size_t bytes, const char *tag,
                                 dsc_mem_handle *h, void **ptr) {
    dsc_status st = dsc_mem_alloc(e->pool, bytes, tag, h);
    if (st == DSC_ERR_OOM && e->may_move) { // a safe point: compact once and retry
        DSC_INFO("mem", "rank %d: %s is too fragmented for %zu bytes of %s; compacting",
                 e->rank, dsc_mem_pool_name(e->pool), bytes, tag);
        DSC_TRY(dsc_mem_defragment(e->pool, NULL));
        dsc__engine_resolve(e);
        st = dsc_mem_alloc(e->pool, bytes, tag, h);
    }
    if (st != DSC_OK) {
        dsc__error_prefix("rank %d: ", e->rank);
        return st;
    }
    *ptr = dsc_mem_ptr(e->pool, *h);
    return DSC_OK;
}

// memset on all threads for large buffers: a model's state is tens of GB, and zeroing it is
// mostly the kernel faulting fresh pages in, which scales with the threads touching them.
static void zero(void *p, size_t bytes) {
    enum { CHUNK = 2 << 20 };
    if (bytes < ((size_t)64 << 20)) {
        memset(p, 0, bytes);
        return;
    }
    size_t chunks = (bytes + CHUNK - 1) / CHUNK;
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < chunks; c++) {
        size_t at = c * CHUNK, len = bytes - at < CHUNK ? bytes - at : CHUNK;
        memset((char *)p + at, 0, len);
    }
}

dsc_status dsc__engine_alloc(dsc_engine *e, size_t n, const char *tag, dsc_mem_handle *h,
                             float **ptr) {
    size_t bytes = (n ? n : DSC_ALIGN_ELEMS) * sizeof(float);
    void *p;
    DSC_TRY(dsc__engine_alloc_raw(e, bytes, tag, h, &p));
    zero(p, bytes);
    *ptr = p;
    return DSC_OK;
}

void dsc__engine_free(dsc_engine *e, dsc_mem_handle *h) {
    if (*h) dsc_mem_free(e->pool, *h);
    *h = 0;
}

static float *at(dsc_engine *e, dsc_mem_handle h) { return h ? dsc_mem_ptr(e->pool, h) : NULL; }

void dsc__engine_resolve(dsc_engine *e) {
    e->master = at(e, e->h_master);
    e->work = at(e, e->h_work);
    e->work_part = at(e, e->h_work_part);
    e->gfull = at(e, e->h_gfull);
    e->acc = at(e, e->h_acc);
    e->m = at(e, e->h_m);
    e->v = at(e, e->h_v);
    if (e->h_init) e->init = at(e, e->h_init);
    else if (e->init) e->init = dsc__engine_init_alias(e); // the staging is an alias
    dsc__frozen_resolve(e);
    for (int g = 0; e->groups && g < e->ngroups; g++) {
        group *gr = &e->groups[g];
        gr->pbuf = at(e, gr->hp);
        gr->gbuf = at(e, gr->hg);
        gr->rbuf = at(e, gr->hr);
        gr->stage16 = (uint16_t *)at(e, gr->h16);
    }
    if (e->pdata && e->pgrad) dsc__zero_repoint(e);
    if (e->ft) dsc__ft_resolve(e);
    e->mem_gen = dsc_mem_generation(e->pool);
}

// Would the largest request of a step find no free block although the free space would hold it?
// Only pools with a capacity can fail so: the others grow.
static bool step_would_not_fit(const dsc_engine *e) {
    dsc_mem_stats s;
    if (e->pool->capacity == 0 || dsc_mem_pool_stats(e->pool, &s) != DSC_OK) return false;
    return s.largest_free_block < e->max_transient && s.reserved - s.allocated >= e->max_transient;
}

static void log_compaction(const dsc_engine *e, double seconds) {
    dsc_mem_stats s;
    char moved[32], res[32];
    if (dsc_mem_pool_stats(e->pool, &s) != DSC_OK) return;
    DSC_INFO("mem", "rank %d: step %lld: compacted %s in %.3f ms (%llu compactions, %s moved in "
             "all; %s reserved, fragmentation now %.3f)", e->rank, (long long)e->global_steps,
             dsc_mem_pool_name(e->pool), seconds * 1e3, (unsigned long long)s.defrag_count,
             dsc_mem_format_bytes(s.defrag_bytes_moved, moved, sizeof moved),
             dsc_mem_format_bytes(s.reserved, res, sizeof res), s.fragmentation);
}

// Would dsc_mem_maybe_defragment compact now? (The same test, without compacting.)
static bool defrag_due(dsc_engine *e, double now) {
    dsc_mem_pool *p = e->pool;
    pthread_mutex_lock(&p->mu);
    bool due = !isnan(p->last_defrag) && now - p->last_defrag >= e->cfg.memory.defrag_interval_s &&
               dsc__mem_fragmentation(p, NULL) > e->cfg.memory.defrag_threshold;
    pthread_mutex_unlock(&p->mu);
    return due;
}

// The buddy replica exchange of the last step runs on into the next step's compute, reading this
// rank's snapshot slot and writing its replica slot: blocks must not move under it. Complete it
// before a compaction. On a failed exchange (a peer died) nothing moves now: the fault surfaces
// in the next step's collectives, where recovery handles it.
static bool replicas_settled(dsc_engine *e) {
    if (dsc__ft_commit_end(e) == DSC_OK) return true;
    dsc_clear_error();
    return false;
}

dsc_status dsc_engine_maintain(dsc_engine *e, bool force, bool *moved) {
    if (moved) *moved = false;
    if (e->in_step || e->micro != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_maintain: a step is in progress; call "
                         "it between optimizer steps (after dsc_step's boundary, before the next "
                         "dsc_gather)");
    if (!e->params_ready)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_engine_maintain: call dsc_params_updated "
                         "first (dsc_param_master's staging must not move)");
    DSC_TRY(dsc_checkpoint_fence(e)); // a background snapshot may still be reading the state
    uint64_t before = dsc_mem_generation(e->pool);
    double t0 = dsc_now();
    bool did = false;
    bool must = force || step_would_not_fit(e);
    if ((must || defrag_due(e, t0)) && !replicas_settled(e)) return DSC_OK; // next boundary
    if (must) {
        DSC_TRY(dsc_mem_defragment(e->pool, NULL));
        did = true;
    } else {
        DSC_TRY(dsc_mem_maybe_defragment(e->pool, t0, e->cfg.memory.defrag_interval_s,
                                         e->cfg.memory.defrag_threshold, &did));
    }
    if (dsc_mem_generation(e->pool) == before && e->mem_gen == before) return DSC_OK;
    dsc__engine_resolve(e);
    if (moved) *moved = true;
    if (did) log_compaction(e, dsc_now() - t0);
    return DSC_OK;
}

dsc_mem_pool *dsc_engine_mem_pool(dsc_engine *e) { return e->pool; }

// Allocated bytes of the pool's blocks with this tag.
static size_t tag_bytes(const dsc_mem_user *u, size_t n, const char *tag) {
    for (size_t k = 0; k < n; k++)
        if (!strcmp(u[k].tag, tag)) return u[k].bytes;
    return 0;
}

void dsc_engine_memory_get(const dsc_engine *e, dsc_engine_memory *out) {
    dsc_mem_user u[64];
    size_t n = dsc_mem_top_users(e->pool, u, sizeof u / sizeof u[0]);
    out->params = tag_bytes(u, n, "zero.params");
    out->grads = tag_bytes(u, n, "zero.grads");
    out->optimizer = tag_bytes(u, n, "zero.optim") + tag_bytes(u, n, "zero.master");
    out->buffers_peak = e->bytes_buffers_peak;
    out->comm_bytes = e->comm_bytes_sent;
}
