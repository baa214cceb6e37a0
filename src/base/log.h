// base/log.h - leveled logging with a rank prefix, configured from DSC_LOG / DSC_LOG_SUBSYS.
#ifndef DSC_BASE_LOG_H
#define DSC_BASE_LOG_H

#include <stdbool.h>

typedef enum dsc_log_level {
    DSC_LOG_ERROR = 0,
    DSC_LOG_WARN = 1,
    DSC_LOG_INFO = 2,
    DSC_LOG_DEBUG = 3,
} dsc_log_level;

// True when a message of this level and subsystem would be printed; checked before formatting.
bool dsc__log_enabled(dsc_log_level level, const char *subsys);
void dsc__log(dsc_log_level level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

// The rank printed in every line ("[rank 3]"); -1 (the default) prints no rank.
void dsc_log_set_rank(int rank);
// Override DSC_LOG (tests, --quiet); level < 0 re-reads the environment.
void dsc_log_set_level(int level);

#define DSC_LOG_AT(level, subsys, ...)                                                         \
    do {                                                                                       \
        if (dsc__log_enabled(level, subsys)) dsc__log(level, subsys, __VA_ARGS__);             \
    } while (0)
#define DSC_ERROR(subsys, ...) DSC_LOG_AT(DSC_LOG_ERROR, subsys, __VA_ARGS__)
#define DSC_WARN(subsys, ...) DSC_LOG_AT(DSC_LOG_WARN, subsys, __VA_ARGS__)
#define DSC_INFO(subsys, ...) DSC_LOG_AT(DSC_LOG_INFO, subsys, __VA_ARGS__)
#define DSC_DEBUG(subsys, ...) DSC_LOG_AT(DSC_LOG_DEBUG, subsys, __VA_ARGS__)

#endif
