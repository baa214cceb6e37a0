// base/log.c - leveled logging. DSC_LOG=error|warn|info|debug (default warn),
// DSC_LOG_SUBSYS=comm,zero,... limits info/debug lines to those subsystems.
#include "base/log.h"

#include <pthread.h> // pthread_once
#include <stdarg.h>  // va_list
#include <stdio.h>   // fprintf
#include <stdlib.h>  // getenv
#include <string.h>  // strstr, strlen

#include "base/env.h" // dsc__env, DSC_ENV_*

static int log_level = -1;
static char log_subsys[256];
static int log_rank = -1;
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

static void log_read_env(void) {
    const char *lv = dsc__env(DSC_ENV_LOG);
    int level = DSC_LOG_WARN;
    if (lv) {
        if (!strcmp(lv, "error")) level = DSC_LOG_ERROR;
        else if (!strcmp(lv, "warn")) level = DSC_LOG_WARN;
        else if (!strcmp(lv, "info")) level = DSC_LOG_INFO;
        else if (!strcmp(lv, "debug")) level = DSC_LOG_DEBUG;
    }
    if (log_level < 0) log_level = level;
    const char *ss = dsc__env(DSC_ENV_LOG_SUBSYS);
    if (ss) snprintf(log_subsys, sizeof log_subsys, ",%s,", ss);
}

void dsc_log_set_rank(int rank) { log_rank = rank; }

void dsc_log_set_level(int level) {
    pthread_once(&log_once, log_read_env);
    if (level < 0) {
        log_level = -1;
        log_read_env();
    } else {
        log_level = level;
    }
}

bool dsc__log_enabled(dsc_log_level level, const char *subsys) {
    pthread_once(&log_once, log_read_env);
    if ((int)level > log_level) return false;
    if (level <= DSC_LOG_WARN || !log_subsys[0] || !subsys) return true;
    char key[64];
    snprintf(key, sizeof key, ",%s,", subsys);
    return strstr(log_subsys, key) != NULL;
}

void dsc__log(dsc_log_level level, const char *subsys, const char *fmt, ...) {
    static const char *names[] = {"error", "warning", "info", "debug"};
    char line[2048];
    int n = 0;
    if (log_rank >= 0) n = snprintf(line, sizeof line, "[rank %d] ", log_rank);
    n += snprintf(line + n, sizeof line - n, "dsc %s", names[level]);
    if (subsys) n += snprintf(line + n, sizeof line - n, " (%s)", subsys);
    n += snprintf(line + n, sizeof line - n, ": ");
    va_list ap;
    va_start(ap, fmt);
    if (n < (int)sizeof line) vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line); // one write per line so ranks' lines do not interleave
}
