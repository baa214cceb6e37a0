// ckpt/deepspeed.c - DeepSpeed's checkpoints: `latest`, the model-states file, the ranks' ZeRO
// optimizer files; the fp32 master weights of every parameter gathered from the partitions the
// way DeepSpeed's zero_to_fp32.py does, a range at a time.
#include "engine/ckpt/deepspeed.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free
#include <string.h> // strcmp, strlen

#include "base/status.h"           // dsc__fail
#include "engine/ckpt/fs.h"        // dsc__ckpt_join, dsc__ckpt_exists, dsc__ckpt_read_file
#include "engine/ckpt/torchfile.h" // dsc_pt_*

#define MODEL_FILE "mp_rank_00_model_states.pt"
#define MODEL_FILE_Z3 "zero_pp_rank_0_mp_rank_00_model_states.pt"
#define MAX_RANKS 65536

typedef struct ds_param {
    const char *name; // borrowed from the model file's pickle
    int ndim;
    int64_t shape[DSC_PARAM_MAX_DIMS];
    int64_t numel;
    int group;
    // ZeRO 1-2: offset in its group's flat (the ranks' partitions concatenated); ZeRO-3: offset
    // in every rank's flat (its groups concatenated), where it owns ceil(numel / world).
    int64_t off;
    const dsc_pt_tensor *whole; // without ZeRO partitions: the module's own tensor
} ds_param;

struct dsc_ds_ckpt {
    char path[DSC_CKPT_PATH_MAX]; // <dir>/<tag>
    char tag[DSC_CKPT_TAG_MAX];
    dsc_pt_file *model;
    dsc_pt_file **optim; // (world); world 0: no ZeRO files
    int world, stage, nparams, ngroups;
    const char *ds_version, *precision;
    int64_t global_steps, global_samples, skipped_steps, numel;
    double loss_scale;
    uint64_t bytes;
    ds_param *p;
    const dsc_pt_tensor **part; // [r * ngroups + g]: rank r's fp32 partition of group g
    // [(k * world + r) * ngroups + g]: Adam's moment k (0 exp_avg, 1 exp_avg_sq) of that
    // partition; it may be longer (DeepSpeed keeps the padding there), never shorter.
    const dsc_pt_tensor **mom;
    dsc_ds_ckpt_state st;
    int64_t *group_len;         // ZeRO 1-2: the group's flat; ZeRO-3: one rank's partition
    // The universal layout (zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt): [i * 3 + kind] is
    // parameter i's whole tensor of that kind, in files[i * 3 + kind].
    bool universal;
    dsc_pt_file **ufile;
    const dsc_pt_tensor **utensor;
};

// ---- finding the files ----

const char *dsc__ds_model_file(const char *tag_dir) {
    char p[DSC_CKPT_PATH_MAX];
    if (dsc__ckpt_join(p, sizeof p, tag_dir, MODEL_FILE) == DSC_OK && dsc__ckpt_exists(p))
        return MODEL_FILE;
    if (dsc__ckpt_join(p, sizeof p, tag_dir, MODEL_FILE_Z3) == DSC_OK && dsc__ckpt_exists(p))
        return MODEL_FILE_Z3;
    return NULL;
}

// <dir>/<tag>; tag NULL: the one <dir>/latest names, else dir itself is the tag directory.
// <dir>/latest names DeepSpeed's own tag; without it, <dir>/latest_universal (ds_to_universal's).
static bool latest_file(const char *dir, char *latest) {
    return !dsc__ds_model_file(dir) &&
           ((dsc__ckpt_join(latest, DSC_CKPT_PATH_MAX, dir, "latest") == DSC_OK &&
             dsc__ckpt_exists(latest)) ||
            (dsc__ckpt_join(latest, DSC_CKPT_PATH_MAX, dir, "latest_universal") == DSC_OK &&
             dsc__ckpt_exists(latest)));
}

static dsc_status resolve(const char *dir, const char *tag, char *path, char *tag_out) {
    char latest[DSC_CKPT_PATH_MAX], *text = NULL;
    size_t n = 0;
    if (!tag && latest_file(dir, latest)) {
        DSC_TRY(dsc__ckpt_read_file(latest, &text, &n));
        while (n && (text[n - 1] == '\n' || text[n - 1] == ' ' || text[n - 1] == '\r')) n--;
        text[n] = 0;
        if (!n || n >= DSC_CKPT_TAG_MAX || strchr(text, '/')) {
            free(text);
            return dsc__fail(DSC_ERR_CORRUPT, "%s does not name a tag", latest);
        }
        snprintf(tag_out, DSC_CKPT_TAG_MAX, "%s", text);
        free(text);
        return dsc__ckpt_join(path, DSC_CKPT_PATH_MAX, dir, tag_out);
    }
    if (tag) {
        snprintf(tag_out, DSC_CKPT_TAG_MAX, "%s", tag);
        return dsc__ckpt_join(path, DSC_CKPT_PATH_MAX, dir, tag);
    }
    const char *slash = strrchr(dir, '/');
    snprintf(tag_out, DSC_CKPT_TAG_MAX, "%s", slash && slash[1] ? slash + 1 : dir);
    snprintf(path, DSC_CKPT_PATH_MAX, "%s", dir);
    return DSC_OK;
}

bool dsc_ds_ckpt_detect(const char *dir, const char *tag) {
    char path[DSC_CKPT_PATH_MAX], t[DSC_CKPT_TAG_MAX];
    return resolve(dir, tag, path, t) == DSC_OK && dsc__ds_model_file(path) != NULL;
}

// The optimizer files' prefix ("bf16_" under bf16, else "") and how many ranks wrote one.
static dsc_status count_ranks(dsc_ds_ckpt *ds, const char **prefix) {
    static const char *const prefixes[] = {"bf16_", "", "fp16_"};
    char p[DSC_CKPT_PATH_MAX], name[128];
    for (int k = 0; k < 3; k++) {
        *prefix = prefixes[k];
        ds->world = 0;
        for (;; ds->world++) {
            snprintf(name, sizeof name, "%szero_pp_rank_%d_mp_rank_00_optim_states.pt", *prefix,
                     ds->world);
            if (ds->world >= MAX_RANKS || dsc__ckpt_join(p, sizeof p, ds->path, name) != DSC_OK ||
                !dsc__ckpt_exists(p))
                break;
        }
        if (ds->world) return DSC_OK;
    }
    return DSC_OK;
}

// ---- the model-states file ----

static int64_t get_int(const dsc_pt_value *d, const char *key, int64_t dflt) {
    int64_t x;
    return dsc_pt_int(dsc_pt_dict_get(d, key), &x) ? x : dflt;
}

static bool get_bool(const dsc_pt_value *d, const char *key) { return get_int(d, key, 0) != 0; }

static void read_scalars(dsc_ds_ckpt *ds, const dsc_pt_value *root) {
    ds->global_steps = get_int(root, "global_steps", 0);
    ds->global_samples = get_int(root, "global_samples", 0);
    ds->skipped_steps = get_int(root, "skipped_steps", 0);
    const dsc_pt_value *v = dsc_pt_dict_get(root, "ds_version"), *cfg;
    ds->ds_version = v && v->kind == DSC_PT_STR ? v->s : "unknown";
    cfg = dsc_pt_dict_get(root, "ds_config");
    ds->precision = get_bool(dsc_pt_dict_get(cfg, "bf16"), "enabled")   ? "bf16"
                    : get_bool(dsc_pt_dict_get(cfg, "fp16"), "enabled") ? "fp16"
                                                                        : "fp32";
    ds->stage = (int)get_int(dsc_pt_dict_get(cfg, "zero_optimization"), "stage", 0);
    ds->loss_scale = 1;
    ds->st = (dsc_ds_ckpt_state){.adam_step = -1, .cur_scale = 1, .last_overflow_iter = -1};
    const dsc_pt_value *type = dsc_pt_dict_get(dsc_pt_dict_get(cfg, "optimizer"), "type");
    ds->st.optimizer = type && type->kind == DSC_PT_STR ? type->s : NULL;
    type = dsc_pt_dict_get(dsc_pt_dict_get(cfg, "scheduler"), "type");
    ds->st.scheduler = type && type->kind == DSC_PT_STR ? type->s : NULL;
    const dsc_pt_value *sched = dsc_pt_dict_get(root, "lr_scheduler");
    ds->st.has_scheduler = dsc_pt_num(dsc_pt_dict_get(sched, "last_batch_iteration"),
                                      &ds->st.last_batch_iteration);
}

static dsc_status param_shape(dsc_ds_ckpt *ds, const dsc_pt_value *shape, ds_param *p) {
    if (!shape || shape->kind != DSC_PT_TUPLE || shape->n > DSC_PARAM_MAX_DIMS)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: param_shapes[%s] is not a shape of at most %d "
                         "dimensions", dsc_pt_path(ds->model), p->name, DSC_PARAM_MAX_DIMS);
    p->ndim = shape->n;
    p->numel = 1;
    for (int d = 0; d < shape->n; d++) {
        if (!dsc_pt_int(shape->items[d], &p->shape[d]) || p->shape[d] < 0 ||
            __builtin_mul_overflow(p->numel, p->shape[d], &p->numel))
            return dsc__fail(DSC_ERR_CORRUPT, "%s: param_shapes[%s] has a bad dimension",
                             dsc_pt_path(ds->model), p->name);
    }
    return DSC_OK;
}

static dsc_status alloc_params(dsc_ds_ckpt *ds, int n) {
    ds->p = calloc((size_t)(n ? n : 1), sizeof *ds->p);
    if (!ds->p) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", ds->path);
    return DSC_OK;
}

// param_shapes: one dict per optimizer group, name -> torch.Size, in the flat order.
static dsc_status read_param_shapes(dsc_ds_ckpt *ds, const dsc_pt_value *shapes) {
    int n = 0;
    for (int g = 0; g < shapes->n; g++) {
        const dsc_pt_value *d = shapes->items[g];
        if (d->kind != DSC_PT_DICT)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: param_shapes[%d] is not a dict of shapes",
                             dsc_pt_path(ds->model), g);
        n += d->n / 2;
    }
    DSC_TRY(alloc_params(ds, n));
    for (int g = 0; g < shapes->n; g++) {
        const dsc_pt_value *d = shapes->items[g];
        for (int k = 0; k + 1 < d->n; k += 2) {
            ds_param *p = &ds->p[ds->nparams++];
            if (d->items[k]->kind != DSC_PT_STR)
                return dsc__fail(DSC_ERR_CORRUPT, "%s: a parameter name that is not a string",
                                 dsc_pt_path(ds->model));
            p->name = d->items[k]->s;
            p->group = g;
            DSC_TRY(param_shape(ds, d->items[k + 1], p));
        }
    }
    ds->ngroups = shapes->n;
    return DSC_OK;
}

// Without ZeRO files, the module's tensors are the weights (buffers excluded).
static dsc_status read_module(dsc_ds_ckpt *ds, const dsc_pt_value *root) {
    const dsc_pt_value *mod = dsc_pt_dict_get(root, "module");
    const dsc_pt_value *bufs = dsc_pt_dict_get(root, "buffer_names");
    if (!mod || mod->kind != DSC_PT_DICT)
        return dsc__fail(DSC_ERR_CORRUPT, "%s has no \"module\" dict of weights",
                         dsc_pt_path(ds->model));
    DSC_TRY(alloc_params(ds, mod->n / 2));
    for (int k = 0; k + 1 < mod->n; k += 2) {
        const dsc_pt_value *key = mod->items[k], *t = mod->items[k + 1];
        bool buffer = false;
        for (int b = 0; bufs && b < bufs->n; b++) buffer |= dsc_pt_is_str(bufs->items[b], key->s);
        if (key->kind != DSC_PT_STR || t->kind != DSC_PT_TENSOR || buffer) continue;
        if (t->t->ndim > DSC_PARAM_MAX_DIMS)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: module[%s] has %d dimensions",
                             dsc_pt_path(ds->model), key->s, t->t->ndim);
        ds_param *p = &ds->p[ds->nparams++];
        *p = (ds_param){.name = key->s, .ndim = t->t->ndim, .numel = t->t->numel, .whole = t->t};
        for (int d = 0; d < p->ndim; d++) p->shape[d] = t->t->shape[d];
    }
    ds->ngroups = 1;
    return DSC_OK;
}

// ---- the optimizer files ----

static dsc_status open_optim(dsc_ds_ckpt *ds, const char *prefix, int r,
                             const dsc_pt_value **osd) {
    char name[128], p[DSC_CKPT_PATH_MAX];
    snprintf(name, sizeof name, "%szero_pp_rank_%d_mp_rank_00_optim_states.pt", prefix, r);
    DSC_TRY(dsc__ckpt_join(p, sizeof p, ds->path, name));
    DSC_TRY(dsc_pt_open(&ds->optim[r], p));
    ds->bytes += dsc_pt_file_bytes(ds->optim[r]);
    *osd = dsc_pt_dict_get(dsc_pt_root(ds->optim[r]), "optimizer_state_dict");
    if (!*osd || (*osd)->kind != DSC_PT_DICT)
        return dsc__fail(DSC_ERR_CORRUPT, "%s has no optimizer_state_dict: not a ZeRO optimizer "
                         "file", p);
    return DSC_OK;
}

// partition_count: an int, or a list of them (one per group; the largest is the world).
static int64_t partition_count(const dsc_pt_value *osd) {
    const dsc_pt_value *pc = dsc_pt_dict_get(osd, "partition_count");
    int64_t x = -1, y;
    if (dsc_pt_int(pc, &x)) return x;
    for (int i = 0; pc && pc->kind == DSC_PT_LIST && i < pc->n; i++)
        if (dsc_pt_int(pc->items[i], &y) && y > x) x = y;
    return x;
}

static dsc_status read_partitions(dsc_ds_ckpt *ds, int r, const dsc_pt_value *osd) {
    const char *key = ds->stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
    const dsc_pt_value *groups = dsc_pt_dict_get(osd, key);
    const char *file = dsc_pt_path(ds->optim[r]);
    if (!groups || groups->kind != DSC_PT_LIST || (ds->stage != 3 && groups->n != ds->ngroups))
        return dsc__fail(DSC_ERR_CORRUPT, "%s: %s is not a list of %d partitions", file, key,
                         ds->ngroups);
    if (r == 0 && ds->stage == 3) {
        ds->ngroups = groups->n; // ZeRO-3's sub-groups need not match param_shapes' groups
        free(ds->part);
        ds->part = calloc((size_t)ds->world * (size_t)groups->n + 1, sizeof *ds->part);
        if (!ds->part) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", file);
    }
    if (groups->n != ds->ngroups)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: %d groups, rank 0 has %d", file, groups->n,
                         ds->ngroups);
    for (int g = 0; g < groups->n; g++) {
        const dsc_pt_value *t = groups->items[g];
        if (t->kind != DSC_PT_TENSOR || t->t->ndim != 1)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: %s[%d] is not a flat tensor", file, key, g);
        ds->part[(size_t)r * ds->ngroups + g] = t->t;
    }
    return DSC_OK;
}

// A dict's value under an integer key (torch optimizers key their state by parameter index).
static const dsc_pt_value *dict_get_int(const dsc_pt_value *d, int64_t key) {
    int64_t x;
    for (int k = 0; d && d->kind == DSC_PT_DICT && k + 1 < d->n; k += 2)
        if (d->items[k]->kind == DSC_PT_INT && dsc_pt_int(d->items[k], &x) && x == key)
            return d->items[k + 1];
    return NULL;
}

// A number, or a one-element tensor (torch.optim keeps Adam's step as a tensor).
static bool get_count(const dsc_pt_value *v, double *out) {
    if (dsc_pt_num(v, out)) return true;
    if (!v || v->kind != DSC_PT_TENSOR || v->t->numel != 1) return false;
    float f;
    dsc_pt_tensor_read(v->t, 0, 1, &f);
    *out = f;
    return true;
}

// The torch optimizer's state of (sub-)group g, whose one parameter is the group's flat
// partition: ZeRO 0-2 keep optimizer.state_dict() as base_optimizer_state (elastic checkpoints:
// a list of per-group states instead), ZeRO-3 as its own optimizer_state_dict.
static const dsc_pt_value *torch_optim(const dsc_ds_ckpt *ds, const dsc_pt_value *osd) {
    return dsc_pt_dict_get(osd, ds->stage == 3 ? "optimizer_state_dict" : "base_optimizer_state");
}

static const dsc_pt_value *group_state(const dsc_ds_ckpt *ds, const dsc_pt_value *osd, int g) {
    const dsc_pt_value *b = torch_optim(ds, osd);
    if (b && b->kind == DSC_PT_LIST) return dsc_pt_item(b, g);
    return dict_get_int(dsc_pt_dict_get(b, "state"), g);
}

// Adam's step: in the state of the first partition, else in param_groups[0] (DeepSpeed's
// FusedAdam), else beside an elastic checkpoint's states.
static void read_adam_step(dsc_ds_ckpt *ds, const dsc_pt_value *osd) {
    double x;
    const dsc_pt_value *groups = dsc_pt_dict_get(torch_optim(ds, osd), "param_groups");
    if (get_count(dsc_pt_dict_get(group_state(ds, osd, 0), "step"), &x) ||
        get_count(dsc_pt_dict_get(dsc_pt_item(groups, 0), "step"), &x) ||
        get_count(dsc_pt_dict_get(osd, "base_optimizer_state_step"), &x))
        ds->st.adam_step = (int64_t)x;
}

static dsc_status read_moments(dsc_ds_ckpt *ds, int r, const dsc_pt_value *osd) {
    static const char *const keys[2] = {"exp_avg", "exp_avg_sq"};
    const char *file = dsc_pt_path(ds->optim[r]);
    if (r == 0) {
        const dsc_pt_value *s0 = group_state(ds, osd, 0);
        ds->st.has_moments = dsc_pt_dict_get(s0, keys[0]) && dsc_pt_dict_get(s0, keys[1]);
        read_adam_step(ds, osd);
        free(ds->mom);
        ds->mom = calloc(2 * (size_t)ds->world * (size_t)ds->ngroups + 1, sizeof *ds->mom);
        if (!ds->mom) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", file);
    }
    for (int g = 0; ds->st.has_moments && g < ds->ngroups; g++) {
        const dsc_pt_tensor *part = ds->part[(size_t)r * ds->ngroups + g];
        for (int k = 0; k < 2; k++) {
            const dsc_pt_value *t = dsc_pt_dict_get(group_state(ds, osd, g), keys[k]);
            if (!t || t->kind != DSC_PT_TENSOR || t->t->ndim != 1 || t->t->numel < part->numel)
                return dsc__fail(DSC_ERR_CORRUPT, "%s: the optimizer state of group %d has no "
                                 "flat %s of at least %lld elements (its fp32 partition's): "
                                 "files of different saves mixed, or not Adam's state", file, g,
                                 keys[k], (long long)part->numel);
            ds->mom[((size_t)k * ds->world + r) * ds->ngroups + g] = t->t;
        }
    }
    return DSC_OK;
}

// The loss scaler (an inert copy of DeepSpeed's LossScaler or DynamicLossScaler).
static void read_scaler(dsc_ds_ckpt *ds, const dsc_pt_value *osd) {
    const dsc_pt_value *ls = dsc_pt_dict_get(osd, "loss_scaler");
    double s;
    int64_t x;
    if (dsc_pt_num(dsc_pt_attr(ls, "cur_scale"), &s)) ds->loss_scale = ds->st.cur_scale = s;
    size_t n = ls && ls->kind == DSC_PT_OBJECT && ls->s ? strlen(ls->s) : 0;
    ds->st.dynamic_scale = n >= 17 && !strcmp(ls->s + n - 17, "DynamicLossScaler");
    if (dsc_pt_int(dsc_pt_attr(ls, "cur_iter"), &x)) ds->st.cur_iter = x;
    if (dsc_pt_int(dsc_pt_attr(ls, "last_overflow_iter"), &x)) ds->st.last_overflow_iter = x;
    if (dsc_pt_int(dsc_pt_attr(ls, "cur_hysteresis"), &x)) ds->st.cur_hysteresis = (int)x;
}

static dsc_status read_optim(dsc_ds_ckpt *ds, const char *prefix) {
    ds->optim = calloc((size_t)ds->world, sizeof *ds->optim);
    ds->part = calloc((size_t)ds->world * (size_t)ds->ngroups + 1, sizeof *ds->part);
    if (!ds->optim || !ds->part)
        return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", ds->path);
    for (int r = 0; r < ds->world; r++) {
        const dsc_pt_value *osd = NULL;
        DSC_TRY(open_optim(ds, prefix, r, &osd));
        if (r == 0) {
            int64_t stage = get_int(osd, "zero_stage", -1), pc = partition_count(osd);
            if (stage >= 0) ds->stage = (int)stage; // absent: the bf16 optimizer (ZeRO 0)
            if (pc != ds->world)
                return dsc__fail(DSC_ERR_CORRUPT, "%s: partition_count is %lld but %d optimizer "
                                 "files are there: a save that did not complete on every rank, "
                                 "or files of another save mixed in", dsc_pt_path(ds->optim[0]),
                                 (long long)pc, ds->world);
            read_scaler(ds, osd);
        }
        DSC_TRY(read_partitions(ds, r, osd));
        DSC_TRY(read_moments(ds, r, osd));
    }
    return DSC_OK;
}

// ---- the layouts ----

static int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

// ZeRO 1-2 (and the bf16 optimizer): a group's parameters lie one after another in its flat
// vector, which is the ranks' partitions concatenated; DeepSpeed pads it to 2 x world.
static dsc_status layout_z12(dsc_ds_ckpt *ds) {
    for (int g = 0; g < ds->ngroups; g++) {
        int64_t len = 0, off = 0;
        for (int r = 0; r < ds->world; r++) len += ds->part[(size_t)r * ds->ngroups + g]->numel;
        for (int i = 0; i < ds->nparams; i++)
            if (ds->p[i].group == g) ds->p[i].off = off, off += ds->p[i].numel;
        ds->group_len[g] = len;
        if (off > len || align_up(off, 2 * ds->world) != align_up(len, 2 * ds->world))
            return dsc__fail(DSC_ERR_CORRUPT, "%s: group %d's parameters (param_shapes) hold "
                             "%lld elements, its partitions %lld: files of different saves mixed",
                             ds->path, g, (long long)off, (long long)len);
    }
    return DSC_OK;
}

// ZeRO-3: every parameter is split into world pieces of ceil(numel / world) (the last padded);
// rank r's flat vector (its groups concatenated) holds piece r of each, in order.
static dsc_status layout_z3(dsc_ds_ckpt *ds) {
    int64_t rank_len = 0, off = 0;
    for (int g = 0; g < ds->ngroups; g++) {
        ds->group_len[g] = ds->part[g]->numel;
        rank_len += ds->group_len[g];
        for (int r = 1; r < ds->world; r++)
            if (ds->part[(size_t)r * ds->ngroups + g]->numel != ds->group_len[g])
                return dsc__fail(DSC_ERR_CORRUPT, "%s: rank %d's partition of group %d differs "
                                 "from rank 0's", ds->path, r, g);
    }
    for (int i = 0; i < ds->nparams; i++) {
        ds->p[i].off = off;
        off += (ds->p[i].numel + ds->world - 1) / ds->world;
    }
    if (off != rank_len)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: the parameters (param_shapes) need %lld elements "
                         "per rank, the partitions hold %lld: files of different saves mixed",
                         ds->path, (long long)off, (long long)rank_len);
    return DSC_OK;
}

// ---- the universal layout ----

#define UNI_DIR "zero"
#define UNI_STATE UNI_DIR "/optimizer_state.pt"

static bool is_universal(const char *tag_dir) {
    char p[DSC_CKPT_PATH_MAX];
    return dsc__ckpt_join(p, sizeof p, tag_dir, UNI_STATE) == DSC_OK && dsc__ckpt_exists(p);
}

// zero/<name>/<kind>.pt: the tensor itself (ZeRO-3's converter) or {"param": tensor, ...}.
static dsc_status open_uni_tensor(dsc_ds_ckpt *ds, int i, int kind) {
    static const char *const files[3] = {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"};
    const ds_param *p = &ds->p[i];
    char d[DSC_CKPT_PATH_MAX], f[DSC_CKPT_PATH_MAX];
    if (snprintf(d, sizeof d, "%s/" UNI_DIR "/%s", ds->path, p->name) >= (int)sizeof d)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: path too long", ds->path);
    DSC_TRY(dsc__ckpt_join(f, sizeof f, d, files[kind]));
    if (kind && !dsc__ckpt_exists(f)) return DSC_OK; // no moments: has_moments says so
    dsc_pt_file **pf = &ds->ufile[(size_t)i * 3 + kind];
    DSC_TRY(dsc_pt_open(pf, f));
    ds->bytes += dsc_pt_file_bytes(*pf);
    const dsc_pt_value *v = dsc_pt_root(*pf);
    if (v && v->kind == DSC_PT_DICT) v = dsc_pt_dict_get(v, "param");
    if (!v || v->kind != DSC_PT_TENSOR || v->t->numel != p->numel)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: not a tensor of %lld elements (parameter %s's "
                         "shape in param_shapes)", f, (long long)p->numel, p->name);
    ds->utensor[(size_t)i * 3 + kind] = v->t;
    return DSC_OK;
}

// optimizer_state.pt: the loss scaler and the optimizer's groups; step.pt (ZeRO 1-2) or the
// optimizer's state (ZeRO-3) Adam's step.
static dsc_status read_universal(dsc_ds_ckpt *ds) {
    char p[DSC_CKPT_PATH_MAX];
    dsc_pt_file *f = NULL;
    DSC_TRY(dsc__ckpt_join(p, sizeof p, ds->path, UNI_STATE));
    DSC_TRY(dsc_pt_open(&f, p));
    const dsc_pt_value *osd = dsc_pt_root(f), *inner = dsc_pt_dict_get(osd, "optimizer_state_dict");
    read_scaler(ds, osd);
    double x;
    if (get_count(dsc_pt_dict_get(dict_get_int(dsc_pt_dict_get(inner, "state"), 0), "step"), &x) ||
        get_count(dsc_pt_dict_get(dsc_pt_item(dsc_pt_dict_get(osd, "param_groups"), 0), "step"),
                  &x))
        ds->st.adam_step = (int64_t)x;
    ds->bytes += dsc_pt_file_bytes(f);
    dsc_pt_close(f);
    ds->ufile = calloc((size_t)ds->nparams * 3 + 1, sizeof *ds->ufile);
    ds->utensor = calloc((size_t)ds->nparams * 3 + 1, sizeof *ds->utensor);
    if (!ds->ufile || !ds->utensor)
        return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", ds->path);
    for (int i = 0; i < ds->nparams; i++)
        for (int k = 0; k < 3; k++) DSC_TRY(open_uni_tensor(ds, i, k));
    ds->st.has_moments = true;
    for (int i = 0; i < ds->nparams * 3; i++) ds->st.has_moments &= ds->utensor[i] != NULL;
    char step[DSC_CKPT_PATH_MAX];
    if (ds->st.adam_step < 0 && ds->nparams &&
        snprintf(step, sizeof step, "%s/" UNI_DIR "/%s/step.pt", ds->path, ds->p[0].name) <
            (int)sizeof step && dsc__ckpt_exists(step)) {
        DSC_TRY(dsc_pt_open(&f, step));
        if (get_count(dsc_pt_root(f), &x)) ds->st.adam_step = (int64_t)x;
        dsc_pt_close(f);
    }
    return DSC_OK;
}

static dsc_status read_layout(dsc_ds_ckpt *ds, const char *prefix) {
    const dsc_pt_value *root = dsc_pt_root(ds->model);
    const dsc_pt_value *shapes = dsc_pt_dict_get(root, "param_shapes");
    if (ds->universal) {
        if (!shapes || shapes->kind != DSC_PT_LIST)
            return dsc__fail(DSC_ERR_CORRUPT, "%s: a universal checkpoint's model states without "
                             "param_shapes", dsc_pt_path(ds->model));
        DSC_TRY(read_param_shapes(ds, shapes));
        return read_universal(ds);
    }
    if (!ds->world) return read_module(ds, root);
    if (!shapes || shapes->kind != DSC_PT_LIST)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: ZeRO optimizer files but no param_shapes list",
                         dsc_pt_path(ds->model));
    DSC_TRY(read_param_shapes(ds, shapes));
    DSC_TRY(read_optim(ds, prefix));
    ds->group_len = calloc((size_t)ds->ngroups + 1, sizeof *ds->group_len);
    if (!ds->group_len) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", ds->path);
    return ds->stage == 3 ? layout_z3(ds) : layout_z12(ds);
}

static dsc_status open_ds(dsc_ds_ckpt *ds, const char *dir, const char *tag) {
    DSC_TRY(resolve(dir, tag, ds->path, ds->tag));
    const char *mf = dsc__ds_model_file(ds->path);
    if (!mf)
        return dsc__fail(DSC_ERR_IO, "%s holds neither " MODEL_FILE " nor " MODEL_FILE_Z3
                         ": not a DeepSpeed checkpoint directory", ds->path);
    char p[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(p, sizeof p, ds->path, mf));
    DSC_TRY(dsc_pt_open(&ds->model, p));
    ds->bytes = dsc_pt_file_bytes(ds->model);
    read_scalars(ds, dsc_pt_root(ds->model));
    const char *prefix = "";
    ds->universal = is_universal(ds->path);
    if (!ds->universal) DSC_TRY(count_ranks(ds, &prefix));
    DSC_TRY(read_layout(ds, prefix));
    for (int i = 0; i < ds->nparams; i++) ds->numel += ds->p[i].numel;
    if (!ds->nparams)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: no parameters found", ds->path);
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc_ds_ckpt_open(dsc_ds_ckpt **out, const char *dir, const char *tag) {
    *out = NULL;
    dsc_ds_ckpt *ds = calloc(1, sizeof *ds);
    if (!ds) return dsc__fail(DSC_ERR_OOM, "out of memory opening %s", dir);
    dsc_status st = open_ds(ds, dir, tag);
    if (st != DSC_OK) dsc_ds_ckpt_close(ds);
    else *out = ds;
    return st;
}

void dsc_ds_ckpt_close(dsc_ds_ckpt *ds) {
    if (!ds) return;
    for (int r = 0; ds->optim && r < ds->world; r++) dsc_pt_close(ds->optim[r]);
    free(ds->optim);
    dsc_pt_close(ds->model);
    free(ds->p);
    free(ds->part);
    free(ds->mom);
    free(ds->group_len);
    for (int i = 0; ds->ufile && i < ds->nparams * 3; i++) dsc_pt_close(ds->ufile[i]);
    free(ds->ufile);
    free(ds->utensor);
    free(ds);
}

void dsc_ds_ckpt_get_info(const dsc_ds_ckpt *ds, dsc_ds_ckpt_info *out) {
    *out = (dsc_ds_ckpt_info){
        .tag = ds->tag, .ds_version = ds->ds_version, .precision = ds->precision,
        .zero_stage = ds->stage, .world_size = ds->world ? ds->world : 1,
        .nparams = ds->nparams, .ngroups = ds->ngroups, .nfiles = 1 + ds->world,
        .global_steps = ds->global_steps, .global_samples = ds->global_samples,
        .skipped_steps = ds->skipped_steps, .numel = ds->numel, .loss_scale = ds->loss_scale,
        .bytes = ds->bytes, .universal = ds->universal};
    if (ds->universal) {
        int64_t w = get_int(dsc_pt_root(ds->model), "dp_world_size", 1);
        out->world_size = w > 0 && w <= MAX_RANKS ? (int)w : 1;
        out->nfiles = 2 + ds->nparams * (ds->st.has_moments ? 3 : 1);
    }
}

void dsc_ds_ckpt_get_param(const dsc_ds_ckpt *ds, int i, dsc_ckpt_param *out) {
    const ds_param *p = &ds->p[i];
    *out = (dsc_ckpt_param){.name = p->name, .ndim = p->ndim, .numel = p->numel,
                            .group = p->group};
    for (int d = 0; d < p->ndim; d++) out->shape[d] = p->shape[d];
}

int dsc_ds_ckpt_find_param(const dsc_ds_ckpt *ds, const char *name) {
    for (int i = 0; i < ds->nparams; i++)
        if (!strcmp(ds->p[i].name, name)) return i;
    return -1;
}

// The tensor of kind (0 fp32, 1 exp_avg, 2 exp_avg_sq) that lies beside rank r's partition g.
static const dsc_pt_tensor *kind_of(const dsc_ds_ckpt *ds, int kind, int r, int g) {
    if (kind == 0) return ds->part[(size_t)r * ds->ngroups + g];
    return ds->mom[((size_t)(kind - 1) * ds->world + r) * ds->ngroups + g];
}

// ZeRO 1-2: flat positions [pos, pos + n) of group g, from whichever ranks hold them (the fp32
// partitions' lengths place them; a moment holds the same positions).
static void read_z12(const dsc_ds_ckpt *ds, int kind, int g, int64_t pos, int64_t n,
                     float *out) {
    int64_t start = 0;
    for (int r = 0; r < ds->world && n > 0; r++) {
        const dsc_pt_tensor *t = ds->part[(size_t)r * ds->ngroups + g];
        if (pos < start + t->numel) {
            int64_t at = pos - start, k = t->numel - at < n ? t->numel - at : n;
            dsc_pt_tensor_read(kind_of(ds, kind, r, g), at, k, out);
            out += k, pos += k, n -= k;
        }
        start += t->numel;
    }
}

// ZeRO-3: rank r's flat positions [pos, pos + n) (its groups concatenated).
static void read_z3_rank(const dsc_ds_ckpt *ds, int kind, int r, int64_t pos, int64_t n,
                         float *out) {
    int64_t start = 0;
    for (int g = 0; g < ds->ngroups && n > 0; g++) {
        const dsc_pt_tensor *t = ds->part[(size_t)r * ds->ngroups + g];
        if (pos < start + t->numel) {
            int64_t at = pos - start, k = t->numel - at < n ? t->numel - at : n;
            dsc_pt_tensor_read(kind_of(ds, kind, r, g), at, k, out);
            out += k, pos += k, n -= k;
        }
        start += t->numel;
    }
}

static void read_z3(const dsc_ds_ckpt *ds, int kind, const ds_param *p, int64_t e, int64_t n,
                    float *out) {
    int64_t piece = (p->numel + ds->world - 1) / ds->world;
    while (n > 0) {
        int r = (int)(e / piece);
        int64_t local = e % piece, k = piece - local < n ? piece - local : n;
        read_z3_rank(ds, kind, r, p->off + local, k, out);
        out += k, e += k, n -= k;
    }
}

void dsc_ds_ckpt_get_state(const dsc_ds_ckpt *ds, dsc_ds_ckpt_state *out) { *out = ds->st; }

dsc_status dsc_ds_ckpt_read_param(dsc_ds_ckpt *ds, int i, int64_t begin, int64_t count,
                                  float *out) {
    return dsc_ds_ckpt_read_state(ds, i, 0, begin, count, out);
}

dsc_status dsc_ds_ckpt_read_state(dsc_ds_ckpt *ds, int i, int kind, int64_t begin,
                                  int64_t count, float *out) {
    if (i < 0 || i >= ds->nparams)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: no parameter %d", ds->path, i);
    if (kind < 0 || kind > 2 || (kind && !ds->st.has_moments))
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: no optimizer state %d (its files hold %s)",
                         ds->path, kind, ds->st.has_moments ? "fp32 weights and Adam's two "
                         "moments" : "no Adam moments");
    const ds_param *p = &ds->p[i];
    if (begin < 0 || count < 0 || begin > p->numel || count > p->numel - begin)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: parameter %s has %lld elements; [%lld, %lld) "
                         "was asked for", ds->path, p->name, (long long)p->numel,
                         (long long)begin, (long long)(begin + count));
    if (ds->universal) {
        dsc_pt_tensor_read(ds->utensor[(size_t)i * 3 + kind], begin, count, out);
        dsc_pt_release_pages(ds->ufile[(size_t)i * 3 + kind]);
        return DSC_OK;
    }
    if (p->whole) dsc_pt_tensor_read(p->whole, begin, count, out);
    else if (ds->stage == 3) read_z3(ds, kind, p, begin, count, out);
    else read_z12(ds, kind, p->group, p->off + begin, count, out);
    for (int r = 0; r < ds->world; r++) dsc_pt_release_pages(ds->optim[r]);
    dsc_pt_release_pages(ds->model);
    return DSC_OK;
}
