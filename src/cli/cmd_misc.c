// cli/cmd_misc.c - verbs that are not built yet say so.
#include <stdbool.h> // bool
#include <stdio.h>  // fprintf
#include <string.h> // strcmp

#include "cli/commands.h" // cmd_not_built

int cmd_not_built(const char *verb, int argc, char **argv) {
    bool help = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"));
    fprintf(help ? stdout : stderr,
            "dsc %s: not built in this version of dsc yet (see docs/cli.md for what each verb "
            "will do); nothing was done\n", verb);
    return help ? 0 : 3;
}
