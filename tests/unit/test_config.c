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
#include <unistd.h>  // write, close, unlink

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
        // DeepSpeed cannot compute with Hugging Face's "auto" in a batch key: rejected.
        {"{\"train_batch_size\":\"auto\",\"train_micro_batch_size_per_gpu\":2,\"gradient_accumulation_steps\":3}", 2, 0, 0, 0},
        // null is "not given"; whole reals are integers (hjson makes 4.8e1 the integer 48)
        {"{\"train_batch_size\":4.8e1,\"train_micro_batch_size_per_gpu\":null}", 3, 48, 16, 1},
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
    // fp16 is a pydantic model in DeepSpeed: "yes" would be true, "maybe" is refused
    expect_error("{\"train_batch_size\":8, \"fp16\": {\"enabled\": \"maybe\"}}", 1,
                 "key \"fp16.enabled\": expected true or false, found a string \"maybe\"");
    expect_error("{\"train_batch_size\":8, \"zero_optimization\": {\"stage\": 4}}", 1,
                 "key \"zero_optimization.stage\" = 4 is out of range: expected 0 .. 3");
    expect_error("{\"train_batch_size\":8, \"zero_optimization\": {\"stage\": 1.5}}", 1,
                 "expected a whole number");
    expect_error("{\"train_batch_size\":8, \"zero_optimization\": 3}", 1,
                 "key \"zero_optimization\": expected an object, found an integer 3");
    expect_error("{\"train_batch_size\":8, \"optimizer\": {\"params\": {\"betas\": [0.9]}}}", 1,
                 "optimizer.params.betas\": expected a list of two numbers");
    expect_error("{\"train_batch_size\":8, \"communication_data_type\": \"fp8\"}", 1,
                 "expected one of fp32|fp16|bf16 (any case)");
    expect_error("{\"train_batch_size\":-8}", 1, "out of range");
    expect_error("[1, 2]", 1, "expected an object at the top, found a list");
}

static void test_syntax_errors_have_line_and_column(void **state) {
    // (a trailing comma, which strict JSON refuses, is fine for DeepSpeed's loader)
    expect_error("{\n  \"train_batch_size\": 8,\n  \"fp16\": {\"enabled: true}\n}", 1,
                 "line 3, column 27: control character 0x0a inside a quoted string");
    expect_error("{\"train_batch_size\": 8, \"train_batch_size\": 4}", 1,
                 "line 1, column 25: duplicate key \"train_batch_size\"");
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"enabled\": true, \"enabled\": true}}", 1,
                 "duplicate key \"enabled\"");
    expect_error("{\r\n\"train_batch_size\": 8\r\n} /* open", 1, "line 3, column 3: unterminated /* comment");
    expect_error("{\n  train batch size: 8\n}", 1, "line 2, column 8: whitespace inside a key name");
    expect_error("{\"train_batch_size\": 8} {}", 1, "line 1, column 25: text after the end");
    expect_error("{\"train_batch_size\": 8, \"x\": \"\xc3\x28\"}", 1, "invalid UTF-8 byte 0xc3");
    expect_error("{\"train_batch_size\": 8, \"x\": 1e400}", 1, "number 1e400 is too large");
    expect_error("{\"train_batch_size\": 8, \"x\": \"\\q\"}", 1, "invalid escape \\q");
    expect_error("{\"train_batch_size\": 8,\n \"fp16\": {\"enabled\": tru}}\n", 1,
                 "line 2, column 10: this object is never closed");
    expect_error("{\"train_batch_size\": 8, \"x\": [1,\n2", 1, "line 1, column 30: this list is never closed");
    // An empty file is an empty object to DeepSpeed's loader, which then misses a batch size.
    expect_error("", 1, "train_micro_batch_size_per_gpu needs to be provided");
}

// What DeepSpeed's loader (hjson) accepts beyond JSON, with the values it gives.
static void test_hjson_syntax(void **state) {
    dsc_config cfg;
    warnings w;
    const char *text =
        "\xef\xbb\xbf// comment\n"
        "train_batch_size: 1.6e1   # a whole number: the integer 16\n"
        "optimizer: {\n"
        "  type: AdamW\n"
        "  params: { lr: 3e-4, betas: [0.8, 0.9,], }\n"
        "}\n"
        "'zero_optimization': {\"stage\": 2 /* block */ \"reduce_bucket_size\": 5e8}\n"
        "tensorboard: {\n"
        "  enabled: true // a comment after a keyword\n"
        "  job_name: my job # part of the string\n"
        "  output_path:\n"
        "    '''\n"
        "    runs/\n"
        "      x\n"
        "    '''\n"
        "}\n"
        "\"train_\\u006Dicro_batch_size_per_gpu\": 4\r\n";
    if (load(&cfg, text, 2, &w) != DSC_OK) fail_msg("%s", dsc_last_error());
    assert_int_equal(cfg.train_batch_size, 16);
    assert_int_equal(cfg.train_micro_batch_size_per_gpu, 4);
    assert_int_equal(cfg.gradient_accumulation_steps, 2);
    assert_string_equal(cfg.optimizer.type, "adamw");
    assert_true(cfg.optimizer.lr == 3e-4 && cfg.optimizer.betas[0] == 0.8 && cfg.optimizer.betas[1] == 0.9);
    assert_int_equal(cfg.zero_optimization.stage, 2);
    assert_true(cfg.zero_optimization.reduce_bucket_size == 5e8);
    assert_true(cfg.tensorboard.enabled);
    assert_string_equal(cfg.tensorboard.job_name, "my job # part of the string");
    assert_string_equal(cfg.tensorboard.output_path, "runs/\n  x");
    assert_int_equal(w.n, 0);
    // A quoteless value is a string unless it is exactly a number or keyword: "16 samples".
    expect_error("train_batch_size: 16 samples\n", 1,
                 "key \"train_batch_size\": expected an integer, found a string \"16 samples\"");
}

// Sections DeepSpeed validates with pydantic: its lax coercions, its null and "auto" rules.
static void test_pydantic_sections(void **state) {
    dsc_config cfg;
    warnings w;
    dsc_status st = load(&cfg, "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": \"2\", "
                               "\"reduce_bucket_size\": \"500000000\", \"overlap_comm\": null, "
                               "\"contiguous_gradients\": \"off\", \"allgather_bucket_size\": \"auto\"}, "
                               "\"fp16\": {\"enabled\": \"yes\", \"initial_scale_power\": 12.0, "
                               "\"min_loss_scale\": \"2\", \"loss_scale\": \"1_024\"}}", 1, &w);
    if (st != DSC_OK) fail_msg("%s", dsc_last_error());
    assert_int_equal(cfg.zero_optimization.stage, 2);
    assert_true(cfg.zero_optimization.reduce_bucket_size == 5e8);
    assert_false(cfg.zero_optimization.contiguous_gradients);
    assert_false(dsc_config_overlap_comm(&cfg));
    assert_true(cfg.zero_optimization.allgather_bucket_size == 5e8); // "auto": the default
    assert_true(cfg.fp16.enabled);
    assert_int_equal(cfg.fp16.initial_scale_power, 12);
    assert_true(cfg.fp16.min_loss_scale == 2 && cfg.fp16.loss_scale == 1024);
    // "auto" warns, and so does contiguous_gradients off (dsc does not act on it)
    assert_int_equal(w.n, 2);
    assert_non_null(strstr(w.all, "\"zero_optimization.contiguous_gradients\" (copy gradients"));
    expect_error("{\"train_batch_size\": 8, \"fp16\": {\"min_loss_scale\": 0.5}}", 1,
                 "key \"fp16.min_loss_scale\": expected a whole number");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": null}}", 1,
                 "key \"zero_optimization.stage\" is null");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"reduce_bucket_size\": \"5e8\"}}", 1,
                 "expected an integer, found a string \"5e8\"");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"offload_optimizer\": {\"device\": \"CPU\"}}}",
                 1, "expected one of none|cpu|nvme");
    expect_error("{\"train_batch_size\": 8, \"fp16\": null}", 1, "section \"fp16\" is null");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": "
                 "{\"device\": \"cpu\", \"ratio\": 0.5}}}", 1, "needs ZeRO stage 3");
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8, \"tensorboard\": \"auto\", \"bf16\": null}", 1, &w), DSC_OK);
}

// Keys DeepSpeed reads with plain lookups: dsc checks the JSON type DeepSpeed would need later.
static void test_plain_lookups(void **state) {
    dsc_config cfg;
    warnings w;
    expect_error("{\"train_batch_size\": 8, \"steps_per_print\": \"10\"}", 1,
                 "key \"steps_per_print\": expected an integer, found a string \"10\"");
    expect_error("{\"train_batch_size\": 8, \"wall_clock_breakdown\": null}", 1,
                 "key \"wall_clock_breakdown\" is null");
    expect_error("{\"train_batch_size\": 8, \"checkpoint\": {\"tag_validation\": \"sometimes\"}}", 1,
                 "expected one of Ignore|Warn|Fail");
    dsc_status st = load(&cfg, "{\"train_batch_size\": 8, \"prescale_gradients\": 1, \"gradient_clipping\": null, "
                               "\"flops_profiler\": {\"enabled\": true}, \"checkpoint\": {\"tag_validation\": \"FAIL\"}, "
                               "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"max_grad_norm\": 1.0}}}", 1, &w);
    if (st != DSC_OK) fail_msg("%s", dsc_last_error());
    assert_true(cfg.prescale_gradients);
    assert_true(cfg.gradient_clipping == 0.0);
    assert_true(cfg.wall_clock_breakdown); // the profiler turns it on, as in DeepSpeed
    assert_string_equal(cfg.checkpoint.tag_validation, "Fail");
    assert_true(cfg.optimizer.max_grad_norm == 0.0); // zeroed outside fp16, as in DeepSpeed
}

// Deprecated spellings DeepSpeed still reads, and the combinations it refuses.
static void test_deprecated_forms(void **state) {
    dsc_config cfg;
    warnings w;
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"cpu_offload\": false, "
                 "\"offload_optimizer\": {\"device\": \"cpu\"}}}", 1, "\"zero_optimization.cpu_offload\" and");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"prefetch_bucket_size\": 5, "
                 "\"stage3_prefetch_bucket_size\": 7}}", 1, "given under two spellings");
    expect_error("{\"train_batch_size\": 8, \"bfloat16\": null}", 1, "section \"bfloat16\" is null");
    // bf16 wins; DeepSpeed does not even read bfloat16 then
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8, \"bf16\": {\"enabled\": false}, "
                                "\"bfloat16\": {\"enabled\": \"garbage\"}}", 1, &w), DSC_OK);
    assert_false(cfg.bf16.enabled);
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8, \"zero_optimization\": true, \"allgather_size\": 1000}",
                          1, &w), DSC_OK);
    assert_int_equal(cfg.zero_optimization.stage, 1);
    assert_true(cfg.zero_optimization.allgather_bucket_size == 1000);
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 2, "
                                "\"cpu_offload\": true, \"cpu_offload_use_pin_memory\": true}}", 1, &w), DSC_OK);
    assert_string_equal(cfg.zero_optimization.offload_optimizer.device, "cpu");
    assert_false(cfg.zero_optimization.offload_optimizer.pin_memory); // no effect in 0.18.4
}

// Elastic batch sizes; the expected triples are DeepSpeed 0.18.4's for these configs.
static void test_elasticity(void **state) {
    static const struct {
        const char *extra;
        int world;
        long long tb, mb, ga; // tb = 0: an error
    } cases[] = {
        {"\"version\": 0.1", 1, 1680, 6, 280},
        {"\"version\": 0.1", 3, 1680, 4, 140},
        {"\"version\": 0.1", 8, 1680, 6, 35},
        {"\"version\": 0.2, \"num_gpus_per_node\": 2", 1, 2000, 4, 500},
        {"\"version\": 0.2, \"num_gpus_per_node\": 2", 3, 1998, 6, 111},
        {"\"version\": 0.2, \"num_gpus_per_node\": 4, \"model_parallel_size\": 2", 2, 0, 0, 0},
        {"\"version\": 0.2, \"num_gpus_per_node\": 4, \"model_parallel_size\": 2", 8, 1920, 6, 40},
        {"\"version\": 0.1, \"model_parallel_size\": 2", 1, 0, 0, 0},
        {"\"version\": 0.3", 1, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[512];
        snprintf(json, sizeof json, "{\"elasticity\": {\"enabled\": true, \"max_train_batch_size\": 2000, "
                 "\"micro_batch_sizes\": [2, 4, 6], \"min_gpus\": 1, \"max_gpus\": 10000, %s}}", cases[i].extra);
        dsc_config cfg;
        warnings w;
        dsc_status st = load(&cfg, json, cases[i].world, &w);
        if (cases[i].tb == 0) {
            if (st == DSC_OK) fail_msg("case %zu (world %d): expected an error", i, cases[i].world);
            continue;
        }
        if (st != DSC_OK) fail_msg("case %zu (world %d): %s", i, cases[i].world, dsc_last_error());
        assert_int_equal(cfg.train_batch_size, cases[i].tb);
        assert_int_equal(cfg.train_micro_batch_size_per_gpu, cases[i].mb);
        assert_int_equal(cfg.gradient_accumulation_steps, cases[i].ga);
    }
    expect_error("{\"train_batch_size\": 8, \"elasticity\": {\"enabled\": true, \"max_train_batch_size\": 100, "
                 "\"micro_batch_sizes\": [2]}}", 1, "train_batch_size is given while elasticity is enabled");
}

// Mutated configs never crash the reader (this test runs under the sanitizers in CI).
static void test_random_inputs(void **state) {
    const char *seeds[] = {"{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": \"2\"}}",
                           "a: '''\n x\n '''\nb: [1, {c: d}]\n", "{\"x\": \"\\ud800\\u0000\"}"};
    const char alphabet[] = "{}[],:\"'#/*\\ \n\tabtrue01e.-u\xc3\xa9";
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    char buf[256];
    for (int iter = 0; iter < 20000; iter++) {
        const char *base = seeds[iter % 3];
        size_t n = strlen(base);
        memcpy(buf, base, n + 1);
        for (int k = 0; k < 4; k++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            buf[(seed >> 33) % n] = alphabet[(seed >> 17) % (sizeof alphabet - 1)];
        }
        dsc_config cfg;
        warnings w;
        dsc_status st = load(&cfg, buf, 1 + iter % 8, &w);
        if (st != DSC_OK && st != DSC_ERR_CONFIG)
            fail_msg("iteration %d (generator seed 0x9e3779b97f4a7c15): status %d for '%s'", iter, st, buf);
    }
}

static void test_auto(void **state) {
    expect_error("{\"train_batch_size\":8, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\"}}}",
                 1, "\"optimizer.params.lr\" is \"auto\"");
    // DeepSpeed keeps "auto" under plain lookups and fails later (here: comparing it with 0)
    expect_error("{\"train_batch_size\":8, \"gradient_clipping\": \"auto\"}", 1,
                 "\"gradient_clipping\" is \"auto\"");
    expect_error("{\"train_micro_batch_size_per_gpu\": \"auto\", \"train_batch_size\": 4}", 2,
                 "\"train_micro_batch_size_per_gpu\" is \"auto\"");
    // ... while its pydantic sections drop it: the default applies
    dsc_config cfg;
    warnings w;
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 4, \"fp16\": {\"enabled\": \"auto\"}, "
                                "\"zero_optimization\": {\"stage\": \"auto\", \"reduce_bucket_size\": \"auto\"}}",
                          2, &w), DSC_OK);
    assert_int_equal(cfg.train_micro_batch_size_per_gpu, 2);
    assert_false(cfg.fp16.enabled);
    assert_int_equal(cfg.zero_optimization.stage, 0);
    assert_int_equal(w.n, 3);
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

// Optimizer hyperparameters outside torch.optim's domains are errors naming the key; where torch
// accepts a value that can still give NaN (eps 0), a warning. (betas [1.5, -0.2] used to pass
// with no warning and train to a NaN loss.)
static void test_optimizer_domains(void **state) {
#define OPT(type, params) "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"" type \
                          "\", \"params\": {" params "}}}"
    expect_error(OPT("AdamW", "\"betas\": [1.5, -0.2]"), 1, "optimizer.params.betas");
    expect_error(OPT("AdamW", "\"betas\": [1.5, -0.2]"), 1, "beta1 = 1.5 is outside [0, 1)");
    expect_error(OPT("Adam", "\"betas\": [0.9, 1.0]"), 1, "beta2 = 1 is outside [0, 1)");
    expect_error(OPT("Adam", "\"betas\": [-0.1, 0.99]"), 1, "beta1 = -0.1");
    expect_error(OPT("Lion", "\"betas\": [0.9, 1.01]"), 1, "beta2 = 1.01 is outside [0, 1]");
    expect_error(OPT("AdamW", "\"lr\": -0.001"), 1, "optimizer.params.lr");
    expect_error(OPT("AdamW", "\"eps\": -1e-8"), 1, "optimizer.params.eps");
    expect_error(OPT("AdamW", "\"weight_decay\": -0.1"), 1, "optimizer.params.weight_decay");
    expect_error(OPT("SGD", "\"momentum\": -0.5"), 1, "optimizer.params.momentum");
    expect_error(OPT("SGD", "\"nesterov\": true"), 1, "nesterov needs momentum > 0");
    expect_error(OPT("SGD", "\"nesterov\": true, \"momentum\": 0.9, \"dampening\": 0.1"), 1,
                 "dampening 0");
    dsc_config cfg;
    warnings w;
    assert_int_equal(load(&cfg, OPT("Lion", "\"betas\": [0.9, 1.0]"), 1, &w), DSC_OK);
    assert_int_equal(load(&cfg, OPT("SGD", "\"betas\": [1.5, 0.9]"), 1, &w), DSC_OK); // unused
    assert_int_equal(load(&cfg, OPT("AdamW", "\"betas\": [0.0, 0.0], \"lr\": 0"), 1, &w), DSC_OK);
    assert_int_equal(w.n, 0);
    assert_int_equal(load(&cfg, OPT("AdamW", "\"eps\": 0"), 1, &w), DSC_OK);
    assert_int_equal(w.n, 1);
    assert_non_null(strstr(w.all, "optimizer.params.eps is 0"));
#undef OPT
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

// Keys dsc parses but does not act on warn like unimplemented sections, when they ask for
// anything but the default; NVMe offload is refused.
static void test_no_effect_keys(void **state) {
    dsc_config cfg;
    warnings w;
    static const char *const keys[] = {
        "\"zero_quantized_weights\": true", "\"zero_quantized_gradients\": true",
        "\"zero_hpz_partition_size\": 8", "\"mics_shard_size\": 4",
    };
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        char json[256];
        snprintf(json, sizeof json, "{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, %s}}",
                 keys[k]);
        assert_int_equal(load(&cfg, json, 1, &w), DSC_OK);
        if (w.n != 1 || !strstr(w.all, "is not implemented by dsc; ignored"))
            fail_msg("%s: expected one 'not implemented' warning, got %d: %s", json, w.n, w.all);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(strchr(keys[k] + 1, '"') - keys[k] - 1), keys[k] + 1);
        assert_non_null(strstr(w.all, name));
    }
    // the defaults, written out, ask for nothing
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8, \"zero_optimization\": {\"zero_quantized_weights\": "
                                "false, \"mics_shard_size\": -1, \"zero_hpz_partition_size\": 1}}", 1, &w), DSC_OK);
    assert_int_equal(w.n, 0);
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
                 "{\"device\": \"nvme\", \"nvme_path\": \"/tmp\"}}}", 1,
                 "zero_optimization.offload_optimizer.device \"nvme\" is not implemented by dsc");
    expect_error("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 3, \"offload_param\": "
                 "{\"device\": \"nvme\"}}}", 1, "offload_param.device \"nvme\" is not implemented");
}

static char *print_text(const dsc_config *cfg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    dsc_config_print(cfg, f, false);
    fclose(f);
    return buf;
}

// `dsc config check`'s messages: deprecated keys warn and are named as the origin of what they
// set, reals print in their shortest form, a misspelt key gets a suggestion, a derived batch size
// is marked as derived.
static void test_check_messages(void **state) {
    dsc_config cfg;
    warnings w;
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8, \"zero_optimisation\": {\"stage\": 1}, "
                                "\"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.9, \"betas\": [0.9, 0.95]}}, "
                                "\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true}}", 1, &w), DSC_OK);
    assert_non_null(strstr(w.all, "unknown key \"zero_optimisation\" ignored"));
    assert_non_null(strstr(w.all, "did you mean \"zero_optimization\"?"));
    assert_non_null(strstr(w.all, "zero_optimization.cpu_offload is deprecated"));
    char *text = print_text(&cfg);
    assert_non_null(strstr(text, "= \"cpu\"   (from zero_optimization.cpu_offload, deprecated)"));
    assert_non_null(strstr(text, "optimizer.params.lr"));
    assert_non_null(strstr(text, "= 0.9\n"));
    assert_non_null(strstr(text, "= [0.9,0.95]\n"));
    assert_null(strstr(text, "0.90000000000000002"));
    assert_non_null(strstr(text, "= 2000.0   (default)")); // positional, as Python prints it
    free(text);
    // far from every key: no suggestion
    assert_int_equal(load(&cfg, "{\"train_batch_size\": 8, \"completely_else\": 1}", 1, &w), DSC_OK);
    assert_null(strstr(w.all, "did you mean"));
    expect_error("{\"train_batch_size\": 4, \"gradient_accumulation_steps\": 4}", 2,
                 "train_micro_batch_size_per_gpu (0, derived)");
    expect_error("{\"train_batch_size\": 0.9e1, \"fp16\": {\"loss_scale\": -0.1}}", 1,
                 "= -0.1 is out of range");
    // a NUL byte is named where it is, not where the parser gave up
    char path[] = "/tmp/dsc_test_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    static const char nul[] = "{\"train_batch_size\": 1,\n  \"b\": \0 2}";
    assert_int_equal(write(fd, nul, sizeof nul - 1), (ssize_t)(sizeof nul - 1));
    close(fd);
    assert_int_equal(dsc_config_load_file(&cfg, path, 1, collect, &w), DSC_ERR_CONFIG);
    unlink(path);
    if (!strstr(dsc_last_error(), "line 2, column 8: a NUL byte"))
        fail_msg("got: %s", dsc_last_error());
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_batch_triple),
        cmocka_unit_test(test_batch_error_prints_numbers),
        cmocka_unit_test(test_unknown_and_unimplemented_keys_warn),
        cmocka_unit_test(test_type_errors_name_key),
        cmocka_unit_test(test_syntax_errors_have_line_and_column),
        cmocka_unit_test(test_hjson_syntax),
        cmocka_unit_test(test_pydantic_sections),
        cmocka_unit_test(test_plain_lookups),
        cmocka_unit_test(test_deprecated_forms),
        cmocka_unit_test(test_elasticity),
        cmocka_unit_test(test_random_inputs),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_optimizer_domains),
        cmocka_unit_test(test_json_print_round_trip),
        cmocka_unit_test(test_real_world_configs),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_no_effect_keys),
        cmocka_unit_test(test_check_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
