// examples/own_model/own_model.c - a model of the user's own, trained by the engine through the
// public headers only (dsc/engine.h, dsc/checkpoint.h, dsc/model.h, dsc/device.h): a two-layer
// MLP language model over bytes. It predicts the next byte from the CTX bytes before it:
//
//   x      = concat(wte[ctx[0]], ..., wte[ctx[CTX-1]])   // (CTX*EMB)   group 0: wte
//   h      = tanh(w1 x + b1)                             // (HID)       group 1: w1, b1
//   logits = w2 h + b2                                   // (VOCAB)     group 2: w2, b2
//   loss   = mean over the batch of -log softmax(logits)[target]
//
// The model is a model family of its own (struct dsc_model_ops, registered with
// dsc_model_register): its host passes are the plain C below, and with -DOWN_MODEL_CUDA its
// device passes are own_model_cuda.cu (cuBLAS and a few kernels). The model owns its arithmetic
// and its activations; the engine owns the parameters, gradients, optimizer state, the
// data-parallel reduction and ZeRO partitioning (stages 0-3) and the checkpoints. On the CPU the
// program drives the host passes itself, with the engine's gather / release / grads_ready around
// each layer group; with --device cuda the engine's device trainer drives the device passes
// (16-bit weights, fp32 gradients and, on one rank, the optimizer on the GPU). The program reads
// its rank and world size from the environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so
// `dsc launch --num_procs 2 ./own_model` runs it on two ranks. Each rank reads its own slice of
// every global batch, chosen by global sample index, so the global batches do not depend on the
// world size.
//
//   own_model [--stage N | --config FILE] [--steps N] [--data FILE] [--seed S]
//             [--save-dir DIR [--save-every N]] [--resume DIR[/TAG]] [--device cpu|cuda]
//
// Rank 0 prints one line per optimizer step (loss, learning rate and gradient norm with every
// digit) and, at the end, a checksum of the final fp32 weights: runs that agree bitwise print
// the same lines. README.md says how to build it against an installed dsc.
#include <errno.h>   // errno
#include <math.h>    // expf, logf, tanhf, INFINITY
#include <stdbool.h> // bool
#include <stdint.h>  // int64_t, uint8_t, uint64_t
#include <stdio.h>   // printf, fprintf, snprintf, fopen, fread
#include <stdlib.h>  // free, malloc, realloc, strtoll
#include <string.h> // memcpy, memset, strcmp, strncmp, strerror

#include "dsc/checkpoint.h" // dsc_checkpointing_*, dsc_load_checkpoint, dsc_ckpt_split_path
#include "dsc/device.h"     // dsc_device_pick, dsc_device_trainer_*
#include "dsc/engine.h"     // dsc_engine_*, dsc_gather, dsc_release, dsc_grads_ready, dsc_step
#include "dsc/model.h"      // dsc_model_ops, dsc_model_register, dsc_model_forward, ...
#include "dsc/status.h"     // dsc_status, dsc_last_error
#include "own_model.h"      // VOCAB, CTX, ..., G_*, P_*, own_mlp_device_ops

// The engine's fallible calls return a dsc_status whose message is in dsc_last_error(); the
// model's own failures print theirs and return DSC_ERR_INVALID_ARG or DSC_ERR_OOM.
#define TRY(expr)                                                                                  \
    do {                                                                                           \
        dsc_status st_ = (expr);                                                                   \
        if (st_ != DSC_OK) return st_;                                                             \
    } while (0)

static const dsc_param_desc param_table[NPARAMS] = {
    [P_WTE] = {"wte.weight", 2, {VOCAB, EMB}, G_EMBED},
    [P_W1] = {"hidden.weight", 2, {HID, IN}, G_HIDDEN},
    [P_B1] = {"hidden.bias", 1, {HID}, G_HIDDEN},
    [P_W2] = {"head.weight", 2, {VOCAB, HID}, G_HEAD},
    [P_B2] = {"head.bias", 1, {VOCAB}, G_HEAD},
};

// ---- the host arithmetic (fp32), one function per layer and direction ----
//
// The device passes (own_model_cuda.cu) compute the same in 16-bit with fp32 sums.

// x: (B, IN) = the CTX embeddings of each sample's context, side by side
static void cpu_embed_forward(const float *wte, const uint8_t *ctx, float *x, int B) {
    for (int b = 0; b < B; b++)
        for (int c = 0; c < CTX; c++)
            memcpy(x + (size_t)b * IN + c * EMB, wte + (size_t)ctx[b * CTX + c] * EMB,
                   EMB * sizeof(float));
}

// h: (B, HID) = tanh(x w1^T + b1)
static void cpu_hidden_forward(const float *w1, const float *b1, const float *x, float *h, int B) {
    for (int b = 0; b < B; b++)
        for (int j = 0; j < HID; j++) {
            float a = b1[j];
            for (int i = 0; i < IN; i++) a += w1[j * IN + i] * x[b * IN + i];
            h[b * HID + j] = tanhf(a);
        }
}

// probs: (B, VOCAB) = softmax(h w2^T + b2); returns the mean of -log probs[b][target[b]]
static float cpu_head_forward(const float *w2, const float *b2, const float *h,
                              const uint8_t *tgt, float *probs, int B) {
    double loss = 0;
    for (int b = 0; b < B; b++) {
        float *p = probs + (size_t)b * VOCAB, max = -INFINITY, sum = 0;
        for (int v = 0; v < VOCAB; v++) {
            float z = b2[v];
            for (int j = 0; j < HID; j++) z += w2[v * HID + j] * h[b * HID + j];
            p[v] = z;
            if (z > max) max = z;
        }
        for (int v = 0; v < VOCAB; v++) sum += (p[v] = expf(p[v] - max));
        for (int v = 0; v < VOCAB; v++) p[v] /= sum;
        loss -= logf(p[tgt[b]]);
    }
    return (float)(loss / B);
}

// dlogits = (probs - onehot) * scale / B; dw2 += dlogits^T h, db2 += sum dlogits,
// dh: (B, HID) = dlogits w2 (overwritten)
static void cpu_head_backward(const float *w2, float *dw2, float *db2, const float *h,
                              const float *probs, const uint8_t *tgt, float scale, float *dh,
                              int B) {
    float g = scale / (float)B;
    memset(dh, 0, (size_t)B * HID * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int v = 0; v < VOCAB; v++) {
            float d = (probs[b * VOCAB + v] - (v == tgt[b] ? 1.0f : 0.0f)) * g;
            db2[v] += d;
            for (int j = 0; j < HID; j++) {
                dw2[v * HID + j] += d * h[b * HID + j];
                dh[b * HID + j] += d * w2[v * HID + j];
            }
        }
}

// da = dh (1 - h^2); dw1 += da^T x, db1 += sum da, dx: (B, IN) = da w1 (overwritten)
static void cpu_hidden_backward(const float *w1, float *dw1, float *db1, const float *x,
                                const float *h, const float *dh, float *dx, int B) {
    memset(dx, 0, (size_t)B * IN * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int j = 0; j < HID; j++) {
            float hv = h[b * HID + j], da = dh[b * HID + j] * (1.0f - hv * hv);
            db1[j] += da;
            for (int i = 0; i < IN; i++) {
                dw1[j * IN + i] += da * x[b * IN + i];
                dx[b * IN + i] += da * w1[j * IN + i];
            }
        }
}

// dwte[ctx[b][c]] += dx[b][c*EMB ..]
static void cpu_embed_backward(float *dwte, const uint8_t *ctx, const float *dx, int B) {
    for (int b = 0; b < B; b++)
        for (int c = 0; c < CTX; c++) {
            float *row = dwte + (size_t)ctx[b * CTX + c] * EMB;
            for (int e = 0; e < EMB; e++) row[e] += dx[b * IN + c * EMB + e];
        }
}

// ---- the model family: its table (struct dsc_model_ops) ----
//
// One model, spec "own-mlp". Its batches are (B, T) token ids with T = CTX: row b is sample b's
// context, and targets[b][CTX - 1] is the byte after it (the model predicts nothing at the other
// positions, whose targets are ignored; the trainer passes -1 there). Layer groups as the
// device trainer lays a model out: 0 the embedding, 1 .. n_layer the layers (one: the hidden
// layer), n_layer + 1 the head.

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s) { // [-1, 1)
    return (float)((double)(splitmix64(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static int64_t numel(int i) {
    int64_t n = 1;
    for (int d = 0; d < param_table[i].ndim; d++) n *= param_table[i].shape[d];
    return n;
}

static bool fam_claims(const char *spec) { return !strcmp(spec, "own-mlp"); }

// The shape is fixed (own_model.h): the configuration is the parameter table itself.
static dsc_status fam_config_parse(const char *spec, const dsc_model_opts *o, void **cfg) {
    (void)spec, (void)o;
    *cfg = (void *)param_table;
    return DSC_OK;
}

// A table of tensors is this model's when it holds its five tensors by name with their shapes.
static dsc_status fam_config_from_params(const dsc_param_desc *t, int count,
                                         const dsc_model_opts *o, const char *what, void **cfg,
                                         int *order) {
    (void)o, (void)what;
    for (int i = 0; i < NPARAMS; i++) {
        order[i] = -1;
        for (int k = 0; k < count && order[i] < 0; k++)
            if (t[k].name && !strcmp(t[k].name, param_table[i].name) &&
                t[k].ndim == param_table[i].ndim &&
                !memcmp(t[k].shape, param_table[i].shape, sizeof t[k].shape))
                order[i] = k;
        if (order[i] < 0) return DSC_ERR_UNSUPPORTED;
    }
    *cfg = (void *)param_table;
    return DSC_OK;
}

static void fam_config_free(void *cfg) { (void)cfg; }

static void fam_describe(const void *cfg, dsc_model_info *out) {
    (void)cfg;
    int64_t n = 0;
    for (int i = 0; i < NPARAMS; i++) n += numel(i);
    *out = (dsc_model_info){.family = "own-mlp", .n_layer = NLAYERS, .n_embd = EMB,
                            .vocab_size = VOCAB, .max_seq_len = CTX, .num_tensors = NPARAMS,
                            .num_groups = NGROUPS, .num_params = n};
}

static void fam_param(const void *cfg, int i, dsc_model_param *out) {
    (void)cfg;
    *out = (dsc_model_param){.ndim = param_table[i].ndim, .numel = numel(i),
                             .group = param_table[i].group};
    snprintf(out->name, sizeof out->name, "%s", param_table[i].name);
    for (int d = 0; d < out->ndim; d++) out->shape[d] = param_table[i].shape[d];
}

// Uniform in +-1/sqrt(fan_in) (wte: +-1), biases zero. Element k of tensor i is the (k+1)-th draw
// of a splitmix64 stream seeded by (seed, i): counter-based, so any slice alone is the same.
static void fam_init(const void *cfg, int i, float *dst, int64_t begin, int64_t count,
                     uint64_t seed) {
    (void)cfg;
    static const float bound[NPARAMS] = {[P_WTE] = 1.0f, [P_W1] = 0.125f, [P_W2] = 0.1020620f};
    uint64_t s = (seed * 1000003u + (uint64_t)i) + (uint64_t)begin * 0x9E3779B97F4A7C15ull;
    for (int64_t k = 0; k < count; k++) dst[k] = bound[i] * uniform(&s);
}

// Multiply-adds of the two dense layers per sample, over its T tokens (one sample: T = CTX).
static double fam_flops_per_token(const void *cfg, int T) {
    (void)cfg;
    return 6.0 * (double)(IN * HID + HID * VOCAB) / (T > 0 ? T : CTX);
}

static int fam_modules(const void *cfg, int B, int T, dsc_model_module *out) {
    dsc_model_info mi;
    fam_describe(cfg, &mi);
    if (out)
        out[0] = (dsc_model_module){.name = "own_mlp", .type = "OwnMLP", .params = mi.num_params,
                                    .fwd_flops = 2.0 * B * (double)(IN * HID + HID * VOCAB),
                                    .slot = -1};
    (void)T;
    return 1;
}

static int fam_timing_slots(const void *cfg) { return (void)cfg, 0; }

// The host passes' activations for up to maxB samples.
typedef struct mlp_host {
    int maxB, B;          // created for; the last forward's
    bool have_targets;    // a forward with targets ran and its backward has not
    uint8_t *ctx, *tgt;   // (B, CTX), (B): the micro-batch
    float *x, *h, *probs; // (B, IN), (B, HID), (B, VOCAB): kept from forward for backward
    float *dh, *dx;       // (B, HID), (B, IN)
} mlp_host;

static void fam_host_destroy(void *state) {
    mlp_host *m = state;
    if (!m) return;
    free(m->ctx), free(m->tgt), free(m->x), free(m->h), free(m->probs), free(m->dh), free(m->dx);
    free(m);
}

static dsc_status fam_host_create(const void *cfg, int B, int T, dsc_mem_pool *pool,
                                  void **state) {
    (void)cfg, (void)pool; // the activations are small: malloc
    if (B < 1 || T != CTX) {
        fprintf(stderr, "own_model: batches of %d x %d; the model takes samples of T = %d "
                "bytes\n", B, T, CTX);
        return DSC_ERR_INVALID_ARG;
    }
    mlp_host *m = calloc(1, sizeof *m);
    if (!m) return DSC_ERR_OOM;
    m->maxB = B;
    m->ctx = malloc((size_t)B * CTX);
    m->tgt = malloc((size_t)B);
    m->x = malloc((size_t)B * IN * sizeof(float));
    m->h = malloc((size_t)B * HID * sizeof(float));
    m->probs = malloc((size_t)B * VOCAB * sizeof(float));
    m->dh = malloc((size_t)B * HID * sizeof(float));
    m->dx = malloc((size_t)B * IN * sizeof(float));
    *state = m;
    if (m->ctx && m->tgt && m->x && m->h && m->probs && m->dh && m->dx) return DSC_OK;
    fprintf(stderr, "own_model: out of memory for the activations of %d samples\n", B);
    fam_host_destroy(m);
    *state = NULL;
    return DSC_ERR_OOM;
}

// The micro-batch's bytes, checked: inputs (B, CTX), each sample's target at its last position.
static dsc_status host_take(mlp_host *m, const int32_t *in, const int32_t *tg, int B, int T) {
    if (!in || B < 1 || B > m->maxB || T != CTX) {
        fprintf(stderr, "own_model: forward of %d x %d; the model was made for up to %d samples "
                "of %d bytes\n", B, T, m->maxB, CTX);
        return DSC_ERR_INVALID_ARG;
    }
    for (int b = 0; b < B; b++) {
        int32_t t = tg ? tg[b * CTX + CTX - 1] : 0;
        for (int c = 0; c <= CTX; c++) {
            int32_t v = c < CTX ? in[b * CTX + c] : t;
            if (v < 0 || v >= VOCAB) {
                fprintf(stderr, "own_model: sample %d: %s %d is not a byte (0-255)\n", b,
                        c < CTX ? "input" : "target", v);
                return DSC_ERR_INVALID_ARG;
            }
            if (c < CTX) m->ctx[b * CTX + c] = (uint8_t)v;
        }
        m->tgt[b] = (uint8_t)t;
    }
    m->B = B;
    return DSC_OK;
}

// The engine's hooks around a group (each optional).
static dsc_status hook_gather(const dsc_model_hooks *k, int g) {
    return k && k->gather ? k->gather(k->user, g) : DSC_OK;
}
static dsc_status hook_release(const dsc_model_hooks *k, int g) {
    return k && k->release ? k->release(k->user, g) : DSC_OK;
}
static dsc_status hook_ready(const dsc_model_hooks *k, int g) {
    return k && k->grads_ready ? k->grads_ready(k->user, g) : DSC_OK;
}

// params[i] of a group is read after its gather hook returned (the hook may repoint it).
static dsc_status fam_forward(void *state, float *const *params, const int32_t *inputs,
                              const int32_t *pos, const int32_t *targets, int B, int T,
                              const dsc_model_hooks *hooks, float *loss) {
    mlp_host *m = state;
    (void)pos; // no positions of its own
    m->have_targets = false;
    TRY(host_take(m, inputs, targets, B, T));
    TRY(hook_gather(hooks, G_EMBED));
    cpu_embed_forward(params[P_WTE], m->ctx, m->x, B);
    TRY(hook_release(hooks, G_EMBED));
    TRY(hook_gather(hooks, G_HIDDEN));
    cpu_hidden_forward(params[P_W1], params[P_B1], m->x, m->h, B);
    TRY(hook_release(hooks, G_HIDDEN));
    TRY(hook_gather(hooks, G_HEAD));
    float l = cpu_head_forward(params[P_W2], params[P_B2], m->h, m->tgt, m->probs, B);
    if (targets && loss) *loss = l;
    m->have_targets = targets != NULL;
    return hook_release(hooks, G_HEAD);
}

// grads += the gradients of loss_scale * mean loss, groups in reverse; each group's gradients
// are handed over (grads_ready) as soon as they are complete, so that their reduction overlaps
// the rest of backward.
static dsc_status fam_backward(void *state, float *const *params, float *const *grads,
                               float loss_scale, const dsc_model_hooks *hooks) {
    mlp_host *m = state;
    if (!m->have_targets) {
        fprintf(stderr, "own_model: backward needs a forward with targets first\n");
        return DSC_ERR_INVALID_ARG;
    }
    m->have_targets = false;
    TRY(hook_gather(hooks, G_HEAD));
    cpu_head_backward(params[P_W2], grads[P_W2], grads[P_B2], m->h, m->probs, m->tgt, loss_scale,
                      m->dh, m->B);
    TRY(hook_release(hooks, G_HEAD));
    TRY(hook_ready(hooks, G_HEAD));
    TRY(hook_gather(hooks, G_HIDDEN));
    cpu_hidden_backward(params[P_W1], grads[P_W1], grads[P_B1], m->x, m->h, m->dh, m->dx, m->B);
    TRY(hook_release(hooks, G_HIDDEN));
    TRY(hook_ready(hooks, G_HIDDEN));
    TRY(hook_gather(hooks, G_EMBED));
    cpu_embed_backward(grads[P_WTE], m->ctx, m->dx, m->B);
    TRY(hook_release(hooks, G_EMBED));
    return hook_ready(hooks, G_EMBED);
}

// The host passes keep probabilities, not logits: none to give.
static const float *fam_logits(void *state) { return (void)state, NULL; }
static void fam_set_timing(void *state, double *times) { (void)state, (void)times; }

#ifdef OWN_MODEL_CUDA
#define OWN_DEVICE_OPS (&own_mlp_device_ops)
#else
#define OWN_DEVICE_OPS NULL // trains on the host only
#endif

static const struct dsc_model_ops own_mlp_family = {
    .family = "own-mlp",
    .specs = "own-mlp",
    .claims = fam_claims,
    .config_parse = fam_config_parse,
    .config_from_params = fam_config_from_params,
    .config_free = fam_config_free,
    .describe = fam_describe,
    .param = fam_param,
    .init = fam_init,
    .flops_per_token = fam_flops_per_token,
    .modules = fam_modules,
    .timing_slots = fam_timing_slots,
    .host_create = fam_host_create,
    .host_destroy = fam_host_destroy,
    .forward = fam_forward,
    .backward = fam_backward,
    .logits = fam_logits,
    .set_timing = fam_set_timing,
    .device = OWN_DEVICE_OPS,
};

// ---- the training side: the engine's calls around the model's passes ----

typedef struct mlp {
    dsc_engine *eng;
    dsc_model *model;
    dsc_device_trainer *gpu;        // --device cuda; NULL: the host passes
    int B;                          // samples per micro-batch on this rank
    int32_t *in, *tg;               // (B, CTX) each: contexts; targets at the last position
    float *w[NPARAMS], *g[NPARAMS]; // the engine's buffers, re-read after every dsc_gather
} mlp;

// The gather hook: gather a group and take its tensors' pointers (ZeRO-3 gathers into fresh
// buffers; during backward the gradient buffers come with the gather).
static dsc_status on_gather(void *user, int group) {
    mlp *m = user;
    TRY(dsc_gather(m->eng, group));
    for (int i = 0; i < NPARAMS; i++)
        if (param_table[i].group == group) {
            m->w[i] = dsc_param_data(m->eng, i);
            m->g[i] = dsc_param_grad(m->eng, i);
        }
    return DSC_OK;
}

static dsc_status on_release(void *user, int group) {
    return dsc_release(((mlp *)user)->eng, group);
}

static dsc_status on_grads_ready(void *user, int group) {
    return dsc_grads_ready(((mlp *)user)->eng, group);
}

// One micro-batch on the host: forward, then backward of the mean loss times
// dsc_backward_scale (loss scale / gradient accumulation).
static dsc_status host_micro(mlp *m, float *loss) {
    dsc_model_hooks fwd = {.user = m, .gather = on_gather, .release = on_release};
    dsc_model_hooks bwd = {.user = m, .gather = on_gather, .release = on_release,
                           .grads_ready = on_grads_ready};
    TRY(dsc_model_forward(m->model, m->w, m->in, m->tg, m->B, CTX, &fwd, loss));
    float scale = (float)dsc_backward_scale(m->eng);
    TRY(dsc_backward_begin(m->eng));
    return dsc_model_backward(m->model, m->w, m->g, scale, &bwd);
}

// Initial weights, the same on every rank (the engine requires it), from the family's
// initialiser; then the engine partitions them (stages 1-3).
static dsc_status mlp_init_weights(mlp *m, uint64_t seed) {
    for (int i = 0; i < NPARAMS; i++)
        dsc_model_init_tensor(m->model, i, dsc_param_master(m->eng, i), 0, numel(i), seed);
    return dsc_params_updated(m->eng);
}

static dsc_status mlp_create(mlp *m, dsc_engine *eng, dsc_model *model, int B, bool cuda) {
    *m = (mlp){.eng = eng, .model = model, .B = B};
    m->in = malloc((size_t)B * CTX * sizeof *m->in);
    m->tg = malloc((size_t)B * CTX * sizeof *m->tg);
    if (!m->in || !m->tg) {
        fprintf(stderr, "own_model: out of memory for a micro-batch of %d samples\n", B);
        return DSC_ERR_OOM;
    }
    for (int i = 0; i < B * CTX; i++) m->tg[i] = -1; // no prediction before the last position
    return cuda ? DSC_OK : dsc_model_reserve(model, B, CTX, NULL); // the host activations
}

static void mlp_destroy(mlp *m) {
    dsc_device_trainer_destroy(m->gpu); // before the engine and the model, which it borrows
    free(m->in), free(m->tg);
}

// ---- data: a byte stream; sample i is CTX bytes and the byte after them ----

typedef struct corpus {
    uint8_t *bytes;
    int64_t n;
} corpus;

// Without --data: sentences of a small made-up language, generated from a fixed seed, so that
// there is structure to learn (spelling within words, spaces, full stops) and no file to ship.
static dsc_status corpus_generate(corpus *c, int64_t n) {
    static const char *const words[] = {"the", "engine", "gathers", "a", "group", "before",
                                        "its", "weights", "are", "used", "and", "reduces",
                                        "gradients", "while", "backward", "runs", "on",
                                        "every", "rank", "of", "world"};
    const int nwords = (int)(sizeof words / sizeof *words);
    c->bytes = malloc((size_t)n);
    if (!c->bytes) return DSC_ERR_OOM;
    c->n = n;
    uint64_t s = 12345;
    int64_t k = 0, in_sentence = 0;
    while (k < n) {
        const char *w = words[splitmix64(&s) % (uint64_t)nwords];
        for (const char *p = w; *p && k < n; p++) c->bytes[k++] = (uint8_t)*p;
        const char *sep = ++in_sentence >= 4 + (int64_t)(splitmix64(&s) % 6) ? ". " : " ";
        if (sep[0] == '.') in_sentence = 0;
        for (const char *p = sep; *p && k < n; p++) c->bytes[k++] = (uint8_t)*p;
    }
    return DSC_OK;
}

static dsc_status corpus_read(corpus *c, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "own_model: --data %s: %s\n", path, strerror(errno));
        return DSC_ERR_IO;
    }
    c->bytes = NULL, c->n = 0;
    size_t cap = 0, got = 1;
    bool oom = false;
    while (got > 0 && !oom) {
        if ((size_t)c->n == cap) {
            uint8_t *b = realloc(c->bytes, cap ? 2 * cap : 65536);
            if ((oom = !b)) break;
            c->bytes = b;
            cap = cap ? 2 * cap : 65536;
        }
        got = fread(c->bytes + c->n, 1, cap - (size_t)c->n, f);
        c->n += (int64_t)got;
    }
    fclose(f);
    if (oom) {
        fprintf(stderr, "own_model: out of memory reading --data %s\n", path);
        return DSC_ERR_OOM;
    }
    if (c->n > CTX) return DSC_OK;
    fprintf(stderr, "own_model: --data %s holds %lld bytes; give a file of more than %d bytes\n",
            path, (long long)c->n, CTX);
    return DSC_ERR_INVALID_ARG;
}

// Samples first .. first+B-1 of the stream, spread over it by a prime stride, as the model takes
// them: in (B, CTX) the context bytes, tg[b][CTX - 1] the byte after them (tg's other entries
// are left as they are: -1).
static void corpus_batch(const corpus *c, int64_t first, int B, int32_t *in, int32_t *tg) {
    int64_t positions = c->n - CTX;
    for (int b = 0; b < B; b++) {
        int64_t at = ((first + b) * 7919) % positions;
        for (int k = 0; k < CTX; k++) in[b * CTX + k] = c->bytes[at + k];
        tg[b * CTX + CTX - 1] = c->bytes[at + CTX];
    }
}

// ---- the training run ----

typedef struct run_opts {
    int stage;               // with the built-in config
    const char *config_path; // instead of the built-in config
    int64_t steps, save_every;
    uint64_t seed;
    const char *data, *save_dir, *resume;
    const char *device; // --device: "cpu" (default) or "cuda"
    bool cuda;          // the choice (dsc_device_pick)
} run_opts;

// The built-in configuration: a global batch of 32 samples (the micro-batch of 8 per rank and the
// gradient accumulation follow from the world size), AdamW with warm-up, clipping. Every group
// is smaller than ZeRO-3's default persistence threshold (1e5 elements), which would keep them
// all gathered: 0 makes stage 3 partition and gather every group. With --device cuda the config
// says bf16, the type the device passes compute in (fp32 master weights and optimizer state).
static void builtin_config(const run_opts *o, char *out, size_t cap) {
    snprintf(out, cap,
             "{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 8,%s"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01,"
             " \"weight_decay\": 0.01}},"
             " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 5}},"
             " \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": %d,"
             " \"stage3_param_persistence_threshold\": 0},"
             " \"checkpoint\": {\"async\": false, \"interval_s\": 0}}",
             o->cuda ? " \"bf16\": {\"enabled\": true}," : "", o->stage);
}

// The fp32 master weights of every tensor, hashed (FNV-1a over their bytes) in parameter order.
// A collective at stages 1-3: every rank calls it.
static dsc_status weights_checksum(dsc_engine *eng, uint64_t *out) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < NPARAMS; i++) {
        int64_t n = numel(i);
        float *w = malloc((size_t)n * sizeof(float));
        if (!w) return DSC_ERR_OOM;
        dsc_status st = dsc_engine_full_param(eng, i, w);
        const unsigned char *p = (const unsigned char *)w;
        for (size_t k = 0; st == DSC_OK && k < (size_t)n * sizeof(float); k++)
            h = (h ^ p[k]) * 0x100000001b3ull;
        free(w);
        TRY(st);
    }
    *out = h;
    return DSC_OK;
}

// --resume DIR (its latest checkpoint) or DIR/TAG: the engine's whole state (weights, optimizer
// moments, step counters, schedule), resharded to this run's world size and stage.
static dsc_status resume(dsc_engine *eng, const char *path) {
    char dir[4096], tag[DSC_CKPT_TAG_MAX], loaded[DSC_CKPT_TAG_MAX];
    bool has_tag;
    TRY(dsc_ckpt_split_path(path, dir, sizeof dir, tag, sizeof tag, &has_tag));
    TRY(dsc_load_checkpoint(eng, dir, has_tag ? tag : NULL, loaded, sizeof loaded));
    if (dsc_engine_rank(eng) == 0)
        printf("resumed from %s/%s after step %lld\n", dir, loaded,
               (long long)dsc_engine_global_steps(eng));
    return DSC_OK;
}

// --save-dir: the config's "checkpoint" section, saving every --save-every steps.
static dsc_status start_saving(dsc_engine *eng, const run_opts *o) {
    dsc_ckpt_opts co;
    dsc_ckpt_opts_from_config(dsc_engine_config(eng), &co);
    co.interval_steps = o->save_every;
    return dsc_checkpointing_start(eng, o->save_dir, &co);
}

// One micro-batch's forward and backward: the host passes, or the device trainer's (which may
// leave the step's last loss on the device, *loss 0: dsc_device_trainer_take_loss reads it).
static dsc_status run_micro(mlp *m, float *loss) {
    if (m->gpu) return dsc_device_trainer_micro(m->gpu, m->in, m->tg, m->B, CTX, loss, NULL, NULL);
    return host_micro(m, loss);
}

// One optimizer step: gradient_accumulation_steps micro-batches on each rank, each followed by
// dsc_step (the device trainer's step when one is attached). *loss: the step's mean loss over its
// micro-batches and ranks.
static dsc_status train_step(mlp *m, const corpus *c, int64_t step, dsc_step_info *si,
                             double *loss) {
    const dsc_config *cfg = dsc_engine_config(m->eng);
    int gas = (int)cfg->gradient_accumulation_steps, world = dsc_engine_world_size(m->eng);
    double sum = 0;
    TRY(dsc_step_begin(m->eng));
    for (int micro = 0; micro < gas; micro++) {
        int64_t first = ((step - 1) * gas + micro) * (int64_t)m->B * world +
                        (int64_t)dsc_engine_rank(m->eng) * m->B;
        float l;
        corpus_batch(c, first, m->B, m->in, m->tg);
        TRY(run_micro(m, &l));
        TRY(dsc_step(m->eng, si));
        sum += l;
    }
    if (m->gpu) TRY(dsc_device_trainer_take_loss(m->gpu, &sum));
    *loss = sum / gas;
    return dsc_engine_mean(m->eng, loss, 1);
}

// --device cuda: the device trainer, made after a resume (it uploads the engine's state).
static dsc_status start_gpu(mlp *m) {
    TRY(dsc_device_trainer_create(&m->gpu, m->eng, m->model, m->B, CTX));
    double peak;
    if (dsc_engine_rank(m->eng) == 0)
        printf("%s\n", dsc_device_trainer_describe(m->gpu, &peak)); // "device NAME | mode | ..."
    return DSC_OK;
}

static dsc_status train(dsc_engine *eng, dsc_model *model, const run_opts *o, const corpus *c) {
    mlp m;
    int64_t B = dsc_engine_config(eng)->train_micro_batch_size_per_gpu;
    dsc_status st = mlp_create(&m, eng, model, (int)B, o->cuda);
    if (st == DSC_OK) st = mlp_init_weights(&m, o->seed);
    bool rank0 = dsc_engine_rank(eng) == 0;
    if (st == DSC_OK && rank0)
        printf("own_model: %d ranks, ZeRO stage %lld, %lld parameters in %d groups, %s kernels, "
               "%lld samples per step\n", dsc_engine_world_size(eng),
               (long long)dsc_engine_config(eng)->zero_optimization.stage,
               (long long)dsc_engine_num_elements(eng), NGROUPS, o->cuda ? "cuda" : "cpu",
               (long long)dsc_engine_config(eng)->train_batch_size);
    if (st == DSC_OK && o->resume) st = resume(eng, o->resume);
    if (st == DSC_OK && o->cuda) st = start_gpu(&m);
    bool saving = st == DSC_OK && o->save_dir;
    if (saving && (st = start_saving(eng, o)) != DSC_OK) saving = false;
    for (int64_t step = dsc_engine_global_steps(eng) + 1; st == DSC_OK && step <= o->steps;
         step++) {
        dsc_step_info si;
        double loss;
        dsc_ckpt_tick tick;
        st = train_step(&m, c, step, &si, &loss);
        if (st == DSC_OK && rank0)
            printf("step %4lld | loss %.17g | lr %.17g | grad_norm %.17g\n", (long long)si.step,
                   loss, si.lr, si.grad_norm);
        // The host passes re-read the pointers at every gather, so the engine may compact its
        // pool between steps; the device trainer keeps the host buffers' addresses: no compaction.
        if (st == DSC_OK && !m.gpu) st = dsc_engine_maintain(eng, false, NULL);
        // The device's state into the engine's host buffers before a save may read them.
        if (st == DSC_OK && saving && m.gpu) st = dsc_device_trainer_store(m.gpu);
        if (st == DSC_OK && saving) st = dsc_checkpoint_step_end(eng, false, &tick);
        if (st == DSC_OK && saving && tick.saved && rank0) printf("checkpoint %s saved\n", tick.tag);
        fflush(stdout);
    }
    if (saving) { // complete the save in flight; after a failure only stop the writer
        dsc_status st2 = dsc_checkpointing_stop(eng, st == DSC_OK);
        if (st == DSC_OK) st = st2;
    }
    uint64_t sum;
    if (st == DSC_OK && m.gpu) st = dsc_device_trainer_store(m.gpu); // the final weights
    if (st == DSC_OK) st = weights_checksum(eng, &sum);
    if (st == DSC_OK && rank0) printf("weights fnv1a64 %016llx\n", (unsigned long long)sum);
    mlp_destroy(&m);
    return st;
}

// ---- command line ----

static int usage(const char *why) {
    fprintf(stderr, "own_model: %s\nusage: own_model [--stage 0-3 | --config FILE] [--steps N] "
            "[--data FILE] [--seed S] [--save-dir DIR [--save-every N]] [--resume DIR[/TAG]] "
            "[--device cpu|cuda]\n",
            why);
    return 2;
}

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

// An integer flag's value in [lo, hi], or a message naming the flag and the range.
static bool int_flag(const char *f, const char *v, int64_t lo, int64_t hi, int64_t *out,
                     char *why, size_t cap) {
    if (parse_int(v, lo, hi, out)) return true;
    snprintf(why, cap, "%s %s: expected an integer from %lld to %lld", f, v, (long long)lo,
             (long long)hi);
    return false;
}

// 0: parsed; otherwise the exit code. `dsc launch` appends --local_rank=N: accepted and unused
// (the engine reads the environment).
static int parse_args(int argc, char **argv, run_opts *o) {
    *o = (run_opts){.steps = 40, .seed = 1, .device = "cpu"};
    char why[512] = "";
    for (int a = 1; a < argc && !why[0]; a++) {
        const char *f = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        int64_t n = 0;
        if (!strncmp(f, "--local_rank", 12)) continue;
        bool known = !strcmp(f, "--stage") || !strcmp(f, "--steps") ||
                     !strcmp(f, "--save-every") || !strcmp(f, "--seed") ||
                     !strcmp(f, "--config") || !strcmp(f, "--data") ||
                     !strcmp(f, "--save-dir") || !strcmp(f, "--resume") ||
                     !strcmp(f, "--device");
        if (!known || !v) {
            snprintf(why, sizeof why, known ? "%s needs a value" : "%s: unknown flag", f);
            break;
        }
        a++; // the value
        if (!strcmp(f, "--stage") && int_flag(f, v, 0, 3, &n, why, sizeof why))
            o->stage = (int)n;
        else if (!strcmp(f, "--steps") && int_flag(f, v, 0, 1000000000, &n, why, sizeof why))
            o->steps = n;
        else if (!strcmp(f, "--save-every") && int_flag(f, v, 1, 1000000000, &n, why, sizeof why))
            o->save_every = n;
        else if (!strcmp(f, "--seed") && int_flag(f, v, 0, INT64_MAX, &n, why, sizeof why))
            o->seed = (uint64_t)n;
        else if (!strcmp(f, "--config")) o->config_path = v;
        else if (!strcmp(f, "--data")) o->data = v;
        else if (!strcmp(f, "--save-dir")) o->save_dir = v;
        else if (!strcmp(f, "--resume")) o->resume = v;
        else if (!strcmp(f, "--device")) o->device = v;
    }
    return why[0] ? usage(why) : 0;
}

// --device: what this job can run on (dsc_device_pick names what is missing), and a program
// built with its device passes when that is the GPU. *world: the job's ranks.
static dsc_status pick_device(run_opts *o, const dsc_model *model, int *world) {
    const char *ws = getenv("WORLD_SIZE");
    *world = ws ? (int)strtol(ws, NULL, 10) : 1;
    TRY(dsc_device_pick(o->device, *world, &o->cuda));
    if (!o->cuda || dsc_device_model_ok(model)) return DSC_OK;
    fprintf(stderr, "own_model: --device %s: this program was built without its device passes; "
            "build it with -DOWN_MODEL_CUDA and own_model_cuda.cu (README.md), or train with "
            "--device cpu\n", o->device);
    return DSC_ERR_UNSUPPORTED;
}

// The model (its family registered first, then made from its spec) and the engine over its
// parameters. On one GPU the device holds the 16-bit weights: no host compute copy.
static dsc_status setup(run_opts *o, dsc_model **model, dsc_engine **eng) {
    TRY(dsc_model_register(&own_mlp_family));
    TRY(dsc_model_create(model, "own-mlp", NULL));
    int world;
    TRY(pick_device(o, *model, &world));
    char json[1024];
    builtin_config(o, json, sizeof json);
    dsc_param_desc pd[NPARAMS];
    dsc_model_param_descs(*model, pd); // names borrowed from the model
    // rank and world: the environment; on one GPU the device keeps the weights' 16-bit copy and
    // the gradients (the engine then holds neither)
    bool one_gpu = o->cuda && world <= 1;
    dsc_engine_opts eo = {.params = pd, .nparams = NPARAMS, .no_compute_copy = one_gpu,
                          .device_grads = one_gpu};
    if (o->config_path) eo.config_path = o->config_path;
    else eo.config_json = json;
    return dsc_engine_create(eng, &eo);
}

int main(int argc, char **argv) {
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    corpus c = {0};
    dsc_status st = o.data ? corpus_read(&c, o.data) : corpus_generate(&c, 1 << 16);
    if (st != DSC_OK) return free(c.bytes), 1;
    dsc_model *model = NULL;
    dsc_engine *eng = NULL;
    dsc_clear_error();
    st = setup(&o, &model, &eng);
    if (st == DSC_OK) st = train(eng, model, &o, &c);
    if (st != DSC_OK)
        fprintf(stderr, "own_model: %s: %s\n", dsc_status_name(st),
                dsc_last_error()[0] ? dsc_last_error() : "see the message above");
    dsc_engine_destroy(eng);
    dsc_model_destroy(model); // after the engine and the device trainer, which borrow it
    free(c.bytes);
    return st == DSC_OK ? 0 : 1;
}
