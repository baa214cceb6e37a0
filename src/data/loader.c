// data/loader.c - windows over concatenated shards, seeded per-epoch permutations, and a
// background thread that computes the batch the caller is expected to ask for next.
#include "data/loader.h"

#include <dirent.h>  // opendir, readdir
#include <errno.h>   // errno
#include <pthread.h> // pthread_*
#include <stdio.h>   // snprintf
#include <stdlib.h>  // calloc, free, malloc, qsort, realloc
#include <string.h>  // memcpy, strcmp, strdup, strerror, strlen, strncmp
#include <sys/stat.h> // stat, S_ISDIR

#include "base/status.h" // dsc__fail, DSC_TRY
#include "data/shard.h"  // dsc_shard_*

#define MAX_PREFETCH 64
#define PERM_CACHE 2 // epochs whose permutation is kept; a batch may straddle two epochs

enum { SLOT_FREE, SLOT_PENDING, SLOT_RUNNING, SLOT_DONE };

// One prefetched batch. The worker owns in/tg while RUNNING; the caller reads them when DONE.
typedef struct pf_slot {
    int state;
    int64_t first;
    int n;
    uint64_t seq;     // pick order among PENDING slots; 0 = a caller is waiting for it
    int32_t *in, *tg, *pos; // (n, T) each
    size_t cap;       // ints allocated in each of in, tg
    dsc_status st;
    char err[1024];
} pf_slot;

struct dsc_loader {
    char path[4096];
    int T;
    int row;           // tokens per window step: T (a stream), or the packed rows' length T + 1
    bool restart;      // positions restart at each document start
    bool flagged;      // some shard carries flags (versions 3-4)
    bool masked;       // some token is not a target
    uint64_t seed;
    bool shuffle;
    dsc_shard *shards;
    int nshards;
    int64_t *begin; // nshards + 1: global index of each shard's first token; begin[n] = ntok
    int64_t ntok, nwin;
    int max_token;
    struct {
        int64_t epoch; // -1 = empty
        int64_t *perm; // (nwin,)
    } perms[PERM_CACHE];
    int perm_victim;
    // Prefetching (all fields below are guarded by mu).
    pf_slot *slots;
    int nslots;
    int64_t stride;
    uint64_t seq;
    int64_t hits; // calls served by a batch that was queued before the call
    bool stop, has_thread;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

// ---- internal: opening ----

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_shard_name(const char *name, const char *split) {
    size_t n = strlen(name), p = strlen(split);
    return n >= p + 4 && strncmp(name, split, p) == 0 && strcmp(name + n - 4, ".bin") == 0;
}

// Sorted names of <split>*.bin in dir; caller frees each and the array.
static dsc_status list_shards(const char *dir, const char *split, char ***names, int *n) {
    DIR *d = opendir(dir);
    if (!d)
        return dsc__fail(DSC_ERR_IO, "data folder %s: cannot open: %s; check the path", dir,
                         strerror(errno));
    char **v = NULL;
    int count = 0, cap = 0;
    dsc_status st = DSC_OK;
    for (struct dirent *e; st == DSC_OK && (e = readdir(d));) {
        if (!is_shard_name(e->d_name, split)) continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            char **w = realloc(v, (size_t)cap * sizeof *w);
            if (!w) st = dsc__fail(DSC_ERR_OOM, "data folder %s: out of memory", dir);
            else v = w;
        }
        if (st == DSC_OK && !(v[count++] = strdup(e->d_name)))
            st = dsc__fail(DSC_ERR_OOM, "data folder %s: out of memory", dir);
    }
    closedir(d);
    if (st == DSC_OK && count == 0)
        st = dsc__fail(DSC_ERR_INVALID_ARG, "data folder %s has no %s*.bin shards; create them "
                       "with `dsc data prepare --out %s`", dir, split, dir);
    if (st != DSC_OK) {
        for (int i = 0; i < count; i++) free(v[i]);
        free(v);
        return st;
    }
    qsort(v, (size_t)count, sizeof *v, cmp_str);
    *names = v;
    *n = count;
    return DSC_OK;
}

static dsc_status open_shards(dsc_loader *l, const char *split) {
    struct stat sb;
    if (stat(l->path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char **names = NULL;
        int n = 0;
        DSC_TRY(list_shards(l->path, split, &names, &n));
        dsc_status st = DSC_OK;
        l->shards = calloc((size_t)n, sizeof *l->shards);
        if (!l->shards) st = dsc__fail(DSC_ERR_OOM, "data folder %s: out of memory", l->path);
        for (int i = 0; i < n; i++) {
            char file[8192];
            snprintf(file, sizeof file, "%s/%s", l->path, names[i]);
            if (st == DSC_OK && (st = dsc_shard_open(&l->shards[i], file)) == DSC_OK)
                l->nshards = i + 1;
            free(names[i]);
        }
        free(names);
        return st;
    }
    l->shards = calloc(1, sizeof *l->shards);
    if (!l->shards) return dsc__fail(DSC_ERR_OOM, "data %s: out of memory", l->path);
    DSC_TRY(dsc_shard_open(&l->shards[0], l->path));
    l->nshards = 1;
    return DSC_OK;
}

static int shard_max(const dsc_shard *s) {
    int m = -1;
    for (int64_t i = 0; i < s->ntok; i++) {
        int v = dsc_shard_token(s, i);
        m = v > m ? v : m;
    }
    return m;
}

// Flags: only defined bits; note whether any token is left out of the loss.
static dsc_status scan_flags(dsc_loader *l, const dsc_shard *s) {
    if (!s->flags) return DSC_OK;
    l->flagged = true;
    for (int64_t i = 0; i < s->ntok; i++) {
        if (s->flags[i] & ~(DSC_TOK_TARGET | DSC_TOK_DOC))
            return dsc__fail(DSC_ERR_CORRUPT, "data shard %s: flag byte %lld is 0x%02x (undefined "
                             "bits); re-create it with `dsc data prepare`", s->path, (long long)i,
                             s->flags[i]);
        if (!(s->flags[i] & DSC_TOK_TARGET)) l->masked = true;
    }
    return DSC_OK;
}

// Every shard packed in rows of the same length (T + 1 tokens), or none packed.
static dsc_status check_rows(dsc_loader *l) {
    int row = l->shards[0].row;
    for (int i = 1; i < l->nshards; i++)
        if (l->shards[i].row != row)
            return dsc__fail(DSC_ERR_CORRUPT, "data %s: shard %s has rows of %d tokens, shard %s "
                             "of %d; prepare every shard with the same --seq-len", l->path,
                             l->shards[i].path, l->shards[i].row, l->shards[0].path, row);
    if (row > 0 && row != l->T + 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data %s was packed into rows of %d tokens "
                         "(`dsc data prepare --seq-len %d`), but the sequence length is %d; train "
                         "with --seq-len %d or prepare the data again", l->path, row, row - 1,
                         l->T, row - 1);
    l->row = row > 0 ? row : l->T;
    return DSC_OK;
}

static dsc_status index_shards(dsc_loader *l, const char *split) {
    l->begin = malloc(((size_t)l->nshards + 1) * sizeof *l->begin);
    if (!l->begin) return dsc__fail(DSC_ERR_OOM, "data %s: out of memory", l->path);
    l->begin[0] = 0;
    l->max_token = -1;
    for (int i = 0; i < l->nshards; i++) {
        l->begin[i + 1] = l->begin[i] + l->shards[i].ntok;
        int m = shard_max(&l->shards[i]);
        l->max_token = m > l->max_token ? m : l->max_token;
        DSC_TRY(scan_flags(l, &l->shards[i]));
    }
    DSC_TRY(check_rows(l));
    if (l->restart && !l->flagged)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data %s: restarting positions at each document "
                         "needs document starts, which plain token shards lack; prepare the data "
                         "with `dsc data prepare --seq-len N`", l->path);
    l->ntok = l->begin[l->nshards];
    if (l->ntok < (int64_t)l->T + 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data %s (split %s): %lld tokens, but one sample "
                         "needs T+1 = %d; use a shorter sequence length or more data", l->path,
                         split, (long long)l->ntok, l->T + 1);
    l->nwin = l->row > l->T ? l->ntok / l->row : (l->ntok - 1) / l->T;
    return DSC_OK;
}

// ---- internal: samples ----

static uint64_t mix64(uint64_t x) { // splitmix64 finalizer: a bijection with good avalanche
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Fisher-Yates where step i draws from a counter-based generator keyed by (seed, epoch), so the
// permutation is a pure function of (seed, epoch, nwin). j = floor(r * (i+1) / 2^64): the bias is
// below nwin / 2^64.
static void make_perm(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch) {
    uint64_t key = mix64(seed ^ mix64((uint64_t)epoch * 0x9e3779b97f4a7c15ull + 0x5851f42dull));
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        uint64_t r = mix64(key + (uint64_t)i * 0x9e3779b97f4a7c15ull);
        int64_t j = (int64_t)(((unsigned __int128)r * (uint64_t)(i + 1)) >> 64);
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static dsc_status get_perm(dsc_loader *l, int64_t epoch, const int64_t **perm) {
    for (int c = 0; c < PERM_CACHE; c++)
        if (l->perms[c].epoch == epoch) {
            *perm = l->perms[c].perm;
            return DSC_OK;
        }
    int c = l->perm_victim;
    l->perm_victim = (c + 1) % PERM_CACHE;
    if (!l->perms[c].perm && !(l->perms[c].perm = malloc((size_t)l->nwin * sizeof(int64_t))))
        return dsc__fail(DSC_ERR_OOM, "data %s: out of memory for a permutation of %lld windows",
                         l->path, (long long)l->nwin);
    make_perm(l->perms[c].perm, l->nwin, l->seed, epoch);
    l->perms[c].epoch = epoch;
    *perm = l->perms[c].perm;
    return DSC_OK;
}

// Tokens [at, at + n) of the concatenated shards, into out (int32) or, with fl, their flags.
static void read_span(const dsc_loader *l, int64_t at, int64_t n, int32_t *out, uint8_t *fl) {
    int lo = 0, hi = l->nshards - 1; // find the shard holding `at`: last i with begin[i] <= at
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (l->begin[mid] <= at) lo = mid;
        else hi = mid - 1;
    }
    for (int s = lo; n > 0; s++) {
        int64_t off = at - l->begin[s], m = l->shards[s].ntok - off;
        if (m <= 0) continue; // empty shard
        m = m < n ? m : n;
        if (fl) dsc_shard_read_flags(&l->shards[s], off, m, fl), fl += m;
        else dsc_shard_read(&l->shards[s], off, m, out), out += m;
        at += m;
        n -= m;
    }
}

// One window starting at token `at`: inputs, targets (ignored ones DSC_LOADER_IGNORE), and
// positions when pos is given. fl: T + 1 bytes of scratch.
static void fill_window(const dsc_loader *l, int64_t at, int32_t *in, int32_t *tg, int32_t *pos,
                        uint8_t *fl) {
    int T = l->T;
    read_span(l, at, T, in, NULL);
    memcpy(tg, in + 1, (size_t)(T - 1) * sizeof *tg);
    read_span(l, at + T, 1, tg + T - 1, NULL);
    if (!l->flagged) {
        for (int t = 0; pos && t < T; t++) pos[t] = t;
        return;
    }
    read_span(l, at, T + 1, NULL, fl);
    for (int t = 0; t < T; t++)
        if (!(fl[t + 1] & DSC_TOK_TARGET)) tg[t] = DSC_LOADER_IGNORE;
    for (int t = 0; pos && t < T; t++)
        pos[t] = t == 0 || (l->restart && (fl[t] & DSC_TOK_DOC)) ? 0 : pos[t - 1] + 1;
}

static dsc_status fill(dsc_loader *l, int64_t first, int n, int32_t *inputs, int32_t *targets,
                       int32_t *positions) {
    int T = l->T;
    uint8_t *fl = l->flagged ? malloc((size_t)T + 1) : NULL;
    if (l->flagged && !fl) return dsc__fail(DSC_ERR_OOM, "data %s: out of memory", l->path);
    dsc_status st = DSC_OK;
    for (int k = 0; k < n && st == DSC_OK; k++) {
        int64_t g = first + k, epoch = g / l->nwin, w = g % l->nwin;
        if (l->shuffle) {
            const int64_t *perm = NULL;
            st = get_perm(l, epoch, &perm);
            if (st != DSC_OK) break;
            w = perm[w];
        }
        size_t off = (size_t)k * T;
        fill_window(l, w * l->row, inputs + off, targets + off, positions ? positions + off : NULL,
                    fl);
    }
    free(fl);
    return st;
}

// ---- internal: prefetching ----

static pf_slot *next_pending(dsc_loader *l) {
    pf_slot *best = NULL;
    for (int i = 0; i < l->nslots; i++) {
        pf_slot *s = &l->slots[i];
        if (s->state == SLOT_PENDING && (!best || s->seq < best->seq)) best = s;
    }
    return best;
}

static bool reserve(pf_slot *s, size_t ints) {
    if (s->cap >= ints) return true;
    int32_t *in = realloc(s->in, ints * sizeof *in);
    if (in) s->in = in;
    int32_t *tg = in ? realloc(s->tg, ints * sizeof *tg) : NULL;
    if (tg) s->tg = tg;
    int32_t *pos = tg ? realloc(s->pos, ints * sizeof *pos) : NULL;
    if (pos) s->pos = pos;
    if (!in || !tg || !pos) return false;
    s->cap = ints;
    return true;
}

// Only this thread calls fill() once prefetching is on, so the permutation cache needs no lock.
static void *worker(void *arg) {
    dsc_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        pf_slot *s = next_pending(l);
        if (!s) {
            pthread_cond_wait(&l->cv, &l->mu);
            continue;
        }
        s->state = SLOT_RUNNING;
        pthread_mutex_unlock(&l->mu);
        size_t ints = (size_t)s->n * (size_t)l->T;
        if (!reserve(s, ints ? ints : 1))
            s->st = dsc__fail(DSC_ERR_OOM, "data %s: out of memory for a prefetch buffer of %d "
                              "samples", l->path, s->n);
        else
            s->st = fill(l, s->first, s->n, s->in, s->tg, s->pos);
        if (s->st != DSC_OK) snprintf(s->err, sizeof s->err, "%s", dsc_last_error());
        pthread_mutex_lock(&l->mu);
        s->state = SLOT_DONE;
        pthread_cond_broadcast(&l->cv);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static pf_slot *find_slot(dsc_loader *l, int64_t first, int n) {
    for (int i = 0; i < l->nslots; i++) {
        pf_slot *s = &l->slots[i];
        if (s->state != SLOT_FREE && s->first == first && s->n == n) return s;
    }
    return NULL;
}

static pf_slot *free_slot(dsc_loader *l) {
    for (int i = 0; i < l->nslots; i++)
        if (l->slots[i].state == SLOT_FREE) return &l->slots[i];
    return NULL;
}

static void post(dsc_loader *l, pf_slot *s, int64_t first, int n, uint64_t seq) {
    s->state = SLOT_PENDING;
    s->first = first;
    s->n = n;
    s->seq = seq;
    pthread_cond_broadcast(&l->cv);
}

// After serving (first, n), keep exactly the next nslots expected batches queued: drop queued
// guesses outside that set (a RUNNING one finishes and is dropped later) and queue the missing.
static void schedule(dsc_loader *l, int64_t first, int n) {
    int64_t stride = l->stride > 0 ? l->stride : n;
    for (int i = 0; i < l->nslots; i++) {
        pf_slot *s = &l->slots[i];
        int64_t d = s->first - first;
        bool wanted = s->n == n && d > 0 && d % stride == 0 && d / stride <= l->nslots;
        if (s->state != SLOT_RUNNING && !wanted) s->state = SLOT_FREE;
    }
    for (int k = 1; k <= l->nslots; k++) {
        int64_t next = first + k * stride;
        pf_slot *s = find_slot(l, next, n);
        if (!s && (s = free_slot(l))) post(l, s, next, n, ++l->seq);
    }
}

// A batch nobody predicted: drop every queued guess and wait for a slot to compute it.
static pf_slot *demand(dsc_loader *l, int64_t first, int n) {
    for (int i = 0; i < l->nslots; i++)
        if (l->slots[i].state != SLOT_RUNNING) l->slots[i].state = SLOT_FREE;
    pf_slot *s;
    while (!(s = free_slot(l))) {
        pthread_cond_wait(&l->cv, &l->mu);
        for (int i = 0; i < l->nslots; i++)
            if (l->slots[i].state == SLOT_DONE) l->slots[i].state = SLOT_FREE;
    }
    post(l, s, first, n, 0);
    return s;
}

static dsc_status get_prefetched(dsc_loader *l, int64_t first, int n, int32_t *inputs,
                                 int32_t *targets, int32_t *positions) {
    pthread_mutex_lock(&l->mu);
    pf_slot *s = find_slot(l, first, n);
    if (!s) s = demand(l, first, n);
    else l->hits++;
    if (s->state == SLOT_PENDING) s->seq = 0; // the caller waits for it: run it first
    while (s->state != SLOT_DONE) pthread_cond_wait(&l->cv, &l->mu);
    dsc_status st = s->st;
    if (st == DSC_OK) {
        size_t ints = (size_t)n * (size_t)l->T;
        memcpy(inputs, s->in, ints * sizeof *inputs);
        memcpy(targets, s->tg, ints * sizeof *targets);
        if (positions) memcpy(positions, s->pos, ints * sizeof *positions);
    } else {
        dsc__fail(st, "%s", s->err);
    }
    s->state = SLOT_FREE;
    schedule(l, first, n);
    pthread_mutex_unlock(&l->mu);
    return st;
}

static dsc_status start_prefetch(dsc_loader *l, int depth) {
    l->nslots = depth > MAX_PREFETCH ? MAX_PREFETCH : depth;
    l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
    if (!l->slots) return dsc__fail(DSC_ERR_OOM, "data %s: out of memory", l->path);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    int rc = pthread_create(&l->thread, NULL, worker, l);
    if (rc != 0)
        return dsc__fail(DSC_ERR_SYSTEM, "data %s: cannot start the prefetch thread: %s",
                         l->path, strerror(rc));
    l->has_thread = true;
    return DSC_OK;
}

// ---- public API ----

dsc_status dsc_loader_create(dsc_loader **out, const dsc_loader_opts *o) {
    *out = NULL;
    if (!o->path || o->T <= 0 || o->prefetch < 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data loader: need a path, T > 0 and prefetch >= 0 "
                         "(got T = %d, prefetch = %d)", o->T, o->prefetch);
    if (strlen(o->path) >= 4096)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data path too long: %.80s...", o->path);
    dsc_loader *l = calloc(1, sizeof *l);
    if (!l) return dsc__fail(DSC_ERR_OOM, "data loader: out of memory");
    snprintf(l->path, sizeof l->path, "%s", o->path);
    l->T = o->T;
    l->seed = o->seed;
    l->shuffle = o->shuffle;
    l->restart = o->restart_positions;
    for (int c = 0; c < PERM_CACHE; c++) l->perms[c].epoch = -1;
    const char *split = o->split ? o->split : "train";
    dsc_status st;
    DSC_TRY_GOTO(open_shards(l, split), st, fail);
    DSC_TRY_GOTO(index_shards(l, split), st, fail);
    if (o->prefetch > 0) DSC_TRY_GOTO(start_prefetch(l, o->prefetch), st, fail);
    *out = l;
    return DSC_OK;
fail:
    dsc_loader_destroy(l);
    return st;
}

void dsc_loader_destroy(dsc_loader *l) {
    if (!l) return;
    if (l->has_thread) {
        pthread_mutex_lock(&l->mu);
        l->stop = true;
        pthread_cond_broadcast(&l->cv);
        pthread_mutex_unlock(&l->mu);
        pthread_join(l->thread, NULL);
    }
    if (l->slots) {
        for (int i = 0; i < l->nslots; i++) {
            free(l->slots[i].in);
            free(l->slots[i].tg);
            free(l->slots[i].pos);
        }
        free(l->slots);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->cv);
    }
    for (int i = 0; i < l->nshards; i++) dsc_shard_close(&l->shards[i]);
    for (int c = 0; c < PERM_CACHE; c++) free(l->perms[c].perm);
    free(l->shards);
    free(l->begin);
    free(l);
}

int64_t dsc_loader_num_samples(const dsc_loader *l) { return l->nwin; }
int64_t dsc_loader_num_tokens(const dsc_loader *l) { return l->ntok; }
int dsc_loader_max_token(const dsc_loader *l) { return l->max_token; }

int64_t dsc_loader_prefetch_hits(dsc_loader *l) {
    if (l->nslots == 0) return 0;
    pthread_mutex_lock(&l->mu);
    int64_t h = l->hits;
    pthread_mutex_unlock(&l->mu);
    return h;
}

void dsc_loader_set_stride(dsc_loader *l, int64_t stride) {
    if (l->nslots > 0) pthread_mutex_lock(&l->mu);
    l->stride = stride > 0 ? stride : 0;
    if (l->nslots > 0) pthread_mutex_unlock(&l->mu);
}

bool dsc_loader_masked(const dsc_loader *l) { return l->masked; }
bool dsc_loader_packed(const dsc_loader *l) { return l->row > l->T; }

dsc_status dsc_loader_get(dsc_loader *l, int64_t first, int n, int32_t *inputs,
                          int32_t *targets) {
    return dsc_loader_get_pos(l, first, n, inputs, targets, NULL);
}

dsc_status dsc_loader_get_pos(dsc_loader *l, int64_t first, int n, int32_t *inputs,
                              int32_t *targets, int32_t *positions) {
    if (first < 0 || n < 0)
        return dsc__fail(DSC_ERR_INVALID_ARG, "data loader: samples from %lld, count %d: both "
                         "must be >= 0", (long long)first, n);
    if (n == 0) return DSC_OK;
    if (l->nslots == 0) return fill(l, first, n, inputs, targets, positions);
    return get_prefetched(l, first, n, inputs, targets, positions);
}
