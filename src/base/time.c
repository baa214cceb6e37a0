// base/time.c - clocks.
#include "base/time.h"

#include <time.h> // clock_gettime

uint64_t dsc_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double dsc_now(void) { return (double)dsc_now_ns() * 1e-9; }

double dsc_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
