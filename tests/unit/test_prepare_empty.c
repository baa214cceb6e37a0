// Unit tests of dsc_data_prepare on inputs without text (data/prepare.c): an empty input is an
// error that names it and writes nothing; an empty document among others is skipped over
// without copying from its (NULL) token list, which a sanitizer build would stop on.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdbool.h>  // bool
#include <stdio.h>    // FILE, fopen, snprintf
#include <stdlib.h>   // mkdtemp, system
#include <string.h>   // strstr
#include <sys/stat.h> // stat
#include <unistd.h>   // unlink, rmdir

#include "data/prepare.h" // dsc_data_prepare
#include "dsc/status.h"   // dsc_last_error

static char dir[64], empty[128], text[128], out[128];

static void put(const char *path, const char *s) {
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fputs(s, fp);
    fclose(fp);
}

static bool exists(const char *folder, const char *name) {
    char p[256];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", folder, name);
    return stat(p, &sb) == 0;
}

static int setup(void **state) {
    snprintf(dir, sizeof dir, "/tmp/dsc-prep-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(empty, sizeof empty, "%s/empty.txt", dir);
    snprintf(text, sizeof text, "%s/text.txt", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    put(empty, "");
    put(text, "hello world, a few bytes of text\n");
    return 0;
}

static int teardown(void **state) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void test_empty_input_is_an_error(void **state) {
    const char *in[] = {empty, empty};
    for (int n = 1; n <= 2; n++) { // two empty documents still hold one end-of-text token
        dsc_prepare_opts o = {.inputs = in, .ninputs = n, .tokenizer = "byte", .out_dir = out,
                              .val_fraction = 0.05};
        assert_int_equal(dsc_data_prepare(&o), DSC_ERR_INVALID_ARG);
        assert_non_null(strstr(dsc_last_error(), empty));
        assert_non_null(strstr(dsc_last_error(), "holds no text"));
        assert_false(exists(out, "dataset.json"));
        assert_false(exists(out, "train.bin"));
    }
}

static void test_empty_document_among_others(void **state) {
    const char *in[] = {empty, text, empty};
    dsc_prepare_opts o = {.inputs = in, .ninputs = 3, .tokenizer = "byte", .out_dir = out,
                          .val_fraction = 0};
    assert_int_equal(dsc_data_prepare(&o), DSC_OK);
    assert_true(exists(out, "dataset.json"));
    assert_true(exists(out, "train.bin"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_input_is_an_error),
        cmocka_unit_test(test_empty_document_among_others),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
