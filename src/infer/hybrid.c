// infer/hybrid.c - dsc_generate: the engine's live weights switched to an inference layout,
// generation, and the switch back (see dsc/generate.h).
#include <pthread.h> // pthread_mutex_*
#include <stdlib.h>  // calloc, free, malloc
#include <string.h>  // memcpy, strcmp

#include "base/status.h"    // dsc__fail, DSC_TRY
#include "base/time.h"      // dsc_now
#include "dsc/generate.h"   // dsc_generate
#include "dsc/memory.h"     // dsc_mem_*
#include "engine/hybrid.h"  // dsc__engine_*
#include "dsc/model.h"      // dsc_model_*
#include "infer/generate.h" // dsc_generate_run

// ---- the caches kept between calls (release_inference_cache false) ----

#define MAX_KEPT 16

static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    const dsc_engine *eng;
    dsc_model_kv *kv;
} kept[MAX_KEPT];

static dsc_model_kv *kept_take(const dsc_engine *eng) {
    dsc_model_kv *kv = NULL;
    pthread_mutex_lock(&kept_mu);
    for (int i = 0; i < MAX_KEPT; i++)
        if (kept[i].eng == eng) {
            kv = kept[i].kv;
            kept[i].eng = NULL, kept[i].kv = NULL;
        }
    pthread_mutex_unlock(&kept_mu);
    return kv;
}

// Keep kv for eng; with every slot taken it is freed instead (the next call makes a new one).
static void kept_put(const dsc_engine *eng, dsc_model_kv *kv) {
    pthread_mutex_lock(&kept_mu);
    for (int i = 0; kv && i < MAX_KEPT; i++)
        if (!kept[i].eng) {
            kept[i].eng = eng, kept[i].kv = kv;
            kv = NULL;
        }
    pthread_mutex_unlock(&kept_mu);
    dsc_model_kv_destroy(kv);
}

void dsc_generate_release(dsc_engine *eng) {
    if (eng) dsc_model_kv_destroy(kept_take(eng));
}

// ---- the inference layout ----

typedef struct layout {
    dsc_engine *eng;
    const dsc_model *model;
    int nt, *order;       // model tensor k is engine parameter order[k]
    float **params;       // (nt) as the model reads them
    dsc_mem_pool *pool;   // tensor-parallel slices (tag "infer.tp_params")
    dsc_mem_handle *held; // (nt) their blocks, or 0
    bool *gathered;       // (ngroups) ZeRO-3 groups held for the whole call
    int tp, tp_rank;
} layout;

// Each of the model's tensors among the engine's parameters, by name, with its shape.
static dsc_status match_params(layout *ly) {
    int np = dsc_engine_num_params(ly->eng);
    ly->order = calloc((size_t)ly->nt, sizeof *ly->order);
    if (!ly->order) return dsc__fail(DSC_ERR_OOM, "generate: out of memory");
    for (int k = 0; k < ly->nt; k++) {
        const dsc_model_param *p = dsc_model_param_get(ly->model, k);
        int i = 0;
        while (i < np && strcmp(dsc__engine_param_name(ly->eng, i), p->name) != 0) i++;
        int64_t sh[DSC_PARAM_MAX_DIMS] = {0};
        int nd = i < np ? dsc__engine_param_shape(ly->eng, i, sh) : 0;
        bool same = i < np && nd == p->ndim;
        for (int d = 0; same && d < nd; d++) same = sh[d] == p->shape[d];
        if (!same)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "dsc_generate: the model's tensor %s (%lld x %lld) is %s among the "
                             "engine's parameters; pass the model the engine was created for "
                             "(dsc_gen_opts.model)", p->name, (long long)p->shape[0],
                             (long long)p->shape[1], i < np ? "of another shape" : "missing");
        ly->order[k] = i;
    }
    return DSC_OK;
}

// Rank tp_rank's slices of group g's tensors into blocks of the pool.
static dsc_status slice_group(layout *ly, int g) {
    for (int k = 0; k < ly->nt; k++) {
        if (dsc__engine_param_group(ly->eng, ly->order[k]) != g) continue;
        size_t bytes = (size_t)dsc_model_tp_numel(ly->model, k, ly->tp) * sizeof(float);
        DSC_TRY(dsc_mem_alloc(ly->pool, bytes, "infer.tp_params", &ly->held[k]));
        ly->params[k] = dsc_mem_ptr(ly->pool, ly->held[k]);
        dsc_model_tp_slice(ly->model, k, ly->tp_rank, ly->tp,
                           dsc_param_data(ly->eng, ly->order[k]), ly->params[k]);
    }
    return DSC_OK;
}

// An engine without a host compute copy (its model trains on a GPU): tensor k made from the
// master weights, rounded as the compute copy would be, in a block of the pool.
static dsc_status compute_copy(layout *ly, int k) {
    int i = ly->order[k];
    int64_t shape[DSC_PARAM_MAX_DIMS];
    int nd = dsc__engine_param_shape(ly->eng, i, shape);
    size_t n = 1;
    for (int d = 0; d < nd; d++) n *= (size_t)shape[d];
    DSC_TRY(dsc_mem_alloc(ly->pool, n * sizeof(float), "infer.params", &ly->held[k]));
    ly->params[k] = dsc_mem_ptr(ly->pool, ly->held[k]);
    return dsc__engine_compute_copy(ly->eng, i, ly->params[k]);
}

// Training layout -> inference layout. ZeRO-3 gathers each group; tensor parallelism copies this
// rank's slices out of it and releases it again, so only 1 / tp of the layers stays resident.
static dsc_status to_inference(layout *ly) {
    if (!dsc__engine_has_compute_copy(ly->eng)) { // one rank (tp 1): made from the master
        for (int k = 0; k < ly->nt; k++) DSC_TRY(compute_copy(ly, k));
        return DSC_OK;
    }
    int ng = dsc__engine_num_groups(ly->eng);
    for (int g = 0; g < ng; g++) {
        DSC_TRY(dsc_gather(ly->eng, g));
        ly->gathered[g] = true;
        if (ly->tp > 1) {
            DSC_TRY(slice_group(ly, g));
            ly->gathered[g] = false;
            DSC_TRY(dsc_release(ly->eng, g));
        }
    }
    for (int k = 0; ly->tp == 1 && k < ly->nt; k++)
        ly->params[k] = dsc_param_data(ly->eng, ly->order[k]);
    return DSC_OK;
}

// And back: every gathered group released, every slice freed (also after a failure).
static dsc_status to_training(layout *ly) {
    dsc_status st = DSC_OK;
    for (int g = 0; ly->gathered && g < dsc__engine_num_groups(ly->eng); g++) {
        if (!ly->gathered[g]) continue;
        dsc_status s2 = dsc_release(ly->eng, g);
        if (st == DSC_OK) st = s2;
    }
    for (int k = 0; ly->held && k < ly->nt; k++)
        dsc_mem_free(ly->pool, ly->held[k]);
    free(ly->order), free(ly->params), free(ly->held), free(ly->gathered);
    return st;
}

static dsc_status layout_init(layout *ly, dsc_engine *eng, const dsc_gen_opts *o) {
    const dsc_config *cfg = dsc_engine_config(eng);
    int world = dsc_engine_world_size(eng);
    int64_t tp = cfg->hybrid_engine.inference_tp_size;
    *ly = (layout){.eng = eng, .model = o->model, .tp = tp > 1 ? (int)tp : 1,
                   .tp_rank = dsc_engine_rank(eng)};
    if (!o->model)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_generate: dsc_gen_opts.model is NULL; pass the "
                         "model whose parameters the engine holds (dsc_model_create)");
    if (tp > 1 && tp != world)
        return dsc__fail(DSC_ERR_CONFIG,
                         "hybrid_engine.inference_tp_size %lld with %d ranks: tensor-parallel "
                         "generation runs on one group of all ranks; set it to 1 or %d",
                         (long long)tp, world, world);
    ly->nt = dsc_model_describe(ly->model)->num_tensors;
    DSC_TRY(match_params(ly));
    if (ly->tp > 1) DSC_TRY(dsc_model_tp_check(ly->model, ly->tp));
    ly->params = calloc((size_t)ly->nt, sizeof *ly->params);
    ly->held = calloc((size_t)ly->nt, sizeof *ly->held);
    ly->gathered = calloc((size_t)dsc__engine_num_groups(eng), sizeof *ly->gathered);
    if (!ly->params || !ly->held || !ly->gathered)
        return dsc__fail(DSC_ERR_OOM, "generate: out of memory");
    return dsc_mem_default_pool(DSC_MEM_HOST, &ly->pool);
}

// ---- prompts of a tensor-parallel group ----

// The group's prompts, rank by rank: every rank contributes its own and generates all of them.
// int32 payloads move as 4-byte elements (an all-gather copies bits and never computes).
typedef struct group_prompts {
    int n, first;        // all prompts; index of this rank's first
    dsc_gen_prompt *p;   // (n), pointing into tok
    int32_t *tok, *meta; // tokens (world, maxtok); (world, 1 + maxn) counts and lengths
} group_prompts;

static dsc_status gather_prompts(dsc_comm *comm, const dsc_gen_prompt *mine, int n,
                                 group_prompts *gp) {
    int world = dsc_comm_size(comm), rank = dsc_comm_rank(comm);
    int32_t maxes[2] = {n, 0}, *all = calloc((size_t)world * 2, sizeof *all);
    for (int i = 0; i < n; i++)
        maxes[1] += mine[i].len;
    if (!all) return dsc__fail(DSC_ERR_OOM, "generate: out of memory");
    dsc_status st = dsc_comm_all_gather(comm, maxes, all, 2, DSC_DT_F32, NULL);
    int maxn = 0, maxtok = 0, total = 0;
    for (int r = 0; r < world; r++) {
        maxn = all[2 * r] > maxn ? all[2 * r] : maxn;
        maxtok = all[2 * r + 1] > maxtok ? all[2 * r + 1] : maxtok;
        if (r < rank) gp->first += all[2 * r];
        total += all[2 * r];
    }
    free(all);
    DSC_TRY(st);
    gp->n = total;
    gp->meta = calloc((size_t)world * (1 + maxn), sizeof(int32_t));
    gp->tok = calloc((size_t)world * maxtok + 1, sizeof(int32_t));
    gp->p = calloc((size_t)total, sizeof *gp->p);
    int32_t *sm = calloc((size_t)1 + maxn, sizeof *sm),
            *stok = calloc((size_t)maxtok + 1, sizeof *stok);
    if (!gp->meta || !gp->tok || !gp->p || !sm || !stok) {
        free(sm), free(stok);
        return dsc__fail(DSC_ERR_OOM, "generate: out of memory for the group's prompts");
    }
    sm[0] = n;
    for (int i = 0, at = 0; i < n; at += mine[i].len, i++) {
        sm[1 + i] = mine[i].len;
        memcpy(stok + at, mine[i].tokens, (size_t)mine[i].len * sizeof(int32_t));
    }
    st = dsc_comm_all_gather(comm, sm, gp->meta, (size_t)1 + maxn, DSC_DT_F32, NULL);
    if (st == DSC_OK)
        st = dsc_comm_all_gather(comm, stok, gp->tok, (size_t)maxtok, DSC_DT_F32, NULL);
    free(sm), free(stok);
    for (int r = 0, k = 0; st == DSC_OK && r < world; r++) {
        const int32_t *m = gp->meta + (size_t)r * (1 + maxn), *t = gp->tok + (size_t)r * maxtok;
        for (int i = 0; i < m[0]; t += m[1 + i], i++)
            gp->p[k++] = (dsc_gen_prompt){t, m[1 + i]};
    }
    return st;
}

static void group_prompts_free(group_prompts *gp) { free(gp->p), free(gp->tok), free(gp->meta); }

// ---- public API ----

static dsc_status run(layout *ly, const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                      dsc_gen_output *out, dsc_gen_stats *st) {
    const dsc_config *cfg = dsc_engine_config(ly->eng);
    int64_t bound = cfg->hybrid_engine.max_out_tokens;
    int context = dsc_model_describe(ly->model)->max_seq_len;
    dsc_gen_model m = {.model = ly->model,
                       .params = ly->params,
                       .tp = {ly->tp_rank, ly->tp, ly->tp > 1 ? dsc__engine_comm(ly->eng) : NULL},
                       .max_positions = bound <= 0        ? 0
                                         : bound < context ? (int)bound
                                                           : context};
    dsc_model_kv *kv = kept_take(ly->eng);
    dsc_status rc;
    if (ly->tp == 1) {
        rc = dsc_generate_run(&m, &kv, prompts, n, o, out, st);
    } else { // the whole group's prompts, then this rank's outputs
        group_prompts gp = {0};
        dsc_gen_output *all = NULL;
        rc = gather_prompts(m.tp.comm, prompts, n, &gp);
        if (rc == DSC_OK && !(all = calloc((size_t)gp.n, sizeof *all)))
            rc = dsc__fail(DSC_ERR_OOM, "generate: out of memory");
        if (rc == DSC_OK) rc = dsc_generate_run(&m, &kv, gp.p, gp.n, o, all, st);
        if (rc == DSC_OK) {
            memcpy(out, all + gp.first, (size_t)n * sizeof *out);
            dsc_gen_output_free(all, gp.first);
            dsc_gen_output_free(all + gp.first + n, gp.n - gp.first - n);
        }
        free(all);
        group_prompts_free(&gp);
    }
    if (cfg->hybrid_engine.release_inference_cache)
        dsc_model_kv_destroy(kv);
    else
        kept_put(ly->eng, kv);
    return rc;
}

dsc_status dsc_generate(dsc_engine *eng, const dsc_gen_prompt *prompts, int n,
                        const dsc_gen_opts *opts, dsc_gen_output *out, dsc_gen_stats *stats) {
    if (!eng || !prompts || n < 1 || !opts || !out)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_generate: needs an engine, n >= 1 prompts, "
                                              "options and n outputs");
    dsc_gen_stats local = {0};
    dsc_gen_stats *st = stats ? stats : &local;
    *st = (dsc_gen_stats){0};
    layout ly;
    double t0 = dsc_now();
    dsc_status rc = layout_init(&ly, eng, opts);
    if (rc == DSC_OK) rc = to_inference(&ly);
    st->to_inference_s = dsc_now() - t0;
    if (rc == DSC_OK) rc = run(&ly, prompts, n, opts, out, st);
    double t1 = dsc_now();
    dsc_status back = to_training(&ly);
    st->to_training_s = dsc_now() - t1;
    if (rc == DSC_OK && back != DSC_OK) dsc_gen_output_free(out, n);
    return rc != DSC_OK ? rc : back;
}
