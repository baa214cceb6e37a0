// ckpt/ds_export.c - a dsc checkpoint as DeepSpeed's universal checkpoint: the layout DeepSpeed
// 0.18's ds_to_universal.py writes and its engine loads with checkpoint.load_universal, at any
// world size. Written with the torch.save writer (ptwrite.h), one tensor at a time.
//
//   OUT/latest_universal                      the tag, global_step<N>
//   OUT/<tag>/mp_rank_00_model_states.pt      ZeRO 1-2 (ZeRO-3: zero_pp_rank_0_mp_rank_00_...):
//                                             module, param_shapes, lr_scheduler, counters,
//                                             ds_config, ds_version
//   OUT/<tag>/zero/optimizer_state.pt         loss scaler, the optimizer's param_groups
//   OUT/<tag>/zero/<param>/fp32.pt            the fp32 master weights; exp_avg.pt, exp_avg_sq.pt
//                                             Adam's moments; step.pt (ZeRO 1-2) Adam's step
//
// ZeRO 1-2 read each tensor file as {"param": tensor, "cat_dim": 0} and ZeRO-3 as the bare
// tensor, so a universal checkpoint is for one or the other (zero_stage).
#include <jansson.h> // json_*
#include <stdio.h>   // snprintf, rename
#include <stdlib.h>  // malloc, free
#include <string.h>  // strcmp, strncmp

#include "base/io.h"              // dsc__mkdirs
#include "base/status.h"          // dsc__fail
#include "config/hjson.h"         // dsc__hjson_parse
#include "dsc/checkpoint.h"       // dsc_ckpt_export_deepspeed
#include "dsc/config.h"           // dsc_config_load_string
#include "dsc/half.h"             // dsc_fp32_to_bf16_n, dsc_fp32_to_fp16_n
#include "engine/ckpt/fs.h"       // dsc__ckpt_*
#include "engine/ckpt/ptwrite.h"  // dsc__ptw_*
#include "engine/ckpt/reader.h"   // struct dsc_ckpt, dsc__ckpt_read_flat
#include "engine/engine_impl.h"   // dsc__config_optimizer_at

// The DeepSpeed version whose loader the files are written for (its checks read ds_version).
#define DS_VERSION "0.18.4"

typedef struct ds_out {
    const dsc_ckpt *ck;
    const char *dir; // OUT/<tag>.partial while writing
    int stage;       // 1-2 or 3: the tensor files' form
    const char *prefix; // before every name but lm_head.*: GPT2LMHeadModel's "transformer."
    dsc_config cfg;
    json_t *ds_config; // the run's config as given (DeepSpeed's ds_config.json)
    dsc_opt_hparams hp;
    dsc_sched_params sched;
    bool has_sched, fp16;
    double next_lr; // the learning rate of the next step (what DeepSpeed's groups hold)
    float *buf;     // one tensor
    void *half;     // one tensor in 16 bits
} ds_out;

// DeepSpeed names parameters as the torch module does (named_parameters()). dsc's GPT-2 names
// are those of GPT2Model (wte.weight, h.0...), GPT2LMHeadModel's lack its "transformer.".
static void ds_name(const ds_out *o, const char *name, char *out, size_t cap) {
    bool head = !strncmp(name, "lm_head.", 8);
    snprintf(out, cap, "%s%s", head ? "" : o->prefix, name);
}

static dsc_status save(dsc__ptw *w, const char *dir, const char *file) {
    char p[DSC_CKPT_PATH_MAX];
    dsc_status st = dsc__ckpt_join(p, sizeof p, dir, file);
    if (st == DSC_OK) st = dsc__ptw_save(w, p, NULL);
    dsc__ptw_free(w);
    return st;
}

static void put_shape_tuple(dsc__ptw *w, const dsc__mparam *p) {
    dsc__ptw_tuple_begin(w);
    for (int d = 0; d < p->ndim; d++) dsc__ptw_int(w, p->shape[d]);
    dsc__ptw_tuple_end(w);
}

// A JSON value as the Python value json.load gives (ds_config).
static void put_json(dsc__ptw *w, const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *v;
        dsc__ptw_dict_begin(w);
        json_object_foreach((json_t *)j, k, v) {
            dsc__ptw_str(w, k);
            put_json(w, v);
        }
        dsc__ptw_dict_end(w);
        return;
    }
    case JSON_ARRAY: {
        size_t i;
        json_t *v;
        dsc__ptw_list_begin(w);
        json_array_foreach((json_t *)j, i, v) put_json(w, v);
        dsc__ptw_list_end(w);
        return;
    }
    case JSON_STRING: dsc__ptw_str(w, json_string_value(j)); return;
    case JSON_INTEGER: dsc__ptw_int(w, (int64_t)json_integer_value(j)); return;
    case JSON_REAL: dsc__ptw_float(w, json_real_value(j)); return;
    case JSON_TRUE: dsc__ptw_bool(w, true); return;
    case JSON_FALSE: dsc__ptw_bool(w, false); return;
    case JSON_NULL: dsc__ptw_none(w); return;
    }
}

// ---- the tensors ----

// Parameter i's master weights (kind 0) or moment kind - 1, whole, into o->buf.
static dsc_status read_kind(ds_out *o, int i, int kind) {
    const dsc__mparam *p = &o->ck->m.params[i];
    dsc__ckpt_read_flat(o->ck, kind, p->off, (size_t)p->numel, o->buf);
    return DSC_OK;
}

static dsc_status write_tensor_file(ds_out *o, int i, const char *dir, const char *file) {
    const dsc__mparam *p = &o->ck->m.params[i];
    dsc__ptw *w;
    DSC_TRY(dsc__ptw_new(&w));
    if (o->stage != 3) {
        dsc__ptw_dict_begin(w);
        dsc__ptw_str(w, "param");
    }
    dsc__ptw_tensor(w, DSC_PT_F32, p->ndim, p->shape, o->buf);
    if (o->stage != 3) {
        dsc__ptw_str(w, "cat_dim");
        dsc__ptw_int(w, 0);
        dsc__ptw_dict_end(w);
    }
    return save(w, dir, file);
}

static dsc_status write_param(ds_out *o, int i) {
    static const char *const files[3] = {"fp32.pt", "exp_avg.pt", "exp_avg_sq.pt"};
    char name[DSC_PARAM_NAME_MAX + 32], zero[DSC_CKPT_PATH_MAX], d[DSC_CKPT_PATH_MAX];
    ds_name(o, o->ck->m.params[i].name, name, sizeof name);
    DSC_TRY(dsc__ckpt_join(zero, sizeof zero, o->dir, "zero"));
    DSC_TRY(dsc__ckpt_join(d, sizeof d, zero, name));
    DSC_TRY(dsc__mkdirs(d));
    for (int k = 0; k < 3; k++) {
        DSC_TRY(read_kind(o, i, k));
        DSC_TRY(write_tensor_file(o, i, d, files[k]));
    }
    if (o->stage == 3) return DSC_OK; // ZeRO-3 keeps the step in optimizer_state.pt
    dsc__ptw *w;
    DSC_TRY(dsc__ptw_new(&w));
    float step = (float)o->ck->m.scalars.applied_steps; // torch's Adam: a float32 scalar tensor
    dsc__ptw_tensor(w, DSC_PT_F32, 0, NULL, &step);
    return save(w, d, "step.pt");
}

// ---- the optimizer's state ----

static void put_scaler(ds_out *o, dsc__ptw *w) {
    const dsc_state_scalars *s = &o->ck->m.scalars;
    dsc__ptw_str(w, "loss_scaler");
    dsc__ptw_object_begin(w, "deepspeed.runtime.fp16.loss_scaler",
                          o->fp16 ? "DynamicLossScaler" : "LossScaler");
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "cur_scale");
    dsc__ptw_float(w, o->fp16 ? s->cur_scale : 1.0);
    dsc__ptw_str(w, "dynamic");
    dsc__ptw_bool(w, o->fp16);
    if (o->fp16) {
        const dsc_config *c = &o->cfg;
        dsc__ptw_str(w, "cur_iter");
        dsc__ptw_int(w, s->cur_iter);
        dsc__ptw_str(w, "last_overflow_iter");
        dsc__ptw_int(w, s->last_overflow_iter);
        dsc__ptw_str(w, "scale_factor");
        dsc__ptw_float(w, 2.0);
        dsc__ptw_str(w, "scale_window");
        dsc__ptw_int(w, (int64_t)c->fp16.loss_scale_window);
        dsc__ptw_str(w, "min_scale");
        dsc__ptw_float(w, c->fp16.min_loss_scale);
        dsc__ptw_str(w, "delayed_shift");
        dsc__ptw_int(w, (int64_t)c->fp16.hysteresis);
        dsc__ptw_str(w, "cur_hysteresis");
        dsc__ptw_int(w, s->cur_hysteresis);
        dsc__ptw_str(w, "consecutive_hysteresis");
        dsc__ptw_bool(w, c->fp16.consecutive_hysteresis);
        dsc__ptw_str(w, "raise_error_at_min_scale");
        dsc__ptw_bool(w, true);
        dsc__ptw_str(w, "dtype");
        dsc__ptw_global(w, "torch", "float16");
    }
    dsc__ptw_dict_end(w);
    dsc__ptw_object_end(w);
}

// The optimizer's hyper-parameters, as its param_groups hold them (one group: DeepSpeed applies
// group 0's to every group when it loads a universal checkpoint).
static void put_param_groups(ds_out *o, dsc__ptw *w) {
    dsc__ptw_list_begin(w);
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "lr");
    dsc__ptw_float(w, o->next_lr);
    dsc__ptw_str(w, "betas");
    dsc__ptw_tuple_begin(w);
    dsc__ptw_float(w, o->hp.beta1);
    dsc__ptw_float(w, o->hp.beta2);
    dsc__ptw_tuple_end(w);
    dsc__ptw_str(w, "eps");
    dsc__ptw_float(w, o->hp.eps);
    dsc__ptw_str(w, "weight_decay");
    dsc__ptw_float(w, o->hp.weight_decay);
    dsc__ptw_str(w, "bias_correction"); // DeepSpeed's FusedAdam and CPUAdam read these two
    dsc__ptw_bool(w, o->hp.bias_correction);
    dsc__ptw_str(w, "step");
    dsc__ptw_int(w, o->ck->m.scalars.applied_steps);
    dsc__ptw_str(w, "params");
    dsc__ptw_list_begin(w);
    dsc__ptw_int(w, 0);
    dsc__ptw_list_end(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_list_end(w);
}

static dsc_status write_optimizer_state(ds_out *o) {
    char zero[DSC_CKPT_PATH_MAX];
    DSC_TRY(dsc__ckpt_join(zero, sizeof zero, o->dir, "zero"));
    DSC_TRY(dsc__mkdirs(zero));
    dsc__ptw *w;
    DSC_TRY(dsc__ptw_new(&w));
    dsc__ptw_dict_begin(w);
    put_scaler(o, w);
    dsc__ptw_str(w, "dynamic_loss_scale");
    dsc__ptw_bool(w, o->fp16);
    dsc__ptw_str(w, "overflow");
    dsc__ptw_bool(w, false);
    dsc__ptw_str(w, "clip_grad");
    dsc__ptw_float(w, o->cfg.gradient_clipping);
    dsc__ptw_str(w, "ds_version");
    dsc__ptw_str(w, DS_VERSION);
    dsc__ptw_str(w, "param_groups");
    put_param_groups(o, w);
    if (o->stage == 3) { // the torch optimizer's state_dict: Adam's step in state[0]
        float step = (float)o->ck->m.scalars.applied_steps;
        dsc__ptw_str(w, "optimizer_state_dict");
        dsc__ptw_dict_begin(w);
        dsc__ptw_str(w, "state");
        dsc__ptw_dict_begin(w);
        dsc__ptw_int(w, 0);
        dsc__ptw_dict_begin(w);
        dsc__ptw_str(w, "step");
        dsc__ptw_tensor(w, DSC_PT_F32, 0, NULL, &step);
        dsc__ptw_dict_end(w);
        dsc__ptw_dict_end(w);
        dsc__ptw_str(w, "param_groups");
        put_param_groups(o, w);
        dsc__ptw_dict_end(w);
    }
    dsc__ptw_dict_end(w);
    return save(w, zero, "optimizer_state.pt");
}

// ---- the model states ----

// module: the weights in the run's precision (what DeepSpeed's load_module_only reads).
static dsc_status put_module(ds_out *o, dsc__ptw *w) {
    const dsc__manifest *m = &o->ck->m;
    bool bf16 = !strcmp(m->precision, "bf16");
    dsc__ptw_ordered_dict_begin(w);
    for (int i = 0; i < m->nparams; i++) {
        const dsc__mparam *p = &m->params[i];
        char name[DSC_PARAM_NAME_MAX + 32];
        ds_name(o, p->name, name, sizeof name);
        DSC_TRY(read_kind(o, i, 0));
        dsc__ptw_str(w, name);
        if (o->fp16) dsc_fp32_to_fp16_n(o->half, o->buf, (size_t)p->numel);
        else if (bf16) dsc_fp32_to_bf16_n(o->half, o->buf, (size_t)p->numel);
        dsc__ptw_tensor(w, o->fp16 ? DSC_PT_F16 : bf16 ? DSC_PT_BF16 : DSC_PT_F32, p->ndim,
                        p->shape, o->fp16 || bf16 ? o->half : (void *)o->buf);
    }
    dsc__ptw_dict_end(w);
    return dsc__ptw_status(w);
}

static dsc_status write_model_states(ds_out *o) {
    const dsc__manifest *m = &o->ck->m;
    dsc__ptw *w;
    DSC_TRY(dsc__ptw_new(&w));
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "module");
    dsc_status st = put_module(o, w);
    if (st != DSC_OK) {
        dsc__ptw_free(w);
        return st;
    }
    dsc__ptw_str(w, "buffer_names");
    dsc__ptw_list_begin(w);
    dsc__ptw_list_end(w);
    dsc__ptw_str(w, "optimizer");
    dsc__ptw_none(w);
    dsc__ptw_str(w, "param_shapes");
    dsc__ptw_list_begin(w);
    dsc__ptw_ordered_dict_begin(w);
    for (int i = 0; i < m->nparams; i++) {
        char name[DSC_PARAM_NAME_MAX + 32];
        ds_name(o, m->params[i].name, name, sizeof name);
        dsc__ptw_str(w, name);
        dsc__ptw_call_begin(w, "torch", "Size");
        put_shape_tuple(w, &m->params[i]);
        dsc__ptw_call_end(w);
    }
    dsc__ptw_dict_end(w);
    dsc__ptw_list_end(w);
    dsc__ptw_str(w, "shared_params");
    dsc__ptw_dict_begin(w);
    dsc__ptw_dict_end(w);
    dsc__ptw_str(w, "lr_scheduler");
    if (o->has_sched) {
        dsc__ptw_dict_begin(w);
        dsc__ptw_str(w, "last_batch_iteration");
        double it = dsc_sched_iteration_after(o->sched.last_batch_iteration,
                                              m->scalars.applied_steps);
        if (it == (double)(int64_t)it) dsc__ptw_int(w, (int64_t)it);
        else dsc__ptw_float(w, it);
        dsc__ptw_dict_end(w);
    } else {
        dsc__ptw_none(w);
    }
    const struct { const char *key; int64_t v; } counts[] = {
        {"global_steps", m->scalars.global_steps},
        {"global_samples", m->scalars.global_steps * o->cfg.train_batch_size},
        {"skipped_steps", m->scalars.skipped_steps},
        {"dp_world_size", m->world},
        {"mp_world_size", 1},
    };
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        dsc__ptw_str(w, counts[k].key);
        dsc__ptw_int(w, counts[k].v);
    }
    dsc__ptw_str(w, "ds_config");
    put_json(w, o->ds_config);
    dsc__ptw_str(w, "ds_version");
    dsc__ptw_str(w, DS_VERSION);
    dsc__ptw_str(w, "universal_checkpoint_info");
    dsc__ptw_dict_begin(w);
    dsc__ptw_str(w, "universal_checkpoint_version");
    dsc__ptw_float(w, 0.2);
    dsc__ptw_dict_end(w);
    dsc__ptw_dict_end(w);
    return save(w, o->dir, o->stage == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt"
                                         : "mp_rank_00_model_states.pt");
}

// ---- the export ----

static dsc_status check_optimizer(const dsc_ckpt *ck) {
    const dsc__manifest *m = &ck->m;
    if (m->nmoments != 2 || strcmp(m->moments[0], "exp_avg") ||
        strcmp(m->moments[1], "exp_avg_sq"))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "checkpoint %s: optimizer %s; the export to "
                         "DeepSpeed writes Adam's and AdamW's state (exp_avg, exp_avg_sq) only",
                         ck->path, m->optimizer);
    return DSC_OK;
}

// The run's config: config_path, else the ds_config.json the trainer attached to the checkpoint.
static dsc_status read_config(ds_out *o, const char *config_path) {
    char path[DSC_CKPT_PATH_MAX], *text = NULL;
    size_t n = 0;
    if (!config_path && !dsc_ckpt_attachment_path(o->ck, "ds_config.json", path, sizeof path))
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint %s carries no ds_config.json (it was "
                         "saved by an older dsc); give the run's config with --config FILE",
                         o->ck->path);
    const char *from = config_path ? config_path : path;
    DSC_TRY(dsc__ckpt_read_file(from, &text, &n));
    dsc_config_defaults(&o->cfg);
    dsc_status st = dsc__hjson_parse(text, n, from, &o->ds_config);
    if (st == DSC_OK) st = dsc_config_load_file(&o->cfg, from, o->ck->m.world, NULL, NULL);
    free(text);
    return st;
}

static dsc_status prepare(ds_out *o, int zero_stage, const char *config_path) {
    const dsc__manifest *m = &o->ck->m;
    DSC_TRY(check_optimizer(o->ck));
    DSC_TRY(read_config(o, config_path));
    DSC_TRY(dsc__config_optimizer_at(&o->cfg, m->scalars.applied_steps + 1, &o->hp, &o->next_lr,
                                     &o->sched, &o->has_sched));
    o->fp16 = !strcmp(m->precision, "fp16");
    // DeepSpeed reads a universal checkpoint's optimizer state into its ZeRO optimizers only
    // (engine.load_checkpoint skips it at stage 0, the bf16 optimizer's too); a stage-0 run's
    // export is for ZeRO 1-2, whose files are the same.
    if (zero_stage == 0 || zero_stage > 3)
        return dsc__fail(DSC_ERR_INVALID_ARG, "--zero-stage %d: DeepSpeed loads a universal "
                         "checkpoint into ZeRO stages 1, 2 or 3 only; give the stage (1-3) of the "
                         "DeepSpeed run that will load it", zero_stage);
    o->stage = zero_stage > 0 ? zero_stage : m->stage > 0 ? m->stage : 1;
    o->prefix = "";
    for (int i = 0; i < m->nparams; i++)
        if (!strncmp(m->params[i].name, "wte.", 4)) o->prefix = "transformer.";
    int64_t most = 1;
    for (int i = 0; i < m->nparams; i++)
        if (m->params[i].numel > most) most = m->params[i].numel;
    o->buf = malloc((size_t)most * sizeof(float));
    o->half = malloc((size_t)most * 2);
    if (!o->buf || !o->half)
        return dsc__fail(DSC_ERR_OOM, "out of memory for a tensor of %lld elements",
                         (long long)most);
    return DSC_OK;
}

static dsc_status write_all(ds_out *o) {
    DSC_TRY(dsc__mkdirs(o->dir));
    DSC_TRY(write_model_states(o));
    DSC_TRY(write_optimizer_state(o));
    for (int i = 0; i < o->ck->m.nparams; i++) DSC_TRY(write_param(o, i));
    return DSC_OK;
}

dsc_status dsc_ckpt_export_deepspeed(const char *dir, const char *tag, const char *out_dir,
                                     int zero_stage, const char *config_path) {
    dsc_ckpt *ck;
    DSC_TRY(dsc_ckpt_open(&ck, dir, tag));
    ds_out o = {.ck = ck};
    char name[64], final[DSC_CKPT_PATH_MAX], partial[DSC_CKPT_PATH_MAX];
    char latest[DSC_CKPT_PATH_MAX];
    snprintf(name, sizeof name, "global_step%lld", (long long)ck->m.scalars.global_steps);
    dsc_status st = dsc__ckpt_join(final, sizeof final, out_dir, name);
    if (st == DSC_OK) st = dsc__ckpt_join(latest, sizeof latest, out_dir, "latest_universal");
    if (st == DSC_OK &&
        snprintf(partial, sizeof partial, "%s.partial", final) >= (int)sizeof partial)
        st = dsc__fail(DSC_ERR_INVALID_ARG, "%s: path too long", final);
    if (st == DSC_OK && dsc__ckpt_exists(final))
        st = dsc__fail(DSC_ERR_INVALID_ARG, "%s already exists; remove it or export to another "
                       "folder (nothing was written)", final);
    if (st == DSC_OK) st = prepare(&o, zero_stage, config_path);
    o.dir = partial;
    if (st == DSC_OK) st = dsc__ckpt_rmtree(partial); // a leftover of an export that died
    if (st == DSC_OK) st = write_all(&o);
    if (st == DSC_OK && rename(partial, final) != 0)
        st = dsc__fail(DSC_ERR_IO, "cannot rename %s to %s", partial, final);
    if (st == DSC_OK) st = dsc__ckpt_fsync_path(out_dir);
    if (st == DSC_OK) st = dsc__ckpt_write_file(latest, name, strlen(name), true);
    if (st != DSC_OK) dsc__ckpt_rmtree(partial);
    free(o.buf);
    free(o.half);
    json_decref(o.ds_config);
    dsc_ckpt_close(ck);
    return st;
}
