// How `dsc launch` learns what a rank's failure does to the others: --on_failure first, then the
// training config of `dsc train` (its --config, or the built-in config), then a DeepSpeed config
// with a fault_tolerance section passed to any other program; otherwise the group is stopped.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>  // fopen, fputs, snprintf
#include <stdlib.h> // mkdtemp
#include <string.h> // strstr
#include <unistd.h> // unlink, rmdir

#include "dsc/status.h"         // dsc_last_error
#include "launch/launch.h"      // dsc_launch_opts
#include "launch/launch_impl.h" // dsc__launch_policy_resolve

static char g_dir[64];

static const char *write_file(const char *name, const char *text) {
    static char path[4][128];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, 128, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return p;
}

// The policy for PROGRAM ARGS (argv, NULL-terminated), with --on_failure `flag` (or NULL).
static int policy_for(const char *flag, char **argv, dsc__launch_policy *p) {
    dsc_launch_opts o;
    dsc_launch_opts_init(&o);
    o.on_failure = flag;
    o.argv = argv;
    while (argv[o.argc]) o.argc++;
    assert_int_equal(dsc__launch_policy_resolve(&o, p), DSC_OK);
    return p->on_failure;
}

static void test_flag(void **state) {
    (void)state;
    dsc__launch_policy p;
    char *prog[] = {"sh", "-c", "true", NULL};
    assert_int_equal(policy_for("degrade", prog, &p), DSC__ON_FAILURE_DEGRADE);
    assert_string_equal(p.source, "--on_failure degrade");
    assert_int_equal(policy_for("restart", prog, &p), DSC__ON_FAILURE_RESTART);
    assert_int_equal(policy_for("abort", prog, &p), DSC__ON_FAILURE_ABORT);
    const char *ab = write_file("ab.json", "{\"fault_tolerance\": {\"on_failure\": \"abort\"}}");
    char *train[] = {"/usr/bin/dsc", "train", "--config", (char *)ab, NULL};
    assert_int_equal(policy_for("degrade", train, &p), DSC__ON_FAILURE_DEGRADE); // flag wins
    dsc_launch_opts o;
    dsc_launch_opts_init(&o);
    o.on_failure = "later";
    o.argv = prog;
    o.argc = 3;
    assert_int_equal(dsc__launch_policy_resolve(&o, &p), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "--on_failure 'later' is not one of degrade"));
}

static void test_dsc_train(void **state) {
    (void)state;
    dsc__launch_policy p;
    char *builtin[] = {"./build/dsc", "train", "--max-steps", "3", NULL};
    assert_int_equal(policy_for(NULL, builtin, &p), DSC__ON_FAILURE_DEGRADE);
    const char *plain = write_file("plain.json", "{\"train_batch_size\": 8}");
    char *dflt[] = {"dsc", "train", "--config", (char *)plain, NULL};
    assert_int_equal(policy_for(NULL, dflt, &p), DSC__ON_FAILURE_DEGRADE); // the key's default
    // the file does not choose: the message says default, not "in plain.json"
    assert_string_equal(p.source, "fault_tolerance.on_failure is degrade (default)");
    const char *rs = // Hjson, as DeepSpeed reads it: unquoted keys and values
        write_file("rs.json", "{\n  fault_tolerance: {\n    on_failure: restart\n  }\n}\n");
    char buf[160];
    snprintf(buf, sizeof buf, "--config=%s", rs);
    char *eq[] = {"dsc", "train", buf, NULL};
    assert_int_equal(policy_for(NULL, eq, &p), DSC__ON_FAILURE_RESTART);
    assert_non_null(strstr(p.source, "fault_tolerance.on_failure is restart in "));
    char *missing[] = {"dsc", "train", "--config", "/nonexistent/ds.json", NULL};
    assert_int_equal(policy_for(NULL, missing, &p), DSC__ON_FAILURE_STOP);
}

static void test_other_programs(void **state) {
    (void)state;
    dsc__launch_policy p;
    const char *ft = write_file("ft.json", "{\"fault_tolerance\": {\"comm_timeout_s\": 5}}");
    const char *plain = write_file("plain.json", "{\"train_batch_size\": 8}");
    char *ds[] = {"train.py", "--deepspeed", "--deepspeed_config", (char *)ft, NULL};
    assert_int_equal(policy_for(NULL, ds, &p), DSC__ON_FAILURE_DEGRADE);
    char *cfg[] = {"python3", "train.py", "--config", (char *)ft, NULL};
    assert_int_equal(policy_for(NULL, cfg, &p), DSC__ON_FAILURE_DEGRADE);
    // A config without a fault_tolerance section says nothing about recovering: stop the group.
    char *nosec[] = {"train.py", "--deepspeed_config", (char *)plain, NULL};
    assert_int_equal(policy_for(NULL, nosec, &p), DSC__ON_FAILURE_STOP);
    char *bare[] = {"sh", "-c", "sleep 1", NULL};
    assert_int_equal(policy_for(NULL, bare, &p), DSC__ON_FAILURE_STOP);
    assert_false(dsc__launch_policy_tolerates(&p));
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dsc-policy-XXXXXX");
    if (!mkdtemp(g_dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flag),
        cmocka_unit_test(test_dsc_train),
        cmocka_unit_test(test_other_programs),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    const char *names[] = {"ab.json", "plain.json", "rs.json", "ft.json"};
    char path[128];
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/%s", g_dir, names[i]);
        unlink(path);
    }
    rmdir(g_dir);
    return rc;
}
