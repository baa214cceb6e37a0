// bench_adam_overlap.cu - can an AdamW pass hide beside the next step's forward products?
//
//   build/bench/bench_adam_overlap [LAYERS C F KV M]   (default llama-3.2-3B: 28 3072 8192 1024 4096)
//
// One layer's forward products (qkv, o, gate-up, down at M tokens; cuBLASLt's heuristic choice)
// L times, and an AdamW pass over L layers' parameters that moves the runtime's bytes (fp32
// master, gradient and two moments read, master and moments written, a bf16 copy written: 30
// bytes a parameter; a stand-in kernel of ours, four elements a thread). Timed with events, best of
// three: each alone, one after the other, and the update on a second stream of low priority with
// layer l's products waiting for layer l's update, as a runtime that overlaps its optimizer with
// the forward would run them: with grid-stride blocks, short blocks, two blocks a SM, and with the
// products held to fewer SMs (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET) and the update on the rest.
// Results: docs/performance.md (2026-12-07).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)
#define CB(x)                                                                                      \
    do {                                                                                           \
        cublasStatus_t s_ = (x);                                                                   \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d: cuBLAS status %d\n", __FILE__, __LINE__, (int)s_);            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__global__ void adam4(float4 *p, const float4 *g, float4 *m, float4 *v, __nv_bfloat162 *w,
                      size_t n4) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 P = p[i], G = g[i], M = m[i], V = v[i];
        float *pp = &P.x, *gg = &G.x, *mm = &M.x, *vv = &V.x;
        for (int k = 0; k < 4; k++) {
            mm[k] = 0.9f * mm[k] + 0.1f * gg[k];
            vv[k] = 0.999f * vv[k] + 0.001f * gg[k] * gg[k];
            pp[k] -= 1e-4f * (mm[k] / (sqrtf(vv[k]) + 1e-8f) + 0.1f * pp[k]);
        }
        p[i] = P, m[i] = M, v[i] = V;
        w[2 * i] = __floats2bfloat162_rn(P.x, P.y);
        w[2 * i + 1] = __floats2bfloat162_rn(P.z, P.w);
    }
}

struct product {
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
};

struct bench {
    int L, M, N[4], K[4], sms;
    size_t per; // parameters a layer (a multiple of 4)
    __nv_bfloat16 *W, *X, *Y;
    std::vector<float *> P, G, Mo, V;
    std::vector<__nv_bfloat16 *> W16;
    cudaStream_t main, side;
    cublasLtHandle_t lt;
    void *ws;
    size_t wsz = 64 << 20;
    std::vector<cudaEvent_t> ready;
    cudaEvent_t t0, t1, fork;
};

// The four products with an SM count target (0: all), their algorithms chosen once.
static void make_products(bench &b, int sm_target, product *pr) {
    for (int j = 0; j < 4; j++) {
        CB(cublasLtMatmulDescCreate(&pr[j].desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
        CB(cublasLtMatmulDescSetAttribute(pr[j].desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
        CB(cublasLtMatmulDescSetAttribute(pr[j].desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
        if (sm_target)
            CB(cublasLtMatmulDescSetAttribute(pr[j].desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                              &sm_target, sizeof sm_target));
        CB(cublasLtMatrixLayoutCreate(&pr[j].a, CUDA_R_16BF, b.K[j], b.N[j], b.K[j]));
        CB(cublasLtMatrixLayoutCreate(&pr[j].b, CUDA_R_16BF, b.K[j], b.M, b.K[j]));
        CB(cublasLtMatrixLayoutCreate(&pr[j].c, CUDA_R_16BF, b.N[j], b.M, b.N[j]));
        cublasLtMatmulPreference_t pref;
        CB(cublasLtMatmulPreferenceCreate(&pref));
        CB(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &b.wsz, sizeof b.wsz));
        cublasLtMatmulHeuristicResult_t r;
        int got = 0;
        CB(cublasLtMatmulAlgoGetHeuristic(b.lt, pr[j].desc, pr[j].a, pr[j].b, pr[j].c, pr[j].c,
                                          pref, 1, &r, &got));
        if (!got) {
            fprintf(stderr, "bench_adam_overlap: no cuBLASLt algorithm for product %d\n", j);
            exit(1);
        }
        pr[j].algo = r.algo;
        CB(cublasLtMatmulPreferenceDestroy(pref));
    }
}

static void free_products(product *pr) {
    for (int j = 0; j < 4; j++) {
        CB(cublasLtMatmulDescDestroy(pr[j].desc));
        CB(cublasLtMatrixLayoutDestroy(pr[j].a));
        CB(cublasLtMatrixLayoutDestroy(pr[j].b));
        CB(cublasLtMatrixLayoutDestroy(pr[j].c));
    }
}

static void layer_products(bench &b, const product *pr, cudaStream_t s) {
    const float one = 1, zero = 0;
    size_t off = 0;
    for (int j = 0; j < 4; j++) {
        CB(cublasLtMatmul(b.lt, pr[j].desc, &one, b.W + off, pr[j].a, b.X, pr[j].b, &zero, b.Y,
                          pr[j].c, b.Y, pr[j].c, &pr[j].algo, b.ws, b.wsz, s));
        off += (size_t)b.N[j] * b.K[j];
    }
}

static void update(bench &b, int l, int blocks, int threads, cudaStream_t s) {
    adam4<<<blocks, threads, 0, s>>>((float4 *)b.P[l], (const float4 *)b.G[l], (float4 *)b.Mo[l],
                                     (float4 *)b.V[l], (__nv_bfloat162 *)b.W16[l], b.per / 4);
    CK(cudaGetLastError());
}

template <class F> static float best_ms(bench &b, F run) {
    float best = 1e30f;
    for (int rep = 0; rep < 3; rep++) {
        CK(cudaDeviceSynchronize());
        CK(cudaEventRecord(b.t0, b.main));
        run();
        CK(cudaEventRecord(b.t1, b.main));
        CK(cudaEventSynchronize(b.t1));
        float ms;
        CK(cudaEventElapsedTime(&ms, b.t0, b.t1));
        if (ms < best) best = ms;
    }
    return best;
}

// The update of every layer on the side stream, layer l's products after layer l's update.
static float overlapped(bench &b, const product *pr, int blocks, int threads) {
    return best_ms(b, [&] {
        CK(cudaEventRecord(b.fork, b.main));
        CK(cudaStreamWaitEvent(b.side, b.fork, 0));
        for (int l = 0; l < b.L; l++) {
            update(b, l, blocks, threads, b.side);
            CK(cudaEventRecord(b.ready[l], b.side));
        }
        for (int l = 0; l < b.L; l++) {
            CK(cudaStreamWaitEvent(b.main, b.ready[l], 0));
            layer_products(b, pr, b.main);
        }
    });
}

int main(int argc, char **argv) {
    bench b;
    b.L = argc > 1 ? atoi(argv[1]) : 28;
    int C = argc > 2 ? atoi(argv[2]) : 3072, F = argc > 3 ? atoi(argv[3]) : 8192;
    int KV = argc > 4 ? atoi(argv[4]) : 1024;
    b.M = argc > 5 ? atoi(argv[5]) : 4096;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_adam_overlap: no CUDA device\n");
        return 77;
    }
    int n[4] = {C + 2 * KV, C, 2 * F, C}, k[4] = {C, C, C, F};
    b.per = 0;
    for (int j = 0; j < 4; j++) b.N[j] = n[j], b.K[j] = k[j], b.per += (size_t)n[j] * k[j];
    b.per = (b.per + 3) / 4 * 4;
    CK(cudaDeviceGetAttribute(&b.sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs | %d layers, C %d, F %d, kv %d, %d tokens: %.1fM parameters a layer\n",
           prop.name, b.sms, b.L, C, F, KV, b.M, b.per / 1e6);
    CK(cudaMalloc(&b.W, b.per * 2));
    CK(cudaMalloc(&b.X, (size_t)b.M * F * 2));
    CK(cudaMalloc(&b.Y, (size_t)b.M * 2 * F * 2));
    CK(cudaMemset(b.W, 0, b.per * 2));
    CK(cudaMemset(b.X, 0, (size_t)b.M * F * 2));
    b.P.resize(b.L), b.G.resize(b.L), b.Mo.resize(b.L), b.V.resize(b.L), b.W16.resize(b.L);
    for (int l = 0; l < b.L; l++) {
        float **bufs[4] = {&b.P[l], &b.G[l], &b.Mo[l], &b.V[l]};
        for (float **p : bufs) {
            CK(cudaMalloc(p, b.per * 4));
            CK(cudaMemset(*p, 0, b.per * 4));
        }
        CK(cudaMalloc(&b.W16[l], b.per * 2));
    }
    int lo, hi;
    CK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CK(cudaStreamCreateWithPriority(&b.main, cudaStreamNonBlocking, hi));
    CK(cudaStreamCreateWithPriority(&b.side, cudaStreamNonBlocking, lo));
    CB(cublasLtCreate(&b.lt));
    CK(cudaMalloc(&b.ws, b.wsz));
    b.ready.resize(b.L);
    for (auto &e : b.ready) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaEventCreate(&b.t0));
    CK(cudaEventCreate(&b.t1));
    CK(cudaEventCreateWithFlags(&b.fork, cudaEventDisableTiming));

    double flop = 2.0 * b.M * (double)b.per * b.L, bytes = 30.0 * b.per * b.L;
    int grid = b.sms * 8, chunks = (int)((b.per / 4 + 255) / 256);
    product all[4];
    make_products(b, 0, all);
    float tp = best_ms(b, [&] { for (int l = 0; l < b.L; l++) layer_products(b, all, b.main); });
    float ta = best_ms(b, [&] { for (int l = 0; l < b.L; l++) update(b, l, grid, 256, b.main); });
    float ts = best_ms(b, [&] { for (int l = 0; l < b.L; l++) update(b, l, chunks, 256, b.main); });
    float tser = best_ms(b, [&] {
        for (int l = 0; l < b.L; l++) update(b, l, grid, 256, b.main);
        for (int l = 0; l < b.L; l++) layer_products(b, all, b.main);
    });
    printf("products alone                    %8.2f ms  %4.0f TFLOP/s\n", tp, flop / tp / 1e9);
    printf("AdamW alone (8 blocks a SM)       %8.2f ms  %4.2f TB/s\n", ta, bytes / ta / 1e9);
    printf("AdamW alone (a block a chunk)     %8.2f ms  %4.2f TB/s\n", ts, bytes / ts / 1e9);
    printf("one after the other               %8.2f ms\n", tser);
    printf("side stream, 8 blocks a SM        %8.2f ms\n", overlapped(b, all, grid, 256));
    printf("side stream, 2 blocks a SM        %8.2f ms\n", overlapped(b, all, b.sms * 2, 256));
    printf("side stream, a block a chunk      %8.2f ms\n", overlapped(b, all, chunks, 256));
    free_products(all);
    for (int target : {124, 116, 108, 100}) { // the products on `target` SMs, AdamW on the rest
        product few[4];
        make_products(b, target, few);
        int rest = b.sms - target;
        float tpt = best_ms(b, [&] { for (int l = 0; l < b.L; l++) layer_products(b, few, b.main); });
        float tat = best_ms(b, [&] { for (int l = 0; l < b.L; l++) update(b, l, rest, 1024, b.main); });
        printf("products on %3d SMs %8.2f ms, AdamW on %3d SMs %8.2f ms (%.2f TB/s): side stream "
               "%8.2f ms\n", target, tpt, rest, tat, bytes / tat / 1e9,
               overlapped(b, few, rest, 1024));
        free_products(few);
    }
    return 0;
}
