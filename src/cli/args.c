// cli/args.c - flag parsing.
#include "cli/args.h"

#include <errno.h>  // errno
#include <stdio.h>  // fprintf
#include <stdlib.h> // strtoll, strtod
#include <string.h> // strcmp, strncmp, strchr

void cli_print_help(const cli_verb *v) {
    printf("usage: %s\n\n%s\n", v->usage, v->about);
    if (v->nflags) printf("\nflags:\n");
    for (int i = 0; i < v->nflags; i++) {
        const cli_flag *f = &v->flags[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", f->name, f->metavar ? " " : "",
                 f->metavar ? f->metavar : "");
        printf("  %-26s %s\n", left, f->help);
    }
    printf("  %-26s %s\n", "--help", "show this help");
}

static const cli_flag *find_flag(const cli_verb *v, const char *name, size_t len) {
    for (int i = 0; i < v->nflags; i++)
        if (strlen(v->flags[i].name) == len && !strncmp(v->flags[i].name, name, len))
            return &v->flags[i];
    return NULL;
}

int cli_parse(const cli_verb *v, int argc, char **argv, int *npos, char **pos) {
    int n = 0;
    bool flags_done = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (flags_done || a[0] != '-' || !strcmp(a, "-")) {
            if (v->max_pos >= 0 && n >= v->max_pos) {
                fprintf(stderr, "dsc %s: unexpected argument '%s'; see dsc %s --help\n", v->name,
                        a, v->name);
                return 2;
            }
            pos[n++] = argv[i];
            continue;
        }
        if (!strcmp(a, "--")) {
            flags_done = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            cli_print_help(v);
            return 1;
        }
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cli_flag *f = find_flag(v, a, len);
        if (!f && len == 12 && !strncmp(a, "--local_rank", len)) {
            // dsc launch (as DeepSpeed's launcher) appends --local_rank=N; the rank's LOCAL_RANK
            // is in its environment, so every verb takes the flag and ignores it.
            if (!eq && i + 1 < argc && argv[i + 1][0] != '-') i++;
            continue;
        }
        if (!f) {
            fprintf(stderr, "dsc %s: unknown flag '%.*s'; see dsc %s --help\n", v->name, (int)len,
                    a, v->name);
            return 2;
        }
        if (!f->metavar) {
            if (eq) {
                fprintf(stderr, "dsc %s: flag %s takes no value\n", v->name, f->name);
                return 2;
            }
            *f->on = true;
            continue;
        }
        if (f->metavar[0] == '[') { // optional value: --flag, --flag=VALUE, --flag VALUE
            if (f->on) *f->on = true;
            if (eq) *f->value = eq + 1;
            else if (i + 1 < argc && argv[i + 1][0] != '-') *f->value = argv[++i];
            else *f->value = "";
        } else if (eq) {
            *f->value = eq + 1;
        } else if (i + 1 < argc) {
            *f->value = argv[++i];
        } else {
            fprintf(stderr, "dsc %s: flag %s needs a value (%s)\n", v->name, f->name, f->metavar);
            return 2;
        }
    }
    if (n < v->min_pos) {
        fprintf(stderr, "dsc %s: missing argument; usage: %s\n", v->name, v->usage);
        return 2;
    }
    *npos = n;
    return 0;
}

bool cli_int(const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi) {
        fprintf(stderr, "dsc: %s %s: expected a whole number in %lld..%lld\n", flag, s, lo, hi);
        return false;
    }
    *out = x;
    return true;
}

bool cli_double(const char *flag, const char *s, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end) {
        fprintf(stderr, "dsc: %s %s: expected a number\n", flag, s);
        return false;
    }
    *out = x;
    return true;
}
