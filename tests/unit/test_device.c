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

// ---- a family whose layer groups the device trainer cannot lay out ----
//
// GPT-2's table under another name and spec, with device passes that are never reached (the
// layout is refused first) and a description that breaks the layout: odd_mode 1 counts one layer
// more than there are middle groups, odd_mode 2 puts a tensor outside the groups.

static const struct dsc_model_ops *gpt2;
static int odd_mode;

static bool odd_claims(const char *spec) { return !strcmp(spec, "odd-d2"); }
static dsc_status odd_parse(const char *spec, const dsc_model_opts *o, void **cfg) {
    (void)spec;
    return gpt2->config_parse("d2", o, cfg);
}
static void odd_describe(const void *cfg, dsc_model_info *out) {
    gpt2->describe(cfg, out);
    if (odd_mode == 1) out->n_layer += 1;
}
static void odd_param(const void *cfg, int i, dsc_model_param *out) {
    gpt2->param(cfg, i, out);
    if (odd_mode == 2 && i == 1) out->group = 7;
}
static dsc_status nd_create(const void *c, int b, int t, void *s, dsc_mem_pool *p, void **d) {
    (void)c, (void)b, (void)t, (void)s, (void)p, (void)d;
    return DSC_ERR_INTERNAL;
}
static void nd_destroy(void *d) { (void)d; }
static void nd_flag(void *d, bool on) { (void)d, (void)on; }
static void nd_grad_hook(void *d, dsc_model_grad_hook f, void *u) { (void)d, (void)f, (void)u; }
static void nd_layer_hook(void *d, dsc_model_layer_hook f, void *u) { (void)d, (void)f, (void)u; }
static dsc_status nd_forward(void *d, const uint16_t *const *p, const int32_t *in,
                             const int32_t *tg, int b, int t, float *l) {
    (void)d, (void)p, (void)in, (void)tg, (void)b, (void)t, (void)l;
    return DSC_ERR_INTERNAL;
}
static dsc_status nd_backward(void *d, const uint16_t *const *p, float *const *g, float s) {
    (void)d, (void)p, (void)g, (void)s;
    return DSC_ERR_INTERNAL;
}
static dsc_status nd_train_step(void *d, const uint16_t *const *p, float *const *g,
                                const int32_t *in, const int32_t *tg, int b, int t, float s,
                                float *l) {
    (void)d, (void)p, (void)g, (void)in, (void)tg, (void)b, (void)t, (void)s, (void)l;
    return DSC_ERR_INTERNAL;
}
static dsc_status nd_read_loss(void *d, float *l) { return (void)d, (void)l, DSC_ERR_INTERNAL; }
static dsc_status nd_loss_enqueue(void *d, const float **l) {
    return (void)d, (void)l, DSC_ERR_INTERNAL;
}

static const struct dsc_model_device_ops never_device = {
    .create = nd_create, .destroy = nd_destroy, .set_fp16 = nd_flag,
    .set_grads_fresh = nd_flag, .set_grad_hook = nd_grad_hook, .set_layer_hook = nd_layer_hook,
    .forward = nd_forward, .backward = nd_backward, .train_step = nd_train_step,
    .read_loss = nd_read_loss, .loss_enqueue = nd_loss_enqueue,
};

// A model's layer groups must be the device trainer's layout (dsc/model.h: n_layer + 2 groups):
// otherwise create refuses it by name, in every build, before it touches the engine or a device.
static void test_group_layout(void **state) {
    (void)state;
    for (int i = 0; i < dsc_model_num_families() && !gpt2; i++)
        if (!strcmp(dsc_model_family(i)->family, "gpt2")) gpt2 = dsc_model_family(i);
    assert_non_null(gpt2);
    static struct dsc_model_ops odd;
    odd = *gpt2;
    odd.family = "gpt2-odd-groups", odd.specs = "odd-d2";
    odd.claims = odd_claims, odd.config_parse = odd_parse;
    odd.describe = odd_describe, odd.param = odd_param;
    odd.device = &never_device;
    assert_int_equal(dsc_model_register(&odd), DSC_OK);
    dsc_model_opts mo = {.vocab_size = VOCAB, .max_seq_len = T};
    for (odd_mode = 1; odd_mode <= 2; odd_mode++) {
        dsc_model *m = NULL;
        assert_int_equal(dsc_model_create(&m, "odd-d2", &mo), DSC_OK);
        assert_true(dsc_model_has_device(m));
        dsc_device_trainer *t = (dsc_device_trainer *)&t; // must be overwritten
        assert_int_equal(dsc_device_trainer_create(&t, NULL, m, B, T), DSC_ERR_INVALID_ARG);
        assert_null(t);
        if (odd_mode == 1) // d2: four groups, described as three layers
            assert_true(has_text("odd-d2") && has_text("describes 4 layer groups and 3 layers") &&
                        has_text("n_layer + 2 groups"));
        else
            assert_true(has_text("tensor wpe.weight is in layer group 7") &&
                        has_text("outside the model's 4 groups"));
        dsc_model_destroy(m);
    }
    odd_mode = 0;
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

// With opts.device_state and DSC_DEVICE_STATE=1 the trainer holds master and moments: the
// weights are set after it is made (dsc_params_init; before it, an error says so), and three
// steps give bit for bit the weights of the same run with the host's copy.
static dsc_status fill_init(void *user, int i, int64_t begin, int64_t count, float *dst) {
    dsc_model_init_tensor(user, i, dst, begin, count, 1234);
    return DSC_OK;
}

static void three_steps(dsc_device_trainer *t, dsc_engine *eng) {
    int32_t in[B * T], tg[B * T];
    for (int k = 0; k < B * T; k++) in[k] = (k * 5 + 1) % VOCAB, tg[k] = (k * 5 + 9) % VOCAB;
    for (int s = 0; s < 3; s++)
        for (int micro = 0; micro < 2; micro++) {
            float loss = 0;
            double sum = 0;
            dsc_step_info si = {0};
            assert_int_equal(dsc_device_trainer_micro(t, in, tg, B, T, &loss, NULL, NULL), DSC_OK);
            assert_int_equal(dsc_step(eng, &si), DSC_OK);
            assert_int_equal(dsc_device_trainer_take_loss(t, &sum), DSC_OK);
        }
}

static void test_state_on_device(void **state) {
    (void)state;
    dsc_model *m = NULL;
    assert_int_equal(dsc_model_create(&m, "d2", &(dsc_model_opts){.vocab_size = VOCAB,
                                                                 .max_seq_len = T}), DSC_OK);
    int n = dsc_model_describe(m)->num_tensors;
    dsc_param_desc *pd = calloc((size_t)n, sizeof *pd);
    assert_non_null(pd);
    dsc_model_param_descs(m, pd);
    dsc_engine *eng[2] = {NULL, NULL};
    dsc_device_trainer *t[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++) { // r 0: the host's copy; r 1: the state on the device
        setenv("DSC_DEVICE_STATE", r ? "1" : "0", 1);
        dsc_engine_opts eo = {.config_json = CONFIG, .params = pd, .nparams = n, .world_size = 1,
                              .no_compute_copy = true, .device_grads = true,
                              .device_state = true, .init_in_place = true};
        assert_int_equal(dsc_engine_create(&eng[r], &eo), DSC_OK);
        unsetenv("DSC_DEVICE_STATE");
        assert_int_equal(dsc_engine_state_on_device(eng[r]), r == 1);
    }
    // the weights live with the trainer: it comes first (checked with or without a device)
    assert_int_equal(dsc_params_init(eng[1], fill_init, m), DSC_ERR_INVALID_ARG);
    assert_true(has_text("dsc_device_trainer_create"));
    assert_int_equal(dsc_params_init(eng[0], fill_init, m), DSC_OK);
    bool device = dsc_device_trainer_create(&t[0], eng[0], m, B, T) == DSC_OK;
    if (!device)
        fprintf(stderr, "no device, the state on the device is not trained: %s\n",
                dsc_last_error());
    for (int r = 0; device && r < 2; r++) {
        if (r == 1) {
            assert_int_equal(dsc_device_trainer_create(&t[r], eng[r], m, B, T), DSC_OK);
            assert_int_equal(dsc_params_init(eng[r], fill_init, m), DSC_OK);
            assert_int_equal(dsc_device_trainer_load(t[r]), DSC_OK);
        }
        three_steps(t[r], eng[r]);
        assert_int_equal(dsc_device_trainer_store(t[r]), DSC_OK);
    }
    for (int i = 0; device && i < n; i++) {
        size_t numel = (size_t)dsc_model_param_get(m, i)->numel;
        float *a = malloc(numel * 4), *b = malloc(numel * 4);
        assert_int_equal(dsc_engine_full_param(eng[0], i, a), DSC_OK);
        assert_int_equal(dsc_engine_full_param(eng[1], i, b), DSC_OK);
        assert_memory_equal(a, b, numel * 4);
        free(a), free(b);
    }
    for (int r = 0; r < 2; r++) {
        dsc_device_trainer_destroy(t[r]);
        dsc_engine_destroy(eng[r]);
    }
    free(pd);
    dsc_model_destroy(m);
}
#endif

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pick),
        cmocka_unit_test(test_models),
        cmocka_unit_test(test_buffers),
        cmocka_unit_test(test_group_layout),
#ifndef DSC_WITH_CUDA
        cmocka_unit_test(test_unsupported),
#else
        cmocka_unit_test(test_train),
        cmocka_unit_test(test_state_on_device),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
