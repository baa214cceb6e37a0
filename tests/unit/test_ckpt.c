// Unit tests of checkpoints (one rank): manifest checksum and parsing, save/load bitwise across
// ZeRO stages (weights and optimizer moments), async saves and `latest`, keep_last, leftovers,
// validation failures (BAD), corruption detection with resume fallback, resharding of a
// synthetic 3-rank checkpoint against an independent reference, export, parameter mismatches.
// Multi-rank saving and loading is tested by tests/ckpt/*.sh with real processes.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>     // sinf
#include <stdio.h>    // snprintf, fopen
#include <stdlib.h>   // mkdtemp, getenv, free, system
#include <string.h>   // strstr, memcmp
#include <sys/stat.h> // mkdir, stat
#include <unistd.h>   // truncate, unlink

#include "base/io.h" // dsc__mkdirs
#include "dsc/checkpoint.h"          // dsc_ckpt_*, dsc_checkpointing_*
#include "dsc/engine.h"              // dsc_engine_*
#include "dsc/half.h"                // dsc_fp32_to_bf16
#include "engine/ckpt/fs.h"          // dsc__ckpt_*
#include "engine/ckpt/hf_weights.h"  // dsc_hf_weights_*
#include "base/hash.h"               // dsc_hasher_*
#include "engine/ckpt/manifest.h"    // dsc__manifest_*
#include "engine/ckpt/reader.h"      // dsc__ckpt_hash_file
#include "engine/ckpt/safetensors.h" // dsc_st_*
#include "engine/ckpt/shard.h"       // dsc__shard_*
#include "engine/device.h"           // dsc__state_source, dsc__engine_set_state_source

static const dsc_param_desc params[] = {
    {"wte.weight", 2, {13, 7}, 0, false}, {"h.0.w", 2, {7, 9}, 1, false},
    {"h.0.b", 1, {9}, 1, false}, {"ln_f.weight", 1, {7}, 2, false},
};
#define NP 4
#define NG 3

static int64_t numel_of(int i) {
    int64_t n = 1;
    for (int d = 0; d < params[i].ndim; d++) n *= params[i].shape[d];
    return n;
}

static char tmpdir[512];

static int setup_dir(void **state) {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/dsc_test_ckpt_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) return -1;
    return 0;
}

static int teardown_dir(void **state) {
    dsc__ckpt_rmtree(tmpdir);
    return 0;
}

static void path_of(char *out, size_t cap, const char *sub) { snprintf(out, cap, "%s/%s", tmpdir, sub); }

static dsc_engine *make(int stage, const char *optimizer) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"%s\", \"params\": {\"lr\": 0.01}},"
             " \"zero_optimization\": {\"stage\": %d}, \"checkpoint\": {\"async\": false}}", optimizer, stage);
    dsc_engine *e = NULL;
    dsc_engine_opts o = {.config_json = json, .params = params, .nparams = NP, .world_size = 1};
    if (dsc_engine_create(&e, &o) != DSC_OK) fail_msg("engine create: %s", dsc_last_error());
    for (int i = 0; i < NP; i++)
        for (int64_t k = 0; k < numel_of(i); k++) dsc_param_master(e, i)[k] = 0.02f * sinf((float)(7 * i + k));
    assert_int_equal(dsc_params_updated(e), DSC_OK);
    return e;
}

// One optimizer step with gradients that depend only on (step, tensor, element).
static void train(dsc_engine *e, int steps) {
    for (int s = 0; s < steps; s++) {
        int64_t step = dsc_engine_global_steps(e) + 1;
        assert_int_equal(dsc_backward_begin(e), DSC_OK);
        for (int g = NG - 1; g >= 0; g--) {
            assert_int_equal(dsc_gather(e, g), DSC_OK);
            for (int i = 0; i < NP; i++) {
                if (params[i].group != g) continue;
                float *gr = dsc_param_grad(e, i);
                for (int64_t k = 0; k < numel_of(i); k++)
                    gr[k] += sinf(0.37f * (float)step + 1.3f * (float)i + 0.01f * (float)k);
            }
            assert_int_equal(dsc_release(e, g), DSC_OK);
            assert_int_equal(dsc_grads_ready(e, g), DSC_OK);
        }
        dsc_step_info info;
        assert_int_equal(dsc_step(e, &info), DSC_OK);
        assert_true(info.boundary);
    }
}

// The weights as the model sees them (fp32: the master values), whole, into out (all tensors).
static void weights(dsc_engine *e, float *out) {
    for (int g = 0; g < NG; g++) {
        assert_int_equal(dsc_gather(e, g), DSC_OK);
        float *o = out;
        for (int i = 0; i < NP; i++) {
            if (params[i].group == g) memcpy(o, dsc_param_data(e, i), (size_t)numel_of(i) * 4);
            o += numel_of(i);
        }
        assert_int_equal(dsc_release(e, g), DSC_OK);
    }
}

static int64_t total_numel(void) {
    int64_t n = 0;
    for (int i = 0; i < NP; i++) n += numel_of(i);
    return n;
}

static dsc_ckpt_opts sync_opts(void) {
    return (dsc_ckpt_opts){.async = false, .validate = true};
}

// ---- manifest ----

static void test_manifest_roundtrip_and_tamper(void **state) {
    dsc_engine *e = make(2, "AdamW");
    train(e, 2);
    dsc__manifest m, back;
    assert_int_equal(dsc__manifest_from_engine(&m, e, "global_step2"), DSC_OK);
    m.files[0].bytes = 12345;
    m.files[0].xxh3 = 0x0123456789abcdefull;
    char *text = dsc__manifest_render(&m, dsc_engine_config(e));
    assert_non_null(text);
    assert_int_equal(dsc__manifest_parse(&back, text, strlen(text), "m.json"), DSC_OK);
    assert_string_equal(back.tag, "global_step2");
    assert_int_equal(back.step, 2);
    assert_int_equal(back.nparams, NP);
    assert_int_equal(back.ngroups, NG);
    assert_int_equal(back.nmoments, 2);
    assert_string_equal(back.moments[1], "exp_avg_sq");
    assert_int_equal(back.files[0].xxh3, 0x0123456789abcdefull);
    assert_int_equal(back.params[2].off, m.params[2].off);
    assert_int_equal(back.scalars.applied_steps, 2);
    dsc__manifest_free(&back);
    // Any edit is detected: here the step.
    char *at = strstr(text, "\"step\": 2");
    assert_non_null(at);
    at[8] = '3';
    assert_int_equal(dsc__manifest_parse(&back, text, strlen(text), "m.json"), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "checksum mismatch"));
    free(text);
    dsc__manifest_free(&m);
    dsc_engine_destroy(e);
}

// ---- save and load ----

// Save at step 3 with one stage, load into every stage, run 3 more steps: weights and moments
// equal bit for bit to the uninterrupted run.
static void test_bitwise_across_stages(void **state) {
    char dir[600];
    path_of(dir, sizeof dir, "bitwise");
    int64_t n = total_numel();
    float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    dsc_engine *a = make(1, "AdamW");
    train(a, 3);
    dsc_ckpt_opts o = sync_opts();
    assert_int_equal(dsc_checkpointing_start(a, dir, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(a, NULL), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(a, true), DSC_OK);
    train(a, 3);
    weights(a, want);
    for (int stage = 0; stage <= 3; stage++) {
        dsc_engine *b = make(stage, "AdamW");
        char tag[DSC_CKPT_TAG_MAX];
        assert_int_equal(dsc_load_checkpoint(b, dir, NULL, tag, sizeof tag), DSC_OK);
        assert_string_equal(tag, "global_step3");
        assert_int_equal(dsc_engine_global_steps(b), 3);
        train(b, 3);
        weights(b, got);
        if (memcmp(want, got, (size_t)n * 4) != 0) fail_msg("stage 1 -> %d: weights differ", stage);
        dsc_engine_destroy(b);
    }
    dsc_engine_destroy(a);
    free(want);
    free(got);
}

// The moments round-trip through a checkpoint exactly (read back with the reader).
static void test_moments_saved(void **state) {
    char dir[600];
    path_of(dir, sizeof dir, "moments");
    dsc_engine *a = make(0, "AdamW");
    train(a, 2);
    dsc_ckpt_opts o = sync_opts();
    assert_int_equal(dsc_checkpointing_start(a, dir, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(a, "mine"), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(a, true), DSC_OK);
    dsc_engine *b = make(3, "Adam"); // Adam and AdamW share their moments
    assert_int_equal(dsc_load_checkpoint(b, dir, "mine", NULL, 0), DSC_OK);
    dsc_ckpt *ck;
    assert_int_equal(dsc_ckpt_open(&ck, dir, "mine"), DSC_OK);
    dsc_ckpt_info info;
    dsc_ckpt_get_info(ck, &info);
    assert_int_equal(info.nmoments, 2);
    assert_string_equal(info.moment_names[0], "exp_avg");
    // Saving b (stage 3) again gives the same moments.
    char dir2[600];
    path_of(dir2, sizeof dir2, "moments2");
    assert_int_equal(dsc_checkpointing_start(b, dir2, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(b, "again"), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(b, true), DSC_OK);
    dsc_ckpt *ck2;
    assert_int_equal(dsc_ckpt_open(&ck2, dir2, "again"), DSC_OK);
    for (int i = 0; i < NP; i++) {
        for (int kind = 0; kind <= 2; kind++) {
            size_t nb = (size_t)numel_of(i) * 4;
            float *x = malloc(nb), *y = malloc(nb);
            assert_int_equal(dsc_ckpt_read_param(ck, i, kind, x), DSC_OK);
            assert_int_equal(dsc_ckpt_read_param(ck2, dsc_ckpt_find_param(ck2, params[i].name), kind, y), DSC_OK);
            assert_memory_equal(x, y, nb);
            if (kind == 2) assert_true(x[0] > 0); // exp_avg_sq after 2 steps
            free(x);
            free(y);
        }
    }
    dsc_ckpt_close(ck);
    dsc_ckpt_close(ck2);
    dsc_engine_destroy(a);
    dsc_engine_destroy(b);
}

static void test_async_latest_keep_last_leftovers(void **state) {
    char dir[600], p[700];
    path_of(dir, sizeof dir, "async");
    assert_int_equal(dsc__mkdirs(dir), DSC_OK);
    snprintf(p, sizeof p, "%s/global_step99.tmp.0123", dir); // an interrupted save
    assert_int_equal(dsc__mkdirs(p), DSC_OK);
    snprintf(p, sizeof p, "%s/latest.tmp.77", dir);
    assert_int_equal(dsc__ckpt_write_file(p, "x", 1, false), DSC_OK);
    dsc_engine *e = make(2, "AdamW");
    dsc_ckpt_opts o = {.async = true, .validate = true, .interval_steps = 2, .keep_last = 2};
    assert_int_equal(dsc_checkpointing_start(e, dir, &o), DSC_OK);
    int saved = 0, finalised = 0;
    for (int s = 0; s < 8; s++) {
        train(e, 1);
        dsc_ckpt_tick t;
        assert_int_equal(dsc_checkpoint_step_end(e, false, &t), DSC_OK);
        saved += t.saved;
        finalised += t.finalised;
    }
    assert_int_equal(dsc_checkpoint_wait(e), DSC_OK);
    dsc_ckpt_stats stats;
    dsc_checkpointing_stats(e, &stats);
    assert_int_equal(stats.saves, 4); // each completed at a later tick, the next save, or the wait
    assert_true(finalised <= 3);
    assert_string_equal(stats.latest, "global_step8");
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);
    assert_int_equal(saved, 4);
    char tag[DSC_CKPT_TAG_MAX];
    assert_int_equal(dsc_ckpt_latest(dir, tag, sizeof tag), DSC_OK);
    assert_string_equal(tag, "global_step8");
    dsc_ckpt_entry *v;
    int n;
    assert_int_equal(dsc_ckpt_list(dir, &v, &n), DSC_OK);
    assert_int_equal(n, 2); // keep_last 2; the leftovers were removed
    assert_string_equal(v[0].name, "global_step8");
    assert_true(v[0].latest);
    assert_string_equal(v[1].name, "global_step6");
    free(v);
    snprintf(p, sizeof p, "%s/latest.tmp.77", dir);
    assert_false(dsc__ckpt_exists(p));
    dsc_engine_destroy(e);
}

// Background snapshot: the writer copies the state while training goes on; after the fence
// the engine may update, and the checkpoint still holds the state of the save's step.
static void test_background_snapshot(void **state) {
    char dir[600];
    path_of(dir, sizeof dir, "background");
    int64_t n = total_numel();
    float *at_save = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    dsc_engine *e = make(3, "AdamW");
    train(e, 2);
    weights(e, at_save);
    dsc_ckpt_opts o = {.async = true, .validate = true, .background_snapshot = true};
    assert_int_equal(dsc_checkpointing_start(e, dir, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_OK);
    assert_int_equal(dsc_checkpoint_fence(e), DSC_OK);
    train(e, 2);
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);
    dsc_engine *b = make(0, "AdamW");
    assert_int_equal(dsc_load_checkpoint(b, dir, NULL, NULL, 0), DSC_OK);
    assert_int_equal(dsc_engine_global_steps(b), 2);
    weights(b, got);
    assert_memory_equal(at_save, got, (size_t)n * 4);
    dsc_engine_destroy(b);
    dsc_engine_destroy(e);
    free(at_save);
    free(got);
}

static dsc_status reject(void *user, dsc_engine *eng, const dsc_ckpt_validation *v, bool *ok,
                         char *why, size_t cap) {
    int *calls = user;
    (*calls)++;
    // The views are whole tensors: live and loaded agree.
    for (int i = 0; i < v->nparams; i++)
        if (memcmp(v->live[i], v->loaded[i], (size_t)numel_of(i) * 4) != 0) fail_msg("views differ");
    *ok = v->step != 4; // the save at step 4 fails
    if (!*ok) snprintf(why, cap, "test rejects step %lld", (long long)v->step);
    return DSC_OK;
}

static void test_validation_failure_marks_bad(void **state) {
    char dir[600];
    path_of(dir, sizeof dir, "bad");
    dsc_engine *e = make(1, "AdamW");
    int calls = 0;
    dsc_ckpt_opts o = sync_opts();
    o.validate_fn = reject;
    o.validate_user = &calls;
    assert_int_equal(dsc_checkpointing_start(e, dir, &o), DSC_OK);
    train(e, 2);
    assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_OK);
    train(e, 2);
    assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "test rejects step 4"));
    assert_int_equal(calls, 2);
    char tag[DSC_CKPT_TAG_MAX];
    assert_int_equal(dsc_ckpt_latest(dir, tag, sizeof tag), DSC_OK);
    assert_string_equal(tag, "global_step2"); // latest did not move
    dsc_ckpt *ck;
    assert_int_equal(dsc_ckpt_open(&ck, dir, "global_step4"), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "marked bad"));
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);
    dsc_engine_destroy(e);
}

// ---- corruption and the resume fallback ----

static void flip_byte(const char *path, long at) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static void expect_open_fails(const char *dir, const char *tag, dsc_status want, const char *needle) {
    dsc_ckpt *ck = NULL;
    dsc_status st = dsc_ckpt_open(&ck, dir, tag);
    if (st != want || !strstr(dsc_last_error(), needle))
        fail_msg("open %s/%s: status %d, message '%s'; wanted %d with '%s'", dir, tag, st,
                 dsc_last_error(), want, needle);
    assert_null(ck);
}

static void test_corruption_and_fallback(void **state) {
    char dir[600], shard[800], man[800];
    path_of(dir, sizeof dir, "corrupt");
    dsc_engine *e = make(2, "AdamW");
    dsc_ckpt_opts o = sync_opts();
    assert_int_equal(dsc_checkpointing_start(e, dir, &o), DSC_OK);
    for (int s = 0; s < 3; s++) {
        train(e, 1);
        assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_OK);
    }
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);
    snprintf(shard, sizeof shard, "%s/global_step3/shard_rank0_of_1.safetensors", dir);
    snprintf(man, sizeof man, "%s/global_step3/manifest.json", dir);
    flip_byte(shard, 3000);
    expect_open_fails(dir, NULL, DSC_ERR_CORRUPT, "checksum mismatch");
    flip_byte(shard, 3000);
    assert_int_equal(truncate(shard, 2000), 0);
    expect_open_fails(dir, NULL, DSC_ERR_CORRUPT, "truncated");
    unlink(shard);
    expect_open_fails(dir, NULL, DSC_ERR_IO, "missing");
    flip_byte(man, 40);
    expect_open_fails(dir, NULL, DSC_ERR_CORRUPT, "manifest");
    // A manifest from another checkpoint.
    char other[800];
    snprintf(other, sizeof other, "%s/global_step2/manifest.json", dir);
    char *text;
    size_t n;
    assert_int_equal(dsc__ckpt_read_file(other, &text, &n), DSC_OK);
    assert_int_equal(dsc__ckpt_write_file(man, text, n, false), DSC_OK);
    free(text);
    expect_open_fails(dir, NULL, DSC_ERR_CORRUPT, "belongs to tag global_step2");
    // Resume falls back to the newest that verifies.
    dsc_engine *b = make(0, "AdamW");
    char tag[DSC_CKPT_TAG_MAX];
    bool none;
    assert_int_equal(dsc_resume_checkpoint(b, dir, NULL, tag, sizeof tag, &none), DSC_OK);
    assert_false(none);
    assert_string_equal(tag, "global_step2");
    assert_int_equal(dsc_engine_global_steps(b), 2);
    // An explicit tag does not fall back.
    assert_int_equal(dsc_resume_checkpoint(b, dir, "global_step3", tag, sizeof tag, &none), DSC_ERR_CORRUPT);
    // An empty directory: nothing to resume.
    char empty[600];
    path_of(empty, sizeof empty, "empty");
    assert_int_equal(dsc_resume_checkpoint(b, empty, NULL, tag, sizeof tag, &none), DSC_OK);
    assert_true(none);
    dsc_engine_destroy(b);
    dsc_engine_destroy(e);
}

static void test_mismatches(void **state) {
    char dir[600];
    path_of(dir, sizeof dir, "mismatch");
    dsc_engine *e = make(0, "AdamW");
    dsc_ckpt_opts o = sync_opts();
    assert_int_equal(dsc_checkpointing_start(e, dir, &o), DSC_OK);
    train(e, 1);
    assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);
    dsc_engine *sgd = make(0, "SGD");
    assert_int_equal(dsc_load_checkpoint(sgd, dir, NULL, NULL, 0), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "optimizer"));
    dsc_engine_destroy(sgd);
    dsc_param_desc other[NP];
    memcpy(other, params, sizeof other);
    other[1].shape[1] = 10;
    dsc_engine *b = NULL;
    dsc_engine_opts eo = {.config_json = "{\"train_batch_size\": 1}", .params = other, .nparams = NP, .world_size = 1};
    assert_int_equal(dsc_engine_create(&b, &eo), DSC_OK);
    assert_int_equal(dsc_params_updated(b), DSC_OK);
    assert_int_equal(dsc_load_checkpoint(b, dir, NULL, NULL, 0), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "h.0.w"));
    dsc_engine_destroy(b);
    dsc_engine_destroy(e);
}

// ---- resharding: a synthetic 3-rank checkpoint, read back whole ----

// A 3-rank layout of the test parameters, built here independently of the engine: tensors
// aligned to 16 elements within a group, each group padded to a multiple of 3 * 16.
static void synthetic_manifest(dsc__manifest *m, int world) {
    memset(m, 0, sizeof *m);
    snprintf(m->tag, sizeof m->tag, "synthetic");
    m->step = 7;
    m->world = world;
    m->stage = 2;
    snprintf(m->precision, sizeof m->precision, "fp32");
    snprintf(m->optimizer, sizeof m->optimizer, "sgd");
    snprintf(m->dsc_version, sizeof m->dsc_version, "test");
    m->nmoments = 1;
    snprintf(m->moments[0], sizeof m->moments[0], "momentum_buffer");
    m->scalars = (dsc_state_scalars){.global_steps = 7, .applied_steps = 7, .cur_scale = 1};
    m->ngroups = NG;
    m->nparams = NP;
    m->nfiles = world;
    m->groups = calloc(NG, sizeof *m->groups);
    m->params = calloc(NP, sizeof *m->params);
    m->files = calloc((size_t)world, sizeof *m->files);
    uint64_t cursor = 0;
    for (int g = 0; g < NG; g++) {
        uint64_t content = 0;
        for (int i = 0; i < NP; i++) {
            if (params[i].group != g) continue;
            dsc__mparam *p = &m->params[i];
            snprintf(p->name, sizeof p->name, "%s", params[i].name);
            p->ndim = params[i].ndim;
            memcpy(p->shape, params[i].shape, sizeof p->shape);
            p->numel = numel_of(i);
            p->group = g;
            p->off = cursor + content;
            content += (uint64_t)(p->numel + 15) / 16 * 16;
        }
        uint64_t unit = 16u * (uint64_t)world, padded = (content + unit - 1) / unit * unit;
        m->groups[g] = (dsc_state_group){(size_t)cursor, (size_t)padded, (size_t)(padded / world)};
        cursor += padded;
    }
    m->total = cursor;
    for (int r = 0; r < world; r++) {
        m->files[r].rank = r;
        dsc__ckpt_shard_name(m->files[r].name, sizeof m->files[r].name, r, world);
    }
}

static float value_at(int kind, int i, int64_t k) { return (float)(kind * 1000 + i * 100) + (float)k * 0.5f; }

static void test_reshard_synthetic(void **state) {
    const int world = 3;
    char dir[600], tdir[700], path[800];
    path_of(dir, sizeof dir, "synth");
    snprintf(tdir, sizeof tdir, "%s/synthetic", dir);
    assert_int_equal(dsc__mkdirs(tdir), DSC_OK);
    dsc__manifest m;
    synthetic_manifest(&m, world);
    float *flat = calloc((size_t)m.total * 2, sizeof(float)); // (kind, total)
    for (int kind = 0; kind < 2; kind++)
        for (int i = 0; i < NP; i++)
            for (int64_t k = 0; k < numel_of(i); k++) flat[(size_t)kind * m.total + m.params[i].off + (size_t)k] = value_at(kind, i, k);
    size_t part = dsc__shard_part(&m);
    float *shard = malloc(part * 2 * sizeof(float));
    for (int r = 0; r < world; r++) {
        float *d = shard;
        for (int kind = 0; kind < 2; kind++)
            for (int g = 0; g < NG; g++) {
                memcpy(d, flat + (size_t)kind * m.total + m.groups[g].off + (size_t)r * m.groups[g].slice,
                       m.groups[g].slice * 4);
                d += m.groups[g].slice;
            }
        char *hdr;
        size_t hlen;
        assert_int_equal(dsc__shard_header(&m, r, &hdr, &hlen), DSC_OK);
        snprintf(path, sizeof path, "%s/%s", tdir, m.files[r].name);
        assert_int_equal(dsc__shard_write(path, hdr, hlen, shard, part * 8, &m.files[r].bytes, &m.files[r].xxh3), DSC_OK);
        free(hdr);
    }
    char *text = dsc__manifest_render(&m, NULL);
    snprintf(path, sizeof path, "%s/manifest.json", tdir);
    assert_int_equal(dsc__ckpt_write_file(path, text, strlen(text), false), DSC_OK);
    free(text);
    dsc_ckpt *ck;
    if (dsc_ckpt_open(&ck, dir, "synthetic") != DSC_OK) fail_msg("%s", dsc_last_error());
    for (int i = 0; i < NP; i++)
        for (int kind = 0; kind < 2; kind++) {
            float *x = malloc((size_t)numel_of(i) * 4);
            assert_int_equal(dsc_ckpt_read_param(ck, dsc_ckpt_find_param(ck, params[i].name), kind, x), DSC_OK);
            for (int64_t k = 0; k < numel_of(i); k++)
                if (x[k] != value_at(kind, i, k)) fail_msg("tensor %d kind %d element %lld: %g", i, kind, (long long)k, x[k]);
            free(x);
        }
    dsc_ckpt_close(ck);
    // Loaded into a one-rank engine with SGD (one moment), then exported.
    dsc_engine *e = make(3, "SGD");
    assert_int_equal(dsc_load_checkpoint(e, dir, "synthetic", NULL, 0), DSC_OK);
    assert_int_equal(dsc_engine_global_steps(e), 7);
    float *w = malloc((size_t)total_numel() * 4);
    weights(e, w);
    float *o = w;
    for (int i = 0; i < NP; i++, o += numel_of(i - 1))
        for (int64_t k = 0; k < numel_of(i); k++) assert_true(o[k] == value_at(0, i, k));
    free(w);
    dsc_engine_destroy(e);
    free(shard);
    free(flat);
    dsc__manifest_free(&m);
}

// ---- export and paths ----

static void test_export(void **state) {
    char dir[600], out[700];
    path_of(dir, sizeof dir, "export");
    dsc_engine *e = make(1, "AdamW");
    train(e, 2);
    dsc_ckpt_opts o = sync_opts();
    assert_int_equal(dsc_checkpointing_start(e, dir, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);
    float *w = malloc((size_t)total_numel() * 4);
    weights(e, w);
    for (int bf = 0; bf < 2; bf++) {
        snprintf(out, sizeof out, "%s/out%d.safetensors", tmpdir, bf);
        assert_int_equal(dsc_ckpt_export(dir, NULL, out, bf ? "bf16" : "fp32"), DSC_OK);
        dsc_st_file *f;
        assert_int_equal(dsc_st_open(&f, out), DSC_OK);
        assert_int_equal(dsc_st_count(f), NP);
        assert_string_equal(dsc_st_meta(f, "format"), "pt");
        const float *ref = w;
        for (int i = 0; i < NP; i++) {
            const dsc_st_tensor *t = dsc_st_find(f, params[i].name);
            assert_non_null(t);
            assert_int_equal(t->ndim, params[i].ndim);
            assert_int_equal(t->shape[0], params[i].shape[0]);
            for (int64_t k = 0; k < numel_of(i); k++) {
                if (bf) assert_int_equal(((const uint16_t *)t->data)[k], dsc_fp32_to_bf16(ref[k]));
                else assert_true(((const float *)t->data)[k] == ref[k]);
            }
            ref += numel_of(i);
        }
        dsc_st_close(f);
    }
    free(w);
    dsc_engine_destroy(e);
}

static void read_text(const char *path, char *out, size_t cap) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

// Files attached to checkpoints travel with them, are verified, and make a Hugging Face folder.
static void test_attachments_and_export_hf(void **state) {
    char dir[600], bare[600], out[700], p[800], text[256];
    path_of(dir, sizeof dir, "attach");
    path_of(bare, sizeof bare, "attach-none");
    path_of(out, sizeof out, "hf-out");
    dsc_engine *e = make(2, "AdamW");
    train(e, 1);
    dsc_ckpt_opts o = sync_opts();
    // A checkpoint with nothing attached: the weights alone, no folder.
    assert_int_equal(dsc_checkpointing_start(e, bare, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);
    assert_int_not_equal(dsc_ckpt_export_hf(bare, NULL, out, NULL, 0), DSC_OK);
    assert_non_null(strstr(dsc_last_error(), "config.json"));

    assert_int_equal(dsc_checkpointing_start(e, dir, &o), DSC_OK);
    assert_int_not_equal(dsc_checkpoint_attach(e, "../x", "x", 1), DSC_OK);
    assert_int_not_equal(dsc_checkpoint_attach(e, "manifest.json", "x", 1), DSC_OK);
    const char *cfg = "{\"architectures\": [\"GPT2LMHeadModel\"]}";
    assert_int_equal(dsc_checkpoint_attach(e, "config.json", "old", 3), DSC_OK);
    assert_int_equal(dsc_checkpoint_attach(e, "config.json", cfg, strlen(cfg)), DSC_OK);
    assert_int_equal(dsc_checkpoint_attach(e, "tokenizer.json", "{}", 2), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(e, NULL), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(e, true), DSC_OK);

    dsc_ckpt *ck;
    assert_int_equal(dsc_ckpt_open(&ck, dir, NULL), DSC_OK);
    assert_int_equal(dsc_ckpt_num_attachments(ck), 2);
    assert_string_equal(dsc_ckpt_attachment_name(ck, 0), "config.json");
    assert_true(dsc_ckpt_attachment_path(ck, "config.json", p, sizeof p));
    read_text(p, text, sizeof text);
    assert_string_equal(text, cfg); // the last content attached under the name
    assert_false(dsc_ckpt_attachment_path(ck, "vocab.json", p, sizeof p));
    dsc_ckpt_close(ck);

    // Sharded export (64 bytes a shard: several shards), read back through the HF reader.
    assert_int_equal(dsc_ckpt_export_hf(dir, NULL, out, "fp32", 64), DSC_OK);
    snprintf(p, sizeof p, "%s/config.json", out);
    read_text(p, text, sizeof text);
    // The attached fields, and the weights' type in both transformers spellings.
    assert_non_null(strstr(text, "\"architectures\": [\n    \"GPT2LMHeadModel\"\n  ]"));
    assert_non_null(strstr(text, "\"torch_dtype\": \"float32\""));
    assert_non_null(strstr(text, "\"dtype\": \"float32\""));
    snprintf(p, sizeof p, "%s/tokenizer.json", out);
    read_text(p, text, sizeof text);
    assert_string_equal(text, "{}");
    float *w = malloc((size_t)total_numel() * 4), *got = malloc((size_t)total_numel() * 4);
    weights(e, w);
    dsc_hf_weights *hw;
    assert_int_equal(dsc_hf_weights_open(&hw, out), DSC_OK);
    assert_int_equal(dsc_hf_weights_count(hw), NP);
    const float *ref = w;
    for (int i = 0; i < NP; i++) {
        assert_int_equal(dsc_hf_weights_read(hw, params[i].name, 0, numel_of(i), got), DSC_OK);
        assert_memory_equal(got, ref, (size_t)numel_of(i) * 4);
        ref += numel_of(i);
    }
    assert_true(dsc_hf_weights_maps(hw) > 1);
    dsc_hf_weights_close(hw);
    free(got);
    free(w);

    // A bf16 export says so (transformers would otherwise load it as float32).
    path_of(out, sizeof out, "hf-out-bf16");
    assert_int_equal(dsc_ckpt_export_hf(dir, NULL, out, "bf16", 0), DSC_OK);
    snprintf(p, sizeof p, "%s/config.json", out);
    read_text(p, text, sizeof text);
    assert_non_null(strstr(text, "\"torch_dtype\": \"bfloat16\""));
    assert_non_null(strstr(text, "\"dtype\": \"bfloat16\""));

    // A damaged attachment fails verification, naming the file.
    char tag[DSC_CKPT_TAG_MAX];
    assert_int_equal(dsc_ckpt_latest(dir, tag, sizeof tag), DSC_OK);
    snprintf(p, sizeof p, "%s/%s/tokenizer.json", dir, tag);
    FILE *f = fopen(p, "w");
    fputs("[]", f);
    fclose(f);
    assert_int_not_equal(dsc_ckpt_open(&ck, dir, NULL), DSC_OK);
    assert_non_null(strstr(dsc_last_error(), "tokenizer.json"));
    dsc_engine_destroy(e);
}

static void test_split_path(void **state) {
    char dir[600], p[700], d[700], t[DSC_CKPT_TAG_MAX];
    bool has;
    path_of(dir, sizeof dir, "split");
    snprintf(p, sizeof p, "%s/global_step5", dir);
    assert_int_equal(dsc__mkdirs(p), DSC_OK);
    snprintf(p, sizeof p, "%s/global_step5/manifest.json", dir);
    assert_int_equal(dsc__ckpt_write_file(p, "{}", 2, false), DSC_OK);
    assert_int_equal(dsc_ckpt_split_path(dir, d, sizeof d, t, sizeof t, &has), DSC_OK);
    assert_false(has);
    assert_string_equal(d, dir);
    snprintf(p, sizeof p, "%s/global_step5/", dir);
    assert_int_equal(dsc_ckpt_split_path(p, d, sizeof d, t, sizeof t, &has), DSC_OK);
    assert_true(has);
    assert_string_equal(d, dir);
    assert_string_equal(t, "global_step5");
}

// ---- the state on a device (dsc_engine_opts.device_state) ----

// A stand-in for the device trainer's side of the contract: the flat state in host arrays.
typedef struct fake_device {
    float *buf[4]; // master, m, v, the frozen tensors (DSC__STATE_FROZEN)
    size_t n, nfrozen;
    int reads, writes;
    int corrupt_from; // > 0: reads from this one on come back with their first value changed
} fake_device;

static float *fake_at(fake_device *d, int kind, size_t off, size_t n) {
    if (kind == DSC__STATE_FROZEN) {
        assert_true(off + n <= d->nfrozen);
        return d->buf[3] + off;
    }
    assert_true(kind >= 0 && kind < 3 && off + n <= d->n);
    return d->buf[kind] + off;
}

static dsc_status fake_read(void *user, int kind, size_t off, size_t n, float *dst) {
    fake_device *d = user;
    memcpy(dst, fake_at(d, kind, off, n), n * sizeof(float));
    if (d->corrupt_from && ++d->reads >= d->corrupt_from) dst[0] += 1.0f;
    else if (!d->corrupt_from) d->reads++;
    return DSC_OK;
}

static dsc_status fake_write(void *user, int kind, size_t off, size_t n, const float *src) {
    fake_device *d = user;
    memcpy(fake_at(d, kind, off, n), src, n * sizeof(float));
    d->writes++;
    return DSC_OK;
}

static dsc_status fill_sin(void *user, int i, int64_t begin, int64_t count, float *dst) {
    (void)user;
    for (int64_t k = 0; k < count; k++) dst[k] = 0.02f * sinf((float)(7 * i + begin + k));
    return DSC_OK;
}

static dsc_engine *make_on_device(const char *async) {
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
             "{\"lr\": 0.01}}, \"zero_optimization\": {\"stage\": 1}, \"checkpoint\": "
             "{\"async\": %s}}", async);
    dsc_engine *e = NULL;
    dsc_engine_opts o = {.config_json = json, .params = params, .nparams = NP, .world_size = 1,
                         .no_compute_copy = true, .device_grads = true, .device_state = true};
    if (dsc_engine_create(&e, &o) != DSC_OK) fail_msg("engine create: %s", dsc_last_error());
    return e;
}

// Init, full reads, checkpoint save (in line, even when async is asked) and load go through the
// source; what they give is bit for bit what a host engine gives for the same state.
static void test_state_on_device(void **state) {
    char da[600], dd[600];
    path_of(da, sizeof da, "dev_host");
    path_of(dd, sizeof dd, "dev_dev");
    setenv("DSC_DEVICE_STATE", "0", 1);
    dsc_engine *off = make_on_device("false");
    assert_false(dsc_engine_state_on_device(off)); // DSC_DEVICE_STATE=0: the host keeps them
    dsc_engine_destroy(off);
    unsetenv("DSC_DEVICE_STATE"); // the default: on the device

    dsc_engine *d = make_on_device("true");
    assert_true(dsc_engine_state_on_device(d));
    assert_null(dsc_param_master(d, 0));
    // no source yet: setting the weights says what to create first
    assert_int_equal(dsc_params_init(d, fill_sin, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "dsc_device_trainer_create"));
    dsc_engine_destroy(d);

    d = make_on_device("true");
    fake_device fd = {.n = dsc__engine_layout_len(d)};
    for (int k = 0; k < 3; k++) assert_non_null(fd.buf[k] = calloc(fd.n, sizeof(float)));
    dsc__engine_set_state_source(d, &(dsc__state_source){&fd, fake_read, fake_write});
    assert_int_equal(dsc_params_init(d, fill_sin, NULL), DSC_OK);
    assert_true(fd.writes > 0);
    dsc_engine *a = make(0, "AdamW"); // the same values through the host
    for (int i = 0; i < NP; i++) {
        size_t nb = (size_t)numel_of(i) * 4;
        float *x = malloc(nb), *y = malloc(nb);
        assert_int_equal(dsc_engine_full_param(d, i, x), DSC_OK);
        assert_int_equal(dsc_engine_full_param(a, i, y), DSC_OK);
        assert_memory_equal(x, y, nb);
        assert_memory_equal(x, fd.buf[0] + dsc__engine_param_offset(d, i), nb);
        free(x);
        free(y);
    }
    // a trained host state loads into the device's arrays
    train(a, 2);
    dsc_ckpt_opts o = sync_opts();
    assert_int_equal(dsc_checkpointing_start(a, da, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(a, "t"), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(a, true), DSC_OK);
    int writes = fd.writes;
    assert_int_equal(dsc_load_checkpoint(d, da, "t", NULL, 0), DSC_OK);
    assert_true(fd.writes > writes);
    assert_int_equal(dsc_engine_global_steps(d), 2);
    // and is saved from there (async asked: written in line from the source) as it was
    o.async = true;
    int reads = fd.reads;
    assert_int_equal(dsc_checkpointing_start(d, dd, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(d, "t"), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(d, true), DSC_OK);
    assert_true(fd.reads > reads);
    dsc_ckpt *c1, *c2;
    assert_int_equal(dsc_ckpt_open(&c1, da, "t"), DSC_OK);
    assert_int_equal(dsc_ckpt_open(&c2, dd, "t"), DSC_OK);
    for (int i = 0; i < NP; i++) {
        for (int kind = 0; kind <= 2; kind++) {
            size_t nb = (size_t)numel_of(i) * 4;
            float *x = malloc(nb), *y = malloc(nb);
            assert_int_equal(dsc_ckpt_read_param(c1, i, kind, x), DSC_OK);
            assert_int_equal(dsc_ckpt_read_param(c2, i, kind, y), DSC_OK);
            assert_memory_equal(x, y, nb);
            if (kind == 2) assert_true(x[0] > 0); // exp_avg_sq after 2 steps: moments moved too
            free(x);
            free(y);
        }
    }
    dsc_ckpt_close(c1);
    dsc_ckpt_close(c2);
    // validation compares each tensor read back with the device's: a device that answers
    // otherwise after the shard was written (its 9 reads: 3 kinds x 3 groups) fails it
    char dbad[600];
    path_of(dbad, sizeof dbad, "dev_bad");
    fd.corrupt_from = fd.reads + 10;
    assert_int_equal(dsc_checkpointing_start(d, dbad, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(d, "t"), DSC_ERR_CORRUPT);
    assert_non_null(strstr(dsc_last_error(), "read back differs from the saved state"));
    dsc_checkpointing_stop(d, false);
    fd.corrupt_from = 0;
    dsc_engine_destroy(a);
    dsc_engine_destroy(d);
    for (int k = 0; k < 3; k++) free(fd.buf[k]);

    // a frozen tensor (LoRA's base) lives there too: set through the source, read back from it
    dsc_param_desc pf[NP + 1];
    memcpy(pf, params, sizeof params);
    pf[NP] = (dsc_param_desc){"base.w", 2, {5, 7}, 1, true};
    const char *json = "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"AdamW\", "
                       "\"params\": {\"lr\": 0.01}}}";
    dsc_engine_opts eo = {.config_json = json, .params = pf, .nparams = NP + 1, .world_size = 1,
                          .no_compute_copy = true, .device_grads = true, .device_state = true};
    assert_int_equal(dsc_engine_create(&d, &eo), DSC_OK);
    fake_device ff = {.n = dsc__engine_layout_len(d), .nfrozen = 35};
    for (int k = 0; k < 4; k++) assert_non_null(ff.buf[k] = calloc(ff.n + 35, sizeof(float)));
    dsc__engine_set_state_source(d, &(dsc__state_source){&ff, fake_read, fake_write});
    assert_int_equal(dsc_params_init(d, fill_sin, NULL), DSC_OK);
    assert_null(dsc_param_data(d, NP)); // no host copy
    float w[35];
    assert_int_equal(dsc_engine_full_param(d, NP, w), DSC_OK);
    for (int k = 0; k < 35; k++) assert_true(w[k] == 0.02f * sinf((float)(7 * NP + k)));
    assert_memory_equal(w, ff.buf[3], sizeof w);
    dsc_engine_destroy(d);
    for (int k = 0; k < 4; k++) free(ff.buf[k]);
    unsetenv("DSC_DEVICE_STATE");
}

// The shard writer that pulls its data piece by piece (from a device) writes the bytes and the
// XXH3 of the one-block writer, across its 64 MiB staging pieces (an aligned header: the whole
// pieces go with O_DIRECT where the file system takes it, the short last one through the page
// cache).
static const char *pull_src;
static int pulls;
static dsc_status pull_from(void *user, void *dst, size_t off, size_t k) {
    (void)user;
    memcpy(dst, pull_src + off, k);
    pulls++;
    return DSC_OK;
}

static void test_shard_write_pull(void **state) {
    size_t n = ((size_t)64 << 20) + 12 * 1024 + 4; // two pieces, the second short
    char *data = malloc(n);
    assert_non_null(data);
    for (size_t i = 0; i < n; i++) data[i] = (char)(i * 2654435761u >> 13);
    char *hdr = NULL;
    assert_int_equal(posix_memalign((void **)&hdr, 4096, 4096), 0);
    memset(hdr, ' ', 4096);
    memcpy(hdr, "\xf8\x0f\x00\x00\x00\x00\x00\x00{}", 10);
    char a[600], b[600];
    path_of(a, sizeof a, "one.safetensors");
    path_of(b, sizeof b, "pulled.safetensors");
    uint64_t ba, bb, xa, xb;
    assert_int_equal(dsc__shard_write(a, hdr, 4096, data, n, &ba, &xa), DSC_OK);
    pull_src = data;
    assert_int_equal(dsc__shard_write_pull(b, hdr, 4096, n, pull_from, NULL, &bb, &xb), DSC_OK);
    assert_int_equal(pulls, 2);
    assert_int_equal(ba, bb);
    assert_true(xa == xb);
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    assert_non_null(fa), assert_non_null(fb);
    char *x = malloc(1 << 20), *y = malloc(1 << 20);
    size_t ra, rb;
    do {
        ra = fread(x, 1, 1 << 20, fa);
        rb = fread(y, 1, 1 << 20, fb);
        assert_int_equal(ra, rb);
        assert_memory_equal(x, y, ra);
    } while (ra > 0);
    fclose(fa), fclose(fb);
    free(x), free(y), free(data), free(hdr);
    unlink(a), unlink(b);
}

// The same across piece boundaries: a tensor of more than 16 Mi elements goes to the device,
// into a shard (64 MiB pieces) and back (16 Mi-element pieces) in several pieces each.
static void test_state_on_device_pieces(void **state) {
    const int64_t BIG = ((int64_t)17 << 20) + 5;
    dsc_param_desc pb[2] = {{"big", 1, {BIG}, 0, false}, {"small", 2, {3, 5}, 1, false}};
    const char *json = "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"AdamW\", "
                       "\"params\": {\"lr\": 0.01}}, \"checkpoint\": {\"async\": false}}";
    dsc_engine *h = NULL, *d = NULL;
    dsc_engine_opts ho = {.config_json = json, .params = pb, .nparams = 2, .world_size = 1,
                          .init_in_place = true};
    assert_int_equal(dsc_engine_create(&h, &ho), DSC_OK);
    assert_int_equal(dsc_params_init(h, fill_sin, NULL), DSC_OK);
    setenv("DSC_DEVICE_STATE", "1", 1);
    dsc_engine_opts dopt = {.config_json = json, .params = pb, .nparams = 2, .world_size = 1,
                            .no_compute_copy = true, .device_grads = true, .device_state = true};
    assert_int_equal(dsc_engine_create(&d, &dopt), DSC_OK);
    unsetenv("DSC_DEVICE_STATE");
    fake_device fd = {.n = dsc__engine_layout_len(d)};
    for (int k = 0; k < 3; k++) assert_non_null(fd.buf[k] = calloc(fd.n, sizeof(float)));
    dsc__engine_set_state_source(d, &(dsc__state_source){&fd, fake_read, fake_write});
    assert_int_equal(dsc_params_init(d, fill_sin, NULL), DSC_OK);
    assert_true(fd.writes >= 3); // two pieces of the big group, one of the small
    float *x = malloc((size_t)BIG * 4), *y = malloc((size_t)BIG * 4);
    assert_non_null(x), assert_non_null(y);
    assert_int_equal(dsc_engine_full_param(h, 0, x), DSC_OK);
    assert_int_equal(dsc_engine_full_param(d, 0, y), DSC_OK);
    assert_memory_equal(x, y, (size_t)BIG * 4);
    // moments that differ from element to element, then saved from the device and loaded into
    // the host engine (and back): the same bits everywhere
    for (int i = 0; i < 2; i++) { // (the padding between tensors stays zero, as a step keeps it)
        size_t off = dsc__engine_param_offset(d, i), n = (size_t)(i ? 15 : BIG);
        for (size_t k = off; k < off + n; k++)
            fd.buf[1][k] = (float)k * 1e-7f, fd.buf[2][k] = (float)(k % 977);
    }
    char dd[600], dh[600];
    path_of(dd, sizeof dd, "pieces_dev");
    path_of(dh, sizeof dh, "pieces_host");
    dsc_ckpt_opts o = sync_opts(); // validated: tensor by tensor, the big one in pieces
    assert_int_equal(dsc_checkpointing_start(d, dd, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(d, "p"), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(d, true), DSC_OK);
    assert_int_equal(dsc_load_checkpoint(h, dd, "p", NULL, 0), DSC_OK);
    assert_int_equal(dsc_checkpointing_start(h, dh, &o), DSC_OK);
    assert_int_equal(dsc_save_checkpoint(h, "p"), DSC_OK);
    assert_int_equal(dsc_checkpointing_stop(h, true), DSC_OK);
    float *saved[3];
    for (int k = 0; k < 3; k++) {
        saved[k] = malloc(fd.n * sizeof(float));
        memcpy(saved[k], fd.buf[k], fd.n * sizeof(float));
        memset(fd.buf[k], 0, fd.n * sizeof(float));
    }
    assert_int_equal(dsc_load_checkpoint(d, dh, "p", NULL, 0), DSC_OK);
    for (int k = 0; k < 3; k++) {
        assert_memory_equal(saved[k], fd.buf[k], fd.n * sizeof(float));
        free(saved[k]);
    }
    free(x), free(y);
    dsc_engine_destroy(h);
    dsc_engine_destroy(d);
    for (int k = 0; k < 3; k++) free(fd.buf[k]);
}

// kB of a /proc/self/status field ("VmRSS:", "VmHWM:"), or -1.
static long status_kb(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field))) kb = strtol(line + strlen(field), NULL, 10);
    if (f) fclose(f);
    return kb;
}

// The state on a device: a validated save and a load of a model of 3 x 40 Mi elements
// (480 MiB of master and moments per kind on the "device") move it through the host in pieces:
// the peak resident set grows by what the memory plan counts for them (engine/memplan.c's
// device_state_pieces: 192 MiB of pieces at this size, and a load's 64 MiB of checksum beside
// them) and a little, never by the state's size.
static void test_device_save_load_bounded(void **state) {
    (void)state;
    enum { BIG = 40 << 20 };
    static const dsc_param_desc big[] = {
        {"a.weight", 1, {BIG}, 0, false}, {"b.weight", 1, {BIG}, 1, false},
        {"c.weight", 1, {BIG}, 2, false},
    };
    const char *json = "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"AdamW\", "
                       "\"params\": {\"lr\": 0.01}}, \"zero_optimization\": {\"stage\": 1}}";
    dsc_engine *d = NULL;
    dsc_engine_opts o = {.config_json = json, .params = big, .nparams = 3, .world_size = 1,
                         .no_compute_copy = true, .device_grads = true, .device_state = true};
    assert_int_equal(dsc_engine_create(&d, &o), DSC_OK);
    fake_device fd = {.n = dsc__engine_layout_len(d)};
    for (int k = 0; k < 3; k++) assert_non_null(fd.buf[k] = calloc(fd.n, sizeof(float)));
    dsc__engine_set_state_source(d, &(dsc__state_source){&fd, fake_read, fake_write});
    assert_int_equal(dsc_params_init(d, fill_sin, NULL), DSC_OK);
    for (size_t i = 0; i < fd.n; i++) fd.buf[1][i] = fd.buf[2][i] = 1e-3f * (float)(i % 97);
    char dir[600];
    path_of(dir, sizeof dir, "dev_big");
    long grew[2] = {0, 0};
    bool reset = true;
    for (int pass = 0; pass < 2; pass++) { // 0: a validated save, 1: its load
        FILE *c = fopen("/proc/self/clear_refs", "w");
        reset = reset && c && fputs("5", c) >= 0;
        if (c) reset = fclose(c) == 0 && reset;
        long rss0 = status_kb("VmRSS:");
        if (pass == 0) {
            dsc_ckpt_opts so = sync_opts();
            assert_int_equal(dsc_checkpointing_start(d, dir, &so), DSC_OK);
            assert_int_equal(dsc_save_checkpoint(d, "t"), DSC_OK);
            assert_int_equal(dsc_checkpointing_stop(d, true), DSC_OK);
        } else {
            assert_int_equal(dsc_load_checkpoint(d, dir, "t", NULL, 0), DSC_OK);
        }
        grew[pass] = (status_kb("VmHWM:") - rss0) / 1024;
    }
    if (reset) {
        print_message("a validated save of 3 x 480 MiB raised the peak resident set by %ld MiB, "
                      "its load by %ld MiB\n", grew[0], grew[1]);
        assert_true(grew[0] < 192 + 80 && grew[1] < 192 + 64 + 80);
    }
    dsc_engine_destroy(d);
    for (int k = 0; k < 3; k++) free(fd.buf[k]);
}

// A checkpoint's verification hashes each shard through a mapping 64 MiB at a time and drops
// each piece's pages: the process's peak resident set grows by about one piece, not the file
// (192 MiB here; a 3B model's shard is 36 GiB), and the checksum is the one-shot XXH3's.
static void test_hash_file_bounded(void **state) {
    (void)state;
    char path[600];
    path_of(path, sizeof path, "big.bin");
    enum { MIB = 1 << 20, NMIB = 192 };
    uint32_t *block = malloc(MIB);
    dsc_hasher *want = dsc_hasher_create();
    FILE *f = fopen(path, "wb");
    assert_non_null(block), assert_non_null(want), assert_non_null(f);
    uint32_t x = 12345;
    for (int b = 0; b < NMIB; b++) {
        for (size_t k = 0; k < MIB / 4; k++) block[k] = x = x * 1664525u + 1013904223u;
        assert_int_equal(fwrite(block, 1, MIB, f), MIB);
        dsc_hasher_update(want, block, MIB);
    }
    assert_int_equal(fclose(f), 0);
    free(block);
    // the peak resets where the kernel allows it (Linux 4.0 on): then it must stay bounded
    FILE *c = fopen("/proc/self/clear_refs", "w");
    bool reset = c && fputs("5", c) >= 0;
    if (c) reset = fclose(c) == 0 && reset;
    long rss0 = status_kb("VmRSS:");
    uint64_t bytes = 0, h = 0;
    assert_int_equal(dsc__ckpt_hash_file(path, &bytes, &h), DSC_OK);
    long grew_mib = (status_kb("VmHWM:") - rss0) / 1024;
    assert_int_equal(bytes, (uint64_t)NMIB * MIB);
    assert_true(h == dsc_hasher_digest(want));
    dsc_hasher_destroy(want);
    if (reset && rss0 > 0) {
        print_message("hashing a %d MiB file raised the peak resident set by %ld MiB\n", NMIB,
                      grew_mib);
        assert_true(grew_mib < 100);
    }
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_manifest_roundtrip_and_tamper),
        cmocka_unit_test(test_bitwise_across_stages),
        cmocka_unit_test(test_moments_saved),
        cmocka_unit_test(test_async_latest_keep_last_leftovers),
        cmocka_unit_test(test_background_snapshot),
        cmocka_unit_test(test_validation_failure_marks_bad),
        cmocka_unit_test(test_corruption_and_fallback),
        cmocka_unit_test(test_mismatches),
        cmocka_unit_test(test_reshard_synthetic),
        cmocka_unit_test(test_export),
        cmocka_unit_test(test_attachments_and_export_hf),
        cmocka_unit_test(test_split_path),
        cmocka_unit_test(test_state_on_device),
        cmocka_unit_test(test_state_on_device_pieces),
        cmocka_unit_test(test_shard_write_pull),
        cmocka_unit_test(test_hash_file_bounded),
        cmocka_unit_test(test_device_save_load_bounded),
    };
    return cmocka_run_group_tests(tests, setup_dir, teardown_dir);
}
