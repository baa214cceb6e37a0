// data/prepare.c - text files -> tokenized train/val shards + dataset.json, and the built-in
// default dataset (system license texts, or generated text where those are absent).
#include "data/prepare.h"
#include "data/prepare_impl.h" // dsc__prepare_*

#include <dirent.h>   // opendir, readdir
#include <errno.h>    // errno, EEXIST
#include <fcntl.h>    // open, O_*
#include <jansson.h>  // json_*
#include <math.h>     // isfinite, llround
#include <pthread.h>  // pthread_*
#include <stdbool.h>  // bool
#include <stdio.h>    // FILE, fopen, fread, printf, rename, snprintf
#include <stdlib.h>   // free, malloc, qsort, realloc
#include <string.h>   // memcpy, strchr, strcmp, strdup, strerror, strlen
#include <sys/stat.h> // fstat, lstat, mkdir, S_IS*
#include <unistd.h>   // close, fsync, unlink, write

#include "base/io.h"        // dsc__fopen_regular
#include "base/log.h"       // DSC_INFO
#include "base/status.h"    // dsc__fail, DSC_TRY, dsc_last_error
#include "data/shard.h"     // dsc_shard_write
#include "data/tokenizer.h" // dsc_tokenizer_*

// One source document: a name for dataset.json and its bytes (owned).
typedef struct doc {
    char *name;
    char *text;
    size_t len;
} doc;

typedef struct doc_list {
    doc *v;
    int n, cap;
} doc_list;

// What build() did, for the summary line.
typedef struct build_result {
    int64_t train, val;
    int vocab;
} build_result;

// ---- internal: files ----

static void docs_free(doc_list *d) {
    for (int i = 0; i < d->n; i++) {
        free(d->v[i].name);
        free(d->v[i].text);
    }
    free(d->v);
    *d = (doc_list){0};
}

// Takes ownership of text.
static dsc_status docs_add(doc_list *d, const char *name, char *text, size_t len) {
    if (d->n == d->cap) {
        int cap = d->cap ? 2 * d->cap : 16;
        doc *v = realloc(d->v, (size_t)cap * sizeof *v);
        if (!v) {
            free(text);
            return dsc__fail(DSC_ERR_OOM, "data: out of memory");
        }
        d->v = v;
        d->cap = cap;
    }
    char *n = strdup(name);
    if (!n) {
        free(text);
        return dsc__fail(DSC_ERR_OOM, "data: out of memory");
    }
    d->v[d->n++] = (doc){n, text, len};
    return DSC_OK;
}

static dsc_status read_file(const char *path, char **text, size_t *len) {
    FILE *f;
    if (dsc__fopen_regular(path, &f) != DSC_OK) {
        dsc__error_prefix("input: ");
        return DSC_ERR_IO;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0) {
        fclose(f);
        return dsc__fail(DSC_ERR_IO, "input %s: %s", path, strerror(errno));
    }
    size_t n = (size_t)sb.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        fclose(f);
        return dsc__fail(DSC_ERR_OOM, "input %s: out of memory for %zu bytes", path, n);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return dsc__fail(DSC_ERR_IO, "input %s: read %zu of %zu bytes; was it changed while "
                         "being read?", path, got, n);
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return DSC_OK;
}

// mkdir -p.
static dsc_status make_dirs(const char *dir) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
        return dsc__fail(DSC_ERR_INVALID_ARG, "output folder path too long: %.80s...", dir);
    for (char *c = p + 1;; c++) {
        if (*c != '/' && *c != '\0') continue;
        char saved = *c;
        *c = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return dsc__fail(DSC_ERR_IO, "output folder %s: cannot create: %s", p,
                             strerror(errno));
        *c = saved;
        if (saved == '\0') break;
    }
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return dsc__fail(DSC_ERR_IO, "output folder %s: exists but is not a folder", dir);
    return DSC_OK;
}

// Write a small file atomically: path.tmp, fsync, rename.
static dsc_status write_atomic(const char *path, const char *data, size_t n) {
    char tmp[4224];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return dsc__fail(DSC_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    bool ok = write(fd, data, n) == (ssize_t)n && fsync(fd) == 0;
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        dsc_status st = dsc__fail(DSC_ERR_IO, "cannot write %s: %s; check free disk space", path,
                                  strerror(errno));
        unlink(tmp);
        return st;
    }
    return DSC_OK;
}

// ---- internal: tokenize, split, write ----

typedef struct tokens {
    int32_t *v;
    int64_t n, cap;
} tokens;

static dsc_status tokens_append(tokens *t, const int32_t *v, int64_t n) {
    if (n == 0) return DSC_OK; // an empty document: v may be NULL
    if (t->n + n > t->cap) {
        int64_t cap = t->cap ? t->cap : 1 << 16;
        while (cap < t->n + n) cap *= 2;
        int32_t *w = realloc(t->v, (size_t)cap * sizeof *w);
        if (!w)
            return dsc__fail(DSC_ERR_OOM, "data: out of memory for %lld tokens", (long long)cap);
        t->v = w;
        t->cap = cap;
    }
    memcpy(t->v + t->n, v, (size_t)n * sizeof *v);
    t->n += n;
    return DSC_OK;
}

// Tokenizing runs on several threads, each taking the next document; results are joined in
// document order, so the output does not depend on the thread count.
typedef struct tok_job {
    const dsc_tokenizer *tk;
    const doc_list *d;
    int32_t **ids;   // per document, caller-owned
    size_t *n;
    int next;        // next document to take (under mu)
    dsc_status st;   // first failure (under mu)
    char err[1024];
    pthread_mutex_t mu;
} tok_job;

static void *tok_worker(void *arg) {
    tok_job *j = arg;
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int i = j->st == DSC_OK ? j->next++ : j->d->n;
        pthread_mutex_unlock(&j->mu);
        if (i >= j->d->n) return NULL;
        dsc_status st = dsc_tokenizer_encode(j->tk, j->d->v[i].text, j->d->v[i].len, &j->ids[i],
                                             &j->n[i]);
        if (st == DSC_OK) continue;
        pthread_mutex_lock(&j->mu);
        if (j->st == DSC_OK) {
            j->st = st;
            snprintf(j->err, sizeof j->err, "%s", dsc_last_error()); // the error is per thread
        }
        pthread_mutex_unlock(&j->mu);
    }
}

static dsc_status tokenize_parallel(tok_job *j, int threads) {
    pthread_t tid[64];
    int started = 0;
    if (threads > 64) threads = 64;
    if (threads > j->d->n) threads = j->d->n;
    for (; started < threads - 1; started++)
        if (pthread_create(&tid[started], NULL, tok_worker, j) != 0) break;
    tok_worker(j); // this thread works too
    for (int k = 0; k < started; k++) pthread_join(tid[k], NULL);
    if (j->st != DSC_OK) return dsc__fail(j->st, "%s", j->err);
    return DSC_OK;
}

// Documents joined by eot (unless a document already ends with it: a tokenizer that appends
// EOS); per-document token counts go to counts (ndocs).
static dsc_status tokenize_docs(const dsc_tokenizer *tk, const doc_list *d, int threads,
                                tokens *all, int64_t *counts) {
    tok_job j = {.tk = tk, .d = d, .ids = calloc((size_t)d->n + 1, sizeof *j.ids),
                 .n = calloc((size_t)d->n + 1, sizeof *j.n)};
    dsc_status st = j.ids && j.n ? DSC_OK : dsc__fail(DSC_ERR_OOM, "data: out of memory");
    pthread_mutex_init(&j.mu, NULL);
    if (st == DSC_OK) st = tokenize_parallel(&j, threads > 0 ? threads : 1);
    int32_t eot = dsc_tokenizer_eot(tk);
    for (int i = 0; st == DSC_OK && i < d->n; i++) {
        bool join = i > 0 && eot >= 0 && (all->n == 0 || all->v[all->n - 1] != eot); // ids: none
        if (join) st = tokens_append(all, &eot, 1);
        if (st == DSC_OK) st = tokens_append(all, j.ids[i], (int64_t)j.n[i]);
        counts[i] = (int64_t)j.n[i];
    }
    for (int i = 0; j.ids && i < d->n; i++) free(j.ids[i]);
    free(j.ids);
    free(j.n);
    pthread_mutex_destroy(&j.mu);
    return st;
}

static json_t *describe(const dsc_tokenizer *tk, const doc_list *d, const int64_t *counts,
                        const build_result *r, double vf, const char *origin) {
    json_t *j = json_object(), *src = json_array();
    json_object_set_new(j, "format", json_string("dsc token shards (llm.c layout)"));
    json_object_set_new(j, "shard_version", json_integer(r->vocab <= 65536 ? 1 : 2));
    json_object_set_new(j, "tokenizer", json_string(dsc_tokenizer_spec(tk)));
    json_object_set_new(j, "vocab_size", json_integer(r->vocab));
    json_object_set_new(j, "eot", json_integer(dsc_tokenizer_eot(tk)));
    json_object_set_new(j, "documents", json_integer(d->n));
    json_object_set_new(j, "tokens", json_integer(r->train + r->val));
    json_object_set_new(j, "train_tokens", json_integer(r->train));
    json_object_set_new(j, "val_tokens", json_integer(r->val));
    json_object_set_new(j, "val_fraction", json_real(vf));
    if (origin) json_object_set_new(j, "origin", json_string(origin));
    for (int i = 0; i < d->n; i++) {
        json_t *s = json_object();
        json_object_set_new(s, "name", json_string(d->v[i].name));
        json_object_set_new(s, "bytes", json_integer((json_int_t)d->v[i].len));
        json_object_set_new(s, "tokens", json_integer(counts[i]));
        json_array_append_new(src, s);
    }
    json_object_set_new(j, "sources", src);
    return j;
}

static dsc_status write_json(const char *out_dir, json_t *j) {
    char path[4200];
    snprintf(path, sizeof path, "%s/dataset.json", out_dir);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (!s) return dsc__fail(DSC_ERR_OOM, "%s: out of memory", path);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2); // end the file with a newline
    if (!t) {
        free(s);
        return dsc__fail(DSC_ERR_OOM, "%s: out of memory", path);
    }
    t[n] = '\n';
    t[n + 1] = '\0';
    dsc_status st = write_atomic(path, t, n + 1);
    free(t);
    return st;
}

static dsc_status write_shards(const char *out_dir, const tokens *all, int64_t ntrain, int vocab) {
    char path[4200];
    snprintf(path, sizeof path, "%s/train.bin", out_dir);
    DSC_TRY(dsc_shard_write(path, all->v, ntrain, vocab));
    snprintf(path, sizeof path, "%s/val.bin", out_dir);
    return dsc_shard_write(path, all->v + ntrain, all->n - ntrain, vocab);
}

// Tokenize the documents, split the last vf of the tokens off as validation, write the folder.
static dsc_status build(const char *out_dir, const char *spec, const doc_list *d, double vf,
                        int threads, const char *origin, build_result *r) {
    if (strlen(out_dir) > 4000)
        return dsc__fail(DSC_ERR_INVALID_ARG, "output folder path too long: %.80s...", out_dir);
    dsc_tokenizer *tk = NULL;
    tokens all = {0};
    json_t *j = NULL;
    int64_t *counts = calloc((size_t)d->n + 1, sizeof *counts);
    dsc_status st = counts ? DSC_OK : dsc__fail(DSC_ERR_OOM, "data: out of memory");
    if (st != DSC_OK) return st;
    DSC_TRY_GOTO(dsc_tokenizer_create(&tk, spec), st, done);
    DSC_TRY_GOTO(tokenize_docs(tk, d, threads, &all, counts), st, done);
    int64_t text_tokens = 0; // end-of-text separators between empty documents do not count
    for (int i = 0; i < d->n; i++) text_tokens += counts[i];
    if (text_tokens == 0) {
        st = dsc__fail(DSC_ERR_INVALID_ARG, "data prepare: the input (%s%s) holds no text, so "
                       "there are no tokens; nothing was written to %s; give files that contain "
                       "text", d->n ? d->v[0].name : "no files", d->n > 1 ? " and the others" : "",
                       out_dir);
        goto done;
    }
    r->vocab = dsc_tokenizer_vocab_size(tk);
    r->val = (int64_t)llround((double)all.n * vf);
    r->train = all.n - r->val;
    DSC_TRY_GOTO(make_dirs(out_dir), st, done);
    DSC_TRY_GOTO(write_shards(out_dir, &all, r->train, r->vocab), st, done);
    j = describe(tk, d, counts, r, vf, origin);
    st = j ? write_json(out_dir, j) : dsc__fail(DSC_ERR_OOM, "data: out of memory");
done:
    json_decref(j);
    free(all.v);
    free(counts);
    dsc_tokenizer_destroy(tk);
    return st;
}

// ---- internal: the default dataset ----

static int cmp_doc(const void *a, const void *b) {
    return strcmp(((const doc *)a)->name, ((const doc *)b)->name);
}

// Regular files of dir (symlinks skipped: they duplicate files there), sorted by name.
static dsc_status read_dir_docs(const char *dir, doc_list *d, size_t *total) {
    *total = 0;
    DIR *dp = opendir(dir);
    if (!dp) return DSC_OK; // absent: the caller falls back to generated text
    dsc_status st = DSC_OK;
    for (struct dirent *e; st == DSC_OK && (e = readdir(dp));) {
        char path[8192];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        char *text;
        size_t len;
        if (read_file(path, &text, &len) != DSC_OK) continue; // unreadable: not our data
        st = docs_add(d, e->d_name, text, len);
        *total += len;
    }
    closedir(dp);
    if (st == DSC_OK && d->n > 1) qsort(d->v, (size_t)d->n, sizeof *d->v, cmp_doc);
    return st;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static dsc_status generated_docs(doc_list *d) {
    for (int i = 0; i < DSC_DEFAULT_GENERATED_DOCS; i++) {
        char name[32], *text;
        size_t len;
        snprintf(name, sizeof name, "generated-%02d", i);
        uint64_t seed = mix64(DSC_DEFAULT_SEED + (uint64_t)i * 0x9e3779b97f4a7c15ull);
        DSC_TRY(dsc_data_generate_text(seed, DSC_DEFAULT_GENERATED_DOC_BYTES, &text, &len));
        DSC_TRY(docs_add(d, name, text, len));
    }
    return DSC_OK;
}

// ---- internal: the text generator ----

typedef struct gen {
    uint64_t state;
    char *buf;
    size_t len, cap;
    bool oom;
} gen;

static uint32_t gen_below(gen *g, uint32_t n) {
    g->state += 0x9e3779b97f4a7c15ull;
    return (uint32_t)(((mix64(g->state) >> 32) * n) >> 32);
}

static void gen_put(gen *g, const char *s) {
    size_t n = strlen(s);
    if (g->len + n + 1 > g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 4096;
        while (cap < g->len + n + 1) cap *= 2;
        char *b = realloc(g->buf, cap);
        if (!b) {
            g->oom = true;
            return;
        }
        g->buf = b;
        g->cap = cap;
    }
    memcpy(g->buf + g->len, s, n + 1);
    g->len += n;
}

#define PICK(g, words) ((words)[gen_below((g), sizeof(words) / sizeof((words)[0]))])

static const char *const DET[] = {"the", "a", "every", "this", "that", "one", "my", "our",
                                  "their", "some", "his", "her"};
static const char *const ADJ[] = {
    "small", "large", "old", "new", "quiet", "bright", "dark", "warm", "cold", "green",
    "red", "happy", "careful", "early", "late", "long", "short", "simple", "strange", "gentle",
    "heavy", "light", "busy", "empty", "full", "young", "clever", "tired", "kind", "proud"};
static const char *const NOUN[] = {
    "cat", "dog", "house", "river", "city", "teacher", "child", "garden", "window", "book",
    "road", "tree", "friend", "market", "letter", "mountain", "table", "village", "ship",
    "bird", "door", "song", "farmer", "doctor", "story", "clock", "bridge", "field", "lamp",
    "kitchen", "forest", "train", "student", "king", "horse", "boat", "island", "school",
    "room", "apple", "idea", "evening", "orange", "engine", "owl", "answer"};
static const char *const VERB[] = {
    "saw", "found", "opened", "carried", "watched", "painted", "followed", "visited", "built",
    "cleaned", "helped", "remembered", "closed", "moved", "liked", "wrote", "read", "bought",
    "sold", "called", "crossed", "heard", "left", "kept", "brought", "showed", "took", "made",
    "met", "answered"};
static const char *const PREP[] = {"near", "behind", "under", "beside", "across", "inside",
                                   "above", "beyond", "along", "around", "before", "after"};
static const char *const ADV[] = {"slowly", "quickly", "quietly", "often", "never", "always",
                                  "carefully", "suddenly", "happily", "again"};
static const char *const CONJ[] = {"and", "but", "so", "because", "while", "until"};
static const char *const OPENER[] = {"Yesterday", "In the morning", "Later", "At night",
                                     "After a while", "Once", "Every day", "Then", "Today",
                                     "In the spring"};

// "a" becomes "an" before a vowel, as in English.
static void gen_noun_phrase(gen *g) {
    const char *det = PICK(g, DET), *adj = gen_below(g, 2) ? PICK(g, ADJ) : NULL;
    const char *noun = PICK(g, NOUN), *next = adj ? adj : noun;
    bool an = strcmp(det, "a") == 0 && strchr("aeiou", next[0]);
    gen_put(g, an ? "an" : det);
    if (adj) {
        gen_put(g, " ");
        gen_put(g, adj);
    }
    gen_put(g, " ");
    gen_put(g, noun);
}

static void gen_clause(gen *g) {
    gen_noun_phrase(g);
    if (gen_below(g, 4) == 0) {
        gen_put(g, " ");
        gen_put(g, PICK(g, ADV));
    }
    gen_put(g, " ");
    gen_put(g, PICK(g, VERB));
    gen_put(g, " ");
    gen_noun_phrase(g);
    if (gen_below(g, 3) == 0) {
        gen_put(g, " ");
        gen_put(g, PICK(g, PREP));
        gen_put(g, " ");
        gen_noun_phrase(g);
    }
}

static void gen_sentence(gen *g) {
    size_t start = g->len;
    if (gen_below(g, 4) == 0) {
        gen_put(g, PICK(g, OPENER));
        gen_put(g, ", ");
    }
    gen_clause(g);
    if (gen_below(g, 3) == 0) {
        gen_put(g, gen_below(g, 2) ? ", " : " ");
        gen_put(g, PICK(g, CONJ));
        gen_put(g, " ");
        gen_clause(g);
    }
    gen_put(g, gen_below(g, 10) == 0 ? "!" : ".");
    if (!g->oom && g->buf[start] >= 'a' && g->buf[start] <= 'z') g->buf[start] -= 'a' - 'A';
}

// ---- public API ----

dsc_status dsc_data_generate_text(uint64_t seed, size_t nbytes, char **text, size_t *len) {
    gen g = {.state = seed};
    gen_put(&g, "");
    while (!g.oom && g.len < nbytes) {
        int sentences = 3 + (int)gen_below(&g, 5);
        for (int s = 0; s < sentences; s++) {
            if (s > 0) gen_put(&g, " ");
            gen_sentence(&g);
        }
        gen_put(&g, "\n\n");
    }
    if (g.oom) {
        free(g.buf);
        return dsc__fail(DSC_ERR_OOM, "data: out of memory generating %zu bytes of text", nbytes);
    }
    *text = g.buf;
    *len = g.len;
    return DSC_OK;
}

static dsc_status check_opts(const dsc_prepare_opts *o) {
    if (!o->inputs || o->ninputs <= 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data prepare: no input files; pass --input FILE...");
    if (!o->out_dir || !o->out_dir[0])
        return dsc__fail(DSC_ERR_INVALID_ARG, "data prepare: no output folder; pass --out DIR");
    if (!isfinite(o->val_fraction) || o->val_fraction < 0 || o->val_fraction >= 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data prepare: --val-fraction %g must be in [0, 1)",
                         o->val_fraction);
    return DSC_OK;
}

dsc_status dsc_data_prepare(const dsc_prepare_opts *o) {
    DSC_TRY(check_opts(o));
    if (dsc__prepare_is_examples(o)) return dsc__prepare_examples(o); // prepare_sft.c
    const char *spec = o->tokenizer ? o->tokenizer : "byte";
    doc_list d = {0};
    dsc_status st = DSC_OK;
    for (int i = 0; i < o->ninputs && st == DSC_OK; i++) {
        char *text;
        size_t len;
        st = read_file(o->inputs[i], &text, &len);
        if (st == DSC_OK) st = docs_add(&d, o->inputs[i], text, len);
    }
    build_result r = {0};
    if (st == DSC_OK) st = build(o->out_dir, spec, &d, o->val_fraction, o->threads, NULL, &r);
    if (st == DSC_OK)
        printf("data prepare: %d document(s), %lld tokens (train %lld, val %lld), tokenizer %s "
               "(vocab %d) -> %s/{train.bin,val.bin,dataset.json}\n",
               d.n, (long long)(r.train + r.val), (long long)r.train, (long long)r.val, spec,
               r.vocab, o->out_dir);
    docs_free(&d);
    return st;
}

dsc_status dsc_data_default(const char *out_dir, const char *source_dir) {
    const char *dir = source_dir ? source_dir : DSC_DEFAULT_TEXT_DIR;
    doc_list d = {0};
    size_t total = 0;
    char origin[4400];
    dsc_status st = read_dir_docs(dir, &d, &total);
    if (st == DSC_OK && total >= DSC_DEFAULT_MIN_BYTES) {
        snprintf(origin, sizeof origin, "license texts from %s", dir);
    } else if (st == DSC_OK) {
        docs_free(&d);
        snprintf(origin, sizeof origin, "generated English-like text (seed %u): %s is missing "
                 "or holds less than %d bytes", DSC_DEFAULT_SEED, dir, DSC_DEFAULT_MIN_BYTES);
        st = generated_docs(&d);
    }
    build_result r = {0};
    if (st == DSC_OK) st = build(out_dir, "byte", &d, DSC_PREPARE_VAL_FRACTION, 1, origin, &r);
    if (st == DSC_OK)
        DSC_INFO("data", "default dataset in %s: %lld train + %lld val byte tokens from %s",
                 out_dir, (long long)r.train, (long long)r.val, origin);
    docs_free(&d);
    return st;
}

// ---- internal, shared with prepare_sft.c (prepare_impl.h) ----

dsc_status dsc__prepare_read_file(const char *path, char **text, size_t *len) {
    return read_file(path, text, len);
}

dsc_status dsc__prepare_make_dirs(const char *dir) { return make_dirs(dir); }

dsc_status dsc__prepare_write_json(const char *out_dir, json_t *j) {
    return write_json(out_dir, j);
}
