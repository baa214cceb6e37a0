// cli/args.h - flag parsing shared by the verbs: --name VALUE, --name=VALUE, --switch.
#ifndef DSC_CLI_ARGS_H
#define DSC_CLI_ARGS_H

#include <stdbool.h> // bool

typedef struct cli_flag {
    const char *name;    // "--config"
    const char *metavar; // NULL for a switch (no value); "[NAME]": the value is optional ("" when
                         // absent; on, when set, becomes true either way)
    const char *help;
    const char **value;  // where a value flag stores its argument (borrowed from argv)
    bool *on;            // where a switch stores true
} cli_flag;

typedef struct cli_verb {
    const char *name;  // "train"
    const char *usage; // "dsc train [flags]"
    const char *about; // one paragraph
    const cli_flag *flags;
    int nflags;
    int min_pos, max_pos; // positional arguments allowed (max -1 = any)
} cli_verb;

// Parse argv (after the verb). Returns 0 when the caller should run, 1 when --help was printed
// (exit 0), 2 on a usage error (message printed; exit 2). Positional arguments are returned in
// pos (borrowed from argv); a lone "--" ends flags. --local_rank[=]N, which dsc launch appends as
// DeepSpeed's launcher does, is accepted and ignored by every verb that does not define it.
int cli_parse(const cli_verb *v, int argc, char **argv, int *npos, char **pos);

void cli_print_help(const cli_verb *v);

// Parse an integer / number flag value; print an error naming the flag and return false if bad.
bool cli_int(const char *flag, const char *s, long long lo, long long hi, long long *out);
bool cli_double(const char *flag, const char *s, double *out);

#endif
