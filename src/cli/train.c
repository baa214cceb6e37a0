// cli/train.c - the reference trainer: a model (dsc/model.h) through the engine on token shards
// (setup, the loop, checkpoints and recovery; what a run writes is train_out.c).
#include "cli/train_impl.h" // trainer, train__* (train_out.c)

#include <cblas.h>    // cblas_sgemm (CPU peak for MFU)
#include <errno.h>    // errno
#include <jansson.h>  // json_* (dataset.json)
#include <math.h>     // isnan, llround
#include <signal.h>   // sigaction, SIGUSR1
#include <stdio.h>    // printf, fopen
#include <stdint.h>   // INT32_MAX
#include <stdlib.h>   // calloc, free, getenv
#include <string.h>   // strcmp, strerror
#include <sys/stat.h> // stat
#include <time.h>     // time, strftime, nanosleep
#include <unistd.h>   // getpid, unlink, rmdir
#ifdef _OPENMP
#include <omp.h> // omp_*
#endif

#include "cli/lora.h"        // cli_lora, cli_peft_name
#include "cli/train_obs.h"   // obs_*, train_times
#include "dsc/base.h"        // dsc_env, dsc_mkdirs, dsc_now
#include "dsc/checkpoint.h"  // dsc_checkpointing_*, dsc_save_checkpoint
#include "dsc/data.h"        // dsc_loader_*, dsc_data_default, dsc_tokenizer_*
#include "dsc/engine.h"      // dsc_engine_*
#include "dsc/half.h"        // dsc_fp32_to_bf16, dsc_fp32_to_fp16
#include "dsc/model.h"       // dsc_model_*
#include "dsc/monitor.h"     // dsc_monitor_*
#include "dsc/safetensors.h" // dsc_hf_weights_*
#include "dsc/status.h"      // dsc_fail, DSC_TRY

// The configuration used when --config is not given: AdamW with warm-up and cosine decay.
static const char *default_config_fmt =
    "{\"train_micro_batch_size_per_gpu\": 8, \"gradient_accumulation_steps\": 1,"
    " \"steps_per_print\": 20, \"gradient_clipping\": 1.0,"
    " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3, \"betas\": [0.9, 0.95],"
    " \"eps\": 1e-8, \"weight_decay\": 0.01}},"
    " \"scheduler\": {\"type\": \"WarmupCosineLR\", \"params\": {\"warmup_num_steps\": %lld,"
    " \"total_num_steps\": %lld, \"warmup_type\": \"linear\", \"cos_min_ratio\": 0.1}}}";

// ---- hooks: the model asks the engine for its parameters ----

// After a gather the engine may have moved the group (ZeRO-3 gathers into fresh buffers): the
// model's pointer tables are refreshed for that group's tensors.
static dsc_status hook_gather(void *u, int g) {
    trainer *t = u;
    DSC_TRY(dsc_gather(t->eng, g));
    for (int i = 0; i < t->ntensors; i++) {
        if (t->tgroup[i] != g) continue;
        t->work[i] = dsc_param_data(t->eng, i);
        t->grads[i] = dsc_param_grad(t->eng, i);
    }
    return DSC_OK;
}

static dsc_status hook_release(void *u, int g) { return dsc_release(((trainer *)u)->eng, g); }
// The reduction a group's gradients start: DeepSpeed's backward_allreduce timer.
static dsc_status hook_ready(void *u, int g) {
    trainer *t = u;
    double t0 = dsc_now();
    dsc_status st = dsc_grads_ready(t->eng, g);
    t->cur.bwd_allreduce += dsc_now() - t0;
    return st;
}

// ---- set-up ----

// The built-in data lives in $DSC_DATA_HOME, else $XDG_CACHE_HOME/dsc, else ~/.cache/dsc. Rank 0
// (or whichever process gets there first) builds it in a private folder and renames it into
// place, so ranks starting together never see a half-written data set; the others wait for it.
static dsc_status default_data(trainer *t) {
    const char *home = dsc_env("DSC_DATA_HOME"), *xdg = getenv("XDG_CACHE_HOME");
    char root[4000];
    if (home && home[0]) snprintf(root, sizeof root, "%s", home);
    else if (xdg && xdg[0]) snprintf(root, sizeof root, "%s/dsc", xdg);
    else snprintf(root, sizeof root, "%s/.cache/dsc", getenv("HOME") ? getenv("HOME") : ".");
    snprintf(t->data_dir, sizeof t->data_dir, "%s/default-data", root);
    char probe[4200], tmp[4200];
    snprintf(probe, sizeof probe, "%s/dataset.json", t->data_dir);
    struct stat sb;
    if (stat(probe, &sb) == 0) return DSC_OK;
    const char *rank = getenv("RANK");
    if (rank && strcmp(rank, "0") != 0) { // another rank builds it: wait up to 5 minutes
        for (int i = 0; i < 3000 && stat(probe, &sb) != 0; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
        if (stat(probe, &sb) == 0) return DSC_OK;
        return dsc_fail(DSC_ERR_TIMEOUT, "rank %s: rank 0 did not build %s within 5 minutes", rank, t->data_dir);
    }
    DSC_TRY(dsc_mkdirs(root));
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", t->data_dir, (int)getpid());
    DSC_TRY(dsc_mkdirs(tmp));
    printf("building the default data set in %s\n", t->data_dir);
    DSC_TRY(dsc_data_default(tmp, NULL));
    if (rename(tmp, t->data_dir) != 0 && stat(probe, &sb) != 0)
        return dsc_fail(DSC_ERR_IO, "cannot move %s to %s: %s", tmp, t->data_dir, strerror(errno));
    if (stat(tmp, &sb) == 0) { // someone else won the race: drop ours
        char cmd[8600];
        snprintf(cmd, sizeof cmd, "%s/train.bin", tmp), unlink(cmd);
        snprintf(cmd, sizeof cmd, "%s/val.bin", tmp), unlink(cmd);
        snprintf(cmd, sizeof cmd, "%s/dataset.json", tmp), unlink(cmd);
        rmdir(tmp);
    }
    return DSC_OK;
}

// The data's dataset.json in *out (NULL when there is none). One that is there must be read: a
// file that is not valid JSON (or not a JSON object) would otherwise pass for an absent one, and
// the model would be built with GPT-2's vocabulary.
static dsc_status read_dataset_json(const char *path, json_t **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return DSC_OK;
    FILE *f;
    DSC_TRY(dsc_fopen_regular(path, &f));
    json_error_t e;
    json_t *j = json_loadf(f, 0, &e);
    fclose(f);
    if (!j)
        return dsc_fail(DSC_ERR_CORRUPT, "%s:%d:%d: not valid JSON: %s; fix the file, or prepare "
                        "the data again with `dsc data prepare`", path, e.line, e.column, e.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return dsc_fail(DSC_ERR_CORRUPT, "%s: expected a JSON object such as {\"tokenizer\": "
                        "\"byte\", \"vocab_size\": 256}; fix the file, or prepare the data again "
                        "with `dsc data prepare`", path);
    }
    *out = j;
    return DSC_OK;
}

// dataset.json names the tokenizer; shards without one are taken as GPT-2 tokens (llm.c's).
static dsc_status open_tokenizer(trainer *t, int *vocab) {
    *vocab = 50257; // GPT-2's, unless dataset.json says otherwise
    char path[4200];
    snprintf(path, sizeof path, "%s/dataset.json", t->data_dir);
    json_t *j;
    DSC_TRY(read_dataset_json(path, &j));
    const char *spec = j ? json_string_value(json_object_get(j, "tokenizer")) : NULL;
    json_t *vs = j ? json_object_get(j, "vocab_size") : NULL;
    // Range-checked before the narrowing: 2^32 + 256 would otherwise pass as 256.
    if (vs && (!json_is_integer(vs) || json_integer_value(vs) < 1 ||
               json_integer_value(vs) > INT32_MAX)) {
        char got[32] = "(not a whole number)";
        if (json_is_integer(vs))
            snprintf(got, sizeof got, "%lld", (long long)json_integer_value(vs));
        json_decref(j);
        return dsc_fail(DSC_ERR_CONFIG, "%s: vocab_size %s is out of range: it must be a whole "
                        "number from 1 to %d (token ids are 32-bit); fix it or prepare the data "
                        "again with `dsc data prepare`", path, got, INT32_MAX);
    }
    if (vs) *vocab = (int)json_integer_value(vs);
    // The tokenizer only serves the closing sample: without it (e.g. GPT-2 files moved away)
    // training goes on and the sample is left out.
    if (spec && dsc_tokenizer_create(&t->tok, spec) != DSC_OK) {
        fprintf(stderr, "note: tokenizer %s unavailable (%s); no text sample at the end\n", spec,
                dsc_last_error());
        t->tok = NULL;
    }
    json_decref(j);
    return DSC_OK;
}

static dsc_status open_data(trainer *t, int *vocab) {
    const train_opts *o = t->o;
    if (o->data) snprintf(t->data_dir, sizeof t->data_dir, "%s", o->data);
    else DSC_TRY(default_data(t));
    DSC_TRY(open_tokenizer(t, vocab));
    dsc_loader_opts lo = {.path = t->data_dir, .split = "train", .T = t->T,
                          .seed = (uint64_t)o->seed, .shuffle = true, .prefetch = 1,
                          .restart_positions = o->restart_positions};
    DSC_TRY(dsc_loader_create(&t->train, &lo));
    lo.split = "val";
    lo.shuffle = false;
    lo.prefetch = 0;
    if (dsc_loader_create(&t->val, &lo) != DSC_OK) {
        printf("note: no validation split in %s (%s); skipping validation\n", t->data_dir,
               dsc_last_error());
        t->val = NULL;
    }
    int maxtok = dsc_loader_max_token(t->train);
    if (maxtok >= *vocab)
        return dsc_fail(DSC_ERR_INVALID_ARG, "data %s holds token id %d but the vocabulary has "
                        "%d entries; fix vocab_size in dataset.json or prepare the data again",
                        t->data_dir, maxtok, *vocab);
    t->target_tokens = dsc_loader_masked(t->train) ? 0 : -1;
    return DSC_OK;
}

static void print_warning(void *user, const char *msg) { fprintf(stderr, "warning: %s\n", msg); }

// A model with a shape of its own (--model hf:DIR) must take the data's tokens and sequences.
static dsc_status check_model_fits(const trainer *t, int vocab) {
    const dsc_model_info *mi = dsc_model_describe(t->model);
    if (t->T > mi->max_seq_len)
        return dsc_fail(DSC_ERR_INVALID_ARG, "--seq-len %d is longer than model %s's context "
                        "(%d positions); give --seq-len %d or less", t->T, t->o->model,
                        mi->max_seq_len, mi->max_seq_len);
    if (vocab > mi->vocab_size)
        return dsc_fail(DSC_ERR_INVALID_ARG, "data %s has a vocabulary of %d tokens but model %s "
                        "has %d; prepare the data with the model's tokenizer (dsc data prepare "
                        "--tokenizer ...)", t->data_dir, vocab, t->o->model, mi->vocab_size);
    return DSC_OK;
}

// --init-weights FILE|DIR|hf:DIR|none; with --model hf:DIR and no --init-weights, DIR's weights.
static const char *weights_path(const trainer *t) {
    const char *p = t->o->init_weights;
    if (!p) return dsc_model_hf_dir(t->model);
    if (!strcmp(p, "none")) return NULL;
    return strncmp(p, "hf:", 3) ? p : p + 3;
}

// Weights from a file, and a LoRA run's (whose frozen base would otherwise be staged whole on every
// rank, defeating its partition at ZeRO stage 3), go straight into each rank's partition; the
// initialiser's values of a full fine-tune go through the engine's staging copy.
static bool init_in_place(const trainer *t) {
    return weights_path(t) != NULL || dsc_model_lora_of(t->model) != NULL;
}

// The built-in config's text (into buf) when --config is not given; NULL otherwise.
static const char *default_config(const train_opts *o, char *buf, size_t cap) {
    if (o->config) return NULL;
    // DeepSpeed warms up over at least 2 steps and needs total > warm-up.
    long long warm = o->max_steps / 10 > 2 ? o->max_steps / 10 : 2;
    long long total = o->max_steps > warm ? o->max_steps : warm + 1;
    snprintf(buf, cap, default_config_fmt, warm, total);
    return buf;
}

// A LoRA run's files name tensors as PEFT's adapter file does.
static dsc_status lora_names(trainer *t) {
    int n = dsc_model_describe(t->model)->num_tensors;
    t->peft_names = calloc((size_t)n, sizeof *t->peft_names);
    if (!t->peft_names) return dsc_fail(DSC_ERR_OOM, "out of memory for the tensor names");
    for (int i = 0; i < n; i++) cli_peft_name(t->model, i, t->peft_names[i], sizeof t->peft_names[i]);
    return DSC_OK;
}

// The memory plan, before the engine allocates anything: the run is refused here, with the
// numbers and the settings that would fit, when it would not fit this machine. The config is
// read here, once, with its warnings; the engine gets the parsed copy (a config given as a pipe,
// <(...), can be read only once).
static dsc_status plan_memory(trainer *t, bool cuda, int world) {
    dsc_config *cfg = &t->cfg;
    char json[1024];
    const char *text = default_config(t->o, json, sizeof json);
    dsc_status st = text ? dsc_config_load_string(cfg, text, world, print_warning, NULL)
                         : dsc_config_load_file_text(cfg, t->o->config, world, print_warning,
                                                     NULL, &t->cfg_text);
    if (st != DSC_OK) return st;
    if (text && !(t->cfg_text = strdup(text)))
        return dsc_fail(DSC_ERR_OOM, "out of memory for the config's text");
    DSC_TRY(cli_plan_device_ok(cfg, cuda, world));
    DSC_TRY(cli_activation_checkpointing(t->model, cfg, cuda, print_warning));
    DSC_TRY(cli_fp8(t->model, cfg, cuda));
    const char *rank = getenv("RANK"); // the engine is not made yet: each rank its own masks
    st = cli_lora(t->model, cfg, cuda, t->o->init_adapter,
                  (uint64_t)t->o->seed * 1000003u + (rank ? strtoull(rank, NULL, 10) : 0));
    if (st != DSC_OK) return st;
    if (dsc_model_lora_of(t->model)) DSC_TRY(lora_names(t));
    cli_plan_opts po = {.model = t->model, .cfg = cfg, .world = world, .seq_len = t->T,
                        .device = cuda, .init_in_place = init_in_place(t),
                        .checkpoints = t->o->save_dir || dsc__train_ckpt_key(cfg),
                        .measure_runtime = true};
    st = cli_memory_plan(&po, true, &t->plan);
    if (st != DSC_OK) { // the message is the plan's; name the model too
        char why[2048];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        dsc_fail(st, "--model %s: %s", t->o->model, why);
    }
    return st;
}

// device_model: one rank whose model lives on a GPU, which keeps its own 16-bit weights, so the
// engine needs no host compute copy of them.
static dsc_status build_engine(trainer *t, bool device_model) {
    dsc_engine_opts eo = {.warn = print_warning, .no_compute_copy = device_model,
                          .device_grads = device_model, .device_state = device_model,
                          .init_in_place = init_in_place(t)};
    eo.config = &t->cfg; // read by plan_memory
    t->ntensors = dsc_model_describe(t->model)->num_tensors;
    dsc_param_desc *pd = calloc((size_t)t->ntensors, sizeof *pd);
    if (!pd) return dsc_fail(DSC_ERR_OOM, "out of memory for the parameter table");
    dsc_model_param_descs(t->model, pd);
    eo.params = pd;
    eo.nparams = t->ntensors;
    dsc_status st = dsc_engine_create(&t->eng, &eo);
    free(pd);
    return st;
}

// Initial weights from a file of Hugging Face weights (one safetensors file, a folder, or a
// sharded index), read slice by slice straight into each rank's partition (dsc_params_init), so
// that no rank holds the whole model.
typedef struct weight_source {
    trainer *t;
    const char *what; // the path, for messages
    dsc_hf_weights *file;
    dsc_hf_weights *adapter; // --init-adapter's adapter_model.safetensors, or NULL
} weight_source;

// The file's name for tensor i: its own, or with GPT2LMHeadModel's "transformer." prefix.
static dsc_status find_tensor(weight_source *w, const dsc_model_param *p, char *name, size_t cap) {
    snprintf(name, cap, "%s", p->name);
    if (!dsc_hf_weights_has(w->file, name)) snprintf(name, cap, "transformer.%s", p->name);
    if (!dsc_hf_weights_has(w->file, name))
        return dsc_fail(DSC_ERR_INVALID_ARG, "--init-weights %s: tensor %s is missing", w->what,
                        p->name);
    dsc_hf_tensor x;
    DSC_TRY(dsc_hf_weights_info(w->file, name, &x));
    bool same = x.ndim == p->ndim && x.numel == p->numel;
    for (int d = 0; same && d < p->ndim; d++) same = x.shape[d] == p->shape[d];
    if (!same)
        return dsc_fail(DSC_ERR_INVALID_ARG, "--init-weights %s: tensor %s has %lld elements "
                        "(shape[0] %lld), the model expects %lld (shape[0] %lld); check --model "
                        "and the vocabulary", w->what, p->name, (long long)x.numel,
                        (long long)x.shape[0], (long long)p->numel, (long long)p->shape[0]);
    return DSC_OK;
}

// A LoRA adapter's tensor: from --init-adapter's file (PEFT's names), else as PEFT initialises.
static dsc_status fill_adapter(trainer *t, dsc_hf_weights *adapter, int i, int64_t begin,
                               int64_t count, float *dst) {
    if (!adapter) {
        dsc_model_init_tensor(t->model, i, dst, begin, count, (uint64_t)t->o->seed);
        return DSC_OK;
    }
    const char *name = t->peft_names[i];
    if (!dsc_hf_weights_has(adapter, name))
        return dsc_fail(DSC_ERR_INVALID_ARG, "--init-adapter %s: tensor %s is missing (the adapter "
                        "was made for another model or other target_modules)", t->o->init_adapter,
                        name);
    dsc_hf_tensor x;
    DSC_TRY(dsc_hf_weights_info(adapter, name, &x));
    const dsc_model_param *p = dsc_model_param_get(t->model, i);
    if (x.ndim != 2 || x.shape[0] != p->shape[0] || x.shape[1] != p->shape[1])
        return dsc_fail(DSC_ERR_INVALID_ARG, "--init-adapter %s: tensor %s is %lld x %lld, the "
                        "model's is %lld x %lld (another r or another base model)",
                        t->o->init_adapter, name, (long long)x.shape[0],
                        (long long)(x.ndim > 1 ? x.shape[1] : 0), (long long)p->shape[0],
                        (long long)p->shape[1]);
    return dsc_hf_weights_read(adapter, name, begin, count, dst);
}

static dsc_status fill_weights(void *user, int i, int64_t begin, int64_t count, float *dst) {
    weight_source *w = user;
    if (dsc_lora_base_of(dsc_model_lora_of(w->t->model), i) >= 0)
        return fill_adapter(w->t, w->adapter, i, begin, count, dst);
    if (w->adapter && w->t->peft_names && !dsc_model_param_get(w->t->model, i)->frozen &&
        dsc_hf_weights_has(w->adapter, w->t->peft_names[i])) // modules_to_save, as saved
        return dsc_hf_weights_read(w->adapter, w->t->peft_names[i], begin, count, dst);
    if (!w->file) { // the model's own initialiser (counter-based: any slice alike)
        dsc_model_init_tensor(w->t->model, i, dst, begin, count, (uint64_t)w->t->o->seed);
        return DSC_OK;
    }
    char name[DSC_PARAM_NAME_MAX + 16];
    DSC_TRY(find_tensor(w, dsc_model_param_get(w->t->model, i), name, sizeof name));
    return dsc_hf_weights_read(w->file, name, begin, count, dst);
}


static dsc_status init_weights(trainer *t) {
    weight_source w = {.t = t, .what = weights_path(t)};
    dsc_status st = DSC_OK;
    if (t->o->init_adapter) {
        char path[4200];
        snprintf(path, sizeof path, "%s/adapter_model.safetensors", t->o->init_adapter);
        st = dsc_hf_weights_open(&w.adapter, path);
        if (st != DSC_OK) return dsc_fail(st, "--init-adapter %s: %s", t->o->init_adapter,
                                          dsc_last_error());
    }
    if (w.what) st = dsc_hf_weights_open(&w.file, w.what);
    // in place, or with the state on the device (no host master: sent there in pieces), the
    // engine asks for each rank's slices (the model's initialiser gives any slice alike)
    if (st == DSC_OK && (init_in_place(t) || dsc_engine_state_on_device(t->eng))) {
        st = dsc_params_init(t->eng, fill_weights, &w);
    } else if (st == DSC_OK) { // the engine's staging copy, whole tensors
        for (int i = 0; i < t->ntensors && st == DSC_OK; i++) {
            const dsc_model_param *p = dsc_model_param_get(t->model, i);
            st = fill_weights(&w, i, 0, p->numel, dsc_param_master(t->eng, i));
        }
        if (st == DSC_OK) st = dsc_params_updated(t->eng);
    }
    dsc_hf_weights_close(w.file);
    dsc_hf_weights_close(w.adapter);
    DSC_TRY(st);
    for (int i = 0; i < t->ntensors; i++) {
        t->tgroup[i] = dsc_model_param_get(t->model, i)->group;
        t->work[i] = dsc_param_data(t->eng, i);
        t->grads[i] = dsc_param_grad(t->eng, i);
    }
    return DSC_OK;
}

// Matrix-product throughput of this machine with every thread busy: MFU's denominator on CPU.
// Each thread times its own products (no barrier inside a timing, so one late thread does not
// spoil a round) and keeps its best of at least 8 over at least 0.1 s, after an untimed one that
// faults the pages in; the peak is the sum. Still approximate on a machine shared with other
// work (the start line and the progress line say so).
static double measure_cpu_peak(void) {
    enum { N = 384, MIN_REPS = 8, MAX_REPS = 200 };
    int nthreads = 1;
#ifdef _OPENMP
    nthreads = omp_get_max_threads();
#endif
    float *buf = malloc((size_t)nthreads * 3 * N * N * sizeof(float));
    double *rate = calloc((size_t)nthreads, sizeof *rate);
    if (!buf || !rate) {
        free(buf);
        free(rate);
        return 0;
    }
#pragma omp parallel num_threads(nthreads)
    {
        int id = 0;
#ifdef _OPENMP
        id = omp_get_thread_num();
#endif
        float *a = buf + (size_t)id * 3 * N * N, *b = a + N * N, *c = b + N * N;
        for (size_t k = 0; k < 3 * (size_t)N * N; k++) a[k] = (float)(k % 7) * 0.125f;
        double start = dsc_now();
        for (int r = 0; r <= MAX_REPS; r++) {
            double t0 = dsc_now();
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, N, N, 1.0f, a, N, b, N,
                        0.0f, c, N);
            double x = 2.0 * N * N * N / (dsc_now() - t0);
            if (r > 0 && x > rate[id]) rate[id] = x; // round 0 only warms up
            if (r >= MIN_REPS && dsc_now() - start >= 0.1) break;
        }
    }
    double best = 0;
    for (int i = 0; i < nthreads; i++) best += rate[i];
    free(rate);
    free(buf);
    return best;
}

// DSC_RESTART_COUNT: 0 (or unset) on a first start, K on dsc launch's K-th restart.
static long restart_count(void) {
    const char *s = dsc_env("DSC_RESTART_COUNT");
    return s ? strtol(s, NULL, 10) : 0;
}

static dsc_status open_run_dir(trainer *t, char *out, size_t cap) {
    if (t->o->out) {
        snprintf(out, cap, "%s", t->o->out);
    } else {
        char stamp[64];
        time_t now = time(NULL);
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
        snprintf(out, cap, "runs/%s", stamp);
    }
    DSC_TRY(dsc_mkdirs(out));
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    // A resumed or restarted run continues the file; its first line says so ("resumed": true).
    struct stat sb;
    bool append = t->o->resume || restart_count() > 0;
    t->mark_resume = append && stat(path, &sb) == 0 && sb.st_size > 0;
    t->metrics = fopen(path, append ? "a" : "w");
    if (!t->metrics) return dsc_fail(DSC_ERR_IO, "cannot write %s: %s", path, strerror(errno));
    return DSC_OK;
}

// ---- the steps ----

static dsc_status micro_step(trainer *t, int64_t step, int micro, float *loss) {
    int64_t first = ((step - 1) * t->gas + micro) * (int64_t)t->B * t->world + (int64_t)t->rank * t->B;
    size_t off = (size_t)micro * t->B * t->T;
    int32_t *in = t->in + off, *tg = t->tg + off, *pos = t->pos ? t->pos + off : NULL;
    DSC_TRY(dsc_loader_get_pos(t->train, first, t->B, in, tg, pos));
    if (t->gpu) {
        if (t->pos) DSC_TRY(dsc_device_trainer_positions(t->gpu, pos));
        return dsc_device_trainer_micro(t->gpu, in, tg, t->B, t->T, loss, &t->cur.fwd, &t->cur.bwd);
    }
    dsc_model_hooks h = {t, hook_gather, hook_release, hook_ready};
    double t0 = dsc_now();
    DSC_TRY(dsc_model_forward_pos(t->model, t->work, in, pos, tg, t->B, t->T, &h, loss));
    double t1 = dsc_now();
    t->cur.fwd += t1 - t0;
    DSC_TRY(dsc_backward_begin(t->eng));
    dsc_status st = dsc_model_backward(t->model, t->work, t->grads,
                                       (float)dsc_backward_scale(t->eng), &h);
    t->cur.bwd += dsc_now() - t1;
    return st;
}

// Validation loss: each rank evaluates its share of the batches (every rank runs the same number
// of forwards, which ZeRO-3's gathers need), then the mean over ranks.
static dsc_status evaluate(trainer *t, double *out) {
    int64_t avail = dsc_loader_num_samples(t->val) / t->B;
    int64_t batches = t->o->eval_batches < avail ? t->o->eval_batches : avail;
    int64_t per = batches / t->world > 0 ? batches / t->world : 1;
    dsc_model_hooks h = {t, hook_gather, hook_release, NULL};
    double sum = 0;
    dsc_status st = DSC_OK;
    dsc_model_set_training(t->model, false); // no dropout in evaluation
    for (int64_t k = 0; k < per && st == DSC_OK; k++) {
        float loss = 0;
        int64_t b = (k * t->world + t->rank) % (avail > 0 ? avail : 1);
        st = dsc_loader_get_pos(t->val, b * t->B, t->B, t->in, t->tg, t->pos);
        if (st == DSC_OK && t->gpu && t->pos) st = dsc_device_trainer_positions(t->gpu, t->pos);
        if (st == DSC_OK && t->gpu)
            st = dsc_device_trainer_loss(t->gpu, t->in, t->tg, t->B, t->T, &loss);
        else if (st == DSC_OK)
            st = dsc_model_forward_pos(t->model, t->work, t->in, t->pos, t->tg, t->B, t->T, &h,
                                       &loss);
        sum += loss;
    }
    dsc_model_set_training(t->model, true);
    DSC_TRY(st);
    *out = sum / (double)per;
    return dsc_engine_mean(t->eng, out, 1);
}

// fault_tolerance asks for a restart after the survivors restored the last complete step
// together: save it (when checkpointing runs) so that the restarted job loses nothing.
static void emergency_checkpoint(trainer *t, dsc_status failed) {
    char why[2048];
    snprintf(why, sizeof why, "%s", dsc_last_error());
    dsc_status st = dsc_save_checkpoint(t->eng, NULL);
    if (st == DSC_OK) st = dsc_checkpoint_wait(t->eng);
    if (st == DSC_OK) fprintf(stderr, "dsc train: saved an emergency checkpoint of step %lld\n", (long long)dsc_engine_global_steps(t->eng));
    else fprintf(stderr, "dsc train: no emergency checkpoint: %s\n", dsc_last_error());
    dsc_fail(failed, "%s", why); // the restart's reason stays the error
}

// A step failed: the engine applies fault_tolerance.on_failure. When it continues (on the
// survivors, or on a fresh communicator), take the new rank, world, batch split and parameter
// pointers, and set *step so that the loop runs the step the engine resumes at.
static dsc_status recover_step(trainer *t, dsc_status failed, int64_t *step) {
    if (t->gpu) { // the device's part of the step ends first; the fault's message stays the error
        char why[2048];
        snprintf(why, sizeof why, "%s", dsc_last_error());
        dsc_device_trainer_fault(t->gpu);
        dsc_fail(failed, "%s", why);
    }
    dsc_ft_report rep;
    dsc_status st = dsc_engine_recover(t->eng, failed, &rep);
    if (st != DSC_OK) {
        if (rep.action == DSC_FT_RESTART) t->exit_code = DSC_FT_EXIT_RESTART;
        if (rep.action == DSC_FT_RESTART && !t->save_dir) // the engine's error asks for a restart
            fprintf(stderr, "dsc train: this run keeps no checkpoints (give --save-dir DIR): a "
                    "restart begins again at step 1\n");
        else if (rep.action == DSC_FT_RESTART && rep.consistent)
            emergency_checkpoint(t, st);
        return st;
    }
    const dsc_config *cfg = dsc_engine_config(t->eng);
    int B = (int)cfg->train_micro_batch_size_per_gpu, gas = (int)cfg->gradient_accumulation_steps;
    if (gas * B > t->gas * t->B) { // more micro-steps per rank: room for one step's tokens
        int32_t *in = realloc(t->in, (size_t)gas * B * t->T * sizeof *in);
        if (in) t->in = in;
        int32_t *tg = realloc(t->tg, (size_t)gas * B * t->T * sizeof *tg);
        if (tg) t->tg = tg;
        int32_t *pos = t->pos ? realloc(t->pos, (size_t)gas * B * t->T * sizeof *pos) : NULL;
        if (pos) t->pos = pos;
        if (!in || !tg || (t->pos && !pos)) return dsc_fail(DSC_ERR_OOM, "out of memory");
    }
    t->B = B;
    t->gas = gas;
    t->rank = dsc_engine_rank(t->eng);
    t->world = dsc_engine_world_size(t->eng);
    if (t->gpu) { // the restored state goes up; the ranks' share of the device may have grown
        DSC_TRY(dsc_device_trainer_recovered(t->gpu, t->B));
        dsc_device_trainer_describe(t->gpu, &t->peak_flops);
    }
    dsc_loader_set_stride(t->train, (int64_t)t->B * t->world);
    for (int i = 0; i < t->ntensors; i++) {
        t->work[i] = dsc_param_data(t->eng, i);
        t->grads[i] = dsc_param_grad(t->eng, i);
    }
    if (t->rank == 0 && !t->metrics && t->o->out) { // rank 0 was lost: this rank writes on
        char path[4200];
        snprintf(path, sizeof path, "%s/metrics.jsonl", t->o->out);
        t->metrics = fopen(path, "a");
    }
    *step = rep.resume_step - 1; // the loop's increment makes it the resumed step
    return DSC_OK;
}

// ---- checkpoints: --save-dir, --resume, --save-at-end, SIGUSR1 ----

static volatile sig_atomic_t stop_signal; // SIGUSR1 (e.g. preemption): save and stop

static void on_stop_signal(int sig) { stop_signal = 1; }

// Mean validation loss over the ranks with whole weights given directly (no gathers), on the
// batches evaluate() uses.
static dsc_status val_loss_with(trainer *t, float *const *params, double *out) {
    int64_t avail = dsc_loader_num_samples(t->val) / t->B;
    int64_t batches = t->o->eval_batches < avail ? t->o->eval_batches : avail;
    int64_t per = batches / t->world > 0 ? batches / t->world : 1;
    double sum = 0;
    dsc_status st = DSC_OK;
    dsc_model_set_training(t->model, false); // no dropout in evaluation
    for (int64_t k = 0; k < per && st == DSC_OK; k++) {
        float loss = 0;
        int64_t b = (k * t->world + t->rank) % (avail > 0 ? avail : 1);
        st = dsc_loader_get_pos(t->val, b * t->B, t->B, t->in, t->tg, t->pos);
        if (st == DSC_OK)
            st = dsc_model_forward_pos(t->model, params, t->in, t->pos, t->tg, t->B, t->T, NULL,
                                       &loss);
        sum += loss;
    }
    dsc_model_set_training(t->model, true);
    DSC_TRY(st);
    *out = sum / (double)per;
    return dsc_engine_mean(t->eng, out, 1);
}

static void free_weights(float **w, int n) {
    for (int i = 0; w && i < n; i++) free(w[i]);
    free(w);
}

// The weights as the model computes with them: under fp16/bf16 the engine rounds its fp32
// master weights to the 16-bit type (dsc_param_data), and a checkpoint holds the masters; rounded
// the same way here, their validation loss is the number the step's "validation loss" line
// printed for the same state, not one a few units off in the last digits. *out: NULL in fp32
// (use w as it is), else n rounded copies (caller frees with free_weights).
static dsc_status rounded_weights(trainer *t, const float *const *w, int n, float ***out) {
    const dsc_config *cfg = dsc_engine_config(t->eng);
    *out = NULL;
    if (!cfg->fp16.enabled && !cfg->bf16.enabled) return DSC_OK;
    float **r = calloc((size_t)n, sizeof *r);
    for (int i = 0; r && i < n; i++) {
        size_t numel = (size_t)dsc_model_param_get(t->model, i)->numel;
        if (!(r[i] = malloc(numel * sizeof(float)))) break;
        for (size_t k = 0; k < numel; k++)
            r[i][k] = cfg->fp16.enabled ? dsc_fp16_to_fp32(dsc_fp32_to_fp16(w[i][k]))
                                        : dsc_bf16_to_fp32(dsc_fp32_to_bf16(w[i][k]));
    }
    *out = r;
    if (r && (n == 0 || r[n - 1])) return DSC_OK;
    free_weights(r, n);
    *out = NULL;
    return dsc_fail(DSC_ERR_OOM, "out of memory validating a checkpoint (a rounded copy of the "
                    "weights); set checkpoint.validate false to skip the check");
}

// The validation loss of the weights w, as the model computes with them.
static dsc_status val_loss_of(trainer *t, const float *const *w, int n, double *out) {
    float **r;
    DSC_TRY(rounded_weights(t, w, n, &r));
    dsc_status st = val_loss_with(t, r ? r : (float *const *)w, out);
    free_weights(r, n);
    return st;
}

// The trainer's checkpoint validation: the weights read back from the files must equal the
// training state that was saved, bit for bit, and give the same validation loss.
static dsc_status ckpt_validate(void *user, dsc_engine *eng, const dsc_ckpt_validation *v,
                                bool *ok, char *why, size_t cap) {
    trainer *t = user;
    int differ = -1;
    for (int i = 0; i < v->nparams && differ < 0; i++) {
        size_t bytes = (size_t)dsc_model_param_get(t->model, i)->numel * sizeof(float);
        if (memcmp(v->live[i], v->loaded[i], bytes) != 0) differ = i;
    }
    double live = NAN, loaded = NAN;
    bool by_loss = t->val && !t->gpu; // --device cuda has no CPU model: the bitwise check only
    if (by_loss) {
        DSC_TRY(val_loss_of(t, v->loaded, v->nparams, &loaded));
        DSC_TRY(val_loss_of(t, v->live, v->nparams, &live));
    }
    *ok = differ < 0 && (!by_loss || (isfinite(loaded) && loaded == live));
    if (differ >= 0) snprintf(why, cap, "tensor %s read back differs from the saved state",
                              dsc_model_param_get(t->model, differ)->name);
    else if (!*ok) snprintf(why, cap, "validation loss %.9g of the saved weights, %.9g of the "
                            "training state", loaded, live);
    else if (t->rank == 0 && by_loss)
        printf("checkpoint %s validated: validation loss %.4f, as the training state's\n",
               v->tag, loaded);
    return DSC_OK;
}

// What a DeepSpeed checkpoint gave the run, and what it could not: DeepSpeed keeps no position in
// the data (only its count of samples), so the batches continue in dsc's order for the step.
static void print_ds_resume(trainer *t, const char *dir, const char *tag) {
    dsc_ds_ckpt *ds;
    if (dsc_ds_ckpt_open(&ds, dir, tag) != DSC_OK) return;
    dsc_ds_ckpt_info in;
    dsc_ds_ckpt_state st;
    dsc_ds_ckpt_get_info(ds, &in);
    dsc_ds_ckpt_get_state(ds, &st);
    long long step = (long long)dsc_engine_global_steps(t->eng);
    printf("DeepSpeed checkpoint (ZeRO-%d, %d ranks, %s): fp32 master weights and Adam moments of "
           "%d tensors, step %lld (%lld skipped), learning-rate schedule continued",
           in.zero_stage, in.world_size, in.precision, in.nparams, step,
           (long long)in.skipped_steps);
    if (st.dynamic_scale && dsc_engine_config(t->eng)->fp16.enabled)
        printf(", loss scale %g", st.cur_scale);
    printf("\nDeepSpeed saves no data position (global_samples %lld): the data continues with "
           "dsc's batches for step %lld\n", (long long)in.global_samples, step + 1);
    dsc_ds_ckpt_close(ds);
}

// A LoRA checkpoint's adapters belong to the base they were trained on: its checksums (when the
// checkpoint has them) must be this run's.
static dsc_status check_base(trainer *t, const char *dir, const char *tag) {
    dsc_ckpt *ck = NULL;
    if (dsc_ds_ckpt_detect(dir, tag) || dsc_ckpt_open(&ck, dir, tag) != DSC_OK) return DSC_OK;
    char path[4200], what[4096 + DSC_CKPT_TAG_MAX + 2];
    dsc_status st = DSC_OK;
    snprintf(what, sizeof what, "%s/%s", dir, tag);
    if (dsc_ckpt_attachment_path(ck, "base_checksums.json", path, sizeof path))
        st = cli_base_check(path, t->base_sums, what);
    dsc_ckpt_close(ck);
    return st;
}

static dsc_status ckpt_resume(trainer *t) {
    const char *resume = t->o->resume ? t->o->resume : ""; // "": a restart, from the latest
    const char *dir = t->save_dir, *tag = resume[0] ? resume : NULL;
    char d[4096], tg[DSC_CKPT_TAG_MAX], loaded[DSC_CKPT_TAG_MAX];
    struct stat sb;
    if (tag && stat(tag, &sb) == 0 && S_ISDIR(sb.st_mode)) { // DIR or DIR/TAG
        bool has;
        DSC_TRY(dsc_ckpt_split_path(tag, d, sizeof d, tg, sizeof tg, &has));
        dir = d;
        tag = has ? tg : NULL;
    }
    if (!dir)
        return dsc_fail(DSC_ERR_INVALID_ARG, "--resume %s: give --save-dir DIR, or the "
                        "checkpoint's path (DIR or DIR/TAG)", resume);
    bool none;
    DSC_TRY(dsc_resume_checkpoint(t->eng, dir, tag, loaded, sizeof loaded, &none));
    if (!none && t->base_sums) DSC_TRY(check_base(t, dir, loaded));
    for (int i = 0; i < t->ntensors; i++) {
        t->work[i] = dsc_param_data(t->eng, i);
        t->grads[i] = dsc_param_grad(t->eng, i);
    }
    if (t->rank != 0) return DSC_OK;
    if (none) printf("--resume: no checkpoint in %s yet; starting from step 0\n", dir);
    else printf("resumed from checkpoint %s/%s: continuing after step %lld\n", dir, loaded,
                (long long)dsc_engine_global_steps(t->eng));
    if (!none && dsc_ds_ckpt_detect(dir, tag)) print_ds_resume(t, dir, tag);
    return DSC_OK;
}

// A file attached as it is under name; one that is absent is skipped.
static dsc_status attach_file(trainer *t, const char *path, const char *name) {
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT) return DSC_OK;
    FILE *f;
    DSC_TRY(dsc_fopen_regular(path, &f)); // a FIFO in its place would hang the save
    char *buf = NULL;
    size_t cap = 0, n = 0;
    for (size_t got = 1; got > 0; n += got) {
        if (n == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 65536))) break;
        got = fread(buf + n, 1, cap - n, f);
    }
    fclose(f);
    dsc_status st = buf ? dsc_checkpoint_attach(t->eng, name, buf, n)
                        : dsc_fail(DSC_ERR_OOM, "out of memory reading %s", path);
    free(buf);
    return st;
}

// The run's tokenizer files travel with every checkpoint (dsc generate --checkpoint finds them,
// dsc ckpt export --hf puts them in the folder).
static dsc_status ckpt_attach_tokenizer(trainer *t) {
    dsc_tokenizer_file files[DSC_TOKENIZER_MAX_FILES];
    int n = t->tok ? dsc_tokenizer_files(t->tok, files) : 0;
    for (int i = 0; i < n; i++) DSC_TRY(attach_file(t, files[i].path, files[i].name));
    return DSC_OK;
}

// The model's config.json and generation_config.json travel with every checkpoint, so that
// `dsc ckpt export --hf` makes a folder transformers loads: a Hugging Face folder's own files
// (--model hf:DIR; its config.json in both transformers spellings, so that 4.x and 5.x load the
// export alike), else what the family writes for its shape (none: nothing is attached).
static dsc_status ckpt_attach_model(trainer *t) {
    DSC_TRY(ckpt_attach_tokenizer(t));
    // The run's config as given: DeepSpeed's ds_config.json (dsc ckpt export --deepspeed).
    DSC_TRY(dsc_checkpoint_attach(t->eng, "ds_config.json", t->cfg_text, strlen(t->cfg_text)));
    if (dsc_model_lora_of(t->model)) { // a LoRA run: its adapter_config.json, naming the base,
        const char *dir = dsc_model_hf_dir(t->model); // and the base's checksums
        char base[4096], *text = NULL;
        if (!dir || !realpath(dir, base)) snprintf(base, sizeof base, "%s", dir ? dir : t->o->model);
        DSC_TRY(cli_adapter_config(t->model, base, &text));
        dsc_status st = dsc_checkpoint_attach(t->eng, "adapter_config.json", text, strlen(text));
        free(text);
        DSC_TRY(st);
        DSC_TRY(dsc_checkpoint_attach(t->eng, "base_checksums.json", t->base_sums,
                                      strlen(t->base_sums)));
    }
    const char *dir = dsc_model_hf_dir(t->model);
    char *cfg_json, *gen_json;
    dsc_status st = dsc_model_hf_config(t->model, &cfg_json, &gen_json);
    if (st != DSC_OK) return dir ? st : DSC_OK; // a folder's config.json must travel
    st = dsc_checkpoint_attach(t->eng, "config.json", cfg_json, strlen(cfg_json));
    if (st == DSC_OK && dir) {
        char path[4200];
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        st = attach_file(t, path, "generation_config.json");
    } else if (st == DSC_OK) {
        st = dsc_checkpoint_attach(t->eng, "generation_config.json", gen_json, strlen(gen_json));
    }
    free(cfg_json);
    free(gen_json);
    return st;
}

const char *dsc__train_ckpt_key(const dsc_config *cfg) {
    if (dsc_config_given(cfg, "checkpoint.interval_steps") && cfg->checkpoint.interval_steps > 0)
        return "checkpoint.interval_steps";
    if (dsc_config_given(cfg, "checkpoint.interval_s") && cfg->checkpoint.interval_s > 0)
        return "checkpoint.interval_s";
    if (!strcmp(cfg->fault_tolerance.on_failure, "restart"))
        return "fault_tolerance.on_failure restart";
    return NULL;
}

// The checkpoint directory: --save-dir; else, when the config asks for saves,
// <--out>/checkpoints. Without --out the run directory is chosen by rank 0 alone, so no place is
// common to the ranks: refuse.
static dsc_status ckpt_pick_dir(trainer *t) {
    const char *key = dsc__train_ckpt_key(dsc_engine_config(t->eng));
    t->save_dir = t->o->save_dir;
    if (t->save_dir || !key) return DSC_OK;
    if (!t->o->out)
        return dsc_fail(DSC_ERR_INVALID_ARG, "%s sets %s, but nothing would be saved: add "
                        "--save-dir DIR (or --out DIR, which keeps them in DIR/checkpoints)",
                        t->o->config ? t->o->config : "the config", key);
    snprintf(t->save_default, sizeof t->save_default, "%s/checkpoints", t->o->out);
    t->save_dir = t->save_default;
    if (t->rank == 0)
        printf("%s is set and --save-dir is not given: checkpoints go to %s\n", key, t->save_dir);
    return DSC_OK;
}

static dsc_status ckpt_setup(trainer *t) {
    DSC_TRY(ckpt_pick_dir(t));
    bool restarted = restart_count() > 0 && t->save_dir; // dsc launch restarted the job
    if (restarted && !t->o->resume && t->rank == 0)
        printf("restart %ld (DSC_RESTART_COUNT): resuming from the latest checkpoint in %s\n",
               restart_count(), t->save_dir);
    if (t->o->resume || restarted) DSC_TRY(ckpt_resume(t));
    if (!t->save_dir) {
        if (t->o->save_at_end) return dsc_fail(DSC_ERR_INVALID_ARG, "--save-at-end needs --save-dir DIR");
        return DSC_OK;
    }
    const dsc_config *cfg = dsc_engine_config(t->eng);
    dsc_ckpt_opts co;
    dsc_ckpt_opts_from_config(cfg, &co);
    co.background_snapshot = true; // the loop calls dsc_checkpoint_fence before each update
    DSC_TRY(dsc_checkpointing_start(t->eng, t->save_dir, &co));
    DSC_TRY(dsc_checkpointing_configure(t->eng, cfg->checkpoint.interval_s, ckpt_validate, t));
    DSC_TRY(ckpt_attach_model(t));
    struct sigaction sa = {.sa_handler = on_stop_signal, .sa_flags = SA_RESTART};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, NULL);
    if (t->rank == 0)
        printf("checkpoints in %s: every %lld steps / %g s%s%s; SIGUSR1 saves and stops\n",
               t->save_dir, (long long)cfg->checkpoint.interval_steps,
               cfg->checkpoint.interval_s, cfg->checkpoint.async ? ", async" : "",
               cfg->checkpoint.validate ? ", validated" : "");
    return DSC_OK;
}

// After each optimizer step, on every rank: periodic saves, completion of a save in flight,
// and the stop request of any rank.
static dsc_status ckpt_after_step(trainer *t) {
    dsc_ckpt_tick tick;
    DSC_TRY(dsc_checkpoint_step_end(t->eng, stop_signal != 0, &tick));
    t->ck_stop = tick.stop;
    if (t->rank == 0 && tick.stop)
        printf("stop requested: checkpoint %s saved at step %lld; continue with --resume\n",
               tick.tag, (long long)dsc_engine_global_steps(t->eng));
    fflush(stdout);
    return DSC_OK;
}

// At the end: --save-at-end, then complete the save in flight (or, after an error, only stop
// the writer).
static dsc_status ckpt_finish(trainer *t, dsc_status st) {
    if (!t->eng || !t->save_dir) return st;
    if (st == DSC_OK && t->o->save_at_end) st = dsc_save_checkpoint(t->eng, NULL);
    dsc_status st2 = dsc_checkpointing_stop(t->eng, st == DSC_OK);
    return st != DSC_OK ? st : st2;
}

// ---- observing the run: breakdown, flops profile, comms summary, progress, actions ----

// Before a step: zero its timers; at the flops profiler's step, time the model's modules too.
static dsc_status observe_begin(trainer *t, int64_t step) {
    const dsc_config *cfg = dsc_engine_config(t->eng);
    t->cur = (train_times){0};
    if (!cfg->flops_profiler.enabled || step != cfg->flops_profiler.profile_step) return DSC_OK;
    free(t->prof_times);
    t->prof_times = calloc((size_t)dsc_model_timing_slots(t->model), sizeof *t->prof_times);
    if (!t->prof_times) return dsc_fail(DSC_ERR_OOM, "out of memory for the flops profiler");
    dsc_model_set_timing(t->model, t->prof_times);
    return DSC_OK;
}

static dsc_status profile_report(trainer *t, int64_t step, double dt) {
    obs_profile p = {.model = t->model, .B = t->B, .T = t->T, .gas = t->gas, .world = t->world,
                     .step = step, .times = t->prof_times, .tt = t->cur, .iter_s = dt};
    obs_progress_clear();
    dsc_status st = obs_flops_report(dsc_engine_config(t->eng), &p);
    free(t->prof_times);
    t->prof_times = NULL;
    return st;
}

// After a step (dt seconds): the breakdown to the sinks and, every steps_per_print, to stdout;
// the flops profile at its step; with comms_logger.verbose the comms summary.
static dsc_status observe_end(trainer *t, int64_t step, int64_t samples, double dt) {
    const dsc_config *cfg = dsc_engine_config(t->eng);
    dsc_model_set_timing(t->model, NULL);
    t->cur.bwd_inner = t->cur.bwd - t->cur.bwd_allreduce;
    train_times *sp = &t->since_print;
    sp->fwd += t->cur.fwd, sp->bwd += t->cur.bwd, sp->bwd_inner += t->cur.bwd_inner;
    sp->bwd_allreduce += t->cur.bwd_allreduce, sp->step += t->cur.step;
    if (cfg->wall_clock_breakdown) DSC_TRY(obs_breakdown_log(t->mon, &t->cur, samples));
    if (t->prof_times && t->rank == 0) DSC_TRY(profile_report(t, step, dt));
    bool print_now = step % cfg->steps_per_print == 0;
    if (!print_now) return DSC_OK;
    if (t->rank == 0 && cfg->wall_clock_breakdown) {
        obs_progress_clear();
        obs_breakdown_print(sp);
    }
    *sp = (train_times){0};
    if (t->rank == 0 && cfg->comms_logger.verbose && step != t->o->max_steps) {
        obs_progress_clear();
        obs_comms_print(cfg, step);
    }
    return DSC_OK;
}

// monitor_actions that move or free pool memory run when no checkpoint copy reads it...
static dsc_status action_before(void *u, const char *action) {
    return dsc_checkpoint_fence(((trainer *)u)->eng);
}

// ... and then the parameter addresses the model holds are taken again.
static void action_after(void *u, const char *action, const char *metric, double value,
                         double threshold, size_t bytes) {
    trainer *t = u;
    for (int i = 0; i < t->ntensors; i++) {
        t->work[i] = dsc_param_data(t->eng, i);
        t->grads[i] = dsc_param_grad(t->eng, i);
    }
    if (t->rank != 0) return;
    obs_progress_clear();
    printf("monitor action %s: %s = %.6g rose above %g", action, metric, value, threshold);
    if (strcmp(action, "log") != 0)
        printf(" (%zu bytes %s)", bytes, strcmp(action, "defrag") ? "released" : "moved");
    printf("\n");
    fflush(stdout);
}

// --device cuda keeps the live state on the GPU: copy it to the engine's host buffers on the steps
// where a checkpoint may be taken (interval, stop request, last step; every step when a time
// interval is set, since only the checkpoint layer knows when it falls due).
// On several ranks every rank must take that copy at the same steps (the save that follows is
// collective, and with nccl so is the copy), but SIGUSR1 may reach one rank only: the stop
// request is agreed first (a mean over the ranks, above 0 when any rank has one).
static dsc_status gpu_store_for_ckpt(trainer *t, int64_t step) {
    if (!t->gpu || !t->save_dir) return DSC_OK;
    const dsc_config *cfg = dsc_engine_config(t->eng);
    long long every = cfg->checkpoint.interval_steps;
    double stop = stop_signal ? 1.0 : 0.0;
    if (t->world > 1) DSC_TRY(dsc_engine_mean(t->eng, &stop, 1));
    if (stop > 0 || cfg->checkpoint.interval_s > 0 || (every > 0 && step % every == 0) ||
        step == t->o->max_steps)
        return dsc_device_trainer_store(t->gpu);
    return DSC_OK;
}

// Masked data: add this step's loss targets (those not ignored) over all ranks to the count.
static dsc_status count_targets(trainer *t) {
    if (t->target_tokens < 0) return DSC_OK;
    int64_t n = (int64_t)t->gas * t->B * t->T, mine = 0;
    for (int64_t i = 0; i < n; i++) mine += t->tg[i] >= 0;
    double all = (double)mine;
    if (t->world > 1) DSC_TRY(dsc_engine_mean(t->eng, &all, 1));
    t->target_tokens += llround(all * t->world);
    return DSC_OK;
}

// A loss that is not finite without fp16's loss scaler (which skips such a step and lowers the
// scale) cannot be trained on: the update it drives would make every weight NaN. Stop with an
// error rather than run on and exit 0 with "loss": null lines; checkpoints already written stay.
static dsc_status check_loss(const trainer *t, int64_t step, double loss) {
    const dsc_config *cfg = dsc_engine_config(t->eng);
    if (isfinite(loss) || cfg->fp16.enabled) return DSC_OK;
    return dsc_fail(DSC_ERR_INVALID_ARG, "step %lld: the training loss is %s; stopping (only "
                    "fp16's loss scaler skips such steps). The weights diverged or the data "
                    "overflowed: lower optimizer.params.lr, set gradient_clipping, or check the "
                    "data, then start again or continue from an earlier checkpoint with --resume",
                    (long long)step, isnan(loss) ? "NaN" : "infinite");
}

static dsc_status train_loop(trainer *t) {
    const dsc_config *cfg = dsc_engine_config(t->eng);
    double flops_tok = dsc_model_flops_per_token(t->model, t->T);
    int64_t tokens_step = (int64_t)t->gas * t->B * t->T * t->world, tokens = 0;
    double start = dsc_now(), first_loss = NAN, last_loss = NAN, val = NAN;
    dsc_loader_set_stride(t->train, (int64_t)t->B * t->world);
    int64_t first_step = dsc_engine_global_steps(t->eng) + 1;
    for (int64_t step = dsc_engine_global_steps(t->eng) + 1; step <= t->o->max_steps && !t->ck_stop; step++) {
        double t0 = dsc_now(), loss_sum = 0;
        dsc_step_info si;
        dsc_status st; // a failure inside the step goes to `fault`: recovery, then the step again
        DSC_TRY(observe_begin(t, step));
        if ((st = dsc_step_begin(t->eng)) != DSC_OK) goto fault;
        // --dump-grads: the observer is there from the step's start (a streamed GPU step hands
        // its gradients to the optimizer during the backward); the loss it writes comes below.
        if (step == 1 && t->o->dump_grads)
            dsc_engine_observe_grads(t->eng, train__dump_grads_observer, t);
        for (int micro = 0; micro < t->gas; micro++) {
            float loss;
            if ((st = micro_step(t, step, micro, &loss)) != DSC_OK) goto fault;
            loss_sum += loss;
            if (step == 1 && micro == t->gas - 1 && t->o->dump_grads) {
                if (t->gpu && (st = dsc_device_trainer_take_loss(t->gpu, &loss_sum)) != DSC_OK)
                    goto fault;
                double mean = loss_sum / t->gas;
                DSC_TRY(dsc_engine_mean(t->eng, &mean, 1));
                t->dump_loss = mean;
            }
            if (micro == t->gas - 1) DSC_TRY(dsc_checkpoint_fence(t->eng)); // a save may be copying
            double ts = dsc_now();
            st = dsc_step(t->eng, &si); // the device trainer's step where one is attached
            if (st != DSC_OK) goto fault;
            t->cur.step += dsc_now() - ts;
        }
        // --device cuda reads the last micro-step's loss with the step's results
        if (t->gpu && (st = dsc_device_trainer_take_loss(t->gpu, &loss_sum)) != DSC_OK) goto fault;
        // Between steps the engine may compact its pool: re-read the pointers. Not with --device
        // cuda: the GPU path keeps the host state's addresses (registered with the driver for
        // its copies) for the whole run.
        bool moved = false;
        if (!t->gpu) DSC_TRY(dsc_engine_maintain(t->eng, false, &moved));
        for (int i = 0; moved && i < t->ntensors; i++) {
            t->work[i] = dsc_param_data(t->eng, i);
            t->grads[i] = dsc_param_grad(t->eng, i);
        }
        double loss = loss_sum / t->gas;
        if ((st = dsc_engine_mean(t->eng, &loss, 1)) != DSC_OK) goto fault;
        DSC_TRY(check_loss(t, step, loss)); // the same mean on every rank: all stop together
        if ((st = count_targets(t)) != DSC_OK) goto fault;
        double dt = dsc_now() - t0;
        tokens += tokens_step;
        double tok_s = tokens_step / dt;
        double mfu = t->peak_flops > 0 ? flops_tok * tok_s / (t->peak_flops * t->world) : 0;
        if (mfu > 1.0 && !t->gpu) { // the start-up measurement ran on a busy machine: measure again
            double again = measure_cpu_peak();
            if (again > t->peak_flops) t->peak_flops = again;
            mfu = flops_tok * tok_s / (t->peak_flops * t->world);
        }
        DSC_TRY(observe_end(t, step, step * cfg->train_batch_size, dt));
        if (isnan(first_loss)) first_loss = loss; // the first step run (resumed runs start later)
        last_loss = loss;
        val = NAN;
        bool eval_now = t->val && ((t->o->eval_every > 0 && step % t->o->eval_every == 0) ||
                                   step == t->o->max_steps);
        if (eval_now && (st = evaluate(t, &val)) != DSC_OK) goto fault;
        dsc_monitor_step ms = {.step = step, .samples = step * cfg->train_batch_size,
                               .loss = loss, .val_loss = val, .lr = si.lr,
                               .loss_scale = cfg->fp16.enabled ? si.loss_scale : NAN,
                               .grad_norm = si.grad_norm, .tokens_per_s = tok_s, .mfu = mfu,
                               .step_time_s = dt};
        DSC_TRY(dsc_monitor_log_step(t->mon, &ms));
        // Rank 0 reports the step before the checkpoint tick: the tick may commit this step's
        // snapshot and then meet a fault in its collectives, and the run resumes after the
        // committed step; reported after the tick, that step would have no metrics line. (A
        // fault that restores an earlier step redoes this one; its line then appears twice.)
        if (t->rank == 0) train__report_step(t, step, &si, loss, val, tokens, tok_s, mfu, start, first_step);
        DSC_TRY(gpu_store_for_ckpt(t, step));
        if ((st = ckpt_after_step(t)) != DSC_OK) goto fault; // its collectives can meet a fault
        continue;
    fault:
        dsc_checkpoint_fence(t->eng); // a save's copy of the state ends before recovery changes it
        DSC_TRY(recover_step(t, st, &step));
    }
    if (t->gpu) DSC_TRY(dsc_device_trainer_store(t->gpu)); // the final state, for exports and saves
    if (t->o->dump_weights) DSC_TRY(train__dump_weights(t));
    DSC_TRY(dsc_monitor_flush(t->mon));
    obs_progress_clear();
    if (t->rank == 0) obs_comms_print(cfg, dsc_engine_global_steps(t->eng));
    if (t->o->max_steps > 0 && t->rank == 0)
        printf("\ntrain loss %.4f -> %.4f over %lld steps (%.1f s)\n", first_loss, last_loss,
               (long long)(dsc_engine_global_steps(t->eng) - first_step + 1), dsc_now() - start);
    return DSC_OK;
}

static dsc_status trainer_setup(trainer *t, char *run_dir, size_t cap) {
    const train_opts *o = t->o;
#ifdef _OPENMP
    if (o->threads > 0) omp_set_num_threads((int)o->threads);
#endif
    t->T = (int)o->seq_len;
    int vocab;
    DSC_TRY(open_data(t, &vocab));
    dsc_model_opts mo = {.vocab_size = vocab, .max_seq_len = t->T};
    DSC_TRY(dsc_model_create(&t->model, o->model, &mo));
    DSC_TRY(check_model_fits(t, vocab));
    bool cuda; // chosen before the engine, whose creation already waits for the other ranks
    const char *ws = getenv("WORLD_SIZE"), *dev = o->device, *be = dsc_env("DSC_COMM_BACKEND");
    bool nccl = be && !strcmp(be, "nccl");
    // --dump-grads serves comparisons against an fp32 reference: auto keeps it on the CPU's
    // fp32 arithmetic unless the run asked for device collectives; --device cuda dumps the GPU's.
    if (o->dump_grads && !nccl && (!dev || !strcmp(dev, "auto"))) dev = "cpu";
    // position ids reach the GPU passes of a family that takes them (the Llama family's)
    if (o->restart_positions && (!dev || !strcmp(dev, "auto")) &&
        !dsc_model_has_device_positions(t->model))
        dev = "cpu";

    // a model without device passes (a registered family may have none) trains on the CPU
    bool gpu_model = dsc_device_model_ok(t->model);
    if (!gpu_model && (!dev || !strcmp(dev, "auto"))) dev = "cpu";

    DSC_TRY(dsc_device_pick(dev, ws ? (int)strtol(ws, NULL, 10) : 1, &cuda));
    if (cuda && !gpu_model)
        return dsc_fail(DSC_ERR_UNSUPPORTED, "--device cuda: model %s (family %s) has no CUDA "
                        "training yet; the CPU trains it: pass --device cpu (or leave --device "
                        "out)", o->model, dsc_model_describe(t->model)->family);
    if (cuda && o->restart_positions && !dsc_model_has_device_positions(t->model))
        return dsc_fail(DSC_ERR_INVALID_ARG, "--restart-positions: the GPU passes of model %s "
                        "(family %s) take no position ids yet (the Llama family's do); "
                        "pass --device cpu, or leave the flag out on the GPU", o->model,
                        dsc_model_describe(t->model)->family);
    int world = ws && strtol(ws, NULL, 10) > 1 ? (int)strtol(ws, NULL, 10) : 1;
    DSC_TRY(plan_memory(t, cuda, world));
    DSC_TRY(build_engine(t, cuda && world <= 1));
    const dsc_config *cfg = dsc_engine_config(t->eng);
    t->B = (int)cfg->train_micro_batch_size_per_gpu;
    t->gas = (int)cfg->gradient_accumulation_steps;
    t->rank = dsc_engine_rank(t->eng);
    t->world = dsc_engine_world_size(t->eng);
    if (!cuda) DSC_TRY(dsc_model_reserve(t->model, t->B, t->T, dsc_engine_mem_pool(t->eng)));
    t->work = calloc((size_t)t->ntensors, sizeof *t->work);
    t->grads = calloc((size_t)t->ntensors, sizeof *t->grads);
    t->tgroup = calloc((size_t)t->ntensors, sizeof *t->tgroup);
    t->in = malloc((size_t)t->gas * t->B * t->T * sizeof *t->in);
    t->tg = malloc((size_t)t->gas * t->B * t->T * sizeof *t->tg);
    if (o->restart_positions) t->pos = malloc((size_t)t->gas * t->B * t->T * sizeof *t->pos);
    bool no_pos = o->restart_positions && !t->pos;
    if (!t->work || !t->grads || !t->tgroup || !t->in || !t->tg || no_pos)
        return dsc_fail(DSC_ERR_OOM, "out of memory");
    // With the state on the device the trainer holds the weights: made before they are set.
    bool early = cuda && dsc_engine_state_on_device(t->eng);
    if (early) DSC_TRY(dsc_device_trainer_create(&t->gpu, t->eng, t->model, t->B, t->T));
    DSC_TRY(init_weights(t));
    if (dsc_model_lora_of(t->model)) // the base the adapters train on, for checkpoints
        DSC_TRY(cli_base_checksums(t->model, t->work, t->eng, &t->base_sums));
    DSC_TRY(ckpt_setup(t));
    const char *gpu_line = NULL;
    if (cuda) {
        if (!early) DSC_TRY(dsc_device_trainer_create(&t->gpu, t->eng, t->model, t->B, t->T));
        gpu_line = dsc_device_trainer_describe(t->gpu, &t->peak_flops);
    } else {
        t->peak_flops = measure_cpu_peak();
    }
    if (t->rank == 0) DSC_TRY(open_run_dir(t, run_dir, cap));
    DSC_TRY(dsc_monitor_create(&t->mon, cfg, t->rank == 0 ? run_dir : NULL, t->rank));
    dsc_monitor_action_hooks ah = {t, action_before, action_after};
    dsc_monitor_set_action_hooks(t->mon, &ah);
    DSC_TRY(obs_comms_setup(cfg));
    if (t->rank != 0) return DSC_OK;
    const dsc_model_info *mi = dsc_model_describe(t->model);
    printf("dsc train: model %s (%.2fM parameters, %d layers, %d heads, %d channels, vocab %d)\n",
           o->model, mi->num_params / 1e6, mi->n_layer, mi->n_head, mi->n_embd, mi->vocab_size);
    printf("data %s: %lld training tokens | T=%d, micro batch %d, accumulation %d, world %d, "
           "ZeRO stage %lld, %s\n", t->data_dir, (long long)dsc_loader_num_tokens(t->train), t->T,
           t->B, t->gas, t->world, (long long)cfg->zero_optimization.stage,
           cfg->fp16.enabled ? "fp16" : cfg->bf16.enabled ? "bf16" : "fp32");
    dsc_memplan_print(&t->plan, stdout, "");
    if (dsc_model_recomputes(t->model))
        printf("activation checkpointing: only each layer's input is kept; the backward "
               "recomputes the %d layers' activations from it\n", mi->n_layer);
    if (dsc_model_fp8(t->model))
        printf("fp8: the %d layers' linear products with %s operands, each scaled by its own "
               "absolute maximum (current scaling, margin %lld); the output head, norms, "
               "attention and optimizer as without it\n", mi->n_layer,
               dsc_model_fp8(t->model) == DSC_MODEL_FP8_E4M3 ? "E4M3"
                                                           : "E4M3 (forward) and E5M2 (gradient)",
               (long long)cfg->fp8.margin);
    const dsc_lora *lo = dsc_model_lora_of(t->model);
    if (lo) {
        int64_t trainable = 0, adapters = 0;
        for (int i = 0; i < mi->num_tensors; i++) {
            const dsc_model_param *p = dsc_model_param_get(t->model, i);
            if (!p->frozen) trainable += p->numel;
            if (dsc_lora_base_of(lo, i) >= 0) adapters++;
        }
        printf("LoRA: r %d, scale %g, %lld adapted modules, dropout %g: %.2fM trainable "
               "parameters of %.2fM (the frozen base: values only)\n", dsc_lora_rank(lo),
               dsc_lora_scale(lo), (long long)adapters / 2, dsc_lora_dropout(lo), trainable / 1e6,
               mi->num_params / 1e6);
    }
    if (t->target_tokens >= 0)
        printf("loss mask: the data ignores some targets (prompts, padding); each micro-batch's "
               "loss is the mean over its own loss targets\n");
    if (gpu_line && t->peak_flops > 0)
        printf("run dir %s | %s | MFU against %.0f TFLOP/s (dense bf16)\n", run_dir, gpu_line,
               t->peak_flops / 1e12);
    else if (gpu_line)
        printf("run dir %s | %s | peak of this GPU unknown: MFU shows 0 (set "
               "DSC_GPU_PEAK_TFLOPS)\n", run_dir, gpu_line);
    else
        printf("run dir %s | CPU matrix peak %.1f GFLOP/s per rank (MFU's reference; "
               "approximate: other work on the machine changes it)\n", run_dir,
               t->peak_flops / 1e9);
    return DSC_OK;
}

static void trainer_free(trainer *t) {
    if (t->metrics) fclose(t->metrics);
    dsc_monitor_destroy(t->mon);
    dsc_device_trainer_destroy(t->gpu); // before the engine: it unpins the engine's buffers
    dsc_model_destroy(t->model);    // after the GPU side, which borrows it
    dsc_engine_destroy(t->eng);
    dsc_loader_destroy(t->train);
    dsc_loader_destroy(t->val);
    dsc_tokenizer_destroy(t->tok);
    free(t->work);
    free(t->grads);
    free(t->tgroup);
    free(t->peft_names);
    free(t->base_sums);
    free(t->cfg_text);
    free(t->prof_times);
    free(t->in);
    free(t->tg);
    free(t->pos);
}

// An error before the first step (config, output paths, ports, data, model files) is no fault
// of the ranks to degrade around: the error is said first (dsc launch may stop this process as
// soon as the others have heard), then the other ranks are told, so they stop within
// milliseconds with it instead of waiting comm_timeout_s and training on without this rank.
// A rank that stops because another could not start waits a moment before exiting, so that
// dsc launch sees the failing rank end first and names it (not the rank it told).
static void let_origin_exit_first(void) {
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
}

static int startup_failed(trainer *t, dsc_status st) {
    if (st == DSC_ERR_ABORTED) let_origin_exit_first();
    char why[1024];
    snprintf(why, sizeof why, "%s", dsc_last_error());
    fprintf(stderr, "dsc train: error: %s\n", why);
    fflush(stderr);
    dsc_engine_abort(t->eng, why);
    ckpt_finish(t, DSC_ERR_ABORTED);
    trainer_free(t);
    // One process alone keeps the plain error code; a rank of several tells the launcher.
    const char *ws = getenv("WORLD_SIZE");
    return ws && strtol(ws, NULL, 10) > 1 ? DSC_EXIT_STARTUP : 1;
}

int dsc__train_run(const train_opts *o) {
    trainer t = {.o = o};
    char run_dir[4096];
    dsc_status st = trainer_setup(&t, run_dir, sizeof run_dir);
    if (st != DSC_OK) return startup_failed(&t, st);
    st = train_loop(&t);
    st = ckpt_finish(&t, st);
    if (st == DSC_OK && !t.ck_stop) train__sample_text(&t);
    trainer_free(&t);
    if (st == DSC_ERR_ABORTED) { // another rank could not start
        t.exit_code = DSC_EXIT_STARTUP;
        let_origin_exit_first();
    }
    if (st != DSC_OK) {
        fprintf(stderr, "dsc train: error: %s\n", dsc_last_error());
        return t.exit_code ? t.exit_code : 1;
    }
    return 0;
}
