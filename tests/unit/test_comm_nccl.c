// Tests of the nccl backend's host-side parts, on any machine: the polling verdict (event,
// NCCL's asynchronous error, a wait on another stream, deadline) and the broken communicator's
// messages, the test hook's parser, the registry (dsc_comm_backend_available, the error when nccl
// is asked for but cannot run here), dsc_comm_shrink's checks, dsc__nccl_after_event's and _record_event's refusals,
// and where the engine's own collectives go when nccl is selected. The collectives themselves
// run on a GPU: tests/cuda/test_cuda_nccl.cu.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // snprintf
#include <stdlib.h> // setenv, unsetenv
#include <string.h> // strstr

#include "comm/backend.h"  // DSC__COMM_MSG_MAX
#include "comm/nccl.h"     // dsc__nccl_judge, dsc__nccl_fault_msg, dsc__nccl_inject_parse
#include "dsc/comm.h"      // dsc_comm_*
#include "engine/device.h" // dsc__engine_host_backend

static dsc__nccl_verdict judge(int event, int async, double elapsed, double timeout) {
    dsc__nccl_probe p = {.event = event, .async = async, .elapsed_s = elapsed,
                         .timeout_s = timeout};
    return dsc__nccl_judge(&p);
}

static void test_verdict(void **state) {
    // running until the deadline, then late; reached is done whatever the clock says
    assert_int_equal(judge(0, 0, 0.0, 30), DSC__NCCL_RUNNING);
    assert_int_equal(judge(0, 1, 29.999, 30), DSC__NCCL_RUNNING); // NCCL busy is not an error
    assert_int_equal(judge(0, 0, 30.0, 30), DSC__NCCL_TIMEOUT);
    assert_int_equal(judge(0, 1, 31.0, 30), DSC__NCCL_TIMEOUT);
    assert_int_equal(judge(1, 0, 0.0, 30), DSC__NCCL_DONE);
    assert_int_equal(judge(1, 1, 100.0, 30), DSC__NCCL_DONE); // finished late: still done
    // an NCCL error wins over a reached event (the kernels left early) and over the deadline
    assert_int_equal(judge(1, -1, 0.0, 30), DSC__NCCL_NCCL_ERROR);
    assert_int_equal(judge(0, -1, 99.0, 30), DSC__NCCL_NCCL_ERROR);
    // a failed event query wins over everything
    assert_int_equal(judge(-1, -1, 99.0, 30), DSC__NCCL_CUDA_ERROR);
    assert_int_equal(judge(-1, 0, 0.0, 30), DSC__NCCL_CUDA_ERROR);
}

static dsc__nccl_verdict judge_held(int held, int event, int async, double elapsed) {
    dsc__nccl_probe p = {.event = event, .async = async, .elapsed_s = elapsed, .timeout_s = 30,
                         .held = held};
    return dsc__nccl_judge(&p);
}

// An operation behind a wait on another stream (dsc__nccl_after_event) is not timed while held.
static void test_verdict_held(void **state) {
    assert_int_equal(judge_held(1, 0, 0, 0.0), DSC__NCCL_RUNNING);
    assert_int_equal(judge_held(1, 0, 0, 1e6), DSC__NCCL_RUNNING); // a long backward: not late
    assert_int_equal(judge_held(1, 0, 1, 1e6), DSC__NCCL_RUNNING);
    assert_int_equal(judge_held(0, 0, 0, 30.0), DSC__NCCL_TIMEOUT); // passed: timed again
    assert_int_equal(judge_held(0, 1, 0, 99.0), DSC__NCCL_DONE);
    // errors still end it while held: NCCL's (a peer failed), and a failed query of the wait
    assert_int_equal(judge_held(1, 0, -1, 0.0), DSC__NCCL_NCCL_ERROR);
    assert_int_equal(judge_held(-1, 0, 0, 0.0), DSC__NCCL_CUDA_ERROR);
    assert_int_equal(judge_held(-1, 0, -1, 0.0), DSC__NCCL_CUDA_ERROR);
}

static void has(const char *msg, const char *needle) {
    if (!strstr(msg, needle)) fail_msg("message lacks \"%s\": %s", needle, msg);
}

static void test_messages(void **state) {
    char msg[DSC__COMM_MSG_MAX];
    dsc__nccl_site at = {.rank = 2, .world = 4, .device = 1};
    dsc__nccl_fault_msg(msg, sizeof msg, &at, "all_reduce of 1000 f32", DSC__NCCL_TIMEOUT, 31.2,
                        30, NULL);
    has(msg, "rank 2 of 4 (cuda:1): all_reduce of 1000 f32");
    has(msg, "not complete after 31.2 s (comm_timeout_s 30.0)");
    has(msg, "one of ranks 0-3");
    has(msg, "NCCL communicator was aborted");
    has(msg, "restart the job");
    dsc__nccl_fault_msg(msg, sizeof msg, &at, "reduce_scatter of 8 bf16", DSC__NCCL_NCCL_ERROR, 1,
                        30, "remote process exited or there was a network error");
    has(msg, "reduce_scatter of 8 bf16: NCCL reported an error (remote process exited");
    has(msg, "NCCL_DEBUG=WARN");
    dsc__nccl_fault_msg(msg, sizeof msg, &at, "barrier", DSC__NCCL_CUDA_ERROR, 1, 30,
                        "an illegal memory access was encountered");
    has(msg, "barrier: the device failed (an illegal memory access");
    has(msg, "nvidia-smi");
    at.world = 1;
    dsc__nccl_fault_msg(msg, sizeof msg, &at, "broadcast of 3 f16", DSC__NCCL_TIMEOUT, 2, 1,
                        NULL);
    has(msg, "one of rank 0 ");
    // a message never overflows its buffer
    char small[40];
    dsc__nccl_fault_msg(small, sizeof small, &at, "all_gather of 1 f32", DSC__NCCL_TIMEOUT, 2, 1,
                        NULL);
    assert_int_equal(strlen(small), sizeof small - 1);
}

static void test_inject_parse(void **state) {
    long op;
    double s;
    assert_true(dsc__nccl_inject_parse(NULL, &op, &s));
    assert_int_equal(op, 0);
    assert_true(dsc__nccl_inject_parse("", &op, &s));
    assert_int_equal(op, 0);
    assert_true(dsc__nccl_inject_parse("2:3.5", &op, &s));
    assert_int_equal(op, 2);
    assert_true(s == 3.5);
    const char *bad[] = {"2", "0:1", "-1:1", "x:1", "2:", "2:0", "2:-1", "2:1x", "2:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (dsc__nccl_inject_parse(bad[i], &op, &s)) fail_msg("\"%s\" was accepted", bad[i]);
}

// Asking for nccl: available exactly when built; on a machine without a GPU (or a build without
// NCCL) create fails with a message that says what is missing and what to use instead.
static void test_registry(void **state) {
    assert_true(dsc_comm_backend_available("shm"));
    assert_false(dsc_comm_backend_available("tcp"));
    assert_false(dsc_comm_backend_available(NULL));
#ifdef DSC_WITH_NCCL
    assert_true(dsc_comm_backend_available("nccl"));
#else
    assert_false(dsc_comm_backend_available("nccl"));
#endif
    dsc_comm_opts o = dsc_comm_opts_default();
    o.backend = "nccl";
    o.rank = 0;
    o.world_size = 1;
    o.timeout_s = 5;
    dsc_comm *c = NULL;
    dsc_status st = dsc_comm_create(&c, &o);
    if (st == DSC_OK) { // a machine with a GPU: one rank works (the GPU test covers it)
        assert_non_null(c);
        assert_string_equal(dsc_comm_backend(c), "nccl");
        assert_int_equal(dsc_comm_size(c), 1);
        dsc_comm_destroy(c);
        return;
    }
    assert_null(c);
    assert_int_equal(st, DSC_ERR_UNSUPPORTED);
#ifdef DSC_WITH_NCCL
    has(dsc_last_error(), "nccl: no CUDA device is usable here");
    has(dsc_last_error(), "use backend shm or mpi");
#else
    has(dsc_last_error(), "built without NCCL");
#endif
}

static void test_shrink_checks(void **state) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = 0;
    o.world_size = 1;
    dsc_comm *c = NULL, *out = (dsc_comm *)&o;
    assert_int_equal(dsc_comm_create(&c, &o), DSC_OK);
    int self = 0, other = 1;
    assert_int_equal(dsc_comm_shrink(c, &self, 1, &out), DSC_ERR_INVALID_ARG);
    assert_null(out);
    assert_int_equal(dsc_comm_shrink(c, &other, 1, &out), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_comm_shrink(c, NULL, -1, &out), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_comm_shrink(NULL, NULL, 0, &out), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_comm_shrink(c, NULL, 0, &out), DSC_ERR_UNSUPPORTED); // shm: no shrink
    has(dsc_last_error(), "comm backend 'shm' cannot shrink");
    has(dsc_last_error(), "dsc_comm_create");
    dsc_comm_destroy(c);
}

// dsc__nccl_after_event and dsc__nccl_record_event are for nccl communicators only; without NCCL
// they say the build lacks it.
static void test_after_event_refusals(void **state) {
    dsc_comm_opts o = dsc_comm_opts_default();
    o.rank = 0;
    o.world_size = 1;
    dsc_comm *c = NULL;
    assert_int_equal(dsc_comm_create(&c, &o), DSC_OK); // shm
    int not_an_event = 0;
#ifdef DSC_WITH_NCCL
    assert_int_equal(dsc__nccl_after_event(c, &not_an_event), DSC_ERR_INVALID_ARG);
    has(dsc_last_error(), "backend is shm");
    assert_int_equal(dsc__nccl_after_event(NULL, &not_an_event), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc__nccl_after_event(c, NULL), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc__nccl_record_event(c, &not_an_event), DSC_ERR_INVALID_ARG);
    has(dsc_last_error(), "backend is shm");
    assert_int_equal(dsc__nccl_record_event(NULL, &not_an_event), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc__nccl_record_event(c, NULL), DSC_ERR_INVALID_ARG);
#else
    assert_int_equal(dsc__nccl_after_event(c, &not_an_event), DSC_ERR_UNSUPPORTED);
    has(dsc_last_error(), "built without NCCL");
    assert_int_equal(dsc__nccl_record_event(c, &not_an_event), DSC_ERR_UNSUPPORTED);
    has(dsc_last_error(), "built without NCCL");
#endif
    dsc_comm_destroy(c);
}

// DSC_COMM_BACKEND=nccl is for the device collectives; the engine's own stay on a host backend.
static void test_engine_host_backend(void **state) {
    unsetenv("DSC_COMM_BACKEND");
    unsetenv("DSC_HOST_COMM_BACKEND");
    assert_string_equal(dsc__engine_host_backend(), "shm");
    setenv("DSC_COMM_BACKEND", "mpi", 1);
    assert_string_equal(dsc__engine_host_backend(), "mpi");
    setenv("DSC_COMM_BACKEND", "nccl", 1);
    assert_string_equal(dsc__engine_host_backend(), "shm");
    setenv("DSC_HOST_COMM_BACKEND", "mpi", 1);
    assert_string_equal(dsc__engine_host_backend(), "mpi");
    unsetenv("DSC_COMM_BACKEND");
    unsetenv("DSC_HOST_COMM_BACKEND");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verdict),
        cmocka_unit_test(test_verdict_held),
        cmocka_unit_test(test_messages),
        cmocka_unit_test(test_inject_parse),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_shrink_checks),
        cmocka_unit_test(test_after_event_refusals),
        cmocka_unit_test(test_engine_host_backend),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
