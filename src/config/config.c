// config/config.c - a DeepSpeed config file -> struct dsc_config, driven by the key table.
//
// The file is read with DeepSpeed's syntax (config/hjson.c); each key is then read the way
// DeepSpeed 0.18.4 reads it (keys.def says how, per section): plain dictionary lookups, where dsc
// checks JSON types strictly, or pydantic models, whose lax coercions dsc reproduces. Afterwards
// the rules DeepSpeedConfig applies across keys, and the batch triple.
#include "dsc/config.h"

#include <ctype.h>   // tolower
#include <errno.h>   // errno
#include <jansson.h> // json_*
#include <math.h>    // floor, isfinite
#include <stdarg.h>  // va_list
#include <stdio.h>   // snprintf, FILE
#include <stdlib.h>  // free, malloc
#include <string.h>  // strcmp, strlen, memset
#include <strings.h> // strncasecmp

#include "base/io.h"       // dsc__fopen_regular
#include "base/log.h"      // DSC_WARN
#include "base/status.h"   // dsc__fail
#include "config/elastic.h" // dsc__elastic_*
#include "config/hjson.h"  // dsc__hjson_parse
#include "config/pytext.h" // dsc__lax_*
#include "config/table.h"  // dsc__rows, dsc__row_*

#define ROWS dsc__rows

static void str_set(char *dst, size_t cap, const char *src) { snprintf(dst, cap, "%s", src); }

void dsc_config_defaults(dsc_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < dsc__nrows; i++) {
        const dsc__key_row *r = &ROWS[i];
        void *p = dsc__field(cfg, r);
        switch (r->kind) {
        case K_BOOL: *(bool *)p = r->def != 0; break;
        case K_INT: *(int64_t *)p = (int64_t)r->def; break;
        case K_WHOLE:
        case K_FLOAT: *(double *)p = r->def; break;
        case K_STR: str_set(p, r->size, r->sdef); break;
        case K_PAIR: ((double *)p)[0] = r->def, ((double *)p)[1] = r->lo; break;
        default: break;
        }
    }
}

// ---- messages ----

typedef struct parse_ctx {
    dsc_config *cfg;
    const char *source; // file name or "<string>" for messages
    const json_t *root;
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
    char *text = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
    if (text && strlen(text) <= 60) snprintf(buf, cap, "%s %s", json_kind(v), text);
    else snprintf(buf, cap, "%s", json_kind(v));
    free(text);
}

static dsc_status type_error(parse_ctx *c, const char *path, const char *expected,
                             const json_t *v) {
    char found[128];
    json_describe(v, found, sizeof found);
    return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\": expected %s, found %s", c->source,
                     path, expected, found);
}

static bool starts_with(const char *s, const char *prefix) {
    return !strncmp(s, prefix, strlen(prefix));
}

static bool is_batch_key(const char *path) {
    return !strcmp(path, "train_batch_size") || !strcmp(path, "train_micro_batch_size_per_gpu") ||
           !strcmp(path, "gradient_accumulation_steps");
}

static bool is_auto(const json_t *v) {
    return json_is_string(v) && !strcmp(json_string_value(v), "auto");
}

// "auto" is Hugging Face's placeholder, which its Trainer replaces before DeepSpeed sees the
// file. DeepSpeed's pydantic sections drop it (the default applies); its plain lookups keep the
// string, which fails (batch sizes: at once; optimizer, scheduler and the rest: later) - so dsc
// rejects it there now, naming the key.
static dsc_status auto_error(parse_ctx *c, const char *path) {
    const char *when = is_batch_key(path) ? "DeepSpeed rejects it (it cannot compute with it)"
                       : starts_with(path, "optimizer.") || starts_with(path, "scheduler.")
                           ? "DeepSpeed would fail when it builds the optimizer/scheduler"
                           : "DeepSpeed would carry the string into the run and fail there";
    return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" is \"auto\", a placeholder that only "
                     "the Hugging Face Trainer fills in; %s. Put a value there", c->source, path,
                     when);
}

// ---- one value, as DeepSpeed's reader of that key takes it ----

// A number as a double; pydantic (lax) also takes booleans and numeric strings.
static bool number_of(const json_t *v, bool lax, bool integer, double *x) {
    if (json_is_number(v)) return *x = json_number_value(v), true;
    if (lax && json_is_boolean(v)) return *x = json_is_true(v), true;
    if (lax && json_is_string(v))
        return integer ? dsc__lax_int(json_string_value(v), x)
                       : dsc__lax_float(json_string_value(v), x);
    return false;
}

// A number for a message: integers as "%.17g" (1e+20 stays readable), reals in their shortest
// exact form (0.9, not 0.90000000000000002).
static void number_text(double x, bool integer, char *buf, size_t cap) {
    if (integer) snprintf(buf, cap, "%.17g", x);
    else dsc__format_real(x, buf, cap);
}

static dsc_status set_number(parse_ctx *c, int idx, const json_t *v, bool lax) {
    const dsc__key_row *r = &ROWS[idx];
    bool integer = r->kind != K_FLOAT;
    const char *expected = integer ? "an integer" : "a number";
    double x;
    if (!number_of(v, lax, integer, &x) || !isfinite(x)) return type_error(c, r->path, expected, v);
    // pydantic takes a real for an int only when it is whole and within int64
    if (integer && (x != floor(x) || (lax && json_is_real(v) && fabs(x) >= 9223372036854775808.0)))
        return type_error(c, r->path, "a whole number", v);
    if (x < r->lo || x > r->hi) {
        char xs[40], lo[40], hi[40];
        number_text(x, integer, xs, sizeof xs);
        number_text(r->lo, integer, lo, sizeof lo);
        number_text(r->hi, integer, hi, sizeof hi);
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" = %s is out of range: expected "
                         "%s .. %s", c->source, r->path, xs, lo, hi);
    }
    void *p = dsc__field(c->cfg, r);
    if (r->kind == K_INT) *(int64_t *)p = json_is_integer(v) ? json_integer_value(v) : (int64_t)x;
    else *(double *)p = x;
    return DSC_OK;
}

// Booleans: pydantic (lax) also takes 0/1 and yes/no strings; DeepSpeed's plain lookups use
// Python truth, under which an integer works as a boolean (0 false, others true).
static dsc_status set_bool(parse_ctx *c, int idx, const json_t *v, bool lax, bool truthy_ints) {
    const dsc__key_row *r = &ROWS[idx];
    bool b = false, ok = json_is_boolean(v);
    if (ok) b = json_is_true(v);
    else if (truthy_ints && json_is_integer(v)) ok = true, b = json_integer_value(v) != 0;
    else if (lax && json_is_number(v)) {
        // pydantic: exactly 0 or 1
        double x = json_number_value(v);
        ok = x == 0 || x == 1, b = x == 1;
    } else if (lax && json_is_string(v)) {
        ok = dsc__lax_bool(json_string_value(v), &b);
    }
    if (!ok) return type_error(c, r->path, "true or false", v);
    *(bool *)dsc__field(c->cfg, r) = b;
    return DSC_OK;
}

// Match `s` against "a|b|c" (a leading '~': without case); copy the table's spelling into out.
static bool choice_match(const char *choices, const char *s, char *out, size_t cap) {
    bool any_case = choices[0] == '~';
    const char *p = choices + any_case;
    while (*p) {
        const char *end = strchr(p, '|');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        bool same = any_case ? !strncasecmp(p, s, n) : !strncmp(p, s, n);
        if (strlen(s) == n && same) {
            snprintf(out, cap, "%.*s", (int)n, p);
            return true;
        }
        p += n + (end ? 1 : 0);
    }
    return false;
}

static dsc_status set_string(parse_ctx *c, int idx, const json_t *v) {
    const dsc__key_row *r = &ROWS[idx];
    if (!json_is_string(v)) return type_error(c, r->path, "a string", v);
    const char *s = json_string_value(v);
    char *dst = dsc__field(c->cfg, r);
    if (strlen(s) >= r->size)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\": value is %zu bytes; at most %zu "
                         "allowed", c->source, r->path, strlen(s), r->size - 1);
    if (!r->choices) {
        str_set(dst, r->size, s);
        return DSC_OK;
    }
    if (!choice_match(r->choices, s, dst, r->size))
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" = \"%s\": expected one of %s%s",
                         c->source, r->path, s, r->choices + (r->choices[0] == '~'),
                         r->choices[0] == '~' ? " (any case)" : "");
    return DSC_OK;
}

static dsc_status set_pair(parse_ctx *c, int idx, const json_t *v) {
    const dsc__key_row *r = &ROWS[idx];
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(json_array_get(v, 0)) ||
        !json_is_number(json_array_get(v, 1)))
        return type_error(c, r->path, "a list of two numbers", v);
    double *p = dsc__field(c->cfg, r);
    p[0] = json_number_value(json_array_get(v, 0));
    p[1] = json_number_value(json_array_get(v, 1));
    return DSC_OK;
}

static dsc_status set_intlist(parse_ctx *c, int idx, const json_t *v) {
    const dsc__key_row *r = &ROWS[idx];
    size_t cap = r->size / sizeof(int64_t), n = json_array_size(v);
    if (!json_is_array(v)) return type_error(c, r->path, "a list of positive integers", v);
    if (n > cap)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\": %zu entries; dsc takes at most "
                         "%zu", c->source, r->path, n, cap);
    int64_t *out = dsc__field(c->cfg, r);
    for (size_t k = 0; k < n; k++) {
        const json_t *e = json_array_get(v, k);
        if (!json_is_integer(e) || json_integer_value(e) <= 0)
            return type_error(c, r->path, "a list of positive integers", v);
        out[k] = json_integer_value(e);
    }
    *(int64_t *)((char *)c->cfg + r->count_off) = (int64_t)n;
    return DSC_OK;
}

// A list: checked to be one; rows with a field keep it as compact JSON text for their user.
// A value kept as its compact JSON text (a list, or any value for K_JSON rows).
static dsc_status set_json(parse_ctx *c, int idx, const json_t *v) {
    const dsc__key_row *r = &ROWS[idx];
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) return dsc__fail(DSC_ERR_OOM, "config %s: out of memory", c->source);
    size_t n = strlen(text);
    if (n < r->size) memcpy(dsc__field(c->cfg, r), text, n + 1);
    free(text);
    if (n >= r->size)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" is %zu characters of JSON; dsc "
                         "takes at most %zu: shorten it", c->source, r->path, n, r->size - 1);
    return DSC_OK;
}

static dsc_status set_list(parse_ctx *c, int idx, const json_t *v) {
    const dsc__key_row *r = &ROWS[idx];
    if (!json_is_array(v)) return type_error(c, r->path, "a list", v);
    return r->size ? set_json(c, idx, v) : DSC_OK;
}

static dsc_status set_value(parse_ctx *c, int idx, const json_t *v, int reader) {
    bool lax = reader == DS_MODEL;
    switch (ROWS[idx].kind) {
    case K_BOOL: return set_bool(c, idx, v, lax, reader == DS_DICT);
    case K_INT:
    case K_WHOLE:
    case K_FLOAT: return set_number(c, idx, v, lax);
    case K_STR: return set_string(c, idx, v);
    case K_PAIR: return set_pair(c, idx, v);
    case K_INTLIST: return set_intlist(c, idx, v);
    case K_LIST: return set_list(c, idx, v);
    case K_JSON: return set_json(c, idx, v);
    default: DSC_ASSERT(0); return DSC_ERR_INTERNAL;
    }
}

// A key with a value. `via` is the row of the spelling used (an alias) or idx itself.
static dsc_status set_leaf(parse_ctx *c, int idx, int via, const json_t *v) {
    const dsc__key_row *r = &ROWS[idx];
    int reader = dsc__row_reader(idx);
    if (reader == DS_MODEL && is_auto(v)) { // the model drops it before validation
        warnf(c, "config %s: key \"%s\" is \"auto\"; DeepSpeed uses its default", c->source,
              ROWS[via].path);
        return DSC_OK;
    }
    c->cfg->given[idx] |= via == idx ? GIVEN_NAMED : GIVEN_ALIAS;
    if (json_is_null(v)) {
        if (dsc__row_nullable(idx)) return DSC_OK;
        return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" is null; DeepSpeed fails on null "
                         "here. Remove the key to get its default", c->source, ROWS[via].path);
    }
    if (is_auto(v) && r->kind != K_STR) return auto_error(c, ROWS[via].path);
    DSC_TRY(set_value(c, idx, v, reader));
    c->cfg->given[idx] |= GIVEN_VALUE;
    return DSC_OK;
}

// ---- walking the tree ----

static dsc_status parse_object(parse_ctx *c, const json_t *obj, const char *prefix);

// DeepSpeed's deprecated form "zero_optimization": true|false means stage 1|0; stage 1 then
// takes its all-gather bucket from the top-level "allgather_size" (default 5e8).
static dsc_status zero_bool(parse_ctx *c, const json_t *v) {
    warnf(c, "config %s: \"zero_optimization\": %s is deprecated; use {\"stage\": %d}", c->source,
          json_is_true(v) ? "true" : "false", json_is_true(v) ? 1 : 0);
    int stage = dsc__row_find("zero_optimization.stage");
    c->cfg->zero_optimization.stage = json_is_true(v) ? 1 : 0;
    c->cfg->given[stage] |= GIVEN_VALUE | GIVEN_NAMED;
    const json_t *size = json_object_get(c->root, "allgather_size");
    if (!json_is_true(v) || !size) return DSC_OK;
    return set_leaf(c, dsc__row_find("zero_optimization.allgather_bucket_size"),
                    dsc__row_find("zero_optimization.allgather_bucket_size"), size);
}

static dsc_status parse_section(parse_ctx *c, int idx, const json_t *v) {
    const dsc__key_row *r = &ROWS[idx];
    if (json_is_null(v) || is_auto(v)) {
        bool ok = json_is_null(v) ? r->how & DS_NULL_OK : r->how & DS_AUTO_OK;
        if (!ok)
            return dsc__fail(DSC_ERR_CONFIG, "config %s: section \"%s\" is %s; DeepSpeed fails on "
                             "that. Give an object (or remove the section for its defaults)",
                             c->source, r->path, json_is_null(v) ? "null" : "\"auto\"");
        c->cfg->given[idx] |= json_is_null(v) ? GIVEN_NAMED : 0;
        return DSC_OK;
    }
    if (!strcmp(r->path, "zero_optimization") && json_is_boolean(v)) return zero_bool(c, v);
    if (!json_is_object(v)) return type_error(c, r->path, "an object", v);
    c->cfg->given[idx] |= GIVEN_VALUE | GIVEN_NAMED;
    return parse_object(c, v, r->path);
}

// "bf16" wins over its older spelling "bfloat16", which DeepSpeed then does not even read.
static bool bfloat16_shadowed(parse_ctx *c, const char *path) {
    const json_t *bf16 = json_object_get(c->root, "bf16");
    if (strcmp(path, "bfloat16") || !bf16 || json_is_null(bf16)) return false;
    warnf(c, "config %s: \"bfloat16\" is ignored because \"bf16\" is given (as in DeepSpeed)",
          c->source);
    return true;
}

// Edit distance (insertions, deletions, substitutions, adjacent swaps) of two short strings;
// anything past 64 bytes counts as far.
static int edit_distance(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    if (n > 64 || m > 64) return 1 << 20;
    int d[65][65];
    for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= n; i++)
        for (size_t j = 1; j <= m; j++) {
            int best = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
                d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    return d[n][m];
}

// The known key of the same section nearest to an unknown `path` ("zero_optimisation" ->
// "zero_optimization"), when it is close: at most 1 edit per 4 characters, at most 3. NULL else.
static const char *nearest_key(const char *path) {
    const char *dot = strrchr(path, '.'), *leaf = dot ? dot + 1 : path;
    size_t plen = dot ? (size_t)(dot - path) : 0;
    const char *best = NULL;
    int best_d = (int)strlen(leaf) / 4;
    if (best_d > 3) best_d = 3;
    for (int i = 0; i < dsc__nrows; i++) {
        const char *p = ROWS[i].path, *pd = strrchr(p, '.');
        size_t pl = pd ? (size_t)(pd - p) : 0;
        if (pl != plen || strncmp(p, path, plen)) continue;
        int d = edit_distance(leaf, pd ? pd + 1 : p);
        if (d <= best_d && (!best || d < best_d)) best = p, best_d = d;
    }
    return best;
}

static dsc_status parse_key(parse_ctx *c, const char *path, const json_t *v) {
    int idx = dsc__row_find(path), via = idx;
    if (idx < 0) {
        // Read by DeepSpeed only with the deprecated "zero_optimization": true (see zero_bool).
        if (!strcmp(path, "allgather_size")) return DSC_OK;
        if (starts_with(path, "scheduler.params.")) { // DeepSpeed's scheduler would refuse it
            const char *key = path + strlen("scheduler.params.");
            char *first = c->cfg->scheduler.unknown_param; // 64 bytes; a longer name is cut
            if (!first[0]) snprintf(first, sizeof c->cfg->scheduler.unknown_param, "%.63s", key);
            warnf(c, "config %s: unknown key \"%s\": no DeepSpeed schedule takes it, so "
                  "DeepSpeed's scheduler fails on it when it is built; dsc train refuses it too",
                  c->source, path);
            return DSC_OK;
        }
        const char *near = nearest_key(path);
        if (starts_with(path, "lora.")) // a PEFT option dsc lacks would change the model: refused
            return dsc__fail(DSC_ERR_CONFIG, "config %s: key \"%s\" is not a LoRA option dsc "
                             "implements%s%s%s; dsc takes r, lora_alpha, lora_dropout, "
                             "target_modules, use_rslora, bias, init_lora_weights, "
                             "modules_to_save (docs/lora.md)", c->source, path,
                             near ? " (did you mean \"" : "", near ? near : "", near ? "\"?)" : "");
        if (near)
            warnf(c, "config %s: unknown key \"%s\" ignored (not a DeepSpeed key that dsc "
                  "knows); did you mean \"%s\"?", c->source, path, near);
        else
            warnf(c, "config %s: unknown key \"%s\" ignored (not a DeepSpeed key that dsc knows)",
                  c->source, path);
        return DSC_OK;
    }
    if (ROWS[idx].kind == K_ALIAS) {
        if (bfloat16_shadowed(c, path)) return DSC_OK;
        idx = dsc__row_find(ROWS[idx].sdef);
        DSC_ASSERT(idx >= 0);
        // DeepSpeed reads an old section spelling only as a fallback, which cannot be null.
        if (ROWS[idx].kind == K_SECTION && json_is_null(v))
            return dsc__fail(DSC_ERR_CONFIG, "config %s: section \"%s\" is null; DeepSpeed fails "
                             "on that. Give an object or remove it", c->source, path);
    }
    const dsc__key_row *r = &ROWS[idx];
    if (r->kind == K_UNIMPL) {
        warnf(c, "config %s: key \"%s\" (%s) is not implemented by dsc; ignored", c->source, path,
              r->doc);
        return DSC_OK;
    }
    if (r->kind == K_SECTION) return parse_section(c, idx, v);
    return set_leaf(c, idx, via, v);
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

// ---- rules across keys ----

static bool named(const dsc_config *cfg, const char *path) {
    int idx = dsc__row_find(path);
    return idx >= 0 && (cfg->given[idx] & GIVEN_NAMED);
}

// pydantic refuses a field given both by its name and by its alias; DeepSpeed's deprecated
// fields refuse to be given together with the field replacing them.
static dsc_status check_spellings(parse_ctx *c) {
    for (int i = 0; i < dsc__nrows; i++) {
        unsigned char g = c->cfg->given[i];
        if ((g & GIVEN_NAMED) && (g & GIVEN_ALIAS))
            return dsc__fail(DSC_ERR_CONFIG, "config %s: \"%s\" is given under two spellings "
                             "(see docs/config.md); DeepSpeed rejects that. Keep one",
                             c->source, ROWS[i].path);
    }
    static const char *const replaced[][2] = {
        {"zero_optimization.cpu_offload", "zero_optimization.offload_optimizer"},
        {"zero_optimization.cpu_offload_param", "zero_optimization.offload_param"},
    };
    for (size_t k = 0; k < sizeof replaced / sizeof replaced[0]; k++)
        if (named(c->cfg, replaced[k][0]) && named(c->cfg, replaced[k][1]))
            return dsc__fail(DSC_ERR_CONFIG, "config %s: the deprecated \"%s\" and \"%s\" are both "
                             "given; DeepSpeed rejects that. Keep only \"%s\"", c->source,
                             replaced[k][0], replaced[k][1], replaced[k][1]);
    return DSC_OK;
}

static const char *const optimizers[] = {"adam", "adamw", "sgd", "lion", NULL};
// DeepSpeed's own optimizer names (it lower-cases these; others are torch.optim classes).
static const char *const ds_optimizers[] = {"adagrad", "adam", "adamw", "lamb", "onebitadam",
                                            "zerooneadam", "onebitlamb", "muadam", "muadamw",
                                            "musgd", "lion", "muon", NULL};
static const char *const schedulers[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                         "OneCycle", "LRRangeTest", NULL};

static bool in_list(const char *const *list, const char *s) {
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], s)) return true;
    return false;
}

static void check_types(parse_ctx *c) {
    dsc_config *cfg = c->cfg;
    if (cfg->optimizer.type[0]) {
        char name[32];
        str_set(name, sizeof name, cfg->optimizer.type);
        for (char *s = name; *s; s++) *s = (char)tolower((unsigned char)*s);
        bool ours = in_list(optimizers, name);
        // dsc keeps its names lower-case (DeepSpeed keeps torch.optim spellings such as "SGD").
        if (ours || in_list(ds_optimizers, name)) str_set(cfg->optimizer.type, 32, name);
        if (!ours)
            warnf(c, "config %s: optimizer.type \"%s\" is not implemented by dsc (Adam, AdamW, "
                  "SGD, Lion are); training will refuse to start", c->source, cfg->optimizer.type);
    }
    if (cfg->scheduler.type[0] && !in_list(schedulers, cfg->scheduler.type))
        warnf(c, "config %s: scheduler.type \"%s\" is not one of DeepSpeed's schedules dsc "
              "implements (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest); "
              "training will refuse to start", c->source, cfg->scheduler.type);
}

// ZeRO options that DeepSpeed accepts only with ZeRO stages 1-3.
static dsc_status check_zero_needs(parse_ctx *c) {
    const dsc_config *cfg = c->cfg;
    int64_t stage = cfg->zero_optimization.stage;
    const char *key = NULL;
    if (cfg->fp16.fp16_master_weights_and_grads) key = "fp16.fp16_master_weights_and_grads";
    else if (cfg->bf16.bf16_master_weights_and_grads) key = "bf16.bf16_master_weights_and_grads";
    else if (cfg->bf16.bf16_optimizer_states) key = "bf16.bf16_optimizer_states";
    if (key && stage == 0)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: %s needs ZeRO stage 1, 2 or 3 (DeepSpeed "
                         "rejects it at stage 0)", c->source, key);
    if (cfg->bf16.bf16_optimizer_states && !cfg->bf16.bf16_master_weights_and_grads)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: bf16.bf16_optimizer_states needs "
                         "bf16.bf16_master_weights_and_grads", c->source);
    if (!strcmp(cfg->bf16_master_rounding, "stochastic") &&
        !(cfg->bf16.enabled && cfg->bf16.bf16_master_weights_and_grads))
        warnf(c, "config %s: bf16_master_rounding \"stochastic\" rounds bf16 master weights, and "
              "this config has none (it needs bf16.enabled and "
              "bf16.bf16_master_weights_and_grads); it does nothing here", c->source);
    if (cfg->bf16.bf16_master_weights_and_grads && !cfg->bf16.enabled) // DeepSpeed accepts it
        warnf(c, "config %s: bf16.bf16_master_weights_and_grads has no effect without "
              "bf16.enabled true (the bf16 training weights are the master); set bf16.enabled",
              c->source);
    if (cfg->fp8.enabled && cfg->fp16.enabled)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: fp8.enabled with fp16.enabled: FP8 products "
                         "run beside bf16 (their results and the rest of the layer in bf16, no "
                         "loss scaling); set fp16.enabled false (bf16.enabled true, or neither)",
                         c->source);
    if (cfg->fp8.enabled && !strcasecmp(cfg->fp8.recipe, "delayed"))
        return dsc__fail(DSC_ERR_CONFIG, "config %s: fp8.recipe \"delayed\" (scales from an "
                         "amax history of earlier steps) is not built; \"current\" scales each "
                         "tensor by its own absolute maximum just before its product", c->source);
    bool offload_opt = dsc_config_given(cfg, "zero_optimization.offload_optimizer") ||
                       cfg->zero_optimization.cpu_offload;
    if (offload_opt && cfg->zero_optimization.offload_optimizer.ratio < 1.0 && stage != 3)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: zero_optimization.offload_optimizer.ratio < 1 "
                         "(partial offload) needs ZeRO stage 3", c->source);
    return DSC_OK;
}

// The deprecated cpu_offload flags stand for the offload sections (with their defaults);
// DeepSpeed warns about them, and so does dsc.
static void deprecated_offload(parse_ctx *c) {
    dsc_config *cfg = c->cfg;
    static const struct {
        const char *flag, *section;
    } old[] = {{"cpu_offload", "offload_optimizer"}, {"cpu_offload_param", "offload_param"}};
    for (int k = 0; k < 2; k++) {
        bool on = k == 0 ? cfg->zero_optimization.cpu_offload
                         : cfg->zero_optimization.cpu_offload_param;
        char flag[64], dev[96];
        snprintf(flag, sizeof flag, "zero_optimization.%s", old[k].flag);
        if (!named(cfg, flag)) continue;
        warnf(c, "config %s: %s is deprecated (as in DeepSpeed); use \"%s\": {\"device\": "
              "\"%s\"}", c->source, flag, old[k].section, on ? "cpu" : "none");
        if (!on) continue;
        dsc_offload_config *o = k == 0 ? &cfg->zero_optimization.offload_optimizer
                                       : &cfg->zero_optimization.offload_param;
        str_set(o->device, sizeof o->device, "cpu");
        snprintf(dev, sizeof dev, "zero_optimization.%s.device", old[k].section);
        cfg->given[dsc__row_find(dev)] |= GIVEN_DEPRECATED;
    }
}

// NVMe offload is not implemented: training would keep everything in memory and write nothing
// to nvme_path, so the memory the user asked for would not be there. Refuse it.
static dsc_status check_nvme(parse_ctx *c) {
    static const char *const sections[] = {"offload_optimizer", "offload_param"};
    const dsc_config *cfg = c->cfg;
    for (int k = 0; k < 2; k++) {
        const dsc_offload_config *o = k == 0 ? &cfg->zero_optimization.offload_optimizer
                                             : &cfg->zero_optimization.offload_param;
        if (strcmp(o->device, "nvme")) continue;
        return dsc__fail(DSC_ERR_CONFIG, "config %s: zero_optimization.%s.device \"nvme\" is not "
                         "implemented by dsc: nothing would be written to nvme_path and the "
                         "memory would not be saved. Use \"cpu\" (host memory) or \"none\"",
                         c->source, sections[k]);
    }
    return DSC_OK;
}

// Whether leaf row r still holds its default.
static bool at_default(dsc_config *cfg, const dsc__key_row *r) {
    const void *p = dsc__field(cfg, r);
    switch (r->kind) {
    case K_BOOL: return *(const bool *)p == (r->def != 0);
    case K_INT: return *(const int64_t *)p == (int64_t)r->def;
    case K_WHOLE:
    case K_FLOAT: return *(const double *)p == r->def;
    case K_STR: return !strcmp(p, r->sdef);
    default: return true;
    }
}

// Keys dsc parses but does not act on: the same warning as the sections it does not implement,
// when the value asks for something (anything but the default).
static void warn_no_effect(parse_ctx *c) {
    for (int i = 0; i < dsc__nrows; i++) {
        const dsc__key_row *r = &ROWS[i];
        if (!(c->cfg->given[i] & GIVEN_VALUE) || !dsc__row_no_effect(i) || at_default(c->cfg, r))
            continue;
        warnf(c, "config %s: key \"%s\" (%s) is not implemented by dsc; ignored", c->source,
              r->path, r->doc);
    }
}

// The optimizer's hyperparameters within the domains torch.optim checks (DeepSpeed's own fused
// optimizers check none of them, and a run with a beta outside [0, 1) goes to NaN). Keys the
// table bounds already (lr, eps, weight_decay, momentum >= 0) are not repeated here.
static dsc_status check_optimizer(parse_ctx *c) {
    const dsc_config *cfg = c->cfg;
    const char *type = cfg->optimizer.type;
    bool adam = !strcmp(type, "adam") || !strcmp(type, "adamw"), lion = !strcmp(type, "lion");
    for (int k = 0; k < 2 && (adam || lion); k++) {
        double b = cfg->optimizer.betas[k];
        // Adam divides by 1 - beta^t (zero at beta 1); Lion's interpolation takes beta = 1
        if (b >= 0 && (b < 1 || (lion && b == 1))) continue;
        return dsc__fail(DSC_ERR_CONFIG, "config %s: optimizer.params.betas [%g, %g]: beta%d = %g "
                         "is outside [0, %s (torch.optim rejects it; the moments would diverge "
                         "to NaN); use values such as [0.9, 0.999]", c->source,
                         cfg->optimizer.betas[0], cfg->optimizer.betas[1], k + 1, b,
                         lion ? "1]" : "1)");
    }
    if (adam && cfg->optimizer.eps == 0)
        warnf(c, "config %s: optimizer.params.eps is 0: a parameter whose gradient is zero gets "
              "0/0 = NaN from Adam (torch accepts it; DeepSpeed's default is 1e-8)", c->source);
    if (!strcmp(type, "sgd") && cfg->optimizer.nesterov &&
        (cfg->optimizer.momentum <= 0 || cfg->optimizer.dampening != 0))
        return dsc__fail(DSC_ERR_CONFIG, "config %s: optimizer.params.nesterov needs momentum > 0 "
                         "and dampening 0 (torch.optim.SGD rejects it); got momentum %g, dampening "
                         "%g", c->source, cfg->optimizer.momentum, cfg->optimizer.dampening);
    return DSC_OK;
}

static dsc_status check_rules(parse_ctx *c) {
    dsc_config *cfg = c->cfg;
    DSC_TRY(check_spellings(c));
    if (cfg->fp16.enabled && cfg->bf16.enabled)
        return dsc__fail(DSC_ERR_CONFIG, "config %s: fp16.enabled and bf16.enabled are both true; "
                         "choose one (DeepSpeed rejects both)", c->source);
    DSC_TRY(check_zero_needs(c));
    deprecated_offload(c);
    DSC_TRY(check_nvme(c));
    warn_no_effect(c);
    if (cfg->zero_optimization.cpu_offload_use_pin_memory)
        warnf(c, "config %s: zero_optimization.cpu_offload_use_pin_memory has no effect in "
              "DeepSpeed 0.18.4; set pin_memory in offload_optimizer / offload_param", c->source);
    // The profiler times steps, so DeepSpeed turns the wall-clock breakdown on with it.
    cfg->wall_clock_breakdown |= cfg->flops_profiler.enabled;
    // DeepSpeed passes optimizer.params.max_grad_norm on only in fp16 mode; else it zeroes it.
    if (!cfg->fp16.enabled && cfg->optimizer.max_grad_norm > 0) {
        warnf(c, "config %s: optimizer.params.max_grad_norm is set to 0 outside fp16 (as "
              "DeepSpeed does); use gradient_clipping", c->source);
        cfg->optimizer.max_grad_norm = 0;
    }
    check_types(c);
    DSC_TRY(check_optimizer(c));
    if (cfg->vocabulary_size % 8)
        warnf(c, "config %s: vocabulary_size %lld is not a multiple of 8, which slows tensor "
              "cores (DeepSpeed warns too)", c->source, (long long)cfg->vocabulary_size);
    if (cfg->elasticity.enabled) DSC_TRY(dsc__elastic_check(cfg, c->source));
    return DSC_OK;
}

// ---- batch sizes ----

// Elasticity overrides the batch keys, which DeepSpeed then refuses unless told to ignore them.
static dsc_status elastic_triple(dsc_config *cfg, int world_size) {
    static const char *const keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                       "gradient_accumulation_steps"};
    for (int k = 0; k < 3; k++) {
        int idx = dsc__row_find(keys[k]);
        if ((cfg->given[idx] & GIVEN_NAMED) && !cfg->elasticity.ignore_non_elastic_batch_info)
            return dsc__fail(DSC_ERR_CONFIG, "%s is given while elasticity is enabled, which "
                             "computes the batch sizes itself; remove it, or set "
                             "elasticity.ignore_non_elastic_batch_info", keys[k]);
    }
    return dsc__elastic_batch(cfg, world_size, &cfg->train_batch_size,
                              &cfg->train_micro_batch_size_per_gpu,
                              &cfg->gradient_accumulation_steps);
}

// micro * gas * world; false when it does not fit in int64 (DeepSpeed's integers are unbounded:
// dsc rejects such sizes, see docs/config.md).
static bool batch_product(int64_t micro, int64_t gas, int64_t world, int64_t *out) {
    int64_t mg;
    return !__builtin_mul_overflow(micro, gas, &mg) && !__builtin_mul_overflow(mg, world, out);
}

static dsc_status too_large(int64_t micro, int64_t gas, int64_t world) {
    return dsc__fail(DSC_ERR_CONFIG, "train_micro_batch_size_per_gpu (%lld) * "
                     "gradient_accumulation_steps (%lld) * world size (%lld) is beyond dsc's "
                     "integers (2^63); use smaller batch sizes", (long long)micro, (long long)gas,
                     (long long)world);
}

dsc_status dsc_config_resolve_batch(dsc_config *cfg, int world_size) {
    if (world_size < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "world size %d: must be at least 1", world_size);
    if (cfg->elasticity.enabled) DSC_TRY(elastic_triple(cfg, world_size));
    int64_t *tb = &cfg->train_batch_size, *mb = &cfg->train_micro_batch_size_per_gpu,
            *ga = &cfg->gradient_accumulation_steps;
    bool t = *tb > 0, m = *mb > 0, g = *ga > 0;
    int64_t w = world_size, product;
    // DeepSpeed's _set_batch_related_parameters, including its order of integer divisions.
    if (t && m && g) {
    } else if (t && m) {
        *ga = *tb / *mb / w;
    } else if (t && g) {
        *mb = *tb / w / *ga;
    } else if (m && g) {
        if (!batch_product(*mb, *ga, w, &product)) return too_large(*mb, *ga, w);
        *tb = product;
    } else if (t) {
        *ga = 1;
        *mb = *tb / w;
    } else if (m) {
        if (!batch_product(*mb, 1, w, &product)) return too_large(*mb, 1, w);
        *tb = product;
        *ga = 1;
    } else {
        return dsc__fail(DSC_ERR_CONFIG, "either train_batch_size or "
                         "train_micro_batch_size_per_gpu needs to be provided");
    }
    if (*tb <= 0 || *mb <= 0 || *ga <= 0 || !batch_product(*mb, *ga, w, &product) ||
        *tb != product) {
        // Say which numbers came from the file: a derived 0 is not something the user wrote.
        const char *how[3] = {t ? "" : ", derived", m ? "" : ", derived", g ? "" : ", derived"};
        return dsc__fail(DSC_ERR_CONFIG,
                         "batch sizes do not fit: train_batch_size (%lld%s) must equal "
                         "train_micro_batch_size_per_gpu (%lld%s) * gradient_accumulation_steps "
                         "(%lld%s) * world size (%d), and all must be > 0; fix one of the three "
                         "keys", (long long)*tb, how[0], (long long)*mb, how[1], (long long)*ga,
                         how[2], world_size);
    }
    cfg->world_size = world_size;
    return DSC_OK;
}

// ---- entry points ----

static dsc_status load_tree(dsc_config *cfg, const json_t *root, const char *source,
                            int world_size, dsc_config_warn_fn warn, void *user) {
    parse_ctx c = {cfg, source, root, warn, user};
    dsc_config_defaults(cfg);
    if (!json_is_object(root)) {
        char found[128];
        json_describe(root, found, sizeof found);
        return dsc__fail(DSC_ERR_CONFIG, "config %s: expected an object at the top, found %s",
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

static dsc_status load_text(dsc_config *cfg, const char *text, size_t len, const char *source,
                            int world_size, dsc_config_warn_fn warn, void *user) {
    json_t *root;
    DSC_TRY(dsc__hjson_parse(text, len, source, &root));
    dsc_status st = load_tree(cfg, root, source, world_size, warn, user);
    json_decref(root);
    return st;
}

dsc_status dsc_config_load_file_text(dsc_config *cfg, const char *path, int world_size,
                                     dsc_config_warn_fn warn, void *user, char **text) {
    if (text) *text = NULL;
    FILE *f;
    if (dsc__fopen_regular(path, &f) != DSC_OK) {
        dsc__error_prefix("config: ");
        return DSC_ERR_IO;
    }
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    while (buf) {
        len += fread(buf + len, 1, cap - len, f);
        if (len < cap) break;
        char *bigger = realloc(buf, cap *= 2);
        if (!bigger) free(buf);
        buf = bigger;
    }
    bool bad = ferror(f);
    fclose(f);
    if (!buf) return dsc__fail(DSC_ERR_OOM, "config %s: out of memory reading it", path);
    dsc_status st = bad ? dsc__fail(DSC_ERR_IO, "config %s: read error", path)
                        : load_text(cfg, buf, len, path, world_size, warn, user);
    char *kept = st == DSC_OK && text ? realloc(buf, len + 1) : NULL;
    if (kept) {
        kept[len] = 0;
        *text = kept;
    } else {
        free(buf);
    }
    return st;
}

dsc_status dsc_config_load_file(dsc_config *cfg, const char *path, int world_size,
                                dsc_config_warn_fn warn, void *user) {
    return dsc_config_load_file_text(cfg, path, world_size, warn, user, NULL);
}

dsc_status dsc_config_load_string(dsc_config *cfg, const char *text, int world_size,
                                  dsc_config_warn_fn warn, void *user) {
    return load_text(cfg, text, strlen(text), "<string>", world_size, warn, user);
}

bool dsc_config_given(const dsc_config *cfg, const char *path) {
    int idx = dsc__row_find(path);
    if (idx >= 0 && ROWS[idx].kind == K_ALIAS) idx = dsc__row_find(ROWS[idx].sdef);
    return idx >= 0 && (cfg->given[idx] & GIVEN_VALUE);
}

bool dsc_config_overlap_comm(const dsc_config *cfg) {
    if (dsc_config_given(cfg, "zero_optimization.overlap_comm"))
        return cfg->zero_optimization.overlap_comm;
    return cfg->zero_optimization.stage == 3;
}
