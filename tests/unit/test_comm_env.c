// Tests of dsc_comm_env (torch > Open MPI > SLURM > defaults, malformed values) and of
// dsc_hostlist_expand (SLURM host lists).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // snprintf
#include <stdlib.h> // setenv, unsetenv
#include <string.h> // strstr

#include "dsc/comm.h" // dsc_comm_env, dsc_hostlist_expand

static const char *VARS[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NODEID", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
};

static int clear_env(void **state) {
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++) unsetenv(VARS[i]);
    return 0;
}

static void expect(int rank, int world, int lrank, int lworld, const char *addr, int port,
                   const char *source) {
    dsc_comm_env_info e;
    dsc_status st = dsc_comm_env(&e);
    if (st != DSC_OK) fail_msg("dsc_comm_env: %s", dsc_last_error());
    assert_int_equal(e.rank, rank);
    assert_int_equal(e.world_size, world);
    assert_int_equal(e.local_rank, lrank);
    assert_int_equal(e.local_world_size, lworld);
    assert_string_equal(e.master_addr, addr);
    assert_int_equal(e.master_port, port);
    assert_string_equal(e.source, source);
}

static void expect_error(const char *needle) {
    dsc_comm_env_info e;
    assert_int_equal(dsc_comm_env(&e), DSC_ERR_CONFIG);
    if (!strstr(dsc_last_error(), needle))
        fail_msg("message \"%s\" lacks \"%s\"", dsc_last_error(), needle);
}

static void test_defaults(void **state) { expect(0, 1, 0, 1, "127.0.0.1", 29500, "default"); }

static void test_torch(void **state) {
    setenv("RANK", "5", 1);
    setenv("WORLD_SIZE", "8", 1);
    expect(5, 8, 5, 8, "127.0.0.1", 29500, "torch"); // no LOCAL_*: one node
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("MASTER_ADDR", "node17", 1);
    setenv("MASTER_PORT", "1234", 1);
    expect(5, 8, 1, 4, "node17", 1234, "torch");
    // torch wins over Open MPI and SLURM
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "2", 1);
    expect(5, 8, 1, 4, "node17", 1234, "torch");
}

static void test_ompi(void **state) {
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "6", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("SLURM_PROCID", "4", 1); // Open MPI wins over SLURM
    setenv("SLURM_NTASKS", "5", 1);
    expect(2, 6, 0, 2, "127.0.0.1", 29500, "ompi");
}

static void test_slurm(void **state) {
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_NODEID", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
    setenv("SLURM_JOB_NODELIST", "node[07-08]", 1);
    expect(5, 8, 1, 4, "node07", 29500, "slurm");
    setenv("SLURM_TASKS_PER_NODE", "3(x2),2", 1); // node 2 runs 2
    setenv("SLURM_NODEID", "2", 1);
    setenv("SLURM_PROCID", "7", 1);
    setenv("SLURM_LOCALID", "1", 1);
    expect(7, 8, 1, 2, "node07", 29500, "slurm");
    setenv("MASTER_ADDR", "10.0.0.9", 1); // an explicit master wins over the node list
    setenv("MASTER_PORT", "40000", 1);
    expect(7, 8, 1, 2, "10.0.0.9", 40000, "slurm");
    unsetenv("MASTER_ADDR");
    unsetenv("SLURM_JOB_NODELIST");
    setenv("SLURM_NODELIST", "gpu5,gpu6", 1);
    expect(7, 8, 1, 2, "gpu5", 40000, "slurm");
    // single node without SLURM_TASKS_PER_NODE: every task is local
    unsetenv("SLURM_TASKS_PER_NODE");
    unsetenv("SLURM_NODEID");
    unsetenv("SLURM_LOCALID");
    expect(7, 8, 7, 8, "gpu5", 40000, "slurm");
    setenv("SLURM_TASKS_PER_NODE", "4", 1);
    setenv("SLURM_NODEID", "1", 1);
    expect_error("SLURM_TASKS_PER_NODE");
}

static void test_errors(void **state) {
    setenv("RANK", "abc", 1);
    setenv("WORLD_SIZE", "4", 1);
    expect_error("RANK=\"abc\"");
    setenv("RANK", "4", 1);
    expect_error("RANK=4 is not below WORLD_SIZE=4");
    unsetenv("WORLD_SIZE");
    setenv("RANK", "1", 1);
    expect_error("RANK is set but WORLD_SIZE is not");
    setenv("WORLD_SIZE", "2", 1);
    setenv("MASTER_PORT", "70000", 1);
    expect_error("MASTER_PORT");
    setenv("MASTER_PORT", "29501", 1);
    setenv("LOCAL_RANK", "3", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    expect_error("LOCAL_RANK=3");
    clear_env(NULL);
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    setenv("SLURM_JOB_NODELIST", "node[1-", 1);
    assert_int_equal(dsc_comm_env(&(dsc_comm_env_info){0}), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "SLURM node list"));
}

// SLURM's tasks-per-node form (the launcher reads it too).
static void test_tasks_per_node(void **state) {
    (void)state;
    assert_int_equal(dsc_slurm_tasks_on_node("4", 0), 4);
    assert_int_equal(dsc_slurm_tasks_on_node("4", 1), -1);
    const int want[] = {2, 2, 2, 1, -1};
    for (int node = 0; node < 5; node++)
        assert_int_equal(dsc_slurm_tasks_on_node("2(x3),1", node), want[node]);
    assert_int_equal(dsc_slurm_tasks_on_node("2(x3", 0), -1);
    assert_int_equal(dsc_slurm_tasks_on_node("x", 0), -1);
    assert_int_equal(dsc_slurm_tasks_on_node("0", 0), -1);
    assert_int_equal(dsc_slurm_tasks_on_node(NULL, 0), -1);
}

static void expect_hosts(const char *spec, const char *joined) {
    char **h = NULL;
    size_t n = 0;
    if (dsc_hostlist_expand(spec, &h, &n) != DSC_OK) fail_msg("%s: %s", spec, dsc_last_error());
    char buf[1024] = "";
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", i ? " " : "", h[i]);
    dsc_hostlist_free(h, n);
    assert_string_equal(buf, joined);
}

static void test_hostlist(void **state) {
    expect_hosts("node[01-04,07]", "node01 node02 node03 node04 node07");
    expect_hosts("node[01-03,07],gpu5", "node01 node02 node03 node07 gpu5");
    expect_hosts("gpu5", "gpu5");
    expect_hosts("a,b,c", "a b c");
    expect_hosts("r[1-2]n[01-02]", "r1n01 r1n02 r2n01 r2n02");
    expect_hosts("n[8-11]", "n8 n9 n10 n11");
    expect_hosts("n[098-101].ib", "n098.ib n099.ib n100.ib n101.ib");
    expect_hosts("x[5]", "x5");
    expect_hosts("vm", "vm");
    expect_hosts("n[008-010]", "n008 n009 n010");
    expect_hosts("r[1-2]-n[3-4]", "r1-n3 r1-n4 r2-n3 r2-n4");
    expect_hosts("a,b[1],c", "a b1 c");
    expect_hosts("x[5]y", "x5y");
    // the launcher (SLURM_JOB_NODELIST's first host) uses this parser too
    const char *bad[] = {"", "node[3-1]", "node[", "node]", "node[a-b]", "n[]", "a,,b",
                         "n[0-9999999]", "n[[1]]", "n[1-", "n[a]", "n[1-2", ",a", "a,",
                         "n[1-x]", "n[-1]", "n[1,]", "n[,1]", "n[1,,2]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char **h = (char **)1;
        size_t n = 7;
        if (dsc_hostlist_expand(bad[i], &h, &n) != DSC_ERR_INVALID_ARG)
            fail_msg("\"%s\" was accepted", bad[i]);
        if (!strstr(dsc_last_error(), "host list")) fail_msg("%s: %s", bad[i], dsc_last_error());
        if (h != NULL || n != 0) fail_msg("\"%s\": outputs not cleared on failure", bad[i]);
    }
    // the limit counts the whole product of bracket groups
    char **h = NULL;
    size_t n = 0;
    assert_int_equal(dsc_hostlist_expand("a[0-999]b[0-999]c[0-9]", &h, &n), DSC_ERR_INVALID_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_defaults, clear_env),
        cmocka_unit_test_setup(test_torch, clear_env),
        cmocka_unit_test_setup(test_ompi, clear_env),
        cmocka_unit_test_setup(test_slurm, clear_env),
        cmocka_unit_test_setup(test_errors, clear_env),
        cmocka_unit_test_setup(test_hostlist, clear_env),
        cmocka_unit_test(test_tasks_per_node),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
