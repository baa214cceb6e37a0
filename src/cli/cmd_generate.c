// cli/cmd_generate.c - `dsc generate`: a model's weights from a checkpoint or a safetensors file,
// prompts from the command line or a file (one per line, generated as one batch), text out. The
// generation itself runs on the CPU (dsc_generate_run) or on a CUDA device
// (dsc_generate_run_cuda): this file only picks one.
#include <errno.h>   // errno
#include <jansson.h> // json_* (a LoRA checkpoint's adapter_config.json)
#include <stdio.h>   // printf, fopen
#include <stdlib.h>  // calloc, free
#include <string.h>  // strcmp, strstr, strerror
#ifdef _OPENMP
#include <omp.h> // omp_set_num_threads
#endif

#include "cli/args.h"        // cli_parse, cli_int, cli_double
#include "cli/ckpt_lora.h"   // cli_merge_peft, cli_merge_ckpt
#include "cli/commands.h"    // cmd_generate
#include "cli/lora.h"        // cli_base_verify
#include "dsc/base.h"        // dsc_fopen_regular
#include "dsc/checkpoint.h"  // dsc_ckpt_*
#include "dsc/data.h"        // dsc_tokenizer_*
#include "dsc/generate.h"    // dsc_generate_run, dsc_generate_run_cuda, dsc_gen_*
#include "dsc/half.h"        // dsc_bf16_to_fp32_n, dsc_fp16_to_fp32_n
#include "dsc/model.h"       // dsc_model_*
#include "dsc/safetensors.h" // dsc_st_*, dsc_hf_weights_*
#include "dsc/status.h"      // dsc_fail, DSC_TRY

typedef struct gen_cli {
    const char *checkpoint, *weights, *model, *prompt, *prompt_file, *stop, *device, *tokenizer;
    const char *trace, *chat_template;
    const char *adapter; // --adapter: a PEFT (LoRA) folder beside the weights, or NULL
    long long max_new, top_k, seed, heads, tp, threads;
    double temperature, top_p;
    bool no_cache, chat;
    bool merge_adapter; // --merge-adapter: merged into the weights first (always on a GPU, --tp)
} gen_cli;

typedef struct weights {
    dsc_model *model; // recognised from the tensors' names and shapes
    char files[4200]; // the folder of the model's companion files (tokenizer), or ""
    int nt;
    float **full; // (nt) whole tensors in model order
} weights;

static void weights_free(weights *w) {
    for (int k = 0; w->full && k < w->nt; k++)
        free(w->full[k]);
    free(w->full);
    dsc_model_destroy(w->model);
}

static dsc_status weights_alloc(weights *w) {
    w->nt = dsc_model_describe(w->model)->num_tensors;
    w->full = calloc((size_t)w->nt, sizeof *w->full);
    for (int k = 0; w->full && k < w->nt; k++) {
        int64_t numel = dsc_model_param_get(w->model, k)->numel;
        if (!(w->full[k] = malloc((size_t)numel * sizeof(float)))) break;
        if (k == w->nt - 1) return DSC_OK;
    }
    return dsc_fail(DSC_ERR_OOM, "dsc generate: out of memory for the weights");
}

// ---- loading ----

// The model whose tensors a file's table holds; *order (caller frees) maps the model's tensor k to
// its table index.
static dsc_status model_of(weights *w, const dsc_param_desc *table, int n, int heads,
                           const char *what, int **order) {
    *order = calloc((size_t)n + 1, sizeof **order);
    if (!*order) return dsc_fail(DSC_ERR_OOM, "out of memory");
    dsc_model_opts mo = {.n_head = heads};
    return dsc_model_create_from_params(&w->model, table, n, &mo, what, *order);
}

static dsc_status load_safetensors(weights *w, const char *path, int heads) {
    dsc_st_file *f;
    DSC_TRY(dsc_st_open(&f, path));
    int n = dsc_st_count(f);
    dsc_param_desc *table = calloc((size_t)n + 1, sizeof *table);
    int *order = NULL;
    dsc_status st = table ? DSC_OK : dsc_fail(DSC_ERR_OOM, "out of memory");
    for (int i = 0; st == DSC_OK && i < n; i++) {
        const dsc_st_tensor *t = dsc_st_get(f, i);
        table[i] = (dsc_param_desc){.name = t->name, .ndim = t->ndim};
        for (int d = 0; d < t->ndim && d < 2; d++) table[i].shape[d] = t->shape[d];
    }
    if (st == DSC_OK) st = model_of(w, table, n, heads, path, &order);
    if (st == DSC_OK) st = weights_alloc(w);
    for (int k = 0; st == DSC_OK && k < w->nt; k++) {
        const dsc_st_tensor *t = dsc_st_get(f, order[k]);
        size_t numel = t->nbytes / (dsc_st_dtype_size(t->dtype) ? dsc_st_dtype_size(t->dtype) : 1);
        if (!strcmp(t->dtype, "F32"))
            memcpy(w->full[k], t->data, numel * 4);
        else if (!strcmp(t->dtype, "BF16"))
            dsc_bf16_to_fp32_n(w->full[k], t->data, numel);
        else if (!strcmp(t->dtype, "F16"))
            dsc_fp16_to_fp32_n(w->full[k], t->data, numel);
        else
            st = dsc_fail(DSC_ERR_INVALID_ARG,
                          "--weights %s: tensor %s has dtype %s; F32, BF16 "
                          "or F16 expected",
                          path, t->name, t->dtype);
    }
    free(table), free(order);
    dsc_st_close(f);
    return st;
}

// The file's name of the model's tensor: its own, or with GPT2LMHeadModel's "transformer." prefix.
static const char *hf_name(dsc_hf_weights *f, const char *name, char *buf, size_t cap) {
    if (dsc_hf_weights_has(f, name)) return name;
    snprintf(buf, cap, "transformer.%s", name);
    return dsc_hf_weights_has(f, buf) ? buf : NULL;
}

// --model hf:DIR: the folder's config.json makes the model, its weights (one file or shards)
// fill it tensor by tensor.
static dsc_status load_hf(weights *w, const char *spec) {
    DSC_TRY(dsc_model_create(&w->model, spec, NULL));
    DSC_TRY(weights_alloc(w));
    snprintf(w->files, sizeof w->files, "%s", spec + 3); // its tokenizer files, if any
    dsc_hf_weights *f;
    DSC_TRY(dsc_hf_weights_open(&f, spec + 3));
    dsc_status st = DSC_OK;
    for (int k = 0; st == DSC_OK && k < w->nt; k++) {
        const dsc_model_param *p = dsc_model_param_get(w->model, k);
        char buf[DSC_PARAM_NAME_MAX + 16];
        const char *name = hf_name(f, p->name, buf, sizeof buf);
        dsc_hf_tensor t;
        if (!name) {
            st = dsc_fail(DSC_ERR_INVALID_ARG, "--model %s: the folder's weights have no tensor "
                          "%s", spec, p->name);
        } else if ((st = dsc_hf_weights_info(f, name, &t)) == DSC_OK && t.numel != p->numel) {
            st = dsc_fail(DSC_ERR_INVALID_ARG, "--model %s: tensor %s has %lld elements, its "
                          "config.json asks for %lld", spec, name, (long long)t.numel,
                          (long long)p->numel);
        }
        if (st == DSC_OK) st = dsc_hf_weights_read(f, name, 0, p->numel, w->full[k]);
    }
    dsc_hf_weights_close(f);
    return st;
}

// A checkpoint whose model config travels with it (an attached config.json): the model from that
// config, the tensors by name.
static dsc_status load_checkpoint_hf(weights *w, dsc_ckpt *ck, const char *cfg_path) {
    char spec[4200];
    snprintf(spec, sizeof spec, "hf:%.*s", (int)(strlen(cfg_path) - strlen("/config.json")),
             cfg_path);
    DSC_TRY(dsc_model_create(&w->model, spec, NULL));
    DSC_TRY(weights_alloc(w));
    for (int k = 0; k < w->nt; k++) {
        const dsc_model_param *p = dsc_model_param_get(w->model, k);
        int i = dsc_ckpt_find_param(ck, p->name);
        dsc_ckpt_param cp;
        if (i >= 0) dsc_ckpt_get_param(ck, i, &cp);
        if (i < 0 || cp.numel != p->numel)
            return dsc_fail(DSC_ERR_CORRUPT, "checkpoint %s: tensor %s is missing or not the "
                            "shape its config.json gives", spec + 3, p->name);
        DSC_TRY(dsc_ckpt_read_param(ck, i, 0, w->full[k]));
    }
    return DSC_OK;
}

// The loaded base's tensor by dsc's name, for cli_base_verify.
static dsc_status loaded_tensor(void *user, const char *name, float **values, int64_t *numel,
                                bool *owned) {
    const weights *w = user;
    *values = NULL;
    *owned = false;
    for (int k = 0; k < w->nt; k++) {
        const dsc_model_param *p = dsc_model_param_get(w->model, k);
        if (strcmp(p->name, name)) continue;
        *values = w->full[k];
        *numel = p->numel;
        break;
    }
    return DSC_OK;
}

// A LoRA run's checkpoint holds its adapters: the base model its adapter_config.json names, with
// the adapters beside it (unmerged) or merged in, once the base is seen to be the one they were
// trained on.
static dsc_status load_lora_checkpoint(weights *w, dsc_ckpt *ck, const char *adapter_config,
                                       const char *path, bool merge) {
    json_t *j = json_load_file(adapter_config, 0, NULL);
    const char *base = json_string_value(json_object_get(j, "base_model_name_or_path"));
    char spec[4200];
    snprintf(spec, sizeof spec, "hf:%s", base ? base : "");
    json_decref(j);
    if (!base)
        return dsc_fail(DSC_ERR_CORRUPT, "%s names no base model (base_model_name_or_path)",
                        adapter_config);
    dsc_status st = load_hf(w, spec);
    if (st != DSC_OK) {
        char why[2048];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        return cli_base_open_failed(st, "a LoRA checkpoint", spec + 3, why);
    }
    char sums[4200], what[4300];
    if (dsc_ckpt_attachment_path(ck, "base_checksums.json", sums, sizeof sums)) {
        snprintf(what, sizeof what, "the base folder %s (adapter_config.json's "
                 "base_model_name_or_path)", spec + 3);
        DSC_TRY(cli_base_verify(sums, path, what, loaded_tensor, w));
    }
    if (merge) return cli_merge_ckpt(w->model, w->full, ck, adapter_config);
    return cli_attach_ckpt(w->model, &w->full, &w->nt, ck, adapter_config);
}

// merge: a LoRA run's adapters are merged into the weights (else they run beside them).
static dsc_status load_checkpoint(weights *w, const char *path, int heads, bool merge) {
    char dir[4096], tag[DSC_CKPT_TAG_MAX];
    bool has_tag;
    DSC_TRY(dsc_ckpt_split_path(path, dir, sizeof dir, tag, sizeof tag, &has_tag));
    dsc_ckpt *ck;
    DSC_TRY(dsc_ckpt_open(&ck, dir, has_tag ? tag : NULL));
    dsc_ckpt_info info;
    dsc_ckpt_get_info(ck, &info);
    // The checkpoint's own folder holds its attached files (the run's tokenizer among them).
    snprintf(w->files, sizeof w->files, "%s/%s", dir, info.tag);
    char cfg_path[4200], ad_path[4200];
    if (dsc_ckpt_attachment_path(ck, "adapter_config.json", ad_path, sizeof ad_path)) {
        dsc_status st = load_lora_checkpoint(w, ck, ad_path, path, merge);
        snprintf(w->files, sizeof w->files, "%s/%s", dir, info.tag);
        dsc_ckpt_close(ck);
        return st;
    }
    if (dsc_ckpt_attachment_path(ck, "config.json", cfg_path, sizeof cfg_path)) {
        dsc_status st = load_checkpoint_hf(w, ck, cfg_path);
        dsc_ckpt_close(ck);
        return st;
    }
    int n = info.nparams;
    dsc_param_desc *table = calloc((size_t)n + 1, sizeof *table);
    int *order = NULL;
    dsc_status st = table ? DSC_OK : dsc_fail(DSC_ERR_OOM, "out of memory");
    for (int i = 0; st == DSC_OK && i < n; i++) {
        dsc_ckpt_param p;
        dsc_ckpt_get_param(ck, i, &p);
        table[i] = (dsc_param_desc){.name = p.name, .ndim = p.ndim};
        for (int d = 0; d < p.ndim && d < 2; d++) table[i].shape[d] = p.shape[d];
    }
    if (st == DSC_OK) st = model_of(w, table, n, heads, path, &order);
    if (st == DSC_OK) st = weights_alloc(w);
    for (int k = 0; st == DSC_OK && k < w->nt; k++)
        st = dsc_ckpt_read_param(ck, order[k], 0, w->full[k]);
    free(table), free(order);
    dsc_ckpt_close(ck);
    return st;
}

// ---- prompts ----

typedef struct prompts {
    int n;
    char **text;
    dsc_gen_prompt *p;
} prompts;

static void prompts_free(prompts *ps) {
    for (int i = 0; i < ps->n; i++) {
        free(ps->text[i]);
        free((void *)ps->p[i].tokens);
    }
    free(ps->text), free(ps->p);
}

static dsc_status add_prompt(prompts *ps, const char *s, size_t len) {
    char **t = realloc(ps->text, sizeof *t * (size_t)(ps->n + 1));
    if (t) ps->text = t;
    dsc_gen_prompt *p = realloc(ps->p, sizeof *p * (size_t)(ps->n + 1));
    if (p) ps->p = p;
    char *copy = t && p ? strndup(s, len) : NULL;
    if (!copy) return dsc_fail(DSC_ERR_OOM, "out of memory for the prompts");
    ps->text[ps->n] = copy;
    ps->p[ps->n++] = (dsc_gen_prompt){NULL, 0};
    return DSC_OK;
}

static dsc_status read_prompts(const gen_cli *o, prompts *ps) {
    if (o->prompt) return add_prompt(ps, o->prompt, strlen(o->prompt));
    FILE *f;
    if (dsc_fopen_regular(o->prompt_file, &f) != DSC_OK) {
        dsc_error_prefix("--prompt-file: ");
        return DSC_ERR_IO;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    dsc_status st = DSC_OK;
    while (st == DSC_OK && (len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (len > 0) st = add_prompt(ps, line, (size_t)len); // blank lines separate nothing
    }
    free(line);
    fclose(f);
    if (st == DSC_OK && ps->n == 0)
        st = dsc_fail(DSC_ERR_INVALID_ARG,
                      "--prompt-file %s holds no prompt; write one prompt "
                      "per line",
                      o->prompt_file);
    return st;
}

static dsc_status encode_prompts(const dsc_tokenizer *tok, prompts *ps) {
    for (int i = 0; i < ps->n; i++) {
        int32_t *ids;
        size_t n;
        DSC_TRY(dsc_tokenizer_encode(tok, ps->text[i], strlen(ps->text[i]), &ids, &n));
        ps->p[i] = (dsc_gen_prompt){ids, (int)n};
        if (n == 0) return dsc_fail(DSC_ERR_INVALID_ARG, "prompt %d encodes to no tokens", i + 1);
    }
    return DSC_OK;
}

// ---- stop strings ----

typedef struct stop_ctx {
    const dsc_tokenizer *tok;
    const char *stop;
    const char *eot; // --chat: the template's end of an assistant turn, or NULL
} stop_ctx;

static bool stop_seen(void *user, int seq, const int32_t *gen, int n) {
    stop_ctx *s = user;
    char *text = NULL;
    size_t len = 0;
    bool hit = dsc_tokenizer_decode(s->tok, gen, (size_t)n, &text, &len) == DSC_OK &&
               ((s->stop && strstr(text, s->stop)) || (s->eot && strstr(text, s->eot)));
    free(text);
    return hit;
}

// ---- --chat: prompts rendered with the model's chat template ----

// A JSON string of s (for a --prompt turned into a user message).
static void json_quote(char *out, size_t cap, const char *s) {
    size_t k = 0;
    out[k++] = '"';
    for (; *s && k + 8 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') k += (size_t)snprintf(out + k, cap - k, "\\%c", c);
        else if (c < 0x20) k += (size_t)snprintf(out + k, cap - k, "\\u%04x", c);
        else out[k++] = (char)c;
    }
    snprintf(out + k, cap - k, "\"");
}

// Each prompt (--prompt: a user message; --prompt-file: a line of JSON, a messages array or
// {"messages", "tools"}) becomes its conversation rendered with add_generation_prompt.
static dsc_status chat_prompts(const gen_cli *o, const dsc_tokenizer *tok, prompts *ps,
                               dsc_chat_template **tpl) {
    char note[4400];
    DSC_TRY(dsc_chat_template_load(o->chat_template, dsc_tokenizer_spec(tok), tpl, note,
                                   sizeof note));
    fprintf(stderr, "dsc generate: chat template %s, end of turn \"%s\"\n", note,
            dsc_chat_template_end_of_turn(*tpl));
    for (int i = 0; i < ps->n; i++) {
        size_t cap = 6 * strlen(ps->text[i]) + 64, len;
        char *conv = malloc(cap + 48), *text;
        if (!conv) return dsc_fail(DSC_ERR_OOM, "out of memory for the prompts");
        if (o->prompt) {
            int k = snprintf(conv, cap, "[{\"role\": \"user\", \"content\": ");
            json_quote(conv + k, cap - (size_t)k, ps->text[i]);
            size_t used = strlen(conv);
            snprintf(conv + used, cap + 48 - used, "}]");
        } else {
            snprintf(conv, cap, "%s", ps->text[i]);
        }
        dsc_status st = dsc_chat_apply(*tpl, conv, true, &text, &len, NULL, NULL);
        free(conv);
        if (st != DSC_OK) {
            dsc_error_prefix("--chat: ");
            return st;
        }
        free(ps->text[i]);
        ps->text[i] = text;
    }
    return DSC_OK;
}

// ---- running ----

static dsc_status open_tokenizer(const gen_cli *o, const weights *w, dsc_tokenizer **tok) {
    int V = dsc_model_describe(w->model)->vocab_size;
    char saved[4300];
    const char *spec = o->tokenizer                                           ? o->tokenizer
                       : w->files[0] && dsc_tokenizer_find(w->files, saved, sizeof saved) ? saved
                       : V == 256                                             ? "byte"
                                                                              : NULL;
    if (!spec)
        return dsc_fail(DSC_ERR_INVALID_ARG,
                        "the model's vocabulary has %d tokens and %s holds no tokenizer: give "
                        "its tokenizer with --tokenizer gpt2:DIR (DIR holding vocab.json and "
                        "merges.txt), --tokenizer hf:DIR (a tokenizer.json), --tokenizer byte, "
                         "or --tokenizer ids (token ids in and out)",
                         V, o->weights ? o->weights : o->model ? o->model : o->checkpoint);
    char ids[32];
    if (!strcmp(spec, "ids")) { // token ids of this model's vocabulary
        snprintf(ids, sizeof ids, "ids:%d", V);
        spec = ids;
    }
    DSC_TRY(dsc_tokenizer_create(tok, spec));
    if (dsc_tokenizer_vocab_size(*tok) > V)
        return dsc_fail(DSC_ERR_INVALID_ARG,
                        "tokenizer %s has %d tokens, the model only %d; "
                        "use the tokenizer the model was trained with",
                        spec, dsc_tokenizer_vocab_size(*tok), V);
    return DSC_OK;
}

// Tensor parallelism: the ranks of the environment form the group; each keeps its slices.
static dsc_status setup_tp(const gen_cli *o, weights *w, dsc_comm **comm, dsc_gen_model *m) {
    if (o->tp <= 1) return DSC_OK;
    DSC_TRY(dsc_model_tp_check(w->model, (int)o->tp));
    dsc_comm_opts co = dsc_comm_opts_default();
    DSC_TRY(dsc_comm_create(comm, &co));
    if (dsc_comm_size(*comm) != o->tp)
        return dsc_fail(DSC_ERR_INVALID_ARG,
                        "--tp %lld, but %d ranks were started; start --tp "
                        "ranks (dsc launch --num_procs %lld dsc generate ...)",
                        o->tp, dsc_comm_size(*comm), o->tp);
    m->tp = (dsc_model_tp){dsc_comm_rank(*comm), (int)o->tp, *comm};
    for (int k = 0; k < w->nt; k++) {
        float *slice = malloc((size_t)dsc_model_tp_numel(w->model, k, m->tp.size) * sizeof(float));
        if (!slice) return dsc_fail(DSC_ERR_OOM, "out of memory for the weight slices");
        dsc_model_tp_slice(w->model, k, m->tp.rank, m->tp.size, w->full[k], slice);
        free(w->full[k]);
        w->full[k] = slice;
    }
    return DSC_OK;
}

static void print_results(const gen_cli *o, const dsc_tokenizer *tok, const prompts *ps,
                          const dsc_gen_output *out, const dsc_gen_stats *gs, const char *device,
                          int context, const char *eot) {
    for (int i = 0; i < ps->n; i++) {
        // Ended by length before --max-new-tokens: the model's context was full.
        if (out[i].finish == DSC_GEN_LENGTH && out[i].len < o->max_new)
            fprintf(stderr, "dsc generate: prompt %d stopped after %d new tokens of the %lld "
                    "asked for: the model's context of %d tokens is full (prompt %d + %d); use a "
                    "shorter prompt or --max-new-tokens %d\n", i + 1, out[i].len, o->max_new,
                    context, ps->p[i].len, out[i].len, out[i].len);
        char *text = NULL;
        size_t len = 0;
        if (dsc_tokenizer_decode(tok, out[i].tokens, (size_t)out[i].len, &text, &len) != DSC_OK)
            continue;
        char *cut = o->stop ? strstr(text, o->stop) : NULL;
        if (cut) len = (size_t)(cut - text);
        cut = eot && eot[0] ? strstr(text, eot) : NULL;
        if (cut && (size_t)(cut - text) < len) len = (size_t)(cut - text);
        if (ps->n > 1) printf("=== prompt %d ===\n", i + 1);
        printf("%s%.*s\n", o->chat ? "" : ps->text[i], (int)len, text); // --chat: the reply
        free(text);
    }
    double s = gs->prefill_s + gs->decode_s;
    long long steps = gs->new_tokens - ps->n; // each prompt's first token comes from its pass
    fprintf(stderr,
            "generated %lld tokens for %d prompt(s) in %.3f s (%.1f tokens/s; prompts %.3f s, "
            "then %.1f tokens/s; KV cache %.1f KiB%s)\n",
            (long long)gs->new_tokens, ps->n, s, s > 0 ? gs->new_tokens / s : 0.0, gs->prefill_s,
            gs->decode_s > 0 ? steps / gs->decode_s : 0.0, gs->kv_bytes / 1024.0,
            o->no_cache ? ", not used" : "");
    if (device[0])
        fprintf(stderr, "device %s (bf16), warm-up pass before the timing %.3f s\n", device,
                gs->warmup_s);
}

// --device cuda: say at once when there is no device (before the weights are read).
static dsc_status pick_device(const gen_cli *o, bool *cuda, char *name, size_t cap) {
    *cuda = !strcmp(o->device, "cuda");
    name[0] = '\0';
    if (!*cuda) return DSC_OK;
    dsc_status st = dsc_generate_cuda_check(name, cap);
    if (st != DSC_OK) dsc_error_prefix("--device cuda: ");
    return st;
}

static dsc_status open_trace(const gen_cli *o, FILE **f) {
    if (!o->trace) return DSC_OK;
    if ((*f = fopen(o->trace, "w"))) return DSC_OK;
    return dsc_fail(DSC_ERR_IO, "--trace %s: cannot create: %s", o->trace, strerror(errno));
}

static dsc_status generate(const gen_cli *o) {
    weights w = {0};
    prompts ps = {0};
    dsc_tokenizer *tok = NULL;
    dsc_chat_template *tpl = NULL;
    dsc_comm *comm = NULL;
    dsc_model_kv *kv = NULL;
    dsc_gen_output *out = NULL;
    FILE *trace = NULL;
    bool cuda;
    char device[256];
    dsc_status st;
    DSC_TRY_GOTO(pick_device(o, &cuda, device, sizeof device), st, done);
    DSC_TRY_GOTO(open_trace(o, &trace), st, done);
    // LoRA adapters (--adapter, a LoRA checkpoint): beside the products on the host's one rank (as
    // PEFT runs them); merged into the weights first on a GPU (its decoder has no adapters), with
    // --tp, or with --merge-adapter
    bool merge = cuda || o->tp > 1 || o->merge_adapter;
    if (o->weights)
        DSC_TRY_GOTO(load_safetensors(&w, o->weights, (int)o->heads), st, done);
    else if (o->model)
        DSC_TRY_GOTO(load_hf(&w, o->model), st, done);
    else
        DSC_TRY_GOTO(load_checkpoint(&w, o->checkpoint, (int)o->heads, merge), st, done);
    if (o->adapter && merge)
        DSC_TRY_GOTO(cli_merge_peft(w.model, w.full, o->adapter), st, done);
    else if (o->adapter)
        DSC_TRY_GOTO(cli_attach_peft(w.model, &w.full, &w.nt, o->adapter), st, done);
    DSC_TRY_GOTO(open_tokenizer(o, &w, &tok), st, done);
    DSC_TRY_GOTO(read_prompts(o, &ps), st, done);
    if (o->chat) DSC_TRY_GOTO(chat_prompts(o, tok, &ps, &tpl), st, done);
    DSC_TRY_GOTO(encode_prompts(tok, &ps), st, done);
    dsc_gen_model m = {.model = w.model, .params = w.full, .tp = {0, 1, NULL}, .trace = trace};
    DSC_TRY_GOTO(setup_tp(o, &w, &comm, &m), st, done);
    const char *eot = tpl ? dsc_chat_template_end_of_turn(tpl) : NULL;
    stop_ctx sc = {tok, o->stop, eot && eot[0] ? eot : NULL};
    dsc_gen_opts go = {.max_new_tokens = (int)o->max_new,
                       .temperature = (float)o->temperature,
                       .top_k = (int)o->top_k,
                       .top_p = (float)o->top_p,
                       .seed = (uint64_t)o->seed,
                       .eot = dsc_tokenizer_eot(tok),
                       .no_cache = o->no_cache,
                       .stop = o->stop || sc.eot ? stop_seen : NULL,
                       .stop_user = &sc};
    dsc_gen_stats gs = {0};
    out = calloc((size_t)ps.n, sizeof *out);
    if (!out) DSC_TRY_GOTO(dsc_fail(DSC_ERR_OOM, "out of memory"), st, done);
    if (cuda)
        DSC_TRY_GOTO(dsc_generate_run_cuda(&m, ps.p, ps.n, &go, out, &gs), st, done);
    else
        DSC_TRY_GOTO(dsc_generate_run(&m, &kv, ps.p, ps.n, &go, out, &gs), st, done);
    if (m.tp.rank == 0) print_results(o, tok, &ps, out, &gs, device,
                                      dsc_model_describe(w.model)->max_seq_len, sc.eot);
done:
    if (trace) fclose(trace);
    if (out) dsc_gen_output_free(out, ps.n);
    free(out);
    dsc_model_kv_destroy(kv);
    dsc_comm_destroy(comm);
    dsc_tokenizer_destroy(tok);
    dsc_chat_template_destroy(tpl);
    prompts_free(&ps);
    weights_free(&w);
    return st;
}

// ---- flags ----

static int check_flags(gen_cli *o) {
    const char *why = NULL;
    if (!!o->checkpoint + !!o->weights + !!o->model != 1)
        why = "give exactly one of --checkpoint DIR, --weights FILE and --model hf:DIR";
    else if (o->model && strncmp(o->model, "hf:", 3))
        why = "--model takes a Hugging Face folder as hf:DIR (a checkpoint: --checkpoint DIR)";
    else if (!o->prompt == !o->prompt_file)
        why = "give exactly one of --prompt TEXT and --prompt-file FILE";
    else if (o->temperature < 0)
        why = "--temperature must be >= 0 (0: greedy)";
    else if (o->top_p <= 0 || o->top_p > 1)
        why = "--top-p must be in (0, 1]";
    else if (o->stop && !o->stop[0])
        why = "--stop needs a non-empty string";
    else if (strcmp(o->device, "cpu") && strcmp(o->device, "cuda"))
        why = "--device must be cpu or cuda";
    else if (o->chat_template && !o->chat)
        why = "--chat-template goes with --chat";
    else if (!strcmp(o->device, "cuda") && o->tp > 1)
        why = "--tp splits the model over CPU ranks; with --device cuda leave it out (one GPU "
              "holds the whole model)";
    if (why) {
        fprintf(stderr, "dsc generate: %s\n", why);
        return 2;
    }
    return 0;
}

int cmd_generate(int argc, char **argv) {
    gen_cli o = {.device = "cpu",
                 .max_new = 64,
                 .top_k = 40,
                 .seed = 1337,
                 .tp = 1,
                 .temperature = 0.8,
                 .top_p = 1.0};
    const char *max_new = NULL, *temp = NULL, *top_k = NULL, *top_p = NULL, *seed = NULL,
               *heads = NULL, *tp = NULL, *threads = NULL;
    const cli_flag flags[] = {
        {"--checkpoint", "DIR", "a checkpoint: DIR (its latest) or DIR/TAG", &o.checkpoint, NULL},
        {"--weights", "FILE",
         "a model's weights, safetensors with Hugging Face names (e.g. from dsc ckpt export)",
         &o.weights, NULL},
        {"--model", "hf:DIR", "a Hugging Face model folder: config.json and its weights "
         "(model.safetensors or shards with model.safetensors.index.json)", &o.model, NULL},
        {"--adapter", "DIR", "a LoRA adapter folder as PEFT saves it (adapter_config.json, "
         "adapter_model.safetensors), applied beside the base weights (merged into them first "
         "on a GPU, with --tp, or with --merge-adapter)", &o.adapter, NULL},
        {"--prompt", "TEXT", "the prompt", &o.prompt, NULL},
        {"--prompt-file", "FILE", "prompts, one per line, generated as one batch", &o.prompt_file,
         NULL},
        {"--max-new-tokens", "N", "tokens to generate per prompt at most (default 64)", &max_new,
         NULL},
        {"--temperature", "T", "sampling temperature, 0 = greedy (default 0.8)", &temp, NULL},
        {"--top-k", "K", "sample among the K most likely tokens, 0 = all (default 40)", &top_k,
         NULL},
        {"--top-p", "P", "then among the most likely reaching probability P (default 1)", &top_p,
         NULL},
        {"--seed", "S", "seed of the sampling (default 1337)", &seed, NULL},
        {"--stop", "STR", "end a prompt's generation at this text (left out of the output)",
         &o.stop, NULL},
        {"--device", "cpu|cuda", "where to run: the CPU (fp32) or one CUDA device (bf16) "
         "(default cpu)", &o.device, NULL},
        {"--tokenizer", "SPEC", "byte, gpt2:DIR, hf:DIR, a tokenizer.json, or ids (prompts and "
         "output as token ids) (default: the one the checkpoint's run saved, else byte for a "
         "256-token vocabulary)", &o.tokenizer, NULL},
        {"--heads", "N", "attention heads of a --weights file (GPT-2 default: channels / 64; a "
         "Llama file without its config.json needs it)", &heads,
         NULL},
        {"--tp", "N", "tensor-parallel ranks: start N ranks (dsc launch) (default 1)", &tp, NULL},
        {"--no-kv-cache", NULL, "recompute every sequence for each token (the reference; slow)",
         NULL, &o.no_cache},
        {"--merge-adapter", NULL, "merge --adapter (or a LoRA checkpoint's adapters) into the "
         "weights before generating (fewer products per token; the same tokens up to rounding)",
         NULL, &o.merge_adapter},
        {"--threads", "N", "CPU threads (default: OMP_NUM_THREADS or all cores)", &threads, NULL},
        {"--chat", NULL, "render each prompt as a conversation with the model's chat template "
         "(--prompt: one user message; --prompt-file: a JSON conversation a line) and the "
         "generation prompt; stop at the template's end of turn; print the reply", NULL, &o.chat},
        {"--chat-template", "SPEC", "with --chat: chatml, a tokenizer_config.json, its folder or "
         "a Jinja file (default: the tokenizer's folder, else chatml)", &o.chat_template, NULL},
        {"--trace", "FILE", "write every choice with the two most likely tokens and their logits "
         "(JSON lines)", &o.trace, NULL},
    };
    const cli_verb v = {"generate",
                        "dsc generate (--checkpoint DIR | --weights FILE | --model hf:DIR) "
                        "(--prompt TEXT | --prompt-file FILE) [flags]",
                        "Generate text with a model from a checkpoint, a safetensors file or a "
                        "Hugging Face folder, with a key/value cache. Each prompt's text is printed followed by its "
                        "continuation; a summary with tokens/s goes to stderr.",
                        flags,
                        (int)(sizeof flags / sizeof flags[0]),
                        0,
                        0};
    char *pos[1];
    int npos;
    int rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (max_new && !cli_int("--max-new-tokens", max_new, 1, 1 << 20, &o.max_new)) return 2;
    if (top_k && !cli_int("--top-k", top_k, 0, 1 << 30, &o.top_k)) return 2;
    if (seed && !cli_int("--seed", seed, 0, 1LL << 62, &o.seed)) return 2;
    if (heads && !cli_int("--heads", heads, 1, 4096, &o.heads)) return 2;
    if (tp && !cli_int("--tp", tp, 1, 4096, &o.tp)) return 2;
    if (threads && !cli_int("--threads", threads, 1, 4096, &o.threads)) return 2;
    if (temp && !cli_double("--temperature", temp, &o.temperature)) return 2;
    if (top_p && !cli_double("--top-p", top_p, &o.top_p)) return 2;
    if ((rc = check_flags(&o))) return rc;
#ifdef _OPENMP
    if (o.threads > 0) omp_set_num_threads((int)o.threads);
#endif
    if (generate(&o) != DSC_OK) {
        fprintf(stderr, "dsc generate: error: %s\n", dsc_last_error());
        return 1;
    }
    return 0;
}
