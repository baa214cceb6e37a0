// test_sft_data.c - fine-tuning data: chat templates, the JSONL readers, loss masks, packing,
// flagged shards through the loader (ignored targets, rows, positions) and `dsc data prepare` on
// examples, down to the bytes of the shards.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE // nftw
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>      // nftw
#include <jansson.h>  // json_load_file
#include <stdbool.h>  // bool
#include <stdio.h>    // FILE, fopen, snprintf
#include <stdlib.h>   // free, getenv, malloc
#include <string.h>   // memcmp, strcmp, strlen, strstr
#include <sys/stat.h> // stat
#include <unistd.h>   // remove

#include "data/chat.h"      // dsc_chat_*
#include "data/jsonl.h"     // dsc_jsonl_read, dsc_examples_*
#include "data/loader.h"    // dsc_loader_*
#include "data/pack.h"      // dsc_pack_examples
#include "data/prepare.h"   // dsc_data_prepare
#include "data/shard.h"     // dsc_shard_*, DSC_TOK_*
#include "data/tokenizer.h" // dsc_tokenizer_*
#include "dsc/status.h"     // dsc_last_error

static char dir[512];

static const char *path_of(const char *name) {
    static char p[2][600];
    static int k;
    k ^= 1;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

static void put_file(const char *name, const char *text) {
    FILE *f = fopen(path_of(name), "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static int setup(void **state) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/dsc_sft_XXXXXX", tmp);
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

static int teardown(void **state) { return nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

static dsc_chat_template *chatml(void) {
    dsc_chat_template *t = NULL;
    char note[256];
    assert_int_equal(dsc_chat_template_load("chatml", NULL, &t, note, sizeof note), DSC_OK);
    return t;
}

static void apply(const dsc_chat_template *t, const char *conv, bool agp, const char *want) {
    char *text;
    size_t len;
    assert_int_equal(dsc_chat_apply(t, conv, agp, &text, &len, NULL, NULL), DSC_OK);
    assert_string_equal(text, want);
    assert_int_equal(len, strlen(want));
    free(text);
}

// ---- chat templates ----

static const char conv2[] = "[{\"role\": \"user\", \"content\": \"Hi\"}, "
                            "{\"role\": \"assistant\", \"content\": \" Yo \"}]";

static void test_chat_templates(void **state) {
    dsc_chat_template *t = chatml();
    apply(t, conv2, false, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n Yo <|im_end|>\n");
    apply(t, "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}", true,
          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    assert_string_equal(dsc_chat_template_end_of_turn(t), "<|im_end|>");
    // Spans: each assistant message and its end of turn.
    char *text;
    size_t len;
    dsc_chat_span *sp;
    int n;
    assert_int_equal(dsc_chat_apply(t, conv2, false, &text, &len, &sp, &n), DSC_OK);
    assert_int_equal(n, 1);
    assert_int_equal(sp[0].end, len);
    assert_string_equal(text + sp[0].begin, " Yo <|im_end|>\n");
    free(text);
    free(sp);
    dsc_chat_template_destroy(t);
    // Whitespace control, loop variables, filters, bos/eos.
    const char *jinja =
        "{{ bos_token }}{# conversation #}\n"
        "{% for message in messages %}\n"
        "    {% if loop.first %}[first]{% endif %}\n"
        "    {{- message.role | upper + ': ' + message['content'] | trim }}{{ eos_token }}\n"
        "{% endfor %}";
    assert_int_equal(dsc_chat_template_create(jinja, "<s>", "</s>", &t), DSC_OK);
    apply(t, conv2, false, "<s>[first]USER: Hi</s>\nASSISTANT: Yo</s>\n");
    assert_string_equal(dsc_chat_template_end_of_turn(t), "</s>");
    dsc_chat_template_destroy(t);
    // Beyond the subset: refused naming the construct and the line.
    const char *bad[][2] = {
        {"{% include 'x' %}", "{% include %}"},
        {"\n{{ messages | wordwrap }}", "line 2: the filter '| wordwrap'"},
        {"{{ x.format(1) }}", ".format()"},
        {"{{ lipsum() }}", "lipsum()"},
        {"{% for m in messages %}", "not closed with {% endfor %}"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(dsc_chat_template_create(bad[i][0], NULL, NULL, &t), DSC_ERR_CONFIG);
        assert_null(t);
        if (!strstr(dsc_last_error(), bad[i][1]))
            fail_msg("template %zu: %s lacks %s", i, dsc_last_error(), bad[i][1]);
    }
    // raise_exception: the conversation is refused with the template's message.
    assert_int_equal(dsc_chat_template_create("{{ raise_exception('no ' ~ messages[0].role) }}",
                                              NULL, NULL, &t), DSC_OK);
    assert_int_equal(dsc_chat_apply(t, conv2, false, &text, &len, NULL, NULL),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "no user"));
    dsc_chat_template_destroy(t);
    // From a tokenizer_config.json (string, or the named list's "default"), a folder's
    // chat_template.jinja.
    char note[1024];
    put_file("tc_ok.json", "{\"chat_template\": \"{% for message in messages %}[{{ message.role"
                           " }}]{{ message.content }}{% endfor %}\", \"eos_token\": \"</s>\", "
                           "\"model_max_length\": 1000000000000000019884624838656}");
    assert_int_equal(dsc_chat_template_load(path_of("tc_ok.json"), "byte", &t, note, sizeof note),
                     DSC_OK);
    apply(t, conv2, false, "[user]Hi[assistant] Yo ");
    assert_non_null(strstr(note, "tc_ok.json"));
    dsc_chat_template_destroy(t);
    put_file("tc_list.json", "{\"chat_template\": [{\"name\": \"rag\", \"template\": \"x\"}, "
                             "{\"name\": \"default\", \"template\": \"{{ eos_token }}\"}], "
                             "\"eos_token\": {\"content\": \"</s>\"}}");
    assert_int_equal(dsc_chat_template_load(path_of("tc_list.json"), NULL, &t, note, sizeof note),
                     DSC_OK);
    apply(t, conv2, false, "</s>");
    dsc_chat_template_destroy(t);
    put_file("chat_template.jinja", "{{ messages | length }}\n");
    assert_int_equal(dsc_chat_template_load(dir, NULL, &t, note, sizeof note), DSC_OK);
    apply(t, conv2, false, "2"); // the final newline dropped, as jinja2 does
    dsc_chat_template_destroy(t);
    put_file("tc_none.json", "{\"eos_token\": \"</s>\"}");
    assert_int_equal(dsc_chat_template_load(path_of("tc_none.json"), "byte", &t, note, sizeof note),
                     DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "chat_template"));
    assert_int_equal(dsc_chat_template_load(path_of("missing.json"), "byte", &t, note, sizeof note),
                     DSC_ERR_IO);
}

// ---- JSONL readers ----

static void expect_seg(const dsc_example *e, int i, const char *text, bool train) {
    assert_true(i < e->nseg);
    assert_string_equal(e->seg[i].text, text);
    assert_int_equal(e->seg[i].len, strlen(text));
    assert_int_equal(e->seg[i].train, train);
}

static void test_jsonl_forms(void **state) {
    dsc_chat_template *t = chatml();
    const char *text =
        "{\"text\": \"plain\"}\n"
        "\r\n"
        "{\"prompt\": \"Q?\", \"completion\": \" A.\", \"id\": 7}\r\n"
        "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
        "\"content\": \"U\"}, {\"role\": \"assistant\", \"content\": \"A1\"}, {\"role\": \"user\","
        " \"content\": \"U2\"}, {\"role\": \"assistant\", \"content\": \"A2\"}]}";
    dsc_examples ex = {0};
    assert_int_equal(dsc_jsonl_read("f.jsonl", text, strlen(text), t, DSC_BAD_LINE_ERROR, &ex),
                     DSC_OK);
    assert_int_equal(ex.n, 3);
    assert_int_equal(ex.v[0].nseg, 1);
    expect_seg(&ex.v[0], 0, "plain", true);
    assert_int_equal(ex.v[1].nseg, 2);
    expect_seg(&ex.v[1], 0, "Q?", false);
    expect_seg(&ex.v[1], 1, " A.", true);
    // Untrained markup and other roles merge; each assistant turn's content + end-of-turn trains.
    assert_int_equal(ex.v[2].nseg, 4);
    expect_seg(&ex.v[2], 0, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
                            "<|im_start|>assistant\n", false);
    expect_seg(&ex.v[2], 1, "A1<|im_end|>\n", true);
    expect_seg(&ex.v[2], 2, "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n", false);
    expect_seg(&ex.v[2], 3, "A2<|im_end|>\n", true);
    dsc_examples_free(&ex);
    dsc_chat_template_destroy(t);
}

static void test_jsonl_bad_lines(void **state) {
    dsc_chat_template *t = chatml();
    const char *lines[][2] = {
        {"{\"text\": \"ok\"", "not valid JSON"},
        {"[1, 2]", "not a JSON object"},
        {"{\"body\": \"x\"}", "no \"text\""},
        {"{\"text\": 5}", "\"text\" must be a string"},
        {"{\"prompt\": \"p\"}", "\"completion\" must both be strings"},
        {"{\"text\": \"a\", \"prompt\": \"p\", \"completion\": \"c\"}", "more than one"},
        {"{\"messages\": []}", "non-empty array"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0] needs"},
        {"{\"messages\": [{\"role\": \"assistant\"}]}", "'content' is undefined"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "no message has role"},
        {"{\"text\": \"\"}", "empty"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "{\"text\": \"first\"}\n\n%s\n{\"text\": \"last\"}\n",
                 lines[i][0]);
        dsc_examples ex = {0};
        // error: names file:line (line 3) and the fix; the earlier line's example is kept
        assert_int_equal(dsc_jsonl_read("in.jsonl", buf, strlen(buf), t, DSC_BAD_LINE_ERROR, &ex),
                         DSC_ERR_INVALID_ARG);
        const char *e = dsc_last_error();
        if (!strstr(e, "in.jsonl:3: ") || !strstr(e, lines[i][1]) ||
            !strstr(e, "--on-bad-line skip"))
            fail_msg("line %zu: %s", i, e);
        assert_int_equal(ex.n, 1);
        dsc_examples_free(&ex);
        // skip: the line is left out, the others kept
        assert_int_equal(dsc_jsonl_read("in.jsonl", buf, strlen(buf), t, DSC_BAD_LINE_SKIP, &ex),
                         DSC_OK);
        assert_int_equal(ex.n, 2);
        assert_int_equal(ex.skipped, 1);
        expect_seg(&ex.v[1], 0, "last", true);
        dsc_examples_free(&ex);
    }
    dsc_chat_template_destroy(t);
}

// ---- packing ----

static dsc_example one_example(const char *prompt, const char *completion) {
    dsc_examples ex = {0};
    char line[256];
    snprintf(line, sizeof line, "{\"prompt\": \"%s\", \"completion\": \"%s\"}", prompt, completion);
    assert_int_equal(dsc_jsonl_read("x", line, strlen(line), NULL, DSC_BAD_LINE_ERROR, &ex),
                     DSC_OK);
    dsc_example e = ex.v[0];
    free(ex.v);
    return e;
}

static void test_pack(void **state) {
    dsc_tokenizer *tk = NULL;
    assert_int_equal(dsc_tokenizer_create(&tk, "byte"), DSC_OK); // one token per byte, eot 0
    dsc_examples ex = {0};
    ex.v = malloc(3 * sizeof *ex.v);
    ex.v[0] = one_example("ab", "c");       // a b c EOT: 4 tokens
    ex.v[1] = one_example("d", "ef");       // 4 tokens
    ex.v[2] = one_example("ghijklm", "no"); // 10 tokens
    ex.n = ex.cap = 3;
    // A stream: flags say which tokens are targets and where each example starts.
    dsc_packed p = {0};
    assert_int_equal(dsc_pack_examples(tk, &ex, 0, &p), DSC_OK);
    const int32_t want_tok[] = {'a', 'b', 'c', 0, 'd', 'e', 'f', 0,   'g', 'h', 'i',
                                'j', 'k', 'l', 'm', 'n', 'o', 0};
    const uint8_t T1 = DSC_TOK_TARGET, D = DSC_TOK_DOC;
    const uint8_t want_fl[] = {D, 0, T1, T1, D, T1, T1, T1, D, 0, 0, 0, 0, 0, 0, T1, T1, T1};
    assert_int_equal(p.n, 18);
    assert_memory_equal(p.tok, want_tok, sizeof want_tok);
    assert_memory_equal(p.flags, want_fl, sizeof want_fl);
    assert_int_equal(p.targets, 8);
    dsc_packed_free(&p);
    // Rows of 6: ex 0 and... ex 1 does not fit the 2 left (padding), ex 2 is longer than a row
    // and continues over the next rows; the last row is padded.
    assert_int_equal(dsc_pack_examples(tk, &ex, 6, &p), DSC_OK);
    const int32_t rows_tok[] = {'a', 'b', 'c', 0, 0,   0,   'd', 'e', 'f', 0,   'g', 'h',
                                'i', 'j', 'k', 'l', 'm', 'n', 'o', 0,   0,   0,   0,   0};
    const uint8_t rows_fl[] = {D, 0, T1, T1, 0, 0, D, T1, T1, T1, D, 0,
                               0, 0, 0,  0,  0, T1, T1, T1, 0, 0, 0, 0};
    assert_int_equal(p.n, 24);
    assert_memory_equal(p.tok, rows_tok, sizeof rows_tok);
    assert_memory_equal(p.flags, rows_fl, sizeof rows_fl);
    assert_int_equal(p.padding, 6);
    assert_int_equal(p.split_examples, 1);
    dsc_packed_free(&p);
    dsc_examples_free(&ex);
    dsc_tokenizer_destroy(tk);
}

// ---- the loader on flagged shards ----

static dsc_loader *loader(const char *path, int T, bool restart, dsc_status want) {
    dsc_loader_opts o = {.path = path, .T = T, .restart_positions = restart};
    dsc_loader *l = NULL;
    dsc_status st = dsc_loader_create(&l, &o);
    if (st != want) fail_msg("loader %s: %d (%s)", path, st, dsc_last_error());
    return l;
}

static void test_loader_masks_rows_positions(void **state) {
    // Rows of 6 as in test_pack: ignored targets are -1, positions restart at documents.
    const int32_t tok[] = {'a', 'b', 'c', 0, 0,   0,   'd', 'e', 'f', 0,   'g', 'h',
                           'i', 'j', 'k', 'l', 'm', 'n', 'o', 0,   0,   0,   0,   0};
    const uint8_t T1 = DSC_TOK_TARGET, D = DSC_TOK_DOC;
    const uint8_t fl[] = {D, 0, T1, T1, 0, 0, D, T1, T1, T1, D, 0,
                          0, 0, 0,  0,  0, T1, T1, T1, 0, 0, 0, 0};
    assert_int_equal(dsc_shard_write_flags(path_of("rows.bin"), tok, fl, 24, 256, 6), DSC_OK);
    dsc_loader *l = loader(path_of("rows.bin"), 5, true, DSC_OK);
    assert_int_equal(dsc_loader_num_samples(l), 4);
    assert_true(dsc_loader_masked(l));
    assert_true(dsc_loader_packed(l));
    int32_t in[10], tg[10], pos[10];
    assert_int_equal(dsc_loader_get_pos(l, 0, 2, in, tg, pos), DSC_OK);
    const int32_t want_in[] = {'a', 'b', 'c', 0, 0, 'd', 'e', 'f', 0, 'g'};
    const int32_t want_tg[] = {-1, 'c', 0, -1, -1, 'e', 'f', 0, -1, -1};
    const int32_t want_pos[] = {0, 1, 2, 3, 4, 0, 1, 2, 3, 0};
    assert_memory_equal(in, want_in, sizeof in);
    assert_memory_equal(tg, want_tg, sizeof tg);
    assert_memory_equal(pos, want_pos, sizeof pos);
    dsc_loader_destroy(l);
    // Without restarts positions count along the window.
    l = loader(path_of("rows.bin"), 5, false, DSC_OK);
    assert_int_equal(dsc_loader_get_pos(l, 1, 1, in, tg, pos), DSC_OK);
    for (int t = 0; t < 5; t++) assert_int_equal(pos[t], t);
    dsc_loader_destroy(l);
    // Rows fix the sequence length.
    loader(path_of("rows.bin"), 4, false, DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "--seq-len 5"));
    // Plain shards: every target counts, and they carry no document starts to restart at.
    assert_int_equal(dsc_shard_write(path_of("plain.bin"), tok, 24, 256), DSC_OK);
    l = loader(path_of("plain.bin"), 5, false, DSC_OK);
    assert_false(dsc_loader_masked(l));
    assert_false(dsc_loader_packed(l));
    assert_int_equal(dsc_loader_get_pos(l, 0, 1, in, tg, NULL), DSC_OK);
    for (int t = 0; t < 5; t++) assert_int_equal(tg[t], tok[t + 1]);
    dsc_loader_destroy(l);
    loader(path_of("plain.bin"), 5, true, DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "document starts"));
    // Prefetching gives the same masked batches.
    dsc_loader_opts o = {.path = path_of("rows.bin"), .T = 5, .prefetch = 2, .shuffle = true,
                         .seed = 3, .restart_positions = true};
    dsc_loader *a = NULL, *b = loader(path_of("rows.bin"), 5, true, DSC_OK);
    assert_int_equal(dsc_loader_create(&a, &o), DSC_OK);
    dsc_loader_destroy(b);
    o.prefetch = 0;
    assert_int_equal(dsc_loader_create(&b, &o), DSC_OK);
    for (int64_t g = 0; g < 9; g++) {
        int32_t in2[5], tg2[5], pos2[5];
        assert_int_equal(dsc_loader_get_pos(a, g, 1, in, tg, pos), DSC_OK);
        assert_int_equal(dsc_loader_get_pos(b, g, 1, in2, tg2, pos2), DSC_OK);
        assert_memory_equal(in, in2, sizeof in2);
        assert_memory_equal(tg, tg2, sizeof tg2);
        assert_memory_equal(pos, pos2, sizeof pos2);
    }
    dsc_loader_destroy(a);
    dsc_loader_destroy(b);
}

// ---- dsc data prepare on examples ----

static json_t *dataset_json(const char *out) {
    char p[700];
    snprintf(p, sizeof p, "%s/dataset.json", out);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    if (!j) fail_msg("%s: %s", p, e.text);
    return j;
}

static long long jint(json_t *j, const char *key) {
    return (long long)json_integer_value(json_object_get(j, key));
}

static void test_prepare_examples(void **state) {
    put_file("sft.jsonl", "{\"prompt\": \"ab\", \"completion\": \"c\"}\n"
                          "{\"prompt\": \"d\", \"completion\": \"ef\"}\n");
    const char *inputs[] = {path_of("sft.jsonl")};
    char out[600];
    snprintf(out, sizeof out, "%s", path_of("ds"));
    dsc_prepare_opts o = {.inputs = inputs, .ninputs = 1, .tokenizer = "byte", .out_dir = out};
    assert_int_equal(dsc_data_prepare(&o), DSC_OK);
    json_t *j = dataset_json(out);
    assert_int_equal(jint(j, "shard_version"), 3);
    assert_int_equal(jint(j, "tokens"), 8);
    assert_int_equal(jint(j, "target_tokens"), 5);
    json_decref(j);
    char p[700];
    snprintf(p, sizeof p, "%s/train.bin", out);
    dsc_shard s;
    assert_int_equal(dsc_shard_open(&s, p), DSC_OK);
    assert_int_equal(s.version, 3);
    assert_int_equal(s.ntok, 8);
    assert_int_equal(s.row, 0);
    assert_int_equal(s.flags[2], DSC_TOK_TARGET);
    assert_int_equal(s.flags[4], DSC_TOK_DOC);
    dsc_shard_close(&s);
    // A bad line fails the run and leaves the folder as it was; skip keeps the good lines.
    put_file("bad.jsonl", "{\"prompt\": \"gh\", \"completion\": \"i\"}\n{oops\n");
    inputs[0] = path_of("bad.jsonl");
    assert_int_equal(dsc_data_prepare(&o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "bad.jsonl:2: not valid JSON"));
    j = dataset_json(out);
    assert_int_equal(jint(j, "tokens"), 8);
    json_decref(j);
    assert_int_equal(dsc_shard_open(&s, p), DSC_OK);
    assert_int_equal(s.ntok, 8);
    dsc_shard_close(&s);
    o.on_bad_line = DSC_BAD_LINE_SKIP;
    o.seq_len = 3; // rows of 4: "ghi" + EOT
    assert_int_equal(dsc_data_prepare(&o), DSC_OK);
    j = dataset_json(out);
    assert_int_equal(jint(j, "skipped_lines"), 1);
    assert_int_equal(jint(j, "packed_seq_len"), 3);
    assert_int_equal(jint(j, "tokens"), 4);
    json_decref(j);
    assert_int_equal(dsc_shard_open(&s, p), DSC_OK);
    assert_int_equal(s.row, 4);
    dsc_shard_close(&s);
    // Only bad lines: nothing to write.
    put_file("allbad.jsonl", "nope\n");
    inputs[0] = path_of("allbad.jsonl");
    assert_int_equal(dsc_data_prepare(&o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "no examples"));
    put_file("empty.txt", ""); // an empty text file is no example either
    inputs[0] = path_of("empty.txt");
    assert_int_equal(dsc_data_prepare(&o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "no examples"));
    o.format = "yaml";
    assert_int_equal(dsc_data_prepare(&o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "--format yaml"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_templates),
        cmocka_unit_test(test_jsonl_forms),
        cmocka_unit_test(test_jsonl_bad_lines),
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_loader_masks_rows_positions),
        cmocka_unit_test(test_prepare_examples),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
