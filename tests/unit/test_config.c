// Unit tests of the DeepSpeed config reader (config/config.c).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>  // opendir
#include <jansson.h> // json_loads (reading back --json output)
#include <stdio.h>   // snprintf
#include <stdlib.h>  // free
#include <string.h>  // strstr

#include "dsc/config.h" // dsc_config_*

typedef struct warnings {
    int n;
    char all[8192];
} warnings;

static void collect(void *user, const char *msg) {
    warnings *w = user;
    w->n++;
    size_t len = strlen(w->all);
    snprintf(w->all + len, sizeof w->all - len, "%s\n", msg);
}

static dsc_status load(dsc_config *cfg, const char *json, int world, warnings *w) {
    memset(w, 0, sizeof *w);
    return dsc_config_load_string(cfg, json, world, collect, w);
}

static void expect_error(const char *json, int world, const char *needle) {
    dsc_config cfg;
    warnings w;
    dsc_status st = load(&cfg, json, world, &w);
    if (st == DSC_OK || !strstr(dsc_last_error(), needle))
        fail_msg("config %s (world %d): expected an error containing '%s', got status %d: '%s'",
                 json, world, needle, st, dsc_last_error());
}

static void test_defaults(void **state) {
    dsc_config cfg;
    warnings w;
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8}", 1, &w), DSC_OK);
    assert_int_equal(w.n, 0);
    assert_int_equal(cfg.steps_per_print, 10);
    assert_int_equal(cfg.fp16.initial_scale_power, 16);
    assert_int_equal(cfg.fp16.loss_scale_window, 1000);
    assert_int_equal(cfg.fp16.hysteresis, 2);
    assert_true(cfg.fp16.min_loss_scale == 1.0);
    assert_int_equal(cfg.zero_optimization.stage, 0);
    assert_true(cfg.zero_optimization.reduce_bucket_size == 5e8);
    assert_true(cfg.zero_optimization.contiguous_gradients);
    assert_false(dsc_config_overlap_comm(&cfg));
    assert_true(cfg.fault_tolerance.comm_timeout_s == 30);
    assert_true(cfg.fault_tolerance.step_timeout_s == 60);
    assert_string_equal(cfg.fault_tolerance.on_failure, "degrade");
    assert_true(cfg.memory.defrag_interval_s == 300);
    assert_true(cfg.checkpoint.interval_s == 3600);
    assert_true(cfg.checkpoint.async && cfg.checkpoint.validate);
    assert_true(cfg.optimizer.betas[0] == 0.9 && cfg.optimizer.betas[1] == 0.999);
    assert_false(dsc_config_given(&cfg, "steps_per_print"));
    assert_true(dsc_config_given(&cfg, "train_batch_size"));
}

typedef struct batch_case {
    const char *json;
    int world;
    long long tb, mb, ga; // expected; tb = 0 means "an error"
} batch_case;

static void test_batch_triple(void **state) {
    static const batch_case cases[] = {
        {"{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":4,\"gradient_accumulation_steps\":2}", 4, 32, 4, 2},
        {"{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":4}", 2, 32, 4, 4},
        {"{\"train_batch_size\":32,\"gradient_accumulation_steps\":4}", 2, 32, 4, 4},
        {"{\"train_micro_batch_size_per_gpu\":3,\"gradient_accumulation_steps\":5}", 3, 45, 3, 5},
        {"{\"train_batch_size\":24}", 3, 24, 8, 1},
        {"{\"train_micro_batch_size_per_gpu\":2}", 8, 16, 2, 1},
        {"{\"train_batch_size\":16,\"train_micro_batch_size_per_gpu\":2,\"gradient_accumulation_steps\":1}", 8, 16, 2, 1},
        // DeepSpeed's integer division leaves an inconsistent triple: rejected.
        {"{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":3}", 2, 0, 0, 0},
        {"{\"train_batch_size\":10}", 3, 0, 0, 0},
        {"{\"train_batch_size\":4}", 8, 0, 0, 0}, // micro = 4 // 8 = 0
        {"{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":4,\"gradient_accumulation_steps\":2}", 1, 0, 0, 0},
        {"{\"gradient_accumulation_steps\":2}", 1, 0, 0, 0},
        {"{}", 1, 0, 0, 0},
        {"{\"train_batch_size\":\"auto\",\"train_micro_batch_size_per_gpu\":2,\"gradient_accumulation_steps\":3}", 2, 12, 2, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const batch_case *c = &cases[i];
        dsc_config cfg;
        warnings w;
        dsc_status st = load(&cfg, c->json, c->world, &w);
        if (c->tb == 0) {
            if (st != DSC_ERR_CONFIG) fail_msg("case %zu %s: expected an error", i, c->json);
            assert_true(strstr(dsc_last_error(), "train_batch_size") != NULL);
            continue;
        }
        if (st != DSC_OK) fail_msg("case %zu %s: %s", i, c->json, dsc_last_error());
        assert_int_equal(cfg.train_batch_size, c->tb);
        assert_int_equal(cfg.train_micro_batch_size_per_gpu, c->mb);
        assert_int_equal(cfg.gradient_accumulation_steps, c->ga);
        assert_int_equal(cfg.world_size, c->world);
    }
}

static void test_batch_error_prints_numbers(void **state) {
    expect_error("{\"train_batch_size\":32,\"train_micro_batch_size_per_gpu\":4,\"gradient_accumulation_steps\":3}",
                 2, "train_batch_size (32) must equal train_micro_batch_size_per_gpu (4) * "
                    "gradient_accumulation_steps (3) * world size (2)");
}

static void test_unknown_and_unimplemented_keys_warn(void **state) {
    dsc_config cfg;
    warnings w;
    const char *json = "{\"train_batch_size\":8, \"no_such_key\": 1, \"fp16\": {\"enabled\": true, "
                       "\"bogus\": 2}, \"eigenvalue\": {\"enabled\": true}}";
    assert_int_equal(load(&cfg, json, 1, &w), DSC_OK);
    assert_int_equal(w.n, 3);
    assert_non_null(strstr(w.all, "unknown key \"no_such_key\""));
    assert_non_null(strstr(w.all, "unknown key \"fp16.bogus\""));
    assert_non_null(strstr(w.all, "\"eigenvalue\""));
    assert_true(cfg.fp16.enabled);
}

static void test_type_errors_name_key(void **state) {
    expect_error("{\"train_batch_size\":8, \"fp16\": {\"enabled\": \"yes\"}}", 1,
                 "key \"fp16.enabled\": expected true or false, found a string \"yes\"");
    expect_error("{\"train_batch_size\":8, \"zero_optimization\": {\"stage\": 4}}", 1,
                 "key \"zero_optimization.stage\" = 4 is out of range: expected 0 .. 3");
    expect_error("{\"train_batch_size\":8, \"zero_optimization\": {\"stage\": 1.5}}", 1,
                 "expected a whole number");
    expect_error("{\"train_batch_size\":8, \"zero_optimization\": 3}", 1,
                 "key \"zero_optimization\": expected an object, found an integer 3");
    expect_error("{\"train_batch_size\":8, \"optimizer\": {\"params\": {\"betas\": [0.9]}}}", 1,
                 "optimizer.params.betas\": expected a list of two numbers");
    expect_error("{\"train_batch_size\":8, \"communication_data_type\": \"fp8\"}", 1,
                 "expected one of fp32|fp16|bf16");
    expect_error("{\"train_batch_size\":-8}", 1, "out of range");
    expect_error("[1, 2]", 1, "expected a JSON object at the top, found a list");
}

static void test_syntax_errors_have_line_and_column(void **state) {
    expect_error("{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled\": true,}\n}", 1, "line 3, column");
    expect_error("{\"train_batch_size\": 8, \"train_batch_size\": 4}", 1, "duplicate");
    expect_error("", 1, "line 1");
}

static void test_auto(void **state) {
    expect_error("{\"train_batch_size\":8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}}",
                 1, "\"optimizer.params.lr\" is \"auto\"");
    dsc_config cfg;
    warnings w;
    assert_int_equal(load(&cfg, "{\"train_micro_batch_size_per_gpu\": \"auto\", \"train_batch_size\": 4, "
                                "\"gradient_clipping\": \"auto\"}", 2, &w), DSC_OK);
    assert_int_equal(cfg.train_micro_batch_size_per_gpu, 2);
    assert_true(cfg.gradient_clipping == 0.0);
    assert_int_equal(w.n, 2);
}

static void test_rules(void **state) {
    expect_error("{\"train_batch_size\":8, \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}",
                 1, "both true");
    dsc_config cfg;
    warnings w;
    assert_int_equal(load(&cfg, "{\"train_batch_size\":8, \"zero_optimization\": {\"stage\": 3, "
                                "\"cpu_offload\": true, \"prefetch_bucket_size\": 7, "
                                "\"stage3_max_live_parameters\": 1e6}}", 1, &w), DSC_OK);
    assert_true(dsc_config_overlap_comm(&cfg)); // stage 3 default
    assert_string_equal(cfg.zero_optimization.offload_optimizer.device, "cpu");
    assert_true(cfg.zero_optimization.prefetch_bucket_size == 7);
    assert_true(cfg.zero_optimization.max_live_parameters == 1e6);
    assert_true(dsc_config_given(&cfg, "zero_optimization.stage3_prefetch_bucket_size"));
    assert_int_equal(load(&cfg, "{\"train_batch_size\":8, \"zero_optimization\": true}", 1, &w), DSC_OK);
    assert_int_equal(cfg.zero_optimization.stage, 1);
    assert_int_equal(load(&cfg, "{\"train_batch_size\":8, \"optimizer\": {\"type\": \"ADAMW\"}, "
                                "\"communication_data_type\": \"FP16\", \"bfloat16\": {\"enabled\": true}}", 1, &w), DSC_OK);
    assert_string_equal(cfg.optimizer.type, "adamw");
    assert_string_equal(cfg.communication_data_type, "fp16");
    assert_true(cfg.bf16.enabled);
    assert_int_equal(load(&cfg, "{\"train_batch_size\":8, \"optimizer\": {\"type\": \"Lamb\"}}", 1, &w), DSC_OK);
    assert_non_null(strstr(w.all, "not implemented by dsc"));
}

static void test_json_print_round_trip(void **state) {
    dsc_config cfg;
    warnings w;
    assert_int_equal(load(&cfg, "{\"train_batch_size\":32, \"gradient_accumulation_steps\": 2, "
                                "\"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"type\": \"Adam\", "
                                "\"params\": {\"lr\": 6e-5, \"betas\": [0.8, 0.95]}}}", 4, &w), DSC_OK);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dsc_config_print(&cfg, f, true);
    fclose(f);
    json_error_t e;
    json_t *root = json_loads(buf, 0, &e);
    if (!root) fail_msg("--json output does not parse: %s", e.text);
    assert_int_equal(json_integer_value(json_object_get(root, "train_batch_size")), 32);
    assert_int_equal(json_integer_value(json_object_get(root, "train_micro_batch_size_per_gpu")), 4);
    json_t *zero = json_object_get(root, "zero_optimization");
    assert_int_equal(json_integer_value(json_object_get(zero, "stage")), 2);
    json_t *params = json_object_get(json_object_get(root, "optimizer"), "params");
    assert_true(json_real_value(json_object_get(params, "lr")) == 6e-5);
    assert_true(json_real_value(json_array_get(json_object_get(params, "betas"), 1)) == 0.95);
    json_decref(root);
    free(buf);
}

// Every real DeepSpeed config we have loads; the autotuning templates have no batch size and are
// rejected exactly as DeepSpeed rejects them on their own.
static void test_real_world_configs(void **state) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/../shared/data/ds-configs", DSC_SOURCE_DIR);
    DIR *d = opendir(dir);
    if (!d) {
        print_message("SKIP: %s not present\n", dir);
        skip();
    }
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".json")) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        dsc_config cfg;
        warnings w = {0};
        dsc_status st = dsc_config_load_file(&cfg, path, 1, collect, &w);
        bool template = strstr(e->d_name, "autotuning_config_templates") != NULL;
        if (template) {
            assert_int_equal(st, DSC_ERR_CONFIG);
            assert_non_null(strstr(dsc_last_error(), "train_micro_batch_size_per_gpu needs to be provided"));
        } else if (st != DSC_OK) {
            fail_msg("%s: %s", e->d_name, dsc_last_error());
        }
        n++;
    }
    closedir(d);
    assert_true(n >= 20);
}

static void test_missing_file(void **state) {
    dsc_config cfg;
    assert_int_equal(dsc_config_load_file(&cfg, "/nonexistent/ds_config.json", 1, NULL, NULL), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "/nonexistent/ds_config.json"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_batch_triple),
        cmocka_unit_test(test_batch_error_prints_numbers),
        cmocka_unit_test(test_unknown_and_unimplemented_keys_warn),
        cmocka_unit_test(test_type_errors_name_key),
        cmocka_unit_test(test_syntax_errors_have_line_and_column),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_json_print_round_trip),
        cmocka_unit_test(test_real_world_configs),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
