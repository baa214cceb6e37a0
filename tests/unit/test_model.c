// test_model.c - the model interface (dsc/model.h): the registry (specs, errors, a family a
// program registers), GPT-2 behind it giving bitwise what its own functions give (parameter
// table, initialisation, forward, backward, logits, FLOPs, module tree, inference with a cache),
// a model recognised from a table of tensors, and the checks of the wrapper calls.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // logf, expf
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free
#include <string.h> // strcmp, strstr, strncmp

#include "dsc/model.h"        // dsc_model_*
#include "model/gpt2/gpt2.h"  // dsc_gpt2_* (the family's own functions, the reference)
#include "model/gpt2/infer.h" // dsc__gpt2_kv_*, dsc__gpt2_infer
#include "model/gpt2/model.h" // dsc__gpt2_model_ops, dsc__model_gpt2_config

// ---- the registry ----

// A device table's create that a test registers without the rest of the table.
static dsc_status no_device(const void *cfg, int B, int T, void *stream, dsc_mem_pool *pool,
                            void **dev) {
    (void)cfg, (void)B, (void)T, (void)stream, (void)pool, (void)dev;
    return DSC_ERR_UNSUPPORTED;
}

static void test_specs(void **state) {
    (void)state;
    assert_true(dsc_model_num_families() >= 1);
    bool gpt2 = false;
    for (int i = 0; i < dsc_model_num_families(); i++)
        gpt2 |= !strcmp(dsc_model_family(i)->family, "gpt2");
    assert_true(gpt2);
    assert_null(dsc_model_family(-1));
    assert_null(dsc_model_family(dsc_model_num_families()));

    dsc_model *m;
    dsc_model_opts o = {.vocab_size = 256, .max_seq_len = 32};
    assert_int_equal(dsc_model_create(&m, "d2", &o), DSC_OK);
    const dsc_model_info *i = dsc_model_describe(m);
    assert_string_equal(i->family, "gpt2");
    assert_string_equal(dsc_model_spec(m), "d2");
    assert_int_equal(i->n_layer, 2), assert_int_equal(i->n_head, 2);
    assert_int_equal(i->n_embd, 128), assert_int_equal(i->vocab_size, 256);
    assert_int_equal(i->max_seq_len, 32), assert_int_equal(i->num_tensors, 4 + 2 * 12);
    assert_int_equal(i->num_groups, 4);
    assert_non_null(dsc__model_gpt2_config(m));
    dsc_model_destroy(m);

    // without opts: GPT-2's own vocabulary and context; 124M counts wpe, as Hugging Face does
    assert_int_equal(dsc_model_create(&m, "gpt2-124M", NULL), DSC_OK);
    i = dsc_model_describe(m);
    assert_int_equal(i->vocab_size, 50257), assert_int_equal(i->max_seq_len, 1024);
    assert_int_equal(i->num_params, 124439808);
    dsc_model_destroy(m);
    dsc_model_destroy(NULL);

    assert_int_equal(dsc_model_create(&m, "foo", &o), DSC_ERR_INVALID_ARG);
    assert_null(m);
    assert_non_null(strstr(dsc_last_error(), "model 'foo' is not known"));
    assert_non_null(strstr(dsc_last_error(), "gpt2-124M")); // every family's specs
    // a spec GPT-2 claims but cannot make: its own message
    assert_int_equal(dsc_model_create(&m, "d0", &o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "gpt2 model 'd0' is not known"));
    assert_int_equal(dsc_model_create(&m, "gpt2-1M", &o), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_model_create(NULL, "d2", &o), DSC_ERR_INVALID_ARG);
    // GPT-2's device passes are in its table exactly when the build has CUDA
#ifdef DSC_WITH_CUDA
    assert_non_null(dsc__gpt2_model_ops.device);
#else
    assert_null(dsc__gpt2_model_ops.device);
#endif
    assert_int_equal(dsc_model_create(&m, "d2", &o), DSC_OK);
    assert_int_equal(dsc_model_has_device(m), dsc__gpt2_model_ops.device != NULL);
    if (!dsc_model_has_device(m)) { // a host-only family asked for device passes: named refusal
        dsc_model_device *d = NULL;
        assert_int_equal(dsc_model_device_create(&d, m, 1, 8, NULL, NULL), DSC_ERR_UNSUPPORTED);
        assert_null(d);
        assert_non_null(strstr(dsc_last_error(), "model d2 (family gpt2) has no GPU passes"));
    }
    dsc_model_destroy(m);
    // a family with a device table must fill every slot of it: the first one missing is named
    static struct dsc_model_device_ops half; // only create
    half.create = no_device;
    struct dsc_model_ops odd = dsc__gpt2_model_ops;
    odd.family = "gpt2-half-device";
    odd.device = &half;
    assert_int_equal(dsc_model_register(&odd), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "has no device->destroy"));
}

// ---- the GPU decoder's slots ----
//
// A family that registers a device table with a decoder (every slot a recorder, so that the
// wrappers' dispatch shows without a GPU): "fakedec" is a d2 GPT-2 shape behind it.

static int calls[8]; // create, destroy, kv_bytes, prefill, step, argmax, logits
static const void *seen_cfg;

static dsc_status fk_create(const void *cfg, const dsc_model_decode_opts *o, void **dec) {
    calls[0]++, seen_cfg = cfg;
    *dec = (void *)&calls;
    return o->batch == 3 ? DSC_OK : DSC_ERR_INTERNAL;
}
static void fk_destroy(void *dec) { calls[1] += dec == (void *)&calls; }
static size_t fk_kv_bytes(const void *cfg, int batch, int max_len) {
    calls[2]++;
    return cfg == seen_cfg ? (size_t)batch * (size_t)max_len : 0;
}
static dsc_status fk_prefill(void *dec, const uint16_t *const *params,
                             const int32_t *const *tokens, const int *lens, int n) {
    (void)dec, (void)params, (void)tokens, (void)lens;
    calls[3] += n;
    return DSC_OK;
}
static dsc_status fk_step(void *dec, const uint16_t *const *params, const int32_t *tokens,
                          const int32_t *pos, int n) {
    (void)dec, (void)params, (void)tokens, (void)pos;
    calls[4] += n;
    return DSC_OK;
}
static dsc_status fk_argmax(void *dec, int32_t *tokens) {
    (void)dec;
    tokens[0] = 42, calls[5]++;
    return DSC_OK;
}
static dsc_status fk_logits(void *dec, float *logits) {
    (void)dec;
    logits[0] = 0.5f, calls[6]++;
    return DSC_OK;
}

// The device passes' slots, never called here.
static void fk_set(void *dev, bool on) { (void)dev, (void)on; }
static void fk_hook(void *dev, dsc_model_grad_hook fn, void *user) {
    (void)dev, (void)fn, (void)user;
}
static void fk_lhook(void *dev, dsc_model_layer_hook fn, void *user) {
    (void)dev, (void)fn, (void)user;
}
static void fk_dev_destroy(void *dev) { (void)dev; }
static dsc_status fk_fwd(void *dev, const uint16_t *const *p, const int32_t *in,
                         const int32_t *tg, int B, int T, float *loss) {
    (void)dev, (void)p, (void)in, (void)tg, (void)B, (void)T, (void)loss;
    return DSC_ERR_UNSUPPORTED;
}
static dsc_status fk_bwd(void *dev, const uint16_t *const *p, float *const *g, float s) {
    (void)dev, (void)p, (void)g, (void)s;
    return DSC_ERR_UNSUPPORTED;
}
static dsc_status fk_train(void *dev, const uint16_t *const *p, float *const *g,
                           const int32_t *in, const int32_t *tg, int B, int T, float s,
                           float *loss) {
    (void)dev, (void)p, (void)g, (void)in, (void)tg, (void)B, (void)T, (void)s, (void)loss;
    return DSC_ERR_UNSUPPORTED;
}
static dsc_status fk_read(void *dev, float *loss) {
    (void)dev, (void)loss;
    return DSC_ERR_UNSUPPORTED;
}
static dsc_status fk_enq(void *dev, const float **loss) {
    (void)dev, (void)loss;
    return DSC_ERR_UNSUPPORTED;
}

static bool fk_claims(const char *spec) { return !strcmp(spec, "fakedec"); }
static dsc_status fk_parse(const char *spec, const dsc_model_opts *o, void **cfg) {
    (void)spec;
    return dsc__gpt2_model_ops.config_parse("d2", o, cfg);
}

static void test_decode_slots(void **state) {
    (void)state;
    // GPT-2's decoder is in its table exactly when the build has CUDA; without one, a named
    // refusal
    dsc_model *m = NULL;
    dsc_model_opts o = {.vocab_size = 256, .max_seq_len = 32};
    assert_int_equal(dsc_model_create(&m, "d2", &o), DSC_OK);
    bool has = dsc__gpt2_model_ops.device && dsc__gpt2_model_ops.device->decode;
#ifdef DSC_WITH_CUDA
    assert_true(has);
#endif
    assert_int_equal(dsc_model_has_decode(m), has);
    dsc_model_decode_opts dopt = {.batch = 3, .max_len = 16};
    dsc_model_decode *d = NULL;
    if (!has) {
        assert_int_equal(dsc_model_decode_create(&d, m, &dopt), DSC_ERR_UNSUPPORTED);
        assert_null(d);
        assert_non_null(strstr(dsc_last_error(), "model d2 (family gpt2) has no GPU decoder"));
        assert_non_null(strstr(dsc_last_error(), "--device cpu"));
        assert_int_equal(dsc_model_decode_kv_bytes(m, 3, 16), 0);
    }
    dsc_model_destroy(m);
    dsc_model_decode_destroy(NULL);
    assert_int_equal(dsc_model_decode_graph_replays(NULL), 0);

    // a decoder table must have every required slot: the first one missing is named
    static struct dsc_model_device_ops dev = {
        .create = no_device, .destroy = fk_dev_destroy, .set_fp16 = fk_set,
        .set_grads_fresh = fk_set, .set_grad_hook = fk_hook, .set_layer_hook = fk_lhook,
        .forward = fk_fwd, .backward = fk_bwd, .train_step = fk_train, .read_loss = fk_read,
        .loss_enqueue = fk_enq};
    static struct dsc_model_decode_ops dec = {.create = fk_create, .destroy = fk_destroy};
    static struct dsc_model_ops fam;
    fam = dsc__gpt2_model_ops;
    fam.family = "fake-decoder", fam.claims = fk_claims, fam.config_parse = fk_parse;
    fam.device = &dev;
    dev.decode = &dec;
    assert_int_equal(dsc_model_register(&fam), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "has no device->decode->kv_bytes"));
    dec.kv_bytes = fk_kv_bytes, dec.prefill = fk_prefill, dec.step = fk_step;
    dec.argmax = fk_argmax, dec.logits = fk_logits; // graph_replays stays NULL: optional
    assert_int_equal(dsc_model_register(&fam), DSC_OK);

    // the wrappers reach the family's slots with its configuration
    assert_int_equal(dsc_model_create(&m, "fakedec", &o), DSC_OK);
    assert_true(dsc_model_has_decode(m));
    dopt.max_len = 33; // past the context: refused before the family sees it
    assert_int_equal(dsc_model_decode_create(&d, m, &dopt), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "1 <= positions <= 32"));
    assert_int_equal(calls[0], 0);
    dopt.max_len = 16;
    assert_int_equal(dsc_model_decode_create(&d, m, &dopt), DSC_OK);
    assert_int_equal(calls[0], 1);
    assert_int_equal(dsc_model_decode_kv_bytes(m, 3, 16), 48);
    const int32_t tok[2] = {1, 2}, pos[2] = {0, 0}, *rows[1] = {tok};
    int lens[1] = {2};
    int32_t chosen = 0;
    float logit = 0;
    assert_int_equal(dsc_model_decode_prefill(d, NULL, rows, lens, 1), DSC_OK);
    assert_int_equal(dsc_model_decode_step(d, NULL, tok, pos, 2), DSC_OK);
    assert_int_equal(dsc_model_decode_argmax(d, &chosen), DSC_OK);
    assert_int_equal(dsc_model_decode_logits(d, &logit), DSC_OK);
    assert_int_equal(calls[3], 1), assert_int_equal(calls[4], 2);
    assert_int_equal(chosen, 42), assert_true(logit == 0.5f);
    assert_int_equal(dsc_model_decode_graph_replays(d), 0);
    dsc_model_decode_destroy(d);
    assert_int_equal(calls[1], 1);
    dopt.batch = 2; // the family's own failure comes back as it is, nothing left behind
    assert_int_equal(dsc_model_decode_create(&d, m, &dopt), DSC_ERR_INTERNAL);
    assert_null(d);
    dsc_model_destroy(m);
}

// ---- GPT-2 through the table == GPT-2's own functions, bit for bit ----

static const dsc_gpt2_config cfg = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 97, .max_seq_len = 24};

typedef struct tensors {
    int n;
    float **t;
} tensors;

static tensors alloc_like(const dsc_model *m) {
    tensors x = {.n = dsc_model_describe(m)->num_tensors};
    x.t = calloc((size_t)x.n, sizeof *x.t);
    for (int i = 0; i < x.n; i++)
        x.t[i] = calloc((size_t)dsc_model_param_get(m, i)->numel, sizeof(float));
    return x;
}

static void free_tensors(tensors *x) {
    for (int i = 0; i < x->n; i++)
        free(x->t[i]);
    free(x->t);
}

static void assert_tensors_equal(const dsc_model *m, const tensors *a, const tensors *b) {
    for (int i = 0; i < a->n; i++)
        assert_memory_equal(a->t[i], b->t[i], (size_t)dsc_model_param_get(m, i)->numel * 4);
}

static void test_table_and_init(void **state) {
    (void)state;
    dsc_model *m;
    assert_int_equal(dsc__model_gpt2_create(&m, &cfg), DSC_OK);
    const dsc_model_info *mi = dsc_model_describe(m);
    assert_int_equal(mi->num_tensors, dsc_gpt2_num_tensors(&cfg));
    assert_int_equal(mi->num_params, dsc_gpt2_num_params(&cfg));
    dsc_param_desc *pd = calloc((size_t)mi->num_tensors, sizeof *pd);
    dsc_model_param_descs(m, pd);
    for (int i = 0; i < mi->num_tensors; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        const dsc_model_param *p = dsc_model_param_get(m, i);
        assert_string_equal(p->name, ti.name);
        assert_int_equal(p->ndim, ti.ndim), assert_int_equal(p->group, ti.group);
        assert_int_equal(p->numel, ti.numel);
        assert_int_equal(p->shape[0], ti.shape[0]), assert_int_equal(p->shape[1], ti.shape[1]);
        assert_ptr_equal(pd[i].name, p->name); // borrowed from the model
        assert_int_equal(pd[i].group, ti.group), assert_int_equal(pd[i].shape[0], ti.shape[0]);
    }
    assert_null(dsc_model_param_get(m, mi->num_tensors));
    free(pd);

    tensors a = alloc_like(m), b = alloc_like(m);
    dsc_model_init_weights(m, a.t, 42);
    dsc_gpt2_init_weights(&cfg, b.t, 42);
    assert_tensors_equal(m, &a, &b);
    float part[5];
    dsc_model_init_tensor(m, 2 + 2, part, 3, 5, 42); // a slice alone: the same values
    assert_memory_equal(part, a.t[4] + 3, sizeof part);
    free_tensors(&a), free_tensors(&b);

    for (int T = 1; T <= cfg.max_seq_len; T += 7)
        assert_true(dsc_model_flops_per_token(m, T) == dsc_gpt2_flops_per_token(&cfg, T));
    assert_int_equal(dsc_model_timing_slots(m), dsc_gpt2_timing_slots(&cfg));
    int n = dsc_model_modules(m, 3, 16, NULL);
    assert_int_equal(n, dsc_gpt2_modules(&cfg, 3, 16, NULL));
    dsc_model_module *x = calloc((size_t)n, sizeof *x), *y = calloc((size_t)n, sizeof *y);
    dsc_model_modules(m, 3, 16, x);
    dsc_gpt2_modules(&cfg, 3, 16, y);
    assert_memory_equal(x, y, (size_t)n * sizeof *x);
    free(x), free(y);
    dsc_model_destroy(m);
}

typedef struct hook_log {
    char seq[256];
    int at;
} hook_log;

static dsc_status log_hook(hook_log *l, char kind, int g) {
    l->at += snprintf(l->seq + l->at, sizeof l->seq - (size_t)l->at, "%c%d", kind, g);
    return DSC_OK;
}
static dsc_status h_gather(void *u, int g) { return log_hook(u, 'g', g); }
static dsc_status h_release(void *u, int g) { return log_hook(u, 'r', g); }
static dsc_status h_ready(void *u, int g) { return log_hook(u, 'd', g); }

static void test_passes_equal_family(void **state) {
    (void)state;
    enum { B = 2, T = 12 };
    dsc_model *m;
    assert_int_equal(dsc__model_gpt2_create(&m, &cfg), DSC_OK);
    int32_t in[B * T], tg[B * T];
    for (int k = 0; k < B * T; k++)
        in[k] = (k * 13 + 5) % cfg.vocab_size, tg[k] = (k * 7 + 1) % cfg.vocab_size;
    tensors p = alloc_like(m), ga = alloc_like(m), gb = alloc_like(m);
    dsc_model_init_weights(m, p.t, 3);

    // before dsc_model_reserve there are no activations
    assert_int_equal(dsc_model_forward(m, p.t, in, tg, B, T, NULL, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "dsc_model_reserve"));
    assert_null(dsc_model_logits(m));
    assert_int_equal(dsc_model_reserve(m, B, T, NULL), DSC_OK);
    assert_int_equal(dsc_model_reserve(m, B, T, NULL), DSC_ERR_INVALID_ARG);

    hook_log la = {0}, lb = {0};
    dsc_model_hooks ha = {&la, h_gather, h_release, h_ready};
    dsc_model_hooks hb = {&lb, h_gather, h_release, h_ready};
    float loss_a, loss_b;
    double times[64] = {0};
    dsc_model_set_timing(m, times);
    assert_int_equal(dsc_model_forward(m, p.t, in, tg, B, T, &ha, &loss_a), DSC_OK);
    dsc_model_set_timing(m, NULL);
    double timed = 0;
    for (int s = 0; s < dsc_model_timing_slots(m); s++)
        timed += times[s];
    assert_true(timed > 0);
    assert_int_equal(dsc_model_backward(m, p.t, ga.t, 2.0f, &ha), DSC_OK);

    dsc_gpt2 *g;
    assert_int_equal(dsc_gpt2_create(&g, &cfg, B, T), DSC_OK);
    assert_int_equal(dsc_gpt2_forward(g, p.t, in, tg, B, T, &hb, &loss_b), DSC_OK);
    assert_int_equal(dsc_gpt2_backward(g, p.t, gb.t, 2.0f, &hb), DSC_OK);
    assert_memory_equal(&loss_a, &loss_b, sizeof loss_a);
    assert_tensors_equal(m, &ga, &gb);
    assert_string_equal(la.seq, lb.seq); // the hooks in the family's order

    // logits only
    assert_int_equal(dsc_model_forward(m, p.t, in, NULL, B, T, NULL, NULL), DSC_OK);
    assert_int_equal(dsc_gpt2_forward(g, p.t, in, NULL, B, T, NULL, NULL), DSC_OK);
    assert_memory_equal(dsc_model_logits(m), dsc_gpt2_logits(g),
                        (size_t)B * T * cfg.vocab_size * sizeof(float));
    assert_int_equal(dsc_model_backward(m, p.t, ga.t, 1.0f, NULL), DSC_ERR_INVALID_ARG);
    dsc_gpt2_destroy(g);
    free_tensors(&p), free_tensors(&ga), free_tensors(&gb);
    dsc_model_destroy(m);
}

static void test_infer_equals_family(void **state) {
    (void)state;
    dsc_model *m, *other;
    assert_int_equal(dsc__model_gpt2_create(&m, &cfg), DSC_OK);
    dsc_model_opts o = {.vocab_size = 97, .max_seq_len = 24};
    assert_int_equal(dsc_model_create(&other, "d1", &o), DSC_OK);
    tensors p = alloc_like(m);
    dsc_model_init_weights(m, p.t, 11);
    assert_int_equal(dsc_model_kv_bytes(m, 1, 3, 16), dsc__gpt2_kv_bytes(&cfg, 1, 3, 16));
    assert_int_equal(dsc_model_tp_check(m, 2), DSC_OK);
    assert_int_equal(dsc_model_tp_check(m, 3), DSC_ERR_INVALID_ARG);
    assert_int_equal(dsc_model_tp_numel(m, 4, 2), dsc__gpt2_tp_numel(&cfg, 4, 2));

    dsc_model_kv *kv;
    dsc_gpt2_kv *ref;
    assert_int_equal(dsc_model_kv_create(&kv, m, 1, 3, 16), DSC_OK);
    assert_int_equal(dsc__gpt2_kv_create(&ref, &cfg, 1, 3, 16), DSC_OK);
    assert_true(dsc_model_kv_fits(kv, m, 1, 2, 16));
    assert_false(dsc_model_kv_fits(kv, m, 1, 4, 16));
    assert_false(dsc_model_kv_fits(kv, other, 1, 1, 8)); // another shape
    assert_false(dsc_model_kv_fits(NULL, m, 1, 1, 1));

    // a prefill of two prompts, then a decode step of one row each
    int32_t seq[5] = {0, 0, 0, 1, 1}, pos[5] = {0, 1, 2, 0, 1}, tok[5] = {3, 9, 27, 81, 50};
    int32_t out[2] = {2, 4};
    dsc_model_rows r = {5, seq, pos, tok, 2, out};
    float la[2 * 97], lb[2 * 97];
    assert_int_equal(dsc_model_infer(m, kv, p.t, NULL, &r, NULL, la), DSC_OK);
    dsc_gpt2_tp none = {0, 1, NULL};
    assert_int_equal(dsc__gpt2_infer(ref, p.t, &none, &r, NULL, lb), DSC_OK);
    assert_memory_equal(la, lb, sizeof la);
    int32_t s2[2] = {0, 1}, p2[2] = {3, 2}, t2[2] = {7, 8}, o2[2] = {0, 1};
    dsc_model_rows step = {2, s2, p2, t2, 2, o2};
    assert_int_equal(dsc_model_infer(m, kv, p.t, NULL, &step, NULL, la), DSC_OK);
    assert_int_equal(dsc__gpt2_infer(ref, p.t, &none, &step, NULL, lb), DSC_OK);
    assert_memory_equal(la, lb, sizeof la);
    assert_int_equal(dsc_model_infer(m, NULL, p.t, NULL, &step, NULL, la), DSC_ERR_INVALID_ARG);
    dsc_model_kv_destroy(kv);
    dsc_model_kv_destroy(NULL);
    dsc__gpt2_kv_destroy(ref);
    free_tensors(&p);
    dsc_model_destroy(m);
    dsc_model_destroy(other);
}

// ---- a model from a table of tensors ----

static void test_from_params(void **state) {
    (void)state;
    dsc_model *want;
    dsc_model_opts o = {.vocab_size = 256, .max_seq_len = 40};
    assert_int_equal(dsc_model_create(&want, "d2", &o), DSC_OK);
    int n = dsc_model_describe(want)->num_tensors;
    dsc_param_desc *pd = calloc((size_t)n, sizeof *pd), *rev = calloc((size_t)n, sizeof *rev);
    char (*prefixed)[DSC_PARAM_NAME_MAX + 16] = calloc((size_t)n, sizeof *prefixed);
    int *order = calloc((size_t)n, sizeof *order);
    dsc_model_param_descs(want, pd);
    for (int i = 0; i < n; i++) { // reversed, and some names with the "transformer." prefix
        rev[n - 1 - i] = pd[i];
        if (i % 3) continue;
        snprintf(prefixed[i], sizeof prefixed[i], "transformer.%s", pd[i].name);
        rev[n - 1 - i].name = prefixed[i];
    }
    dsc_model *got;
    assert_int_equal(dsc_model_create_from_params(&got, rev, n, NULL, "test", order), DSC_OK);
    const dsc_model_info *a = dsc_model_describe(want), *b = dsc_model_describe(got);
    assert_int_equal(a->n_layer, b->n_layer), assert_int_equal(a->n_head, b->n_head);
    assert_int_equal(a->n_embd, b->n_embd), assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->max_seq_len, b->max_seq_len);
    for (int k = 0; k < n; k++)
        assert_int_equal(order[k], n - 1 - k);
    dsc_model_destroy(got);

    dsc_model_opts heads = {.n_head = 4}; // the heads are not in the tensors: the option gives them
    assert_int_equal(dsc_model_create_from_params(&got, pd, n, &heads, "test", order), DSC_OK);
    assert_int_equal(dsc_model_describe(got)->n_head, 4);
    dsc_model_destroy(got);

    // a missing layer tensor, a wrong shape, no embeddings at all
    assert_int_equal(dsc_model_create_from_params(&got, pd, n - 3, NULL, "x.safetensors", order),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "x.safetensors: tensor "));
    pd[5].shape[0]++;
    assert_int_equal(dsc_model_create_from_params(&got, pd, n, NULL, "x", order),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), pd[5].name));
    assert_int_equal(dsc_model_create_from_params(&got, pd + 2, n - 2, NULL, "y", order),
                     DSC_ERR_INVALID_ARG);
    assert_null(got);
    assert_non_null(strstr(dsc_last_error(), "y: no GPT-2 embeddings"));
    free(pd), free(rev), free(prefixed), free(order);
    dsc_model_destroy(want);
}

// ---- a family a program registers: a bigram model, one (V, V) tensor of logits ----

typedef struct bigram {
    int V, B, T;
    float *loss_rows; // unused scratch, to show host state
    int32_t *in, *tg;
    float *logits; // (B, T, V)
} bigram;

static bool bg_claims(const char *spec) { return !strncmp(spec, "bigram-", 7); }
static dsc_status bg_parse(const char *spec, const dsc_model_opts *o, void **cfg) {
    int *v = malloc(sizeof *v);
    *v = o->vocab_size > 0 ? o->vocab_size : 8;
    *cfg = v;
    return DSC_OK;
}
static dsc_status bg_from(const dsc_param_desc *t, int count, const dsc_model_opts *o,
                          const char *what, void **cfg, int *order) {
    return DSC_ERR_UNSUPPORTED;
}
static void bg_free(void *cfg) { free(cfg); }
static void bg_describe(const void *cfg, dsc_model_info *out) {
    int V = *(const int *)cfg;
    *out = (dsc_model_info){.family = "bigram", .vocab_size = V, .max_seq_len = 1 << 20,
                            .num_tensors = 1, .num_groups = 1, .num_params = (int64_t)V * V};
}
static void bg_param(const void *cfg, int i, dsc_model_param *out) {
    int V = *(const int *)cfg;
    *out = (dsc_model_param){.name = "logits.weight", .ndim = 2, .shape = {V, V},
                             .numel = (int64_t)V * V, .group = 0};
}
static void bg_init(const void *cfg, int i, float *dst, int64_t begin, int64_t count,
                    uint64_t seed) {
    for (int64_t k = 0; k < count; k++)
        dst[k] = 0;
}
static double bg_flops(const void *cfg, int T) { return 0; }
static int bg_modules(const void *cfg, int B, int T, dsc_model_module *out) {
    if (out) *out = (dsc_model_module){.name = "model", .type = "Bigram", .slot = 0};
    return 1;
}
static int bg_slots(const void *cfg) { return 1; }
static dsc_status bg_create(const void *cfg, int B, int T, dsc_mem_pool *pool, void **state) {
    bigram *b = calloc(1, sizeof *b);
    b->V = *(const int *)cfg, b->B = B, b->T = T;
    b->in = calloc((size_t)B * T, sizeof *b->in), b->tg = calloc((size_t)B * T, sizeof *b->tg);
    b->logits = calloc((size_t)B * T * b->V, sizeof *b->logits);
    *state = b;
    return DSC_OK;
}
static void bg_destroy(void *state) {
    bigram *b = state;
    free(b->in), free(b->tg), free(b->logits), free(b);
}
static dsc_status bg_forward(void *state, float *const *params, const int32_t *in,
                             const int32_t *pos, const int32_t *tg, int B, int T,
                             const dsc_model_hooks *h, float *loss) {
    (void)pos; // a bigram has no positions
    bigram *b = state;
    double sum = 0;
    for (int r = 0; r < B * T; r++) {
        const float *row = params[0] + (size_t)in[r] * b->V;
        memcpy(b->logits + (size_t)r * b->V, row, sizeof(float) * (size_t)b->V);
        double z = 0;
        for (int v = 0; v < b->V; v++)
            z += exp(row[v]);
        if (tg) sum += log(z) - row[tg[r]];
        b->in[r] = in[r], b->tg[r] = tg ? tg[r] : 0;
    }
    b->B = B, b->T = T;
    if (loss) *loss = (float)(sum / (B * T));
    return DSC_OK;
}
static dsc_status bg_backward(void *state, float *const *params, float *const *grads, float s,
                              const dsc_model_hooks *h) {
    bigram *b = state;
    int n = b->B * b->T;
    for (int r = 0; r < n; r++) {
        const float *row = params[0] + (size_t)b->in[r] * b->V;
        float *g = grads[0] + (size_t)b->in[r] * b->V;
        double z = 0;
        for (int v = 0; v < b->V; v++)
            z += exp(row[v]);
        for (int v = 0; v < b->V; v++)
            g[v] += s * (float)((exp(row[v]) / z - (v == b->tg[r])) / n);
    }
    return h && h->grads_ready ? h->grads_ready(h->user, 0) : DSC_OK;
}
static const float *bg_logits(void *state) { return ((bigram *)state)->logits; }
static void bg_timing(void *state, double *times) {}

static struct dsc_model_ops bigram_ops = {
    .family = "bigram", .specs = "bigram-V", .claims = bg_claims, .config_parse = bg_parse,
    .config_from_params = bg_from, .config_free = bg_free, .describe = bg_describe,
    .param = bg_param, .init = bg_init, .flops_per_token = bg_flops, .modules = bg_modules,
    .timing_slots = bg_slots, .host_create = bg_create, .host_destroy = bg_destroy,
    .forward = bg_forward, .backward = bg_backward, .logits = bg_logits, .set_timing = bg_timing,
};

static void test_register_family(void **state) {
    (void)state;
    struct dsc_model_ops broken = bigram_ops;
    broken.backward = NULL;
    assert_int_equal(dsc_model_register(&broken), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "bigram has no backward"));
    struct dsc_model_ops clash = bigram_ops;
    clash.family = "gpt2";
    assert_int_equal(dsc_model_register(&clash), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "named gpt2 is registered"));

    int before = dsc_model_num_families();
    assert_int_equal(dsc_model_register(&bigram_ops), DSC_OK);
    assert_int_equal(dsc_model_num_families(), before + 1);
    assert_ptr_equal(dsc_model_family(0), &bigram_ops); // registered families come first
    assert_int_equal(dsc_model_register(&bigram_ops), DSC_ERR_INVALID_ARG);

    dsc_model *m;
    dsc_model_opts o = {.vocab_size = 5};
    assert_int_equal(dsc_model_create(&m, "nothing", &o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "bigram-V (bigram)"));
    assert_int_equal(dsc_model_create(&m, "bigram-5", &o), DSC_OK);
    assert_string_equal(dsc_model_describe(m)->family, "bigram");
    assert_null(dsc__model_gpt2_config(m));
    float w[25], g[25] = {0}, *p = w, *gp = g, loss;
    dsc_model_init_weights(m, &p, 1);
    assert_int_equal(dsc_model_reserve(m, 1, 4, NULL), DSC_OK);
    int32_t in[4] = {0, 1, 2, 3}, tg[4] = {1, 2, 3, 4};
    assert_int_equal(dsc_model_forward(m, &p, in, tg, 1, 4, NULL, &loss), DSC_OK);
    assert_true(fabsf(loss - logf(5.0f)) < 1e-6f); // uniform over 5 tokens
    assert_int_equal(dsc_model_backward(m, &p, &gp, 1.0f, NULL), DSC_OK);
    assert_true(g[0 * 5 + 1] < 0 && g[0 * 5 + 0] > 0);
    // no inference in this family: a clear error, not a crash
    dsc_model_kv *kv;
    assert_int_equal(dsc_model_kv_create(&kv, m, 1, 1, 4), DSC_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsc_last_error(), "bigram has no inference"));
    assert_int_equal(dsc_model_tp_check(m, 2), DSC_ERR_UNSUPPORTED);
    dsc_model_destroy(m);
    // GPT-2's specs still go to GPT-2
    assert_int_equal(dsc_model_create(&m, "d1", &o), DSC_OK);
    assert_string_equal(dsc_model_describe(m)->family, "gpt2");
    dsc_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_specs),          cmocka_unit_test(test_table_and_init),
        cmocka_unit_test(test_passes_equal_family), cmocka_unit_test(test_infer_equals_family),
        cmocka_unit_test(test_from_params),    cmocka_unit_test(test_register_family),
        cmocka_unit_test(test_decode_slots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
