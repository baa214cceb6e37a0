// The GPU decoder (model/gpt2/gpt2_decode.h) and GPU generation (dsc_generate_run_cuda) against the
// CPU.
//
// (a) Logits: a small random GPT-2 (2 layers, 128 channels, vocabulary 1000, context 256), three
//     rows with prompts of 5, 150 and 77 tokens (150 > the 128 keys one pass of the attention
//     kernel covers), then 6 steps. Every pass's logits against the CPU model's fp32 forward over
//     the whole sequence (model/gpt2): the cached decoder, the recompute mode (the training
//     forward), and the two against each other, within bf16 tolerance. The device's argmax equals
//     the host's over the same logits (lowest id on ties); a step replayed from the captured
//     graph equals the eager step bit for bit; a second run is bitwise the first; a second
//     prefill of other lengths on the same decoder is right again.
// (b) Greedy generation, 40 tokens for 4 prompts of different lengths, over 3 seeds of two
//     models: "peaked" (position embeddings that point at a next token, so the choices have wide
//     margins) and "random" (GPT-2 init with every matrix x5, margins as they come). With the
//     cache vs without it (both GPU), and vs the CPU's fp32 generation: the tokens must be equal,
//     or at the first difference the reference's two best logits must be a near-tie (within
//     TIE_ABS + TIE_REL |best|); any other difference fails. The count of near-tie divergences
//     is printed. The peaked model must give equal tokens outright.
// (c) Sampling on the GPU equals dsc__sample run on the host over the decoder's logits with the
//     CPU path's seed streams, token for token; the same seed repeats, another seed differs.
//
// With --bench SPEC B PROMPT NEW (e.g. gpt2-124M 8 64 128) it times the decoder alone on random
// weights: prefill, and per-step time with and without the graph.
#include "cuda_test.h" // require_device, check, rel_err, dev_*, to_bf16

#include <stdio.h> // tmpfile, fgets, sscanf

#include <algorithm> // std::max

extern "C" {
#include "base/time.h"              // dsc_now
#include "model/gpt2/gpt2_decode.h" // dsc_gpt2_decode_*
#include "infer/generate.h"         // dsc_generate_run_cuda, dsc_generate_run
#include "infer/sample.h"           // dsc__sample
#include "model/gpt2/gpt2.h"        // dsc_gpt2_* (CPU reference)
#include "model/gpt2/model.h"       // dsc__model_gpt2_create
}

#define TOL_LOGITS 1.5e-2 // relative, all rows of a pass; bf16 activations give about 5e-3
#define TIE_ABS 0.05      // a near-tie: the reference's best two logits this close, plus
#define TIE_REL 0.05      // this fraction of the best one's magnitude

// ---- a host model ----

struct host_model {
    dsc_gpt2_config c;
    std::vector<std::vector<float>> t; // tensors in table order, bf16-rounded
    std::vector<float *> p;
};

enum { PERTURBED, PEAKED, RANDOM5 };

// GPT-2 init, then: PERTURBED adds noise 0.05 to everything (biases and layernorms not 0 and 1);
// PEAKED scales wte by 5 and adds to wpe[t] twice wte[next(t)] for a fixed pseudo-random next(t),
// so that the last position's embedding dominates its logits; RANDOM5 scales every matrix by 5.
static host_model make_model(const dsc_gpt2_config &c, uint64_t seed, int kind) {
    host_model m;
    m.c = c;
    int nt = dsc_gpt2_num_tensors(&c);
    m.t.resize(nt);
    for (int i = 0; i < nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&c, i, &ti);
        m.t[i].assign((size_t)ti.numel, 0.0f);
        m.p.push_back(m.t[i].data());
    }
    dsc_gpt2_init_weights(&c, m.p.data(), seed);
    size_t C = (size_t)c.n_embd;
    for (int i = 0; i < nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&c, i, &ti);
        for (float &x : m.t[i]) {
            if (kind == PERTURBED) x += (float)(0.05 * normal());
            if (kind == RANDOM5 && ti.ndim == 2) x *= 5.0f;
            if (kind == PEAKED && i == 0) x *= 5.0f;
        }
    }
    if (kind == PEAKED)
        for (int t = 0; t < c.max_seq_len; t++) {
            size_t next = (size_t)((t * 7919u + (unsigned)seed * 104729u) % (unsigned)c.vocab_size);
            for (size_t k = 0; k < C; k++)
                m.t[1][t * C + k] += 2.0f * m.t[0][next * C + k];
        }
    for (auto &v : m.t)
        (void)to_bf16(v); // the host keeps exactly the device's bf16 values
    return m;
}

// CPU fp32 logits of the last position of seq[0 .. T).
static std::vector<float> cpu_last_logits(dsc_gpt2 *cpu, const host_model &m, const int32_t *seq,
                                          int T) {
    DS(dsc_gpt2_forward(cpu, (float *const *)m.p.data(), seq, NULL, 1, T, NULL, NULL));
    const float *l = dsc_gpt2_logits(cpu) + (size_t)(T - 1) * m.c.vocab_size;
    return std::vector<float>(l, l + m.c.vocab_size);
}

static int host_argmax(const float *l, int V) { // dsc__sample's greedy rule
    int best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

// ---- (a) logits ----

struct pass_result {
    std::vector<float> logits; // (n, V)
    std::vector<int32_t> chosen;
};

// Prefill rows of lens, then `steps` steps feeding seqs[b][lens[b] + k] at that position.
static std::vector<pass_result> run_decoder(dsc_gpt2_decode *d, const uint16_t *const *params,
                                            const std::vector<std::vector<int32_t>> &seqs,
                                            const std::vector<int> &lens, int steps, int V) {
    int n = (int)lens.size();
    std::vector<const int32_t *> rows;
    for (auto &s : seqs)
        rows.push_back(s.data());
    std::vector<pass_result> out;
    auto collect = [&] {
        pass_result r;
        r.logits.resize((size_t)n * V);
        r.chosen.resize(n);
        DS(dsc_gpt2_decode_argmax(d, r.chosen.data()));
        DS(dsc_gpt2_decode_logits(d, r.logits.data()));
        out.push_back(r);
    };
    DS(dsc_gpt2_decode_prefill(d, params, rows.data(), lens.data(), n));
    collect();
    for (int k = 0; k < steps; k++) {
        std::vector<int32_t> tok(n), pos(n);
        for (int b = 0; b < n; b++)
            pos[b] = lens[b] + k, tok[b] = seqs[b][pos[b]];
        DS(dsc_gpt2_decode_step(d, params, tok.data(), pos.data(), n));
        collect();
    }
    return out;
}

static double pass_err(const std::vector<pass_result> &a, const std::vector<pass_result> &b,
                       size_t k) {
    return rel_err(a[k].logits.data(), b[k].logits.data(), a[k].logits.size());
}

static dsc_gpt2_decode *make_decoder(const dsc_gpt2_config &c, int B, int L, bool recompute,
                                     bool no_graph) {
    dsc_gpt2_decode_opts o = {};
    o.batch = B, o.max_len = L, o.recompute = recompute, o.no_graph = no_graph;
    dsc_gpt2_decode *d = NULL;
    DS(dsc_gpt2_decode_create(&d, &c, &o));
    return d;
}

static void test_logits(void) {
    dsc_gpt2_config c = {2, 2, 128, 1000, 256, false, NULL};
    host_model m = make_model(c, 1234, PERTURBED);
    dsc_gpt2_decode_weights *w = NULL;
    DS(dsc_gpt2_decode_weights_upload(&w, &c, (const float *const *)m.p.data(), NULL));
    const uint16_t *const *params = dsc_gpt2_decode_weights_params(w);
    std::vector<int> lens = {5, 150, 77};
    const int steps = 6, V = c.vocab_size, n = 3;
    std::vector<std::vector<int32_t>> seqs(n);
    for (int b = 0; b < n; b++)
        for (int t = 0; t < lens[b] + steps; t++)
            seqs[b].push_back((int32_t)(rng_next() % V));
    seqs[0][2] = seqs[0][3] = 17; // repeated tokens

    dsc_gpt2_decode *dg = make_decoder(c, n, c.max_seq_len, false, false);
    dsc_gpt2_decode *de = make_decoder(c, n, c.max_seq_len, false, true);
    dsc_gpt2_decode *dr = make_decoder(c, n, c.max_seq_len, true, false);
    auto g = run_decoder(dg, params, seqs, lens, steps, V);
    auto e = run_decoder(de, params, seqs, lens, steps, V);
    auto r = run_decoder(dr, params, seqs, lens, steps, V);
    auto g2 = run_decoder(dg, params, seqs, lens, steps, V);

    dsc_gpt2 *cpu = NULL;
    DS(dsc_gpt2_create(&cpu, &c, 1, c.max_seq_len));
    std::vector<pass_result> ref(steps + 1);
    for (int k = 0; k <= steps; k++)
        for (int b = 0; b < n; b++) {
            auto l = cpu_last_logits(cpu, m, seqs[b].data(), lens[b] + k);
            ref[k].logits.insert(ref[k].logits.end(), l.begin(), l.end());
        }
    double worst_g = 0, worst_r = 0, worst_gr = 0;
    bool argmax_ok = true, graph_bitwise = true, repeat_bitwise = true;
    for (int k = 0; k <= steps; k++) {
        double eg = pass_err(g, ref, k), er = pass_err(r, ref, k), egr = pass_err(g, r, k);
        printf("  pass %d: cache vs cpu %.3e, recompute vs cpu %.3e, cache vs recompute %.3e\n", k,
               eg, er, egr);
        worst_g = eg > worst_g || eg != eg ? eg : worst_g;
        worst_r = er > worst_r || er != er ? er : worst_r;
        worst_gr = egr > worst_gr || egr != egr ? egr : worst_gr;
        graph_bitwise &= g[k].logits == e[k].logits && g[k].chosen == e[k].chosen;
        repeat_bitwise &= g[k].logits == g2[k].logits;
        for (auto *res : {&g[k], &e[k], &r[k]})
            for (int b = 0; b < n; b++)
                argmax_ok &= res->chosen[b] == host_argmax(res->logits.data() + (size_t)b * V, V);
    }
    check("decode logits (KV cache) vs CPU fp32 forward", worst_g, TOL_LOGITS);
    check("decode logits (recompute) vs CPU fp32 forward", worst_r, TOL_LOGITS);
    check("decode logits cache vs recompute", worst_gr, TOL_LOGITS);
    check_true("decode argmax on the device == host argmax of its logits", argmax_ok);
    printf("  graph replays: %ld\n", dsc_gpt2_decode_graph_replays(dg));
    check_true("decode steps replay a captured graph", dsc_gpt2_decode_graph_replays(dg) > 0);
    check_true("decode graph replay == eager steps, bitwise", graph_bitwise);
    check_true("decode second run == first, bitwise", repeat_bitwise);
    check_true("decode kv bytes = L x 2 x B x positions x C x 2",
               dsc_gpt2_decode_kv_bytes(&c, 3, 256) == (size_t)2 * 2 * 3 * 256 * 128 * 2);

    // a second prefill of other rows and lengths on the same decoder
    std::vector<int> lens2 = {40, 9};
    std::vector<std::vector<int32_t>> seqs2 = {seqs[2], seqs[1]};
    auto g3 = run_decoder(dg, params, seqs2, lens2, 2, V);
    std::vector<float> ref3;
    for (int b = 0; b < 2; b++) {
        auto l = cpu_last_logits(cpu, m, seqs2[b].data(), lens2[b] + 2);
        ref3.insert(ref3.end(), l.begin(), l.end());
    }
    check("decode: a second prefill (2 rows) then 2 steps vs CPU",
          rel_err(g3[2].logits.data(), ref3.data(), ref3.size()), TOL_LOGITS);

    // bad input is an error, not a fault
    int32_t bad_tok = V, zero = 0, far = c.max_seq_len;
    check_true("decode: a token outside the vocabulary is refused",
               dsc_gpt2_decode_step(dg, params, &bad_tok, &zero, 1) == DSC_ERR_INVALID_ARG);
    check_true("decode: a position outside the cache is refused",
               dsc_gpt2_decode_step(dg, params, &zero, &far, 1) == DSC_ERR_INVALID_ARG);
    check_true("decode: more rows than the batch are refused",
               dsc_gpt2_decode_step(dg, params, seqs[0].data(), seqs[1].data(), 4) ==
                   DSC_ERR_INVALID_ARG);
    dsc_gpt2_destroy(cpu);
    dsc_gpt2_decode_destroy(dg);
    dsc_gpt2_decode_destroy(de);
    dsc_gpt2_decode_destroy(dr);
    dsc_gpt2_decode_weights_destroy(w);
}

// ---- (b) greedy generation ----

struct trace_top {
    int token;
    float v1, v2;
};

// The trace lines by (sequence, step).
static std::vector<std::vector<trace_top>> read_trace(FILE *f, int n) {
    std::vector<std::vector<trace_top>> t(n);
    rewind(f);
    char line[512];
    while (fgets(line, sizeof line, f)) {
        int seq, step, tok, i1, i2;
        float v1, v2;
        const char *fmt =
            "{\"seq\": %d, \"step\": %d, \"token\": %d, \"top\": [[%d, %g], [%d, %g]]}";
        if (sscanf(line, fmt, &seq, &step, &tok, &i1, &v1, &i2, &v2) != 7 ||
            seq < 0 || seq >= n)
            continue;
        if ((int)t[seq].size() <= step) t[seq].resize(step + 1);
        t[seq][step] = {tok, v1, v2};
    }
    return t;
}

typedef dsc_status (*gen_fn)(const dsc_gen_model *, const dsc_gen_prompt *, int,
                             const dsc_gen_opts *, dsc_gen_output *, dsc_gen_stats *);

static dsc_status run_cpu(const dsc_gen_model *m, const dsc_gen_prompt *p, int n,
                          const dsc_gen_opts *o, dsc_gen_output *out, dsc_gen_stats *st) {
    dsc_model_kv *kv = NULL;
    dsc_status rc = dsc_generate_run(m, &kv, p, n, o, out, st);
    dsc_model_kv_destroy(kv);
    return rc;
}

static std::vector<std::vector<int32_t>> generate(gen_fn fn, const host_model &hm,
                                                  const std::vector<std::vector<int32_t>> &prompts,
                                                  dsc_gen_opts o, FILE *trace) {
    int n = (int)prompts.size();
    dsc_model *model = NULL;
    DS(dsc__model_gpt2_create(&model, &hm.c));
    dsc_gen_model gm = {};
    gm.model = model, gm.params = (float *const *)hm.p.data(), gm.tp = {0, 1, NULL};
    gm.trace = trace;
    std::vector<dsc_gen_prompt> p;
    for (auto &q : prompts)
        p.push_back({q.data(), (int)q.size()});
    std::vector<dsc_gen_output> out(n);
    DS(fn(&gm, p.data(), n, &o, out.data(), NULL));
    std::vector<std::vector<int32_t>> toks;
    for (auto &x : out)
        toks.emplace_back(x.tokens, x.tokens + x.len);
    dsc_gen_output_free(out.data(), n);
    dsc_model_destroy(model);
    return toks;
}

// got vs want, sequence by sequence: equal, or a near-tie of the reference (its trace) at the
// first difference. Returns the number of near-tie divergences; a real difference fails.
static int compare_greedy(const char *what, const std::vector<std::vector<int32_t>> &got,
                          const std::vector<std::vector<int32_t>> &want,
                          const std::vector<std::vector<trace_top>> &ref) {
    int ties = 0;
    bool ok = got.size() == want.size();
    for (size_t i = 0; ok && i < got.size(); i++) {
        size_t k = 0;
        while (k < got[i].size() && k < want[i].size() && got[i][k] == want[i][k])
            k++;
        if (k == got[i].size() && k == want[i].size()) continue;
        if (k >= ref[i].size() || ref[i][k].token != want[i][k]) {
            ok = false;
            printf("  %s: sequence %zu differs at token %zu and the reference trace lacks it\n",
                   what, i, k);
            break;
        }
        float gap = ref[i][k].v1 - ref[i][k].v2;
        float tol = (float)(TIE_ABS + TIE_REL * fabs(ref[i][k].v1));
        printf("  %s: sequence %zu diverges at token %zu (%d vs %d); reference top-2 gap %.4f "
               "(near-tie bound %.4f)\n",
               what, i, k, k < got[i].size() ? got[i][k] : -1, want[i][k], gap, tol);
        if (gap <= tol) ties++;
        else ok = false;
    }
    char name[160];
    snprintf(name, sizeof name, "greedy %s: equal, or a near-tie at the first difference", what);
    check_true(name, ok);
    return ties;
}

static void test_greedy(void) {
    dsc_gpt2_config c = {2, 4, 256, 512, 128, false, NULL};
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0, o.max_new_tokens = 40;
    int ties_nc[2] = {0, 0}, ties_cpu[2] = {0, 0}, runs = 0;
    int nseeds = small_mode() ? 1 : 3; // compute-sanitizer runs take one seed
    for (int kind : {PEAKED, RANDOM5}) {
        for (uint64_t seed = 11; seed < 11 + (uint64_t)nseeds; seed++) {
            host_model m = make_model(c, seed, kind);
            std::vector<std::vector<int32_t>> prompts;
            for (int len : {3, 11, 6, 20}) {
                std::vector<int32_t> q;
                for (int t = 0; t < len; t++)
                    q.push_back((int32_t)(rng_next() % c.vocab_size));
                prompts.push_back(q);
            }
            FILE *tn = tmpfile(), *tc = tmpfile();
            if (!tn || !tc) {
                printf("FATAL: tmpfile\n");
                exit(1);
            }
            auto cached = generate(dsc_generate_run_cuda, m, prompts, o, NULL);
            o.no_cache = true;
            auto nocache = generate(dsc_generate_run_cuda, m, prompts, o, tn);
            o.no_cache = false;
            auto cpu = generate(run_cpu, m, prompts, o, tc);
            int k = kind == PEAKED ? 0 : 1;
            char what[96];
            snprintf(what, sizeof what, "%s seed %d, cache vs no cache (GPU)",
                     kind == PEAKED ? "peaked" : "random", (int)seed);
            int t1 = compare_greedy(what, cached, nocache, read_trace(tn, (int)prompts.size()));
            snprintf(what, sizeof what, "%s seed %d, GPU (cache) vs CPU fp32",
                     kind == PEAKED ? "peaked" : "random", (int)seed);
            int t2 = compare_greedy(what, cached, cpu, read_trace(tc, (int)prompts.size()));
            ties_nc[k] += t1, ties_cpu[k] += t2;
            if (kind == PEAKED) {
                int distinct = 0;
                for (auto &s : cached)
                    for (size_t j = 1; j < s.size(); j++)
                        distinct += s[j] != s[0];
                check_true("peaked model: equal tokens outright, and varied ones",
                           t1 == 0 && t2 == 0 && distinct > 40);
            }
            runs++;
            fclose(tn);
            fclose(tc);
        }
    }
    printf("greedy near-tie divergences over %d runs x 4 sequences x 40 tokens: peaked %d (cache "
           "vs no cache) %d (GPU vs CPU); random x5 %d and %d\n",
           runs / 2, ties_nc[0], ties_cpu[0], ties_nc[1], ties_cpu[1]);
}

// ---- (c) sampling ----

static void test_sampling(void) {
    dsc_gpt2_config c = {2, 4, 256, 512, 128, false, NULL};
    host_model m = make_model(c, 21, RANDOM5);
    std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {40, 50, 60, 70, 80, 90, 100}};
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0.9f, o.top_k = 20, o.top_p = 0.95f, o.seed = 77, o.max_new_tokens = 24;
    auto a = generate(dsc_generate_run_cuda, m, prompts, o, NULL);
    auto b = generate(dsc_generate_run_cuda, m, prompts, o, NULL);
    o.seed = 78;
    auto d = generate(dsc_generate_run_cuda, m, prompts, o, NULL);
    o.seed = 77;
    check_true("sampling on the GPU: the same seed repeats", a == b);
    check_true("sampling on the GPU: another seed differs", a != d);

    // the same choices by hand: the decoder's logits, dsc__sample with the CPU's streams
    int n = (int)prompts.size(), V = c.vocab_size, L = 0;
    for (auto &q : prompts)
        L = std::max(L, (int)q.size() + o.max_new_tokens);
    dsc_gpt2_decode_weights *w = NULL;
    DS(dsc_gpt2_decode_weights_upload(&w, &c, (const float *const *)m.p.data(), NULL));
    const uint16_t *const *params = dsc_gpt2_decode_weights_params(w);
    dsc_gpt2_decode *dec = make_decoder(c, n, L, false, false);
    std::vector<std::vector<int32_t>> seq = prompts, mine(n);
    std::vector<uint64_t> rng(n);
    for (int i = 0; i < n; i++)
        rng[i] = dsc__sample_stream(o.seed, i);
    std::vector<float> logits((size_t)n * V), scratch(2 * (size_t)V);
    std::vector<const int32_t *> rows = {seq[0].data(), seq[1].data()};
    std::vector<int> lens = {(int)seq[0].size(), (int)seq[1].size()};
    DS(dsc_gpt2_decode_prefill(dec, params, rows.data(), lens.data(), n));
    for (int k = 0; k < o.max_new_tokens; k++) {
        DS(dsc_gpt2_decode_logits(dec, logits.data()));
        std::vector<int32_t> tok(n), pos(n);
        for (int i = 0; i < n; i++) {
            tok[i] = dsc__sample(logits.data() + (size_t)i * V, V, &o, &rng[i], scratch.data(),
                                 NULL);
            mine[i].push_back(tok[i]);
            pos[i] = (int)seq[i].size();
            seq[i].push_back(tok[i]);
        }
        if (k + 1 < o.max_new_tokens)
            DS(dsc_gpt2_decode_step(dec, params, tok.data(), pos.data(), n));
    }
    check_true("sampling on the GPU == dsc__sample over the decoder's logits (CPU seed streams)",
               mine == a);
    dsc_gpt2_decode_destroy(dec);
    dsc_gpt2_decode_weights_destroy(w);
}

// ---- bench ----

static int bench(const char *spec, int B, int P, int N) {
    dsc_gpt2_config c;
    DS(dsc_gpt2_config_parse(spec, 50257, 1024, &c));
    host_model m;
    m.c = c;
    int nt = dsc_gpt2_num_tensors(&c);
    m.t.resize(nt);
    for (int i = 0; i < nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&c, i, &ti);
        m.t[i].assign((size_t)ti.numel, 0.0f);
        m.p.push_back(m.t[i].data());
    }
    dsc_gpt2_init_weights(&c, m.p.data(), 42);
    dsc_gpt2_decode_weights *w = NULL;
    DS(dsc_gpt2_decode_weights_upload(&w, &c, (const float *const *)m.p.data(), NULL));
    const uint16_t *const *params = dsc_gpt2_decode_weights_params(w);
    std::vector<std::vector<int32_t>> seqs(B);
    for (auto &s : seqs)
        for (int t = 0; t < P; t++)
            s.push_back((int32_t)(rng_next() % c.vocab_size));
    std::vector<const int32_t *> rows;
    for (auto &s : seqs)
        rows.push_back(s.data());
    std::vector<int> lens(B, P);
    for (int no_graph = 0; no_graph < 2; no_graph++) {
        dsc_gpt2_decode *d = make_decoder(c, B, P + N, false, no_graph);
        std::vector<int32_t> tok(B), pos(B);
        double pre = 0, dec = 0;
        for (int rep = 0; rep < 2; rep++) { // the first is a warm-up
            double t0 = dsc_now();
            DS(dsc_gpt2_decode_prefill(d, params, rows.data(), lens.data(), B));
            DS(dsc_gpt2_decode_argmax(d, tok.data()));
            double t1 = dsc_now();
            for (int k = 0; k + 1 < N; k++) {
                for (int b = 0; b < B; b++)
                    pos[b] = P + k;
                DS(dsc_gpt2_decode_step(d, params, tok.data(), pos.data(), B));
                DS(dsc_gpt2_decode_argmax(d, tok.data()));
            }
            pre = t1 - t0, dec = dsc_now() - t1;
        }
        printf("bench decode %s B=%d prompt %d new %d%s: prefill %.2f ms, step %.3f ms "
               "(%.0f tokens/s decode, %.0f tokens/s with the prefill), graph replays %ld\n",
               spec, B, P, N, no_graph ? " (no graph)" : "", pre * 1e3, dec * 1e3 / (N - 1),
               B * (N - 1) / dec, B * N / (pre + dec), dsc_gpt2_decode_graph_replays(d));
        dsc_gpt2_decode_destroy(d);
    }
    dsc_gpt2_decode_weights_destroy(w);
    return finish("bench_decode");
}

int main(int argc, char **argv) {
    require_device("test_cuda_decode");
    if (argc >= 6 && strcmp(argv[1], "--bench") == 0)
        return bench(argv[2], (int)strtol(argv[3], NULL, 10), (int)strtol(argv[4], NULL, 10),
                     (int)strtol(argv[5], NULL, 10));
    test_logits();
    test_greedy();
    test_sampling();
    return finish("test_cuda_decode");
}
