// data/chat.c - a model's chat template: found (tokenizer_config.json's chat_template, a
// chat_template.jinja beside it, a Jinja file, or ChatML), compiled (data/jinja.h), rendered as
// apply_chat_template renders it, and the assistant spans of a rendering (see chat.h).
#include "data/chat.h"

#include <errno.h>    // errno
#include <stdio.h>    // FILE, fopen, fread, snprintf
#include <stdlib.h>   // calloc, free, malloc
#include <string.h>   // memcmp, strcmp, strerror, strlen, strrchr
#include <sys/stat.h> // stat, S_ISDIR

#include "base/io.h"     // dsc__fopen_regular
#include "base/status.h" // dsc__fail, DSC_TRY
#include "data/jinja.h"  // dsc_jinja_*

struct dsc_chat_template {
    dsc_jinja *jinja;
    json_t *vars; // the special tokens (bos_token, eos_token, ...) the template sees
    char *eot;    // the text the template closes an assistant turn with ("" if none)
};

// ChatML, as a template (dsc's default, and `--chat-template chatml`).
static const char chatml[] =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

// The special tokens apply_chat_template passes (transformers' special_tokens_map).
static const char *const special[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                      "pad_token", "cls_token", "mask_token", NULL};

// ---- internal: reading files ----

static dsc_status slurp(const char *path, const char *what, char **out) {
    FILE *f;
    if (dsc__fopen_regular(path, &f) != DSC_OK) { // a FIFO in its place would hang the read
        char why[1024];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        return dsc__fail(DSC_ERR_IO, "%s: %s", what, why);
    }
    char *s = NULL, buf[8192];
    size_t n = 0, k;
    bool ok = true;
    while (ok && (k = fread(buf, 1, sizeof buf, f)) > 0) {
        char *p = realloc(s, n + k + 1);
        if ((ok = p != NULL)) memcpy(p + n, buf, k), n += k, s = p;
    }
    fclose(f);
    if (!ok || (!s && !(s = calloc(1, 1)))) {
        free(s);
        return dsc__fail(DSC_ERR_OOM, "%s %s: out of memory", what, path);
    }
    s[n] = '\0';
    *out = s;
    return DSC_OK;
}

static dsc_status load_json(const char *path, json_t **out) {
    json_error_t e;
    FILE *f;
    DSC_TRY(dsc__fopen_regular(path, &f));
    // Integers as reals: transformers writes model_max_length values beyond 64 bits.
    *out = json_loadf(f, JSON_DECODE_INT_AS_REAL, &e);
    fclose(f);
    if (!*out) return dsc__fail(DSC_ERR_CORRUPT, "%s: line %d: %s", path, e.line, e.text);
    return DSC_OK;
}

static bool exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISDIR(sb.st_mode);
}

// A special token of tokenizer_config.json: a string, or {"content": ...}.
static json_t *token_value(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? v : NULL;
}

static json_t *special_vars(json_t *cfg) {
    json_t *vars = json_object();
    for (int k = 0; vars && special[k]; k++) {
        json_t *v = token_value(cfg, special[k]);
        if (v) json_object_set(vars, special[k], v);
    }
    json_t *extra = json_object_get(cfg, "additional_special_tokens");
    if (vars && json_is_array(extra)) json_object_set(vars, "additional_special_tokens", extra);
    return vars;
}

// "chat_template": a string, or a list of {"name", "template"} (the one named "default").
static dsc_status template_text(json_t *cfg, const char *path, const char **out) {
    json_t *v = json_object_get(cfg, "chat_template");
    *out = json_string_value(v);
    if (*out) return DSC_OK;
    size_t i;
    json_t *e;
    char names[512] = "";
    json_array_foreach(v, i, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && !strcmp(name, "default"))
            *out = json_string_value(json_object_get(e, "template"));
        size_t n = strlen(names);
        snprintf(names + n, sizeof names - n, "%s%s", n ? ", " : "", name ? name : "?");
    }
    if (*out) return DSC_OK;
    if (json_is_array(v))
        return dsc__fail(DSC_ERR_CONFIG, "%s: the chat_template list (%s) has no template named "
                         "\"default\"; pass --chat-template with a file holding the one to use",
                         path, names);
    return dsc__fail(DSC_ERR_CONFIG, "%s has no \"chat_template\"; pass --chat-template chatml or "
                     "a Jinja file", path);
}

// ---- internal: making a template ----

static dsc_status end_of_turn(dsc_chat_template *t);

static dsc_status create(const char *jinja, const char *name, json_t *vars,
                         dsc_chat_template **out) {
    dsc_chat_template *t = calloc(1, sizeof *t);
    if (!t) return dsc__fail(DSC_ERR_OOM, "chat template: out of memory");
    t->vars = vars ? json_deep_copy(vars) : json_object();
    dsc_status st = t->vars ? dsc_jinja_compile(jinja, name, &t->jinja)
                            : dsc__fail(DSC_ERR_OOM, "chat template: out of memory");
    if (st == DSC_OK) st = end_of_turn(t);
    if (st != DSC_OK) {
        dsc_chat_template_destroy(t);
        return st;
    }
    *out = t;
    return DSC_OK;
}

// The template of a folder: chat_template.jinja (transformers 5 writes it; it takes precedence,
// as there), else tokenizer_config.json's chat_template; the special tokens from the latter.
static dsc_status load_dir(const char *dir, dsc_chat_template **out, char *note, size_t cap,
                           bool required) {
    char cfg_path[4200], jinja_path[4200], name[4300];
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    snprintf(jinja_path, sizeof jinja_path, "%s/chat_template.jinja", dir);
    json_t *cfg = NULL;
    char *text = NULL;
    const char *src = NULL;
    dsc_status st = DSC_OK;
    if (exists(cfg_path)) st = load_json(cfg_path, &cfg);
    if (st == DSC_OK && exists(jinja_path)) {
        st = slurp(jinja_path, "chat template", &text);
        src = text;
        snprintf(name, sizeof name, "chat template %s", jinja_path);
        snprintf(note, cap, "%s", jinja_path);
    } else if (st == DSC_OK && cfg && json_object_get(cfg, "chat_template")) {
        st = template_text(cfg, cfg_path, &src);
        snprintf(name, sizeof name, "chat_template of %s", cfg_path);
        snprintf(note, cap, "%s", name);
    } else if (st == DSC_OK && required) {
        st = dsc__fail(DSC_ERR_CONFIG, "%s holds neither chat_template.jinja nor a "
                       "tokenizer_config.json with a chat_template; pass --chat-template chatml "
                       "or a Jinja file", dir);
    } else if (st == DSC_OK) {
        snprintf(note, cap, "chatml (default: %s has no chat template)", dir);
    }
    json_t *vars = cfg ? special_vars(cfg) : NULL;
    if (st == DSC_OK) st = src ? create(src, name, vars, out)
                               : dsc_chat_template_create(chatml, NULL, NULL, out);
    json_decref(vars);
    json_decref(cfg);
    free(text);
    return st;
}

static dsc_status load_config(const char *path, dsc_chat_template **out, char *note,
                              size_t cap) {
    json_t *cfg;
    DSC_TRY(load_json(path, &cfg));
    const char *src;
    char name[4300];
    snprintf(name, sizeof name, "chat_template of %s", path);
    dsc_status st = template_text(cfg, path, &src);
    json_t *vars = special_vars(cfg);
    if (st == DSC_OK) st = create(src, name, vars, out);
    if (st == DSC_OK) snprintf(note, cap, "%s", name);
    json_decref(vars);
    json_decref(cfg);
    return st;
}

// A Jinja file; the special tokens from the tokenizer's folder when it is hf:DIR.
static dsc_status load_file(const char *path, const char *tokenizer_spec, dsc_chat_template **out,
                            char *note, size_t cap) {
    char *text, cfg_path[4200], name[4300];
    DSC_TRY(slurp(path, "--chat-template", &text));
    json_t *cfg = NULL;
    dsc_status st = DSC_OK;
    if (tokenizer_spec && !strncmp(tokenizer_spec, "hf:", 3)) {
        snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", tokenizer_spec + 3);
        if (exists(cfg_path)) st = load_json(cfg_path, &cfg);
    }
    json_t *vars = cfg ? special_vars(cfg) : NULL;
    snprintf(name, sizeof name, "chat template %s", path);
    if (st == DSC_OK) st = create(text, name, vars, out);
    if (st == DSC_OK) snprintf(note, cap, "%s", path);
    json_decref(vars);
    json_decref(cfg);
    free(text);
    return st;
}

// ---- internal: rendering ----

static json_t *variables(const dsc_chat_template *t, json_t *messages, json_t *tools, bool agp) {
    json_t *v = json_copy(t->vars);
    if (!v) return NULL;
    json_object_set(v, "messages", messages);
    json_object_set_new(v, "tools", tools ? json_incref(tools) : json_null());
    json_object_set_new(v, "documents", json_null());
    json_object_set_new(v, "add_generation_prompt", json_boolean(agp));
    return v;
}

static dsc_status check_messages(json_t *messages) {
    if (!json_is_array(messages))
        return dsc__fail(DSC_ERR_INVALID_ARG, "\"messages\" must be an array of {\"role\", "
                         "\"content\"} objects");
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_string(json_object_get(m, "role")))
            return dsc__fail(DSC_ERR_INVALID_ARG, "messages[%zu] needs a string \"role\"", i);
    }
    return DSC_OK;
}

// The first k messages.
static json_t *head(json_t *messages, size_t k) {
    json_t *h = json_array();
    for (size_t i = 0; h && i < k; i++) json_array_append(h, json_array_get(messages, i));
    return h;
}

static dsc_status render_head(const dsc_chat_template *t, json_t *messages, size_t k,
                              json_t *tools, bool agp, char **out, size_t *len) {
    json_t *h = head(messages, k);
    dsc_status st = h ? dsc__chat_render(t, h, tools, agp, out, len)
                      : dsc__fail(DSC_ERR_OOM, "chat: out of memory");
    json_decref(h);
    return st;
}

static bool is_prefix(const char *p, size_t pn, const char *s, size_t sn) {
    return pn <= sn && !memcmp(p, s, pn);
}

// The span of assistant message i in the whole render (text, len); at: where the last one ended.
static dsc_status span_of(const dsc_chat_template *t, json_t *messages, json_t *tools, size_t i,
                          const char *text, size_t len, size_t *at, dsc_chat_span *sp) {
    char *p = NULL, *q = NULL;
    size_t pn = 0, qn = 0;
    dsc_status st = render_head(t, messages, i, tools, true, &p, &pn);
    if (st == DSC_OK) st = render_head(t, messages, i + 1, tools, false, &q, &qn);
    if (st == DSC_OK && (!is_prefix(p, pn, text, len) || !is_prefix(q, qn, text, len) ||
                         pn < *at || qn < pn))
        st = dsc__fail(DSC_ERR_INVALID_ARG, "the chat template renders the turns before "
                       "messages[%zu] (assistant) differently once later messages follow (or its "
                       "generation prompt is not how the assistant turn starts), so the "
                       "assistant's text cannot be told apart; use a template that renders each "
                       "turn the same whatever follows", i);
    if (st == DSC_OK) *sp = (dsc_chat_span){pn, qn}, *at = qn;
    free(p);
    free(q);
    return st;
}

// The end of an assistant turn: what the template writes after an assistant message's text, as
// a probe conversation shows it; white space around it dropped.
static dsc_status end_of_turn(dsc_chat_template *t) {
    static const char probe[] = "dsc-end-of-turn-probe";
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "hi", "role",
                             "assistant", "content", probe);
    char *text = NULL;
    size_t len = 0;
    dsc_status st = msgs ? DSC_OK : dsc__fail(DSC_ERR_OOM, "chat: out of memory");
    if (st == DSC_OK && dsc__chat_render(t, msgs, NULL, false, &text, &len) != DSC_OK)
        text = NULL; // a template that refuses this conversation: no end of turn known
    const char *hit = text ? strstr(text, probe) : NULL;
    const char *s = hit ? hit + strlen(probe) : "";
    size_t n = strlen(s);
    while (n && strchr(" \t\r\n", s[n - 1])) n--;
    while (n && strchr(" \t\r\n", *s)) s++, n--;
    if (st == DSC_OK && !(t->eot = strndup(s, n))) st = dsc__fail(DSC_ERR_OOM, "out of memory");
    free(text);
    json_decref(msgs);
    return st;
}

// ---- internal API ----

dsc_status dsc__chat_render(const dsc_chat_template *t, json_t *messages, json_t *tools,
                            bool add_generation_prompt, char **out, size_t *len) {
    DSC_TRY(check_messages(messages));
    json_t *v = variables(t, messages, json_is_null(tools) ? NULL : tools, add_generation_prompt);
    if (!v) return dsc__fail(DSC_ERR_OOM, "chat: out of memory");
    dsc_status st = dsc_jinja_render(t->jinja, v, out, len);
    json_decref(v);
    return st;
}

dsc_status dsc__chat_render_spans(const dsc_chat_template *t, json_t *messages, json_t *tools,
                                  char **text, size_t *len, dsc_chat_span **spans, int *nspans) {
    *spans = NULL;
    *nspans = 0;
    DSC_TRY(dsc__chat_render(t, messages, tools, false, text, len));
    size_t n = json_array_size(messages), at = 0;
    dsc_chat_span *sp = calloc(n + 1, sizeof *sp);
    dsc_status st = sp ? DSC_OK : dsc__fail(DSC_ERR_OOM, "chat: out of memory");
    int k = 0;
    for (size_t i = 0; st == DSC_OK && i < n; i++) {
        const char *role = json_string_value(json_object_get(json_array_get(messages, i), "role"));
        if (!strcmp(role, "assistant"))
            st = span_of(t, messages, tools, i, *text, *len, &at, &sp[k++]);
    }
    if (st != DSC_OK) {
        free(sp);
        free(*text);
        *text = NULL;
        return st;
    }
    *spans = sp;
    *nspans = k;
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc_chat_template_create(const char *jinja, const char *bos, const char *eos,
                                    dsc_chat_template **out) {
    *out = NULL;
    json_t *vars = json_object();
    if (vars && bos) json_object_set_new(vars, "bos_token", json_string(bos));
    if (vars && eos) json_object_set_new(vars, "eos_token", json_string(eos));
    dsc_status st = vars ? create(jinja, "chat template", vars, out)
                         : dsc__fail(DSC_ERR_OOM, "chat: out of memory");
    json_decref(vars);
    return st;
}

dsc_status dsc_chat_template_load(const char *spec, const char *tokenizer_spec,
                                  dsc_chat_template **out, char *note, size_t cap) {
    *out = NULL;
    snprintf(note, cap, "chatml (default)");
    if (spec && !strcmp(spec, "chatml")) {
        snprintf(note, cap, "chatml");
        return dsc_chat_template_create(chatml, NULL, NULL, out);
    }
    if (!spec) { // the tokenizer's folder, if it has one
        char dir[4200] = "";
        if (tokenizer_spec && !strncmp(tokenizer_spec, "hf:", 3))
            snprintf(dir, sizeof dir, "%s", tokenizer_spec + 3);
        else if (tokenizer_spec && strrchr(tokenizer_spec, '/') &&
                 strlen(tokenizer_spec) > 5 &&
                 !strcmp(tokenizer_spec + strlen(tokenizer_spec) - 5, ".json"))
            snprintf(dir, sizeof dir, "%.*s", (int)(strrchr(tokenizer_spec, '/') - tokenizer_spec),
                     tokenizer_spec);
        if (dir[0]) return load_dir(dir, out, note, cap, false);
        return dsc_chat_template_create(chatml, NULL, NULL, out);
    }
    struct stat sb;
    if (stat(spec, &sb) != 0)
        return dsc__fail(DSC_ERR_IO, "--chat-template %s: %s; give chatml, a "
                         "tokenizer_config.json, its folder or a Jinja file", spec,
                         strerror(errno));
    if (S_ISDIR(sb.st_mode)) return load_dir(spec, out, note, cap, true);
    size_t n = strlen(spec);
    if (n >= 5 && !strcmp(spec + n - 5, ".json")) return load_config(spec, out, note, cap);
    return load_file(spec, tokenizer_spec, out, note, cap);
}

void dsc_chat_template_destroy(dsc_chat_template *t) {
    if (!t) return;
    dsc_jinja_destroy(t->jinja);
    json_decref(t->vars);
    free(t->eot);
    free(t);
}

const char *dsc_chat_template_end_of_turn(const dsc_chat_template *t) { return t->eot; }

// The conversation of a JSON text: an array of messages, or {"messages": [...], "tools": [...]}.
static dsc_status parse_conversation(const char *json, json_t **root, json_t **msgs,
                                     json_t **tools) {
    json_error_t e;
    *root = json_loads(json, 0, &e);
    if (!*root)
        return dsc__fail(DSC_ERR_INVALID_ARG, "conversation: not valid JSON (column %d: %s)",
                         e.column, e.text);
    *msgs = json_is_array(*root) ? *root : json_object_get(*root, "messages");
    *tools = json_is_object(*root) ? json_object_get(*root, "tools") : NULL;
    if (!json_is_array(*msgs) || json_array_size(*msgs) == 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "conversation: give a non-empty array of messages, "
                         "or an object with \"messages\" (and \"tools\")");
    return DSC_OK;
}

dsc_status dsc_chat_apply(const dsc_chat_template *t, const char *conversation,
                          bool add_generation_prompt, char **text, size_t *len,
                          dsc_chat_span **spans, int *nspans) {
    json_t *root, *msgs, *tools;
    dsc_status st = parse_conversation(conversation, &root, &msgs, &tools);
    if (st == DSC_OK && spans && !add_generation_prompt)
        st = dsc__chat_render_spans(t, msgs, tools, text, len, spans, nspans);
    else if (st == DSC_OK)
        st = dsc__chat_render(t, msgs, tools, add_generation_prompt, text, len);
    if (st == DSC_OK && spans && add_generation_prompt) *spans = NULL, *nspans = 0;
    json_decref(root);
    return st;
}
