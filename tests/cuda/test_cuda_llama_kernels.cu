// GPU kernels of the Llama-family layers (model/llama/llama_kernels.h) against the CPU kernels of
// model/llama/kernels.h fed the same 16-bit-rounded inputs, once with bf16 tensors and once with
// fp16 ones. Tolerances (relative L2 over the tensor): bf16 results 1e-2, fp16 results 2e-3, fp32
// results (rstd, parameter gradients) 1e-5; embedding rows are copied bit for bit. Output buffers
// are poisoned (NaN bits) first, so an element a kernel forgets to write fails its check. Odd row
// counts, position ids that restart mid-row (packed sequences), rope's inverse as the round trip,
// parameter gradients bitwise repeatable, add (+=) against set (=) semantics, Qwen3's q/k norms
// fused with the rotation (forward and backward), fp16 overflow to inf, and the shapes the
// kernels refuse. Then the bandwidth of each kernel at SmolLM2-360M's
// shapes (N 16384, C 960, I 2560).
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn, to_16

#include <math.h>   // sqrt
#include <stdarg.h> // va_list

extern "C" {
#include "cuda/kernels.h"              // dsc__cuda_embed_*
#include "model/llama/llama_kernels.h" // dsc__cuda_rmsnorm_*, _rope_h, ...
#include "model/llama/kernels.h"       // dsc__llama_* (the CPU reference)
}

#define TOL_BF16 1e-2
#define TOL_FP16 2e-3
#define TOL_F32 1e-5

static double tol16(bool f16) {
    return f16 ? TOL_FP16 : TOL_BF16;
}

// "name" or "name [fp16]", with printf arguments (one buffer: use it before the next call).
static const char *nm(bool f16, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static const char *nm(bool f16, const char *fmt, ...) {
    static char buf[192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof buf) snprintf(buf + n, sizeof buf - n, "%s", type_tag(f16));
    return buf;
}

template <typename T> static bool same_bits(const std::vector<T> &a, const std::vector<T> &b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

static void fill_dev(float *d, const std::vector<float> &h) {
    CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
}

static void fill_dev16(uint16_t *d, const std::vector<uint16_t> &h) {
    CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

// ---- token embeddings ----

static void test_embed(int64_t N, int C, int V, bool f16) {
    std::vector<float> emb = randn((size_t)V * C, 0.5);
    std::vector<uint16_t> emb16 = to_16(emb, f16);
    std::vector<int32_t> tok(N);
    for (int64_t i = 0; i < N; i++) // a third of the positions share token 7 (long runs)
        tok[i] = rng_next() % 3 == 0 ? 7 : (int32_t)(rng_next() % V);
    uint16_t *d_emb = dev_upload(emb16), *d_out = dev_alloc<uint16_t>((size_t)N * C);
    int32_t *d_tok = dev_upload(tok);
    DS(dsc__cuda_embed_forward_h(d_out, d_tok, d_emb, N, C, f16, NULL));
    SYNC();
    std::vector<float> ref((size_t)N * C);
    dsc__llama_embed_forward(ref.data(), tok.data(), emb.data(), N, C);
    std::vector<float> out = from_16(dev_download(d_out, (size_t)N * C), f16);
    check_true(nm(f16, "embedding forward (N %lld, C %d): rows copied bit for bit",
                  (long long)N, C),
               memcmp(out.data(), ref.data(), ref.size() * 4) == 0);

    // backward, add: demb starts from random values
    std::vector<float> dout = randn((size_t)N * C, 1.0), g0 = randn((size_t)V * C, 1.0);
    std::vector<uint16_t> dout16 = to_16(dout, f16);
    uint16_t *d_dout = dev_upload(dout16);
    float *d_g = dev_upload(g0);
    void *scratch = NULL;
    CK(cudaMalloc(&scratch, dsc__cuda_embed_backward_scratch(N, V)));
    DS(dsc__cuda_embed_backward_h(d_g, scratch, d_dout, d_tok, N, C, V, true, f16, NULL));
    SYNC();
    std::vector<float> radd = g0;
    dsc__llama_embed_backward(radd.data(), dout.data(), tok.data(), N, C);
    std::vector<float> g1 = dev_download(d_g, g0.size());
    check(nm(f16, "embedding backward (+=, skewed tokens)"),
          rel_err(g1.data(), radd.data(), radd.size()), TOL_F32);
    fill_dev(d_g, g0);
    DS(dsc__cuda_embed_backward_h(d_g, scratch, d_dout, d_tok, N, C, V, true, f16, NULL));
    SYNC();
    check_true(nm(f16, "embedding backward is bitwise repeatable"),
               same_bits(dev_download(d_g, g0.size()), g1));

    // add false: the rows of tokens in the batch are written, every other row keeps its bits
    // (NaN here: a row the kernel should have written but did not would stay NaN)
    std::vector<float> nan_g(g0.size(), NAN);
    fill_dev(d_g, nan_g);
    DS(dsc__cuda_embed_backward_h(d_g, scratch, d_dout, d_tok, N, C, V, false, f16, NULL));
    SYNC();
    std::vector<float> rset(g0.size(), 0.0f), g3 = dev_download(d_g, g0.size());
    dsc__llama_embed_backward(rset.data(), dout.data(), tok.data(), N, C);
    std::vector<char> seen(V, 0);
    for (int32_t t : tok)
        seen[t] = 1;
    std::vector<float> got_seen, ref_seen;
    bool untouched = true;
    for (int v = 0; v < V; v++) {
        const float *gr = &g3[(size_t)v * C];
        if (seen[v]) {
            got_seen.insert(got_seen.end(), gr, gr + C);
            ref_seen.insert(ref_seen.end(), &rset[(size_t)v * C], &rset[(size_t)v * C] + C);
        } else {
            untouched = untouched && memcmp(gr, &nan_g[(size_t)v * C], (size_t)C * 4) == 0;
        }
    }
    check(nm(f16, "embedding backward (=): rows of the batch's tokens"),
          rel_err(got_seen.data(), ref_seen.data(), ref_seen.size()), TOL_F32);
    check_true(nm(f16, "embedding backward (=): other rows untouched"), untouched);
    cudaFree(d_emb), cudaFree(d_out), cudaFree(d_tok), cudaFree(d_dout), cudaFree(d_g);
    cudaFree(scratch);
}

// ---- RMSNorm ----

static void test_rmsnorm(int64_t N, int C, bool f16) {
    const float eps = 1e-5f;
    size_t n = (size_t)N * C;
    std::vector<float> x = randn(n, 1.5, 0.2), w = randn(C, 0.3, 1.0);
    std::vector<uint16_t> x16 = to_16(x, f16), w16 = to_16(w, f16);
    uint16_t *d_x = dev_upload(x16), *d_w = dev_upload(w16), *d_out = dev_alloc<uint16_t>(n);
    float *d_r = dev_alloc<float>(N);
    DS(dsc__cuda_rmsnorm_forward_h(d_out, d_r, d_x, d_w, eps, N, C, f16, NULL));
    SYNC();
    std::vector<float> ref(n), rref(N);
    dsc__llama_rmsnorm_forward(ref.data(), rref.data(), x.data(), w.data(), eps, N, C);
    std::vector<float> out = from_16(dev_download(d_out, n), f16), gr = dev_download(d_r, N);
    check(nm(f16, "rmsnorm forward out (N %lld, C %d)", (long long)N, C),
          rel_err(out.data(), ref.data(), n), tol16(f16));
    check(nm(f16, "rmsnorm forward rstd (N %lld, C %d)", (long long)N, C),
          rel_err(gr.data(), rref.data(), N), TOL_F32);

    // backward from the CPU's rstd (both sides the same statistics); dx and dw start random
    std::vector<float> dy = randn(n, 1.0), dx0 = randn(n, 1.0), dw0 = randn(C, 1.0);
    std::vector<uint16_t> dy16 = to_16(dy, f16), dx16 = to_16(dx0, f16);
    uint16_t *d_dy = dev_upload(dy16), *d_dx = dev_upload(dx16);
    float *d_dw = dev_upload(dw0);
    float *d_scr = dev_alloc<float>(dsc__cuda_rmsnorm_backward_scratch(N, C));
    fill_dev(d_r, rref);
    DS(dsc__cuda_rmsnorm_backward_h(d_dx, d_dw, d_scr, d_dy, d_x, d_w, d_r, true, N, C, f16, NULL));
    SYNC();
    std::vector<float> rdx = dx0, rdw = dw0, cscr(dsc__llama_rmsnorm_scratch(N, C));
    dsc__llama_rmsnorm_backward(rdx.data(), rdw.data(), cscr.data(), dy.data(), x.data(), w.data(),
                                rref.data(), N, C);
    std::vector<uint16_t> gdx16 = dev_download(d_dx, n);
    std::vector<float> gdx = from_16(gdx16, f16), gdw = dev_download(d_dw, C);
    check(nm(f16, "rmsnorm backward dx (+=, C %d)", C), rel_err(gdx.data(), rdx.data(), n),
          tol16(f16));
    check(nm(f16, "rmsnorm backward dw (+=, C %d)", C), rel_err(gdw.data(), rdw.data(), C),
          TOL_F32);
    fill_dev16(d_dx, dx16);
    fill_dev(d_dw, dw0);
    DS(dsc__cuda_rmsnorm_backward_h(d_dx, d_dw, d_scr, d_dy, d_x, d_w, d_r, true, N, C, f16, NULL));
    SYNC();
    check_true(nm(f16, "rmsnorm backward dx, dw bitwise repeatable (C %d)", C),
               same_bits(dev_download(d_dx, n), gdx16) && same_bits(dev_download(d_dw, C), gdw));
    // add false: dw overwritten, whatever it held
    std::vector<float> nan_c(C, NAN), rdw_set(C, 0.0f), rdx2 = dx0;
    fill_dev16(d_dx, dx16);
    fill_dev(d_dw, nan_c);
    DS(dsc__cuda_rmsnorm_backward_h(d_dx, d_dw, d_scr, d_dy, d_x, d_w, d_r, false, N, C, f16,
                                    NULL));
    SYNC();
    dsc__llama_rmsnorm_backward(rdx2.data(), rdw_set.data(), cscr.data(), dy.data(), x.data(),
                                w.data(), rref.data(), N, C);
    std::vector<float> sdw = dev_download(d_dw, C);
    check(nm(f16, "rmsnorm backward dw (=, C %d)", C), rel_err(sdw.data(), rdw_set.data(), C),
          TOL_F32);
    check_true(nm(f16, "rmsnorm backward dx the same bits with dw (=)"),
               same_bits(dev_download(d_dx, n), gdx16));
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_out), cudaFree(d_r), cudaFree(d_dy), cudaFree(d_dx);
    cudaFree(d_dw), cudaFree(d_scr);
}

// ---- rotary position embeddings ----

static void test_rope(int B, int T, int NH, int NKV, int HS, bool with_pos, bool f16) {
    int nheads = NH + NKV, ld = (NH + 2 * NKV) * HS, half = HS / 2, maxT = T + 8;
    std::vector<float> ct((size_t)maxT * half), st((size_t)maxT * half);
    // Llama 3's scaled frequencies (theta 500000, factor 8, low 1, high 4, 8192 original)
    dsc__llama_rope_tables(ct.data(), st.data(), maxT, HS, 500000.0, 2, 8.0, 1.0, 4.0, 8192);
    std::vector<int32_t> pos((size_t)B * T);
    for (int b = 0; b < B; b++) { // two packed sequences a row: positions restart at cut
        int cut = 1 + (int)(rng_next() % (T - 1)), off = (int)(rng_next() % 8);
        for (int t = 0; t < T; t++)
            pos[(size_t)b * T + t] = t < cut ? t + off : t - cut;
    }
    size_t n = (size_t)B * T * ld;
    std::vector<float> x = randn(n, 1.0);
    std::vector<uint16_t> x16 = to_16(x, f16);
    uint16_t *d_x = dev_upload(x16);
    float *d_ct = dev_upload(ct), *d_st = dev_upload(st);
    int32_t *d_pos = dev_upload(pos);
    const int32_t *dp = with_pos ? d_pos : NULL;
    DS(dsc__cuda_rope_h(d_x, ld, d_ct, d_st, dp, B, T, nheads, HS, false, f16, NULL));
    SYNC();
    std::vector<float> ref = x;
    dsc__llama_rope_pos(ref.data(), ld, ct.data(), st.data(), with_pos ? pos.data() : NULL, B, T,
                        nheads, HS, 0);
    std::vector<uint16_t> y16 = dev_download(d_x, n);
    std::vector<float> y = from_16(y16, f16);
    const char *how = with_pos ? "position ids" : "positions t";
    check(nm(f16, "rope (%d+%d heads of %d, %s)", NH, NKV, HS, how),
          rel_err(y.data(), ref.data(), n), tol16(f16));
    bool v_same = true; // the v heads after the q and k ones: not touched
    for (size_t r = 0; r < (size_t)B * T; r++)
        v_same = v_same && memcmp(&y16[r * ld + (size_t)nheads * HS],
                                  &x16[r * ld + (size_t)nheads * HS], (size_t)NKV * HS * 2) == 0;
    check_true(nm(f16, "rope leaves the v heads alone"), v_same);
    // the inverse: against the CPU's inverse of the same input, and back to x
    std::vector<float> rinv = y;
    dsc__llama_rope_pos(rinv.data(), ld, ct.data(), st.data(), with_pos ? pos.data() : NULL, B, T,
                        nheads, HS, 1);
    DS(dsc__cuda_rope_h(d_x, ld, d_ct, d_st, dp, B, T, nheads, HS, true, f16, NULL));
    SYNC();
    std::vector<float> back = from_16(dev_download(d_x, n), f16);
    check(nm(f16, "rope inverse (HS %d, %s)", HS, how), rel_err(back.data(), rinv.data(), n),
          tol16(f16));
    check(nm(f16, "rope inverse(rope(x)) ~ x (HS %d)", HS), rel_err(back.data(), x.data(), n),
          tol16(f16));
    cudaFree(d_x), cudaFree(d_ct), cudaFree(d_st), cudaFree(d_pos);
}

// ---- Qwen3's q/k norms with the rotation ----

// The fused GPU pass against the CPU's two (dsc__llama_head_norm_*, then dsc__llama_rope_pos) on
// the same 16-bit inputs: the forward (raw inputs kept bitwise, rstd in fp32, v untouched), the
// backward's input gradient, and the weight gradients (+= and =, bitwise repeatable).
static void test_qk_norm(int B, int T, int NH, int NKV, int HS, bool with_pos, bool f16) {
    int nheads = NH + NKV, ld = (NH + 2 * NKV) * HS, half = HS / 2, maxT = T + 8;
    int64_t N = (int64_t)B * T;
    std::vector<float> ct((size_t)maxT * half), st((size_t)maxT * half);
    dsc__llama_rope_tables(ct.data(), st.data(), maxT, HS, 1000000.0, 0, 1.0, 1.0, 1.0, maxT);
    std::vector<int32_t> pos((size_t)N);
    for (int64_t i = 0; i < N; i++) pos[i] = (int32_t)(rng_next() % (uint64_t)maxT);
    size_t n = (size_t)N * ld;
    std::vector<float> x = randn(n, 2.0), w = randn(2 * (size_t)HS, 0.3), dy = randn(n, 1.0);
    for (float &v : w) v += 1.0f; // norm weights around 1
    // rounded in place to the 16-bit type: both sides see the same values
    std::vector<uint16_t> x16 = to_16(x, f16), w16 = to_16(w, f16), dy16 = to_16(dy, f16);
    uint16_t *d_x = dev_upload(x16), *d_w = dev_upload(w16), *d_dy = dev_upload(dy16);
    uint16_t *d_raw = dev_alloc<uint16_t>((size_t)N * nheads * HS);
    float *d_rstd = dev_alloc<float>((size_t)N * nheads), *d_dw = dev_alloc<float>(2 * HS);
    float *d_ct = dev_upload(ct), *d_st = dev_upload(st);
    float *d_scr = dev_alloc<float>(dsc__cuda_qk_norm_backward_scratch(N, HS));
    int32_t *d_pos = dev_upload(pos);
    const int32_t *dp = with_pos ? d_pos : NULL;
    const int32_t *hp = with_pos ? pos.data() : NULL;
    DS(dsc__cuda_qk_norm_rope_h(d_x, ld, d_raw, d_rstd, d_w, d_w + HS, 1e-6f, d_ct, d_st, dp, B,
                                T, NH, NKV, HS, f16, NULL));
    SYNC();
    // the CPU: norms then rotation, fp32 (raw and rstd kept for its backward)
    std::vector<float> ref = x, raw((size_t)N * nheads * HS), rstd((size_t)N * nheads);
    dsc__llama_head_norm_forward(ref.data(), ld, raw.data(), rstd.data(), w.data(),
                                 w.data() + HS, 1e-6f, N, NH, NKV, HS);
    dsc__llama_rope_pos(ref.data(), ld, ct.data(), st.data(), hp, B, T, nheads, HS, 0);
    std::vector<uint16_t> y16 = dev_download(d_x, n);
    std::vector<float> y = from_16(y16, f16);
    check(nm(f16, "q/k norm + rope (%d+%d heads of %d)", NH, NKV, HS),
          rel_err(y.data(), ref.data(), n), tol16(f16));
    std::vector<float> grstd = dev_download(d_rstd, (size_t)N * nheads);
    check(nm(f16, "q/k norm rstd (HS %d)", HS), rel_err(grstd.data(), rstd.data(), grstd.size()),
          TOL_F32);
    check_true(nm(f16, "q/k norm keeps its inputs bitwise (HS %d)", HS),
               same_bits(from_16(dev_download(d_raw, raw.size()), f16), raw));
    bool v_same = true;
    for (size_t r = 0; r < (size_t)N; r++)
        v_same = v_same && memcmp(&y16[r * ld + (size_t)nheads * HS],
                                  &x16[r * ld + (size_t)nheads * HS], (size_t)NKV * HS * 2) == 0;
    check_true(nm(f16, "q/k norm leaves the v heads alone"), v_same);
    // backward: the CPU's inverse rotation then its norm backward
    std::vector<float> dref = dy, dw(2 * (size_t)HS, 0.0f);
    std::vector<float> scr(dsc__llama_head_norm_scratch(N, HS));
    dsc__llama_rope_pos(dref.data(), ld, ct.data(), st.data(), hp, B, T, nheads, HS, 1);
    dsc__llama_head_norm_backward(dref.data(), ld, dw.data(), dw.data() + HS, scr.data(),
                                  raw.data(), rstd.data(), w.data(), w.data() + HS, N, NH, NKV,
                                  HS);
    fill_dev(d_dw, std::vector<float>(2 * (size_t)HS, 0.5f)); // overwritten (=)
    DS(dsc__cuda_qk_norm_rope_backward_h(d_dy, ld, d_dw, d_dw + HS, d_scr, d_raw, d_rstd, d_w,
                                         d_w + HS, d_ct, d_st, dp, B, T, NH, NKV, HS, false, f16,
                                         NULL));
    SYNC();
    std::vector<float> dx = from_16(dev_download(d_dy, n), f16);
    std::vector<float> gdw = dev_download(d_dw, 2 * (size_t)HS);
    check(nm(f16, "q/k norm backward dx (HS %d)", HS), rel_err(dx.data(), dref.data(), n),
          tol16(f16));
    check(nm(f16, "q/k norm backward dq_norm, dk_norm (=, HS %d)", HS),
          rel_err(gdw.data(), dw.data(), gdw.size()), TOL_F32);
    // += from the same dy: twice the weight gradient, bitwise the same sum added
    fill_dev16(d_dy, dy16);
    DS(dsc__cuda_qk_norm_rope_backward_h(d_dy, ld, d_dw, d_dw + HS, d_scr, d_raw, d_rstd, d_w,
                                         d_w + HS, d_ct, d_st, dp, B, T, NH, NKV, HS, true, f16,
                                         NULL));
    SYNC();
    std::vector<float> gdw2 = dev_download(d_dw, 2 * (size_t)HS), twice(gdw.size());
    for (size_t i = 0; i < gdw.size(); i++) twice[i] = gdw[i] + gdw[i];
    check_true(nm(f16, "q/k norm backward += adds the same sums (bitwise)"), same_bits(gdw2, twice));
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_dy), cudaFree(d_raw), cudaFree(d_rstd);
    cudaFree(d_dw), cudaFree(d_ct), cudaFree(d_st), cudaFree(d_scr), cudaFree(d_pos);
}

// ---- SwiGLU ----

static void test_swiglu(int64_t N, int I, bool f16) {
    size_t n = (size_t)N * I;
    std::vector<float> gu = randn(2 * n, 2.0), dh = randn(n, 1.0);
    std::vector<uint16_t> gu16 = to_16(gu, f16), dh16 = to_16(dh, f16);
    std::vector<float> gate(n), up(n);
    for (int64_t r = 0; r < N; r++)
        for (int i = 0; i < I; i++) {
            gate[(size_t)r * I + i] = gu[(size_t)r * 2 * I + i];
            up[(size_t)r * I + i] = gu[(size_t)r * 2 * I + I + i];
        }
    uint16_t *d_gu = dev_upload(gu16), *d_dh = dev_upload(dh16), *d_h = dev_alloc<uint16_t>(n);
    uint16_t *d_dgu = dev_alloc<uint16_t>(2 * n);
    DS(dsc__cuda_swiglu_forward_h(d_h, d_gu, N, I, f16, NULL));
    SYNC();
    std::vector<float> rh(n);
    dsc__llama_swiglu_forward(rh.data(), gate.data(), up.data(), (int64_t)n);
    std::vector<float> h = from_16(dev_download(d_h, n), f16);
    check(nm(f16, "swiglu forward (N %lld, I %d)", (long long)N, I),
          rel_err(h.data(), rh.data(), n), tol16(f16));

    DS(dsc__cuda_swiglu_backward_h(d_dgu, d_dh, d_gu, N, I, f16, NULL));
    SYNC();
    std::vector<float> dg(n), du(n), rd(2 * n);
    dsc__llama_swiglu_backward(dg.data(), du.data(), dh.data(), gate.data(), up.data(), (int64_t)n);
    for (int64_t r = 0; r < N; r++)
        for (int i = 0; i < I; i++) {
            rd[(size_t)r * 2 * I + i] = dg[(size_t)r * I + i];
            rd[(size_t)r * 2 * I + I + i] = du[(size_t)r * I + i];
        }
    std::vector<uint16_t> g16 = dev_download(d_dgu, 2 * n);
    std::vector<float> g = from_16(g16, f16);
    check(nm(f16, "swiglu backward [dgate | dup] (I %d)", I), rel_err(g.data(), rd.data(), 2 * n),
          tol16(f16));
    DS(dsc__cuda_swiglu_backward_h(d_gu, d_dh, d_gu, N, I, f16, NULL)); // in place
    SYNC();
    check_true(nm(f16, "swiglu backward in place: the same bits"),
               same_bits(dev_download(d_gu, 2 * n), g16));
    cudaFree(d_gu), cudaFree(d_dh), cudaFree(d_h), cudaFree(d_dgu);
}

// ---- fp16 overflow, refused shapes ----

static bool all_inf16(const std::vector<uint16_t> &v, size_t from, size_t step) {
    for (size_t i = from; i < v.size(); i += step)
        if ((v[i] & 0x7fff) != 0x7c00) return false;
    return true;
}

// fp16 results beyond 65504 come out as inf (never clamped), so that a too-large loss scale
// reaches the loss scaler.
static void test_fp16_overflow(void) {
    const int N = 4, I = 16, C = 64;
    std::vector<float> gu((size_t)N * 2 * I, 300.0f); // silu(300) 300 = 90000
    std::vector<uint16_t> gu16 = to_16(gu, true);
    uint16_t *d_gu = dev_upload(gu16), *d_h = dev_alloc<uint16_t>((size_t)N * I);
    DS(dsc__cuda_swiglu_forward_h(d_h, d_gu, N, I, true, NULL));
    SYNC();
    check_true("fp16 overflow: swiglu forward 300 * 300 = inf",
               all_inf16(dev_download(d_h, (size_t)N * I), 0, 1));
    std::vector<float> dh((size_t)N * I, 60000.0f), g2((size_t)N * 2 * I, 10.0f);
    std::vector<uint16_t> dh16 = to_16(dh, true), g216 = to_16(g2, true);
    uint16_t *d_dh = dev_upload(dh16), *d_g2 = dev_upload(g216);
    DS(dsc__cuda_swiglu_backward_h(d_g2, d_dh, d_g2, N, I, true, NULL)); // 60000 * 10 * ~1
    SYNC();
    check_true("fp16 overflow: swiglu backward past 65504 = inf",
               all_inf16(dev_download(d_g2, (size_t)N * 2 * I), 0, 1));
    // rmsnorm: a row (100, 0, ...) normalises to (8, 0, ...); w = 10000 makes 80000
    std::vector<float> x((size_t)N * C, 0.0f), w(C, 10000.0f);
    for (int r = 0; r < N; r++)
        x[(size_t)r * C] = 100.0f;
    std::vector<uint16_t> x16 = to_16(x, true), w16 = to_16(w, true);
    uint16_t *d_x = dev_upload(x16), *d_w = dev_upload(w16);
    uint16_t *d_o = dev_alloc<uint16_t>((size_t)N * C);
    float *d_r = dev_alloc<float>(N);
    DS(dsc__cuda_rmsnorm_forward_h(d_o, d_r, d_x, d_w, 1e-5f, N, C, true, NULL));
    SYNC();
    check_true("fp16 overflow: rmsnorm forward w (x rstd) = 80000 is inf",
               all_inf16(dev_download(d_o, (size_t)N * C), 0, C));
    // rope at 45 degrees: x2 c + x1 s = 60000 sqrt(2) = 84853
    std::vector<float> ct(8, 0.70710678f), st(8, 0.70710678f), xr(16, 60000.0f);
    std::vector<uint16_t> xr16 = to_16(xr, true);
    uint16_t *d_xr = dev_upload(xr16);
    float *d_ct = dev_upload(ct), *d_st = dev_upload(st);
    DS(dsc__cuda_rope_h(d_xr, 16, d_ct, d_st, NULL, 1, 1, 1, 16, false, true, NULL));
    SYNC();
    check_true("fp16 overflow: rope 60000 at 45 degrees is inf",
               all_inf16(dev_download(d_xr, 16), 8, 1)); // x2 c + x1 s: the second half
    cudaFree(d_gu), cudaFree(d_h), cudaFree(d_dh), cudaFree(d_g2), cudaFree(d_x), cudaFree(d_w);
    cudaFree(d_o), cudaFree(d_r), cudaFree(d_xr), cudaFree(d_ct), cudaFree(d_st);
}

static void test_refused(void) {
    uint16_t *a = dev_alloc<uint16_t>(4096), *b = dev_alloc<uint16_t>(4096);
    float *f = dev_alloc<float>(4096);
    int32_t *ids = dev_upload(std::vector<int32_t>(16, 0));
    check_true("refused: rmsnorm C = 100 (not a multiple of 8)",
               dsc__cuda_rmsnorm_forward_h(a, f, b, b, 1e-5f, 4, 100, false, NULL) ==
                   DSC_ERR_INVALID_ARG);
    check_true("refused: rope head size 24 (not a multiple of 16)",
               dsc__cuda_rope_h(a, 48, f, f, NULL, 1, 4, 2, 24, false, false, NULL) ==
                   DSC_ERR_INVALID_ARG);
    check_true("refused: rope row stride 60 (not a multiple of 8)",
               dsc__cuda_rope_h(a, 60, f, f, NULL, 1, 4, 1, 32, false, false, NULL) ==
                   DSC_ERR_INVALID_ARG);
    check_true("refused: swiglu I = 12",
               dsc__cuda_swiglu_forward_h(a, b, 4, 12, false, NULL) == DSC_ERR_INVALID_ARG);
    check_true("refused: swiglu backward on a misaligned tensor",
               dsc__cuda_swiglu_backward_h(a + 1, b, b, 4, 16, false, NULL) ==
                   DSC_ERR_INVALID_ARG);
    check_true("refused: embedding C = 0",
               dsc__cuda_embed_forward_h(a, ids, b, 16, 0, false, NULL) == DSC_ERR_INVALID_ARG);
    printf("  (last error: %s)\n", dsc_last_error());
    SYNC();
    cudaFree(a), cudaFree(b), cudaFree(f), cudaFree(ids);
}

// ---- bandwidth at SmolLM2-360M's shapes: N = 8 x 2048, C 960, I 2560, V 49152, 15 + 5 heads ----

static void report(const char *what, double ms, double bytes) {
    printf("time %-44s %8.3f ms %6.0f GB/s\n", what, ms, bytes / ms / 1e6);
}

static void time_kernels(void) {
    const int B = 8, T = 2048, C = 960, I = 2560, V = 49152, NH = 15, NKV = 5, HS = 64;
    const int64_t N = (int64_t)B * T;
    const int ld = (NH + 2 * NKV) * HS;
    size_t big = (size_t)N * 2 * I; // the largest tensor: gate | up
    std::vector<float> h = randn(big, 1.0);
    std::vector<uint16_t> h16 = to_bf16(h);
    uint16_t *d_a = dev_upload(h16), *d_b = dev_upload(h16), *d_c = dev_upload(h16);
    std::vector<float> w = randn(C, 0.1, 1.0);
    std::vector<uint16_t> w16 = to_bf16(w);
    uint16_t *d_w = dev_upload(w16), *d_emb = dev_alloc<uint16_t>((size_t)V * C);
    CK(cudaMemset(d_emb, 0x3c, (size_t)V * C * 2));
    std::vector<int32_t> tok(N);
    std::vector<char> seen(V, 0);
    size_t uniq = 0;
    for (int64_t i = 0; i < N; i++) {
        tok[i] = (int32_t)(rng_next() % V);
        uniq += !seen[tok[i]];
        seen[tok[i]] = 1;
    }
    int32_t *d_tok = dev_upload(tok);
    float *d_r = dev_alloc<float>(N), *d_demb = dev_alloc<float>((size_t)V * C),
          *d_dw = dev_alloc<float>(C),
          *d_scr = dev_alloc<float>(dsc__cuda_rmsnorm_backward_scratch(N, C));
    CK(cudaMemset(d_demb, 0, (size_t)V * C * 4));
    void *escr = NULL;
    CK(cudaMalloc(&escr, dsc__cuda_embed_backward_scratch(N, V)));
    std::vector<float> ct((size_t)T * HS / 2), st((size_t)T * HS / 2);
    dsc__llama_rope_tables(ct.data(), st.data(), T, HS, 100000.0, 0, 1.0, 1.0, 1.0, T);
    float *d_ct = dev_upload(ct), *d_st = dev_upload(st);
    double nc = (double)N * C, ni = (double)N * I, nq = (double)N * (NH + NKV) * HS;
    char what[96];
    for (int f16 = 0; f16 < 2; f16++) {
        const char *tag = f16 ? " fp16" : "";
        double ms = time_ms([&] { dsc__cuda_embed_forward_h(d_a, d_tok, d_emb, N, C, f16, NULL); },
                            3, 20);
        snprintf(what, sizeof what, "embedding forward%s (%lld x %d)", tag, (long long)N, C);
        report(what, ms, 4.0 * nc);
        ms = time_ms(
            [&] {
                dsc__cuda_embed_backward_h(d_demb, escr, d_a, d_tok, N, C, V, true, f16, NULL);
            },
            3, 20);
        snprintf(what, sizeof what, "embedding backward%s (V %d, %zu rows)", tag, V, uniq);
        report(what, ms, 2.0 * nc + 8.0 * (double)uniq * C); // dout, touched rows read + written
        ms = time_ms(
            [&] { dsc__cuda_rmsnorm_forward_h(d_b, d_r, d_a, d_w, 1e-5f, N, C, f16, NULL); }, 3,
            20);
        snprintf(what, sizeof what, "rmsnorm forward%s (%lld x %d)", tag, (long long)N, C);
        report(what, ms, 4.0 * nc);
        ms = time_ms(
            [&] {
                dsc__cuda_rmsnorm_backward_h(d_c, d_dw, d_scr, d_a, d_b, d_w, d_r, true, N, C, f16,
                                             NULL);
            },
            3, 20);
        snprintf(what, sizeof what, "rmsnorm backward%s (%lld x %d)", tag, (long long)N, C);
        report(what, ms, 8.0 * nc); // dout, x, dx read; dx written
        ms = time_ms(
            [&] {
                dsc__cuda_rope_h(d_a, ld, d_ct, d_st, NULL, B, T, NH + NKV, HS, false, f16, NULL);
            },
            3, 20);
        snprintf(what, sizeof what, "rope%s (%lld x %d+%d heads of %d)", tag, (long long)N, NH,
                 NKV, HS);
        report(what, ms, 4.0 * nq);
        ms = time_ms([&] { dsc__cuda_swiglu_forward_h(d_b, d_a, N, I, f16, NULL); }, 3, 20);
        snprintf(what, sizeof what, "swiglu forward%s (%lld x %d)", tag, (long long)N, I);
        report(what, ms, 6.0 * ni);
        ms = time_ms([&] { dsc__cuda_swiglu_backward_h(d_c, d_b, d_a, N, I, f16, NULL); }, 3, 20);
        snprintf(what, sizeof what, "swiglu backward%s (%lld x %d)", tag, (long long)N, I);
        report(what, ms, 10.0 * ni);
    }
    SYNC();
    cudaFree(d_a), cudaFree(d_b), cudaFree(d_c), cudaFree(d_w), cudaFree(d_emb), cudaFree(d_tok);
    cudaFree(d_r), cudaFree(d_demb), cudaFree(d_dw), cudaFree(d_scr), cudaFree(escr);
    cudaFree(d_ct), cudaFree(d_st);
}

int main(void) {
    require_device("test_cuda_llama_kernels");
    bool small = small_mode();
    for (int f16 = 0; f16 < 2; f16++) {
        test_embed(small ? 301 : 4097, small ? 64 : 960, small ? 500 : 5000, f16);
        test_rmsnorm(small ? 33 : 1001, 960, f16); // 3.75 chunks of 8 channels a lane
        test_rmsnorm(small ? 9 : 257, 576, f16);
        test_rmsnorm(small ? 9 : 129, 2048, f16); // the most the registers hold
        test_rmsnorm(small ? 7 : 67, 2056, f16);  // beyond: two warps a row, 5 chunks a lane
        test_rmsnorm(small ? 11 : 131, 3072, f16); // llama-3.2-3B's width
        test_rmsnorm(small ? 5 : 65, 4096, f16);  // the most two warps' registers hold
        test_rmsnorm(small ? 5 : 65, 4104, f16);  // beyond: the shared-memory kernel
        test_rope(3, small ? 21 : 37, 4, 2, 64, true, f16);
        test_rope(2, small ? 17 : 33, 15, 5, 64, true, f16); // SmolLM2-360M's heads
        test_rope(3, 19, 4, 2, 64, false, f16);
        test_rope(2, small ? 9 : 29, 8, 2, 128, true, f16);
        test_qk_norm(2, small ? 9 : 37, 16, 8, 128, true, f16); // qwen3-0.6B's heads
        test_qk_norm(3, 19, 4, 2, 64, false, f16);
        test_swiglu(small ? 7 : 33, 2560, f16);
        test_swiglu(small ? 5 : 17, 1536, f16);
    }
    test_fp16_overflow();
    test_refused();
    if (!small) time_kernels();
    return finish("test_cuda_llama_kernels");
}
