// The launcher's parsers: hostfiles, --include/--exclude, node and slot limits, the job layout
// string, SLURM host lists and tasks-per-node, .deepspeed_env files, shell quoting and
// splitting, and the output labels of srun / mpirun / pdsh. Malformed input must fail with a
// message that names the problem.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>  // printf, snprintf
#include <stdlib.h> // free, rand_r
#include <string.h> // strcmp, strstr

#include "dsc/status.h"         // dsc_last_error
#include "launch/hosts.h"       // dsc__launch_*
#include "launch/launch.h"      // dsc_launch_opts
#include "launch/launch_impl.h" // dsc__launch_program_argv
#include "launch/proc.h"        // dsc__launch_parse_*
#include "launch/strv.h"        // dsc__strv, dsc__launch_shell_quote

// "a:0,1@b:0" form of a pool, for compact comparisons.
static void expect_pool(const dsc__launch_pool *p, const char *want) {
    char *got = NULL;
    assert_int_equal(dsc__launch_pool_format(p, &got), DSC_OK);
    if (strcmp(got, want)) printf("pool: got '%s', want '%s'\n", got, want);
    assert_string_equal(got, want);
    free(got);
}

// The call fails with `st` and its message contains `needle`.
static void expect_error(dsc_status got, dsc_status st, const char *needle) {
    if (got != st || !strstr(dsc_last_error(), needle))
        printf("status %d (want %d), message: %s\n(want it to contain '%s')\n", got, st,
               dsc_last_error(), needle);
    assert_int_equal(got, st);
    assert_non_null(strstr(dsc_last_error(), needle));
}

// ---- hostfiles ----

static void test_hostfile_ok(void **state) {
    (void)state;
    dsc__launch_pool p;
    const char *text = "# cluster\n"
                       "worker-0 slots=4\n"
                       "\n"
                       "  worker-1\tslots=2   # the small one\r\n"
                       "10.0.0.7 slots=1";
    assert_int_equal(dsc__launch_hostfile_parse(text, "hf", &p), DSC_OK);
    assert_int_equal(p.nhosts, 3);
    expect_pool(&p, "worker-0:0,1,2,3@worker-1:0,1@10.0.0.7:0");
    assert_int_equal(dsc__launch_pool_size(&p), 7);
    assert_int_equal(dsc__launch_pool_find(&p, "worker-1"), 1);
    assert_int_equal(dsc__launch_pool_find(&p, "worker-9"), -1);
    dsc__launch_pool_free(&p);
    assert_int_equal(p.nhosts, 0);
}

static void test_hostfile_malformed(void **state) {
    (void)state;
    static const struct {
        const char *text, *needle;
    } cases[] = {
        {"a slots=2\nb\n", "hf line 2: expected 'HOST slots=N'"},
        {"a slots=0\n", "line 1: expected 'HOST slots=N'"},
        {"a slots=x\n", "got 'a slots=x'"},
        {"a slots=-1\n", "line 1"},
        {"a slots=2 extra\n", "line 1"},
        {"a slot=2\n", "line 1"},
        {"a slots=\n", "line 1"},
        {"a slots=99999999\n", "line 1"},
        {"a slots=2\n# x\na slots=3\n", "line 3: host 'a' is listed twice"},
        {"", "lists no hosts"},
        {"# only a comment\n\n", "lists no hosts"},
        {"a:1 slots=2\n", "may not contain"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsc__launch_pool p = {0};
        expect_error(dsc__launch_hostfile_parse(cases[i].text, "hf", &p), DSC_ERR_CONFIG,
                     cases[i].needle);
        assert_int_equal(p.nhosts, 0);
    }
    dsc__launch_pool p;
    expect_error(dsc__launch_hostfile_read("/nonexistent/hostfile", &p), DSC_ERR_IO,
                 "/nonexistent/hostfile");
}

// ---- include / exclude / limits ----

static void pool_of(const char *text, dsc__launch_pool *p) {
    assert_int_equal(dsc__launch_hostfile_parse(text, "hf", p), DSC_OK);
}

static void filter_case(const char *inc, const char *exc, const char *want) {
    dsc__launch_pool in, out;
    pool_of("a slots=4\nb slots=4\nc slots=2\n", &in);
    dsc_status st = dsc__launch_pool_filter(&in, inc, exc, &out);
    if (st != DSC_OK) printf("filter %s/%s: %s\n", inc, exc, dsc_last_error());
    assert_int_equal(st, DSC_OK);
    expect_pool(&out, want);
    dsc__launch_pool_free(&out);
    dsc__launch_pool_free(&in);
}

static void test_filters(void **state) {
    (void)state;
    filter_case(NULL, NULL, "a:0,1,2,3@b:0,1,2,3@c:0,1");
    filter_case("a:0,1@b", NULL, "a:0,1@b:0,1,2,3");
    filter_case("c@a:3,1", NULL, "a:1,3@c:0,1"); // hostfile order, sorted slots
    filter_case("a:2,2@a:2", NULL, "a:2");        // repeats collapse
    filter_case("b:1", NULL, "b:1");
    filter_case(NULL, "a:0@b", "a:1,2,3@c:0,1");
    filter_case(NULL, "c:0,1", "a:0,1,2,3@b:0,1,2,3"); // a host left without slots goes
    filter_case(NULL, "a@b@c:1", "c:0");
}

static void test_filters_malformed(void **state) {
    (void)state;
    static const struct {
        const char *inc, *exc, *needle;
    } cases[] = {
        {"a", "b", "cannot be used together"},
        {"z", NULL, "host 'z' is not among"},
        {"a:4", NULL, "host 'a' has no slot 4"},
        {"", NULL, "empty entry"},
        {"a@", NULL, "empty entry"},
        {"@a", NULL, "empty entry"},
        {"a@@b", NULL, "empty entry"},
        {"a:", NULL, "has ':' but no slots"},
        {":1", NULL, "empty host name"},
        {"a:x", NULL, "slot 'x' of host 'a'"},
        {"a:1,,2", NULL, "slot '' of host 'a'"},
        {"a:-1", NULL, "slot '-1'"},
        {"a:01x", NULL, "slot '01x'"},
        {NULL, "a@b@c", "leaves no slot"},
        {NULL, "q:1", "host 'q' is not among"},
    };
    dsc__launch_pool in;
    pool_of("a slots=4\nb slots=4\nc slots=2\n", &in);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dsc__launch_pool out = {0};
        expect_error(dsc__launch_pool_filter(&in, cases[i].inc, cases[i].exc, &out),
                     DSC_ERR_INVALID_ARG, cases[i].needle);
        assert_int_equal(out.nhosts, 0);
    }
    dsc__launch_pool_free(&in);
}

static void test_limits(void **state) {
    (void)state;
    dsc__launch_pool p;
    pool_of("a slots=4\nb slots=4\nc slots=2\n", &p);
    assert_int_equal(dsc__launch_pool_limit(&p, -1, -1), DSC_OK);
    expect_pool(&p, "a:0,1,2,3@b:0,1,2,3@c:0,1");
    assert_int_equal(dsc__launch_pool_limit(&p, 2, 3), DSC_OK);
    expect_pool(&p, "a:0,1,2@b:0,1,2");
    expect_error(dsc__launch_pool_limit(&p, 3, -1), DSC_ERR_INVALID_ARG, "--num_nodes 3");
    expect_error(dsc__launch_pool_limit(&p, -1, 4), DSC_ERR_INVALID_ARG, "--num_gpus 4");
    dsc__launch_pool_remove(&p, "a");
    dsc__launch_pool_remove(&p, "nothere");
    expect_pool(&p, "b:0,1,2");
    dsc__launch_pool_free(&p);

    assert_int_equal(dsc__launch_pool_local(3, &p), DSC_OK);
    expect_pool(&p, "localhost:0,1,2");
    dsc__launch_pool_free(&p);
    expect_error(dsc__launch_pool_local(0, &p), DSC_ERR_INVALID_ARG, "0 processes");
}

static void test_world_info(void **state) {
    (void)state;
    dsc__launch_pool p, q;
    pool_of("n1 slots=2\nn2 slots=3\n", &p);
    char *s = NULL;
    assert_int_equal(dsc__launch_pool_format(&p, &s), DSC_OK);
    assert_int_equal(dsc__launch_pool_parse(s, &q), DSC_OK);
    expect_pool(&q, s);
    assert_int_equal(dsc__launch_pool_size(&q), 5);
    free(s);
    dsc__launch_pool_free(&q);
    dsc__launch_pool_free(&p);
    expect_error(dsc__launch_pool_parse("a:0@b", &q), DSC_ERR_INVALID_ARG, "host 'b' must appear");
    expect_error(dsc__launch_pool_parse("a:0@a:1", &q), DSC_ERR_INVALID_ARG, "host 'a'");
    expect_error(dsc__launch_pool_parse("a:0@", &q), DSC_ERR_INVALID_ARG, "empty entry");
}

// ---- .deepspeed_env ----

static void test_envfile(void **state) {
    (void)state;
    dsc__strv kv = {0};
    const char *text = "NCCL_DEBUG=INFO\n"
                       "# comment\n"
                       "\n"
                       "  PYTHONPATH=/a:/b  \n"
                       "EMPTY=\n"
                       "OPTS=--x=1 --y 'z'\n"
                       "NCCL_DEBUG=WARN\n";
    assert_int_equal(dsc__launch_envfile_parse(text, ".deepspeed_env", &kv), DSC_OK);
    assert_int_equal(kv.n, 4);
    assert_string_equal(dsc__strv_getenv(&kv, "NCCL_DEBUG"), "WARN"); // the later line wins
    assert_string_equal(dsc__strv_getenv(&kv, "PYTHONPATH"), "/a:/b");
    assert_string_equal(dsc__strv_getenv(&kv, "EMPTY"), "");
    assert_string_equal(dsc__strv_getenv(&kv, "OPTS"), "--x=1 --y 'z'");
    assert_null(dsc__strv_getenv(&kv, "NCCL"));
    assert_null(kv.v[kv.n]);
    dsc__strv_free(&kv);
    expect_error(dsc__launch_envfile_parse("A=1\nJUSTAWORD\n", "envf", &kv), DSC_ERR_CONFIG,
                 "envf line 2: expected KEY=VALUE");
    dsc__strv_free(&kv);
    expect_error(dsc__launch_envfile_parse("1A=2\n", "envf", &kv), DSC_ERR_CONFIG,
                 "'1A' is not a variable name");
    dsc__strv_free(&kv);
    expect_error(dsc__launch_envfile_parse("A-B=2\n", "envf", &kv), DSC_ERR_CONFIG, "'A-B'");
    dsc__strv_free(&kv);
    expect_error(dsc__launch_envfile_parse("=2\n", "envf", &kv), DSC_ERR_CONFIG, "line 1");
    dsc__strv_free(&kv);
}

// ---- shell words ----

static void expect_split(const char *s, const char *const *want, int n) {
    dsc__strv w = {0};
    assert_int_equal(dsc__launch_split_words(s, &w), DSC_OK);
    if (w.n != n) printf("'%s' split into %d words, want %d\n", s, w.n, n);
    assert_int_equal(w.n, n);
    for (int i = 0; i < n; i++) assert_string_equal(w.v[i], want[i]);
    dsc__strv_free(&w);
}

static void test_split(void **state) {
    (void)state;
    const char *w1[] = {"-R", "exec", "-l", "a b", "c\"d", "e f", "", "x'y"};
    expect_split("  -R exec\t-l 'a b' \"c\\\"d\" e\\ f '' \"x'y\"  ", w1, 8);
    const char *w2[] = {"--mca", "btl", "^openib", "a\\b"};
    expect_split("--mca btl ^openib 'a\\b'", w2, 4);
    const char *w3[] = {"ab"};
    expect_split("a\"\"b", w3, 1);
    expect_split("   ", NULL, 0);
    dsc__strv w = {0};
    expect_error(dsc__launch_split_words("a 'b", &w), DSC_ERR_INVALID_ARG, "unterminated");
    dsc__strv_free(&w);
    expect_error(dsc__launch_split_words("a \"b", &w), DSC_ERR_INVALID_ARG, "unterminated");
    dsc__strv_free(&w);
    expect_error(dsc__launch_split_words("a b\\", &w), DSC_ERR_INVALID_ARG, "backslash");
    dsc__strv_free(&w);
}

// Quote random words, split the result back: the words must come back unchanged.
static void test_quote_roundtrip(void **state) {
    (void)state;
    unsigned seed = 12345;
    const char alphabet[] = "ab Z09_-./:=,+@%'\"\\$`!*?;&|<>(){}[]~#\t\n";
    for (int iter = 0; iter < 2000; iter++) {
        char words[4][24];
        dsc__sbuf line = {0};
        int n = 1 + rand_r(&seed) % 4;
        for (int i = 0; i < n; i++) {
            int len = rand_r(&seed) % 12;
            for (int k = 0; k < len; k++)
                words[i][k] = alphabet[rand_r(&seed) % (sizeof alphabet - 1)];
            words[i][len] = '\0';
            if (i) assert_int_equal(dsc__sbuf_add(&line, " ", 1), DSC_OK);
            assert_int_equal(dsc__launch_shell_quote(&line, words[i]), DSC_OK);
        }
        dsc__strv back = {0};
        assert_int_equal(dsc__launch_split_words(line.p, &back), DSC_OK);
        if (back.n != n) printf("seed 12345 iter %d: '%s' gave %d words, want %d\n", iter, line.p,
                                back.n, n);
        assert_int_equal(back.n, n);
        for (int i = 0; i < n; i++) assert_string_equal(back.v[i], words[i]);
        dsc__strv_free(&back);
        dsc__sbuf_free(&line);
    }
    dsc__sbuf b = {0};
    assert_int_equal(dsc__launch_shell_quote(&b, "plain-word_1.py"), DSC_OK);
    assert_string_equal(b.p, "plain-word_1.py");
    b.n = 0;
    assert_int_equal(dsc__launch_shell_quote(&b, "it's"), DSC_OK);
    assert_string_equal(b.p, "'it'\\''s'");
    dsc__sbuf_free(&b);
}

// ---- strings, program lines ----

static void test_strv_env(void **state) {
    (void)state;
    dsc__strv e = {0};
    assert_int_equal(dsc__strv_push(&e, "A=1"), DSC_OK);
    assert_int_equal(dsc__strv_push(&e, "AB=2"), DSC_OK);
    assert_int_equal(dsc__strv_setenv(&e, "A", "3"), DSC_OK);
    assert_int_equal(dsc__strv_setenv(&e, "C", "x=y"), DSC_OK);
    assert_int_equal(e.n, 3);
    assert_string_equal(e.v[0], "A=3");
    assert_string_equal(dsc__strv_getenv(&e, "AB"), "2");
    assert_string_equal(dsc__strv_getenv(&e, "C"), "x=y");
    assert_null(e.v[3]);
    assert_int_equal(dsc__strv_pushf(&e, "N=%d", 42), DSC_OK);
    assert_string_equal(dsc__strv_getenv(&e, "N"), "42");
    dsc__strv_free(&e);
    assert_null(e.v);
}

static void test_program_argv(void **state) {
    (void)state;
    char *args[] = {"train.py", "--config", "c.json"};
    dsc_launch_opts o;
    dsc_launch_opts_init(&o);
    o.argv = args;
    o.argc = 3;
    dsc__strv a = {0};
    assert_int_equal(dsc__launch_program_argv(&o, 2, &a), DSC_OK);
    const char *want[] = {"python3", "-u", "train.py", "--config", "c.json", "--local_rank=2"};
    assert_int_equal(a.n, 6);
    for (int i = 0; i < 6; i++) assert_string_equal(a.v[i], want[i]);
    dsc__strv_free(&a);
    char *args2[] = {"/usr/bin/python3", "s.py"};
    o.argv = args2;
    o.argc = 2;
    o.no_local_rank = true;
    assert_int_equal(dsc__launch_program_argv(&o, 0, &a), DSC_OK);
    assert_int_equal(a.n, 2);
    assert_string_equal(a.v[0], "/usr/bin/python3");
    dsc__strv_free(&a);
}

// ---- output labels ----

static void test_labels(void **state) {
    (void)state;
    const char *t = NULL;
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_SRUN, "3: hello: world", &t), 3);
    assert_string_equal(t, "hello: world");
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_SRUN, " 12: x", &t), 12);
    assert_string_equal(t, "x");
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_SRUN, "0:", &t), 0);
    assert_string_equal(t, "");
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_SRUN, "srun: error: x", &t), -1);
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_SRUN, "12 x", &t), -1);
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_OMPI, "[1,7]<stdout>:hi there", &t), 7);
    assert_string_equal(t, "hi there");
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_OMPI, "[33,0]<stderr>:", &t), 0);
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_OMPI, "[1,7]<stdin>:x", &t), -1);
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_OMPI, "-----", &t), -1);
    assert_int_equal(dsc__launch_parse_label(DSC__OUT_RANK, "1: x", &t), -1);

    char host[64];
    assert_int_equal(dsc__launch_parse_pdsh_exit("pdsh@vm: 127.0.0.1: sh exited with exit code 3",
                                                 host, sizeof host),
                     3);
    assert_string_equal(host, "127.0.0.1");
    assert_int_equal(dsc__launch_parse_pdsh_exit("pdsh@vm: n1: ssh exited with exit code 255",
                                                 host, sizeof host),
                     255);
    assert_string_equal(host, "n1");
    assert_int_equal(dsc__launch_parse_pdsh_exit("[rank 1] exited with exit code 3", host, 64), -1);
    assert_int_equal(dsc__launch_parse_pdsh_exit("pdsh@vm: n1: exited with exit code x", host, 64),
                     -1);
    int task = -1;
    assert_int_equal(
        dsc__launch_parse_srun_exit("srun: error: vm: task 2: Exited with exit code 3", &task), 3);
    assert_int_equal(task, 2);
    assert_int_equal(dsc__launch_parse_srun_exit(
                         "srun: error: vm: tasks 0-1,3: Exited with exit code 143", &task),
                     143);
    assert_int_equal(task, 0);
    assert_int_equal(dsc__launch_parse_srun_exit("srun: error: vm: tasks 0-1: Killed", &task), -1);
    assert_int_equal(dsc__launch_parse_srun_exit("2: Exited with exit code 3", &task), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hostfile_ok),     cmocka_unit_test(test_hostfile_malformed),
        cmocka_unit_test(test_filters),         cmocka_unit_test(test_filters_malformed),
        cmocka_unit_test(test_limits),          cmocka_unit_test(test_world_info),
        cmocka_unit_test(test_envfile),         cmocka_unit_test(test_split),
        cmocka_unit_test(test_quote_roundtrip), cmocka_unit_test(test_strv_env),
        cmocka_unit_test(test_program_argv),    cmocka_unit_test(test_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
