// engine/zero/frozen.c - the frozen tensors (dsc_param_desc.frozen: LoRA's base): values only,
// no gradient, no master, no optimizer state, never in a checkpoint.
//
// Whole on every rank, except at ZeRO stage 3 on several ranks with a host compute copy, where
// they are partitioned as the trainable tensors are: each layer group's frozen tensors form a
// range of their own flat layout, padded to world * DSC_ALIGN_ELEMS and split into `world`
// slices, rank r keeps slice r of every group, and dsc_gather all-gathers a group's range for the
// layer's forward or backward (prefetching the next one as zero.c does), dsc_release frees it.
// Groups below stage3_param_persistence_threshold stay gathered. With the fault-tolerance ring
// each rank's slices are also sent once to its buddy (rank + 1), which is where a lost rank's
// part of the base comes back from (ft/recover.c).
#include <stdlib.h> // calloc, free, malloc
#include <string.h> // memcpy, memset

#include "base/status.h"        // dsc__fail, DSC_TRY
#include "engine/device.h"      // dsc__engine_frozen_gathered
#include "engine/engine_impl.h" // struct dsc_engine, fgroup
#include "engine/ft/ft.h"       // dsc__ft_replicates

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

// Partitioned: stage 3, several ranks, and the model computes from the engine's host copy (a
// device trainer keeps the base on its GPU, uploaded from the whole store).
static bool parts(const dsc_engine *e) {
    return e->nfrozen && e->stage == 3 && e->world > 1 && !e->no_compute_copy && !e->dev_state;
}

dsc_status dsc__frozen_layout(dsc_engine *e) {
    free(e->fgroups);
    e->fgroups = NULL;
    e->frozen_parted = parts(e);
    e->frozen_total = e->frozen_part = 0;
    if (!e->nfrozen) return DSC_OK;
    e->fgroups = calloc((size_t)e->ngroups, sizeof *e->fgroups);
    if (!e->fgroups) return dsc__fail(DSC_ERR_OOM, "out of memory for the frozen tensors' table");
    int world = e->frozen_parted ? e->world : 1;
    size_t unit = (size_t)world * DSC_ALIGN_ELEMS, cursor = 0, part = 0;
    double persist = e->cfg.zero_optimization.param_persistence_threshold;
    for (int g = 0; g < e->ngroups; g++) {
        fgroup *fg = &e->fgroups[g];
        int64_t numel;
        size_t content = dsc__zero_place(e->frozen, e->nfrozen, g, cursor, &numel);
        fg->off = cursor;
        fg->padded = round_up(content, unit);
        fg->slice = fg->padded / (size_t)world;
        fg->part_off = part;
        fg->persistent = e->frozen_parted && (double)numel < persist;
        cursor += fg->padded;
        part += fg->slice;
    }
    e->frozen_total = cursor;
    if (e->frozen_parted) e->frozen_part = part;
    return DSC_OK;
}

dsc_status dsc__frozen_alloc(dsc_engine *e, bool staging) {
    if (!e->nfrozen || e->dev_state) return DSC_OK; // (the device trainer holds them)
    if (!e->frozen_parted)
        return dsc__engine_alloc(e, e->frozen_total, "engine.frozen_weights", &e->h_frozen,
                            &e->fdata);
    DSC_TRY(dsc__engine_alloc(e, e->frozen_part, "engine.frozen_weights", &e->h_fpart, &e->fpart));
    for (int g = 0; g < e->ngroups; g++) {
        fgroup *fg = &e->fgroups[g];
        if (fg->persistent && fg->padded)
            DSC_TRY(dsc__engine_alloc(e, fg->padded, "engine.frozen_weights", &fg->h, &fg->buf));
    }
    if (!staging) return DSC_OK;
    return dsc__engine_alloc(e, e->frozen_total, "engine.init_weights", &e->h_frozen, &e->fdata);
}

void dsc__frozen_free(dsc_engine *e) {
    for (int g = 0; e->fgroups && g < e->ngroups; g++) {
        fgroup *fg = &e->fgroups[g];
        if (fg->req) dsc_comm_wait(fg->req);
        fg->req = NULL;
        dsc__engine_free(e, &fg->h);
        fg->buf = NULL;
    }
    dsc__engine_free(e, &e->h_frozen);
    dsc__engine_free(e, &e->h_fpart);
    dsc__engine_free(e, &e->h_frep);
    e->fdata = e->fpart = e->frep = NULL;
}

static float *at(dsc_engine *e, dsc_mem_handle h) { return h ? dsc_mem_ptr(e->pool, h) : NULL; }

void dsc__frozen_resolve(dsc_engine *e) {
    e->fdata = at(e, e->h_frozen);
    e->fpart = at(e, e->h_fpart);
    e->frep = at(e, e->h_frep);
    for (int g = 0; e->fgroups && g < e->ngroups; g++) e->fgroups[g].buf = at(e, e->fgroups[g].h);
}

float *dsc__frozen_data(const dsc_engine *e, const param *f) {
    if (e->fdata) return e->fdata + f->off; // whole, or the initialiser's staging
    if (!e->frozen_parted) return NULL;     // on the device
    const fgroup *fg = &e->fgroups[f->group];
    return fg->buf ? fg->buf + (f->off - fg->off) : NULL;
}

dsc_status dsc__frozen_fill(dsc_engine *e, dsc_param_fill_fn fill, void *user) {
    for (int i = 0; i < e->npub; i++) {
        const param *f = dsc__engine_frozen_of(e, i);
        if (!f) continue;
        dsc_status st = DSC_OK;
        if (e->fdata) {
            st = fill(user, i, 0, f->numel, e->fdata + f->off);
        } else { // this rank's slice of the group, where it meets the tensor
            const fgroup *fg = &e->fgroups[f->group];
            size_t lo = fg->off + (size_t)e->rank * fg->slice, hi = lo + fg->slice;
            size_t b = f->off > lo ? f->off : lo, end = f->off + (size_t)f->numel;
            if (end > hi) end = hi;
            if (b < end)
                st = fill(user, i, (int64_t)(b - f->off), (int64_t)(end - b),
                          e->fpart + fg->part_off + (b - lo));
        }
        if (st != DSC_OK) {
            dsc__error_prefix("initialising %s: ", f->name);
            return st;
        }
    }
    return DSC_OK;
}

dsc_status dsc__frozen_ready(dsc_engine *e) {
    // Frozen tensors never change: rounded once to the 16-bit type the model computes in (fp16,
    // bf16), as the trainable tensors' compute copy is after every step.
    if (!e->frozen_parted) {
        if (e->fdata) dsc__zero_round_compute(e, e->fdata, e->frozen_total);
        return DSC_OK;
    }
    if (e->fdata) { // the staging: keep this rank's slices
        for (int g = 0; g < e->ngroups; g++) {
            const fgroup *fg = &e->fgroups[g];
            memcpy(e->fpart + fg->part_off, e->fdata + fg->off + (size_t)e->rank * fg->slice,
                   fg->slice * sizeof(float));
        }
        dsc__engine_free(e, &e->h_frozen);
        e->fdata = NULL;
    }
    dsc__zero_round_compute(e, e->fpart, e->frozen_part);
    for (int g = 0; g < e->ngroups; g++) {
        fgroup *fg = &e->fgroups[g];
        if (fg->persistent && fg->buf)
            DSC_TRY(dsc__zero_all_gather(e, e->fpart + fg->part_off, fg->buf, fg->slice, NULL));
    }
    return dsc__frozen_replicate(e);
}

static dsc_status start(dsc_engine *e, int g, bool async) {
    fgroup *fg = &e->fgroups[g];
    dsc_status st = dsc__zero_take(e, fg->padded, &fg->h, &fg->buf);
    if (st != DSC_OK) {
        dsc__error_prefix("gathering the frozen tensors of layer group %d: ", g);
        return st;
    }
    return dsc__zero_all_gather(e, e->fpart + fg->part_off, fg->buf, fg->slice,
                                async ? &fg->req : NULL);
}

static dsc_status wait_req(dsc_comm_req **req) {
    if (!*req) return DSC_OK;
    dsc_status st = dsc_comm_wait(*req);
    *req = NULL;
    return st;
}

dsc_status dsc__frozen_gather(dsc_engine *e, int g) {
    if (!e->frozen_parted) return DSC_OK;
    fgroup *fg = &e->fgroups[g];
    if (!fg->persistent && fg->padded) {
        if (!fg->buf) DSC_TRY(start(e, g, false));
        DSC_TRY(wait_req(&fg->req));
    }
    int next = e->backward ? g - 1 : g + 1; // the layer after this one, as zero.c prefetches
    if (next < 0 || next >= e->ngroups) return DSC_OK;
    const fgroup *nf = &e->fgroups[next];
    if (nf->persistent || nf->buf || !nf->padded ||
        (double)nf->padded > e->cfg.zero_optimization.prefetch_bucket_size)
        return DSC_OK;
    return start(e, next, true);
}

dsc_status dsc__frozen_release(dsc_engine *e, int g) {
    if (!e->frozen_parted) return DSC_OK;
    fgroup *fg = &e->fgroups[g];
    if (fg->persistent || !fg->buf) return DSC_OK;
    DSC_TRY(wait_req(&fg->req));
    dsc__zero_give(e, &fg->h, fg->padded);
    fg->buf = NULL;
    return DSC_OK;
}

void dsc__frozen_abandon(dsc_engine *e) {
    for (int g = 0; e->frozen_parted && g < e->ngroups; g++) {
        fgroup *fg = &e->fgroups[g];
        if (fg->req) dsc_comm_wait(fg->req); // fails at once on a broken communicator
        fg->req = NULL;
        if (fg->persistent) continue;
        dsc__zero_give(e, &fg->h, fg->padded);
        fg->buf = NULL;
    }
}

// Group g's frozen range whole (padded) into *out: the buffer a persistent group keeps, else a
// transient block all-gathered now (*h: give it back). Every rank takes the same path whatever it
// holds (a group gathered for a layer on this rank is gathered again), so the collective matches.
static dsc_status group_whole(dsc_engine *e, int g, dsc_mem_handle *h, float **out) {
    fgroup *fg = &e->fgroups[g];
    *h = 0;
    if (fg->persistent) {
        *out = fg->buf;
        return DSC_OK;
    }
    DSC_TRY(dsc__zero_take(e, fg->padded, h, out));
    dsc_status st = dsc__zero_all_gather(e, e->fpart + fg->part_off, *out, fg->slice, NULL);
    if (st != DSC_OK) dsc__zero_give(e, h, fg->padded);
    return st;
}

dsc_status dsc__frozen_full(dsc_engine *e, const param *f, float *out) {
    if (e->fdata) { // whole, or the initialiser's staging
        memcpy(out, e->fdata + f->off, (size_t)f->numel * sizeof(float));
        return DSC_OK;
    }
    if (!e->frozen_parted)
        return dsc__fail(DSC_ERR_INVALID_ARG, "frozen tensor %s: its values are on the device",
                         f->name);
    const fgroup *fg = &e->fgroups[f->group];
    float *whole;
    dsc_mem_handle h;
    dsc_status st = group_whole(e, f->group, &h, &whole);
    if (st != DSC_OK) {
        dsc__error_prefix("gathering frozen tensor %s: ", f->name);
        return st;
    }
    memcpy(out, whole + (f->off - fg->off), (size_t)f->numel * sizeof(float));
    dsc__zero_give(e, &h, fg->padded);
    return DSC_OK;
}

dsc_status dsc__engine_frozen_group(dsc_engine *e, int g, dsc__frozen_put_fn put, void *user) {
    if (!e->fgroups || g < 0 || g >= e->ngroups)
        return dsc__fail(DSC_ERR_INTERNAL, "frozen tensors: no group %d (a bug: report it)", g);
    const fgroup *fg = &e->fgroups[g];
    if (!fg->padded) return DSC_OK;
    if (e->fdata) return put(user, fg->off, fg->padded, e->fdata + fg->off);
    if (!e->frozen_parted)
        return dsc__fail(DSC_ERR_INTERNAL, "frozen tensors of group %d: the host holds none "
                         "(the device keeps them; a bug: report it)", g);
    float *whole;
    dsc_mem_handle h;
    DSC_TRY(group_whole(e, g, &h, &whole));
    dsc_status st = put(user, fg->off, fg->padded, whole);
    dsc__zero_give(e, &h, fg->padded);
    return st;
}

dsc_status dsc__engine_frozen_gathered(dsc_engine *e, dsc__frozen_put_fn put, void *user) {
    for (int g = 0; e->frozen_parted && !e->fdata && g < e->ngroups; g++)
        DSC_TRY(dsc__engine_frozen_group(e, g, put, user));
    return DSC_OK;
}

const float *dsc__engine_frozen_own(const dsc_engine *e, int g, size_t *len) {
    *len = 0;
    if (!e->fgroups || g < 0 || g >= e->ngroups) return NULL;
    const fgroup *fg = &e->fgroups[g];
    if (e->frozen_parted && e->fpart) {
        *len = fg->slice;
        return e->fpart + fg->part_off;
    }
    if (e->world != 1 || !e->fdata) return NULL;
    *len = fg->padded;
    return e->fdata + fg->off;
}

dsc_status dsc__frozen_replicate(dsc_engine *e) {
    if (!e->frozen_parted || !dsc__ft_replicates(e) || !e->frozen_part) return DSC_OK;
    if (!e->h_frep) {
        dsc_status st = dsc__engine_alloc(e, e->frozen_part, "ft.replica", &e->h_frep, &e->frep);
        if (st != DSC_OK) {
            dsc__error_prefix("fault tolerance: the buddy's replica of the frozen tensors "
                              "(%.1f MiB; fault_tolerance.replicate false saves it): ",
                              (double)e->frozen_part * 4 / (1 << 20));
            return st;
        }
    }
    int next = (e->rank + 1) % e->world, prev = (e->rank + e->world - 1) % e->world;
    dsc_comm_req *rq = NULL, *sq = NULL;
    dsc_status st = dsc_comm_recv(e->comm, e->frep, e->frozen_part, DSC_DT_F32, prev, &rq);
    if (st == DSC_OK)
        st = dsc_comm_send(e->comm, e->fpart, e->frozen_part, DSC_DT_F32, next, &sq);
    dsc_status w1 = rq ? dsc_comm_wait(rq) : DSC_OK, w2 = sq ? dsc_comm_wait(sq) : DSC_OK;
    if (st == DSC_OK) st = w1 != DSC_OK ? w1 : w2;
    if (st != DSC_OK) dsc__error_prefix("fault tolerance: replicating the frozen tensors: ");
    e->comm_bytes_sent += e->frozen_part * sizeof(float);
    return st;
}
