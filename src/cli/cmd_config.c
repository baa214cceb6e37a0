// cli/cmd_config.c - `dsc config check FILE [--world-size N] [--json] [--model SPEC ...]`,
// `dsc config keys`.
#include <jansson.h> // json_* (memory_plan added to the --json object)
#include <stdbool.h> // bool
#include <stdint.h>  // INT32_MAX
#include <stdio.h>   // printf, fprintf, open_memstream
#include <stdlib.h>  // free
#include <string.h>  // strcmp

#include "cli/args.h"     // cli_parse
#include "cli/commands.h" // cmd_config
#include "cli/lora.h"     // cli_lora
#include "cli/plan.h"     // cli_memory_plan
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

// --model SPEC: the memory plan of a run of that model with this config (dsc/memplan.h).
typedef struct plan_flags {
    const char *model, *device, *seq, *vocab;
} plan_flags;

static dsc_status make_plan(const plan_flags *f, const dsc_config *cfg, int world,
                            dsc_memplan *plan) {
    long long T = 64, V = 0; // dsc train's default --seq-len; the family's vocabulary
    if (f->seq && !cli_int("--seq-len", f->seq, 1, 1 << 20, &T))
        return dsc_fail(DSC_ERR_INVALID_ARG, "--seq-len %s: give a whole number of tokens",
                        f->seq);
    if (f->vocab && !cli_int("--vocab-size", f->vocab, 1, INT32_MAX, &V))
        return dsc_fail(DSC_ERR_INVALID_ARG, "--vocab-size %s: give a whole number", f->vocab);
    bool cuda = f->device && !strcmp(f->device, "cuda");
    if (f->device && !cuda && strcmp(f->device, "cpu"))
        return dsc_fail(DSC_ERR_INVALID_ARG, "--device %s: give cpu or cuda", f->device);
    DSC_TRY(cli_plan_device_ok(cfg, cuda, world));
    dsc_model *m;
    dsc_model_opts mo = {.vocab_size = (int)V, .max_seq_len = (int)T};
    DSC_TRY(dsc_model_create(&m, f->model, &mo));
    dsc_status st = cli_activation_checkpointing(m, cfg, cuda, NULL);
    if (st == DSC_OK) st = cli_fp8(m, cfg, cuda);
    if (st == DSC_OK) st = cli_lora(m, cfg, cuda, NULL, 0); // a frozen base costs only its weights
    if (st != DSC_OK) {
        dsc_model_destroy(m);
        return st;
    }
    cli_plan_opts po = {.model = m, .cfg = cfg, .world = world, .seq_len = (int)T,
                        .device = cuda, // a LoRA run initialises in place (dsc train)
                        .init_in_place = dsc_model_lora_of(m) != NULL,
                        .checkpoints = dsc__train_ckpt_key(cfg) != NULL};
    st = cli_memory_plan(&po, false, plan);
    dsc_model_destroy(m);
    return st;
}

// The resolved config as JSON with "memory_plan" added (the config's own printer writes the
// object; it is read back and extended here).
static int print_json_with_plan(const dsc_config *cfg, const dsc_memplan *plan) {
    char *text = NULL, *ptext = dsc_memplan_json(plan);
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem || !ptext) return 1;
    dsc_config_print(cfg, mem, true);
    fclose(mem);
    json_error_t e;
    json_t *root = json_loads(text, 0, &e), *pj = json_loads(ptext, 0, &e);
    free(text);
    free(ptext);
    if (!root || !pj) return 1;
    json_object_set_new(root, "memory_plan", pj);
    json_dumpf(root, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    fputc('\n', stdout);
    json_decref(root);
    return 0;
}

static int config_check(int argc, char **argv) {
    const char *world = NULL;
    bool json = false;
    plan_flags pf = {0};
    const cli_flag flags[] = {
        {"--world-size", "N", "ranks to resolve the batch sizes for (default 1)", &world, NULL},
        {"--json", NULL, "print the resolved values as one nested JSON object", NULL, &json},
        {"--model", "SPEC", "also print the memory plan of training this model (per rank)",
         &pf.model, NULL},
        {"--device", "DEV", "with --model: cpu (default) or cuda", &pf.device, NULL},
        {"--seq-len", "T", "with --model: tokens per sample (default 64, as dsc train)", &pf.seq,
         NULL},
        {"--vocab-size", "V", "with --model: the data's vocabulary for a dN shape", &pf.vocab,
         NULL},
    };
    const cli_verb v = {"config check", "dsc config check FILE [--world-size N] [--json] "
                        "[--model SPEC [--device cuda] [--seq-len T]]",
                        "Validate a DeepSpeed config: print every resolved value (defaults filled "
                        "in, batch sizes derived) and every warning; exit 1 on an error. With "
                        "--model, also the memory plan of a run (host and device bytes per rank "
                        "by category, against this machine's memory).",
                        flags, 6, 1, 1};
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
    dsc_memplan plan;
    if (pf.model && make_plan(&pf, &cfg, (int)ws, &plan) != DSC_OK) {
        fprintf(stderr, "error: %s\n", dsc_last_error());
        return 1;
    }
    if (json && pf.model) return print_json_with_plan(&cfg, &plan);
    dsc_config_print(&cfg, stdout, json);
    if (!json)
        printf("# %s: valid for world size %lld; %d warning%s\n", pos[0], ws, nwarn,
               nwarn == 1 ? "" : "s");
    if (!json) note_checkpoints(&cfg);
    if (pf.model) dsc_memplan_print(&plan, stdout, "# ");
    return 0;
}

// `dsc config keys` takes no flags and no arguments: anything after it is a usage error (exit 2),
// not silently ignored.
static int config_keys(int argc, char **argv) {
    const cli_verb v = {"config keys", "dsc config keys",
                        "Print every key dsc reads (path, type, default, range, meaning) as a "
                        "markdown table: the key list of docs/config.md.",
                        NULL, 0, 0, 0};
    char *pos[1];
    int npos;
    int rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    dsc_config_write_doc(stdout);
    return 0;
}

int cmd_config(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "check")) return config_check(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "keys")) return config_keys(argc - 1, argv + 1);
    bool help = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"));
    fprintf(help ? stdout : stderr,
            "usage: dsc config check FILE [--world-size N] [--json] [--model SPEC [--device cuda] "
            "[--seq-len T]]\n"
            "       dsc config keys      (every key dsc reads, as a markdown table)\n");
    return help ? 0 : 2;
}
