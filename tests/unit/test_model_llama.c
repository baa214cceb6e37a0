// test_model_llama.c - the Llama family behind the model interface (dsc/model.h): its specs beside
// GPT-2's, the table giving bitwise what the family's own functions give (parameter table,
// initialisation, FLOPs, module tree, forward, backward, hooks, logits), position ids, inference
// through the grouped-query cache against a full forward's logits, a model recognised from a
// table of tensors, the config.json it writes, and dsc_generate on a live engine (ZeRO 0 and 3)
// against greedy decoding by full forwards.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>   // fabsf
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free
#include <string.h> // strcmp, strstr

#include "dsc/engine.h"        // dsc_engine_*
#include "dsc/generate.h"      // dsc_generate
#include "dsc/model.h"         // dsc_model_*
#include "model/llama/llama.h" // dsc_llama_* (the family's own functions, the reference)

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

static const char *family_of(const char *spec) {
    static char fam[16];
    dsc_model *m;
    dsc_model_opts o = {.vocab_size = 256, .max_seq_len = 32};
    if (dsc_model_create(&m, spec, &o) != DSC_OK) return "(none)";
    snprintf(fam, sizeof fam, "%s", dsc_model_describe(m)->family);
    dsc_model_destroy(m);
    return fam;
}

// ---- specs ----

static void test_specs(void **state) {
    (void)state;
    assert_string_equal(family_of("d2"), "gpt2");
    assert_string_equal(family_of("gpt2-124M"), "gpt2");
    assert_string_equal(family_of("llama-d2"), "llama");
    assert_string_equal(family_of("smollm2-135M"), "llama");
    assert_string_equal(family_of("qwen2.5-0.5B"), "llama");

    // llama-dN: the data's vocabulary and --seq-len; none given: no vocabulary, an error
    dsc_model *m;
    dsc_model_opts o = {.vocab_size = 256, .max_seq_len = 32};
    assert_int_equal(dsc_model_create(&m, "llama-d2", &o), DSC_OK);
    const dsc_model_info *i = dsc_model_describe(m);
    assert_int_equal(i->n_layer, 2), assert_int_equal(i->n_head, 2);
    assert_int_equal(i->n_embd, 128), assert_int_equal(i->vocab_size, 256);
    assert_int_equal(i->max_seq_len, 32), assert_int_equal(i->num_groups, 4);
    dsc_model_destroy(m);
    assert_int_equal(dsc_model_create(&m, "llama-d2", NULL), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "vocab_size"));
    // a published shape keeps its vocabulary and its context, or a longer --seq-len
    assert_int_equal(dsc_model_create(&m, "smollm2-135M", &o), DSC_OK);
    assert_int_equal(dsc_model_describe(m)->vocab_size, 49152);
    assert_int_equal(dsc_model_describe(m)->max_seq_len, 8192);
    dsc_model_destroy(m);
    o.max_seq_len = 10000;
    assert_int_equal(dsc_model_create(&m, "smollm2-135M", &o), DSC_OK);
    assert_int_equal(dsc_model_describe(m)->max_seq_len, 10000);
    dsc_model_destroy(m);
    assert_int_equal(dsc_model_create(&m, "llama-d0", &o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "llama model 'llama-d0' is not known"));
    assert_int_equal(dsc_model_create(&m, "foo", &o), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "llama-dN")); // every family's specs
    assert_non_null(strstr(dsc_last_error(), "gpt2-124M"));
}

// ---- the table == the family's own functions, bit for bit ----

enum { V = 97, CTX = 24 };

static void test_table_and_init(void **state) {
    (void)state;
    dsc_llama_config c;
    assert_int_equal(dsc_llama_config_parse("llama-d2", V, CTX, &c), DSC_OK);
    dsc_model *m;
    dsc_model_opts o = {.vocab_size = V, .max_seq_len = CTX};
    assert_int_equal(dsc_model_create(&m, "llama-d2", &o), DSC_OK);
    const dsc_model_info *mi = dsc_model_describe(m);
    assert_int_equal(mi->num_tensors, dsc_llama_num_tensors(&c));
    assert_int_equal(mi->num_params, dsc_llama_num_params(&c));
    for (int i = 0; i < mi->num_tensors; i++) {
        dsc_llama_tensor_info ti;
        dsc_llama_tensor_info_get(&c, i, &ti);
        const dsc_model_param *p = dsc_model_param_get(m, i);
        assert_string_equal(p->name, ti.name);
        assert_int_equal(p->ndim, ti.ndim), assert_int_equal(p->group, ti.group);
        assert_int_equal(p->numel, ti.numel);
        assert_int_equal(p->shape[0], ti.shape[0]), assert_int_equal(p->shape[1], ti.shape[1]);
    }
    tensors a = alloc_like(m), b = alloc_like(m);
    dsc_model_init_weights(m, a.t, 42);
    dsc_llama_init_weights(&c, b.t, 42);
    assert_tensors_equal(m, &a, &b);
    float part[5];
    dsc_model_init_tensor(m, 2, part, 3, 5, 42);
    assert_memory_equal(part, a.t[2] + 3, sizeof part);
    free_tensors(&a), free_tensors(&b);

    for (int T = 1; T <= CTX; T += 7)
        assert_true(dsc_model_flops_per_token(m, T) == dsc_llama_flops_per_token(&c, T));
    assert_int_equal(dsc_model_timing_slots(m), dsc_llama_timing_slots(&c));
    int n = dsc_model_modules(m, 3, 16, NULL);
    assert_int_equal(n, dsc_llama_modules(&c, 3, 16, NULL));
    dsc_model_module *x = calloc((size_t)n, sizeof *x);
    dsc_llama_module *y = calloc((size_t)n, sizeof *y);
    dsc_model_modules(m, 3, 16, x);
    dsc_llama_modules(&c, 3, 16, y);
    for (int k = 0; k < n; k++) {
        assert_string_equal(x[k].name, y[k].name), assert_string_equal(x[k].type, y[k].type);
        assert_int_equal(x[k].depth, y[k].depth), assert_int_equal(x[k].params, y[k].params);
        assert_true(x[k].fwd_flops == y[k].fwd_flops), assert_int_equal(x[k].slot, y[k].slot);
    }
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

// A Qwen2-like shape (q/k/v biases, untied, 4 heads over 2 kv heads) from a table of tensors.
static void qwen_like(dsc_llama_config *c) {
    *c = (dsc_llama_config){.n_layer = 2, .hidden = 64, .n_head = 4, .n_kv_head = 2,
                            .head_dim = 16, .intermediate = 96, .vocab_size = V,
                            .max_seq_len = CTX, .rms_eps = 1e-5f, .rope_theta = 1e4,
                            .rope_factor = 1.0, .tied = 0, .qkv_bias = 1};
}

static dsc_model *from_table(const dsc_llama_config *c, int n_head, dsc_status *st) {
    int n = dsc_llama_num_tensors(c);
    dsc_param_desc *pd = calloc((size_t)n, sizeof *pd);
    dsc_llama_tensor_info *ti = calloc((size_t)n, sizeof *ti);
    for (int i = 0; i < n; i++) { // reversed: any order
        dsc_llama_tensor_info_get(c, n - 1 - i, &ti[i]);
        pd[i] = (dsc_param_desc){.name = ti[i].name, .ndim = ti[i].ndim};
        pd[i].shape[0] = ti[i].shape[0], pd[i].shape[1] = ti[i].shape[1];
    }
    int *order = calloc((size_t)n, sizeof *order);
    dsc_model_opts o = {.n_head = n_head, .max_seq_len = CTX};
    dsc_model *m = NULL;
    *st = dsc_model_create_from_params(&m, pd, n, &o, "t.safetensors", order);
    for (int k = 0; m && k < n; k++) assert_int_equal(order[k], n - 1 - k);
    free(pd), free(ti), free(order);
    return m;
}

static void test_passes_equal_family(void **state) {
    (void)state;
    enum { B = 2, T = 12 };
    dsc_llama_config c;
    qwen_like(&c);
    dsc_status st;
    dsc_model *m = from_table(&c, 4, &st);
    assert_int_equal(st, DSC_OK);
    assert_string_equal(dsc_model_describe(m)->family, "llama");
    int32_t in[B * T], tg[B * T];
    for (int k = 0; k < B * T; k++)
        in[k] = (k * 13 + 5) % V, tg[k] = k % 5 == 0 ? -1 : (k * 7 + 1) % V;
    tensors p = alloc_like(m), ga = alloc_like(m), gb = alloc_like(m);
    dsc_model_init_weights(m, p.t, 3);
    for (int i = 0; i < p.n; i++) // nonzero biases
        if (dsc_model_param_get(m, i)->ndim == 1)
            for (int64_t e = 0; e < dsc_model_param_get(m, i)->numel; e++)
                p.t[i][e] += 0.01f * (float)((e * 7 + i) % 5 - 2);
    assert_int_equal(dsc_model_reserve(m, B, T, NULL), DSC_OK);

    hook_log la = {0}, lb = {0};
    dsc_model_hooks ha = {&la, h_gather, h_release, h_ready};
    dsc_llama_hooks hb = {&lb, h_gather, h_release, h_ready};
    float loss_a, loss_b;
    double times[64] = {0};
    dsc_model_set_timing(m, times);
    assert_int_equal(dsc_model_forward(m, p.t, in, tg, B, T, &ha, &loss_a), DSC_OK);
    dsc_model_set_timing(m, NULL);
    double timed = 0;
    for (int s = 0; s < dsc_model_timing_slots(m); s++) timed += times[s];
    assert_true(timed > 0);
    assert_int_equal(dsc_model_backward(m, p.t, ga.t, 2.0f, &ha), DSC_OK);

    dsc_llama *g;
    assert_int_equal(dsc_llama_create(&g, &c, B, T), DSC_OK);
    assert_int_equal(dsc_llama_forward(g, p.t, in, tg, B, T, &hb, &loss_b), DSC_OK);
    assert_int_equal(dsc_llama_backward(g, p.t, gb.t, 2.0f, &hb), DSC_OK);
    assert_memory_equal(&loss_a, &loss_b, sizeof loss_a);
    assert_tensors_equal(m, &ga, &gb);
    assert_string_equal(la.seq, lb.seq);

    // position ids: 0 .. T-1 given explicitly are the default, bit for bit; others change the
    // logits; one past the sequence length is refused
    int32_t pos[B * T];
    for (int k = 0; k < B * T; k++) pos[k] = k % T;
    size_t nl = (size_t)B * T * V;
    float *want = malloc(nl * sizeof(float));
    assert_int_equal(dsc_llama_forward(g, p.t, in, NULL, B, T, NULL, NULL), DSC_OK);
    memcpy(want, dsc_llama_logits(g), nl * sizeof(float));
    assert_int_equal(dsc_model_forward_pos(m, p.t, in, pos, NULL, B, T, NULL, NULL), DSC_OK);
    assert_memory_equal(dsc_model_logits(m), want, nl * sizeof(float));
    for (int k = 0; k < B * T; k++) pos[k] = k % T < 5 ? k % T : k % T - 5; // two documents
    assert_int_equal(dsc_model_forward_pos(m, p.t, in, pos, tg, B, T, NULL, &loss_a), DSC_OK);
    assert_true(memcmp(dsc_model_logits(m), want, nl * sizeof(float)) != 0);
    // the first document's logits do not depend on the positions of the second
    for (int b = 0; b < B; b++)
        assert_memory_equal(dsc_model_logits(m) + (size_t)b * T * V, want + (size_t)b * T * V,
                            5 * V * sizeof(float));
    assert_int_equal(dsc_model_backward(m, p.t, ga.t, 1.0f, NULL), DSC_OK);
    pos[3] = T;
    assert_int_equal(dsc_model_forward_pos(m, p.t, in, pos, NULL, B, T, NULL, NULL),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "position id"));
    free(want);
    dsc_llama_destroy(g);
    free_tensors(&p), free_tensors(&ga), free_tensors(&gb);
    dsc_model_destroy(m);
}

// ---- inference through the cache == a full forward ----

static void test_infer(void **state) {
    (void)state;
    enum { T = 10 };
    dsc_llama_config c;
    qwen_like(&c);
    dsc_status st;
    dsc_model *m = from_table(&c, 4, &st);
    assert_int_equal(st, DSC_OK);
    tensors p = alloc_like(m);
    dsc_model_init_weights(m, p.t, 11);
    int KV = c.n_kv_head * c.head_dim;
    assert_int_equal(dsc_model_kv_bytes(m, 1, 3, 16), (size_t)2 * 2 * 3 * 16 * KV * 4);
    // tensor parallelism splits the kv heads (2) and the MLP rows (96)
    assert_int_equal(dsc_model_tp_check(m, 1), DSC_OK);
    assert_int_equal(dsc_model_tp_check(m, 2), DSC_OK);
    assert_int_equal(dsc_model_tp_check(m, 4), DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "2 key/value heads"));
    assert_int_equal(dsc_model_kv_bytes(m, 2, 3, 16), dsc_model_kv_bytes(m, 1, 3, 16) / 2);
    for (int i = 0; i < p.n; i++) { // the two ranks' slices of a split tensor make up the whole
        const dsc_model_param *pi = dsc_model_param_get(m, i);
        int64_t part = dsc_model_tp_numel(m, i, 2);
        float *s0 = malloc(sizeof(float) * (size_t)part);
        float *s1 = malloc(sizeof(float) * (size_t)part);
        dsc_model_tp_slice(m, i, 0, 2, p.t[i], s0);
        dsc_model_tp_slice(m, i, 1, 2, p.t[i], s1);
        bool split = strstr(pi->name, "_proj") != NULL;
        assert_int_equal(part, split ? pi->numel / 2 : pi->numel);
        if (split && strstr(pi->name, "o_proj")) { // columns: row r is rank 0's then rank 1's
            int64_t w = pi->shape[1] / 2;
            assert_memory_equal(s0, p.t[i], sizeof(float) * (size_t)w);
            assert_memory_equal(s1, p.t[i] + w, sizeof(float) * (size_t)w);
        } else if (split && !strstr(pi->name, "down_proj")) { // rows: rank 0's, then rank 1's
            assert_memory_equal(s0, p.t[i], sizeof(float) * (size_t)part);
            assert_memory_equal(s1, p.t[i] + part, sizeof(float) * (size_t)part);
        } else if (!split) {
            assert_memory_equal(s0, p.t[i], sizeof(float) * (size_t)part);
        }
        free(s0), free(s1);
    }
    dsc_model_kv *kv;
    assert_int_equal(dsc_model_kv_create(&kv, m, 1, 3, 16), DSC_OK);
    assert_true(dsc_model_kv_fits(kv, m, 1, 2, 16));
    assert_false(dsc_model_kv_fits(kv, m, 1, 4, 16));
    assert_false(dsc_model_kv_fits(kv, m, 2, 2, 16)); // another group size

    // two sequences: a full forward of each, then through the cache as a prefill of 6 and 4
    // rows, then decode steps of one row each
    int32_t toks[2][T];
    for (int t = 0; t < T; t++) toks[0][t] = (t * 31 + 7) % V, toks[1][t] = (t * 17 + 3) % V;
    float *full = malloc(sizeof(float) * 2 * T * V);
    dsc_llama *g;
    assert_int_equal(dsc_llama_create(&g, &c, 2, T), DSC_OK);
    assert_int_equal(dsc_llama_forward(g, p.t, &toks[0][0], NULL, 2, T, NULL, NULL), DSC_OK);
    memcpy(full, dsc_llama_logits(g), sizeof(float) * 2 * T * V);
    dsc_llama_destroy(g);

    int32_t seq[10], pos[10], tok[10], out[10];
    int n = 0;
    for (int t = 0; t < 6; t++) seq[n] = 0, pos[n] = t, tok[n++] = toks[0][t];
    for (int t = 0; t < 4; t++) seq[n] = 1, pos[n] = t, tok[n++] = toks[1][t];
    for (int k = 0; k < n; k++) out[k] = k;
    float got[10 * V];
    double worst = 0;
    dsc_model_rows r = {n, seq, pos, tok, n, out};
    assert_int_equal(dsc_model_infer(m, kv, p.t, NULL, &r, NULL, got), DSC_OK);
    for (int k = 0; k < n; k++)
        for (int v = 0; v < V; v++) {
            float want = full[((size_t)seq[k] * T + pos[k]) * V + v];
            double e = fabsf(got[k * V + v] - want);
            worst = e > worst ? e : worst;
        }
    int len[2] = {6, 4};
    for (int step = 0; step < 4; step++) { // decode: one row per sequence
        int32_t s2[2] = {0, 1}, p2[2] = {len[0], len[1]}, t2[2], o2[2] = {0, 1};
        t2[0] = toks[0][len[0]], t2[1] = toks[1][len[1]];
        dsc_model_rows d = {2, s2, p2, t2, 2, o2};
        assert_int_equal(dsc_model_infer(m, kv, p.t, NULL, &d, NULL, got), DSC_OK);
        for (int k = 0; k < 2; k++)
            for (int v = 0; v < V; v++) {
                double e = fabsf(got[k * V + v] - full[((size_t)k * T + len[k]) * V + v]);
                worst = e > worst ? e : worst;
            }
        len[0]++, len[1]++;
    }
    print_message("llama inference through the cache vs a full forward: worst logit error %.3g\n",
                  worst);
    assert_true(worst < 1e-5);
    int32_t bad = 16;
    dsc_model_rows b = {1, seq, &bad, tok, 0, NULL};
    assert_int_equal(dsc_model_infer(m, kv, p.t, NULL, &b, NULL, NULL), DSC_ERR_INVALID_ARG);
    dsc_model_tp two = {0, 2, NULL}; // a group the cache was not made for
    assert_int_equal(dsc_model_infer(m, kv, p.t, &two, &r, NULL, got), DSC_ERR_INVALID_ARG);
    dsc_model_kv_destroy(kv);
    free(full);
    free_tensors(&p);
    dsc_model_destroy(m);
}

// ---- a model from tensors; its config.json ----

static void test_from_params_and_hf(void **state) {
    (void)state;
    dsc_llama_config c;
    qwen_like(&c);
    dsc_status st;
    assert_null(from_table(&c, 0, &st)); // the head count cannot be read off the shapes
    assert_int_equal(st, DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "config.json"));
    assert_null(from_table(&c, 3, &st)); // 3 heads do not divide q_proj's 64 rows
    assert_int_equal(st, DSC_ERR_INVALID_ARG);
    dsc_model *m = from_table(&c, 4, &st);
    assert_int_equal(st, DSC_OK);
    char *cj, *gj;
    assert_int_equal(dsc_model_hf_config(m, &cj, &gj), DSC_OK);
    assert_non_null(strstr(cj, "\"Qwen2ForCausalLM\""));
    assert_non_null(strstr(cj, "\"num_key_value_heads\": 2"));
    assert_non_null(strstr(cj, "\"tie_word_embeddings\": false"));
    free(cj), free(gj);
    dsc_model_destroy(m);

    // neither family's tensors: both say what they looked for
    dsc_param_desc other = {.name = "encoder.weight", .ndim = 2, .shape = {4, 4}};
    int order[1];
    assert_int_equal(dsc_model_create_from_params(&m, &other, 1, NULL, "z", order),
                     DSC_ERR_INVALID_ARG);
    assert_non_null(strstr(dsc_last_error(), "z: no GPT-2 embeddings"));
    assert_non_null(strstr(dsc_last_error(), "z: no Llama embeddings"));

    dsc_model_opts o = {.vocab_size = V, .max_seq_len = CTX};
    assert_int_equal(dsc_model_create(&m, "llama-d2", &o), DSC_OK);
    assert_int_equal(dsc_model_hf_config(m, &cj, &gj), DSC_OK);
    assert_non_null(strstr(cj, "\"LlamaForCausalLM\""));
    const char *eps = strstr(cj, "\"rms_norm_eps\": ");
    assert_non_null(eps);
    assert_true(strtod(eps + 16, NULL) == 1e-5); // the decimal 1e-5, not the float's 9.99999975e-6
    assert_non_null(strstr(cj, "\"max_position_embeddings\": 24"));
    free(cj), free(gj);
    dsc_model_destroy(m);
}


// ---- dsc_generate on a live engine == greedy by full forwards ----

static void test_engine_generate(void **state) {
    (void)state;
    enum { NEW = 8, PLEN = 4 };
    dsc_llama_config c;
    qwen_like(&c);
    dsc_status st;
    dsc_model *m = from_table(&c, 4, &st);
    assert_int_equal(st, DSC_OK);
    tensors p = alloc_like(m);
    dsc_model_init_weights(m, p.t, 5);
    // the reference: each new token the argmax of a full forward's last logits
    int32_t ids[PLEN + NEW] = {5, 6, 7, 8};
    dsc_llama *g;
    assert_int_equal(dsc_llama_create(&g, &c, 1, PLEN + NEW), DSC_OK);
    for (int n = PLEN; n < PLEN + NEW; n++) {
        assert_int_equal(dsc_llama_forward(g, p.t, ids, NULL, 1, n, NULL, NULL), DSC_OK);
        const float *l = dsc_llama_logits(g) + (size_t)(n - 1) * V;
        int best = 0;
        for (int v = 1; v < V; v++) best = l[v] > l[best] ? v : best;
        ids[n] = best;
    }
    dsc_llama_destroy(g);

    int nt = dsc_model_describe(m)->num_tensors;
    dsc_param_desc *pd = calloc((size_t)nt, sizeof *pd);
    dsc_model_param_descs(m, pd);
    for (int stage = 0; stage <= 3; stage += 3) {
        char json[512];
        snprintf(json, sizeof json,
                 "{\"train_micro_batch_size_per_gpu\": 1, \"optimizer\": {\"type\": \"AdamW\", "
                 "\"params\": {\"lr\": 1e-3}}, \"zero_optimization\": {\"stage\": %d}, "
                 "\"hybrid_engine\": {\"enabled\": true, \"max_out_tokens\": 16}}",
                 stage);
        dsc_engine_opts eo = {.config_json = json, .params = pd, .nparams = nt, .world_size = 1};
        dsc_engine *eng;
        if (dsc_engine_create(&eng, &eo) != DSC_OK) fail_msg("engine: %s", dsc_last_error());
        for (int i = 0; i < nt; i++)
            memcpy(dsc_param_master(eng, i), p.t[i],
                   (size_t)dsc_model_param_get(m, i)->numel * sizeof(float));
        assert_int_equal(dsc_params_updated(eng), DSC_OK);
        dsc_gen_opts o = dsc_gen_opts_default();
        o.temperature = 0;
        o.max_new_tokens = NEW;
        o.model = m;
        dsc_gen_prompt pr = {ids, PLEN};
        dsc_gen_output out;
        dsc_gen_stats gs;
        assert_int_equal(dsc_generate(eng, &pr, 1, &o, &out, &gs), DSC_OK);
        assert_int_equal(out.len, NEW);
        assert_memory_equal(out.tokens, ids + PLEN, NEW * sizeof(int32_t));
        assert_int_equal(gs.kv_bytes, dsc_model_kv_bytes(m, 1, 1, 16)); // GQA-sized
        dsc_gen_output_free(&out, 1);
        dsc_generate_release(eng);
        dsc_engine_destroy(eng);
    }
    free(pd);
    free_tensors(&p);
    dsc_model_destroy(m);
}

// MFU's numerator of a LoRA run: the family's 6 N, less 2 per frozen product weight (no weight
// gradient), plus 6 per adapter weight. llama-d2 (C 128, I from the shape, untied head V x C):
// counted here from the shapes by name.
static void test_lora_flops(void **state) {
    (void)state;
    dsc_model *m;
    dsc_model_opts o = {.vocab_size = 256, .max_seq_len = 32};
    assert_int_equal(dsc_model_create(&m, "llama-d2", &o), DSC_OK);
    double base = dsc_model_flops_per_token(m, 32);
    int n0 = dsc_model_describe(m)->num_tensors;
    double frozen = 0, adapters = 0;
    for (int i = 0; i < n0; i++) { // every layer matrix, the head if untied, else the table
        const dsc_model_param *p = dsc_model_param_get(m, i);
        bool layer_matrix = p->ndim == 2 && strstr(p->name, "layers.");
        bool head = !strcmp(p->name, "lm_head.weight");
        if (layer_matrix) adapters += 8.0 * (double)(p->shape[0] + p->shape[1]);
        if (layer_matrix || head) frozen += (double)p->numel;
    }
    bool tied = true;
    for (int i = 0; i < n0; i++)
        if (!strcmp(dsc_model_param_get(m, i)->name, "lm_head.weight")) tied = false;
    if (tied) frozen += 256.0 * 128.0;
    dsc_model_lora lo = {.r = 8, .alpha = 16};
    assert_int_equal(dsc_model_set_lora(m, &lo), DSC_OK);
    double want = base - 2 * frozen + 6 * adapters, got = dsc_model_flops_per_token(m, 32);
    assert_true(fabs(got - want) <= 1e-9 * want);
    assert_true(got < base); // the frozen base's weight gradients are not computed
    dsc_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_specs),       cmocka_unit_test(test_table_and_init),
        cmocka_unit_test(test_passes_equal_family), cmocka_unit_test(test_infer),
        cmocka_unit_test(test_from_params_and_hf), cmocka_unit_test(test_engine_generate),
        cmocka_unit_test(test_lora_flops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
