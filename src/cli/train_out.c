// cli/train_out.c - what a `dsc train` run writes (see train_impl.h): metrics.jsonl lines, the
// progress and step lines, the closing text sample, the --dump-grads and --dump-weights files.
#include "cli/train_impl.h"

#include <math.h>   // isnan, isfinite
#include <stdlib.h> // calloc, malloc, free
#include <stdio.h>  // snprintf
#include <string.h> // strlen, strcmp, memcpy

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

// A dump file of the trainable tensors (HF or PEFT names; ts[0 .. n) with data NULL, read by
// get one at a time as the file is written, so that no rank holds more than one tensor), then
// ts[n .. n + extra) as they are. A collective at ZeRO stages 1-3 (get gathers): every rank reads
// every tensor in the same order and rank 0 writes; a rank 0 whose write fails reads the rest
// still, so that no rank waits alone.
typedef dsc_status (*dump_get_fn)(dsc_engine *eng, int i, float *out);
typedef struct dump_ctx {
    trainer *t;
    dump_get_fn get;
    const int *idx;         // (n) model tensor of each streamed entry
    const dsc_st_tensor *ts;
    int n, done;            // done: entries read so far
    bool get_failed;
} dump_ctx;

static dsc_status dump_fill(void *user, int k, void *dst, size_t nbytes) {
    dump_ctx *c = user;
    if (k >= c->n) {
        memcpy(dst, c->ts[k].data, nbytes);
        return DSC_OK;
    }
    c->done = k + 1;
    dsc_status st = c->get(c->t->eng, c->idx[k], dst);
    c->get_failed = st != DSC_OK;
    return st;
}

// Reads the dump's entries from the from-th on (the trainable tensors in the model's order, as
// dump_tensors lists them) into a scratch and drops them: ranks other than 0, rank 0 after a
// failed write, and a rank that could not allocate the list itself.
static dsc_status dump_drain(trainer *t, dump_get_fn get, int from) {
    dsc_status st = DSC_OK;
    for (int i = 0, k = 0; i < t->ntensors && st == DSC_OK; i++) {
        const dsc_model_param *info = dsc_model_param_get(t->model, i);
        if (info->frozen || k++ < from) continue;
        float *tmp = malloc(info->numel ? (size_t)info->numel * sizeof(float) : 1);
        st = tmp ? get(t->eng, i, tmp) : dsc_fail(DSC_ERR_OOM, "out of memory");
        free(tmp);
    }
    return st;
}

// A rank that could not allocate the dump's tables still reads every tensor (the others' gathers
// complete), then fails naming path.
static dsc_status dump_oom(trainer *t, dump_get_fn get, const char *path) {
    dump_drain(t, get, 0);
    return dsc_fail(DSC_ERR_OOM, "out of memory writing %s", path);
}

static dsc_status write_dump(trainer *t, const char *path, dump_get_fn get, dsc_st_tensor *ts,
                             const int *idx, int n, int extra, const char *const *meta,
                             int nmeta) {
    dump_ctx c = {t, get, idx, ts, n, 0, false};
    if (t->rank != 0) return dump_drain(t, get, 0);
    dsc_status st = dsc_st_write_stream(path, ts, n + extra, meta, nmeta, dump_fill, &c);
    if (st != DSC_OK && !c.get_failed) {
        char why[1024];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        dump_drain(t, get, c.done);
        st = dsc_fail(st, "%s", why);
    }
    return st;
}

// The trainable tensors as a dump lists them: ts[k] (name, shape, no data) and idx[k] its model
// tensor; returns k. ts and idx hold t->ntensors (+ 2) entries.
static int dump_tensors(const trainer *t, dsc_st_tensor *ts, int *idx) {
    int k = 0; // a LoRA run's trainable ones only, under PEFT's names
    for (int i = 0; i < t->ntensors; i++) {
        const dsc_model_param *info = dsc_model_param_get(t->model, i);
        if (info->frozen) continue;
        ts[k] = (dsc_st_tensor){.name = train__tensor_name(t, i), .dtype = "F32",
                                .ndim = info->ndim, .nbytes = (size_t)info->numel * 4};
        for (int d = 0; d < info->ndim; d++) ts[k].shape[d] = info->shape[d];
        idx[k++] = i;
    }
    return k;
}

dsc_status train__dump_grads_observer(void *user, dsc_engine *eng) {
    trainer *t = user;
    (void)eng; // t->eng
    int64_t rows = (int64_t)t->gas * t->world * t->B;
    size_t ntok = (size_t)rows * t->T;
    dsc_st_tensor *ts = calloc((size_t)t->ntensors + 2, sizeof *ts);
    int *idx = calloc((size_t)t->ntensors + 1, sizeof *idx);
    // the batch's tokens: rank 0 writes them
    int32_t *in = t->rank == 0 ? malloc(ntok * sizeof *in) : NULL;
    int32_t *tg = t->rank == 0 ? malloc(ntok * sizeof *tg) : NULL;
    dsc_status st = DSC_OK;
    if (!ts || !idx || (t->rank == 0 && (!in || !tg))) {
        st = dump_oom(t, dsc_engine_full_grad, t->o->dump_grads);
        goto done;
    }
    int k = dump_tensors(t, ts, idx);
    // The global batch of step 1, in (micro-step, rank, sample) order: the loader is
    // deterministic by global sample index, so rank 0 reads every rank's share itself.
    for (int64_t r = 0; t->rank == 0 && r < (int64_t)t->gas * t->world && st == DSC_OK; r++)
        st = dsc_loader_get(t->train, r * t->B, t->B, in + r * t->B * t->T, tg + r * t->B * t->T);
    ts[k] = (dsc_st_tensor){"inputs", "I32", 2, {rows, t->T}, in, ntok * 4};
    ts[k + 1] = (dsc_st_tensor){"targets", "I32", 2, {rows, t->T}, tg, ntok * 4};
    char sloss[64], sgas[32], sworld[32];
    snprintf(sloss, sizeof sloss, "%.9g", t->dump_loss);
    snprintf(sgas, sizeof sgas, "%d", t->gas);
    snprintf(sworld, sizeof sworld, "%d", t->world);
    const char *meta[] = {"loss", sloss, "step", "1", "model", t->o->model,
                          "gradient_accumulation_steps", sgas, "world_size", sworld,
                          "format", "dsc-dump-grads-1"};
    // (a loader failure on rank 0 still lets the gathers run on every rank)
    dsc_status w = write_dump(t, t->o->dump_grads, dsc_engine_full_grad, ts, idx, k, 2, meta, 6);
    if (st == DSC_OK) st = w;
done:
    free(ts);
    free(idx);
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
    // On the GPU the host decoder reads an fp32 copy of every weight, made for it (with the state
    // on the device, read from there tensor by tensor): not beyond the host memory the plan found.
    double copy = (double)dsc_model_describe(t->model)->num_params * 4;
    if (t->gpu && t->plan.host_avail >= 0 &&
        (double)t->plan.host_bytes + copy > (double)t->plan.host_avail) {
        if (t->rank == 0)
            fprintf(stderr, "note: no text sample: the host memory left beside the run's plan is "
                    "smaller than the host decoder's copy of every weight (%.1f GiB); dsc "
                    "generate --checkpoint CKPT --device cuda generates from a checkpoint\n",
                    copy / (double)(1u << 30));
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
    // generator reads (a KV-cached decode of a few tokens; the CPU is quick enough for a sample);
    // with the state on the device the generator makes its copy from there, tensor by tensor.
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
    dsc_st_tensor *ts = calloc((size_t)t->ntensors + 1, sizeof *ts);
    int *idx = calloc((size_t)t->ntensors + 1, sizeof *idx);
    if (!ts || !idx) {
        free(ts);
        free(idx);
        return dump_oom(t, dsc_engine_full_param, t->o->dump_weights);
    }
    int n = dump_tensors(t, ts, idx); // a LoRA run: its adapters (and modules_to_save)
    char steps[32], world[32];
    snprintf(steps, sizeof steps, "%lld", (long long)dsc_engine_global_steps(t->eng));
    snprintf(world, sizeof world, "%d", t->world);
    // "format": "pt", as `dsc ckpt export` writes: Hugging Face's loaders refuse any other value.
    const char *meta[] = {"format", "pt", "global_steps", steps, "world_size", world};
    dsc_status st = write_dump(t, t->o->dump_weights, dsc_engine_full_param, ts, idx, n, 0, meta,
                               3);
    free(ts);
    free(idx);
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
