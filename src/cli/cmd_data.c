// cli/cmd_data.c - `dsc data prepare` (text -> token shards) and `dsc data default`.
#include <stdbool.h> // bool
#include <stdio.h>  // fprintf
#include <stdlib.h> // calloc
#include <string.h> // strcmp

#include "cli/args.h"     // cli_parse
#include "cli/commands.h" // cmd_data
#include "data/jsonl.h"   // DSC_BAD_LINE_*
#include "data/prepare.h" // dsc_data_prepare, dsc_data_default
#include "dsc/status.h"   // dsc_last_error

static int data_prepare(int argc, char **argv) {
    const char *input = NULL, *tok = "byte", *out = NULL, *frac = NULL, *format = NULL;
    const char *tpl = NULL, *seq = NULL, *bad = NULL;
    const cli_flag flags[] = {
        {"--input", "FILE...", "text files (one document each) or JSONL files (more may follow as arguments)", &input, NULL},
        {"--tokenizer", "SPEC", "byte (default), gpt2:DIR (DIR has vocab.json and merges.txt), "
         "or ids / ids:VOCAB (the text is token ids: decimal numbers separated by spaces, commas "
         "or new lines)", &tok, NULL},
        {"--out", "DIR", "where train.bin, val.bin and dataset.json go", &out, NULL},
        {"--val-fraction", "F", "share of the tokens (packed: rows) kept for validation (default 0.05)", &frac, NULL},
        {"--format", "auto|text|jsonl", "input format (auto: *.jsonl files are JSONL, others text)", &format, NULL},
        {"--chat-template", "SPEC", "for \"messages\" lines: chatml, a tokenizer_config.json, its folder or a Jinja file (default: hf:DIR's, else chatml)", &tpl, NULL},
        {"--seq-len", "N", "pack the examples into rows of N+1 tokens (train with --seq-len N)", &seq, NULL},
        {"--on-bad-line", "error|skip", "a malformed JSONL line stops the run (error, default) or is skipped with a warning", &bad, NULL},
    };
    const cli_verb v = {"data prepare",
                        "dsc data prepare --input FILE [FILE...] "
                        "--tokenizer byte|gpt2:DIR|ids[:VOCAB] --out DIR [--val-fraction F] "
                        "[--format auto|text|jsonl] [--chat-template SPEC] [--seq-len N] "
                        "[--on-bad-line error|skip]",
                        "Tokenize text files, or JSONL files of text, prompt/completion or chat "
                        "examples (the loss masked to the completions and assistant messages), "
                        "into token shards (llm.c's .bin layout) that dsc train --data DIR reads.",
                        flags, 8, 0, -1};
    char **pos = calloc((size_t)argc + 1, sizeof *pos);
    const char **inputs = calloc((size_t)argc + 1, sizeof *inputs);
    int npos = 0, rc = pos && inputs ? cli_parse(&v, argc, argv, &npos, pos) : 2;
    if (rc) {
        rc = rc == 1 ? 0 : 2; // --help printed, or a usage error
        goto done;
    }
    int n = 0;
    if (input) inputs[n++] = input;
    for (int i = 0; i < npos; i++) inputs[n++] = pos[i];
    rc = 2;
    if (!n || !out) {
        fprintf(stderr, "dsc data prepare: need --input FILE and --out DIR; see --help\n");
        goto done;
    }
    double f = 0.05;
    if (frac && (!cli_double("--val-fraction", frac, &f) || f < 0 || f >= 1)) {
        fprintf(stderr, "dsc data prepare: --val-fraction must be in [0, 1)\n");
        goto done;
    }
    long long seq_len = 0;
    if (seq && !cli_int("--seq-len", seq, 1, 1 << 24, &seq_len)) goto done;
    if (bad && strcmp(bad, "error") && strcmp(bad, "skip")) {
        fprintf(stderr, "dsc data prepare: --on-bad-line must be error or skip\n");
        goto done;
    }
    dsc_prepare_opts o = {.inputs = inputs, .ninputs = n, .tokenizer = tok, .out_dir = out,
                          .val_fraction = f, .format = format, .chat_template = tpl,
                          .seq_len = (int)seq_len,
                          .on_bad_line = bad && !strcmp(bad, "skip") ? DSC_BAD_LINE_SKIP
                                                                     : DSC_BAD_LINE_ERROR};
    rc = 0;
    if (dsc_data_prepare(&o) != DSC_OK) {
        fprintf(stderr, "dsc data prepare: error: %s\n", dsc_last_error());
        rc = 1;
    }
done:
    free(pos);
    free(inputs);
    return rc;
}

static int data_default(int argc, char **argv) {
    const char *out = NULL;
    const cli_flag flags[] = {{"--out", "DIR", "where to write the data set", &out, NULL}};
    const cli_verb v = {"data default", "dsc data default --out DIR",
                        "Build the built-in default data set (byte-level tokens of the license "
                        "texts every Debian system ships, or generated text) into DIR.",
                        flags, 1, 0, 0};
    char *pos[1];
    int npos, rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (!out) {
        fprintf(stderr, "dsc data default: need --out DIR\n");
        return 2;
    }
    if (dsc_data_default(out, NULL) != DSC_OK) {
        fprintf(stderr, "dsc data default: error: %s\n", dsc_last_error());
        return 1;
    }
    printf("default data written to %s\n", out);
    return 0;
}

int cmd_data(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "prepare")) return data_prepare(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "default")) return data_default(argc - 1, argv + 1);
    bool help = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"));
    fprintf(help ? stdout : stderr,
            "usage: dsc data prepare --input FILE [FILE...] --tokenizer byte|gpt2:DIR|ids[:VOCAB] "
            "--out DIR [--val-fraction F] [--format auto|text|jsonl] [--chat-template SPEC] "
            "[--seq-len N] [--on-bad-line error|skip]\n       dsc data default --out DIR\n");
    return help ? 0 : 2;
}
