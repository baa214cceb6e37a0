// base/time.h - monotonic clock.
#ifndef DSC_BASE_TIME_H
#define DSC_BASE_TIME_H
#include <stdint.h>

// Seconds on the monotonic clock (arbitrary origin).
double dsc_now(void);
// Nanoseconds on the monotonic clock.
uint64_t dsc_now_ns(void);
// Seconds since the Unix epoch (wall clock), for logs and manifests.
double dsc_wall_time(void);

#endif
