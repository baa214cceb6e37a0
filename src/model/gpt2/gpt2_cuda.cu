// model/gpt2/gpt2_cuda.cu - GPT-2 forward and backward on one GPU (see gpt2_cuda.h).
#include "model/gpt2/gpt2_cuda.h"

#include <stdlib.h> // calloc, free
#include <stdio.h>  // snprintf
#include <string.h> // memcmp, memcpy, memset

extern "C" {
#include "model/gpt2/gpt2.h" // dsc_gpt2_config, dsc_gpt2_tensor_info_get
#include "model/lora.h"      // struct dsc_lora (which base tensors train)
}

#include "cuda/attention.h"          // dsc__cuda_attention_*
#include "cuda/common.cuh"           // DSC_CUDA_TRY
#include "cuda/devbuf.h"             // dsc__cuda_buf_*
#include "cuda/device_model.h"       // dsc__cuda_tokens_upload, dsc__cuda_mean_loss, ...
#include "model/gpt2/gpt2_decode.h"  // dsc__gpt2_decode_ops
#include "model/gpt2/gpt2_kernels.h" // dsc__cuda_layernorm_*, ...
#include "model/layers_cuda.h"        // dsc__dev_layers (the layer loop, hooks, graphs)
#include "model/lora_cuda.h"          // dsc__lora_dev_* (LoRA adapters beside the products)
#include "cuda/kernels.h"            // dsc__cuda_xent_*_h, _colsum_h, _reduce_columns
#include "cuda/matmul.h"             // dsc__cuda_gemm
#include "cuda/linear.h"             // dsc__cuda_lin_* (the layers' products, Conv1D layout)

#define LOGITS_ALIGN 64 // logits rows padded to a multiple of this many columns

// The twelve tensors of a layer, in table order (as model/gpt2/gpt2.c).
// clang-format off
enum {
    K_LN1W, K_LN1B, K_ATTW, K_ATTB, K_APROJW, K_APROJB,
    K_LN2W, K_LN2B, K_FCW, K_FCB, K_MPROJW, K_MPROJB, PER_LAYER
};
// clang-format on

typedef struct gpt2_cuda gpt2_cuda; // activations and scratch for up to maxB x maxT tokens
struct gpt2_cuda {
    dsc_gpt2_config c;
    int maxB, maxT, B, T, Vp;
    int ntargets; // targets of the last forward that count (not negative): the mean's divisor
    bool have_targets, fused_gelu;
    bool fp16; // 16-bit tensors (parameters, activations, their gradients) are fp16, not bf16
    bool fresh; // the next backward overwrites the gradients (set_fresh) instead of adding
    cudaStream_t st;
    dsc_cuda_blas *blas;
    dsc__cuda_lin lin;  // the layers' linear products (w (IN, OUT), 16-bit)
    dsc_cuda_buf slab; // every buffer below is a view of it
    // 16-bit activations; per-layer arrays hold n_layer blocks of maxB * maxT rows.
    uint16_t *res; // the residual stream into each layer, the driver's (dsc__dev_layers)
    uint16_t *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg; // (L, BT, C / 3C / C / C / C / 4C / 4C)
    uint16_t *lnf;                                        // (BT, C)
    uint16_t *wte_pad; // (Vp, C): the forward's copy of wte, rows [V, Vp) zero (see forward)
    uint16_t *logits;                   // (BT, Vp); their gradients after backward
    uint16_t *dres, *dln, *datt, *dbig; // backward scratch (BT, C) x 3 and (BT, 4C)
    // fp32
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd; // (L, BT)
    float *att_lse;                                   // (L, B, NH, T)
    float *lnf_mean, *lnf_rstd, *losses, *lse;        // (BT)
    float *loss_dev;                                  // (1)
    float *ln_scratch, *col_scratch, *att_scratch;
    float *bias_carry; // (C) mlp.c_proj's bias gradient of the layer below, from ln_1's backward
    float *att_bpart;  // (chunks, 3C) attn.c_attn's bias gradient per 64 rows, from the attention
    void *enc_scratch;
    float *discard;  // (2, C) the gradients of a frozen layernorm (LoRA's base), never read
    void *lora_buf;  // the adapters' activations (model/lora_cuda.h), in the slab
    dsc__lora_dev lora;
    int32_t *tokens; // (2, BT): inputs, targets
    int32_t *pos_buf;        // (BT) the position ids of the last forward, when it had any
    const int32_t *pos_host; // set_positions' ids for the next forward (HOST), or NULL
    const int32_t *posd;     // the last forward's ids on the device (pos_buf), or NULL: 0 .. T-1
    // the layer loop, the hooks, activation checkpointing and the step's CUDA graph
    dsc__dev_layers drv;
};

typedef struct layer_acts {
    uint16_t *res_in, *ln1, *qkv, *atty, *res2, *ln2, *fch, *fchg, *res_out;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
} layer_acts;

// The residual stream is the driver's; the rest lives in the layer's block, one block shared by
// all layers when they are recomputed in the backward (activation checkpointing).
static layer_acts acts_of(const gpt2_cuda *m, int l) {
    size_t R = (size_t)m->maxB * m->maxT, C = (size_t)m->c.n_embd;
    size_t L = dsc__dev_layers_block(m->c.recompute, l);
    layer_acts a = {
        dsc__dev_layers_input(&m->drv, l), m->ln1 + L * R * C,
        m->qkv + L * R * 3 * C,   m->atty + L * R * C,
        m->res2 + L * R * C,      m->ln2 + L * R * C,
        m->fch + L * R * 4 * C,   m->fchg + L * R * 4 * C,
        dsc__dev_layers_input(&m->drv, l + 1), m->ln1_mean + L * R,
        m->ln1_rstd + L * R,      m->ln2_mean + L * R,
        m->ln2_rstd + L * R,      m->att_lse + L * R * (size_t)m->c.n_head,
    };
    return a;
}

// ---- allocation ----

// The activation block's views (dsc__cuda_carve: base NULL only counts bytes).
static size_t carve(gpt2_cuda *m, char *base) {
    size_t R = (size_t)m->maxB * m->maxT, C = (size_t)m->c.n_embd;
    size_t NL = (size_t)m->c.n_layer, L = dsc__dev_layers_blocks(m->c.recompute, (int)NL);
    size_t NH = (size_t)m->c.n_head, V = (size_t)m->c.vocab_size, Vp = (size_t)m->Vp;
    size_t NP = V > (size_t)m->c.max_seq_len ? V : (size_t)m->c.max_seq_len; // ids the sort takes
    size_t colsum = dsc__cuda_colsum_scratch((int64_t)R, 4 * (int)C);
    dsc__cuda_carve_entry table[] = {
        {(void **)&m->res, dsc__dev_layers_res_bytes(m->c.recompute, (int)NL, (int64_t)R, (int)C)},
        {(void **)&m->ln1, L * R * C * 2},
        {(void **)&m->qkv, L * R * 3 * C * 2},
        {(void **)&m->atty, L * R * C * 2},
        {(void **)&m->res2, L * R * C * 2},
        {(void **)&m->ln2, L * R * C * 2},
        {(void **)&m->fch, L * R * 4 * C * 2},
        {(void **)&m->fchg, L * R * 4 * C * 2},
        {(void **)&m->lnf, R * C * 2},
        {(void **)&m->wte_pad, Vp * C * 2},
        {(void **)&m->logits, R * Vp * 2},
        {(void **)&m->dres, R * C * 2},
        {(void **)&m->dln, R * C * 2},
        {(void **)&m->datt, R * C * 2},
        {(void **)&m->dbig, R * 4 * C * 2},
        {(void **)&m->ln1_mean, L * R * 4},
        {(void **)&m->ln1_rstd, L * R * 4},
        {(void **)&m->ln2_mean, L * R * 4},
        {(void **)&m->ln2_rstd, L * R * 4},
        {(void **)&m->att_lse, L * R * NH * 4},
        {(void **)&m->lnf_mean, R * 4},
        {(void **)&m->lnf_rstd, R * 4},
        {(void **)&m->losses, R * 4},
        {(void **)&m->lse, R * 4},
        {(void **)&m->loss_dev, 4},
        {(void **)&m->ln_scratch, dsc__cuda_layernorm_backward_scratch((int64_t)R, (int)C) * 4},
        {(void **)&m->col_scratch, colsum * 4},
        {(void **)&m->bias_carry, C * 4},
        {(void **)&m->att_bpart,
         (size_t)dsc__cuda_attention_bias_chunks(m->maxB, m->maxT) * 3 * C * 4},
        {(void **)&m->att_scratch,
         dsc__cuda_attention_backward_scratch(m->maxB, m->maxT, (int)NH) * 4},
        {(void **)&m->enc_scratch, dsc__cuda_embed_backward_scratch((int64_t)R, (int)NP)},
        {(void **)&m->discard, m->c.lora ? 2 * C * 4 : 0},
        {(void **)&m->lora_buf, dsc__lora_dev_bytes(m->c.lora, (int64_t)R)},
        {(void **)&m->tokens, 2 * R * 4},
        {(void **)&m->pos_buf, R * 4},
    };
    return dsc__cuda_carve(table, sizeof table / sizeof table[0], base);
}

static void destroy(void *dev);
static const dsc__dev_layers_ops *layer_ops(void); // the passes the driver calls (below)

// The activations and scratch for up to B x T tokens as one block of the pool ("gpu.activations";
// NULL: cudaMalloc), cuBLASLt's workspace too; every pass runs on stream (NULL: the default).
static dsc_status create(const void *cfg, int B, int T, void *stream, dsc_mem_pool *pool,
                         void **dev) {
    const dsc_gpt2_config *c = (const dsc_gpt2_config *)cfg;
    DSC_CUDA_ARG(dev && c, "gpt2 cuda create: out and config must be set");
    *dev = NULL;
    DSC_CUDA_ARG(c->n_layer > 0 && c->n_head > 0 && c->n_embd == 64 * c->n_head &&
                     c->vocab_size > 0 && c->max_seq_len > 0,
                 "gpt2 cuda create: the GPU model needs head size 64 (n_embd %d, n_head %d)",
                 c->n_embd, c->n_head);
    DSC_CUDA_ARG(B >= 1 && T >= 1 && T <= c->max_seq_len && (int64_t)B * T <= (1 << 24),
                 "gpt2 cuda create: batch %d x %d is invalid (T <= %d, B * T <= 16M)", B, T,
                 c->max_seq_len);
    DSC_CUDA_ARG((int64_t)B * c->n_head <= DSC_CUDA_ATT_MAX_BH,
                 "gpt2 cuda create: micro-batch %d x %d heads is more than the %d (sequence, "
                 "head) pairs attention takes in one launch; lower train_micro_batch_size_per_gpu",
                 B, c->n_head, DSC_CUDA_ATT_MAX_BH);
    // LoRA: wte and wpe train together or stay frozen together (the position embedding's own
    // gradient comes out of the encoder's backward beside the token embedding's)
    DSC_CUDA_ARG(!c->lora || c->lora->trainable[0] == c->lora->trainable[1],
                 "--device cuda: lora.modules_to_save trains %s of GPT-2's embeddings but not %s: "
                 "on the GPU both train or neither (add \"%s\" to modules_to_save), or train on "
                 "the CPU (--device cpu)", c->lora && c->lora->trainable[0] ? "wte" : "wpe",
                 c->lora && c->lora->trainable[0] ? "wpe" : "wte",
                 c->lora && c->lora->trainable[0] ? "wpe" : "wte");
    gpt2_cuda *m = (gpt2_cuda *)calloc(1, sizeof *m);
    if (!m) return dsc__fail(DSC_ERR_OOM, "gpt2 cuda create: out of host memory");
    m->c = *c;
    m->maxB = B;
    m->maxT = T;
    m->Vp = (c->vocab_size + LOGITS_ALIGN - 1) / LOGITS_ALIGN * LOGITS_ALIGN;
    m->st = (cudaStream_t)stream;
    m->fused_gelu = true;
    dsc_status st = dsc__cuda_buf_alloc(&m->slab, pool, carve(m, NULL), "gpu.activations");
    if (st == DSC_OK) carve(m, (char *)m->slab.ptr);
    if (st == DSC_OK)
        dsc__lora_dev_carve(&m->lora, c->lora, (int64_t)B * T, (char *)m->lora_buf);
    if (st == DSC_OK)
        st = dsc__dev_layers_init(&m->drv, layer_ops(), m, c->n_layer, dsc_gpt2_num_tensors(c),
                                  c->recompute, (int64_t)B * T, c->n_embd, m->res,
                                  m->st);
    if (st == DSC_OK) { // the padding rows of wte's copy stay zero for the model's life
        size_t V = (size_t)c->vocab_size, C = (size_t)c->n_embd;
        cudaError_t e = cudaMemsetAsync(m->wte_pad + V * C, 0,
                                        sizeof(uint16_t) * (size_t)(m->Vp - V) * C, m->st);
        if (e != cudaSuccess)
            st = dsc__cuda_fail(e, "gpt2 cuda create: clearing wte padding", __FILE__, __LINE__);
    }
    if (st == DSC_OK) st = dsc__cuda_blas_create_in(&m->blas, 0, pool);
    m->lora.blas = m->blas, m->lora.stream = m->st;
    m->lin.blas = m->blas, m->lin.stream = m->st, m->lin.in_out = true;
    if (st != DSC_OK) {
        destroy(m);
        return st;
    }
    *dev = m;
    return DSC_OK;
}

static void destroy(void *dev) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    if (!m) return;
    (void)cudaStreamSynchronize(m->st); // destroy cannot fail; a fault was reported earlier
    dsc__dev_layers_destroy(&m->drv);
    dsc__cuda_blas_destroy(m->blas);
    dsc__cuda_buf_free(&m->slab);
    free(m);
}

extern "C" void dsc__gpt2_cuda_set_fused_gelu(void *dev, bool on) {
    if (dev) ((gpt2_cuda *)dev)->fused_gelu = on;
}

static void set_fresh(void *dev, bool on) { ((gpt2_cuda *)dev)->fresh = on; }

static void set_positions(void *dev, const int32_t *pos) { ((gpt2_cuda *)dev)->pos_host = pos; }

static void set_fp16(void *dev, bool on) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    m->fp16 = m->lora.fp16 = m->lin.fp16 = on;
}

extern "C" const uint16_t *dsc__gpt2_cuda_logits(const void *dev, int *ld) {
    const gpt2_cuda *m = (const gpt2_cuda *)dev;
    if (ld) *ld = m ? m->Vp : 0;
    return m ? m->logits : NULL;
}

// ---- products ----

// Every product goes through the one device linear (m->lin, cuda/linear.h: the Conv1D layout;
// slot = the weight's tensor index): the layers' and the head's, whose logits (rows, Vp) are lnf
// @ wte_pad^T, wte_pad (Vp, C) read as a Conv1D weight of Vp inputs and C outputs (slot -1).

// ---- forward ----

static int layer_tensor(int l, int k) { return 2 + l * PER_LAYER + k; }

// Whether the MLP's GELU runs in the products' epilogues: not with LoRA, whose adapters on
// mlp.c_fc and mlp.c_proj add their terms before the GELU and before its derivative.
static bool gelu_fused(const gpt2_cuda *m) { return m->fused_gelu && !m->c.lora; }

// Layer l's weight k's adapter (if any) after its product: out (rows, its OC; stride ldo) += the
// adapter's term of inp (stride ldi).
static dsc_status adapt(gpt2_cuda *m, const uint16_t *const *params, int l, int k, uint16_t *out,
                        int ldo, const uint16_t *inp, int ldi) {
    return dsc__lora_dev_forward(&m->lora, params, layer_tensor(l, k), out, ldo, inp, ldi,
                                 (int64_t)m->B * m->T);
}

// Layer l's weight k's adapter in the backward, after the product's input gradient dinp
// (stride lddi) was written from dout (stride ldd); inp (stride ldi) the product's input.
static dsc_status adapt_back(gpt2_cuda *m, const uint16_t *const *params, float *const *grads,
                             int l, int k, uint16_t *dinp, int lddi, const uint16_t *dout,
                             int ldd, const uint16_t *inp, int ldi) {
    return dsc__lora_dev_backward(&m->lora, params, grads, layer_tensor(l, k), dinp, lddi, dout,
                                  ldd, inp, ldi, (int64_t)m->B * m->T, m->fresh);
}

// A layernorm's weight (j 0) or bias (j 1) gradient, or a discard buffer when frozen (LoRA).
static float *ln_grad(const gpt2_cuda *m, float *const *g, int i, int j) {
    return g[i] ? g[i] : m->discard + (size_t)j * m->c.n_embd;
}

static dsc_status layer_forward(gpt2_cuda *m, const uint16_t *const *params, int l) {
    int B = m->B, T = m->T, C = m->c.n_embd, NH = m->c.n_head, BT = B * T;
    layer_acts a = acts_of(m, l);
    const uint16_t *const *p = params + layer_tensor(l, 0);
    DSC_TRY(dsc__cuda_layernorm_forward_h(a.ln1, a.ln1_mean, a.ln1_rstd, a.res_in, p[K_LN1W],
                                          p[K_LN1B], BT, C, m->fp16, m->st));
    dsc__cuda_lin *L = &m->lin;
    DSC_TRY(dsc__cuda_lin_forward(L, layer_tensor(l, K_ATTW), a.qkv, 3 * C, a.ln1, C, p[K_ATTW],
                                  p[K_ATTB], NULL, BT, C, 3 * C));
    DSC_TRY(adapt(m, params, l, K_ATTW, a.qkv, 3 * C, a.ln1, C));
    DSC_TRY(dsc__cuda_attention_forward_h(a.atty, a.lse, a.qkv, B, T, C, NH, m->fp16, m->st));
    DSC_TRY(dsc__cuda_lin_forward(L, layer_tensor(l, K_APROJW), a.res2, C, a.atty, C, p[K_APROJW],
                                  p[K_APROJB], a.res_in, BT, C, C));
    DSC_TRY(adapt(m, params, l, K_APROJW, a.res2, C, a.atty, C));
    DSC_TRY(dsc__cuda_layernorm_forward_h(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p[K_LN2W],
                                          p[K_LN2B], BT, C, m->fp16, m->st));
    if (gelu_fused(m)) {
        DSC_TRY(dsc__cuda_lin_forward_gelu(L, layer_tensor(l, K_FCW), a.fchg, 4 * C, a.ln2, C,
                                           p[K_FCW], p[K_FCB], a.fch, BT, C, 4 * C));
    } else {
        DSC_TRY(dsc__cuda_lin_forward(L, layer_tensor(l, K_FCW), a.fch, 4 * C, a.ln2, C, p[K_FCW],
                                      p[K_FCB], NULL, BT, C, 4 * C));
        DSC_TRY(adapt(m, params, l, K_FCW, a.fch, 4 * C, a.ln2, C));
        DSC_TRY(dsc__cuda_gelu_forward_h(a.fchg, a.fch, (int64_t)BT * 4 * C, m->fp16, m->st));
    }
    DSC_TRY(dsc__cuda_lin_forward(L, layer_tensor(l, K_MPROJW), a.res_out, C, a.fchg, 4 * C,
                                  p[K_MPROJW], p[K_MPROJB], a.res2, BT, 4 * C, C));
    return adapt(m, params, l, K_MPROJW, a.res_out, C, a.fchg, 4 * C);
}

static void tensor_name(const void *cfg, int i, char *buf, int cap) {
    dsc_gpt2_tensor_info info;
    dsc_gpt2_tensor_info_get((const dsc_gpt2_config *)cfg, i, &info);
    snprintf(buf, (size_t)cap, "%s", info.name);
}

// A pass's tensor table: every entry set, but for the gradients of LoRA's frozen base.
static dsc_status check_params(const gpt2_cuda *m, const void *const *t, const char *what) {
    const bool *required = m->c.lora && !strcmp(what, "grads") ? m->c.lora->trainable : NULL;
    return dsc__cuda_table_check(t, dsc_gpt2_num_tensors(&m->c), "gpt2 cuda", what, tensor_name,
                                 &m->c, required);
}

static dsc_status loss_enqueue(void *dev, const float **loss_dev) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    DSC_CUDA_ARG(m && loss_dev, "gpt2 cuda loss: model and out must be set");
    DSC_TRY(dsc__cuda_mean_loss(m->loss_dev, m->losses, (int64_t)m->B * m->T, m->ntargets, m->st));
    *loss_dev = m->loss_dev;
    return DSC_OK;
}

static dsc_status loss_read(gpt2_cuda *m, float *loss) {
    return dsc__cuda_mean_loss_read(loss, m->loss_dev, m->losses, (int64_t)m->B * m->T,
                                    m->ntargets, m->st);
}

static void set_layer_hook(void *dev, dsc_model_layer_hook fn, void *user) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    m->drv.layer_hook = fn;
    m->drv.layer_user = user;
}

// Everything of a forward up to the logits (tokens checked and copied, targets too when given).
// Checks the batch's shape, the parameters and the tokens, and queues the tokens' upload.
static dsc_status prepare_tokens(gpt2_cuda *m, const uint16_t *const *params,
                                 const int32_t *inputs, const int32_t *targets, int B, int T) {
    DSC_CUDA_ARG(m && inputs, "gpt2 cuda forward: model and inputs must be set");
    DSC_CUDA_ARG(B >= 1 && T >= 1 && B <= m->maxB && T <= m->maxT,
                 "gpt2 cuda forward: batch %d x %d does not fit the %d x %d this model was "
                 "created for",
                 B, T, m->maxB, m->maxT);
    DSC_TRY(check_params(m, (const void *const *)params, "params"));
    DSC_TRY(dsc__cuda_tokens_upload(m->tokens, inputs, targets, B, T, m->c.vocab_size,
                                    "gpt2 cuda", &m->ntargets, m->st));
    m->posd = NULL;
    if (m->pos_host) {
        DSC_TRY(dsc__cuda_positions_upload(m->pos_buf, m->pos_host, B, T, m->c.max_seq_len,
                                           "gpt2 cuda", m->st));
        m->posd = m->pos_buf;
    }
    m->B = B, m->T = T, m->have_targets = false;
    dsc__dev_layers_set_rows(&m->drv, (int64_t)B * T);
    return DSC_OK;
}

// The driver's passes (dsc__dev_layers_ops): the tokens' and positions' embeddings.
static dsc_status embed_op(void *dev, const uint16_t *const *params) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    return dsc__cuda_encoder_forward_h(dsc__dev_layers_input(&m->drv, 0), m->tokens, m->posd,
                                       params[0], params[1], m->B, m->T, m->c.n_embd, m->fp16,
                                       m->st);
}

static dsc_status layer_forward_op(void *dev, const uint16_t *const *params, int l) {
    return layer_forward((gpt2_cuda *)dev, params, l);
}

// ln_f and the logits.
static dsc_status head_op(void *dev, const uint16_t *const *params) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    int BT = m->B * m->T, C = m->c.n_embd, V = m->c.vocab_size, L = m->c.n_layer;
    int lnf = layer_tensor(L, 0);
    DSC_TRY(dsc__cuda_layernorm_forward_h(m->lnf, m->lnf_mean, m->lnf_rstd, acts_of(m, L).res_in,
                                          params[lnf], params[lnf + 1], BT, C, m->fp16, m->st));
    // The logits product runs over Vp columns of a padded copy of wte: with V (50257) columns
    // cuBLASLt can only use its unaligned kernels, measured 5-7x slower on an H200 than the
    // aligned ones. The copy (V x C, tens of microseconds) is what backward uses too.
    DSC_CUDA_TRY(cudaMemcpyAsync(m->wte_pad, params[0], sizeof(uint16_t) * (size_t)V * C,
                                 cudaMemcpyDeviceToDevice, m->st));
    return dsc__cuda_lin_dinp(&m->lin, -1, m->logits, m->Vp, m->lnf, C, m->wte_pad, BT, m->Vp, C,
                              false);
}

static dsc_status forward_logits(gpt2_cuda *m, const uint16_t *const *params,
                                 const int32_t *inputs, const int32_t *targets, int B, int T) {
    DSC_TRY(prepare_tokens(m, params, inputs, targets, B, T));
    return dsc__dev_layers_forward(&m->drv, params);
}

static dsc_status forward(void *dev, const uint16_t *const *params, const int32_t *inputs,
                          const int32_t *targets, int B, int T, float *loss) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    DSC_TRY(forward_logits(m, params, inputs, targets, B, T));
    if (!targets) return DSC_OK;
    int BT = B * T, V = m->c.vocab_size;
    DSC_TRY(dsc__cuda_xent_forward_h(m->losses, m->lse, m->logits, m->tokens + BT, BT, V, m->Vp,
                                     m->fp16, m->st));
    m->have_targets = true;
    return loss ? loss_read(m, loss) : DSC_OK;
}

// ---- backward ----

// On entry m->dres holds the gradient of layer l's output; on return that of its input. The two
// projections that read the residual stream's gradient (attn.c_proj, mlp.c_proj) take their bias
// gradients from the layernorm backward that wrote it (its column sums, dsum): attn.c_proj's
// from ln_2 directly, mlp.c_proj's from the layer above's ln_1 (or ln_f) through bias_carry,
// added here: a streamed layer's gradient buffer exists only during its own backward.
static dsc_status layer_backward(gpt2_cuda *m, const uint16_t *const *params,
                                 float *const *grads, int l) {
    int B = m->B, T = m->T, C = m->c.n_embd, NH = m->c.n_head, BT = B * T;
    layer_acts a = acts_of(m, l);
    const uint16_t *const *p = params + layer_tensor(l, 0);
    float *const *g = grads + layer_tensor(l, 0);
    cudaStream_t st = m->st;
    uint16_t *dres = m->dres, *dln = m->dln, *datt = m->datt, *dbig = m->dbig;
    // mlp.c_proj and the GELU
    bool fused = gelu_fused(m);
    dsc__cuda_lin *L = &m->lin;
    int t = layer_tensor(l, 0); // the layer's tensors: slot t + k
    if (fused)
        DSC_TRY(dsc__cuda_lin_dinp_dgelu(L, t + K_MPROJW, dbig, 4 * C, dres, C, p[K_MPROJW], BT,
                                         4 * C, C, a.fch));
    else
        DSC_TRY(dsc__cuda_lin_dinp(L, t + K_MPROJW, dbig, 4 * C, dres, C, p[K_MPROJW], BT, 4 * C,
                                   C, false));
    DSC_TRY(adapt_back(m, params, grads, l, K_MPROJW, dbig, 4 * C, dres, C, a.fchg, 4 * C));
    if (g[K_MPROJW])
        DSC_TRY(dsc__cuda_lin_dw(L, t + K_MPROJW, g[K_MPROJW], dres, C, a.fchg, 4 * C, BT, 4 * C, C,
                                 m->fresh));
    if (g[K_MPROJB]) DSC_TRY(dsc__cuda_add_f32_clear(g[K_MPROJB], m->bias_carry, C, !m->fresh, st));
    if (!fused)
        DSC_TRY(dsc__cuda_gelu_backward_h(dbig, dbig, a.fch, (int64_t)BT * 4 * C, m->fp16, st));
    // mlp.c_fc and ln_2
    DSC_TRY(dsc__cuda_lin_dinp(L, t + K_FCW, dln, C, dbig, 4 * C, p[K_FCW], BT, C, 4 * C, false));
    DSC_TRY(adapt_back(m, params, grads, l, K_FCW, dln, C, dbig, 4 * C, a.ln2, C));
    if (g[K_FCW])
        DSC_TRY(dsc__cuda_lin_dw(L, t + K_FCW, g[K_FCW], dbig, 4 * C, a.ln2, C, BT, C, 4 * C,
                                 m->fresh));
    if (g[K_FCB])
        DSC_TRY(dsc__cuda_colsum_h(g[K_FCB], m->col_scratch, dbig, BT, 4 * C, !m->fresh, m->fp16,
                                   st));
    DSC_TRY(dsc__cuda_layernorm_backward_h(dres, ln_grad(m, g, K_LN2W, 0), ln_grad(m, g, K_LN2B, 1),
                                           m->ln_scratch, dln, a.res2, p[K_LN2W], a.ln2_mean,
                                           a.ln2_rstd, g[K_APROJB], !m->fresh, BT, C, m->fp16,
                                           st));
    // attn.c_proj and attention
    DSC_TRY(dsc__cuda_lin_dinp(L, t + K_APROJW, datt, C, dres, C, p[K_APROJW], BT, C, C, false));
    DSC_TRY(adapt_back(m, params, grads, l, K_APROJW, datt, C, dres, C, a.atty, C));
    if (g[K_APROJW])
        DSC_TRY(dsc__cuda_lin_dw(L, t + K_APROJW, g[K_APROJW], dres, C, a.atty, C, BT, C, C,
                                 m->fresh));
    // the attention's backward also sums dqkv's columns per 64 rows: attn.c_attn's bias gradient
    DSC_TRY(dsc__cuda_attention_backward_h(dbig, m->att_scratch, m->att_bpart, datt, a.qkv, a.atty,
                                           a.lse, B, T, C, NH, m->fp16, st));
    if (g[K_ATTB])
        DSC_TRY(dsc__cuda_reduce_columns(g[K_ATTB], m->att_bpart,
                                         dsc__cuda_attention_bias_chunks(B, T), 3 * C, !m->fresh,
                                         st));
    // attn.c_attn and ln_1 (dbig holds dqkv (BT, 3C))
    DSC_TRY(dsc__cuda_lin_dinp(L, t + K_ATTW, dln, C, dbig, 3 * C, p[K_ATTW], BT, C, 3 * C,
                               false));
    DSC_TRY(adapt_back(m, params, grads, l, K_ATTW, dln, C, dbig, 3 * C, a.ln1, C));
    if (g[K_ATTW])
        DSC_TRY(dsc__cuda_lin_dw(L, t + K_ATTW, g[K_ATTW], dbig, 3 * C, a.ln1, C, BT, C, 3 * C,
                                 m->fresh));
    return dsc__cuda_layernorm_backward_h(
        dres, ln_grad(m, g, K_LN1W, 0), ln_grad(m, g, K_LN1B, 1), m->ln_scratch, dln, a.res_in,
        p[K_LN1W], a.ln1_mean, a.ln1_rstd, l > 0 ? m->bias_carry : NULL, !m->fresh, BT, C,
        m->fp16, st);
}

static dsc_status read_loss(void *dev, float *loss) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    DSC_CUDA_ARG(m && loss && m->B > 0, "gpt2 cuda read loss: needs a model that ran a forward");
    return loss_read(m, loss);
}

static void set_grad_hook(void *dev, dsc_model_grad_hook fn, void *user) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    m->drv.hook = fn;
    m->drv.hook_user = user;
}

// From the logits' gradients (in m->logits) through the head and ln_f into dres.
static dsc_status head_back_op(void *dev, const uint16_t *const *params, float *const *grads) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    int BT = m->B * m->T, C = m->c.n_embd, V = m->c.vocab_size, L = m->c.n_layer;
    int lnf = layer_tensor(L, 0);
    cudaStream_t st = m->st;
    DSC_TRY(dsc__cuda_lin_forward(&m->lin, -1, m->dln, C, m->logits, m->Vp, m->wte_pad, NULL,
                                  NULL, BT, m->Vp, C)); // columns [V, Vp) of dlogits are zero
    if (grads[0]) // wte's gradient: its V rows of the (Vp, C) product
        DSC_TRY(dsc__cuda_lin_dw(&m->lin, -1, grads[0], m->lnf, C, m->logits, m->Vp, BT, V, C,
                                 m->fresh));
    DSC_CUDA_TRY(cudaMemsetAsync(m->dres, 0, sizeof(uint16_t) * (size_t)BT * C, st));
    DSC_CUDA_TRY(cudaMemsetAsync(m->bias_carry, 0, sizeof(float) * C, st));
    DSC_TRY(dsc__cuda_layernorm_backward_h(
        m->dres, ln_grad(m, grads, lnf, 0), ln_grad(m, grads, lnf + 1, 1), m->ln_scratch, m->dln, acts_of(m, L).res_in,
        params[lnf], m->lnf_mean, m->lnf_rstd, m->bias_carry, !m->fresh, BT, C, m->fp16, st));
    return DSC_OK;
}

static dsc_status layer_backward_op(void *dev, const uint16_t *const *params, float *const *grads,
                                    int l) {
    return layer_backward((gpt2_cuda *)dev, params, grads, l);
}

// wte (after the head's share) and wpe from dres; neither when frozen (LoRA's base: both or
// neither, create checks).
static dsc_status embed_back_op(void *dev, const uint16_t *const *params, float *const *grads) {
    (void)params;
    gpt2_cuda *m = (gpt2_cuda *)dev;
    if (!grads[0]) return DSC_OK;
    return dsc__cuda_encoder_backward_h(grads[0], grads[1], m->enc_scratch, m->dres, m->tokens,
                                        m->posd, m->c.max_seq_len, m->B, m->T, m->c.n_embd,
                                        m->c.vocab_size, !m->fresh, m->fp16, m->st);
}

static dsc_status backward(void *dev, const uint16_t *const *params, float *const *grads,
                           float loss_scale) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    DSC_CUDA_ARG(m != NULL, "gpt2 cuda backward: model is NULL");
    DSC_CUDA_ARG(m->have_targets,
                 "gpt2 cuda backward: needs a forward with targets first, and each such forward "
                 "allows one backward (it consumes the logits)");
    DSC_TRY(check_params(m, (const void *const *)params, "params"));
    DSC_TRY(check_params(m, (const void *const *)grads, "grads"));
    m->have_targets = false;
    int BT = m->B * m->T, V = m->c.vocab_size;
    float g = m->ntargets ? loss_scale / (float)m->ntargets : 0.0f;
    DSC_TRY(dsc__cuda_xent_backward_h(m->logits, m->logits, m->lse, m->tokens + BT, g, BT, V,
                                      m->Vp, m->fp16, m->st));
    return dsc__dev_layers_backward(&m->drv, params, grads);
}

// ---- the training step ----

// After the forward: loss and logits' gradients in one pass (the driver's loss).
static dsc_status loss_op(void *dev, float loss_scale) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    int BT = m->B * m->T;
    float g = m->ntargets ? loss_scale / (float)m->ntargets : 0.0f; // d(mean)/d(loss_i)
    return dsc__cuda_xent_fused_h(m->losses, m->logits, m->tokens + BT, g, BT, m->c.vocab_size,
                                  m->Vp, m->fp16, m->st);
}

// A step is a graph unless its adapters say no (lora_dropout: model/lora_cuda.h).
static bool graph_op(const void *dev) { return dsc__lora_dev_graph_ok(((gpt2_cuda *)dev)->c.lora); }

static const dsc__dev_layers_ops *layer_ops(void) {
    static const dsc__dev_layers_ops ops = {
        embed_op,      layer_forward_op, head_op,     loss_op, head_back_op, layer_backward_op,
        embed_back_op, NULL,             graph_op,
    };
    return &ops;
}

static dsc_status train_step(void *dev, const uint16_t *const *params, float *const *grads,
                             const int32_t *inputs, const int32_t *targets, int B, int T,
                             float loss_scale, float *loss) {
    gpt2_cuda *m = (gpt2_cuda *)dev;
    DSC_CUDA_ARG(m && targets, "gpt2 cuda train step: model and targets must be set");
    DSC_TRY(check_params(m, (const void *const *)grads, "grads"));
    // The tokens are checked and uploaded outside the graph; the driver enqueues the rest.
    DSC_TRY(prepare_tokens(m, params, inputs, targets, B, T));
    dsc__dev_graph_key k;
    memset(&k, 0, sizeof k);
    k.B = B, k.T = T, k.ntargets = m->ntargets, k.loss_scale = loss_scale, k.fp16 = m->fp16;
    k.fresh = m->fresh, k.pos = m->posd != NULL, k.extra[0] = gelu_fused(m);
    DSC_TRY(dsc__dev_layers_step(&m->drv, params, grads, &k));
    m->have_targets = false; // the logits became their gradients
    return loss ? loss_read(m, loss) : DSC_OK;
}

// ---- the model interface's device table ----

// The bytes create takes from the pool for B x T tokens (the same carve), for a memory plan.
static size_t act_bytes(const void *cfg, int B, int T) {
    const dsc_gpt2_config *c = (const dsc_gpt2_config *)cfg;
    gpt2_cuda m = {};
    m.c = *c;
    m.maxB = B;
    m.maxT = T;
    m.Vp = (c->vocab_size + LOGITS_ALIGN - 1) / LOGITS_ALIGN * LOGITS_ALIGN;
    return carve(&m, NULL);
}

// cpu_checkpointing's page-locked host copy of the layers' inputs (the driver's).
static size_t act_host_bytes(const void *cfg, int B, int T) {
    const dsc_gpt2_config *c = (const dsc_gpt2_config *)cfg;
    return c->recompute == 2 ? (size_t)c->n_layer * B * T * c->n_embd * 2 : 0;
}

extern "C" const struct dsc_model_device_ops dsc__gpt2_device_ops = {
    create,       destroy,  set_fp16,   set_fresh,  set_grad_hook,        set_layer_hook,
    forward,      backward, train_step, read_loss,  loss_enqueue, &dsc__gpt2_decode_ops,
    act_bytes,
    true,  // recomputes: acts_of / carve lay out one shared block, the driver reruns
    true,  // adapters: LoRA beside every product (model/lora_cuda.h), frozen gradients skipped
    set_positions,
    act_host_bytes,
    false, // fp8: GPT-2's device products are 16-bit only
};
