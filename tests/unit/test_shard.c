// test_shard.c - token shard format: round trips, the exact byte layout, and error messages.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>    // FILE, fopen, fwrite, snprintf
#include <stdlib.h>   // free, getenv, malloc
#include <string.h>   // memset, strstr
#include <sys/stat.h> // stat
#include <unistd.h>   // rmdir, truncate, unlink

#include "data/shard.h" // dsc_shard_*
#include "dsc/status.h" // dsc_last_error

static char dir[512];

static int setup(void **state) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/dsc_shard_XXXXXX", tmp);
    return mkdtemp(dir) ? 0 : -1;
}

static const char *const FILES[] = {"v1.bin", "v2.bin", "empty.bin", "magic.bin", "short.bin",
                                    "tiny.bin", "long.bin", "ver.bin", "v3.bin", "v4.bin",
                                    "row.bin"};

static int teardown(void **state) {
    char p[600];
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, FILES[i]);
        unlink(p);
    }
    return rmdir(dir);
}

static const char *path_of(const char *name) {
    static char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static uint8_t *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)*n);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}

// Write a file holding a header (magic, version, ntok) followed by `body` bytes of zeros.
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t ntok, long body) {
    int32_t h[256] = {magic, version, ntok};
    FILE *f = fopen(path, "wb");
    fwrite(h, 4, 256, f);
    for (long i = 0; i < body; i++) fputc(0, f);
    fclose(f);
}

static void test_v1_round_trip(void **state) {
    enum { N = 1000 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 7919) % 50257;
    tok[0] = 0;
    tok[1] = 65535 % 50257;
    assert_int_equal(dsc_shard_write(path_of("v1.bin"), tok, N, 50257), DSC_OK);
    // The layout, byte by byte: what llm.c's readers expect.
    long n;
    uint8_t *b = slurp(path_of("v1.bin"), &n);
    assert_int_equal(n, 1024 + 2 * N);
    int32_t h[3];
    memcpy(h, b, sizeof h);
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], N);
    for (int i = 3; i < 256; i++) assert_int_equal(((int32_t *)b)[i], 0);
    for (int i = 0; i < N; i++) assert_int_equal(b[1024 + 2 * i] | b[1025 + 2 * i] << 8, tok[i]);
    free(b);
    dsc_shard s;
    assert_int_equal(dsc_shard_open(&s, path_of("v1.bin")), DSC_OK);
    assert_int_equal(s.version, 1);
    assert_int_equal(s.ntok, N);
    for (int i = 0; i < N; i++) assert_int_equal(dsc_shard_token(&s, i), tok[i]);
    int32_t part[10];
    dsc_shard_read(&s, 990, 10, part);
    assert_memory_equal(part, tok + 990, sizeof part);
    dsc_shard_close(&s);
    dsc_shard_close(&s); // twice is harmless
    struct stat sb;
    assert_int_not_equal(stat(path_of("v1.bin.tmp"), &sb), 0); // no temporary left behind
}

static void test_v2_round_trip(void **state) {
    enum { N = 777 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 2654435761u) % 200000u);
    tok[5] = 199999;
    assert_int_equal(dsc_shard_write(path_of("v2.bin"), tok, N, 200000), DSC_OK);
    long n;
    uint8_t *b = slurp(path_of("v2.bin"), &n);
    assert_int_equal(n, 1024 + 4 * N);
    assert_int_equal(((int32_t *)b)[1], 2);
    free(b);
    dsc_shard s;
    assert_int_equal(dsc_shard_open(&s, path_of("v2.bin")), DSC_OK);
    assert_int_equal(s.version, 2);
    assert_int_equal(s.ntok, N);
    for (int i = 0; i < N; i++) assert_int_equal(dsc_shard_token(&s, i), tok[i]);
    dsc_shard_close(&s);
    // 65536 ids still fit uint16; 65537 do not.
    int32_t top = 65535;
    assert_int_equal(dsc_shard_write(path_of("v2.bin"), &top, 1, 65536), DSC_OK);
    assert_int_equal(dsc_shard_open(&s, path_of("v2.bin")), DSC_OK);
    assert_int_equal(s.version, 1);
    assert_int_equal(dsc_shard_token(&s, 0), 65535);
    dsc_shard_close(&s);
}

// Versions 3 (uint16) and 4 (uint32): the tokens, then one flag byte each; word 3 the row length.
static void test_flags_round_trip(void **state) {
    enum { N = 12 };
    int32_t tok[N];
    uint8_t fl[N];
    for (int i = 0; i < N; i++) {
        tok[i] = 100 + i;
        fl[i] = (uint8_t)((i % 3 ? DSC_TOK_TARGET : 0) | (i % 4 == 0 ? DSC_TOK_DOC : 0));
    }
    assert_int_equal(dsc_shard_write_flags(path_of("v3.bin"), tok, fl, N, 50257, 4), DSC_OK);
    long n;
    uint8_t *b = slurp(path_of("v3.bin"), &n);
    assert_int_equal(n, 1024 + 3 * N);
    assert_int_equal(((int32_t *)b)[1], 3);
    assert_int_equal(((int32_t *)b)[2], N);
    assert_int_equal(((int32_t *)b)[3], 4);
    assert_memory_equal(b + 1024 + 2 * N, fl, N);
    free(b);
    dsc_shard s;
    assert_int_equal(dsc_shard_open(&s, path_of("v3.bin")), DSC_OK);
    assert_int_equal(s.version, 3);
    assert_int_equal(s.row, 4);
    int32_t back[N];
    uint8_t fb[N];
    dsc_shard_read(&s, 0, N, back);
    dsc_shard_read_flags(&s, 0, N, fb);
    assert_memory_equal(back, tok, sizeof tok);
    assert_memory_equal(fb, fl, sizeof fl);
    dsc_shard_close(&s);
    tok[7] = 70000; // a vocabulary above 65536: version 4, 32-bit ids, never wrapped
    assert_int_equal(dsc_shard_write_flags(path_of("v4.bin"), tok, fl, N, 70001, 0), DSC_OK);
    assert_int_equal(dsc_shard_open(&s, path_of("v4.bin")), DSC_OK);
    assert_int_equal(s.version, 4);
    assert_int_equal(s.row, 0);
    assert_int_equal(s.ntok, N);
    assert_int_equal(dsc_shard_token(&s, 7), 70000);
    dsc_shard_read_flags(&s, 0, N, fb);
    assert_memory_equal(fb, fl, sizeof fl);
    dsc_shard_close(&s);
    // An id the vocabulary cannot hold is an error, not a wrap; so are a row length that does
    // not divide the tokens and undefined flag bits.
    assert_int_equal(dsc_shard_write_flags(path_of("v4.bin"), tok, fl, N, 65536, 0),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "70000"));
    assert_int_equal(dsc_shard_write_flags(path_of("row.bin"), tok, fl, N, 70001, 5),
                     DSC_ERR_INVALID_ARG);
    fl[2] = 0x80;
    assert_int_equal(dsc_shard_write_flags(path_of("row.bin"), tok, fl, N, 70001, 0),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "flag byte 2"));
    // A plain shard reads as every token a target.
    int32_t t2[2] = {1, 2};
    assert_int_equal(dsc_shard_write(path_of("row.bin"), t2, 2, 256), DSC_OK);
    assert_int_equal(dsc_shard_open(&s, path_of("row.bin")), DSC_OK);
    assert_null(s.flags);
    dsc_shard_read_flags(&s, 0, 2, fb);
    assert_int_equal(fb[0], DSC_TOK_TARGET);
    assert_int_equal(fb[1], DSC_TOK_TARGET);
    dsc_shard_close(&s);
    // Header checks: a flagged file whose size lacks the flags, a row length that does not
    // divide the count.
    write_raw(path_of("row.bin"), 20240520, 3, 10, 20);
    assert_int_equal(dsc_shard_open(&s, path_of("row.bin")), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "truncated"));
    int32_t h[256] = {20240520, 3, 10, 3};
    FILE *f = fopen(path_of("row.bin"), "wb");
    fwrite(h, 4, 256, f);
    for (int i = 0; i < 30; i++) fputc(0, f);
    fclose(f);
    assert_int_equal(dsc_shard_open(&s, path_of("row.bin")), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "row length 3"));
}

static void test_empty_and_bad_tokens(void **state) {
    dsc_shard s;
    assert_int_equal(dsc_shard_write(path_of("empty.bin"), NULL, 0, 256), DSC_OK);
    assert_int_equal(dsc_shard_open(&s, path_of("empty.bin")), DSC_OK);
    assert_int_equal(s.ntok, 0);
    dsc_shard_close(&s);
    int32_t bad[] = {1, 2, 256};
    assert_int_equal(dsc_shard_write(path_of("empty.bin"), bad, 3, 256), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "outside the vocabulary"));
    bad[2] = -1;
    assert_int_equal(dsc_shard_write(path_of("empty.bin"), bad, 3, 256), DSC_ERR_INVALID_ARG);
    // The failed writes left the earlier shard intact.
    assert_int_equal(dsc_shard_open(&s, path_of("empty.bin")), DSC_OK);
    dsc_shard_close(&s);
}

static void test_errors(void **state) {
    dsc_shard s;
    write_raw(path_of("magic.bin"), 123, 1, 0, 0);
    assert_int_equal(dsc_shard_open(&s, path_of("magic.bin")), DSC_ERR_CORRUPT);
    const char *e = dsc_last_error();
    assert_non_null(strstr(e, path_of("magic.bin")));
    assert_non_null(strstr(e, "bad magic 123 (expected 20240520)"));
    assert_non_null(strstr(e, "dsc data prepare"));

    write_raw(path_of("short.bin"), 20240520, 1, 100, 150); // needs 200 body bytes
    assert_int_equal(dsc_shard_open(&s, path_of("short.bin")), DSC_ERR_CORRUPT);
    e = dsc_last_error();
    assert_non_null(strstr(e, path_of("short.bin")));
    assert_non_null(strstr(e, "truncated"));
    assert_non_null(strstr(e, "1224 bytes expected"));
    assert_non_null(strstr(e, "1174 bytes"));

    write_raw(path_of("long.bin"), 20240520, 2, 10, 41);
    assert_int_equal(dsc_shard_open(&s, path_of("long.bin")), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "trailing bytes"));

    FILE *f = fopen(path_of("tiny.bin"), "wb");
    fputs("hello", f);
    fclose(f);
    assert_int_equal(dsc_shard_open(&s, path_of("tiny.bin")), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "5 bytes"));

    write_raw(path_of("ver.bin"), 20240520, 7, 0, 0);
    assert_int_equal(dsc_shard_open(&s, path_of("ver.bin")), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "version 7"));

    assert_int_equal(dsc_shard_open(&s, path_of("missing.bin")), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), path_of("missing.bin")));
    assert_non_null(strstr(dsc_last_error(), "No such file"));
    dsc_shard_close(&s); // a failed open leaves a closable shard

    int32_t t = 1;
    assert_int_equal(dsc_shard_write("/nonexistent-dir/x.bin", &t, 1, 256), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), "/nonexistent-dir/x.bin"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_v1_round_trip),
        cmocka_unit_test(test_v2_round_trip),
        cmocka_unit_test(test_flags_round_trip),
        cmocka_unit_test(test_empty_and_bad_tokens),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
