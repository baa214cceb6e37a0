// ckpt/hf_weights.c - tensors of a Hugging Face folder (one file or an index of shards).
#include "engine/ckpt/hf_weights.h"

#include <errno.h>    // errno
#include <jansson.h>  // json_*
#include <stdio.h>    // snprintf
#include <stdlib.h>   // calloc, free
#include <string.h>   // strcmp, memcpy, strrchr
#include <sys/stat.h> // stat

#include "base/io.h"                // dsc__fopen_regular
#include "base/status.h"            // dsc__fail, DSC_TRY
#include "dsc/half.h"               // dsc_bf16_to_fp32_n, dsc_fp16_to_fp32_n
#include "engine/ckpt/safetensors.h" // dsc_st_*
#include "dsc/checkpoint.h"           // dsc_ds_ckpt_*

#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

struct dsc_hf_weights {
    char dir[4096];  // the folder shard names are relative to
    char what[4200]; // the path as given, for messages
    int nshards;
    char **shard;    // file names, relative to dir
    int n;
    const char **names; // borrowed from index
    int *shard_of;      // tensor -> shard
    json_t *index;      // name -> tensor number
    dsc_st_file *open;  // the one mapped shard, or NULL
    int open_shard;
    int maps;
    dsc_ds_ckpt *ds;    // a DeepSpeed checkpoint instead of safetensors files, or NULL
};

static bool is_dir(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static bool ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && !strcmp(s + n - m, tail);
}

static dsc_status add_shard(dsc_hf_weights *w, const char *file, int *id) {
    for (int i = 0; i < w->nshards; i++)
        if (!strcmp(w->shard[i], file)) return *id = i, DSC_OK;
    if (strchr(file, '/') || !strcmp(file, "..") || !file[0])
        return dsc__fail(DSC_ERR_CORRUPT, "%s: shard name \"%.200s\" is not a file name in the "
                         "folder", w->what, file);
    char **s = realloc(w->shard, (size_t)(w->nshards + 1) * sizeof *s);
    if (!s) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", w->what);
    w->shard = s;
    if (!(s[w->nshards] = strdup(file))) return dsc__fail(DSC_ERR_OOM, "out of memory");
    *id = w->nshards++;
    return DSC_OK;
}

static dsc_status add_tensor(dsc_hf_weights *w, const char *name, int shard) {
    if (json_object_get(w->index, name))
        return dsc__fail(DSC_ERR_CORRUPT, "%s: tensor %.200s is listed twice", w->what, name);
    json_object_set_new(w->index, name, json_integer(w->n));
    w->shard_of[w->n++] = shard;
    return DSC_OK;
}

// weight_map of an index file: name -> shard file.
static dsc_status read_index(dsc_hf_weights *w, const char *path) {
    json_error_t e;
    FILE *f;
    DSC_TRY(dsc__fopen_regular(path, &f));
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &e);
    fclose(f);
    json_t *map = json_object_get(root, "weight_map");
    dsc_status st = DSC_OK;
    if (!json_is_object(map) || !json_object_size(map)) {
        st = root ? dsc__fail(DSC_ERR_CORRUPT, "%s: no \"weight_map\" object of tensor names to "
                              "shard files", path)
                  : dsc__fail(DSC_ERR_CORRUPT, "%s:%d:%d: %s", path, e.line, e.column, e.text);
        json_decref(root);
        return st;
    }
    w->names = calloc(json_object_size(map), sizeof *w->names);
    w->shard_of = calloc(json_object_size(map), sizeof *w->shard_of);
    if (!w->names || !w->shard_of) st = dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    const char *name;
    json_t *file;
    json_object_foreach(map, name, file) {
        if (st != DSC_OK) break;
        int id;
        if (!json_is_string(file)) {
            st = dsc__fail(DSC_ERR_CORRUPT, "%s: weight_map[\"%.200s\"] is not a file name", path, name);
            break;
        }
        if ((st = add_shard(w, json_string_value(file), &id)) != DSC_OK) break;
        st = add_tensor(w, name, id);
    }
    if (st == DSC_OK) { // the names are the index object's own copies of the keys
        int i = 0;
        const char *k;
        json_t *v;
        json_object_foreach(w->index, k, v) w->names[i++] = k;
    }
    json_decref(root);
    return st;
}

// One .safetensors file: its own header lists the tensors.
static dsc_status read_single(dsc_hf_weights *w, const char *file) {
    int id;
    DSC_TRY(add_shard(w, file, &id));
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", w->dir, file);
    DSC_TRY(dsc_st_open(&w->open, path));
    w->open_shard = id;
    w->maps = 1;
    int n = dsc_st_count(w->open);
    w->names = calloc((size_t)n + 1, sizeof *w->names);
    w->shard_of = calloc((size_t)n + 1, sizeof *w->shard_of);
    if (!w->names || !w->shard_of) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    for (int i = 0; i < n; i++) DSC_TRY(add_tensor(w, dsc_st_get(w->open, i)->name, id));
    int i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(w->index, k, v) w->names[i++] = k;
    return DSC_OK;
}

static void split_path(dsc_hf_weights *w, const char *path, char *file, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(w->dir, sizeof w->dir, ".");
        snprintf(file, cap, "%s", path);
    } else {
        snprintf(w->dir, sizeof w->dir, "%.*s", (int)(slash - path), path);
        if (!w->dir[0]) snprintf(w->dir, sizeof w->dir, "/");
        snprintf(file, cap, "%s", slash + 1);
    }
}

// A DeepSpeed checkpoint (its save directory or a tag directory): the fp32 master weights of its
// ZeRO partitions under the names DeepSpeed recorded, read a range at a time.
static dsc_status read_deepspeed(dsc_hf_weights *w, const char *path) {
    DSC_TRY(dsc_ds_ckpt_open(&w->ds, path, NULL));
    dsc_ds_ckpt_info in;
    dsc_ds_ckpt_get_info(w->ds, &in);
    w->names = calloc((size_t)in.nparams + 1, sizeof *w->names);
    w->shard_of = calloc((size_t)in.nparams + 1, sizeof *w->shard_of);
    if (!w->names || !w->shard_of) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    for (int i = 0; i < in.nparams; i++) {
        dsc_ckpt_param p;
        dsc_ds_ckpt_get_param(w->ds, i, &p);
        DSC_TRY(add_tensor(w, p.name, 0));
    }
    int i = 0;
    const char *k;
    json_t *v;
    json_object_foreach(w->index, k, v) w->names[i++] = k;
    return DSC_OK;
}

static dsc_status open_any(dsc_hf_weights *w, const char *path) {
    char file[4096], p[8400];
    if (is_dir(path) && dsc_ds_ckpt_detect(path, NULL)) return read_deepspeed(w, path);
    if (is_dir(path)) {
        snprintf(w->dir, sizeof w->dir, "%s", path);
        snprintf(p, sizeof p, "%s/" INDEX_NAME, path);
        if (exists(p)) return read_index(w, p);
        snprintf(p, sizeof p, "%s/" SINGLE_NAME, path);
        if (exists(p)) return read_single(w, SINGLE_NAME);
        snprintf(p, sizeof p, "%s/pytorch_model.bin", path);
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s holds neither " INDEX_NAME " nor " SINGLE_NAME
                         "%s", path, exists(p) ? " (pytorch_model.bin is not read: save the model "
                         "with save_pretrained(DIR, safe_serialization=True))" : "");
    }
    if (!exists(path))
        return dsc__fail(DSC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    split_path(w, path, file, sizeof file);
    if (ends_with(path, ".json")) return read_index(w, path);
    return read_single(w, file);
}

dsc_status dsc_hf_weights_open(dsc_hf_weights **out, const char *path) {
    *out = NULL;
    dsc_hf_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->index = json_object())) {
        free(w);
        return dsc__fail(DSC_ERR_OOM, "out of memory opening %s", path);
    }
    snprintf(w->what, sizeof w->what, "%s", path);
    w->open_shard = -1;
    dsc_status st = open_any(w, path);
    if (st != DSC_OK) {
        dsc_hf_weights_close(w);
        return st;
    }
    *out = w;
    return DSC_OK;
}

void dsc_hf_weights_close(dsc_hf_weights *w) {
    if (!w) return;
    dsc_ds_ckpt_close(w->ds);
    dsc_st_close(w->open);
    for (int i = 0; i < w->nshards; i++) free(w->shard[i]);
    free(w->shard);
    free(w->names);
    free(w->shard_of);
    json_decref(w->index);
    free(w);
}

int dsc_hf_weights_count(const dsc_hf_weights *w) { return w->n; }
const char *dsc_hf_weights_name(const dsc_hf_weights *w, int i) { return w->names[i]; }
int dsc_hf_weights_maps(const dsc_hf_weights *w) { return w->maps; }

bool dsc_hf_weights_has(const dsc_hf_weights *w, const char *name) {
    return json_object_get(w->index, name) != NULL;
}

// Map the shard that holds `name` (unmapping the one before) and find the tensor in it.
static dsc_status locate(dsc_hf_weights *w, const char *name, const dsc_st_tensor **out) {
    json_t *id = json_object_get(w->index, name);
    if (!id)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s has no tensor %s", w->what, name);
    int shard = w->shard_of[json_integer_value(id)];
    if (shard != w->open_shard) {
        dsc_st_close(w->open);
        w->open = NULL;
        w->open_shard = -1;
        char path[8400];
        snprintf(path, sizeof path, "%s/%s", w->dir, w->shard[shard]);
        DSC_TRY(dsc_st_open(&w->open, path));
        w->open_shard = shard;
        w->maps++;
    }
    *out = dsc_st_find(w->open, name);
    if (!*out)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: the index puts tensor %s in %s, which does not "
                         "hold it", w->what, name, w->shard[shard]);
    return DSC_OK;
}

// The DeepSpeed checkpoint's parameter `name`, or an error naming it.
static dsc_status ds_param(dsc_hf_weights *w, const char *name, dsc_ckpt_param *p, int *i) {
    *i = dsc_ds_ckpt_find_param(w->ds, name);
    if (*i < 0) return dsc__fail(DSC_ERR_INVALID_ARG, "%s has no tensor %s", w->what, name);
    dsc_ds_ckpt_get_param(w->ds, *i, p);
    return DSC_OK;
}

static dsc_status ds_info(dsc_hf_weights *w, const char *name, dsc_hf_tensor *out) {
    dsc_ckpt_param p;
    int i;
    DSC_TRY(ds_param(w, name, &p, &i));
    *out = (dsc_hf_tensor){.dtype = "F32", .ndim = p.ndim, .numel = p.numel};
    for (int d = 0; d < p.ndim; d++) out->shape[d] = p.shape[d];
    return DSC_OK;
}

dsc_status dsc_hf_weights_info(dsc_hf_weights *w, const char *name, dsc_hf_tensor *out) {
    if (w->ds) return ds_info(w, name, out);
    const dsc_st_tensor *t;
    DSC_TRY(locate(w, name, &t));
    *out = (dsc_hf_tensor){.ndim = t->ndim, .numel = 1};
    snprintf(out->dtype, sizeof out->dtype, "%s", t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        out->shape[d] = t->shape[d];
        out->numel *= t->shape[d];
    }
    return DSC_OK;
}

dsc_status dsc_hf_weights_read(dsc_hf_weights *w, const char *name, int64_t begin, int64_t count,
                               float *dst) {
    if (w->ds) {
        dsc_ckpt_param p;
        int i;
        DSC_TRY(ds_param(w, name, &p, &i));
        return dsc_ds_ckpt_read_param(w->ds, i, begin, count, dst);
    }
    const dsc_st_tensor *t;
    DSC_TRY(locate(w, name, &t));
    size_t es = dsc_st_dtype_size(t->dtype);
    int64_t numel = (int64_t)(t->nbytes / es);
    if (begin < 0 || count < 0 || begin > numel || count > numel - begin)
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: tensor %s has %lld elements; elements "
                         "[%lld, %lld) were asked for", w->what, name, (long long)numel,
                         (long long)begin, (long long)(begin + count));
    const char *src = (const char *)t->data + (size_t)begin * es;
    bool bf16 = !strcmp(t->dtype, "BF16");
    // the pages read leave the resident set (dsc__map_drop): weights read piece by piece, as
    // the state on a device takes them, never stay resident all at once
    if (!strcmp(t->dtype, "F32")) {
        memcpy(dst, src, (size_t)count * 4);
        dsc__map_drop(src, (size_t)count * 4);
        return DSC_OK;
    }
    if (!bf16 && strcmp(t->dtype, "F16"))
        return dsc__fail(DSC_ERR_INVALID_ARG, "%s: tensor %s is %s; dsc reads F32, BF16 and F16 "
                         "weights", w->what, name, t->dtype);
    // 16-bit values through an aligned buffer: the file's offsets need not be even.
    uint16_t buf[4096];
    for (int64_t done = 0; done < count;) {
        size_t n = (size_t)(count - done < 4096 ? count - done : 4096);
        memcpy(buf, src + (size_t)done * 2, n * 2);
        if (bf16) dsc_bf16_to_fp32_n(dst + done, buf, n);
        else dsc_fp16_to_fp32_n(dst + done, buf, n);
        done += (int64_t)n;
    }
    dsc__map_drop(src, (size_t)count * 2);
    return DSC_OK;
}

// ---- writing ----

typedef struct shard_fill {
    dsc_st_fill_fn fill;
    void *user;
    int first; // tensor number of the shard's first tensor
} shard_fill;

static dsc_status fill_shifted(void *user, int i, void *dst, size_t nbytes) {
    shard_fill *s = user;
    return s->fill(s->user, s->first + i, dst, nbytes);
}

// The first tensor of each shard: starts[0..*nshards], starts[*nshards] = n.
static int plan_shards(const dsc_st_tensor *t, int n, uint64_t shard_bytes, int *starts) {
    int k = 0;
    uint64_t used = 0;
    starts[0] = 0;
    for (int i = 0; i < n; i++) {
        if (i > starts[k] && used + t[i].nbytes > shard_bytes) {
            starts[++k] = i;
            used = 0;
        }
        used += t[i].nbytes;
    }
    starts[++k] = n;
    return k;
}

static dsc_status write_index(const char *dir, const dsc_st_tensor *t, int n, const int *starts,
                              int nshards) {
    json_t *map = json_object();
    uint64_t total = 0;
    char file[64];
    for (int k = 0; k < nshards; k++) {
        snprintf(file, sizeof file, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        for (int i = starts[k]; i < starts[k + 1]; i++) {
            json_object_set_new(map, t[i].name, json_string(file));
            total += t[i].nbytes;
        }
    }
    json_t *root = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
                             "weight_map", map);
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/" INDEX_NAME, dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = root ? json_dump_file(root, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : -1;
    json_decref(root);
    if (rc != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        return dsc__fail(DSC_ERR_IO, "cannot write %s (check free space and permissions)", path);
    }
    return DSC_OK;
}

dsc_status dsc_hf_weights_write(const char *dir, const dsc_st_tensor *t, int n,
                                uint64_t shard_bytes, const char *const *meta, int nmeta,
                                dsc_st_fill_fn fill, void *user) {
    if (n <= 0 || shard_bytes == 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "writing %s: no tensors, or a shard size of 0", dir);
    int *starts = malloc((size_t)(n + 1) * sizeof *starts);
    if (!starts) return dsc__fail(DSC_ERR_OOM, "out of memory writing %s", dir);
    int nshards = plan_shards(t, n, shard_bytes, starts);
    dsc_status st = DSC_OK;
    char path[4200];
    for (int k = 0; k < nshards && st == DSC_OK; k++) {
        if (nshards == 1) snprintf(path, sizeof path, "%s/" SINGLE_NAME, dir);
        else snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", dir, k + 1, nshards);
        shard_fill sf = {fill, user, starts[k]};
        st = dsc_st_write_stream(path, t + starts[k], starts[k + 1] - starts[k], meta, nmeta,
                                 fill_shifted, &sf);
    }
    if (st == DSC_OK && nshards > 1) st = write_index(dir, t, n, starts, nshards);
    free(starts);
    return st;
}
