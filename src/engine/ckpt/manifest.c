// ckpt/manifest.c - render and parse manifest.json (see manifest.h and
// docs/checkpoint-format.md).
#include "engine/ckpt/manifest.h"

#include <inttypes.h> // PRIx64
#include <jansson.h>  // json_*
#include <stdio.h>    // snprintf, open_memstream
#include <stdlib.h>   // calloc, free, strtoull
#include <string.h>   // strcmp, memcpy

#include "base/hash.h"      // dsc_hash64
#include "base/status.h"    // dsc__fail
#include "base/time.h"      // dsc_wall_time
#include "dsc_build_info.h" // DSC_VERSION_STRING

#define SUM_KEY "\"manifest_xxh3\": \""
#define SUM_ZERO "0000000000000000"

const char *dsc__ckpt_moment_name(const char *optimizer, int k) {
    if (!strcmp(optimizer, "sgd")) return "momentum_buffer";
    return k == 0 ? "exp_avg" : "exp_avg_sq"; // Adam, AdamW; Lion keeps exp_avg only
}

void dsc__ckpt_shard_name(char *out, size_t cap, int rank, int world) {
    snprintf(out, cap, "shard_rank%d_of_%d.safetensors", rank, world);
}

// ---- from the engine ----

dsc_status dsc__manifest_from_engine(dsc__manifest *m, dsc_engine *eng, const char *tag) {
    memset(m, 0, sizeof *m);
    dsc_state_layout L;
    dsc__state_layout(eng, &L);
    snprintf(m->tag, sizeof m->tag, "%s", tag);
    m->world = L.world;
    m->stage = L.stage;
    snprintf(m->precision, sizeof m->precision, "%s", L.precision);
    snprintf(m->optimizer, sizeof m->optimizer, "%s", L.optimizer);
    snprintf(m->master_precision, sizeof m->master_precision, "%s", L.master_precision);
    snprintf(m->moments_precision, sizeof m->moments_precision, "%s", L.moments_precision);
    snprintf(m->dsc_version, sizeof m->dsc_version, "%s", DSC_VERSION_STRING);
    m->nmoments = L.nmoments;
    for (int k = 0; k < L.nmoments; k++)
        snprintf(m->moments[k], sizeof m->moments[k], "%s", dsc__ckpt_moment_name(L.optimizer, k));
    dsc__state_scalars_get(eng, &m->scalars);
    m->step = m->scalars.global_steps;
    m->total = L.total;
    m->created = dsc_wall_time();
    m->ngroups = L.ngroups;
    m->nparams = L.nparams;
    m->nfiles = L.world;
    m->groups = calloc((size_t)L.ngroups, sizeof *m->groups);
    m->params = calloc((size_t)L.nparams, sizeof *m->params);
    m->files = calloc((size_t)L.world, sizeof *m->files);
    if (!m->groups || !m->params || !m->files) {
        dsc__manifest_free(m);
        return dsc__fail(DSC_ERR_OOM, "out of memory for the checkpoint manifest");
    }
    for (int g = 0; g < L.ngroups; g++) dsc__state_group(eng, g, &m->groups[g]);
    for (int i = 0; i < L.nparams; i++) {
        dsc_state_param p;
        dsc__state_param(eng, i, &p);
        dsc__mparam *q = &m->params[i];
        snprintf(q->name, sizeof q->name, "%s", p.name);
        q->ndim = p.ndim;
        memcpy(q->shape, p.shape, sizeof q->shape);
        q->numel = p.numel;
        q->group = p.group;
        q->off = p.off;
    }
    for (int r = 0; r < L.world; r++) {
        m->files[r].rank = r;
        dsc__ckpt_shard_name(m->files[r].name, sizeof m->files[r].name, r, L.world);
    }
    return DSC_OK;
}

void dsc__manifest_free(dsc__manifest *m) {
    free(m->groups);
    free(m->params);
    free(m->files);
    free(m->attach);
    m->groups = NULL;
    m->params = NULL;
    m->files = NULL;
    m->attach = NULL;
    m->nattach = 0;
}

bool dsc__ckpt_attachment_name_ok(const char *name) {
    size_t n = strlen(name);
    return n > 0 && n < sizeof(((dsc__mfile *)0)->name) && !strchr(name, '/') &&
           strcmp(name, ".") && strcmp(name, "..") && strcmp(name, DSC_CKPT_MANIFEST) &&
           strcmp(name, DSC_CKPT_BAD_MARKER) && strncmp(name, "shard_rank", 10);
}

// ---- rendering ----

static json_t *config_json(const dsc_config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return json_null();
    dsc_config_print(cfg, f, true);
    fclose(f);
    json_t *j = json_loadb(buf, len, 0, NULL);
    free(buf);
    return j ? j : json_null();
}

static json_t *scalars_json(const dsc_state_scalars *s) {
    return json_pack("{s:I, s:I, s:I, s:f, s:I, s:I, s:i}", "global_steps",
                     (json_int_t)s->global_steps, "applied_steps", (json_int_t)s->applied_steps,
                     "skipped_steps", (json_int_t)s->skipped_steps, "loss_scale", s->cur_scale,
                     "scaler_iter", (json_int_t)s->cur_iter, "scaler_last_overflow_iter",
                     (json_int_t)s->last_overflow_iter, "scaler_hysteresis", s->cur_hysteresis);
}

static json_t *tables_json(const dsc__manifest *m, json_t *root) {
    json_t *groups = json_array(), *params = json_array(), *files = json_array(), *mom = json_array();
    for (int k = 0; k < m->nmoments; k++) json_array_append_new(mom, json_string(m->moments[k]));
    json_object_set_new(root, "moments", mom);
    json_object_set_new(root, "scalars", scalars_json(&m->scalars));
    json_object_set_new(root, "flat_size", json_integer((json_int_t)m->total));
    for (int g = 0; g < m->ngroups; g++)
        json_array_append_new(groups, json_pack("{s:I, s:I, s:I}", "off", (json_int_t)m->groups[g].off,
                                                "padded", (json_int_t)m->groups[g].padded, "slice",
                                                (json_int_t)m->groups[g].slice));
    json_object_set_new(root, "groups", groups);
    for (int i = 0; i < m->nparams; i++) {
        const dsc__mparam *p = &m->params[i];
        json_t *shape = json_array();
        for (int d = 0; d < p->ndim; d++) json_array_append_new(shape, json_integer(p->shape[d]));
        json_array_append_new(params, json_pack("{s:s, s:o, s:i, s:I}", "name", p->name, "shape",
                                                shape, "group", p->group, "offset", (json_int_t)p->off));
    }
    json_object_set_new(root, "params", params);
    for (int r = 0; r < m->nfiles; r++) {
        char hex[17];
        snprintf(hex, sizeof hex, "%016" PRIx64, m->files[r].xxh3);
        json_array_append_new(files, json_pack("{s:s, s:i, s:I, s:s}", "name", m->files[r].name,
                                               "rank", m->files[r].rank, "bytes",
                                               (json_int_t)m->files[r].bytes, "xxh3", hex));
    }
    json_object_set_new(root, "files", files);
    if (m->nattach > 0) { // absent when there are none: such manifests read as before
        json_t *att = json_array();
        for (int i = 0; i < m->nattach; i++) {
            char hex[17];
            snprintf(hex, sizeof hex, "%016" PRIx64, m->attach[i].xxh3);
            json_array_append_new(att, json_pack("{s:s, s:I, s:s}", "name", m->attach[i].name,
                                                 "bytes", (json_int_t)m->attach[i].bytes,
                                                 "xxh3", hex));
        }
        json_object_set_new(root, "attachments", att);
    }
    return root;
}

char *dsc__manifest_render(const dsc__manifest *m, const dsc_config *cfg) {
    json_t *root = json_pack("{s:s, s:i, s:s, s:s, s:I, s:f, s:i, s:i, s:s, s:s}", "format",
                             DSC_CKPT_FORMAT, "format_version", DSC_CKPT_FORMAT_VERSION,
                             "dsc_version", m->dsc_version, "tag", m->tag, "step",
                             (json_int_t)m->step, "created", m->created, "world_size", m->world,
                             "zero_stage", m->stage, "precision", m->precision, "optimizer",
                             m->optimizer);
    if (!root) return NULL;
    json_object_set_new(root, "master_precision",
                        json_string(m->master_precision[0] ? m->master_precision : "fp32"));
    json_object_set_new(root, "moments_precision",
                        json_string(m->moments_precision[0] ? m->moments_precision : "fp32"));
    tables_json(m, root);
    json_object_set_new(root, "config", cfg ? config_json(cfg) : json_null());
    json_object_set_new(root, "manifest_xxh3", json_string(SUM_ZERO));
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (!text) return NULL;
    char *at = strstr(text, SUM_KEY SUM_ZERO "\"");
    if (!at) {
        free(text);
        return NULL;
    }
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, dsc_hash64(text, strlen(text)));
    memcpy(at + strlen(SUM_KEY), hex, 16);
    return text;
}

// ---- parsing ----

static dsc_status bad(const char *path, const char *what) {
    return dsc__fail(DSC_ERR_CORRUPT, "%s: %s; the checkpoint is damaged or not a dsc checkpoint "
                     "(dsc ckpt verify explains; resume from another tag)", path, what);
}

static dsc_status check_sum(const char *text, size_t n, const char *path) {
    const char *at = NULL;
    for (const char *p = strstr(text, SUM_KEY); p; p = strstr(p + 1, SUM_KEY)) at = p;
    if (!at) return bad(path, "no manifest_xxh3 field (not written by dsc, or cut short)");
    const char *hex = at + strlen(SUM_KEY);
    if ((size_t)(hex - text) + 17 > n || hex[16] != '"') return bad(path, "malformed manifest_xxh3");
    char want[17];
    memcpy(want, hex, 16);
    want[16] = '\0';
    char *copy = malloc(n);
    if (!copy) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    memcpy(copy, text, n);
    memcpy(copy + (hex - text), SUM_ZERO, 16);
    char got[17];
    snprintf(got, sizeof got, "%016" PRIx64, dsc_hash64(copy, n));
    free(copy);
    if (strcmp(got, want) != 0)
        return dsc__fail(DSC_ERR_CORRUPT, "%s: checksum mismatch (the file says %s, its content "
                         "hashes to %s): the manifest was edited or damaged; resume from another "
                         "tag", path, want, got);
    return DSC_OK;
}

static bool get_int(json_t *o, const char *key, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return false;
    *out = json_integer_value(v);
    return true;
}

static bool get_str(json_t *o, const char *key, char *out, size_t cap) {
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v) || strlen(json_string_value(v)) >= cap) return false;
    snprintf(out, cap, "%s", json_string_value(v));
    return true;
}

static dsc_status parse_scalars(dsc__manifest *m, json_t *s, const char *path) {
    int64_t hyst = 0;
    json_t *scale = json_object_get(s, "loss_scale");
    if (!json_is_object(s) || !json_is_number(scale) ||
        !get_int(s, "global_steps", &m->scalars.global_steps) ||
        !get_int(s, "applied_steps", &m->scalars.applied_steps) ||
        !get_int(s, "skipped_steps", &m->scalars.skipped_steps) ||
        !get_int(s, "scaler_iter", &m->scalars.cur_iter) ||
        !get_int(s, "scaler_last_overflow_iter", &m->scalars.last_overflow_iter) ||
        !get_int(s, "scaler_hysteresis", &hyst))
        return bad(path, "field 'scalars' is missing or malformed");
    m->scalars.cur_scale = json_number_value(scale);
    m->scalars.cur_hysteresis = (int)hyst;
    return DSC_OK;
}

static dsc_status parse_groups(dsc__manifest *m, json_t *a, const char *path) {
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > 1000000)
        return bad(path, "field 'groups' is missing or malformed");
    m->ngroups = (int)json_array_size(a);
    m->groups = calloc((size_t)m->ngroups, sizeof *m->groups);
    if (!m->groups) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    uint64_t cursor = 0;
    for (int g = 0; g < m->ngroups; g++) {
        json_t *e = json_array_get(a, (size_t)g);
        int64_t off, padded, slice;
        if (!get_int(e, "off", &off) || !get_int(e, "padded", &padded) || !get_int(e, "slice", &slice) ||
            (uint64_t)off != cursor || slice < 0 || padded != slice * m->world)
            return bad(path, "the group table is inconsistent (offsets, padding or slices)");
        m->groups[g] = (dsc_state_group){(size_t)off, (size_t)padded, (size_t)slice};
        cursor += (uint64_t)padded;
    }
    if (cursor != m->total) return bad(path, "the groups do not add up to flat_size");
    return DSC_OK;
}

static dsc_status parse_param(dsc__manifest *m, json_t *e, dsc__mparam *p, const char *path) {
    json_t *shape = json_object_get(e, "shape");
    int64_t group, off;
    if (!get_str(e, "name", p->name, sizeof p->name) || !json_is_array(shape) ||
        json_array_size(shape) < 1 || json_array_size(shape) > DSC_PARAM_MAX_DIMS ||
        !get_int(e, "group", &group) || !get_int(e, "offset", &off) || group < 0 ||
        group >= m->ngroups || off < 0)
        return bad(path, "a parameter entry is malformed");
    p->ndim = (int)json_array_size(shape);
    p->numel = 1;
    for (int d = 0; d < p->ndim; d++) {
        json_t *s = json_array_get(shape, (size_t)d);
        if (!json_is_integer(s) || json_integer_value(s) <= 0) return bad(path, "a parameter shape is malformed");
        p->shape[d] = json_integer_value(s);
        p->numel *= p->shape[d];
    }
    p->group = (int)group;
    p->off = (uint64_t)off;
    const dsc_state_group *g = &m->groups[group];
    if (p->off < g->off || p->off + (uint64_t)p->numel > g->off + g->padded) {
        char why[DSC_PARAM_NAME_MAX + 64];
        snprintf(why, sizeof why, "parameter %s lies outside its group", p->name);
        return bad(path, why);
    }
    return DSC_OK;
}

static dsc_status parse_params(dsc__manifest *m, json_t *a, const char *path) {
    if (!json_is_array(a) || json_array_size(a) == 0 || json_array_size(a) > 10000000)
        return bad(path, "field 'params' is missing or malformed");
    m->nparams = (int)json_array_size(a);
    m->params = calloc((size_t)m->nparams, sizeof *m->params);
    if (!m->params) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    for (int i = 0; i < m->nparams; i++)
        DSC_TRY(parse_param(m, json_array_get(a, (size_t)i), &m->params[i], path));
    return DSC_OK;
}

static dsc_status parse_files(dsc__manifest *m, json_t *a, const char *path) {
    if (!json_is_array(a) || json_array_size(a) != (size_t)m->world)
        return bad(path, "field 'files' must list one shard per rank");
    m->nfiles = m->world;
    m->files = calloc((size_t)m->nfiles, sizeof *m->files);
    if (!m->files) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    for (int r = 0; r < m->nfiles; r++) {
        json_t *e = json_array_get(a, (size_t)r);
        dsc__mfile *f = &m->files[r];
        int64_t rank, bytes;
        char hex[24], *end, want[96];
        if (!get_str(e, "name", f->name, sizeof f->name) || !get_int(e, "rank", &rank) ||
            !get_int(e, "bytes", &bytes) || !get_str(e, "xxh3", hex, sizeof hex) ||
            strlen(hex) != 16 || rank != r || bytes < 8)
            return bad(path, "a file entry is malformed");
        dsc__ckpt_shard_name(want, sizeof want, r, m->world);
        if (strcmp(want, f->name) != 0 || strchr(f->name, '/'))
            return bad(path, "a file entry names an unexpected shard");
        f->rank = r;
        f->bytes = (uint64_t)bytes;
        f->xxh3 = strtoull(hex, &end, 16);
        if (*end) return bad(path, "a file checksum is not hexadecimal");
    }
    return DSC_OK;
}

// "attachments" (optional): files that travel with the checkpoint.
static dsc_status parse_attachments(dsc__manifest *m, json_t *a, const char *path) {
    if (!a) return DSC_OK;
    if (!json_is_array(a) || json_array_size(a) > 1000)
        return bad(path, "field 'attachments' is malformed");
    m->nattach = (int)json_array_size(a);
    m->attach = calloc((size_t)m->nattach + 1, sizeof *m->attach);
    if (!m->attach) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    for (int i = 0; i < m->nattach; i++) {
        json_t *e = json_array_get(a, (size_t)i);
        dsc__mfile *f = &m->attach[i];
        int64_t bytes;
        char hex[24], *end;
        if (!get_str(e, "name", f->name, sizeof f->name) || !get_int(e, "bytes", &bytes) ||
            !get_str(e, "xxh3", hex, sizeof hex) || strlen(hex) != 16 || bytes < 0 ||
            !dsc__ckpt_attachment_name_ok(f->name))
            return bad(path, "an attachment entry is malformed");
        f->rank = -1;
        f->bytes = (uint64_t)bytes;
        f->xxh3 = strtoull(hex, &end, 16);
        if (*end) return bad(path, "an attachment checksum is not hexadecimal");
    }
    return DSC_OK;
}

static dsc_status parse_root(dsc__manifest *m, json_t *root, const char *path) {
    char format[32];
    int64_t version, world, stage, total;
    if (!json_is_object(root) || !get_str(root, "format", format, sizeof format) ||
        strcmp(format, DSC_CKPT_FORMAT) != 0)
        return bad(path, "not a dsc checkpoint manifest (format)");
    if (!get_int(root, "format_version", &version) || version != DSC_CKPT_FORMAT_VERSION)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "%s: format_version is not %d; this dsc reads "
                         "format %d only", path, DSC_CKPT_FORMAT_VERSION, DSC_CKPT_FORMAT_VERSION);
    json_t *created = json_object_get(root, "created"), *mom = json_object_get(root, "moments");
    if (!get_str(root, "tag", m->tag, sizeof m->tag) || !get_int(root, "step", &m->step) ||
        !get_int(root, "world_size", &world) || !get_int(root, "zero_stage", &stage) ||
        !get_str(root, "precision", m->precision, sizeof m->precision) ||
        !get_str(root, "optimizer", m->optimizer, sizeof m->optimizer) ||
        !get_str(root, "dsc_version", m->dsc_version, sizeof m->dsc_version) ||
        !get_int(root, "flat_size", &total) || !json_is_number(created) || !json_is_array(mom) ||
        world < 1 || world > 1000000 || stage < 0 || stage > 3 || total < 0 ||
        json_array_size(mom) < 1 || json_array_size(mom) > DSC_CKPT_MAX_MOMENTS)
        return bad(path, "a required field is missing or out of range");
    if (!get_str(root, "master_precision", m->master_precision, sizeof m->master_precision))
        snprintf(m->master_precision, sizeof m->master_precision, "fp32");
    if (!get_str(root, "moments_precision", m->moments_precision, sizeof m->moments_precision))
        snprintf(m->moments_precision, sizeof m->moments_precision, "fp32");
    m->world = (int)world;
    m->stage = (int)stage;
    m->total = (uint64_t)total;
    m->created = json_number_value(created);
    m->nmoments = (int)json_array_size(mom);
    for (int k = 0; k < m->nmoments; k++)
        if (!json_is_string(json_array_get(mom, (size_t)k)) ||
            snprintf(m->moments[k], sizeof m->moments[k], "%s",
                     json_string_value(json_array_get(mom, (size_t)k))) >= (int)sizeof m->moments[k])
            return bad(path, "field 'moments' is malformed");
    DSC_TRY(parse_scalars(m, json_object_get(root, "scalars"), path));
    DSC_TRY(parse_groups(m, json_object_get(root, "groups"), path));
    DSC_TRY(parse_params(m, json_object_get(root, "params"), path));
    DSC_TRY(parse_files(m, json_object_get(root, "files"), path));
    return parse_attachments(m, json_object_get(root, "attachments"), path);
}

dsc_status dsc__manifest_parse(dsc__manifest *m, const char *text, size_t n, const char *path) {
    memset(m, 0, sizeof *m);
    DSC_TRY(check_sum(text, n, path));
    json_error_t e;
    json_t *root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &e);
    if (!root) {
        char why[256];
        snprintf(why, sizeof why, "not valid JSON (line %d: %s)", e.line, e.text);
        return bad(path, why);
    }
    dsc_status st = parse_root(m, root, path);
    json_decref(root);
    if (st != DSC_OK) dsc__manifest_free(m);
    return st;
}
