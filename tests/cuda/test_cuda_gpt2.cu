// The GPU GPT-2 (model/gpt2/gpt2_cuda.h) against the CPU model (model/gpt2/gpt2.h) on a small
// config: same parameters (rounded to the GPU's 16-bit type for both), same tokens; the loss and
// every parameter's gradient must agree within 16-bit tolerances (the GPU keeps activations in bf16
// or fp16, the CPU computes in fp32). Run with and without the fused GELU epilogues, in bf16 and in
// fp16; fp16 runs its backward under a loss scale of 1024 (gradients compared after dividing it
// out) and must turn a loss scale of 2^32 into non-finite gradients (the overflow the loss scaler
// watches for). The GPU pass must be bitwise repeatable, and the train step (one pass
// over the logits for the loss and its gradient) bitwise equal to forward + backward.
//
// With --bench SPEC B T [STEPS] it instead times training steps of a GPT-2 of that spec (e.g.
// gpt2-124M 16 1024) on random tokens: forward + backward, and the whole step with gradient
// zeroing and a fused AdamW over the flat fp32 master weights (median of STEPS, after warm-up).
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn

extern "C" {
#include "model/gpt2/gpt2_cuda.h" // dsc__gpt2_device_ops, dsc__gpt2_cuda_set_fused_gelu
#include "cuda/kernels.h"         // dsc__cuda_f32_to_16
#include "engine/gpu/optim.h"     // dsc__cuda_opt_step
#include "model/gpt2/gpt2.h"      // dsc_gpt2_* (CPU reference)
}

#define TOL_LOSS 1e-2
#define TOL_GRAD_ALL 3e-2 // all gradients together
#define TOL_GRAD_ONE 8e-2 // the worst single tensor (small bias gradients are noisier)
// fp16 keeps 11 significant bits to bf16's 8
#define TOL_LOSS_F16 1e-3
#define TOL_GRAD_ALL_F16 1e-2
#define TOL_GRAD_ONE_F16 3e-2
#define LOSS_SCALE_F16 1024.0f

static const struct dsc_model_device_ops *ops = &dsc__gpt2_device_ops;

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

// masked: two targets in three are ignored (-1), as a loss mask leaves prompt tokens out.
static void run_compare(bool fused, bool f16, bool masked) {
    dsc_gpt2_config c = {2, 2, 128, 1000, 64, false, NULL}; // shape, recompute, lora
    int B = 3, T = 48, BT = B * T;
    flat f(c);
    std::vector<float> params(f.total, 0.0f);
    std::vector<float *> pv = views(params.data(), f);
    dsc_gpt2_init_weights(&c, pv.data(), 1234);
    // perturb so that biases and layernorm weights are not 0 and 1 (their paths get tested)
    for (size_t i = 0; i < f.total; i++)
        params[i] += (float)(0.05 * normal());
    std::vector<uint16_t> p16 = to_16(params, f16); // both models see the 16-bit values
    std::vector<int32_t> in(BT), tg(BT);
    for (int i = 0; i < BT; i++)
        in[i] = (int32_t)(rng_next() % c.vocab_size), tg[i] = (int32_t)(rng_next() % c.vocab_size);
    if (fused) in[5] = in[9] = in[17] = 3; // repeated tokens through the embedding backward
    for (int i = 0; masked && i < BT; i++)
        if (i % 3 != 2) tg[i] = -1;

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
    void *gpu = NULL;
    DS(ops->create(&c, B, T, NULL, NULL, &gpu));
    dsc__gpt2_cuda_set_fused_gelu(gpu, fused);
    ops->set_fp16(gpu, f16);
    float scale = f16 ? LOSS_SCALE_F16 : 1.0f;
    const char *what = masked ? (fused ? " (fused GELU, masked targets)" : " (masked targets)")
                              : fused ? " (fused GELU)" : "";
    char name[128];
    std::vector<float> g1;
    float loss_gpu = 0;
    for (int rep = 0; rep < 2; rep++) {
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(ops->forward(gpu, dpv.data(), in.data(), tg.data(), B, T, &loss_gpu));
        DS(ops->backward(gpu, dpv.data(), dgv.data(), scale));
        SYNC();
        std::vector<float> g = dev_download(d_g, f.total);
        if (rep == 0) {
            g1 = g;
            continue;
        }
        snprintf(name, sizeof name, "gpt2 gpu%s pass is bitwise repeatable%s", what, type_tag(f16));
        check_true(name, g == g1);
    }
    { // the training step's one-pass cross-entropy: bitwise forward + backward
        float loss_step = 0;
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(ops->train_step(gpu, dpv.data(), dgv.data(), in.data(), tg.data(), B, T, scale,
                                    &loss_step));
        SYNC();
        std::vector<float> g = dev_download(d_g, f.total);
        snprintf(name, sizeof name, "gpt2 gpu%s train step == forward + backward, bitwise%s", what,
                 type_tag(f16));
        check_true(name, g == g1 && loss_step == loss_gpu);
    }
    { // activation checkpointing: each layer recomputed in the backward, gradients bitwise;
      // three steps, so that the CUDA graph of the step is replayed too
        dsc_gpt2_config rc = c;
        rc.recompute = true;
        void *gr = NULL;
        DS(ops->create(&rc, B, T, NULL, NULL, &gr));
        dsc__gpt2_cuda_set_fused_gelu(gr, fused);
        ops->set_fp16(gr, f16);
        bool same = true;
        for (int k = 0; k < 3; k++) {
            float loss_rc = 0;
            CK(cudaMemset(d_g, 0, f.total * 4));
            DS(ops->train_step(gr, dpv.data(), dgv.data(), in.data(), tg.data(), B, T,
                                        scale, &loss_rc));
            SYNC();
            same = same && dev_download(d_g, f.total) == g1 && loss_rc == loss_gpu;
        }
        snprintf(name, sizeof name, "gpt2 gpu%s recompute (activation checkpointing) == kept "
                 "activations, bitwise, 3 steps%s", what, type_tag(f16));
        check_true(name, same);
        snprintf(name, sizeof name, "gpt2 gpu recompute takes less device memory%s", what);
        check_true(name, ops->act_bytes(&rc, B, T) <
                             ops->act_bytes(&c, B, T));
        ops->destroy(gr);
    }
    if (masked) { // replayed steps (a CUDA graph from the third) keep the loss; a new mask's
                  // divisor is not the captured one's
        float l[4] = {0, 0, 0, 0}, want = 0;
        for (int k = 0; k < 3; k++)
            DS(ops->train_step(gpu, dpv.data(), dgv.data(), in.data(), tg.data(), B, T,
                                        scale, &l[k]));
        std::vector<int32_t> tg2 = tg;
        for (int i = 0; i < BT; i += 2)
            tg2[i] = -1;
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(ops->train_step(gpu, dpv.data(), dgv.data(), in.data(), tg2.data(), B, T,
                                    scale, &l[3]));
        SYNC();
        std::vector<float> ga = dev_download(d_g, f.total);
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(ops->forward(gpu, dpv.data(), in.data(), tg2.data(), B, T, &want));
        DS(ops->backward(gpu, dpv.data(), dgv.data(), scale));
        SYNC();
        std::vector<float> gb = dev_download(d_g, f.total);
        snprintf(name, sizeof name, "gpt2 gpu%s repeated and re-masked train steps%s", what,
                 type_tag(f16));
        check_true(name, l[0] == loss_gpu && l[1] == loss_gpu && l[2] == loss_gpu &&
                             l[3] == want && ga == gb);
    }
    for (float &x : g1)
        x /= scale; // exact: a power of two
    // fp16: a loss scale fp16 cannot hold; the overflow must reach the fp32 gradients
    if (f16) {
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(ops->forward(gpu, dpv.data(), in.data(), tg.data(), B, T, NULL));
        DS(ops->backward(gpu, dpv.data(), dgv.data(), 4294967296.0f));
        SYNC();
        std::vector<float> g = dev_download(d_g, f.total);
        size_t bad = 0;
        for (float x : g)
            bad += !isfinite(x);
        printf("gpt2 fp16, loss scale 2^32: %zu of %zu gradients not finite\n", bad, g.size());
        snprintf(name, sizeof name, "gpt2 gpu%s fp16: loss scale 2^32 overflows into the grads",
                 what);
        check_true(name, bad > 0);
    }
    ops->destroy(gpu);
    printf("gpt2 loss%s: cpu %.6f gpu %.6f\n", type_tag(f16), loss_cpu, loss_gpu);
    snprintf(name, sizeof name, "gpt2 loss vs CPU model%s%s", what, type_tag(f16));
    check(name, fabs(loss_gpu - loss_cpu) / fabs(loss_cpu), f16 ? TOL_LOSS_F16 : TOL_LOSS);
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
    snprintf(name, sizeof name, "gpt2 all gradients vs CPU model%s%s", what, type_tag(f16));
    check(name, rel_err(g1.data(), gcpu.data(), f.total), f16 ? TOL_GRAD_ALL_F16 : TOL_GRAD_ALL);
    snprintf(name, sizeof name, "gpt2 worst tensor gradient (%s)%s", info.name, type_tag(f16));
    check(name, worst, f16 ? TOL_GRAD_ONE_F16 : TOL_GRAD_ONE);
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
    for (int run = 0; run < 3; run++) { // bf16, bf16 with the GELU epilogues, fp16 with them
        bool fused = run > 0, f16 = run == 2;
        if (f16) DS(dsc__cuda_f32_to_16(d_p16, d_master, (int64_t)n, true, NULL));
        void *m = NULL;
        DS(ops->create(&c, B, T, NULL, NULL, &m));
        dsc__gpt2_cuda_set_fused_gelu(m, fused);
        ops->set_fp16(m, f16);
        int step = 0;
        float loss = 0;
        auto fwdbwd = [&] {
            DS(ops->forward(m, dpv.data(), in.data(), tg.data(), B, T, NULL));
            DS(ops->backward(m, dpv.data(), dgv.data(), f16 ? 1024.0f : 1.0f));
        };
        auto train = [&] {
            CK(cudaMemsetAsync(d_grad, 0, n * 4, 0));
            fwdbwd();
            DS(dsc__cuda_opt_step(&h, ++step, d_master, d_grad, d_m, d_v, n,
                                  f16 ? 1.0f / 1024.0f : 1.0f, NULL, d_p16,
                                  f16 ? DSC_OPT_OUT_FP16 : DSC_OPT_OUT_BF16, NULL));
        };
        double ms_fb = time_ms(fwdbwd, 2, steps);
        double ms_tr = time_ms(train, 2, steps);
        DS(ops->forward(m, dpv.data(), in.data(), tg.data(), B, T, &loss));
        SYNC();
        printf("bench %s B=%d T=%d%s%s: fwd+bwd %.2f ms = %.0f tok/s (%.1f%% MFU of 989 TFLOP/s); "
               "train step (zero + fwd + bwd + AdamW) %.2f ms = %.0f tok/s (%.1f%% MFU); loss %.4f "
               "after %d steps\n",
               spec, B, T, fused ? " fused-GELU" : "", f16 ? " fp16" : "", ms_fb,
               tokens / ms_fb * 1e3, 100.0 * flops / (ms_fb * 1e-3) / 989e12, ms_tr,
               tokens / ms_tr * 1e3, 100.0 * flops / (ms_tr * 1e-3) / 989e12, loss, step);
        check_true("bench loss is finite", isfinite(loss));
        ops->destroy(m);
    }
    cudaFree(d_master), cudaFree(d_grad), cudaFree(d_m), cudaFree(d_v), cudaFree(d_p16);
    return finish("bench_gpt2_cuda");
}

int main(int argc, char **argv) {
    require_device("test_cuda_gpt2");
    if (argc >= 5 && strcmp(argv[1], "--bench") == 0)
        return bench(argv[2], (int)strtol(argv[3], NULL, 10), (int)strtol(argv[4], NULL, 10),
                     argc >= 6 ? (int)strtol(argv[5], NULL, 10) : 10);
    for (int f16 = 0; f16 < 2; f16++) {
        run_compare(false, f16, false);
        run_compare(true, f16, false);
        run_compare(true, f16, true);
    }
    return finish("test_cuda_gpt2");
}
