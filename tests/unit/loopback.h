// tests/unit/loopback.h - what the tests that start ranks as processes on this host share: a free
// TCP port on loopback for their store, and a sleep in seconds.
#ifndef DSC_TESTS_LOOPBACK_H
#define DSC_TESTS_LOOPBACK_H

#include <netinet/in.h> // sockaddr_in, htonl, htons
#include <stdio.h>      // fopen, fscanf
#include <sys/socket.h> // socket, bind, setsockopt
#include <time.h>       // nanosleep, time
#include <unistd.h>     // close, getpid

// A port nobody holds now, drawn below the kernel's ephemeral range: a port the kernel hands out
// may be taken, before the store binds it, by the local end of another test's connection.
static inline int free_port(void) {
    int lo = 32768;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f) {
        if (fscanf(f, "%d", &lo) != 1) lo = 32768;
        fclose(f);
    }
    if (lo <= 10001) lo = 10001;
    static unsigned seed; // advances between calls: two ports of one test differ
    if (!seed) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL) ^ 1u;
    for (int tries = 0; tries < 200; tries++) {
        seed = seed * 1103515245u + 12345u;
        int port = 10000 + (int)((seed >> 8) % (unsigned)(lo - 10000));
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) return port;
    }
    return 0;
}

static inline void nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

#endif
