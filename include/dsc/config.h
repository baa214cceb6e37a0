// dsc/config.h - DeepSpeed's JSON configuration, read into one struct.
//
// Keys, meanings and defaults are DeepSpeed's (docs/config.md lists them all). Every key dsc reads
// is one row of src/config/keys.def; that table drives parsing, validation, defaults, the output of
// `dsc config check` and the documentation.
#ifndef DSC_CONFIG_H
#define DSC_CONFIG_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_CONFIG_STR 256 // longest string value (paths, names)

typedef struct dsc_offload_config {
    char device[16]; // "none", "cpu", "nvme"
    char nvme_path[DSC_CONFIG_STR];
    int64_t buffer_count;
    double buffer_size;
    double max_in_cpu;
    bool pin_memory;
    bool pipeline_read, pipeline_write, fast_init;
    double ratio;
} dsc_offload_config;

typedef struct dsc_config {
    // batch sizes; -1 = not given (before resolution). After dsc_config_resolve all three are > 0.
    int64_t train_batch_size;
    int64_t train_micro_batch_size_per_gpu;
    int64_t gradient_accumulation_steps;
    int64_t steps_per_print;
    bool wall_clock_breakdown;
    bool memory_breakdown;
    bool dump_state;
    double gradient_clipping;
    bool prescale_gradients;
    double gradient_predivide_factor;
    bool sparse_gradients;
    bool zero_allow_untested_optimizer;
    bool zero_force_ds_cpu_optimizer;
    bool disable_allgather;
    bool dataloader_drop_last;
    int64_t vocabulary_size; // 0 = not given; DeepSpeed only warns when it is not a multiple of 8
    char communication_data_type[16]; // "" (follow the training dtype), "fp32", "fp16", "bf16"
    char seq_parallel_communication_data_type[16];
    // (dsc) bf16 master weights' rounding after each step: "nearest" (even; DeepSpeed's) or
    // "stochastic" (unbiased, from a hash of the step and the element's index)
    char bf16_master_rounding[16];

    struct {
        char type[32]; // "" = none given
        double lr;
        double betas[2];
        double eps;
        double weight_decay;
        bool adam_w_mode;
        bool bias_correction;
        bool amsgrad;
        bool torch_adam;
        bool fp32_optimizer_states;
        double momentum;
        double dampening;
        bool nesterov;
        double max_grad_norm; // DeepSpeed zeroes it unless fp16 is enabled
    } optimizer;

    struct {
        char type[32]; // "" = none
        // Numbers are doubles: DeepSpeed computes with whatever number it is given (fractional
        // step counts included). Which keys a schedule takes, and null: engine/sched_config.c.
        // WarmupLR / WarmupDecayLR / WarmupCosineLR
        double warmup_min_lr, warmup_max_lr;
        double warmup_num_steps, total_num_steps;
        char warmup_type[16];
        double warmup_min_ratio, cos_min_ratio;
        // OneCycle
        double cycle_min_lr, cycle_max_lr, decay_lr_rate;
        double cycle_first_step_size, cycle_second_step_size;
        double cycle_first_stair_count, cycle_second_stair_count, decay_step_size;
        bool cycle_momentum;
        double cycle_min_mom, cycle_max_mom, decay_mom_rate;
        // LRRangeTest
        double lr_range_test_min_lr, lr_range_test_step_rate;
        double lr_range_test_step_size;
        bool lr_range_test_staircase;
        double last_batch_iteration;
        // The first key under scheduler.params that is no DeepSpeed schedule's parameter ("" =
        // none): DeepSpeed passes every key to the scheduler's constructor, which then fails.
        char unknown_param[64];
    } scheduler;

    struct {
        bool enabled;
        bool auto_cast;
        double loss_scale; // 0 = dynamic
        int64_t initial_scale_power;
        int64_t loss_scale_window;
        int64_t hysteresis;
        bool consecutive_hysteresis;
        double min_loss_scale;
        bool fp16_master_weights_and_grads;
    } fp16;

    struct {
        bool enabled;
        bool immediate_grad_update;
        bool check_grad_overflow;
        bool bf16_master_weights_and_grads;
        bool bf16_optimizer_states;
    } bf16;

    struct {
        int64_t stage;
        bool contiguous_gradients;
        bool reduce_scatter;
        double reduce_bucket_size;
        bool use_multi_rank_bucket_allreduce;
        bool allgather_partitions;
        double allgather_bucket_size;
        bool overlap_comm; // effective value: dsc_config_overlap_comm()
        bool load_from_fp32_weights;
        bool elastic_checkpoint;
        dsc_offload_config offload_param;
        dsc_offload_config offload_optimizer;
        double sub_group_size;
        bool cpu_offload;
        bool cpu_offload_param;
        bool cpu_offload_use_pin_memory;
        double prefetch_bucket_size;
        double param_persistence_threshold;
        double model_persistence_threshold;
        double max_live_parameters;
        double max_reuse_distance;
        bool gather_16bit_weights_on_model_save;
        bool ignore_unused_parameters;
        bool legacy_stage1;
        bool round_robin_gradients;
        int64_t zero_hpz_partition_size;
        bool zero_quantized_weights;
        bool zero_quantized_nontrainable_weights;
        bool zero_quantized_gradients;
        int64_t mics_shard_size;
        bool mics_hierarchical_params_gather;
        bool memory_efficient_linear;
        bool pipeline_loading_checkpoint;
        bool override_module_apply;
        bool log_trace_cache_warnings;
        int64_t module_granularity_threshold;
        bool use_all_reduce_for_fetch_params;
    } zero_optimization;

    struct {
        char tag_validation[16]; // "Ignore", "Warn", "Fail"
        bool load_universal;
        bool use_node_local_storage;
        // dsc additions
        double interval_s;
        int64_t interval_steps;
        bool validate;
        bool async;
        int64_t keep_last;
    } checkpoint;

    struct {
        bool enabled;
        char output_path[DSC_CONFIG_STR];
        char job_name[DSC_CONFIG_STR];
    } tensorboard, csv_monitor;

    struct {
        bool enabled;
        char group[DSC_CONFIG_STR], team[DSC_CONFIG_STR], project[DSC_CONFIG_STR];
    } wandb;

    struct {
        bool enabled;
        char workspace[DSC_CONFIG_STR], project[DSC_CONFIG_STR], experiment_name[DSC_CONFIG_STR];
        int64_t samples_log_interval;
        bool online;
    } comet;

    struct {
        bool enabled;
        int64_t port;
    } prometheus; // dsc addition

    struct {
        bool enabled, verbose, prof_all, debug;
        char prof_ops[512]; // JSON list of op names, "" when not given
    } comms_logger;

    // (dsc) threshold actions of the monitor: the JSON list as given, "" when not given
    char monitor_actions[2048];

    struct {
        bool enabled;
        double recompute_fwd_factor;
        int64_t profile_step, module_depth, top_modules;
        bool detailed;
        char output_file[DSC_CONFIG_STR];
    } flops_profiler;

    // (dsc) LoRA: PEFT's LoraConfig (docs/lora.md); on when dsc_config_given(cfg, "lora")
    struct {
        int64_t r;
        double lora_alpha, lora_dropout;
        char target_modules[1024];    // compact JSON as given ("" = the family's default)
        bool use_rslora;
        char bias[16];
        char init_lora_weights[64];   // compact JSON as given ("" = true)
        char modules_to_save[1024];   // compact JSON list ("" = none)
    } lora;

    // (dsc) FP8 products on the GPU (docs/fp8.md)
    struct {
        bool enabled;
        char fp8_format[16]; // "hybrid" (E4M3 forward, E5M2 gradients) or "e4m3"
        char recipe[16];     // "current": each tensor scaled by its own amax just before use
        int64_t margin;      // scales divided by 2^margin
    } fp8;

    struct {
        bool partition_activations, cpu_checkpointing, contiguous_memory_optimization;
        int64_t number_checkpoints;
        bool synchronize_checkpoint_boundary, profile;
    } activation_checkpointing;

    struct {
        bool enabled;
        int64_t max_out_tokens, inference_tp_size;
        bool release_inference_cache, pin_parameters;
        int64_t tp_gather_partition_size;
    } hybrid_engine;

    struct {
        int64_t block_size, queue_depth, intra_op_parallelism;
        bool single_submit, overlap_events, use_gds;
    } aio;

    struct {
        bool enabled;
        int64_t max_train_batch_size, min_gpus, max_gpus, model_parallel_size, num_gpus_per_node;
        double min_time, version;
        bool prefer_larger_batch, ignore_non_elastic_batch_info;
        int64_t micro_batch_sizes[16];
        int64_t n_micro_batch_sizes;
    } elasticity;

    // dsc additions
    struct {
        double comm_timeout_s;
        double step_timeout_s;
        char on_failure[16]; // "degrade", "restart", "abort"
        bool replicate;
    } fault_tolerance;

    struct {
        double defrag_interval_s;
        double defrag_threshold;
    } memory;

    // bookkeeping: which rows were given in the file (indexed like keys.def; bit 0 = a value was
    // taken from the file, see dsc_config_given)
    unsigned char given[512];
    int world_size; // the world size the batch triple was resolved for (0 = unresolved)
} dsc_config;

// Fill every field with DeepSpeed's default (batch sizes unset).
void dsc_config_defaults(dsc_config *cfg);

// Warnings (unknown keys, keys read but not implemented) go to this callback; NULL = dsc's log.
typedef void (*dsc_config_warn_fn)(void *user, const char *message);

// Parse a config file or its text and resolve batch sizes for `world_size` ranks (0: parse and
// check only). The syntax is DeepSpeed's loader's (Hjson: JSON plus comments, unquoted keys and
// strings, optional commas; see docs/config.md); duplicate keys are an error.
// Errors name the file, line/column or key path, what was expected and what was found.
dsc_status dsc_config_load_file(dsc_config *cfg, const char *path, int world_size,
                                dsc_config_warn_fn warn, void *user);
dsc_status dsc_config_load_string(dsc_config *cfg, const char *json, int world_size,
                                  dsc_config_warn_fn warn, void *user);
// dsc_config_load_file that also hands back the file's text (*text, NUL-terminated, caller frees;
// NULL on failure): what was read, for a file that can be read only once (a pipe).
dsc_status dsc_config_load_file_text(dsc_config *cfg, const char *path, int world_size,
                                     dsc_config_warn_fn warn, void *user, char **text);

// DeepSpeed's batch rule: any two of the triple given derive the third (with DeepSpeed's integer
// division); all three must then satisfy train = micro * gas * world_size. With elasticity enabled
// the triple comes from DeepSpeed's elastic batch computation for this world size instead.
dsc_status dsc_config_resolve_batch(dsc_config *cfg, int world_size);

// True when the key path (e.g. "scheduler.params.warmup_num_steps") was present in the input.
bool dsc_config_given(const dsc_config *cfg, const char *path);

// Effective overlap_comm (DeepSpeed: defaults to true at stage 3).
bool dsc_config_overlap_comm(const dsc_config *cfg);

// Print every resolved value, one `key = value` per line (or one nested JSON object when json).
// `out` is a FILE*.
void dsc_config_print(const dsc_config *cfg, void *out, bool json);

// Write every key dsc reads as a markdown table (key path, type, default, meaning; one row of
// src/config/keys.def each), as docs/config.md and `dsc config keys` show it. `out` is a FILE*.
void dsc_config_write_doc(void *out);

#ifdef __cplusplus
}
#endif
#endif
