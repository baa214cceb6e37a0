// test_env.c - the environment switches' table and accessor (base/env.h): every row complete and
// named once; values read at every call (set, changed and unset in-process, as other tests do
// between scenarios); out-of-range ids answered with NULL; and docs/environment.md's table is
// exactly the rows, in their order.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // fopen, fgets
#include <stdlib.h> // setenv, unsetenv
#include <string.h> // strcmp, strncmp, strchr, strcspn

#include "base/env.h" // dsc__env*

static void test_rows(void **state) {
    (void)state;
    assert_true(DSC_ENV_COUNT > 20);
    for (int i = 0; i < DSC_ENV_COUNT; i++) {
        const dsc__env_row *r = dsc__env_row_of(i);
        assert_non_null(r);
        assert_true(!strncmp(r->name, "DSC_", 4) || !strncmp(r->name, "DS_", 3));
        assert_true(r->values[0] && r->dflt[0] && r->effect[0]);
        // a '|' would split docs/environment.md's table row
        assert_null(strchr(r->values, '|')), assert_null(strchr(r->dflt, '|'));
        assert_null(strchr(r->effect, '|'));
        for (int k = 0; k < i; k++) assert_string_not_equal(dsc__env_row_of(k)->name, r->name);
    }
    assert_string_equal(dsc__env_row_of(DSC_ENV_OFFLOAD_STREAM)->name, "DSC_OFFLOAD_STREAM");
    assert_null(dsc__env_row_of(-1));
    assert_null(dsc__env_row_of(DSC_ENV_COUNT));
    assert_null(dsc__env((dsc__env_id)DSC_ENV_COUNT));
    char buf[8] = "x";
    dsc__env_doc_row(DSC_ENV_COUNT, buf, sizeof buf);
    assert_string_equal(buf, "");
}

static void test_read_at_each_call(void **state) {
    (void)state;
    unsetenv("DSC_COMM_BACKEND");
    assert_null(dsc__env(DSC_ENV_COMM_BACKEND));
    assert_false(dsc__env_is(DSC_ENV_COMM_BACKEND, "nccl"));
    setenv("DSC_COMM_BACKEND", "nccl", 1);
    assert_string_equal(dsc__env(DSC_ENV_COMM_BACKEND), "nccl");
    assert_true(dsc__env_is(DSC_ENV_COMM_BACKEND, "nccl"));
    setenv("DSC_COMM_BACKEND", "mpi", 1); // no cache: the new value at once
    assert_string_equal(dsc__env(DSC_ENV_COMM_BACKEND), "mpi");
    assert_false(dsc__env_is(DSC_ENV_COMM_BACKEND, "nccl"));
    setenv("DSC_COMM_BACKEND", "", 1); // empty is not unset: callers decide (as with getenv)
    assert_string_equal(dsc__env(DSC_ENV_COMM_BACKEND), "");
    unsetenv("DSC_COMM_BACKEND");
    assert_null(dsc__env(DSC_ENV_COMM_BACKEND));
}

// The table rows of docs/environment.md ("| `NAME` | ..."), in order, equal the generated rows.
static void test_doc(void **state) {
    (void)state;
    FILE *f = fopen(DSC_SOURCE_DIR "/docs/environment.md", "r");
    assert_non_null(f);
    char line[2048], want[2048];
    int i = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (strncmp(line, "| `", 3)) continue;
        if (i >= DSC_ENV_COUNT) fail_msg("docs/environment.md: an extra row: %s", line);
        dsc__env_doc_row(i, want, sizeof want);
        if (strcmp(line, want))
            fail_msg("docs/environment.md row %d:\n  %s\nbut src/base/env.def gives\n  %s", i + 1,
                     line, want);
        i++;
    }
    fclose(f);
    assert_int_equal(i, DSC_ENV_COUNT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_read_at_each_call),
        cmocka_unit_test(test_doc),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
