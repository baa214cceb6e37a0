// model/llama/llama_cuda.cu - the Llama family's forward and backward on one GPU (see
// llama_cuda.h).
#include "model/llama/llama_cuda.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free, malloc
#include <string.h> // memset, strcmp

extern "C" {
#include "model/llama/kernels.h" // dsc__llama_rope_tables
#include "model/llama/llama.h"   // dsc_llama_config, dsc__llama_layer_tensor, ...
#include "model/lora.h"          // struct dsc_lora (which base tensors train)
}

#include "cuda/attention.h"            // dsc__cuda_gqa_*
#include "cuda/common.cuh"             // DSC_CUDA_TRY, DSC_CUDA_ARG
#include "cuda/devbuf.h"               // dsc__cuda_buf_*
#include "cuda/device_model.h"         // dsc__cuda_tokens_upload, dsc__cuda_mean_loss, ...
#include "model/llama/llama_decode.h"  // dsc__llama_decode_ops
#include "model/lora_cuda.h"           // dsc__lora_dev_* (LoRA adapters beside the products)
#include "model/layers_cuda.h"         // dsc__dev_layers (the layer loop, hooks, graphs)
#include "cuda/kernels.h"              // dsc__cuda_xent_*, dsc__cuda_sum, dsc__cuda_colsum_h, ...
#include "model/llama/llama_kernels.h" // dsc__cuda_rmsnorm_*, dsc__cuda_rope_h, dsc__cuda_swiglu_*
#include "cuda/matmul.h"               // dsc__cuda_gemm
#include "cuda/linear.h"               // dsc__cuda_lin_* (the layers' products, 16-bit or FP8)
#include "cuda/fp8.h"                  // dsc__cuda_fp8_supported

#define LOGITS_ALIGN 64 // logits rows padded to a multiple of this many columns

typedef struct llama_cuda {
    dsc_llama_config c;
    int maxB, maxT, B, T, Vp;
    int QD, KD, QKV; // q columns (NH hd), k and v columns each (NKV hd), a qkv row (QD + 2 KD)
    int ntargets;    // targets of the last forward that count: the mean's divisor
    bool have_targets, fp16, fresh;
    cudaStream_t st;
    dsc_cuda_blas *blas;
    dsc__cuda_lin lin;   // the layers' linear products (FP8 with the fp8 section)
    void *lin_buf;       // lin's FP8 scratch, in the slab
    dsc_cuda_buf slab;
    // 16-bit activations; per-layer arrays hold n_layer blocks of maxB * maxT rows
    uint16_t *res;               // the residual stream into each layer, the driver's
    uint16_t *ln1, *qkv, *atty;  // (L, R, C / QKV / QD)
    uint16_t *res2, *ln2;        // (L, R, C)
    uint16_t *gu, *hmid;         // (L, R, 2 I): gate | up; (L, R, I): silu(gate) * up
    uint16_t *qk_raw;            // Qwen3: (L, R, QD + KD) q and k before their norms
    uint16_t *lnf;               // (R, C)
    uint16_t *head_pad;          // (Vp, C) the head's rows, [V, Vp) zero; NULL when V == Vp
    uint16_t *logits;            // (R, Vp); their gradients after backward
    uint16_t *dres, *dln, *datt; // backward scratch (R, C), (R, C), (R, QD)
    uint16_t *dbig, *dh;         // (R, max(2 I, QKV)), (R, I)
    float *rstd1, *rstd2;        // (L, R)
    float *att_lse;              // (L, B, NH, T)
    float *qk_rstd;              // Qwen3: (L, R, NH + NKV) each head's rstd
    float *qkn_scratch;          // Qwen3: dsc__cuda_qk_norm_backward_scratch(R, hd)
    float *rstdf, *losses, *lse; // (R)
    float *loss_dev;             // (1)
    float *rms_scratch, *att_scratch, *col_scratch, *bias_tmp;
    float *rope_cos, *rope_sin; // (maxT, hd / 2)
    void *emb_scratch;
    float *discard;  // (C) the gradient of a frozen norm weight (LoRA), never read
    void *lora_buf;  // the adapters' activations (model/lora_cuda.h), in the slab
    dsc__lora_dev lora;
    int32_t *tokens; // (2, R): inputs, targets
    int32_t *posd;   // (R) position ids of the last forward, or NULL: 0 .. T-1 in every row
    int32_t *pos_buf;        // (R) where they are uploaded
    const int32_t *pos_host; // set_positions' ids for the next forward (HOST), or NULL
    // the layer loop, the hooks, activation checkpointing (cpu_checkpointing: c.recompute 2,
    // the layers' inputs on the host) and the step's CUDA graph
    dsc__dev_layers drv;
} llama_cuda;

typedef struct layer_acts {
    uint16_t *res_in, *ln1, *qkv, *atty, *res2, *ln2, *gu, *hmid, *res_out, *qk_raw;
    float *rstd1, *rstd2, *lse, *qk_rstd;
} layer_acts;

// The residual stream is the driver's (with cpu_checkpointing three blocks, the rest on the
// host); the rest lives in the layer's block, one block shared by all layers when they are
// recomputed in the backward (activation checkpointing).
static layer_acts acts_of(const llama_cuda *m, int l) {
    size_t R = (size_t)m->maxB * m->maxT, C = (size_t)m->c.hidden;
    size_t L = dsc__dev_layers_block(m->c.recompute, l);
    size_t I = (size_t)m->c.intermediate;
    size_t NQK = m->c.qk_norm ? (size_t)(m->c.n_head + m->c.n_kv_head) : 0; // heads normed
    layer_acts a = {
        dsc__dev_layers_input(&m->drv, l), m->ln1 + L * R * C,     m->qkv + L * R * (size_t)m->QKV,
        m->atty + L * R * m->QD,   m->res2 + L * R * C,     m->ln2 + L * R * C,
        m->gu + L * R * 2 * I,     m->hmid + L * R * I,     dsc__dev_layers_input(&m->drv, l + 1),
        m->qk_raw ? m->qk_raw + L * R * NQK * (size_t)m->c.head_dim : NULL,
        m->rstd1 + L * R,          m->rstd2 + L * R,        m->att_lse + L * R * m->c.n_head,
        m->qk_rstd ? m->qk_rstd + L * R * NQK : NULL,
    };
    return a;
}

// ---- allocation ----

// The widest input or output of a layer's products and their largest weight (FP8 scratch).
static int64_t lin_max_dim(const llama_cuda *m) {
    int64_t d = m->c.hidden;
    if (m->QKV > d) d = m->QKV;
    if (m->QD > d) d = m->QD;
    if (2 * (int64_t)m->c.intermediate > d) d = 2 * (int64_t)m->c.intermediate;
    return d;
}

static int64_t lin_max_w(const llama_cuda *m) {
    int64_t C = m->c.hidden, w = (int64_t)m->QKV * C;
    if ((int64_t)m->QD * C > w) w = (int64_t)m->QD * C;
    if (2 * (int64_t)m->c.intermediate * C > w) w = 2 * (int64_t)m->c.intermediate * C;
    return w;
}

static size_t lin_scratch(const llama_cuda *m) {
    return dsc__cuda_lin_scratch_bytes(m->c.fp8, (int64_t)m->maxB * m->maxT, lin_max_dim(m),
                                       lin_max_w(m), dsc_llama_num_tensors(&m->c));
}

// The activation block's views (dsc__cuda_carve: base NULL only counts bytes).
static size_t carve(llama_cuda *m, char *base) {
    size_t R = (size_t)m->maxB * m->maxT, C = (size_t)m->c.hidden;
    size_t NL = (size_t)m->c.n_layer, L = dsc__dev_layers_blocks(m->c.recompute, (int)NL);
    size_t I = (size_t)m->c.intermediate, NH = (size_t)m->c.n_head, V = (size_t)m->c.vocab_size;
    size_t Vp = (size_t)m->Vp, QKV = (size_t)m->QKV, QD = (size_t)m->QD;
    size_t big = 2 * I > QKV ? 2 * I : QKV, hd2 = (size_t)m->c.head_dim / 2;
    size_t colsum = dsc__cuda_colsum_scratch((int64_t)R, (int)QKV);
    size_t NQK = m->c.qk_norm ? NH + (size_t)m->c.n_kv_head : 0, HS = (size_t)m->c.head_dim;
    dsc__cuda_carve_entry table[] = {
        {(void **)&m->res, dsc__dev_layers_res_bytes(m->c.recompute, (int)NL, (int64_t)R, (int)C)},
        {(void **)&m->ln1, L * R * C * 2},
        {(void **)&m->qkv, L * R * QKV * 2},
        {(void **)&m->atty, L * R * QD * 2},
        {(void **)&m->res2, L * R * C * 2},
        {(void **)&m->ln2, L * R * C * 2},
        {(void **)&m->gu, L * R * 2 * I * 2},
        {(void **)&m->hmid, L * R * I * 2},
        {(void **)&m->qk_raw, L * R * NQK * HS * 2},
        {(void **)&m->lnf, R * C * 2},
        {(void **)&m->head_pad, Vp != V ? Vp * C * 2 : 0},
        {(void **)&m->logits, R * Vp * 2},
        {(void **)&m->dres, R * C * 2},
        {(void **)&m->dln, R * C * 2},
        {(void **)&m->datt, R * QD * 2},
        {(void **)&m->dbig, R * big * 2},
        {(void **)&m->dh, R * I * 2},
        {(void **)&m->rstd1, L * R * 4},
        {(void **)&m->rstd2, L * R * 4},
        {(void **)&m->att_lse, L * R * NH * 4},
        {(void **)&m->qk_rstd, L * R * NQK * 4},
        {(void **)&m->qkn_scratch,
         NQK ? dsc__cuda_qk_norm_backward_scratch((int64_t)R, (int)HS) * 4 : 0},
        {(void **)&m->rstdf, R * 4},
        {(void **)&m->losses, R * 4},
        {(void **)&m->lse, R * 4},
        {(void **)&m->loss_dev, 4},
        {(void **)&m->rms_scratch, dsc__cuda_rmsnorm_backward_scratch((int64_t)R, (int)C) * 4},
        {(void **)&m->att_scratch,
         dsc__cuda_gqa_backward_scratch(m->maxB, m->maxT, (int)NH) * 4},
        {(void **)&m->col_scratch, colsum * 4},
        {(void **)&m->bias_tmp, QKV * 4},
        {(void **)&m->rope_cos, (size_t)m->maxT * hd2 * 4},
        {(void **)&m->rope_sin, (size_t)m->maxT * hd2 * 4},
        {(void **)&m->emb_scratch, dsc__cuda_embed_backward_scratch((int64_t)R, (int)V)},
        {(void **)&m->discard, m->c.lora ? C * 4 : 0},
        {(void **)&m->lora_buf, dsc__lora_dev_bytes(m->c.lora, (int64_t)R)},
        {(void **)&m->tokens, 2 * R * 4},
        {(void **)&m->pos_buf, R * 4},
        {(void **)&m->lin_buf, lin_scratch(m)},
    };
    return dsc__cuda_carve(table, sizeof table / sizeof table[0], base);
}

static void destroy(void *dev) {
    llama_cuda *m = (llama_cuda *)dev;
    if (!m) return;
    (void)cudaStreamSynchronize(m->st); // destroy cannot fail; a fault was reported earlier
    dsc__dev_layers_destroy(&m->drv);
    dsc__cuda_lin_release(&m->lin);
    dsc__cuda_blas_destroy(m->blas);
    dsc__cuda_buf_free(&m->slab);
    free(m);
}

extern "C" dsc_status dsc__llama_cuda_rope_upload(float *cos, float *sin,
                                                  const dsc_llama_config *c, int npos,
                                                  const char *who) {
    size_t n = (size_t)npos * (size_t)(c->head_dim / 2);
    float *h = (float *)malloc(2 * n * sizeof(float));
    if (!h) return dsc__fail(DSC_ERR_OOM, "%s: out of host memory", who);
    dsc__llama_rope_tables(h, h + n, npos, c->head_dim, c->rope_theta, c->rope_scaling,
                           c->rope_factor, c->rope_low_freq_factor, c->rope_high_freq_factor,
                           c->rope_original_max_pos);
    cudaError_t e = cudaMemcpy(cos, h, n * sizeof(float), cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemcpy(sin, h + n, n * sizeof(float), cudaMemcpyHostToDevice);
    free(h);
    if (e == cudaSuccess) return DSC_OK;
    char what[128];
    snprintf(what, sizeof what, "%s: uploading the rotary tables", who);
    return dsc__cuda_fail(e, what, __FILE__, __LINE__);
}

// The rotary tables of the model's positions.
static dsc_status upload_rope(llama_cuda *m) {
    return dsc__llama_cuda_rope_upload(m->rope_cos, m->rope_sin, &m->c, m->maxT,
                                       "llama cuda create");
}

static const dsc__dev_layers_ops *layer_ops(void); // the passes the driver calls (below)

static dsc_status create(const void *cfg, int B, int T, void *stream, dsc_mem_pool *pool,
                         void **out) {
    const dsc_llama_config *c = (const dsc_llama_config *)cfg;
    DSC_CUDA_ARG(out && c, "llama cuda create: out and config must be set");
    *out = NULL;
    DSC_CUDA_ARG(c->head_dim == 64 || c->head_dim == 128,
                 "--device cuda: this Llama-family model has head_dim %d; the GPU attention "
                 "kernels take head_dim 64 (SmolLM2, Llama 3.2 1B, Qwen2.5 0.5B) or 128 (Llama "
                 "3.2 3B, 3.1 8B): train it on the CPU (--device cpu)",
                 c->head_dim);
    DSC_CUDA_ARG(c->hidden % 8 == 0 && c->intermediate % 8 == 0,
                 "--device cuda: hidden_size %d and intermediate_size %d must be multiples of 8 "
                 "on the GPU (its kernels move rows as 16-byte vectors): train this model on the "
                 "CPU (--device cpu)", c->hidden, c->intermediate);
    DSC_CUDA_ARG(B >= 1 && T >= 1 && T <= c->max_seq_len && (int64_t)B * T <= (1 << 24),
                 "llama cuda create: batch %d x %d is invalid (T <= %d, B * T <= 16M)", B, T,
                 c->max_seq_len);
    DSC_CUDA_ARG((int64_t)B * c->n_head <= DSC_CUDA_ATT_MAX_BH,
                 "llama cuda create: micro-batch %d x %d heads is more than the %d (sequence, "
                 "head) pairs attention takes in one launch; lower "
                 "train_micro_batch_size_per_gpu", B, c->n_head, DSC_CUDA_ATT_MAX_BH);
    if (c->fp8) DSC_TRY(dsc__cuda_fp8_supported());
    llama_cuda *m = (llama_cuda *)calloc(1, sizeof *m);
    if (!m) return dsc__fail(DSC_ERR_OOM, "llama cuda create: out of host memory");
    m->c = *c;
    m->maxB = B, m->maxT = T;
    m->QD = c->n_head * c->head_dim;
    m->KD = c->n_kv_head * c->head_dim;
    m->QKV = m->QD + 2 * m->KD;
    m->Vp = (c->vocab_size + LOGITS_ALIGN - 1) / LOGITS_ALIGN * LOGITS_ALIGN;
    m->st = (cudaStream_t)stream;
    dsc_status st = dsc__cuda_buf_alloc(&m->slab, pool, carve(m, NULL), "gpu.activations");
    if (st == DSC_OK) carve(m, (char *)m->slab.ptr);
    if (st == DSC_OK)
        dsc__lora_dev_carve(&m->lora, c->lora, (int64_t)B * T, (char *)m->lora_buf);
    if (st == DSC_OK && m->head_pad) { // the padding rows stay zero for the model's life
        size_t V = (size_t)c->vocab_size, C = (size_t)c->hidden;
        cudaError_t e = cudaMemsetAsync(m->head_pad + V * C, 0,
                                        sizeof(uint16_t) * (size_t)(m->Vp - V) * C, m->st);
        if (e != cudaSuccess)
            st = dsc__cuda_fail(e, "llama cuda create: clearing the head's padding", __FILE__,
                                __LINE__);
    }
    if (st == DSC_OK) st = upload_rope(m);
    if (st == DSC_OK)
        st = dsc__dev_layers_init(&m->drv, layer_ops(), m, c->n_layer, dsc_llama_num_tensors(c),
                                  c->recompute, (int64_t)B * T, c->hidden, m->res, m->st);
    if (st == DSC_OK) st = dsc__cuda_blas_create_in(&m->blas, 0, pool);
    m->lora.blas = m->blas, m->lora.stream = m->st;
    m->lin.blas = m->blas, m->lin.stream = m->st, m->lin.fp8 = c->fp8;
    m->lin.margin = c->fp8_margin;
    if (st == DSC_OK)
        st = dsc__cuda_lin_carve(&m->lin, m->lin_buf, (int64_t)B * T, lin_max_dim(m),
                                 lin_max_w(m), dsc_llama_num_tensors(c));
    if (st != DSC_OK) {
        destroy(m);
        return st;
    }
    *out = m;
    return DSC_OK;
}

static void set_fp16(void *dev, bool on) {
    llama_cuda *m = (llama_cuda *)dev;
    m->fp16 = m->lora.fp16 = m->lin.fp16 = on;
}
static void set_fresh(void *dev, bool on) { ((llama_cuda *)dev)->fresh = on; }
static void set_positions(void *dev, const int32_t *pos) { ((llama_cuda *)dev)->pos_host = pos; }

static void set_grad_hook(void *dev, dsc_model_grad_hook fn, void *user) {
    llama_cuda *m = (llama_cuda *)dev;
    m->drv.hook = fn;
    m->drv.hook_user = user;
}

static void set_layer_hook(void *dev, dsc_model_layer_hook fn, void *user) {
    llama_cuda *m = (llama_cuda *)dev;
    m->drv.layer_hook = fn;
    m->drv.layer_user = user;
}

// ---- products (nn.Linear: w is (out, in)) ----

// out (rows, OUT; row stride ldo) = inp (rows, IN; stride ldi) @ w^T [+ bias] [+ resid, which
// has out's row stride].
// A layer's product (cuda/linear.h: FP8 with the fp8 section).
// slot: the weight's tensor index (its products' absolute maxima are kept there).
static dsc_status linear(llama_cuda *m, int slot, uint16_t *out, int ldo, const uint16_t *inp,
                         int ldi, const uint16_t *w, const uint16_t *bias, const uint16_t *resid,
                         int rows, int IN, int OUT) {
    return dsc__cuda_lin_forward(&m->lin, slot, out, ldo, inp, ldi, w, bias, resid, rows, IN,
                                 OUT);
}

// dinp (rows, IN; stride ldo) = dout (rows, OUT; stride ldd) @ w (OUT, IN), or += when acc.
static dsc_status linear_dinp(llama_cuda *m, int slot, uint16_t *dinp, int ldo,
                              const uint16_t *dout, int ldd, const uint16_t *w, int rows, int IN,
                              int OUT, bool acc) {
    return dsc__cuda_lin_dinp(&m->lin, slot, dinp, ldo, dout, ldd, w, rows, IN, OUT, acc);
}

// dw (OUT, IN) fp32 += (= when fresh) dout^T @ inp; dout (rows, OUT; stride ldd), inp (rows, IN;
// stride ldi). A frozen weight (LoRA's base: dw NULL) gets none.
static dsc_status linear_dw(llama_cuda *m, int slot, float *dw, const uint16_t *dout, int ldd,
                            const uint16_t *inp, int ldi, int rows, int IN, int OUT) {
    if (!dw) return DSC_OK;
    return dsc__cuda_lin_dw(&m->lin, slot, dw, dout, ldd, inp, ldi, rows, IN, OUT, m->fresh);
}

// The output head's products, always in 16-bit (as the head of an FP8 recipe stays).
static dsc_status head_linear(llama_cuda *m, const uint16_t *w) {
    return dsc__cuda_linear_forward(m->blas, m->logits, m->Vp, m->lnf, m->c.hidden, w, NULL, NULL,
                                    m->B * m->T, m->c.hidden, m->Vp, m->fp16, m->st);
}

static dsc_status head_backward(llama_cuda *m, const uint16_t *w, float *dw) {
    int BT = m->B * m->T, C = m->c.hidden;
    dsc_cuda_gemm g;
    memset(&g, 0, sizeof g);
    g.M = BT, g.N = C, g.K = m->Vp;
    g.A = m->logits, g.lda = m->Vp, g.B = w, g.ldb = C, g.D = m->dln, g.ldd = C;
    g.alpha = 1.0f, g.fp16 = m->fp16;
    DSC_TRY(dsc__cuda_gemm(m->blas, &g, m->st));
    if (!dw) return DSC_OK;
    return dsc__cuda_mm_dweight(m->blas, dw, m->logits, m->Vp, m->lnf, C, BT, m->c.vocab_size, C,
                                m->fresh, m->fp16, m->st);
}

// ---- forward ----

static int lt(const llama_cuda *m, int l, int k) { return dsc__llama_layer_tensor(&m->c, l, k); }

// Layer l's weight k's adapter (if any) after its product: out (rows, its OUT; stride ldo) +=
// the adapter's term of inp (stride ldi).
static dsc_status adapt(llama_cuda *m, const uint16_t *const *p, int l, int k, uint16_t *out,
                        int ldo, const uint16_t *inp, int ldi) {
    return dsc__lora_dev_forward(&m->lora, p, lt(m, l, k), out, ldo, inp, ldi,
                                 (int64_t)m->B * m->T);
}

// Layer l's weight k's adapter in the backward, after the product's input gradient dinp
// (stride lddi) was written from dout (stride ldd); inp (stride ldi) the product's input.
static dsc_status adapt_back(llama_cuda *m, const uint16_t *const *p, float *const *g, int l,
                             int k, uint16_t *dinp, int lddi, const uint16_t *dout, int ldd,
                             const uint16_t *inp, int ldi) {
    return dsc__lora_dev_backward(&m->lora, p, g, lt(m, l, k), dinp, lddi, dout, ldd, inp, ldi,
                                  (int64_t)m->B * m->T, m->fresh);
}

// A norm weight's gradient, or the discard buffer when the weight is frozen (LoRA's base).
static float *norm_grad(const llama_cuda *m, float *const *g, int i) {
    return g[i] ? g[i] : m->discard;
}

// A bias of layer l (Qwen2), or NULL.
static const uint16_t *bias_of(const llama_cuda *m, const uint16_t *const *p, int l, int k) {
    int i = lt(m, l, k);
    return i >= 0 ? p[i] : NULL;
}

// Whether tensors i and j of the table lie end to end in t (j right after i's n elements), so
// that one product covers both: the engine lays out a group's tensors in table order, so the
// q, k, v weights (no biases between them) and the gate, up weights usually do.
static bool adjacent(const void *const *t, int i, int j, size_t n, size_t elem) {
    return (const char *)t[i] + n * elem == (const char *)t[j];
}

// q, k, v weights one (QKV, C) matrix, in the weights and, for backward, in the gradients.
static bool qkv_joined(const llama_cuda *m, const uint16_t *const *p, int l) {
    if (lt(m, l, DSC_LLAMA_QB) >= 0) return false; // biases between the weights
    size_t C = (size_t)m->c.hidden;
    int q = lt(m, l, DSC_LLAMA_QW), k = lt(m, l, DSC_LLAMA_KW), v = lt(m, l, DSC_LLAMA_VW);
    const void *const *t = (const void *const *)p;
    return adjacent(t, q, k, (size_t)m->QD * C, 2) && adjacent(t, k, v, (size_t)m->KD * C, 2);
}

static bool qkv_grads_joined(const llama_cuda *m, float *const *g, int l) {
    if (lt(m, l, DSC_LLAMA_QB) >= 0) return false;
    size_t C = (size_t)m->c.hidden;
    int q = lt(m, l, DSC_LLAMA_QW), k = lt(m, l, DSC_LLAMA_KW), v = lt(m, l, DSC_LLAMA_VW);
    const void *const *t = (const void *const *)g;
    return adjacent(t, q, k, (size_t)m->QD * C, 4) && adjacent(t, k, v, (size_t)m->KD * C, 4);
}

// gate and up weights one (2 I, C) matrix.
static bool gu_joined(const llama_cuda *m, const uint16_t *const *p, int l) {
    size_t n = (size_t)m->c.intermediate * m->c.hidden;
    return adjacent((const void *const *)p, lt(m, l, DSC_LLAMA_GATE), lt(m, l, DSC_LLAMA_UP), n,
                    2);
}

static bool gu_grads_joined(const llama_cuda *m, float *const *g, int l) {
    size_t n = (size_t)m->c.intermediate * m->c.hidden;
    return adjacent((const void *const *)g, lt(m, l, DSC_LLAMA_GATE), lt(m, l, DSC_LLAMA_UP), n,
                    4);
}

static dsc_status layer_forward(llama_cuda *m, const uint16_t *const *p, int l) {
    int B = m->B, T = m->T, BT = B * T, C = m->c.hidden, I = m->c.intermediate;
    int NH = m->c.n_head, NKV = m->c.n_kv_head, HS = m->c.head_dim;
    int QD = m->QD, KD = m->KD, QKV = m->QKV;
    float eps = m->c.rms_eps;
    layer_acts a = acts_of(m, l);
    cudaStream_t st = m->st;
    DSC_TRY(dsc__cuda_rmsnorm_forward_h(a.ln1, a.rstd1, a.res_in, p[lt(m, l, DSC_LLAMA_LN1)], eps,
                                        BT, C, m->fp16, st));
    if (qkv_joined(m, p, l)) { // one product over the three weights, which lie end to end
        DSC_TRY(linear(m, lt(m, l, DSC_LLAMA_QW), a.qkv, QKV, a.ln1, C, p[lt(m, l, DSC_LLAMA_QW)], NULL, NULL, BT, C,
                       QKV));
    } else {
        DSC_TRY(linear(m, lt(m, l, DSC_LLAMA_QW), a.qkv, QKV, a.ln1, C, p[lt(m, l, DSC_LLAMA_QW)],
                       bias_of(m, p, l, DSC_LLAMA_QB), NULL, BT, C, QD));
        DSC_TRY(linear(m, lt(m, l, DSC_LLAMA_KW), a.qkv + QD, QKV, a.ln1, C, p[lt(m, l, DSC_LLAMA_KW)],
                       bias_of(m, p, l, DSC_LLAMA_KB), NULL, BT, C, KD));
        DSC_TRY(linear(m, lt(m, l, DSC_LLAMA_VW), a.qkv + QD + KD, QKV, a.ln1, C, p[lt(m, l, DSC_LLAMA_VW)],
                       bias_of(m, p, l, DSC_LLAMA_VB), NULL, BT, C, KD));
    }
    DSC_TRY(adapt(m, p, l, DSC_LLAMA_QW, a.qkv, QKV, a.ln1, C));
    DSC_TRY(adapt(m, p, l, DSC_LLAMA_KW, a.qkv + QD, QKV, a.ln1, C));
    DSC_TRY(adapt(m, p, l, DSC_LLAMA_VW, a.qkv + QD + KD, QKV, a.ln1, C));
    if (m->c.qk_norm) // Qwen3: each head's q and k normed, then rotated, in one pass
        DSC_TRY(dsc__cuda_qk_norm_rope_h(a.qkv, QKV, a.qk_raw, a.qk_rstd,
                                         p[lt(m, l, DSC_LLAMA_QN)], p[lt(m, l, DSC_LLAMA_KN)],
                                         eps, m->rope_cos, m->rope_sin, m->posd, B, T, NH, NKV, HS,
                                         m->fp16, st));
    else
        DSC_TRY(dsc__cuda_rope_h(a.qkv, QKV, m->rope_cos, m->rope_sin, m->posd, B, T, NH + NKV, HS,
                                 false, m->fp16, st));
    DSC_TRY(dsc__cuda_gqa_forward(a.atty, a.lse, a.qkv, B, T, NH, NKV, HS, m->fp16, st));
    DSC_TRY(linear(m, lt(m, l, DSC_LLAMA_OW), a.res2, C, a.atty, QD, p[lt(m, l, DSC_LLAMA_OW)], NULL, a.res_in, BT, QD,
                   C));
    DSC_TRY(adapt(m, p, l, DSC_LLAMA_OW, a.res2, C, a.atty, QD));
    DSC_TRY(dsc__cuda_rmsnorm_forward_h(a.ln2, a.rstd2, a.res2, p[lt(m, l, DSC_LLAMA_LN2)], eps,
                                        BT, C, m->fp16, st));
    if (gu_joined(m, p, l)) {
        DSC_TRY(linear(m, lt(m, l, DSC_LLAMA_GATE), a.gu, 2 * I, a.ln2, C, p[lt(m, l, DSC_LLAMA_GATE)], NULL, NULL, BT, C,
                       2 * I));
    } else {
        DSC_TRY(
            linear(m, lt(m, l, DSC_LLAMA_GATE), a.gu, 2 * I, a.ln2, C, p[lt(m, l, DSC_LLAMA_GATE)], NULL, NULL, BT, C, I));
        DSC_TRY(
            linear(m, lt(m, l, DSC_LLAMA_UP), a.gu + I, 2 * I, a.ln2, C, p[lt(m, l, DSC_LLAMA_UP)], NULL, NULL, BT, C, I));
    }
    DSC_TRY(adapt(m, p, l, DSC_LLAMA_GATE, a.gu, 2 * I, a.ln2, C));
    DSC_TRY(adapt(m, p, l, DSC_LLAMA_UP, a.gu + I, 2 * I, a.ln2, C));
    DSC_TRY(dsc__cuda_swiglu_forward_h(a.hmid, a.gu, BT, I, m->fp16, st));
    DSC_TRY(
        linear(m, lt(m, l, DSC_LLAMA_DOWN), a.res_out, C, a.hmid, I, p[lt(m, l, DSC_LLAMA_DOWN)], NULL, a.res2, BT, I, C));
    return adapt(m, p, l, DSC_LLAMA_DOWN, a.res_out, C, a.hmid, I);
}

static void tensor_name(const void *cfg, int i, char *buf, int cap) {
    dsc_llama_tensor_info info;
    dsc_llama_tensor_info_get((const dsc_llama_config *)cfg, i, &info);
    snprintf(buf, (size_t)cap, "%s", info.name);
}

// Every params entry; a grads entry for every tensor that trains (a frozen one, LoRA's base, has
// none), as the host passes check it.
static dsc_status check_params(const llama_cuda *m, const void *const *t, const char *what) {
    const bool *required = m->c.lora && !strcmp(what, "grads") ? m->c.lora->trainable : NULL;
    return dsc__cuda_table_check(t, dsc_llama_num_tensors(&m->c), "llama cuda", what,
                                 tensor_name, &m->c, required);
}

static dsc_status loss_enqueue(void *dev, const float **loss_dev) {
    llama_cuda *m = (llama_cuda *)dev;
    DSC_CUDA_ARG(m && loss_dev, "llama cuda loss: model and out must be set");
    DSC_TRY(dsc__cuda_mean_loss(m->loss_dev, m->losses, (int64_t)m->B * m->T, m->ntargets, m->st));
    *loss_dev = m->loss_dev;
    return DSC_OK;
}

static dsc_status read_loss(void *dev, float *loss) {
    llama_cuda *m = (llama_cuda *)dev;
    DSC_CUDA_ARG(m && loss && m->B > 0, "llama cuda read loss: needs a model that ran a forward");
    return dsc__cuda_mean_loss_read(loss, m->loss_dev, m->losses, (int64_t)m->B * m->T,
                                    m->ntargets, m->st);
}

static dsc_status prepare_tokens(llama_cuda *m, const uint16_t *const *params,
                                 const int32_t *inputs, const int32_t *targets, int B, int T) {
    DSC_CUDA_ARG(m && inputs, "llama cuda forward: model and inputs must be set");
    DSC_CUDA_ARG(B >= 1 && T >= 1 && B <= m->maxB && T <= m->maxT,
                 "llama cuda forward: batch %d x %d does not fit the %d x %d this model was "
                 "created for", B, T, m->maxB, m->maxT);
    DSC_TRY(check_params(m, (const void *const *)params, "params"));
    DSC_TRY(dsc__cuda_tokens_upload(m->tokens, inputs, targets, B, T, m->c.vocab_size,
                                    "llama cuda", &m->ntargets, m->st));
    m->posd = NULL;
    if (m->pos_host) {
        DSC_TRY(dsc__cuda_positions_upload(m->pos_buf, m->pos_host, B, T, m->maxT, "llama cuda",
                                           m->st));
        m->posd = m->pos_buf;
    }
    m->B = B, m->T = T, m->have_targets = false;
    dsc__dev_layers_set_rows(&m->drv, (int64_t)B * T);
    return DSC_OK;
}

// The head's rows as the logits product reads them: the parameter itself when the vocabulary is
// a multiple of 64, else a padded copy (cuBLASLt's aligned kernels are several times faster).
static dsc_status head_rows(llama_cuda *m, const uint16_t *const *params, const uint16_t **w) {
    const uint16_t *head = params[dsc__llama_head_tensor(&m->c)];
    *w = head;
    if (!m->head_pad) return DSC_OK;
    DSC_CUDA_TRY(cudaMemcpyAsync(m->head_pad, head,
                                 sizeof(uint16_t) * (size_t)m->c.vocab_size * m->c.hidden,
                                 cudaMemcpyDeviceToDevice, m->st));
    *w = m->head_pad;
    return DSC_OK;
}

// The driver's passes (dsc__dev_layers_ops): the tokens' embeddings.
static dsc_status embed_op(void *dev, const uint16_t *const *params) {
    llama_cuda *m = (llama_cuda *)dev;
    return dsc__cuda_embed_forward_h(dsc__dev_layers_input(&m->drv, 0), m->tokens, params[0],
                                     m->B * m->T, m->c.hidden, m->fp16, m->st);
}

static dsc_status layer_forward_op(void *dev, const uint16_t *const *params, int l) {
    return layer_forward((llama_cuda *)dev, params, l);
}

// The final norm and the logits.
static dsc_status head_op(void *dev, const uint16_t *const *params) {
    llama_cuda *m = (llama_cuda *)dev;
    int BT = m->B * m->T, C = m->c.hidden, L = m->c.n_layer;
    DSC_TRY(dsc__cuda_rmsnorm_forward_h(m->lnf, m->rstdf, acts_of(m, L).res_in,
                                        params[dsc__llama_norm_tensor(&m->c)], m->c.rms_eps, BT,
                                        C, m->fp16, m->st));
    const uint16_t *w = NULL;
    DSC_TRY(head_rows(m, params, &w));
    return head_linear(m, w);
}

static dsc_status forward(void *dev, const uint16_t *const *params, const int32_t *inputs,
                          const int32_t *targets, int B, int T, float *loss) {
    llama_cuda *m = (llama_cuda *)dev;
    DSC_TRY(prepare_tokens(m, params, inputs, targets, B, T));
    DSC_TRY(dsc__dev_layers_forward(&m->drv, params));
    if (!targets) return DSC_OK;
    int BT = B * T;
    DSC_TRY(dsc__cuda_xent_forward_h(m->losses, m->lse, m->logits, m->tokens + BT, BT,
                                     m->c.vocab_size, m->Vp, m->fp16, m->st));
    m->have_targets = true;
    return loss ? read_loss(m, loss) : DSC_OK;
}

// ---- backward ----

// On entry m->dres holds the gradient of layer l's output (the residual stream); on return that
// of its input.
static dsc_status layer_backward(llama_cuda *m, const uint16_t *const *p, float *const *g,
                                 int l) {
    int B = m->B, T = m->T, BT = B * T, C = m->c.hidden, I = m->c.intermediate;
    int NH = m->c.n_head, NKV = m->c.n_kv_head, HS = m->c.head_dim;
    int QD = m->QD, KD = m->KD, QKV = m->QKV;
    layer_acts a = acts_of(m, l);
    cudaStream_t st = m->st;
    bool add = !m->fresh;
    // down_proj and SwiGLU: dh = dres @ W_down; dgu (in dbig) from dh
    DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_DOWN), m->dh, I, m->dres, C, p[lt(m, l, DSC_LLAMA_DOWN)], BT, I, C, false));
    DSC_TRY(adapt_back(m, p, g, l, DSC_LLAMA_DOWN, m->dh, I, m->dres, C, a.hmid, I));
    DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_DOWN), g[lt(m, l, DSC_LLAMA_DOWN)], m->dres, C, a.hmid, I, BT, I, C));
    DSC_TRY(dsc__cuda_swiglu_backward_h(m->dbig, m->dh, a.gu, BT, I, m->fp16, st));
    // gate_proj, up_proj and post_attention_layernorm
    if (gu_joined(m, p, l)) {
        DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_GATE), m->dln, C, m->dbig, 2 * I, p[lt(m, l, DSC_LLAMA_GATE)], BT, C,
                            2 * I, false));
    } else {
        DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_GATE), m->dln, C, m->dbig, 2 * I, p[lt(m, l, DSC_LLAMA_GATE)], BT, C, I,
                            false));
        DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_UP), m->dln, C, m->dbig + I, 2 * I, p[lt(m, l, DSC_LLAMA_UP)], BT, C,
                            I, true));
    }
    DSC_TRY(adapt_back(m, p, g, l, DSC_LLAMA_GATE, m->dln, C, m->dbig, 2 * I, a.ln2, C));
    DSC_TRY(adapt_back(m, p, g, l, DSC_LLAMA_UP, m->dln, C, m->dbig + I, 2 * I, a.ln2, C));
    if (gu_grads_joined(m, g, l)) {
        DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_GATE), g[lt(m, l, DSC_LLAMA_GATE)], m->dbig, 2 * I, a.ln2, C, BT, C,
                          2 * I));
    } else {
        DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_GATE), g[lt(m, l, DSC_LLAMA_GATE)], m->dbig, 2 * I, a.ln2, C, BT, C, I));
        DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_UP), g[lt(m, l, DSC_LLAMA_UP)], m->dbig + I, 2 * I, a.ln2, C, BT, C, I));
    }
    DSC_TRY(dsc__cuda_rmsnorm_backward_h(m->dres, norm_grad(m, g, lt(m, l, DSC_LLAMA_LN2)),
                                         m->rms_scratch,
                                         m->dln, a.res2, p[lt(m, l, DSC_LLAMA_LN2)], a.rstd2, add,
                                         BT, C, m->fp16, st));
    // o_proj and attention (dqkv in dbig), rotary embeddings undone on dq and dk
    DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_OW), m->datt, QD, m->dres, C, p[lt(m, l, DSC_LLAMA_OW)], BT, QD, C, false));
    DSC_TRY(adapt_back(m, p, g, l, DSC_LLAMA_OW, m->datt, QD, m->dres, C, a.atty, QD));
    DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_OW), g[lt(m, l, DSC_LLAMA_OW)], m->dres, C, a.atty, QD, BT, QD, C));
    DSC_TRY(dsc__cuda_gqa_backward(m->dbig, m->att_scratch, m->datt, a.qkv, a.atty, a.lse, B, T,
                                   NH, NKV, HS, m->fp16, st));
    if (m->c.qk_norm) // Qwen3: the rotation undone and the q/k norms' backward in one pass
        DSC_TRY(dsc__cuda_qk_norm_rope_backward_h(
            m->dbig, QKV, norm_grad(m, g, lt(m, l, DSC_LLAMA_QN)),
            norm_grad(m, g, lt(m, l, DSC_LLAMA_KN)), m->qkn_scratch,
            a.qk_raw, a.qk_rstd, p[lt(m, l, DSC_LLAMA_QN)], p[lt(m, l, DSC_LLAMA_KN)],
            m->rope_cos, m->rope_sin, m->posd, B, T, NH, NKV, HS, add, m->fp16, st));
    else
        DSC_TRY(dsc__cuda_rope_h(m->dbig, QKV, m->rope_cos, m->rope_sin, m->posd, B, T, NH + NKV,
                                 HS, true, m->fp16, st));
    if (lt(m, l, DSC_LLAMA_QB) >= 0 && g[lt(m, l, DSC_LLAMA_QB)]) { // Qwen2's q/k/v biases
        // (trained together, or frozen together as LoRA's base): dqkv's column sums
        DSC_TRY(dsc__cuda_colsum_h(m->bias_tmp, m->col_scratch, m->dbig, BT, QKV, false, m->fp16,
                                   st));
        DSC_TRY(dsc__cuda_add_f32_clear(g[lt(m, l, DSC_LLAMA_QB)], m->bias_tmp, QD, add, st));
        DSC_TRY(dsc__cuda_add_f32_clear(g[lt(m, l, DSC_LLAMA_KB)], m->bias_tmp + QD, KD, add, st));
        DSC_TRY(dsc__cuda_add_f32_clear(g[lt(m, l, DSC_LLAMA_VB)], m->bias_tmp + QD + KD, KD, add,
                                        st));
    }
    // q, k, v projections and input_layernorm
    if (qkv_joined(m, p, l)) {
        DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_QW), m->dln, C, m->dbig, QKV, p[lt(m, l, DSC_LLAMA_QW)], BT, C, QKV,
                            false));
    } else {
        DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_QW), m->dln, C, m->dbig, QKV, p[lt(m, l, DSC_LLAMA_QW)], BT, C, QD,
                            false));
        DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_KW), m->dln, C, m->dbig + QD, QKV, p[lt(m, l, DSC_LLAMA_KW)], BT, C, KD,
                            true));
        DSC_TRY(linear_dinp(m, lt(m, l, DSC_LLAMA_VW), m->dln, C, m->dbig + QD + KD, QKV, p[lt(m, l, DSC_LLAMA_VW)], BT,
                            C, KD, true));
    }
    DSC_TRY(adapt_back(m, p, g, l, DSC_LLAMA_QW, m->dln, C, m->dbig, QKV, a.ln1, C));
    DSC_TRY(adapt_back(m, p, g, l, DSC_LLAMA_KW, m->dln, C, m->dbig + QD, QKV, a.ln1, C));
    DSC_TRY(adapt_back(m, p, g, l, DSC_LLAMA_VW, m->dln, C, m->dbig + QD + KD, QKV, a.ln1, C));
    if (qkv_grads_joined(m, g, l)) {
        DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_QW), g[lt(m, l, DSC_LLAMA_QW)], m->dbig, QKV, a.ln1, C, BT, C, QKV));
    } else {
        DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_QW), g[lt(m, l, DSC_LLAMA_QW)], m->dbig, QKV, a.ln1, C, BT, C, QD));
        DSC_TRY(linear_dw(m, lt(m, l, DSC_LLAMA_KW), g[lt(m, l, DSC_LLAMA_KW)], m->dbig + QD, QKV, a.ln1, C, BT, C, KD));
        DSC_TRY(
            linear_dw(m, lt(m, l, DSC_LLAMA_VW), g[lt(m, l, DSC_LLAMA_VW)], m->dbig + QD + KD, QKV, a.ln1, C, BT, C, KD));
    }
    return dsc__cuda_rmsnorm_backward_h(m->dres, norm_grad(m, g, lt(m, l, DSC_LLAMA_LN1)),
                                        m->rms_scratch,
                                        m->dln, a.res_in, p[lt(m, l, DSC_LLAMA_LN1)], a.rstd1,
                                        add, BT, C, m->fp16, st);
}

// From the logits' gradients (in m->logits) through the head and the final norm into dres.
static dsc_status head_back_op(void *dev, const uint16_t *const *params, float *const *grads) {
    llama_cuda *m = (llama_cuda *)dev;
    int BT = m->B * m->T, C = m->c.hidden, L = m->c.n_layer;
    int norm = dsc__llama_norm_tensor(&m->c), head = dsc__llama_head_tensor(&m->c);
    cudaStream_t st = m->st;
    const uint16_t *w = m->head_pad ? m->head_pad : params[head]; // as the forward read it
    DSC_TRY(head_backward(m, w, grads[head]));
    DSC_CUDA_TRY(cudaMemsetAsync(m->dres, 0, sizeof(uint16_t) * (size_t)BT * C, st));
    return dsc__cuda_rmsnorm_backward_h(m->dres, norm_grad(m, grads, norm), m->rms_scratch,
                                        m->dln, acts_of(m, L).res_in, params[norm], m->rstdf,
                                        !m->fresh, BT, C, m->fp16, st);
}

static dsc_status layer_backward_op(void *dev, const uint16_t *const *params, float *const *grads,
                                    int l) {
    return layer_backward((llama_cuda *)dev, params, grads, l);
}

// embed_tokens from dres: tied, the head's product wrote (or added to) it above; untied and
// fresh, its rows no token visits must read zero; frozen (LoRA's base): nothing.
static dsc_status embed_back_op(void *dev, const uint16_t *const *params, float *const *grads) {
    (void)params;
    llama_cuda *m = (llama_cuda *)dev;
    int BT = m->B * m->T, C = m->c.hidden, V = m->c.vocab_size;
    if (grads[0] && dsc__llama_head_tensor(&m->c) != 0 && m->fresh)
        DSC_CUDA_TRY(cudaMemsetAsync(grads[0], 0, sizeof(float) * (size_t)V * C, m->st));
    if (!grads[0]) return DSC_OK;
    return dsc__cuda_embed_backward_h(grads[0], m->emb_scratch, m->dres, m->tokens, BT, C, V,
                                      true, m->fp16, m->st);
}

// The recomputed forwards of activation checkpointing: FP8's products reuse the maxima the
// first forward measured.
static void recompute_op(void *dev, bool on) { ((llama_cuda *)dev)->lin.recompute = on; }

// A step is a graph unless its adapters say no (lora_dropout: model/lora_cuda.h).
static bool graph_op(const void *dev) { return dsc__lora_dev_graph_ok(((llama_cuda *)dev)->c.lora); }

static dsc_status backward(void *dev, const uint16_t *const *params, float *const *grads,
                           float loss_scale) {
    llama_cuda *m = (llama_cuda *)dev;
    DSC_CUDA_ARG(m != NULL, "llama cuda backward: model is NULL");
    DSC_CUDA_ARG(m->have_targets,
                 "llama cuda backward: needs a forward with targets first, and each such forward "
                 "allows one backward (it consumes the logits)");
    DSC_TRY(check_params(m, (const void *const *)params, "params"));
    DSC_TRY(check_params(m, (const void *const *)grads, "grads"));
    m->have_targets = false;
    int BT = m->B * m->T;
    float g = m->ntargets ? loss_scale / (float)m->ntargets : 0.0f;
    DSC_TRY(dsc__cuda_xent_backward_h(m->logits, m->logits, m->lse, m->tokens + BT, g, BT,
                                      m->c.vocab_size, m->Vp, m->fp16, m->st));
    return dsc__dev_layers_backward(&m->drv, params, grads);
}

// The training step's loss and the logits' gradients in one pass over the logits (bitwise a
// forward's loss then the backward's: the fused cross-entropy makes the same values).
static dsc_status loss_op(void *dev, float loss_scale) {
    llama_cuda *m = (llama_cuda *)dev;
    int BT = m->B * m->T;
    float g = m->ntargets ? loss_scale / (float)m->ntargets : 0.0f; // d(mean)/d(loss_i)
    return dsc__cuda_xent_fused_h(m->losses, m->logits, m->tokens + BT, g, BT, m->c.vocab_size,
                                  m->Vp, m->fp16, m->st);
}

static const dsc__dev_layers_ops *layer_ops(void) {
    static const dsc__dev_layers_ops ops = {
        embed_op,      layer_forward_op, head_op,     loss_op, head_back_op, layer_backward_op,
        embed_back_op, recompute_op,     graph_op,
    };
    return &ops;
}

// Forward, loss and logits' gradients, backward: through the driver's graph of the step.
static dsc_status train_step(void *dev, const uint16_t *const *params, float *const *grads,
                             const int32_t *inputs, const int32_t *targets, int B, int T,
                             float loss_scale, float *loss) {
    llama_cuda *m = (llama_cuda *)dev;
    DSC_CUDA_ARG(m && targets, "llama cuda train step: model and targets must be set");
    DSC_TRY(check_params(m, (const void *const *)grads, "grads"));
    DSC_TRY(prepare_tokens(m, params, inputs, targets, B, T));
    dsc__dev_graph_key k;
    memset(&k, 0, sizeof k);
    k.B = B, k.T = T, k.ntargets = m->ntargets, k.loss_scale = loss_scale, k.fp16 = m->fp16;
    k.fresh = m->fresh, k.pos = m->posd != NULL;
    DSC_TRY(dsc__dev_layers_step(&m->drv, params, grads, &k));
    m->have_targets = false; // the logits became their gradients
    return loss ? read_loss(m, loss) : DSC_OK;
}

// The bytes create takes from the pool for B x T tokens (the same carve), for a memory plan.
static size_t act_bytes(const void *cfg, int B, int T) {
    const dsc_llama_config *c = (const dsc_llama_config *)cfg;
    llama_cuda m = {};
    m.c = *c;
    m.maxB = B, m.maxT = T;
    m.QD = c->n_head * c->head_dim;
    m.KD = c->n_kv_head * c->head_dim;
    m.QKV = m.QD + 2 * m.KD;
    m.Vp = (c->vocab_size + LOGITS_ALIGN - 1) / LOGITS_ALIGN * LOGITS_ALIGN;
    return carve(&m, NULL);
}

// cpu_checkpointing's page-locked host copy of the layers' inputs.
static size_t act_host_bytes(const void *cfg, int B, int T) {
    const dsc_llama_config *c = (const dsc_llama_config *)cfg;
    return c->recompute == 2 ? (size_t)c->n_layer * B * T * c->hidden * 2 : 0;
}

extern "C" const struct dsc_model_device_ops dsc__llama_device_ops = {
    create,   destroy,  set_fp16,   set_fresh, set_grad_hook, set_layer_hook,
    forward,  backward, train_step, read_loss, loss_enqueue, &dsc__llama_decode_ops,
    act_bytes,
    true, // recomputes: acts_of / carve lay out one shared block, the driver reruns
    true, // adapters: LoRA beside every product (model/lora_cuda.h), frozen gradients skipped
    set_positions,
    act_host_bytes,
    true, // fp8: the layers' products through cuda/linear.h, the head in 16-bit
};
