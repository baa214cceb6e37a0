// model/hf_config.c - config.json of a Hugging Face model folder, read and written.
#include "model/hf_config.h"

#include <errno.h>   // errno
#include <jansson.h> // json_*
#include <math.h>    // isfinite
#include <stdio.h>   // snprintf, fopen
#include <stdlib.h>  // free
#include <string.h>  // strcmp, strerror
#include <sys/stat.h> // stat, S_ISDIR

#include "base/io.h"     // dsc__fopen_regular
#include "base/status.h" // dsc__fail, DSC_TRY

static const struct {
    const char *name, *model_type;
    dsc_hf_arch arch;
} archs[] = {
    {"GPT2LMHeadModel", "gpt2", DSC_HF_GPT2},
    {"LlamaForCausalLM", "llama", DSC_HF_LLAMA},
    {"Qwen2ForCausalLM", "qwen2", DSC_HF_QWEN2},
    {"MistralForCausalLM", "mistral", DSC_HF_MISTRAL},
    {"Qwen3ForCausalLM", "qwen3", DSC_HF_QWEN3},
};
#define NARCHS (int)(sizeof archs / sizeof archs[0])

const char *dsc_hf_supported(void) {
    return "GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM, "
           "Qwen3ForCausalLM";
}

// ---- reading ----

typedef struct reader {
    const char *path;
    json_t *root;
} reader;

// A field that is absent or null keeps *out (the family's default).
static dsc_status get_int(const reader *r, const char *key, int *out) {
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) return DSC_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 0x7fffffff)
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"%s\" must be a non-negative integer below 2^31",
                         r->path, key);
    *out = (int)json_integer_value(v);
    return DSC_OK;
}

static dsc_status get_real(const reader *r, const json_t *obj, const char *key, double *out) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return DSC_OK;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"%s\" must be a number", r->path, key);
    *out = json_number_value(v);
    return DSC_OK;
}

static dsc_status get_bool(const reader *r, const char *key, bool *out) {
    json_t *v = json_object_get(r->root, key);
    if (!v || json_is_null(v)) return DSC_OK;
    if (!json_is_boolean(v))
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"%s\" must be true or false", r->path, key);
    *out = json_is_true(v);
    return DSC_OK;
}

static dsc_status get_str(const reader *r, const json_t *obj, const char *key, char *out,
                          size_t cap) {
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return DSC_OK;
    if (!json_is_string(v) || strlen(json_string_value(v)) >= cap)
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"%s\" must be a string of under %zu characters",
                         r->path, key, cap);
    snprintf(out, cap, "%s", json_string_value(v));
    return DSC_OK;
}

// "architectures": ["LlamaForCausalLM"]; a config saved without a model (no architectures) is
// known by its model_type.
static dsc_status read_arch(const reader *r, dsc_hf_config *c) {
    json_t *a = json_object_get(r->root, "architectures");
    json_t *mt = json_object_get(r->root, "model_type");
    const char *name = NULL, *type = json_is_string(mt) ? json_string_value(mt) : NULL;
    if (json_is_array(a) && json_array_size(a) == 1 && json_is_string(json_array_get(a, 0)))
        name = json_string_value(json_array_get(a, 0));
    else if ((a && !json_is_null(a)) || !type)
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"architectures\" must be a list of one name (one "
                         "of %s)", r->path, dsc_hf_supported());
    for (int i = 0; i < NARCHS; i++) {
        if (name ? strcmp(archs[i].name, name) : strcmp(archs[i].model_type, type)) continue;
        c->arch = archs[i].arch;
        snprintf(c->architecture, sizeof c->architecture, "%s", archs[i].name);
        snprintf(c->model_type, sizeof c->model_type, "%s", archs[i].model_type);
        return DSC_OK;
    }
    if (!name)
        return dsc__fail(DSC_ERR_CONFIG, "%s: model_type \"%.64s\" (and no architectures): dsc "
                         "trains %s", r->path, type, dsc_hf_supported());
    return dsc__fail(DSC_ERR_CONFIG, "%s: architectures is [\"%.64s\"], which dsc does not "
                     "train; supported: %s", r->path, name, dsc_hf_supported());
}

static dsc_status read_eos(const reader *r, dsc_hf_config *c) {
    json_t *v = json_object_get(r->root, "eos_token_id");
    if (!v || json_is_null(v)) return DSC_OK;
    c->n_eos = 0;
    if (json_is_integer(v)) {
        c->eos_ids[c->n_eos++] = (int)json_integer_value(v);
    } else if (json_is_array(v) && json_array_size(v) <= DSC_HF_MAX_EOS) {
        size_t i;
        json_t *e;
        json_array_foreach(v, i, e) {
            if (!json_is_integer(e)) break;
            c->eos_ids[c->n_eos++] = (int)json_integer_value(e);
        }
        if (c->n_eos != (int)json_array_size(v)) c->n_eos = -1;
    } else {
        c->n_eos = -1;
    }
    if (c->n_eos < 0)
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"eos_token_id\" must be an integer or a list of "
                         "at most %d integers", r->path, DSC_HF_MAX_EOS);
    return DSC_OK;
}

// ---- the rotary embedding, in either spelling ----

// What one spelling says about the rotary embedding. Factors absent from the file are NAN.
// stated: the spelling names a type (4.x: "rope_scaling" present, null meaning "default"; 5.x:
// "rope_parameters" present).
typedef struct rope_spec {
    const char *field; // "rope_scaling" or "rope_parameters", for messages
    bool stated;
    char type[16];
    double theta, factor, low, high, orig_max, partial;
} rope_spec;

static rope_spec rope_none(const char *field) {
    return (rope_spec){.field = field, .theta = NAN, .factor = NAN, .low = NAN, .high = NAN,
                       .orig_max = NAN, .partial = NAN};
}

// A number at obj[key] into *out (NAN when absent or null); where names it in messages.
static dsc_status opt_real(const reader *r, const json_t *obj, const char *where, const char *key,
                           double *out) {
    json_t *v = json_object_get(obj, key);
    *out = NAN;
    if (!v || json_is_null(v)) return DSC_OK;
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"%s%s%s\" must be a number", r->path, where,
                         where[0] ? "." : "", key);
    *out = json_number_value(v);
    return DSC_OK;
}

// "rope_type", or the older "type" (transformers reads either; both present must agree).
static dsc_status rope_type_of(const reader *r, const json_t *o, const char *where, rope_spec *s) {
    char a[16] = "", b[16] = "";
    DSC_TRY(get_str(r, o, "rope_type", a, sizeof a));
    DSC_TRY(get_str(r, o, "type", b, sizeof b));
    if (a[0] && b[0] && strcmp(a, b) != 0)
        return dsc__fail(DSC_ERR_CONFIG, "%s: %s names rope_type \"%s\" and type \"%s\"; keep "
                         "one of them", r->path, where, a, b);
    snprintf(s->type, sizeof s->type, "%s", a[0] ? a : b);
    return DSC_OK;
}

// One rope object: {"rope_type", "rope_theta", "factor", ...}.
static dsc_status rope_object(const reader *r, const json_t *o, const char *where, rope_spec *s) {
    if (!json_is_object(o))
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"%s\" must be null or an object", r->path, where);
    s->stated = true;
    DSC_TRY(rope_type_of(r, o, where, s));
    DSC_TRY(opt_real(r, o, where, "rope_theta", &s->theta));
    DSC_TRY(opt_real(r, o, where, "factor", &s->factor));
    DSC_TRY(opt_real(r, o, where, "low_freq_factor", &s->low));
    DSC_TRY(opt_real(r, o, where, "high_freq_factor", &s->high));
    DSC_TRY(opt_real(r, o, where, "original_max_position_embeddings", &s->orig_max));
    return opt_real(r, o, where, "partial_rotary_factor", &s->partial);
}

static bool same_real(double a, double b) {
    return (isnan(a) && isnan(b)) || a == b;
}

static bool same_rope(const rope_spec *a, const rope_spec *b) {
    return !strcmp(a->type, b->type) && same_real(a->factor, b->factor) &&
           same_real(a->low, b->low) && same_real(a->high, b->high) &&
           same_real(a->orig_max, b->orig_max);
}

// 4.x: "rope_theta" and "rope_scaling" (null, or {"rope_type" or "type", "factor", ...}) at the
// top level, and some families' top-level "partial_rotary_factor".
static dsc_status rope_v4(const reader *r, rope_spec *s) {
    *s = rope_none("rope_scaling");
    DSC_TRY(opt_real(r, r->root, "", "rope_theta", &s->theta));
    DSC_TRY(opt_real(r, r->root, "", "partial_rotary_factor", &s->partial));
    json_t *o = json_object_get(r->root, "rope_scaling");
    if (!o) return DSC_OK;
    if (json_is_null(o)) {
        s->stated = true;
        snprintf(s->type, sizeof s->type, "default");
        return DSC_OK;
    }
    double theta = s->theta, partial = s->partial;
    DSC_TRY(rope_object(r, o, "rope_scaling", s));
    if (!s->type[0])
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"rope_scaling\" names no \"rope_type\"", r->path);
    s->theta = theta, s->partial = isnan(s->partial) ? partial : s->partial;
    return DSC_OK;
}

// Layer-type keys under which transformers 5 may nest one rope object per kind of layer.
static const char *const layer_kinds[] = {"full_attention", "sliding_attention"};

// 5.x: "rope_parameters": {"rope_theta", "rope_type", factors}, or one such object per kind of
// layer ({"full_attention": {...}, "sliding_attention": {...}}), which must then all agree: dsc
// gives every layer the same rotation.
static dsc_status rope_v5(const reader *r, rope_spec *s) {
    *s = rope_none("rope_parameters");
    json_t *o = json_object_get(r->root, "rope_parameters");
    if (!o || json_is_null(o)) return DSC_OK;
    int nested = 0;
    for (int k = 0; k < 2; k++) {
        json_t *sub = json_object_get(o, layer_kinds[k]);
        if (!sub) continue;
        char where[64];
        snprintf(where, sizeof where, "rope_parameters.%s", layer_kinds[k]);
        rope_spec one = rope_none("rope_parameters");
        DSC_TRY(rope_object(r, sub, where, &one));
        if (nested++ && (!same_rope(s, &one) || !same_real(s->theta, one.theta)))
            return dsc__fail(DSC_ERR_CONFIG, "%s: rope_parameters gives full_attention and "
                             "sliding_attention layers different rotary embeddings; dsc rotates "
                             "every layer alike (one rope_parameters object)", r->path);
        *s = one;
    }
    if (!nested) DSC_TRY(rope_object(r, o, "rope_parameters", s));
    if (!s->type[0]) snprintf(s->type, sizeof s->type, "default"); // transformers 5's default
    return DSC_OK;
}

static dsc_status rope_disagree(const reader *r, const char *what, const char *a,
                                const char *b) {
    return dsc__fail(DSC_ERR_CONFIG, "%s: the transformers 4 and 5 spellings disagree on %s: %s "
                     "but %s (transformers 4 reads the first, 5 the second, so the file means two "
                     "models); keep one spelling, or make them equal", r->path, what, a, b);
}

// "rope_scaling says rope_type \"linear\" with factor 2", naming only the factors given.
static const char *rope_text(const rope_spec *s, char *buf, size_t cap) {
    const struct {
        const char *key;
        double v;
    } f[] = {{"factor", s->factor}, {"low_freq_factor", s->low}, {"high_freq_factor", s->high},
             {"original_max_position_embeddings", s->orig_max}};
    int n = snprintf(buf, cap, "%s says rope_type \"%s\"", s->field, s->type);
    for (size_t i = 0; i < sizeof f / sizeof f[0] && n > 0 && (size_t)n < cap; i++)
        if (!isnan(f[i].v)) n += snprintf(buf + n, cap - (size_t)n, " %s %g", f[i].key, f[i].v);
    return buf;
}

// The factors each implemented type needs (transformers fails without them, so a missing one is
// the file's error, not a default).
static dsc_status rope_required(const reader *r, const rope_spec *s) {
    const struct {
        const char *key;
        double v;
    } need[] = {{"factor", s->factor}, {"low_freq_factor", s->low},
                {"high_freq_factor", s->high},
                {"original_max_position_embeddings", s->orig_max}};
    int n = !strcmp(s->type, "linear") ? 1 : !strcmp(s->type, "llama3") ? 4 : 0;
    for (int i = 0; i < n; i++)
        if (isnan(need[i].v))
            return dsc__fail(DSC_ERR_CONFIG, "%s: %s has rope_type \"%s\" but no \"%s\" (%s "
                             "needs factor%s)", r->path, s->field, s->type, need[i].key, s->type,
                             n > 1 ? ", low_freq_factor, high_freq_factor and "
                                     "original_max_position_embeddings" : "");
    return DSC_OK;
}

static dsc_status read_rope(const reader *r, dsc_hf_config *c) {
    rope_spec v4, v5;
    DSC_TRY(rope_v4(r, &v4));
    DSC_TRY(rope_v5(r, &v5));
    char a[200], b[200];
    if (!isnan(v4.theta) && !isnan(v5.theta) && v4.theta != v5.theta) {
        snprintf(a, sizeof a, "rope_theta is %g", v4.theta);
        snprintf(b, sizeof b, "rope_parameters.rope_theta is %g", v5.theta);
        return rope_disagree(r, "the RoPE base", a, b);
    }
    if (v4.stated && v5.stated && !same_rope(&v4, &v5))
        return rope_disagree(r, "the RoPE scaling", rope_text(&v4, a, sizeof a),
                             rope_text(&v5, b, sizeof b));
    if (!isnan(v4.partial) && !isnan(v5.partial) && v4.partial != v5.partial) {
        snprintf(a, sizeof a, "partial_rotary_factor is %g", v4.partial);
        snprintf(b, sizeof b, "rope_parameters.partial_rotary_factor is %g", v5.partial);
        return rope_disagree(r, "the rotated share of a head", a, b);
    }
    const rope_spec *s = v5.stated ? &v5 : &v4;
    if (s->stated) {
        DSC_TRY(rope_required(r, s));
        snprintf(c->rope_type, sizeof c->rope_type, "%s", s->type);
    }
    if (!isnan(v5.theta) || !isnan(v4.theta)) c->rope_theta = isnan(v5.theta) ? v4.theta : v5.theta;
    if (!isnan(s->factor)) c->rope_factor = s->factor;
    if (!isnan(s->low)) c->rope_low_freq = s->low;
    if (!isnan(s->high)) c->rope_high_freq = s->high;
    if (!isnan(s->orig_max)) c->rope_orig_max = (int)s->orig_max;
    c->rope_partial = isnan(v5.partial) ? (isnan(v4.partial) ? 1.0 : v4.partial) : v5.partial;
    return DSC_OK;
}

// transformers' defaults for each family (its config classes' constructor arguments).
static void family_defaults(dsc_hf_config *c) {
    c->bos_id = -1;
    c->rope_theta = 10000.0;
    snprintf(c->rope_type, sizeof c->rope_type, "default");
    c->rope_factor = 1.0;
    c->rope_partial = 1.0;
    c->scale_attn_weights = true;
    snprintf(c->act, sizeof c->act, "silu");
    switch (c->arch) {
    case DSC_HF_GPT2:
        c->vocab_size = 50257, c->max_positions = 1024, c->hidden = 768, c->n_layer = 12;
        c->n_head = 12, c->norm_eps = 1e-5, c->tied = true, c->bos_id = 50256;
        c->eos_ids[0] = 50256, c->n_eos = 1, c->rope_theta = 0;
        snprintf(c->act, sizeof c->act, "gelu_new");
        snprintf(c->rope_type, sizeof c->rope_type, "none");
        break;
    case DSC_HF_LLAMA:
        c->vocab_size = 32000, c->hidden = 4096, c->intermediate = 11008, c->n_layer = 32;
        c->n_head = 32, c->max_positions = 2048, c->norm_eps = 1e-6, c->bos_id = 1;
        c->eos_ids[0] = 2, c->n_eos = 1;
        break;
    case DSC_HF_QWEN2:
        c->vocab_size = 151936, c->hidden = 4096, c->intermediate = 22016, c->n_layer = 32;
        c->n_head = 32, c->max_positions = 32768, c->norm_eps = 1e-6, c->qkv_bias = true;
        break;
    case DSC_HF_MISTRAL:
        c->vocab_size = 32000, c->hidden = 4096, c->intermediate = 14336, c->n_layer = 32;
        c->n_head = 32, c->n_kv_head = 8, c->max_positions = 4096 * 32, c->norm_eps = 1e-6;
        c->sliding_window = 4096, c->bos_id = 1, c->eos_ids[0] = 2, c->n_eos = 1;
        break;
    case DSC_HF_QWEN3: // Qwen3Config: head_dim 128 whatever the hidden size
        c->vocab_size = 151936, c->hidden = 4096, c->intermediate = 22016, c->n_layer = 32;
        c->n_head = 32, c->head_dim = 128, c->max_positions = 32768, c->norm_eps = 1e-6;
        break;
    }
}

static dsc_status read_gpt2(const reader *r, dsc_hf_config *c) {
    DSC_TRY(get_int(r, "vocab_size", &c->vocab_size));
    DSC_TRY(get_int(r, "n_positions", &c->max_positions));
    DSC_TRY(get_int(r, "n_embd", &c->hidden));
    DSC_TRY(get_int(r, "n_layer", &c->n_layer));
    DSC_TRY(get_int(r, "n_head", &c->n_head));
    DSC_TRY(get_int(r, "n_inner", &c->intermediate));
    DSC_TRY(get_real(r, r->root, "layer_norm_epsilon", &c->norm_eps));
    DSC_TRY(get_str(r, r->root, "activation_function", c->act, sizeof c->act));
    DSC_TRY(get_bool(r, "scale_attn_weights", &c->scale_attn_weights));
    DSC_TRY(get_bool(r, "scale_attn_by_inverse_layer_idx", &c->scale_attn_by_inverse_layer_idx));
    DSC_TRY(get_bool(r, "reorder_and_upcast_attn", &c->reorder_and_upcast_attn));
    if (!c->intermediate) c->intermediate = 4 * c->hidden;
    c->n_kv_head = c->n_head;
    return DSC_OK;
}

// ---- sliding windows and kinds of layers ----

// "layer_types" (transformers 5): one "full_attention" or "sliding_attention" per layer. Returns
// through *sliding how many layers slide; *given says whether the file has the field.
static dsc_status read_layer_types(const reader *r, int n_layer, int *sliding, bool *given) {
    json_t *a = json_object_get(r->root, "layer_types");
    *sliding = 0, *given = a && !json_is_null(a);
    if (!*given) return DSC_OK;
    if (!json_is_array(a) || (int)json_array_size(a) != n_layer)
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"layer_types\" must be a list of one entry per "
                         "layer (%d)", r->path, n_layer);
    for (int i = 0; i < n_layer; i++) {
        const char *t = json_string_value(json_array_get(a, (size_t)i));
        if (!t || (strcmp(t, layer_kinds[0]) && strcmp(t, layer_kinds[1])))
            return dsc__fail(DSC_ERR_CONFIG, "%s: layer_types[%d] is \"%.40s\"; dsc's decoder "
                             "layers are \"full_attention\" (or \"sliding_attention\" with a "
                             "window at least as long as the context)", r->path, i, t ? t : "?");
        *sliding += !strcmp(t, layer_kinds[1]);
    }
    return DSC_OK;
}

// Does layer_types[i] say "sliding_attention"? (read_layer_types checked the list.)
static bool slides(const reader *r, int i) {
    json_t *a = json_object_get(r->root, "layer_types");
    return !strcmp(json_string_value(json_array_get(a, (size_t)i)), layer_kinds[1]);
}

// Qwen2: the window is on when use_sliding_window is true and sliding_window not null; then the
// layers from max_window_layers on slide (4.x), or those layer_types marks (5.x, which writes
// the list it derives from the same fields: the two must agree).
static dsc_status read_qwen2_window(const reader *r, dsc_hf_config *c) {
    bool on = false, given;
    int window = 4096, n_types;
    DSC_TRY(get_bool(r, "use_sliding_window", &on));
    json_t *w = json_object_get(r->root, "sliding_window");
    if (w && json_is_null(w)) on = false;
    else DSC_TRY(get_int(r, "sliding_window", &window));
    c->max_window_layers = 28;
    DSC_TRY(get_int(r, "max_window_layers", &c->max_window_layers));
    DSC_TRY(read_layer_types(r, c->n_layer, &n_types, &given));
    c->sliding_window = on ? window : 0;
    if (!on) return DSC_OK;
    for (int i = 0; given && i < c->n_layer; i++)
        if (slides(r, i) != (i >= c->max_window_layers))
            return dsc__fail(DSC_ERR_CONFIG, "%s: the transformers 4 and 5 spellings disagree: "
                             "use_sliding_window with max_window_layers %d makes layer %d %s, but "
                             "layer_types says otherwise; keep one spelling, or make them equal",
                             r->path, c->max_window_layers, i,
                             i >= c->max_window_layers ? "slide" : "attend to everything");
    int from = c->max_window_layers < c->n_layer ? c->max_window_layers : c->n_layer;
    c->n_sliding_layers = given ? n_types : c->n_layer - from;
    return DSC_OK;
}

// Mistral: sliding_window (null: none) applies to every layer; transformers' Mistral does not
// read layer_types (it warns), so the list is only checked.
static dsc_status read_mistral_window(const reader *r, dsc_hf_config *c) {
    bool given;
    int n_types;
    json_t *w = json_object_get(r->root, "sliding_window");
    if (w && json_is_null(w)) c->sliding_window = 0;
    else DSC_TRY(get_int(r, "sliding_window", &c->sliding_window));
    DSC_TRY(read_layer_types(r, c->n_layer, &n_types, &given));
    c->n_sliding_layers = c->sliding_window > 0 ? c->n_layer : 0;
    return DSC_OK;
}

static dsc_status read_llama_like(const reader *r, dsc_hf_config *c) {
    DSC_TRY(get_int(r, "vocab_size", &c->vocab_size));
    DSC_TRY(get_int(r, "hidden_size", &c->hidden));
    DSC_TRY(get_int(r, "intermediate_size", &c->intermediate));
    DSC_TRY(get_int(r, "num_hidden_layers", &c->n_layer));
    DSC_TRY(get_int(r, "num_attention_heads", &c->n_head));
    DSC_TRY(get_int(r, "num_key_value_heads", &c->n_kv_head));
    DSC_TRY(get_int(r, "head_dim", &c->head_dim));
    DSC_TRY(get_int(r, "max_position_embeddings", &c->max_positions));
    DSC_TRY(get_real(r, r->root, "rms_norm_eps", &c->norm_eps));
    DSC_TRY(get_str(r, r->root, "hidden_act", c->act, sizeof c->act));
    DSC_TRY(get_real(r, r->root, "attention_dropout", &c->attention_dropout));
    DSC_TRY(read_rope(r, c));
    bool given;
    int n_types;
    switch (c->arch) {
    case DSC_HF_LLAMA: {
        bool attn_bias = false;
        DSC_TRY(get_bool(r, "attention_bias", &attn_bias));
        DSC_TRY(get_bool(r, "mlp_bias", &c->mlp_bias));
        c->qkv_bias = c->o_bias = attn_bias;
        // LlamaForCausalLM has no sliding window: every layer attends to all before it.
        DSC_TRY(read_layer_types(r, c->n_layer, &n_types, &given));
        break;
    }
    case DSC_HF_QWEN3: { // attention_bias biases o_proj too; the window is spelled as Qwen2's
        bool attn_bias = false;
        DSC_TRY(get_bool(r, "attention_bias", &attn_bias));
        c->qkv_bias = c->o_bias = attn_bias;
        DSC_TRY(read_qwen2_window(r, c));
        break;
    }
    case DSC_HF_QWEN2: DSC_TRY(read_qwen2_window(r, c)); break;
    case DSC_HF_MISTRAL: DSC_TRY(read_mistral_window(r, c)); break;
    case DSC_HF_GPT2: break;
    }
    if (!c->n_kv_head) c->n_kv_head = c->n_head;
    return DSC_OK;
}

// "torch_dtype" (4.x) and "dtype" (5.x; transformers 5 keeps dtype when both are given).
static dsc_status read_dtype(const reader *r, dsc_hf_config *c) {
    char a[16] = "", b[16] = "";
    DSC_TRY(get_str(r, r->root, "torch_dtype", a, sizeof a));
    DSC_TRY(get_str(r, r->root, "dtype", b, sizeof b));
    if (a[0] && b[0] && strcmp(a, b) != 0)
        return dsc__fail(DSC_ERR_CONFIG, "%s: the transformers 4 and 5 spellings disagree: "
                         "torch_dtype is \"%s\" but dtype is \"%s\"; keep one, or make them equal",
                         r->path, a, b);
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", b[0] ? b : a);
    return DSC_OK;
}

static dsc_status check_sizes(const reader *r, const dsc_hf_config *c) {
    const struct {
        const char *key;
        int v;
    } sizes[] = {{"vocab_size", c->vocab_size}, {"hidden size", c->hidden},
                 {"number of layers", c->n_layer}, {"number of heads", c->n_head},
                 {"num_key_value_heads", c->n_kv_head}, {"head_dim", c->head_dim},
                 {"intermediate size", c->intermediate}, {"context length", c->max_positions}};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i].v <= 0)
            return dsc__fail(DSC_ERR_CONFIG, "%s: the %s is %d; it must be positive", r->path,
                             sizes[i].key, sizes[i].v);
    if (c->n_head % c->n_kv_head)
        return dsc__fail(DSC_ERR_CONFIG, "%s: num_attention_heads %d is not a multiple of "
                         "num_key_value_heads %d", r->path, c->n_head, c->n_kv_head);
    if (!(c->norm_eps > 0))
        return dsc__fail(DSC_ERR_CONFIG, "%s: the normalisation epsilon must be positive", r->path);
    return DSC_OK;
}

dsc_status dsc_hf_config_parse(const char *text, const char *path, dsc_hf_config *out) {
    json_error_t e;
    reader r = {path, json_loads(text, JSON_REJECT_DUPLICATES, &e)};
    if (!r.root)
        return dsc__fail(DSC_ERR_CONFIG, "%s:%d:%d: %s (a config.json must be a JSON object)",
                         path, e.line, e.column, e.text);
    if (!json_is_object(r.root)) {
        const char *kind = json_is_array(r.root) ? "an array" : json_is_string(r.root) ? "a string"
                           : json_is_number(r.root) ? "a number" : "true, false or null";
        json_decref(r.root);
        return dsc__fail(DSC_ERR_CONFIG, "%s: the top level is %s; a config.json must be a JSON "
                         "object ({\"model_type\": ...} as transformers writes it)", path, kind);
    }
    dsc_hf_config c = {0};
    dsc_status st;
    DSC_TRY_GOTO(read_arch(&r, &c), st, done);
    family_defaults(&c);
    st = c.arch == DSC_HF_GPT2 ? read_gpt2(&r, &c) : read_llama_like(&r, &c);
    if (st != DSC_OK) goto done;
    DSC_TRY_GOTO(get_bool(&r, "tie_word_embeddings", &c.tied), st, done);
    DSC_TRY_GOTO(get_int(&r, "bos_token_id", &c.bos_id), st, done);
    DSC_TRY_GOTO(read_eos(&r, &c), st, done);
    DSC_TRY_GOTO(read_dtype(&r, &c), st, done);
    if (!c.head_dim && c.n_head > 0) c.head_dim = c.hidden / c.n_head;
    DSC_TRY_GOTO(check_sizes(&r, &c), st, done);
    *out = c;
done:
    json_decref(r.root);
    return st;
}

// DIR/config.json, or dir itself when it names a file.
static void config_path(const char *dir, char *path, size_t cap) {
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(path, cap, "%s/config.json", dir);
    else snprintf(path, cap, "%s", dir);
}

dsc_status dsc_hf_config_read(const char *dir, dsc_hf_config *out) {
    char path[4200];
    config_path(dir, path, sizeof path);
    FILE *f;
    if (dsc__fopen_regular(path, &f) != DSC_OK) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        return dsc__fail(DSC_ERR_IO, "%s (a Hugging Face model folder holds config.json beside "
                         "its weights)", why);
    }
    json_error_t e;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &e);
    fclose(f);
    if (!root)
        return dsc__fail(DSC_ERR_CONFIG, "%s:%d:%d: %s", path, e.line, e.column, e.text);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!text) return dsc__fail(DSC_ERR_OOM, "out of memory reading %s", path);
    dsc_status st = dsc_hf_config_parse(text, path, out);
    free(text);
    return st;
}

// ---- writing ----

// As transformers writes them: indented, fields in order, reals in their shortest usual form.
#define JSON_OUT (JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12))

static json_t *eos_json(const dsc_hf_config *c) {
    if (c->n_eos <= 0) return json_null();
    if (c->n_eos == 1) return json_integer(c->eos_ids[0]);
    json_t *a = json_array();
    for (int i = 0; i < c->n_eos; i++) json_array_append_new(a, json_integer(c->eos_ids[i]));
    return a;
}

static json_t *bos_json(const dsc_hf_config *c) {
    return c->bos_id >= 0 ? json_integer(c->bos_id) : json_null();
}

static json_t *gpt2_json(const dsc_hf_config *c) {
    return json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:s, s:f, s:b, s:b, s:b, "
                     "s:b, s:o, s:o}",
                     "architectures", "GPT2LMHeadModel", "model_type", "gpt2",
                     "vocab_size", c->vocab_size, "n_positions", c->max_positions,
                     "n_ctx", c->max_positions, "n_embd", c->hidden, "n_layer", c->n_layer,
                     "n_head", c->n_head,
                     "n_inner", c->intermediate == 4 * c->hidden ? json_null()
                                                                 : json_integer(c->intermediate),
                     "activation_function", c->act, "layer_norm_epsilon", c->norm_eps,
                     "scale_attn_weights", c->scale_attn_weights,
                     "scale_attn_by_inverse_layer_idx", c->scale_attn_by_inverse_layer_idx,
                     "reorder_and_upcast_attn", c->reorder_and_upcast_attn,
                     "tie_word_embeddings", c->tied, "bos_token_id", bos_json(c),
                     "eos_token_id", eos_json(c));
}

// The scaling's factors, as both spellings hold them.
static void rope_factors(const dsc_hf_config *c, json_t *s) {
    json_object_set_new(s, "factor", json_real(c->rope_factor));
    if (!strcmp(c->rope_type, "llama3")) {
        json_object_set_new(s, "low_freq_factor", json_real(c->rope_low_freq));
        json_object_set_new(s, "high_freq_factor", json_real(c->rope_high_freq));
        json_object_set_new(s, "original_max_position_embeddings",
                            json_integer(c->rope_orig_max));
    }
}

// 4.x: "rope_scaling": null or {"rope_type", factors}.
static json_t *rope_scaling_json(const dsc_hf_config *c) {
    if (!strcmp(c->rope_type, "default") || !strcmp(c->rope_type, "none")) return json_null();
    json_t *s = json_pack("{s:s}", "rope_type", c->rope_type);
    rope_factors(c, s);
    return s;
}

// 5.x: "rope_parameters": {"rope_type", "rope_theta", factors}.
static json_t *rope_parameters_json(const dsc_hf_config *c) {
    json_t *s = json_pack("{s:s, s:f}", "rope_type", c->rope_type, "rope_theta", c->rope_theta);
    if (strcmp(c->rope_type, "default") != 0) rope_factors(c, s);
    return s;
}

// Qwen2's windows in both spellings: use_sliding_window, sliding_window and max_window_layers
// (4.x), and the layer_types transformers 5 derives from them.
static void qwen2_window_json(const dsc_hf_config *c, json_t *o) {
    bool on = c->sliding_window > 0;
    json_object_set_new(o, "use_sliding_window", json_boolean(on));
    json_object_set_new(o, "sliding_window", on ? json_integer(c->sliding_window) : json_null());
    if (c->max_window_layers > 0)
        json_object_set_new(o, "max_window_layers", json_integer(c->max_window_layers));
    json_t *types = json_array();
    for (int i = 0; i < c->n_layer; i++)
        json_array_append_new(types, json_string(layer_kinds[on && i >= c->max_window_layers]));
    json_object_set_new(o, "layer_types", types);
}

static json_t *llama_json(const dsc_hf_config *c) {
    json_t *o = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:f, s:o, "
                          "s:o, s:b, s:o, s:o}",
                          "architectures", c->architecture, "model_type", c->model_type,
                          "vocab_size", c->vocab_size, "hidden_size", c->hidden,
                          "intermediate_size", c->intermediate, "num_hidden_layers", c->n_layer,
                          "num_attention_heads", c->n_head, "num_key_value_heads", c->n_kv_head,
                          "hidden_act", c->act, "max_position_embeddings", c->max_positions,
                          "rms_norm_eps", c->norm_eps, "rope_theta", c->rope_theta,
                          "rope_scaling", rope_scaling_json(c),
                          "rope_parameters", rope_parameters_json(c), "tie_word_embeddings",
                          c->tied, "bos_token_id", bos_json(c), "eos_token_id", eos_json(c));
    if (c->head_dim != c->hidden / c->n_head || c->arch == DSC_HF_QWEN3) // Qwen3's default: 128
        json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    if (c->arch == DSC_HF_LLAMA || c->arch == DSC_HF_QWEN3)
        json_object_set_new(o, "attention_bias", json_boolean(c->qkv_bias));
    if (c->arch == DSC_HF_LLAMA) json_object_set_new(o, "mlp_bias", json_boolean(c->mlp_bias));
    if (c->arch == DSC_HF_QWEN2 || c->arch == DSC_HF_QWEN3) qwen2_window_json(c, o);
    if (c->arch == DSC_HF_MISTRAL)
        json_object_set_new(o, "sliding_window",
                            c->sliding_window > 0 ? json_integer(c->sliding_window) : json_null());
    return o;
}

static dsc_status write_json(const char *dir, const char *name, json_t *o) {
    char path[4200], tmp[4300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!o) return dsc__fail(DSC_ERR_OOM, "out of memory building %s", path);
    int rc = json_dump_file(o, tmp, JSON_OUT);
    json_decref(o);
    if (rc != 0) {
        remove(tmp);
        return dsc__fail(DSC_ERR_IO, "cannot write %s (check that the folder exists and has free "
                         "space)", tmp);
    }
    if (rename(tmp, path) != 0)
        return dsc__fail(DSC_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    return DSC_OK;
}

static json_t *config_json(const dsc_hf_config *c) {
    json_t *o = c->arch == DSC_HF_GPT2 ? gpt2_json(c) : llama_json(c);
    // Both spellings: transformers 4.44 reads torch_dtype, 5.x dtype.
    if (o && c->torch_dtype[0]) {
        json_object_set_new(o, "torch_dtype", json_string(c->torch_dtype));
        json_object_set_new(o, "dtype", json_string(c->torch_dtype));
    }
    return o;
}

static json_t *generation_json(const dsc_hf_config *c) {
    return json_pack("{s:o, s:o}", "bos_token_id", bos_json(c), "eos_token_id", eos_json(c));
}

dsc_status dsc_hf_config_write(const char *dir, const dsc_hf_config *c) {
    return write_json(dir, "config.json", config_json(c));
}

dsc_status dsc_hf_generation_config_write(const char *dir, const dsc_hf_config *c) {
    return write_json(dir, "generation_config.json", generation_json(c));
}

static dsc_status render(json_t *o, char **out) {
    *out = o ? json_dumps(o, JSON_OUT) : NULL;
    json_decref(o);
    return *out ? DSC_OK : dsc__fail(DSC_ERR_OOM, "out of memory rendering a config.json");
}

// Reals as few digits as give back the same doubles (12 mostly: "1e-05", not
// "1.0000000000000001e-05"), up to the 17 that always do: a re-written file loses nothing.
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

// The spelling a file leaves out, added beside the one it has (keys already there are kept).
static void add_missing_spelling(json_t *o, const dsc_hf_config *c) {
    if (c->torch_dtype[0]) {
        if (!json_object_get(o, "torch_dtype"))
            json_object_set_new(o, "torch_dtype", json_string(c->torch_dtype));
        if (!json_object_get(o, "dtype"))
            json_object_set_new(o, "dtype", json_string(c->torch_dtype));
    }
    if (c->arch == DSC_HF_GPT2) return;
    if (!json_object_get(o, "rope_theta"))
        json_object_set_new(o, "rope_theta", json_real(c->rope_theta));
    if (!json_object_get(o, "rope_scaling"))
        json_object_set_new(o, "rope_scaling", rope_scaling_json(c));
    if (!json_object_get(o, "rope_parameters"))
        json_object_set_new(o, "rope_parameters", rope_parameters_json(c));
}

dsc_status dsc_hf_config_respell(const char *dir, char **out) {
    *out = NULL;
    dsc_hf_config c;
    DSC_TRY(dsc_hf_config_read(dir, &c)); // refuses spellings that disagree
    char path[4200];
    config_path(dir, path, sizeof path);
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return dsc__fail(DSC_ERR_IO, "%s changed while it was read; read it again", path);
    }
    add_missing_spelling(o, &c);
    *out = dumps_exact(o);
    json_decref(o);
    return *out ? DSC_OK : dsc__fail(DSC_ERR_OOM, "out of memory rewriting %s", path);
}

dsc_status dsc_hf_config_render(const dsc_hf_config *c, char **config, char **generation) {
    *config = *generation = NULL;
    DSC_TRY(render(config_json(c), config));
    dsc_status st = render(generation_json(c), generation);
    if (st != DSC_OK) {
        free(*config);
        *config = NULL;
    }
    return st;
}
