// data/prepare_sft.c - `dsc data prepare` for examples: text and JSONL inputs (prompt/completion,
// chat messages) -> tokens with loss-mask flags, a stream or packed rows, in flagged shards.
#include "data/prepare_impl.h"

#include <jansson.h> // json_*
#include <math.h>    // llround
#include <stdio.h>   // printf, snprintf
#include <stdlib.h>  // calloc, free
#include <string.h>  // strcmp, strlen

#include "base/status.h"    // dsc__fail, DSC_TRY
#include "data/chat.h"      // dsc_chat_template_*
#include "data/jsonl.h"     // dsc_examples, dsc_jsonl_read
#include "data/pack.h"      // dsc_pack_examples
#include "data/shard.h"     // dsc_shard_write_flags
#include "data/tokenizer.h" // dsc_tokenizer_*

// What was read from each input, for dataset.json.
typedef struct source {
    size_t bytes;
    bool jsonl;
    int64_t examples, skipped;
} source;

typedef struct sft_run {
    const dsc_prepare_opts *o;
    dsc_tokenizer *tk;
    dsc_chat_template *tpl;
    char tpl_note[1024];
    dsc_examples ex;
    source *src; // (ninputs)
    dsc_packed p;
    int row;               // seq_len + 1, or 0
    int64_t ntrain;        // tokens in train.bin
    int64_t train_targets; // of them, targets
} sft_run;

// ---- internal ----

static bool is_jsonl(const dsc_prepare_opts *o, const char *path) {
    if (o->format && !strcmp(o->format, "jsonl")) return true;
    if (o->format && !strcmp(o->format, "text")) return false;
    size_t n = strlen(path);
    return n >= 6 && !strcmp(path + n - 6, ".jsonl");
}

static dsc_status check_format(const dsc_prepare_opts *o) {
    if (o->format && strcmp(o->format, "auto") && strcmp(o->format, "text") &&
        strcmp(o->format, "jsonl"))
        return dsc__fail(DSC_ERR_INVALID_ARG, "data prepare: --format %s: use auto, text or "
                         "jsonl", o->format);
    if (o->seq_len < 0 || o->seq_len >= (1 << 30))
        return dsc__fail(DSC_ERR_INVALID_ARG, "data prepare: --seq-len %d must be positive",
                         o->seq_len);
    return DSC_OK;
}

static dsc_status read_inputs(sft_run *r) {
    const dsc_prepare_opts *o = r->o;
    for (int i = 0; i < o->ninputs; i++) {
        char *text;
        size_t len;
        DSC_TRY(dsc__prepare_read_file(o->inputs[i], &text, &len));
        source *s = &r->src[i];
        int64_t before = r->ex.n, skipped = r->ex.skipped;
        s->bytes = len;
        s->jsonl = is_jsonl(o, o->inputs[i]);
        dsc_status st = s->jsonl ? dsc_jsonl_read(o->inputs[i], text, len, r->tpl, o->on_bad_line,
                                                  &r->ex)
                                 : dsc_examples_add_text(&r->ex, text, len);
        free(text);
        DSC_TRY(st);
        s->examples = r->ex.n - before;
        s->skipped = r->ex.skipped - skipped;
    }
    if (r->ex.n == 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data prepare: the inputs hold no examples (%lld "
                         "bad lines skipped); check the files", (long long)r->ex.skipped);
    return DSC_OK;
}

// The split: the last val_fraction of the rows (packed) or of the tokens (stream).
static void split(sft_run *r) {
    int64_t unit = r->row ? r->row : 1, units = r->p.n / unit;
    int64_t val = (int64_t)llround((double)units * r->o->val_fraction);
    r->ntrain = (units - val) * unit;
    r->train_targets = 0;
    for (int64_t i = 0; i < r->ntrain; i++)
        r->train_targets += (r->p.flags[i] & DSC_TOK_TARGET) != 0;
}

static dsc_status write_shards(sft_run *r) {
    char path[4200];
    int vocab = dsc_tokenizer_vocab_size(r->tk);
    snprintf(path, sizeof path, "%s/train.bin", r->o->out_dir);
    DSC_TRY(dsc_shard_write_flags(path, r->p.tok, r->p.flags, r->ntrain, vocab, r->row));
    snprintf(path, sizeof path, "%s/val.bin", r->o->out_dir);
    return dsc_shard_write_flags(path, r->p.tok + r->ntrain, r->p.flags + r->ntrain,
                                 r->p.n - r->ntrain, vocab, r->row);
}

static json_t *describe(const sft_run *r) {
    const dsc_prepare_opts *o = r->o;
    int vocab = dsc_tokenizer_vocab_size(r->tk);
    json_t *j = json_object(), *src = json_array();
    json_object_set_new(j, "format", json_string("dsc token shards (llm.c layout) with loss-mask "
                                                 "flags"));
    json_object_set_new(j, "shard_version", json_integer(vocab <= 65536 ? 3 : 4));
    json_object_set_new(j, "tokenizer", json_string(dsc_tokenizer_spec(r->tk)));
    json_object_set_new(j, "vocab_size", json_integer(vocab));
    json_object_set_new(j, "eot", json_integer(dsc_tokenizer_eot(r->tk)));
    json_object_set_new(j, "documents", json_integer(r->ex.n));
    json_object_set_new(j, "tokens", json_integer(r->p.n));
    json_object_set_new(j, "train_tokens", json_integer(r->ntrain));
    json_object_set_new(j, "val_tokens", json_integer(r->p.n - r->ntrain));
    json_object_set_new(j, "target_tokens", json_integer(r->p.targets));
    json_object_set_new(j, "train_target_tokens", json_integer(r->train_targets));
    json_object_set_new(j, "val_fraction", json_real(o->val_fraction));
    if (r->row) {
        json_object_set_new(j, "packed_seq_len", json_integer(o->seq_len));
        json_object_set_new(j, "padding_tokens", json_integer(r->p.padding));
        json_object_set_new(j, "split_examples", json_integer(r->p.split_examples));
    }
    json_object_set_new(j, "chat_template", json_string(r->tpl_note));
    json_object_set_new(j, "skipped_lines", json_integer(r->ex.skipped));
    for (int i = 0; i < o->ninputs; i++) {
        json_t *s = json_object();
        json_object_set_new(s, "name", json_string(o->inputs[i]));
        json_object_set_new(s, "format", json_string(r->src[i].jsonl ? "jsonl" : "text"));
        json_object_set_new(s, "bytes", json_integer((json_int_t)r->src[i].bytes));
        json_object_set_new(s, "examples", json_integer(r->src[i].examples));
        json_object_set_new(s, "skipped_lines", json_integer(r->src[i].skipped));
        json_array_append_new(src, s);
    }
    json_object_set_new(j, "sources", src);
    return j;
}

static void summary(const sft_run *r) {
    const dsc_prepare_opts *o = r->o;
    printf("data prepare: %lld example(s)", (long long)r->ex.n);
    if (r->ex.skipped) printf(" (%lld bad line(s) skipped)", (long long)r->ex.skipped);
    printf(", %lld tokens (train %lld, val %lld), %lld loss targets (%.1f%%)", (long long)r->p.n,
           (long long)r->ntrain, (long long)(r->p.n - r->ntrain), (long long)r->p.targets,
           r->p.n ? 100.0 * (double)r->p.targets / (double)r->p.n : 0.0);
    if (r->row)
        printf(", packed in %lld rows of %d tokens (%lld padding, %lld example(s) split)",
               (long long)(r->p.n / r->row), r->row, (long long)r->p.padding,
               (long long)r->p.split_examples);
    printf(", chat template %s, tokenizer %s (vocab %d) -> %s/{train.bin,val.bin,dataset.json}\n",
           r->tpl_note, dsc_tokenizer_spec(r->tk), dsc_tokenizer_vocab_size(r->tk), o->out_dir);
}

static dsc_status run(sft_run *r) {
    const dsc_prepare_opts *o = r->o;
    const char *spec = o->tokenizer ? o->tokenizer : "byte";
    DSC_TRY(check_format(o));
    r->row = o->seq_len > 0 ? o->seq_len + 1 : 0;
    r->src = calloc((size_t)o->ninputs, sizeof *r->src);
    if (!r->src) return dsc__fail(DSC_ERR_OOM, "data: out of memory");
    DSC_TRY(dsc_chat_template_load(o->chat_template, spec, &r->tpl, r->tpl_note,
                                   sizeof r->tpl_note));
    DSC_TRY(dsc_tokenizer_create(&r->tk, spec));
    DSC_TRY(read_inputs(r));
    DSC_TRY(dsc_pack_examples(r->tk, &r->ex, r->row, &r->p));
    split(r);
    if (strlen(o->out_dir) > 4000)
        return dsc__fail(DSC_ERR_INVALID_ARG, "output folder path too long: %.80s...", o->out_dir);
    DSC_TRY(dsc__prepare_make_dirs(o->out_dir));
    DSC_TRY(write_shards(r));
    json_t *j = describe(r);
    dsc_status st = j ? dsc__prepare_write_json(o->out_dir, j)
                      : dsc__fail(DSC_ERR_OOM, "data: out of memory");
    json_decref(j);
    if (st == DSC_OK) summary(r);
    return st;
}

// ---- internal API (prepare_impl.h) ----

bool dsc__prepare_is_examples(const dsc_prepare_opts *o) {
    if (o->seq_len != 0 || (o->format && !strcmp(o->format, "jsonl"))) return true;
    if (o->format && strcmp(o->format, "auto") && strcmp(o->format, "text")) return true; // bad
    for (int i = 0; i < o->ninputs; i++)
        if (is_jsonl(o, o->inputs[i])) return true;
    return false;
}

dsc_status dsc__prepare_examples(const dsc_prepare_opts *o) {
    sft_run r = {.o = o};
    dsc_status st = run(&r);
    dsc_packed_free(&r.p);
    dsc_examples_free(&r.ex);
    dsc_chat_template_destroy(r.tpl);
    dsc_tokenizer_destroy(r.tk);
    free(r.src);
    return st;
}
