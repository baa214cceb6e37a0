// config/print.c - the resolved config as text or JSON, and the key table as documentation.
#include "dsc/config.h"

#include <jansson.h> // json_*
#include <math.h>    // fabs, floor, isfinite, log10
#include <stdio.h>   // FILE, fprintf, snprintf
#include <stdlib.h>  // free
#include <string.h>  // strchr, strcmp, strncmp, strpbrk, strstr, strdup

#include "config/table.h" // dsc__rows

static json_t *whole(double x) {
    return fabs(x) < 9223372036854775808.0 ? json_integer((json_int_t)x) : json_real(x);
}

static json_t *int_list(const int64_t *v, int64_t n) {
    json_t *a = json_array();
    for (int64_t k = 0; a && k < n; k++) json_array_append_new(a, json_integer(v[k]));
    return a;
}

static json_t *row_value(const dsc_config *cfg, const dsc__key_row *r) {
    const void *p = (const char *)cfg + r->off;
    switch (r->kind) {
    case K_BOOL:
        if (!strcmp(r->path, "zero_optimization.overlap_comm"))
            return json_boolean(dsc_config_overlap_comm(cfg));
        return json_boolean(*(const bool *)p);
    case K_INT: return json_integer(*(const int64_t *)p);
    case K_WHOLE: return whole(*(const double *)p);
    case K_FLOAT: return json_real(*(const double *)p);
    case K_STR: return json_string(p);
    case K_PAIR: return json_pack("[ff]", ((const double *)p)[0], ((const double *)p)[1]);
    case K_INTLIST: return int_list(p, *(const int64_t *)((const char *)cfg + r->count_off));
    case K_LIST: return r->size ? json_loads(*(const char *)p ? p : "[]", 0, NULL) : NULL;
    case K_JSON: return *(const char *)p ? json_loads(p, JSON_DECODE_ANY, NULL) : json_null();
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

// Where a printed value came from, when not from the file.
static const char *origin(const dsc_config *cfg, int i) {
    if (cfg->given[i] & GIVEN_VALUE) return "";
    if (cfg->given[i] & GIVEN_DEPRECATED)
        return strstr(dsc__rows[i].path, "offload_param")
                   ? "   (from zero_optimization.cpu_offload_param, deprecated)"
                   : "   (from zero_optimization.cpu_offload, deprecated)";
    bool batch = !strncmp(dsc__rows[i].path, "train_", 6) ||
                 !strcmp(dsc__rows[i].path, "gradient_accumulation_steps");
    return batch && cfg->world_size > 0 ? "   (derived)" : "   (default)";
}

// The shortest decimal that reads back as exactly x (0.9, not 0.90000000000000002), with a
// ".0" on whole numbers so that it still reads as a real.
void dsc__format_real(double x, char *buf, size_t cap) {
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    // Positional notation where Python's repr uses it (2000.0, not 2e+03).
    int e10 = x != 0 && isfinite(x) ? (int)floor(log10(fabs(x))) : 0;
    if (strpbrk(buf, "eE") && e10 >= -4 && e10 < 16)
        snprintf(buf, cap, "%.*f", prec - 1 - e10 > 0 ? prec - 1 - e10 : 0, x);
    if (isfinite(x) && !strpbrk(buf, ".eE")) {
        size_t n = strlen(buf);
        if (n + 2 < cap) memcpy(buf + n, ".0", 3);
    }
}

// A value as compact JSON text with its reals in their shortest form. Caller frees.
static char *value_text(const json_t *v) {
    char a[40], b[40], *out = NULL;
    if (json_is_real(v)) {
        dsc__format_real(json_real_value(v), a, sizeof a);
        return strdup(a);
    }
    if (json_is_array(v) && json_array_size(v) == 2 && json_is_real(json_array_get(v, 0))) {
        dsc__format_real(json_real_value(json_array_get(v, 0)), a, sizeof a);
        dsc__format_real(json_real_value(json_array_get(v, 1)), b, sizeof b);
        size_t n = strlen(a) + strlen(b) + 4;
        out = malloc(n);
        if (out) snprintf(out, n, "[%s,%s]", a, b);
        return out;
    }
    return json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(17));
}

void dsc_config_print(const dsc_config *cfg, void *out, bool as_json) {
    FILE *f = out;
    json_t *root = as_json ? json_object() : NULL;
    for (int i = 0; i < dsc__nrows; i++) {
        json_t *v = row_value(cfg, &dsc__rows[i]);
        if (!v) continue;
        if (as_json) {
            json_set_path(root, dsc__rows[i].path, v);
            continue;
        }
        char *text = value_text(v);
        fprintf(f, "%-58s = %s%s\n", dsc__rows[i].path, text ? text : "?", origin(cfg, i));
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

static void default_text(const dsc__key_row *r, char *def, size_t cap) {
    def[0] = '\0';
    switch (r->kind) {
    case K_BOOL: snprintf(def, cap, "%s", r->def != 0 ? "true" : "false"); break;
    case K_INT:
    case K_WHOLE: snprintf(def, cap, "%.17g", r->def); break;
    case K_FLOAT: snprintf(def, cap, "%g", r->def); break;
    case K_STR: snprintf(def, cap, "\"%s\"", r->sdef); break;
    case K_PAIR: snprintf(def, cap, "[%g, %g]", r->def, r->lo); break;
    case K_INTLIST: snprintf(def, cap, "[]"); break;
    case K_LIST: snprintf(def, cap, "%s", r->size ? "[]" : ""); break;
    case K_JSON: snprintf(def, cap, "null"); break;
    case K_ALIAS: snprintf(def, cap, "= `%s`", r->sdef); break;
    default: break;
    }
}

static const char *reader_text(const dsc__key_row *r) {
    if (r->kind != K_SECTION) return "";
    switch (r->how & DS_READER) {
    case DS_MODEL: return " (DeepSpeed: pydantic model)";
    case DS_OWN: return "";
    default: return " (DeepSpeed: plain lookups)";
    }
}

// Write the key table as a markdown table (docs/config.md is generated from this).
void dsc_config_write_doc(void *out) {
    static const char *kinds[] = {"section", "bool", "int", "int", "float", "string",
                                  "[float, float]", "list", "JSON value", "[int, ...]", "alias",
                                  "not implemented"};
    FILE *f = out;
    fprintf(f, "| key | type | default | meaning |\n|---|---|---|---|\n");
    for (int i = 0; i < dsc__nrows; i++) {
        const dsc__key_row *r = &dsc__rows[i];
        char def[128], choice[128] = "";
        default_text(r, def, sizeof def);
        if (r->choices) { // '|' would split the markdown cell
            bool any_case = r->choices[0] == '~';
            size_t n = (size_t)snprintf(choice, sizeof choice, " (%s%s)", r->choices + any_case,
                                        any_case ? ", any case" : "");
            for (size_t k = 0; k < n && k < sizeof choice; k++)
                if (choice[k] == '|') choice[k] = '/';
        }
        fprintf(f, "| `%s` | %s%s | %s | %s%s%s |\n", r->path, kinds[r->kind], choice, def, r->doc,
                reader_text(r), dsc__row_no_effect(i) ? " (not implemented by dsc: another value "
                                                        "warns)" : "");
    }
}
