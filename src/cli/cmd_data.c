// cli/cmd_data.c - `dsc data prepare` (text -> token shards), `dsc data decode` (shard -> text),
// `dsc data chat` (conversations rendered with a chat template) and `dsc data default`.
#include <stdbool.h> // bool
#include <stdio.h>  // fprintf, fwrite
#include <stdlib.h> // calloc, free, malloc
#include <string.h> // strcmp
#include <unistd.h> // sysconf

#include "cli/args.h"     // cli_parse
#include "cli/commands.h" // cmd_data
#include "dsc/data.h"     // dsc_data_*, dsc_shard_*, dsc_tokenizer_*
#include "dsc/status.h"   // dsc_last_error

#define TOKENIZER_HELP                                                                         \
    "byte (default), gpt2:DIR (vocab.json + merges.txt), hf:DIR (a Hugging Face tokenizer.json, " \
    "optionally tokenizer_config.json) or a tokenizer.json path"

static int data_prepare(int argc, char **argv) {
    const char *input = NULL, *tok = "byte", *out = NULL, *frac = NULL, *format = NULL;
    const char *tpl = NULL, *seq = NULL, *bad = NULL, *threads = NULL;
    const cli_flag flags[] = {
        {"--input", "FILE...", "text files (one document each) or JSONL files (more may follow as arguments)", &input, NULL},
        {"--tokenizer", "SPEC", TOKENIZER_HELP ", or ids / ids:VOCAB (the text is token ids: "
         "decimal numbers separated by spaces, commas or new lines)", &tok, NULL},
        {"--out", "DIR", "where train.bin, val.bin and dataset.json go", &out, NULL},
        {"--val-fraction", "F", "share of the tokens (packed: rows) kept for validation (default 0.05)", &frac, NULL},
        {"--threads", "N", "documents tokenized at once (default: all cores; same output)", &threads, NULL},
        {"--format", "auto|text|jsonl", "input format (auto: *.jsonl files are JSONL, others text)", &format, NULL},
        {"--chat-template", "SPEC", "for \"messages\" lines: chatml, a tokenizer_config.json, its folder or a Jinja file (default: hf:DIR's, else chatml)", &tpl, NULL},
        {"--seq-len", "N", "pack the examples into rows of N+1 tokens (train with --seq-len N)", &seq, NULL},
        {"--on-bad-line", "error|skip", "a malformed JSONL line stops the run (error, default) or is skipped with a warning", &bad, NULL},
    };
    const cli_verb v = {"data prepare",
                        "dsc data prepare --input FILE [FILE...] --tokenizer SPEC --out DIR "
                        "[--val-fraction F] [--threads N] [--format auto|text|jsonl] "
                        "[--chat-template SPEC] [--seq-len N] [--on-bad-line error|skip]",
                        "Tokenize text files, or JSONL files of text, prompt/completion or chat "
                        "examples (the loss masked to the completions and assistant messages), "
                        "into token shards (llm.c's .bin layout) that dsc train --data DIR reads.",
                        flags, 9, 0, -1};
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
    long long seq_len = 0, nthreads = sysconf(_SC_NPROCESSORS_ONLN);
    if (seq && !cli_int("--seq-len", seq, 1, 1 << 24, &seq_len)) goto done;
    if (threads && !cli_int("--threads", threads, 1, 4096, &nthreads)) goto done;
    if (bad && strcmp(bad, "error") && strcmp(bad, "skip")) {
        fprintf(stderr, "dsc data prepare: --on-bad-line must be error or skip\n");
        goto done;
    }
    dsc_prepare_opts o = {.inputs = inputs, .ninputs = n, .tokenizer = tok, .out_dir = out,
                          .val_fraction = f, .threads = nthreads > 0 ? (int)nthreads : 1,
                          .format = format, .chat_template = tpl, .seq_len = (int)seq_len,
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

// Shard -> text on stdout.
static int decode_shard(const char *spec, const char *path) {
    dsc_tokenizer *tk = NULL;
    dsc_shard sh = {0};
    int32_t *ids = NULL;
    char *text = NULL;
    size_t len = 0;
    int rc = 1;
    if (dsc_tokenizer_create(&tk, spec) != DSC_OK || dsc_shard_open(&sh, path) != DSC_OK)
        goto done;
    ids = malloc(((size_t)sh.ntok + 1) * sizeof *ids);
    if (!ids) {
        fprintf(stderr, "dsc data decode: out of memory for %lld tokens\n", (long long)sh.ntok);
        goto done;
    }
    dsc_shard_read(&sh, 0, sh.ntok, ids);
    if (dsc_tokenizer_decode(tk, ids, (size_t)sh.ntok, &text, &len) != DSC_OK) goto done;
    rc = fwrite(text, 1, len, stdout) == len ? 0 : 1;
done:
    if (rc && !text) fprintf(stderr, "dsc data decode: error: %s\n", dsc_last_error());
    free(text);
    free(ids);
    dsc_shard_close(&sh);
    dsc_tokenizer_destroy(tk);
    return rc;
}

static int data_decode(int argc, char **argv) {
    const char *tok = NULL, *shard = NULL;
    const cli_flag flags[] = {
        {"--tokenizer", "SPEC", TOKENIZER_HELP "", &tok, NULL},
        {"--shard", "FILE", "the token shard (.bin) to decode", &shard, NULL},
    };
    const cli_verb v = {"data decode", "dsc data decode --shard FILE.bin --tokenizer SPEC",
                        "Write the text of a token shard to stdout (special tokens as their text).",
                        flags, 2, 0, 0};
    char *pos[1];
    int npos, rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (!shard || !tok) {
        fprintf(stderr, "dsc data decode: need --shard FILE and --tokenizer SPEC; see --help\n");
        return 2;
    }
    return decode_shard(tok, shard);
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

// A JSON string of n bytes (UTF-8 left as it is; control characters escaped).
static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') printf("\\n");
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

// One conversation (a JSONL line): its rendering, or {"text", "spans"} with --json.
static int chat_line(const dsc_chat_template *t, const char *line, bool agp, bool json,
                     const char *path, long long lineno) {
    char *text = NULL;
    size_t len = 0;
    dsc_chat_span *sp = NULL;
    int n = 0;
    if (dsc_chat_apply(t, line, agp, &text, &len, json && !agp ? &sp : NULL, &n) != DSC_OK) {
        fprintf(stderr, "dsc data chat: %s:%lld: %s\n", path, lineno, dsc_last_error());
        return 1;
    }
    if (json) {
        printf("{\"text\": ");
        print_json_string(text, len);
        printf(", \"spans\": [");
        for (int k = 0; k < n; k++) printf("%s[%zu, %zu]", k ? ", " : "", sp[k].begin, sp[k].end);
        printf("]}\n");
    } else {
        fwrite(text, 1, len, stdout);
        putchar('\n');
    }
    free(text);
    free(sp);
    return 0;
}

static int chat_render(const dsc_chat_template *t, const char *path, bool agp, bool json) {
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "dsc data chat: --input %s: cannot open\n", path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    long long lineno = 0;
    int rc = 0;
    while (!rc && getline(&line, &cap, f) >= 0) {
        lineno++;
        if (strspn(line, " \t\r\n") == strlen(line)) continue; // blank
        rc = chat_line(t, line, agp, json, path, lineno);
    }
    free(line);
    fclose(f);
    return rc;
}

static int data_chat(int argc, char **argv) {
    const char *input = NULL, *tok = NULL, *tpl = NULL;
    bool agp = false, json = false;
    const cli_flag flags[] = {
        {"--input", "FILE", "JSONL: one conversation a line, {\"messages\": [...], \"tools\": [...]} or a messages array", &input, NULL},
        {"--chat-template", "SPEC", "chatml, a tokenizer_config.json, its folder or a Jinja file (default: the --tokenizer hf:DIR folder's, else chatml)", &tpl, NULL},
        {"--tokenizer", "SPEC", "the tokenizer whose folder holds the template (hf:DIR)", &tok, NULL},
        {"--add-generation-prompt", NULL, "end with the template's generation prompt (as dsc generate --chat does)", NULL, &agp},
        {"--json", NULL, "print {\"text\", \"spans\"} lines: the rendering and its assistant spans (byte offsets; none with --add-generation-prompt), the loss targets of dsc data prepare", NULL, &json},
    };
    const cli_verb v = {"data chat", "dsc data chat --input FILE.jsonl [--chat-template SPEC] "
                        "[--tokenizer hf:DIR] [--add-generation-prompt] [--json]",
                        "Render conversations with a chat template as dsc data prepare and dsc "
                        "generate --chat do, to see the text (and with --json the assistant "
                        "spans that are trained on).", flags, 5, 0, 0};
    char *pos[1];
    int npos, rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (!input) {
        fprintf(stderr, "dsc data chat: need --input FILE; see --help\n");
        return 2;
    }
    dsc_chat_template *t = NULL;
    char note[4400];
    if (dsc_chat_template_load(tpl, tok, &t, note, sizeof note) != DSC_OK) {
        fprintf(stderr, "dsc data chat: error: %s\n", dsc_last_error());
        return 1;
    }
    fprintf(stderr, "dsc data chat: chat template %s\n", note);
    rc = chat_render(t, input, agp, json);
    dsc_chat_template_destroy(t);
    return rc;
}

int cmd_data(int argc, char **argv) {
    if (argc >= 1 && !strcmp(argv[0], "prepare")) return data_prepare(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "default")) return data_default(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "decode")) return data_decode(argc - 1, argv + 1);
    if (argc >= 1 && !strcmp(argv[0], "chat")) return data_chat(argc - 1, argv + 1);
    bool help = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"));
    fprintf(help ? stdout : stderr,
            "usage: dsc data prepare --input FILE [FILE...] --tokenizer SPEC --out DIR "
            "[--val-fraction F] [--threads N] [--format auto|text|jsonl] [--chat-template SPEC] "
            "[--seq-len N] [--on-bad-line error|skip]\n"
            "       dsc data decode --shard FILE.bin --tokenizer SPEC\n"
            "       dsc data chat --input FILE.jsonl [--chat-template SPEC] [--tokenizer hf:DIR] "
            "[--add-generation-prompt] [--json]\n"
            "       dsc data default --out DIR\n");
    return help ? 0 : 2;
}
