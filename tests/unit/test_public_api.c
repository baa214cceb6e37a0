// The public calls the command-line tool is wired from, through the installed headers only
// (include/dsc/): errors (dsc_fail, dsc_error_prefix, DSC_TRY, DSC_TRY_GOTO), clocks, switches and
// directories (dsc/base.h), data (dsc/data.h: tokenizer, shards, loader, dataset folders), the
// launcher (dsc/launch.h), generation from weights the caller holds (dsc/generate.h), the key
// table (dsc/config.h) and the flops profiler's report (dsc/monitor.h).
#define _GNU_SOURCE // nftw
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>      // nftw
#include <math.h>     // fabs
#include <stdio.h>    // fopen, fputs, tmpfile
#include <stdlib.h>   // calloc, free, mkdtemp, setenv, unsetenv
#include <string.h>   // strcmp, strstr, memcmp
#include <sys/stat.h> // stat
#include <time.h>     // time

#include "dsc/base.h"     // dsc_now, dsc_wall_time, dsc_env, dsc_mkdirs
#include "dsc/config.h"   // dsc_config_write_doc
#include "dsc/data.h"     // dsc_tokenizer_*, dsc_shard_*, dsc_loader_*, dsc_data_prepare
#include "dsc/generate.h" // dsc_generate_run, dsc_gen_model, dsc_generate_cuda_check
#include "dsc/launch.h"   // dsc_launch_opts_init, dsc_launch_run
#include "dsc/model.h"    // dsc_model_*
#include "dsc/monitor.h"  // dsc_flops_profile_write
#include "dsc/status.h"   // dsc_fail, dsc_error_prefix, DSC_TRY, DSC_TRY_GOTO

static char dir[] = "/tmp/dsc_public_api_XXXXXX";

static int setup(void **state) {
    (void)state;
    return mkdtemp(dir) ? 0 : -1;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static int teardown(void **state) {
    (void)state;
    return nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

// ---- status ----

static dsc_status inner(int shard) {
    return dsc_fail(DSC_ERR_CORRUPT, "shard %d: truncated", shard);
}

static dsc_status outer(int *reached) {
    DSC_TRY(inner(3));
    *reached = 1;
    return DSC_OK;
}

static dsc_status with_cleanup(int *cleaned) {
    dsc_status st = DSC_OK;
    DSC_TRY_GOTO(inner(4), st, fail);
    return DSC_OK;
fail:
    *cleaned = 1;
    return st;
}

// A family of one's own drives its layers with the built-in families' loop.
typedef struct layer_log {
    char s[128];
} layer_log;
static void log_add(layer_log *g, const char *what, int l) {
    size_t n = strlen(g->s);
    snprintf(g->s + n, sizeof g->s - n, "%s%d ", what, l);
}
static void own_fwd(void *st, float *const *params, int l) { (void)params, log_add(st, "F", l); }
static void own_bwd(void *st, float *const *params, float *const *grads, int l) {
    (void)params, (void)grads, log_add(st, "B", l);
}
static dsc_status own_gather(void *u, int g) {
    log_add(u, "g", g);
    return DSC_OK;
}

static void test_layer_loop(void **state) {
    (void)state;
    layer_log g = {""};
    dsc_model_hooks h = {.user = &g, .gather = own_gather};
    assert_int_equal(dsc_model_layers_forward(&h, "own", 2, own_fwd, &g, NULL), DSC_OK);
    assert_int_equal(dsc_model_layers_backward(&h, "own", 2, own_bwd, own_fwd, &g, NULL, NULL),
                     DSC_OK);
    assert_string_equal(g.s, "g1 F0 g2 F1 g2 F1 B1 g1 F0 B0 ");
}

static void test_status(void **state) {
    (void)state;
    dsc_clear_error();
    int reached = 0, cleaned = 0;
    assert_int_equal(outer(&reached), DSC_ERR_CORRUPT);
    assert_int_equal(reached, 0);
    assert_string_equal(dsc_last_error(), "shard 3: truncated");
    dsc_error_prefix("checkpoint %s: ", "step9");
    assert_string_equal(dsc_last_error(), "checkpoint step9: shard 3: truncated");
    assert_int_equal(with_cleanup(&cleaned), DSC_ERR_CORRUPT);
    assert_int_equal(cleaned, 1);
    assert_string_equal(dsc_last_error(), "shard 4: truncated");
    assert_int_equal(dsc_fail(DSC_OK, "%s", ""), DSC_OK); // returns what it is given
}

// ---- base ----

static void test_base(void **state) {
    (void)state;
    double t0 = dsc_now(), w = dsc_wall_time();
    assert_true(dsc_now() >= t0);
    assert_true(w > (double)time(NULL) - 5 && w < (double)time(NULL) + 5);

    setenv("DSC_PROGRESS", "plain", 1);
    assert_string_equal(dsc_env("DSC_PROGRESS"), "plain");
    unsetenv("DSC_PROGRESS");
    dsc_clear_error();
    assert_null(dsc_env("DSC_PROGRESS"));
    assert_string_equal(dsc_last_error(), ""); // unset is not an error
    setenv("DSC_PROGRES", "tty", 1);           // set, but not a switch of dsc's
    assert_null(dsc_env("DSC_PROGRES"));
    assert_non_null(strstr(dsc_last_error(), "DSC_PROGRES: not one of dsc's switches"));
    unsetenv("DSC_PROGRES");

    char deep[256], file[256];
    snprintf(deep, sizeof deep, "%s/a/b/c", dir);
    assert_int_equal(dsc_mkdirs(deep), DSC_OK);
    assert_int_equal(dsc_mkdirs(deep), DSC_OK); // already there
    struct stat sb;
    assert_int_equal(stat(deep, &sb), 0);
    assert_true(S_ISDIR(sb.st_mode));
    snprintf(file, sizeof file, "%s/plain", dir);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(deep, sizeof deep, "%s/plain/sub", dir);
    assert_int_equal(dsc_mkdirs(deep), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "plain exists and is not a directory"));
}

// ---- data ----

static void test_data(void **state) {
    (void)state;
    dsc_tokenizer *tk;
    assert_int_equal(dsc_tokenizer_create(&tk, "byte"), DSC_OK);
    assert_int_equal(dsc_tokenizer_vocab_size(tk), 256);
    int32_t *ids;
    size_t n;
    assert_int_equal(dsc_tokenizer_encode(tk, "hello", 5, &ids, &n), DSC_OK);
    assert_int_equal(n, 5);
    assert_int_equal(ids[0], 'h');
    char *text;
    size_t len;
    assert_int_equal(dsc_tokenizer_decode(tk, ids, n, &text, &len), DSC_OK);
    assert_string_equal(text, "hello");
    free(text);
    free(ids);
    dsc_tokenizer_destroy(tk);
    assert_int_equal(dsc_tokenizer_create(&tk, "nosuch"), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "nosuch"));

    // a shard of 0..40, then the loader's windows over it (T = 4: window w is tokens 4w..4w+4)
    int32_t tok[41], got[8], in[8], tg[8];
    for (int i = 0; i < 41; i++) tok[i] = i;
    char path[256];
    snprintf(path, sizeof path, "%s/train.bin", dir);
    assert_int_equal(dsc_shard_write(path, tok, 41, 256), DSC_OK);
    dsc_shard sh = {0};
    assert_int_equal(dsc_shard_open(&sh, path), DSC_OK);
    assert_int_equal(sh.ntok, 41);
    dsc_shard_read(&sh, 10, 8, got);
    assert_memory_equal(got, tok + 10, sizeof got);
    assert_int_equal(dsc_shard_token(&sh, 40), 40);
    dsc_shard_close(&sh);

    dsc_loader *l;
    dsc_loader_opts lo = {.path = path, .split = "train", .T = 4, .seed = 1};
    assert_int_equal(dsc_loader_create(&l, &lo), DSC_OK);
    assert_int_equal(dsc_loader_num_samples(l), 10);
    assert_int_equal(dsc_loader_max_token(l), 40);
    assert_int_equal(dsc_loader_get(l, 3, 2, in, tg), DSC_OK); // windows 3 and 4, unshuffled
    for (int i = 0; i < 8; i++) {
        assert_int_equal(in[i], 12 + i);
        assert_int_equal(tg[i], 13 + i);
    }
    dsc_loader_destroy(l);
    lo.T = 41; // more than the data holds
    assert_int_equal(dsc_loader_create(&l, &lo), DSC_ERR_INVALID_ARG);

    // a dataset folder from a text file, which the loader reads back
    char src[256], out[256];
    snprintf(src, sizeof src, "%s/doc.txt", dir);
    snprintf(out, sizeof out, "%s/ds", dir);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    for (int i = 0; i < 40; i++) fputs("the quick brown fox jumps over the lazy dog. ", f);
    fclose(f);
    const char *inputs[] = {src};
    dsc_prepare_opts po = {.inputs = inputs, .ninputs = 1, .tokenizer = "byte", .out_dir = out,
                           .val_fraction = 0.1, .on_bad_line = DSC_BAD_LINE_ERROR};
    assert_int_equal(dsc_data_prepare(&po), DSC_OK);
    lo = (dsc_loader_opts){.path = out, .split = "train", .T = 16, .seed = 1, .shuffle = true};
    assert_int_equal(dsc_loader_create(&l, &lo), DSC_OK);
    assert_true(dsc_loader_num_tokens(l) > 1500); // 90% of 1800 bytes
    assert_true(dsc_loader_max_token(l) < 256);
    dsc_loader_destroy(l);
}

// ---- launch ----

static void test_launch(void **state) {
    (void)state;
    dsc_launch_opts o;
    dsc_launch_opts_init(&o);
    assert_int_equal(o.master_port, DSC_LAUNCH_DEFAULT_PORT);
    assert_int_equal(o.num_procs, -1);
    char *argv[] = {"/nonexistent/dsc-program", NULL};
    o.argv = argv;
    o.argc = 1;
    o.num_procs = 1;
    int code = -1;
    assert_int_not_equal(dsc_launch_run(&o, &code), DSC_OK);
    assert_non_null(strstr(dsc_last_error(), "/nonexistent/dsc-program"));
}

// ---- generation from weights the caller holds ----

static void greedy(const dsc_gen_model *m, bool no_cache, int32_t *tokens) {
    const int32_t prompt[3] = {5, 9, 2};
    dsc_gen_prompt p = {prompt, 3};
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0;
    o.max_new_tokens = 6;
    o.no_cache = no_cache;
    dsc_gen_output out;
    dsc_model_kv *kv = NULL;
    assert_int_equal(dsc_generate_run(m, &kv, &p, 1, &o, &out, NULL), DSC_OK);
    assert_int_equal(out.len, 6);
    assert_int_equal(out.finish, DSC_GEN_LENGTH);
    memcpy(tokens, out.tokens, sizeof(int32_t) * 6);
    dsc_gen_output_free(&out, 1);
    dsc_model_kv_destroy(kv);
}

static void test_generate_run(void **state) {
    (void)state;
    dsc_model *model;
    dsc_model_opts mo = {.vocab_size = 64, .max_seq_len = 16};
    assert_int_equal(dsc_model_create(&model, "d2", &mo), DSC_OK);
    int n = dsc_model_describe(model)->num_tensors;
    dsc_param_desc *pd = calloc((size_t)n, sizeof *pd);
    float **params = calloc((size_t)n, sizeof *params);
    assert_non_null(pd);
    assert_non_null(params);
    dsc_model_param_descs(model, pd);
    for (int i = 0; i < n; i++) {
        int64_t numel = 1;
        for (int d = 0; d < pd[i].ndim; d++) numel *= pd[i].shape[d];
        params[i] = calloc((size_t)numel, sizeof(float));
        assert_non_null(params[i]);
    }
    dsc_model_init_weights(model, params, 7);
    dsc_gen_model m = {.model = model, .params = params, .tp = {0, 1, NULL}};
    int32_t cached[6], recomputed[6];
    greedy(&m, false, cached);
    greedy(&m, true, recomputed);
    assert_memory_equal(cached, recomputed, sizeof cached); // the cache changes nothing
    for (int i = 0; i < 6; i++) assert_true(cached[i] >= 0 && cached[i] < 64);

    dsc_gen_prompt empty = {NULL, 0};
    dsc_gen_opts o = dsc_gen_opts_default();
    dsc_gen_output out;
    dsc_model_kv *kv = NULL;
    assert_int_equal(dsc_generate_run(&m, &kv, &empty, 1, &o, &out, NULL), DSC_ERR_INVALID_ARG);
    dsc_model_kv_destroy(kv);
    char name[64];
    if (dsc_generate_cuda_check(name, sizeof name) != DSC_OK) // no device: says what is missing
        assert_true(strlen(dsc_last_error()) > 0);
    for (int i = 0; i < n; i++) free(params[i]);
    free(params);
    free(pd);
    dsc_model_destroy(model);
}

// ---- config keys and the flops profiler's report ----

static void test_reports(void **state) {
    (void)state;
    FILE *f = tmpfile();
    assert_non_null(f);
    dsc_config_write_doc(f);
    char buf[1 << 16];
    rewind(f);
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = '\0';
    fclose(f);
    assert_non_null(strstr(buf, "| key | type | default | meaning |"));
    assert_non_null(strstr(buf, "`train_micro_batch_size_per_gpu`"));

    dsc_prof_module mods[3] = {
        {"model", "Model", 0, 30, 600.0, 0},
        {"model.a", "Linear", 1, 10, 200.0, 0.25},
        {"model.b", "Linear", 1, 20, 400.0, 0.75},
    };
    dsc_prof_summary s = {.step = 2, .world = 1, .dp = 1, .mp = 1, .batch_per_rank = 4,
                          .fwd_s = 1, .bwd_s = 2, .step_s = 0.5, .iter_s = 3.5};
    dsc_prof_opts po = {.module_depth = -1, .top_modules = 1, .detailed = true};
    f = tmpfile();
    assert_non_null(f);
    assert_int_equal(dsc_flops_profile_write(f, &s, mods, 3, &po), DSC_OK);
    assert_true(fabs(mods[0].latency_s - 1.0) < 1e-12); // a parent's latency: its children's
    fclose(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status), cmocka_unit_test(test_base),
        cmocka_unit_test(test_layer_loop),
        cmocka_unit_test(test_data),   cmocka_unit_test(test_launch),
        cmocka_unit_test(test_generate_run), cmocka_unit_test(test_reports),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
