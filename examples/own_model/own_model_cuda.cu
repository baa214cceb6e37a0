// examples/own_model/own_model_cuda.cu - the example's model on a GPU: its family's device passes
// (struct dsc_model_device_ops, dsc/model.h), which the engine's device trainer (dsc/device.h)
// drives. The same arithmetic as the host passes in own_model.c, computing in 16-bit with fp32
// statistics: the two dense layers are cuBLAS products (16-bit operands, fp32 accumulation and
// results), the rest are small kernels of this file (embedding gather, tanh, softmax
// cross-entropy, and the backward of each). Everything runs on the trainer's stream, and every
// sum is taken in a fixed order, so a pass is bitwise repeatable (a resumed run is bitwise the
// uninterrupted one). Built only with -DOWN_MODEL_CUDA (README.md); uses dsc's public headers,
// the CUDA runtime and cuBLAS, nothing of dsc's own sources.
//
// The device trainer hands each pass a 16-bit copy of every tensor (params[i]: bf16, or IEEE fp16
// after set_fp16) and an fp32 gradient buffer per tensor (grads[i]). The layer hook may repoint
// the hidden layer's entries (ZeRO-3 over nccl streams its weights and gradients through slots),
// so a layer's entries are read only after its hook returned. Activations are this file's, kept
// from forward to backward.
#include <cublas_v2.h>    // cublasGemmEx
#include <cuda_bf16.h>    // __nv_bfloat16
#include <cuda_fp16.h>    // __half
#include <cuda_runtime.h> // cudaMemcpyAsync, cudaStream_t
#include <stdio.h>        // fprintf
#include <stdlib.h>       // calloc, free, malloc

#include "dsc/memory.h" // dsc_mem_alloc, dsc_mem_ptr, dsc_mem_free
#include "own_model.h"  // VOCAB, CTX, EMB, HID, IN, P_*, G_*, own_mlp_device_ops

enum { THREADS = 256 }; // threads of a block; the softmax's block is one row of VOCAB

typedef struct own_dev {
    int maxB, B;       // the micro-batch created for, and of the last forward
    bool fp16;         // 16-bit tensors are IEEE fp16 (else bf16)
    bool fresh;        // backward writes (=) the gradients instead of adding
    bool have_targets; // a forward with targets ran and its backward has not
    cudaStream_t st;   // the trainer's (borrowed)
    cublasHandle_t blas;
    dsc_mem_pool *pool;   // the trainer's (borrowed), or NULL: cudaMalloc
    dsc_mem_handle block; // the block every device buffer below is a view of (pool)
    void *raw;            // ... (no pool)
    int32_t *host_tok;    // (maxB * (CTX + 1)) the micro-batch's tokens, checked, on the host
    dsc_model_grad_hook grad_hook;
    void *grad_user;
    dsc_model_layer_hook layer_hook;
    void *layer_user;
    // device buffers
    int32_t *tok;     // (B, CTX) inputs, then (B) targets
    uint16_t *x16;    // (B, IN) the gathered embeddings
    float *a;         // (B, HID) x w1^T (fp32), b1 added by the tanh kernel
    float *h;         // (B, HID) tanh, fp32 (its derivative)
    uint16_t *h16;    // (B, HID) tanh, 16-bit (the head's operand)
    float *probs;     // (B, VOCAB) h w2^T, then softmax(. + b2)
    uint16_t *dl16;   // (B, VOCAB) the logits' gradient
    float *dh;        // (B, HID)
    uint16_t *da16;   // (B, HID) the hidden pre-activation's gradient
    float *dx;        // (B, IN)
    float *losses;    // (B)
    float *loss;      // (1) their mean
} own_dev;

// ---- errors: printed, then the status the engine passes on ----

static dsc_status cuda_fail(cudaError_t e, const char *what) {
    fprintf(stderr, "own_model cuda: %s: %s\n", what, cudaGetErrorString(e));
    return DSC_ERR_CUDA;
}

#define CUDA_TRY(expr, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess) return cuda_fail(e_, what);                                         \
    } while (0)

#define BLAS_TRY(expr, what)                                                                       \
    do {                                                                                           \
        cublasStatus_t s_ = (expr);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "own_model cuda: %s: cuBLAS status %d\n", what, (int)s_);              \
            return DSC_ERR_CUDA;                                                                   \
        }                                                                                          \
    } while (0)

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        dsc_status st_ = (expr);                                                                   \
        if (st_ != DSC_OK) return st_;                                                             \
    } while (0)

// A kernel launch's error (a bad configuration) right after it.
static dsc_status launched(const char *what) {
    CUDA_TRY(cudaGetLastError(), what);
    return DSC_OK;
}

// ---- 16-bit values ----

__device__ static float ld16(const uint16_t *p, size_t i, bool fp16) {
    uint16_t v = p[i];
    return fp16 ? __half2float(__ushort_as_half(v)) : __bfloat162float(__ushort_as_bfloat16(v));
}

__device__ static uint16_t st16(float v, bool fp16) {
    return fp16 ? __half_as_ushort(__float2half_rn(v)) : __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// ---- kernels (one thread per output element unless said) ----

// x16 (B, IN) = the CTX embedding rows of each sample side by side (a copy: no rounding).
__global__ static void embed_forward(uint16_t *x16, const uint16_t *wte, const int32_t *tok, int B) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * IN) return;
    int b = i / IN, c = (i % IN) / EMB, e = i % EMB;
    x16[i] = wte[(size_t)tok[b * CTX + c] * EMB + e];
}

// h = tanh(a + b1) in fp32 and rounded to 16 bits; a, h: (B, HID).
__global__ static void tanh_forward(float *h, uint16_t *h16, const float *a, const uint16_t *b1,
                                    int B, bool fp16) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= B * HID) return;
    float t = tanhf(a[i] + ld16(b1, i % HID, fp16));
    h[i] = t;
    h16[i] = st16(t, fp16);
}

// One block per sample b, one thread per vocabulary entry v: probs[b] = softmax(logits[b] + b2)
// in place, losses[b] = -log probs[b][tgt[b]]. Max and sum by a fixed tree.
__global__ static void softmax_xent(float *probs, float *losses, const uint16_t *b2,
                                    const int32_t *tgt, bool fp16) {
    __shared__ float red[VOCAB];
    int b = blockIdx.x, v = threadIdx.x;
    float *row = probs + (size_t)b * VOCAB;
    float z = row[v] + ld16(b2, v, fp16);
    red[v] = z;
    __syncthreads();
    for (int s = VOCAB / 2; s > 0; s >>= 1) {
        if (v < s) red[v] = fmaxf(red[v], red[v + s]);
        __syncthreads();
    }
    float max = red[0];
    __syncthreads();
    float ex = expf(z - max);
    red[v] = ex;
    __syncthreads();
    for (int s = VOCAB / 2; s > 0; s >>= 1) {
        if (v < s) red[v] += red[v + s];
        __syncthreads();
    }
    float p = ex / red[0];
    row[v] = p;
    if (v == tgt[b]) losses[b] = -logf(p);
}

// One block: *loss = mean of losses[0 .. B), summed in a fixed order.
__global__ static void mean_loss(float *loss, const float *losses, int B) {
    __shared__ float red[THREADS];
    float s = 0;
    for (int b = threadIdx.x; b < B; b += THREADS) s += losses[b];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) *loss = red[0] / (float)B;
}

// One thread per vocabulary entry v: dlogits[b][v] = (probs - onehot(tgt[b])) * g into dl16, and
// db2[v] (= or +=) their sum over the batch (from the fp32 values).
__global__ static void head_grad(uint16_t *dl16, float *db2, const float *probs,
                                 const int32_t *tgt, float g, int B, bool fresh, bool fp16) {
    int v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= VOCAB) return;
    float sum = 0;
    for (int b = 0; b < B; b++) {
        float d = (probs[(size_t)b * VOCAB + v] - (v == tgt[b] ? 1.0f : 0.0f)) * g;
        dl16[(size_t)b * VOCAB + v] = st16(d, fp16);
        sum += d;
    }
    db2[v] = fresh ? sum : db2[v] + sum;
}

// One thread per hidden unit j: da = dh (1 - h^2) into da16, db1[j] (= or +=) its batch sum.
__global__ static void tanh_backward(uint16_t *da16, float *db1, const float *dh, const float *h,
                                     int B, bool fresh, bool fp16) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= HID) return;
    float sum = 0;
    for (int b = 0; b < B; b++) {
        size_t i = (size_t)b * HID + j;
        float da = dh[i] * (1.0f - h[i] * h[i]);
        da16[i] = st16(da, fp16);
        sum += da;
    }
    db1[j] = fresh ? sum : db1[j] + sum;
}

// One thread per element (v, e) of wte's gradient: the sum of dx over the (sample, position)
// pairs whose byte is v, in sample order (no atomics: the order is fixed).
__global__ static void embed_backward(float *dwte, const float *dx, const int32_t *tok, int B,
                                      bool fresh) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= VOCAB * EMB) return;
    int v = i / EMB, e = i % EMB;
    float sum = 0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < CTX; c++)
            if (tok[b * CTX + c] == v) sum += dx[(size_t)b * IN + c * EMB + e];
    dwte[i] = fresh ? sum : dwte[i] + sum;
}

static int blocks(int n) { return (n + THREADS - 1) / THREADS; }

// ---- products: row-major C (M, N) = op(A) op(B) as cuBLAS's column-major C^T ----

// out (rows, n) fp32 = act (rows, k) 16-bit @ w^T, w (n, k) 16-bit row-major (a dense layer).
static dsc_status dense(own_dev *d, float *out, const uint16_t *act, const uint16_t *w, int rows,
                        int k, int n) {
    cudaDataType t = d->fp16 ? CUDA_R_16F : CUDA_R_16BF;
    float one = 1.0f, zero = 0.0f;
    BLAS_TRY(cublasGemmEx(d->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w, t, k, act, t, k,
                          &zero, out, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "dense layer forward");
    return DSC_OK;
}

// dw (n, k) fp32 (= or +=) dout^T @ act: dout (rows, n), act (rows, k), both 16-bit.
static dsc_status dense_dweight(own_dev *d, float *dw, const uint16_t *dout, const uint16_t *act,
                                int rows, int k, int n) {
    cudaDataType t = d->fp16 ? CUDA_R_16F : CUDA_R_16BF;
    float one = 1.0f, beta = d->fresh ? 0.0f : 1.0f;
    BLAS_TRY(cublasGemmEx(d->blas, CUBLAS_OP_N, CUBLAS_OP_T, k, n, rows, &one, act, t, k, dout, t, n,
                          &beta, dw, CUDA_R_32F, k, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "dense layer weight gradient");
    return DSC_OK;
}

// dinp (rows, k) fp32 = dout (rows, n) @ w, w (n, k); all 16-bit operands.
static dsc_status dense_dinput(own_dev *d, float *dinp, const uint16_t *dout, const uint16_t *w,
                               int rows, int k, int n) {
    cudaDataType t = d->fp16 ? CUDA_R_16F : CUDA_R_16BF;
    float one = 1.0f, zero = 0.0f;
    BLAS_TRY(cublasGemmEx(d->blas, CUBLAS_OP_N, CUBLAS_OP_N, k, rows, n, &one, w, t, k, dout, t, n,
                          &zero, dinp, CUDA_R_32F, k, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "dense layer input gradient");
    return DSC_OK;
}

// ---- create / destroy ----

// Carve the block into the buffers, each on a 256-byte boundary; base NULL only counts bytes.
static size_t carve(own_dev *d, char *base) {
    size_t B = (size_t)d->maxB;
    struct {
        void **view;
        size_t bytes;
    } table[] = {
        {(void **)&d->tok, B * (CTX + 1) * 4}, {(void **)&d->x16, B * IN * 2},
        {(void **)&d->a, B * HID * 4},         {(void **)&d->h, B * HID * 4},
        {(void **)&d->h16, B * HID * 2},       {(void **)&d->probs, B * VOCAB * 4},
        {(void **)&d->dl16, B * VOCAB * 2},    {(void **)&d->dh, B * HID * 4},
        {(void **)&d->da16, B * HID * 2},      {(void **)&d->dx, B * IN * 4},
        {(void **)&d->losses, B * 4},          {(void **)&d->loss, 4},
    };
    size_t off = 0;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (base) *table[i].view = base + off;
        off += (table[i].bytes + 255) / 256 * 256;
    }
    return off;
}

static void dev_destroy(void *dev) {
    own_dev *d = (own_dev *)dev;
    if (!d) return;
    (void)cudaStreamSynchronize(d->st); // destroy cannot fail; a fault was reported earlier
    if (d->blas) (void)cublasDestroy(d->blas);
    if (d->pool) dsc_mem_free(d->pool, d->block);
    else (void)cudaFree(d->raw);
    free(d->host_tok);
    free(d);
}

static dsc_status buffers(own_dev *d) {
    size_t bytes = carve(d, NULL);
    char *base;
    if (d->pool) {
        TRY(dsc_mem_alloc(d->pool, bytes, "own_mlp.activations", &d->block));
        base = (char *)dsc_mem_ptr(d->pool, d->block);
    } else {
        CUDA_TRY(cudaMalloc(&d->raw, bytes), "activations");
        base = (char *)d->raw;
    }
    carve(d, base);
    return DSC_OK;
}

static dsc_status setup(own_dev *d) {
    TRY(buffers(d));
    BLAS_TRY(cublasCreate(&d->blas), "cublasCreate");
    BLAS_TRY(cublasSetStream(d->blas, d->st), "cublasSetStream");
    // fp32 accumulation in every product: no reduced-precision reductions of 16-bit sums
    BLAS_TRY(cublasSetMathMode(d->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
    return DSC_OK;
}

static dsc_status dev_create(const void *cfg, int B, int T, void *stream, dsc_mem_pool *pool,
                             void **out) {
    (void)cfg; // the shape is fixed (own_model.h)
    *out = NULL;
    if (B < 1 || T != CTX) {
        fprintf(stderr, "own_model cuda: micro-batches of %d x %d; the model takes B >= 1 "
                "samples of T = %d bytes\n", B, T, CTX);
        return DSC_ERR_INVALID_ARG;
    }
    own_dev *d = (own_dev *)calloc(1, sizeof *d);
    if (!d) return DSC_ERR_OOM;
    d->maxB = B;
    d->st = (cudaStream_t)stream;
    d->pool = pool;
    d->host_tok = (int32_t *)malloc((size_t)B * (CTX + 1) * sizeof(int32_t));
    dsc_status st = d->host_tok ? setup(d) : DSC_ERR_OOM;
    if (st != DSC_OK) {
        dev_destroy(d);
        return st;
    }
    *out = d;
    return DSC_OK;
}

static void dev_set_fp16(void *dev, bool on) { ((own_dev *)dev)->fp16 = on; }
static void dev_set_fresh(void *dev, bool on) { ((own_dev *)dev)->fresh = on; }

static void dev_set_grad_hook(void *dev, dsc_model_grad_hook fn, void *user) {
    own_dev *d = (own_dev *)dev;
    d->grad_hook = fn, d->grad_user = user;
}

static void dev_set_layer_hook(void *dev, dsc_model_layer_hook fn, void *user) {
    own_dev *d = (own_dev *)dev;
    d->layer_hook = fn, d->layer_user = user;
}

static dsc_status layer_hook(own_dev *d, int pass, int layer) {
    return d->layer_hook ? d->layer_hook(d->layer_user, pass, layer) : DSC_OK;
}

static dsc_status grads_done(own_dev *d, int group) {
    return d->grad_hook ? d->grad_hook(d->grad_user, group) : DSC_OK;
}

// ---- forward ----

// The micro-batch's tokens, checked, to the device: inputs (B, CTX); the target of sample b is
// the byte after its context, targets[b][CTX - 1] (the other positions predict nothing).
static dsc_status upload(own_dev *d, const int32_t *inputs, const int32_t *targets, int B, int T) {
    if (!inputs || B < 1 || B > d->maxB || T != CTX) {
        fprintf(stderr, "own_model cuda: forward of %d x %d; the model was made for up to %d "
                "samples of %d bytes\n", B, T, d->maxB, CTX);
        return DSC_ERR_INVALID_ARG;
    }
    int32_t *h = d->host_tok;
    for (int i = 0; i < B * CTX; i++) h[i] = inputs[i];
    for (int b = 0; b < B; b++) h[B * CTX + b] = targets ? targets[b * CTX + CTX - 1] : 0;
    for (int i = 0; i < B * (CTX + 1); i++)
        if (h[i] < 0 || h[i] >= VOCAB) {
            fprintf(stderr, "own_model cuda: %s %d is not a byte (0-255)\n",
                    i < B * CTX ? "input" : "target", h[i]);
            return DSC_ERR_INVALID_ARG;
        }
    // From pageable memory: the call returns once the bytes were taken, so host_tok is free again.
    CUDA_TRY(cudaMemcpyAsync(d->tok, h, (size_t)B * (CTX + 1) * sizeof(int32_t),
                             cudaMemcpyHostToDevice, d->st), "tokens to the device");
    d->B = B;
    d->have_targets = false;
    return DSC_OK;
}

// The forward's kernels, group by group, with the layer hook before the hidden layer (layer 0)
// and before the head (layer NLAYERS).
static dsc_status enqueue_forward(own_dev *d, const uint16_t *const *params, bool targets) {
    int B = d->B;
    cudaStream_t st = d->st;
    embed_forward<<<blocks(B * IN), THREADS, 0, st>>>(d->x16, params[P_WTE], d->tok, B);
    TRY(launched("embedding forward"));
    TRY(layer_hook(d, 0, 0));
    TRY(dense(d, d->a, d->x16, params[P_W1], B, IN, HID));
    tanh_forward<<<blocks(B * HID), THREADS, 0, st>>>(d->h, d->h16, d->a, params[P_B1], B, d->fp16);
    TRY(launched("tanh forward"));
    TRY(layer_hook(d, 0, NLAYERS));
    TRY(dense(d, d->probs, d->h16, params[P_W2], B, HID, VOCAB));
    if (!targets) return DSC_OK;
    softmax_xent<<<B, VOCAB, 0, st>>>(d->probs, d->losses, params[P_B2], d->tok + B * CTX, d->fp16);
    TRY(launched("softmax cross-entropy"));
    mean_loss<<<1, THREADS, 0, st>>>(d->loss, d->losses, B);
    TRY(launched("mean loss"));
    d->have_targets = true;
    return DSC_OK;
}

static dsc_status dev_read_loss(void *dev, float *loss) {
    own_dev *d = (own_dev *)dev;
    CUDA_TRY(cudaMemcpyAsync(loss, d->loss, sizeof *loss, cudaMemcpyDeviceToHost, d->st),
             "reading the loss");
    CUDA_TRY(cudaStreamSynchronize(d->st), "reading the loss");
    return DSC_OK;
}

static dsc_status dev_loss_enqueue(void *dev, const float **loss_dev) {
    *loss_dev = ((own_dev *)dev)->loss;
    return DSC_OK;
}

static dsc_status dev_forward(void *dev, const uint16_t *const *params, const int32_t *inputs,
                              const int32_t *targets, int B, int T, float *loss) {
    own_dev *d = (own_dev *)dev;
    TRY(upload(d, inputs, targets, B, T));
    TRY(enqueue_forward(d, params, targets != NULL));
    return loss && targets ? dev_read_loss(d, loss) : DSC_OK;
}

// ---- backward: the head, the hidden layer, the embedding; each group's gradients complete ----

static dsc_status dev_backward(void *dev, const uint16_t *const *params, float *const *grads,
                               float loss_scale) {
    own_dev *d = (own_dev *)dev;
    if (!d->have_targets) {
        fprintf(stderr, "own_model cuda: backward needs a forward with targets first (one "
                "backward per such forward)\n");
        return DSC_ERR_INVALID_ARG;
    }
    d->have_targets = false;
    int B = d->B;
    cudaStream_t st = d->st;
    head_grad<<<blocks(VOCAB), THREADS, 0, st>>>(d->dl16, grads[P_B2], d->probs, d->tok + B * CTX,
                                                 loss_scale / (float)B, B, d->fresh, d->fp16);
    TRY(launched("head gradient"));
    TRY(dense_dweight(d, grads[P_W2], d->dl16, d->h16, B, HID, VOCAB));
    TRY(dense_dinput(d, d->dh, d->dl16, params[P_W2], B, HID, VOCAB));
    TRY(grads_done(d, G_HEAD));
    TRY(layer_hook(d, 1, 0)); // the hidden layer's weights and gradient buffers from here
    tanh_backward<<<blocks(HID), THREADS, 0, st>>>(d->da16, grads[P_B1], d->dh, d->h, B, d->fresh,
                                                   d->fp16);
    TRY(launched("tanh backward"));
    TRY(dense_dweight(d, grads[P_W1], d->da16, d->x16, B, IN, HID));
    TRY(dense_dinput(d, d->dx, d->da16, params[P_W1], B, IN, HID));
    TRY(grads_done(d, G_HIDDEN));
    TRY(layer_hook(d, 1, -1));
    embed_backward<<<blocks(VOCAB * EMB), THREADS, 0, st>>>(grads[P_WTE], d->dx, d->tok, B,
                                                            d->fresh);
    TRY(launched("embedding backward"));
    return grads_done(d, G_EMBED);
}

static dsc_status dev_train_step(void *dev, const uint16_t *const *params, float *const *grads,
                                 const int32_t *inputs, const int32_t *targets, int B, int T,
                                 float loss_scale, float *loss) {
    if (!targets) {
        fprintf(stderr, "own_model cuda: a training step needs targets\n");
        return DSC_ERR_INVALID_ARG;
    }
    TRY(dev_forward(dev, params, inputs, targets, B, T, NULL));
    TRY(dev_backward(dev, params, grads, loss_scale));
    return loss ? dev_read_loss(dev, loss) : DSC_OK;
}

extern "C" const struct dsc_model_device_ops own_mlp_device_ops = {
    dev_create,     dev_destroy,     dev_set_fp16,  dev_set_fresh,  dev_set_grad_hook,
    dev_set_layer_hook, dev_forward, dev_backward, dev_train_step, dev_read_loss,
    dev_loss_enqueue, NULL, // no GPU decoder
};
