// Causal flash attention on the GPU (cuda/attention.h) against a float64 reference written here,
// with bf16 and with fp16 operands: forward output (bf16 1e-2, fp16 2e-3), lse (fp32, 1e-5), and
// the backward's dq, dk, dv (16-bit operands through two tile products each: bf16 2e-2, fp16
// 5e-3; a peaked softmax 5e-2 and 1e-2), at lengths that are and are not multiples of the tile;
// the backward is checked to be bitwise repeatable. Then timings at GPT-2 124M's shape.
//
// Grouped-query attention (dsc__cuda_gqa_*) the same way against its own float64 reference
// (query head h reads kv head h / (NH / NKV); a kv head's dK, dV sum its query heads), at
// SmolLM2-360M's 15 / 5 heads, multi-query 8 / 1, 4 / 2 and NKV == NH, with T = 1, 63, 200 and
// 2048, head size 64 and (Llama 3.2 3B's 24 / 8 heads and others) 128; both passes run twice with
// bitwise equal results, NKV == NH gives the GPT-2 calls' bits, bad shapes are refused by name;
// then timings at SmolLM2-360M's heads and Llama 3.1 8B's (head size 64, beside the GPT-2 layout
// with as many heads) and at Llama 3.2 3B's and 3.1 8B's (head size 128).
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn, to_16

#include <math.h>   // exp, log, sqrt
#include <string.h> // memcmp, strstr

extern "C" {
#include "cuda/attention.h" // dsc__cuda_attention_*
}

#define HS 64
#define TOL_FWD 1e-2
#define TOL_BWD 2e-2
#define TOL_PEAKED 5e-2
#define TOL_F32 1e-5
// fp16 keeps 11 significant bits to bf16's 8
#define TOL_FWD_F16 2e-3
#define TOL_BWD_F16 5e-3
#define TOL_PEAKED_F16 1e-2

// Reference for one (b, h): y (T, HS), lse (T), and given dy, dq dk dv (T, HS) each.
static void ref_bh(const std::vector<float> &qkv, const std::vector<float> &dy, int b, int h, int T,
                   int C, std::vector<double> &y, std::vector<double> &lse,
                   std::vector<double> &dqkv) {
    size_t C3 = 3 * (size_t)C;
    auto q = [&](int t, int d) { return (double)qkv[((size_t)b * T + t) * C3 + h * HS + d]; };
    auto k = [&](int t, int d) { return (double)qkv[((size_t)b * T + t) * C3 + C + h * HS + d]; };
    auto v = [&](int t, int d) {
        return (double)qkv[((size_t)b * T + t) * C3 + 2 * C + h * HS + d];
    };
    auto g = [&](int t, int d) { return (double)dy[((size_t)b * T + t) * C + h * HS + d]; };
    double scale = 1.0 / sqrt((double)HS);
    std::vector<double> P(T), dP(T);
    for (int t = 0; t < T; t++) {
        double m = -INFINITY;
        for (int s = 0; s <= t; s++) {
            double a = 0;
            for (int d = 0; d < HS; d++)
                a += q(t, d) * k(s, d);
            P[s] = a * scale;
            m = P[s] > m ? P[s] : m;
        }
        double sum = 0;
        for (int s = 0; s <= t; s++)
            sum += (P[s] = exp(P[s] - m));
        for (int s = 0; s <= t; s++)
            P[s] /= sum;
        lse[t] = m + log(sum);
        for (int d = 0; d < HS; d++) {
            double a = 0;
            for (int s = 0; s <= t; s++)
                a += P[s] * v(s, d);
            y[(size_t)t * HS + d] = a;
        }
        // backward of row t: dP = dy v^T, dS = P (dP - sum P dP)
        double dot = 0;
        for (int s = 0; s <= t; s++) {
            double a = 0;
            for (int d = 0; d < HS; d++)
                a += g(t, d) * v(s, d);
            dP[s] = a;
            dot += P[s] * a;
        }
        for (int s = 0; s <= t; s++) {
            double ds = P[s] * (dP[s] - dot);
            for (int d = 0; d < HS; d++) {
                dqkv[((size_t)t * 3 + 0) * HS + d] += ds * k(s, d) * scale;
                dqkv[((size_t)s * 3 + 1) * HS + d] += ds * q(t, d) * scale;
                dqkv[((size_t)s * 3 + 2) * HS + d] += P[s] * g(t, d);
            }
        }
    }
}

static void test_attention(int B, int T, int NH, double qscale, bool peaked, bool f16) {
    int C = NH * HS;
    size_t C3 = 3 * (size_t)C;
    double tol_fwd = f16 ? TOL_FWD_F16 : TOL_FWD;
    double tol_bwd = peaked ? (f16 ? TOL_PEAKED_F16 : TOL_PEAKED) : (f16 ? TOL_BWD_F16 : TOL_BWD);
    std::vector<float> qkv = randn((size_t)B * T * C3, qscale), dy = randn((size_t)B * T * C, 1.0);
    std::vector<uint16_t> qkv16 = to_16(qkv, f16), dy16 = to_16(dy, f16);
    uint16_t *d_qkv = dev_upload(qkv16), *d_dy = dev_upload(dy16);
    uint16_t *d_out = dev_alloc<uint16_t>((size_t)B * T * C),
             *d_dqkv = dev_alloc<uint16_t>((size_t)B * T * C3);
    float *d_lse = dev_alloc<float>((size_t)B * NH * T);
    float *d_scr = dev_alloc<float>(dsc__cuda_attention_backward_scratch(B, T, NH));
    DS(dsc__cuda_attention_forward_h(d_out, d_lse, d_qkv, B, T, C, NH, f16, NULL));
    DS(dsc__cuda_attention_backward_h(d_dqkv, d_scr, NULL, d_dy, d_qkv, d_out, d_lse, B, T, C, NH,
                                      f16, NULL));
    SYNC();
    std::vector<float> out = from_16(dev_download(d_out, (size_t)B * T * C), f16);
    std::vector<float> lse = dev_download(d_lse, (size_t)B * NH * T);
    std::vector<uint16_t> dq16 = dev_download(d_dqkv, (size_t)B * T * C3);
    std::vector<float> dq = from_16(dq16, f16);
    // gather the reference into the device layouts
    std::vector<double> ry((size_t)B * T * C), rl((size_t)B * NH * T), rd((size_t)B * T * C3);
    std::vector<double> y((size_t)T * HS), l(T), d((size_t)T * 3 * HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            std::fill(d.begin(), d.end(), 0.0);
            ref_bh(qkv, dy, b, h, T, C, y, l, d);
            for (int t = 0; t < T; t++) {
                rl[((size_t)b * NH + h) * T + t] = l[t];
                for (int e = 0; e < HS; e++) {
                    ry[((size_t)b * T + t) * C + h * HS + e] = y[(size_t)t * HS + e];
                    for (int part = 0; part < 3; part++)
                        rd[((size_t)b * T + t) * C3 + part * C + h * HS + e] =
                            d[((size_t)t * 3 + part) * HS + e];
                }
            }
        }
    char name[128];
    snprintf(name, sizeof name, "attention forward out (B %d T %d NH %d, q x%.0f)%s", B, T, NH,
             qscale, type_tag(f16));
    check(name, rel_err(out.data(), ry.data(), ry.size()), tol_fwd);
    snprintf(name, sizeof name, "attention forward lse%s", type_tag(f16));
    check(name, rel_err(lse.data(), rl.data(), rl.size()), TOL_F32);
    // dq, dk, dv separately: each is its own kernel path
    for (int part = 0; part < 3; part++) {
        std::vector<float> g;
        std::vector<double> r;
        for (size_t bt = 0; bt < (size_t)B * T; bt++)
            for (int c = 0; c < C; c++) {
                g.push_back(dq[bt * C3 + part * C + c]);
                r.push_back(rd[bt * C3 + part * C + c]);
            }
        snprintf(name, sizeof name, "attention backward d%c%s", "qkv"[part], type_tag(f16));
        check(name, rel_err(g.data(), r.data(), r.size()), tol_bwd);
    }
    // again, with the column sums per 64 rows (bias_part): the same dqkv bits, and the sums of
    // exactly those stored values
    int chunks = dsc__cuda_attention_bias_chunks(B, T);
    float *d_part = dev_upload(std::vector<float>((size_t)chunks * C3, NAN));
    CK(cudaMemset(d_dqkv, 0xff, (size_t)B * T * C3 * 2));
    DS(dsc__cuda_attention_backward_h(d_dqkv, d_scr, d_part, d_dy, d_qkv, d_out, d_lse, B, T, C, NH,
                                      f16, NULL));
    SYNC();
    std::vector<uint16_t> again = dev_download(d_dqkv, (size_t)B * T * C3);
    snprintf(name, sizeof name, "attention backward is bitwise repeatable (with bias_part)%s",
             type_tag(f16));
    check_true(name, again == dq16);
    std::vector<float> part = dev_download(d_part, (size_t)chunks * C3);
    std::vector<double> rpart((size_t)chunks * C3, 0.0);
    int nt = (T + 63) / 64;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (size_t c = 0; c < C3; c++)
                rpart[((size_t)b * nt + t / 64) * C3 + c] += dq[((size_t)b * T + t) * C3 + c];
    snprintf(name, sizeof name, "attention backward bias_part (column sums of dqkv)%s",
             type_tag(f16));
    check(name, rel_err(part.data(), rpart.data(), rpart.size()), TOL_F32);
    cudaFree(d_part);
    cudaFree(d_qkv), cudaFree(d_dy), cudaFree(d_out), cudaFree(d_dqkv), cudaFree(d_lse),
        cudaFree(d_scr);
}

// Causal attention FLOPs: 2 products of T^2/2 x HS multiply-adds each (forward), 5 in the
// backward as counted by flash-attention papers (ours does 7: dS is recomputed for dQ).
static void time_attention(int B, int T, int NH, bool f16) {
    int C = NH * HS;
    size_t C3 = 3 * (size_t)C;
    std::vector<float> qkv = randn((size_t)B * T * C3, 1.0), dy = randn((size_t)B * T * C, 1.0);
    std::vector<uint16_t> qkv16 = to_16(qkv, f16), dy16 = to_16(dy, f16);
    uint16_t *d_qkv = dev_upload(qkv16), *d_dy = dev_upload(dy16);
    uint16_t *d_out = dev_alloc<uint16_t>((size_t)B * T * C),
             *d_dqkv = dev_alloc<uint16_t>((size_t)B * T * C3);
    float *d_lse = dev_alloc<float>((size_t)B * NH * T);
    float *d_scr = dev_alloc<float>(dsc__cuda_attention_backward_scratch(B, T, NH));
    double fwd_flops = 2.0 * 2.0 * B * NH * ((double)T * T / 2) * HS;
    double ms_f = time_ms(
        [&] { dsc__cuda_attention_forward_h(d_out, d_lse, d_qkv, B, T, C, NH, f16, NULL); }, 3, 20);
    double ms_b = time_ms(
        [&] {
            dsc__cuda_attention_backward_h(d_dqkv, d_scr, NULL, d_dy, d_qkv, d_out, d_lse, B, T, C,
                                           NH, f16, NULL);
        },
        3, 20);
    SYNC();
    const char *ty = f16 ? "fp16" : "bf16";
    printf("time attention forward  %s (B %d T %d NH %d): %.3f ms, %.1f TFLOP/s\n", ty, B, T, NH,
           ms_f, fwd_flops / ms_f / 1e9);
    printf("time attention backward %s (B %d T %d NH %d): %.3f ms, %.1f TFLOP/s (2.5x forward "
           "FLOPs counted)\n",
           ty, B, T, NH, ms_b, 2.5 * fwd_flops / ms_b / 1e9);
    cudaFree(d_qkv), cudaFree(d_dy), cudaFree(d_out), cudaFree(d_dqkv), cudaFree(d_lse),
        cudaFree(d_scr);
}

// ---- grouped-query attention ----

// The reference over the whole batch in the device layouts: qkv (B, T, (NH + 2 NKV) hs) and dy
// (B, T, NH hs) give y (B, T, NH hs), lse (B, NH, T) and dqkv (qkv's layout; zeroed here).
static void ref_gqa(const std::vector<float> &qkv, const std::vector<float> &dy, int B, int T,
                    int NH, int NKV, int hs, std::vector<double> &y, std::vector<double> &lse,
                    std::vector<double> &dqkv) {
    size_t C = (size_t)NH * hs, ld = C + 2 * (size_t)NKV * hs;
    std::fill(dqkv.begin(), dqkv.end(), 0.0);
    double scale = 1.0 / sqrt((double)hs);
    std::vector<double> P(T), dP(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t qc = (size_t)h * hs, kc = C + (size_t)(h / (NH / NKV)) * hs,
                   vc = kc + (size_t)NKV * hs, row = (size_t)b * T;
            auto at = [&](int t, size_t c) { return (double)qkv[(row + t) * ld + c]; };
            auto g = [&](int t, int d) { return (double)dy[(row + t) * C + qc + d]; };
            for (int t = 0; t < T; t++) {
                double m = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    double a = 0;
                    for (int d = 0; d < hs; d++)
                        a += at(t, qc + d) * at(s, kc + d);
                    P[s] = a * scale;
                    m = P[s] > m ? P[s] : m;
                }
                double sum = 0;
                for (int s = 0; s <= t; s++)
                    sum += (P[s] = exp(P[s] - m));
                for (int s = 0; s <= t; s++)
                    P[s] /= sum;
                lse[((size_t)b * NH + h) * T + t] = m + log(sum);
                double dot = 0;
                for (int s = 0; s <= t; s++) {
                    double a = 0;
                    for (int d = 0; d < hs; d++)
                        a += g(t, d) * at(s, vc + d);
                    dP[s] = a;
                    dot += P[s] * a;
                }
                for (int d = 0; d < hs; d++) {
                    double a = 0;
                    for (int s = 0; s <= t; s++)
                        a += P[s] * at(s, vc + d);
                    y[(row + t) * C + qc + d] = a;
                }
                for (int s = 0; s <= t; s++) {
                    double ds = P[s] * (dP[s] - dot);
                    for (int d = 0; d < hs; d++) {
                        dqkv[(row + t) * ld + qc + d] += ds * at(s, kc + d) * scale;
                        dqkv[(row + s) * ld + kc + d] += ds * at(t, qc + d) * scale;
                        dqkv[(row + s) * ld + vc + d] += P[s] * g(t, d);
                    }
                }
            }
        }
}

struct gqa_run {
    std::vector<uint16_t> out, dqkv;
    std::vector<float> lse;
};

// Forward and backward through dsc__cuda_gqa_* over freshly poisoned outputs.
static gqa_run run_gqa(const uint16_t *d_qkv, const uint16_t *d_dy, int B, int T, int NH, int NKV,
                       int hs, bool f16) {
    size_t C = (size_t)NH * hs, ld = C + 2 * (size_t)NKV * hs;
    uint16_t *d_out = dev_alloc<uint16_t>((size_t)B * T * C),
             *d_dqkv = dev_alloc<uint16_t>((size_t)B * T * ld);
    float *d_lse = dev_alloc<float>((size_t)B * NH * T);
    float *d_scr = dev_alloc<float>(dsc__cuda_gqa_backward_scratch(B, T, NH));
    DS(dsc__cuda_gqa_forward(d_out, d_lse, d_qkv, B, T, NH, NKV, hs, f16, NULL));
    DS(dsc__cuda_gqa_backward(d_dqkv, d_scr, d_dy, d_qkv, d_out, d_lse, B, T, NH, NKV, hs, f16,
                              NULL));
    SYNC();
    gqa_run r = {dev_download(d_out, (size_t)B * T * C), dev_download(d_dqkv, (size_t)B * T * ld),
                 dev_download(d_lse, (size_t)B * NH * T)};
    cudaFree(d_out), cudaFree(d_dqkv), cudaFree(d_lse), cudaFree(d_scr);
    return r;
}

static bool same_bits(const gqa_run &a, const gqa_run &b) {
    return a.out == b.out && a.dqkv == b.dqkv && a.lse.size() == b.lse.size() &&
           memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

// With NKV == NH the GPT-2 calls on the same tensors (C = NH HS, no bias sums).
static gqa_run run_gpt2(const uint16_t *d_qkv, const uint16_t *d_dy, int B, int T, int NH,
                        bool f16) {
    int C = NH * HS;
    uint16_t *d_out = dev_alloc<uint16_t>((size_t)B * T * C),
             *d_dqkv = dev_alloc<uint16_t>((size_t)B * T * 3 * C);
    float *d_lse = dev_alloc<float>((size_t)B * NH * T);
    float *d_scr = dev_alloc<float>(dsc__cuda_attention_backward_scratch(B, T, NH));
    DS(dsc__cuda_attention_forward_h(d_out, d_lse, d_qkv, B, T, C, NH, f16, NULL));
    DS(dsc__cuda_attention_backward_h(d_dqkv, d_scr, NULL, d_dy, d_qkv, d_out, d_lse, B, T, C, NH,
                                      f16, NULL));
    SYNC();
    gqa_run r = {dev_download(d_out, (size_t)B * T * C),
                 dev_download(d_dqkv, (size_t)B * T * 3 * C),
                 dev_download(d_lse, (size_t)B * NH * T)};
    cudaFree(d_out), cudaFree(d_dqkv), cudaFree(d_lse), cudaFree(d_scr);
    return r;
}

static void test_gqa(int B, int T, int NH, int NKV, int hs, bool f16) {
    size_t C = (size_t)NH * hs, ld = C + 2 * (size_t)NKV * hs;
    std::vector<float> qkv = randn((size_t)B * T * ld, 1.0), dy = randn((size_t)B * T * C, 1.0);
    std::vector<uint16_t> qkv16 = to_16(qkv, f16), dy16 = to_16(dy, f16);
    uint16_t *d_qkv = dev_upload(qkv16), *d_dy = dev_upload(dy16);
    gqa_run r = run_gqa(d_qkv, d_dy, B, T, NH, NKV, hs, f16);
    std::vector<double> ry((size_t)B * T * C), rl((size_t)B * NH * T), rd((size_t)B * T * ld);
    ref_gqa(qkv, dy, B, T, NH, NKV, hs, ry, rl, rd);
    std::vector<float> out = from_16(r.out, f16), dq = from_16(r.dqkv, f16);
    char name[160];
    snprintf(name, sizeof name, "gqa forward out (B %d T %d NH %d NKV %d HS %d)%s", B, T, NH, NKV,
             hs, type_tag(f16));
    check(name, rel_err(out.data(), ry.data(), ry.size()), f16 ? TOL_FWD_F16 : TOL_FWD);
    snprintf(name, sizeof name, "gqa forward lse%s", type_tag(f16));
    check(name, rel_err(r.lse.data(), rl.data(), rl.size()), TOL_F32);
    size_t lo[4] = {0, C, C + (size_t)NKV * hs, ld}; // q, k, v columns
    for (int part = 0; part < 3; part++) {
        std::vector<float> g;
        std::vector<double> ref;
        for (size_t bt = 0; bt < (size_t)B * T; bt++)
            for (size_t c = lo[part]; c < lo[part + 1]; c++) {
                g.push_back(dq[bt * ld + c]);
                ref.push_back(rd[bt * ld + c]);
            }
        snprintf(name, sizeof name, "gqa backward d%c%s", "qkv"[part], type_tag(f16));
        check(name, rel_err(g.data(), ref.data(), ref.size()), f16 ? TOL_BWD_F16 : TOL_BWD);
    }
    snprintf(name, sizeof name, "gqa forward and backward are bitwise repeatable%s",
             type_tag(f16));
    check_true(name, same_bits(r, run_gqa(d_qkv, d_dy, B, T, NH, NKV, hs, f16)));
    if (NKV == NH && hs == HS) {
        snprintf(name, sizeof name, "gqa with NKV == NH gives the GPT-2 calls' bits%s",
                 type_tag(f16));
        check_true(name, same_bits(r, run_gpt2(d_qkv, d_dy, B, T, NH, f16)));
    }
    cudaFree(d_qkv), cudaFree(d_dy);
}

// Shapes the kernels do not take are refused with DSC_ERR_INVALID_ARG and a sentence naming them.
static void test_gqa_refusals(void) {
    uint16_t *buf = dev_alloc<uint16_t>(1024);
    float *f = dev_alloc<float>(1024);
    struct {
        int B, NH, NKV, hs;
        const char *needle;
    } bad[] = {{1, 4, 2, 96, "HS = 96"},
               {1, 6, 4, 64, "NKV = 4"},
               {2, 40000, 40000, 64, "DSC_CUDA_ATT_MAX_BH"}};
    for (auto &c : bad) {
        dsc_status a = dsc__cuda_gqa_forward(buf, f, buf, c.B, 8, c.NH, c.NKV, c.hs, false, NULL);
        bool ok_a = a == DSC_ERR_INVALID_ARG && strstr(dsc_last_error(), c.needle);
        dsc_status b = dsc__cuda_gqa_backward(buf, f, buf, buf, buf, f, c.B, 8, c.NH, c.NKV, c.hs,
                                              false, NULL);
        bool ok_b = b == DSC_ERR_INVALID_ARG && strstr(dsc_last_error(), c.needle);
        char name[160];
        snprintf(name, sizeof name, "gqa refuses B %d NH %d NKV %d HS %d naming \"%s\"", c.B,
                 c.NH, c.NKV, c.hs, c.needle);
        check_true(name, ok_a && ok_b);
        if (!ok_b) printf("  got %s: %s\n", dsc_status_name(b), dsc_last_error());
    }
    cudaFree(buf), cudaFree(f);
}

// Forward, and forward + backward, of the GQA calls and, at head size 64, of the GPT-2 calls with
// as many query heads (TFLOP/s of the causal products: forward 4 T^2 HS NH B / 2, backward 2.5
// times that).
static void time_gqa(int B, int T, int NH, int NKV, int hs, bool f16) {
    size_t C = (size_t)NH * hs;
    std::vector<float> qkv = randn((size_t)B * T * (3 * C), 1.0), dy = randn((size_t)B * T * C, 1.0);
    std::vector<uint16_t> qkv16 = to_16(qkv, f16), dy16 = to_16(dy, f16);
    uint16_t *d_qkv = dev_upload(qkv16), *d_dy = dev_upload(dy16); // big enough for both layouts
    uint16_t *d_out = dev_alloc<uint16_t>((size_t)B * T * C),
             *d_dqkv = dev_alloc<uint16_t>((size_t)B * T * 3 * C);
    float *d_lse = dev_alloc<float>((size_t)B * NH * T);
    float *d_scr = dev_alloc<float>(dsc__cuda_gqa_backward_scratch(B, T, NH));
    double fwd_flops = 4.0 * T * (double)T * hs * NH * B / 2;
    const char *ty = f16 ? "fp16" : "bf16";
    for (int gpt2 = 0; gpt2 < (hs == HS ? 2 : 1); gpt2++) {
        auto fwd = [&] {
            if (gpt2)
                dsc__cuda_attention_forward_h(d_out, d_lse, d_qkv, B, T, (int)C, NH, f16, NULL);
            else
                dsc__cuda_gqa_forward(d_out, d_lse, d_qkv, B, T, NH, NKV, hs, f16, NULL);
        };
        auto bwd = [&] {
            if (gpt2)
                dsc__cuda_attention_backward_h(d_dqkv, d_scr, NULL, d_dy, d_qkv, d_out, d_lse, B,
                                               T, (int)C, NH, f16, NULL);
            else
                dsc__cuda_gqa_backward(d_dqkv, d_scr, d_dy, d_qkv, d_out, d_lse, B, T, NH, NKV,
                                       hs, f16, NULL);
        };
        double ms_f = time_ms(fwd, 3, 20);
        double ms_fb = time_ms(
            [&] {
                fwd();
                bwd();
            },
            3, 20);
        SYNC();
        char what[64];
        if (gpt2)
            snprintf(what, sizeof what, "gpt2 layout (B %d T %d NH %d)", B, T, NH);
        else
            snprintf(what, sizeof what, "gqa (B %d T %d NH %d NKV %d HS %d)", B, T, NH, NKV, hs);
        printf("time %s %s forward: %.3f ms, %.1f TFLOP/s; forward+backward: %.3f ms, %.1f "
               "TFLOP/s\n",
               what, ty, ms_f, fwd_flops / ms_f / 1e9, ms_fb, 3.5 * fwd_flops / ms_fb / 1e9);
    }
    cudaFree(d_qkv), cudaFree(d_dy), cudaFree(d_out), cudaFree(d_dqkv), cudaFree(d_lse),
        cudaFree(d_scr);
}

int main(void) {
    require_device("test_cuda_attention");
    bool small = small_mode();
    for (int f16 = 0; f16 < 2; f16++) {
        test_attention(2, 128, 2, 1.0, false, f16);
        test_attention(1, 100, 3, 1.0, false, f16); // T not a multiple of the 64-row tile
        test_attention(1, 37, 1, 1.0, false, f16);  // one partial tile
        if (small) continue;
        test_attention(2, 300, 2, 2.0, true, f16); // peaked softmax
        test_attention(1, 1024, 1, 1.0, false, f16);
    }
    for (int f16 = 0; f16 < 2; f16++) {
        test_gqa(2, 200, 15, 5, 64, f16); // SmolLM2-360M's heads
        test_gqa(1, 63, 8, 1, 64, f16);   // multi-query
        test_gqa(2, 1, 4, 2, 64, f16);
        test_gqa(1, 130, 3, 3, 64, f16); // GPT-2's layout
        test_gqa(1, 130, 24, 8, 128, f16); // Llama 3.2 3B's heads
        test_gqa(1, 63, 4, 1, 128, f16);
        test_gqa(2, 1, 4, 2, 128, f16);
        test_gqa(1, 100, 2, 2, 128, f16);
        if (small) continue;
        test_gqa(1, 2048, 4, 2, 64, f16);
        test_gqa(1, 2048, 4, 1, 128, f16);
    }
    test_gqa_refusals();
    if (!small) {
        time_attention(16, 1024, 12, false);
        time_attention(16, 1024, 12, true);
        time_gqa(8, 2048, 15, 5, 64, false);
        time_gqa(4, 2048, 32, 8, 64, false);
        time_gqa(4, 2048, 24, 8, 128, false); // Llama 3.2 3B
        time_gqa(4, 2048, 32, 8, 128, false); // Llama 3.1 8B
    }
    return finish("test_cuda_attention");
}
