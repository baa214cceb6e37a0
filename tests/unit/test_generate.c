// Generation: sampling rules, the key/value cache against the training forward (token for
// token), ragged batches, and dsc_generate on a live engine (ZeRO stages, the max_out_tokens
// bound in the memory statistics, training continuing bit for bit after a generation).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // log, fabsf
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free
#include <string.h> // memcpy, strstr

#include "dsc/engine.h"       // dsc_engine_*
#include "dsc/generate.h"     // dsc_generate
#include "dsc/memory.h"       // dsc_memory_stats
#include "infer/generate.h"   // dsc_generate_run
#include "infer/sample.h"     // dsc__sample
#include "model/gpt2/gpt2.h"  // dsc_gpt2_*
#include "model/gpt2/model.h" // dsc__model_gpt2_create
#ifdef _OPENMP
#include <omp.h> // omp_set_num_threads
#endif

// ---- sampling ----

static void test_sample_rules(void **state) {
    (void)state;
    const float logits[4] = {(float)log(0.5), (float)log(0.3), (float)log(0.2), -1e30f};
    float scratch[8];
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0;
    uint64_t rng = dsc__sample_stream(1, 0);
    assert_int_equal(dsc__sample(logits, 4, &o, &rng, scratch, NULL), 0);
    const float tie[3] = {1.0f, 3.0f, 3.0f};
    assert_int_equal(dsc__sample(tie, 3, &o, &rng, scratch, NULL), 1); // lower id wins a tie
    o.temperature = 1.0f;
    o.top_k = 0;
    int count[4] = {0};
    for (int i = 0; i < 20000; i++)
        count[dsc__sample(logits, 4, &o, &rng, scratch, NULL)]++;
    assert_true(fabs(count[0] / 20000.0 - 0.5) < 0.02);
    assert_true(fabs(count[1] / 20000.0 - 0.3) < 0.02);
    assert_true(fabs(count[2] / 20000.0 - 0.2) < 0.02);
    assert_int_equal(count[3], 0);
    o.top_k = 2; // only the two most likely
    memset(count, 0, sizeof count);
    for (int i = 0; i < 4000; i++)
        count[dsc__sample(logits, 4, &o, &rng, scratch, NULL)]++;
    assert_int_equal(count[2], 0);
    assert_true(fabs(count[0] / 4000.0 - 0.625) < 0.03);
    o.top_k = 0;
    o.top_p = 0.7f; // 0.5 + 0.3 reach 0.7: token 2 is out
    memset(count, 0, sizeof count);
    for (int i = 0; i < 4000; i++)
        count[dsc__sample(logits, 4, &o, &rng, scratch, NULL)]++;
    assert_int_equal(count[2], 0);
    assert_true(count[1] > 1000);
    o.top_p = 0.4f; // the top token alone reaches it
    for (int i = 0; i < 100; i++)
        assert_int_equal(dsc__sample(logits, 4, &o, &rng, scratch, NULL), 0);
    // the same stream gives the same draws
    uint64_t a = dsc__sample_stream(7, 3), b = dsc__sample_stream(7, 3),
             c = dsc__sample_stream(7, 4);
    o.top_p = 1.0f;
    int same = 0, differ = 0;
    for (int i = 0; i < 200; i++) {
        int x = dsc__sample(logits, 4, &o, &a, scratch, NULL);
        same += x == dsc__sample(logits, 4, &o, &b, scratch, NULL);
        differ += x != dsc__sample(logits, 4, &o, &c, scratch, NULL);
    }
    assert_int_equal(same, 200);
    assert_true(differ > 20);
}

// ---- a small random model ----

static const dsc_gpt2_config cfg = {
    .n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 97, .max_seq_len = 48};

typedef struct model {
    float **p;
    int nt;
} model;

// The model handle of cfg (made once; the process ends with it).
static const dsc_model *the_model(void) {
    static dsc_model *m;
    if (!m) assert_int_equal(dsc__model_gpt2_create(&m, &cfg), DSC_OK);
    return m;
}

// GPT-2's initialisation with the weights scaled up, so that the logits spread out and greedy
// choices are not near-ties that rounding could flip.
static model make_model(uint64_t seed) {
    model m = {.nt = dsc_gpt2_num_tensors(&cfg)};
    m.p = calloc((size_t)m.nt, sizeof *m.p);
    for (int i = 0; i < m.nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        m.p[i] = calloc((size_t)ti.numel, sizeof(float));
    }
    dsc_gpt2_init_weights(&cfg, m.p, seed);
    for (int i = 0; i < m.nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        if (ti.ndim == 2)
            for (int64_t k = 0; k < ti.numel; k++)
                m.p[i][k] *= 5.0f;
    }
    return m;
}

static void free_model(model *m) {
    for (int i = 0; i < m->nt; i++)
        free(m->p[i]);
    free(m->p);
}

// Greedy continuation by the training forward over the whole sequence for every token: the
// reference without any cache. Checks the final logits against the cached path too.
static void reference(const model *m, const int32_t *prompt, int len, int n_new, int32_t *out) {
    dsc_gpt2 *g;
    assert_int_equal(dsc_gpt2_create(&g, &cfg, 1, cfg.max_seq_len), DSC_OK);
    int32_t seq[64];
    memcpy(seq, prompt, sizeof(int32_t) * len);
    for (int k = 0; k < n_new; k++) {
        int T = len + k;
        assert_int_equal(dsc_gpt2_forward(g, m->p, seq, NULL, 1, T, NULL, NULL), DSC_OK);
        const float *l = dsc_gpt2_logits(g) + (size_t)(T - 1) * cfg.vocab_size;
        int best = 0;
        for (int v = 1; v < cfg.vocab_size; v++)
            best = l[v] > l[best] ? v : best;
        seq[T] = out[k] = best;
    }
    dsc_gpt2_destroy(g);
}

static dsc_status run(const model *m, const dsc_gen_prompt *p, int n, const dsc_gen_opts *o,
                      dsc_gen_output *out, dsc_gen_stats *st) {
    dsc_gen_model gm = {.model = the_model(), .params = m->p, .tp = {0, 1, NULL}};
    dsc_model_kv *kv = NULL;
    dsc_status rc = dsc_generate_run(&gm, &kv, p, n, o, out, st);
    dsc_model_kv_destroy(kv);
    return rc;
}

static void test_cache_equals_forward(void **state) {
    (void)state;
    model m = make_model(11);
    const int32_t prompt[5] = {3, 14, 15, 92, 65};
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0;
    o.max_new_tokens = 30;
    dsc_gen_prompt p = {prompt, 5};
    dsc_gen_output cached, nocache;
    assert_int_equal(run(&m, &p, 1, &o, &cached, NULL), DSC_OK);
    o.no_cache = true;
    assert_int_equal(run(&m, &p, 1, &o, &nocache, NULL), DSC_OK);
    int32_t want[30];
    reference(&m, prompt, 5, 30, want);
    assert_int_equal(cached.len, 30);
    assert_int_equal(cached.finish, DSC_GEN_LENGTH);
    assert_memory_equal(cached.tokens, want, sizeof want);
    assert_memory_equal(nocache.tokens, want, sizeof want);
    int distinct = 0; // a degenerate model repeating one token would prove little
    for (int k = 1; k < 30; k++)
        distinct += want[k] != want[0];
    assert_true(distinct > 3);
    dsc_gen_output_free(&cached, 1);
    dsc_gen_output_free(&nocache, 1);
    free_model(&m);
}

// Prompts of different lengths in one batch give what each gives alone; the context ends a
// sequence; end token and stop function end theirs.
static bool stop_after_3(void *user, int seq, const int32_t *gen, int n) {
    (void)gen;
    return seq == *(int *)user && n == 3;
}

static void test_ragged_batch_and_stops(void **state) {
    (void)state;
    model m = make_model(5);
    int32_t a[3] = {1, 2, 3}, b[9] = {9, 8, 7, 6, 5, 4, 3, 2, 1}, c[1] = {42};
    dsc_gen_prompt p[3] = {{a, 3}, {b, 9}, {c, 1}};
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0;
    o.max_new_tokens = 12;
    dsc_gen_output all[3], one;
    assert_int_equal(run(&m, p, 3, &o, all, NULL), DSC_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(run(&m, &p[i], 1, &o, &one, NULL), DSC_OK);
        assert_int_equal(one.len, 12);
        assert_memory_equal(one.tokens, all[i].tokens, 12 * sizeof(int32_t));
        dsc_gen_output_free(&one, 1);
    }
    o.max_new_tokens = 100; // the context (48) ends sequence 0 after 45 new tokens
    o.eot = all[1].tokens[2];
    int which = 2;
    o.stop = stop_after_3;
    o.stop_user = &which;
    dsc_gen_output ends[3];
    assert_int_equal(run(&m, p, 3, &o, ends, NULL), DSC_OK);
    assert_int_equal(ends[0].finish, DSC_GEN_LENGTH);
    assert_int_equal(ends[0].len, 48 - 3);
    assert_int_equal(ends[1].finish, DSC_GEN_EOT);
    assert_true(ends[1].len <= 3);
    assert_int_equal(ends[1].tokens[ends[1].len - 1], o.eot);
    assert_int_equal(ends[2].finish, DSC_GEN_STOP);
    assert_int_equal(ends[2].len, 3);
    dsc_gen_output_free(all, 3);
    dsc_gen_output_free(ends, 3);
    free_model(&m);
}

static void test_bad_input(void **state) {
    (void)state;
    model m = make_model(5);
    int32_t bad[2] = {1, 97}, long_p[48] = {0};
    dsc_gen_opts o = dsc_gen_opts_default();
    dsc_gen_output out;
    dsc_gen_prompt p = {bad, 2};
    assert_int_equal(run(&m, &p, 1, &o, &out, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "outside the model's vocabulary"));
    p = (dsc_gen_prompt){long_p, 48};
    assert_int_equal(run(&m, &p, 1, &o, &out, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "shorten the prompt"));
    p = (dsc_gen_prompt){bad, 0};
    assert_int_equal(run(&m, &p, 1, &o, &out, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "is empty"));
    p = (dsc_gen_prompt){bad, 1};
    o.top_p = 2;
    assert_int_equal(run(&m, &p, 1, &o, &out, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "top_p"));
    free_model(&m);
}

// ---- on a live engine ----

typedef struct trainer {
    dsc_engine *eng;
    dsc_gpt2 *g;
    float **work, **grads;
    int nt;
} trainer;

static bool freeze_wte; // make_trainer_as registers wte frozen (a LoRA run's base is)

static trainer make_trainer_as(const char *json, uint64_t seed, bool no_compute_copy) {
    trainer t = {.nt = dsc_gpt2_num_tensors(&cfg)};
    dsc_param_desc *pd = calloc((size_t)t.nt, sizeof *pd);
    dsc_gpt2_tensor_info *ti = calloc((size_t)t.nt, sizeof *ti);
    for (int i = 0; i < t.nt; i++) {
        dsc_gpt2_tensor_info_get(&cfg, i, &ti[i]);
        pd[i] = (dsc_param_desc){.name = ti[i].name, .ndim = ti[i].ndim, .group = ti[i].group,
                                 .frozen = freeze_wte && i == 0};
        for (int d = 0; d < ti[i].ndim; d++)
            pd[i].shape[d] = ti[i].shape[d];
    }
    dsc_engine_opts eo = {.config_json = json, .params = pd, .nparams = t.nt, .world_size = 1,
                          .no_compute_copy = no_compute_copy};
    if (dsc_engine_create(&t.eng, &eo) != DSC_OK) fail_msg("engine: %s", dsc_last_error());
    model m = make_model(seed);
    for (int i = 0; i < t.nt; i++)
        memcpy(dsc_param_master(t.eng, i), m.p[i], (size_t)ti[i].numel * sizeof(float));
    free_model(&m);
    assert_int_equal(dsc_params_updated(t.eng), DSC_OK);
    free(pd);
    free(ti);
    t.work = calloc((size_t)t.nt, sizeof *t.work);
    t.grads = calloc((size_t)t.nt, sizeof *t.grads);
    assert_int_equal(dsc_gpt2_create(&t.g, &cfg, 2, 16), DSC_OK);
    return t;
}

static trainer make_trainer(const char *json, uint64_t seed) {
    return make_trainer_as(json, seed, false);
}

static void free_trainer(trainer *t) {
    dsc_generate_release(t->eng);
    dsc_engine_destroy(t->eng);
    dsc_gpt2_destroy(t->g);
    free(t->work);
    free(t->grads);
}

static dsc_status gather(void *u, int g) {
    trainer *t = u;
    dsc_status st = dsc_gather(t->eng, g);
    for (int i = 0; i < t->nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        if (ti.group != g) continue;
        t->work[i] = dsc_param_data(t->eng, i);
        t->grads[i] = dsc_param_grad(t->eng, i);
    }
    return st;
}
static dsc_status release(void *u, int g) { return dsc_release(((trainer *)u)->eng, g); }
static dsc_status ready(void *u, int g) { return dsc_grads_ready(((trainer *)u)->eng, g); }

static float train_step(trainer *t, int step) {
    int32_t in[32], tg[32];
    for (int k = 0; k < 32; k++)
        in[k] = (k * 7 + step * 3) % 97, tg[k] = (k * 7 + step * 3 + 1) % 97;
    dsc_gpt2_hooks h = {t, gather, release, ready};
    float loss;
    dsc_step_info si;
    assert_int_equal(dsc_gpt2_forward(t->g, t->work, in, tg, 2, 16, &h, &loss), DSC_OK);
    assert_int_equal(dsc_backward_begin(t->eng), DSC_OK);
    assert_int_equal(
        dsc_gpt2_backward(t->g, t->work, t->grads, (float)dsc_backward_scale(t->eng), &h), DSC_OK);
    assert_int_equal(dsc_step(t->eng, &si), DSC_OK);
    return loss;
}

static const char *engine_json =
    "{\"train_micro_batch_size_per_gpu\": 2, \"optimizer\": {\"type\": \"AdamW\", \"params\": "
    "{\"lr\": 1e-3}}, \"zero_optimization\": {\"stage\": %d}, \"hybrid_engine\": {\"enabled\": "
    "true, \"max_out_tokens\": %d, \"release_inference_cache\": %s}}";

static void test_engine_generate(void **state) {
    (void)state;
    const int32_t prompt[4] = {5, 6, 7, 8};
    dsc_gen_prompt p[2] = {{prompt, 4}, {prompt + 1, 3}};
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0;
    o.max_new_tokens = 10;
    o.model = the_model();
    model m = make_model(3);
    dsc_gen_output want[2];
    assert_int_equal(run(&m, p, 2, &o, want, NULL), DSC_OK);
    free_model(&m);
    for (int stage = 0; stage <= 3; stage += 3) {
        char json[512];
        snprintf(json, sizeof json, engine_json, stage, 32, "false");
        trainer t = make_trainer(json, 3);
        dsc_mem_stats before, during, after;
        assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &before), DSC_OK);
        dsc_gen_output out[2];
        dsc_gen_stats gs;
        assert_int_equal(dsc_generate(t.eng, p, 2, &o, out, &gs), DSC_OK);
        for (int i = 0; i < 2; i++)
            assert_memory_equal(out[i].tokens, want[i].tokens, 10 * 4);
        // the cache holds max_out_tokens (32) positions per sequence, whatever the prompts
        size_t bound = (size_t)cfg.n_layer * 2 * 2 * 32 * cfg.n_embd * sizeof(float);
        assert_int_equal(gs.kv_positions, 32);
        assert_int_equal(gs.kv_bytes, bound);
        assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &during), DSC_OK);
        assert_true(during.allocated - before.allocated >= bound); // kept (release false)
        assert_true(during.allocated - before.allocated < bound + 4096);
        dsc_generate_release(t.eng);
        assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &after), DSC_OK);
        assert_int_equal(after.allocated, before.allocated);
        dsc_gen_output_free(out, 2);
        free_trainer(&t);
    }
    dsc_gen_output_free(want, 2);
    // a bound the prompt does not fit in is an error naming max_out_tokens
    char json[512];
    snprintf(json, sizeof json, engine_json, 0, 4, "true");
    trainer t = make_trainer(json, 3);
    dsc_gen_output out[2];
    assert_int_equal(dsc_generate(t.eng, p, 1, &o, out, NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "max_out_tokens"));
    dsc_mem_stats s0, s1; // release_inference_cache: nothing stays behind
    assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &s0), DSC_OK);
    assert_int_equal(dsc_generate(t.eng, p + 1, 1, &o, out, NULL), DSC_OK);
    assert_int_equal(out[0].len, 1); // 3 prompt tokens + 1 reach the bound of 4
    assert_int_equal(out[0].finish, DSC_GEN_LENGTH);
    assert_int_equal(dsc_memory_stats(DSC_MEM_HOST, &s1), DSC_OK);
    assert_int_equal(s1.allocated, s0.allocated);
    dsc_gen_output_free(out, 1);
    free_trainer(&t);
}

// Greedy generation from a and from b gives the same tokens; both trainers are freed.
static void same_tokens(trainer *a, trainer *b) {
    const int32_t prompt[4] = {5, 6, 7, 8};
    dsc_gen_prompt p = {prompt, 4};
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0;
    o.max_new_tokens = 12;
    o.model = the_model();
    dsc_gen_output x, y;
    assert_int_equal(dsc_generate(a->eng, &p, 1, &o, &x, NULL), DSC_OK);
    assert_int_equal(dsc_generate(b->eng, &p, 1, &o, &y, NULL), DSC_OK);
    assert_int_equal(x.len, y.len);
    assert_memory_equal(x.tokens, y.tokens, (size_t)x.len * sizeof(int32_t));
    dsc_gen_output_free(&x, 1);
    dsc_gen_output_free(&y, 1);
    free_trainer(a);
    free_trainer(b);
}

// An engine without a host compute copy (its model trains on a GPU) generates from its master
// weights rounded as the compute copy would be: the same tokens as an engine with the copy, bf16,
// at stages 0 and 3 (where it gathers nothing).
static void test_generate_without_compute_copy(void **state) {
    (void)state;
    const char *fmt = "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, "
                      "\"zero_optimization\": {\"stage\": %d}}";
    for (int stage = 0; stage <= 3; stage += 3) {
        char json[256];
        snprintf(json, sizeof json, fmt, stage);
        trainer a = make_trainer_as(json, 5, false), b = make_trainer_as(json, 5, true);
        assert_null(dsc_param_data(b.eng, 0));
        same_tokens(&a, &b);
    }
}

// An engine with a frozen tensor (the caller's indices then differ from the engine's trainable
// table) generates the same tokens, with and without a host compute copy.
static void test_generate_with_frozen(void **state) {
    (void)state;
    const char *json = "{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": "
                       "{\"stage\": 0}}";
    for (int copy = 0; copy < 2; copy++) {
        trainer a = make_trainer_as(json, 5, copy);
        freeze_wte = true;
        trainer b = make_trainer_as(json, 5, copy);
        freeze_wte = false;
        assert_true(dsc_param_frozen(b.eng, 0));
        same_tokens(&a, &b);
    }
}

// Train, generate, train: the losses equal those of training without the generation, bit for
// bit, at ZeRO stages 0 and 3 (nothing of the training state moved through the switch).
static void test_generate_mid_training(void **state) {
    (void)state;
    for (int stage = 0; stage <= 3; stage += 3) {
        char json[512];
        snprintf(json, sizeof json, engine_json, stage, 24, "false");
        trainer a = make_trainer(json, 9), b = make_trainer(json, 9);
        const int32_t prompt[3] = {1, 2, 3};
        dsc_gen_prompt p = {prompt, 3};
        dsc_gen_opts o = dsc_gen_opts_default();
        o.model = the_model();
        o.max_new_tokens = 8;
        for (int s = 1; s <= 6; s++) {
            float la = train_step(&a, s), lb = train_step(&b, s);
            assert_memory_equal(&la, &lb, sizeof la);
            if (s % 2) continue;
            dsc_gen_output out;
            assert_int_equal(dsc_generate(a.eng, &p, 1, &o, &out, NULL), DSC_OK);
            assert_int_equal(out.len, 8);
            dsc_gen_output_free(&out, 1);
        }
        free_trainer(&a);
        free_trainer(&b);
    }
}

int main(void) {
#ifdef _OPENMP
    // Decoding runs many tiny parallel regions; on a shared, oversubscribed machine each one can
    // wait for a preempted thread. The results do not depend on the thread count (kernels.h).
    omp_set_num_threads(1);
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sample_rules),           cmocka_unit_test(test_cache_equals_forward),
        cmocka_unit_test(test_ragged_batch_and_stops), cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_generate_without_compute_copy),
        cmocka_unit_test(test_engine_generate),        cmocka_unit_test(test_generate_mid_training),
        cmocka_unit_test(test_generate_with_frozen),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
