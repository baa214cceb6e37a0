// monitor/util.c - helpers shared by the sinks: Python-style float text, host memory.
#include <errno.h>    // errno
#include <float.h>    // DBL_MIN
#include <math.h>     // isnan, isinf
#include <stdio.h>    // snprintf, fopen, fgets, sscanf
#include <stdlib.h>   // strtod
#include <string.h>   // strlen, strncmp, strerror
#include <unistd.h>   // sysconf

#include "base/status.h"  // dsc__fail
#include "monitor/sink.h" // dsc__fmt_pyfloat, dsc__host_mem

// ---- Python's float repr ----

// Shortest %e text that reads back to v: digits (no dot) and the decimal exponent.
// Any decimal of at most 15 digits survives a trip through a double (DBL_DIG), so when v's
// shortest form has k <= 15 digits, v rounded to 15 digits is that form padded with zeros: one
// try at 15 digits settles all of those, and 16 or 17 digits the rest (17 always reads back).
// Subnormals carry fewer digits, so for them every precision is tried from 1.
static void shortest_digits(double v, char *digits, int *ndigits, int *exp10) {
    char text[40];
    for (int prec = v < DBL_MIN ? 1 : 15; prec <= 17; prec++) {
        snprintf(text, sizeof text, "%.*e", prec - 1, v);
        if (strtod(text, NULL) == v) break;
    }
    // text is "d.ddde[+-]XX" (v > 0 here)
    int n = 0;
    const char *p = text;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[n++] = *p;
    while (n > 1 && digits[n - 1] == '0') n--;
    digits[n] = '\0';
    *ndigits = n;
    *exp10 = (int)strtol(p + 1, NULL, 10);
}

// Python switches to exponent notation when the decimal point would sit more than 4 places
// before the first digit or more than 16 places after it (float_repr_style 'short').
int dsc__fmt_pyfloat(char *buf, size_t cap, double v) {
    if (isnan(v)) return snprintf(buf, cap, "nan");
    if (isinf(v)) return snprintf(buf, cap, v < 0 ? "-inf" : "inf");
    const char *sign = signbit(v) ? "-" : "";
    if (v == 0) return snprintf(buf, cap, "%s0.0", sign);
    char d[24];
    int n, e;
    shortest_digits(fabs(v), d, &n, &e);
    int decpt = e + 1; // the value is 0.d[0..n) times 10^decpt
    if (decpt > -4 && decpt <= 16) {
        char zeros[20] = "0000000000000000000"; // enough for decpt in (-4, 16]
        if (decpt <= 0) return snprintf(buf, cap, "%s0.%.*s%s", sign, -decpt, zeros, d);
        if (decpt >= n) return snprintf(buf, cap, "%s%s%.*s.0", sign, d, decpt - n, zeros);
        return snprintf(buf, cap, "%s%.*s.%s", sign, decpt, d, d + decpt);
    }
    char exp[16];
    snprintf(exp, sizeof exp, "e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
    if (n == 1) return snprintf(buf, cap, "%s%s%s", sign, d, exp);
    return snprintf(buf, cap, "%s%c.%s%s", sign, d[0], d + 1, exp);
}

// ---- host memory ----

dsc_status dsc__host_mem(double *used_fraction, double *rss_bytes) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return dsc__fail(DSC_ERR_SYSTEM, "cannot read /proc/meminfo: %s", strerror(errno));
    char line[256];
    double total = 0, avail = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long long kib;
        if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) total = (double)kib * 1024;
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) avail = (double)kib * 1024;
    }
    fclose(f);
    if (total <= 0 || avail < 0)
        return dsc__fail(DSC_ERR_SYSTEM, "/proc/meminfo lacks MemTotal or MemAvailable");
    *used_fraction = (total - avail) / total;
    f = fopen("/proc/self/statm", "r");
    if (!f) return dsc__fail(DSC_ERR_SYSTEM, "cannot read /proc/self/statm: %s", strerror(errno));
    unsigned long long size_pages, rss_pages;
    int got = fscanf(f, "%llu %llu", &size_pages, &rss_pages);
    fclose(f);
    if (got != 2) return dsc__fail(DSC_ERR_SYSTEM, "/proc/self/statm: unexpected format");
    *rss_bytes = (double)rss_pages * (double)sysconf(_SC_PAGESIZE);
    return DSC_OK;
}
