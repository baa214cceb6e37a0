// test_model_common.c - what the families share on the host (model/common.h): the normal
// initialiser is order-free and is what each family's init gives; the mean loss leaves ignored
// targets out; a file's tensor table is matched by name and shape with errors that name the
// tensor; a pass's tensor arrays, the layer loops' hooks and the inference row scratch behave
// as both families rely on.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free
#include <string.h> // strcmp, strstr, memcmp

#include "dsc/status.h"        // dsc_last_error
#include "model/common.h"      // dsc__model_*
#include "model/gpt2/gpt2.h"   // dsc_gpt2_*
#include "model/gpt2/model.h"  // dsc__gpt2_model_ops
#include "model/llama/llama.h" // dsc_llama_*

static void expect_error(dsc_status st, dsc_status want, const char *text) {
    assert_int_equal(st, want);
    if (!strstr(dsc_last_error(), text))
        fail_msg("error \"%s\" does not say \"%s\"", dsc_last_error(), text);
}

// ---- initialisation ----

static void test_init_normal_slices(void **state) {
    (void)state;
    enum { N = 101 };
    float full[N], part[N];
    dsc__model_init_normal(full, 5, 0, N, 0.02, 7);
    // Any slice, odd or even at either end, is the same range of the whole stream, bit for bit.
    const int cuts[][2] = {{0, 1}, {1, 1}, {3, 10}, {4, 9}, {1, 100}, {50, 51}, {100, 1}};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        memset(part, 0, sizeof part);
        dsc__model_init_normal(part, 5, cuts[c][0], cuts[c][1], 0.02, 7);
        assert_memory_equal(part, full + cuts[c][0], sizeof(float) * (size_t)cuts[c][1]);
    }
    double sq = 0.0;
    for (int i = 0; i < N; i++) sq += (double)full[i] * full[i];
    assert_true(sq / N > 0.0001 && sq / N < 0.0009); // variance near 0.02^2
    float other[N];
    dsc__model_init_normal(other, 6, 0, N, 0.02, 7); // another tensor: another stream
    assert_true(memcmp(other, full, sizeof full) != 0);
}

// Both families' initialisers are this one for their matrices: GPT-2's wte (tensor 0) and
// Llama's embed_tokens (tensor 0), both normal(0, 0.02).
static void test_init_normal_is_the_families(void **state) {
    (void)state;
    dsc_gpt2_config g;
    assert_int_equal(dsc_gpt2_config_parse("d1", 50, 16, &g), DSC_OK);
    dsc_llama_config l;
    assert_int_equal(dsc_llama_config_parse("llama-d1", 50, 16, &l), DSC_OK);
    size_t n = 50 * 64;
    float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float));
    dsc_gpt2_init_tensor(&g, 0, a, 3, (int64_t)n - 3, 11);
    dsc__model_init_normal(b, 0, 3, (int64_t)n - 3, 0.02, 11);
    assert_memory_equal(a, b, sizeof(float) * (n - 3));
    dsc_llama_init_tensor(&l, 0, a, 0, (int64_t)n, 11);
    dsc__model_init_normal(b, 0, 0, (int64_t)n, 0.02, 11);
    assert_memory_equal(a, b, sizeof(float) * n);
    free(a), free(b);
}

// ---- the loss ----

static void test_mean_loss(void **state) {
    (void)state;
    const float losses[5] = {1.0f, 0.0f, 2.0f, 0.0f, 4.5f};
    const int32_t targets[5] = {3, -100, 0, -1, 9};
    int64_t counted = -1;
    float mean = dsc__model_mean_loss(losses, targets, 5, &counted);
    assert_int_equal(counted, 3);
    assert_true(mean == (float)(7.5 / 3.0));
    const int32_t none[2] = {-1, -1};
    assert_true(dsc__model_mean_loss(losses, none, 2, &counted) == 0.0f);
    assert_int_equal(counted, 0);
}

// ---- a file's tensor table ----

typedef struct table {
    dsc_param_desc *t;
    char (*names)[96]; // the entries' names
    int n;
} table;

// GPT-2 d1's tensors as a file would list them, each name behind prefix.
static table gpt2_table(const dsc_gpt2_config *c, const char *prefix) {
    int n = dsc_gpt2_num_tensors(c);
    table tb = {calloc((size_t)n, sizeof(dsc_param_desc)), calloc((size_t)n, 96), n};
    for (int i = 0; i < tb.n; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(c, i, &ti);
        snprintf(tb.names[i], sizeof tb.names[i], "%s%s", prefix, ti.name);
        tb.t[i].name = tb.names[i];
        tb.t[i].ndim = ti.ndim;
        tb.t[i].shape[0] = ti.shape[0];
        tb.t[i].shape[1] = ti.shape[1];
    }
    return tb;
}

static void test_match_params(void **state) {
    (void)state;
    dsc_gpt2_config c;
    assert_int_equal(dsc_gpt2_config_parse("d1", 50, 16, &c), DSC_OK);
    table tb = gpt2_table(&c, "transformer.");
    // Listed backwards: order maps each model tensor to its entry.
    for (int i = 0; i < tb.n / 2; i++) {
        dsc_param_desc tmp = tb.t[i];
        tb.t[i] = tb.t[tb.n - 1 - i];
        tb.t[tb.n - 1 - i] = tmp;
    }
    int *order = calloc((size_t)tb.n, sizeof(int));
    const struct dsc_model_ops *ops = &dsc__gpt2_model_ops;
    assert_int_equal(dsc__model_find_param(tb.t, tb.n, "wte.weight", "transformer."), tb.n - 1);
    assert_int_equal(dsc__model_find_param(tb.t, tb.n, "wte.weight", NULL), -1);
    assert_int_equal(dsc__model_match_params(tb.t, tb.n, "transformer.", ops->param, &c, tb.n,
                                             "f.safetensors", "GPT-2 of 1 layers", "GPT-2 d1",
                                             order),
                     DSC_OK);
    for (int k = 0; k < tb.n; k++) assert_int_equal(order[k], tb.n - 1 - k);

    tb.t[0].shape[0] = 7; // ln_f.bias (the last tensor, first in the file) misshapen
    expect_error(dsc__model_match_params(tb.t, tb.n, "transformer.", ops->param, &c, tb.n,
                                         "f.safetensors", "GPT-2 of 1 layers", "GPT-2 d1", order),
                 DSC_ERR_INVALID_ARG,
                 "f.safetensors: tensor ln_f.bias has shape (7, 0), GPT-2 d1 needs (64, 0)");
    tb.t[0].name = "transformer.ln_f.b";
    expect_error(dsc__model_match_params(tb.t, tb.n, "transformer.", ops->param, &c, tb.n,
                                         "f.safetensors", "GPT-2 of 1 layers", "GPT-2 d1", order),
                 DSC_ERR_INVALID_ARG,
                 "f.safetensors: tensor ln_f.bias is missing; the file is not a complete GPT-2 "
                 "of 1 layers");
    free(tb.t), free(tb.names), free(order);
}

// ---- a pass's arguments ----

static dsc_status gather_none(void *u, int g) {
    (void)u, (void)g;
    return DSC_OK;
}

static void test_check_tensors(void **state) {
    (void)state;
    dsc_gpt2_config c;
    assert_int_equal(dsc_gpt2_config_parse("d1", 50, 16, &c), DSC_OK);
    int n = dsc_gpt2_num_tensors(&c);
    float one = 0.0f, **t = calloc((size_t)n, sizeof(float *));
    for (int i = 0; i < n; i++) t[i] = &one;
    const struct dsc_model_ops *ops = &dsc__gpt2_model_ops;
    assert_int_equal(dsc__model_check_tensors(ops, &c, n, t, "params", NULL, NULL), DSC_OK);
    t[4] = NULL;
    expect_error(dsc__model_check_tensors(ops, &c, n, t, "grads", NULL, NULL), DSC_ERR_INVALID_ARG,
                 "gpt2: grads[4] (h.0.attn.c_attn.weight) is NULL");
    bool *required = calloc((size_t)n, sizeof(bool)); // a LoRA run: only trainable ones needed
    assert_int_equal(dsc__model_check_tensors(ops, &c, n, t, "grads", NULL, required), DSC_OK);
    required[4] = true;
    expect_error(dsc__model_check_tensors(ops, &c, n, t, "grads", NULL, required),
                 DSC_ERR_INVALID_ARG, "gpt2: grads[4] (h.0.attn.c_attn.weight) is NULL");
    free(required);
    dsc_model_hooks gather = {.gather = gather_none}; // it fills the entries itself
    assert_int_equal(dsc__model_check_tensors(ops, &c, n, t, "params", &gather, NULL), DSC_OK);
    expect_error(dsc__model_check_tensors(ops, &c, n, NULL, "params", &gather, NULL),
                 DSC_ERR_INVALID_ARG, "gpt2: the params array is NULL");
    expect_error(dsc__model_check_batch("llama", 3, 8, 2, 8), DSC_ERR_INVALID_ARG,
                 "llama forward: batch 3 x 8 does not fit the 2 x 8");
    expect_error(dsc__model_check_create("gpt2", 1, 17, 16), DSC_ERR_INVALID_ARG,
                 "gpt2 create: batch 1 x 17 is invalid");
    expect_error(dsc__model_check_backward("llama", true, false), DSC_ERR_INVALID_ARG,
                 "llama backward: needs a forward with targets first");
    assert_int_equal(dsc__model_check_backward("llama", true, true), DSC_OK);
    free(t);
}

// ---- the layer loops ----

typedef struct trace {
    char log[256];
    int fail_group; // the gather hook of this group fails
} trace;

static void note(trace *tr, const char *what, int g) {
    size_t len = strlen(tr->log);
    snprintf(tr->log + len, sizeof tr->log - len, "%s%d ", what, g);
}
static dsc_status on_gather(void *u, int g) {
    note(u, "g", g);
    return g == ((trace *)u)->fail_group ? DSC_ERR_PEER : DSC_OK;
}
static dsc_status on_release(void *u, int g) {
    note(u, "r", g);
    return DSC_OK;
}
static dsc_status on_ready(void *u, int g) {
    note(u, "d", g);
    return DSC_OK;
}
static void fwd_layer(void *m, float *const *params, int l) {
    (void)params;
    note(m, "F", l);
}
static void bwd_layer(void *m, float *const *params, float *const *grads, int l) {
    (void)params, (void)grads;
    note(m, "B", l);
}

static void test_layer_loops(void **state) {
    (void)state;
    trace tr = {.fail_group = -1};
    dsc_model_hooks h = {.user = &tr, .gather = on_gather, .release = on_release,
                         .grads_ready = on_ready};
    assert_int_equal(dsc_model_layers_forward(&h, "gpt2", 2, fwd_layer, &tr, NULL), DSC_OK);
    assert_string_equal(tr.log, "g1 F0 r1 g2 F1 r2 ");
    tr.log[0] = '\0';
    assert_int_equal(dsc_model_layers_backward(&h, "gpt2", 2, bwd_layer, NULL, &tr, NULL, NULL),
                     DSC_OK);
    assert_string_equal(tr.log, "g2 B1 r2 d2 g1 B0 r1 d1 ");
    tr.log[0] = '\0';
    // activation checkpointing: each layer's forward again, inside its gather, before its backward
    assert_int_equal(dsc_model_layers_backward(&h, "gpt2", 2, bwd_layer, fwd_layer, &tr, NULL,
                                                NULL), DSC_OK);
    assert_string_equal(tr.log, "g2 F1 B1 r2 d2 g1 F0 B0 r1 d1 ");
    assert_int_equal(dsc__model_act_blocks(true, 12), 1);
    assert_int_equal(dsc__model_act_blocks(false, 12), 12);
    assert_int_equal(dsc__model_act_block(true, 7), 0);
    assert_int_equal(dsc__model_act_block(false, 7), 7);
    tr.log[0] = '\0';
    tr.fail_group = 2;
    expect_error(dsc_model_layers_forward(&h, "llama", 3, fwd_layer, &tr, NULL), DSC_ERR_PEER,
                 "llama: gather hook of group 2");
    assert_string_equal(tr.log, "g1 F0 r1 g2 "); // stopped at the failing hook
    assert_int_equal(dsc_model_layers_forward(NULL, "gpt2", 0, fwd_layer, &tr, NULL), DSC_OK);
}

// ---- inference scratch ----

static void test_rows_slab(void **state) {
    (void)state;
    float *slab = NULL;
    int cap = 0;
    assert_int_equal(dsc__model_rows_slab(&slab, &cap, 4, 64, "gpt2"), DSC_OK);
    assert_non_null(slab);
    assert_int_equal(cap, 4);
    float *first = slab;
    assert_int_equal(dsc__model_rows_slab(&slab, &cap, 3, 48, "gpt2"), DSC_OK); // fits: kept
    assert_ptr_equal(slab, first);
    assert_int_equal(cap, 4);
    assert_int_equal(dsc__model_rows_slab(&slab, &cap, 8, 128, "gpt2"), DSC_OK); // grown
    assert_int_equal(cap, 8);
    expect_error(dsc__model_check_kv("gpt2", 0, 8, 16), DSC_ERR_INVALID_ARG,
                 "gpt2 kv cache: 0 sequences of 8 positions is invalid");
    assert_int_equal(dsc__model_check_kv("gpt2", 1, 16, 16), DSC_OK);
    free(slab);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_normal_slices),
        cmocka_unit_test(test_init_normal_is_the_families),
        cmocka_unit_test(test_mean_loss),
        cmocka_unit_test(test_match_params),
        cmocka_unit_test(test_check_tensors),
        cmocka_unit_test(test_layer_loops),
        cmocka_unit_test(test_rows_slab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
