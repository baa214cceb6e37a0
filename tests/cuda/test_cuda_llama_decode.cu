// The Llama family's GPU decoder (model/llama/llama_decode.h) against the CPU model's cached
// inference (model/llama/infer.h, fp32, the rows of dsc_model_infer) on small random
// configurations: grouped-query (4 query heads over 2 kv heads, llama3 rope scaling), multi-query
// (1 kv head, untied head), Qwen2's q/k/v biases, and head_dim 128 with q columns != hidden. Three
// sequences with prompts of 5, 150 and 77 tokens (ragged rows) go through a prefill and then 6
// steps; every pass's logits (fp32) must agree with the CPU's within bf16 tolerance (both see the
// same bf16-rounded weights), the device's argmax must equal the host's over the device's logits
// (the lowest id on ties), the recompute mode (no cache reuse) must agree with the cached decoder,
// a second prefill of other lengths on the same decoder must be right again, and two runs must be
// bitwise equal. Then the same through the model interface (dsc_model_decode_* against
// dsc_model_infer on a llama-d2), the cache's size, and clear errors for bad input.
#include "cuda_test.h" // require_device, check, rel_err, to_bf16

#include <algorithm> // std::max

extern "C" {
#include "model/llama/llama_decode.h" // dsc_llama_decode_*
#include "dsc/model.h"                // dsc_model_* (the interface)
#include "model/llama/infer.h"        // dsc__llama_kv_*, dsc__llama_infer (CPU reference)
#include "model/llama/llama.h"        // dsc_llama_*
}

#define TOL_LOGITS 2e-2 // relative, all rows of a pass; bf16 activations give about 1e-2
#define TOL_RECOMPUTE 1e-2

typedef struct shape {
    const char *name;
    int n_head, n_kv_head, head_dim, hidden, tied, qkv_bias, rope;
    int qk_norm; // Qwen3's per-head q/k norms
} shape;

static dsc_llama_config config_of(const shape &s) {
    dsc_llama_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = 2, c.n_head = s.n_head, c.n_kv_head = s.n_kv_head, c.head_dim = s.head_dim;
    c.hidden = s.hidden, c.intermediate = 320, c.vocab_size = 1000, c.max_seq_len = 256;
    c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.tied = s.tied, c.qkv_bias = s.qkv_bias;
    c.rope_scaling = s.rope, c.qk_norm = s.qk_norm;
    if (s.rope == DSC_LLAMA_ROPE_LLAMA3) {
        c.rope_factor = 8.0, c.rope_low_freq_factor = 1.0, c.rope_high_freq_factor = 4.0;
        c.rope_original_max_pos = 64;
    }
    return c;
}

// Weights: the family's init plus noise 0.05 (norms and biases away from 1 and 0), rounded to
// bf16 for both sides.
struct weights {
    std::vector<std::vector<float>> t;
    std::vector<float *> host;
    std::vector<uint16_t *> dev;
    std::vector<const uint16_t *> params;
    weights(const dsc_llama_config &c, uint64_t seed) {
        int nt = dsc_llama_num_tensors(&c);
        t.resize(nt);
        for (int i = 0; i < nt; i++) {
            dsc_llama_tensor_info ti;
            dsc_llama_tensor_info_get(&c, i, &ti);
            t[i].assign((size_t)ti.numel, 0.0f);
            host.push_back(t[i].data());
        }
        dsc_llama_init_weights(&c, host.data(), seed);
        for (int i = 0; i < nt; i++) {
            dsc_llama_tensor_info ti;
            dsc_llama_tensor_info_get(&c, i, &ti);
            for (float &x : t[i])
                x += (float)(0.05 * normal());
            std::vector<uint16_t> b = to_bf16(t[i]);
            dev.push_back(dev_upload(b));
            params.push_back(dev.back());
        }
    }
    ~weights() {
        for (uint16_t *p : dev)
            cudaFree(p);
    }
};

// The CPU's logits of one pass: rows (b, t) for t in [from[b], upto[b]], outputs the last row
// of each sequence.
static std::vector<float> cpu_pass(dsc_llama_kv *kv, const weights &w,
                                   const std::vector<std::vector<int32_t>> &seqs,
                                   const std::vector<int> &from, const std::vector<int> &upto,
                                   int V) {
    std::vector<int32_t> seq, pos, tok, out;
    for (size_t b = 0; b < from.size(); b++) {
        for (int t = from[b]; t <= upto[b]; t++)
            seq.push_back((int32_t)b), pos.push_back(t), tok.push_back(seqs[b][t]);
        out.push_back((int32_t)tok.size() - 1);
    }
    dsc_model_rows r = {(int)tok.size(), seq.data(), pos.data(), tok.data(), (int)out.size(),
                        out.data()};
    std::vector<float> logits(out.size() * (size_t)V);
    DS(dsc__llama_infer(kv, (float *const *)w.host.data(), NULL, &r, NULL, logits.data()));
    return logits;
}

static int host_argmax(const float *l, int V) { // dsc__sample's greedy rule
    int best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

struct pass_result {
    std::vector<float> logits;
    std::vector<int32_t> chosen;
};

// A prefill of lens, then `steps` steps feeding seqs[b][lens[b] + k] at that position.
static std::vector<pass_result> run_gpu(dsc_llama_decode *d, const weights &w,
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
        DS(dsc_llama_decode_argmax(d, r.chosen.data()));
        DS(dsc_llama_decode_logits(d, r.logits.data()));
        out.push_back(r);
    };
    DS(dsc_llama_decode_prefill(d, w.params.data(), rows.data(), lens.data(), n));
    collect();
    for (int k = 0; k < steps; k++) {
        std::vector<int32_t> tok(n), pos(n);
        for (int b = 0; b < n; b++)
            pos[b] = lens[b] + k, tok[b] = seqs[b][pos[b]];
        DS(dsc_llama_decode_step(d, w.params.data(), tok.data(), pos.data(), n));
        collect();
    }
    return out;
}

static std::vector<std::vector<float>> run_cpu(const dsc_llama_config &c, const weights &w,
                                               const std::vector<std::vector<int32_t>> &seqs,
                                               const std::vector<int> &lens, int steps) {
    int n = (int)lens.size();
    dsc_llama_kv *kv = NULL;
    DS(dsc__llama_kv_create(&kv, &c, 1, n, c.max_seq_len));
    std::vector<std::vector<float>> out;
    std::vector<int> from(n, 0), upto(n);
    for (int b = 0; b < n; b++)
        upto[b] = lens[b] - 1;
    out.push_back(cpu_pass(kv, w, seqs, from, upto, c.vocab_size));
    for (int k = 0; k < steps; k++) {
        for (int b = 0; b < n; b++)
            from[b] = upto[b] = lens[b] + k;
        out.push_back(cpu_pass(kv, w, seqs, from, upto, c.vocab_size));
    }
    dsc__llama_kv_destroy(kv);
    return out;
}

static dsc_llama_decode *make(const dsc_llama_config &c, int B, bool recompute) {
    dsc_model_decode_opts o = {};
    o.batch = B, o.max_len = c.max_seq_len, o.recompute = recompute;
    dsc_llama_decode *d = NULL;
    DS(dsc_llama_decode_create(&d, &c, &o));
    return d;
}

static void test_shape(const shape &s) {
    dsc_llama_config c = config_of(s);
    int V = c.vocab_size, steps = 6;
    weights w(c, 77);
    std::vector<int> lens = {5, 150, 77};
    int n = (int)lens.size();
    std::vector<std::vector<int32_t>> seqs(n);
    for (int b = 0; b < n; b++)
        for (int t = 0; t < lens[b] + steps; t++)
            seqs[b].push_back((int32_t)(rng_next() % (uint64_t)V));
    std::vector<std::vector<float>> ref = run_cpu(c, w, seqs, lens, steps);
    dsc_llama_decode *d = make(c, n, false), *dr = make(c, n, true);
    std::vector<pass_result> got = run_gpu(d, w, seqs, lens, steps, V);
    std::vector<pass_result> again = run_gpu(d, w, seqs, lens, steps, V);
    std::vector<pass_result> rec = run_gpu(dr, w, seqs, lens, steps, V);
    double worst = 0, worst_rec = 0;
    bool argmax_ok = true, bitwise = true;
    for (size_t k = 0; k < got.size(); k++) {
        worst = std::max(worst, rel_err(got[k].logits.data(), ref[k].data(), ref[k].size()));
        worst_rec = std::max(worst_rec, rel_err(rec[k].logits.data(), got[k].logits.data(),
                                                got[k].logits.size()));
        for (int b = 0; b < n; b++)
            argmax_ok &= got[k].chosen[b] == host_argmax(got[k].logits.data() + (size_t)b * V, V);
        bitwise &= got[k].logits == again[k].logits && got[k].chosen == again[k].chosen;
    }
    char name[160];
    snprintf(name, sizeof name, "%s: prefill + %d steps vs CPU", s.name, steps);
    check(name, worst, TOL_LOGITS);
    snprintf(name, sizeof name, "%s: recompute vs cache", s.name);
    check(name, worst_rec, TOL_RECOMPUTE);
    snprintf(name, sizeof name, "%s: device argmax == host argmax of its logits", s.name);
    check_true(name, argmax_ok);
    snprintf(name, sizeof name, "%s: a second run is bitwise the first", s.name);
    check_true(name, bitwise);
    // a second prefill of other lengths (fewer rows than the slab holds) on the same decoder
    std::vector<int> lens2 = {3, 40}; // within the tokens drawn: 5 + 6 and 150 + 6
    std::vector<std::vector<int32_t>> seqs2(seqs.begin(), seqs.begin() + 2);
    std::vector<std::vector<float>> ref2 = run_cpu(c, w, seqs2, lens2, 2);
    std::vector<pass_result> got2 = run_gpu(d, w, seqs2, lens2, 2, V);
    double worst2 = 0;
    for (size_t k = 0; k < got2.size(); k++)
        worst2 = std::max(worst2, rel_err(got2[k].logits.data(), ref2[k].data(), ref2[k].size()));
    snprintf(name, sizeof name, "%s: a second prefill (2 rows, other lengths)", s.name);
    check(name, worst2, TOL_LOGITS);
    dsc_llama_decode_destroy(d);
    dsc_llama_decode_destroy(dr);
}

// Through the model interface: dsc_model_decode_* on a llama-d2 against dsc_model_infer.
static void test_interface(void) {
    dsc_model_opts mo = {300, 64, 0};
    dsc_model *m = NULL;
    DS(dsc_model_create(&m, "llama-d2", &mo));
    check_true("llama-d2 has a GPU decoder (dsc_model_has_decode)", dsc_model_has_decode(m));
    const dsc_model_info *info = dsc_model_describe(m);
    int nt = info->num_tensors, V = info->vocab_size;
    std::vector<std::vector<float>> t(nt);
    std::vector<float *> host(nt);
    std::vector<const uint16_t *> dev(nt);
    for (int i = 0; i < nt; i++) {
        t[i].assign((size_t)dsc_model_param_get(m, i)->numel, 0.0f);
        host[i] = t[i].data();
    }
    dsc_model_init_weights(m, host.data(), 5);
    for (int i = 0; i < nt; i++) {
        std::vector<uint16_t> b = to_bf16(t[i]);
        dev[i] = dev_upload(b);
    }
    std::vector<int32_t> p0 = {1, 2, 3, 4, 5, 6, 7}, p1 = {9, 8};
    const int32_t *prompts[] = {p0.data(), p1.data()};
    int lens[] = {7, 2};
    dsc_model_decode_opts o = {};
    o.batch = 2, o.max_len = 64;
    dsc_model_decode *d = NULL;
    DS(dsc_model_decode_create(&d, m, &o));
    DS(dsc_model_decode_prefill(d, dev.data(), prompts, lens, 2));
    std::vector<float> got(2 * (size_t)V), ref(2 * (size_t)V);
    DS(dsc_model_decode_logits(d, got.data()));
    int32_t tok[2] = {11, 12}, pos[2] = {7, 2};
    DS(dsc_model_decode_step(d, dev.data(), tok, pos, 2));
    std::vector<float> got_step(2 * (size_t)V), ref_step(2 * (size_t)V);
    DS(dsc_model_decode_logits(d, got_step.data()));
    dsc_model_kv *kv = NULL;
    DS(dsc_model_kv_create(&kv, m, 1, 2, 64));
    std::vector<int32_t> seq, rpos, rtok;
    for (int b = 0; b < 2; b++)
        for (int k = 0; k < lens[b]; k++)
            seq.push_back(b), rpos.push_back(k), rtok.push_back(prompts[b][k]);
    int32_t out[2] = {lens[0] - 1, lens[0] + lens[1] - 1};
    dsc_model_rows r = {(int)rtok.size(), seq.data(), rpos.data(), rtok.data(), 2, out};
    DS(dsc_model_infer(m, kv, host.data(), NULL, &r, NULL, ref.data()));
    int32_t sseq[2] = {0, 1}, sout[2] = {0, 1};
    dsc_model_rows rs = {2, sseq, pos, tok, 2, sout};
    DS(dsc_model_infer(m, kv, host.data(), NULL, &rs, NULL, ref_step.data()));
    check("interface: llama-d2 prefill vs dsc_model_infer", rel_err(got.data(), ref.data(),
                                                                     got.size()), TOL_LOGITS);
    check("interface: llama-d2 step vs dsc_model_infer",
          rel_err(got_step.data(), ref_step.data(), got_step.size()), TOL_LOGITS);
    check_true("interface: kv bytes = L x 2 x B x len x NKV x hd x 2",
               dsc_model_decode_kv_bytes(m, 2, 64) == (size_t)2 * 2 * 2 * 64 * 1 * 64 * 2);
    check_true("interface: no graph replays", dsc_model_decode_graph_replays(d) == 0);
    dsc_model_decode_destroy(d);
    dsc_model_kv_destroy(kv);
    for (const uint16_t *p : dev)
        cudaFree((void *)p);
    dsc_model_destroy(m);
}

static void test_errors(void) {
    shape s = {"gqa", 4, 2, 64, 256, 1, 0, DSC_LLAMA_ROPE_NONE, 0};
    dsc_llama_config c = config_of(s);
    check_true("kv bytes: 2 layers x 2 x 3 rows x 256 positions x 2 kv heads x 64 x 2 bytes",
               dsc_llama_decode_kv_bytes(&c, 3, 256) == (size_t)2 * 2 * 3 * 256 * 2 * 64 * 2);
    weights w(c, 3);
    dsc_llama_decode *d = make(c, 2, false);
    int32_t zero = 0, bad_tok = c.vocab_size, far = c.max_seq_len;
    check_true("a token outside the vocabulary is refused",
               dsc_llama_decode_step(d, w.params.data(), &bad_tok, &zero, 1) ==
                   DSC_ERR_INVALID_ARG);
    check_true("a position outside the cache is refused",
               dsc_llama_decode_step(d, w.params.data(), &zero, &far, 1) == DSC_ERR_INVALID_ARG);
    check_true("more rows than the decoder holds are refused",
               dsc_llama_decode_step(d, w.params.data(), &zero, &zero, 3) == DSC_ERR_INVALID_ARG);
    int32_t chosen[2];
    check_true("argmax before any pass is refused",
               dsc_llama_decode_argmax(d, chosen) == DSC_ERR_INVALID_ARG);
    dsc_llama_decode_destroy(d);
    dsc_llama_config odd = c;
    odd.head_dim = 32, odd.hidden = 128;
    dsc_model_decode_opts o = {};
    o.batch = 1, o.max_len = 16;
    dsc_llama_decode *bad = NULL;
    dsc_status st = dsc_llama_decode_create(&bad, &odd, &o);
    check_true("head_dim 32 is refused, naming head_dim",
               st == DSC_ERR_INVALID_ARG && strstr(dsc_last_error(), "head_dim 32") && !bad);
}

int main(int argc, char **argv) {
    require_device(argv[0]);
    (void)argc;
    g_rng = g_seed;
    const shape shapes[] = {
        {"gqa 4/2 heads, llama3 rope", 4, 2, 64, 256, 1, 0, DSC_LLAMA_ROPE_LLAMA3, 0},
        {"mqa 4/1 heads, untied", 4, 1, 64, 256, 0, 0, DSC_LLAMA_ROPE_NONE, 0},
        {"qwen2 q/k/v biases", 4, 2, 64, 256, 0, 1, DSC_LLAMA_ROPE_NONE, 0},
        {"head_dim 128, 2/1 heads, hidden 192", 2, 1, 128, 192, 1, 0, DSC_LLAMA_ROPE_NONE, 0},
        {"qwen3 q/k norms, 4/2 heads of 128, hidden 256", 4, 2, 128, 256, 1, 0,
         DSC_LLAMA_ROPE_NONE, 1},
        {"qwen3 q/k norms, 4/1 heads of 64, untied", 4, 1, 64, 256, 0, 0, DSC_LLAMA_ROPE_NONE, 1},
    };
    for (const shape &s : shapes)
        test_shape(s);
    test_interface();
    test_errors();
    return finish(argv[0]);
}
