// Unit tests of base/: fp16/bf16 conversion (exhaustive), status messages, checksums, logging.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>    // open
#include <math.h>     // isnan, ldexp
#include <stdio.h>    // snprintf
#include <stdlib.h>   // mkdtemp
#include <string.h>   // memcpy, strstr
#include <sys/stat.h> // stat
#include <unistd.h>   // close, read

#include "base/hash.h"   // dsc_hash64
#include "base/io.h"     // dsc__mkdirs, dsc__write_all
#include "base/log.h"    // dsc__log_enabled
#include "base/status.h" // dsc__fail
#include "dsc/half.h"    // dsc_fp16_*, dsc_bf16_*

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

// Reference decode of an IEEE half from its fields, in double arithmetic.
static double fp16_ref(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexp(m, -24);
    else v = ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static void test_fp16_decode_all(void **state) {
    for (uint32_t h = 0; h < 65536; h++) {
        float got = dsc_fp16_to_fp32((uint16_t)h);
        double want = fp16_ref((uint16_t)h);
        if (isnan(want)) {
            assert_true(isnan(got));
            continue;
        }
        if ((double)got != want || !signbit(got) != !signbit(want))
            fail_msg("fp16 0x%04x: got %.10g want %.10g", h, got, want);
    }
}

// Every half round-trips, and every midpoint between neighbours rounds to the even one; values
// just off the midpoint round to the nearer neighbour. Compared with the compiler's _Float16.
static void test_fp16_encode_rne(void **state) {
    for (uint32_t h = 0; h < 0x7c00; h++) { // positive finite halves
        double a = fp16_ref((uint16_t)h);
        assert_int_equal(dsc_fp32_to_fp16((float)a), h);
        assert_int_equal(dsc_fp32_to_fp16((float)-a), h | 0x8000);
        double b = h + 1 < 0x7c00 ? fp16_ref((uint16_t)(h + 1)) : 65536.0;
        float mid = (float)((a + b) / 2); // exact in fp32
        uint16_t want_mid = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        if (want_mid == 0x7c00 && h + 1 == 0x7c00) want_mid = 0x7c00;
        assert_int_equal(dsc_fp32_to_fp16(mid), want_mid);
        float below = from_bits(bits(mid) - 1), above = from_bits(bits(mid) + 1);
        assert_int_equal(dsc_fp32_to_fp16(below), h);
        assert_int_equal(dsc_fp32_to_fp16(above), (uint16_t)(h + 1));
#if defined(__FLT16_MAX__)
        _Float16 c = (_Float16)mid;
        uint16_t cb;
        memcpy(&cb, &c, 2);
        assert_int_equal(dsc_fp32_to_fp16(mid), cb);
#endif
    }
    assert_int_equal(dsc_fp32_to_fp16(1e6f), 0x7c00);
    assert_int_equal(dsc_fp32_to_fp16(-INFINITY), 0xfc00);
    assert_int_equal(dsc_fp32_to_fp16(65520.0f), 0x7c00); // ties to even overflows
    assert_int_equal(dsc_fp32_to_fp16(65519.0f), 0x7bff);
    assert_int_equal(dsc_fp32_to_fp16(1e-9f), 0);
    uint16_t n = dsc_fp32_to_fp16(NAN);
    assert_true((n & 0x7c00) == 0x7c00 && (n & 0x3ff));
}

static void test_bf16_all(void **state) {
    for (uint32_t b = 0; b < 65536; b++) {
        float f = dsc_bf16_to_fp32((uint16_t)b);
        assert_int_equal(bits(f), b << 16);
        if (isnan(f)) {
            assert_true(isnan(dsc_bf16_to_fp32(dsc_fp32_to_bf16(f))));
            continue;
        }
        assert_int_equal(dsc_fp32_to_bf16(f), b);
        if ((b & 0x7fff) >= 0x7f7f) continue; // next value is inf/nan
        uint32_t mid = (b << 16) | 0x8000;     // exactly half-way to b+1
        assert_int_equal(dsc_fp32_to_bf16(from_bits(mid)), (b & 1) ? b + 1 : b);
        assert_int_equal(dsc_fp32_to_bf16(from_bits(mid - 1)), b);
        assert_int_equal(dsc_fp32_to_bf16(from_bits(mid + 1)), b + 1);
    }
}

static void test_array_forms(void **state) {
    float src[5] = {0.1f, -2.5f, 65504.0f, 1e-5f, 3.14159f}, back[5];
    uint16_t h[5];
    dsc_fp32_to_fp16_n(h, src, 5);
    dsc_fp16_to_fp32_n(back, h, 5);
    for (int i = 0; i < 5; i++) assert_int_equal(h[i], dsc_fp32_to_fp16(src[i]));
    dsc_fp32_to_bf16_n(h, src, 5);
    dsc_bf16_to_fp32_n(back, h, 5);
    for (int i = 0; i < 5; i++) assert_true(fabsf(back[i] - src[i]) <= fabsf(src[i]) / 128);
}

static dsc_status inner(void) { return dsc__fail(DSC_ERR_IO, "shard %d: truncated", 3); }
static dsc_status outer(void) {
    DSC_TRY(inner());
    return DSC_OK;
}

static void test_status(void **state) {
    dsc_clear_error();
    assert_string_equal(dsc_last_error(), "");
    assert_int_equal(outer(), DSC_ERR_IO);
    assert_string_equal(dsc_last_error(), "shard 3: truncated");
    dsc__error_prefix("checkpoint %s: ", "global_step10");
    assert_string_equal(dsc_last_error(), "checkpoint global_step10: shard 3: truncated");
    // nested callers naming the same context say it once ("rank 1 of 2: rank 1 of 2: ...")
    dsc__error_prefix("checkpoint %s: ", "global_step10");
    assert_string_equal(dsc_last_error(), "checkpoint global_step10: shard 3: truncated");
    assert_string_equal(dsc_status_name(DSC_ERR_CONFIG), "DSC_ERR_CONFIG");
    assert_string_equal(dsc_status_name(DSC_ERR_ABORTED), "DSC_ERR_ABORTED");
    assert_string_equal(dsc_status_name((dsc_status)999), "DSC_ERR_UNKNOWN");
}

static void test_hash(void **state) {
    // XXH3-64 of the empty input and of "abc" (published test vectors of xxHash).
    assert_true(dsc_hash64("", 0) == 0x2D06800538D394C2ull);
    char data[1000];
    for (int i = 0; i < 1000; i++) data[i] = (char)(i * 7);
    dsc_hasher *h = dsc_hasher_create();
    assert_non_null(h);
    dsc_hasher_update(h, data, 300);
    dsc_hasher_update(h, data + 300, 700);
    assert_true(dsc_hasher_digest(h) == dsc_hash64(data, 1000));
    dsc_hasher_destroy(h);
    data[500] ^= 1;
    assert_true(dsc_hash64(data, 1000) != dsc_hash64(data + 1, 999));
}

static void test_log_levels(void **state) {
    dsc_log_set_level(DSC_LOG_WARN);
    assert_true(dsc__log_enabled(DSC_LOG_ERROR, "comm"));
    assert_true(dsc__log_enabled(DSC_LOG_WARN, "comm"));
    assert_false(dsc__log_enabled(DSC_LOG_INFO, "comm"));
    dsc_log_set_level(DSC_LOG_DEBUG);
    assert_true(dsc__log_enabled(DSC_LOG_DEBUG, "zero"));
    dsc_log_set_level(-1);
}

// mkdir -p: nested, again (nothing to do), "" (nothing); a path through a file is an error that
// names it. Full writes: every byte lands; a bad descriptor is an error naming the file.
static void test_io(void **state) {
    (void)state;
    char root[] = "/tmp/dsc_base_io_XXXXXX", path[256], file[256];
    assert_non_null(mkdtemp(root));
    snprintf(path, sizeof path, "%s/a/b/c", root);
    assert_int_equal(dsc__mkdirs(path), DSC_OK);
    assert_int_equal(dsc__mkdirs(path), DSC_OK);
    assert_int_equal(dsc__mkdirs(""), DSC_OK);
    struct stat sb;
    assert_true(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    snprintf(file, sizeof file, "%s/f", root);
    int fd = open(file, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    assert_true(fd >= 0);
    char data[5000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (char)(i * 7);
    assert_int_equal(dsc__write_all(fd, data, sizeof data, file), DSC_OK);
    close(fd);
    char back[sizeof data + 1];
    fd = open(file, O_RDONLY);
    assert_int_equal(read(fd, back, sizeof back), (ssize_t)sizeof data);
    close(fd);
    assert_memory_equal(back, data, sizeof data);
    snprintf(path, sizeof path, "%s/f/g", root);
    assert_int_equal(dsc__mkdirs(path), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "/f"));
    assert_int_equal(dsc__write_all(-1, data, 1, "nowhere"), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "nowhere"));
    dsc_clear_error();
    snprintf(path, sizeof path, "rm -rf %s", root);
    assert_int_equal(system(path), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp16_decode_all), cmocka_unit_test(test_fp16_encode_rne),
        cmocka_unit_test(test_bf16_all),        cmocka_unit_test(test_array_forms),
        cmocka_unit_test(test_status),          cmocka_unit_test(test_hash),
        cmocka_unit_test(test_log_levels),      cmocka_unit_test(test_io),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
