// cli/cmd_ckpt.c - `dsc ckpt ls|info|verify|export`: look after checkpoint directories.
#include <errno.h>    // errno
#include <stdint.h>   // uint64_t
#include <stdio.h>    // printf, fprintf
#include <stdlib.h>   // free, strtod
#include <string.h>   // strcmp, strerror, strrchr
#include <sys/stat.h> // stat
#include <time.h>     // localtime, strftime

#include "cli/args.h"       // cli_parse
#include "cli/ckpt_lora.h"  // cli_export_peft, cli_export_merged, cli_ckpt_is_lora
#include "dsc/base.h"       // dsc_mkdirs, dsc_now
#include "dsc/checkpoint.h" // dsc_ckpt_*

static const char *state_name(dsc_ckpt_state s) {
    return s == DSC_CKPT_COMPLETE    ? "complete"
           : s == DSC_CKPT_BAD       ? "BAD"
           : s == DSC_CKPT_DEEPSPEED ? "deepspeed"
                                     : "partial";
}

static void print_size(char *out, size_t cap, double bytes) {
    if (bytes >= 1 << 30) snprintf(out, cap, "%.2f GiB", bytes / (1 << 30));
    else if (bytes >= 1 << 20) snprintf(out, cap, "%.2f MiB", bytes / (1 << 20));
    else snprintf(out, cap, "%.1f KiB", bytes / 1024);
}

// A DeepSpeed checkpoint keeps no checksums: verifying it is reading every file (archive,
// pickle, tensor bounds) and checking the partitions against the parameter shapes.
static bool verify_deepspeed(const char *dir, const char *tag) {
    double t0 = dsc_now();
    dsc_ds_ckpt *ds;
    if (dsc_ds_ckpt_open(&ds, dir, tag) != DSC_OK) {
        printf("%s: FAILED: %s\n", tag ? tag : "latest", dsc_last_error());
        return false;
    }
    dsc_ds_ckpt_info in;
    dsc_ds_ckpt_get_info(ds, &in);
    char size[32];
    print_size(size, sizeof size, (double)in.bytes);
    printf("%s: OK (DeepSpeed checkpoint, step %lld, %d files, %s, structure verified in %.2f s; "
           "DeepSpeed keeps no checksums)\n", in.tag, (long long)in.global_steps, in.nfiles, size,
           dsc_now() - t0);
    dsc_ds_ckpt_close(ds);
    return true;
}

// Verify one tag and print one line; true when it verifies.
static bool verify_one(const char *dir, const char *tag) {
    if (dsc_ds_ckpt_detect(dir, tag)) return verify_deepspeed(dir, tag);
    double t0 = dsc_now();
    dsc_ckpt *ck;
    if (dsc_ckpt_open(&ck, dir, tag) != DSC_OK) {
        printf("%s: FAILED: %s\n", tag ? tag : "latest", dsc_last_error());
        return false;
    }
    dsc_ckpt_info info;
    dsc_ckpt_get_info(ck, &info);
    char size[32];
    print_size(size, sizeof size, (double)info.bytes);
    printf("%s: OK (step %lld, %d shard%s, %s, checksums verified in %.2f s)\n", info.tag,
           (long long)info.step, info.nfiles, info.nfiles == 1 ? "" : "s", size, dsc_now() - t0);
    dsc_ckpt_close(ck);
    return true;
}

static int ckpt_ls(int argc, char **argv) {
    bool verify = false;
    const cli_flag flags[] = {{"--verify", NULL, "also verify every complete checkpoint", NULL, &verify}};
    const cli_verb v = {"ckpt ls", "dsc ckpt ls DIR [--verify]",
                        "List the checkpoints in a save directory, newest first.", flags, 1, 1, 1};
    char *pos[1];
    int npos, rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    // A directory that is not there is a mistake (a typo, the wrong machine), not an empty list.
    struct stat sb;
    if (stat(pos[0], &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "dsc ckpt ls: %s: %s; give the save directory (--save-dir of dsc train)\n",
                pos[0], stat(pos[0], &sb) != 0 ? strerror(errno) : "not a directory");
        return 1;
    }
    dsc_ckpt_entry *e;
    int n;
    if (dsc_ckpt_list(pos[0], &e, &n) != DSC_OK) {
        fprintf(stderr, "dsc ckpt ls: %s\n", dsc_last_error());
        return 1;
    }
    if (n == 0)
        printf("no checkpoints in %s (no folder there holds a manifest.json, a DeepSpeed "
               "checkpoint or an interrupted save)\n", pos[0]);
    else printf("%-32s %10s  %s\n", "TAG", "STEP", "STATE");
    bool all_ok = true;
    for (int i = 0; i < n; i++) {
        printf("%-32s %10lld  %s%s\n", e[i].name, (long long)e[i].step, state_name(e[i].state),
               e[i].latest ? "  <- latest" : "");
        if (verify && e[i].state == DSC_CKPT_COMPLETE) {
            printf("    ");
            all_ok &= verify_one(pos[0], e[i].name);
        }
    }
    free(e);
    return all_ok ? 0 : 1;
}

static int path_args(const char *path, char *dir, size_t dcap, char *tag, size_t tcap, bool *has) {
    if (dsc_ckpt_split_path(path, dir, dcap, tag, tcap, has) != DSC_OK) {
        fprintf(stderr, "dsc ckpt: %s\n", dsc_last_error());
        return 2;
    }
    return 0;
}

static void print_info(const dsc_ckpt *ck, const char *dir) {
    dsc_ckpt_info in;
    dsc_ckpt_get_info(ck, &in);
    char when[64], size[32];
    time_t t = (time_t)in.created;
    strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", localtime(&t));
    print_size(size, sizeof size, (double)in.bytes);
    int64_t elems = 0;
    for (int i = 0; i < in.nparams; i++) {
        dsc_ckpt_param p;
        dsc_ckpt_get_param(ck, i, &p);
        elems += p.numel;
    }
    printf("checkpoint %s/%s\n", dir, in.tag);
    printf("  step        %lld (applied %lld, skipped %lld), saved %s by dsc %s\n",
           (long long)in.step, (long long)in.applied_steps, (long long)in.skipped_steps, when,
           in.dsc_version);
    printf("  layout      world size %d, ZeRO stage %d, precision %s, loss scale %g\n",
           in.world_size, in.zero_stage, in.precision, in.loss_scale);
    printf("  optimizer   %s (moments:", in.optimizer);
    for (int k = 0; k < in.nmoments; k++) printf(" %s", in.moment_names[k]);
    printf(")\n  parameters  %d tensors, %.3fM elements, %d groups\n", in.nparams, elems / 1e6,
           in.ngroups);
    printf("  files       %d shard%s, %s, all checksums verified\n", in.nfiles,
           in.nfiles == 1 ? "" : "s", size);
    if (dsc_ckpt_num_attachments(ck) > 0) {
        printf("  attached   ");
        for (int i = 0; i < dsc_ckpt_num_attachments(ck); i++)
            printf(" %s", dsc_ckpt_attachment_name(ck, i));
        printf("\n");
    }
}

static int print_deepspeed(const char *dir, const char *tag) {
    dsc_ds_ckpt *ds;
    if (dsc_ds_ckpt_open(&ds, dir, tag) != DSC_OK) {
        fprintf(stderr, "dsc ckpt info: %s\n", dsc_last_error());
        return 1;
    }
    dsc_ds_ckpt_info in;
    dsc_ds_ckpt_get_info(ds, &in);
    char size[32];
    print_size(size, sizeof size, (double)in.bytes);
    const char *base = strrchr(dir, '/'); // DIR itself may be the tag's directory
    bool is_tag = !strcmp(base ? base + 1 : dir, in.tag);
    printf("DeepSpeed checkpoint %s%s%s (saved by DeepSpeed %s)\n", dir, is_tag ? "" : "/",
           is_tag ? "" : in.tag, in.ds_version);
    printf("  step        %lld (samples %lld, skipped %lld)\n", (long long)in.global_steps,
           (long long)in.global_samples, (long long)in.skipped_steps);
    printf("  layout      %sworld size %d, ZeRO stage %d, precision %s, loss scale %g\n",
           in.universal ? "universal (one file per tensor), saved at " : "", in.world_size,
           in.zero_stage, in.precision, in.loss_scale);
    printf("  parameters  %d tensors, %.3fM elements, %d groups\n", in.nparams,
           (double)in.numel / 1e6, in.ngroups);
    printf("  files       %d, %s, structure verified (DeepSpeed keeps no checksums)\n",
           in.nfiles, size);
    dsc_ds_ckpt_close(ds);
    return 0;
}

static int ckpt_info(int argc, char **argv) {
    bool json = false;
    const cli_flag flags[] = {{"--json", NULL, "print the manifest itself", NULL, &json}};
    const cli_verb v = {"ckpt info", "dsc ckpt info DIR[/TAG] [--json]",
                        "Show a checkpoint's manifest (DIR alone: the latest checkpoint). The "
                        "checkpoint is verified first.", flags, 1, 1, 1};
    char *pos[1], dir[4096], tag[DSC_CKPT_TAG_MAX];
    bool has;
    int npos, rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if ((rc = path_args(pos[0], dir, sizeof dir, tag, sizeof tag, &has))) return rc;
    if (!json && dsc_ds_ckpt_detect(dir, has ? tag : NULL))
        return print_deepspeed(dir, has ? tag : NULL);
    dsc_ckpt *ck;
    if (dsc_ckpt_open(&ck, dir, has ? tag : NULL) != DSC_OK) {
        fprintf(stderr, "dsc ckpt info: %s\n", dsc_last_error());
        return 1;
    }
    if (json) fputs(dsc_ckpt_manifest_text(ck), stdout), putchar('\n');
    else print_info(ck, dir);
    dsc_ckpt_close(ck);
    return 0;
}

static int ckpt_verify(int argc, char **argv) {
    bool all = false;
    const cli_flag flags[] = {{"--all", NULL, "verify every complete checkpoint in DIR", NULL, &all}};
    const cli_verb v = {"ckpt verify", "dsc ckpt verify DIR[/TAG] [--all]",
                        "Verify a checkpoint (DIR alone: the latest one): manifest, every file's "
                        "size and XXH3 checksum, shard headers. Exit 0 when it verifies, 1 with "
                        "the reasons otherwise.", flags, 1, 1, 1};
    char *pos[1], dir[4096], tag[DSC_CKPT_TAG_MAX];
    bool has;
    int npos, rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if ((rc = path_args(pos[0], dir, sizeof dir, tag, sizeof tag, &has))) return rc;
    if (!all) return verify_one(dir, has ? tag : NULL) ? 0 : 1;
    dsc_ckpt_entry *e;
    int n;
    if (dsc_ckpt_list(dir, &e, &n) != DSC_OK) {
        fprintf(stderr, "dsc ckpt verify: %s\n", dsc_last_error());
        return 1;
    }
    bool ok = true;
    int checked = 0;
    for (int i = 0; i < n; i++) {
        if (e[i].state == DSC_CKPT_PARTIAL) continue;
        ok &= verify_one(dir, e[i].name);
        checked++;
    }
    free(e);
    if (!checked) printf("no checkpoints in %s\n", dir);
    return ok && checked ? 0 : 1;
}

// "5GB" (10^9, as transformers' max_shard_size), "500MB", "2GiB", "1MiB", "4096" (bytes).
static bool parse_size(const char *s, uint64_t *out) {
    static const struct {
        const char *suffix;
        double mult;
    } units[] = {{"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0}, {"GB", 1e9},
                 {"MB", 1e6}, {"KB", 1e3}, {"kB", 1e3}, {"B", 1}, {"", 1}};
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return false;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix)) continue;
        double b = v * units[i].mult;
        if (b < 1 || b > 1e18) return false;
        *out = (uint64_t)b;
        return true;
    }
    return false;
}

// --out and the parent folders of --out, as every other writer of dsc makes them.
static int make_parent(const char *out) {
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", out);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = '\0';
        if (dsc_mkdirs(parent) != DSC_OK) {
            fprintf(stderr, "dsc ckpt export: --out %s: %s\n", out, dsc_last_error());
            return 1;
        }
    }
    return 0;
}

static int export_deepspeed(const char *dir, const char *tag, const char *out, const char *hf,
                            const char *hf_config, const char *dtype, uint64_t shard_bytes) {
    if (out && make_parent(out)) return 1;
    dsc_status st = hf ? dsc_ds_ckpt_export_hf(dir, tag, hf_config, hf, dtype, shard_bytes)
                       : dsc_ds_ckpt_export(dir, tag, out, dtype);
    if (st != DSC_OK) {
        fprintf(stderr, "dsc ckpt export: %s\n", dsc_last_error());
        return 1;
    }
    printf("wrote %s (%s, from DeepSpeed checkpoint %s%s%s)\n", hf ? hf : out, dtype, dir,
           tag ? "/" : "", tag ? tag : "");
    return 0;
}

static int export_to_deepspeed(const char *dir, const char *tag, const char *out, int stage,
                               const char *config) {
    if (dsc_ds_ckpt_detect(dir, tag)) {
        fprintf(stderr, "dsc ckpt export: %s is a DeepSpeed checkpoint already; --deepspeed "
                        "writes one from dsc's (DeepSpeed's ds_to_universal.py converts its own "
                        "to the universal layout)\n", dir);
        return 2;
    }
    if (cli_ckpt_is_lora(dir, tag)) {
        fprintf(stderr, "dsc ckpt export: %s is a LoRA run's checkpoint: its adapters go out with "
                        "--peft DIR (PEFT's format), the merged model with --hf DIR\n", dir);
        return 2;
    }
    if (make_parent(out)) return 1;
    if (dsc_mkdirs(out) != DSC_OK || dsc_ckpt_export_deepspeed(dir, tag, out, stage, config) != DSC_OK) {
        fprintf(stderr, "dsc ckpt export: %s\n", dsc_last_error());
        return 1;
    }
    printf("wrote %s (a DeepSpeed universal checkpoint: load it with \"checkpoint\": "
           "{\"load_universal\": true} in DeepSpeed's config)\n", out);
    return 0;
}

static int ckpt_export(int argc, char **argv) {
    const char *out = NULL, *hf = NULL, *dtype = "fp32", *shard = "5GB", *hf_config = NULL;
    const char *peft = NULL, *deepspeed = NULL, *zstage = NULL, *config = NULL;
    const cli_flag flags[] = {
        {"--out", "FILE", "one safetensors file with every weight", &out, NULL},
        {"--hf", "DIR", "a Hugging Face model folder (config.json, sharded safetensors with "
                        "the index, generation_config.json, the run's tokenizer files)", &hf, NULL},
        {"--peft", "DIR", "a LoRA run's adapters as PEFT saves them (adapter_config.json, "
                          "adapter_model.safetensors), for PeftModel.from_pretrained", &peft, NULL},
        {"--deepspeed", "DIR", "a DeepSpeed universal checkpoint (DIR/latest_universal, "
                               "DIR/global_stepN/) that DeepSpeed 0.18 loads and continues with "
                               "checkpoint.load_universal: true, at any world size",
         &deepspeed, NULL},
        {"--zero-stage", "N", "with --deepspeed: the ZeRO stage (1-3) of the DeepSpeed run that "
                              "loads it (its files differ between stages 1-2 and 3; default: the "
                              "checkpoint's, 1 for a stage-0 run)", &zstage, NULL},
        {"--config", "FILE", "with --deepspeed: the run's config (default: the ds_config.json "
                             "the checkpoint carries)", &config, NULL},
        {"--shard-size", "SIZE", "with --hf: the largest shard (default 5GB; MB, GB, MiB, GiB "
                                 "or bytes)", &shard, NULL},
        {"--dtype", "fp32|bf16", "tensor type of the weights (default fp32)", &dtype, NULL},
        {"--hf-config", "DIR", "with --hf from a DeepSpeed checkpoint: the model's Hugging Face "
                               "folder, whose config.json, generation_config.json and tokenizer "
                               "files go into the export (default: DS_DIR's own, where the "
                               "Hugging Face Trainer keeps them)", &hf_config, NULL},
    };
    const cli_verb v = {"ckpt export",
                        "dsc ckpt export DIR[/TAG] (--out FILE | --hf DIR | --peft DIR | "
                        "--deepspeed DIR [--zero-stage N]) [--shard-size SIZE] "
                        "[--dtype fp32|bf16] [--hf-config DIR]",
                        "Write the checkpoint's weights (DIR alone: the latest checkpoint) under "
                        "their Hugging Face names, whatever the world size and ZeRO stage it was "
                        "saved with: as one safetensors file (--out), or as a folder that "
                        "transformers' from_pretrained loads (--hf), written one tensor at a "
                        "time. DIR may be a DeepSpeed checkpoint (its fp32 master weights). A "
                        "LoRA run's checkpoint: --peft writes its adapters, --hf the base model "
                        "with the adapters merged in. --deepspeed writes the whole training state "
                        "(fp32 master weights, Adam's moments and step, the schedule's position, "
                        "the loss scaler) for DeepSpeed to continue the run.",
                        flags, 9, 1, 1};
    char *pos[1], dir[4096], tag[DSC_CKPT_TAG_MAX];
    bool has;
    uint64_t shard_bytes = 0;
    int npos, rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if ((out != NULL) + (hf != NULL) + (peft != NULL) + (deepspeed != NULL) != 1) {
        fprintf(stderr, "dsc ckpt export: give --out FILE (one safetensors file), --hf DIR (a "
                        "Hugging Face folder), --peft DIR (a LoRA run's adapters) or --deepspeed "
                        "DIR (a DeepSpeed universal checkpoint), one of them\n");
        return 2;
    }
    long long stage = -1;
    if ((zstage || config) && !deepspeed) {
        fprintf(stderr, "dsc ckpt export: --zero-stage and --config go with --deepspeed\n");
        return 2;
    }
    if (zstage && !cli_int("--zero-stage", zstage, 0, 3, &stage)) return 2;
    if (!parse_size(shard, &shard_bytes)) {
        fprintf(stderr, "dsc ckpt export: --shard-size %s: give a size such as 5GB, 500MB, 2GiB "
                        "or a number of bytes\n", shard);
        return 2;
    }
    if (strcmp(dtype, "fp32") != 0 && strcmp(dtype, "bf16") != 0) {
        fprintf(stderr, "dsc ckpt export: --dtype %s: use fp32 or bf16\n", dtype);
        return 2;
    }
    if ((rc = path_args(pos[0], dir, sizeof dir, tag, sizeof tag, &has))) return rc;
    if (deepspeed)
        return export_to_deepspeed(dir, has ? tag : NULL, deepspeed, (int)stage, config);
    if (dsc_ds_ckpt_detect(dir, has ? tag : NULL))
        return export_deepspeed(dir, has ? tag : NULL, out, hf, hf_config, dtype, shard_bytes);
    if (hf_config) {
        fprintf(stderr, "dsc ckpt export: --hf-config is for DeepSpeed checkpoints; dsc's carry "
                        "their model's config.json\n");
        return 2;
    }
    if (peft || (hf && cli_ckpt_is_lora(dir, has ? tag : NULL))) {
        dsc_status st = peft ? cli_export_peft(dir, has ? tag : NULL, peft)
                             : cli_export_merged(dir, has ? tag : NULL, hf, dtype, shard_bytes);
        if (st != DSC_OK) {
            fprintf(stderr, "dsc ckpt export: %s\n", dsc_last_error());
            return 1;
        }
        printf("wrote %s (%s)\n", peft ? peft : hf, peft ? "LoRA adapters, as PEFT saves them"
                                                        : "the base model with the adapters merged");
        return 0;
    }
    if (hf) {
        if (dsc_ckpt_export_hf(dir, has ? tag : NULL, hf, dtype, shard_bytes) != DSC_OK) {
            fprintf(stderr, "dsc ckpt export: %s\n", dsc_last_error());
            return 1;
        }
        printf("wrote %s (%s)\n", hf, dtype);
        return 0;
    }
    if (make_parent(out)) return 1;
    if (dsc_ckpt_export(dir, has ? tag : NULL, out, dtype) != DSC_OK) {
        fprintf(stderr, "dsc ckpt export: %s\n", dsc_last_error());
        return 1;
    }
    printf("wrote %s (%s)\n", out, dtype);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: dsc ckpt <ls|info|verify|export> ...\n\n"
               "  ls DIR [--verify]                     list checkpoints, newest first\n"
               "  info DIR[/TAG] [--json]               show a checkpoint's manifest\n"
               "  verify DIR[/TAG] [--all]              check manifest, sizes and checksums\n"
               "  export DIR[/TAG] --out FILE [--dtype fp32|bf16]\n"
               "                                        one safetensors file, Hugging Face names\n"
               "  export DIR[/TAG] --hf DIR [--shard-size SIZE] [--dtype fp32|bf16]\n"
               "                                        a Hugging Face model folder\n"
               "  export DIR[/TAG] --peft DIR           a LoRA run's adapters\n"
               "  export DIR[/TAG] --deepspeed DIR [--zero-stage N]\n"
               "                                        a DeepSpeed universal checkpoint\n"
               "  (DIR may be a DeepSpeed checkpoint; --hf-config DIR names its model's folder)\n"
               "DIR alone means the checkpoint `latest` names.\n");
}

int cmd_ckpt(int argc, char **argv) {
    if (argc < 1) {
        usage(stderr);
        return 2;
    }
    const char *sub = argv[0];
    if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(sub, "ls")) return ckpt_ls(argc - 1, argv + 1);
    if (!strcmp(sub, "info")) return ckpt_info(argc - 1, argv + 1);
    if (!strcmp(sub, "verify")) return ckpt_verify(argc - 1, argv + 1);
    if (!strcmp(sub, "export")) return ckpt_export(argc - 1, argv + 1);
    fprintf(stderr, "dsc ckpt: unknown command '%s'\n", sub);
    usage(stderr);
    return 2;
}
