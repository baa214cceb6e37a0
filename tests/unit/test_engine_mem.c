// Unit tests of the engine's memory: its buffers and the model's activations are blocks of one
// pool that moves them between steps (training continues bitwise as without the moves), a long
// run neither grows nor allocates from the system after warm-up, the model states are the pool's
// accounting, and an allocation that does not fit compacts once, then names the largest users.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, getenv, strtol
#include <string.h> // memcmp, strstr

#include <omp.h>    // omp_set_num_threads

#include "dsc/engine.h"      // dsc_engine_*
#include "dsc/memory.h"      // dsc_mem_*
#include "model/gpt2/gpt2.h" // dsc_gpt2_*

enum { B = 2, T = 8, MAXP = 64 };

// The leak test's length: 10,000 steps take about 3 s in an optimized build; an unoptimized
// AddressSanitizer build is several times slower, so it checks the first 2,000.
#if defined(__SANITIZE_ADDRESS__)
#define LEAK_STEPS 2000
#else
#define LEAK_STEPS 10000
#endif

// A tiny GPT-2 trained through the engine, as the trainer does it.
typedef struct run {
    dsc_gpt2_config mc;
    dsc_engine *e;
    dsc_gpt2 *model;
    int n;
    float *work[MAXP], *grads[MAXP];
    int tgroup[MAXP];
    int32_t in[B * T], tg[B * T];
} run;

static dsc_status hook_gather(void *u, int g) {
    run *r = u;
    dsc_status st = dsc_gather(r->e, g);
    for (int i = 0; st == DSC_OK && i < r->n; i++) {
        if (r->tgroup[i] != g) continue;
        r->work[i] = dsc_param_data(r->e, i);
        r->grads[i] = dsc_param_grad(r->e, i);
    }
    return st;
}
static dsc_status hook_release(void *u, int g) { return dsc_release(((run *)u)->e, g); }
static dsc_status hook_ready(void *u, int g) { return dsc_grads_ready(((run *)u)->e, g); }

static void refresh(run *r) {
    for (int i = 0; i < r->n; i++) {
        r->work[i] = dsc_param_data(r->e, i);
        r->grads[i] = dsc_param_grad(r->e, i);
    }
}

// The engine's parameter table of the model; returns the number of tensors.
static int describe(const dsc_gpt2_config *mc, dsc_param_desc *pd, dsc_gpt2_tensor_info *info) {
    int n = dsc_gpt2_num_tensors(mc);
    assert_true(n <= MAXP);
    for (int i = 0; i < n; i++) {
        dsc_gpt2_tensor_info_get(mc, i, &info[i]);
        pd[i] = (dsc_param_desc){.name = info[i].name, .ndim = info[i].ndim,
                                 .group = info[i].group};
        for (int d = 0; d < info[i].ndim; d++) pd[i].shape[d] = info[i].shape[d];
    }
    return n;
}

// pool: NULL for the engine's own. Activations go into the engine's pool either way.
static void run_open(run *r, const char *json, dsc_mem_pool *pool) {
    memset(r, 0, sizeof *r);
    assert_int_equal(dsc_gpt2_config_parse("d1", 32, T, &r->mc), DSC_OK);
    dsc_param_desc pd[MAXP];
    dsc_gpt2_tensor_info info[MAXP];
    r->n = describe(&r->mc, pd, info);
    for (int i = 0; i < r->n; i++) r->tgroup[i] = info[i].group;
    dsc_engine_opts o = {.config_json = json, .params = pd, .nparams = r->n, .rank = 0,
                         .world_size = 1, .pool = pool};
    if (dsc_engine_create(&r->e, &o) != DSC_OK) fail_msg("engine create: %s", dsc_last_error());
    float *master[MAXP];
    for (int i = 0; i < r->n; i++) master[i] = dsc_param_master(r->e, i);
    dsc_gpt2_init_weights(&r->mc, master, 1234);
    assert_int_equal(dsc_params_updated(r->e), DSC_OK);
    assert_int_equal(dsc_gpt2_create_in(&r->model, &r->mc, B, T, dsc_engine_mem_pool(r->e)),
                     DSC_OK);
    refresh(r);
}

static void run_close(run *r) {
    dsc_gpt2_destroy(r->model);
    dsc_engine_destroy(r->e);
}

// One optimizer step on deterministic tokens; returns the mean loss of its micro-steps.
static float run_step(run *r, int64_t step) {
    dsc_gpt2_hooks h = {r, hook_gather, hook_release, hook_ready};
    int gas = (int)dsc_engine_config(r->e)->gradient_accumulation_steps;
    float sum = 0;
    for (int micro = 0; micro < gas; micro++) {
        for (int k = 0; k < B * T; k++) {
            r->in[k] = (int32_t)((step * 7 + micro * 3 + k * 5) % 32);
            r->tg[k] = (int32_t)((step * 7 + micro * 3 + k * 5 + 1) % 32);
        }
        float loss;
        if (dsc_gpt2_forward(r->model, r->work, r->in, r->tg, B, T, &h, &loss) != DSC_OK ||
            dsc_backward_begin(r->e) != DSC_OK ||
            dsc_gpt2_backward(r->model, r->work, r->grads, (float)dsc_backward_scale(r->e),
                              &h) != DSC_OK)
            fail_msg("step %lld: %s", (long long)step, dsc_last_error());
        dsc_step_info si;
        if (dsc_step(r->e, &si) != DSC_OK) fail_msg("dsc_step: %s", dsc_last_error());
        sum += loss;
    }
    return sum / (float)gas;
}

static void full_params(run *r, float **out) {
    dsc_gpt2_tensor_info ti;
    for (int i = 0; i < r->n; i++) {
        dsc_gpt2_tensor_info_get(&r->mc, i, &ti);
        out[i] = malloc((size_t)ti.numel * sizeof(float));
        assert_non_null(out[i]);
        assert_int_equal(dsc_engine_full_param(r->e, i, out[i]), DSC_OK);
    }
}

static const char *config(int stage, const char *extra, char *buf, size_t cap) {
    snprintf(buf, cap, "{\"train_batch_size\": %s, \"train_micro_batch_size_per_gpu\": 2,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": %d,"
             " \"stage3_param_persistence_threshold\": 100}%s}",
             strstr(extra, "gas2") ? "4" : "2", stage, strstr(extra, "fp16") ?
             ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8}" : "");
    return buf;
}

// Every stage: a run whose blocks all move down between steps 3 and 4 (a hole opened below
// them, then a forced compaction) gives the same losses and weights, bit for bit, as one without.
static void check_defrag_bitwise(int stage, const char *extra) {
    char json[512];
    config(stage, extra, json, sizeof json);
    enum { STEPS = 7 };
    run a, b;
    float la[STEPS], lb[STEPS], *pa[MAXP], *pb[MAXP];
    run_open(&a, json, NULL);
    for (int s = 0; s < STEPS; s++) la[s] = run_step(&a, s + 1);
    full_params(&a, pa);
    run_close(&a);

    dsc_mem_pool *pool;
    dsc_mem_opts po = {.name = "test pool", .no_defrag_on_oom = true};
    assert_int_equal(dsc_mem_pool_create(&pool, DSC_MEM_HOST, 0, &po), DSC_OK);
    dsc_mem_handle spacer;
    assert_int_equal(dsc_mem_alloc(pool, 1 << 20, "test.spacer", &spacer), DSC_OK);
    run_open(&b, json, pool);
    for (int s = 0; s < STEPS; s++) {
        if (s == 3) {
            const float *before = dsc_param_data(b.e, 0);
            dsc_mem_free(pool, spacer);
            bool moved = false;
            assert_int_equal(dsc_engine_maintain(b.e, true, &moved), DSC_OK);
            assert_true(moved);
            dsc_mem_stats st;
            assert_int_equal(dsc_mem_pool_stats(pool, &st), DSC_OK);
            assert_int_equal(st.defrag_count, 1);
            assert_true(st.defrag_bytes_moved > 0);
            if (stage < 3) assert_ptr_not_equal(dsc_param_data(b.e, 0), before);
            refresh(&b);
        }
        lb[s] = run_step(&b, s + 1);
    }
    full_params(&b, pb);
    for (int s = 0; s < STEPS; s++)
        if (memcmp(&la[s], &lb[s], sizeof la[s]) != 0)
            fail_msg("stage %d %s: step %d loss %.9g with a compaction, %.9g without", stage,
                     extra, s + 1, lb[s], la[s]);
    dsc_gpt2_tensor_info ti;
    for (int i = 0; i < a.n; i++) {
        dsc_gpt2_tensor_info_get(&a.mc, i, &ti);
        if (memcmp(pa[i], pb[i], (size_t)ti.numel * sizeof(float)) != 0)
            fail_msg("stage %d %s: %s differs after a compaction", stage, extra, ti.name);
        free(pa[i]);
        free(pb[i]);
    }
    run_close(&b);
    dsc_mem_pool_destroy(pool);
}

static void test_defrag_bitwise(void **state) {
    for (int stage = 0; stage <= 3; stage++) check_defrag_bitwise(stage, "");
    check_defrag_bitwise(1, "gas2");
    check_defrag_bitwise(2, "fp16");
    check_defrag_bitwise(3, "fp16 gas2");
}

// Model states are the pool's accounting per tag, and they are what the stage keeps.
static void test_memory_from_pool(void **state) {
    char json[512];
    run r;
    run_open(&r, config(2, "", json, sizeof json), NULL);
    dsc_engine_memory m;
    dsc_engine_memory_get(r.e, &m);
    dsc_mem_stats st;
    assert_int_equal(dsc_mem_pool_stats(dsc_engine_mem_pool(r.e), &st), DSC_OK);
    size_t P = (size_t)dsc_engine_num_elements(r.e);
    // stage 2, one rank: parameters, gradients (a partition = everything) and two moments, each
    // at least P floats and at most 10% above (padding to 16 elements per tensor).
    assert_true(m.params >= 4 * P && m.params < 4 * P * 11 / 10);
    assert_true(m.grads >= 4 * P && m.grads < 4 * P * 11 / 10);
    assert_true(m.optimizer >= 8 * P && m.optimizer < 8 * P * 11 / 10);
    assert_true(st.allocated >= m.params + m.grads + m.optimizer);
    run_close(&r);
}

// LEAK_STEPS steps (DSC_LEAK_STEPS overrides): after warm-up the pool neither grows nor asks the
// system for memory, its live blocks stay the same, and every step's allocations are freed.
static void test_no_growth(void **state) {
    const char *env = getenv("DSC_LEAK_STEPS");
    long steps = env ? strtol(env, NULL, 10) : LEAK_STEPS;
    assert_true(steps > 100);
    char json[600], cfg[512];
    config(3, "gas2", cfg, sizeof cfg);
    // periodic compaction on every maintain call that finds fragmentation
    snprintf(json, sizeof json, "%.*s, \"memory\": {\"defrag_interval_s\": 0, "
             "\"defrag_threshold\": 0}}", (int)strlen(cfg) - 1, cfg);
    run r;
    run_open(&r, json, NULL);
    dsc_mem_pool *pool = dsc_engine_mem_pool(r.e);
    dsc_mem_stats at100 = {0}, end;
    for (long s = 1; s <= steps; s++) {
        float loss = run_step(&r, s);
        if (!(loss == loss)) fail_msg("step %ld: loss is NaN", s);
        bool moved;
        assert_int_equal(dsc_engine_maintain(r.e, false, &moved), DSC_OK);
        if (moved) refresh(&r);
        if (s == 100) assert_int_equal(dsc_mem_pool_stats(pool, &at100), DSC_OK);
    }
    assert_int_equal(dsc_mem_pool_stats(pool, &end), DSC_OK);
    print_message("steps 100 -> %ld: reserved %zu -> %zu, system allocs %llu -> %llu, live %llu -> "
                  "%llu, allocs %llu -> %llu, peak %zu -> %zu\n", steps, at100.reserved,
                  end.reserved, (unsigned long long)at100.system_allocs,
                  (unsigned long long)end.system_allocs, (unsigned long long)at100.live_blocks,
                  (unsigned long long)end.live_blocks, (unsigned long long)at100.alloc_count,
                  (unsigned long long)end.alloc_count, at100.peak_allocated, end.peak_allocated);
    assert_int_equal(end.reserved, at100.reserved);
    assert_int_equal(end.system_allocs, at100.system_allocs);
    assert_int_equal(end.system_frees, at100.system_frees);
    assert_int_equal(end.live_blocks, at100.live_blocks);
    assert_int_equal(end.allocated, at100.allocated);
    assert_int_equal(end.peak_allocated, at100.peak_allocated);
    assert_int_equal(end.alloc_count - end.free_count, at100.alloc_count - at100.free_count);
    assert_true(end.alloc_count > at100.alloc_count); // the steps did allocate, from the pool
    run_close(&r);
}

// A pool too fragmented for the engine's buffers is compacted once during create (moving the
// caller's blocks too); one too small fails with the request and the largest users by name.
static void test_oom_compacts_then_names_users(void **state) {
    char json[512];
    config(0, "", json, sizeof json);
    run probe;
    run_open(&probe, json, NULL);
    dsc_mem_stats need; // the engine's buffers and the model's activations
    assert_int_equal(dsc_mem_pool_stats(dsc_engine_mem_pool(probe.e), &need), DSC_OK);
    run_close(&probe);

    // [hole][block] x k, then a tail of 64 KiB: the free space would hold everything, but no
    // free block holds even the first buffer until the pool is compacted.
    size_t piece = 64u << 10, k = need.allocated / piece + 1;
    size_t cap = 2 * k * piece + piece;
    dsc_mem_pool *pool;
    dsc_mem_opts po = {.name = "small pool", .no_defrag_on_oom = true};
    assert_int_equal(dsc_mem_pool_create(&pool, DSC_MEM_HOST, cap, &po), DSC_OK);
    dsc_mem_handle *h = calloc(2 * k, sizeof *h);
    assert_non_null(h);
    for (size_t q = 0; q < 2 * k; q++)
        assert_int_equal(dsc_mem_alloc(pool, piece, "test.block", &h[q]), DSC_OK);
    for (size_t q = 0; q < 2 * k; q += 2) dsc_mem_free(pool, h[q]);
    ((char *)dsc_mem_ptr(pool, h[2 * k - 1]))[7] = 42;
    dsc_mem_stats st;
    assert_int_equal(dsc_mem_pool_stats(pool, &st), DSC_OK);
    assert_true(st.reserved - st.allocated >= need.allocated);
    assert_true(st.largest_free_block < need.allocated / 4);
    run r;
    run_open(&r, json, pool);
    assert_int_equal(dsc_mem_pool_stats(pool, &st), DSC_OK);
    assert_int_equal(st.defrag_count, 1);
    assert_int_equal(((char *)dsc_mem_ptr(pool, h[2 * k - 1]))[7], 42); // moved intact
    for (int s = 1; s <= 2; s++) run_step(&r, s);
    run_close(&r);
    free(h);
    dsc_mem_pool_destroy(pool);

    // Far too small: a clear out-of-memory error naming the engine's largest users.
    assert_int_equal(dsc_mem_pool_create(&pool, DSC_MEM_HOST, need.allocated / 2, &po), DSC_OK);
    dsc_gpt2_config mc;
    assert_int_equal(dsc_gpt2_config_parse("d1", 32, T, &mc), DSC_OK);
    dsc_param_desc pd[MAXP];
    dsc_gpt2_tensor_info info[MAXP];
    int n = describe(&mc, pd, info);
    dsc_engine_opts o = {.config_json = json, .params = pd, .nparams = n, .world_size = 1,
                         .pool = pool};
    dsc_engine *e = NULL;
    assert_int_equal(dsc_engine_create(&e, &o), DSC_ERR_OOM);
    const char *msg = dsc_last_error();
    print_message("%s\n", msg);
    assert_non_null(strstr(msg, "out of memory"));
    assert_non_null(strstr(msg, "largest users: zero."));
    assert_non_null(strstr(msg, "small pool"));
    dsc_mem_pool_destroy(pool);

    // A pool that would move blocks by itself in the middle of a step is refused.
    po.no_defrag_on_oom = false;
    assert_int_equal(dsc_mem_pool_create(&pool, DSC_MEM_HOST, 0, &po), DSC_OK);
    o.pool = pool;
    assert_int_equal(dsc_engine_create(&e, &o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "no_defrag_on_oom"));
    dsc_mem_pool_destroy(pool);
}

// Moving blocks in the middle of a step, or before the weights are in, is refused.
static void test_maintain_only_between_steps(void **state) {
    char json[512];
    run r;
    run_open(&r, config(3, "gas2", json, sizeof json), NULL);
    assert_int_equal(dsc_gather(r.e, 0), DSC_OK);
    bool moved;
    assert_int_equal(dsc_engine_maintain(r.e, true, &moved), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "between optimizer steps"));
    assert_false(moved);
    assert_int_equal(dsc_release(r.e, 0), DSC_OK);
    run_close(&r);
}

int main(void) {
    // One thread: the model is tiny, and OpenMP's barriers on a busy machine would cost more
    // than the work (thousands of parallel regions per second).
    omp_set_num_threads(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defrag_bitwise),
        cmocka_unit_test(test_memory_from_pool),
        cmocka_unit_test(test_oom_compacts_then_names_users),
        cmocka_unit_test(test_maintain_only_between_steps),
        cmocka_unit_test(test_no_growth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
