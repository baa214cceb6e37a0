// examples/own_model/own_model.c - a model of the user's own, trained by the engine through the
// public headers only (dsc/engine.h, dsc/checkpoint.h): a two-layer MLP language model over
// bytes. It predicts the next byte from the CTX bytes before it:
//
//   x      = concat(wte[ctx[0]], ..., wte[ctx[CTX-1]])   // (CTX*EMB)   group 0: wte
//   h      = tanh(w1 x + b1)                             // (HID)       group 1: w1, b1
//   logits = w2 h + b2                                   // (VOCAB)     group 2: w2, b2
//   loss   = mean over the batch of -log softmax(logits)[target]
//
// The model owns its arithmetic (plain C below, behind a small table of kernels so that a device
// back end can take its place) and its activations; the engine owns the parameters, gradients,
// optimizer state, the data-parallel reduction and ZeRO partitioning (stages 0-3) and the
// checkpoints. The program reads its rank and world size from the environment (RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT), so `dsc launch --num_procs 2 ./own_model` runs it on
// two ranks. Each rank reads its own slice of every global batch, chosen by global sample index,
// so the global batches do not depend on the world size.
//
//   own_model [--stage N | --config FILE] [--steps N] [--data FILE] [--seed S]
//             [--save-dir DIR [--save-every N]] [--resume DIR[/TAG]]
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
#include "dsc/engine.h"     // dsc_engine_*, dsc_gather, dsc_release, dsc_grads_ready, dsc_step
#include "dsc/status.h"     // dsc_status, dsc_last_error

enum { VOCAB = 256, CTX = 4, EMB = 16, HID = 96, IN = CTX * EMB };
enum { G_EMBED = 0, G_HIDDEN = 1, G_HEAD = 2, NGROUPS = 3 };
enum { P_WTE, P_W1, P_B1, P_W2, P_B2, NPARAMS };

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

// ---- the kernels: one table per back end; the CPU's is below ----
//
// A device back end (cuBLAS for the two dense layers, a kernel for the embedding's gather and
// scatter and one for the softmax) fills the same table; only where the weights and activations
// live changes (see README.md).

typedef struct mlp_kernels {
    const char *name;
    // x: (B, IN) = the CTX embeddings of each sample's context, side by side
    void (*embed_forward)(const float *wte, const uint8_t *ctx, float *x, int B);
    // h: (B, HID) = tanh(x w1^T + b1)
    void (*hidden_forward)(const float *w1, const float *b1, const float *x, float *h, int B);
    // probs: (B, VOCAB) = softmax(h w2^T + b2); returns the mean of -log probs[b][target[b]]
    float (*head_forward)(const float *w2, const float *b2, const float *h, const uint8_t *tgt,
                          float *probs, int B);
    // dlogits = (probs - onehot) * scale / B; dw2 += dlogits^T h, db2 += sum dlogits,
    // dh: (B, HID) = dlogits w2 (overwritten)
    void (*head_backward)(const float *w2, float *dw2, float *db2, const float *h,
                          const float *probs, const uint8_t *tgt, float scale, float *dh, int B);
    // da = dh (1 - h^2); dw1 += da^T x, db1 += sum da, dx: (B, IN) = da w1 (overwritten)
    void (*hidden_backward)(const float *w1, float *dw1, float *db1, const float *x,
                            const float *h, const float *dh, float *dx, int B);
    // dwte[ctx[b][c]] += dx[b][c*EMB ..]
    void (*embed_backward)(float *dwte, const uint8_t *ctx, const float *dx, int B);
} mlp_kernels;

static void cpu_embed_forward(const float *wte, const uint8_t *ctx, float *x, int B) {
    for (int b = 0; b < B; b++)
        for (int c = 0; c < CTX; c++)
            memcpy(x + (size_t)b * IN + c * EMB, wte + (size_t)ctx[b * CTX + c] * EMB,
                   EMB * sizeof(float));
}

static void cpu_hidden_forward(const float *w1, const float *b1, const float *x, float *h, int B) {
    for (int b = 0; b < B; b++)
        for (int j = 0; j < HID; j++) {
            float a = b1[j];
            for (int i = 0; i < IN; i++) a += w1[j * IN + i] * x[b * IN + i];
            h[b * HID + j] = tanhf(a);
        }
}

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

static void cpu_embed_backward(float *dwte, const uint8_t *ctx, const float *dx, int B) {
    for (int b = 0; b < B; b++)
        for (int c = 0; c < CTX; c++) {
            float *row = dwte + (size_t)ctx[b * CTX + c] * EMB;
            for (int e = 0; e < EMB; e++) row[e] += dx[b * IN + c * EMB + e];
        }
}

static const mlp_kernels cpu_kernels = {
    .name = "cpu",
    .embed_forward = cpu_embed_forward,
    .hidden_forward = cpu_hidden_forward,
    .head_forward = cpu_head_forward,
    .head_backward = cpu_head_backward,
    .hidden_backward = cpu_hidden_backward,
    .embed_backward = cpu_embed_backward,
};

// ---- the model: its activations, and the engine's calls around each layer group ----

typedef struct mlp {
    dsc_engine *eng;
    const mlp_kernels *k;
    int B;                       // samples per micro-batch on this rank
    uint8_t *ctx, *tgt;          // (B, CTX), (B): the micro-batch
    float *x, *h, *probs;        // (B, IN), (B, HID), (B, VOCAB): kept from forward for backward
    float *dh, *dx;              // (B, HID), (B, IN)
    float *w[NPARAMS], *g[NPARAMS]; // the engine's buffers, re-read after every dsc_gather
} mlp;

// Gather a group and take its tensors' pointers (ZeRO-3 gathers into fresh buffers; during
// backward the gradient buffers come with the gather).
static dsc_status gather(mlp *m, int group) {
    TRY(dsc_gather(m->eng, group));
    for (int i = 0; i < NPARAMS; i++)
        if (param_table[i].group == group) {
            m->w[i] = dsc_param_data(m->eng, i);
            m->g[i] = dsc_param_grad(m->eng, i);
        }
    return DSC_OK;
}

static dsc_status mlp_forward(mlp *m, const uint8_t *ctx, const uint8_t *tgt, float *loss) {
    TRY(gather(m, G_EMBED));
    m->k->embed_forward(m->w[P_WTE], ctx, m->x, m->B);
    TRY(dsc_release(m->eng, G_EMBED));
    TRY(gather(m, G_HIDDEN));
    m->k->hidden_forward(m->w[P_W1], m->w[P_B1], m->x, m->h, m->B);
    TRY(dsc_release(m->eng, G_HIDDEN));
    TRY(gather(m, G_HEAD));
    *loss = m->k->head_forward(m->w[P_W2], m->w[P_B2], m->h, tgt, m->probs, m->B);
    return dsc_release(m->eng, G_HEAD);
}

// Backward of the mean loss times dsc_backward_scale (loss scale / gradient accumulation), layer
// groups in reverse; each group's gradients are handed over as soon as they are complete, so that
// their reduction overlaps the rest of backward.
static dsc_status mlp_backward(mlp *m, const uint8_t *ctx, const uint8_t *tgt) {
    float scale = (float)dsc_backward_scale(m->eng);
    TRY(dsc_backward_begin(m->eng));
    TRY(gather(m, G_HEAD));
    m->k->head_backward(m->w[P_W2], m->g[P_W2], m->g[P_B2], m->h, m->probs, tgt, scale, m->dh,
                        m->B);
    TRY(dsc_release(m->eng, G_HEAD));
    TRY(dsc_grads_ready(m->eng, G_HEAD));
    TRY(gather(m, G_HIDDEN));
    m->k->hidden_backward(m->w[P_W1], m->g[P_W1], m->g[P_B1], m->x, m->h, m->dh, m->dx, m->B);
    TRY(dsc_release(m->eng, G_HIDDEN));
    TRY(dsc_grads_ready(m->eng, G_HIDDEN));
    TRY(gather(m, G_EMBED));
    m->k->embed_backward(m->g[P_WTE], ctx, m->dx, m->B);
    TRY(dsc_release(m->eng, G_EMBED));
    return dsc_grads_ready(m->eng, G_EMBED);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static float uniform(uint64_t *s) { // [-1, 1)
    return (float)((double)(splitmix64(s) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

// Initial weights, the same on every rank (the engine requires it): uniform in +-1/sqrt(fan_in),
// biases zero. Then the engine partitions them (stages 1-3).
static dsc_status mlp_init_weights(mlp *m, uint64_t seed) {
    static const float bound[NPARAMS] = {[P_WTE] = 1.0f, [P_W1] = 0.125f, [P_W2] = 0.1020620f};
    for (int i = 0; i < NPARAMS; i++) {
        float *w = dsc_param_master(m->eng, i);
        int64_t n = 1;
        for (int d = 0; d < param_table[i].ndim; d++) n *= param_table[i].shape[d];
        uint64_t s = seed * 1000003u + (uint64_t)i;
        for (int64_t k = 0; k < n; k++) w[k] = bound[i] * uniform(&s);
    }
    return dsc_params_updated(m->eng);
}

static dsc_status mlp_create(mlp *m, dsc_engine *eng, int B) {
    *m = (mlp){.eng = eng, .k = &cpu_kernels, .B = B};
    m->ctx = malloc((size_t)B * CTX);
    m->tgt = malloc((size_t)B);
    m->x = malloc((size_t)B * IN * sizeof(float));
    m->h = malloc((size_t)B * HID * sizeof(float));
    m->probs = malloc((size_t)B * VOCAB * sizeof(float));
    m->dh = malloc((size_t)B * HID * sizeof(float));
    m->dx = malloc((size_t)B * IN * sizeof(float));
    if (m->ctx && m->tgt && m->x && m->h && m->probs && m->dh && m->dx) return DSC_OK;
    fprintf(stderr, "own_model: out of memory for the activations of %d samples\n", B);
    return DSC_ERR_OOM;
}

static void mlp_destroy(mlp *m) {
    free(m->ctx), free(m->tgt), free(m->x), free(m->h), free(m->probs), free(m->dh), free(m->dx);
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

// Samples first .. first+B-1 of the stream, spread over it by a prime stride.
static void corpus_batch(const corpus *c, int64_t first, int B, uint8_t *ctx, uint8_t *tgt) {
    int64_t positions = c->n - CTX;
    for (int b = 0; b < B; b++) {
        int64_t at = ((first + b) * 7919) % positions;
        memcpy(ctx + b * CTX, c->bytes + at, CTX);
        tgt[b] = c->bytes[at + CTX];
    }
}

// ---- the training run ----

typedef struct run_opts {
    int stage;               // with the built-in config
    const char *config_path; // instead of the built-in config
    int64_t steps, save_every;
    uint64_t seed;
    const char *data, *save_dir, *resume;
} run_opts;

// The built-in configuration: a global batch of 32 samples (the micro-batch of 8 per rank and the
// gradient accumulation follow from the world size), AdamW with warm-up, clipping. Every group
// is smaller than ZeRO-3's default persistence threshold (1e5 elements), which would keep them
// all gathered: 0 makes stage 3 partition and gather every group.
static void builtin_config(const run_opts *o, char *out, size_t cap) {
    snprintf(out, cap,
             "{\"train_batch_size\": 32, \"train_micro_batch_size_per_gpu\": 8,"
             " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01,"
             " \"weight_decay\": 0.01}},"
             " \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 5}},"
             " \"gradient_clipping\": 1.0,"
             " \"zero_optimization\": {\"stage\": %d,"
             " \"stage3_param_persistence_threshold\": 0},"
             " \"checkpoint\": {\"async\": false, \"interval_s\": 0}}",
             o->stage);
}

// The fp32 master weights of every tensor, hashed (FNV-1a over their bytes) in parameter order.
// A collective at stages 1-3: every rank calls it.
static dsc_status weights_checksum(dsc_engine *eng, uint64_t *out) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < NPARAMS; i++) {
        int64_t n = 1;
        for (int d = 0; d < param_table[i].ndim; d++) n *= param_table[i].shape[d];
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

// One optimizer step: gradient_accumulation_steps micro-batches on each rank, then dsc_step.
// *loss: the step's mean loss over its micro-batches and ranks.
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
        corpus_batch(c, first, m->B, m->ctx, m->tgt);
        TRY(mlp_forward(m, m->ctx, m->tgt, &l));
        TRY(mlp_backward(m, m->ctx, m->tgt));
        TRY(dsc_step(m->eng, si));
        sum += l;
    }
    *loss = sum / gas;
    return dsc_engine_mean(m->eng, loss, 1);
}

static dsc_status train(dsc_engine *eng, const run_opts *o, const corpus *c) {
    mlp m;
    int64_t B = dsc_engine_config(eng)->train_micro_batch_size_per_gpu;
    dsc_status st = mlp_create(&m, eng, (int)B);
    if (st == DSC_OK) st = mlp_init_weights(&m, o->seed);
    bool rank0 = dsc_engine_rank(eng) == 0;
    if (st == DSC_OK && rank0)
        printf("own_model: %d ranks, ZeRO stage %lld, %lld parameters in %d groups, %s kernels, "
               "%lld samples per step\n", dsc_engine_world_size(eng),
               (long long)dsc_engine_config(eng)->zero_optimization.stage,
               (long long)dsc_engine_num_elements(eng), NGROUPS, m.k->name,
               (long long)dsc_engine_config(eng)->train_batch_size);
    if (st == DSC_OK && o->resume) st = resume(eng, o->resume);
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
        if (st == DSC_OK) st = dsc_engine_maintain(eng, false, NULL); // pointers: next gather
        if (st == DSC_OK && saving) st = dsc_checkpoint_step_end(eng, false, &tick);
        if (st == DSC_OK && saving && tick.saved && rank0) printf("checkpoint %s saved\n", tick.tag);
        fflush(stdout);
    }
    if (saving) { // complete the save in flight; after a failure only stop the writer
        dsc_status st2 = dsc_checkpointing_stop(eng, st == DSC_OK);
        if (st == DSC_OK) st = st2;
    }
    uint64_t sum;
    if (st == DSC_OK) st = weights_checksum(eng, &sum);
    if (st == DSC_OK && rank0) printf("weights fnv1a64 %016llx\n", (unsigned long long)sum);
    mlp_destroy(&m);
    return st;
}

// ---- command line ----

static int usage(const char *why) {
    fprintf(stderr, "own_model: %s\nusage: own_model [--stage 0-3 | --config FILE] [--steps N] "
            "[--data FILE] [--seed S] [--save-dir DIR [--save-every N]] [--resume DIR[/TAG]]\n",
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
    *o = (run_opts){.steps = 40, .seed = 1};
    char why[512] = "";
    for (int a = 1; a < argc && !why[0]; a++) {
        const char *f = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        int64_t n = 0;
        if (!strncmp(f, "--local_rank", 12)) continue;
        bool known = !strcmp(f, "--stage") || !strcmp(f, "--steps") ||
                     !strcmp(f, "--save-every") || !strcmp(f, "--seed") ||
                     !strcmp(f, "--config") || !strcmp(f, "--data") ||
                     !strcmp(f, "--save-dir") || !strcmp(f, "--resume");
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
    }
    return why[0] ? usage(why) : 0;
}

int main(int argc, char **argv) {
    run_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    corpus c = {0};
    dsc_status st = o.data ? corpus_read(&c, o.data) : corpus_generate(&c, 1 << 16);
    if (st != DSC_OK) return free(c.bytes), 1;
    char json[1024];
    builtin_config(&o, json, sizeof json);
    dsc_engine_opts eo = {.params = param_table, .nparams = NPARAMS}; // world: the environment
    if (o.config_path) eo.config_path = o.config_path;
    else eo.config_json = json;
    dsc_engine *eng = NULL;
    st = dsc_engine_create(&eng, &eo);
    if (st == DSC_OK) st = train(eng, &o, &c);
    if (st != DSC_OK)
        fprintf(stderr, "own_model: %s: %s\n", dsc_status_name(st),
                dsc_last_error()[0] ? dsc_last_error() : "see the message above");
    dsc_engine_destroy(eng);
    free(c.bytes);
    return st == DSC_OK ? 0 : 1;
}
