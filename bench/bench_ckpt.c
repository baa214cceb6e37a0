// bench/bench_ckpt.c - what a checkpoint costs the training loop, asynchronous vs synchronous,
// and how fast the writer streams compared with the disk.
//
// One rank, the parameter table of a GPT-2 model (default gpt2-124M: a 1.4 GiB shard of fp32
// master weights and two AdamW moments). A training step here is a synthetic gradient, the real
// engine step (AdamW over every parameter) and a CPU-bound stand-in for forward and backward
// (--compute-ms). The loop runs three times: without checkpoints, with asynchronous saves and
// with synchronous saves every --every steps. The stall per checkpoint is the time the training
// thread spends in save calls and waiting at dsc_checkpoint_fence; the loop slowdown (extra
// loop time per save) also counts the writer thread competing for cores. The disk's sequential
// write bandwidth is measured in the same run by writing and fsyncing a file of the shard's
// size in the same directory, buffered and with O_DIRECT (like dd conv=fsync / oflag=direct).
//
// usage: bench_ckpt [--model SPEC] [--steps N] [--every N] [--compute-ms MS] [--dir DIR]
// BENCH_CKPT_VERBOSE=1 prints every step's time and save call.
#define _GNU_SOURCE // O_DIRECT
#include <fcntl.h>  // open
#include <math.h>   // sqrt
#include <stdio.h>  // printf
#include <stdlib.h> // strtol, posix_memalign
#include <string.h> // strcmp
#include <unistd.h> // write, fsync, unlink

#include "base/io.h" // dsc__mkdirs
#include "base/time.h"       // dsc_now
#include "dsc/checkpoint.h"  // dsc_checkpointing_*
#include "dsc/engine.h"      // dsc_engine_*
#include "engine/ckpt/fs.h"  // dsc__ckpt_rmtree
#include "model/gpt2/gpt2.h" // dsc_gpt2_*

typedef struct bench_opts {
    const char *model, *dir;
    int steps, every, compute_ms;
} bench_opts;

static dsc_engine *make_engine(const char *spec) {
    dsc_gpt2_config mc;
    if (dsc_gpt2_config_parse(spec, 50257, 1024, &mc) != DSC_OK) return NULL;
    int n = dsc_gpt2_num_tensors(&mc);
    dsc_param_desc *pd = calloc((size_t)n, sizeof *pd);
    dsc_gpt2_tensor_info *info = calloc((size_t)n, sizeof *info);
    for (int i = 0; i < n; i++) {
        dsc_gpt2_tensor_info_get(&mc, i, &info[i]);
        pd[i] = (dsc_param_desc){.name = info[i].name, .ndim = info[i].ndim, .group = info[i].group};
        for (int d = 0; d < info[i].ndim; d++) pd[i].shape[d] = info[i].shape[d];
    }
    const char *json = "{\"train_batch_size\": 1, \"optimizer\": {\"type\": \"AdamW\"}, "
                       "\"zero_optimization\": {\"stage\": 1}}";
    dsc_engine_opts o = {.config_json = json, .params = pd, .nparams = n, .world_size = 1};
    dsc_engine *e = NULL;
    if (dsc_engine_create(&e, &o) != DSC_OK) fprintf(stderr, "bench_ckpt: %s\n", dsc_last_error());
    for (int i = 0; e && i < n; i++) {
        float *m = dsc_param_master(e, i);
        for (int64_t k = 0; k < info[i].numel; k++) m[k] = 0.01f * (float)((k * 7 + i) % 13);
    }
    if (e) dsc_params_updated(e);
    free(pd);
    free(info);
    return e;
}

static volatile double sink;

// Stand-in for forward and backward: keeps one core busy for ms milliseconds.
static void compute(int ms) {
    double t0 = dsc_now(), x = 1;
    while (dsc_now() - t0 < ms / 1000.0)
        for (int k = 0; k < 1000; k++) x = x * 1.0000001 + 1e-9;
    sink = x;
}

static void train_step(dsc_engine *e, int ms) {
    compute(ms);
    dsc_backward_begin(e);
    int n = dsc_engine_num_params(e);
    for (int i = 0; i < n; i++) {
        float *g = dsc_param_grad(e, i);
        g[0] += 1e-3f; // the rest stays zero: AdamW still updates every element
    }
    dsc_checkpoint_fence(e); // the optimizer step below changes the state a save may be copying
    dsc_step_info info;
    dsc_step(e, &info);
}

typedef struct loop_result {
    double seconds;   // the whole loop
    double blocked;   // inside save calls (the training thread waiting for checkpoints)
    double step_sd;   // standard deviation of the step times
} loop_result;

// Saves every `every` steps when mode is 1 (async) or 2 (sync). One save before the timed loop
// warms the buffers and the page cache.
static loop_result loop(dsc_engine *e, const bench_opts *b, int mode, dsc_ckpt_stats *st) {
    dsc_ckpt_opts o = {.async = mode == 1, .background_snapshot = true};
    if (mode) {
        dsc_checkpointing_start(e, b->dir, &o);
        train_step(e, 0);
        dsc_save_checkpoint(e, NULL);
        dsc_checkpoint_wait(e);
    }
    loop_result r = {0};
    double t0 = dsc_now(), sum = 0, sum2 = 0;
    for (int s = 1; s <= b->steps; s++) {
        double t1 = dsc_now();
        train_step(e, b->compute_ms);
        double t2 = dsc_now();
        sum += t2 - t1;
        sum2 += (t2 - t1) * (t2 - t1);
        if (mode && s % b->every == 0 && dsc_save_checkpoint(e, NULL) != DSC_OK)
            fprintf(stderr, "bench_ckpt: save: %s\n", dsc_last_error());
        r.blocked += dsc_now() - t2;
        if (getenv("BENCH_CKPT_VERBOSE"))
            fprintf(stderr, "mode %d step %d: step %.3f s, save call %.3f s\n", mode, s, t2 - t1,
                    dsc_now() - t2);
    }
    r.seconds = dsc_now() - t0;
    double mean = sum / b->steps, var = sum2 / b->steps - mean * mean;
    r.step_sd = var > 0 ? sqrt(var) : 0;
    if (mode) {
        dsc_checkpoint_wait(e);
        dsc_checkpointing_stats(e, st);
        dsc_checkpointing_stop(e, true);
    }
    return r;
}

// Sequential write + fsync of `bytes` in 8 MiB blocks, like dd bs=8M conv=fsync (direct: also
// oflag=direct); the best of three. bytes: rounded down to whole blocks.
static double disk_bandwidth(const char *dir, size_t bytes, bool direct) {
    char path[4200];
    snprintf(path, sizeof path, "%s/dd.bin", dir);
    size_t block = 8u << 20, n = bytes / block * block;
    char *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, block) != 0) return 0;
    for (size_t k = 0; k < block; k++) buf[k] = (char)(k * 31 + 7);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | (direct ? O_DIRECT : 0), 0644);
        if (fd < 0) break;
        double t0 = dsc_now();
        for (size_t done = 0; done < n; done += block)
            if (write(fd, buf, block) != (ssize_t)block) break;
        fsync(fd);
        double t = dsc_now() - t0;
        close(fd);
        unlink(path);
        if (n / t > best) best = n / t;
    }
    free(buf);
    return best;
}

// Validation's re-read (checksums from the disk: the writer dropped the pages from the cache).
static double reread(const char *dir, double *bytes) {
    double t0 = dsc_now();
    dsc_ckpt *ck;
    if (dsc_ckpt_open(&ck, dir, NULL) != DSC_OK) return -1;
    dsc_ckpt_info info;
    dsc_ckpt_get_info(ck, &info);
    *bytes = (double)info.bytes;
    dsc_ckpt_close(ck);
    return dsc_now() - t0;
}

static bool parse(int argc, char **argv, bench_opts *b) {
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (!strcmp(k, "--model")) b->model = v;
        else if (!strcmp(k, "--dir")) b->dir = v;
        else if (!strcmp(k, "--steps")) b->steps = (int)strtol(v, NULL, 10);
        else if (!strcmp(k, "--every")) b->every = (int)strtol(v, NULL, 10);
        else if (!strcmp(k, "--compute-ms")) b->compute_ms = (int)strtol(v, NULL, 10);
        else return false;
    }
    return (argc % 2) == 1 && b->steps > 0 && b->every > 0;
}

int main(int argc, char **argv) {
    bench_opts b = {.model = "gpt2-124M", .dir = "bench_ckpt.tmp", .steps = 12, .every = 4,
                    .compute_ms = 1500};
    if (!parse(argc, argv, &b)) {
        fprintf(stderr, "usage: bench_ckpt [--model SPEC] [--steps N] [--every N] "
                        "[--compute-ms MS] [--dir DIR]\n");
        return 2;
    }
    dsc_engine *e = make_engine(b.model);
    if (!e) return 1;
    dsc__ckpt_rmtree(b.dir);
    dsc__mkdirs(b.dir);
    dsc_ckpt_stats sa, ss;
    train_step(e, 0); // first touch of every buffer
    size_t shard = (size_t)dsc_engine_num_elements(e) * 12;
    disk_bandwidth(b.dir, shard, false); // warm the page cache's memory
    loop_result base = loop(e, &b, 0, NULL);
    loop_result la = loop(e, &b, 1, &sa);
    loop_result ls = loop(e, &b, 2, &ss);
    double dbuf = disk_bandwidth(b.dir, ss.shard_bytes, false);
    double ddir = disk_bandwidth(b.dir, ss.shard_bytes, true);
    double disk = dbuf > ddir ? dbuf : ddir, rbytes = 0, rt = reread(b.dir, &rbytes);
    int saves = b.steps / b.every;
    // The stall is the time training waits in save calls and in the fence; the slowdown of the
    // whole loop also counts the writer competing for cores and memory (noise: step times' sd).
    double stall_a = (la.blocked + sa.fence_s) / saves, stall_s = ls.blocked / saves;
    double slow_a = (la.seconds - base.seconds) / saves, slow_s = (ls.seconds - base.seconds) / saves;
    double noise = base.step_sd * sqrt((double)b.steps) / saves;
    double wa = sa.shard_bytes / sa.write_s, ws = ss.shard_bytes / ss.write_s;
    printf("bench_ckpt: %s, %.1fM parameters, shard %.2f GiB (fp32 master + 2 AdamW moments); "
           "%d steps of %.2f s (%d ms stand-in compute + AdamW), a save every %d steps; %s\n",
           b.model, dsc_engine_num_elements(e) / 1e6, ss.shard_bytes / 1073741824.0, b.steps,
           base.seconds / b.steps, b.compute_ms, b.every, b.dir);
    printf("  %-50s %8.3f s\n", "stall per checkpoint, synchronous save", stall_s);
    printf("  %-50s %8.3f s  (%.1f%% of synchronous)\n", "stall per checkpoint, asynchronous save",
           stall_a, 100 * stall_a / stall_s);
    printf("  %-50s %8.3f s / %.3f s  (+-%.3f s)\n", "loop slowdown per checkpoint, sync / async",
           slow_s, slow_a, noise);
    printf("  %-50s %8.3f s  (on the writer thread)\n", "  snapshot copy", sa.snapshot_s);
    printf("  %-50s %8.2f GB/s\n", "disk: write + fsync, buffered (dd conv=fsync)", dbuf / 1e9);
    printf("  %-50s %8.2f GB/s\n", "disk: write + fsync, O_DIRECT (dd oflag=direct)", ddir / 1e9);
    printf("  %-50s %8.2f GB/s  (%.0f%% of the disk's best)\n", "writer: shard + fsync, synchronous",
           ws / 1e9, 100 * ws / disk);
    printf("  %-50s %8.2f GB/s  (%.0f%% of the disk's best)\n", "writer: shard + fsync, asynchronous",
           wa / 1e9, 100 * wa / disk);
    if (rt > 0) printf("  %-50s %8.2f GB/s\n", "validation re-read (every checksum)", rbytes / rt / 1e9);
    dsc__ckpt_rmtree(b.dir);
    dsc_engine_destroy(e);
    return 0;
}
