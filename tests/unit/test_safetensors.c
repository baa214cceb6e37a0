// Unit tests of the safetensors reader and writer (engine/ckpt/safetensors.c).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>    // FILE, fopen
#include <stdlib.h>   // mkdtemp, free
#include <string.h>   // memcmp, strstr
#include <unistd.h>   // truncate, unlink

#include "engine/ckpt/safetensors.h" // dsc_st_*

static char dir[64];
static char path[128];

static int setup(void **state) {
    snprintf(dir, sizeof dir, "/tmp/dsc-st-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/t.safetensors", dir);
    return 0;
}

static int teardown(void **state) {
    unlink(path);
    rmdir(dir);
    return 0;
}

static float a[6] = {1, 2, 3, 4, 5, 6};
static int32_t b[3] = {7, -8, 9};
static uint16_t c[1] = {0x3c00};

static void write_sample(void) {
    dsc_st_tensor t[3] = {
        {"h.0.w", "F32", 2, {2, 3}, a, sizeof a},
        {"ids", "I32", 1, {3}, b, sizeof b},
        {"one", "F16", 0, {0}, c, sizeof c},
    };
    const char *meta[] = {"loss", "1.25", "step", "1"};
    assert_int_equal(dsc_st_write(path, t, 3, meta, 2), DSC_OK);
}

static void test_round_trip(void **state) {
    write_sample();
    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, path), DSC_OK);
    assert_int_equal(dsc_st_count(f), 3);
    const dsc_st_tensor *x = dsc_st_find(f, "h.0.w");
    assert_non_null(x);
    assert_string_equal(x->dtype, "F32");
    assert_int_equal(x->ndim, 2);
    assert_int_equal(x->shape[0], 2);
    assert_int_equal(x->shape[1], 3);
    assert_memory_equal(x->data, a, sizeof a);
    x = dsc_st_find(f, "ids");
    assert_memory_equal(x->data, b, sizeof b);
    x = dsc_st_find(f, "one");
    assert_int_equal(x->ndim, 0);
    assert_memory_equal(x->data, c, sizeof c);
    assert_null(dsc_st_find(f, "absent"));
    assert_string_equal(dsc_st_meta(f, "loss"), "1.25");
    assert_null(dsc_st_meta(f, "nope"));
    // Data starts 8-byte aligned after the header, as the format requires.
    FILE *fp = fopen(path, "rb");
    uint64_t hlen;
    assert_int_equal(fread(&hlen, 8, 1, fp), 1);
    fclose(fp);
    assert_int_equal(hlen % 8, 0);
    dsc_st_close(f);
}

static void test_truncated_is_corrupt(void **state) {
    write_sample();
    FILE *fp = fopen(path, "rb");
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    fclose(fp);
    assert_int_equal(truncate(path, size - 4), 0);
    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, path), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), path));
    assert_non_null(strstr(dsc_last_error(), "truncated"));
}

static void test_garbage_is_corrupt(void **state) {
    FILE *fp = fopen(path, "wb");
    uint64_t n = 1000000;
    fwrite(&n, 8, 1, fp);
    fputs("{not json", fp);
    fclose(fp);
    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, path), DSC_ERR_CORRUPT);
    fp = fopen(path, "wb");
    n = 9;
    fwrite(&n, 8, 1, fp);
    fputs("[1,2,3]  ", fp);
    fclose(fp);
    assert_int_equal(dsc_st_open(&f, path), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "not a JSON object"));
    assert_int_equal(dsc_st_open(&f, "/nonexistent.safetensors"), DSC_ERR_IO);
}

static void test_bad_tensor_rejected_on_write(void **state) {
    dsc_st_tensor t = {"x", "F32", 1, {5}, a, 8}; // 5 floats but 8 bytes
    assert_int_equal(dsc_st_write(path, &t, 1, NULL, 0), DSC_ERR_INVALID_ARG);
    dsc_st_tensor u = {"x", "Q4", 1, {2}, a, 8};
    assert_int_equal(dsc_st_write(path, &u, 1, NULL, 0), DSC_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncated_is_corrupt),
        cmocka_unit_test(test_garbage_is_corrupt),
        cmocka_unit_test(test_bad_tensor_rejected_on_write),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
