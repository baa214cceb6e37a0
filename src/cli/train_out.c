// cli/train_out.c - what a `dsc train` run writes (see train_impl.h): metrics.jsonl lines, the
// progress and step lines, the closing text sample, the --dump-grads and --dump-weights files.
#include "cli/train_impl.h"

#include <math.h>   // isnan, isfinite
#include <stdlib.h> // calloc, malloc, free
#include <string.h> // strlen, strcmp

#include "dsc/base.h"        // dsc_now
#include "dsc/generate.h"    // dsc_generate
#include "dsc/safetensors.h" // dsc_st_*
#include "dsc/status.h"      // dsc_fail, DSC_TRY

// --dump-grads: the first step's reduced, unscaled, accumulated gradients with Hugging Face
// names, the global batch's input and target tokens, and the step's loss, so the step can be
// recomputed outside dsc. Runs inside the engine's gradient observer (a collective at ZeRO 2-3:
// every rank takes part, rank 0 writes).
const char *train__tensor_name(const trainer *t, int i) {
    return t->peft_names ? t->peft_names[i] : dsc_model_param_get(t->model, i)->name;
}

dsc_status train__dump_grads_observer(void *user, dsc_engine *eng) {
    trainer *t = user;
    int n = t->ntensors;
    int64_t rows = (int64_t)t->gas * t->world * t->B;
    size_t ntok = (size_t)rows * t->T;
    dsc_st_tensor *ts = calloc((size_t)n + 2, sizeof *ts);
    float **copies = calloc((size_t)n, sizeof *copies);
    int32_t *in = malloc(ntok * sizeof *in), *tg = malloc(ntok * sizeof *tg);
    dsc_status st = DSC_OK;
    if (!ts || !copies || !in || !tg) {
        st = dsc_fail(DSC_ERR_OOM, "out of memory writing %s", t->o->dump_grads);
        goto done;
    }
    int k = 0; // tensors written: a LoRA run's trainable ones only, under PEFT's names
    for (int i = 0; i < n && st == DSC_OK; i++) {
        const dsc_model_param *info = dsc_model_param_get(t->model, i);
        if (info->frozen) continue;
        copies[k] = malloc((size_t)info->numel * sizeof(float));
        if (!copies[k]) st = dsc_fail(DSC_ERR_OOM, "out of memory writing %s", t->o->dump_grads);
        else st = dsc_engine_full_grad(eng, i, copies[k]);
        ts[k] = (dsc_st_tensor){.name = train__tensor_name(t, i), .dtype = "F32",
                                .ndim = info->ndim, .data = copies[k],
                                .nbytes = (size_t)info->numel * 4};
        for (int d = 0; d < info->ndim; d++) ts[k].shape[d] = info->shape[d];
        k++;
    }
    if (st != DSC_OK || t->rank != 0) goto done;
    // The global batch of step 1, in (micro-step, rank, sample) order: the loader is
    // deterministic by global sample index, so rank 0 reads every rank's share itself.
    for (int64_t r = 0; r < (int64_t)t->gas * t->world && st == DSC_OK; r++)
        st = dsc_loader_get(t->train, r * t->B, t->B, in + r * t->B * t->T, tg + r * t->B * t->T);
    if (st != DSC_OK) goto done;
    ts[k] = (dsc_st_tensor){"inputs", "I32", 2, {rows, t->T}, in, ntok * 4};
    ts[k + 1] = (dsc_st_tensor){"targets", "I32", 2, {rows, t->T}, tg, ntok * 4};
    char sloss[64], sgas[32], sworld[32];
    snprintf(sloss, sizeof sloss, "%.9g", t->dump_loss);
    snprintf(sgas, sizeof sgas, "%d", t->gas);
    snprintf(sworld, sizeof sworld, "%d", t->world);
    const char *meta[] = {"loss", sloss, "step", "1", "model", t->o->model,
                          "gradient_accumulation_steps", sgas, "world_size", sworld,
                          "format", "dsc-dump-grads-1"};
    st = dsc_st_write(t->o->dump_grads, ts, k + 2, meta, 6);
done:
    for (int i = 0; copies && i < n; i++) free(copies[i]);
    free(copies);
    free(ts);
    free(in);
    free(tg);
    return st;
}

// --device cuda: the run's device pool and the device's used bytes, so that a run shows whether
// its steps allocate device memory (tests/gpu/test_gpu_mem.sh reads them). A failed query only
// leaves the fields out: the next device call reports the fault.
static void write_gpu_memory(trainer *t) {
    dsc_mem_stats ms;
    size_t used;
    if (!t->gpu || dsc_device_trainer_memory(t->gpu, &ms, &used) != DSC_OK) return;
    fprintf(t->metrics,
            ", \"gpu_reserved\": %zu, \"gpu_allocated\": %zu, \"gpu_allocs\": %llu, "
            "\"gpu_system_allocs\": %llu, \"gpu_device_used\": %zu",
            ms.reserved, ms.allocated, (unsigned long long)ms.alloc_count,
            (unsigned long long)ms.system_allocs, used);
}

// A number as JSON: inf and NaN have no JSON spelling, so they are written as null.
static const char *json_num(char *buf, size_t cap, const char *fmt, double x) {
    if (!isfinite(x)) return "null";
    snprintf(buf, cap, fmt, x);
    return buf;
}

static void write_metrics(trainer *t, const dsc_step_info *si, double loss, double val,
                          int64_t tokens, double tok_s, double elapsed) {
    char lb[32], vb[32];
    fprintf(t->metrics,
            "{\"step\": %lld, \"loss\": %s, \"lr\": %.17g, \"grad_norm\": %.9g, "
            "\"loss_scale\": %.17g, \"skipped\": %s, \"tokens\": %lld, \"tokens_per_s\": %.6g, "
            "\"elapsed_s\": %.6f",
            (long long)si->step, json_num(lb, sizeof lb, "%.9g", loss), si->lr,
            isfinite(si->grad_norm) ? si->grad_norm : -1.0, si->loss_scale,
            si->skipped ? "true" : "false", (long long)tokens, tok_s, elapsed);
    if (!isnan(val)) fprintf(t->metrics, ", \"val_loss\": %s", json_num(vb, sizeof vb, "%.9g", val));
    if (t->target_tokens >= 0)
        fprintf(t->metrics, ", \"target_tokens\": %lld", (long long)t->target_tokens);
    write_gpu_memory(t);
    if (t->gpu) {
        char extra[256];
        dsc_device_trainer_metrics(t->gpu, extra, sizeof extra);
        fprintf(t->metrics, ", \"gpu_compute\": \"%s\"%s", dsc_device_trainer_compute(t->gpu),
                extra);
    }
    if (t->mark_resume) fprintf(t->metrics, ", \"resumed\": true"); // lines before: an earlier run
    t->mark_resume = false;
    int64_t faults = dsc_engine_fault_events(t->eng);
    if (faults) fprintf(t->metrics, ", \"fault_events\": %lld, \"world_size\": %d", (long long)faults, t->world);
    fprintf(t->metrics, "}\n");
    fflush(t->metrics);
}

// The closing sample: dsc_generate on the engine's live weights (temperature 0.8, top-40,
// seeded), up to the context length. Every rank takes part (ZeRO-3 gathers); rank 0 prints.
void train__sample_text(trainer *t) {
    if (!t->tok || t->o->sample_tokens <= 0) return;
    if (dsc_model_lora_of(t->model)) { // the cached decoder computes without the adapters
        if (t->rank == 0)
            fprintf(stderr, "note: no text sample in a LoRA run; dsc generate --checkpoint CKPT "
                    "(or --model hf:BASE --adapter DIR) generates with the adapters merged\n");
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    if (dsc_tokenizer_encode(t->tok, t->o->prompt, strlen(t->o->prompt), &ids, &n) != DSC_OK || !n)
        return;
    dsc_gen_opts go = dsc_gen_opts_default();
    go.max_new_tokens = (int)t->o->sample_tokens;
    go.seed = (uint64_t)t->o->seed;
    go.model = t->model;
    dsc_gen_prompt p = {ids, (int)n};
    dsc_gen_output out = {0};
    // On the GPU the weights live on the device: bring them into the engine, whose host copy the
    // generator reads (a KV-cached decode of a few tokens; the CPU is quick enough for a sample).
    dsc_status st = t->gpu ? dsc_device_trainer_store(t->gpu) : DSC_OK;
    if (st == DSC_OK) st = dsc_generate(t->eng, &p, 1, &go, &out, NULL);
    dsc_generate_release(t->eng);
    char *text = NULL;
    size_t tl = 0;
    if (st != DSC_OK) fprintf(stderr, "note: no text sample: %s\n", dsc_last_error());
    else if (t->rank == 0 && dsc_tokenizer_decode(t->tok, out.tokens, (size_t)out.len, &text, &tl) == DSC_OK)
        printf("\nsample (temperature 0.8, top-40):\n----\n%s%.*s\n----\n", t->o->prompt, (int)tl, text);
    free(text);
    dsc_gen_output_free(&out, 1);
    free(ids);
}

static void print_progress(const trainer *t, const dsc_step_info *si, double loss, double tok_s,
                           double mfu) {
    // On the CPU MFU's peak is measured on a machine that other work may share: approximate.
    printf("step %5lld/%lld | loss %.4f | lr %.3e | grad norm %7.4f | loss scale %g | %8.0f tok/s "
           "| MFU %s%.1f%%%s\n",
           (long long)si->step, t->o->max_steps, loss, si->lr, si->grad_norm, si->loss_scale,
           tok_s, t->gpu ? "" : "~", 100 * mfu, si->skipped ? " | skipped (overflow)" : "");
    fflush(stdout);
}

// --dump-weights: the final fp32 master weights with Hugging Face names (a collective at ZeRO
// stages 1-3; rank 0 writes), to compare runs bit for bit.
dsc_status train__dump_weights(trainer *t) {
    int n = t->ntensors;
    dsc_st_tensor *ts = calloc((size_t)n, sizeof *ts);
    float **vals = calloc((size_t)n, sizeof *vals);
    dsc_status st = ts && vals ? DSC_OK : dsc_fail(DSC_ERR_OOM, "out of memory");
    int k = 0; // a LoRA run writes its adapters (and modules_to_save) as PEFT names them
    for (int i = 0; i < n && st == DSC_OK; i++) {
        const dsc_model_param *info = dsc_model_param_get(t->model, i);
        if (info->frozen) continue;
        vals[k] = malloc((size_t)info->numel * sizeof(float));
        st = vals[k] ? dsc_engine_full_param(t->eng, i, vals[k]) : dsc_fail(DSC_ERR_OOM, "out of memory");
        ts[k] = (dsc_st_tensor){.name = train__tensor_name(t, i), .dtype = "F32",
                                .ndim = info->ndim, .data = vals[k],
                                .nbytes = (size_t)info->numel * 4};
        for (int d = 0; d < info->ndim; d++) ts[k].shape[d] = info->shape[d];
        k++;
    }
    n = k;
    char steps[32], world[32];
    snprintf(steps, sizeof steps, "%lld", (long long)dsc_engine_global_steps(t->eng));
    snprintf(world, sizeof world, "%d", t->world);
    // "format": "pt", as `dsc ckpt export` writes: Hugging Face's loaders refuse any other value.
    const char *meta[] = {"format", "pt", "global_steps", steps, "world_size", world};
    if (st == DSC_OK && t->rank == 0) st = dsc_st_write(t->o->dump_weights, ts, n, meta, 3);
    for (int i = 0; vals && i < n; i++) free(vals[i]);
    free(vals);
    free(ts);
    return st;
}

// Rank 0's account of a finished step: its metrics.jsonl line, the progress line, the printed
// step at steps_per_print, the validation loss.
void train__report_step(trainer *t, int64_t step, const dsc_step_info *si, double loss, double val,
                        int64_t tokens, double tok_s, double mfu, double start, int64_t first_step) {
    const dsc_config *cfg = dsc_engine_config(t->eng);
    write_metrics(t, si, loss, val, tokens, tok_s, dsc_now() - start);
    double per_step = (dsc_now() - start) / (double)(step - first_step + 1);
    double eta = per_step * (double)(t->o->max_steps - step);
    obs_progress_update(step, t->o->max_steps, loss, tok_s, eta);
    if (step == 1 || step % cfg->steps_per_print == 0 || step == t->o->max_steps) {
        obs_progress_clear();
        print_progress(t, si, loss, tok_s, mfu);
    }
    if (!isnan(val)) {
        obs_progress_clear();
        printf("step %5lld | validation loss %.4f\n", (long long)step, val);
    }
}
