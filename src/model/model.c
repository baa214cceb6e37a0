// model/model.c - the model registry (built-in families from families.def, then the ones a
// program registers) and the dsc_model_* calls, which check their arguments and go through the
// family's table.
#include "model/model.h"

#include <pthread.h> // pthread_mutex_*
#include <stdio.h>   // snprintf
#include <stdlib.h>  // calloc, free
#include <string.h>  // strcmp, strlen
#include <unistd.h>  // access

#include "base/status.h"     // dsc__fail, DSC_TRY
#include "model/hf_config.h" // dsc_hf_config_read, dsc_hf_config_respell
#include "model/lora.h"      // dsc__lora_*

// ---- the registry ----

#define DSC_MODEL_FAMILY(name) extern const struct dsc_model_ops dsc__##name##_model_ops;
#include "model/families.def"
#undef DSC_MODEL_FAMILY

#define DSC_MODEL_FAMILY(name) &dsc__##name##_model_ops,
static const struct dsc_model_ops *const builtin[] = {
#include "model/families.def"
};
#undef DSC_MODEL_FAMILY

enum { NBUILTIN = sizeof builtin / sizeof builtin[0], MAX_REGISTERED = 16 };

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static const struct dsc_model_ops *registered[MAX_REGISTERED]; // newest first
static int nregistered;

int dsc_model_num_families(void) {
    pthread_mutex_lock(&reg_mu);
    int n = nregistered + NBUILTIN;
    pthread_mutex_unlock(&reg_mu);
    return n;
}

const struct dsc_model_ops *dsc_model_family(int i) {
    pthread_mutex_lock(&reg_mu);
    const struct dsc_model_ops *f = i < 0                 ? NULL
                                    : i < nregistered     ? registered[i]
                                    : i - nregistered < NBUILTIN ? builtin[i - nregistered]
                                                                 : NULL;
    pthread_mutex_unlock(&reg_mu);
    return f;
}

// The first required slot ops leaves NULL, or NULL when none is missing.
static const char *missing_slot(const struct dsc_model_ops *o) {
    const struct {
        const char *name;
        bool set;
    } req[] = {
        {"family", o->family != NULL},           {"specs", o->specs != NULL},
        {"claims", o->claims != NULL},           {"config_parse", o->config_parse != NULL},
        {"config_from_params", o->config_from_params != NULL},
        {"config_free", o->config_free != NULL}, {"describe", o->describe != NULL},
        {"param", o->param != NULL},             {"init", o->init != NULL},
        {"flops_per_token", o->flops_per_token != NULL},
        {"modules", o->modules != NULL},         {"timing_slots", o->timing_slots != NULL},
        {"host_create", o->host_create != NULL}, {"host_destroy", o->host_destroy != NULL},
        {"forward", o->forward != NULL},         {"backward", o->backward != NULL},
        {"logits", o->logits != NULL},           {"set_timing", o->set_timing != NULL},
    };
    for (size_t i = 0; i < sizeof req / sizeof req[0]; i++)
        if (!req[i].set) return req[i].name;
    const struct dsc_model_device_ops *d = o->device;
    if (!d) return NULL; // no device passes is fine; some of them is not
    const struct {
        const char *name;
        bool set;
    } dreq[] = {
        {"device->create", d->create != NULL},
        {"device->destroy", d->destroy != NULL},
        {"device->set_fp16", d->set_fp16 != NULL},
        {"device->set_grads_fresh", d->set_grads_fresh != NULL},
        {"device->set_grad_hook", d->set_grad_hook != NULL},
        {"device->set_layer_hook", d->set_layer_hook != NULL},
        {"device->forward", d->forward != NULL},
        {"device->backward", d->backward != NULL},
        {"device->train_step", d->train_step != NULL},
        {"device->read_loss", d->read_loss != NULL},
        {"device->loss_enqueue", d->loss_enqueue != NULL},
    };
    for (size_t i = 0; i < sizeof dreq / sizeof dreq[0]; i++)
        if (!dreq[i].set) return dreq[i].name;
    const struct dsc_model_decode_ops *g = d->decode;
    if (!g) return NULL; // no GPU decoder is fine; part of one is not
    const struct {
        const char *name;
        bool set;
    } greq[] = {
        {"device->decode->create", g->create != NULL},
        {"device->decode->destroy", g->destroy != NULL},
        {"device->decode->kv_bytes", g->kv_bytes != NULL},
        {"device->decode->prefill", g->prefill != NULL},
        {"device->decode->step", g->step != NULL},
        {"device->decode->argmax", g->argmax != NULL},
        {"device->decode->logits", g->logits != NULL},
    };
    for (size_t i = 0; i < sizeof greq / sizeof greq[0]; i++)
        if (!greq[i].set) return greq[i].name;
    return NULL;
}

dsc_status dsc_model_register(const struct dsc_model_ops *ops) {
    if (!ops) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_register: ops is NULL");
    const char *miss = missing_slot(ops);
    if (miss)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "dsc_model_register: model family %s has no %s; every family needs it "
                         "(see dsc/model.h)", ops->family ? ops->family : "(unnamed)", miss);
    for (int i = 0; i < dsc_model_num_families(); i++)
        if (!strcmp(dsc_model_family(i)->family, ops->family))
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "dsc_model_register: a model family named %s is registered "
                             "already; give the family another name", ops->family);
    pthread_mutex_lock(&reg_mu);
    dsc_status st = DSC_OK;
    if (nregistered == MAX_REGISTERED) {
        st = dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_register: %d families registered "
                       "already, the most a program may add", MAX_REGISTERED);
    } else {
        memmove(registered + 1, registered, sizeof registered[0] * (size_t)nregistered);
        registered[0] = ops;
        nregistered++;
    }
    pthread_mutex_unlock(&reg_mu);
    return st;
}

// ---- a model ----

struct dsc_model {
    const struct dsc_model_ops *ops;
    void *cfg;   // the family's configuration (owned)
    void *state; // host activations (dsc_model_reserve), or NULL
    char spec[4200];
    dsc_model_info info;
    dsc_model_param *params; // (info.num_tensors)
    bool recompute;          // dsc_model_set_recompute
    int fp8;                 // dsc_model_set_fp8's format
    dsc_lora *lora;          // dsc_model_set_lora, or NULL
    int n_base;              // the family's tensors (info.num_tensors less the adapters)
};

struct dsc_model_kv {
    const struct dsc_model_ops *ops;
    void *impl;
};

const struct dsc_model_ops *dsc__model_ops(const dsc_model *m) { return m ? m->ops : NULL; }
const void *dsc__model_config(const dsc_model *m) { return m ? m->cfg : NULL; }

dsc_status dsc__model_wrap(dsc_model **out, const struct dsc_model_ops *ops, void *cfg,
                           const char *spec) {
    dsc_model *m = calloc(1, sizeof *m);
    if (!m) {
        ops->config_free(cfg);
        return dsc__fail(DSC_ERR_OOM, "model %s: out of memory for the handle", spec);
    }
    m->ops = ops;
    m->cfg = cfg;
    snprintf(m->spec, sizeof m->spec, "%s", spec);
    ops->describe(cfg, &m->info);
    m->params = calloc((size_t)m->info.num_tensors, sizeof *m->params);
    if (!m->params) {
        dsc_model_destroy(m);
        return dsc__fail(DSC_ERR_OOM, "model %s: out of memory for its parameter table", spec);
    }
    for (int i = 0; i < m->info.num_tensors; i++) ops->param(cfg, i, &m->params[i]);
    m->n_base = m->info.num_tensors;
    *out = m;
    return DSC_OK;
}

static const dsc_model_opts no_opts;

// Every family's specs into buf: "<specs> (<family>); <specs> (<family>)".
static void all_specs(char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < dsc_model_num_families() && at < cap; i++) {
        const struct dsc_model_ops *f = dsc_model_family(i);
        int n = snprintf(buf + at, cap - at, "%s%s (%s)", i ? "; " : "", f->specs, f->family);
        if (n > 0) at += (size_t)n;
    }
}

// "hf:DIR": the family whose config_from_hf takes DIR/config.json.
static dsc_status create_hf(dsc_model **out, const char *spec, const dsc_model_opts *opts) {
    char path[4200];
    dsc_hf_config h;
    snprintf(path, sizeof path, "%s/config.json", spec + 3);
    DSC_TRY(dsc_hf_config_read(spec + 3, &h)); // names a missing file or an unknown architecture
    for (int i = 0; i < dsc_model_num_families(); i++) {
        const struct dsc_model_ops *f = dsc_model_family(i);
        if (!f->config_from_hf) continue;
        void *cfg = NULL;
        dsc_status st = f->config_from_hf(path, opts ? opts : &no_opts, &cfg);
        if (st == DSC_OK) return dsc__model_wrap(out, f, cfg, spec);
        if (st != DSC_ERR_UNSUPPORTED) return st;
    }
    return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: architecture %s has no model family in this dsc",
                     path, h.architecture);
}

const char *dsc_model_hf_dir(const dsc_model *m) {
    return m && !strncmp(m->spec, "hf:", 3) ? m->spec + 3 : NULL;
}

dsc_status dsc_model_hf_config(const dsc_model *m, char **config_json, char **generation_json) {
    *config_json = *generation_json = NULL;
    if (!m->ops->hf_config)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "model family %s writes no Hugging Face config",
                         m->ops->family);
    DSC_TRY(m->ops->hf_config(m->cfg, config_json, generation_json));
    const char *dir = dsc_model_hf_dir(m);
    if (!dir) return DSC_OK;
    // A folder's own config.json, every field kept, in both spellings.
    free(*config_json);
    dsc_status st = dsc_hf_config_respell(dir, config_json);
    if (st != DSC_OK) {
        free(*generation_json);
        *generation_json = NULL;
    }
    return st;
}

dsc_status dsc_model_create(dsc_model **out, const char *spec, const dsc_model_opts *opts) {
    if (!out || !spec)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_create: out and spec must be given");
    *out = NULL;
    if (!strncmp(spec, "hf:", 3)) return create_hf(out, spec, opts);
    for (int i = 0; i < dsc_model_num_families(); i++) {
        const struct dsc_model_ops *f = dsc_model_family(i);
        if (!f->claims(spec)) continue;
        void *cfg = NULL;
        DSC_TRY(f->config_parse(spec, opts ? opts : &no_opts, &cfg));
        return dsc__model_wrap(out, f, cfg, spec);
    }
    char specs[1024], cfg[4200];
    all_specs(specs, sizeof specs);
    snprintf(cfg, sizeof cfg, "%s/config.json", spec);
    if (access(cfg, R_OK) == 0) // a folder given without its prefix
        return dsc__fail(DSC_ERR_INVALID_ARG, "model '%s' is a folder with a config.json: give a "
                         "Hugging Face model folder as hf:%s", spec, spec);
    return dsc__fail(DSC_ERR_INVALID_ARG, "model '%s' is not known; use %s, or hf:DIR (a Hugging "
                     "Face model folder)", spec, specs);
}

dsc_status dsc_model_create_from_params(dsc_model **out, const dsc_param_desc *table, int count,
                                        const dsc_model_opts *opts, const char *what,
                                        int *order) {
    if (!out || !table || count < 1 || !order)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_create_from_params: needs out, a "
                         "table of at least one tensor and order");
    *out = NULL;
    dsc_status st = DSC_ERR_UNSUPPORTED;
    char looked[2048] = ""; // what each family looked for
    for (int i = 0; i < dsc_model_num_families() && st == DSC_ERR_UNSUPPORTED; i++) {
        const struct dsc_model_ops *f = dsc_model_family(i);
        void *cfg = NULL;
        st = f->config_from_params(table, count, opts ? opts : &no_opts, what, &cfg, order);
        if (st == DSC_OK) return dsc__model_wrap(out, f, cfg, "(tensors)");
        size_t at = strlen(looked);
        if (st == DSC_ERR_UNSUPPORTED && at < sizeof looked - 1)
            snprintf(looked + at, sizeof looked - at, "%s%s", at ? "; " : "", dsc_last_error());
    }
    // Not one family's tensors: every family's message says what it looked for.
    if (st == DSC_ERR_UNSUPPORTED)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s; give the weights of a model family dsc has",
                         looked);
    return st;
}

void dsc_model_destroy(dsc_model *m) {
    if (!m) return;
    if (m->state) m->ops->host_destroy(m->state);
    m->ops->config_free(m->cfg);
    dsc__lora_destroy(m->lora);
    free(m->params);
    free(m);
}

const dsc_model_info *dsc_model_describe(const dsc_model *m) { return &m->info; }
const char *dsc_model_spec(const dsc_model *m) { return m->spec; }

const dsc_model_param *dsc_model_param_get(const dsc_model *m, int i) {
    return i >= 0 && i < m->info.num_tensors ? &m->params[i] : NULL;
}

void dsc_model_param_descs(const dsc_model *m, dsc_param_desc *out) {
    for (int i = 0; i < m->info.num_tensors; i++) {
        const dsc_model_param *p = &m->params[i];
        out[i] = (dsc_param_desc){.name = p->name, .ndim = p->ndim, .group = p->group,
                                  .frozen = p->frozen};
        for (int d = 0; d < p->ndim; d++) out[i].shape[d] = p->shape[d];
    }
}

void dsc_model_init_weights(const dsc_model *m, float *const *params, uint64_t seed) {
    for (int i = 0; i < m->info.num_tensors; i++)
        dsc_model_init_tensor(m, i, params[i], 0, m->params[i].numel, seed);
}

void dsc_model_init_tensor(const dsc_model *m, int i, float *dst, int64_t begin, int64_t count,
                           uint64_t seed) {
    if (i >= m->n_base) { // an adapter
        int k = (i - m->n_base) / 2;
        dsc__lora_init(m->lora, k, (i - m->n_base) % 2 == 1, dst, begin, count, seed);
        return;
    }
    m->ops->init(m->cfg, i, dst, begin, count, seed);
}

// ---- LoRA ----

dsc_status dsc_model_set_lora(dsc_model *m, const dsc_model_lora *o) {
    if (!m || !o) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_lora: model and options "
                                   "must be given");
    if (!m->ops->set_lora)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "model %s (family %s) takes no LoRA adapters yet",
                         m->spec, m->ops->family);
    if (m->state || m->lora)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_lora: model %s has its activations "
                         "or adapters already; set LoRA once, before dsc_model_reserve", m->spec);
    dsc_lora *lo = NULL;
    dsc_status st = dsc__lora_create(&lo, m->params, m->n_base, m->info.num_groups,
                                     m->ops->weights_in_out, o, m->spec);
    if (st != DSC_OK) {
        dsc__lora_destroy(lo);
        return st;
    }
    int n = m->n_base + 2 * lo->n_adapters;
    dsc_model_param *ps = realloc(m->params, (size_t)n * sizeof *ps);
    if (!ps) {
        dsc__lora_destroy(lo);
        return dsc__fail(DSC_ERR_OOM, "out of memory for the LoRA tensors");
    }
    m->params = ps;
    for (int i = 0; i < m->n_base; i++) ps[i].frozen = !lo->trainable[i];
    for (int k = 0; k < lo->n_adapters; k++) {
        dsc__lora_param(lo, &ps[lo->base[k]], k, false, &ps[m->n_base + 2 * k]);
        dsc__lora_param(lo, &ps[lo->base[k]], k, true, &ps[m->n_base + 2 * k + 1]);
        m->info.num_params += ps[m->n_base + 2 * k].numel + ps[m->n_base + 2 * k + 1].numel;
    }
    m->info.num_tensors = n;
    m->lora = lo;
    m->ops->set_lora(m->cfg, lo);
    return DSC_OK;
}

const dsc_lora *dsc_model_lora_of(const dsc_model *m) { return m ? m->lora : NULL; }

void dsc_model_set_training(dsc_model *m, bool on) {
    if (m && m->lora) m->lora->training = on;
}

// A LoRA run does less than the family's 6 N: its frozen products compute no weight gradient
// (2 FLOPs per weight per token fewer), and each adapter adds 6 per parameter (forward 2, the
// backward's t, A's and B's gradients and the input's 4). The frozen products are the layers'
// matrices and the output layer: the last group's matrix, or, when the model ties its head to
// the embeddings (the last group has no matrix), the embeddings' largest table (the token
// table; position tables and an untied token table are lookups, no product).
double dsc_model_flops_per_token(const dsc_model *m, int T) {
    double f = m->ops->flops_per_token(m->cfg, T);
    if (!m->lora) return f;
    int last = m->info.num_groups - 1, head = -1;
    for (int i = 0; i < m->info.num_tensors; i++) {
        const dsc_model_param *p = &m->params[i];
        if (p->ndim == 2 && p->group == last) head = i;
    }
    bool tied = head < 0;
    for (int i = 0; i < m->info.num_tensors && tied; i++) // tied: the token table
        if (m->params[i].group == 0 && m->params[i].ndim == 2 &&
            (head < 0 || m->params[i].numel > m->params[head].numel))
            head = i;
    for (int i = 0; i < m->info.num_tensors; i++) {
        const dsc_model_param *p = &m->params[i];
        bool product = p->ndim == 2 && ((p->group > 0 && p->group < last) || i == head);
        if (dsc_lora_base_of(m->lora, i) >= 0) f += 6.0 * (double)p->numel;
        else if (p->frozen && product) f -= 2.0 * (double)p->numel;
    }
    return f;
}

int dsc_model_modules(const dsc_model *m, int B, int T, dsc_model_module *out) {
    return m->ops->modules(m->cfg, B, T, out);
}

int dsc_model_timing_slots(const dsc_model *m) { return m->ops->timing_slots(m->cfg); }

// ---- host passes ----

static dsc_status need_state(const dsc_model *m, const char *call) {
    if (!m) return dsc__fail(DSC_ERR_INVALID_ARG, "%s: the model is NULL", call);
    if (!m->state)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: model %s has no activations; call "
                         "dsc_model_reserve first", call, m->spec);
    return DSC_OK;
}

dsc_status dsc_model_reserve(dsc_model *m, int B, int T, dsc_mem_pool *pool) {
    if (!m) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_reserve: the model is NULL");
    if (m->state)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_reserve: model %s has its activations "
                         "already; create another model for another size", m->spec);
    if (m->lora) DSC_TRY(dsc__lora_reserve(m->lora, (int64_t)B * T));
    return m->ops->host_create(m->cfg, B, T, pool, &m->state);
}

dsc_status dsc_model_forward(dsc_model *m, float *const *params, const int32_t *inputs,
                             const int32_t *targets, int B, int T, const dsc_model_hooks *hooks,
                             float *loss) {
    return dsc_model_forward_pos(m, params, inputs, NULL, targets, B, T, hooks, loss);
}

dsc_status dsc_model_forward_pos(dsc_model *m, float *const *params, const int32_t *inputs,
                                 const int32_t *pos, const int32_t *targets, int B, int T,
                                 const dsc_model_hooks *hooks, float *loss) {
    DSC_TRY(need_state(m, "dsc_model_forward"));
    if (m->lora) {
        m->lora->params = params, m->lora->grads = NULL;
        dsc__lora_next_pass(m->lora);
    }
    return m->ops->forward(m->state, params, inputs, pos, targets, B, T, hooks, loss);
}

dsc_status dsc_model_backward(dsc_model *m, float *const *params, float *const *grads,
                              float loss_scale, const dsc_model_hooks *hooks) {
    DSC_TRY(need_state(m, "dsc_model_backward"));
    if (m->lora) m->lora->params = params, m->lora->grads = grads;
    return m->ops->backward(m->state, params, grads, loss_scale, hooks);
}

const float *dsc_model_logits(dsc_model *m) {
    return m && m->state ? m->ops->logits(m->state) : NULL;
}

void dsc_model_set_timing(dsc_model *m, double *times) {
    if (m && m->state) m->ops->set_timing(m->state, times);
}

// ---- inference ----

static dsc_status need_infer(const dsc_model *m, const char *call) {
    if (!m) return dsc__fail(DSC_ERR_INVALID_ARG, "%s: the model is NULL", call);
    if (!m->ops->infer || !m->ops->kv_create || !m->ops->kv_destroy || !m->ops->kv_bytes ||
        !m->ops->kv_fits)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: model family %s has no inference with a "
                         "key/value cache", call, m->ops->family);
    return DSC_OK;
}

dsc_status dsc_model_tp_check(const dsc_model *m, int size) {
    if (!m) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_tp_check: the model is NULL");
    if (size <= 1) return DSC_OK;
    if (!m->ops->tp_check || !m->ops->tp_numel || !m->ops->tp_slice)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "model family %s has no tensor-parallel inference; "
                         "use 1 rank", m->ops->family);
    return m->ops->tp_check(m->cfg, size);
}

int64_t dsc_model_tp_numel(const dsc_model *m, int i, int size) {
    return size <= 1 || !m->ops->tp_numel ? m->params[i].numel : m->ops->tp_numel(m->cfg, i, size);
}

void dsc_model_tp_slice(const dsc_model *m, int i, int rank, int size, const float *full,
                        float *dst) {
    if (size <= 1 || !m->ops->tp_slice) memcpy(dst, full, (size_t)m->params[i].numel * sizeof *dst);
    else m->ops->tp_slice(m->cfg, i, rank, size, full, dst);
}

dsc_status dsc_model_kv_create(dsc_model_kv **out, const dsc_model *m, int tp_size, int nseq,
                               int max_len) {
    if (!out) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_kv_create: out is NULL");
    *out = NULL;
    DSC_TRY(need_infer(m, "dsc_model_kv_create"));
    dsc_model_kv *kv = calloc(1, sizeof *kv);
    if (!kv) return dsc__fail(DSC_ERR_OOM, "out of memory for a key/value cache");
    kv->ops = m->ops;
    dsc_status st = m->ops->kv_create(m->cfg, tp_size, nseq, max_len, &kv->impl);
    if (st != DSC_OK) {
        free(kv);
        return st;
    }
    *out = kv;
    return DSC_OK;
}

void dsc_model_kv_destroy(dsc_model_kv *kv) {
    if (!kv) return;
    kv->ops->kv_destroy(kv->impl);
    free(kv);
}

size_t dsc_model_kv_bytes(const dsc_model *m, int tp_size, int nseq, int max_len) {
    return m->ops->kv_bytes ? m->ops->kv_bytes(m->cfg, tp_size, nseq, max_len) : 0;
}

bool dsc_model_kv_fits(const dsc_model_kv *kv, const dsc_model *m, int tp_size, int nseq,
                       int max_len) {
    return kv && m && kv->ops == m->ops && m->ops->kv_fits(kv->impl, m->cfg, tp_size, nseq,
                                                           max_len);
}

dsc_status dsc_model_infer(const dsc_model *m, dsc_model_kv *kv, float *const *params,
                           const dsc_model_tp *tp, const dsc_model_rows *rows,
                           const dsc_model_hooks *hooks, float *logits) {
    DSC_TRY(need_infer(m, "dsc_model_infer"));
    if (!kv || kv->ops != m->ops)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_infer: the key/value cache is missing "
                         "or was made for another model family; make it with dsc_model_kv_create");
    dsc_model_tp none = {0, 1, NULL};
    if (m->lora) { // adapters beside the products (unmerged), on the rows of this pass
        if (tp && tp->size > 1)
            return dsc__fail(DSC_ERR_UNSUPPORTED, "dsc_model_infer: model %s has LoRA adapters, "
                             "which its tensor-parallel products do not slice; merge them into "
                             "the weights first", m->spec);
        if (rows && m->lora->maxN < rows->n) DSC_TRY(dsc__lora_reserve(m->lora, rows->n));
        m->lora->params = params, m->lora->grads = NULL;
        bool training = m->lora->training; // inference drops nothing
        m->lora->training = false;
        dsc_status st = m->ops->infer(kv->impl, params, tp ? tp : &none, rows, hooks, logits);
        m->lora->training = training;
        return st;
    }
    return m->ops->infer(kv->impl, params, tp ? tp : &none, rows, hooks, logits);
}

// ---- device passes ----

struct dsc_model_device {
    const struct dsc_model_device_ops *ops;
    void *impl;
    dsc_lora *lora; // the model's adapters (borrowed), or NULL: a training pass's dropout masks
};

bool dsc_model_has_device(const dsc_model *m) { return m && m->ops->device; }

bool dsc_model_has_device_adapters(const dsc_model *m) {
    return dsc_model_has_device(m) && m->ops->device->adapters;
}

bool dsc_model_has_device_positions(const dsc_model *m) {
    return dsc_model_has_device(m) && m->ops->device->set_positions;
}

dsc_status dsc_model_device_create(dsc_model_device **out, const dsc_model *m, int B, int T,
                                   void *stream, dsc_mem_pool *pool) {
    if (!out || !m) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_device_create: out and m "
                                     "must be set");
    *out = NULL;
    if (!m->ops->device)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "model %s (family %s) has no GPU passes in this "
                         "build; train it on the CPU (--device cpu)", m->spec, m->ops->family);
    if (B < 1 || T < 1 || T > m->info.max_seq_len)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_device_create: batch %d x %d does not "
                         "fit model %s (1 <= T <= %d)", B, T, m->spec, m->info.max_seq_len);
    if (m->lora && !m->ops->device->adapters)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "LoRA on --device cuda: model %s (family %s) has "
                         "no adapters in its GPU passes yet; train it on the CPU (--device cpu)",
                         m->spec, m->ops->family);
    dsc_model_device *d = calloc(1, sizeof *d);
    if (!d) return dsc__fail(DSC_ERR_OOM, "dsc_model_device_create: out of memory");
    d->ops = m->ops->device;
    d->lora = m->lora;
    dsc_status st = d->ops->create(m->cfg, B, T, stream, pool, &d->impl);
    if (st != DSC_OK) {
        free(d);
        return st;
    }
    *out = d;
    return DSC_OK;
}

void dsc_model_device_destroy(dsc_model_device *d) {
    if (!d) return;
    d->ops->destroy(d->impl);
    free(d);
}

void dsc_model_device_set_fp16(dsc_model_device *d, bool on) { d->ops->set_fp16(d->impl, on); }

void dsc_model_device_set_grads_fresh(dsc_model_device *d, bool on) {
    d->ops->set_grads_fresh(d->impl, on);
}

void dsc_model_device_set_grad_hook(dsc_model_device *d, dsc_model_grad_hook fn, void *user) {
    d->ops->set_grad_hook(d->impl, fn, user);
}

void dsc_model_device_set_layer_hook(dsc_model_device *d, dsc_model_layer_hook fn, void *user) {
    d->ops->set_layer_hook(d->impl, fn, user);
}

dsc_status dsc_model_device_set_positions(dsc_model_device *d, const int32_t *pos) {
    if (d->ops->set_positions) {
        d->ops->set_positions(d->impl, pos);
        return DSC_OK;
    }
    if (!pos) return DSC_OK;
    return dsc__fail(DSC_ERR_UNSUPPORTED, "position ids on the GPU: this family's device passes "
                     "take none (--restart-positions); train it on the CPU (--device cpu)");
}

dsc_status dsc_model_device_forward(dsc_model_device *d, const uint16_t *const *params,
                                    const int32_t *inputs, const int32_t *targets, int B, int T,
                                    float *loss) {
    if (d->lora) dsc__lora_next_pass(d->lora); // (an evaluation pass draws none: not training)
    return d->ops->forward(d->impl, params, inputs, targets, B, T, loss);
}

dsc_status dsc_model_device_backward(dsc_model_device *d, const uint16_t *const *params,
                                     float *const *grads, float loss_scale) {
    return d->ops->backward(d->impl, params, grads, loss_scale);
}

dsc_status dsc_model_device_train_step(dsc_model_device *d, const uint16_t *const *params,
                                       float *const *grads, const int32_t *inputs,
                                       const int32_t *targets, int B, int T, float loss_scale,
                                       float *loss) {
    if (d->lora) dsc__lora_next_pass(d->lora);
    return d->ops->train_step(d->impl, params, grads, inputs, targets, B, T, loss_scale, loss);
}

dsc_status dsc_model_device_read_loss(dsc_model_device *d, float *loss) {
    return d->ops->read_loss(d->impl, loss);
}

dsc_status dsc_model_device_loss_enqueue(dsc_model_device *d, const float **loss_dev) {
    return d->ops->loss_enqueue(d->impl, loss_dev);
}

// ---- generation on a GPU ----

struct dsc_model_decode {
    const struct dsc_model_decode_ops *ops;
    void *impl;
};

static const struct dsc_model_decode_ops *decode_ops(const dsc_model *m) {
    return m && m->ops->device ? m->ops->device->decode : NULL;
}

bool dsc_model_has_decode(const dsc_model *m) { return decode_ops(m) != NULL; }

dsc_status dsc_model_decode_create(dsc_model_decode **out, const dsc_model *m,
                                   const dsc_model_decode_opts *o) {
    if (!out || !m || !o)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_decode_create: out, m and o must be set");
    *out = NULL;
    const struct dsc_model_decode_ops *ops = decode_ops(m);
    if (!ops)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "generation on the GPU: model %s (family %s) has "
                         "no GPU decoder in this build; generate on the CPU (--device cpu)",
                         m->spec, m->ops->family);
    if (o->batch < 1 || o->max_len < 1 || o->max_len > m->info.max_seq_len)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_decode_create: %d sequences of %d "
                         "positions do not fit model %s (at least one sequence, 1 <= positions "
                         "<= %d)", o->batch, o->max_len, m->spec, m->info.max_seq_len);
    dsc_model_decode *d = calloc(1, sizeof *d);
    if (!d) return dsc__fail(DSC_ERR_OOM, "dsc_model_decode_create: out of memory");
    d->ops = ops;
    dsc_status st = ops->create(m->cfg, o, &d->impl);
    if (st != DSC_OK) {
        free(d);
        return st;
    }
    *out = d;
    return DSC_OK;
}

void dsc_model_decode_destroy(dsc_model_decode *d) {
    if (!d) return;
    d->ops->destroy(d->impl);
    free(d);
}

size_t dsc_model_decode_kv_bytes(const dsc_model *m, int batch, int max_len) {
    const struct dsc_model_decode_ops *ops = decode_ops(m);
    return ops ? ops->kv_bytes(m->cfg, batch, max_len) : 0;
}

dsc_status dsc_model_decode_prefill(dsc_model_decode *d, const uint16_t *const *params,
                                    const int32_t *const *tokens, const int *lens, int n) {
    return d->ops->prefill(d->impl, params, tokens, lens, n);
}

dsc_status dsc_model_decode_step(dsc_model_decode *d, const uint16_t *const *params,
                                 const int32_t *tokens, const int32_t *pos, int n) {
    return d->ops->step(d->impl, params, tokens, pos, n);
}

dsc_status dsc_model_decode_argmax(dsc_model_decode *d, int32_t *tokens) {
    return d->ops->argmax(d->impl, tokens);
}

dsc_status dsc_model_decode_logits(dsc_model_decode *d, float *logits) {
    return d->ops->logits(d->impl, logits);
}

long dsc_model_decode_graph_replays(const dsc_model_decode *d) {
    return d && d->ops->graph_replays ? d->ops->graph_replays(d->impl) : 0;
}

// ---- activation sizes (the memory plan's) ----

// A decoder's activations when its family does not count them: per token and layer the
// residual stream, norms, q/k/v, attention output, a 4x MLP and its input (about 16 channels'
// worth), plus the logits and their gradient; fp32 on the host, 16-bit on a device.
static size_t estimate_act(const dsc_model_info *mi, int B, int T, bool device) {
    size_t tokens = (size_t)B * (size_t)T, width = device ? 2 : 4;
    size_t per_token = ((size_t)mi->n_layer * 16 + 4) * (size_t)mi->n_embd * width +
                       (size_t)mi->vocab_size * width * 2;
    return tokens * per_token;
}

dsc_status dsc_model_set_recompute(dsc_model *m, bool on) {
    if (!m) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_recompute: the model is NULL");
    if (m->state)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_recompute: model %s has its "
                         "activations already; set it before dsc_model_reserve", m->spec);
    if (!m->ops->set_recompute) {
        if (!on) return DSC_OK;
        return dsc__fail(DSC_ERR_UNSUPPORTED, "model %s: family %s cannot recompute its layers "
                         "(its model ops have no set_recompute); remove the "
                         "activation_checkpointing section", m->spec, m->ops->family);
    }
    m->ops->set_recompute(m->cfg, on);
    m->recompute = on;
    return DSC_OK;
}

bool dsc_model_recomputes(const dsc_model *m) { return m && m->recompute; }

dsc_status dsc_model_set_fp8(dsc_model *m, int format, int margin) {
    if (!m) return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_fp8: the model is NULL");
    if (format < DSC_MODEL_FP8_OFF || format > DSC_MODEL_FP8_E4M3 || margin < 0 || margin > 63)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_fp8: format %d or margin %d out of "
                         "range (format 0-2, margin 0-63)", format, margin);
    if (!m->ops->set_fp8 || !m->ops->device || !m->ops->device->fp8) {
        if (format == DSC_MODEL_FP8_OFF) return DSC_OK;
        return dsc__fail(DSC_ERR_UNSUPPORTED, "model %s: the GPU passes of family %s have no FP8 "
                         "products (the Llama family's have: Llama, Qwen2/2.5/3, Mistral, SmolLM2); "
                         "remove the fp8 section or set fp8.enabled false", m->spec,
                         m->ops->family);
    }
    m->ops->set_fp8(m->cfg, format, margin);
    m->fp8 = format;
    return DSC_OK;
}

int dsc_model_fp8(const dsc_model *m) { return m ? m->fp8 : 0; }

dsc_status dsc_model_set_recompute_host(dsc_model *m, bool on) {
    if (!m)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_recompute_host: the model is NULL");
    if (!on && !m->ops->set_recompute_host) return DSC_OK;
    if (!dsc_model_device_recomputes_host(m))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "model %s: the GPU passes of family %s cannot keep "
                         "the layers' inputs on the host; set "
                         "activation_checkpointing.cpu_checkpointing to false", m->spec,
                         m->ops->family);
    if (on && !m->recompute)
        return dsc__fail(DSC_ERR_INVALID_ARG, "dsc_model_set_recompute_host: model %s does not "
                         "recompute its layers; call dsc_model_set_recompute first", m->spec);
    m->ops->set_recompute_host(m->cfg, on);
    return DSC_OK;
}

bool dsc_model_device_recomputes_host(const dsc_model *m) {
    return dsc_model_device_recomputes(m) && m->ops->set_recompute_host &&
           m->ops->device->act_host_bytes;
}

bool dsc_model_device_recomputes(const dsc_model *m) {
    return m && m->ops->set_recompute && m->ops->device && m->ops->device->recomputes;
}

size_t dsc_model_activation_host_bytes(const dsc_model *m, int B, int T) {
    if (!m || B < 1 || T < 1 || !m->ops->device || !m->ops->device->act_host_bytes) return 0;
    return m->ops->device->act_host_bytes(m->cfg, B, T);
}

size_t dsc_model_activation_bytes(const dsc_model *m, int B, int T, bool device) {
    if (!m || B < 1 || T < 1) return 0;
    const struct dsc_model_device_ops *d = m->ops->device;
    if (device && d && d->act_bytes) return d->act_bytes(m->cfg, B, T);
    size_t lora = !device && m->lora ? dsc__lora_act_bytes(m->lora, (int64_t)B * T) : 0;
    if (!device && m->ops->act_bytes) return m->ops->act_bytes(m->cfg, B, T) + lora;
    return estimate_act(&m->info, B, T, device) + lora;
}
