// Tests of the rendezvous store: every operation, waiting across processes, atomic counters from
// several processes, deadlines (key never set, no server, server gone), connection retry, and a
// client speaking garbage. Children are forked before any server thread exists.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <netinet/in.h> // sockaddr_in
#include <signal.h>     // kill
#include <stdio.h>      // snprintf
#include <stdlib.h>     // malloc, free
#include <string.h>     // memcmp, strstr
#include <sys/socket.h> // socket
#include <sys/wait.h>   // waitpid
#include <time.h>       // nanosleep
#include <unistd.h>     // fork, _exit

#include "loopback.h" // free_port, nap
#include "base/time.h"  // dsc_now
#include "comm/store.h" // dsc_store_*

// Exit code of a child, killing it after limit_s.
static int reap(pid_t pid, double limit_s) {
    double t0 = dsc_now();
    int status;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (dsc_now() - t0 > limit_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 99;
        }
        nap(0.005);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_operations(void **state) {
    dsc_store *s = NULL;
    assert_int_equal(dsc_store_create(&s, "127.0.0.1", 0, true, 5.0), DSC_OK);
    assert_true(dsc_store_port(s) > 0);
    const char bin[] = {'a', 0, 'b', (char)0xff};
    assert_int_equal(dsc_store_set(s, "k1", bin, sizeof bin), DSC_OK);
    assert_int_equal(dsc_store_set(s, "empty", NULL, 0), DSC_OK);
    void *v = NULL;
    size_t len = 0;
    assert_int_equal(dsc_store_get(s, "k1", &v, &len), DSC_OK);
    assert_int_equal(len, sizeof bin);
    assert_memory_equal(v, bin, sizeof bin);
    free(v);
    assert_int_equal(dsc_store_get(s, "empty", &v, &len), DSC_OK);
    assert_int_equal(len, 0);
    free(v);
    assert_int_equal(dsc_store_set(s, "k1", "new", 3), DSC_OK); // replace
    assert_int_equal(dsc_store_get(s, "k1", &v, &len), DSC_OK);
    assert_int_equal(len, 3);
    assert_string_equal(v, "new"); // NUL-terminated for convenience
    free(v);
    size_t big = 3u << 20; // a value larger than any socket buffer
    char *b = malloc(big);
    for (size_t i = 0; i < big; i++) b[i] = (char)(i * 131);
    assert_int_equal(dsc_store_set(s, "big", b, big), DSC_OK);
    assert_int_equal(dsc_store_get(s, "big", &v, &len), DSC_OK);
    assert_int_equal(len, big);
    assert_memory_equal(v, b, big);
    free(v);
    free(b);
    int64_t r = 0;
    assert_int_equal(dsc_store_add(s, "ctr", 5, &r), DSC_OK);
    assert_int_equal(r, 5);
    assert_int_equal(dsc_store_add(s, "ctr", -7, &r), DSC_OK);
    assert_int_equal(r, -2);
    assert_int_equal(dsc_store_add(s, "k1", 1, &r), DSC_ERR_INVALID_ARG); // not a counter
    bool present = false, existed = false;
    assert_int_equal(dsc_store_check(s, "ctr", &present), DSC_OK);
    assert_true(present);
    assert_int_equal(dsc_store_delete(s, "ctr", &existed), DSC_OK);
    assert_true(existed);
    assert_int_equal(dsc_store_delete(s, "ctr", &existed), DSC_OK);
    assert_false(existed);
    assert_int_equal(dsc_store_check(s, "ctr", &present), DSC_OK);
    assert_false(present);
    const char *keys[] = {"k1", "empty", "big"};
    assert_int_equal(dsc_store_wait(s, keys, 3), DSC_OK);
    // a key never set: the deadline, not a hang
    dsc_store_set_timeout(s, 0.3);
    double t0 = dsc_now();
    assert_int_equal(dsc_store_get(s, "never", &v, &len), DSC_ERR_TIMEOUT);
    assert_true(dsc_now() - t0 < 1.0);
    assert_non_null(strstr(dsc_last_error(), "'never'"));
    const char *keys2[] = {"k1", "never"};
    assert_int_equal(dsc_store_wait(s, keys2, 2), DSC_ERR_TIMEOUT);
    // the connection was re-established after the timeout
    assert_int_equal(dsc_store_check(s, "k1", &present), DSC_OK);
    assert_true(present);
    char longkey[DSC_STORE_KEY_MAX + 2];
    memset(longkey, 'x', sizeof longkey - 1);
    longkey[sizeof longkey - 1] = '\0';
    assert_int_equal(dsc_store_set(s, longkey, "v", 1), DSC_ERR_INVALID_ARG);
    dsc_store_destroy(s);
    dsc_store_destroy(NULL);
}

// A get waits for another process's set; counters are atomic across processes.
static void test_across_processes(void **state) {
    int port = free_port();
    enum { NCHILD = 4, ADDS = 200 };
    pid_t pids[NCHILD];
    for (int k = 0; k < NCHILD; k++) {
        pids[k] = fork();
        if (pids[k] == 0) {
            dsc_store *c = NULL;
            if (dsc_store_create(&c, "127.0.0.1", port, false, 10.0) != DSC_OK) _exit(1);
            for (int i = 0; i < ADDS; i++)
                if (dsc_store_add(c, "hits", 1, NULL) != DSC_OK) _exit(2);
            if (k == 0) {
                nap(0.2);
                if (dsc_store_set(c, "late", "here", 4) != DSC_OK) _exit(3);
            }
            int64_t n = 0;
            if (dsc_store_add(c, "finished", 1, &n) != DSC_OK) _exit(4);
            dsc_store_destroy(c);
            _exit(0);
        }
    }
    nap(0.1); // the children are already retrying their connection
    dsc_store *s = NULL;
    assert_int_equal(dsc_store_create(&s, "127.0.0.1", port, true, 10.0), DSC_OK);
    void *v = NULL;
    size_t len = 0;
    double t0 = dsc_now();
    assert_int_equal(dsc_store_get(s, "late", &v, &len), DSC_OK);
    assert_true(dsc_now() - t0 > 0.05);
    assert_string_equal(v, "here");
    free(v);
    for (int k = 0; k < NCHILD; k++) assert_int_equal(reap(pids[k], 20), 0);
    int64_t hits = 0;
    assert_int_equal(dsc_store_add(s, "hits", 0, &hits), DSC_OK);
    assert_int_equal(hits, NCHILD * ADDS);
    dsc_store_destroy(s);
}

// No server at all: create gives up at its deadline.
static void test_no_server(void **state) {
    dsc_store *s = NULL;
    double t0 = dsc_now();
    assert_int_equal(dsc_store_create(&s, "127.0.0.1", free_port(), false, 0.5), DSC_ERR_TIMEOUT);
    double dt = dsc_now() - t0;
    assert_true(dt >= 0.4 && dt < 1.5);
    assert_non_null(strstr(dsc_last_error(), "MASTER_ADDR"));
    assert_int_equal(dsc_store_create(&s, "no-such-host.invalid", 1234, false, 0.5),
                     DSC_ERR_CONFIG);
}

// The process hosting the server exits: a waiting client learns it at once (DSC_ERR_PEER), and
// the next call fails at its deadline instead of hanging.
static void test_server_gone(void **state) {
    int port = free_port();
    int up[2], down[2]; // child -> parent "ready", parent -> child "exit now"
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dsc_store *s = NULL;
        if (dsc_store_create(&s, "127.0.0.1", port, true, 5.0) != DSC_OK) _exit(1);
        char go;
        if (write(up[1], "r", 1) != 1 || read(down[0], &go, 1) != 1) _exit(2);
        _exit(0); // without destroying: the server vanishes with the process
    }
    char ready;
    assert_int_equal(read(up[0], &ready, 1), 1);
    dsc_store *c = NULL;
    assert_int_equal(dsc_store_create(&c, "127.0.0.1", port, false, 5.0), DSC_OK);
    assert_int_equal(dsc_store_set(c, "a", "1", 1), DSC_OK);
    assert_int_equal(write(down[1], "x", 1), 1);
    double t0 = dsc_now();
    void *v = NULL;
    size_t len;
    assert_int_equal(dsc_store_get(c, "never", &v, &len), DSC_ERR_PEER);
    assert_true(dsc_now() - t0 < 2.0);
    assert_non_null(strstr(dsc_last_error(), "closed the connection"));
    assert_int_equal(reap(pid, 10), 0);
    dsc_store_set_timeout(c, 0.3);
    t0 = dsc_now();
    assert_int_equal(dsc_store_set(c, "b", "1", 1), DSC_ERR_TIMEOUT);
    assert_true(dsc_now() - t0 < 1.5);
    dsc_store_destroy(c);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
}

// A client that speaks garbage is dropped; the others are still served.
static void test_garbage_client(void **state) {
    dsc_store *s = NULL;
    assert_int_equal(dsc_store_create(&s, "127.0.0.1", 0, true, 5.0), DSC_OK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)dsc_store_port(s)),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    const char junk[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_true(write(fd, junk, sizeof junk) > 0);
    char buf[16];
    assert_true(read(fd, buf, sizeof buf) <= 0); // dropped
    close(fd);
    assert_int_equal(dsc_store_set(s, "still", "ok", 2), DSC_OK);
    bool present = false;
    assert_int_equal(dsc_store_check(s, "still", &present), DSC_OK);
    assert_true(present);
    dsc_store_destroy(s);
}

int main(void) {
    alarm(120);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_across_processes), // forks first: no threads exist yet
        cmocka_unit_test(test_server_gone),
        cmocka_unit_test(test_operations),
        cmocka_unit_test(test_no_server),
        cmocka_unit_test(test_garbage_client),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
