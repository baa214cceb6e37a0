// infer/generate.c - the generation loop: prompts through the cache at once, then one row per
// live sequence and token, sampling, stop conditions.
#include "infer/generate.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, malloc
#include <string.h> // memcpy

#include "base/status.h"  // dsc__fail, DSC_TRY
#include "base/time.h"    // dsc_now
#include "infer/sample.h" // dsc__sample*

dsc_gen_opts dsc_gen_opts_default(void) {
    return (dsc_gen_opts){.max_new_tokens = 64,
                          .temperature = 0.8f,
                          .top_k = 40,
                          .top_p = 1.0f,
                          .seed = 1337,
                          .eot = -1};
}

void dsc_gen_output_free(dsc_gen_output *out, int n) {
    for (int i = 0; out && i < n; i++) {
        free(out[i].tokens);
        out[i].tokens = NULL;
        out[i].len = 0;
    }
}

// ---- the loop ----

typedef struct gen_state {
    const dsc_gen_model *m;
    const dsc_gen_opts *o;
    int n, ctx;     // sequences; positions each may reach
    int *len;       // (n) tokens so far, prompt included
    int32_t **seq;  // (n) prompt + generated tokens
    bool *live;
    uint64_t *rng;
    int32_t *sel;    // (n) sequence of each output row
    int32_t *chosen; // (n) tokens the model picked itself (greedy)
    int32_t *code;   // (n) how each output row's sequence ends, or -1
    int32_t *pack;   // (2 n) rank 0's decisions, broadcast
    float *logits;   // (n, V)
    float *scratch;  // (2 V) sampling
    int step;        // passes so far
} gen_state;

static dsc_status check_inputs(const dsc_gen_model *m, const dsc_gen_prompt *p, int n,
                               const dsc_gen_opts *o, int ctx) {
    if (!o || n < 1 || !p)
        return dsc__fail(DSC_ERR_INVALID_ARG, "generate: need at least one prompt and options");
    if (o->max_new_tokens < 1 || o->temperature < 0 || o->top_k < 0 || o->top_p < 0 || o->top_p > 1)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "generate: max_new_tokens %d, temperature %g, top_k %d, top_p %g: need "
                         "max_new_tokens >= 1, temperature >= 0, top_k >= 0, 0 <= top_p <= 1",
                         o->max_new_tokens, o->temperature, o->top_k, o->top_p);
    const dsc_model_info *mi = dsc_model_describe(m->model);
    for (int i = 0; i < n; i++) {
        if (p[i].len < 1 || !p[i].tokens)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "generate: prompt %d is empty; give at least "
                             "one token",
                             i);
        if (p[i].len >= ctx)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "generate: prompt %d has %d tokens, but a sequence may hold %d "
                             "(the model's context %d%s); shorten the prompt",
                             i, p[i].len, ctx, mi->max_seq_len,
                             m->max_positions ? ", or max_out_tokens" : "");
        for (int t = 0; t < p[i].len; t++)
            if (p[i].tokens[t] < 0 || p[i].tokens[t] >= mi->vocab_size)
                return dsc__fail(DSC_ERR_INVALID_ARG,
                                 "generate: token %d of prompt %d is %d, outside the model's "
                                 "vocabulary [0, %d); use the tokenizer the model was trained "
                                 "with",
                                 t, i, p[i].tokens[t], mi->vocab_size);
    }
    return DSC_OK;
}

static void state_free(gen_state *s) {
    for (int i = 0; s->seq && i < s->n; i++)
        free(s->seq[i]);
    free(s->seq), free(s->len), free(s->live), free(s->rng);
    free(s->sel), free(s->chosen), free(s->code), free(s->pack);
    free(s->logits), free(s->scratch);
}

static dsc_status state_init(gen_state *s, const dsc_gen_prompt *p) {
    int n = s->n, V = dsc_model_describe(s->m->model)->vocab_size;
    s->seq = calloc((size_t)n, sizeof *s->seq);
    s->len = calloc((size_t)n, sizeof *s->len);
    s->live = calloc((size_t)n, sizeof *s->live);
    s->rng = calloc((size_t)n, sizeof *s->rng);
    s->sel = malloc((size_t)n * sizeof(int32_t));
    s->chosen = malloc((size_t)n * sizeof(int32_t));
    s->code = malloc((size_t)n * sizeof(int32_t));
    s->pack = malloc((size_t)2 * n * sizeof(int32_t));
    s->logits = malloc((size_t)n * V * sizeof(float));
    s->scratch = malloc((size_t)2 * V * sizeof(float));
    bool ok = s->seq && s->len && s->live && s->rng && s->sel && s->chosen && s->code && s->pack &&
              s->logits && s->scratch;
    for (int i = 0; ok && i < n; i++) {
        ok = (s->seq[i] = malloc((size_t)s->ctx * sizeof(int32_t))) != NULL;
        if (!ok) break;
        memcpy(s->seq[i], p[i].tokens, (size_t)p[i].len * sizeof(int32_t));
        s->len[i] = p[i].len;
        s->live[i] = true;
        s->rng[i] = dsc__sample_stream(s->o->seed, i);
    }
    return ok ? DSC_OK : dsc__fail(DSC_ERR_OOM, "generate: out of memory for %d sequences", n);
}

// The next pass: the live sequences, in index order.
static int next_pass(gen_state *s, dsc__gen_pass *p) {
    int no = 0;
    for (int i = 0; i < s->n; i++)
        if (s->live[i]) s->sel[no++] = i;
    *p = (dsc__gen_pass){.n = s->n,
                         .tokens = (const int32_t *const *)s->seq,
                         .len = s->len,
                         .live = s->live,
                         .first = s->step == 0,
                         .nout = no,
                         .sel = s->sel};
    return no;
}

// After its newest token: how sequence i ends (a dsc_gen_finish), or -1 when it goes on.
static int ends(gen_state *s, int i, const dsc_gen_prompt *p) {
    int gen = s->len[i] - p[i].len;
    int32_t tok = s->seq[i][s->len[i] - 1];
    const dsc_gen_opts *o = s->o;
    if (o->eot >= 0 && tok == o->eot) return DSC_GEN_EOT;
    if (o->stop && o->stop(o->stop_user, i, s->seq[i] + p[i].len, gen)) return DSC_GEN_STOP;
    if (gen >= o->max_new_tokens || s->len[i] >= s->ctx) return DSC_GEN_LENGTH;
    return -1;
}

// --trace: the choice and the two best tokens of output row j (largest logit, lowest id first).
static void trace_row(gen_state *s, int j, int32_t tok) {
    int V = dsc_model_describe(s->m->model)->vocab_size;
    const float *l = s->logits + (size_t)j * V;
    int a = 0, b = V > 1 ? 1 : 0;
    if (V > 1 && l[1] > l[0]) a = 1, b = 0;
    for (int v = 2; v < V; v++) {
        if (l[v] > l[a]) b = a, a = v;
        else if (l[v] > l[b]) b = v;
    }
    fprintf(s->m->trace,
            "{\"seq\": %d, \"step\": %d, \"token\": %d, \"top\": [[%d, %.9g], [%d, %.9g]]}\n",
            s->sel[j], s->step, tok, a, l[a], b, l[b]);
}

// One token for every output row, and whether its sequence ends. In a tensor-parallel group
// rank 0's tokens and decisions are broadcast, so that the ranks never drift apart (their
// logits agree, but a backend need not promise it bit for bit, and a stop function may differ).
static dsc_status decide(gen_state *s, int nout, bool picked, const dsc_gen_prompt *p,
                         dsc_gen_output *out) {
    int V = dsc_model_describe(s->m->model)->vocab_size;
    int32_t *code = s->code, *pack = s->pack;
    for (int j = 0; j < nout; j++) {
        int i = s->sel[j];
        int32_t tok = picked ? s->chosen[j]
                             : dsc__sample(s->logits + (size_t)j * V, V, s->o, &s->rng[i],
                                           s->scratch, NULL);
        if (s->m->trace && !picked) trace_row(s, j, tok);
        s->seq[i][s->len[i]++] = tok;
        code[j] = ends(s, i, p);
    }
    if (s->m->tp.size > 1) {
        for (int j = 0; j < nout; j++) {
            pack[j] = s->seq[s->sel[j]][s->len[s->sel[j]] - 1];
            pack[nout + j] = code[j];
        }
        // int32 payload moved as 4-byte elements: a broadcast copies bits and never computes
        DSC_TRY(dsc_comm_broadcast(s->m->tp.comm, pack, 2 * (size_t)nout, DSC_DT_F32, 0, NULL));
        for (int j = 0; j < nout; j++) {
            s->seq[s->sel[j]][s->len[s->sel[j]] - 1] = pack[j];
            code[j] = pack[nout + j];
        }
    }
    for (int j = 0; j < nout; j++) {
        if (code[j] < 0) continue;
        s->live[s->sel[j]] = false;
        out[s->sel[j]].finish = (dsc_gen_finish)code[j];
    }
    return DSC_OK;
}

static dsc_status run_loop(gen_state *s, const dsc__gen_backend *be, const dsc_gen_prompt *p,
                           dsc_gen_output *out, dsc_gen_stats *st) {
    dsc__gen_pass pass;
    double t0 = dsc_now();
    bool greedy = s->o->temperature <= 0.0f && !s->m->trace; // a trace needs the logits
    int nout;
    while ((nout = next_pass(s, &pass)) > 0) {
        bool picked = false;
        DSC_TRY(be->next(be->ctx, &pass, s->logits, greedy ? s->chosen : NULL, &picked));
        if (s->step == 0) st->prefill_s = dsc_now() - t0;
        DSC_TRY(decide(s, nout, picked, p, out));
        s->step++;
        st->new_tokens += nout;
    }
    st->decode_s = dsc_now() - t0 - st->prefill_s;
    return DSC_OK;
}

static dsc_status take_outputs(gen_state *s, const dsc_gen_prompt *p, dsc_gen_output *out) {
    for (int i = 0; i < s->n; i++) {
        int gen = s->len[i] - p[i].len;
        out[i].tokens = malloc((size_t)(gen > 0 ? gen : 1) * sizeof(int32_t));
        if (!out[i].tokens) {
            dsc_gen_output_free(out, i);
            return dsc__fail(DSC_ERR_OOM, "generate: out of memory for the outputs");
        }
        memcpy(out[i].tokens, s->seq[i] + p[i].len, (size_t)gen * sizeof(int32_t));
        out[i].len = gen;
    }
    return DSC_OK;
}

dsc_status dsc__generate_positions(const dsc_gen_model *m, const dsc_gen_prompt *prompts, int n,
                                   const dsc_gen_opts *o, int *positions) {
    int context = dsc_model_describe(m->model)->max_seq_len;
    int ctx = m->max_positions > 0 && m->max_positions < context ? m->max_positions : context;
    DSC_TRY(check_inputs(m, prompts, n, o, ctx));
    // The cache holds max_out_tokens positions when bounded (its size proves the bound), else
    // only what the longest sequence of this call reaches.
    int reach_max = 0;
    for (int i = 0; i < n; i++) {
        int reach = prompts[i].len + o->max_new_tokens;
        if (reach > ctx) reach = ctx;
        if (reach > reach_max) reach_max = reach;
    }
    *positions = m->max_positions > 0 ? ctx : reach_max;
    return DSC_OK;
}

dsc_status dsc__generate_loop(const dsc_gen_model *m, const dsc__gen_backend *be, int positions,
                              const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                              dsc_gen_output *out, dsc_gen_stats *stats) {
    dsc_gen_stats local = {0};
    dsc_gen_stats *st = stats ? stats : &local;
    gen_state s = {.m = m, .o = o, .n = n, .ctx = positions};
    for (int i = 0; i < n; i++)
        out[i] = (dsc_gen_output){0};
    dsc_status rc = state_init(&s, prompts);
    if (rc == DSC_OK) rc = run_loop(&s, be, prompts, out, st);
    if (rc == DSC_OK) rc = take_outputs(&s, prompts, out);
    state_free(&s);
    return rc;
}

// ---- the CPU model as the loop's backend ----

typedef struct cpu_backend {
    const dsc_gen_model *m;
    dsc_model_kv *kv;
    bool no_cache;
    int32_t *rseq, *rpos, *rtok, *rout; // row arrays, sized for every token of every sequence
} cpu_backend;

// Rows of a pass: every token of each live sequence (the prompts' pass, or no cache), else
// only its newest (the cache holds the rest); its last row's logits are wanted.
static dsc_status cpu_next(void *ctx, const dsc__gen_pass *p, float *logits, int32_t *chosen,
                           bool *picked) {
    cpu_backend *cb = ctx;
    bool whole = p->first || cb->no_cache;
    int nr = 0;
    for (int j = 0; j < p->nout; j++) {
        int i = p->sel[j];
        for (int t = whole ? 0 : p->len[i] - 1; t < p->len[i]; t++) {
            cb->rseq[nr] = i, cb->rpos[nr] = t, cb->rtok[nr] = p->tokens[i][t];
            nr++;
        }
        cb->rout[j] = nr - 1;
    }
    dsc_model_rows r = {.n = nr, .seq = cb->rseq, .pos = cb->rpos, .tokens = cb->rtok,
                       .nout = p->nout, .out = cb->rout};
    (void)chosen;
    *picked = false;
    return dsc_model_infer(cb->m->model, cb->kv, cb->m->params, &cb->m->tp, &r, cb->m->hooks,
                           logits);
}

// The cache: reused when it fits, else made for n sequences of `positions`.
static dsc_status cache_for(const dsc_gen_model *m, dsc_model_kv **kv, int n, int positions) {
    if (dsc_model_kv_fits(*kv, m->model, m->tp.size, n, positions)) return DSC_OK;
    dsc_model_kv_destroy(*kv);
    *kv = NULL;
    return dsc_model_kv_create(kv, m->model, m->tp.size, n, positions);
}

dsc_status dsc_generate_run(const dsc_gen_model *m, dsc_model_kv **kv,
                            const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                            dsc_gen_output *out, dsc_gen_stats *stats) {
    dsc_gen_stats local = {0};
    dsc_gen_stats *st = stats ? stats : &local;
    int positions;
    DSC_TRY(dsc__generate_positions(m, prompts, n, o, &positions));
    DSC_TRY(cache_for(m, kv, n, positions));
    st->kv_bytes = dsc_model_kv_bytes(m->model, m->tp.size, n, positions);
    st->kv_positions = positions;
    size_t rows = (size_t)n * positions;
    cpu_backend cb = {.m = m, .kv = *kv, .no_cache = o->no_cache};
    cb.rseq = malloc(rows * sizeof(int32_t)), cb.rpos = malloc(rows * sizeof(int32_t));
    cb.rtok = malloc(rows * sizeof(int32_t)), cb.rout = malloc((size_t)n * sizeof(int32_t));
    dsc_status rc = cb.rseq && cb.rpos && cb.rtok && cb.rout
                        ? DSC_OK
                        : dsc__fail(DSC_ERR_OOM, "generate: out of memory for %d sequences", n);
    dsc__gen_backend be = {.ctx = &cb, .next = cpu_next};
    if (rc == DSC_OK) rc = dsc__generate_loop(m, &be, positions, prompts, n, o, out, st);
    free(cb.rseq), free(cb.rpos), free(cb.rtok), free(cb.rout);
    return rc;
}
