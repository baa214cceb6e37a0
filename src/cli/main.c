// cli/main.c - `dsc <verb>`: dispatch to the verbs.
#include <stdio.h>  // printf
#include <string.h> // strcmp

#include "cli/commands.h" // cmd_*
#include "dsc_build_info.h" // DSC_VERSION_STRING

typedef struct verb {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *about;
} verb;

static const verb verbs[] = {
    {"train", cmd_train, "train a model (GPT-2, Llama family)"},
    {"launch", cmd_launch, "start one process per rank (local, hostfile, SLURM, mpirun)"},
    {"data", cmd_data, "prepare token shards from text"},
    {"ckpt", cmd_ckpt, "list, inspect, verify and export checkpoints"},
    {"generate", cmd_generate, "generate text from a checkpoint or weights"},
    {"config", cmd_config, "check a DeepSpeed config and print the resolved values"},
    {"report", cmd_report, "show version, build features and devices (like ds_report)"},
    {"plot", cmd_plot, "draw training curves of runs (SVG or PNG)"},
    {"bench", cmd_bench, "communication benchmarks over the comm backends (like ds_bench)"},
};
#define NVERBS ((int)(sizeof verbs / sizeof verbs[0]))

static void usage(FILE *f) {
    fprintf(f, "dsc %s - DeepSpeed's training runtime in C\n\nusage: dsc <verb> [flags]   "
            "(dsc <verb> --help for its flags)\n\nverbs:\n", DSC_VERSION_STRING);
    for (int i = 0; i < NVERBS; i++) fprintf(f, "  %-10s %s\n", verbs[i].name, verbs[i].about);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *name = argv[1];
    if (!strcmp(name, "--help") || !strcmp(name, "-h") || !strcmp(name, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(name, "--version")) {
        printf("dsc %s\n", DSC_VERSION_STRING);
        return 0;
    }
    for (int i = 0; i < NVERBS; i++)
        if (!strcmp(name, verbs[i].name)) return verbs[i].run(argc - 2, argv + 2);
    fprintf(stderr, "dsc: unknown verb '%s'; run dsc --help for the list\n", name);
    return 2;
}
