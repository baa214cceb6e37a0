// monitor/csv.c - DeepSpeed's csv_monitor layout: one CSV file per metric.
//
// For tag "Train/Samples/train_loss" the file is <dir>/Train_Samples_train_loss.csv ('/' and ' '
// become '_'), opened for appending; its first row in this process is the header
// "step,train_loss" (the tag's last '/' component) and every event adds "step,value". Rows end in
// "\r\n" and values are written as Python's repr(float), because DeepSpeed writes with Python's
// csv module: files from dsc and from DeepSpeed read the same, byte for byte.
#include <errno.h>  // errno
#include <stdio.h>  // FILE, fopen, fprintf
#include <stdlib.h> // calloc, realloc, free
#include <string.h> // strlen, strrchr, strcmp, strerror

#include "base/hash.h"    // dsc_hash64
#include "base/io.h" // dsc__mkdirs
#include "base/status.h"  // dsc__fail
#include "monitor/sink.h" // dsc__sink, dsc__fmt_pyfloat

typedef struct csv_file {
    uint64_t hash; // of the tag
    char *tag;
    FILE *f;
} csv_file;

typedef struct csv_sink {
    char dir[4096];
    csv_file *files;
    int n, cap;
} csv_sink;

// A CSV field as Python's csv.writer (QUOTE_MINIMAL) writes it.
static int put_field(FILE *f, const char *s) {
    if (!strpbrk(s, ",\"\r\n")) return fputs(s, f);
    if (fputc('"', f) == EOF) return EOF;
    for (; *s; s++)
        if ((*s == '"' && fputc('"', f) == EOF) || fputc(*s, f) == EOF) return EOF;
    return fputc('"', f);
}

static dsc_status open_file(csv_sink *s, const char *tag, csv_file *out) {
    char path[8192];
    int len = snprintf(path, sizeof path, "%s/", s->dir);
    for (const char *c = tag; *c && len < (int)sizeof path - 5; c++)
        path[len++] = (*c == '/' || *c == ' ') ? '_' : *c;
    snprintf(path + len, sizeof path - (size_t)len, ".csv");
    FILE *f = fopen(path, "a");
    if (!f) return dsc__fail(DSC_ERR_IO, "cannot open %s: %s; check csv_monitor.output_path", path,
                             strerror(errno));
    const char *slash = strrchr(tag, '/');
    int rc = fputs("step,", f);
    if (rc != EOF) rc = put_field(f, slash ? slash + 1 : tag);
    if (rc != EOF) rc = fputs("\r\n", f);
    if (rc == EOF) {
        fclose(f);
        return dsc__fail(DSC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    }
    out->f = f;
    out->tag = strdup(tag);
    out->hash = dsc_hash64(tag, strlen(tag));
    if (!out->tag) {
        fclose(f);
        return dsc__fail(DSC_ERR_OOM, "out of memory");
    }
    return DSC_OK;
}

static dsc_status find_file(csv_sink *s, const char *tag, csv_file **out) {
    uint64_t h = dsc_hash64(tag, strlen(tag));
    for (int i = 0; i < s->n; i++)
        if (s->files[i].hash == h && !strcmp(s->files[i].tag, tag)) {
            *out = &s->files[i];
            return DSC_OK;
        }
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        csv_file *grown = realloc(s->files, (size_t)cap * sizeof *grown);
        if (!grown) return dsc__fail(DSC_ERR_OOM, "out of memory");
        s->files = grown;
        s->cap = cap;
    }
    DSC_TRY(open_file(s, tag, &s->files[s->n]));
    *out = &s->files[s->n++];
    return DSC_OK;
}

static dsc_status csv_write(void *ctx, const char *tag, double value, int64_t step, double wall) {
    csv_sink *s = ctx;
    csv_file *cf = NULL;
    DSC_TRY(find_file(s, tag, &cf));
    char num[40];
    dsc__fmt_pyfloat(num, sizeof num, value);
    if (fprintf(cf->f, "%lld,%s\r\n", (long long)step, num) < 0)
        return dsc__fail(DSC_ERR_IO, "cannot write the CSV file of %s in %s: %s", tag, s->dir,
                         strerror(errno));
    return DSC_OK;
}

static dsc_status csv_flush(void *ctx) {
    csv_sink *s = ctx;
    for (int i = 0; i < s->n; i++)
        if (fflush(s->files[i].f) != 0)
            return dsc__fail(DSC_ERR_IO, "cannot write the CSV file of %s in %s: %s",
                             s->files[i].tag, s->dir, strerror(errno));
    return DSC_OK;
}

static void csv_destroy(void *ctx) {
    csv_sink *s = ctx;
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        fclose(s->files[i].f);
        free(s->files[i].tag);
    }
    free(s->files);
    free(s);
}

static const dsc__sink_ops csv_ops = {
    .name = "csv_monitor", .write = csv_write, .flush = csv_flush, .destroy = csv_destroy};

dsc_status dsc__sink_csv_open(dsc__sink *out, const char *dir) {
    if (strlen(dir) >= sizeof ((csv_sink *)0)->dir)
        return dsc__fail(DSC_ERR_CONFIG, "csv_monitor: output directory path too long");
    dsc_status made = dsc__mkdirs(dir);
    if (made != DSC_OK) {
        dsc__error_prefix("csv_monitor.output_path (choose another): ");
        return made;
    }
    csv_sink *s = calloc(1, sizeof *s);
    if (!s) return dsc__fail(DSC_ERR_OOM, "out of memory opening the CSV sink");
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    *out = (dsc__sink){&csv_ops, s};
    return DSC_OK;
}
