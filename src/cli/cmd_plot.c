// cli/cmd_plot.c - `dsc plot RUN_DIR...`: training curves from metrics.jsonl as an SVG (or PNG).
//
// Each run's metrics.jsonl holds one JSON object per optimizer step. Every numeric field but the
// step counters becomes a panel (loss with validation loss, lr, tokens/s, then the others), runs
// overlaid in one colour each. The SVG is written by hand; PNG goes through rsvg-convert.
#include <errno.h>    // errno
#include <jansson.h>  // json_loads, json_object_foreach
#include <math.h>     // floor, log10, pow, isfinite
#include <spawn.h>    // posix_spawnp
#include <stdbool.h>  // bool
#include <stdio.h>    // FILE, fprintf, getline
#include <stdlib.h>   // calloc, realloc, free, strtod
#include <string.h>   // strcmp, strlen, strrchr, strerror
#include <sys/stat.h> // stat
#include <sys/wait.h> // waitpid
#include <unistd.h>   // unlink

#include "cli/args.h"     // cli_parse, cli_double
#include "cli/commands.h" // cmd_plot
#include "dsc/base.h"     // dsc_fopen_regular
#include "dsc/status.h"   // dsc_last_error

extern char **environ; // for posix_spawnp

enum { MAX_RUNS = 10, MAX_SERIES = 64 };

// ---- data ----

typedef struct series {
    char key[64];
    double *x, *y; // (n,) step and value
    size_t n, cap;
} series;

typedef struct run {
    char name[128];
    series s[MAX_SERIES];
    int ns;
    long long last_step, skipped, lines;
} run;

static series *find_series(run *r, const char *key, bool create) {
    for (int i = 0; i < r->ns; i++)
        if (!strcmp(r->s[i].key, key)) return &r->s[i];
    if (!create || r->ns == MAX_SERIES || strlen(key) >= sizeof r->s[0].key) return NULL;
    series *s = &r->s[r->ns++];
    snprintf(s->key, sizeof s->key, "%s", key);
    return s;
}

static bool push(series *s, double x, double y) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, cap * sizeof *nx);
        if (!nx) return false;
        s->x = nx;
        double *ny = realloc(s->y, cap * sizeof *ny);
        if (!ny) return false;
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return true;
}

static void run_free(run *r) {
    for (int i = 0; i < r->ns; i++) {
        free(r->s[i].x);
        free(r->s[i].y);
    }
}

// The trainer prints a non-finite loss as nan/inf, which is not JSON: read those as null.
// out needs room for 4/3 of in.
static void nonfinite_to_null(const char *in, char *out) {
    bool quoted = false;
    char prev = 0;
    while (*in) {
        if (*in == '"' && prev != '\\') quoted = !quoted;
        prev = *in;
        const char *t = in + (*in == '-');
        if (!quoted && (!strncmp(t, "nan", 3) || !strncmp(t, "inf", 3))) {
            memcpy(out, "null", 4);
            out += 4;
            in = t + 3;
            continue;
        }
        *out++ = *in++;
    }
    *out = '\0';
}

// Counters that only say where in the run a line is: not curves of their own.
static bool is_counter(const char *key) {
    return !strcmp(key, "step") || !strcmp(key, "tokens") || !strcmp(key, "elapsed_s");
}

static void add_line(run *r, json_t *obj) {
    json_t *st = json_object_get(obj, "step");
    double x = json_is_number(st) ? json_number_value(st) : (double)r->lines;
    r->last_step = (long long)x;
    if (json_is_true(json_object_get(obj, "skipped"))) r->skipped++;
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        if (!json_is_number(v) || is_counter(key)) continue;
        double y = json_number_value(v);
        if (!strcmp(key, "grad_norm") && y < 0) continue; // -1 marks a non-finite norm
        series *s = find_series(r, key, true);
        if (s) push(s, x, y);
    }
}

// A run's name: its directory's last component (also for DIR/metrics.jsonl), else the file's.
static void run_name(const char *path, char *out, size_t cap) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s", path);
    size_t n = strlen(tmp);
    while (n > 1 && tmp[n - 1] == '/') tmp[--n] = '\0';
    char *slash = strrchr(tmp, '/');
    if (slash && slash > tmp && !strcmp(slash + 1, "metrics.jsonl")) {
        *slash = '\0';
        slash = strrchr(tmp, '/');
    }
    const char *base = slash ? slash + 1 : tmp;
    size_t len = strnlen(base, cap - 1); // long names are cut
    memcpy(out, base, len);
    out[len] = '\0';
}

// RUN_DIR/metrics.jsonl, or the .jsonl file itself. Returns 0 or prints why and returns 1.
static int load_run(const char *arg, run *r) {
    char path[4200];
    struct stat sb;
    bool dir = stat(arg, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (dir) snprintf(path, sizeof path, "%s/metrics.jsonl", arg);
    else snprintf(path, sizeof path, "%s", arg);
    FILE *f;
    if (dsc_fopen_regular(path, &f) != DSC_OK) {
        fprintf(stderr, "dsc plot: %s; give a run directory (with metrics.jsonl, as written by "
                "dsc train --out) or a .jsonl file\n", dsc_last_error());
        return 1;
    }
    char *line = NULL, *clean = NULL;
    size_t cap = 0;
    ssize_t len;
    long long bad = 0;
    while ((len = getline(&line, &cap, f)) > 0) {
        char *grown = realloc(clean, 2 * (size_t)len + 1); // "nan" -> "null" grows the text
        if (!grown) break;
        clean = grown;
        nonfinite_to_null(line, clean);
        json_error_t err;
        json_t *obj = json_loads(clean, JSON_DECODE_ANY, &err);
        r->lines++;
        if (json_is_object(obj)) add_line(r, obj);
        else if (strspn(line, " \t\r\n") != (size_t)len) bad++;
        json_decref(obj);
    }
    free(line);
    free(clean);
    fclose(f);
    if (bad)
        fprintf(stderr, "dsc plot: %s: skipped %lld lines that are not JSON objects\n", path, bad);
    run_name(dir ? arg : path, r->name, sizeof r->name);
    if (!r->ns) {
        fprintf(stderr, "dsc plot: %s holds no numeric metrics\n", path);
        return 1;
    }
    return 0;
}

// ---- panels ----

typedef enum unit { U_PLAIN, U_PERCENT, U_BYTES, U_MS, U_SECONDS, U_LOG2 } unit;

typedef struct panel {
    const char *keys[2]; // second: drawn dashed with markers (validation loss)
    int nkeys;
    char title[96], ylabel[64];
    unit unit;
    bool smooth; // noisy: draw an EMA over the faded raw curve
    bool zero;   // the y axis may start at zero (not for losses: it would flatten the curve)
} panel;

static const struct known {
    const char *key, *title, *ylabel;
    unit unit;
    bool smooth, zero;
} known[] = {
    {"loss", "Loss (train and validation)", "cross-entropy (nats)", U_PLAIN, true, false},
    {"lr", "Learning rate", "learning rate", U_PLAIN, false, true},
    {"tokens_per_s", "Throughput", "tokens / s", U_PLAIN, true, true},
    {"grad_norm", "Gradient norm (before clipping)", "L2 norm", U_PLAIN, true, true},
    {"loss_scale", "Loss scale", "scale (log2 axis)", U_LOG2, false, false},
    {"mfu", "Model FLOPs utilisation", "% of peak", U_PERCENT, true, true},
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

// "gpu_allocated_bytes" -> "GPU allocated": words spaced, unit suffix dropped, acronyms upper.
static void pretty_title(const char *key, char *out, size_t cap) {
    static const char *suffixes[] = {"_bytes", "_ms", "_s", "_fraction", "_frac"};
    size_t n = strlen(key);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (ends_with(key, suffixes[i]) && n > strlen(suffixes[i])) {
            n -= strlen(suffixes[i]);
            break;
        }
    size_t k = 0;
    for (size_t i = 0; i < n && k + 4 < cap;) {
        size_t w = strcspn(key + i, "_/");
        if (w > n - i) w = n - i;
        const char *upper[] = {"gpu", "cpu", "mfu", "hbm", "nvme"};
        bool acronym = false;
        for (size_t u = 0; u < sizeof upper / sizeof upper[0]; u++)
            acronym |= strlen(upper[u]) == w && !strncmp(key + i, upper[u], w);
        for (size_t c = 0; c < w && k + 2 < cap; c++) {
            char ch = key[i + c];
            bool up = (acronym || k == 0) && ch >= 'a' && ch <= 'z';
            out[k++] = up ? (char)(ch - 'a' + 'A') : ch;
        }
        i += w;
        if (i < n && k + 2 < cap) out[k++] = ' ';
        i++;
    }
    out[k] = '\0';
}

// Panel for a key not in the table: its unit from its suffix.
static void generic_panel(panel *p, const char *key) {
    *p = (panel){.keys = {key}, .nkeys = 1, .smooth = true, .zero = true};
    pretty_title(key, p->title, sizeof p->title);
    p->unit = ends_with(key, "_bytes") ? U_BYTES
              : ends_with(key, "_ms")  ? U_MS
              : ends_with(key, "_s")   ? U_SECONDS
              : (ends_with(key, "_fraction") || ends_with(key, "_frac")) ? U_PERCENT
                                                                           : U_PLAIN;
    static const char *labels[] = {"value", "%", "bytes", "ms", "seconds", "value"};
    snprintf(p->ylabel, sizeof p->ylabel, "%s", labels[p->unit]);
}

static bool any_run_has(run *runs, int nr, const char *key) {
    for (int i = 0; i < nr; i++)
        if (find_series(&runs[i], key, false)) return true;
    return false;
}

static bool listed(const panel *ps, int np, const char *key) {
    for (int i = 0; i < np; i++)
        for (int k = 0; k < ps[i].nkeys; k++)
            if (!strcmp(ps[i].keys[k], key)) return true;
    return false;
}

// Known panels in their order, then every other series in first-seen order.
static int plan_panels(run *runs, int nr, panel *ps, int cap) {
    int np = 0;
    for (size_t k = 0; k < sizeof known / sizeof known[0] && np < cap; k++) {
        bool val = !strcmp(known[k].key, "loss") && any_run_has(runs, nr, "val_loss");
        if (!any_run_has(runs, nr, known[k].key) && !val) continue;
        panel *p = &ps[np++];
        *p = (panel){.keys = {known[k].key, val ? "val_loss" : NULL}, .nkeys = val ? 2 : 1,
                     .unit = known[k].unit, .smooth = known[k].smooth, .zero = known[k].zero};
        snprintf(p->title, sizeof p->title, "%s", known[k].title);
        snprintf(p->ylabel, sizeof p->ylabel, "%s", known[k].ylabel);
    }
    for (int r = 0; r < nr; r++)
        for (int i = 0; i < runs[r].ns && np < cap; i++)
            if (!listed(ps, np, runs[r].s[i].key)) generic_panel(&ps[np++], runs[r].s[i].key);
    return np;
}

// ---- axes ----

typedef struct axis {
    double lo, hi;     // data range shown
    double step;       // tick spacing (log2 axes: in powers of two)
    double div;        // tick labels show value / div (bytes: KiB, MiB, ...)
    const char *suffix; // unit suffix after the scaled label, or ""
    bool log2;
} axis;

// 1, 2 or 5 times a power of ten, near range / target.
static double nice_step(double range, int target) {
    double raw = range / target, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

static void make_axis(axis *a, double lo, double hi, unit u, bool is_x, bool zero) {
    *a = (axis){.div = 1, .suffix = "", .log2 = u == U_LOG2};
    if (a->log2) { // ticks at powers of two, 1, 2, 4 or 8 doublings apart
        lo = log2(lo), hi = log2(hi);
        if (hi - lo < 2) lo -= 1, hi += 1;
        double pad = 0.05 * (hi - lo);
        a->lo = lo - pad, a->hi = hi + pad;
        for (a->step = 1; (hi - lo) / a->step > 6; a->step *= 2) {}
        return;
    }
    if (zero && lo >= 0 && lo < 0.3 * hi) lo = 0; // near-zero quantities: show zero
    if (hi - lo < 1e-12 * fmax(1, fabs(hi))) {     // flat: give it some height
        double pad = lo != 0 ? fabs(lo) * 0.1 : 1;
        lo -= pad, hi += pad;
        if (!is_x && lo < 0 && hi > 0 && u != U_PLAIN) lo = 0;
    }
    if (!is_x) {
        double pad = 0.05 * (hi - lo);
        hi += pad;
        if (lo != 0) lo -= pad;
    }
    a->lo = lo, a->hi = hi;
    a->step = nice_step(hi - lo, is_x ? 8 : 5);
    if (is_x && a->step < 1) a->step = 1; // steps are whole numbers
    if (u == U_BYTES) {
        static const char *units[] = {" B", " KiB", " MiB", " GiB", " TiB"};
        int k = 0;
        while (k < 4 && fmax(fabs(lo), fabs(hi)) >= 1024.0 * pow(1024, k)) k++;
        a->div = pow(1024, k);
        a->suffix = units[k];
        a->step = nice_step((hi - lo) / a->div, 5) * a->div;
    }
}

// Label of tick value v: decimals from the tick spacing; k/M/G for large numbers; a short
// exponent form ("6e-4") for small ones.
static void tick_label(char *out, size_t cap, double v, const axis *a) {
    if (a->log2) {
        double p = pow(2, v);
        if (p >= 1024 * 1024) snprintf(out, cap, "2^%.0f", v);
        else if (p >= 1.0 / 1024) snprintf(out, cap, "%g", p);
        else snprintf(out, cap, "2^%.0f", v);
        return;
    }
    double s = a->step / a->div, x = v / a->div;
    if (fabs(x) < s * 1e-6) x = 0;
    double big = fmax(fabs(a->lo), fabs(a->hi)) / a->div;
    if (big >= 1e4 && a->div == 1) {
        static const char *si[] = {"", "k", "M", "G", "T"};
        int k = 0;
        while (k < 4 && big >= 1e3 * pow(1e3, k)) k++;
        double d = pow(1e3, k);
        int dec = (int)fmax(0, -floor(log10(s / d) + 1e-9));
        snprintf(out, cap, "%.*f%s%s", dec, x / d, x == 0 ? "" : si[k], a->suffix);
    } else if (big < 1e-2 && big > 0) { // each label its own short exponent form: 5e-4, 1.5e-3
        if (x == 0) {
            snprintf(out, cap, "0");
            return;
        }
        int e = (int)floor(log10(fabs(x)) + 1e-9);
        double m = x / pow(10, e);
        int dec = 0;
        while (dec < 3 && fabs(m * pow(10, dec) - round(m * pow(10, dec))) > 1e-6) dec++;
        snprintf(out, cap, "%.*fe%d", dec, m, e);
    } else {
        int dec = (int)fmax(0, -floor(log10(s) + 1e-9));
        snprintf(out, cap, "%.*f%s", dec, x, a->suffix);
    }
}

// ---- SVG ----

static const char *palette[MAX_RUNS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                        "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

enum { WIDTH = 1280, COLS = 2, PANEL_W = 620, PANEL_H = 330, GAP = 20, HEAD = 40 };
enum { PL = 78, PR = 18, PT = 34, PB = 46 }; // plot area insets inside a panel

typedef struct frame {
    double x0, y0, w, h; // plot area in pixels
    axis ax, ay;
} frame;

static double px(const frame *f, double x) {
    return f->x0 + (x - f->ax.lo) / (f->ax.hi - f->ax.lo) * f->w;
}
static double py(const frame *f, double y) {
    double v = f->ay.log2 ? log2(y) : y;
    return f->y0 + f->h - (v - f->ay.lo) / (f->ay.hi - f->ay.lo) * f->h;
}

static void xml_text(FILE *o, const char *s) {
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", o);
        else if (*s == '<') fputs("&lt;", o);
        else if (*s == '>') fputs("&gt;", o);
        else if (*s == '"') fputs("&quot;", o);
        else fputc(*s, o);
    }
}

static bool usable(double y, unit u) { return isfinite(y) && (u != U_LOG2 || y > 0); }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// x range and y range of the panel's data. Noisy rates and norms (smoothed, zero-based panels)
// ignore the top and bottom 0.5% of values, as TensorBoard ignores outliers: one spike would
// otherwise flatten the rest. Losses always show every point.
static void data_range(run *runs, int nr, const panel *p, double r[4]) {
    r[0] = r[2] = INFINITY, r[1] = r[3] = -INFINITY;
    size_t total = 0, n = 0;
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < p->nkeys; k++) {
            series *s = find_series(&runs[i], p->keys[k], false);
            total += s ? s->n : 0;
        }
    double *ys = p->smooth && p->zero ? malloc((total + 1) * sizeof *ys) : NULL;
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < p->nkeys; k++) {
            series *s = find_series(&runs[i], p->keys[k], false);
            for (size_t j = 0; s && j < s->n; j++) {
                if (!usable(s->y[j], p->unit)) continue;
                double y = p->unit == U_PERCENT ? 100 * s->y[j] : s->y[j];
                r[0] = fmin(r[0], s->x[j]), r[1] = fmax(r[1], s->x[j]);
                r[2] = fmin(r[2], y), r[3] = fmax(r[3], y);
                if (ys) ys[n++] = y;
            }
        }
    if (ys && n >= 200) {
        qsort(ys, n, sizeof *ys, cmp_double);
        r[2] = ys[n / 200];
        r[3] = ys[n - 1 - n / 200];
    }
    free(ys);
}

static void draw_axes(FILE *o, const frame *f, const panel *p) {
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fbfbfb\" "
            "stroke=\"#bbb\"/>\n", f->x0, f->y0, f->w, f->h);
    char label[64];
    const axis *ay = &f->ay, *ax = &f->ax;
    double first_y = ceil(ay->lo / ay->step - 1e-9) * ay->step;
    for (double v = first_y; v <= ay->hi + 1e-9 * ay->step; v += ay->step) {
        double y = f->y0 + f->h - (v - ay->lo) / (ay->hi - ay->lo) * f->h;
        tick_label(label, sizeof label, v, ay);
        fprintf(o, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"end\">%s</text>\n",
                f->x0, f->x0 + f->w, y, y, f->x0 - 6, y + 4, label);
    }
    double first_x = ceil(ax->lo / ax->step - 1e-9) * ax->step;
    for (double v = first_x; v <= ax->hi + 1e-9 * ax->step; v += ax->step) {
        double x = px(f, v);
        tick_label(label, sizeof label, v, ax);
        fprintf(o, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>"
                "<text x=\"%.1f\" y=\"%.1f\" class=\"tick\" text-anchor=\"middle\">%s</text>\n",
                x, x, f->y0, f->y0 + f->h, x, f->y0 + f->h + 16, label);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" class=\"axis\" text-anchor=\"middle\">step</text>\n",
            f->x0 + f->w / 2, f->y0 + f->h + 36);
    double cy = f->y0 + f->h / 2;
    fprintf(o, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" class=\"axis\" "
            "text-anchor=\"middle\">", f->x0 - 60, cy);
    xml_text(o, p->ylabel);
    fputs("</text>\n<text class=\"title\" ", o);
    fprintf(o, "x=\"%.1f\" y=\"%.1f\">", f->x0, f->y0 - 12);
    xml_text(o, p->title);
    fputs("</text>\n", o);
}

// TensorBoard's smoothing: an exponential moving average, debiased at the start.
static void ema(const double *y, double *out, size_t n, double w) {
    double acc = 0, norm = 0;
    for (size_t i = 0; i < n; i++) {
        acc = acc * w + (1 - w) * y[i];
        norm = norm * w + (1 - w);
        out[i] = acc / norm;
    }
}

// Noisy when consecutive points jump about more than the curve bends: the mean distance of a
// point from the midpoint of its neighbours, against the series' range.
static bool noisy(const double *y, size_t n) {
    double lo = INFINITY, hi = -INFINITY, dev = 0;
    for (size_t i = 0; i < n; i++) lo = fmin(lo, y[i]), hi = fmax(hi, y[i]);
    for (size_t i = 1; i + 1 < n; i++) dev += fabs(y[i] - 0.5 * (y[i - 1] + y[i + 1]));
    return n > 30 && hi > lo && dev / (double)(n - 2) > 0.01 * (hi - lo);
}

// A polyline through the points, at most two per pixel column (its lowest and highest) so that
// long runs stay small without hiding spikes.
static void polyline(FILE *o, const frame *f, const double *x, const double *y, size_t n,
                     const char *style) {
    fprintf(o, "<polyline %s points=\"", style);
    size_t i = 0;
    while (i < n) {
        long col = lround(px(f, x[i]));
        size_t lo = i, hi = i, j = i;
        for (; j < n && lround(px(f, x[j])) == col; j++) {
            if (y[j] < y[lo]) lo = j;
            if (y[j] > y[hi]) hi = j;
        }
        size_t a = lo < hi ? lo : hi, b = lo < hi ? hi : lo;
        fprintf(o, "%.1f,%.1f ", px(f, x[a]), py(f, y[a]));
        if (b != a) fprintf(o, "%.1f,%.1f ", px(f, x[b]), py(f, y[b]));
        i = j;
    }
    fputs("\"/>\n", o);
}

// One series of one run: finite points only, percent scaled; smoothed when asked.
static void draw_series(FILE *o, const frame *f, const series *s, const panel *p, int k,
                        const char *colour, double smooth) {
    double *x = malloc(s->n * sizeof *x), *y = malloc(s->n * sizeof *y);
    double *sm = malloc(s->n * sizeof *sm);
    size_t n = 0;
    for (size_t j = 0; x && y && sm && j < s->n; j++)
        if (usable(s->y[j], p->unit)) {
            x[n] = s->x[j];
            y[n++] = p->unit == U_PERCENT ? 100 * s->y[j] : s->y[j];
        }
    char style[160];
    if (n == 0) { // nothing finite to draw
    } else if (k == 1) { // validation: dashed, with a dot per evaluation
        snprintf(style, sizeof style, "fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" "
                 "stroke-dasharray=\"6 4\"", colour);
        polyline(o, f, x, y, n, style);
        for (size_t j = 0; j < n && n <= 400; j++)
            fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.8\" fill=\"%s\"/>\n", px(f, x[j]),
                    py(f, y[j]), colour);
    } else if (p->smooth && smooth != 0 && noisy(y, n)) {
        // auto (negative): a memory of about n / 100 points, within 0.6..0.95
        if (smooth < 0) smooth = fmin(0.95, fmax(0.6, 1 - 100.0 / (double)n));
        snprintf(style, sizeof style, "fill=\"none\" stroke=\"%s\" stroke-opacity=\"0.25\" "
                 "stroke-width=\"1\"", colour);
        polyline(o, f, x, y, n, style);
        ema(y, sm, n, smooth);
        snprintf(style, sizeof style, "fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"", colour);
        polyline(o, f, x, sm, n, style);
    } else if (n == 1) { // a line needs two points
        fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(f, x[0]),
                py(f, y[0]), colour);
    } else {
        snprintf(style, sizeof style, "fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"%s", colour,
                 p->unit == U_LOG2 ? " stroke-linejoin=\"miter\"" : "");
        polyline(o, f, x, y, n, style);
    }
    free(x);
    free(y);
    free(sm);
}

static void draw_key(FILE *o, const frame *f) {
    double x = f->x0 + f->w - 190, y = f->y0 + 10;
    fprintf(o, "<rect x=\"%.1f\" y=\"%.1f\" width=\"182\" height=\"24\" fill=\"white\" "
            "fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n", x, y);
    fprintf(o, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
            "stroke-width=\"1.8\"/><text x=\"%.1f\" y=\"%.1f\" class=\"key\">train</text>\n",
            x + 8, x + 30, y + 12, y + 12, x + 35, y + 16);
    fprintf(o, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#444\" "
            "stroke-width=\"1.6\" stroke-dasharray=\"6 4\"/><circle cx=\"%.1f\" cy=\"%.1f\" "
            "r=\"2.8\" fill=\"#444\"/><text x=\"%.1f\" y=\"%.1f\" class=\"key\">validation"
            "</text>\n",
            x + 80, x + 104, y + 12, y + 12, x + 92, y + 12, x + 109, y + 16);
}

static void draw_panel(FILE *o, run *runs, int nr, const panel *p, double left, double top,
                       double smooth) {
    double r[4];
    data_range(runs, nr, p, r);
    frame f = {.x0 = left + PL, .y0 = top + PT, .w = PANEL_W - PL - PR, .h = PANEL_H - PT - PB};
    make_axis(&f.ax, r[0], r[1], U_PLAIN, true, false);
    make_axis(&f.ay, r[2], r[3], p->unit, false, p->zero);
    fprintf(o, "<g>\n");
    draw_axes(o, &f, p);
    // curves are clipped to the plot area, less a margin that keeps edge markers whole
    double m = 4;
    fprintf(o, "<svg x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" viewBox=\"%.1f %.1f %.1f "
            "%.1f\" overflow=\"hidden\">\n", f.x0 - m, f.y0 - m, f.w + 2 * m, f.h + 2 * m, f.x0 - m,
            f.y0 - m, f.w + 2 * m, f.h + 2 * m);
    for (int i = 0; i < nr; i++)
        for (int k = 0; k < p->nkeys; k++) {
            series *s = find_series(&runs[i], p->keys[k], false);
            if (s) draw_series(o, &f, s, p, k, palette[i], smooth);
        }
    fputs("</svg>\n", o);
    if (p->nkeys == 2) draw_key(o, &f);
    fputs("</g>\n", o);
}

// Last value of a key in a run (NAN when absent), for the legend.
static double last_value(run *r, const char *key, bool minimum) {
    series *s = find_series(r, key, false);
    double v = NAN;
    for (size_t j = 0; s && j < s->n; j++)
        if (isfinite(s->y[j]) && (!minimum || !(v <= s->y[j]))) v = s->y[j];
    return v;
}

static void draw_legend(FILE *o, run *runs, int nr) {
    fputs("<text x=\"20\" y=\"28\" class=\"head\">dsc training metrics</text>\n", o);
    for (int i = 0; i < nr; i++) {
        double y = HEAD + 14 + 20 * i;
        char extra[160] = "";
        double loss = last_value(&runs[i], "loss", false);
        double val = last_value(&runs[i], "val_loss", true);
        size_t cap = sizeof extra;
        int k = snprintf(extra, sizeof extra, ": %lld step%s", runs[i].last_step,
                         runs[i].last_step == 1 ? "" : "s");
        if (isfinite(loss)) k += snprintf(extra + k, cap - (size_t)k, ", last loss %.4f", loss);
        if (isfinite(val)) k += snprintf(extra + k, cap - (size_t)k, ", best val %.4f", val);
        if (runs[i].skipped)
            snprintf(extra + k, cap - (size_t)k, ", %lld skipped (overflow)", runs[i].skipped);
        fprintf(o, "<rect x=\"20\" y=\"%.1f\" width=\"22\" height=\"4\" fill=\"%s\"/>"
                "<text x=\"50\" y=\"%.1f\" class=\"run\">", y - 5, palette[i], y);
        xml_text(o, runs[i].name);
        fprintf(o, "<tspan class=\"muted\">%s</tspan></text>\n", extra);
    }
}

static int write_svg(const char *path, run *runs, int nr, double smooth) {
    panel ps[MAX_SERIES];
    int np = plan_panels(runs, nr, ps, MAX_SERIES);
    int rows = (np + COLS - 1) / COLS;
    double top = HEAD + 20 * nr + 16;
    double height = top + rows * (PANEL_H + GAP) + 10;
    FILE *o = fopen(path, "w");
    if (!o) {
        fprintf(stderr, "dsc plot: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    fprintf(o, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" "
            "width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\">\n<style>text{font-family:"
            "'DejaVu Sans',Helvetica,Arial,sans-serif;fill:#222}.tick{font-size:11px;fill:#555}"
            ".axis{font-size:12px;fill:#444}.title{font-size:14px;font-weight:bold}"
            ".head{font-size:18px;font-weight:bold}.run{font-size:13px}.muted{fill:#666}"
            ".key{font-size:11px}</style>\n"
            "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            WIDTH, height, WIDTH, height);
    draw_legend(o, runs, nr);
    for (int i = 0; i < np; i++)
        draw_panel(o, runs, nr, &ps[i], 10 + (i % COLS) * (PANEL_W + GAP),
                   top + (i / COLS) * (PANEL_H + GAP), smooth);
    fputs("</svg>\n", o);
    if (fclose(o) != 0) {
        fprintf(stderr, "dsc plot: cannot write %s: %s\n", path, strerror(errno));
        return 1;
    }
    return 0;
}

// ---- PNG ----

static int svg_to_png(const char *svg, const char *png) {
    char *argv[] = {"rsvg-convert", "--format", "png", "--background-color", "white", "--output",
                    (char *)png, (char *)svg, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "rsvg-convert", NULL, NULL, argv, environ);
    if (rc == ENOENT) {
        fprintf(stderr, "dsc plot: PNG output needs rsvg-convert (Debian package librsvg2-bin), "
                "which is not installed; install it or write an SVG with --out FILE.svg\n");
        return 1;
    }
    int status = 0;
    if (rc != 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "dsc plot: rsvg-convert failed to write %s%s%s\n", png, rc ? ": " : "",
                rc ? strerror(rc) : "");
        return 1;
    }
    return 0;
}

// ---- the verb ----

static int plot(char **dirs, int ndirs, const char *out, double smooth) {
    run *runs = calloc((size_t)ndirs, sizeof *runs);
    if (!runs) return 1;
    int rc = 0;
    for (int i = 0; i < ndirs && !rc; i++) rc = load_run(dirs[i], &runs[i]);
    bool png = ends_with(out, ".png") || ends_with(out, ".PNG");
    char svg[4200];
    if (png) snprintf(svg, sizeof svg, "%s.tmp.svg", out);
    else snprintf(svg, sizeof svg, "%s", out);
    if (!rc) rc = write_svg(svg, runs, ndirs, smooth);
    if (!rc && png) {
        rc = svg_to_png(svg, out);
        unlink(svg);
    }
    if (!rc) printf("dsc plot: wrote %s (%d run%s)\n", out, ndirs, ndirs > 1 ? "s" : "");
    for (int i = 0; i < ndirs; i++) run_free(&runs[i]);
    free(runs);
    return rc;
}

int cmd_plot(int argc, char **argv) {
    const char *out = NULL, *smooth_s = NULL;
    const cli_flag flags[] = {
        {"--out", "FILE", "FILE.svg or FILE.png (default: RUN_DIR/metrics.svg of the first run)",
         &out, NULL},
        {"--smooth", "W", "weight of the moving average drawn over noisy curves, 0..0.99 "
         "(default: from the number of steps, 0.6..0.95; 0 = raw curves only)", &smooth_s, NULL},
    };
    const cli_verb v = {"plot", "dsc plot RUN_DIR [RUN_DIR...] [--out FILE.svg|FILE.png]",
                        "Draw the training curves of one or more runs from their metrics.jsonl: "
                        "loss (train and validation), learning rate, tokens/s and every other "
                        "numeric series, against the step, several runs overlaid in different "
                        "colours. PNG needs rsvg-convert (Debian package librsvg2-bin).",
                        flags, (int)(sizeof flags / sizeof flags[0]), 1, MAX_RUNS};
    char *pos[MAX_RUNS];
    int npos = 0;
    int rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    double smooth = -1; // auto
    if (smooth_s && (!cli_double("--smooth", smooth_s, &smooth) || smooth < 0 || smooth > 0.99)) {
        fprintf(stderr, "dsc plot: --smooth takes a weight between 0 and 0.99\n");
        return 2;
    }
    char def[4200];
    if (!out) {
        struct stat sb;
        bool dir = stat(pos[0], &sb) == 0 && S_ISDIR(sb.st_mode);
        if (dir) snprintf(def, sizeof def, "%s/metrics.svg", pos[0]);
        else snprintf(def, sizeof def, "metrics.svg");
        out = def;
    }
    if (!ends_with(out, ".svg") && !ends_with(out, ".png") && !ends_with(out, ".PNG") &&
        !ends_with(out, ".SVG")) {
        fprintf(stderr, "dsc plot: --out %s: the name must end in .svg or .png\n", out);
        return 2;
    }
    return plot(pos, npos, out, smooth);
}
