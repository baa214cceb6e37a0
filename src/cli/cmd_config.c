// cli/cmd_config.c - `dsc config check FILE [--world-size N] [--json]`, `dsc config keys`.
#include <stdbool.h> // bool
#include <stdio.h>  // printf, fprintf
#include <string.h> // strcmp

#include "cli/args.h"     // cli_parse
#include "cli/commands.h" // cmd_config
#include "cli/train.h"    // dsc__train_ckpt_key
#include "dsc/config.h"   // dsc_config_*, dsc_config_write_doc
#include "dsc/monitor.h"  // dsc_monitor_check_config

static void print_warning(void *user, const char *msg) {
    int *count = user;
    (*count)++;
    fprintf(stderr, "warning: %s\n", msg);
}

// Keys that ask for checkpoints do nothing without a place to write them: say where they go.
static void note_checkpoints(const dsc_config *cfg) {
    const char *key = dsc__train_ckpt_key(cfg);
    if (key)
        printf("# note: %s asks for checkpoints: dsc train writes them into --save-dir DIR, else "
               "into RUN_DIR/checkpoints of --out RUN_DIR, and refuses to start without either\n",
               key);
}

static int config_check(int argc, char **argv) {
    const char *world = NULL;
    bool json = false;
    const cli_flag flags[] = {
        {"--world-size", "N", "ranks to resolve the batch sizes for (default 1)", &world, NULL},
        {"--json", NULL, "print the resolved values as one nested JSON object", NULL, &json},
    };
    const cli_verb v = {"config check", "dsc config check FILE [--world-size N] [--json]",
                        "Validate a DeepSpeed config: print every resolved value (defaults filled "
                        "in, batch sizes derived) and every warning; exit 1 on an error.",
                        flags, 2, 1, 1};
    char *pos[1];
    int npos;
    int rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    long long ws = 1;
    if (world && !cli_int("--world-size", world, 1, 1 << 24, &ws)) return 2;
    dsc_config cfg;
    int nwarn = 0;
    // the monitor's paths and port too: a run would otherwise stop on them only at its start
    if (dsc_config_load_file(&cfg, pos[0], (int)ws, print_warning, &nwarn) != DSC_OK ||
        dsc_monitor_check_config(&cfg, print_warning, &nwarn) != DSC_OK) {
        fprintf(stderr, "error: %s\n", dsc_last_error());
        return 1;
    }
    dsc_config_print(&cfg, stdout, json);
    if (!json)
        printf("# %s: valid for world size %lld; %d warning%s\n", pos[0], ws, nwarn,
               nwarn == 1 ? "" : "s");
    if (!json) note_checkpoints(&cfg);
    return 0;
}

int cmd_config(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "check")) return config_check(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "keys")) {
        dsc_config_write_doc(stdout);
        return 0;
    }
    bool help = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"));
    fprintf(help ? stdout : stderr,
            "usage: dsc config check FILE [--world-size N] [--json]\n"
            "       dsc config keys      (every key dsc reads, as a markdown table)\n");
    return help ? 0 : 2;
}
