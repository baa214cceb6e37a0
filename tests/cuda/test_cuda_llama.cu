// The GPU Llama family (model/llama/llama_cuda.h, through its device table) against the CPU model
// (model/llama/llama.h, fp32, itself checked against transformers in tests/model) on small
// configurations that cover grouped-query and multi-query attention, tied and untied heads,
// Qwen2's q/k/v biases, Qwen3's per-head q/k norms (fused with the rotation), llama3 rope
// scaling and a vocabulary that is not a multiple of 64: same
// parameters (rounded to the GPU's 16-bit type for both), same tokens; the loss and every
// parameter's gradient must agree within 16-bit tolerances. bf16 and fp16 (under a loss scale of
// 1024, divided out before comparing), masked targets, bitwise repeatable passes, the train step
// bitwise equal to forward + backward, and "fresh" gradients (=) equal to zeroed then added (+=).
//
// With --bench SPEC B T [STEPS] it instead times training steps of a published shape (e.g.
// smollm2-360M 8 2048) on random tokens: forward + backward, and the whole step with a fused
// AdamW over the flat fp32 master weights (median of STEPS, after warm-up), with MFU by
// dsc_llama_flops_per_token.
#include "cuda_test.h" // require_device, check, rel_err, dev_*, randn

extern "C" {
#include "cuda/kernels.h"           // dsc__cuda_f32_to_16
#include "model/llama/llama_cuda.h" // dsc__llama_device_ops
#include "engine/gpu/optim.h"       // dsc__cuda_opt_step
#include "model/llama/llama.h"      // dsc_llama_* (CPU reference)
}

#define TOL_LOSS 1e-2
#define TOL_GRAD_ALL 3e-2
#define TOL_GRAD_ONE 8e-2
#define TOL_LOSS_F16 1e-3
#define TOL_GRAD_ALL_F16 1e-2
#define TOL_GRAD_ONE_F16 3e-2
#define LOSS_SCALE_F16 1024.0f

static const struct dsc_model_device_ops *ops = &dsc__llama_device_ops;

// Flat parameter storage: tensor i at offset[i] (each 256-byte aligned), as an engine keeps it.
struct flat {
    std::vector<size_t> off, numel;
    size_t total = 0;
    // gaps: 64 unused elements after every tensor, so that no two lie end to end (the GPU model
    // then runs one product per tensor instead of joining q, k, v and gate, up)
    explicit flat(const dsc_llama_config &c, bool gaps = false) {
        for (int i = 0; i < dsc_llama_num_tensors(&c); i++) {
            dsc_llama_tensor_info info;
            dsc_llama_tensor_info_get(&c, i, &info);
            off.push_back(total);
            numel.push_back((size_t)info.numel);
            total += ((size_t)info.numel + 63) / 64 * 64 + (gaps ? 64 : 0);
        }
    }
};

template <typename T> static std::vector<T *> views(T *base, const flat &f) {
    std::vector<T *> v;
    for (size_t o : f.off)
        v.push_back(base + o);
    return v;
}

typedef struct shape {
    const char *name;
    int n_layer, n_head, n_kv_head, vocab, tied, qkv_bias, rope;
    int head_dim; // 0: 64
    int qk_norm;  // Qwen3's per-head q/k norms
} shape;

static dsc_llama_config config_of(const shape &s) {
    dsc_llama_config c;
    memset(&c, 0, sizeof c);
    c.n_layer = s.n_layer, c.n_head = s.n_head, c.n_kv_head = s.n_kv_head;
    c.head_dim = s.head_dim ? s.head_dim : 64;
    c.hidden = 64 * s.n_head, c.intermediate = 320, c.vocab_size = s.vocab, c.max_seq_len = 80;
    c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.tied = s.tied, c.qkv_bias = s.qkv_bias;
    c.rope_scaling = s.rope, c.qk_norm = s.qk_norm;
    if (s.rope == DSC_LLAMA_ROPE_LINEAR) c.rope_factor = 2.0;
    if (s.rope == DSC_LLAMA_ROPE_LLAMA3) {
        c.rope_factor = 8.0, c.rope_low_freq_factor = 1.0, c.rope_high_freq_factor = 4.0;
        c.rope_original_max_pos = 32;
    }
    return c;
}

static void run_compare(const shape &s, bool f16, bool masked, bool gaps = false) {
    dsc_llama_config c = config_of(s);
    int B = 3, T = 70, BT = B * T;
    flat f(c, gaps);
    std::vector<float> params(f.total, 0.0f);
    std::vector<float *> pv = views(params.data(), f);
    dsc_llama_init_weights(&c, pv.data(), 1234);
    for (size_t i = 0; i < f.total; i++) // norms and biases away from 1 and 0 (their paths)
        params[i] += (float)(0.05 * normal());
    std::vector<uint16_t> p16 = to_16(params, f16);
    std::vector<float> rounded = from_16(p16, f16); // both models see the 16-bit values
    std::vector<float *> rv = views(rounded.data(), f);
    std::vector<int32_t> in(BT), tg(BT);
    for (int i = 0; i < BT; i++)
        in[i] = (int32_t)(rng_next() % c.vocab_size), tg[i] = (int32_t)(rng_next() % c.vocab_size);
    in[5] = in[9] = in[17] = 3; // repeated tokens through the embedding backward
    for (int i = 0; masked && i < BT; i++)
        if (i % 3 != 2) tg[i] = -1;

    dsc_llama *cpu = NULL;
    DS(dsc_llama_create(&cpu, &c, B, T));
    std::vector<float> gcpu(f.total, 0.0f);
    std::vector<float *> gv = views(gcpu.data(), f);
    float loss_cpu = 0;
    DS(dsc_llama_forward(cpu, rv.data(), in.data(), tg.data(), B, T, NULL, &loss_cpu));
    DS(dsc_llama_backward(cpu, rv.data(), gv.data(), 1.0f, NULL));
    dsc_llama_destroy(cpu);

    uint16_t *d_p = dev_upload(p16);
    float *d_g = dev_alloc<float>(f.total);
    std::vector<const uint16_t *> dpv;
    for (size_t o : f.off)
        dpv.push_back(d_p + o);
    std::vector<float *> dgv = views(d_g, f);
    void *gpu = NULL;
    DS(ops->create(&c, B, T, NULL, NULL, &gpu));
    ops->set_fp16(gpu, f16);
    float scale = f16 ? LOSS_SCALE_F16 : 1.0f;
    char name[256], what[96];
    snprintf(what, sizeof what, " %s%s%s%s", s.name, masked ? ", masked" : "",
             gaps ? ", tensors apart" : "", type_tag(f16));
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
        snprintf(name, sizeof name, "llama gpu pass is bitwise repeatable%s", what);
        check_true(name, g == g1);
    }
    { // the train step: bitwise forward + backward; fresh (=) over garbage: bitwise zero + add
        float loss_step = 0;
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(ops->train_step(gpu, dpv.data(), dgv.data(), in.data(), tg.data(), B, T, scale,
                           &loss_step));
        SYNC();
        std::vector<float> g = dev_download(d_g, f.total);
        snprintf(name, sizeof name, "llama gpu train step == forward + backward, bitwise%s", what);
        check_true(name, g == g1 && loss_step == loss_gpu);
        CK(cudaMemset(d_g, 0x7f, f.total * 4)); // stale values the fresh pass must overwrite
        ops->set_grads_fresh(gpu, true);
        DS(ops->train_step(gpu, dpv.data(), dgv.data(), in.data(), tg.data(), B, T, scale,
                           &loss_step));
        ops->set_grads_fresh(gpu, false);
        SYNC();
        std::vector<float> gf = dev_download(d_g, f.total);
        bool same = true; // padding between tensors is not a gradient: compare the tensors
        for (size_t i = 0; i < f.off.size(); i++)
            same = same && !memcmp(&gf[f.off[i]], &g1[f.off[i]], f.numel[i] * 4);
        snprintf(name, sizeof name, "llama gpu fresh gradients (=) == zeroed + added%s", what);
        check_true(name, same);
    }
    { // activation checkpointing: each layer recomputed in the backward, gradients bitwise
        dsc_llama_config rc = c;
        rc.recompute = 1;
        void *gr = NULL;
        DS(ops->create(&rc, B, T, NULL, NULL, &gr));
        ops->set_fp16(gr, f16);
        float loss_rc = 0;
        CK(cudaMemset(d_g, 0, f.total * 4));
        DS(ops->train_step(gr, dpv.data(), dgv.data(), in.data(), tg.data(), B, T, scale,
                           &loss_rc));
        SYNC();
        std::vector<float> g = dev_download(d_g, f.total);
        snprintf(name, sizeof name, "llama gpu recompute (activation checkpointing) == kept "
                 "activations, bitwise%s", what);
        check_true(name, g == g1 && loss_rc == loss_gpu);
        snprintf(name, sizeof name, "llama gpu recompute takes less device memory%s", what);
        check_true(name, ops->act_bytes(&rc, B, T) < ops->act_bytes(&c, B, T));
        ops->destroy(gr);
    }
    for (float &x : g1)
        x /= scale;
    ops->destroy(gpu);
    printf("llama loss%s: cpu %.6f gpu %.6f\n", what, loss_cpu, loss_gpu);
    snprintf(name, sizeof name, "llama loss vs CPU model%s", what);
    check(name, fabs(loss_gpu - loss_cpu) / fabs(loss_cpu), f16 ? TOL_LOSS_F16 : TOL_LOSS);
    double worst = 0;
    int worst_i = 0;
    for (size_t i = 0; i < f.off.size(); i++) {
        double e = rel_err(&g1[f.off[i]], &gcpu[f.off[i]], f.numel[i]);
        if (!(e <= worst)) worst = e, worst_i = (int)i;
    }
    std::vector<float> a, b; // every tensor, without the padding
    for (size_t i = 0; i < f.off.size(); i++) {
        a.insert(a.end(), g1.begin() + f.off[i], g1.begin() + f.off[i] + f.numel[i]);
        b.insert(b.end(), gcpu.begin() + f.off[i], gcpu.begin() + f.off[i] + f.numel[i]);
    }
    dsc_llama_tensor_info info;
    dsc_llama_tensor_info_get(&c, worst_i, &info);
    snprintf(name, sizeof name, "llama all gradients vs CPU model%s", what);
    check(name, rel_err(a.data(), b.data(), a.size()), f16 ? TOL_GRAD_ALL_F16 : TOL_GRAD_ALL);
    snprintf(name, sizeof name, "llama worst tensor gradient (%s)%s", info.name, what);
    check(name, worst, f16 ? TOL_GRAD_ONE_F16 : TOL_GRAD_ONE);
    cudaFree(d_p), cudaFree(d_g);
}

// A head size the attention kernels do not take is refused at create, naming it.
static void refusals(void) {
    dsc_llama_config c = config_of({"hd96", 1, 2, 1, 256, 1, 0, DSC_LLAMA_ROPE_NONE, 96, 0});
    c.head_dim = 96;
    void *gpu = NULL;
    dsc_status st = ops->create(&c, 1, 8, NULL, NULL, &gpu);
    check_true("llama gpu refuses head_dim 96, naming it",
               st == DSC_ERR_INVALID_ARG && strstr(dsc_last_error(), "head_dim 96") && !gpu);
}

static int bench(const char *spec, int B, int T, int steps) {
    dsc_llama_config c;
    DS(dsc_llama_config_parse(spec, 0, T, &c));
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
    {
        std::vector<float> h(n, 0.0f);
        std::vector<float *> pv = views(h.data(), f);
        dsc_llama_init_weights(&c, pv.data(), 42);
        CK(cudaMemcpy(d_master, h.data(), n * 4, cudaMemcpyHostToDevice));
        DS(dsc__cuda_f32_to_bf16(d_p16, d_master, (int64_t)n, NULL));
    }
    std::vector<const uint16_t *> dpv;
    for (size_t o : f.off)
        dpv.push_back(d_p16 + o);
    std::vector<float *> dgv = views(d_grad, f);
    std::vector<int32_t> in((size_t)B * T), tg((size_t)B * T);
    for (size_t i = 0; i < in.size(); i++)
        in[i] = (int32_t)(rng_next() % c.vocab_size), tg[i] = (int32_t)(rng_next() % c.vocab_size);
    dsc_opt_hparams h;
    dsc_opt_hparams_defaults(DSC_OPT_ADAMW, &h);
    h.lr = 1e-4f, h.weight_decay = 0.1f;
    double tokens = (double)B * T, flops = dsc_llama_flops_per_token(&c, T) * tokens;
    void *m = NULL;
    DS(ops->create(&c, B, T, NULL, NULL, &m));
    int step = 0;
    float loss = 0;
    auto fwdbwd = [&] { DS(ops->train_step(m, dpv.data(), dgv.data(), in.data(), tg.data(), B, T,
                                           1.0f, NULL)); };
    auto train = [&] {
        ops->set_grads_fresh(m, true);
        fwdbwd();
        DS(dsc__cuda_opt_step(&h, ++step, d_master, d_grad, d_m, d_v, n, 1.0f, NULL, d_p16,
                              DSC_OPT_OUT_BF16, NULL));
    };
    double ms_fb = time_ms(fwdbwd, 2, steps);
    double ms_tr = time_ms(train, 2, steps);
    DS(ops->forward(m, dpv.data(), in.data(), tg.data(), B, T, &loss));
    SYNC();
    printf("bench %s B=%d T=%d: fwd+bwd %.2f ms = %.0f tok/s (%.1f%% MFU of 989 TFLOP/s); train "
           "step (fwd + bwd + AdamW) %.2f ms = %.0f tok/s (%.1f%% MFU); loss %.4f after %d "
           "steps\n",
           spec, B, T, ms_fb, tokens / ms_fb * 1e3, 100.0 * flops / (ms_fb * 1e-3) / 989e12, ms_tr,
           tokens / ms_tr * 1e3, 100.0 * flops / (ms_tr * 1e-3) / 989e12, loss, step);
    check_true("bench loss is finite", isfinite(loss));
    ops->destroy(m);
    cudaFree(d_master), cudaFree(d_grad), cudaFree(d_m), cudaFree(d_v), cudaFree(d_p16);
    return finish("bench_llama_cuda");
}

int main(int argc, char **argv) {
    require_device("test_cuda_llama");
    if (argc >= 5 && strcmp(argv[1], "--bench") == 0)
        return bench(argv[2], (int)strtol(argv[3], NULL, 10), (int)strtol(argv[4], NULL, 10),
                     argc >= 6 ? (int)strtol(argv[5], NULL, 10) : 10);
    // name, layers, heads, kv heads, vocab, tied, qkv bias, rope scaling, head_dim, q/k norms
    const shape shapes[] = {
        {"gqa tied", 2, 4, 2, 1000, 1, 0, DSC_LLAMA_ROPE_NONE, 64, 0},
        {"mqa untied llama3-rope", 2, 4, 1, 1024, 0, 0, DSC_LLAMA_ROPE_LLAMA3, 64, 0},
        {"qwen2 qkv-bias", 2, 2, 2, 777, 1, 1, DSC_LLAMA_ROPE_LINEAR, 64, 0},
        {"head_dim 128 untied", 2, 4, 2, 512, 0, 0, DSC_LLAMA_ROPE_LLAMA3, 128, 0},
        // Qwen3: q and k wider than the hidden size (2 heads of 128 on hidden 128), as qwen3-0.6B
        {"qwen3 q/k-norm hd128 tied", 2, 2, 1, 1000, 1, 0, DSC_LLAMA_ROPE_NONE, 128, 1},
        {"qwen3 q/k-norm hd64 untied", 2, 4, 2, 777, 0, 0, DSC_LLAMA_ROPE_NONE, 64, 1},
    };
    for (const shape &s : shapes)
        for (int f16 = 0; f16 < 2; f16++) run_compare(s, f16, false);
    run_compare(shapes[4], false, true);       // Qwen3 with masked targets
    run_compare(shapes[5], false, false, true); // and tensors apart
    run_compare(shapes[0], false, true);
    run_compare(shapes[1], false, false, true);
    run_compare(shapes[1], true, false, true);
    run_compare(shapes[2], true, true);
    refusals();
    return finish("test_cuda_llama");
}
