// GPU kernels of the GPT-2 layers (model/gpt2/gpt2_kernels.h), the kernels every model shares
// (cuda/kernels.h: cross-entropy, column sums, sums, conversions) and the matrix products
// (cuda/matmul.h) against float64 references computed here on the same 16-bit-rounded inputs, once
// with bf16 tensors and once with fp16 ones (the `_h` entry points). Tolerances: bf16 results 1e-2
// relative (L2 over the tensor), fp16 results 2e-3, fp32 results 1e-5 (products into fp32: 1e-4);
// every output buffer is poisoned (NaN bits) first, so an element a kernel forgets to write fails
// the check. fp16 only: conversions bitwise against dsc/half.h (all 65536 bit patterns through a
// kernel), and overflow reaching the outputs as inf/NaN, never clamped to finite values.
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn, to_16

#include <math.h> // tanh, exp, log, sqrt

extern "C" {
#include "model/gpt2/gpt2_kernels.h" // dsc__cuda_encoder_*, _layernorm_*, _gelu_*, ...
#include "cuda/kernels.h"            // dsc__cuda_xent_*, dsc__cuda_colsum*, dsc__cuda_sum, ...
#include "cuda/matmul.h"             // dsc__cuda_gemm
}

#define TOL_BF16 1e-2
#define TOL_FP16 2e-3
#define TOL_F32 1e-5

static double tol16(bool f16) {
    return f16 ? TOL_FP16 : TOL_BF16;
}

// "name" or "name [fp16]" (one buffer: use the result before the next call).
static const char *nm(const char *name, bool f16) {
    static char buf[192];
    snprintf(buf, sizeof buf, "%s%s", name, type_tag(f16));
    return buf;
}

// ---- embeddings ----

static void test_encoder(int B, int T, int C, int V, bool skewed, bool f16) {
    int BT = B * T;
    std::vector<float> wte = randn((size_t)V * C, 0.5), wpe = randn((size_t)T * C, 0.5);
    std::vector<uint16_t> wte16 = to_16(wte, f16), wpe16 = to_16(wpe, f16);
    std::vector<int32_t> tok(BT);
    for (int i = 0; i < BT; i++) // skewed: a third of the positions share token 7
        tok[i] = skewed && rng_next() % 3 == 0 ? 7 : (int32_t)(rng_next() % V);
    uint16_t *d_wte = dev_upload(wte16), *d_wpe = dev_upload(wpe16),
             *d_out = dev_alloc<uint16_t>((size_t)BT * C);
    int32_t *d_tok = dev_upload(tok);
    DS(dsc__cuda_encoder_forward_h(d_out, d_tok, NULL, d_wte, d_wpe, B, T, C, f16, NULL));
    SYNC();
    std::vector<float> out = from_16(dev_download(d_out, (size_t)BT * C), f16);
    std::vector<double> ref((size_t)BT * C);
    for (int i = 0; i < BT; i++)
        for (int c = 0; c < C; c++)
            ref[(size_t)i * C + c] =
                (double)wte[(size_t)tok[i] * C + c] + wpe[(size_t)(i % T) * C + c];
    check(nm("encoder forward", f16), rel_err(out.data(), ref.data(), ref.size()), tol16(f16));

    // backward: gradients start from random values (the kernel adds)
    std::vector<float> dout = randn((size_t)BT * C, 1.0), gte = randn((size_t)V * C, 1.0),
                       gpe = randn((size_t)T * C, 1.0);
    std::vector<uint16_t> dout16 = to_16(dout, f16);
    uint16_t *d_dout = dev_upload(dout16);
    float *d_gte = dev_upload(gte), *d_gpe = dev_upload(gpe);
    size_t sb = dsc__cuda_embed_backward_scratch((int64_t)B * T, V);
    void *scratch;
    CK(cudaMalloc(&scratch, sb));
    DS(dsc__cuda_encoder_backward_h(d_gte, d_gpe, scratch, d_dout, d_tok, NULL, 0, B, T, C, V,
                                    true, f16, NULL));
    SYNC();
    std::vector<float> g1 = dev_download(d_gte, gte.size()), p1 = dev_download(d_gpe, gpe.size());
    std::vector<double> rte(gte.begin(), gte.end()), rpe(gpe.begin(), gpe.end());
    for (int i = 0; i < BT; i++)
        for (int c = 0; c < C; c++) {
            rte[(size_t)tok[i] * C + c] += dout[(size_t)i * C + c];
            rpe[(size_t)(i % T) * C + c] += dout[(size_t)i * C + c];
        }
    char name[96];
    snprintf(name, sizeof name, "encoder backward dwte%s%s", skewed ? " (skewed tokens)" : "",
             type_tag(f16));
    check(name, rel_err(g1.data(), rte.data(), rte.size()), TOL_F32);
    check(nm("encoder backward dwpe", f16), rel_err(p1.data(), rpe.data(), rpe.size()), TOL_F32);
    // deterministic: the same call on the same inputs gives the same bits
    CK(cudaMemcpy(d_gte, gte.data(), gte.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_gpe, gpe.data(), gpe.size() * 4, cudaMemcpyHostToDevice));
    DS(dsc__cuda_encoder_backward_h(d_gte, d_gpe, scratch, d_dout, d_tok, NULL, 0, B, T, C, V,
                                    true, f16, NULL));
    SYNC();
    std::vector<float> g2 = dev_download(d_gte, gte.size());
    check_true(nm("encoder backward is bitwise repeatable", f16),
               memcmp(g1.data(), g2.data(), g1.size() * 4) == 0);
    // wpe_add false: dwpe overwritten (whatever it held), dwte still added to
    CK(cudaMemcpy(d_gte, gte.data(), gte.size() * 4, cudaMemcpyHostToDevice));
    std::vector<float> nan_pe(gpe.size(), NAN);
    CK(cudaMemcpy(d_gpe, nan_pe.data(), gpe.size() * 4, cudaMemcpyHostToDevice));
    DS(dsc__cuda_encoder_backward_h(d_gte, d_gpe, scratch, d_dout, d_tok, NULL, 0, B, T, C, V,
                                    false, f16, NULL));
    SYNC();
    std::vector<float> p3 = dev_download(d_gpe, gpe.size()), g3 = dev_download(d_gte, gte.size());
    std::vector<double> rpe_set(gpe.size());
    for (size_t i = 0; i < gpe.size(); i++)
        rpe_set[i] = rpe[i] - gpe[i];
    check(nm("encoder backward dwpe (=)", f16), rel_err(p3.data(), rpe_set.data(), rpe_set.size()),
          TOL_F32);
    check_true(nm("encoder backward dwte with dwpe (=): the same bits", f16),
               memcmp(g1.data(), g3.data(), g1.size() * 4) == 0);
    // position ids (restarting at random documents' starts, as packed data's): the forward reads
    // wpe at each id; the backward scatters dwpe by id (added to, or every row of the table
    // written: rows no id names become 0)
    std::vector<int32_t> pos(BT);
    for (int b = 0; b < B; b++)
        for (int t = 0, p = 0; t < T; t++, p++) {
            if (t > 0 && rng_next() % 5 == 0) p = 0;
            pos[(size_t)b * T + t] = p;
        }
    int32_t *d_pos = dev_upload(pos);
    DS(dsc__cuda_encoder_forward_h(d_out, d_tok, d_pos, d_wte, d_wpe, B, T, C, f16, NULL));
    SYNC();
    out = from_16(dev_download(d_out, (size_t)BT * C), f16);
    for (int i = 0; i < BT; i++)
        for (int c = 0; c < C; c++)
            ref[(size_t)i * C + c] =
                (double)wte[(size_t)tok[i] * C + c] + wpe[(size_t)pos[i] * C + c];
    check(nm("encoder forward with position ids", f16), rel_err(out.data(), ref.data(), ref.size()),
          tol16(f16));
    for (int add = 1; add >= 0; add--) {
        CK(cudaMemcpy(d_gte, gte.data(), gte.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(d_gpe, gpe.data(), gpe.size() * 4, cudaMemcpyHostToDevice));
        DS(dsc__cuda_encoder_backward_h(d_gte, d_gpe, scratch, d_dout, d_tok, d_pos, T, B, T, C,
                                        V, add, f16, NULL));
        SYNC();
        std::vector<float> p4 = dev_download(d_gpe, gpe.size());
        std::vector<float> g4 = dev_download(d_gte, gte.size());
        std::vector<double> rpos(gpe.size());
        for (size_t i = 0; i < gpe.size(); i++)
            rpos[i] = add ? gpe[i] : 0;
        for (int i = 0; i < BT; i++)
            for (int c = 0; c < C; c++)
                rpos[(size_t)pos[i] * C + c] += dout[(size_t)i * C + c];
        check(nm(add ? "encoder backward dwpe by position id (+=)"
                     : "encoder backward dwpe by position id (=, other rows 0)", f16),
              rel_err(p4.data(), rpos.data(), rpos.size()), TOL_F32);
        check_true(nm("encoder backward dwte with position ids: the same bits", f16),
                   memcmp(g1.data(), g4.data(), g1.size() * 4) == 0);
    }
    cudaFree(d_wte), cudaFree(d_wpe), cudaFree(d_out), cudaFree(d_tok), cudaFree(d_dout);
    cudaFree(d_gte), cudaFree(d_gpe), cudaFree(scratch), cudaFree(d_pos);
}

// ---- layernorm ----

static void test_layernorm(int N, int C, bool f16) {
    std::vector<float> x = randn((size_t)N * C, 2.0, 0.5), w = randn(C, 0.3, 1.0),
                       b = randn(C, 0.3);
    std::vector<uint16_t> x16 = to_16(x, f16), w16 = to_16(w, f16), b16 = to_16(b, f16);
    uint16_t *d_x = dev_upload(x16), *d_w = dev_upload(w16), *d_b = dev_upload(b16);
    uint16_t *d_out = dev_alloc<uint16_t>((size_t)N * C);
    float *d_mean = dev_alloc<float>(N), *d_rstd = dev_alloc<float>(N);
    DS(dsc__cuda_layernorm_forward_h(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C, f16, NULL));
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
    std::vector<float> out = from_16(dev_download(d_out, (size_t)N * C), f16);
    check(nm("layernorm forward out", f16), rel_err(out.data(), ref.data(), ref.size()),
          tol16(f16));
    std::vector<float> gm = dev_download(d_mean, N), gr = dev_download(d_rstd, N);
    check(nm("layernorm forward mean", f16), rel_err(gm.data(), rm.data(), N), TOL_F32);
    check(nm("layernorm forward rstd", f16), rel_err(gr.data(), rr.data(), N), TOL_F32);

    // backward from the fp32 statistics both sides share
    std::vector<float> dy = randn((size_t)N * C, 1.0), dx0 = randn((size_t)N * C, 1.0);
    std::vector<float> dw0 = randn(C, 1.0), db0 = randn(C, 1.0);
    std::vector<uint16_t> dy16 = to_16(dy, f16), dx16 = to_16(dx0, f16);
    uint16_t *d_dy = dev_upload(dy16), *d_dx = dev_upload(dx16);
    float *d_dw = dev_upload(dw0), *d_db = dev_upload(db0);
    CK(cudaMemcpy(d_mean, mean_f.data(), N * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_rstd, rstd_f.data(), N * 4, cudaMemcpyHostToDevice));
    float *d_scr = dev_alloc<float>(dsc__cuda_layernorm_backward_scratch(N, C));
    std::vector<float> ds0 = randn(C, 1.0);
    float *d_ds = dev_upload(ds0); // += the column sums of the resulting dinp
    DS(dsc__cuda_layernorm_backward_h(d_dx, d_dw, d_db, d_scr, d_dy, d_x, d_w, d_mean, d_rstd, d_ds,
                                      true, N, C, f16, NULL));
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
    std::vector<float> gdx = from_16(dev_download(d_dx, (size_t)N * C), f16);
    std::vector<float> gdw = dev_download(d_dw, C), gdb = dev_download(d_db, C);
    check(nm("layernorm backward dinp (+=)", f16), rel_err(gdx.data(), rdx.data(), rdx.size()),
          tol16(f16));
    check(nm("layernorm backward dw", f16), rel_err(gdw.data(), rdw.data(), C), TOL_F32);
    check(nm("layernorm backward db", f16), rel_err(gdb.data(), rdb.data(), C), TOL_F32);
    std::vector<double> rds(ds0.begin(), ds0.end()); // of dinp as stored (16-bit)
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++)
            rds[c] += gdx[(size_t)r * C + c];
    std::vector<float> gds = dev_download(d_ds, C);
    check(nm("layernorm backward column sums of dinp", f16), rel_err(gds.data(), rds.data(), C),
          TOL_F32);
    // without dsum: the same dinp, dw and db bit for bit
    uint16_t *d_dx2 = dev_upload(dx16);
    float *d_dw2 = dev_upload(dw0), *d_db2 = dev_upload(db0);
    DS(dsc__cuda_layernorm_backward_h(d_dx2, d_dw2, d_db2, d_scr, d_dy, d_x, d_w, d_mean, d_rstd,
                                      NULL, true, N, C, f16, NULL));
    SYNC();
    check_true(nm("layernorm backward without dsum: dinp, dw, db bitwise the same", f16),
               dev_download(d_dx2, (size_t)N * C) == dev_download(d_dx, (size_t)N * C) &&
                   dev_download(d_dw2, C) == dev_download(d_dw, C) &&
                   dev_download(d_db2, C) == dev_download(d_db, C));
    // add false: dw, db and dsum overwritten (whatever they held)
    std::vector<float> nan_c(C, NAN);
    CK(cudaMemcpy(d_dx2, dx16.data(), dx16.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_dw2, nan_c.data(), C * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_db2, nan_c.data(), C * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_ds, nan_c.data(), C * 4, cudaMemcpyHostToDevice));
    DS(dsc__cuda_layernorm_backward_h(d_dx2, d_dw2, d_db2, d_scr, d_dy, d_x, d_w, d_mean, d_rstd,
                                      d_ds, false, N, C, f16, NULL));
    SYNC();
    std::vector<double> sdw(C), sdb(C), sds(C);
    for (int c = 0; c < C; c++)
        sdw[c] = rdw[c] - dw0[c], sdb[c] = rdb[c] - db0[c], sds[c] = rds[c] - ds0[c];
    std::vector<float> odw = dev_download(d_dw2, C), odb = dev_download(d_db2, C),
                       ods = dev_download(d_ds, C);
    check(nm("layernorm backward dw (=)", f16), rel_err(odw.data(), sdw.data(), C), TOL_F32);
    check(nm("layernorm backward db (=)", f16), rel_err(odb.data(), sdb.data(), C), TOL_F32);
    check(nm("layernorm backward column sums (=)", f16), rel_err(ods.data(), sds.data(), C),
          TOL_F32);
    cudaFree(d_dx2), cudaFree(d_dw2), cudaFree(d_db2), cudaFree(d_ds);
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

static void test_elementwise(long long n, bool f16) {
    std::vector<float> x = randn(n, 3.0), dy = randn(n, 1.0), y = randn(n, 1.0);
    std::vector<uint16_t> x16 = to_16(x, f16), dy16 = to_16(dy, f16), y16 = to_16(y, f16);
    uint16_t *d_x = dev_upload(x16), *d_dy = dev_upload(dy16), *d_y = dev_upload(y16);
    uint16_t *d_out = dev_alloc<uint16_t>(n);
    std::vector<double> ref(n);
    char name[96];
    const char *path = n % 8 == 0 ? "vector" : "scalar";

    DS(dsc__cuda_gelu_forward_h(d_out, d_x, n, f16, NULL));
    SYNC();
    std::vector<float> out = from_16(dev_download(d_out, n), f16);
    for (long long i = 0; i < n; i++)
        ref[i] = gelu_ref(x[i]);
    snprintf(name, sizeof name, "gelu forward (%s path)%s", path, type_tag(f16));
    check(name, rel_err(out.data(), ref.data(), n), tol16(f16));

    DS(dsc__cuda_gelu_backward_h(d_dy, d_dy, d_x, n, f16, NULL)); // in place, as the model does
    SYNC();
    out = from_16(dev_download(d_dy, n), f16);
    for (long long i = 0; i < n; i++)
        ref[i] = dy[i] * gelu_grad_ref(x[i]);
    snprintf(name, sizeof name, "gelu backward (%s path, in place)%s", path, type_tag(f16));
    check(name, rel_err(out.data(), ref.data(), n), tol16(f16));

    DS(dsc__cuda_residual_forward_h(d_out, d_x, d_y, n, f16, NULL));
    SYNC();
    out = from_16(dev_download(d_out, n), f16);
    for (long long i = 0; i < n; i++)
        ref[i] = (double)x[i] + y[i];
    snprintf(name, sizeof name, "residual forward (%s path)%s", path, type_tag(f16));
    check(name, rel_err(out.data(), ref.data(), n), tol16(f16));
    cudaFree(d_x), cudaFree(d_dy), cudaFree(d_y), cudaFree(d_out);
}

// ---- softmax + cross-entropy ----

static void test_xent(int N, int V, int ld, bool f16) {
    std::vector<float> lg = randn((size_t)N * ld, 2.0);
    std::vector<uint16_t> lg16 = to_16(lg, f16);
    std::vector<int32_t> tg(N);
    for (int i = 0; i < N; i++)
        tg[i] = (int32_t)(rng_next() % V);
    uint16_t *d_lg = dev_upload(lg16), *d_dl = dev_alloc<uint16_t>((size_t)N * ld);
    int32_t *d_tg = dev_upload(tg);
    float *d_loss = dev_alloc<float>(N), *d_lse = dev_alloc<float>(N),
          *d_loss2 = dev_alloc<float>(N);
    // fp16 training scales the loss (here as a loss scale of 1024 would) so that the gradients
    // stay clear of fp16's subnormals; bf16 has fp32's range.
    float g = (f16 ? 1024.0f : 1.0f) / N;
    DS(dsc__cuda_xent_forward_h(d_loss, d_lse, d_lg, d_tg, N, V, ld, f16, NULL));
    DS(dsc__cuda_xent_backward_h(d_dl, d_lg, d_lse, d_tg, g, N, V, ld, f16, NULL));
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
    std::vector<float> gd = from_16(gd16, f16);
    char name[96];
    snprintf(name, sizeof name, "xent forward losses (V %d, ld %d)%s", V, ld, type_tag(f16));
    check(name, rel_err(gl.data(), rl.data(), N), TOL_F32);
    check(nm("xent backward dlogits (pads zeroed)", f16), rel_err(gd.data(), rd.data(), rd.size()),
          tol16(f16));
    // fused: same losses, same gradient bits, in place
    DS(dsc__cuda_xent_fused_h(d_loss2, d_lg, d_tg, g, N, V, ld, f16, NULL));
    SYNC();
    std::vector<float> gl2 = dev_download(d_loss2, N);
    std::vector<uint16_t> gf16 = dev_download(d_lg, (size_t)N * ld);
    check_true(nm("xent fused == forward + backward (bitwise)", f16),
               memcmp(gl.data(), gl2.data(), N * 4) == 0 && gf16 == gd16);
    cudaFree(d_lg), cudaFree(d_dl), cudaFree(d_tg), cudaFree(d_loss), cudaFree(d_lse),
        cudaFree(d_loss2);
}

// ---- column sums and sums ----

static void test_sums(int rows, int ncols, bool f16) {
    std::vector<float> d = randn((size_t)rows * ncols, 1.0), acc0 = randn(ncols, 1.0);
    std::vector<uint16_t> d16 = to_16(d, f16);
    uint16_t *d_d = dev_upload(d16);
    float *d_acc = dev_upload(acc0),
          *d_scr = dev_alloc<float>(dsc__cuda_colsum_scratch(rows, ncols));
    DS(dsc__cuda_colsum_h(d_acc, d_scr, d_d, rows, ncols, true, f16, NULL));
    SYNC();
    std::vector<double> ref(acc0.begin(), acc0.end());
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ncols; c++)
            ref[c] += d[(size_t)r * ncols + c];
    std::vector<float> got = dev_download(d_acc, ncols);
    check(nm("colsum (bias gradients, +=)", f16), rel_err(got.data(), ref.data(), ncols), TOL_F32);
    std::vector<float> nan_acc(ncols, NAN); // add false: acc overwritten, whatever it held
    CK(cudaMemcpy(d_acc, nan_acc.data(), (size_t)ncols * 4, cudaMemcpyHostToDevice));
    DS(dsc__cuda_colsum_h(d_acc, d_scr, d_d, rows, ncols, false, f16, NULL));
    SYNC();
    for (int c = 0; c < ncols; c++)
        ref[c] -= acc0[c];
    got = dev_download(d_acc, ncols);
    check(nm("colsum (bias gradients, =)", f16), rel_err(got.data(), ref.data(), ncols), TOL_F32);
    if (f16) { // the sum below has no 16-bit input: once is enough
        cudaFree(d_d), cudaFree(d_acc), cudaFree(d_scr);
        return;
    }

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

static void test_matmul(dsc_cuda_blas *h, const mm_case &t, bool f16) {
    int rows_a = t.ta ? t.K : t.M, cols_a = t.ta ? t.M : t.K;
    int rows_b = t.tb ? t.N : t.K, cols_b = t.tb ? t.K : t.N;
    int lda = (cols_a + 7) / 8 * 8 + t.pad, ldb = (cols_b + 7) / 8 * 8 + t.pad;
    int ldd = (t.N + 7) / 8 * 8 + t.pad;
    std::vector<float> A = randn((size_t)rows_a * lda, 1.0), B = randn((size_t)rows_b * ldb, 1.0);
    std::vector<float> bias = randn(t.N, 1.0), Cm = randn((size_t)t.M * ldd, 1.0);
    std::vector<uint16_t> A16 = to_16(A, f16), B16 = to_16(B, f16), bias16 = to_16(bias, f16),
                          C16 = to_16(Cm, f16);
    std::vector<float> aux_in = randn((size_t)t.M * ldd, 1.5); // DGELU's pre-activation
    std::vector<uint16_t> aux16 = to_16(aux_in, f16);
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
    g.fp16 = f16;
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
        std::vector<float> d = from_16(dev_download((uint16_t *)dD, (size_t)t.M * ldd), f16);
        std::vector<float> x = from_16(dev_download(daux, (size_t)t.M * ldd), f16);
        for (int m = 0; m < t.M; m++)
            for (int n = 0; n < t.N; n++) {
                got[(size_t)m * t.N + n] = d[(size_t)m * ldd + n];
                gaux[(size_t)m * t.N + n] = x[(size_t)m * ldd + n];
            }
    }
    char name[96];
    snprintf(name, sizeof name, "gemm %s%s", t.name, type_tag(f16));
    check(name, rel_err(got.data(), ref.data(), ref.size()), t.d_fp32 ? 1e-4 : tol16(f16));
    if (t.epi == DSC_CUDA_EPI_GELU_BIAS) {
        snprintf(name, sizeof name, "gemm %s: aux (pre-activation)%s", t.name, type_tag(f16));
        check(name, rel_err(gaux.data(), raux.data(), raux.size()), tol16(f16));
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
    for (int f16 = 0; f16 < 2; f16++)
        for (const mm_case &t : cases)
            test_matmul(h, t, f16);
    dsc__cuda_blas_destroy(h);
}

// ---- fp16: conversions and overflow ----

static bool is_nan16(uint16_t h) {
    return (h & 0x7fff) > 0x7c00;
}

// Every fp16 bit pattern through a kernel (x + -0 = x, so the output bits must be the input's):
// the device's fp16 -> fp32 and fp32 -> fp16 conversions on the vector and the scalar path.
// NaNs only need to stay NaN (the hardware's quiet NaN need not keep the payload).
static void test_fp16_roundtrip(void) {
    for (int vec = 1; vec >= 0; vec--) {
        size_t n = vec ? 65536 : 65537; // 65537: not a multiple of 8, the scalar path
        std::vector<uint16_t> a(n), z(n, 0x8000);
        for (size_t i = 0; i < n; i++)
            a[i] = (uint16_t)i;
        uint16_t *d_a = dev_upload(a), *d_z = dev_upload(z), *d_o = dev_alloc<uint16_t>(n);
        DS(dsc__cuda_residual_forward_h(d_o, d_a, d_z, (int64_t)n, true, NULL));
        SYNC();
        std::vector<uint16_t> o = dev_download(d_o, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += is_nan16(a[i]) ? !is_nan16(o[i]) : o[i] != a[i];
        char name[128];
        snprintf(name, sizeof name, "fp16 round trip of all 65536 bit patterns (%s path)",
                 vec ? "vector" : "scalar");
        check_true(name, bad == 0);
        cudaFree(d_a), cudaFree(d_z), cudaFree(d_o);
    }
}

// fp32 -> fp16 on the device bitwise as dsc_fp32_to_fp16 (nearest even, overflow to inf,
// subnormals), and the engine's gradient rounding as dsc_fp16_to_fp32(dsc_fp32_to_fp16(x)).
static void test_fp16_rounding(void) {
    std::vector<float> x;
    // zeros, the largest finite fp16 and the rounding boundary to inf, beyond it, the smallest
    // normal and subnormal, half the smallest subnormal (a tie to 0), ties to even at 1
    // clang-format off
    const float special[] = {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, -65520.0f, 1e30f,
                             -1e30f, INFINITY, -INFINITY, NAN, 6.1035156e-05f, 6.0e-05f,
                             5.96e-08f, 2.98e-08f, 2.9802322e-08f, 1e-10f, 1.0f + 0x1p-11f,
                             1.0f + 0x1p-10f + 0x1p-11f};
    // clang-format on
    for (float v : special)
        x.push_back(v);
    for (int e = -30; e <= 18; e++) // every binade fp16 touches, and some beyond
        for (int k = 0; k < 4000; k++)
            x.push_back((float)(normal() * ldexp(1.0, e)));
    size_t n = x.size();
    float *d_x = dev_upload(x);
    uint16_t *d_h = dev_alloc<uint16_t>(n);
    DS(dsc__cuda_f32_to_16(d_h, d_x, (int64_t)n, true, NULL));
    DS(dsc__cuda_round_fp16(d_x, (int64_t)n, NULL));
    SYNC();
    std::vector<uint16_t> h = dev_download(d_h, n);
    std::vector<float> r = dev_download(d_x, n);
    size_t bad_h = 0, bad_r = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = dsc_fp32_to_fp16(x[i]);
        float wr = dsc_fp16_to_fp32(want);
        bad_h += is_nan16(want) ? !is_nan16(h[i]) : h[i] != want;
        bad_r += isnan(wr) ? !isnan(r[i]) : memcmp(&wr, &r[i], 4) != 0;
    }
    check_true("f32 -> fp16 bitwise equal to dsc_fp32_to_fp16", bad_h == 0);
    check_true("fp16 gradient rounding bitwise equal to the engine's", bad_r == 0);
    cudaFree(d_x), cudaFree(d_h);
}

static bool all_finite(const std::vector<float> &v) {
    for (float x : v)
        if (!isfinite(x)) return false;
    return true;
}

// An fp16 result beyond 65504 must come out as inf (and what is computed from it as inf/NaN),
// never clamped to a finite value: that is how a too-large loss scale reaches the scaler.
static void test_fp16_overflow(dsc_cuda_blas *h) {
    const int n = 64, C = 64;
    std::vector<float> big(n, 60000.0f), three(n, 3.0f);
    std::vector<uint16_t> big16 = to_16(big, true), three16 = to_16(three, true);
    uint16_t *d_big = dev_upload(big16), *d_three = dev_upload(three16);
    uint16_t *d_o = dev_alloc<uint16_t>(n);
    DS(dsc__cuda_residual_forward_h(d_o, d_big, d_big, n, true, NULL)); // 120000
    SYNC();
    std::vector<uint16_t> o = dev_download(d_o, n);
    bool ok = true;
    for (uint16_t v : o)
        ok = ok && v == 0x7c00;
    check_true("fp16 overflow: residual 60000 + 60000 = inf", ok);
    DS(dsc__cuda_gelu_backward_h(d_o, d_big, d_three, n, true, NULL)); // 60000 * 1.0116 = 60695
    SYNC();
    o = dev_download(d_o, n);
    ok = true;
    for (uint16_t v : o)
        ok = ok && v > 0x7b00 && v < 0x7c00; // finite, above 57344
    check_true("fp16: gelu backward 60000 * GELU'(3) stays finite (no early overflow)", ok);
    std::vector<float> x15(n, 1.5f);
    std::vector<uint16_t> x15h = to_16(x15, true);
    uint16_t *d_x15 = dev_upload(x15h);
    DS(dsc__cuda_gelu_backward_h(d_o, d_big, d_x15, n, true, NULL)); // 60000 * 1.1277 = 67663
    SYNC();
    o = dev_download(d_o, n);
    ok = true;
    for (uint16_t v : o)
        ok = ok && v == 0x7c00;
    check_true("fp16 overflow: gelu backward past 65504 = inf", ok);

    // cross-entropy backward with a loss scale far too large: inf in dlogits
    std::vector<float> lg = randn((size_t)4 * C, 1.0);
    std::vector<uint16_t> lg16 = to_16(lg, true);
    std::vector<int32_t> tg = {1, 2, 3, 4};
    uint16_t *d_lg = dev_upload(lg16);
    int32_t *d_tg = dev_upload(tg);
    float *d_loss = dev_alloc<float>(4);
    DS(dsc__cuda_xent_fused_h(d_loss, d_lg, d_tg, 1e9f, 4, C, C, true, NULL));
    SYNC();
    std::vector<uint16_t> dl = dev_download(d_lg, (size_t)4 * C);
    std::vector<float> dlf = from_16(dl, true);
    check_true("fp16 overflow: xent backward with a huge loss scale gives inf", !all_finite(dlf));

    // what consumes those gradients: fp32 outputs must turn non-finite, not stay finite
    float *d_acc = dev_upload(std::vector<float>(C, 0.0f));
    float *d_scr = dev_alloc<float>(dsc__cuda_colsum_scratch(4, C));
    DS(dsc__cuda_colsum_h(d_acc, d_scr, d_lg, 4, C, true, true, NULL));
    SYNC();
    check_true("fp16 overflow: colsum of inf is not finite", !all_finite(dev_download(d_acc, C)));
    std::vector<float> x = randn((size_t)4 * C, 1.0), w(C, 1.0f);
    std::vector<uint16_t> x16 = to_16(x, true), w16 = to_16(w, true);
    std::vector<float> mean(4, 0.0f), rstd(4, 1.0f);
    uint16_t *d_x = dev_upload(x16), *d_w = dev_upload(w16);
    uint16_t *d_dx = dev_upload(std::vector<uint16_t>((size_t)4 * C, 0));
    float *d_mean = dev_upload(mean), *d_rstd = dev_upload(rstd);
    float *d_dw = dev_upload(std::vector<float>(C, 0.0f)),
          *d_db = dev_upload(std::vector<float>(C, 0.0f));
    float *d_lscr = dev_alloc<float>(dsc__cuda_layernorm_backward_scratch(4, C));
    DS(dsc__cuda_layernorm_backward_h(d_dx, d_dw, d_db, d_lscr, d_lg, d_x, d_w, d_mean, d_rstd,
                                      NULL, true, 4, C, true, NULL));
    SYNC();
    check_true("fp16 overflow: layernorm backward of inf gives non-finite dinp, dw, db",
               !all_finite(from_16(dev_download(d_dx, (size_t)4 * C), true)) &&
                   !all_finite(dev_download(d_dw, C)) && !all_finite(dev_download(d_db, C)));

    // products: an fp16 result past 65504 is inf; the fp32 weight gradient of inf is not finite
    int K = 256;
    std::vector<float> A((size_t)C * K, 16.0f), B((size_t)K * C, 16.0f); // 256 * 256 = 65536
    std::vector<uint16_t> A16 = to_16(A, true), B16 = to_16(B, true);
    uint16_t *dA = dev_upload(A16), *dB = dev_upload(B16), *dD = dev_alloc<uint16_t>((size_t)C * C);
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.M = C, g.N = C, g.K = K, g.A = dA, g.lda = K, g.B = dB, g.ldb = C, g.D = dD, g.ldd = C;
    g.alpha = 1.0f, g.fp16 = 1;
    DS(dsc__cuda_gemm(h, &g, NULL));
    SYNC();
    std::vector<uint16_t> D = dev_download(dD, (size_t)C * C);
    ok = true;
    for (uint16_t v : D)
        ok = ok && v == 0x7c00;
    check_true("fp16 overflow: a product of 65536 is inf in an fp16 result", ok);
    float *dW = dev_upload(std::vector<float>((size_t)C * C, 0.0f));
    memset(&g, 0, sizeof g);
    g.trans_a = 1, g.M = C, g.N = C, g.K = 4, g.A = d_x, g.lda = C, g.B = d_lg, g.ldb = C;
    g.D = dW, g.ldd = C, g.d_fp32 = 1, g.alpha = 1.0f, g.beta = 1.0f, g.C = dW, g.ldc = C;
    g.fp16 = 1;
    DS(dsc__cuda_gemm(h, &g, NULL));
    SYNC();
    check_true("fp16 overflow: an fp32 weight gradient from inf is not finite",
               !all_finite(dev_download(dW, (size_t)C * C)));
    cudaFree(d_big), cudaFree(d_three), cudaFree(d_x15), cudaFree(d_o), cudaFree(d_lg);
    cudaFree(d_tg);
    cudaFree(d_loss), cudaFree(d_acc), cudaFree(d_scr), cudaFree(d_x), cudaFree(d_w);
    cudaFree(d_dx), cudaFree(d_mean), cudaFree(d_rstd), cudaFree(d_dw), cudaFree(d_db);
    cudaFree(d_lscr), cudaFree(dA), cudaFree(dB), cudaFree(dD), cudaFree(dW);
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
    // fp16 (the same bits read as fp16: the conversions cost the same for any value)
    ms =
        time_ms([&] { dsc__cuda_gelu_forward_h(d_y, d_x, (int64_t)N * 4 * C, true, NULL); }, 3, 20);
    printf("time gelu forward fp16 (%d x %d): %.3f ms, %.0f GB/s\n", N, 4 * C, ms,
           4.0 * N * 4 * C / ms / 1e6);
    ms = time_ms([&] { dsc__cuda_layernorm_forward(d_y, d_m, d_r, d_x, d_w, d_w, N, C, NULL); }, 3,
                 20);
    printf("time layernorm forward (%d x %d): %.3f ms, %.0f GB/s\n", N, C, ms,
           4.0 * N * C / ms / 1e6);
    ms = time_ms(
        [&] { dsc__cuda_layernorm_forward_h(d_y, d_m, d_r, d_x, d_w, d_w, N, C, true, NULL); }, 3,
        20);
    printf("time layernorm forward fp16 (%d x %d): %.3f ms, %.0f GB/s\n", N, C, ms,
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
    ms = time_ms([&] { dsc__cuda_xent_fused(d_loss, d_lg, d_tg, 1e-4f, N, V, ld, NULL); }, 3, 10);
    printf("time xent fused (%d x %d): %.3f ms, %.0f GB/s\n", N, V, ms, 4.0 * N * ld / ms / 1e6);
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
    for (int f16 = 0; f16 < 2; f16++) {
        test_encoder(small ? 2 : 4, small ? 64 : 256, small ? 64 : 768, 1000, false, f16);
        test_encoder(small ? 2 : 8, small ? 64 : 512, small ? 64 : 256, small ? 300 : 5000, true,
                     f16);
        test_layernorm(small ? 70 : 1030, small ? 128 : 768, f16);
        test_layernorm(small ? 33 : 257, 1600, f16); // lanes with 6 or 7 chunks of channels
        test_layernorm(small ? 9 : 65, 3008, f16);   // 188 KB of partial sums a block
        test_elementwise(small ? 4096 : (1 << 20), f16);
        test_elementwise(small ? 4099 : (1 << 20) + 3, f16);
        test_xent(small ? 4 : 64, small ? 1000 : 50257, small ? 1024 : 50304, f16);
        test_xent(small ? 3 : 17, 999, 999, f16); // odd row stride: scalar path
        test_xent(3, 60001, 60008, f16);             // rows too long for the registers
        test_sums(small ? 300 : 4100, small ? 200 : 2304, f16);
    }
    test_matmuls(small);
    test_fp16_roundtrip();
    test_fp16_rounding();
    {
        dsc_cuda_blas *h = NULL;
        DS(dsc__cuda_blas_create(&h, 0));
        test_fp16_overflow(h);
        dsc__cuda_blas_destroy(h);
    }
    if (!small) time_kernels();
    return finish("test_cuda_kernels");
}
