// Model test: dsc's GPT-2 (d4, V 101, B 3, T 16) against a hand-written PyTorch GPT-2 in float32
// (tests/model/gpt2_torch_ref.py): loss, logits and every parameter gradient agree to a relative
// error max|a - b| / max|b| <= 1e-5 per tensor. Skipped when /usr/bin/python3 lacks torch.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // fabs
#include <stdio.h>  // FILE, fopen, fwrite, fread, snprintf, printf
#include <stdlib.h> // malloc, calloc, free, getenv, mkstemp, system
#include <string.h> // strchr, strlen
#include <unistd.h> // close, unlink

#include "dsc/status.h"      // dsc_last_error
#include "model/gpt2/gpt2.h" // dsc_gpt2_*

#define PYTHON "/usr/bin/python3"
#define TOL 1e-5

static const uint64_t seed = 7;

static uint64_t rng_state;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float uniform(float lo, float hi) {
    return lo + (hi - lo) * (float)((double)(rng_next() >> 11) * 0x1.0p-53);
}

static double rel_err(const float *got, const float *want, int64_t n) {
    double num = 0.0, den = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        num = (d > num || isnan(d)) ? (isnan(d) ? INFINITY : d) : num;
        den = fabs(want[i]) > den ? fabs(want[i]) : den;
    }
    return num / den;
}

static int make_temp(char *path, size_t cap, const char *tag) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, cap, "%s/dsc_gpt2_torch_%s_XXXXXX", dir && *dir ? dir : "/tmp", tag);
    int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    return fd >= 0;
}

static void write_input(const char *path, const dsc_gpt2_config *c, int B, int T,
                        const int32_t *in, const int32_t *tg, float *const *p,
                        const int64_t *numel, int n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    int32_t header[8] = {1, c->n_layer, c->n_head, c->n_embd, c->vocab_size, c->max_seq_len, B, T};
    assert_int_equal(fwrite("DSCGPT2I", 1, 8, f), 8);
    assert_int_equal(fwrite(header, sizeof header, 1, f), 1);
    assert_int_equal(fwrite(in, sizeof(int32_t), (size_t)B * T, f), (size_t)B * T);
    assert_int_equal(fwrite(tg, sizeof(int32_t), (size_t)B * T, f), (size_t)B * T);
    for (int i = 0; i < n; i++)
        assert_int_equal(fwrite(p[i], sizeof(float), (size_t)numel[i], f), (size_t)numel[i]);
    assert_int_equal(fclose(f), 0);
}

static void read_exact(FILE *f, void *dst, size_t bytes) {
    assert_int_equal(fread(dst, 1, bytes, f), bytes);
}

static void test_against_torch(void **state) {
    if (system(PYTHON " -c 'import torch, numpy' >/dev/null 2>&1") != 0) {
        printf("SKIP: " PYTHON " cannot import torch and numpy; install python3-torch to run "
               "the PyTorch comparison\n");
        skip();
    }
    dsc_gpt2_config c;
    int B = 3, T = 16, V = 101;
    assert_int_equal(dsc_gpt2_config_parse("d4", V, T, &c), DSC_OK);
    int n = dsc_gpt2_num_tensors(&c);
    float **p = calloc(n, sizeof(float *)), **g = calloc(n, sizeof(float *));
    int64_t *numel = calloc(n, sizeof(int64_t));
    int *ndim = calloc(n, sizeof(int));
    rng_state = seed;
    for (int i = 0; i < n; i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&c, i, &info);
        numel[i] = info.numel;
        ndim[i] = info.ndim;
        p[i] = malloc(sizeof(float) * info.numel);
        g[i] = calloc(info.numel, sizeof(float));
    }
    dsc_gpt2_init_weights(&c, p, seed);
    for (int i = 0; i < n; i++) { // move biases and layernorm off 0 and 1; widen the weights
        for (int64_t j = 0; j < numel[i]; j++)
            p[i][j] = ndim[i] == 1 ? p[i][j] + uniform(-0.2f, 0.2f) : p[i][j] * 4.0f;
    }
    int32_t in[48], tg[48];
    for (int i = 0; i < B * T; i++) in[i] = (int32_t)(rng_next() % V);
    for (int i = 0; i < B * T; i++) tg[i] = (int32_t)(rng_next() % V);

    dsc_gpt2 *m = NULL;
    assert_int_equal(dsc_gpt2_create(&m, &c, B, T), DSC_OK);
    float loss = 0.0f;
    assert_int_equal(dsc_gpt2_forward(m, p, in, tg, B, T, NULL, &loss), DSC_OK);
    size_t nlog = (size_t)B * T * V;
    float *logits = malloc(sizeof(float) * nlog);
    memcpy(logits, dsc_gpt2_logits(m), sizeof(float) * nlog);
    assert_int_equal(dsc_gpt2_backward(m, p, g, 1.0f, NULL), DSC_OK);

    char in_path[512], out_path[512], cmd[2048];
    assert_true(make_temp(in_path, sizeof in_path, "in"));
    assert_true(make_temp(out_path, sizeof out_path, "out"));
    write_input(in_path, &c, B, T, in, tg, p, numel, n);
    const char *script = DSC_SOURCE_DIR "/tests/model/gpt2_torch_ref.py";
    assert_null(strchr(script, '\''));
    assert_null(strchr(in_path, '\''));
    snprintf(cmd, sizeof cmd, PYTHON " '%s' '%s' '%s'", script, in_path, out_path);
    int rc = system(cmd);
    unlink(in_path);
    if (rc != 0) {
        unlink(out_path);
        fail_msg("%s failed with status %d", cmd, rc);
    }

    FILE *f = fopen(out_path, "rb");
    assert_non_null(f);
    char magic[8];
    double want_loss;
    read_exact(f, magic, 8);
    assert_memory_equal(magic, "DSCGPT2O", 8);
    read_exact(f, &want_loss, sizeof want_loss);
    float *want = malloc(sizeof(float) * nlog);
    read_exact(f, want, sizeof(float) * nlog);
    double loss_err = fabs(loss - want_loss) / fabs(want_loss);
    double logit_err = rel_err(logits, want, (int64_t)nlog);
    printf("  loss dsc %.7f torch %.7f rel err %.3g; logits rel err %.3g\n", loss, want_loss,
           loss_err, logit_err);
    assert_true(loss_err <= TOL && logit_err <= TOL);
    double worst = 0.0;
    int worst_i = 0;
    for (int i = 0; i < n; i++) {
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&c, i, &info);
        float *w = malloc(sizeof(float) * numel[i]);
        read_exact(f, w, sizeof(float) * numel[i]);
        double e = rel_err(g[i], w, numel[i]);
        if (e > worst || i == 0) worst = e, worst_i = i;
        if (!(e <= TOL)) printf("  grad %-26s rel err %.3g > %.0e\n", info.name, e, TOL);
        free(w);
    }
    fclose(f);
    unlink(out_path);
    dsc_gpt2_tensor_info info;
    dsc_gpt2_tensor_info_get(&c, worst_i, &info);
    printf("  gradients: worst rel err %.3g (%s) over %d tensors, tol %.0e\n", worst, info.name, n,
           TOL);
    if (!(worst <= TOL)) fail_msg("gradient %s: rel err %.3g > %.0e", info.name, worst, TOL);

    dsc_gpt2_destroy(m);
    for (int i = 0; i < n; i++) free(p[i]), free(g[i]);
    free(p), free(g), free(numel), free(ndim), free(logits), free(want);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_torch)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
