// test_observe.c - the flops profiler's module table and report, the comms logger's bandwidth
// formulas and summary, and the config's monitor_actions (parsing, crossings, memory actions).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>    // fabs
#include <stdbool.h> // bool
#include <stdio.h>  // FILE, tmpfile
#include <stdlib.h> // calloc, free
#include <string.h> // strstr, strcmp

#include "base/log.h"               // dsc_log_set_level
#include "dsc/comm.h"               // dsc_comm_log_*
#include "dsc/config.h"             // dsc_config_load_string
#include "dsc/memory.h"             // dsc_mem_*
#include "dsc/monitor.h"            // dsc_monitor_*, dsc_flops_profile_write
#include "model/gpt2/gpt2.h"        // dsc_gpt2_modules

// Every model: 3 x the root's forward FLOPs is the trainer's MFU numerator, exactly; the
// parameters are the model's; each parent holds the sums of its children.
static void test_modules_match_mfu_formula(void **state) {
    const char *specs[] = {"d1", "d2", "d4", "gpt2-124M", "gpt2-350M"};
    for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++) {
        dsc_gpt2_config c;
        assert_int_equal(dsc_gpt2_config_parse(specs[k], 50257, 1024, &c), DSC_OK);
        int B = 3, T = 256, n = dsc_gpt2_modules(&c, B, T, NULL);
        assert_int_equal(n, 5 + 5 * c.n_layer + 1);
        dsc_gpt2_module *m = calloc((size_t)n, sizeof *m);
        assert_non_null(m);
        assert_int_equal(dsc_gpt2_modules(&c, B, T, m), n);
        double want = dsc_gpt2_flops_per_token(&c, T) * B * T;
        assert_true(fabs(3 * m[0].fwd_flops - want) <= 1e-12 * want);
        assert_int_equal(m[0].params, dsc_gpt2_num_params(&c));
        double leaf_flops = 0;
        int64_t leaf_params = 0;
        int slots = 0;
        for (int i = 0; i < n; i++) {
            if (m[i].slot < 0) continue;
            leaf_flops += m[i].fwd_flops, leaf_params += m[i].params, slots++;
            assert_true(m[i].slot < dsc_gpt2_timing_slots(&c));
        }
        assert_int_equal(slots, dsc_gpt2_timing_slots(&c));
        assert_true(fabs(leaf_flops - m[0].fwd_flops) <= 1e-12 * want);
        assert_int_equal(leaf_params, m[0].params);
        assert_string_equal(m[n - 1].name, "lm_head");
        free(m);
    }
}

// The measured per-module times of a real forward add up to about its wall time.
static void test_forward_timing(void **state) {
    dsc_gpt2_config c;
    assert_int_equal(dsc_gpt2_config_parse("d2", 256, 64, &c), DSC_OK);
    int n = dsc_gpt2_num_tensors(&c), slots = dsc_gpt2_timing_slots(&c);
    float **p = calloc((size_t)n, sizeof *p);
    double *times = calloc((size_t)slots, sizeof *times);
    int32_t in[2 * 64], tg[2 * 64];
    for (int i = 0; i < 2 * 64; i++) in[i] = i % 256, tg[i] = (i + 1) % 256;
    for (int i = 0; i < n; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&c, i, &ti);
        p[i] = calloc((size_t)ti.numel, sizeof(float));
    }
    dsc_gpt2_init_weights(&c, p, 1);
    dsc_gpt2 *m;
    assert_int_equal(dsc_gpt2_create(&m, &c, 2, 64), DSC_OK);
    dsc_gpt2_set_timing(m, times);
    float loss;
    assert_int_equal(dsc_gpt2_forward(m, p, in, tg, 2, 64, NULL, &loss), DSC_OK);
    for (int s = 0; s < slots; s++) assert_true(times[s] > 0);
    dsc_gpt2_set_timing(m, NULL);
    double before = times[0];
    assert_int_equal(dsc_gpt2_forward(m, p, in, tg, 2, 64, NULL, &loss), DSC_OK);
    assert_true(times[0] == before); // off again
    dsc_gpt2_destroy(m);
    for (int i = 0; i < n; i++) free(p[i]);
    free(p);
    free(times);
}

static char *read_all(FILE *f) {
    long n = ftell(f);
    rewind(f);
    char *buf = calloc((size_t)n + 1, 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    return buf;
}

// The summary's "label<padding>  value" line is in out.
static bool has_row(const char *out, const char *label, const char *value) {
    char line[256];
    snprintf(line, sizeof line, "%-60s  %s\n", label, value);
    return strstr(out, line) != NULL;
}

static void test_profile_report(void **state) {
    dsc_prof_module m[] = {
        {"model", "Net", 0, 300, 6e9, 0},      {"model.a", "Block", 1, 100, 2e9, 0},
        {"model.a.x", "Linear", 2, 100, 2e9, 0.001}, {"model.b", "Block", 1, 200, 4e9, 0.003},
    };
    dsc_prof_summary s = {.step = 3, .world = 2, .dp = 2, .mp = 1, .batch_per_rank = 8,
                          .fwd_s = 0.004, .bwd_s = 0.008, .step_s = 0.001, .iter_s = 0.013};
    dsc_prof_opts o = {.module_depth = -1, .top_modules = 1, .detailed = true};
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_int_equal(dsc_flops_profile_write(f, &s, m, 4, &o), DSC_OK);
    assert_true(fabs(m[0].latency_s - 0.004) < 1e-12); // parents: sums of children
    char *out = read_all(f);
    assert_non_null(strstr(out, "Profile Summary at step 3:"));
    assert_true(has_row(out, "fwd flops per GPU:", "6.00 G"));
    assert_true(has_row(out, "fwd MACs per GPU:", "3.00 GMACs"));
    assert_true(has_row(out, "fwd FLOPS per GPU = fwd flops per GPU / fwd latency:",
                        "1.50 TFLOPS"));
    assert_true(has_row(out, "samples/second:", "1230.77"));
    assert_non_null(strstr(out, "params      - {'Block': '300.00'}")); // merged by type
    assert_non_null(strstr(out, "  (a): Block(\n    100.00, 33.33% Params, 1.00 GMACs, 33.33% "
                                "MACs, 1.00 ms, 25.00% latency, 2.00 TFLOPS,"));
    assert_non_null(strstr(out, "    (x): Linear("));
    free(out);
    fclose(f);
    f = tmpfile();
    o = (dsc_prof_opts){.module_depth = 1, .top_modules = 0, .detailed = true};
    assert_int_equal(dsc_flops_profile_write(f, &s, m, 4, &o), DSC_OK);
    out = read_all(f);
    assert_null(strstr(out, "(x): Linear")); // deeper than module_depth
    assert_null(strstr(out, "Aggregated Profile"));
    free(out);
    fclose(f);
}

static void test_bandwidth_formulas(void **state) {
    double alg, bus;
    // 1 MB in 1 ms = 8 Gbps of payload
    dsc_comm_log_bandwidth("all_reduce", 1e6, 1, 4, &alg, &bus);
    assert_true(fabs(alg - 16) < 1e-9 && fabs(bus - 8 * 2 * 3.0 / 4) < 1e-9);
    dsc_comm_log_bandwidth("all_gather", 1e6, 1, 4, &alg, &bus);
    assert_true(fabs(alg - 32) < 1e-9 && fabs(bus - 32 * 3.0 / 4) < 1e-9);
    dsc_comm_log_bandwidth("reduce_scatter", 1e6, 1, 2, &alg, &bus);
    assert_true(fabs(alg - 16) < 1e-9 && fabs(bus - 8) < 1e-9);
    dsc_comm_log_bandwidth("broadcast", 1e6, 1, 8, &alg, &bus);
    assert_true(fabs(alg - 8) < 1e-9 && fabs(bus - 8) < 1e-9);
    unsigned bit;
    assert_int_equal(dsc_comm_log_op_bit("all_gather_into_tensor", &bit), DSC_OK);
    assert_int_equal(bit, DSC_COMM_LOG_ALL_GATHER);
    assert_int_equal(dsc_comm_log_op_bit("all_to_all", &bit), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "unknown operation 'all_to_all'"));
}

// ---- monitor_actions ----

typedef struct fired {
    int n;
    char action[32], metric[64];
    size_t bytes;
    int before;
} fired;

static dsc_status before(void *u, const char *action) {
    ((fired *)u)->before++;
    return DSC_OK;
}

static void after(void *u, const char *action, const char *metric, double v, double thr,
                  size_t bytes) {
    fired *f = u;
    f->n++;
    snprintf(f->action, sizeof f->action, "%s", action);
    snprintf(f->metric, sizeof f->metric, "%s", metric);
    f->bytes = bytes;
}

static dsc_monitor *monitor_with(const char *actions, dsc_status want) {
    static dsc_config cfg;
    char json[1024];
    snprintf(json, sizeof json, "{\"monitor_actions\": %s}", actions);
    assert_int_equal(dsc_config_load_string(&cfg, json, 0, NULL, NULL), DSC_OK);
    dsc_monitor *m = NULL;
    assert_int_equal(dsc_monitor_create(&m, &cfg, NULL, 1), want);
    return m;
}

static void test_actions_fire_once_per_crossing(void **state) {
    dsc_monitor *m = monitor_with("[{\"metric\": \"loss\", \"above\": 2.5, \"action\": \"log\"}]",
                                  DSC_OK);
    fired f = {0};
    dsc_monitor_action_hooks h = {&f, before, after};
    dsc_monitor_set_action_hooks(m, &h);
    const double loss[] = {3, 3, 2, 2.5, 2.6, 2.7, 1, 9};
    int when[8];
    for (int i = 0; i < 8; i++) {
        assert_int_equal(dsc_monitor_log(m, "Train/Samples/train_loss", loss[i], i), DSC_OK);
        when[i] = f.n;
    }
    const int want[8] = {1, 1, 1, 1, 2, 2, 2, 3};
    for (int i = 0; i < 8; i++) assert_int_equal(when[i], want[i]);
    assert_string_equal(f.action, "log");
    assert_int_equal(f.before, 0); // log touches no memory
    dsc_monitor_destroy(m);
}

static void test_defrag_action_compacts_the_host_pool(void **state) {
    dsc_mem_pool *pool;
    assert_int_equal(dsc_mem_default_pool(DSC_MEM_HOST, &pool), DSC_OK);
    dsc_mem_handle h[64];
    for (int i = 0; i < 64; i++)
        assert_int_equal(dsc_mem_alloc(pool, 64 << 10, "t", &h[i]), DSC_OK);
    for (int i = 0; i < 64; i += 2) dsc_mem_free(pool, h[i]); // holes between live blocks
    dsc_monitor *m = monitor_with("[{\"metric\": \"Memory/x\", \"above\": 0.5, \"action\": "
                                  "\"defrag\"}, {\"metric\": \"Memory/y\", \"above\": 0.5, "
                                  "\"action\": \"release_caches\"}]", DSC_OK);
    fired f = {0};
    dsc_monitor_action_hooks hk = {&f, before, after};
    dsc_monitor_set_action_hooks(m, &hk);
    assert_int_equal(dsc_monitor_log(m, "Memory/x", 0.9, 1), DSC_OK);
    assert_int_equal(f.n, 1);
    assert_int_equal(f.before, 1);
    assert_string_equal(f.action, "defrag");
    assert_true(f.bytes > 0); // the odd blocks moved down
    dsc_mem_stats st;
    assert_int_equal(dsc_mem_pool_stats(pool, &st), DSC_OK);
    assert_true(st.fragmentation < 1e-9);
    for (int i = 1; i < 64; i += 2) dsc_mem_free(pool, h[i]);
    assert_int_equal(dsc_monitor_log(m, "Memory/y", 0.9, 1), DSC_OK);
    assert_int_equal(f.n, 2);
    assert_string_equal(f.action, "release_caches");
    dsc_monitor_destroy(m);
    dsc_mem_shutdown();
}

static void test_actions_bad_config(void **state) {
    monitor_with("[{\"metric\": \"loss\", \"above\": 1, \"action\": \"explode\"}]",
                 DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "\"monitor_actions\"[0]: \"action\" \"explode\""));
    monitor_with("[{\"metric\": \"loss\", \"action\": \"log\"}]", DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "\"above\" is missing"));
    monitor_with("[{\"metric\": \"loss\", \"above\": 1, \"action\": \"log\", \"below\": 0}]",
                 DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "unknown field \"below\""));
    monitor_with("[3]", DSC_ERR_CONFIG);
    dsc_config cfg;
    assert_int_equal(dsc_config_load_string(&cfg, "{\"monitor_actions\": {}}", 0, NULL, NULL),
                     DSC_ERR_CONFIG);
}

int main(void) {
    dsc_log_set_level(0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modules_match_mfu_formula),
        cmocka_unit_test(test_forward_timing),
        cmocka_unit_test(test_profile_report),
        cmocka_unit_test(test_bandwidth_formulas),
        cmocka_unit_test(test_actions_fire_once_per_crossing),
        cmocka_unit_test(test_defrag_action_compacts_the_host_pool),
        cmocka_unit_test(test_actions_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
