// GPU optimizer steps (engine/gpu/optim.h) against the CPU's scalar path (engine/optim/optim.h),
// which performs the same correctly rounded fp32 operations per element: parameters, moments and
// the 16-bit copies must agree bit for bit, for every optimizer, a few steps, with and without the
// 16-bit copy, loss-scale and device-side clipping factors. Then the gradient norm's sum of
// squares (vs dsc_opt_sumsq, 1e-12 relative), its overflow flag, the clipping coefficient, and a
// timing at GPT-2 124M's parameter count.
#include "cuda_test.h" // require_device, check, dev_*, randn

extern "C" {
#include "engine/gpu/optim.h" // dsc__cuda_opt_*, dsc_opt_step (via engine/optim/optim.h)
}

struct opt_case {
    const char *name;
    dsc_opt_kind kind;
    float wd;
    bool adam_w_mode, nesterov;
    float momentum;
};

static void test_step(const opt_case &c, int out16_kind, bool dev_scale) {
    const size_t n = small_mode() ? 4099 : (1u << 20) + 5;
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(c.kind, &h);
    h.lr = 3e-3f, h.weight_decay = c.wd, h.adam_w_mode = c.adam_w_mode, h.nesterov = c.nesterov;
    h.momentum = c.momentum, h.beta2 = c.kind == DSC_OPT_LION ? 0.99f : 0.999f;
    std::vector<float> p = randn(n, 1.0), m(n, 0.0f), v(n, 0.0f);
    std::vector<uint16_t> o16(n, 0);
    float *d_p = dev_upload(p), *d_m = dev_upload(m), *d_v = dev_upload(v),
          *d_g = dev_alloc<float>(n);
    uint16_t *d_o = dev_upload(o16);
    float coef = 0.75f, *d_coef = dev_upload(std::vector<float>(1, coef));
    float grad_scale = 1.0f / 1024.0f; // an fp16 loss scale of 1024, undone in the step
    for (int step = 1; step <= 3; step++) {
        std::vector<float> g = randn(n, 1024.0);
        CK(cudaMemcpy(d_g, g.data(), n * 4, cudaMemcpyHostToDevice));
        float cpu_scale = dev_scale ? grad_scale * coef : grad_scale;
        dsc_opt_step(&h, step, p.data(), g.data(), m.data(), v.data(), n, cpu_scale,
                     out16_kind ? o16.data() : NULL, out16_kind);
        DS(dsc__cuda_opt_step(&h, step, d_p, d_g, d_m, d_v, n, grad_scale,
                              dev_scale ? d_coef : NULL, out16_kind ? d_o : NULL, out16_kind,
                              NULL));
    }
    SYNC();
    bool same = dev_download(d_p, n) == p && dev_download(d_m, n) == m;
    if (c.kind == DSC_OPT_ADAM || c.kind == DSC_OPT_ADAMW) same = same && dev_download(d_v, n) == v;
    if (out16_kind) same = same && dev_download(d_o, n) == o16;
    char name[160];
    snprintf(name, sizeof name, "%s, 3 steps, %s copy%s: bitwise equal to the CPU", c.name,
             out16_kind == DSC_OPT_OUT_BF16   ? "bf16"
             : out16_kind == DSC_OPT_OUT_FP16 ? "fp16"
                                              : "no",
             dev_scale ? ", device clip factor" : "");
    check_true(name, same);
    cudaFree(d_p), cudaFree(d_m), cudaFree(d_v), cudaFree(d_g), cudaFree(d_o), cudaFree(d_coef);
}

static void test_sumsq(void) {
    const size_t n = small_mode() ? 100003 : 10000019;
    std::vector<float> g = randn(n, 3.0);
    float *d_g = dev_upload(g);
    double *d_acc = dev_upload(std::vector<double>(1, 5.0)),
           *d_scr = dev_alloc<double>(DSC_CUDA_SUMSQ_SCRATCH);
    int *d_flag = dev_upload(std::vector<int>(1, 0));
    DS(dsc__cuda_opt_sumsq(d_acc, d_flag, d_scr, d_g, n, 0.5f, NULL));
    SYNC();
    bool nonfinite = false;
    double ref = 5.0 + dsc_opt_sumsq(g.data(), n, 0.5f, &nonfinite);
    double got = dev_download(d_acc, 1)[0];
    check("sumsq (+=) vs dsc_opt_sumsq", fabs(got - ref) / ref, 1e-12);
    check_true("sumsq leaves the overflow flag clear on finite data",
               dev_download(d_flag, 1)[0] == 0);
    // A range that is not 16-byte aligned takes the scalar loads.
    double *d_acc1 = dev_upload(std::vector<double>(1, 0.0));
    DS(dsc__cuda_opt_sumsq(d_acc1, NULL, d_scr, d_g + 1, n - 1, 0.5f, NULL));
    SYNC();
    double ref1 = dsc_opt_sumsq(g.data() + 1, n - 1, 0.5f, &nonfinite);
    check("sumsq of an unaligned range vs dsc_opt_sumsq",
          fabs(dev_download(d_acc1, 1)[0] - ref1) / ref1, 1e-12);
    cudaFree(d_acc1);
    float *d_coef = dev_alloc<float>(1);
    DS(dsc__cuda_opt_clip_coef(d_coef, d_acc, 1.0f, NULL));
    SYNC();
    double want = 1.0 / (sqrt(got) + 1e-6);
    check("clip coefficient", fabs(dev_download(d_coef, 1)[0] - want) / want, 1e-6);
    g[n / 3] = INFINITY;
    CK(cudaMemcpy(d_g, g.data(), n * 4, cudaMemcpyHostToDevice));
    DS(dsc__cuda_opt_sumsq(d_acc, d_flag, d_scr, d_g, n, 1.0f, NULL));
    SYNC();
    check_true("sumsq sets the overflow flag on an inf gradient", dev_download(d_flag, 1)[0] == 1);
    cudaFree(d_g), cudaFree(d_acc), cudaFree(d_scr), cudaFree(d_flag), cudaFree(d_coef);
}

// AdamW with a bf16 copy: 16 bytes read and 14 written per element.
static void time_adamw(void) {
    const size_t n = 124475904; // GPT-2 124M's parameter count
    float *d_p, *d_g, *d_m, *d_v;
    uint16_t *d_o;
    CK(cudaMalloc(&d_p, n * 4));
    CK(cudaMalloc(&d_g, n * 4));
    CK(cudaMalloc(&d_m, n * 4));
    CK(cudaMalloc(&d_v, n * 4));
    CK(cudaMalloc(&d_o, n * 2));
    CK(cudaMemset(d_p, 0x3c, n * 4));
    CK(cudaMemset(d_g, 0x3b, n * 4));
    CK(cudaMemset(d_m, 0, n * 4));
    CK(cudaMemset(d_v, 0, n * 4));
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAMW, &h);
    h.weight_decay = 0.1f;
    int step = 0;
    double ms = time_ms(
        [&] {
            dsc__cuda_opt_step(&h, ++step, d_p, d_g, d_m, d_v, n, 1.0f, NULL, d_o, DSC_OPT_OUT_BF16,
                               NULL);
        },
        2, 10);
    // the same step on arrays one element off 16-byte alignment: the one-element-a-thread kernel
    double ms1 = time_ms(
        [&] {
            dsc__cuda_opt_step(&h, ++step, d_p + 1, d_g + 1, d_m + 1, d_v + 1, n - 1, 1.0f, NULL,
                               d_o + 1, DSC_OPT_OUT_BF16, NULL);
        },
        2, 10);
    double *d_acc, *d_scr;
    CK(cudaMalloc(&d_acc, 8));
    CK(cudaMalloc(&d_scr, 8 * DSC_CUDA_SUMSQ_SCRATCH));
    double ms_n =
        time_ms([&] { dsc__cuda_opt_sumsq(d_acc, NULL, d_scr, d_g, n, 1.0f, NULL); }, 2, 10);
    SYNC();
    printf("time AdamW step + bf16 copy, %zu params: %.3f ms, %.0f GB/s\n", n, ms,
           30.0 * n / ms / 1e6);
    printf("time AdamW step + bf16 copy, one element off 16-byte alignment (an element a "
           "thread): %.3f ms, %.0f GB/s\n", ms1, 30.0 * (n - 1) / ms1 / 1e6);
    printf("time grad-norm sum of squares, %zu params: %.3f ms, %.0f GB/s\n", n, ms_n,
           4.0 * n / ms_n / 1e6);
    cudaFree(d_p), cudaFree(d_g), cudaFree(d_m), cudaFree(d_v), cudaFree(d_o), cudaFree(d_acc),
        cudaFree(d_scr);
}

int main(void) {
    require_device("test_cuda_optim");
    DS(dsc_opt_simd_force("scalar")); // the reference path: no fused multiply-adds
    const opt_case cases[] = {
        {"AdamW wd 0.1", DSC_OPT_ADAMW, 0.1f, true, false, 0.0f},
        {"Adam (L2) wd 0.01", DSC_OPT_ADAM, 0.01f, false, false, 0.0f},
        {"Adam, no decay", DSC_OPT_ADAM, 0.0f, true, false, 0.0f},
        {"Lion wd 0.1", DSC_OPT_LION, 0.1f, false, false, 0.0f},
        {"SGD momentum 0.9 nesterov wd 0.01", DSC_OPT_SGD, 0.01f, false, true, 0.9f},
        {"SGD plain", DSC_OPT_SGD, 0.0f, false, false, 0.0f},
    };
    for (const opt_case &c : cases) {
        test_step(c, DSC_OPT_OUT_BF16, false);
        test_step(c, DSC_OPT_OUT_NONE, true);
    }
    test_step(cases[0], DSC_OPT_OUT_FP16, false);
    test_sumsq();
    if (!small_mode()) time_adamw();
    return finish("test_cuda_optim");
}
