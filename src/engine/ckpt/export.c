// ckpt/export.c - one consolidated safetensors file from a sharded checkpoint (the role of
// DeepSpeed's zero_to_fp32.py): every parameter whole, under its Hugging Face name; or a Hugging
// Face folder (the weights in save_pretrained's shards beside the checkpoint's attached
// config.json and tokenizer files), written a tensor at a time.
#include <jansson.h> // json_*
#include <stdio.h>   // snprintf
#include <stdlib.h>  // calloc, malloc, free
#include <string.h>  // strcmp, strlen

#include "base/status.h"             // dsc__fail
#include "dsc/checkpoint.h"          // dsc_ckpt_export
#include "dsc/half.h"                // dsc_fp32_to_bf16_n
#include "base/io.h"                 // dsc__mkdirs
#include "engine/ckpt/fs.h"          // dsc__ckpt_join, dsc__ckpt_read_file, dsc__ckpt_write_file
#include "engine/ckpt/hf_weights.h"  // dsc_hf_weights_write
#include "engine/ckpt/reader.h"      // struct dsc_ckpt
#include "engine/ckpt/safetensors.h" // dsc_st_write

static dsc_status export_tensors(const dsc_ckpt *ck, bool bf16, dsc_st_tensor *ts, void **bufs) {
    const dsc__manifest *m = &ck->m;
    float *tmp = NULL;
    for (int i = 0; i < m->nparams; i++) {
        const dsc__mparam *p = &m->params[i];
        size_t n = (size_t)p->numel;
        bufs[i] = malloc(n * (bf16 ? 2 : 4));
        if (bf16) {
            free(tmp);
            tmp = malloc(n * sizeof(float));
        }
        if (!bufs[i] || (bf16 && !tmp)) {
            free(tmp);
            return dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", p->name);
        }
        dsc__ckpt_read_flat(ck, 0, p->off, n, bf16 ? tmp : bufs[i]);
        if (bf16) dsc_fp32_to_bf16_n(bufs[i], tmp, n);
        ts[i] = (dsc_st_tensor){.name = p->name, .dtype = bf16 ? "BF16" : "F32", .ndim = p->ndim,
                                .data = bufs[i], .nbytes = n * (bf16 ? 2 : 4)};
        for (int d = 0; d < p->ndim; d++) ts[i].shape[d] = p->shape[d];
    }
    free(tmp);
    return DSC_OK;
}

dsc_status dsc_ckpt_export(const char *dir, const char *tag, const char *out_path,
                           const char *dtype) {
    bool bf16 = dtype && !strcmp(dtype, "bf16");
    if (dtype && !bf16 && strcmp(dtype, "fp32") != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "export dtype %s: use fp32 or bf16", dtype);
    dsc_ckpt *ck;
    DSC_TRY(dsc_ckpt_open(&ck, dir, tag));
    int n = ck->m.nparams;
    dsc_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    dsc_status st = ts && bufs ? export_tensors(ck, bf16, ts, bufs)
                               : dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", ck->path);
    if (st == DSC_OK) {
        char step[32];
        snprintf(step, sizeof step, "%lld", (long long)ck->m.step);
        // "format": "pt" is what Hugging Face's loaders expect of PyTorch weights.
        const char *meta[] = {"format", "pt", "dsc_tag", ck->m.tag, "dsc_step", step,
                              "dsc_source", "dsc ckpt export"};
        st = dsc_st_write(out_path, ts, n, meta, 4);
    }
    for (int i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    free(ts);
    dsc_ckpt_close(ck);
    return st;
}

// ---- a Hugging Face folder ----

typedef struct hf_fill {
    const dsc_ckpt *ck;
    bool bf16;
    float *tmp; // one tensor, fp32 (bf16 only)
    size_t cap;
} hf_fill;

static dsc_status fill_param(void *user, int i, void *dst, size_t nbytes) {
    hf_fill *h = user;
    const dsc__mparam *p = &h->ck->m.params[i];
    size_t n = (size_t)p->numel;
    if (!h->bf16) {
        dsc__ckpt_read_flat(h->ck, 0, p->off, n, dst);
        return DSC_OK;
    }
    if (n > h->cap) {
        free(h->tmp);
        if (!(h->tmp = malloc(n * sizeof(float))))
            return h->cap = 0, dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", p->name);
        h->cap = n;
    }
    dsc__ckpt_read_flat(h->ck, 0, p->off, n, h->tmp);
    dsc_fp32_to_bf16_n(dst, h->tmp, nbytes / 2);
    return DSC_OK;
}

// Reals in as few digits as give back the same doubles (12 mostly: "1e-05", not
// "1.0000000000000001e-05"), up to the 17 that always do: the rewritten file loses nothing.
static char *dumps_exact(const json_t *o) {
    for (int p = 12; p <= 17; p++) {
        char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(p));
        json_t *back = text ? json_loads(text, 0, NULL) : NULL;
        bool same = back && json_equal(o, back);
        json_decref(back);
        if (same || p == 17 || !text) return text;
        free(text);
    }
    return NULL;
}

// The attached config.json with the type the weights were written in, in both spellings
// (transformers 4.44 reads "torch_dtype", 5.x "dtype"): a bf16 export that said float32 would be
// loaded at twice its size, and one from a bf16 folder exported as fp32 the other way round.
// *data is replaced by the new text (malloc'd).
static dsc_status set_config_dtype(const char *src, bool bf16, char **data, size_t *n) {
    json_error_t e;
    json_t *o = json_loadb(*data, *n, JSON_REJECT_DUPLICATES, &e);
    if (!json_is_object(o)) {
        json_decref(o);
        return dsc__fail(DSC_ERR_CORRUPT, "%s:%d:%d: %s (the checkpoint's attached config.json "
                         "is not a JSON object; export the weights alone with --out FILE)", src,
                         e.line, e.column, e.text);
    }
    const char *dtype = bf16 ? "bfloat16" : "float32";
    json_object_set_new(o, "torch_dtype", json_string(dtype));
    json_object_set_new(o, "dtype", json_string(dtype));
    char *text = dumps_exact(o);
    json_decref(o);
    if (!text) return dsc__fail(DSC_ERR_OOM, "out of memory rewriting %s", src);
    free(*data);
    *data = text, *n = strlen(text);
    return DSC_OK;
}

// Every attached file (config.json, generation_config.json, the tokenizer's) into out_dir.
static dsc_status copy_attachments(const dsc_ckpt *ck, const char *out_dir, bool bf16) {
    for (int i = 0; i < dsc_ckpt_num_attachments(ck); i++) {
        const char *name = dsc_ckpt_attachment_name(ck, i);
        char src[DSC_CKPT_PATH_MAX], dst[DSC_CKPT_PATH_MAX];
        char *data = NULL;
        size_t n;
        DSC_TRY(dsc__ckpt_join(dst, sizeof dst, out_dir, name));
        if (!dsc_ckpt_attachment_path(ck, name, src, sizeof src))
            return dsc__fail(DSC_ERR_INVALID_ARG, "%s: path too long", name);
        DSC_TRY(dsc__ckpt_read_file(src, &data, &n));
        dsc_status st = strcmp(name, "config.json") ? DSC_OK
                                                   : set_config_dtype(src, bf16, &data, &n);
        if (st == DSC_OK) st = dsc__ckpt_write_file(dst, data, n, true);
        free(data);
        DSC_TRY(st);
    }
    return DSC_OK;
}

static dsc_status export_hf(const dsc_ckpt *ck, const char *out_dir, bool bf16,
                            uint64_t shard_bytes) {
    char cfg[DSC_CKPT_PATH_MAX];
    if (!dsc_ckpt_attachment_path(ck, "config.json", cfg, sizeof cfg))
        return dsc__fail(DSC_ERR_INVALID_ARG, "checkpoint %s records no model config.json (saved "
                         "by a program that attached none, or by an older dsc): export the "
                         "weights alone with --out FILE", ck->path);
    DSC_TRY(dsc__mkdirs(out_dir));
    const dsc__manifest *m = &ck->m;
    dsc_st_tensor *ts = calloc((size_t)m->nparams, sizeof *ts);
    if (!ts) return dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", ck->path);
    for (int i = 0; i < m->nparams; i++) {
        const dsc__mparam *p = &m->params[i];
        ts[i] = (dsc_st_tensor){.name = p->name, .dtype = bf16 ? "BF16" : "F32", .ndim = p->ndim,
                                .nbytes = (size_t)p->numel * (bf16 ? 2 : 4)};
        for (int d = 0; d < p->ndim; d++) ts[i].shape[d] = p->shape[d];
    }
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)m->step);
    const char *meta[] = {"format", "pt", "dsc_tag", m->tag, "dsc_step", step};
    hf_fill h = {.ck = ck, .bf16 = bf16};
    dsc_status st = dsc_hf_weights_write(out_dir, ts, m->nparams, shard_bytes, meta, 3,
                                         fill_param, &h);
    free(h.tmp);
    free(ts);
    if (st == DSC_OK) st = copy_attachments(ck, out_dir, bf16);
    return st;
}

dsc_status dsc_ckpt_export_hf(const char *dir, const char *tag, const char *out_dir,
                              const char *dtype, uint64_t shard_bytes) {
    bool bf16 = dtype && !strcmp(dtype, "bf16");
    if (dtype && !bf16 && strcmp(dtype, "fp32") != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "export dtype %s: use fp32 or bf16", dtype);
    dsc_ckpt *ck;
    DSC_TRY(dsc_ckpt_open(&ck, dir, tag));
    dsc_status st = export_hf(ck, out_dir, bf16, shard_bytes ? shard_bytes : DSC_HF_SHARD_BYTES);
    dsc_ckpt_close(ck);
    return st;
}

// ---- from a DeepSpeed checkpoint ----

typedef struct ds_fill {
    dsc_ds_ckpt *ds;
    bool bf16;
    float *tmp; // one tensor, fp32 (bf16 only)
    size_t cap;
} ds_fill;

static dsc_status fill_ds(void *user, int i, void *dst, size_t nbytes) {
    ds_fill *h = user;
    dsc_ckpt_param p;
    dsc_ds_ckpt_get_param(h->ds, i, &p);
    if (!h->bf16) return dsc_ds_ckpt_read_param(h->ds, i, 0, p.numel, dst);
    if ((size_t)p.numel > h->cap) {
        free(h->tmp);
        if (!(h->tmp = malloc((size_t)p.numel * sizeof(float))))
            return h->cap = 0, dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", p.name);
        h->cap = (size_t)p.numel;
    }
    DSC_TRY(dsc_ds_ckpt_read_param(h->ds, i, 0, p.numel, h->tmp));
    dsc_fp32_to_bf16_n(dst, h->tmp, nbytes / 2);
    return DSC_OK;
}

// The folder of the model's Hugging Face files: config_dir, else the save directory when it
// holds config.json (the Hugging Face Trainer keeps it beside `latest`), else its parent.
static dsc_status find_model_files(const char *dir, const char *config_dir, char *out,
                                   size_t cap) {
    char p[DSC_CKPT_PATH_MAX];
    const char *slash = strrchr(dir, '/');
    if (config_dir) {
        snprintf(out, cap, "%s", config_dir);
    } else {
        snprintf(out, cap, "%s", dir);
        if (dsc__ckpt_join(p, sizeof p, out, "config.json") == DSC_OK && !dsc__ckpt_exists(p))
            snprintf(out, cap, "%.*s", slash ? (int)(slash - dir) : 1, slash ? dir : ".");
    }
    DSC_TRY(dsc__ckpt_join(p, sizeof p, out, "config.json"));
    if (!dsc__ckpt_exists(p))
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s has no config.json: DeepSpeed saves none; give "
                         "the model's Hugging Face folder with --hf-config DIR (its config.json, "
                         "generation_config.json and tokenizer files go into the export), or "
                         "export the weights alone with --out FILE", config_dir ? config_dir : dir);
    return DSC_OK;
}

// The model's files that a Hugging Face folder carries, copied when present (config.json
// rewritten with the export's dtype).
static dsc_status copy_model_files(const char *from, const char *out_dir, bool bf16) {
    static const char *const names[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "special_tokens_map.json",
                                        "vocab.json", "merges.txt", "tokenizer.model",
                                        "chat_template.jinja", "added_tokens.json"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char src[DSC_CKPT_PATH_MAX], dst[DSC_CKPT_PATH_MAX], *data = NULL;
        size_t n;
        DSC_TRY(dsc__ckpt_join(src, sizeof src, from, names[i]));
        if (!dsc__ckpt_exists(src)) continue;
        DSC_TRY(dsc__ckpt_join(dst, sizeof dst, out_dir, names[i]));
        DSC_TRY(dsc__ckpt_read_file(src, &data, &n));
        dsc_status st = i ? DSC_OK : set_config_dtype(src, bf16, &data, &n);
        if (st == DSC_OK) st = dsc__ckpt_write_file(dst, data, n, true);
        free(data);
        DSC_TRY(st);
    }
    return DSC_OK;
}

static dsc_status ds_tensors(dsc_ds_ckpt *ds, bool bf16, dsc_st_tensor **out, int *n) {
    dsc_ds_ckpt_info in;
    dsc_ds_ckpt_get_info(ds, &in);
    dsc_st_tensor *ts = calloc((size_t)in.nparams + 1, sizeof *ts);
    if (!ts) return dsc__fail(DSC_ERR_OOM, "out of memory exporting %s", in.tag);
    for (int i = 0; i < in.nparams; i++) {
        dsc_ckpt_param p;
        dsc_ds_ckpt_get_param(ds, i, &p);
        ts[i] = (dsc_st_tensor){.name = p.name, .dtype = bf16 ? "BF16" : "F32", .ndim = p.ndim,
                                .nbytes = (size_t)p.numel * (bf16 ? 2 : 4)};
        for (int d = 0; d < p.ndim; d++) ts[i].shape[d] = p.shape[d];
    }
    *out = ts, *n = in.nparams;
    return DSC_OK;
}

static dsc_status ds_export(dsc_ds_ckpt *ds, const char *files, const char *out, bool bf16,
                            uint64_t shard_bytes) {
    dsc_ds_ckpt_info in;
    dsc_ds_ckpt_get_info(ds, &in);
    dsc_st_tensor *ts = NULL;
    int n = 0;
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)in.global_steps);
    const char *meta[] = {"format", "pt", "dsc_tag", in.tag, "dsc_step", step, "dsc_source",
                          "DeepSpeed checkpoint"};
    DSC_TRY(ds_tensors(ds, bf16, &ts, &n));
    ds_fill h = {.ds = ds, .bf16 = bf16};
    dsc_status st = files ? dsc__mkdirs(out) : DSC_OK;
    if (st == DSC_OK && files)
        st = dsc_hf_weights_write(out, ts, n, shard_bytes, meta, 4, fill_ds, &h);
    else if (st == DSC_OK)
        st = dsc_st_write_stream(out, ts, n, meta, 4, fill_ds, &h);
    if (st == DSC_OK && files) st = copy_model_files(files, out, bf16);
    free(h.tmp);
    free(ts);
    return st;
}

dsc_status dsc_ds_ckpt_export_hf(const char *dir, const char *tag, const char *config_dir,
                                 const char *out_dir, const char *dtype, uint64_t shard_bytes) {
    bool bf16 = dtype && !strcmp(dtype, "bf16");
    if (dtype && !bf16 && strcmp(dtype, "fp32") != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "export dtype %s: use fp32 or bf16", dtype);
    char files[DSC_CKPT_PATH_MAX];
    DSC_TRY(find_model_files(dir, config_dir, files, sizeof files));
    dsc_ds_ckpt *ds;
    DSC_TRY(dsc_ds_ckpt_open(&ds, dir, tag));
    dsc_status st = ds_export(ds, files, out_dir, bf16,
                              shard_bytes ? shard_bytes : DSC_HF_SHARD_BYTES);
    dsc_ds_ckpt_close(ds);
    return st;
}

dsc_status dsc_ds_ckpt_export(const char *dir, const char *tag, const char *out_path,
                              const char *dtype) {
    bool bf16 = dtype && !strcmp(dtype, "bf16");
    if (dtype && !bf16 && strcmp(dtype, "fp32") != 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "export dtype %s: use fp32 or bf16", dtype);
    dsc_ds_ckpt *ds;
    DSC_TRY(dsc_ds_ckpt_open(&ds, dir, tag));
    dsc_status st = ds_export(ds, NULL, out_path, bf16, 0);
    dsc_ds_ckpt_close(ds);
    return st;
}
