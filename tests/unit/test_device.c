// test_device.c - the device trainer's public API (dsc/device.h), as a program that embeds libdsc
// sees it: only public headers. In every build: what a --device flag means, which models can
// train on the device, and the errors of a run that cannot (a build without the CUDA kernels:
// every call DSC_ERR_UNSUPPORTED with a sentence saying how to rebuild; a CUDA build without a
// device: create fails cleanly, leaving nothing). Where a device exists, GPT-2 d2 trains through
// the API: three optimizer steps of two micro-steps on one batch (the second through dsc_step,
// which runs the attached trainer's step; a second trainer on the engine is refused), the loss
// finite and falling, the trained weights through the engine (store, load) the same model.
// Device buffers: a round trip of values through the device, or the reason there is none.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // isfinite, logf, fabsf
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, setenv, unsetenv
#include <string.h> // strstr

#include "dsc/device.h" // dsc_device_*
#include "dsc/engine.h" // dsc_engine_*
#include "dsc/model.h"  // dsc_model_*
#include "dsc/status.h" // dsc_last_error

#define VOCAB 256
#define B 2
#define T 32

static const char *CONFIG =
    "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 2,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.003}},"
    " \"bf16\": {\"enabled\": true}, \"gradient_clipping\": 1.0}";

static bool has_text(const char *needle) { return strstr(dsc_last_error(), needle) != NULL; }

static void test_pick(void **state) {
    (void)state;
    unsetenv("DSC_COMM_BACKEND");
    bool cuda = true;
    assert_int_equal(dsc_device_pick("bogus", 1, &cuda), DSC_ERR_INVALID_ARG);
    assert_true(has_text("--device bogus"));
    assert_false(cuda);
    assert_int_equal(dsc_device_pick("cpu", 4, &cuda), DSC_OK);
    assert_false(cuda);
    assert_int_equal(dsc_device_pick(NULL, 1, &cuda), DSC_OK); // auto: never an error
#ifndef DSC_WITH_CUDA
    assert_false(cuda);
#endif
    dsc_status st = dsc_device_pick("cuda", 1, &cuda);
#ifdef DSC_WITH_CUDA
    // a device, or an error naming the flag and what to check
    if (st != DSC_OK) assert_true(has_text("--device cuda")), assert_false(cuda);
    assert_true(st == DSC_OK || st == DSC_ERR_UNSUPPORTED);
#else
    assert_int_equal(st, DSC_ERR_UNSUPPORTED);
    assert_true(has_text("built without the CUDA kernels"));
    assert_false(cuda);
#endif
    // nccl moves device buffers: with --device cpu (or without nccl at all) that is an error
    setenv("DSC_COMM_BACKEND", "nccl", 1);
    assert_int_not_equal(dsc_device_pick("cpu", 2, &cuda), DSC_OK);
    assert_true(has_text("DSC_COMM_BACKEND"));
    assert_false(cuda);
    unsetenv("DSC_COMM_BACKEND");
}

static dsc_status make_run(dsc_model **model, dsc_engine **eng) {
    dsc_model_opts mo = {.vocab_size = VOCAB, .max_seq_len = T};
    dsc_status st = dsc_model_create(model, "d2", &mo);
    if (st != DSC_OK) return st;
    int n = dsc_model_describe(*model)->num_tensors;
    dsc_param_desc *pd = calloc((size_t)n, sizeof *pd);
    float **w = calloc((size_t)n, sizeof *w);
    assert_non_null(pd), assert_non_null(w);
    dsc_model_param_descs(*model, pd);
    dsc_engine_opts eo = {.config_json = CONFIG, .params = pd, .nparams = n, .rank = 0,
                          .world_size = 1, .no_compute_copy = true};
    st = dsc_engine_create(eng, &eo);
    if (st == DSC_OK) {
        for (int i = 0; i < n; i++) w[i] = dsc_param_master(*eng, i);
        dsc_model_init_weights(*model, w, 1234);
        st = dsc_params_updated(*eng);
    }
    free(pd);
    free(w);
    return st;
}

static void test_models(void **state) {
    (void)state;
    dsc_model *m;
    dsc_model_opts mo = {.vocab_size = VOCAB, .max_seq_len = T};
    assert_int_equal(dsc_model_create(&m, "d2", &mo), DSC_OK);
#ifdef DSC_WITH_CUDA
    assert_true(dsc_device_model_ok(m)); // GPT-2's family fills the device passes
#else
    assert_false(dsc_device_model_ok(m)); // no kernels: no model trains on a device
#endif
    dsc_model_destroy(m);
}

// Device buffers: a round trip through the device where there is one; otherwise each call
// says why not.
static void test_buffers(void **state) {
    (void)state;
    int dev = -1;
    dsc_status st = dsc_device_select(&dev);
#ifndef DSC_WITH_CUDA
    assert_int_equal(st, DSC_ERR_UNSUPPORTED);
    assert_true(has_text("built without the CUDA kernels"));
    void *p = &dev;
    float x = 1;
    assert_int_equal(dsc_device_alloc(&p, 64, "test"), DSC_ERR_UNSUPPORTED);
    assert_null(p);
    assert_int_equal(dsc_device_to_device(&x, &x, sizeof x), DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_to_host(&x, &x, sizeof x), DSC_ERR_UNSUPPORTED);
    dsc_device_free(NULL);
#else
    if (st != DSC_OK) { // no device here
        assert_int_equal(st, DSC_ERR_UNSUPPORTED);
        assert_true(dsc_last_error()[0] != '\0');
        return;
    }
    assert_true(dev >= 0);
    enum { N = 1000 };
    float a[N], b[N];
    for (int k = 0; k < N; k++) a[k] = (float)k * 0.5f - 7.0f, b[k] = 0;
    void *d = NULL;
    assert_int_equal(dsc_device_alloc(&d, sizeof a, "test"), DSC_OK);
    assert_non_null(d);
    assert_int_equal(dsc_device_to_device(d, a, sizeof a), DSC_OK);
    assert_int_equal(dsc_device_to_host(b, d, sizeof b), DSC_OK);
    assert_memory_equal(a, b, sizeof a);
    dsc_device_free(d);
    dsc_device_free(NULL);
#endif
}

#ifndef DSC_WITH_CUDA
// Every call of a build without the CUDA kernels: DSC_ERR_UNSUPPORTED, saying how to rebuild.
static void test_unsupported(void **state) {
    (void)state;
    dsc_model *m = NULL;
    dsc_engine *eng = NULL;
    assert_int_equal(make_run(&m, &eng), DSC_OK);
    dsc_device_trainer *t = (dsc_device_trainer *)&t; // must be overwritten
    assert_int_equal(dsc_device_trainer_create(&t, eng, m, B, T), DSC_ERR_UNSUPPORTED);
    assert_null(t);
    assert_true(has_text("built without the CUDA kernels") && has_text("rebuild"));
    int32_t tok[B * T] = {0};
    float loss;
    double sum = 0;
    dsc_step_info si;
    dsc_mem_stats ms;
    size_t used;
    assert_int_equal(dsc_device_trainer_load(t), DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_trainer_store(t), DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_trainer_micro(t, tok, tok, B, T, &loss, NULL, NULL),
                     DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_trainer_step(t, &si), DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_trainer_take_loss(t, &sum), DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_trainer_loss(t, tok, tok, B, T, &loss), DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_trainer_memory(t, &ms, &used), DSC_ERR_UNSUPPORTED);
    assert_int_equal(dsc_device_trainer_recovered(t, B), DSC_ERR_UNSUPPORTED);
    assert_true(has_text("built without the CUDA kernels"));
    dsc_device_trainer_fault(t);
    dsc_device_trainer_destroy(NULL);
    dsc_engine_destroy(eng);
    dsc_model_destroy(m);
}
#else
// GPT-2 d2 on the device: the loss of one batch falls over three steps and store hands the new
// master weights to the engine. Without a device create fails and leaves nothing behind.
static void test_train(void **state) {
    (void)state;
    dsc_model *m = NULL;
    dsc_engine *eng = NULL;
    assert_int_equal(make_run(&m, &eng), DSC_OK);
    dsc_device_trainer *t = NULL;
    dsc_status st = dsc_device_trainer_create(&t, eng, m, B, T);
    if (st != DSC_OK) { // no device here: a clean failure with a sentence
        assert_null(t);
        assert_true(dsc_last_error()[0] != '\0');
        fprintf(stderr, "no device, the training part is not run: %s\n", dsc_last_error());
        dsc_engine_destroy(eng);
        dsc_model_destroy(m);
        return;
    }
    double peak;
    assert_non_null(dsc_device_trainer_describe(t, &peak));
    assert_string_equal(dsc_device_trainer_compute(t), "bf16");
    dsc_device_trainer *t2 = NULL; // one trainer per engine: dsc_step runs it
    assert_int_equal(dsc_device_trainer_create(&t2, eng, m, B, T), DSC_ERR_INVALID_ARG);
    assert_null(t2);
    assert_true(has_text("device trainer already"));
    int32_t in[B * T], tg[B * T];
    for (int k = 0; k < B * T; k++) in[k] = (k * 7 + 3) % VOCAB, tg[k] = (k * 7 + 10) % VOCAB;
    float eval0, eval1, eval2;
    assert_int_equal(dsc_device_trainer_loss(t, in, tg, B, T, &eval0), DSC_OK);
    double first = 0, last = 0;
    for (int s = 0; s < 3; s++) {
        double sum = 0;
        dsc_step_info si = {0};
        for (int micro = 0; micro < 2; micro++) {
            float loss = 0;
            assert_int_equal(dsc_device_trainer_micro(t, in, tg, B, T, &loss, NULL, NULL), DSC_OK);
            sum += loss;
            // dsc_step runs the attached trainer's step: the second step goes through it
            assert_int_equal(s == 1 ? dsc_step(eng, &si) : dsc_device_trainer_step(t, &si),
                             DSC_OK);
            assert_int_equal(dsc_device_trainer_take_loss(t, &sum), DSC_OK);
        }
        assert_true(si.boundary);
        assert_int_equal(si.step, s + 1);
        assert_true(isfinite(sum));
        if (s == 0) first = sum / 2;
        last = sum / 2;
    }
    assert_true(first > 0.5 * logf(VOCAB) && first < 2 * logf(VOCAB));
    assert_true(last < first);
    assert_int_equal(dsc_device_trainer_loss(t, in, tg, B, T, &eval1), DSC_OK);
    assert_true(eval1 < eval0);
    // the trained weights to the engine and back: the same model
    assert_int_equal(dsc_device_trainer_store(t), DSC_OK);
    assert_int_equal(dsc_device_trainer_load(t), DSC_OK);
    assert_int_equal(dsc_device_trainer_loss(t, in, tg, B, T, &eval2), DSC_OK);
    assert_true(fabsf(eval2 - eval1) <= 1e-3f * eval1);
    dsc_device_trainer_destroy(t);
    dsc_engine_destroy(eng);
    dsc_model_destroy(m);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_buffers),
#ifndef DSC_WITH_CUDA
        cmocka_unit_test(test_unsupported),
#else
        cmocka_unit_test(test_train),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
