// Unit tests of DeepSpeed's checkpoint layout (engine/ckpt/deepspeed.c) on ZeRO-2 and ZeRO-3
// checkpoints of 2 ranks laid out as DeepSpeed 0.18 saves them (tests/unit/torchfile/ds_z2,
// ds_z3, written by make_ds_layout.py there): every parameter's fp32 weights gathered from the
// partitions, whole and by slices, and the scalars of the model-states file.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // snprintf
#include <string.h> // strcmp

#include "dsc/checkpoint.h"  // dsc_ds_ckpt_*
#include "dsc/safetensors.h" // dsc_hf_weights_*
#include "dsc/status.h"     // dsc_last_error

#define DIR DSC_SOURCE_DIR "/tests/unit/torchfile/"

static const char *const names[] = {"wte.weight", "h.0.ln.weight", "h.0.mlp.weight",
                                    "ln_f.bias"};
static const int64_t numels[] = {15, 3, 12, 3};

// Adam's moments (m[k] = 0.001 k - p, v[k] = 0.0001 k + p + 1), from any offset, and the step.
static void check_state(dsc_ds_ckpt *ds) {
    dsc_ds_ckpt_state st;
    dsc_ds_ckpt_get_state(ds, &st);
    assert_true(st.has_moments);
    assert_int_equal(st.adam_step, 10);
    assert_true(st.has_scheduler);
    assert_true(st.last_batch_iteration == 9);
    assert_false(st.dynamic_scale);
    float v[16];
    for (int i = 0; i < 4; i++) {
        for (int64_t b = 0; b < numels[i]; b++) {
            int64_t n = numels[i] - b;
            assert_int_equal(dsc_ds_ckpt_read_state(ds, i, 1, b, n, v), DSC_OK);
            for (int64_t k = 0; k < n; k++)
                assert_float_equal(v[k], 0.001f * (float)(b + k) - (float)i, 1e-6);
            assert_int_equal(dsc_ds_ckpt_read_state(ds, i, 2, b, n, v), DSC_OK);
            for (int64_t k = 0; k < n; k++)
                assert_float_equal(v[k], 0.0001f * (float)(b + k) + (float)i + 1, 1e-6);
        }
    }
    assert_int_not_equal(dsc_ds_ckpt_read_state(ds, 0, 3, 0, 1, v), DSC_OK);
}

static void check(const char *dir, const char *tag, int stage) {
    dsc_ds_ckpt *ds = NULL;
    assert_true(dsc_ds_ckpt_detect(dir, tag));
    if (dsc_ds_ckpt_open(&ds, dir, tag) != DSC_OK) fail_msg("%s: %s", dir, dsc_last_error());
    dsc_ds_ckpt_info info;
    dsc_ds_ckpt_get_info(ds, &info);
    assert_int_equal(info.zero_stage, stage);
    assert_int_equal(info.world_size, 2);
    assert_int_equal(info.nparams, 4);
    assert_int_equal(info.global_steps, 10);
    assert_int_equal(info.global_samples, 80);
    assert_string_equal(info.precision, "bf16");
    assert_string_equal(info.tag, "global_step10");
    assert_int_equal(info.numel, 33);
    float v[16];
    for (int i = 0; i < 4; i++) {
        dsc_ckpt_param p;
        dsc_ds_ckpt_get_param(ds, i, &p);
        assert_string_equal(p.name, names[i]);
        assert_int_equal(p.numel, numels[i]);
        assert_int_equal(dsc_ds_ckpt_find_param(ds, names[i]), i);
        assert_int_equal(dsc_ds_ckpt_read_param(ds, i, 0, p.numel, v), DSC_OK);
        for (int k = 0; k < p.numel; k++)
            assert_float_equal(v[k], 0.01f * (float)k + (float)i, 1e-6);
        // slices that cross the ranks' partitions
        for (int64_t b = 0; b < p.numel; b++) {
            assert_int_equal(dsc_ds_ckpt_read_param(ds, i, b, p.numel - b, v), DSC_OK);
            assert_float_equal(v[0], 0.01f * (float)b + (float)i, 1e-6);
        }
    }
    assert_int_not_equal(dsc_ds_ckpt_read_param(ds, 0, 10, 6, v), DSC_OK);
    check_state(ds);
    dsc_ds_ckpt_close(ds);
}

static void test_zero2(void **state) {
    (void)state;
    check(DIR "ds_z2", NULL, 2);
    check(DIR "ds_z2", "global_step10", 2);
    check(DIR "ds_z2/global_step10", NULL, 2);
}

static void test_zero3(void **state) {
    (void)state;
    check(DIR "ds_z3", NULL, 3);
}

// --init-weights DS_DIR reads through the Hugging Face weights reader: the same fp32 values.
static void test_as_weights(void **state) {
    (void)state;
    const char *dirs[] = {DIR "ds_z2", DIR "ds_z3/global_step10"};
    for (int k = 0; k < 2; k++) {
        dsc_hf_weights *w = NULL;
        if (dsc_hf_weights_open(&w, dirs[k]) != DSC_OK) fail_msg("%s", dsc_last_error());
        assert_int_equal(dsc_hf_weights_count(w), 4);
        float v[16];
        for (int i = 0; i < 4; i++) {
            dsc_hf_tensor t;
            assert_true(dsc_hf_weights_has(w, names[i]));
            assert_int_equal(dsc_hf_weights_info(w, names[i], &t), DSC_OK);
            assert_string_equal(t.dtype, "F32");
            assert_int_equal(t.numel, numels[i]);
            assert_int_equal(dsc_hf_weights_read(w, names[i], 1, t.numel - 1, v), DSC_OK);
            for (int e = 1; e < t.numel; e++)
                assert_float_equal(v[e - 1], 0.01f * (float)e + (float)i, 1e-6);
        }
        assert_int_not_equal(dsc_hf_weights_info(w, "absent", &(dsc_hf_tensor){0}), DSC_OK);
        dsc_hf_weights_close(w);
    }
}

static void test_not_deepspeed(void **state) {
    (void)state;
    dsc_ds_ckpt *ds = NULL;
    assert_false(dsc_ds_ckpt_detect(DIR, NULL));
    assert_int_not_equal(dsc_ds_ckpt_open(&ds, DIR, NULL), DSC_OK);
    assert_null(ds);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_zero2), cmocka_unit_test(test_zero3),
                                       cmocka_unit_test(test_as_weights),
                                       cmocka_unit_test(test_not_deepspeed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
