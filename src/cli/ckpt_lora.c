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

#include "cli/lora.h"          // cli_adapter_config_read
#include "dsc/base.h"        // dsc_mkdirs
#include "dsc/checkpoint.h"  // dsc_ckpt_*
#include "dsc/half.h"        // dsc_fp32_to_bf16
#include "dsc/safetensors.h" // dsc_st_*, dsc_hf_weights_*
#include "dsc/status.h"      // dsc_fail, DSC_TRY

typedef struct lora_ckpt {
    dsc_ckpt *ck;
    json_t *adapter; // adapter_config.json
    bool gpt2;       // GPT-2's names carry "transformer." in PEFT's file; Conv1D weights (in, out)
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
    l->gpt2 = type && !strcmp(type, "gpt2");
    json_decref(cfg);
    double r = (double)json_integer_value(json_object_get(l->adapter, "r"));
    double alpha = json_number_value(json_object_get(l->adapter, "lora_alpha"));
    bool rs = json_is_true(json_object_get(l->adapter, "use_rslora"));
    if (!(r >= 1)) {
        lora_close(l);
        return dsc_fail(DSC_ERR_CORRUPT, "checkpoint %s: its adapter_config.json has no rank r",
                        dir);
    }
    l->scale = rs ? alpha / sqrt(r) : alpha / r;
    return DSC_OK;
}

// PEFT's name of a checkpoint tensor.
static void peft_name(const lora_ckpt *l, const char *name, char *out, size_t cap) {
    bool head = !strncmp(name, "lm_head.", 8);
    snprintf(out, cap, "base_model.model.%s%s", l->gpt2 && !head ? "transformer." : "", name);
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
        peft_name(&l, p.name, names[i], sizeof names[i]);
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

typedef struct merge_ctx {
    lora_ckpt *l;
    dsc_hf_weights *base;
    const char *const *names; // the base file's names, in its order
    bool bf16;
} merge_ctx;

// The checkpoint's index of `name` (a base file name; GPT-2's may carry "transformer.").
static int ckpt_index(const lora_ckpt *l, const char *name, const char *suffix) {
    char want[DSC_PARAM_NAME_MAX + 40];
    const char *n = !strncmp(name, "transformer.", 12) ? name + 12 : name;
    size_t len = strlen(n);
    if (suffix) { // "<module>.weight" -> "<module><suffix>"
        if (len < 7 || strcmp(n + len - 7, ".weight")) return -1;
        snprintf(want, sizeof want, "%.*s%s", (int)(len - 7), n, suffix);
    } else {
        snprintf(want, sizeof want, "%s", n);
    }
    return dsc_ckpt_find_param(l->ck, want);
}

static dsc_status merge_fill(void *user, int i, void *dst, size_t nbytes) {
    merge_ctx *m = user;
    const char *name = m->names[i];
    dsc_hf_tensor x;
    DSC_TRY(dsc_hf_weights_info(m->base, name, &x));
    float *w = malloc((size_t)x.numel * sizeof(float));
    if (!w) return dsc_fail(DSC_ERR_OOM, "out of memory merging %s", name);
    int own = ckpt_index(m->l, name, NULL); // a module trained in full
    int a = ckpt_index(m->l, name, ".lora_A.weight"), b = ckpt_index(m->l, name, ".lora_B.weight");
    dsc_status st = own >= 0 ? dsc_ckpt_read_param(m->l->ck, own, 0, w)
                             : dsc_hf_weights_read(m->base, name, 0, x.numel, w);
    if (st == DSC_OK && own < 0 && a >= 0 && b >= 0) { // W += scale B A (Conv1D: its transpose)
        dsc_ckpt_param pa, pb;
        dsc_ckpt_get_param(m->l->ck, a, &pa);
        dsc_ckpt_get_param(m->l->ck, b, &pb);
        int64_t r = pa.shape[0], in = pa.shape[1], out = pb.shape[0];
        float *A = malloc((size_t)pa.numel * sizeof(float)), *B = malloc((size_t)pb.numel * 4);
        st = A && B ? dsc_ckpt_read_param(m->l->ck, a, 0, A)
                    : dsc_fail(DSC_ERR_OOM, "out of memory merging %s", name);
        if (st == DSC_OK) st = dsc_ckpt_read_param(m->l->ck, b, 0, B);
        if (st == DSC_OK && x.numel != in * out)
            st = dsc_fail(DSC_ERR_INVALID_ARG, "merging %s: the adapter is %lld x %lld, the base "
                          "tensor has %lld elements: the checkpoint's base model is another "
                          "one", name, (long long)out, (long long)in, (long long)x.numel);
        if (st == DSC_OK) merge_product(w, A, B, r, in, out, m->l->scale, m->l->gpt2);
        free(A);
        free(B);
    }
    if (st == DSC_OK) {
        if (m->bf16) {
            uint16_t *h = dst;
            for (int64_t k = 0; k < x.numel; k++) h[k] = dsc_fp32_to_bf16(w[k]);
        } else {
            memcpy(dst, w, nbytes);
        }
    }
    free(w);
    return st;
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
        lora_close(&l);
        return dsc_fail(st, "the merged export of a LoRA checkpoint reads its base model: %s",
                        why);
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
    bool head = !strncmp(name, "lm_head.", 8);
    snprintf(full, sizeof full, "base_model.model.%s%s", s->gpt2 && !head ? "transformer." : "",
             name);
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

static dsc_status merge_all(const dsc_model *m, float *const *full, const merge_src *s, int r,
                            double scale, int *merged) {
    *merged = 0;
    for (int k = 0; k < dsc_model_describe(m)->num_tensors; k++) {
        const dsc_model_param *p = dsc_model_param_get(m, k);
        bool found;
        DSC_TRY(src_read(s, p->name, p->numel, full[k], &found)); // a module trained in full
        if (found) {
            (*merged)++;
            continue;
        }
        size_t len = strlen(p->name);
        if (p->ndim != 2 || len < 7 || strcmp(p->name + len - 7, ".weight")) continue;
        char an[DSC_PARAM_NAME_MAX + 16], bn[DSC_PARAM_NAME_MAX + 16];
        snprintf(an, sizeof an, "%.*s.lora_A.weight", (int)(len - 7), p->name);
        snprintf(bn, sizeof bn, "%.*s.lora_B.weight", (int)(len - 7), p->name);
        int64_t in = p->shape[s->gpt2 ? 0 : 1], out = p->shape[s->gpt2 ? 1 : 0];
        DSC_TRY(src_read(s, an, (int64_t)r * in, NULL, &found));
        if (!found) continue;
        float *A = malloc((size_t)r * (size_t)in * 4), *B = malloc((size_t)r * (size_t)out * 4);
        dsc_status st = A && B ? src_read(s, an, (int64_t)r * in, A, &found)
                               : dsc_fail(DSC_ERR_OOM, "out of memory merging %s", p->name);
        if (st == DSC_OK) st = src_read(s, bn, (int64_t)r * out, B, &found);
        if (st == DSC_OK && !found)
            st = dsc_fail(DSC_ERR_INVALID_ARG, "adapter of %s: %s is there but not %s", p->name,
                          an, bn);
        if (st == DSC_OK) merge_product(full[k], A, B, r, in, out, scale, s->gpt2);
        free(A);
        free(B);
        DSC_TRY(st);
        (*merged)++;
    }
    return DSC_OK;
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
