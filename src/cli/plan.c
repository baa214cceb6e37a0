// cli/plan.c - the memory plan's inputs from a model, a config and this machine (cli/plan.h).
#include "cli/plan.h"

#include <stdint.h>  // int64_t
#include <stdio.h>   // fopen, fscanf, fprintf, snprintf
#include <stdlib.h>  // calloc, free, strtol
#include <string.h>  // strcmp
#include <strings.h> // strcasecmp
#include <unistd.h>  // sysconf

#include "dsc/base.h"   // dsc_env
#include "dsc/device.h" // dsc_device_mem_info
#include "dsc/status.h" // dsc_last_error, dsc_clear_error

typedef struct act_user {
    const dsc_model *model;
    int T;
} act_user;

static size_t act(void *user, int B, bool device) {
    const act_user *a = user;
    return dsc_model_activation_bytes(a->model, B, a->T, device);
}

static size_t act_host(void *user, int B, bool device) {
    const act_user *a = user;
    return device ? dsc_model_activation_host_bytes(a->model, B, a->T) : 0;
}

// Resident bytes of this process now (/proc/self/statm), and a margin for what the libraries
// allocate later on their own (BLAS and OpenMP thread buffers, the loader's prefetch); a GPU run
// adds what the CUDA runtime and cuBLASLt take on the host as their kernels are first loaded
// (measured 67 MiB for a Llama on an H100 with CUDA 13, after the plan's own reading).
#define DEVICE_HOST_GROWTH ((int64_t)64 << 20)
static int64_t runtime_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, rss = 0;
    if (!f) return 0;
    int got = fscanf(f, "%llu %llu", &size, &rss);
    fclose(f);
    return got == 2 ? (int64_t)rss * sysconf(_SC_PAGESIZE) + ((int64_t)32 << 20) : 0;
}

static int env_int(const char *name, int fallback) {
    const char *s = getenv(name);
    long v = s ? strtol(s, NULL, 10) : 0;
    return v > 0 ? (int)v : fallback;
}

// The machine: host memory per rank of this node, the device's free memory.
static void machine(dsc_memplan_input *in) {
    char src[64];
    int64_t host = dsc_host_mem_available(src, sizeof src);
    in->local_ranks = env_int("LOCAL_WORLD_SIZE", in->world);
    in->host_avail = host < 0 ? -1 : host / in->local_ranks;
    in->device_avail = -1;
    int64_t fr, tot;
    if (in->device && dsc_device_mem_info(&fr, &tot) == DSC_OK) in->device_avail = fr;
    else if (in->device) dsc_clear_error(); // no device here: the plan cannot check it
}

dsc_status cli_plan_device_ok(const dsc_config *cfg, bool cuda, int world) {
    // The GPU trainer keeps bf16 master weights on the device; the streamed ZeRO-Offload of one
    // GPU updates an fp32 master group by group. Several host-staged ranks, and one rank with
    // DSC_OFFLOAD_STREAM=0, step in the engine, which keeps the bf16 master (the GPU trainer's
    // own check says the same).
    const char *stream = dsc_env("DSC_OFFLOAD_STREAM");
    bool streamed = world <= 1 && !(stream && !strcmp(stream, "0"));
    if (cuda && streamed && cfg->bf16.enabled && cfg->bf16.bf16_master_weights_and_grads &&
        !strcmp(cfg->zero_optimization.offload_optimizer.device, "cpu"))
        return dsc_fail(DSC_ERR_UNSUPPORTED, "--device cuda: bf16.bf16_master_weights_and_grads "
                        "with zero_optimization.offload_optimizer \"cpu\" is not built on one GPU "
                        "(the streamed offload's CPU step keeps an fp32 master); set "
                        "offload_optimizer.device to \"none\" (bf16 master, gradients and moments "
                        "on the GPU), or the bf16 master keys false");
    return DSC_OK;
}

dsc_status cli_activation_checkpointing(dsc_model *m, const dsc_config *cfg, bool cuda,
                                        void (*warn)(void *user, const char *msg)) {
    if (!dsc_config_given(cfg, "activation_checkpointing")) return DSC_OK;
    char msg[512];
    if (cuda && !dsc_model_device_recomputes(m)) {
        if (warn) {
            snprintf(msg, sizeof msg, "activation_checkpointing: the GPU passes of family %s "
                     "keep every layer's activations (they recompute on the CPU only); the "
                     "memory plan counts them all", dsc_model_describe(m)->family);
            warn(NULL, msg);
        }
        return DSC_OK;
    }
    DSC_TRY(dsc_model_set_recompute(m, true));
    // cpu_checkpointing: the device passes keep the layers' inputs on the host; the host passes
    // have them there already
    if (cuda && cfg->activation_checkpointing.cpu_checkpointing) {
        if (dsc_model_device_recomputes_host(m)) {
            DSC_TRY(dsc_model_set_recompute_host(m, true));
        } else if (warn) {
            snprintf(msg, sizeof msg, "activation_checkpointing.cpu_checkpointing: the GPU "
                     "passes of family %s keep the layers' inputs on the GPU",
                     dsc_model_describe(m)->family);
            warn(NULL, msg);
        }
    }
    int L = dsc_model_describe(m)->n_layer;
    int64_t want = cfg->activation_checkpointing.number_checkpoints;
    if (warn && want > 0 && want != L) {
        snprintf(msg, sizeof msg, "activation_checkpointing.number_checkpoints is %lld: dsc "
                 "keeps one checkpoint per transformer layer (%d here) and recomputes each "
                 "layer from it", (long long)want, L);
        warn(NULL, msg);
    }
    return DSC_OK;
}

dsc_status cli_fp8(dsc_model *m, const dsc_config *cfg, bool cuda) {
    if (!cfg->fp8.enabled) return DSC_OK;
    if (!cuda)
        return dsc_fail(DSC_ERR_UNSUPPORTED, "fp8.enabled: FP8 products run on a GPU "
                        "(--device cuda, compute capability 8.9 or later); the CPU passes "
                        "compute in fp32: remove the fp8 section or set fp8.enabled false");
    int format = !strcasecmp(cfg->fp8.fp8_format, "e4m3") ? DSC_MODEL_FP8_E4M3
                                                          : DSC_MODEL_FP8_HYBRID;
    return dsc_model_set_fp8(m, format, (int)cfg->fp8.margin);
}

dsc_status cli_memory_plan(const cli_plan_opts *o, bool check, dsc_memplan *out) {
    const dsc_model_info *mi = dsc_model_describe(o->model);
    dsc_param_desc *pd = calloc((size_t)mi->num_tensors, sizeof *pd);
    if (!pd) return dsc_fail(DSC_ERR_OOM, "out of memory for the memory plan");
    dsc_model_param_descs(o->model, pd);
    act_user au = {o->model, o->seq_len};
    const char *be = dsc_env("DSC_COMM_BACKEND");
    dsc_memplan_input in = {
        .config = o->cfg, .params = pd, .nparams = mi->num_tensors, .n_layer = mi->n_layer,
        .world = o->world, .seq_len = o->seq_len, .device = o->device,
        .nccl = be && !strcmp(be, "nccl"), .init_in_place = o->init_in_place,
        .checkpoints = o->checkpoints, .act = act, .act_user = &au, .act_host = act_host,
        .host_runtime = !o->measure_runtime ? 0
                        : runtime_now() + (o->device ? DEVICE_HOST_GROWTH : 0),
    };
    machine(&in);
    dsc_status st = dsc_memplan_compute(&in, out);
    if (st == DSC_OK && check) st = dsc_memplan_check(&in, out);
    const char *policy = dsc_env("DSC_MEM_PLAN");
    if (st == DSC_ERR_OOM && policy && !strcmp(policy, "warn")) {
        fprintf(stderr, "warning: DSC_MEM_PLAN=warn: starting anyway: %s\n", dsc_last_error());
        dsc_clear_error();
        st = DSC_OK;
    }
    free(pd);
    return st;
}
