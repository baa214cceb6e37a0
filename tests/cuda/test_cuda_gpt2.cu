// The GPU GPT-2 (cuda/gpt2_cuda.h) against the CPU model (model/gpt2/gpt2.h) on a small config:
// same parameters (bf16-rounded for both), same tokens; the loss and every parameter's gradient
// must agree within bf16 tolerances (the GPU keeps activations in bf16). Run with and without
// the fused GELU epilogues; the GPU pass must be bitwise repeatable.
//
// With --bench SPEC B T [STEPS] it instead times training steps of a GPT-2 of that spec (e.g.
// gpt2-124M 16 1024) on random tokens: forward + backward, and the whole step with gradient
// zeroing and a fused AdamW over the flat fp32 master weights (median of STEPS, after warm-up).
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn

extern "C" {
#include "cuda/gpt2_cuda.h"    // dsc_gpt2_cuda_*
#include "cuda/gpt2_kernels.h" // dsc__cuda_f32_to_bf16
#include "cuda/optim.h"        // dsc__cuda_opt_step
#include "model/gpt2/gpt2.h"   // dsc_gpt2_* (CPU reference)
}

#define TOL_LOSS 1e-2
#define TOL_GRAD_ALL 3e-2 // all gradients together
#define TOL_GRAD_ONE 8e-2 // the worst single tensor (small bias gradients are noisier)

// Flat parameter storage: tensor i at offset[i] (each 256-byte aligned), as an engine keeps it.
struct flat {
    std::vector<size_t> off, numel;
    size_t total = 0;
    explicit flat(const dsc_gpt2_config &c) {
        for (int i = 0; i < dsc_gpt2_num_tensors(&c); i++) {
            dsc_gpt2_tensor_info info;
            dsc_gpt2_tensor_info_get(&c, i, &info);
            off.push_back(total);
            numel.push_back((size_t)info.numel);
            total += ((size_t)info.numel + 63) / 64 * 64;
        }
    }
};

template <typename T> static std::vector<T *> views(T *base, const flat &f) {
    std::vector<T *> v;
    for (size_t o : f.off)
        v.push_back(base + o);
    return v;
}

static void run_compare(bool fused) {
    dsc_gpt2_config c = {2, 2, 128, 1000, 64}; // n_layer, n_head, n_embd, vocab, max_seq_len
    int B = 3, T = 48, BT = B * T;
    flat f(c);
    std::vector<float> params(f.total, 0.0f);
    std::vector<float *> pv = views(params.data(), f);
    dsc_gpt2_init_weights(&c, pv.data(), 1234);
    // perturb so that biases and layernorm weights are not 0 and 1 (their paths get tested)
    for (size_t i = 0; i < f.total; i++)
        params[i] += (float)(0.05 * normal());
    std::vector<uint16_t> p16 = to_bf16(params); // both models see the bf16 values
    std::vector<int32_t> in(BT), tg(BT);
    for (int i = 0; i < BT; i++)
        in[i] = (int32_t)(rng_next() % c.vocab_size), tg[i] = (int32_t)(rng_next() % c.vocab_size);
    if (fused) in[5] = in[9] = in[17] = 3; // repeated tokens through the embedding backward

    // CPU reference
    dsc_gpt2 *cpu = NULL;
    DS(dsc_gpt2_create(&cpu, &c, B, T));
    std::vector<float> gcpu(f.total, 0.0f);
    std::vector<float *> gv = views(gcpu.data(), f);
    float loss_cpu = 0;
    DS(dsc_gpt2_forward(cpu, pv.data(), in.data(), tg.data(), B, T, NULL, &loss_cpu));
    DS(dsc_gpt2_backward(cpu, pv.data(), gv.data(), 1.0f, NULL));
    dsc_gpt2_destroy(cpu);

    // GPU
    uint16_t *d_p = dev_upload(p16);
    float *d_g = dev_alloc<float>(f.total);
    std::vector<const uint16_t *> dpv;
    for (size_t o : f.off)
        dpv.push_back(d_p + o);
    std::vector<float *> dgv = views(d_g, f);
    dsc_gpt2_cuda *gpu = NULL;
    DS(dsc_gpt2_cuda_create(&gpu, &c, B, T, NULL));
    dsc_gpt2_cuda_set_fused_gelu(gpu, fused);
    std::vector<float> g1;
    float loss_gpu = 0;
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(dsc_gpt2_cuda_forward(gpu, dpv.data(), in.data(), tg.data(), B, T, &loss_gpu));
        DS(dsc_gpt2_cuda_backward(gpu, dpv.data(), dgv.data(), 1.0f));
        SYNC();
        std::vector<float> g = dev_download(d_g, f.total);
        if (rep == 0)
            g1 = g;
        else
            check_true(fused ? "gpt2 gpu (fused GELU) pass is bitwise repeatable"
                             : "gpt2 gpu pass is bitwise repeatable",
                       g == g1);
    }
    dsc_gpt2_cuda_destroy(gpu);
    char name[128];
    printf("gpt2 loss: cpu %.6f gpu %.6f\n", loss_cpu, loss_gpu);
    snprintf(name, sizeof name, "gpt2 loss vs CPU model%s", fused ? " (fused GELU)" : "");
    check(name, fabs(loss_gpu - loss_cpu) / fabs(loss_cpu), TOL_LOSS);
    double worst = 0;
    int worst_i = 0;
    for (size_t i = 0; i < f.off.size(); i++) {
        double e = rel_err(&g1[f.off[i]], &gcpu[f.off[i]], f.numel[i]);
        dsc_gpt2_tensor_info info;
        dsc_gpt2_tensor_info_get(&c, (int)i, &info);
        printf("  grad %-24s rel err %.3e\n", info.name, e);
        if (!(e <= worst)) worst = e, worst_i = (int)i;
    }
    dsc_gpt2_tensor_info info;
    dsc_gpt2_tensor_info_get(&c, worst_i, &info);
    snprintf(name, sizeof name, "gpt2 all gradients vs CPU model%s", fused ? " (fused GELU)" : "");
    check(name, rel_err(g1.data(), gcpu.data(), f.total), TOL_GRAD_ALL);
    snprintf(name, sizeof name, "gpt2 worst tensor gradient (%s)", info.name);
    check(name, worst, TOL_GRAD_ONE);
    cudaFree(d_p), cudaFree(d_g);
}

static int bench(const char *spec, int B, int T, int steps) {
    dsc_gpt2_config c;
    DS(dsc_gpt2_config_parse(spec, 50257, 1024, &c));
    flat f(c);
    size_t n = f.total;
    float *d_master, *d_grad, *d_m, *d_v;
    uint16_t *d_p16;
    CK(cudaMalloc(&d_master, n * 4));
    CK(cudaMalloc(&d_grad, n * 4));
    CK(cudaMalloc(&d_m, n * 4));
    CK(cudaMalloc(&d_v, n * 4));
    CK(cudaMalloc(&d_p16, n * 2));
    CK(cudaMemset(d_m, 0, n * 4));
    CK(cudaMemset(d_v, 0, n * 4));
    CK(cudaMemset(d_grad, 0, n * 4));
    { // initialise on the host once (GPT-2 init), upload, make the bf16 copy
        std::vector<float> h(n, 0.0f);
        std::vector<float *> pv = views(h.data(), f);
        dsc_gpt2_init_weights(&c, pv.data(), 42);
        CK(cudaMemcpy(d_master, h.data(), n * 4, cudaMemcpyHostToDevice));
        DS(dsc__cuda_f32_to_bf16(d_p16, d_master, (int64_t)n, NULL));
    }
    std::vector<const uint16_t *> dpv;
    for (size_t o : f.off)
        dpv.push_back(d_p16 + o);
    std::vector<float *> dgv = views(d_grad, f);
    std::vector<int32_t> in((size_t)B * T), tg((size_t)B * T);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = (int32_t)(rng_next() % 50257), tg[i] = (int32_t)(rng_next() % 50257);
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAMW, &h);
    h.lr = 1e-4f, h.weight_decay = 0.1f;
    double tokens = (double)B * T, flops = dsc_gpt2_flops_per_token(&c, T) * tokens;
    for (int fused = 0; fused < 2; fused++) {
        dsc_gpt2_cuda *m = NULL;
        DS(dsc_gpt2_cuda_create(&m, &c, B, T, NULL));
        dsc_gpt2_cuda_set_fused_gelu(m, fused);
        int step = 0;
        float loss = 0;
        auto fwdbwd = [&] {
            DS(dsc_gpt2_cuda_forward(m, dpv.data(), in.data(), tg.data(), B, T, NULL));
            DS(dsc_gpt2_cuda_backward(m, dpv.data(), dgv.data(), 1.0f));
        };
        auto train = [&] {
            CK(cudaMemsetAsync(d_grad, 0, n * 4, 0));
            fwdbwd();
            DS(dsc__cuda_opt_step(&h, ++step, d_master, d_grad, d_m, d_v, n, 1.0f, NULL, d_p16,
                                  DSC_OPT_OUT_BF16, NULL));
        };
        double ms_fb = time_ms(fwdbwd, 2, steps);
        double ms_tr = time_ms(train, 2, steps);
        DS(dsc_gpt2_cuda_forward(m, dpv.data(), in.data(), tg.data(), B, T, &loss));
        SYNC();
        printf("bench %s B=%d T=%d%s: fwd+bwd %.2f ms = %.0f tok/s (%.1f%% MFU of 989 TFLOP/s); "
               "train step (zero + fwd + bwd + AdamW) %.2f ms = %.0f tok/s (%.1f%% MFU); loss %.4f "
               "after %d steps\n",
               spec, B, T, fused ? " fused-GELU" : "", ms_fb, tokens / ms_fb * 1e3,
               100.0 * flops / (ms_fb * 1e-3) / 989e12, ms_tr, tokens / ms_tr * 1e3,
               100.0 * flops / (ms_tr * 1e-3) / 989e12, loss, step);
        check_true("bench loss is finite", isfinite(loss));
        dsc_gpt2_cuda_destroy(m);
    }
    cudaFree(d_master), cudaFree(d_grad), cudaFree(d_m), cudaFree(d_v), cudaFree(d_p16);
    return finish("bench_gpt2_cuda");
}

int main(int argc, char **argv) {
    require_device("test_cuda_gpt2");
    if (argc >= 5 && strcmp(argv[1], "--bench") == 0)
        return bench(argv[2], (int)strtol(argv[3], NULL, 10), (int)strtol(argv[4], NULL, 10),
                     argc >= 6 ? (int)strtol(argv[5], NULL, 10) : 10);
    run_compare(false);
    run_compare(true);
    return finish("test_cuda_gpt2");
}
