// cli/lora.c - the config's `lora` section and PEFT's adapter folders, for `dsc train` and
// `dsc ckpt export --peft`.
#include "cli/lora.h"

#include <jansson.h> // json_*
#include <math.h>    // fabs
#include <stdio.h>   // snprintf
#include <stdlib.h>  // calloc, malloc, free
#include <string.h>  // strcmp, strncmp
#include <sys/stat.h> // stat (cli_base_open_failed)

#include "dsc/half.h"   // dsc_fp32_to_bf16, dsc_fp32_to_fp16 and back
#include "dsc/status.h" // dsc_fail

enum { MAX_NAMES = 32, NAME_CAP = 64 };

typedef struct lora_names {
    char v[MAX_NAMES][NAME_CAP];
    const char *p[MAX_NAMES];
    int n;
} lora_names;

// A JSON list of module names (or one name) into names; "all-linear" (the string) leaves n 0.
static dsc_status read_names(const json_t *j, const char *key, lora_names *out, bool *all) {
    out->n = 0;
    if (all) *all = false;
    if (!j || json_is_null(j)) return DSC_OK;
    if (json_is_string(j)) {
        if (all && !strcmp(json_string_value(j), "all-linear")) {
            *all = true;
            return DSC_OK;
        }
        snprintf(out->v[0], NAME_CAP, "%s", json_string_value(j));
        out->p[0] = out->v[0];
        out->n = 1;
        return DSC_OK;
    }
    if (!json_is_array(j))
        return dsc_fail(DSC_ERR_CONFIG, "%s must be a list of module names%s", key,
                        all ? " or \"all-linear\"" : "");
    size_t i;
    json_t *e;
    json_array_foreach(j, i, e) {
        if (!json_is_string(e) || strlen(json_string_value(e)) >= NAME_CAP || i >= MAX_NAMES)
            return dsc_fail(DSC_ERR_CONFIG, "%s[%zu]: give module names (strings of at most %d "
                            "characters, at most %d of them)", key, i, NAME_CAP - 1, MAX_NAMES);
        snprintf(out->v[i], NAME_CAP, "%s", json_string_value(e));
        out->p[i] = out->v[i];
        out->n = (int)i + 1;
    }
    return DSC_OK;
}

static json_t *parse_json(const char *text) {
    return text && text[0] ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
}

typedef struct lora_spec {
    dsc_model_lora o;
    lora_names targets, save;
    bool all;
} lora_spec;

// The config's lora section.
static dsc_status spec_from_config(const dsc_config *cfg, const char *family, lora_spec *s) {
    const typeof(cfg->lora) *c = &cfg->lora;
    if (strcmp(c->bias, "none"))
        return dsc_fail(DSC_ERR_UNSUPPORTED, "lora.bias \"%s\": dsc trains no biases beside the "
                        "adapters yet; use \"none\" (PEFT's default)", c->bias);
    s->o = (dsc_model_lora){.r = (int)c->r, .alpha = c->lora_alpha, .rslora = c->use_rslora,
                            .dropout = c->lora_dropout};
    json_t *j = parse_json(c->target_modules);
    dsc_status st = read_names(j, "lora.target_modules", &s->targets, &s->all);
    json_decref(j);
    DSC_TRY(st);
    if (c->target_modules[0] && !s->all && !s->targets.n) // (as PEFT refuses it)
        return dsc_fail(DSC_ERR_CONFIG, "lora.target_modules is an empty list: no module would "
                        "get an adapter; name the modules (e.g. [\"q_proj\", \"v_proj\"]), give "
                        "\"all-linear\", or leave the key out for the architecture's default");
    if (!c->target_modules[0]) { // PEFT's default for the architecture
        bool gpt2 = !strcmp(family, "gpt2");
        snprintf(s->targets.v[0], NAME_CAP, "%s", gpt2 ? "c_attn" : "q_proj");
        snprintf(s->targets.v[1], NAME_CAP, "v_proj");
        s->targets.p[0] = s->targets.v[0];
        s->targets.p[1] = s->targets.v[1];
        s->targets.n = gpt2 ? 1 : 2;
    }
    j = parse_json(c->modules_to_save);
    st = read_names(j, "lora.modules_to_save", &s->save, NULL);
    json_decref(j);
    DSC_TRY(st);
    j = parse_json(c->init_lora_weights);
    if (!j || json_is_true(j)) s->o.init = 0;
    else if (json_is_false(j)) s->o.init = 2;
    else if (json_is_string(j) && !strcmp(json_string_value(j), "gaussian")) s->o.init = 1;
    else st = dsc_fail(DSC_ERR_UNSUPPORTED, "lora.init_lora_weights %s: dsc takes true, false or "
                       "\"gaussian\"", c->init_lora_weights);
    json_decref(j);
    return st;
}

dsc_status cli_adapter_config_read(const char *dir, const char *flag, json_t **out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_error_t err;
    *out = json_load_file(path, 0, &err);
    if (!*out)
        return dsc_fail(DSC_ERR_INVALID_ARG, "%s %s: cannot read %s (%s); give a folder that "
                        "PEFT's save_pretrained (or dsc ckpt export --peft) wrote", flag, dir,
                        path, err.text);
    return DSC_OK;
}

// An adapter folder's adapter_config.json (PEFT's LoraConfig as saved).
static dsc_status spec_from_adapter(const char *dir, lora_spec *s) {
    char path[4200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *j;
    DSC_TRY(cli_adapter_config_read(dir, "--init-adapter", &j));
    dsc_status st = DSC_OK;
    const char *type = json_string_value(json_object_get(j, "peft_type"));
    if (type && strcmp(type, "LORA"))
        st = dsc_fail(DSC_ERR_UNSUPPORTED, "%s: peft_type \"%s\"; dsc reads LORA adapters", path,
                      type);
    json_t *r = json_object_get(j, "r"), *a = json_object_get(j, "lora_alpha");
    if (st == DSC_OK && (!json_is_integer(r) || !json_is_number(a)))
        st = dsc_fail(DSC_ERR_INVALID_ARG, "%s: r and lora_alpha must be numbers", path);
    if (st == DSC_OK) {
        s->o.r = (int)json_integer_value(r);
        s->o.alpha = json_number_value(a);
        s->o.rslora = json_is_true(json_object_get(j, "use_rslora"));
        st = read_names(json_object_get(j, "target_modules"), "target_modules", &s->targets,
                        &s->all);
    }
    if (st == DSC_OK)
        st = read_names(json_object_get(j, "modules_to_save"), "modules_to_save", &s->save, NULL);
    json_t *d = json_object_get(j, "lora_dropout"), *b = json_object_get(j, "bias");
    if (st == DSC_OK && d) s->o.dropout = json_number_value(d);
    if (st == DSC_OK && b && json_is_string(b) && strcmp(json_string_value(b), "none"))
        st = dsc_fail(DSC_ERR_UNSUPPORTED, "%s: bias \"%s\": dsc trains no biases beside the "
                      "adapters yet", path, json_string_value(b));
    const char *fields[] = {"use_dora", "layers_to_transform", "rank_pattern", "alpha_pattern"};
    for (size_t k = 0; st == DSC_OK && k < sizeof fields / sizeof *fields; k++) {
        json_t *v = json_object_get(j, fields[k]);
        bool set = v && !json_is_null(v) && !json_is_false(v) &&
                   !(json_is_object(v) && !json_object_size(v));
        if (set)
            st = dsc_fail(DSC_ERR_UNSUPPORTED, "%s: %s is set; dsc implements plain LoRA only",
                          path, fields[k]);
    }
    json_decref(j);
    return st;
}

// names as a list for a message: [a, b] ("all-linear" when all; [] when none).
static void names_text(const lora_names *n, bool all, char *buf, size_t cap) {
    if (all) {
        snprintf(buf, cap, "\"all-linear\"");
        return;
    }
    size_t len = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < n->n && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", n->v[i]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

static bool same_names(const lora_names *a, const lora_names *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++) {
        bool hit = false;
        for (int k = 0; k < b->n && !hit; k++) hit = !strcmp(a->v[i], b->v[k]);
        if (!hit) return false;
    }
    return true;
}

dsc_status cli_lora(dsc_model *m, const dsc_config *cfg, bool cuda, const char *init_adapter,
                    uint64_t seed) {
    bool section = cfg && dsc_config_given(cfg, "lora");
    if (!section && !init_adapter) return DSC_OK;
    if (cuda && !dsc_model_has_device_adapters(m))
        return dsc_fail(DSC_ERR_UNSUPPORTED, "LoRA on --device cuda: model %s (family %s) has no "
                        "adapters in its GPU passes yet (GPT-2 and the Llama family have); train it "
                        "on the CPU (--device cpu)", dsc_model_spec(m), dsc_model_describe(m)->family);
    lora_spec s = {0}, a = {0};
    const char *family = dsc_model_describe(m)->family;
    if (section) DSC_TRY(spec_from_config(cfg, family, &s));
    if (init_adapter) {
        DSC_TRY(spec_from_adapter(init_adapter, &a));
        if (section && s.all != a.all) { // PEFT saves "all-linear" as the list it resolved to
            s.all = false;
            if (!a.all) s.targets = a.targets;
            else a.targets = s.targets, a.all = false;
        }
        if (!section) {
            s = a;
        } else if (s.o.r != a.o.r || fabs(s.o.alpha - a.o.alpha) > 0 ||
                   s.o.rslora != a.o.rslora || s.all != a.all ||
                   (!s.all && !same_names(&s.targets, &a.targets)) || !same_names(&s.save, &a.save)) {
            char ta[512], ts[512], sa[512], ss[512], diff[1200] = "";
            names_text(&a.targets, a.all, ta, sizeof ta);
            names_text(&s.targets, s.all, ts, sizeof ts);
            names_text(&a.save, false, sa, sizeof sa);
            names_text(&s.save, false, ss, sizeof ss);
            if (s.all != a.all || (!s.all && !same_names(&s.targets, &a.targets)))
                snprintf(diff, sizeof diff, "; target_modules %s against the config's %s", ta, ts);
            if (!same_names(&s.save, &a.save))
                snprintf(diff + strlen(diff), sizeof diff - strlen(diff),
                         "; modules_to_save %s against the config's %s", sa, ss);
            return dsc_fail(DSC_ERR_CONFIG, "--init-adapter %s: its adapter_config.json (r %d, "
                            "lora_alpha %g, use_rslora %d) differs from the config's lora section "
                            "(r %d, lora_alpha %g, use_rslora %d)%s; make them agree, or drop the "
                            "lora section to take the adapter's", init_adapter, a.o.r, a.o.alpha,
                            a.o.rslora, s.o.r, s.o.alpha, s.o.rslora, diff);
        }
    }
    s.o.targets = s.all ? NULL : s.targets.p;
    s.o.ntargets = s.all ? 0 : s.targets.n;
    s.o.save = s.save.p;
    s.o.nsave = s.save.n;
    s.o.seed = seed;
    return dsc_model_set_lora(m, &s.o);
}

void cli_peft_tensor_name(bool gpt2, const char *name, char *out, size_t cap) {
    bool head = !strncmp(name, "lm_head.", 8);
    snprintf(out, cap, "base_model.model.%s%s", gpt2 && !head ? "transformer." : "", name);
}

void cli_peft_name(const dsc_model *m, int i, char *out, size_t cap) {
    cli_peft_tensor_name(!strcmp(dsc_model_describe(m)->family, "gpt2"),
                         dsc_model_param_get(m, i)->name, out, cap);
}

dsc_status cli_adapter_config(const dsc_model *m, const char *base, char **out) {
    const dsc_lora *lo = dsc_model_lora_of(m);
    if (!lo) return dsc_fail(DSC_ERR_INVALID_ARG, "the model has no LoRA adapters");
    const dsc_model_info *mi = dsc_model_describe(m);
    json_t *targets = json_array(), *save = json_null();
    int nbase = mi->num_tensors;
    for (int i = 0; i < mi->num_tensors; i++)
        if (dsc_lora_base_of(lo, i) >= 0 && i < nbase) nbase = i;
    for (int i = nbase; i < mi->num_tensors; i += 2) { // each A: its module's leaf, once
        const char *name = dsc_model_param_get(m, dsc_lora_base_of(lo, i))->name;
        const char *end = strrchr(name, '.'), *leaf = end;
        while (leaf > name && leaf[-1] != '.') leaf--;
        char buf[NAME_CAP];
        snprintf(buf, sizeof buf, "%.*s", (int)(end - leaf), leaf);
        bool seen = false;
        for (size_t k = 0; k < json_array_size(targets) && !seen; k++)
            seen = !strcmp(json_string_value(json_array_get(targets, k)), buf);
        if (!seen) json_array_append_new(targets, json_string(buf));
    }
    for (int i = 0; i < nbase; i++) {
        const dsc_model_param *p = dsc_model_param_get(m, i);
        if (p->frozen) continue;
        if (json_is_null(save)) save = json_array();
        const char *end = strrchr(p->name, '.'), *leaf = end;
        while (leaf > p->name && leaf[-1] != '.') leaf--;
        char buf[NAME_CAP];
        snprintf(buf, sizeof buf, "%.*s", (int)(end - leaf), leaf);
        json_array_append_new(save, json_string(buf));
    }
    int r = dsc_lora_rank(lo);
    double alpha = dsc_lora_alpha(lo);
    json_t *j = json_pack("{s:s?, s:s, s:s, s:b, s:i, s:f, s:f, s:o, s:o, s:s, s:b, s:b}",
                          "base_model_name_or_path", base, "peft_type", "LORA", "task_type",
                          "CAUSAL_LM", "inference_mode", true, "r", r, "lora_alpha", alpha,
                          "lora_dropout", dsc_lora_dropout(lo), "target_modules", targets, "modules_to_save", save,
                          "bias", "none", "fan_in_fan_out",
                          !strcmp(mi->family, "gpt2"), "use_rslora", dsc_lora_rslora(lo));
    if (!j) return dsc_fail(DSC_ERR_OOM, "out of memory writing adapter_config.json");
    *out = json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(j);
    return *out ? DSC_OK : dsc_fail(DSC_ERR_OOM, "out of memory writing adapter_config.json");
}

// ---- the base a LoRA checkpoint was trained on ----

// A 64-bit digest of n floats' bits, 8 bytes a round (a multiply-xorshift chain): quick enough to
// run over an 8B model's base at start-up (seconds), and any changed value changes it.
static uint64_t digest(const float *v, int64_t n) {
    const unsigned char *b = (const unsigned char *)v;
    size_t bytes = (size_t)n * sizeof(float), i = 0;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)bytes;
    for (; i + 8 <= bytes; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    for (; i < bytes; i++) h = (h ^ b[i]) * 0x94D049BB133111EBull;
    return h ^ (h >> 29);
}

dsc_status cli_base_checksums(const dsc_model *m, float *const *values, dsc_engine *eng,
                              char **out) {
    const dsc_model_info *mi = dsc_model_describe(m);
    uint64_t *h = calloc((size_t)mi->num_tensors, sizeof *h);
    if (!h) return dsc_fail(DSC_ERR_OOM, "out of memory for the base checksums");
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < mi->num_tensors; i++) {
        const dsc_model_param *p = dsc_model_param_get(m, i);
        if (p->frozen && values[i]) h[i] = digest(values[i], p->numel);
    }
    for (int i = 0; i < mi->num_tensors; i++) { // on the device: read one tensor at a time
        const dsc_model_param *p = dsc_model_param_get(m, i);
        if (!p->frozen || values[i]) continue;
        float *v = eng ? malloc((size_t)p->numel * sizeof *v) : NULL;
        dsc_status st = v ? dsc_engine_full_param(eng, i, v)
                          : dsc_fail(DSC_ERR_OOM, "out of memory reading %s for its checksum",
                                     p->name);
        if (st == DSC_OK) h[i] = digest(v, p->numel);
        free(v);
        if (st != DSC_OK) {
            free(h);
            return st;
        }
    }
    json_t *t = json_object();
    for (int i = 0; i < mi->num_tensors; i++) {
        const dsc_model_param *p = dsc_model_param_get(m, i);
        if (!p->frozen) continue;
        char hex[17];
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h[i]);
        json_object_set_new(t, p->name, json_string(hex));
    }
    free(h);
    json_t *j = json_pack("{s:s, s:o}", "format", "dsc-lora-base-1", "tensors", t);
    *out = j ? json_dumps(j, JSON_INDENT(1) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return *out ? DSC_OK : dsc_fail(DSC_ERR_OOM, "out of memory for the base checksums");
}

// Whether n values are the tensor whose digest is hex: as they are, or rounded to bf16 or fp16
// (the engine keeps a frozen base rounded once in 16-bit training). tmp: n floats of scratch.
static bool base_matches(const char *hex, const float *v, int64_t n, float *tmp) {
    char mine[17];
    for (int kind = 0; kind < 3; kind++) {
        const float *x = v;
        if (kind == 1) {
            for (int64_t k = 0; k < n; k++) tmp[k] = dsc_bf16_to_fp32(dsc_fp32_to_bf16(v[k]));
            x = tmp;
        } else if (kind == 2) {
            for (int64_t k = 0; k < n; k++) tmp[k] = dsc_fp16_to_fp32(dsc_fp32_to_fp16(v[k]));
            x = tmp;
        }
        snprintf(mine, sizeof mine, "%016llx", (unsigned long long)digest(x, n));
        if (!strcmp(mine, hex)) return true;
    }
    return false;
}

static dsc_status verify_one(const char *name, const char *hex, const char *ckpt,
                             const char *base_what, cli_base_reader read, void *user) {
    float *v = NULL;
    int64_t n = 0;
    bool owned = false;
    DSC_TRY(read(user, name, &v, &n, &owned));
    if (!v)
        return dsc_fail(DSC_ERR_INVALID_ARG, "checkpoint %s holds LoRA adapters trained on a base "
                        "with the tensor %s, which %s lacks; give the base model they were "
                        "trained on", ckpt, name, base_what);
    float *tmp = malloc((size_t)(n > 0 ? n : 1) * sizeof *tmp);
    dsc_status st = tmp ? DSC_OK : dsc_fail(DSC_ERR_OOM, "out of memory checking %s", name);
    if (st == DSC_OK && !base_matches(hex, v, n, tmp))
        st = dsc_fail(DSC_ERR_INVALID_ARG, "checkpoint %s holds LoRA adapters trained on another "
                      "base model: its tensor %s has other values in %s; give the base model the "
                      "adapters were trained on (merged into this one they would be wrong)",
                      ckpt, name, base_what);
    free(tmp);
    if (owned) free(v);
    return st;
}

dsc_status cli_base_verify(const char *sums_path, const char *ckpt, const char *base_what,
                           cli_base_reader read, void *user) {
    json_t *j = json_load_file(sums_path, 0, NULL);
    json_t *t = json_object_get(j, "tensors");
    dsc_status st = DSC_OK;
    if (!json_is_object(t)) {
        st = dsc_fail(DSC_ERR_CORRUPT, "checkpoint %s: its base_checksums.json is not readable",
                      ckpt);
    } else {
        const char *name;
        json_t *v;
        json_object_foreach(t, name, v) {
            const char *hex = json_string_value(v);
            st = hex ? verify_one(name, hex, ckpt, base_what, read, user)
                     : dsc_fail(DSC_ERR_CORRUPT, "checkpoint %s: base_checksums.json: %s is not "
                                "a string", ckpt, name);
            if (st != DSC_OK) break;
        }
    }
    json_decref(j);
    return st;
}

dsc_status cli_base_check(const char *saved_path, const char *now, const char *ckpt) {
    json_t *a = json_load_file(saved_path, 0, NULL), *b = json_loads(now, 0, NULL);
    json_t *ta = json_object_get(a, "tensors"), *tb = json_object_get(b, "tensors");
    dsc_status st = DSC_OK;
    if (!json_is_object(ta) || !json_is_object(tb)) {
        st = dsc_fail(DSC_ERR_CORRUPT, "checkpoint %s: its base_checksums.json is not readable",
                      ckpt);
    } else {
        const char *name;
        json_t *v;
        json_object_foreach(ta, name, v) {
            const char *mine = json_string_value(json_object_get(tb, name));
            if (mine && !strcmp(mine, json_string_value(v))) continue;
            st = dsc_fail(DSC_ERR_INVALID_ARG, "checkpoint %s holds LoRA adapters trained on another "
                          "base model: its tensor %s %s; give the --model it was trained from",
                          ckpt, name, mine ? "has other values here" : "is not in this model");
            break;
        }
        if (st == DSC_OK && json_object_size(ta) != json_object_size(tb))
            st = dsc_fail(DSC_ERR_INVALID_ARG, "checkpoint %s holds LoRA adapters trained on a "
                          "base of %zu frozen tensors; this one has %zu; give the --model it was "
                          "trained from", ckpt, json_object_size(ta), json_object_size(tb));
    }
    json_decref(a);
    json_decref(b);
    return st;
}

dsc_status cli_base_open_failed(dsc_status st, const char *what, const char *base,
                                const char *why) {
    struct stat sb;
    if (stat(base, &sb) == 0 && S_ISDIR(sb.st_mode))
        return dsc_fail(st, "%s reads its base model: %s", what, why);
    return dsc_fail(st, "%s reads its base model, which adapter_config.json's "
                    "base_model_name_or_path names \"%s\": %s. It is no folder here: a run "
                    "on a built-in model (random initial weights) stores no base; train on a "
                    "Hugging Face folder (--model hf:DIR), or, where that base's folder is "
                    "elsewhere, export the adapters (dsc ckpt export CKPT --peft DIR) and use "
                    "them with it (--model hf:BASE --adapter DIR)", what, base, why);
}
