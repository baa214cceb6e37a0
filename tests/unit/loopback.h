// tests/unit/loopback.h - what the tests that start ranks as processes on this host share: a free
// TCP port on loopback for their store, and a sleep in seconds.
#ifndef DSC_TESTS_LOOPBACK_H
#define DSC_TESTS_LOOPBACK_H

#include <netinet/in.h> // sockaddr_in, htonl, ntohs
#include <sys/socket.h> // socket, bind, getsockname
#include <time.h>       // nanosleep
#include <unistd.h>     // close

static inline int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    close(fd);
    return ntohs(a.sin_port);
}

static inline void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

#endif
