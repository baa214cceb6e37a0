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
};
#define NARCHS (int)(sizeof archs / sizeof archs[0])

const char *dsc_hf_supported(void) {
    return "GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM, MistralForCausalLM";
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

// rope_scaling: null, or {"rope_type" (or the older "type"), "factor", ...}.
static dsc_status read_rope(const reader *r, dsc_hf_config *c) {
    DSC_TRY(get_real(r, r->root, "rope_theta", &c->rope_theta));
    json_t *s = json_object_get(r->root, "rope_scaling");
    if (!s || json_is_null(s)) return DSC_OK;
    if (!json_is_object(s))
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"rope_scaling\" must be null or an object",
                         r->path);
    snprintf(c->rope_type, sizeof c->rope_type, "%s", "");
    DSC_TRY(get_str(r, s, "rope_type", c->rope_type, sizeof c->rope_type));
    if (!c->rope_type[0]) DSC_TRY(get_str(r, s, "type", c->rope_type, sizeof c->rope_type));
    if (!c->rope_type[0])
        return dsc__fail(DSC_ERR_CONFIG, "%s: \"rope_scaling\" names no \"rope_type\"", r->path);
    DSC_TRY(get_real(r, s, "factor", &c->rope_factor));
    DSC_TRY(get_real(r, s, "low_freq_factor", &c->rope_low_freq));
    DSC_TRY(get_real(r, s, "high_freq_factor", &c->rope_high_freq));
    double orig = c->rope_orig_max;
    DSC_TRY(get_real(r, s, "original_max_position_embeddings", &orig));
    c->rope_orig_max = (int)orig;
    return DSC_OK;
}

// transformers' defaults for each family (its config classes' constructor arguments).
static void family_defaults(dsc_hf_config *c) {
    c->bos_id = -1;
    c->rope_theta = 10000.0;
    snprintf(c->rope_type, sizeof c->rope_type, "default");
    c->rope_factor = 1.0;
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
    DSC_TRY(read_rope(r, c));
    if (c->arch == DSC_HF_LLAMA) {
        bool attn_bias = false;
        DSC_TRY(get_bool(r, "attention_bias", &attn_bias));
        DSC_TRY(get_bool(r, "mlp_bias", &c->mlp_bias));
        c->qkv_bias = c->o_bias = attn_bias;
    }
    if (c->arch == DSC_HF_QWEN2) {
        bool sliding = false;
        DSC_TRY(get_bool(r, "use_sliding_window", &sliding));
        int window = 4096;
        DSC_TRY(get_int(r, "sliding_window", &window));
        c->sliding_window = sliding ? window : 0;
    }
    if (c->arch == DSC_HF_MISTRAL) {
        json_t *w = json_object_get(r->root, "sliding_window");
        if (w && json_is_null(w)) c->sliding_window = 0;
        else DSC_TRY(get_int(r, "sliding_window", &c->sliding_window));
    }
    if (!c->n_kv_head) c->n_kv_head = c->n_head;
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
    if (!json_is_object(r.root)) {
        json_decref(r.root);
        return dsc__fail(DSC_ERR_CONFIG, "%s:%d:%d: %s (a config.json must be a JSON object)",
                         path, e.line, e.column, e.text);
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
    DSC_TRY_GOTO(get_str(&r, r.root, "torch_dtype", c.torch_dtype, sizeof c.torch_dtype), st, done);
    if (!c.head_dim && c.n_head > 0) c.head_dim = c.hidden / c.n_head;
    DSC_TRY_GOTO(check_sizes(&r, &c), st, done);
    *out = c;
done:
    json_decref(r.root);
    return st;
}

dsc_status dsc_hf_config_read(const char *dir, dsc_hf_config *out) {
    char path[4200];
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode))
        snprintf(path, sizeof path, "%s/config.json", dir);
    else
        snprintf(path, sizeof path, "%s", dir);
    FILE *f;
    DSC_TRY(dsc__fopen_regular(path, &f)); // a Hugging Face folder holds config.json
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

static json_t *rope_json(const dsc_hf_config *c) {
    if (!strcmp(c->rope_type, "default") || !strcmp(c->rope_type, "none")) return json_null();
    json_t *s = json_pack("{s:s, s:f}", "rope_type", c->rope_type, "factor", c->rope_factor);
    if (!strcmp(c->rope_type, "llama3")) {
        json_object_set_new(s, "low_freq_factor", json_real(c->rope_low_freq));
        json_object_set_new(s, "high_freq_factor", json_real(c->rope_high_freq));
        json_object_set_new(s, "original_max_position_embeddings",
                            json_integer(c->rope_orig_max));
    }
    return s;
}

static json_t *llama_json(const dsc_hf_config *c) {
    json_t *o = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:i, s:f, s:f, s:o, "
                          "s:b, s:o, s:o}",
                          "architectures", c->architecture, "model_type", c->model_type,
                          "vocab_size", c->vocab_size, "hidden_size", c->hidden,
                          "intermediate_size", c->intermediate, "num_hidden_layers", c->n_layer,
                          "num_attention_heads", c->n_head, "num_key_value_heads", c->n_kv_head,
                          "hidden_act", c->act, "max_position_embeddings", c->max_positions,
                          "rms_norm_eps", c->norm_eps, "rope_theta", c->rope_theta,
                          "rope_scaling", rope_json(c), "tie_word_embeddings", c->tied,
                          "bos_token_id", bos_json(c), "eos_token_id", eos_json(c));
    if (c->head_dim != c->hidden / c->n_head)
        json_object_set_new(o, "head_dim", json_integer(c->head_dim));
    if (c->arch == DSC_HF_LLAMA) {
        json_object_set_new(o, "attention_bias", json_boolean(c->qkv_bias));
        json_object_set_new(o, "mlp_bias", json_boolean(c->mlp_bias));
    }
    if (c->arch == DSC_HF_QWEN2) {
        json_object_set_new(o, "use_sliding_window", json_boolean(c->sliding_window > 0));
        json_object_set_new(o, "sliding_window",
                            c->sliding_window > 0 ? json_integer(c->sliding_window) : json_null());
    }
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
    if (o && c->torch_dtype[0]) json_object_set_new(o, "torch_dtype", json_string(c->torch_dtype));
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
