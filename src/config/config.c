// config/config.c - DeepSpeed JSON -> struct dsc_config, driven by the key table keys.def.
#include "dsc/config.h"

#include <ctype.h>   // tolower
#include <errno.h>   // errno
#include <stdarg.h>  // va_list
#include <strings.h> // strncasecmp
#include <jansson.h> // json_*
#include <math.h>    // floor, isfinite
#include <stddef.h>  // offsetof
#include <stdio.h>   // snprintf, FILE
#include <stdlib.h>  // free
#include <string.h>  // strcmp, strlen, memset

#include "base/log.h"    // DSC_WARN
#include "base/status.h" // dsc__fail
#include "config/doc.h"  // dsc__config_write_doc

// ---- the key table ----

typedef enum key_kind {
    K_SECTION,
    K_BOOL,
    K_INT,
    K_FLOAT,
    K_STR,
    K_PAIR,
    K_LIST,
    K_ALIAS,
    K_UNIMPL,
} key_kind;

typedef struct key_row {
    const char *path;
    key_kind kind;
    size_t off;          // offset of the field in dsc_config
    size_t size;         // size of the field (strings: buffer size)
    double def, lo, hi;  // numeric default and range; PAIR: def, lo = the two defaults
    const char *sdef;    // string default; ALIAS: target path
    const char *choices; // "a|b|c" or NULL
    const char *doc;
} key_row;

#define FIELD(f) offsetof(dsc_config, f), sizeof(((dsc_config *)0)->f)
static const key_row rows[] = {
#define DSC_SECTION(p, d) {p, K_SECTION, 0, 0, 0, 0, 0, NULL, NULL, d},
#define DSC_BOOL(p, f, def, d) {p, K_BOOL, FIELD(f), def, 0, 1, NULL, NULL, d},
#define DSC_INT(p, f, def, lo, hi, d) {p, K_INT, FIELD(f), def, lo, hi, NULL, NULL, d},
#define DSC_FLOAT(p, f, def, lo, hi, d) {p, K_FLOAT, FIELD(f), def, lo, hi, NULL, NULL, d},
#define DSC_STR(p, f, def, ch, d) {p, K_STR, FIELD(f), 0, 0, 0, def, ch, d},
#define DSC_PAIR(p, f, d0, d1, d) {p, K_PAIR, FIELD(f), d0, d1, 0, NULL, NULL, d},
#define DSC_LIST(p, d) {p, K_LIST, 0, 0, 0, 0, 0, NULL, NULL, d},
#define DSC_ALIAS(p, target, d) {p, K_ALIAS, 0, 0, 0, 0, 0, target, NULL, d},
#define DSC_UNIMPL(p, d) {p, K_UNIMPL, 0, 0, 0, 0, 0, NULL, NULL, d},
#include "config/keys.def"
#undef DSC_SECTION
#undef DSC_BOOL
#undef DSC_INT
#undef DSC_FLOAT
#undef DSC_STR
#undef DSC_PAIR
#undef DSC_LIST
#undef DSC_ALIAS
#undef DSC_UNIMPL
};
#undef FIELD
#define NROWS ((int)(sizeof rows / sizeof rows[0]))
_Static_assert(sizeof rows / sizeof rows[0] <= sizeof(((dsc_config *)0)->given),
               "dsc_config.given is too small for keys.def");

static int row_find(const char *path) {
    for (int i = 0; i < NROWS; i++)
        if (!strcmp(rows[i].path, path)) return i;
    return -1;
}

static void *field_ptr(dsc_config *cfg, const key_row *r) { return (char *)cfg + r->off; }

static void str_set(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src); }

void dsc_config_defaults(dsc_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < NROWS; i++) {
        const key_row *r = &rows[i];
        void *p = field_ptr(cfg, r);
        switch (r->kind) {
        case K_BOOL: *(bool *)p = r->def != 0; break;
        case K_INT: *(int64_t *)p = (int64_t)r->def; break;
        case K_FLOAT: *(double *)p = r->def; break;
        case K_STR: str_set(p, r->size, r->sdef); break;
        case K_PAIR: ((double *)p)[0] = r->def, ((double *)p)[1] = r->lo; break;
        default: break;
        }
    }
}

// ---- parsing ----

typedef struct parse_ctx {
    dsc_config *cfg;
    const char *source; // file name or "<string>" for messages
    dsc_config_warn_fn warn;
    void *user;
} parse_ctx;

static void warnf(parse_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void warnf(parse_ctx *c, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->warn) c->warn(c->user, msg);
    else DSC_WARN("config", "%s", msg);
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

// Describe a value for an error message: its type, and its text when short.
static void json_describe(const json_t *v, char *buf, size_t cap) {
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT);
    if (text && strlen(text) <= 60) snprintf(buf, cap, "%s %s", json_kind(v), text);
    else snprintf(buf, cap, "%s", json_kind(v));
    free(text);
}

static dsc_status type_error(parse_ctx *c, const char *path, const char *expected, const json_t *v) {
    char found[128];
    json_describe(v, found, sizeof found);
    return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\": expected %s, found %s", c->source,
                     path, expected, found);
}

static bool is_batch_key(const char *path) {
    return !strcmp(path, "train_batch_size") || !strcmp(path, "train_micro_batch_size_per_gpu") ||
           !strcmp(path, "gradient_accumulation_steps");
}

static bool starts_with(const char *s, const char *prefix) {
    return !strncmp(s, prefix, strlen(prefix));
}

// "auto" is Hugging Face's placeholder. Batch sizes: treated as not given (derived). Optimizer
// and scheduler parameters would reach the optimizer as a string and fail there: an error now.
static dsc_status handle_auto(parse_ctx *c, int idx, bool *skip) {
    const char *path = rows[idx].path;
    *skip = true;
    if (is_batch_key(path)) {
        warnf(c, "config %s: key \"%s\" is \"auto\": derived from the other batch sizes",
              c->source, path);
        return DSC_OK;
    }
    if (starts_with(path, "optimizer.") || starts_with(path, "scheduler."))
        return dsc__fail(DSC_ERR_CONFIG,
                         "config %s: key \"%s\" is \"auto\", a placeholder that only the Hugging "
                         "Face Trainer fills in; DeepSpeed would fail when it builds the "
                         "optimizer/scheduler. Put a value there",
                         c->source, path);
    warnf(c, "config %s: key \"%s\" is \"auto\" and nothing resolves it; using the default",
          c->source, path);
    return DSC_OK;
}

static dsc_status set_number(parse_ctx *c, int idx, const json_t *v) {
    const key_row *r = &rows[idx];
    const char *expected = r->kind == K_INT ? "an integer" : "a number";
    if (!json_is_number(v)) return type_error(c, r->path, expected, v);
    double x = json_number_value(v);
    if (!isfinite(x)) return type_error(c, r->path, expected, v);
    if (r->kind == K_INT && x != floor(x)) return type_error(c, r->path, "a whole number", v);
    if (x < r->lo || x > r->hi) {
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" = %g is out of range: expected %g .. %g",
                         c->source, r->path, x, r->lo, r->hi);
    }
    if (r->kind == K_INT) *(int64_t *)field_ptr(c->cfg, r) = json_is_integer(v) ? json_integer_value(v) : (int64_t)x;
    else *(double *)field_ptr(c->cfg, r) = x;
    return DSC_OK;
}

// Match `s` against "a|b|c" without case; on success copy the table's spelling into out.
static bool choice_match(const char *choices, const char *s, char *out, size_t cap) {
    const char *p = choices;
    while (*p) {
        const char *end = strchr(p, '|');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (strlen(s) == n && !strncasecmp(p, s, n)) {
            snprintf(out, cap, "%.*s", (int)n, p);
            return true;
        }
        p += n + (end ? 1 : 0);
    }
    return false;
}

static dsc_status set_string(parse_ctx *c, int idx, const json_t *v) {
    const key_row *r = &rows[idx];
    if (!json_is_string(v)) return type_error(c, r->path, "a string", v);
    const char *s = json_string_value(v);
    char *dst = field_ptr(c->cfg, r);
    if (strlen(s) >= r->size)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\": value is %zu characters; at most %zu allowed",
                         c->source, r->path, strlen(s), r->size - 1);
    if (!r->choices) {
        str_set(dst, r->size, s);
        return DSC_OK;
    }
    if (!choice_match(r->choices, s, dst, r->size))
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" = \"%s\": expected one of %s",
                         c->source, r->path, s, r->choices);
    return DSC_OK;
}

static dsc_status set_leaf(parse_ctx *c, int idx, const json_t *v) {
    const key_row *r = &rows[idx];
    if (json_is_null(v)) return DSC_OK; // DeepSpeed reads null as "use the default"
    if (json_is_string(v) && !strcmp(json_string_value(v), "auto") && r->kind != K_STR) {
        bool skip;
        DSC_TRY(handle_auto(c, idx, &skip));
        if (skip) return DSC_OK;
    }
    switch (r->kind) {
    case K_BOOL:
        if (!json_is_boolean(v)) return type_error(c, r->path, "true or false", v);
        *(bool *)field_ptr(c->cfg, r) = json_is_true(v);
        break;
    case K_INT:
    case K_FLOAT: DSC_TRY(set_number(c, idx, v)); break;
    case K_STR: DSC_TRY(set_string(c, idx, v)); break;
    case K_PAIR: {
        if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(json_array_get(v, 0)) ||
            !json_is_number(json_array_get(v, 1)))
            return type_error(c, r->path, "a list of two numbers", v);
        double *p = field_ptr(c->cfg, r);
        p[0] = json_number_value(json_array_get(v, 0));
        p[1] = json_number_value(json_array_get(v, 1));
        break;
    }
    case K_LIST:
        if (!json_is_array(v)) return type_error(c, r->path, "a list", v);
        break;
    default: DSC_ASSERT(0);
    }
    c->cfg->given[idx] = 1;
    return DSC_OK;
}

static dsc_status parse_object(parse_ctx *c, const json_t *obj, const char *prefix);

// DeepSpeed's deprecated form "zero_optimization": true|false means stage 1|0.
static dsc_status zero_bool(parse_ctx *c, const json_t *v) {
    warnf(c, "config %s: \"zero_optimization\": %s is deprecated; use {\"stage\": %d}", c->source,
          json_is_true(v) ? "true" : "false", json_is_true(v) ? 1 : 0);
    c->cfg->zero_optimization.stage = json_is_true(v) ? 1 : 0;
    c->cfg->given[row_find("zero_optimization.stage")] = 1;
    return DSC_OK;
}

static dsc_status parse_key(parse_ctx *c, const char *path, const json_t *v) {
    int idx = row_find(path);
    if (idx >= 0 && rows[idx].kind == K_ALIAS) {
        path = rows[idx].sdef;
        idx = row_find(path);
        DSC_ASSERT(idx >= 0);
    }
    if (idx < 0) {
        warnf(c, "config %s: unknown key \"%s\" ignored (not a DeepSpeed key that dsc knows)",
              c->source, path);
        return DSC_OK;
    }
    const key_row *r = &rows[idx];
    if (r->kind == K_UNIMPL) {
        warnf(c, "config %s: key \"%s\" (%s) is not implemented by dsc; ignored", c->source, path,
              r->doc);
        return DSC_OK;
    }
    if (r->kind != K_SECTION) return set_leaf(c, idx, v);
    if (!strcmp(path, "zero_optimization") && json_is_boolean(v)) return zero_bool(c, v);
    if (json_is_null(v)) return DSC_OK;
    if (!json_is_object(v)) return type_error(c, path, "an object", v);
    c->cfg->given[idx] = 1;
    return parse_object(c, v, path);
}

static dsc_status parse_object(parse_ctx *c, const json_t *obj, const char *prefix) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        char path[512];
        if (prefix[0]) snprintf(path, sizeof path, "%s.%s", prefix, key);
        else snprintf(path, sizeof path, "%s", key);
        DSC_TRY(parse_key(c, path, v));
    }
    return DSC_OK;
}

// ---- checks after parsing ----

static const char *const optimizers[] = {"adam", "adamw", "sgd", "lion"};
static const char *const ds_optimizers_other[] = {
    "lamb", "onebitadam", "zerooneadam", "onebitlamb", "adagrad", "muon", "lion8bit", NULL};
static const char *const schedulers[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                         "OneCycle", "LRRangeTest", NULL};

static void lower(char *s) {
    for (; *s; s++) *s = (char)tolower((unsigned char)*s);
}

static void check_types(parse_ctx *c) {
    dsc_config *cfg = c->cfg;
    if (cfg->optimizer.type[0]) {
        char name[32];
        str_set(name, sizeof name, cfg->optimizer.type);
        lower(name);
        bool ours = false, theirs = false;
        for (size_t i = 0; i < sizeof optimizers / sizeof optimizers[0]; i++)
            ours |= !strcmp(name, optimizers[i]);
        for (int i = 0; ds_optimizers_other[i]; i++) theirs |= !strcmp(name, ds_optimizers_other[i]);
        if (ours || theirs) str_set(cfg->optimizer.type, sizeof cfg->optimizer.type, name);
        if (!ours)
            warnf(c, "config %s: optimizer.type \"%s\" is not implemented by dsc (Adam, AdamW, SGD, "
                  "Lion are); training will refuse to start", c->source, cfg->optimizer.type);
    }
    if (cfg->scheduler.type[0]) {
        bool known = false;
        for (int i = 0; schedulers[i]; i++) known |= !strcmp(cfg->scheduler.type, schedulers[i]);
        if (!known)
            warnf(c, "config %s: scheduler.type \"%s\" is not one of DeepSpeed's schedules dsc "
                  "implements (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest); "
                  "training will refuse to start", c->source, cfg->scheduler.type);
    }
}

static dsc_status check_rules(parse_ctx *c) {
    dsc_config *cfg = c->cfg;
    if (cfg->fp16.enabled && cfg->bf16.enabled)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: fp16.enabled and bf16.enabled are both true; "
                         "choose one (DeepSpeed rejects both)", c->source);
    // DeepSpeed maps the deprecated cpu_offload flags onto the offload sections.
    if (cfg->zero_optimization.cpu_offload && !dsc_config_given(cfg, "zero_optimization.offload_optimizer.device"))
        str_set(cfg->zero_optimization.offload_optimizer.device, 16, "cpu");
    if (cfg->zero_optimization.cpu_offload_param && !dsc_config_given(cfg, "zero_optimization.offload_param.device"))
        str_set(cfg->zero_optimization.offload_param.device, 16, "cpu");
    if (cfg->zero_optimization.cpu_offload_use_pin_memory) {
        cfg->zero_optimization.offload_optimizer.pin_memory = true;
        cfg->zero_optimization.offload_param.pin_memory = true;
    }
    check_types(c);
    return DSC_OK;
}

// ---- batch sizes ----

dsc_status dsc_config_resolve_batch(dsc_config *cfg, int world_size) {
    if (world_size < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "world size %d: must be at least 1", world_size);
    int64_t *tb = &cfg->train_batch_size, *mb = &cfg->train_micro_batch_size_per_gpu,
            *ga = &cfg->gradient_accumulation_steps;
    bool t = *tb > 0, m = *mb > 0, g = *ga > 0;
    int64_t w = world_size;
    // DeepSpeed's _set_batch_related_parameters, including its order of integer divisions.
    if (t && m && g) {
    } else if (t && m) {
        *ga = *tb / *mb / w;
    } else if (t && g) {
        *mb = *tb / w / *ga;
    } else if (m && g) {
        *tb = *mb * *ga * w;
    } else if (t) {
        *ga = 1;
        *mb = *tb / w;
    } else if (m) {
        *tb = *mb * w;
        *ga = 1;
    } else {
        return dsc__fail(DSC_ERR_CONFIG, "either train_batch_size or "
                         "train_micro_batch_size_per_gpu needs to be provided");
    }
    if (*tb <= 0 || *mb <= 0 || *ga <= 0 || *tb != *mb * *ga * w) {
        return dsc__fail(DSC_ERR_CONFIG,
                         "batch sizes do not fit: train_batch_size (%lld) must equal "
                         "train_micro_batch_size_per_gpu (%lld) * gradient_accumulation_steps (%lld) "
                         "* world size (%d), and all must be > 0; fix one of the three keys",
                         (long long)*tb, (long long)*mb, (long long)*ga, world_size);
    }
    cfg->world_size = world_size;
    return DSC_OK;
}

// ---- entry points ----

static dsc_status load_json(dsc_config *cfg, json_t *root, const char *source, int world_size,
                            dsc_config_warn_fn warn, void *user) {
    parse_ctx c = {cfg, source, warn, user};
    dsc_config_defaults(cfg);
    if (!json_is_object(root)) {
        char found[128];
        json_describe(root, found, sizeof found);
        return dsc__fail(DSC_ERR_CONFIG, "config %s: expected a JSON object at the top, found %s",
                         source, found);
    }
    DSC_TRY(parse_object(&c, root, ""));
    DSC_TRY(check_rules(&c));
    if (world_size > 0) {
        dsc_status st = dsc_config_resolve_batch(cfg, world_size);
        if (st != DSC_OK) dsc__error_prefix("config %s: ", source);
        return st;
    }
    return DSC_OK;
}

static dsc_status syntax_error(const char *source, const json_error_t *e) {
    return dsc__fail(DSC_ERR_CONFIG, "config %s: line %d, column %d: %s", source, e->line,
                     e->column, e->text);
}

dsc_status dsc_config_load_file(dsc_config *cfg, const char *path, int world_size,
                                dsc_config_warn_fn warn, void *user) {
    FILE *f = fopen(path, "rb");
    if (!f) return dsc__fail(DSC_ERR_IO, "config %s: cannot open: %s", path, strerror(errno));
    json_error_t e;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &e);
    fclose(f);
    if (!root) return syntax_error(path, &e);
    dsc_status st = load_json(cfg, root, path, world_size, warn, user);
    json_decref(root);
    return st;
}

dsc_status dsc_config_load_string(dsc_config *cfg, const char *text, int world_size,
                                  dsc_config_warn_fn warn, void *user) {
    json_error_t e;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &e);
    if (!root) return syntax_error("<string>", &e);
    dsc_status st = load_json(cfg, root, "<string>", world_size, warn, user);
    json_decref(root);
    return st;
}

bool dsc_config_given(const dsc_config *cfg, const char *path) {
    int idx = row_find(path);
    if (idx >= 0 && rows[idx].kind == K_ALIAS) idx = row_find(rows[idx].sdef);
    return idx >= 0 && cfg->given[idx];
}

bool dsc_config_overlap_comm(const dsc_config *cfg) {
    if (dsc_config_given(cfg, "zero_optimization.overlap_comm"))
        return cfg->zero_optimization.overlap_comm;
    return cfg->zero_optimization.stage == 3;
}

// ---- printing ----

static json_t *row_value(const dsc_config *cfg, const key_row *r) {
    const void *p = (const char *)cfg + r->off;
    switch (r->kind) {
    case K_BOOL:
        if (!strcmp(r->path, "zero_optimization.overlap_comm"))
            return json_boolean(dsc_config_overlap_comm(cfg));
        return json_boolean(*(const bool *)p);
    case K_INT: return json_integer(*(const int64_t *)p);
    case K_FLOAT: return json_real(*(const double *)p);
    case K_STR: return json_string(p);
    case K_PAIR: return json_pack("[ff]", ((const double *)p)[0], ((const double *)p)[1]);
    default: return NULL;
    }
}

// Set obj[a][b][c] = v for the path "a.b.c", creating the objects on the way.
static void json_set_path(json_t *obj, const char *path, json_t *v) {
    char part[128];
    const char *dot;
    while ((dot = strchr(path, '.'))) {
        snprintf(part, sizeof part, "%.*s", (int)(dot - path), path);
        json_t *child = json_object_get(obj, part);
        if (!child) {
            child = json_object();
            json_object_set_new(obj, part, child);
        }
        obj = child;
        path = dot + 1;
    }
    json_object_set_new(obj, path, v);
}

void dsc_config_print(const dsc_config *cfg, void *out, bool as_json) {
    FILE *f = out;
    json_t *root = as_json ? json_object() : NULL;
    for (int i = 0; i < NROWS; i++) {
        json_t *v = row_value(cfg, &rows[i]);
        if (!v) continue;
        if (as_json) {
            json_set_path(root, rows[i].path, v);
            continue;
        }
        char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
        fprintf(f, "%-58s = %s%s\n", rows[i].path, text ? text : "?",
                cfg->given[i] ? "" : "   (default)");
        free(text);
        json_decref(v);
    }
    if (as_json) {
        json_dumpf(root, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        fputc('\n', f);
        json_decref(root);
    }
}

// ---- documentation ----

// Write the key table as a markdown table (docs/config.md is generated from this).
void dsc__config_write_doc(void *out) {
    static const char *kinds[] = {"section", "bool", "int", "float", "string", "[float, float]",
                                  "list", "alias", "not implemented"};
    FILE *f = out;
    fprintf(f, "| key | type | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < NROWS; i++) {
        const key_row *r = &rows[i];
        char def[128] = "";
        switch (r->kind) {
        case K_BOOL: snprintf(def, sizeof def, "%s", r->def != 0 ? "true" : "false"); break;
        case K_INT: snprintf(def, sizeof def, "%lld", (long long)r->def); break;
        case K_FLOAT: snprintf(def, sizeof def, "%g", r->def); break;
        case K_STR: snprintf(def, sizeof def, "\"%s\"", r->sdef); break;
        case K_PAIR: snprintf(def, sizeof def, "[%g, %g]", r->def, r->lo); break;
        case K_ALIAS: snprintf(def, sizeof def, "= `%s`", r->sdef); break;
        default: break;
        }
        const char *type = kinds[r->kind];
        char choice[128] = "";
        if (r->choices) { // '|' would split the markdown cell
            size_t n = (size_t)snprintf(choice, sizeof choice, " (%s)", r->choices);
            for (size_t k = 0; k < n && k < sizeof choice; k++)
                if (choice[k] == '|') choice[k] = '/';
        }
        fprintf(f, "| `%s` | %s%s | %s | %s |\n", r->path, type, choice, def, r->doc);
    }
}
