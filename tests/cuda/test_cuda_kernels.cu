// GPU kernels of the GPT-2 layers (cuda/gpt2_kernels.h) and the matrix products (cuda/matmul.h)
// against float64 references computed here on the same bf16-rounded inputs. Tolerances: bf16
// results 1e-2 relative (L2 over the tensor), fp32 results 1e-5; every output buffer is poisoned
// (NaN bits) first, so an element a kernel forgets to write fails the check.
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn, to_bf16

#include <math.h> // tanh, exp, log, sqrt

extern "C" {
#include "cuda/gpt2_kernels.h" // dsc__cuda_*
#include "cuda/matmul.h"       // dsc__cuda_gemm
}

#define TOL_BF16 1e-2
#define TOL_F32 1e-5

// ---- embeddings ----

static void test_encoder(int B, int T, int C, int V, bool skewed) {
    int BT = B * T;
    std::vector<float> wte = randn((size_t)V * C, 0.5), wpe = randn((size_t)T * C, 0.5);
    std::vector<uint16_t> wte16 = to_bf16(wte), wpe16 = to_bf16(wpe);
    std::vector<int32_t> tok(BT);
    for (int i = 0; i < BT; i++) // skewed: a third of the positions share token 7
        tok[i] = skewed && rng_next() % 3 == 0 ? 7 : (int32_t)(rng_next() % V);
    uint16_t *d_wte = dev_upload(wte16), *d_wpe = dev_upload(wpe16),
             *d_out = dev_alloc<uint16_t>((size_t)BT * C);
    int32_t *d_tok = dev_upload(tok);
    DS(dsc__cuda_encoder_forward(d_out, d_tok, d_wte, d_wpe, B, T, C, NULL));
    SYNC();
    std::vector<float> out = from_bf16(dev_download(d_out, (size_t)BT * C));
    std::vector<double> ref((size_t)BT * C);
    for (int i = 0; i < BT; i++)
        for (int c = 0; c < C; c++)
            ref[(size_t)i * C + c] =
                (double)wte[(size_t)tok[i] * C + c] + wpe[(size_t)(i % T) * C + c];
    check("encoder forward", rel_err(out.data(), ref.data(), ref.size()), TOL_BF16);

    // backward: gradients start from random values (the kernel adds)
    std::vector<float> dout = randn((size_t)BT * C, 1.0), gte = randn((size_t)V * C, 1.0),
                       gpe = randn((size_t)T * C, 1.0);
    std::vector<uint16_t> dout16 = to_bf16(dout);
    uint16_t *d_dout = dev_upload(dout16);
    float *d_gte = dev_upload(gte), *d_gpe = dev_upload(gpe);
    size_t sb = dsc__cuda_encoder_backward_scratch(B, T, V);
    void *scratch;
    CK(cudaMalloc(&scratch, sb));
    DS(dsc__cuda_encoder_backward(d_gte, d_gpe, scratch, d_dout, d_tok, B, T, C, V, NULL));
    SYNC();
    std::vector<float> g1 = dev_download(d_gte, gte.size()), p1 = dev_download(d_gpe, gpe.size());
    std::vector<double> rte(gte.begin(), gte.end()), rpe(gpe.begin(), gpe.end());
    for (int i = 0; i < BT; i++)
        for (int c = 0; c < C; c++) {
            rte[(size_t)tok[i] * C + c] += dout[(size_t)i * C + c];
            rpe[(size_t)(i % T) * C + c] += dout[(size_t)i * C + c];
        }
    char name[96];
    snprintf(name, sizeof name, "encoder backward dwte%s", skewed ? " (skewed tokens)" : "");
    check(name, rel_err(g1.data(), rte.data(), rte.size()), TOL_F32);
    check("encoder backward dwpe", rel_err(p1.data(), rpe.data(), rpe.size()), TOL_F32);
    // deterministic: the same call on the same inputs gives the same bits
    CK(cudaMemcpy(d_gte, gte.data(), gte.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_gpe, gpe.data(), gpe.size() * 4, cudaMemcpyHostToDevice));
    DS(dsc__cuda_encoder_backward(d_gte, d_gpe, scratch, d_dout, d_tok, B, T, C, V, NULL));
    SYNC();
    std::vector<float> g2 = dev_download(d_gte, gte.size());
    check_true("encoder backward is bitwise repeatable",
               memcmp(g1.data(), g2.data(), g1.size() * 4) == 0);
    cudaFree(d_wte), cudaFree(d_wpe), cudaFree(d_out), cudaFree(d_tok), cudaFree(d_dout);
    cudaFree(d_gte), cudaFree(d_gpe), cudaFree(scratch);
}

// ---- layernorm ----

static void test_layernorm(int N, int C) {
    std::vector<float> x = randn((size_t)N * C, 2.0, 0.5), w = randn(C, 0.3, 1.0),
                       b = randn(C, 0.3);
    std::vector<uint16_t> x16 = to_bf16(x), w16 = to_bf16(w), b16 = to_bf16(b);
    uint16_t *d_x = dev_upload(x16), *d_w = dev_upload(w16), *d_b = dev_upload(b16);
    uint16_t *d_out = dev_alloc<uint16_t>((size_t)N * C);
    float *d_mean = dev_alloc<float>(N), *d_rstd = dev_alloc<float>(N);
    DS(dsc__cuda_layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, NULL));
    SYNC();
    std::vector<double> ref((size_t)N * C), rm(N), rr(N);
    std::vector<float> mean_f(N), rstd_f(N);
    for (int r = 0; r < N; r++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++)
            m += x[(size_t)r * C + c];
        m /= C;
        for (int c = 0; c < C; c++)
            v += (x[(size_t)r * C + c] - m) * (x[(size_t)r * C + c] - m);
        double s = 1.0 / sqrt(v / C + 1e-5);
        rm[r] = m, rr[r] = s, mean_f[r] = (float)m, rstd_f[r] = (float)s;
        for (int c = 0; c < C; c++)
            ref[(size_t)r * C + c] = (x[(size_t)r * C + c] - m) * s * w[c] + b[c];
    }
    std::vector<float> out = from_bf16(dev_download(d_out, (size_t)N * C));
    check("layernorm forward out", rel_err(out.data(), ref.data(), ref.size()), TOL_BF16);
    std::vector<float> gm = dev_download(d_mean, N), gr = dev_download(d_rstd, N);
    check("layernorm forward mean", rel_err(gm.data(), rm.data(), N), TOL_F32);
    check("layernorm forward rstd", rel_err(gr.data(), rr.data(), N), TOL_F32);

    // backward from the fp32 statistics both sides share
    std::vector<float> dy = randn((size_t)N * C, 1.0), dx0 = randn((size_t)N * C, 1.0);
    std::vector<float> dw0 = randn(C, 1.0), db0 = randn(C, 1.0);
    std::vector<uint16_t> dy16 = to_bf16(dy), dx16 = to_bf16(dx0);
    uint16_t *d_dy = dev_upload(dy16), *d_dx = dev_upload(dx16);
    float *d_dw = dev_upload(dw0), *d_db = dev_upload(db0);
    CK(cudaMemcpy(d_mean, mean_f.data(), N * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_rstd, rstd_f.data(), N * 4, cudaMemcpyHostToDevice));
    float *d_scr = dev_alloc<float>(dsc__cuda_layernorm_backward_scratch(N, C));
    DS(dsc__cuda_layernorm_backward(d_dx, d_dw, d_db, d_scr, d_dy, d_x, d_w, d_mean, d_rstd, N, C,
                                    NULL));
    SYNC();
    std::vector<double> rdx(dx0.begin(), dx0.end()), rdw(dw0.begin(), dw0.end()),
        rdb(db0.begin(), db0.end());
    for (int r = 0; r < N; r++) {
        double m = mean_f[r], s = rstd_f[r], s1 = 0, s2 = 0;
        const float *xr = &x[(size_t)r * C], *gr2 = &dy[(size_t)r * C];
        for (int c = 0; c < C; c++) {
            double xh = (xr[c] - m) * s, g = (double)gr2[c] * w[c];
            s1 += g, s2 += g * xh;
            rdw[c] += gr2[c] * xh, rdb[c] += gr2[c];
        }
        s1 /= C, s2 /= C;
        for (int c = 0; c < C; c++) {
            double xh = (xr[c] - m) * s;
            rdx[(size_t)r * C + c] += s * ((double)gr2[c] * w[c] - s1 - xh * s2);
        }
    }
    std::vector<float> gdx = from_bf16(dev_download(d_dx, (size_t)N * C));
    std::vector<float> gdw = dev_download(d_dw, C), gdb = dev_download(d_db, C);
    check("layernorm backward dinp (+=)", rel_err(gdx.data(), rdx.data(), rdx.size()), TOL_BF16);
    check("layernorm backward dw", rel_err(gdw.data(), rdw.data(), C), TOL_F32);
    check("layernorm backward db", rel_err(gdb.data(), rdb.data(), C), TOL_F32);
    cudaFree(d_x), cudaFree(d_w), cudaFree(d_b), cudaFree(d_out), cudaFree(d_mean);
    cudaFree(d_rstd), cudaFree(d_dy), cudaFree(d_dx), cudaFree(d_dw), cudaFree(d_db),
        cudaFree(d_scr);
}

// ---- elementwise ----

static double gelu_ref(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

static double gelu_grad_ref(double x) {
    double k = 0.7978845608028654, u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_elementwise(long long n) {
    std::vector<float> x = randn(n, 3.0), dy = randn(n, 1.0), y = randn(n, 1.0);
    std::vector<uint16_t> x16 = to_bf16(x), dy16 = to_bf16(dy), y16 = to_bf16(y);
    uint16_t *d_x = dev_upload(x16), *d_dy = dev_upload(dy16), *d_y = dev_upload(y16);
    uint16_t *d_out = dev_alloc<uint16_t>(n);
    std::vector<double> ref(n);
    char name[96];
    const char *path = n % 8 == 0 ? "vector" : "scalar";

    DS(dsc__cuda_gelu_forward(d_out, d_x, n, NULL));
    SYNC();
    std::vector<float> out = from_bf16(dev_download(d_out, n));
    for (long long i = 0; i < n; i++)
        ref[i] = gelu_ref(x[i]);
    snprintf(name, sizeof name, "gelu forward (%s path)", path);
    check(name, rel_err(out.data(), ref.data(), n), TOL_BF16);

    DS(dsc__cuda_gelu_backward(d_dy, d_dy, d_x, n, NULL)); // in place, as the model calls it
    SYNC();
    out = from_bf16(dev_download(d_dy, n));
    for (long long i = 0; i < n; i++)
        ref[i] = dy[i] * gelu_grad_ref(x[i]);
    snprintf(name, sizeof name, "gelu backward (%s path, in place)", path);
    check(name, rel_err(out.data(), ref.data(), n), TOL_BF16);

    DS(dsc__cuda_residual_forward(d_out, d_x, d_y, n, NULL));
    SYNC();
    out = from_bf16(dev_download(d_out, n));
    for (long long i = 0; i < n; i++)
        ref[i] = (double)x[i] + y[i];
    snprintf(name, sizeof name, "residual forward (%s path)", path);
    check(name, rel_err(out.data(), ref.data(), n), TOL_BF16);
    cudaFree(d_x), cudaFree(d_dy), cudaFree(d_y), cudaFree(d_out);
}

// ---- softmax + cross-entropy ----

static void test_xent(int N, int V, int ld) {
    std::vector<float> lg = randn((size_t)N * ld, 2.0);
    std::vector<uint16_t> lg16 = to_bf16(lg);
    std::vector<int32_t> tg(N);
    for (int i = 0; i < N; i++)
        tg[i] = (int32_t)(rng_next() % V);
    uint16_t *d_lg = dev_upload(lg16), *d_dl = dev_alloc<uint16_t>((size_t)N * ld);
    int32_t *d_tg = dev_upload(tg);
    float *d_loss = dev_alloc<float>(N), *d_lse = dev_alloc<float>(N),
          *d_loss2 = dev_alloc<float>(N);
    float g = 1.0f / N;
    DS(dsc__cuda_xent_forward(d_loss, d_lse, d_lg, d_tg, N, V, ld, NULL));
    DS(dsc__cuda_xent_backward(d_dl, d_lg, d_lse, d_tg, g, N, V, ld, NULL));
    SYNC();
    std::vector<double> rl(N), rd((size_t)N * ld, 0.0);
    for (int r = 0; r < N; r++) {
        const float *l = &lg[(size_t)r * ld];
        double m = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            m = l[j] > m ? l[j] : m;
        for (int j = 0; j < V; j++)
            s += exp(l[j] - m);
        double lse = m + log(s);
        rl[r] = lse - l[tg[r]];
        for (int j = 0; j < V; j++)
            rd[(size_t)r * ld + j] = g * (exp(l[j] - lse) - (j == tg[r]));
    }
    std::vector<float> gl = dev_download(d_loss, N);
    std::vector<uint16_t> gd16 = dev_download(d_dl, (size_t)N * ld);
    std::vector<float> gd = from_bf16(gd16);
    char name[96];
    snprintf(name, sizeof name, "xent forward losses (V %d, ld %d)", V, ld);
    check(name, rel_err(gl.data(), rl.data(), N), TOL_F32);
    check("xent backward dlogits (pads zeroed)", rel_err(gd.data(), rd.data(), rd.size()),
          TOL_BF16);
    // fused: same losses, same gradient bits, in place
    DS(dsc__cuda_xent_fused(d_loss2, d_lg, d_tg, g, N, V, ld, NULL));
    SYNC();
    std::vector<float> gl2 = dev_download(d_loss2, N);
    std::vector<uint16_t> gf16 = dev_download(d_lg, (size_t)N * ld);
    check_true("xent fused == forward + backward (bitwise)",
               memcmp(gl.data(), gl2.data(), N * 4) == 0 && gf16 == gd16);
    cudaFree(d_lg), cudaFree(d_dl), cudaFree(d_tg), cudaFree(d_loss), cudaFree(d_lse),
        cudaFree(d_loss2);
}

// ---- column sums and sums ----

static void test_sums(int rows, int ncols) {
    std::vector<float> d = randn((size_t)rows * ncols, 1.0), acc0 = randn(ncols, 1.0);
    std::vector<uint16_t> d16 = to_bf16(d);
    uint16_t *d_d = dev_upload(d16);
    float *d_acc = dev_upload(acc0),
          *d_scr = dev_alloc<float>(dsc__cuda_colsum_scratch(rows, ncols));
    DS(dsc__cuda_colsum(d_acc, d_scr, d_d, rows, ncols, NULL));
    SYNC();
    std::vector<double> ref(acc0.begin(), acc0.end());
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ncols; c++)
            ref[c] += d[(size_t)r * ncols + c];
    std::vector<float> got = dev_download(d_acc, ncols);
    check("colsum (bias gradients, +=)", rel_err(got.data(), ref.data(), ncols), TOL_F32);

    std::vector<float> x = randn(rows, 1.0, 3.0);
    float *d_x = dev_upload(x), *d_s = dev_alloc<float>(1);
    DS(dsc__cuda_sum(d_s, d_x, rows, 0.5f, NULL));
    SYNC();
    double rs = 0;
    for (float v : x)
        rs += v;
    rs *= 0.5;
    float gs = dev_download(d_s, 1)[0];
    check("sum (mean loss)", fabs(gs - rs) / fabs(rs), TOL_F32);
    cudaFree(d_d), cudaFree(d_acc), cudaFree(d_scr), cudaFree(d_x), cudaFree(d_s);
}

// ---- matrix products ----

struct mm_case {
    const char *name;
    int ta, tb, M, N, K, pad; // row strides: columns rounded up to 8, plus pad (a multiple of 8)
    int d_fp32, epi, with_c;
};

// Host reference of op(A) op(B) in double.
static double prod_at(const std::vector<float> &A, int lda, const std::vector<float> &B, int ldb,
                      const mm_case &t, int m, int n) {
    double s = 0;
    for (int k = 0; k < t.K; k++) {
        double a = t.ta ? A[(size_t)k * lda + m] : A[(size_t)m * lda + k];
        double b = t.tb ? B[(size_t)n * ldb + k] : B[(size_t)k * ldb + n];
        s += a * b;
    }
    return s;
}

static void test_matmul(dsc_cuda_blas *h, const mm_case &t) {
    int rows_a = t.ta ? t.K : t.M, cols_a = t.ta ? t.M : t.K;
    int rows_b = t.tb ? t.N : t.K, cols_b = t.tb ? t.K : t.N;
    int lda = (cols_a + 7) / 8 * 8 + t.pad, ldb = (cols_b + 7) / 8 * 8 + t.pad;
    int ldd = (t.N + 7) / 8 * 8 + t.pad;
    std::vector<float> A = randn((size_t)rows_a * lda, 1.0), B = randn((size_t)rows_b * ldb, 1.0);
    std::vector<float> bias = randn(t.N, 1.0), Cm = randn((size_t)t.M * ldd, 1.0);
    std::vector<uint16_t> A16 = to_bf16(A), B16 = to_bf16(B), bias16 = to_bf16(bias),
                          C16 = to_bf16(Cm);
    std::vector<float> aux_in = randn((size_t)t.M * ldd, 1.5); // DGELU's pre-activation
    std::vector<uint16_t> aux16 = to_bf16(aux_in);
    uint16_t *dA = dev_upload(A16), *dB = dev_upload(B16), *dbias = dev_upload(bias16);
    uint16_t *daux =
        t.epi == DSC_CUDA_EPI_DGELU ? dev_upload(aux16) : dev_alloc<uint16_t>((size_t)t.M * ldd);
    void *dC = NULL, *dD;
    if (t.d_fp32) {
        dD = t.with_c ? (void *)dev_upload(Cm) : (void *)dev_alloc<float>((size_t)t.M * ldd);
        dC = t.with_c ? dD : NULL; // accumulate in place, as weight gradients do
    } else {
        dD = dev_alloc<uint16_t>((size_t)t.M * ldd);
        if (t.with_c) dC = dev_upload(C16);
    }
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.trans_a = t.ta, g.trans_b = t.tb, g.M = t.M, g.N = t.N, g.K = t.K;
    g.A = dA, g.lda = lda, g.B = dB, g.ldb = ldb, g.D = dD, g.ldd = ldd, g.d_fp32 = t.d_fp32;
    g.C = dC, g.ldc = ldd, g.alpha = 1.0f, g.beta = t.with_c ? 1.0f : 0.0f, g.epilogue = t.epi;
    if (t.epi == DSC_CUDA_EPI_BIAS || t.epi == DSC_CUDA_EPI_GELU_BIAS) g.bias = dbias;
    if (t.epi == DSC_CUDA_EPI_GELU_BIAS || t.epi == DSC_CUDA_EPI_DGELU) g.aux = daux, g.ldaux = ldd;
    DS(dsc__cuda_gemm(h, &g, NULL));
    SYNC();
    std::vector<double> ref((size_t)t.M * t.N), raux((size_t)t.M * t.N);
    for (int m = 0; m < t.M; m++)
        for (int n = 0; n < t.N; n++) {
            double v = prod_at(A, lda, B, ldb, t, m, n);
            if (t.with_c) v += Cm[(size_t)m * ldd + n];
            if (g.bias) v += bias[n];
            raux[(size_t)m * t.N + n] = v;
            if (t.epi == DSC_CUDA_EPI_GELU_BIAS) v = gelu_ref(v);
            if (t.epi == DSC_CUDA_EPI_DGELU) v *= gelu_grad_ref(aux_in[(size_t)m * ldd + n]);
            ref[(size_t)m * t.N + n] = v;
        }
    std::vector<float> got((size_t)t.M * t.N), gaux((size_t)t.M * t.N);
    if (t.d_fp32) {
        std::vector<float> d = dev_download((float *)dD, (size_t)t.M * ldd);
        for (int m = 0; m < t.M; m++)
            for (int n = 0; n < t.N; n++)
                got[(size_t)m * t.N + n] = d[(size_t)m * ldd + n];
    } else {
        std::vector<float> d = from_bf16(dev_download((uint16_t *)dD, (size_t)t.M * ldd));
        std::vector<float> x = from_bf16(dev_download(daux, (size_t)t.M * ldd));
        for (int m = 0; m < t.M; m++)
            for (int n = 0; n < t.N; n++) {
                got[(size_t)m * t.N + n] = d[(size_t)m * ldd + n];
                gaux[(size_t)m * t.N + n] = x[(size_t)m * ldd + n];
            }
    }
    char name[96];
    snprintf(name, sizeof name, "gemm %s", t.name);
    check(name, rel_err(got.data(), ref.data(), ref.size()), t.d_fp32 ? 1e-4 : TOL_BF16);
    if (t.epi == DSC_CUDA_EPI_GELU_BIAS) {
        snprintf(name, sizeof name, "gemm %s: aux (pre-activation)", t.name);
        check(name, rel_err(gaux.data(), raux.data(), raux.size()), TOL_BF16);
    }
    cudaFree(dA), cudaFree(dB), cudaFree(dbias), cudaFree(daux), cudaFree(dD);
    if (dC && dC != dD) cudaFree(dC);
}

static void test_matmuls(bool small) {
    dsc_cuda_blas *h = NULL;
    DS(dsc__cuda_blas_create(&h, 0));
    int s = small ? 4 : 1;
    const mm_case cases[] = {
        {"fwd + bias (c_attn)", 0, 0, 512 / s, 2304 / s, 768 / s, 0, 0, DSC_CUDA_EPI_BIAS, 0},
        {"fwd + bias + residual (c_proj)", 0, 0, 384 / s, 768 / s, 768 / s, 0, 0, DSC_CUDA_EPI_BIAS,
         1},
        {"fwd + bias + GELU, aux out (c_fc)", 0, 0, 256 / s, 3072 / s, 768 / s, 0, 0,
         DSC_CUDA_EPI_GELU_BIAS, 0},
        {"dinp = dout W^T", 0, 1, 256 / s, 768 / s, 3072 / s, 0, 0, DSC_CUDA_EPI_NONE, 0},
        {"dinp with DGELU epilogue", 0, 1, 256 / s, 3072 / s, 768 / s, 0, 0, DSC_CUDA_EPI_DGELU, 0},
        {"dW += inp^T dout (fp32)", 1, 0, 768 / s, 2304 / s, 256 / s, 0, 1, DSC_CUDA_EPI_NONE, 1},
        {"logits: odd N, padded ld", 0, 1, 128, 1001, 256, 24, 0, DSC_CUDA_EPI_NONE, 0},
        {"dlnf: odd K, padded ld", 0, 0, 128, 256, 1001, 8, 0, DSC_CUDA_EPI_NONE, 0},
        {"dwte: odd M, fp32 +=", 1, 0, 1001, 256, 128, 8, 1, DSC_CUDA_EPI_NONE, 1},
    };
    for (const mm_case &t : cases)
        test_matmul(h, t);
    dsc__cuda_blas_destroy(h);
}

// ---- timings of the memory-bound kernels at GPT-2 124M, B=16, T=1024 ----

static void time_kernels(void) {
    int N = 16 * 1024, C = 768, V = 50257, ld = 50304;
    std::vector<float> x = randn((size_t)N * 4 * C, 1.0);
    std::vector<uint16_t> x16 = to_bf16(x);
    uint16_t *d_x = dev_upload(x16), *d_y = dev_alloc<uint16_t>((size_t)N * 4 * C);
    std::vector<float> w = randn(C, 0.1, 1.0);
    std::vector<uint16_t> w16 = to_bf16(w);
    uint16_t *d_w = dev_upload(w16);
    float *d_m = dev_alloc<float>(N), *d_r = dev_alloc<float>(N);
    double ms = time_ms([&] { dsc__cuda_gelu_forward(d_y, d_x, (int64_t)N * 4 * C, NULL); }, 3, 20);
    printf("time gelu forward (%d x %d): %.3f ms, %.0f GB/s\n", N, 4 * C, ms,
           4.0 * N * 4 * C / ms / 1e6);
    ms = time_ms([&] { dsc__cuda_layernorm_forward(d_y, d_m, d_r, d_x, d_w, d_w, N, C, NULL); }, 3,
                 20);
    printf("time layernorm forward (%d x %d): %.3f ms, %.0f GB/s\n", N, C, ms,
           4.0 * N * C / ms / 1e6);
    float *d_scr = dev_alloc<float>(dsc__cuda_layernorm_backward_scratch(N, C)),
          *d_g = dev_alloc<float>(2 * C);
    CK(cudaMemset(d_g, 0, 8 * C));
    ms = time_ms(
        [&] {
            dsc__cuda_layernorm_backward(d_y, d_g, d_g + C, d_scr, d_x, d_x + (size_t)N * C, d_w,
                                         d_m, d_r, N, C, NULL);
        },
        3, 20);
    printf("time layernorm backward (%d x %d): %.3f ms, %.0f GB/s\n", N, C, ms,
           10.0 * N * C / ms / 1e6);
    uint16_t *d_lg = dev_alloc<uint16_t>((size_t)N * ld);
    CK(cudaMemset(d_lg, 0x3c, (size_t)N * ld * 2)); // bf16 ~0.0115, finite
    std::vector<int32_t> tg(N, 11);
    int32_t *d_tg = dev_upload(tg);
    float *d_loss = dev_alloc<float>(N), *d_lse = dev_alloc<float>(N);
    ms = time_ms([&] { dsc__cuda_xent_forward(d_loss, d_lse, d_lg, d_tg, N, V, ld, NULL); }, 3, 10);
    printf("time xent forward (%d x %d): %.3f ms, %.0f GB/s\n", N, V, ms, 2.0 * N * ld / ms / 1e6);
    ms = time_ms([&] { dsc__cuda_xent_backward(d_lg, d_lg, d_lse, d_tg, 1e-4f, N, V, ld, NULL); },
                 3, 10);
    printf("time xent backward (%d x %d): %.3f ms, %.0f GB/s\n", N, V, ms, 4.0 * N * ld / ms / 1e6);
    float *d_acc = dev_alloc<float>(4 * C),
          *d_cs = dev_alloc<float>(dsc__cuda_colsum_scratch(N, 4 * C));
    CK(cudaMemset(d_acc, 0, 16 * C));
    ms = time_ms([&] { dsc__cuda_colsum(d_acc, d_cs, d_x, N, 4 * C, NULL); }, 3, 20);
    printf("time colsum (%d x %d): %.3f ms, %.0f GB/s\n", N, 4 * C, ms, 2.0 * N * 4 * C / ms / 1e6);
    SYNC();
    cudaFree(d_x), cudaFree(d_y), cudaFree(d_w), cudaFree(d_m), cudaFree(d_r), cudaFree(d_scr);
    cudaFree(d_g), cudaFree(d_lg), cudaFree(d_tg), cudaFree(d_loss), cudaFree(d_lse);
    cudaFree(d_acc), cudaFree(d_cs);
}

int main(void) {
    require_device("test_cuda_kernels");
    bool small = small_mode();
    test_encoder(small ? 2 : 4, small ? 64 : 256, small ? 64 : 768, 1000, false);
    test_encoder(small ? 2 : 8, small ? 64 : 512, small ? 64 : 256, small ? 300 : 5000, true);
    test_layernorm(small ? 70 : 1030, small ? 128 : 768);
    test_elementwise(small ? 4096 : (1 << 20));
    test_elementwise(small ? 4099 : (1 << 20) + 3);
    test_xent(small ? 4 : 64, small ? 1000 : 50257, small ? 1024 : 50304);
    test_xent(small ? 3 : 17, 999, 999); // odd row stride: scalar path
    test_sums(small ? 300 : 4100, small ? 200 : 2304);
    test_matmuls(small);
    if (!small) time_kernels();
    return finish("test_cuda_kernels");
}
