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

// A file made of `header` (padded to 8 bytes) and `data_len` bytes of data.
static void write_raw(const char *header, size_t data_len) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    size_t len = strlen(header), padded = (len + 7) & ~(size_t)7;
    uint64_t n = padded;
    fwrite(&n, 8, 1, fp);
    fputs(header, fp);
    for (size_t i = len; i < padded; i++) fputc(' ', fp);
    for (size_t i = 0; i < data_len; i++) fputc((int)i, fp);
    fclose(fp);
}

static void expect_corrupt(const char *header, size_t data_len, const char *words) {
    write_raw(header, data_len);
    dsc_st_file *f = NULL;
    assert_int_equal(dsc_st_open(&f, path), DSC_ERR_CORRUPT);
    assert_null(f);
    if (!strstr(dsc_last_error(), words)) fail_msg("'%s' lacks '%s'", dsc_last_error(), words);
}

static void test_shape_overflow_is_corrupt(void **state) {
    // 2^40 x 2^40 elements: the product overflows 64 bits.
    expect_corrupt("{\"x\":{\"dtype\":\"U8\",\"shape\":[1099511627776,1099511627776],"
                   "\"data_offsets\":[0,0]}}", 0, "tensor x: bad shape");
    // 2^62 F32 elements are 2^64 bytes, which wraps to 0 and would match [0, 0].
    expect_corrupt("{\"x\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904],"
                   "\"data_offsets\":[0,0]}}", 0, "overflows");
    // 2^61 x 2^3 BF16 elements wrap to 0 bytes too, through the product of the dimensions.
    expect_corrupt("{\"x\":{\"dtype\":\"BF16\",\"shape\":[2305843009213693952,8],"
                   "\"data_offsets\":[0,0]}}", 0, "overflows");
    expect_corrupt("{\"x\":{\"dtype\":\"U8\",\"shape\":[-4],\"data_offsets\":[0,4]}}", 4,
                   "bad shape");
    expect_corrupt("{\"x\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,\"4\"]}}", 4,
                   "data_offsets");
}

static void test_offsets_must_tile(void **state) {
    // Overlapping: b reuses a's bytes.
    expect_corrupt("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8,
                   "overlapping");
    // A gap at the start, and a gap between two tensors.
    expect_corrupt("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8,
                   "tensor a: data_offsets begin at 4 where 0 was expected (a gap");
    expect_corrupt("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
                   "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}", 6, "a gap");
    // Bytes after the last tensor.
    expect_corrupt("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 8,
                   "the tensors cover 4 of the file's 8 data bytes");
    expect_corrupt("{}", 8, "cover 0 of the file's 8");
    // Out of file order but tiling, with an empty tensor: accepted, each sees its own bytes.
    write_raw("{\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[5,8]},"
              "\"e\":{\"dtype\":\"F32\",\"shape\":[0,2],\"data_offsets\":[5,5]},"
              "\"a\":{\"dtype\":\"I8\",\"shape\":[5],\"data_offsets\":[0,5]}}", 8);
    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, path), DSC_OK);
    assert_int_equal(dsc_st_count(f), 3);
    const uint8_t *b = dsc_st_find(f, "b")->data, *a = dsc_st_find(f, "a")->data;
    assert_int_equal(a[0], 0);
    assert_int_equal(a[4], 4);
    assert_int_equal(b[0], 5);
    assert_int_equal(dsc_st_find(f, "b")->nbytes, 3);
    assert_int_equal(dsc_st_find(f, "e")->nbytes, 0);
    dsc_st_close(f);
}

static void test_write_shape_overflow(void **state) {
    dsc_st_tensor t = {"x", "F32", 1, {INT64_C(4611686018427387904)}, a, 0}; // 2^64 bytes
    assert_int_equal(dsc_st_write(path, &t, 1, NULL, 0), DSC_ERR_INVALID_ARG);
    dsc_st_tensor u = {"x", "U8", 2, {INT64_C(1) << 40, INT64_C(1) << 40}, a, 0};
    assert_int_equal(dsc_st_write(path, &u, 1, NULL, 0), DSC_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncated_is_corrupt),
        cmocka_unit_test(test_garbage_is_corrupt),
        cmocka_unit_test(test_bad_tensor_rejected_on_write),
        cmocka_unit_test(test_shape_overflow_is_corrupt),
        cmocka_unit_test(test_offsets_must_tile),
        cmocka_unit_test(test_write_shape_overflow),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
