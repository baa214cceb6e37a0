// test_loader.c - the loader's samples are windows of the data, a pure function of
// (data, T, seed, global index), whatever the batching, world size or prefetching.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE // nftw, memmem
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>     // nftw
#include <jansson.h> // json_load_file
#include <stdbool.h> // bool
#include <stdio.h>   // FILE, fopen, snprintf
#include <stdlib.h>  // calloc, free, getenv, malloc
#include <string.h>  // memcmp, strstr
#include <sys/stat.h> // stat
#include <unistd.h>  // remove

#include "data/loader.h"    // dsc_loader_*
#include "data/prepare.h"   // dsc_data_prepare, dsc_data_default
#include "data/shard.h"     // dsc_shard_*
#include "data/tokenizer.h" // dsc_tokenizer_*
#include "dsc/status.h"     // dsc_last_error

#define GPT2_DIR DSC_SOURCE_DIR "/../shared/data/gpt2-tokenizer"

// Three train shards (one tiny) whose token at global position p is p, so every sample shows
// where it came from; and a val shard holding 60000 + p.
enum { SHARD_A = 4000, SHARD_B = 1, SHARD_C = 6006, NTOK = SHARD_A + SHARD_B + SHARD_C };
enum { NVAL = 300, T = 16 };
static char dir[512];

static const char *path_of(const char *name) {
    static char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static int setup(void **state) {
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof dir, "%s/dsc_loader_XXXXXX", tmp);
    if (!mkdtemp(dir)) return -1;
    int32_t *tok = malloc(NTOK * sizeof *tok);
    for (int p = 0; p < NTOK; p++) tok[p] = p;
    int bad = dsc_shard_write(path_of("train_000.bin"), tok, SHARD_A, 65536) |
              dsc_shard_write(path_of("train_001.bin"), tok + SHARD_A, SHARD_B, 65536) |
              dsc_shard_write(path_of("train_002.bin"), tok + SHARD_A + SHARD_B, SHARD_C, 65536);
    for (int p = 0; p < NVAL; p++) tok[p] = 60000 + p;
    bad |= dsc_shard_write(path_of("val.bin"), tok, NVAL, 65536);
    bad |= dsc_shard_write(path_of("tiny.bin"), tok, T, 65536);
    free(tok);
    return bad ? -1 : 0;
}

static int remove_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    return remove(path);
}

static int teardown(void **state) { return nftw(dir, remove_one, 16, FTW_DEPTH | FTW_PHYS); }

static dsc_loader *open_loader(const char *path, const char *split, uint64_t seed, bool shuffle,
                               int prefetch) {
    dsc_loader_opts o = {.path = path, .split = split, .T = T, .seed = seed, .shuffle = shuffle,
                         .prefetch = prefetch};
    dsc_loader *l = NULL;
    if (dsc_loader_create(&l, &o) != DSC_OK) fail_msg("loader: %s", dsc_last_error());
    return l;
}

// n samples from first; returns the inputs (n*T), targets in *tg (caller frees both).
static int32_t *get(dsc_loader *l, int64_t first, int n, int32_t **tg) {
    int32_t *in = malloc((size_t)n * T * sizeof *in);
    *tg = malloc((size_t)n * T * sizeof **tg);
    if (dsc_loader_get(l, first, n, in, *tg) != DSC_OK) fail_msg("get: %s", dsc_last_error());
    return in;
}

// Window start of each sample in [first, first + n), checking each is a proper window.
static void starts(dsc_loader *l, int64_t first, int n, int64_t *out, int32_t base) {
    int32_t *tg, *in = get(l, first, n, &tg);
    for (int k = 0; k < n; k++) {
        int64_t s = in[k * T] - base;
        assert_int_equal(s % T, 0);
        assert_true(s + T < (base ? NVAL : NTOK));
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[k * T + t], base + s + t);
            assert_int_equal(tg[k * T + t], base + s + t + 1);
        }
        out[k] = s;
    }
    free(in);
    free(tg);
}

static void test_windows_and_permutation(void **state) {
    dsc_loader *l = open_loader(dir, "train", 42, true, 0);
    int64_t W = dsc_loader_num_samples(l);
    assert_int_equal(W, (NTOK - 1) / T);
    assert_int_equal(dsc_loader_num_tokens(l), NTOK);
    assert_int_equal(dsc_loader_max_token(l), NTOK - 1);
    int64_t *s = malloc((size_t)W * sizeof *s);
    starts(l, 0, (int)W, s, 0);
    bool *seen = calloc((size_t)W, 1);
    int64_t in_place = 0;
    for (int64_t k = 0; k < W; k++) {
        assert_false(seen[s[k] / T]); // each window exactly once per epoch
        seen[s[k] / T] = true;
        in_place += s[k] / T == k;
    }
    assert_true(in_place < 10); // shuffled (a random permutation fixes ~1 point)
    free(seen);
    free(s);
    dsc_loader_destroy(l);
}

static void test_determinism(void **state) {
    dsc_loader *a = open_loader(dir, "train", 7, true, 0);
    dsc_loader *b = open_loader(dir, "train", 7, true, 0);
    dsc_loader *c = open_loader(dir, "train", 8, true, 0);
    int64_t W = dsc_loader_num_samples(a);
    int64_t sa[64], sb[64], sc[64], s1[64];
    starts(a, 100, 64, sa, 0);
    starts(b, 100, 64, sb, 0);
    starts(c, 100, 64, sc, 0);
    starts(a, 100 + W, 64, s1, 0); // the same positions, one epoch later
    assert_memory_equal(sa, sb, sizeof sa);
    assert_memory_not_equal(sa, sc, sizeof sa);
    assert_memory_not_equal(sa, s1, sizeof sa);
    dsc_loader_destroy(a);
    dsc_loader_destroy(b);
    dsc_loader_destroy(c);
}

static void test_epoch_wrap(void **state) {
    dsc_loader *l = open_loader(dir, "train", 1, false, 0);
    int64_t W = dsc_loader_num_samples(l), s[6];
    starts(l, W - 3, 6, s, 0); // straddles epochs 0 and 1: unshuffled, windows repeat
    int64_t want[6] = {(W - 3) * T, (W - 2) * T, (W - 1) * T, 0, T, 2 * T};
    assert_memory_equal(s, want, sizeof s);
    starts(l, 5 * W + 2, 1, s, 0);
    assert_int_equal(s[0], 2 * T);
    dsc_loader_destroy(l);
    // Shuffled: a batch across the boundary equals its two halves read apart.
    l = open_loader(dir, "train", 1, true, 0);
    int64_t both[10], lo[5], hi[5];
    starts(l, W - 5, 10, both, 0);
    starts(l, W, 5, hi, 0);
    starts(l, W - 5, 5, lo, 0);
    assert_memory_equal(both, lo, sizeof lo);
    assert_memory_equal(both + 5, hi, sizeof hi);
    dsc_loader_destroy(l);
}

// Global batch of 8 read at once, in halves, or as 4 ranks x 2 samples: the same samples.
static void test_partition_invariance(void **state) {
    dsc_loader *l = open_loader(dir, "train", 99, true, 0);
    int32_t *tga, *a = get(l, 0, 8, &tga);
    int32_t *tg1, *p1 = get(l, 0, 4, &tg1), *tg2, *p2 = get(l, 4, 4, &tg2);
    assert_memory_equal(a, p1, 4 * T * sizeof *a);
    assert_memory_equal(a + 4 * T, p2, 4 * T * sizeof *a);
    assert_memory_equal(tga + 4 * T, tg2, 4 * T * sizeof *a);
    for (int step = 0; step < 3; step++) { // world sizes 1, 2, 4 with micro = 8 / world
        int32_t *tg, *ref = get(l, step * 8, 8, &tg);
        for (int world = 2; world <= 4; world *= 2) {
            int micro = 8 / world;
            for (int rank = 0; rank < world; rank++) {
                int32_t *tr, *r = get(l, step * 8 + rank * micro, micro, &tr);
                assert_memory_equal(r, ref + rank * micro * T, (size_t)micro * T * sizeof *r);
                assert_memory_equal(tr, tg + rank * micro * T, (size_t)micro * T * sizeof *r);
                free(r);
                free(tr);
            }
        }
        free(ref);
        free(tg);
    }
    free(a), free(tga), free(p1), free(tg1), free(p2), free(tg2);
    dsc_loader_destroy(l);
}

// Prefetching never changes a result: right guesses, wrong guesses, changing n and stride.
static void test_prefetch_equals_sync(void **state) {
    dsc_loader *sync = open_loader(dir, "train", 5, true, 0);
    for (int depth = 1; depth <= 3; depth += 2) {
        dsc_loader *pf = open_loader(dir, "train", 5, true, depth);
        int64_t first = 0;
        for (int call = 0; call < 200; call++) {
            int n = call < 100 ? 3 : 4; // the guess for call 100 has the wrong n
            if (call == 50) dsc_loader_set_stride(pf, 12); // e.g. 3 ranks x 4
            if (call == 150) dsc_loader_set_stride(pf, 0);
            int32_t *ts, *s = get(sync, first, n, &ts), *tp, *p = get(pf, first, n, &tp);
            size_t bytes = (size_t)n * T * sizeof *s;
            if (memcmp(s, p, bytes) || memcmp(ts, tp, bytes))
                fail_msg("prefetch depth %d differs at call %d (first %lld)", depth, call,
                         (long long)first);
            free(s), free(ts), free(p), free(tp);
            first += call % 17 == 16 ? 1000 : (call >= 50 && call < 150 ? 12 : n); // some misses
        }
        int64_t hits = dsc_loader_prefetch_hits(pf);
        print_message("prefetch depth %d: %lld of 200 calls prefetched\n", depth, (long long)hits);
        assert_true(hits >= 150 && hits < 200); // 11 jumps and 2 stride changes cannot be guessed
        dsc_loader_destroy(pf);
    }
    dsc_loader_destroy(sync);
}

static void test_split_file_and_errors(void **state) {
    dsc_loader *l = open_loader(dir, "val", 3, true, 2);
    assert_int_equal(dsc_loader_num_samples(l), (NVAL - 1) / T);
    assert_int_equal(dsc_loader_max_token(l), 60000 + NVAL - 1);
    int64_t s[4];
    starts(l, 0, 4, s, 60000);
    dsc_loader_destroy(l);
    l = open_loader(path_of("val.bin"), "train", 3, true, 0); // a file: split ignored
    assert_int_equal(dsc_loader_num_samples(l), (NVAL - 1) / T);
    dsc_loader_destroy(l);

    dsc_loader_opts o = {.path = path_of("tiny.bin"), .split = "train", .T = T};
    assert_int_equal(dsc_loader_create(&l, &o), DSC_ERR_INVALID_ARG); // T tokens, T+1 needed
    assert_null(l);
    assert_non_null(strstr(dsc_last_error(), "T+1 = 17"));
    o.T = T - 1; // exactly T tokens: one window
    assert_int_equal(dsc_loader_create(&l, &o), DSC_OK);
    assert_int_equal(dsc_loader_num_samples(l), 1);
    dsc_loader_destroy(l);
    o = (dsc_loader_opts){.path = dir, .split = "test", .T = T};
    assert_int_equal(dsc_loader_create(&l, &o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "no test*.bin"));
    o.path = path_of("nothing-here");
    assert_int_equal(dsc_loader_create(&l, &o), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), path_of("nothing-here")));
    o = (dsc_loader_opts){.path = dir, .split = "train", .T = 0};
    assert_int_equal(dsc_loader_create(&l, &o), DSC_ERR_INVALID_ARG);
    l = open_loader(dir, "train", 3, false, 1);
    int32_t buf[2 * T];
    assert_int_equal(dsc_loader_get(l, -1, 1, buf, buf + T), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_loader_get(l, 0, 0, buf, buf + T), DSC_OK);
    dsc_loader_destroy(l);
    dsc_loader_destroy(NULL);
}

// ---- dataset building ----

static uint8_t *slurp(const char *path, long *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)*n + 1);
    assert_int_equal(fread(b, 1, (size_t)*n, f), (size_t)*n);
    fclose(f);
    return b;
}

static void assert_same_file(const char *a, const char *b) {
    long na, nb;
    uint8_t *x = slurp(a, &na), *y = slurp(b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(x, y, (size_t)na);
    free(x);
    free(y);
}

static void assert_same_dataset(const char *a, const char *b) {
    const char *names[] = {"train.bin", "val.bin", "dataset.json"};
    for (int i = 0; i < 3; i++) {
        char pa[700], pb[700];
        snprintf(pa, sizeof pa, "%s/%s", a, names[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, names[i]);
        assert_same_file(pa, pb);
    }
}

static json_t *load_json(const char *data_dir) {
    char p[700];
    snprintf(p, sizeof p, "%s/dataset.json", data_dir);
    json_error_t err;
    json_t *j = json_load_file(p, 0, &err);
    if (!j) fail_msg("%s: %s", p, err.text);
    return j;
}

static json_int_t json_int(json_t *j, const char *key) {
    json_t *v = json_object_get(j, key);
    if (!json_is_integer(v)) fail_msg("dataset.json: no integer \"%s\"", key);
    return json_integer_value(v);
}

// Tokens of a split, read back through the loader with T = ntok - 1 (one window: all of it).
static int32_t *all_tokens(const char *data_dir, const char *split, int64_t *n) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s.bin", data_dir, split);
    dsc_shard s;
    if (dsc_shard_open(&s, p) != DSC_OK) fail_msg("%s", dsc_last_error());
    *n = s.ntok;
    int32_t *v = malloc(((size_t)s.ntok + 1) * sizeof *v);
    dsc_shard_read(&s, 0, s.ntok, v);
    dsc_shard_close(&s);
    return v;
}

static void test_default_dataset(void **state) {
    char a[600], b[600];
    snprintf(a, sizeof a, "%s/default_a", dir);
    snprintf(b, sizeof b, "%s/default_b/nested", dir); // parents are created
    assert_int_equal(dsc_data_default(a, NULL), DSC_OK);
    assert_int_equal(dsc_data_default(b, NULL), DSC_OK);
    assert_same_dataset(a, b);
    json_t *j = load_json(a);
    const char *origin = json_string_value(json_object_get(j, "origin"));
    print_message("default dataset: %lld train + %lld val tokens, %s\n",
                  (long long)json_int(j, "train_tokens"), (long long)json_int(j, "val_tokens"),
                  origin);
    assert_int_equal(json_int(j, "vocab_size"), 256);
    assert_string_equal(json_string_value(json_object_get(j, "tokenizer")), "byte");
    int64_t ntrain, nval, docs = json_int(j, "documents");
    int32_t *train = all_tokens(a, "train", &ntrain), *val = all_tokens(a, "val", &nval);
    assert_int_equal(ntrain, json_int(j, "train_tokens"));
    assert_int_equal(nval, json_int(j, "val_tokens"));
    assert_true(ntrain + nval >= 50 * 1024);
    assert_true(nval * 100 >= (ntrain + nval) * 4 && nval * 100 <= (ntrain + nval) * 6);
    int64_t eots = 0, bytes = 0;
    for (int64_t i = 0; i < ntrain + nval; i++)
        eots += (i < ntrain ? train[i] : val[i - ntrain]) == 0;
    json_t *src = json_object_get(j, "sources");
    for (size_t i = 0; i < json_array_size(src); i++)
        bytes += json_int(json_array_get(src, i), "bytes");
    assert_int_equal(eots, docs - 1); // documents joined by end-of-text, which text never holds
    assert_int_equal(ntrain + nval, bytes + docs - 1);
    if (strstr(origin, "license texts")) { // sorted by name, the system's license texts
        const char *prev = "";
        for (size_t i = 0; i < json_array_size(src); i++) {
            const char *name = json_string_value(json_object_get(json_array_get(src, i), "name"));
            assert_true(strcmp(prev, name) < 0);
            prev = name;
        }
        char gpl[700];
        snprintf(gpl, sizeof gpl, "%s/GPL-3", DSC_DEFAULT_TEXT_DIR);
        long n;
        uint8_t *text = slurp(gpl, &n);
        assert_non_null(memmem(text, (size_t)n, "GNU GENERAL PUBLIC LICENSE", 26));
        free(text);
    }
    dsc_loader *l = open_loader(a, "train", 1, true, 0);
    assert_true(dsc_loader_max_token(l) < 256);
    dsc_loader_destroy(l);
    l = open_loader(a, "val", 1, false, 0);
    dsc_loader_destroy(l);
    free(train);
    free(val);
    json_decref(j);
}

static void test_default_fallback(void **state) {
    char a[600], b[600], empty[600];
    snprintf(a, sizeof a, "%s/gen_a", dir);
    snprintf(b, sizeof b, "%s/gen_b", dir);
    snprintf(empty, sizeof empty, "%s/no-such-texts", dir);
    assert_int_equal(dsc_data_default(a, empty), DSC_OK);
    assert_int_equal(dsc_data_default(b, empty), DSC_OK);
    assert_same_dataset(a, b);
    json_t *j = load_json(a);
    assert_non_null(strstr(json_string_value(json_object_get(j, "origin")), "generated"));
    assert_int_equal(json_int(j, "documents"), DSC_DEFAULT_GENERATED_DOCS);
    int64_t n;
    int32_t *v = all_tokens(a, "train", &n);
    assert_true(n >= 300 * 1024);
    int64_t letters = 0;
    for (int64_t i = 0; i < n; i++) {
        int c = v[i];
        assert_true(c == 0 || c == '\n' || (c >= ' ' && c < 127)); // plain English text
        letters += (c >= 'a' && c <= 'z');
    }
    assert_true(letters * 10 > n * 7);
    free(v);
    json_decref(j);
    // The generator itself: seeded, deterministic, sized.
    char *t1, *t2, *t3;
    size_t n1, n2, n3;
    assert_int_equal(dsc_data_generate_text(11, 5000, &t1, &n1), DSC_OK);
    assert_int_equal(dsc_data_generate_text(11, 5000, &t2, &n2), DSC_OK);
    assert_int_equal(dsc_data_generate_text(12, 5000, &t3, &n3), DSC_OK);
    assert_true(n1 >= 5000 && n1 < 7000);
    assert_int_equal(n1, n2);
    assert_memory_equal(t1, t2, n1);
    assert_true(n1 != n3 || memcmp(t1, t3, n1) != 0);
    assert_true(t1[0] >= 'A' && t1[0] <= 'Z');
    free(t1), free(t2), free(t3);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

static void test_prepare(void **state) {
    char in1[600], in2[600], out[600], missing[600];
    snprintf(in1, sizeof in1, "%s/doc1.txt", dir);
    snprintf(in2, sizeof in2, "%s/doc2.txt", dir);
    snprintf(out, sizeof out, "%s/prepared", dir);
    snprintf(missing, sizeof missing, "%s/missing.txt", dir);
    const char *doc1 = "Hello world. This is the first document.\n";
    const char *doc2 = "A second one, caf\303\251.\n";
    write_text(in1, doc1);
    write_text(in2, doc2);
    const char *inputs[] = {in1, in2};
    dsc_prepare_opts o = {.inputs = inputs, .ninputs = 2, .tokenizer = "byte", .out_dir = out,
                          .val_fraction = 0.25, .threads = 1};
    assert_int_equal(dsc_data_prepare(&o), DSC_OK);
    int64_t ntrain, nval;
    int32_t *train = all_tokens(out, "train", &ntrain), *val = all_tokens(out, "val", &nval);
    char joined[128];
    int64_t n1 = (int64_t)strlen(doc1), total = n1 + 1 + (int64_t)strlen(doc2);
    snprintf(joined, sizeof joined, "%s%c%s", doc1, 1, doc2);
    joined[n1] = 0; // the end-of-text between the documents
    assert_int_equal(ntrain + nval, total);
    assert_int_equal(nval, (total + 2) / 4); // round(total * 0.25)
    for (int64_t i = 0; i < total; i++)
        assert_int_equal(i < ntrain ? train[i] : val[i - ntrain], (uint8_t)joined[i]);
    json_t *j = load_json(out);
    assert_int_equal(json_int(j, "documents"), 2);
    assert_int_equal(json_int(j, "eot"), 0);
    assert_string_equal(json_string_value(json_object_get(json_array_get(
                            json_object_get(j, "sources"), 1), "name")), in2);
    json_decref(j);
    free(train);
    free(val);

    const char *bad_inputs[] = {in1, missing};
    o.inputs = bad_inputs;
    assert_int_equal(dsc_data_prepare(&o), DSC_ERR_IO);
    assert_non_null(strstr(dsc_last_error(), missing));
    o.inputs = inputs;
    o.val_fraction = 1.0;
    assert_int_equal(dsc_data_prepare(&o), DSC_ERR_INVALID_ARG);
    o.val_fraction = 0.1;
    o.tokenizer = "words";
    assert_int_equal(dsc_data_prepare(&o), DSC_ERR_INVALID_ARG);

    struct stat sb;
    if (stat(GPT2_DIR "/vocab.json", &sb) != 0) {
        print_message("SKIP: GPT-2 tokenizer files not found in %s\n", GPT2_DIR);
        return;
    }
    o.tokenizer = "gpt2:" GPT2_DIR;
    o.val_fraction = 0;
    assert_int_equal(dsc_data_prepare(&o), DSC_OK);
    train = all_tokens(out, "train", &ntrain);
    val = all_tokens(out, "val", &nval);
    assert_int_equal(nval, 0);
    dsc_tokenizer *t;
    assert_int_equal(dsc_tokenizer_create(&t, o.tokenizer), DSC_OK);
    int32_t *ids;
    size_t n;
    assert_int_equal(dsc_tokenizer_encode(t, "Hello world.", 12, &ids, &n), DSC_OK);
    assert_memory_equal(train, ids, n * sizeof *ids); // "Hello world." starts document 1
    free(ids);
    int64_t eots = 0;
    for (int64_t i = 0; i < ntrain; i++) eots += train[i] == dsc_tokenizer_eot(t);
    assert_int_equal(eots, 1);
    dsc_tokenizer_destroy(t);
    free(train);
    free(val);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_windows_and_permutation),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_epoch_wrap),
        cmocka_unit_test(test_partition_invariance),
        cmocka_unit_test(test_prefetch_equals_sync),
        cmocka_unit_test(test_split_file_and_errors),
        cmocka_unit_test(test_default_dataset),
        cmocka_unit_test(test_default_fallback),
        cmocka_unit_test(test_prepare),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
