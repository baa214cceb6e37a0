// Unit tests of dsc/safetensors.h as a program that embeds libdsc sees it: public headers only
// (what `dsc train --init-weights`, `--dump-weights` and `dsc generate --weights` use). One
// safetensors file written, streamed and read back; a Hugging Face folder written in shards and
// read back by slices, with bf16 converted; errors that name the file and the tensor.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // FILE, fopen, snprintf
#include <stdlib.h> // mkdtemp, system
#include <string.h> // strcmp, strstr
#include <unistd.h> // truncate

#include "dsc/half.h"        // dsc_fp32_to_bf16, dsc_bf16_to_fp32
#include "dsc/safetensors.h" // dsc_st_*, dsc_hf_weights_*
#include "dsc/status.h"      // dsc_last_error

static char dir[64];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/dsc-st-api-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void expect_error(dsc_status st, const char *needle) {
    assert_int_not_equal(st, DSC_OK);
    if (!strstr(dsc_last_error(), needle))
        fail_msg("error \"%s\" lacks \"%s\"", dsc_last_error(), needle);
}

static void test_dtype_size(void **state) {
    (void)state;
    assert_int_equal(dsc_st_dtype_size("F32"), 4);
    assert_int_equal(dsc_st_dtype_size("BF16"), 2);
    assert_int_equal(dsc_st_dtype_size("F16"), 2);
    assert_int_equal(dsc_st_dtype_size("I64"), 8);
    assert_int_equal(dsc_st_dtype_size("U8"), 1);
    assert_int_equal(dsc_st_dtype_size("Q4"), 0);
    dsc_st_close(NULL);
    dsc_hf_weights_close(NULL);
}

// One file: the tensors, their shapes and bytes, and the metadata come back as written.
static void test_file_round_trip(void **state) {
    (void)state;
    float w[6] = {1, -2, 3.5f, 4, 5, 1e-3f};
    int32_t tok[3] = {7, 0, 65535};
    dsc_st_tensor ts[] = {{"w", "F32", 2, {2, 3}, w, sizeof w},
                          {"tokens", "I32", 1, {3}, tok, sizeof tok}};
    const char *meta[] = {"format", "pt", "step", "12"};
    char p[128];
    snprintf(p, sizeof p, "%s/a.safetensors", dir);
    assert_int_equal(dsc_st_write(p, ts, 2, meta, 2), DSC_OK);

    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, p), DSC_OK);
    assert_int_equal(dsc_st_count(f), 2);
    const dsc_st_tensor *t = dsc_st_find(f, "w");
    assert_non_null(t);
    assert_string_equal(t->dtype, "F32");
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 2);
    assert_int_equal(t->shape[1], 3);
    assert_int_equal(t->nbytes, sizeof w);
    assert_memory_equal(t->data, w, sizeof w);
    t = dsc_st_find(f, "tokens");
    assert_non_null(t);
    assert_memory_equal(t->data, tok, sizeof tok);
    assert_null(dsc_st_find(f, "absent"));
    // dsc_st_get walks the file's order, every tensor once
    int seen = 0;
    for (int i = 0; i < dsc_st_count(f); i++) {
        const char *name = dsc_st_get(f, i)->name;
        seen |= !strcmp(name, "w") ? 1 : !strcmp(name, "tokens") ? 2 : 4;
    }
    assert_int_equal(seen, 3);
    assert_string_equal(dsc_st_meta(f, "format"), "pt");
    assert_string_equal(dsc_st_meta(f, "step"), "12");
    assert_null(dsc_st_meta(f, "absent"));
    dsc_st_close(f);
}

// Tensor i of the streamed writes: element k is 10 i + k (as float).
static dsc_status fill_counting(void *user, int i, void *dst, size_t nbytes) {
    int *calls = user;
    calls[i]++;
    float *x = dst;
    for (size_t k = 0; k < nbytes / 4; k++) x[k] = (float)(10 * i + (int)k);
    return DSC_OK;
}

static dsc_status fill_failing(void *user, int i, void *dst, size_t nbytes) {
    (void)user, (void)dst, (void)nbytes;
    return i == 1 ? DSC_ERR_IO : DSC_OK;
}

static void test_stream_write(void **state) {
    (void)state;
    dsc_st_tensor ts[] = {{.name = "a", .dtype = "F32", .ndim = 1, .shape = {3}, .nbytes = 12},
                          {.name = "b", .dtype = "F32", .ndim = 2, .shape = {2, 2}, .nbytes = 16}};
    int calls[2] = {0, 0};
    char p[128];
    snprintf(p, sizeof p, "%s/s.safetensors", dir);
    assert_int_equal(dsc_st_write_stream(p, ts, 2, NULL, 0, fill_counting, calls), DSC_OK);
    assert_int_equal(calls[0], 1);
    assert_int_equal(calls[1], 1);
    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, p), DSC_OK);
    const float *b = dsc_st_find(f, "b")->data;
    assert_true(b[0] == 10 && b[3] == 13);
    dsc_st_close(f);

    // A fill that fails: its status comes back and nothing is left under the name.
    snprintf(p, sizeof p, "%s/bad.safetensors", dir);
    assert_int_equal(dsc_st_write_stream(p, ts, 2, NULL, 0, fill_failing, NULL), DSC_ERR_IO);
    FILE *x = fopen(p, "rb");
    assert_null(x);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    x = fopen(tmp, "rb");
    assert_null(x);
}

static void test_file_errors(void **state) {
    (void)state;
    char p[128];
    snprintf(p, sizeof p, "%s/missing.safetensors", dir);
    dsc_st_file *f;
    expect_error(dsc_st_open(&f, p), "missing.safetensors");
    // A file cut short: the header says 8 bytes of tensor data, 4 are there.
    float w[2] = {1, 2};
    dsc_st_tensor t = {"w", "F32", 1, {2}, w, sizeof w};
    snprintf(p, sizeof p, "%s/cut.safetensors", dir);
    assert_int_equal(dsc_st_write(p, &t, 1, NULL, 0), DSC_OK);
    FILE *fp = fopen(p, "r+b");
    assert_non_null(fp);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long size = ftell(fp);
    fclose(fp);
    assert_int_equal(truncate(p, size - 4), 0);
    expect_error(dsc_st_open(&f, p), "cut.safetensors");
}

// A Hugging Face folder: written in shards by dsc_hf_weights_write, read by slices.
static void test_hf_folder(void **state) {
    (void)state;
    enum { N = 3 };
    const int64_t numel[N] = {6, 4, 5}; // 24, 16 and 20 bytes of F32
    const char *names[N] = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"};
    dsc_st_tensor t[N];
    for (int i = 0; i < N; i++)
        t[i] = (dsc_st_tensor){.name = names[i], .dtype = "F32", .ndim = 1, .shape = {numel[i]},
                               .nbytes = (size_t)numel[i] * 4};
    t[0].ndim = 2, t[0].shape[0] = 2, t[0].shape[1] = 3;
    const char *meta[] = {"format", "pt"};
    int calls[N] = {0};
    // 40 bytes a shard: {embed, norm}, {lm_head}.
    assert_int_equal(dsc_hf_weights_write(dir, t, N, 40, meta, 1, fill_counting, calls), DSC_OK);
    for (int i = 0; i < N; i++) assert_int_equal(calls[i], 1);
    char p[128];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, p), DSC_OK);
    assert_int_equal(dsc_st_count(f), 1);
    assert_non_null(dsc_st_find(f, "lm_head.weight"));
    assert_string_equal(dsc_st_meta(f, "format"), "pt");
    dsc_st_close(f);

    dsc_hf_weights *w;
    assert_int_equal(dsc_hf_weights_open(&w, dir), DSC_OK);
    assert_int_equal(dsc_hf_weights_count(w), N);
    for (int i = 0; i < N; i++) assert_true(dsc_hf_weights_has(w, dsc_hf_weights_name(w, i)));
    assert_true(dsc_hf_weights_has(w, "model.norm.weight"));
    assert_false(dsc_hf_weights_has(w, "transformer.wte.weight"));
    dsc_hf_tensor info;
    assert_int_equal(dsc_hf_weights_info(w, "model.embed_tokens.weight", &info), DSC_OK);
    assert_string_equal(info.dtype, "F32");
    assert_int_equal(info.ndim, 2);
    assert_int_equal(info.shape[1], 3);
    assert_int_equal(info.numel, 6);
    float out[6];
    // a slice, as a rank reads its ZeRO partition
    assert_int_equal(dsc_hf_weights_read(w, "model.embed_tokens.weight", 2, 3, out), DSC_OK);
    assert_true(out[0] == 2 && out[1] == 3 && out[2] == 4);
    assert_int_equal(dsc_hf_weights_read(w, "lm_head.weight", 0, 5, out), DSC_OK);
    assert_true(out[0] == 20 && out[4] == 24);
    expect_error(dsc_hf_weights_info(w, "transformer.wte.weight", &info), "transformer.wte.weight");
    expect_error(dsc_hf_weights_read(w, "model.norm.weight", 2, 3, out), "model.norm.weight");
    dsc_hf_weights_close(w);
}

// One bf16 file opened as a folder of one: read as fp32.
static void test_hf_bf16_file(void **state) {
    (void)state;
    const float x[4] = {-1.5f, 0.1f, 8, 3.14159f};
    uint16_t h[4];
    for (int i = 0; i < 4; i++) h[i] = dsc_fp32_to_bf16(x[i]);
    dsc_st_tensor t = {"model.norm.weight", "BF16", 1, {4}, h, sizeof h};
    char p[128];
    snprintf(p, sizeof p, "%s/one.safetensors", dir);
    assert_int_equal(dsc_st_write(p, &t, 1, NULL, 0), DSC_OK);
    dsc_hf_weights *w;
    assert_int_equal(dsc_hf_weights_open(&w, p), DSC_OK);
    assert_int_equal(dsc_hf_weights_count(w), 1);
    dsc_hf_tensor info;
    assert_int_equal(dsc_hf_weights_info(w, "model.norm.weight", &info), DSC_OK);
    assert_string_equal(info.dtype, "BF16");
    float out[4];
    assert_int_equal(dsc_hf_weights_read(w, "model.norm.weight", 0, 4, out), DSC_OK);
    for (int i = 0; i < 4; i++) assert_true(out[i] == dsc_bf16_to_fp32(h[i]));
    dsc_hf_weights_close(w);
    // a folder with no weights: the error names what it must hold
    char empty[96];
    snprintf(empty, sizeof empty, "%s/empty", dir);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", empty);
    assert_int_equal(system(cmd), 0);
    expect_error(dsc_hf_weights_open(&w, empty), "model.safetensors");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_size),
        cmocka_unit_test_setup_teardown(test_file_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stream_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hf_folder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_hf_bf16_file, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
