// infer/generate_cuda.c - the generation loop (generate.c) over the model's GPU decoder (the
// model interface's decode slots, dsc_model_decode_* in dsc/model.h): `dsc generate --device
// cuda`. See dsc_generate_run_cuda in generate.h.
//
// Every sequence of the call is a row of the decoder for the whole call: the prompts' pass is its
// prefill, and each later pass is one step over all rows, where a row whose sequence has ended is
// fed its last token again at its last position (rows are independent, so the others are not
// affected) - the step's shape never changes, and a decoder with graphs replays its captured one
// to the end. Only the live rows' results are handed to the loop. One host wait per pass: the
// chosen tokens (greedy) or the logits (sampling, --trace) coming back.
#include <stdio.h>  // snprintf
#include <stdlib.h> // calloc, free
#include <string.h> // memcpy

#include "base/status.h"    // dsc__fail, DSC_TRY
#include "base/time.h"      // dsc_now
#include "infer/generate.h" // dsc__generate_*

#ifdef DSC_WITH_CUDA

#include "cuda/convert.h"           // dsc__cuda_to_device
#include "cuda/devbuf.h"            // dsc__cuda_buf_*
#include "engine/gpu/train_state.h" // dsc__cuda_device_info, dsc__cuda_current_device
#include "dsc/half.h"               // dsc_fp32_to_bf16_n

// ---- the weights ----

// Device bf16 copies of every tensor of the model's parameter table (host fp32, rounded to nearest
// even as dsc_fp32_to_bf16_n) in one block (tag "gpu.bf16_weights"), each tensor on a 256-byte
// boundary; params[i] = tensor i, as the decoder takes them.
typedef struct bf16_weights {
    dsc_cuda_buf buf;
    const uint16_t **params; // (tensors) views into buf
} bf16_weights;

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

static void weights_free(bf16_weights *w) {
    dsc__cuda_buf_free(&w->buf);
    free(w->params);
    w->params = NULL;
}

// One host staging buffer as large as the largest tensor; each copy waits for its transfer.
static dsc_status weights_upload(bf16_weights *w, const dsc_model *m, const float *const *host,
                                 dsc_mem_pool *pool) {
    int nt = dsc_model_describe(m)->num_tensors;
    if (nt < 1)
        return dsc__fail(DSC_ERR_INVALID_ARG, "generation on the GPU: a model without tensors");
    size_t total = 0, most = 0;
    for (int i = 0; i < nt; i++) {
        const dsc_model_param *p = dsc_model_param_get(m, i);
        if (!host[i])
            return dsc__fail(DSC_ERR_INVALID_ARG, "generation on the GPU: tensor %d (%s) is "
                             "NULL", i, p->name);
        total += align256((size_t)p->numel * 2);
        most = (size_t)p->numel > most ? (size_t)p->numel : most;
    }
    uint16_t *stage = malloc(most * 2);
    w->params = calloc((size_t)nt, sizeof *w->params);
    dsc_status st = stage && w->params ? DSC_OK
                                       : dsc__fail(DSC_ERR_OOM, "generation on the GPU: out of "
                                                   "host memory for the weights' staging");
    if (st == DSC_OK) st = dsc__cuda_buf_alloc(&w->buf, pool, total, "gpu.bf16_weights");
    size_t off = 0;
    for (int i = 0; st == DSC_OK && i < nt; i++) {
        const dsc_model_param *p = dsc_model_param_get(m, i);
        uint16_t *dst = (uint16_t *)((char *)w->buf.ptr + off);
        dsc_fp32_to_bf16_n(stage, host[i], (size_t)p->numel);
        st = dsc__cuda_to_device(dst, stage, (size_t)p->numel * 2, NULL);
        if (st != DSC_OK) dsc__error_prefix("uploading %s: ", p->name);
        w->params[i] = dst;
        off += align256((size_t)p->numel * 2);
    }
    free(stage);
    if (st != DSC_OK) weights_free(w);
    return st;
}

// ---- the backend ----

typedef struct gpu_backend {
    dsc_model_decode *dec;
    const uint16_t *const *params;
    int n, V;
    int32_t *tok, *pos, *all; // (n) a step's inputs; every row's chosen token
    float *logits;            // (n, V) every row's logits, when some have ended
} gpu_backend;

static dsc_status gpu_next(void *ctx, const dsc__gen_pass *p, float *logits, int32_t *chosen,
                           bool *picked) {
    gpu_backend *g = ctx;
    if (p->first) {
        DSC_TRY(dsc_model_decode_prefill(g->dec, g->params, p->tokens, p->len, p->n));
    } else {
        for (int i = 0; i < p->n; i++) {
            g->tok[i] = p->tokens[i][p->len[i] - 1];
            g->pos[i] = p->len[i] - 1;
        }
        DSC_TRY(dsc_model_decode_step(g->dec, g->params, g->tok, g->pos, p->n));
    }
    *picked = chosen != NULL;
    if (chosen) {
        DSC_TRY(dsc_model_decode_argmax(g->dec, g->all));
        for (int j = 0; j < p->nout; j++)
            chosen[j] = g->all[p->sel[j]];
        return DSC_OK;
    }
    if (p->nout == p->n) return dsc_model_decode_logits(g->dec, logits); // sel is 0 .. n-1
    DSC_TRY(dsc_model_decode_logits(g->dec, g->logits));
    for (int j = 0; j < p->nout; j++)
        memcpy(logits + (size_t)j * g->V, g->logits + (size_t)p->sel[j] * g->V,
               sizeof(float) * (size_t)g->V);
    return DSC_OK;
}

// The prompts' pass and two steps (the first runs eagerly, the second captures the step's
// graph where the decoder has graphs), each waited for; the timed loop then starts from a fresh
// prefill, which rewrites every cache position these wrote.
static dsc_status warm_up(gpu_backend *g, const dsc_gen_prompt *p, int n) {
    const int32_t **rows = calloc((size_t)n, sizeof *rows);
    int *lens = calloc((size_t)n, sizeof *lens);
    dsc_status st = rows && lens ? DSC_OK : dsc__fail(DSC_ERR_OOM, "generate: out of memory");
    for (int i = 0; st == DSC_OK && i < n; i++) {
        rows[i] = p[i].tokens, lens[i] = p[i].len;
        g->tok[i] = p[i].tokens[p[i].len - 1], g->pos[i] = p[i].len - 1;
    }
    if (st == DSC_OK) st = dsc_model_decode_prefill(g->dec, g->params, rows, lens, n);
    if (st == DSC_OK) st = dsc_model_decode_argmax(g->dec, g->all);
    for (int k = 0; k < 2 && st == DSC_OK; k++) {
        st = dsc_model_decode_step(g->dec, g->params, g->tok, g->pos, n);
        if (st == DSC_OK) st = dsc_model_decode_argmax(g->dec, g->all);
    }
    free(rows);
    free(lens);
    return st;
}

// One device pool for the call's buffers (weights, cache, activations, the product workspace):
// tagged and counted; it never moves blocks, since the kernels keep raw addresses.
static dsc_status make_pool(dsc_mem_pool **pool) {
    int dev = 0;
    DSC_TRY(dsc__cuda_current_device(&dev));
    char name[64];
    snprintf(name, sizeof name, "cuda:%d generation pool", dev);
    dsc_mem_opts o = {.name = name, .chunk_bytes = (size_t)16 << 20, .no_defrag_on_oom = true};
    return dsc_mem_pool_create(pool, dev, 0, &o);
}

dsc_status dsc_generate_cuda_check(char *name, size_t cap) {
    double peak = 0;
    if (dsc__cuda_device_info(name, cap, &peak) == DSC_OK) return DSC_OK;
    char why[512]; // dsc__fail writes the buffer dsc_last_error() points to: copy first
    snprintf(why, sizeof why, "%s", dsc_last_error());
    return dsc__fail(DSC_ERR_UNSUPPORTED, "generation on the GPU: %s; check nvidia-smi and "
                     "CUDA_VISIBLE_DEVICES, or generate on the CPU (--device cpu)", why);
}

static dsc_status run(const dsc_gen_model *m, dsc_mem_pool *pool, int positions,
                      const dsc_gen_prompt *prompts, int n, const dsc_gen_opts *o,
                      dsc_gen_output *out, dsc_gen_stats *st) {
    bf16_weights w = {0};
    gpu_backend g = {.n = n, .V = dsc_model_describe(m->model)->vocab_size};
    dsc_status rc = weights_upload(&w, m->model, (const float *const *)m->params, pool);
    dsc_model_decode_opts dopt = {.batch = n, .max_len = positions, .recompute = o->no_cache,
                                  .pool = pool};
    if (rc == DSC_OK) rc = dsc_model_decode_create(&g.dec, m->model, &dopt);
    g.params = w.params;
    g.tok = calloc((size_t)n, sizeof(int32_t)), g.pos = calloc((size_t)n, sizeof(int32_t));
    g.all = calloc((size_t)n, sizeof(int32_t));
    g.logits = malloc((size_t)n * g.V * sizeof(float));
    if (rc == DSC_OK && !(g.tok && g.pos && g.all && g.logits))
        rc = dsc__fail(DSC_ERR_OOM, "generate: out of memory for %d sequences", n);
    st->kv_bytes = o->no_cache ? 0 : dsc_model_decode_kv_bytes(m->model, n, positions);
    st->kv_positions = positions;
    double t0 = dsc_now();
    if (rc == DSC_OK) rc = warm_up(&g, prompts, n);
    st->warmup_s = dsc_now() - t0;
    dsc__gen_backend be = {.ctx = &g, .next = gpu_next};
    if (rc == DSC_OK) rc = dsc__generate_loop(m, &be, positions, prompts, n, o, out, st);
    dsc_model_decode_destroy(g.dec);
    weights_free(&w);
    free(g.tok), free(g.pos), free(g.all), free(g.logits);
    return rc;
}

dsc_status dsc_generate_run_cuda(const dsc_gen_model *m, const dsc_gen_prompt *prompts, int n,
                                 const dsc_gen_opts *o, dsc_gen_output *out,
                                 dsc_gen_stats *stats) {
    dsc_gen_stats local = {0};
    dsc_gen_stats *st = stats ? stats : &local;
    if (m->tp.size > 1 || m->hooks)
        return dsc__fail(DSC_ERR_UNSUPPORTED, "generation on the GPU takes whole weights on one "
                         "device: tensor parallelism (--tp) and gather hooks are CPU only");
    if (!dsc_model_has_decode(m->model))
        return dsc__fail(DSC_ERR_UNSUPPORTED, "generation on the GPU: model family %s has no "
                         "GPU decoder; generate on the CPU (--device cpu)",
                         dsc_model_describe(m->model)->family);
    int positions;
    DSC_TRY(dsc__generate_positions(m, prompts, n, o, &positions));
    char name[256];
    DSC_TRY(dsc_generate_cuda_check(name, sizeof name));
    dsc_mem_pool *pool = NULL;
    DSC_TRY(make_pool(&pool));
    dsc_status rc = run(m, pool, positions, prompts, n, o, out, st);
    dsc_mem_pool_destroy(pool); // after its users: they wait for their streams first
    return rc;
}

#else // a build without the CUDA kernels

static dsc_status no_cuda(void) {
    return dsc__fail(DSC_ERR_UNSUPPORTED, "generation on the GPU: this dsc was built without "
                     "the CUDA kernels (nvcc was not found, or -DDSC_CUDA=OFF); rebuild with the "
                     "CUDA toolkit on PATH, or generate on the CPU (--device cpu)");
}

dsc_status dsc_generate_cuda_check(char *name, size_t cap) {
    if (cap) name[0] = '\0';
    return no_cuda();
}

dsc_status dsc_generate_run_cuda(const dsc_gen_model *m, const dsc_gen_prompt *prompts, int n,
                                 const dsc_gen_opts *o, dsc_gen_output *out,
                                 dsc_gen_stats *stats) {
    return no_cuda();
}

#endif
