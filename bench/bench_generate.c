// bench_generate - generation throughput and the hybrid engine's switch time, on the CPU.
//
//   bench_generate [model] [batch] [prompt_len] [new_tokens]   (default d6 4 32 96)
//
// 1. Tokens per second of greedy generation for a batch of prompts: with the key/value cache
//    (one row per token and layer) and without it (every sequence recomputed for each token).
// 2. The hybrid engine: train step -> dsc_generate -> train step on one rank at ZeRO stages 0
//    and 3, timing the switch to the inference layout (stage 3: every group gathered), the
//    switch back, and a training step before and after (equal: nothing else changed).
// Weights are GPT-2's random initialisation (vocabulary 256, context 512): speed does not depend
// on what the weights say.
#include <stdio.h>  // printf
#include <stdlib.h> // calloc, exit, free, malloc, strtol
#include <string.h> // memcpy

#include "base/time.h"        // dsc_now
#include "dsc/engine.h"       // dsc_engine_*
#include "dsc/generate.h"     // dsc_generate
#include "infer/generate.h"   // dsc_generate_run
#include "model/gpt2/gpt2.h"  // dsc_gpt2_*
#include "model/gpt2/model.h" // dsc__model_gpt2_create

static dsc_gpt2_config cfg;
static dsc_model *model; // cfg's handle
static int B = 4, P = 32, N = 96;

static int arg(char **argv, int argc, int i, int def) {
    return argc > i ? (int)strtol(argv[i], NULL, 10) : def;
}

static void make_prompts(dsc_gen_prompt *p, int32_t *tok) {
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < P; t++)
            tok[b * P + t] = (b * 31 + t * 7) % cfg.vocab_size;
        p[b] = (dsc_gen_prompt){tok + b * P, P};
    }
}

static double tokens_per_s(float **params, bool no_cache) {
    dsc_gen_prompt p[64];
    int32_t tok[64 * 512];
    make_prompts(p, tok);
    dsc_gen_opts o = dsc_gen_opts_default();
    o.temperature = 0, o.max_new_tokens = N, o.no_cache = no_cache;
    dsc_gen_model m = {.model = model, .params = params, .tp = {0, 1, NULL}};
    dsc_model_kv *kv = NULL;
    dsc_gen_output out[64];
    dsc_gen_stats st = {0};
    if (dsc_generate_run(&m, &kv, p, B, &o, out, &st) != DSC_OK) {
        fprintf(stderr, "generate: %s\n", dsc_last_error());
        exit(1);
    }
    dsc_gen_output_free(out, B);
    dsc_model_kv_destroy(kv);
    return (double)st.new_tokens / (st.prefill_s + st.decode_s);
}

// ---- the hybrid engine ----

typedef struct tr {
    dsc_engine *eng;
    dsc_gpt2 *g;
    float **work, **grads;
    int nt;
} tr;

static dsc_status hk_gather(void *u, int g) {
    tr *t = u;
    dsc_status st = dsc_gather(t->eng, g);
    for (int i = 0; i < t->nt; i++) {
        t->work[i] = dsc_param_data(t->eng, i);
        t->grads[i] = dsc_param_grad(t->eng, i);
    }
    return st;
}
static dsc_status hk_release(void *u, int g) { return dsc_release(((tr *)u)->eng, g); }
static dsc_status hk_ready(void *u, int g) { return dsc_grads_ready(((tr *)u)->eng, g); }

static double train_step(tr *t) {
    int32_t in[8 * 128], tg[8 * 128];
    for (int k = 0; k < 8 * 128; k++)
        in[k] = (k * 13) % 256, tg[k] = (k * 13 + 1) % 256;
    dsc_gpt2_hooks h = {t, hk_gather, hk_release, hk_ready};
    dsc_step_info si;
    double t0 = dsc_now();
    float loss;
    if (dsc_gpt2_forward(t->g, t->work, in, tg, 8, 128, &h, &loss) != DSC_OK ||
        dsc_backward_begin(t->eng) != DSC_OK ||
        dsc_gpt2_backward(t->g, t->work, t->grads, (float)dsc_backward_scale(t->eng), &h) !=
            DSC_OK ||
        dsc_step(t->eng, &si) != DSC_OK) {
        fprintf(stderr, "train step: %s\n", dsc_last_error());
        exit(1);
    }
    return dsc_now() - t0;
}

static void hybrid(int stage) {
    tr t = {.nt = dsc_gpt2_num_tensors(&cfg)};
    dsc_param_desc pd[1024];
    dsc_gpt2_tensor_info ti[1024];
    for (int i = 0; i < t.nt; i++) {
        dsc_gpt2_tensor_info_get(&cfg, i, &ti[i]);
        pd[i] = (dsc_param_desc){.name = ti[i].name,
                                 .ndim = ti[i].ndim,
                                 .group = ti[i].group,
                                 .shape = {ti[i].shape[0], ti[i].shape[1]}};
    }
    char json[512];
    snprintf(json, sizeof json,
             "{\"train_micro_batch_size_per_gpu\": 8, \"optimizer\": "
             "{\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4}}, \"zero_optimization\": "
             "{\"stage\": %d}, \"hybrid_engine\": {\"enabled\": true, \"max_out_tokens\": %d}}",
             stage, P + N);
    dsc_engine_opts eo = {.config_json = json, .params = pd, .nparams = t.nt, .world_size = 1};
    if (dsc_engine_create(&t.eng, &eo) != DSC_OK || dsc_gpt2_create(&t.g, &cfg, 8, 128) != DSC_OK) {
        fprintf(stderr, "setup: %s\n", dsc_last_error());
        exit(1);
    }
    float *master[1024];
    for (int i = 0; i < t.nt; i++)
        master[i] = dsc_param_master(t.eng, i);
    dsc_gpt2_init_weights(&cfg, master, 1);
    dsc_params_updated(t.eng);
    float *work[1024], *grads[1024];
    t.work = work, t.grads = grads;
    train_step(&t); // warm-up
    double before = train_step(&t);
    dsc_gen_prompt p[64];
    int32_t tok[64 * 512];
    make_prompts(p, tok);
    dsc_gen_opts o = dsc_gen_opts_default();
    o.max_new_tokens = N;
    o.model = model;
    dsc_gen_output out[64];
    dsc_gen_stats st;
    double g0 = dsc_now();
    if (dsc_generate(t.eng, p, B, &o, out, &st) != DSC_OK) {
        fprintf(stderr, "dsc_generate: %s\n", dsc_last_error());
        exit(1);
    }
    double total = dsc_now() - g0;
    dsc_gen_output_free(out, B);
    double after = train_step(&t);
    printf("| %d | %.2f | %.2f | %.0f | %.1f | %.3f | %.3f | %.1f |\n", stage,
           st.to_inference_s * 1e3, st.to_training_s * 1e3, st.new_tokens / total,
           st.kv_bytes / 1024.0, before, after, total);
    dsc_generate_release(t.eng);
    dsc_gpt2_destroy(t.g);
    dsc_engine_destroy(t.eng);
}

int main(int argc, char **argv) {
    const char *spec = argc > 1 ? argv[1] : "d6";
    B = arg(argv, argc, 2, 4), P = arg(argv, argc, 3, 32), N = arg(argv, argc, 4, 96);
    if (B < 1 || B > 64 || P < 1 || N < 1 || P + N > 512 ||
        dsc_gpt2_config_parse(spec, 256, 512, &cfg) != DSC_OK ||
        dsc__model_gpt2_create(&model, &cfg) != DSC_OK) {
        fprintf(stderr, "usage: bench_generate [dN] [batch 1..64] [prompt_len] [new_tokens], "
                        "prompt_len + new_tokens <= 512\n");
        return 2;
    }
    int nt = dsc_gpt2_num_tensors(&cfg);
    float **params = calloc((size_t)nt, sizeof *params);
    for (int i = 0; i < nt; i++) {
        dsc_gpt2_tensor_info ti;
        dsc_gpt2_tensor_info_get(&cfg, i, &ti);
        params[i] = malloc((size_t)ti.numel * sizeof(float));
    }
    dsc_gpt2_init_weights(&cfg, params, 1);
    printf("model %s (%.2fM parameters), batch %d, prompt %d, %d new tokens each\n\n", spec,
           dsc_gpt2_num_params(&cfg) / 1e6, B, P, N);
    double with = tokens_per_s(params, false), without = tokens_per_s(params, true);
    printf("| path | tokens/s |\n|---|---|\n| KV cache | %.0f |\n| no cache (recompute) | %.0f |\n"
           "| speed-up | %.1fx |\n\n",
           with, without, with / without);
    printf("| ZeRO stage | to inference ms | to training ms | generate tok/s | KV KiB | train step "
           "before s | after s | generate s |\n|---|---|---|---|---|---|---|---|\n");
    hybrid(0);
    hybrid(3);
    for (int i = 0; i < nt; i++)
        free(params[i]);
    free(params);
    return 0;
}
