// tests/cuda/test_dev_layers.cu - the device layer driver through its public API (dsc/model.h,
// dsc_model_dev_layers_*), driving a small family of this file's own, as a user's model would:
// L residual layers x' = x + w_l * tanh(x) over rows x C bf16 values, an embedding table read
// at fixed token ids, and a head whose loss is the mean over rows of x_L . h.
//
// Checks: the gradients against a float64 reference that rounds where the device rounds; the
// same bits with the layers recomputed (recompute 1) and with their inputs on the host
// (recompute 2); the hooks in the documented order; the training step as a CUDA graph (the third
// step of a key replays it: the family's callbacks are not called, the bits are the eager
// step's); a family that declines graphs, and hooks, keep every step eager; bad arguments are
// refused by name.
#include "cuda_test.h"

extern "C" {
#include "dsc/model.h" // dsc_model_dev_layers_*
}

enum { V = 7, C = 64, L = 4, B = 3, T = 32, R = B * T, NT = L + 2 };

typedef struct fam {
    dsc_model_dev_layers *drv;
    int recompute;
    cudaStream_t st;
    int32_t *tok;   // (R) token ids
    uint16_t *act;  // (blocks, R, C) tanh(x_l)
    float *logit;   // (R)
    float *dx;      // (R, C) the gradient of the current layer's input
    float *loss;    // (1)
    float dlogit;   // loss_scale / R of the last loss
    int calls;      // embed calls: counts eager and captured steps, not replays
    bool graph;     // graph_ok's answer
} fam;

static uint16_t *act_of(const fam *f, int l) {
    return f->act + dsc_model_dev_layers_block(f->recompute, l) * (size_t)R * C;
}

__device__ static float bf(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }
__device__ static uint16_t tobf(float x) { // round to nearest even, as dsc_fp32_to_bf16
    uint32_t u = __float_as_uint(x);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__global__ void embed_k(uint16_t *x, const uint16_t *emb, const int32_t *tok) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < R * C) x[i] = emb[tok[i / C] * C + i % C];
}
__global__ void layer_k(uint16_t *out, uint16_t *a, const uint16_t *x, const uint16_t *w) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= R * C) return;
    uint16_t t = tobf(tanhf(bf(x[i])));
    a[i] = t;
    out[i] = tobf(bf(x[i]) + bf(w[i % C]) * bf(t));
}
__global__ void head_k(float *logit, const uint16_t *x, const uint16_t *h) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= R) return;
    float s = 0;
    for (int c = 0; c < C; c++) s += bf(x[r * C + c]) * bf(h[c]);
    logit[r] = s;
}
__global__ void loss_k(float *loss, const float *logit) {
    if (threadIdx.x || blockIdx.x) return;
    float s = 0;
    for (int r = 0; r < R; r++) s += logit[r];
    *loss = s / R;
}
// dh[c] = sum_r x[r][c] g, dx[r][c] = g h[c]
__global__ void head_back_k(float *dh, float *dx, const uint16_t *x, const uint16_t *h, float g) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0;
    for (int r = 0; r < R; r++) {
        s += bf(x[r * C + c]) * g;
        dx[r * C + c] = g * bf(h[c]);
    }
    dh[c] = s;
}
// dw[c] = sum_r dx[r][c] a[r][c]; dx[r][c] *= 1 + w[c] (1 - a^2)
__global__ void layer_back_k(float *dw, float *dx, const uint16_t *a, const uint16_t *w) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0, wc = bf(w[c]);
    for (int r = 0; r < R; r++) {
        float t = bf(a[r * C + c]), d = dx[r * C + c];
        s += d * t;
        dx[r * C + c] = d * (1.0f + wc * (1.0f - t * t));
    }
    dw[c] = s;
}
__global__ void embed_back_k(float *demb, const float *dx, const int32_t *tok) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= V * C) return;
    int k = i / C, c = i % C;
    float s = 0;
    for (int r = 0; r < R; r++)
        if (tok[r] == k) s += dx[r * C + c];
    demb[i] = s;
}

static unsigned nb(int n) { return (unsigned)((n + 127) / 128); }
static dsc_status launched(void) {
    return cudaGetLastError() == cudaSuccess ? DSC_OK : DSC_ERR_CUDA;
}

static dsc_status op_embed(void *u, const uint16_t *const *p) {
    fam *f = (fam *)u;
    f->calls++;
    embed_k<<<nb(R * C), 128, 0, f->st>>>(dsc_model_dev_layers_input(f->drv, 0), p[0], f->tok);
    return launched();
}
static dsc_status op_layer(void *u, const uint16_t *const *p, int l) {
    fam *f = (fam *)u;
    layer_k<<<nb(R * C), 128, 0, f->st>>>(dsc_model_dev_layers_input(f->drv, l + 1), act_of(f, l),
                                         dsc_model_dev_layers_input(f->drv, l), p[1 + l]);
    return launched();
}
static dsc_status op_head(void *u, const uint16_t *const *p) {
    fam *f = (fam *)u;
    head_k<<<nb(R), 128, 0, f->st>>>(f->logit, dsc_model_dev_layers_input(f->drv, L), p[L + 1]);
    return launched();
}
static dsc_status op_loss(void *u, float scale) {
    fam *f = (fam *)u;
    f->dlogit = scale / R;
    loss_k<<<1, 32, 0, f->st>>>(f->loss, f->logit);
    return launched();
}
static dsc_status op_head_back(void *u, const uint16_t *const *p, float *const *g) {
    fam *f = (fam *)u;
    head_back_k<<<nb(C), 128, 0, f->st>>>(g[L + 1], f->dx, dsc_model_dev_layers_input(f->drv, L),
                                         p[L + 1], f->dlogit);
    return launched();
}
static dsc_status op_layer_back(void *u, const uint16_t *const *p, float *const *g, int l) {
    fam *f = (fam *)u;
    layer_back_k<<<nb(C), 128, 0, f->st>>>(g[1 + l], f->dx, act_of(f, l), p[1 + l]);
    return launched();
}
static dsc_status op_embed_back(void *u, const uint16_t *const *p, float *const *g) {
    (void)p;
    fam *f = (fam *)u;
    embed_back_k<<<nb(V * C), 128, 0, f->st>>>(g[0], f->dx, f->tok);
    return launched();
}
static bool op_graph_ok(const void *u) { return ((const fam *)u)->graph; }

static const dsc_model_dev_layers_ops ops = {op_embed,      op_layer,      op_head,
                                             op_loss,       op_head_back,  op_layer_back,
                                             op_embed_back, NULL,          op_graph_ok};

// ---- the host reference (float64, rounding to bf16 where the device does) ----

static double rbf(double x) { return dsc_bf16_to_fp32(dsc_fp32_to_bf16((float)x)); }

static std::vector<std::vector<double>> reference(const std::vector<std::vector<float>> &P,
                                                  const std::vector<int32_t> &tok, double g) {
    std::vector<std::vector<double>> x(L + 1, std::vector<double>(R * C)), a(L);
    for (int i = 0; i < R * C; i++) x[0][i] = P[0][tok[i / C] * C + i % C];
    for (int l = 0; l < L; l++) {
        a[l].resize(R * C);
        for (int i = 0; i < R * C; i++) {
            a[l][i] = rbf(tanh(x[l][i]));
            x[l + 1][i] = rbf(x[l][i] + P[1 + l][i % C] * a[l][i]);
        }
    }
    std::vector<std::vector<double>> G(NT);
    G[L + 1].assign(C, 0.0);
    std::vector<double> dx(R * C);
    for (int i = 0; i < R * C; i++) {
        G[L + 1][i % C] += x[L][i] * g;
        dx[i] = g * P[L + 1][i % C];
    }
    for (int l = L - 1; l >= 0; l--) {
        G[1 + l].assign(C, 0.0);
        for (int i = 0; i < R * C; i++) {
            G[1 + l][i % C] += dx[i] * a[l][i];
            dx[i] *= 1.0 + P[1 + l][i % C] * (1.0 - a[l][i] * a[l][i]);
        }
    }
    G[0].assign(V * C, 0.0);
    for (int i = 0; i < R * C; i++) G[0][tok[i / C] * C + i % C] += dx[i];
    return G;
}

// ---- a run: one family, one recompute mode ----

typedef struct run {
    fam f;
    void *res;
    uint16_t *p16[NT];
    float *g32[NT];
    std::vector<int> hooks; // layer hook (pass * 1000 + layer + 1) and grad hook (-1 - group)
} run;

static size_t numel(int i) { return i == 0 ? (size_t)V * C : (size_t)C; }

static dsc_status layer_hook(void *u, int pass, int layer) {
    ((run *)u)->hooks.push_back(pass * 1000 + layer + 1);
    return DSC_OK;
}
static dsc_status grad_hook(void *u, int group) {
    ((run *)u)->hooks.push_back(-1 - group);
    return DSC_OK;
}

static void setup(run *r, int recompute, const std::vector<std::vector<uint16_t>> &P16,
                  const std::vector<int32_t> &tok) {
    fam *f = &r->f;
    *f = fam{};
    f->recompute = recompute, f->graph = true;
    CK(cudaStreamCreate(&f->st));
    f->tok = dev_upload(tok);
    f->act = dev_alloc<uint16_t>(dsc_model_dev_layers_blocks(recompute, L) * R * C);
    f->logit = dev_alloc<float>(R);
    f->dx = dev_alloc<float>((size_t)R * C);
    f->loss = dev_alloc<float>(1);
    CK(cudaMalloc(&r->res, dsc_model_dev_layers_res_bytes(recompute, L, R, C)));
    for (int i = 0; i < NT; i++) {
        r->p16[i] = dev_upload(P16[i]);
        r->g32[i] = dev_alloc<float>(numel(i));
    }
    DS(dsc_model_dev_layers_create(&f->drv, &ops, f, L, NT, recompute, R, C, (uint16_t *)r->res,
                                   f->st));
}

static void teardown(run *r) {
    dsc_model_dev_layers_destroy(r->f.drv);
    CK(cudaStreamSynchronize(r->f.st));
    CK(cudaStreamDestroy(r->f.st));
    CK(cudaFree(r->f.tok));
    CK(cudaFree(r->f.act));
    CK(cudaFree(r->f.logit));
    CK(cudaFree(r->f.dx));
    CK(cudaFree(r->f.loss));
    CK(cudaFree(r->res));
    for (int i = 0; i < NT; i++) {
        CK(cudaFree(r->p16[i]));
        CK(cudaFree(r->g32[i]));
    }
}

static std::vector<float> grads_of(const run *r) {
    std::vector<float> all;
    for (int i = 0; i < NT; i++) {
        std::vector<float> g = dev_download(r->g32[i], numel(i));
        all.insert(all.end(), g.begin(), g.end());
    }
    return all;
}

// forward, loss, backward through the driver's passes (no graph)
static std::vector<float> eager(run *r, float scale) {
    DS(dsc_model_dev_layers_forward(r->f.drv, (const uint16_t *const *)r->p16));
    DS(ops.loss(&r->f, scale));
    DS(dsc_model_dev_layers_backward(r->f.drv, (const uint16_t *const *)r->p16, r->g32));
    CK(cudaStreamSynchronize(r->f.st));
    return grads_of(r);
}

static std::vector<float> stepped(run *r, float scale) {
    dsc_model_dev_step_key k;
    memset(&k, 0, sizeof k);
    k.B = B, k.T = T, k.ntargets = R, k.loss_scale = scale;
    DS(dsc_model_dev_layers_step(r->f.drv, (const uint16_t *const *)r->p16, r->g32, &k));
    CK(cudaStreamSynchronize(r->f.st));
    return grads_of(r);
}

static bool same(const std::vector<float> &a, const std::vector<float> &b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

int main(void) {
    require_device("test_dev_layers");
    std::vector<std::vector<float>> P(NT);
    std::vector<std::vector<uint16_t>> P16(NT);
    for (int i = 0; i < NT; i++) {
        P[i] = randn(numel(i), i == 0 ? 1.0 : 0.5);
        P16[i] = to_bf16(P[i]);
    }
    std::vector<int32_t> tok(R);
    for (int r = 0; r < R; r++) tok[r] = (int32_t)((r * 5 + 3) % V);
    const float scale = 2.0f;

    run base;
    setup(&base, 0, P16, tok);
    std::vector<float> g0 = eager(&base, scale);
    std::vector<std::vector<double>> ref = reference(P, tok, (double)scale / R);
    std::vector<double> flat;
    for (auto &v : ref) flat.insert(flat.end(), v.begin(), v.end());
    check("gradients against the float64 reference", rel_err(g0.data(), flat.data(), flat.size()),
          2e-3);

    // hooks: the documented order
    dsc_model_dev_layers_set_layer_hook(base.f.drv, layer_hook, &base);
    dsc_model_dev_layers_set_grad_hook(base.f.drv, grad_hook, &base);
    base.hooks.clear();
    std::vector<float> gh = eager(&base, scale);
    std::vector<int> want;
    for (int l = 0; l <= L; l++) want.push_back(l + 1);          // forward: 0 .. L
    want.push_back(-1 - (L + 1));                                  // the head's group
    for (int l = L - 1; l >= -1; l--) {                             // backward: L-1 .. -1
        want.push_back(1000 + l + 1);
        if (l >= 0) want.push_back(-1 - (l + 1));                   // layer l's group
    }
    want.push_back(-1);                                            // group 0, the embeddings
    check_true("hooks: layer and grad hooks in the documented order", base.hooks == want);
    check_true("hooks do not change the bits", same(g0, gh));
    // a step with hooks stays eager: every step calls the family's passes
    base.f.calls = 0;
    for (int s = 0; s < 3; s++) stepped(&base, scale);
    check_true("steps with hooks run eagerly (3 of 3 called the passes)", base.f.calls == 3);
    dsc_model_dev_layers_set_layer_hook(base.f.drv, NULL, NULL);
    dsc_model_dev_layers_set_grad_hook(base.f.drv, NULL, NULL);

    // the step as a graph: eager, captured, then replayed without calling the passes
    base.f.calls = 0;
    std::vector<float> s1 = stepped(&base, scale), s2 = stepped(&base, scale),
                       s3 = stepped(&base, scale);
    bool graphs = getenv("DSC_GPU_GRAPH") == NULL || strcmp(getenv("DSC_GPU_GRAPH"), "0") != 0;
    check_true("a step: the eager passes' bits (first, captured, replayed)",
               same(g0, s1) && same(g0, s2) && same(g0, s3));
    check_true("the third step of a key replays the graph (the passes ran twice)",
               !graphs || base.f.calls == 2);
    // a new key (the loss scale) captures again
    std::vector<float> half = stepped(&base, scale / 2);
    check_true("another key runs eagerly first", base.f.calls == (graphs ? 3 : 4));
    double ratio = 0;
    for (size_t i = 0; i < g0.size(); i++) ratio = fmax(ratio, fabs(half[i] * 2 - g0[i]));
    check("another key: its own gradients (half the scale)", ratio, 1e-6);
    // a family that declines graphs
    base.f.graph = false, base.f.calls = 0;
    for (int s = 0; s < 3; s++) stepped(&base, scale);
    check_true("graph_ok false: every step eager", base.f.calls == 3);
    teardown(&base);

    // activation checkpointing: the same bits with the inputs on the device and on the host
    for (int rc = 1; rc <= 2; rc++) {
        run r;
        setup(&r, rc, P16, tok);
        std::vector<float> g = eager(&r, scale), s = stepped(&r, scale);
        char name[96];
        snprintf(name, sizeof name, "recompute %d: the plain run's bits (passes and step)", rc);
        check_true(name, same(g0, g) && same(g0, s));
        teardown(&r);
    }

    // bad arguments, refused by name
    dsc_model_dev_layers *d = NULL;
    dsc_model_dev_layers_ops partial = ops;
    partial.loss = NULL;
    uint16_t *dummy = dev_alloc<uint16_t>(8);
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    dsc_status s = dsc_model_dev_layers_create(&d, &partial, NULL, L, NT, 0, R, C, dummy, st);
    check_true("ops without loss: DSC_ERR_INVALID_ARG naming loss",
               s == DSC_ERR_INVALID_ARG && strstr(dsc_last_error(), "loss") && !d);
    s = dsc_model_dev_layers_create(&d, &ops, NULL, L, NT, 3, R, C, dummy, st);
    check_true("recompute 3: DSC_ERR_INVALID_ARG naming recompute",
               s == DSC_ERR_INVALID_ARG && strstr(dsc_last_error(), "recompute") && !d);
    CK(cudaStreamDestroy(st));
    CK(cudaFree(dummy));
    return finish("test_dev_layers");
}
