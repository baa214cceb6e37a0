// Model test: dsc's Qwen3 (the Llama family with qk_norm) against Hugging Face transformers' own
// Qwen3ForCausalLM, through fixtures that scripts/qwen3-hf-fixtures.py wrote with transformers
// (tests/model/fixtures/qwen3: each case's model.safetensors from save_pretrained and a
// ref.safetensors with a batch, the logits, the loss and every parameter's gradient, float32,
// eager attention, CPU; the versions that made them are in its metadata). For each case dsc's
// CPU model, built from the shape in the metadata and the file's weights, must give logits within
// 1e-4 relative (max |a - b| / max |b|), the loss within 1e-5 relative and every gradient within
// 1e-4 relative in L2; the config.json transformers wrote reads as the same shape. The GPU passes are held to this CPU model by tests/cuda/test_cuda_llama.cu.
// Skipped (77) when the fixtures are absent.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // fabs, sqrt, isnan
#include <stdio.h>  // FILE, fopen, fgets, snprintf, printf
#include <stdlib.h> // calloc, free, malloc, strtod, strtol
#include <string.h> // memcpy, strcspn

#include "dsc/status.h"              // dsc_last_error
#include "engine/ckpt/safetensors.h" // dsc_st_*
#include "model/hf_config.h"         // dsc_hf_config_read
#include "model/llama/llama.h"       // dsc_llama_*

#define LOGIT_TOL 1e-4
#define LOSS_TOL 1e-5
#define GRAD_TOL 1e-4
#define FIXTURES DSC_SOURCE_DIR "/tests/model/fixtures/qwen3"

static double max_rel(const float *got, const float *want, int64_t n) {
    double num = 0.0, den = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return num / den;
}

static double l2_rel(const float *got, const float *want, int64_t n) {
    double num = 0.0, den = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static const char *meta(const dsc_st_file *f, const char *key) {
    const char *v = dsc_st_meta(f, key);
    if (!v) fail_msg("ref.safetensors has no metadata \"%s\"", key);
    return v;
}

static long meta_long(const dsc_st_file *f, const char *key) {
    char *end = NULL;
    const char *v = meta(f, key);
    long x = strtol(v, &end, 10);
    assert_true(end != v && *end == '\0');
    return x;
}

static double meta_double(const dsc_st_file *f, const char *key) {
    char *end = NULL;
    const char *v = meta(f, key);
    double x = strtod(v, &end);
    assert_true(end != v && *end == '\0');
    return x;
}

static dsc_llama_config config_of(const dsc_st_file *ref) {
    dsc_llama_config c = {.n_layer = (int)meta_long(ref, "n_layer"),
                          .hidden = (int)meta_long(ref, "hidden"),
                          .n_head = (int)meta_long(ref, "n_head"),
                          .n_kv_head = (int)meta_long(ref, "n_kv_head"),
                          .head_dim = (int)meta_long(ref, "head_dim"),
                          .intermediate = (int)meta_long(ref, "intermediate"),
                          .vocab_size = (int)meta_long(ref, "vocab"),
                          .max_seq_len = (int)meta_long(ref, "T"),
                          .rms_eps = (float)meta_double(ref, "rms_eps"),
                          .rope_theta = meta_double(ref, "rope_theta"),
                          .rope_scaling = DSC_LLAMA_ROPE_NONE,
                          .rope_factor = 1.0,
                          .tied = (int)meta_long(ref, "tied"),
                          .qk_norm = 1};
    return c;
}

// The folder's config.json, as `--model hf:DIR` reads it, names the shape the metadata does.
static void check_config_json(const char *name, const dsc_llama_config *want) {
    char dir[1024];
    snprintf(dir, sizeof dir, FIXTURES "/%s", name);
    dsc_hf_config h;
    if (dsc_hf_config_read(dir, &h) != DSC_OK) fail_msg("%s", dsc_last_error());
    assert_int_equal(h.arch, DSC_HF_QWEN3);
    assert_int_equal(h.n_layer, want->n_layer), assert_int_equal(h.hidden, want->hidden);
    assert_int_equal(h.n_head, want->n_head), assert_int_equal(h.n_kv_head, want->n_kv_head);
    assert_int_equal(h.head_dim, want->head_dim);
    assert_int_equal(h.intermediate, want->intermediate);
    assert_int_equal(h.vocab_size, want->vocab_size), assert_int_equal(h.tied, want->tied);
    assert_true(fabs(h.rope_theta - want->rope_theta) < 1e-6 * want->rope_theta);
    assert_true(fabs((float)h.norm_eps - want->rms_eps) < 1e-12);
    assert_false(h.qkv_bias || h.o_bias || h.mlp_bias);
    assert_int_equal(h.sliding_window, 0);
}

static const float *f32_of(const dsc_st_file *f, const char *name, int64_t numel) {
    const dsc_st_tensor *t = dsc_st_find(f, name);
    if (!t) fail_msg("tensor %s is missing", name);
    assert_string_equal(t->dtype, "F32");
    assert_int_equal(t->nbytes, (size_t)numel * sizeof(float));
    return t->data;
}

// The model's tensors from model.safetensors (shapes checked), zeroed gradients.
static void load_params(const dsc_llama_config *c, const dsc_st_file *model, const char *name,
                        float **p, float **g) {
    int n = dsc_llama_num_tensors(c);
    for (int i = 0; i < n; i++) {
        dsc_llama_tensor_info info;
        dsc_llama_tensor_info_get(c, i, &info);
        const dsc_st_tensor *t = dsc_st_find(model, info.name);
        if (!t) fail_msg("%s: model.safetensors has no %s", name, info.name);
        assert_int_equal(t->ndim, info.ndim);
        for (int d = 0; d < info.ndim; d++) assert_int_equal(t->shape[d], info.shape[d]);
        p[i] = malloc(sizeof(float) * info.numel);
        memcpy(p[i], f32_of(model, info.name, info.numel), sizeof(float) * info.numel);
        g[i] = calloc(info.numel, sizeof(float));
    }
    assert_int_equal(dsc_st_count(model), n); // nothing left over (a tied lm_head is not saved)
}

static double worst_grad(const dsc_llama_config *c, const dsc_st_file *ref, float **g,
                         char *where, size_t cap) {
    double worst = 0.0;
    char key[96];
    for (int i = 0; i < dsc_llama_num_tensors(c); i++) {
        dsc_llama_tensor_info info;
        dsc_llama_tensor_info_get(c, i, &info);
        snprintf(key, sizeof key, "grad.%s", info.name);
        double e = l2_rel(g[i], f32_of(ref, key, info.numel), info.numel);
        if (!(e <= worst)) worst = e, snprintf(where, cap, "%s", info.name);
    }
    return worst;
}

static void run_case(const char *name) {
    char path[1024];
    dsc_st_file *model = NULL, *ref = NULL;
    snprintf(path, sizeof path, FIXTURES "/%s/model.safetensors", name);
    if (dsc_st_open(&model, path) != DSC_OK) fail_msg("%s", dsc_last_error());
    snprintf(path, sizeof path, FIXTURES "/%s/ref.safetensors", name);
    if (dsc_st_open(&ref, path) != DSC_OK) fail_msg("%s", dsc_last_error());
    dsc_llama_config c = config_of(ref);
    check_config_json(name, &c);
    int B = (int)meta_long(ref, "B"), T = (int)meta_long(ref, "T"), n = dsc_llama_num_tensors(&c);
    const dsc_st_tensor *ids = dsc_st_find(ref, "input_ids"), *lab = dsc_st_find(ref, "labels");
    assert_true(ids && lab && ids->nbytes == sizeof(int32_t) * (size_t)B * T);
    float **p = calloc(n, sizeof(float *)), **g = calloc(n, sizeof(float *));
    load_params(&c, model, name, p, g);
    dsc_llama *m = NULL;
    assert_int_equal(dsc_llama_create(&m, &c, B, T), DSC_OK);
    float loss = 0.0f;
    if (dsc_llama_forward(m, p, ids->data, lab->data, B, T, NULL, &loss) != DSC_OK)
        fail_msg("%s: forward: %s", name, dsc_last_error());
    int64_t nlog = (int64_t)B * T * c.vocab_size;
    double logit_err = max_rel(dsc_llama_logits(m), f32_of(ref, "logits", nlog), nlog);
    double want = f32_of(ref, "loss", 1)[0], loss_err = fabs(loss - want) / fabs(want);
    assert_int_equal(dsc_llama_backward(m, p, g, 1.0f, NULL), DSC_OK);
    char where[64] = "";
    double worst = worst_grad(&c, ref, g, where, sizeof where);
    printf("  %-11s (transformers %s, torch %s) loss %.6f (rel err %.2g), logits rel err %.2g; "
           "%d gradients, worst L2 rel err %.2g (%s)\n",
           name, meta(ref, "transformers"), meta(ref, "torch"), loss, loss_err, logit_err, n,
           worst, where);
    if (!(logit_err <= LOGIT_TOL)) fail_msg("%s: logits rel err %.3g", name, logit_err);
    if (!(loss_err <= LOSS_TOL)) fail_msg("%s: loss rel err %.3g", name, loss_err);
    if (!(worst <= GRAD_TOL)) fail_msg("%s: gradient %s rel err %.3g", name, where, worst);
    dsc_llama_destroy(m);
    for (int i = 0; i < n; i++) free(p[i]), free(g[i]);
    free(p), free(g);
    dsc_st_close(model);
    dsc_st_close(ref);
}

static void test_against_transformers(void **state) {
    (void)state;
    char line[256];
    FILE *f = fopen(FIXTURES "/cases.txt", "r");
    assert_non_null(f);
    int cases = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!*line) continue;
        run_case(line);
        cases++;
    }
    fclose(f);
    assert_true(cases >= 2);
}

int main(void) {
    FILE *f = fopen(FIXTURES "/cases.txt", "r");
    if (!f) {
        printf("SKIP: no Qwen3 fixtures in tests/model/fixtures/qwen3; make them with "
               "python3 scripts/qwen3-hf-fixtures.py where transformers has Qwen3\n");
        return 77;
    }
    fclose(f);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_transformers)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
