// test_memplan.c - the memory plan's accounting (dsc/memplan.h) on a made-up parameter table:
// bytes per parameter of each mode as the runtime allocates them (the GPU-resident run's host
// mirror 12, ZeRO-Offload's 12 and four slots, the device's 18, 6 and 8 plus a gradient scratch
// with bf16 master weights), partitions that shrink with ranks,
// activations from the callback, the machine's limit, and the refusal naming both numbers and
// the settings that would fit.
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // snprintf
#include <stdlib.h> // setenv, unsetenv, free
#include <string.h> // strstr

#include "dsc/config.h"  // dsc_config_load_string
#include "dsc/memplan.h" // dsc_memplan_*
#include "dsc/status.h"  // dsc_last_error

enum { L = 4, PER = 4 << 20 }; // 4 layers of 4 Mi elements, 2 end groups of 4 Mi each

static dsc_param_desc table[L + 2];
static char names[L + 2][16];

static void make_table(void) {
    for (int g = 0; g < L + 2; g++) {
        snprintf(names[g], sizeof names[g], "w%d", g);
        table[g] = (dsc_param_desc){.name = names[g], .ndim = 2, .shape = {2048, 2048}, .group = g};
    }
}

static size_t act(void *user, int B, bool device) {
    (void)user;
    return (size_t)B * (device ? 1000 : 3000);
}

static void plan(const char *json, int world, bool device, int64_t host_avail, dsc_memplan *p,
                 dsc_config *cfg, dsc_memplan_input *in) {
    make_table();
    assert_int_equal(dsc_config_load_string(cfg, json, world, NULL, NULL), DSC_OK);
    *in = (dsc_memplan_input){.config = cfg, .params = table, .nparams = L + 2, .n_layer = L,
                              .world = world, .seq_len = 64, .device = device, .act = act,
                              .host_runtime = 1, .host_avail = host_avail, .device_avail = -1};
    assert_int_equal(dsc_memplan_compute(in, p), DSC_OK);
}

#define CFG(extra) "{\"train_micro_batch_size_per_gpu\": 2, \"bf16\": {\"enabled\": true}, " \
    "\"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-3}}" extra "}"

static const int64_t P = (int64_t)(L + 2) * PER;

static void test_gpu_modes(void **state) {
    (void)state;
    dsc_config c;
    dsc_memplan_input in;
    dsc_memplan p;
    // optimizer on the GPU (by default): the host keeps nothing of the state but pieces passing
    // through, here a load's (the largest group's 4 Mi elements of three kinds, 48 MiB, beside
    // the 64 MiB the checksum maps; of 288 MiB of state)
    plan(CFG(""), 1, true, -1, &p, &c, &in);
    assert_int_equal(p.params, P);
    assert_int_equal(p.host_bytes - p.host[DSC_PLAN_RUNTIME], 12 * PER + (64 << 20));
    assert_non_null(strstr(p.mode, "no host copy of master or moments"));
    // with DSC_DEVICE_STATE=0 a host that cannot hold the copy (288 MiB) is told that
    // DSC_DEVICE_STATE=1 fits
    setenv("DSC_DEVICE_STATE", "0", 1);
    plan(CFG(""), 1, true, (int64_t)160 << 20, &p, &c, &in);
    assert_false(p.fits);
    assert_int_equal(dsc_memplan_check(&in, &p), DSC_ERR_OOM);
    assert_non_null(strstr(dsc_last_error(), "settings that would fit: DSC_DEVICE_STATE=1"));
    plan(CFG(""), 1, true, -1, &p, &c, &in); // DSC_DEVICE_STATE=0: a host copy of master and
    unsetenv("DSC_DEVICE_STATE");            // moments (the gradients stay on the device)
    assert_int_equal(p.host[DSC_PLAN_MASTER] + p.host[DSC_PLAN_MOMENTS], 12 * P);
    assert_int_equal(p.host[DSC_PLAN_GRADS], 0);
    assert_non_null(strstr(p.mode, "host mirror of master and moments"));
    assert_int_equal(p.device[DSC_PLAN_WEIGHTS] + p.device[DSC_PLAN_MASTER] +
                     p.device[DSC_PLAN_MOMENTS] + p.device[DSC_PLAN_GRADS], 18 * P);
    assert_int_equal(p.device[DSC_PLAN_ACTIVATIONS], 2000);
    assert_int_equal(p.host[DSC_PLAN_ACTIVATIONS], 0);
    plan(CFG(", \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
             "\"cpu\"}}"), 1, true, -1, &p, &c, &in);
    // master and moments, and four slots of the largest group (gradients twice, 16-bit twice)
    assert_int_equal(p.host_bytes - p.host[DSC_PLAN_RUNTIME], 12 * P + 12 * PER);
    assert_int_equal(p.host[DSC_PLAN_GRADS], 0);
    assert_int_equal(p.device_bytes - p.device[DSC_PLAN_RUNTIME] - 2000, 6 * P); // no master
    setenv("DSC_OFFLOAD_STREAM", "0", 1); // the whole-gradient path keeps the engine's gradients
    plan(CFG(", \"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": "
             "\"cpu\"}}"), 1, true, -1, &p, &c, &in);
    unsetenv("DSC_OFFLOAD_STREAM");
    assert_int_equal(p.host_bytes - p.host[DSC_PLAN_RUNTIME], 16 * P);
    plan(CFG(", \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": 3, "
             "\"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": "
             "\"cpu\"}}"), 1, true, -1, &p, &c, &in);
    // the device keeps the two end groups and two layer slots: 4 of the 6 groups
    assert_int_equal(p.device_bytes - p.device[DSC_PLAN_RUNTIME] - 2000, 6 * 4 * PER);
    // the host: master, moments, accumulator, the 16-bit copy, two layer-sized gradient slots
    assert_int_equal(p.host_bytes - p.host[DSC_PLAN_RUNTIME], 18 * P + 8 * PER);
    // without clipping (one micro-step, bf16) the step is streamed too: no accumulator, and the
    // end groups' four slots
    plan(CFG(", \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": "
             "\"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}"), 1, true, -1, &p, &c, &in);
    assert_int_equal(p.host[DSC_PLAN_GRADS], 0);
    assert_int_equal(p.host_bytes - p.host[DSC_PLAN_RUNTIME], 14 * P + 8 * PER + 12 * PER);
}

// A parameter-offload run that does not fit because of its host gradient accumulator is told
// that the streamed step (no clipping, one micro-step) would fit.
static void test_streamed_advice(void **state) {
    (void)state;
    dsc_config c;
    dsc_memplan_input in;
    dsc_memplan p;
    // accumulator kept: 18 P + slots = 116 PER; streamed: 14 P + slots = 104 PER (P = 6 PER)
    plan(CFG(", \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": 3, "
             "\"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": "
             "\"cpu\"}}"), 1, true, (int64_t)110 * PER, &p, &c, &in);
    assert_false(p.fits);
    assert_int_equal(dsc_memplan_check(&in, &p), DSC_ERR_OOM);
    assert_non_null(strstr(dsc_last_error(), "gradient_clipping 0 and "
                           "gradient_accumulation_steps 1"));
}

// More GPUs are suggested with the ranks of a node sharing its host memory (8 per node when the
// node's GPU count is unknown).
static void test_more_gpus_advice(void **state) {
    (void)state;
    dsc_config c;
    dsc_memplan_input in;
    dsc_memplan p;
    plan(CFG(", \"zero_optimization\": {\"stage\": 3}"), 1, true, (int64_t)1 << 40, &p, &c, &in);
    in.device_avail = p.device_bytes - 1; // one GPU: a byte short
    assert_int_equal(dsc_memplan_compute(&in, &p), DSC_OK);
    assert_false(p.fits);
    assert_int_equal(dsc_memplan_check(&in, &p), DSC_ERR_OOM);
    assert_non_null(strstr(dsc_last_error(), "2 GPUs at ZeRO stage 3 (2 per node)"));
}

static void test_cpu_ranks(void **state) {
    (void)state;
    dsc_config c;
    dsc_memplan_input in;
    dsc_memplan one, two;
    const char *s3 = CFG(", \"zero_optimization\": {\"stage\": 3}, "
                         "\"fault_tolerance\": {\"replicate\": false}");
    plan(s3, 1, false, -1, &one, &c, &in);
    plan(s3, 2, false, -1, &two, &c, &in);
    // master and moments are partitioned: half per rank on two
    assert_int_equal(two.host[DSC_PLAN_MOMENTS] * 2, one.host[DSC_PLAN_MOMENTS]);
    assert_int_equal(two.host[DSC_PLAN_MASTER] * 2, one.host[DSC_PLAN_MASTER]);
    assert_int_equal(one.host[DSC_PLAN_ACTIVATIONS], 6000);
    assert_int_equal(one.device_bytes, 0);
    assert_true(two.host[DSC_PLAN_SNAPSHOTS] > 0); // two ranks keep fault tolerance's slots
}

static void test_refusal(void **state) {
    (void)state;
    dsc_config c;
    dsc_memplan_input in;
    dsc_memplan p;
    plan(CFG(""), 1, false, (int64_t)64 << 20, &p, &c, &in); // 384 MiB of state, 64 available
    assert_false(p.fits);
    assert_int_equal(dsc_memplan_check(&in, &p), DSC_ERR_OOM);
    assert_non_null(strstr(dsc_last_error(), "of host memory per rank, 64 MiB available"));
    plan(CFG(""), 1, false, (int64_t)1 << 40, &p, &c, &in);
    assert_true(p.fits);
    assert_int_equal(dsc_memplan_check(&in, &p), DSC_OK);
    char *json = dsc_memplan_json(&p);
    assert_non_null(json);
    assert_non_null(strstr(json, "\"host_bytes\""));
    assert_non_null(strstr(json, "\"device_bytes\": 0"));
    free(json);
}

// One GPU with the optimizer on it: bf16 master, gradients and moments take 8 bytes per
// parameter and an fp32 scratch of the end groups and two layers; a device too small for the
// fp32 master is told that the keys would fit (stage 1: DeepSpeed takes them at ZeRO 1-3 only).
static void test_device_bf16_master(void **state) {
    (void)state;
    dsc_config c, c16;
    dsc_memplan_input in, in16;
    dsc_memplan p, p16;
    plan(CFG(""), 1, true, (int64_t)1 << 40, &p, &c, &in);
    plan("{\"train_micro_batch_size_per_gpu\": 2, \"zero_optimization\": {\"stage\": 1}, "
         "\"bf16\": {\"enabled\": true, \"bf16_master_weights_and_grads\": true, "
         "\"bf16_optimizer_states\": true}, \"optimizer\": {\"type\": \"AdamW\", "
         "\"params\": {\"lr\": 1e-3}}}", 1, true, (int64_t)1 << 40, &p16, &c16, &in16);
    int64_t states16 = p16.device[DSC_PLAN_WEIGHTS] + p16.device[DSC_PLAN_MASTER] +
                       p16.device[DSC_PLAN_MOMENTS] + p16.device[DSC_PLAN_GRADS];
    assert_int_equal(states16, 8 * P + (2 * PER + 2 * PER) * 4); // scratch: 2 ends + 2 slots
    assert_int_equal(p16.device[DSC_PLAN_MASTER], 0);
    in.device_avail = p.device_bytes - (int64_t)(20 << 20); // the fp32 master does not fit
    assert_int_equal(dsc_memplan_compute(&in, &p), DSC_OK);
    assert_false(p.fits);
    assert_int_equal(dsc_memplan_check(&in, &p), DSC_ERR_OOM);
    assert_non_null(strstr(dsc_last_error(), "of device memory"));
    assert_non_null(strstr(dsc_last_error(), "zero_optimization.stage 1 with "
                                             "bf16.bf16_master_weights_and_grads and "
                                             "bf16.bf16_optimizer_states"));
}

static void test_host_limit(void **state) {
    (void)state;
    char src[64];
    setenv("DSC_HOST_MEM_LIMIT", "3M", 1);
    assert_int_equal(dsc_host_mem_available(src, sizeof src), 3 << 20);
    assert_string_equal(src, "DSC_HOST_MEM_LIMIT");
    setenv("DSC_HOST_MEM_LIMIT", "1.5GiB", 1);
    int64_t v = dsc_host_mem_available(src, sizeof src);
    assert_true(v > 0 && v <= (int64_t)3 << 29);
    unsetenv("DSC_HOST_MEM_LIMIT");
    assert_true(dsc_host_mem_available(src, sizeof src) > 0); // MemAvailable at least
}

// LoRA's shape: every group a frozen 4 Mi-element matrix ("base<g>") beside a trained one of
// 16 x 2048 elements ("a<g>").
static const dsc_param_desc *lora_table(void) {
    static dsc_param_desc lt[2 * (L + 2)];
    static char ln[2 * (L + 2)][16];
    for (int g = 0; g < L + 2; g++) {
        snprintf(ln[2 * g], sizeof ln[0], "base%d", g);
        snprintf(ln[2 * g + 1], sizeof ln[0], "a%d", g);
        lt[2 * g] = (dsc_param_desc){.name = ln[2 * g], .ndim = 2, .shape = {2048, 2048},
                                     .group = g, .frozen = true};
        lt[2 * g + 1] = (dsc_param_desc){.name = ln[2 * g + 1], .ndim = 2, .shape = {16, 2048},
                                         .group = g};
    }
    return lt;
}

// LoRA with ZeRO-Offload keeps the base whole on the device in 16 bits; with offload_param the
// device keeps the end groups' base and two layers' of it, and the host adds the layers' base in
// 16 bits.
static void test_lora_offload_param(void **state) {
    (void)state;
    enum { A = 16 * 2048 };
    const dsc_param_desc *lt = lora_table();
    dsc_config c;
    dsc_memplan p, q;
    const char *off = CFG(", \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
                          "{\"device\": \"cpu\"}}");
    const char *offp = CFG(", \"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": "
                           "{\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}");
    for (int k = 0; k < 2; k++) {
        assert_int_equal(dsc_config_load_string(&c, k ? offp : off, 1, NULL, NULL), DSC_OK);
        dsc_memplan_input in = {.config = &c, .params = lt, .nparams = 2 * (L + 2), .n_layer = L,
                                .world = 1, .seq_len = 64, .device = true, .act = act,
                                .host_runtime = 1, .host_avail = -1, .device_avail = -1};
        assert_int_equal(dsc_memplan_compute(&in, k ? &q : &p), DSC_OK);
    }
    // the device: the whole base (6 x 4 Mi x 2 bytes), then two end groups' and two layers'
    int64_t trained_off = p.device[DSC_PLAN_WEIGHTS] - (int64_t)(L + 2) * PER * 2;
    assert_int_equal(trained_off, (int64_t)(L + 2) * A * 2);
    assert_int_equal(q.device[DSC_PLAN_WEIGHTS], 4 * (int64_t)A * 2 + 4 * (int64_t)PER * 2);
    // the host: the engine's fp32 store either way, and the layers' base in 16 bits with offload_param
    assert_int_equal(p.host[DSC_PLAN_WEIGHTS], q.host[DSC_PLAN_WEIGHTS]);
    assert_true(q.host[DSC_PLAN_STAGING] - p.host[DSC_PLAN_STAGING] >= (int64_t)L * PER * 2);
}

// nccl over 4 GPUs with LoRA at stage 3: each GPU keeps its slice of every layer's base and two
// slots of it beside the end groups' (train_gpu_dp.c), the trainable weights likewise; with
// DSC_GPU_STAGE3_PARTITION=0 both whole.
static void test_lora_nccl_stage3(void **state) {
    (void)state;
    enum { A = 16 * 2048, W = 4 };
    const dsc_param_desc *lt = lora_table();
    dsc_config c;
    dsc_memplan p[2];
    assert_int_equal(dsc_config_load_string(&c, CFG(", \"zero_optimization\": {\"stage\": 3}"),
                                            W, NULL, NULL), DSC_OK);
    dsc_memplan_input in = {.config = &c, .params = lt, .nparams = 2 * (L + 2), .n_layer = L,
                            .world = W, .seq_len = 64, .device = true, .nccl = true, .act = act,
                            .host_runtime = 1, .host_avail = -1, .device_avail = -1};
    for (int k = 0; k < 2; k++) {
        if (k) setenv("DSC_GPU_STAGE3_PARTITION", "0", 1);
        assert_int_equal(dsc_memplan_compute(&in, &p[k]), DSC_OK);
        unsetenv("DSC_GPU_STAGE3_PARTITION");
    }
    // partitioned: end groups + two slots + the slices, of the base and of the trained tensors
    int64_t base = (2 * (int64_t)PER + 2 * PER + (int64_t)L * PER / W) * 2;
    int64_t trained = (2 * (int64_t)A + 2 * A + (int64_t)(L + 2) * A / W) * 2;
    assert_int_equal(p[0].device[DSC_PLAN_WEIGHTS], base + trained);
    assert_int_equal(p[1].device[DSC_PLAN_WEIGHTS], (int64_t)(L + 2) * (PER + A) * 2);
    // the gradients: the device's arrays (end groups and two slots, or all) and the partition
    assert_int_equal(p[0].device[DSC_PLAN_GRADS], (4 * (int64_t)A + (L + 2) * A / W) * 4);
    assert_int_equal(p[1].device[DSC_PLAN_GRADS], ((int64_t)(L + 2) * A + (L + 2) * A / W) * 4);
    assert_true(p[0].device_bytes < p[1].device_bytes);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_modes),
        cmocka_unit_test(test_streamed_advice),
        cmocka_unit_test(test_more_gpus_advice),
        cmocka_unit_test(test_cpu_ranks),
        cmocka_unit_test(test_refusal),
        cmocka_unit_test(test_host_limit),
        cmocka_unit_test(test_device_bf16_master),
        cmocka_unit_test(test_lora_offload_param),
        cmocka_unit_test(test_lora_nccl_stage3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
