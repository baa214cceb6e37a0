// test_step.c - the one step routine that dsc_step and the device paths share (engine/device.h,
// engine/engine_impl.h), on the host: the engine's accumulation position (dsc_step and the
// device calls move the same counter; the last micro-step and the boundary are where the config
// says), the decisions of a boundary (an fp16 overflow skips and backs the scaler off, bf16 never
// skips, clipping divides by the norm over the threshold), which configs may step before the
// norm is known, the fp16 rounding rule (nearest even, beyond the range inf, NaN kept), the
// global norm of the ranks' parts, and dsc_step running an attached device trainer's step.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // isinf, isnan, sqrt, INFINITY, NAN
#include <stdio.h>  // snprintf
#include <stdlib.h> // unsetenv
#include <string.h> // strcmp

#include "dsc/engine.h"         // dsc_engine_*, dsc_step
#include "engine/device.h"      // dsc__engine_micro*, dsc__engine_fp16, dsc__round_fp16, ...
#include "engine/engine_impl.h" // dsc__step_decide

static const dsc_param_desc PARAMS[] = {
    {.name = "a", .ndim = 1, .shape = {40}, .group = 0},
    {.name = "b", .ndim = 2, .shape = {13, 7}, .group = 1},
};

// An engine on one rank with gradient accumulation `gas`, precision "fp16", "bf16" or "fp32"
// and gradient_clipping `clip` (0: none); its weights set (all zero).
static dsc_engine *make(int gas, const char *prec, double clip) {
    const char *extra = !strcmp(prec, "fp16")
                            ? ", \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8,"
                                " \"hysteresis\": 1}"
                        : !strcmp(prec, "bf16") ? ", \"bf16\": {\"enabled\": true}"
                                                : "";
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_accumulation_steps\": %d,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01}},"
             " \"gradient_clipping\": %g%s}",
             gas, clip, extra);
    unsetenv("DSC_INJECT_OVERFLOW");
    unsetenv("DSC_FT_SAVE_STATE");
    unsetenv("DSC_FT_LOAD_STATE");
    dsc_engine_opts o = {.config_json = json, .params = PARAMS, .nparams = 2, .rank = 0,
                         .world_size = 1};
    dsc_engine *e = NULL;
    assert_int_equal(dsc_engine_create(&e, &o), DSC_OK);
    assert_int_equal(dsc_params_updated(e), DSC_OK);
    return e;
}

// The position goes 0, 1, 2, 0 over gas = 3; the last micro-step is the third; the boundary
// comes after it and leaves info naming the step; off the boundary info is cleared.
static void test_position(void **state) {
    (void)state;
    dsc_engine *e = make(3, "fp32", 0);
    dsc_step_info info;
    for (int step = 1; step <= 2; step++) {
        for (int m = 0; m < 3; m++) {
            assert_int_equal(dsc__engine_micro(e), m);
            assert_int_equal(dsc__engine_micro_last(e), m == 2);
            info.boundary = true, info.step = -1;
            bool done = dsc__engine_micro_done(e, &info);
            assert_int_equal(done, m == 2);
            assert_false(info.boundary);
            if (!done) assert_int_equal(info.step, dsc_engine_global_steps(e));
        }
        assert_int_equal(dsc__engine_micro(e), 0);
    }
    dsc_engine_destroy(e);
}

// dsc_step moves the same counter: after one host micro-step the device path is at position 1,
// and the host's next two calls end the step at the boundary.
static void test_host_shares_position(void **state) {
    (void)state;
    dsc_engine *e = make(3, "fp32", 0);
    dsc_step_info info;
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_false(info.boundary);
    assert_int_equal(dsc__engine_micro(e), 1);
    assert_false(dsc__engine_micro_done(e, &info)); // a device path's micro-step
    assert_true(dsc__engine_micro_last(e));
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_true(info.boundary);
    assert_int_equal(info.step, 1);
    assert_int_equal(dsc_engine_global_steps(e), 1);
    assert_int_equal(dsc__engine_micro(e), 0);
    dsc_engine_destroy(e);
}

// fp16: inf/NaN skips (the scale halves, info says skipped with an infinite norm); finite
// gradients apply with grad_scale = 1 / scale, the scale as the scaler had it.
static void test_decide_fp16(void **state) {
    (void)state;
    dsc_engine *e = make(1, "fp16", 0);
    assert_true(dsc__engine_fp16(e));
    assert_false(dsc__engine_norm_free(e));
    double scale = dsc__engine_loss_scale(e);
    assert_true(scale == 256.0);
    dsc_step_info info = {0};
    dsc_opt_hparams hp;
    float gs = 0;
    bool apply = true;
    assert_int_equal(dsc__step_decide(e, NAN, true, &info, &hp, &gs, &apply), DSC_OK);
    assert_false(apply);
    assert_true(info.skipped);
    assert_true(isinf(info.grad_norm));
    assert_true(info.lr == 0.01);
    assert_true(dsc__engine_loss_scale(e) == 128.0);
    dsc_step_info ok = {0};
    assert_int_equal(dsc__step_decide(e, 9.0, false, &ok, &hp, &gs, &apply), DSC_OK);
    assert_true(apply);
    assert_false(ok.skipped);
    assert_true(ok.grad_norm == 3.0);
    assert_true(gs == (float)(1.0 / 128.0));
    assert_true(hp.lr == 0.01f);
    dsc_engine_destroy(e);
}

// bf16 never skips (inf/NaN is warned about and applied); with clipping the divisor is the
// norm over the threshold (DeepSpeed's + 1e-6), below it nothing.
static void test_decide_bf16_clip(void **state) {
    (void)state;
    dsc_engine *e = make(1, "bf16", 0);
    assert_false(dsc__engine_fp16(e));
    assert_true(dsc__engine_norm_free(e));
    dsc_step_info info = {0};
    dsc_opt_hparams hp;
    float gs = 0;
    bool apply = false;
    assert_int_equal(dsc__step_decide(e, INFINITY, true, &info, &hp, &gs, &apply), DSC_OK);
    assert_true(apply);
    assert_false(info.skipped);
    dsc_engine_destroy(e);

    e = make(1, "bf16", 1.0);
    assert_false(dsc__engine_norm_free(e)); // clipping needs the norm first
    assert_int_equal(dsc__step_decide(e, 16.0, false, &info, &hp, &gs, &apply), DSC_OK);
    assert_true(apply);
    assert_true(info.grad_norm == 4.0);
    assert_true(gs == (float)(1.0 / (4.0 + 1e-6)));
    assert_int_equal(dsc__step_decide(e, 0.25, false, &info, &hp, &gs, &apply), DSC_OK);
    assert_true(gs == 1.0f); // a norm of 0.5 is under the threshold
    dsc_engine_destroy(e);
}

// The device's step halves make the same decision as the whole: on bf16 begin plans (opt_step
// counted), end fills the norm; an fp16 overflow through dsc__engine_device_step is a skip
// that counts the global step but not the applied one.
static void test_device_step(void **state) {
    (void)state;
    dsc_engine *e = make(1, "bf16", 0);
    dsc__device_step plan;
    dsc__device_divisor div;
    dsc_step_info info;
    assert_int_equal(dsc__engine_device_step_begin(e, &plan, &info, &div), DSC_OK);
    assert_true(plan.apply);
    assert_int_equal(plan.opt_step, 1);
    assert_true(div.clipping == 0.0);
    dsc__engine_device_step_end(e, 4.0, false, &info);
    assert_true(info.grad_norm == 2.0);
    assert_true(info.boundary);
    assert_int_equal(info.step, 1);
    dsc_engine_destroy(e);

    e = make(1, "fp16", 0);
    assert_int_equal(dsc__engine_device_step(e, 1.0, true, &plan, &info), DSC_OK);
    assert_false(plan.apply);
    assert_true(info.skipped);
    assert_int_equal(info.skipped_total, 1);
    assert_int_equal(dsc_engine_global_steps(e), 1);
    assert_int_equal(dsc__engine_device_step(e, 1.0, false, &plan, &info), DSC_OK);
    assert_true(plan.apply);
    assert_int_equal(plan.opt_step, 1); // the first applied step
    dsc_engine_destroy(e);
}

// The rounding rule: representable values stay, ties go to even, beyond 65504 (after rounding)
// inf, NaN stays NaN; in place the same as into another buffer.
static void test_round_fp16(void **state) {
    (void)state;
    float x[] = {1.0f, 65504.0f, 70000.0f, -1e6f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                 0.1f, NAN, 65519.0f, 65520.0f};
    enum { N = sizeof x / sizeof x[0] };
    float y[N];
    dsc__round_fp16(y, x, N);
    assert_true(y[0] == 1.0f);
    assert_true(y[1] == 65504.0f);
    assert_true(isinf(y[2]) && y[2] > 0);
    assert_true(isinf(y[3]) && y[3] < 0);
    assert_true(y[4] == 1.0f);                 // halfway: to the even neighbour
    assert_true(y[5] == 1.0f + 4.0f / 2048);   // halfway: up to the even one
    assert_true(y[6] == 0.0999755859375f);     // fp16's nearest to 0.1
    assert_true(isnan(y[7]));
    assert_true(y[8] == 65504.0f);
    assert_true(isinf(y[9]));
    dsc__round_fp16(x, x, N);
    for (int i = 0; i < N; i++)
        assert_true(x[i] == y[i] || (isnan(x[i]) && isnan(y[i])));
}

// The global norm of the ranks' parts: added in rank order, a flag or a non-finite sum makes it
// inf/NaN; replicated parts (every rank summed the same vector) count once.
static void test_global_norm(void **state) {
    (void)state;
    double sumsq;
    bool bad = true;
    const double parts[] = {1.0, 0.0, 2.5, 0.0, 0.5, 0.0};
    dsc__step_global_norm(parts, 3, false, &sumsq, &bad);
    assert_true(sumsq == 4.0);
    assert_false(bad);
    dsc__step_global_norm(parts, 3, true, &sumsq, &bad);
    assert_true(sumsq == 1.0);
    const double flagged[] = {1.0, 0.0, 2.0, 1.0};
    dsc__step_global_norm(flagged, 2, false, &sumsq, &bad);
    assert_true(bad);
    const double big[] = {1e308, 0.0, 1e308, 0.0};
    dsc__step_global_norm(big, 2, false, &sumsq, &bad);
    assert_true(bad); // the sum overflowed
    dsc__step_global_norm(big, 0, true, &sumsq, &bad); // no rank answered
    assert_true(sumsq == 0.0);
    assert_false(bad);
}

// A device trainer's step as the engine sees it: counts its calls, moves the shared position.
typedef struct fake_device {
    int calls;
    dsc_engine *e;
} fake_device;

static dsc_status device_fn(void *user, dsc_step_info *info) {
    fake_device *d = user;
    d->calls++;
    (void)dsc__engine_micro_done(d->e, info);
    return DSC_OK;
}

// dsc_step runs the attached device step (and only it); a detach by someone else leaves it;
// after its own detach dsc_step is the host step again.
static void test_attach(void **state) {
    (void)state;
    dsc_engine *e = make(2, "fp32", 0);
    fake_device dev = {.e = e};
    assert_false(dsc__engine_device_attached(e));
    dsc__engine_attach_device(e, device_fn, &dev);
    assert_true(dsc__engine_device_attached(e));
    dsc_step_info info;
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_int_equal(dev.calls, 2);
    assert_int_equal(dsc_engine_global_steps(e), 0); // the host step never ran
    int other;
    dsc__engine_detach_device(e, &other);
    assert_true(dsc__engine_device_attached(e));
    dsc__engine_detach_device(e, &dev);
    assert_false(dsc__engine_device_attached(e));
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_int_equal(dsc_step(e, &info), DSC_OK);
    assert_int_equal(dev.calls, 2);
    assert_true(info.boundary);
    assert_int_equal(dsc_engine_global_steps(e), 1);
    dsc_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_position),
        cmocka_unit_test(test_host_shares_position),
        cmocka_unit_test(test_decide_fp16),
        cmocka_unit_test(test_decide_bf16_clip),
        cmocka_unit_test(test_device_step),
        cmocka_unit_test(test_round_fp16),
        cmocka_unit_test(test_global_norm),
        cmocka_unit_test(test_attach),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
