// Unit tests of the single-rank engine: accumulation, clipping, fp16 overflow skipping, schedules.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // sqrt, fabs
#include <stdio.h>  // snprintf
#include <stdlib.h> // setenv, calloc
#include <string.h> // strstr

#include "dsc/engine.h"    // dsc_engine_*
#include "engine/device.h" // dsc__engine_add_grads, dsc__engine_gather_master

static const dsc_param_desc params[] = {
    {"a.weight", 2, {3, 5}, 0, false},
    {"a.bias", 1, {5}, 0, false},
    {"b.weight", 1, {7}, 1, false},
};

static dsc_engine *make(const char *json) {
    dsc_engine *e = NULL;
    dsc_engine_opts o = {.config_json = json, .params = params, .nparams = 3, .rank = 0, .world_size = 1};
    dsc_status st = dsc_engine_create(&e, &o);
    if (st != DSC_OK) fail_msg("engine create: %s", dsc_last_error());
    for (int i = 0; i < 3; i++) {
        float *m = dsc_param_master(e, i);
        int n = i == 0 ? 15 : i == 1 ? 5 : 7;
        for (int k = 0; k < n; k++) m[k] = 0.1f * (float)(k + 1) * (i == 2 ? -1.0f : 1.0f);
    }
    assert_int_equal(dsc_params_updated(e), DSC_OK);
    return e;
}

static int numel(int i) { return i == 0 ? 15 : i == 1 ? 5 : 7; }

// Add grad = c * (k + 1) to every element, scaled as backward would be.
static void backward(dsc_engine *e, double c) {
    double s = dsc_backward_scale(e);
    for (int i = 0; i < 3; i++) {
        float *g = dsc_param_grad(e, i);
        for (int k = 0; k < numel(i); k++) g[k] += (float)(s * c * (k + 1));
    }
}

static void test_accumulation_and_sgd(void **state) {
    dsc_engine *e = make("{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": 2,"
                         " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}}");
    assert_int_equal(dsc_engine_config(e)->gradient_accumulation_steps, 2);
    dsc_step_info info;
    backward(e, 1.0);
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_false(info.boundary);
    backward(e, 3.0);
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_true(info.boundary);
    assert_int_equal(info.step, 1);
    // mean gradient over the two micro-batches = 2 (k + 1); SGD: p -= 0.5 * 2 (k + 1)
    for (int k = 0; k < 5; k++) {
        float want = 0.1f * (k + 1) - 0.5f * 2.0f * (k + 1);
        assert_float_equal(dsc_param_master(e, 1)[k], want, 1e-6);
        assert_float_equal(dsc_param_grad(e, 1)[k], 0.0f, 0.0f); // zeroed after the step
    }
    double sumsq = 0;
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < numel(i); k++) sumsq += 4.0 * (k + 1) * (k + 1);
    assert_float_equal(info.grad_norm, sqrt(sumsq), 1e-4);
    assert_float_equal(info.lr, 0.5, 1e-7);
    dsc_engine_destroy(e);
}

// A frozen tensor (LoRA's base): values only, no gradient, untouched by the optimizer, left out
// of the trainable layout; the caller's indices still name every tensor, in registration order.
static void test_frozen_tensor(void **state) {
    static const dsc_param_desc fp[] = {
        {"a.weight", 2, {3, 5}, 0, true}, // frozen, between two trainable tensors
        {"a.bias", 1, {5}, 0, false},
        {"b.weight", 1, {7}, 1, false},
    };
    for (int stage = 0; stage <= 3; stage++) {
        char json[256];
        snprintf(json, sizeof json, "{\"train_batch_size\": 1, \"zero_optimization\": {\"stage\": "
                 "%d}, \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 0.5}}}", stage);
        dsc_engine *e = NULL;
        dsc_engine_opts o = {.config_json = json, .params = fp, .nparams = 3, .rank = 0,
                             .world_size = 1};
        assert_int_equal(dsc_engine_create(&e, &o), DSC_OK);
        assert_int_equal(dsc_engine_num_params(e), 3);
        assert_int_equal(dsc_engine_num_elements(e), 12); // trainable elements only
        assert_true(dsc_param_frozen(e, 0));
        assert_false(dsc_param_frozen(e, 1));
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < numel(i); k++) dsc_param_master(e, i)[k] = (float)(10 * i + k);
        assert_int_equal(dsc_params_updated(e), DSC_OK);
        assert_null(dsc_param_grad(e, 0));
        assert_int_equal(dsc_backward_begin(e), DSC_OK);
        assert_int_equal(dsc_gather(e, 0), DSC_OK);
        assert_int_equal(dsc_gather(e, 1), DSC_OK);
        assert_null(dsc_param_grad(e, 0));
        assert_float_equal(dsc_param_data(e, 0)[14], 14.0f, 0.0f);
        for (int i = 1; i < 3; i++)
            for (int k = 0; k < numel(i); k++) dsc_param_grad(e, i)[k] += dsc_backward_scale(e);
        assert_int_equal(dsc_release(e, 1), DSC_OK);
        assert_int_equal(dsc_grads_ready(e, 1), DSC_OK);
        assert_int_equal(dsc_release(e, 0), DSC_OK);
        assert_int_equal(dsc_grads_ready(e, 0), DSC_OK);
        dsc_step_info info;
        assert_int_equal(dsc_step(e, &info), DSC_OK);
        assert_true(info.boundary);
        assert_float_equal(info.grad_norm, sqrt(12.0), 1e-5); // the trainable tensors' norm
        float v[15];
        assert_int_equal(dsc_engine_full_param(e, 0, v), DSC_OK);
        for (int k = 0; k < 15; k++) assert_float_equal(v[k], (float)k, 0.0f); // untouched
        assert_int_equal(dsc_engine_full_param(e, 2, v), DSC_OK);
        for (int k = 0; k < 7; k++) assert_float_equal(v[k], 20.0f + k - 0.5f, 1e-6);
        assert_int_not_equal(dsc_engine_full_grad(e, 0, v), DSC_OK);
        assert_non_null(strstr(dsc_last_error(), "a.weight"));
        dsc_engine_destroy(e);
    }
}

static void test_clipping(void **state) {
    dsc_engine *e = make("{\"train_batch_size\": 1, \"gradient_clipping\": 1.0,"
                         " \"optimizer\": {\"type\": \"SGD\", \"params\": {\"lr\": 1.0}}}");
    float before = dsc_param_master(e, 2)[3];
    backward(e, 1.0);
    dsc_step_info info;
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    double coef = 1.0 / (info.grad_norm + 1e-6); // DeepSpeed's clip coefficient
    assert_true(info.grad_norm > 1.0);
    assert_float_equal(dsc_param_master(e, 2)[3], before - (float)(coef * 4.0), 1e-6);
    dsc_engine_destroy(e);
}

// fp16 with a forced overflow at steps 2 and 3: those steps change nothing but the loss scale;
// the schedule does not advance, Adam's step count does not advance.
static void test_fp16_overflow_skips(void **state) {
    const char *cfg = "{\"train_batch_size\": 1, \"fp16\": {\"enabled\": true, "
                      "\"initial_scale_power\": 8, \"hysteresis\": 1},"
                      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
                      " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_min_lr\": 0,"
                      " \"warmup_max_lr\": 0.01, \"warmup_num_steps\": 10, \"warmup_type\": \"linear\"}}}";
    setenv("DSC_INJECT_OVERFLOW", "2-3", 1);
    dsc_engine *e = make(cfg);
    unsetenv("DSC_INJECT_OVERFLOW");
    dsc_engine *ref = make(cfg); // no overflow: the steps it applies must match e's
    dsc_step_info a, b;
    double scales[5], lrs[5];
    for (int s = 1; s <= 5; s++) {
        float snapshot[15];
        memcpy(snapshot, dsc_param_master(e, 0), sizeof snapshot);
        backward(e, 0.01);
        assert_int_equal(dsc_step(e, &a), DSC_OK);
        scales[s - 1] = a.loss_scale;
        lrs[s - 1] = a.lr;
        if (s == 2 || s == 3) {
            assert_true(a.skipped);
            assert_memory_equal(snapshot, dsc_param_master(e, 0), sizeof snapshot);
            continue;
        }
        assert_false(a.skipped);
        backward(ref, 0.01);
        assert_int_equal(dsc_step(ref, &b), DSC_OK);
        assert_float_equal(a.lr, b.lr, 0);
    }
    // Each overflow halves the scale (hysteresis 1): 256, 256, 128, 64, 64.
    assert_float_equal(scales[0], 256, 0);
    assert_float_equal(scales[2], 128, 0);
    assert_float_equal(scales[3], 64, 0);
    assert_float_equal(lrs[1], lrs[2], 0);
    assert_int_equal(a.skipped_total, 2);
    assert_int_equal(dsc_engine_global_steps(e), 5);
    // After 3 applied steps each, the two runs agree (the grads were the same once unscaled).
    for (int k = 0; k < 15; k++)
        assert_float_equal(dsc_param_master(e, 0)[k], dsc_param_master(ref, 0)[k], 1e-6);
    dsc_engine_destroy(e);
    dsc_engine_destroy(ref);
}

static void test_bf16_work_copy_is_rounded(void **state) {
    dsc_engine *e = make("{\"train_batch_size\": 1, \"bf16\": {\"enabled\": true}}");
    float *w = dsc_param_data(e, 0), *m = dsc_param_master(e, 0);
    assert_true(w != m);
    for (int k = 0; k < 15; k++) {
        uint32_t u;
        memcpy(&u, &w[k], 4);
        assert_int_equal(u & 0xffff, 0);
        assert_float_equal(w[k], m[k], fabsf(m[k]) / 128);
    }
    dsc_engine_destroy(e);
}

static void test_errors(void **state) {
    dsc_engine *e = NULL;
    dsc_engine_opts o = {.config_json = "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"Lamb\"}}",
                         .params = params, .nparams = 3, .world_size = 1};
    assert_int_equal(dsc_engine_create(&e, &o), DSC_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsc_last_error(), "lamb"));
    o.config_json = "{\"train_batch_size\": 1}";
    o.config_path = "x.json";
    assert_int_equal(dsc_engine_create(&e, &o), DSC_ERR_INVALID_ARG);
    o.config_path = NULL;
    o.nparams = 0;
    assert_int_equal(dsc_engine_create(&e, &o), DSC_ERR_INVALID_ARG);
    e = make("{\"train_batch_size\": 1}");
    assert_int_equal(dsc_release(e, 0), DSC_ERR_INVALID_ARG); // release without gather
    assert_int_equal(dsc_gather(e, 2), DSC_ERR_INVALID_ARG);  // groups are 0..1
    assert_int_equal(dsc_gather(e, 1), DSC_OK);
    assert_int_equal(dsc_release(e, 1), DSC_OK);
    dsc_engine_destroy(e);
    dsc_engine_destroy(NULL);
}

// The host-staged device path hands each micro-step's gradients over as one full-layout vector
// (dsc__engine_add_grads) and reads the weights back whole (dsc__engine_gather_master): at every
// stage that must be bitwise what the model's own backward into dsc_param_grad gives at stage 0.
static dsc_engine *make_stage(int stage) {
    char json[512];
    snprintf(json, sizeof json, "{\"train_batch_size\": 4, \"train_micro_batch_size_per_gpu\": 2,"
             " \"gradient_clipping\": 0.5, \"bf16\": {\"enabled\": true},"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"zero_optimization\": {\"stage\": %d}}", stage);
    return make(json);
}

static void test_device_hooks_match_backward(void **state) {
    dsc_engine *ref = make_stage(0);
    size_t n = dsc__engine_layout_len(ref);
    float *flat = calloc(n, sizeof *flat), *want = calloc(n, sizeof *want);
    float *got = calloc(n, sizeof *got);
    assert_non_null(flat);
    assert_non_null(want);
    assert_non_null(got);
    dsc_step_info info, rinfo;
    for (int step = 0; step < 3; step++)
        for (int micro = 0; micro < 2; micro++) {
            backward(ref, 1.0 + micro - 0.7 * step);
            assert_int_equal(dsc_step(ref, &rinfo), DSC_OK);
        }
    assert_int_equal(dsc__engine_gather_master(ref, want), DSC_OK);
    for (int stage = 0; stage <= 3; stage++) {
        dsc_engine *e = make_stage(stage);
        assert_int_equal(dsc__engine_layout_len(e), n);
        for (int step = 0; step < 3; step++)
            for (int micro = 0; micro < 2; micro++) {
                double s = dsc_backward_scale(e), c = 1.0 + micro - 0.7 * step;
                for (int i = 0; i < 3; i++) {
                    size_t off = dsc__engine_param_offset(e, i);
                    for (int k = 0; k < numel(i); k++) flat[off + (size_t)k] = (float)(s * c * (k + 1));
                }
                assert_int_equal(dsc__engine_add_grads(e, flat), DSC_OK);
                assert_int_equal(dsc_step(e, &info), DSC_OK);
            }
        assert_true(info.boundary);
        assert_true(info.grad_norm == rinfo.grad_norm);
        assert_int_equal(dsc__engine_gather_master(e, got), DSC_OK);
        assert_memory_equal(got, want, n * sizeof *got);
        dsc_engine_destroy(e);
    }
    free(flat);
    free(want);
    free(got);
    dsc_engine_destroy(ref);
}

// no_compute_copy (a model on a GPU): no host compute copy (dsc_param_data NULL, 4 bytes per
// parameter less), and the engine's own steps give the same masters bit for bit. Stages 0 and 1
// (stage 2's gradients need the gather protocol, which `backward` here does not follow).
static void test_no_compute_copy(void **state) {
    for (int stage = 0; stage <= 1; stage++) {
        char json[512];
        snprintf(json, sizeof json, "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": "
                 "{\"enabled\": true}, \"gradient_clipping\": 0.5, \"zero_optimization\": "
                 "{\"stage\": %d}, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
                 "{\"lr\": 0.01}}}", stage);
        dsc_engine *a = make(json), *b = NULL;
        dsc_engine_opts o = {.config_json = json, .params = params, .nparams = 3,
                             .world_size = 1, .no_compute_copy = true};
        assert_int_equal(dsc_engine_create(&b, &o), DSC_OK);
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < numel(i); k++)
                dsc_param_master(b, i)[k] = 0.1f * (float)(k + 1) * (i == 2 ? -1.0f : 1.0f);
        assert_int_equal(dsc_params_updated(b), DSC_OK);
        assert_non_null(dsc_param_data(a, 0));
        assert_null(dsc_param_data(b, 0));
        dsc_engine_memory ma, mb;
        dsc_engine_memory_get(a, &ma);
        dsc_engine_memory_get(b, &mb);
        assert_true(mb.params < ma.params);
        for (int step = 0; step < 3; step++) {
            dsc_step_info ia, ib;
            backward(a, 1.0 + step);
            backward(b, 1.0 + step);
            assert_int_equal(dsc_step(a, &ia), DSC_OK);
            assert_int_equal(dsc_step(b, &ib), DSC_OK);
            assert_true(ia.grad_norm == ib.grad_norm);
        }
        for (int i = 0; i < 3; i++) {
            float x[15], y[15];
            assert_int_equal(dsc_engine_full_param(a, i, x), DSC_OK);
            assert_int_equal(dsc_engine_full_param(b, i, y), DSC_OK);
            assert_memory_equal(x, y, (size_t)numel(i) * sizeof(float));
        }
        dsc_engine_destroy(a);
        dsc_engine_destroy(b);
    }
    // Stage 3: no compute-copy partition either; a gather says why it cannot run.
    const char *j3 = "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, "
                     "\"zero_optimization\": {\"stage\": 3, \"param_persistence_threshold\": 0}}";
    dsc_engine *c = NULL;
    dsc_engine_opts o3 = {.config_json = j3, .params = params, .nparams = 3, .world_size = 1,
                          .no_compute_copy = true};
    assert_int_equal(dsc_engine_create(&c, &o3), DSC_OK);
    assert_int_equal(dsc_params_updated(c), DSC_OK);
    assert_int_equal(dsc_gather(c, 0), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "no_compute_copy"));
    dsc_engine_destroy(c);
}

// Streamed ZeRO-Offload (offload_optimizer "cpu", one rank, a model on a device): the engine
// keeps no gradient buffers (the device trainer hands each group to the CPU optimizer), refuses
// a host backward, and its master is the initialiser's target in place at every stage;
// DSC_OFFLOAD_STREAM=0 keeps the gradients (the whole-gradient path hands them to dsc_step).
// dsc_engine_opts.device_grads (one rank, the optimizer on the device): no gradient buffers, a
// host backward refused; without it, or with an offloaded optimizer that is not streamed, the
// engine keeps them.
static void test_device_grads_engine(void **state) {
    (void)state;
    const char *json = "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, "
                       "\"zero_optimization\": {\"stage\": 1}, \"optimizer\": {\"type\": "
                       "\"AdamW\", \"params\": {\"lr\": 0.01}}}";
    dsc_engine_opts o = {.config_json = json, .params = params, .nparams = 3, .world_size = 1,
                         .no_compute_copy = true, .device_grads = true};
    dsc_engine *dev = NULL, *host = NULL;
    assert_int_equal(dsc_engine_create(&dev, &o), DSC_OK);
    o.device_grads = false;
    assert_int_equal(dsc_engine_create(&host, &o), DSC_OK);
    dsc_engine_memory md, mh;
    dsc_engine_memory_get(dev, &md);
    dsc_engine_memory_get(host, &mh);
    assert_int_equal(md.grads, 0);
    assert_true(mh.grads > 0);
    assert_int_equal(dsc_backward_begin(dev), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "no gradient buffers"));
    assert_int_equal(dsc_backward_begin(host), DSC_OK);
    dsc_engine_destroy(dev);
    dsc_engine_destroy(host);
}

static void test_streamed_offload_engine(void **state) {
    (void)state;
    for (int stage = 0; stage <= 3; stage++) {
        char json[512];
        snprintf(json, sizeof json, "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": "
                 "{\"enabled\": true}, \"gradient_accumulation_steps\": 2, "
                 "\"zero_optimization\": {\"stage\": %d, \"offload_optimizer\": {\"device\": "
                 "\"cpu\"}}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}}}",
                 stage);
        dsc_engine_opts o = {.config_json = json, .params = params, .nparams = 3,
                             .world_size = 1, .no_compute_copy = true};
        dsc_engine *lean = NULL, *whole = NULL;
        assert_int_equal(dsc_engine_create(&lean, &o), DSC_OK);
        setenv("DSC_OFFLOAD_STREAM", "0", 1);
        assert_int_equal(dsc_engine_create(&whole, &o), DSC_OK);
        unsetenv("DSC_OFFLOAD_STREAM");
        dsc_engine_memory ml, mw;
        dsc_engine_memory_get(lean, &ml);
        dsc_engine_memory_get(whole, &mw);
        assert_int_equal(ml.grads, 0);
        assert_true(mw.grads > 0);
        for (int i = 0; i < 3; i++)
            for (int k = 0; k < numel(i); k++)
                dsc_param_master(lean, i)[k] = 0.1f * (float)(k + 1) * (i == 2 ? -1.0f : 1.0f);
        assert_int_equal(dsc_params_updated(lean), DSC_OK);
        float x[15];
        assert_int_equal(dsc_engine_full_param(lean, 2, x), DSC_OK);
        for (int k = 0; k < numel(2); k++) assert_true(x[k] == -0.1f * (float)(k + 1));
        assert_int_equal(dsc_backward_begin(lean), DSC_ERR_INVALID_ARG);
        assert_non_null(strstr(dsc_last_error(), "no gradient buffers"));
        assert_int_equal(dsc_backward_begin(whole), DSC_OK);
        dsc_engine_destroy(lean);
        dsc_engine_destroy(whole);
    }
    // Parameter offload streams the step only at one micro-step without clipping (each layer's
    // gradients are taken for good as the backward goes); clipping needs the accumulator.
    for (int clip = 0; clip <= 1; clip++) {
        char json[512];
        snprintf(json, sizeof json, "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": "
                 "{\"enabled\": true}, \"gradient_clipping\": %d, \"zero_optimization\": "
                 "{\"stage\": 3, \"offload_optimizer\": {\"device\": \"cpu\"}, "
                 "\"offload_param\": {\"device\": \"cpu\"}}}", clip);
        dsc_engine_opts o = {.config_json = json, .params = params, .nparams = 3,
                             .world_size = 1, .no_compute_copy = true};
        dsc_engine *e = NULL;
        assert_int_equal(dsc_engine_create(&e, &o), DSC_OK);
        dsc_engine_memory m;
        dsc_engine_memory_get(e, &m);
        assert_true(clip ? m.grads > 0 : m.grads == 0);
        dsc_engine_destroy(e);
    }
}

// The initial value of element k of tensor i in these tests.
static float init_value(int i, int64_t k) { return 0.1f * (float)(k + 1) * (i == 2 ? -1.0f : 1.0f); }

typedef struct fill_log {
    int64_t elems[3]; // elements asked for, per tensor
    int fail_at;      // tensor whose fill fails, or -1
} fill_log;

static dsc_status fill_values(void *user, int i, int64_t begin, int64_t count, float *dst) {
    fill_log *l = user;
    if (i == l->fail_at) return DSC_ERR_IO;
    l->elems[i] += count;
    for (int64_t k = 0; k < count; k++) dst[k] = init_value(i, begin + k);
    return DSC_OK;
}

// dsc_params_init writes the partition in place: no staging block, and the run is bit for bit
// the run initialised through dsc_param_master, at every stage in fp32 and bf16.
static void test_params_init_in_place(void **state) {
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        for (int stage = 0; stage <= 3; stage++) {
            char json[512];
            snprintf(json, sizeof json, "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": "
                     "{\"enabled\": %s}, \"zero_optimization\": {\"stage\": %d, "
                     "\"param_persistence_threshold\": 0}, \"optimizer\": {\"type\": \"AdamW\", "
                     "\"params\": {\"lr\": 0.01}}}", bf16 ? "true" : "false", stage);
            dsc_engine *a = make(json), *b = NULL;
            dsc_engine_opts o = {.config_json = json, .params = params, .nparams = 3,
                                 .world_size = 1, .init_in_place = true};
            assert_int_equal(dsc_engine_create(&b, &o), DSC_OK);
            assert_null(dsc_param_master(b, 0));
            fill_log log = {.fail_at = -1};
            assert_int_equal(dsc_params_init(b, fill_values, &log), DSC_OK);
            for (int i = 0; i < 3; i++) assert_int_equal(log.elems[i], numel(i)); // one rank: all
            assert_int_not_equal(dsc_params_init(b, fill_values, &log), DSC_OK); // only once
            for (int step = 0; step < 3; step++) {
                dsc_step_info ia, ib;
                assert_int_equal(dsc_backward_begin(a), DSC_OK);
                assert_int_equal(dsc_backward_begin(b), DSC_OK);
                for (int g = 0; g < 2; g++) {
                    assert_int_equal(dsc_gather(a, g), DSC_OK);
                    assert_int_equal(dsc_gather(b, g), DSC_OK);
                }
                for (int i = 0; i < 3; i++)
                    assert_memory_equal(dsc_param_data(a, i), dsc_param_data(b, i),
                                        (size_t)numel(i) * sizeof(float));
                backward(a, 1.0 + step);
                backward(b, 1.0 + step);
                for (int g = 1; g >= 0; g--) {
                    assert_int_equal(dsc_release(a, g), DSC_OK);
                    assert_int_equal(dsc_release(b, g), DSC_OK);
                    assert_int_equal(dsc_grads_ready(a, g), DSC_OK);
                    assert_int_equal(dsc_grads_ready(b, g), DSC_OK);
                }
                assert_int_equal(dsc_step(a, &ia), DSC_OK);
                assert_int_equal(dsc_step(b, &ib), DSC_OK);
                assert_true(ia.grad_norm == ib.grad_norm);
            }
            for (int i = 0; i < 3; i++) {
                float x[15], y[15];
                assert_int_equal(dsc_engine_full_param(a, i, x), DSC_OK);
                assert_int_equal(dsc_engine_full_param(b, i, y), DSC_OK);
                assert_memory_equal(x, y, (size_t)numel(i) * sizeof(float));
            }
            dsc_engine_destroy(a);
            dsc_engine_destroy(b);
        }
    }
    // A fill failure comes back, naming the tensor; an engine made the usual way refuses.
    const char *j = "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 3}}";
    dsc_engine *c = NULL;
    dsc_engine_opts o = {.config_json = j, .params = params, .nparams = 3, .world_size = 1,
                         .init_in_place = true};
    assert_int_equal(dsc_engine_create(&c, &o), DSC_OK);
    fill_log bad = {.fail_at = 2};
    assert_int_equal(dsc_params_init(c, fill_values, &bad), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "b.weight"));
    dsc_engine_destroy(c);
    dsc_engine *d = make(j);
    fill_log ok = {.fail_at = -1};
    assert_int_equal(dsc_params_init(d, fill_values, &ok), DSC_ERR_INVALID_ARG);
    dsc_engine_destroy(d);
}

// The device step in two halves (the divisor computed where the norm is) plans exactly the step
// dsc__engine_device_step plans from the norm: same lr, hyper-parameters, step numbers, reported
// norm, and 1 / divisor bitwise the grad_scale. fp16 (whose steps may be skipped) is refused.
static void test_device_step_halves(void **state) {
    const char *cfg = "{\"train_batch_size\": 2, \"train_micro_batch_size_per_gpu\": 2,"
                      " \"gradient_clipping\": 1.0, \"bf16\": {\"enabled\": true},"
                      " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}},"
                      " \"scheduler\": {\"type\": \"WarmupLR\", \"params\":"
                      " {\"warmup_min_lr\": 0, \"warmup_max_lr\": 0.001, \"warmup_num_steps\": 3}}}";
    dsc_engine *a = make(cfg), *b = make(cfg);
    const double sumsqs[] = {0.0, 0.25, 0.999999, 1.0, 4.0, 1e6, 3.0e-9};
    for (size_t k = 0; k < sizeof sumsqs / sizeof sumsqs[0]; k++) {
        dsc__device_step pa, pb;
        dsc_step_info ia, ib;
        dsc__device_divisor div;
        assert_int_equal(dsc__engine_device_step(a, sumsqs[k], false, &pa, &ia), DSC_OK);
        assert_int_equal(dsc__engine_device_step_begin(b, &pb, &ib, &div), DSC_OK);
        dsc__engine_device_step_end(b, sumsqs[k], false, &ib);
        assert_true(pa.apply && pb.apply);
        assert_int_equal(pa.opt_step, pb.opt_step);
        assert_memory_equal(&pa.hp, &pb.hp, sizeof pa.hp);
        assert_true(ia.step == ib.step && ia.lr == ib.lr && ia.grad_norm == ib.grad_norm);
        assert_true(ia.loss_scale == ib.loss_scale && ib.boundary && !ib.skipped);
        float scale = (float)(1.0 / dsc__step_divisor(sqrt(sumsqs[k]), div.prev, div.scale,
                                                      div.clipping));
        assert_memory_equal(&scale, &pa.grad_scale, sizeof scale);
        assert_true(pb.grad_scale == 1.0f);
    }
    dsc_engine_destroy(a);
    dsc_engine_destroy(b);
    dsc_engine *h = make("{\"train_batch_size\": 2, \"train_micro_batch_size_per_gpu\": 2,"
                         " \"fp16\": {\"enabled\": true},"
                         " \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 0.001}}}");
    dsc__device_step p;
    dsc_step_info info;
    dsc__device_divisor div;
    assert_int_equal(dsc__engine_device_step_begin(h, &p, &info, &div), DSC_ERR_INTERNAL);
    assert_non_null(strstr(dsc_last_error(), "fp16"));
    dsc_clear_error();
    dsc_engine_destroy(h);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accumulation_and_sgd),
        cmocka_unit_test(test_clipping),
        cmocka_unit_test(test_frozen_tensor),
        cmocka_unit_test(test_fp16_overflow_skips),
        cmocka_unit_test(test_bf16_work_copy_is_rounded),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_device_hooks_match_backward),
        cmocka_unit_test(test_no_compute_copy),
        cmocka_unit_test(test_streamed_offload_engine),
        cmocka_unit_test(test_device_grads_engine),
        cmocka_unit_test(test_device_step_halves),
        cmocka_unit_test(test_params_init_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
