// cli/ckpt_lora.c - `dsc ckpt export` of a LoRA run's checkpoint: the adapters as PEFT saves
// them (--peft), or the base model with the adapters merged into it (--hf).
//
// A LoRA checkpoint holds the trainable tensors only (the adapters under "<module>.lora_A.weight"
// and ".lora_B.weight", and the modules_to_save under their own names) and carries
// adapter_config.json, whose base_model_name_or_path names the base weights.
#include "cli/ckpt_lora.h"

#include <jansson.h> // json_*
#include <math.h>    // sqrt
#include <stdio.h>   // fprintf, snprintf
#include <stdlib.h>  // malloc, free
#include <string.h>  // strcmp, strlen

#include "cli/lora.h"         // cli_adapter_config_read, cli_peft_tensor_name, cli_base_verify
#include "dsc/base.h"        // dsc_mkdirs
#include "dsc/checkpoint.h"  // dsc_ckpt_*
#include "dsc/half.h"        // dsc_fp32_to_bf16
#include "dsc/safetensors.h" // dsc_st_*, dsc_hf_weights_*
#include "dsc/status.h"      // dsc_fail, DSC_TRY

// ---- merging adapters into a base, one tensor at a time ----

// w (the base weight: (out, in), or (in, out) for Conv1D) += scale B A, with A (r, in) and
// B (out, r); (B A) in fp32 as torch's B @ A, then scaled and added as PEFT's merge does.
static void merge_product(float *w, const float *A, const float *B, int64_t r, int64_t in,
                          int64_t out, double scale, bool conv1d) {
#pragma omp parallel for schedule(static)
    for (int64_t o = 0; o < out; o++)
        for (int64_t c = 0; c < in; c++) {
            float s = 0.0f;
            for (int64_t k = 0; k < r; k++) s += B[o * r + k] * A[k * in + c];
            w[conv1d ? c * out + o : o * in + c] += s * (float)scale;
        }
}

typedef struct merge_src {
    const dsc_ckpt *ck;      // a LoRA checkpoint's tensors (dsc's names), or
    dsc_hf_weights *peft;    // a PEFT folder's adapter_model.safetensors (PEFT's names)
    bool gpt2;
} merge_src;

// Tensor `name` (dsc's name) of the source into out when it has it (numel elements); *found.
static dsc_status src_read(const merge_src *s, const char *name, int64_t numel, float *out,
                           bool *found) {
    *found = false;
    if (s->ck) {
        int i = dsc_ckpt_find_param(s->ck, name);
        if (i < 0) return DSC_OK;
        dsc_ckpt_param p;
        dsc_ckpt_get_param(s->ck, i, &p);
        if (p.numel != numel)
            return dsc_fail(DSC_ERR_INVALID_ARG, "adapter tensor %s has %lld elements, the model "
                            "needs %lld: it was trained on another base model", name,
                            (long long)p.numel, (long long)numel);
        *found = true;
        return out ? dsc_ckpt_read_param(s->ck, i, 0, out) : DSC_OK;
    }
    char full[DSC_PARAM_NAME_MAX + 40];
    cli_peft_tensor_name(s->gpt2, name, full, sizeof full);
    if (!dsc_hf_weights_has(s->peft, full)) return DSC_OK;
    dsc_hf_tensor x;
    DSC_TRY(dsc_hf_weights_info(s->peft, full, &x));
    if (x.numel != numel)
        return dsc_fail(DSC_ERR_INVALID_ARG, "adapter tensor %s has %lld elements, the model "
                        "needs %lld: it was trained on another base model", full,
                        (long long)x.numel, (long long)numel);
    *found = true;
    return out ? dsc_hf_weights_read(s->peft, full, 0, numel, out) : DSC_OK;
}

// Tensor `name` (dsc's name; ndim, shape, numel as the model has it) in w, the base's values:
// replaced by the source's own when it trained the module in full, else += scale B A when it has
// an adapter there; *touched says whether either happened.
static dsc_status merge_one(const merge_src *s, const char *name, int ndim, const int64_t *shape,
                            int64_t numel, float *w, int r, double scale, bool *touched) {
    DSC_TRY(src_read(s, name, numel, w, touched)); // a module trained in full
    size_t len = strlen(name);
    if (*touched || ndim != 2 || len < 7 || strcmp(name + len - 7, ".weight")) return DSC_OK;
    char an[DSC_PARAM_NAME_MAX + 16], bn[DSC_PARAM_NAME_MAX + 16];
    snprintf(an, sizeof an, "%.*s.lora_A.weight", (int)(len - 7), name);
    snprintf(bn, sizeof bn, "%.*s.lora_B.weight", (int)(len - 7), name);
    int64_t in = shape[s->gpt2 ? 0 : 1], out = shape[s->gpt2 ? 1 : 0];
    bool found;
    DSC_TRY(src_read(s, an, (int64_t)r * in, NULL, &found));
    if (!found) return DSC_OK;
    float *A = malloc((size_t)r * (size_t)in * 4), *B = malloc((size_t)r * (size_t)out * 4);
    dsc_status st = A && B ? src_read(s, an, (int64_t)r * in, A, &found)
                           : dsc_fail(DSC_ERR_OOM, "out of memory merging %s", name);
    if (st == DSC_OK) st = src_read(s, bn, (int64_t)r * out, B, &found);
    if (st == DSC_OK && !found)
        st = dsc_fail(DSC_ERR_INVALID_ARG, "adapter of %s: %s is there but not %s", name, an, bn);
    if (st == DSC_OK) merge_product(w, A, B, r, in, out, scale, s->gpt2);
    free(A);
    free(B);
    *touched = st == DSC_OK;
    return st;
}

// r, lora_alpha and use_rslora of an adapter_config.json.
static dsc_status adapter_scale(const json_t *j, const char *what, int *r, double *scale) {
    json_t *jr = json_object_get(j, "r"), *ja = json_object_get(j, "lora_alpha");
    if (!json_is_integer(jr) || json_integer_value(jr) < 1 || !json_is_number(ja))
        return dsc_fail(DSC_ERR_INVALID_ARG, "%s: adapter_config.json needs r and lora_alpha",
                        what);
    *r = (int)json_integer_value(jr);
    double a = json_number_value(ja);
    *scale = json_is_true(json_object_get(j, "use_rslora")) ? a / sqrt(*r) : a / *r;
    return DSC_OK;
}

// A LoRA run's checkpoint, opened, with what its attachments say.
typedef struct lora_ckpt {
    dsc_ckpt *ck;
    json_t *adapter; // adapter_config.json
    merge_src src;   // its tensors as a merge source (gpt2: GPT-2's names and Conv1D layout)
    int r;
    double scale;
} lora_ckpt;

static json_t *attachment_json(const dsc_ckpt *ck, const char *name) {
    char path[4200];
    if (!dsc_ckpt_attachment_path(ck, name, path, sizeof path)) return NULL;
    return json_load_file(path, 0, NULL);
}

static void lora_close(lora_ckpt *l) {
    json_decref(l->adapter);
    dsc_ckpt_close(l->ck);
}

static dsc_status lora_open(lora_ckpt *l, const char *dir, const char *tag) {
    *l = (lora_ckpt){0};
    DSC_TRY(dsc_ckpt_open(&l->ck, dir, tag));
    l->adapter = attachment_json(l->ck, "adapter_config.json");
    if (!l->adapter) {
        lora_close(l);
        return dsc_fail(DSC_ERR_INVALID_ARG, "checkpoint %s%s%s is not of a LoRA run (it carries "
                        "no adapter_config.json); export its weights with --hf or --out", dir,
                        tag ? "/" : "", tag ? tag : "");
    }
    json_t *cfg = attachment_json(l->ck, "config.json");
    const char *type = json_string_value(json_object_get(cfg, "model_type"));
    l->src = (merge_src){.ck = l->ck, .gpt2 = type && !strcmp(type, "gpt2")};
    json_decref(cfg);
    dsc_status st = adapter_scale(l->adapter, dir, &l->r, &l->scale);
    if (st != DSC_OK) lora_close(l);
    return st;
}

static dsc_status copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb"), *out = in ? fopen(to, "wb") : NULL;
    char buf[65536];
    size_t n;
    bool ok = in && out;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, out) == n;
    if (in) fclose(in);
    if (out && fclose(out)) ok = false;
    return ok ? DSC_OK : dsc_fail(DSC_ERR_IO, "cannot copy %s to %s", from, to);
}

dsc_status cli_export_peft(const char *dir, const char *tag, const char *out_dir) {
    lora_ckpt l;
    DSC_TRY(lora_open(&l, dir, tag));
    dsc_ckpt_info info;
    dsc_ckpt_get_info(l.ck, &info);
    dsc_st_tensor *ts = calloc((size_t)info.nparams, sizeof *ts);
    float **vals = calloc((size_t)info.nparams, sizeof *vals);
    char (*names)[DSC_PARAM_NAME_MAX + 40] = calloc((size_t)info.nparams, sizeof *names);
    dsc_status st = ts && vals && names ? dsc_mkdirs(out_dir)
                                        : dsc_fail(DSC_ERR_OOM, "out of memory exporting %s", dir);
    for (int i = 0; i < info.nparams && st == DSC_OK; i++) {
        dsc_ckpt_param p;
        dsc_ckpt_get_param(l.ck, i, &p);
        cli_peft_tensor_name(l.src.gpt2, p.name, names[i], sizeof names[i]);
        vals[i] = malloc((size_t)p.numel * sizeof(float));
        st = vals[i] ? dsc_ckpt_read_param(l.ck, i, 0, vals[i])
                     : dsc_fail(DSC_ERR_OOM, "out of memory exporting %s", p.name);
        ts[i] = (dsc_st_tensor){.name = names[i], .dtype = "F32", .ndim = p.ndim,
                                .data = vals[i], .nbytes = (size_t)p.numel * 4};
        for (int d = 0; d < p.ndim; d++) ts[i].shape[d] = p.shape[d];
    }
    char path[4200], from[4200];
    if (st == DSC_OK) {
        const char *meta[] = {"format", "pt"};
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", out_dir);
        st = dsc_st_write(path, ts, info.nparams, meta, 1);
    }
    if (st == DSC_OK && dsc_ckpt_attachment_path(l.ck, "adapter_config.json", from, sizeof from)) {
        snprintf(path, sizeof path, "%s/adapter_config.json", out_dir);
        st = copy_file(from, path);
    }
    for (int i = 0; vals && i < info.nparams; i++) free(vals[i]);
    free(vals);
    free(ts);
    free(names);
    lora_close(&l);
    return st;
}

// ---- the merged model ----

typedef struct merge_ctx {
    lora_ckpt *l;
    dsc_hf_weights *base;
    const char *const *names; // the base file's names, in its order
    bool bf16;
} merge_ctx;

static dsc_status merge_fill(void *user, int i, void *dst, size_t nbytes) {
    merge_ctx *m = user;
    const char *name = m->names[i];
    dsc_hf_tensor x;
    DSC_TRY(dsc_hf_weights_info(m->base, name, &x));
    float *w = malloc((size_t)x.numel * sizeof(float));
    if (!w) return dsc_fail(DSC_ERR_OOM, "out of memory merging %s", name);
    // dsc's name: GPT-2's files may carry "transformer." before it
    const char *own = !strncmp(name, "transformer.", 12) ? name + 12 : name;
    bool touched;
    dsc_status st = dsc_hf_weights_read(m->base, name, 0, x.numel, w);
    if (st == DSC_OK)
        st = merge_one(&m->l->src, own, x.ndim, x.shape, x.numel, w, m->l->r, m->l->scale,
                       &touched);
    if (st == DSC_OK && m->bf16) {
        uint16_t *h = dst;
        for (int64_t k = 0; k < x.numel; k++) h[k] = dsc_fp32_to_bf16(w[k]);
    } else if (st == DSC_OK) {
        memcpy(dst, w, nbytes);
    }
    free(w);
    return st;
}

// The base folder's tensor called `name` in dsc (GPT-2's files may carry "transformer." before
// it), whole, for cli_base_verify.
static dsc_status base_file_read(void *user, const char *name, float **values, int64_t *numel,
                                 bool *owned) {
    dsc_hf_weights *w = user;
    *values = NULL;
    *owned = true;
    const char *found = NULL;
    for (int i = 0; i < dsc_hf_weights_count(w) && !found; i++) {
        const char *f = dsc_hf_weights_name(w, i);
        const char *own = !strncmp(f, "transformer.", 12) ? f + 12 : f;
        if (!strcmp(own, name)) found = f;
    }
    if (!found) return DSC_OK;
    dsc_hf_tensor x;
    DSC_TRY(dsc_hf_weights_info(w, found, &x));
    float *v = malloc((size_t)(x.numel > 0 ? x.numel : 1) * sizeof *v);
    if (!v) return dsc_fail(DSC_ERR_OOM, "out of memory reading %s", found);
    dsc_status st = dsc_hf_weights_read(w, found, 0, x.numel, v);
    if (st != DSC_OK) {
        free(v);
        return st;
    }
    *values = v;
    *numel = x.numel;
    return DSC_OK;
}

// Before anything is written: the base folder holds the base the adapters were trained on
// (when the checkpoint has base_checksums.json; older ones do not).
static dsc_status check_merged_base(const lora_ckpt *l, dsc_hf_weights *base,
                                    const char *base_path, const char *dir, const char *tag) {
    char path[4200], what[4300], ckpt[4200];
    if (!dsc_ckpt_attachment_path(l->ck, "base_checksums.json", path, sizeof path)) return DSC_OK;
    snprintf(what, sizeof what, "the base folder %s (adapter_config.json's "
             "base_model_name_or_path)", base_path);
    snprintf(ckpt, sizeof ckpt, "%s%s%s", dir, tag ? "/" : "", tag ? tag : "");
    return cli_base_verify(path, ckpt, what, base_file_read, base);
}

dsc_status cli_export_merged(const char *dir, const char *tag, const char *out_dir,
                             const char *dtype, uint64_t shard_bytes) {
    lora_ckpt l;
    DSC_TRY(lora_open(&l, dir, tag));
    const char *base_path = json_string_value(json_object_get(l.adapter,
                                                              "base_model_name_or_path"));
    merge_ctx m = {.l = &l, .bf16 = dtype && !strcmp(dtype, "bf16")};
    dsc_status st = base_path ? dsc_hf_weights_open(&m.base, base_path)
                              : dsc_fail(DSC_ERR_INVALID_ARG, "checkpoint %s: adapter_config.json "
                                         "names no base model (base_model_name_or_path)", dir);
    if (st != DSC_OK) {
        char why[2048];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        st = base_path ? cli_base_open_failed(st, "the merged export of a LoRA checkpoint",
                                              base_path, why)
                       : dsc_fail(st, "%s", why);
        lora_close(&l); // (base_path lies in its adapter_config.json)
        return st;
    }
    st = check_merged_base(&l, m.base, base_path, dir, tag);
    if (st != DSC_OK) {
        dsc_hf_weights_close(m.base);
        lora_close(&l);
        return st;
    }
    int n = dsc_hf_weights_count(m.base);
    dsc_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    const char **names = calloc((size_t)n, sizeof *names);
    st = ts && names ? DSC_OK : dsc_fail(DSC_ERR_OOM, "out of memory exporting %s", dir);
    for (int i = 0; i < n && st == DSC_OK; i++) {
        dsc_hf_tensor x;
        names[i] = dsc_hf_weights_name(m.base, i);
        st = dsc_hf_weights_info(m.base, names[i], &x);
        ts[i] = (dsc_st_tensor){.name = names[i], .dtype = m.bf16 ? "BF16" : "F32",
                                .ndim = x.ndim, .nbytes = (size_t)x.numel * (m.bf16 ? 2 : 4)};
        for (int d = 0; d < x.ndim; d++) ts[i].shape[d] = x.shape[d];
    }
    m.names = names;
    const char *meta[] = {"format", "pt"};
    if (st == DSC_OK) st = dsc_mkdirs(out_dir);
    if (st == DSC_OK)
        st = dsc_hf_weights_write(out_dir, ts, n, shard_bytes ? shard_bytes : DSC_HF_SHARD_BYTES,
                                  meta, 1, merge_fill, &m);
    // The model's files (config.json, generation_config.json, the tokenizer's); not the adapter's.
    for (int i = 0; st == DSC_OK && i < dsc_ckpt_num_attachments(l.ck); i++) {
        const char *name = dsc_ckpt_attachment_name(l.ck, i);
        if (!strcmp(name, "adapter_config.json") || !strcmp(name, "base_checksums.json")) continue;
        char from[4200], to[4200];
        if (!dsc_ckpt_attachment_path(l.ck, name, from, sizeof from)) continue;
        snprintf(to, sizeof to, "%s/%s", out_dir, name);
        st = copy_file(from, to);
    }
    free(ts);
    free(names);
    dsc_hf_weights_close(m.base);
    lora_close(&l);
    return st;
}

bool cli_ckpt_is_lora(const char *dir, const char *tag) {
    dsc_ckpt *ck = NULL;
    if (dsc_ckpt_open(&ck, dir, tag) != DSC_OK) return false;
    char path[4200];
    bool lora = dsc_ckpt_attachment_path(ck, "adapter_config.json", path, sizeof path);
    dsc_ckpt_close(ck);
    return lora;
}

// ---- merging into weights in memory (dsc generate) ----

static dsc_status merge_all(const dsc_model *m, float *const *full, const merge_src *s, int r,
                            double scale, int *merged) {
    *merged = 0;
    for (int k = 0; k < dsc_model_describe(m)->num_tensors; k++) {
        const dsc_model_param *p = dsc_model_param_get(m, k);
        bool touched;
        DSC_TRY(merge_one(s, p->name, p->ndim, p->shape, p->numel, full[k], r, scale, &touched));
        *merged += touched;
    }
    return DSC_OK;
}

dsc_status cli_merge_peft(const dsc_model *m, float *const *full, const char *dir) {
    char path[4200];
    json_t *j;
    DSC_TRY(cli_adapter_config_read(dir, "--adapter", &j));
    int r = 0;
    double scale = 0;
    dsc_status st = adapter_scale(j, dir, &r, &scale);
    json_decref(j);
    DSC_TRY(st);
    merge_src s = {.gpt2 = !strcmp(dsc_model_describe(m)->family, "gpt2")};
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    DSC_TRY(dsc_hf_weights_open(&s.peft, path));
    int merged = 0;
    st = merge_all(m, full, &s, r, scale, &merged);
    dsc_hf_weights_close(s.peft);
    if (st == DSC_OK && !merged)
        st = dsc_fail(DSC_ERR_INVALID_ARG, "--adapter %s: none of its tensors belongs to this "
                      "model (another base model?)", dir);
    return st;
}

// The adapters that config_dir's adapter_config.json describes, read from s, beside the model's
// weights (see cli_attach_peft); what: the source, for messages.
static dsc_status attach(dsc_model *m, float ***full, int *nt, const char *config_dir,
                         const merge_src *s, const char *what) {
    // no config, so no lora section: the adapter_config.json says what the adapters are
    DSC_TRY(cli_lora(m, NULL, false, config_dir, 0));
    dsc_model_set_training(m, false);
    int n0 = *nt, n = dsc_model_describe(m)->num_tensors;
    float **f = realloc(*full, (size_t)n * sizeof *f);
    if (!f) return dsc_fail(DSC_ERR_OOM, "%s: out of memory", what);
    *full = f;
    for (int k = n0; k < n; k++) f[k] = NULL;
    *nt = n; // the caller frees every entry
    dsc_status st = DSC_OK;
    for (int k = 0; k < n && st == DSC_OK; k++) {
        const dsc_model_param *p = dsc_model_param_get(m, k);
        bool found = false;
        if (k >= n0 && !(f[k] = malloc((size_t)p->numel * sizeof(float))))
            st = dsc_fail(DSC_ERR_OOM, "%s: out of memory for %s", what, p->name);
        if (st == DSC_OK) st = src_read(s, p->name, p->numel, f[k], &found); // k < n0: saved
        if (st == DSC_OK && k >= n0 && !found)                                // in full
            st = dsc_fail(DSC_ERR_INVALID_ARG, "%s has no tensor for %s, which its "
                          "adapter_config.json asks for", what, p->name);
    }
    return st;
}

dsc_status cli_attach_peft(dsc_model *m, float ***full, int *nt, const char *dir) {
    char path[4200], what[4300];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    snprintf(what, sizeof what, "--adapter %s", dir);
    merge_src s = {.gpt2 = !strcmp(dsc_model_describe(m)->family, "gpt2")};
    DSC_TRY(dsc_hf_weights_open(&s.peft, path));
    dsc_status st = attach(m, full, nt, dir, &s, what);
    dsc_hf_weights_close(s.peft);
    return st;
}

dsc_status cli_attach_ckpt(dsc_model *m, float ***full, int *nt, const dsc_ckpt *ck,
                           const char *adapter_config_path) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", adapter_config_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    merge_src s = {.ck = ck, .gpt2 = !strcmp(dsc_model_describe(m)->family, "gpt2")};
    return attach(m, full, nt, dir, &s, "the LoRA checkpoint");
}

dsc_status cli_merge_ckpt(const dsc_model *m, float *const *full, const dsc_ckpt *ck,
                          const char *adapter_config_path) {
    json_t *j = json_load_file(adapter_config_path, 0, NULL);
    if (!j) return dsc_fail(DSC_ERR_CORRUPT, "cannot read %s", adapter_config_path);
    int r = 0;
    double scale = 0;
    dsc_status st = adapter_scale(j, adapter_config_path, &r, &scale);
    json_decref(j);
    DSC_TRY(st);
    merge_src s = {.ck = ck, .gpt2 = !strcmp(dsc_model_describe(m)->family, "gpt2")};
    int merged = 0;
    return merge_all(m, full, &s, r, scale, &merged);
}
