// base/time.h - clocks. The monotonic clock in seconds and the wall clock are public
// (dsc/base.h: dsc_now, dsc_wall_time).
#ifndef DSC_BASE_TIME_H
#define DSC_BASE_TIME_H
#include <stdint.h>

#include "dsc/base.h" // dsc_now, dsc_wall_time

// Nanoseconds on the monotonic clock (dsc_now's).
uint64_t dsc_now_ns(void);

#endif
