#!/usr/bin/env python3
"""Write the parity corpus, tests/parity/configs/ (committed; rerun after editing this list).

Each entry is a file name and its exact text. Names say what the file probes: batch_* (the batch
triple; every file is checked at world sizes 1, 2, 3 and 8), type_* (typing corners: strings for
numbers and booleans, null, "auto"), rule_* (rules across keys), syntax_* (what DeepSpeed's loader
accepts beyond JSON), bad_* (files both must reject), elastic_*, unimpl_* (sections dsc lacks),
hf_* (Hugging Face style files, with and without "auto").
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "configs")
CASES = {}


def add(name, text):
    assert name not in CASES, name
    CASES[name] = text


def cfg(name, d):
    """A JSON file of the dict d."""
    add(name + ".json", json.dumps(d, indent=2) + "\n")


OK = {"train_micro_batch_size_per_gpu": 2}  # a batch that fits every world size


def with_ok(**kw):
    d = dict(OK)
    d.update(kw)
    return d


# ---- batch triple ----
for tb in (1, 4, 10, 24, 32, 48):
    cfg(f"batch_tb{tb}", {"train_batch_size": tb})
for mb in (1, 3):
    cfg(f"batch_mb{mb}", {"train_micro_batch_size_per_gpu": mb})
for tb, mb in ((32, 4), (32, 3), (24, 8), (48, 2), (16, 16), (96, 4)):
    cfg(f"batch_tb{tb}_mb{mb}", {"train_batch_size": tb, "train_micro_batch_size_per_gpu": mb})
for tb, ga in ((32, 4), (24, 3), (10, 2), (48, 6), (96, 2)):
    cfg(f"batch_tb{tb}_ga{ga}", {"train_batch_size": tb, "gradient_accumulation_steps": ga})
for mb, ga in ((2, 3), (1, 1), (4, 8)):
    cfg(f"batch_mb{mb}_ga{ga}", {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga})
for tb, mb, ga in ((32, 4, 1), (24, 1, 3), (48, 2, 8), (48, 2, 3), (64, 4, 2), (16, 2, 1)):
    cfg(f"batch_tb{tb}_mb{mb}_ga{ga}", {"train_batch_size": tb, "train_micro_batch_size_per_gpu": mb,
                                        "gradient_accumulation_steps": ga})
cfg("batch_ga_only", {"gradient_accumulation_steps": 2})
cfg("batch_none", {"steps_per_print": 5})
cfg("batch_tb0", {"train_batch_size": 0})
cfg("batch_mb0", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 0})
cfg("batch_ga0", {"train_batch_size": 8, "gradient_accumulation_steps": 0})
cfg("batch_negative", {"train_batch_size": -8, "train_micro_batch_size_per_gpu": -2})
cfg("batch_null_ga", {"train_batch_size": 16, "gradient_accumulation_steps": None})
cfg("batch_null_all", {"train_batch_size": None, "train_micro_batch_size_per_gpu": 2})
cfg("batch_auto_tb", {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2,
                      "gradient_accumulation_steps": 3})
cfg("batch_auto_mb", {"train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto"})
cfg("batch_string_tb", {"train_batch_size": "32"})
add("batch_float_whole.json", '{"train_batch_size": 4.8e1, "train_micro_batch_size_per_gpu": 2.0}\n')
add("batch_float_fraction.json", '{"train_micro_batch_size_per_gpu": 2.5, "gradient_accumulation_steps": 2}\n')
cfg("batch_bool_mb", {"train_batch_size": 8, "train_micro_batch_size_per_gpu": True})

# ---- typing: pydantic sections (zero_optimization, fp16, bf16, monitors, ...) ----
for tag, v in (("str2", "2"), ("str2p0", "2.0"), ("float2", 2.0), ("true", True), ("auto", "auto"),
               ("null", None), ("4", 4), ("x", "x"), ("minus1", -1), ("str_space", " 3 "),
               ("list", [2])):
    cfg(f"type_zero_stage_{tag}", with_ok(zero_optimization={"stage": v}))
for tag, v in (("str_true", "true"), ("yes", "yes"), ("On", "On"), ("one", 1), ("str1", "1"),
               ("str_false", "false"), ("maybe", "maybe"), ("two", 2), ("null", None),
               ("auto", "auto"), ("float1", 1.0), ("float_half", 0.5), ("str_space", " true")):
    cfg(f"type_fp16_enabled_{tag}", with_ok(fp16={"enabled": v}))
cfg("type_fp16_numbers_as_strings", with_ok(fp16={"enabled": True, "loss_scale": "128",
                                                  "initial_scale_power": "12", "loss_scale_window": "500",
                                                  "hysteresis": "3", "min_loss_scale": "2"}))
cfg("type_fp16_loss_scale_exp_string", with_ok(fp16={"enabled": True, "loss_scale": "1e3"}))
cfg("type_fp16_loss_scale_underscore", with_ok(fp16={"enabled": True, "loss_scale": "1_024"}))
cfg("type_fp16_power_float", with_ok(fp16={"enabled": True, "initial_scale_power": 16.0}))
cfg("type_fp16_power_fraction", with_ok(fp16={"enabled": True, "initial_scale_power": 16.5}))
cfg("type_fp16_power_str_fraction", with_ok(fp16={"enabled": True, "initial_scale_power": "16.00"}))
cfg("type_fp16_min_scale_half", with_ok(fp16={"enabled": True, "min_loss_scale": 0.5}))
cfg("type_fp16_min_scale_float", with_ok(fp16={"enabled": True, "min_loss_scale": 4.0}))
cfg("type_fp16_null", with_ok(fp16=None))
cfg("type_fp16_auto_section", with_ok(fp16="auto"))
cfg("type_fp16_all_auto", with_ok(fp16={"enabled": "auto", "loss_scale": "auto",
                                        "initial_scale_power": "auto", "hysteresis": "auto"}))
cfg("type_fp16_unknown_key", with_ok(fp16={"enabled": True, "bogus": 1}))
add("type_zero_bucket_5e8.json", '{"train_batch_size": 8, "zero_optimization": {"stage": 2, '
    '"reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8}}\n')
cfg("type_zero_bucket_string", with_ok(zero_optimization={"stage": 2, "reduce_bucket_size": "500000000"}))
cfg("type_zero_bucket_string_exp", with_ok(zero_optimization={"stage": 2, "reduce_bucket_size": "5e8"}))
add("type_zero_bucket_fraction.json", '{"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 1.5}}\n')
add("type_zero_bucket_1e20.json", '{"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 1e20}}\n')
add("type_zero_bucket_1e10.json", '{"train_batch_size": 8, "zero_optimization": {"sub_group_size": 1e10}}\n')
cfg("type_zero_bucket_negative", with_ok(zero_optimization={"reduce_bucket_size": -1}))
cfg("type_zero_bucket_zero", with_ok(zero_optimization={"allgather_bucket_size": 0}))
cfg("type_zero_overlap_null_stage3", with_ok(zero_optimization={"stage": 3, "overlap_comm": None}))
cfg("type_zero_overlap_str", with_ok(zero_optimization={"stage": 3, "overlap_comm": "false"}))
cfg("type_zero_overlap_auto", with_ok(zero_optimization={"stage": 3, "overlap_comm": "auto"}))
cfg("type_zero_contiguous_null", with_ok(zero_optimization={"contiguous_gradients": None}))
cfg("type_zero_all_auto", with_ok(zero_optimization={"stage": "auto", "reduce_bucket_size": "auto",
                                                     "stage3_prefetch_bucket_size": "auto",
                                                     "stage3_param_persistence_threshold": "auto"}))
cfg("type_zero_hf_stage3", with_ok(zero_optimization={
    "stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
    "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
    "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": True}))
cfg("type_zero_mics_string", with_ok(zero_optimization={"mics_shard_size": "4"}))
cfg("type_zero_granularity_negative", with_ok(zero_optimization={"stage3_module_granularity_threshold": -5}))
cfg("type_zero_unknown_key", with_ok(zero_optimization={"stage": 1, "bogus": True}))
cfg("type_zero_null", with_ok(zero_optimization=None))
cfg("type_zero_auto", with_ok(zero_optimization="auto"))
cfg("type_zero_int", with_ok(zero_optimization=1))
cfg("type_zero_bool_true", with_ok(zero_optimization=True))
cfg("type_zero_bool_false", with_ok(zero_optimization=False))
cfg("type_zero_bool_allgather_size", with_ok(zero_optimization=True, allgather_size=1000000))
cfg("type_offload_device_upper", with_ok(zero_optimization={"stage": 2, "offload_optimizer": {"device": "CPU"}}))
cfg("type_offload_device_auto", with_ok(zero_optimization={"stage": 3, "offload_param": {"device": "auto"}}))
cfg("type_offload_section_auto", with_ok(zero_optimization={"stage": 2, "offload_optimizer": "auto"}))
cfg("type_offload_section_null", with_ok(zero_optimization={"stage": 2, "offload_optimizer": None}))
cfg("type_offload_strings", with_ok(zero_optimization={"stage": 3, "offload_optimizer": {
    "device": "nvme", "nvme_path": "/local_nvme", "buffer_count": "5", "pin_memory": "yes",
    "pipeline_read": "on", "ratio": "1"}, "offload_param": {"device": "cpu", "buffer_size": "100000000"}}))
cfg("type_offload_nvme_path_int", with_ok(zero_optimization={"offload_param": {"nvme_path": 5}}))
cfg("type_offload_nvme_path_null", with_ok(zero_optimization={"offload_param": {"device": "cpu", "nvme_path": None}}))
cfg("type_offload_unknown_key", with_ok(zero_optimization={"offload_param": {"device": "cpu", "bogus": 1}}))
cfg("type_offload_ratio_string", with_ok(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": "0.5"}}))
cfg("type_offload_ratio_big", with_ok(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}))
for tag, v in (("str_true", "true"), ("null", None), ("auto", "auto"), ("T", "T")):
    cfg(f"type_bf16_enabled_{tag}", with_ok(bf16={"enabled": v}))
cfg("type_bf16_immediate_default", with_ok(bf16={"enabled": True}))
cfg("type_bf16_null", with_ok(bf16=None))
cfg("type_bf16_auto", with_ok(bf16="auto"))
cfg("type_bfloat16_old_name", with_ok(bfloat16={"enabled": True}))
cfg("type_bfloat16_null", with_ok(bfloat16=None))
cfg("type_bfloat16_shadowed", with_ok(bf16={"enabled": False}, bfloat16={"enabled": "garbage"}))
cfg("type_bf16_null_bfloat16", with_ok(bf16=None, bfloat16={"enabled": True}))
cfg("type_tensorboard_auto", with_ok(tensorboard="auto"))
cfg("type_tensorboard_null", with_ok(tensorboard=None))
cfg("type_tensorboard_strings", with_ok(tensorboard={"enabled": "true", "output_path": "runs/", "job_name": "j"}))
cfg("type_tensorboard_path_int", with_ok(tensorboard={"enabled": True, "output_path": 5}))
cfg("type_tensorboard_field_auto", with_ok(tensorboard={"enabled": "auto", "output_path": "auto"}))
cfg("type_csv_monitor", with_ok(csv_monitor={"enabled": True, "output_path": "csv/", "job_name": "x"}))
cfg("type_wandb_group_null", with_ok(wandb={"enabled": False, "group": None, "project": "p"}))
cfg("type_wandb_project_null", with_ok(wandb={"project": None}))
cfg("type_comet_online_null", with_ok(comet={"enabled": False, "online": None, "samples_log_interval": "50"}))
cfg("type_comet_unknown_key", with_ok(comet={"enabled": False, "bogus": 1}))
cfg("type_comms_logger", with_ok(comms_logger={"enabled": "1", "verbose": False, "prof_all": "no", "prof_ops": ["all_reduce"], "debug": 0}))
cfg("type_comms_logger_null", with_ok(comms_logger=None))
cfg("type_comms_logger_empty", with_ok(comms_logger={}))
cfg("type_comms_logger_prof_ops_string", with_ok(comms_logger={"prof_ops": "all_reduce"}))
cfg("type_hybrid_engine_strings", with_ok(hybrid_engine={"enabled": "yes", "max_out_tokens": "256", "inference_tp_size": 2.0}))
cfg("type_hybrid_engine_null", with_ok(hybrid_engine=None))

# ---- typing: plain lookups (top level, optimizer, scheduler, checkpoint, ...) ----
cfg("type_steps_per_print_string", with_ok(steps_per_print="10"))
cfg("type_steps_per_print_zero", with_ok(steps_per_print=0))
cfg("type_steps_per_print_null", with_ok(steps_per_print=None))
cfg("type_steps_per_print_5", with_ok(steps_per_print=5))
cfg("type_gradient_clipping_auto", with_ok(gradient_clipping="auto"))
cfg("type_gradient_clipping_string", with_ok(gradient_clipping="1.0"))
cfg("type_gradient_clipping_null", with_ok(gradient_clipping=None))
cfg("type_gradient_clipping_negative", with_ok(gradient_clipping=-1))
cfg("type_gradient_clipping_int", with_ok(gradient_clipping=1))
cfg("type_prescale_string", with_ok(prescale_gradients="false"))
cfg("type_prescale_int", with_ok(prescale_gradients=1))
cfg("type_predivide", with_ok(gradient_predivide_factor=2))
cfg("type_wall_clock_null", with_ok(wall_clock_breakdown=None))
cfg("type_wall_clock_string", with_ok(wall_clock_breakdown="true"))
cfg("type_wall_clock_int", with_ok(wall_clock_breakdown=1))
cfg("type_flops_enabled_null", with_ok(flops_profiler={"enabled": None}))
cfg("type_flops_enabled", with_ok(flops_profiler={"enabled": True, "profile_step": 2, "module_depth": 3, "top_modules": 2, "detailed": False}))
cfg("type_flops_null", with_ok(flops_profiler=None))
for tag, v in (("FP16", "FP16"), ("bf16", "bf16"), ("fp8", "fp8"), ("null", None), ("int", 16), ("auto", "auto")):
    cfg(f"type_comm_dtype_{tag}", with_ok(communication_data_type=v))
cfg("type_seq_comm_dtype", with_ok(seq_parallel_communication_data_type="BF16"))
for tag, v in (("fail", "fail"), ("FAIL", "FAIL"), ("ignore", "Ignore"), ("bogus", "bogus"), ("null", None), ("int", 1)):
    cfg(f"type_checkpoint_tag_{tag}", with_ok(checkpoint={"tag_validation": v}))
cfg("type_checkpoint_null", with_ok(checkpoint=None))
cfg("type_checkpoint_empty", with_ok(checkpoint={}))
cfg("type_checkpoint_universal", with_ok(checkpoint={"load_universal": True, "use_node_local_storage": True}))
cfg("type_optimizer_null", with_ok(optimizer=None))
cfg("type_optimizer_list", with_ok(optimizer=[]))
cfg("type_optimizer_type_int", with_ok(optimizer={"type": 5}))
cfg("type_optimizer_type_null", with_ok(optimizer={"type": None, "params": {"lr": 0.1}}))
for t in ("SGD", "sgd", "Lamb", "AdamW", "adam", "Adagrad", "RMSprop"):
    cfg(f"type_optimizer_type_{t}", with_ok(optimizer={"type": t, "params": {"lr": 0.01}}))
cfg("type_optimizer_params_null", with_ok(optimizer={"type": "Adam", "params": None}))
cfg("type_optimizer_lr_auto", with_ok(optimizer={"type": "AdamW", "params": {"lr": "auto"}}))
cfg("type_optimizer_lr_string", with_ok(optimizer={"type": "AdamW", "params": {"lr": "1e-3"}}))
cfg("type_optimizer_betas_auto", with_ok(optimizer={"type": "AdamW", "params": {"betas": "auto"}}))
cfg("type_optimizer_full", with_ok(optimizer={"type": "Adam", "params": {
    "lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "adam_w_mode": False,
    "bias_correction": True, "torch_adam": False}}))
cfg("type_optimizer_max_grad_norm_fp32", with_ok(optimizer={"type": "Adam", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}))
cfg("type_optimizer_max_grad_norm_fp16", with_ok(fp16={"enabled": True}, optimizer={"type": "Adam", "params": {"lr": 1e-3, "max_grad_norm": 1.0}}))
cfg("type_optimizer_max_grad_norm_string", with_ok(optimizer={"type": "Adam", "params": {"max_grad_norm": "1"}}))
cfg("type_scheduler_null", with_ok(scheduler=None))
cfg("type_scheduler_warmup", with_ok(scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 100, "warmup_type": "linear"}}))
cfg("type_scheduler_decay", with_ok(scheduler={"type": "WarmupDecayLR", "params": {"total_num_steps": 1000, "warmup_num_steps": 10}}))
cfg("type_scheduler_auto", with_ok(scheduler={"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_max_lr": "auto"}}))
cfg("type_scheduler_onecycle", with_ok(scheduler={"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 100, "cycle_momentum": False}}))
cfg("type_scheduler_unknown_type", with_ok(scheduler={"type": "StepLR", "params": {"step_size": 10}}))
cfg("type_activation_null", with_ok(activation_checkpointing=None))
cfg("type_activation", with_ok(activation_checkpointing={"partition_activations": True, "number_checkpoints": 4, "contiguous_memory_optimization": False, "cpu_checkpointing": False}))
cfg("type_activation_string", with_ok(activation_checkpointing={"partition_activations": "true"}))
cfg("type_aio_null", with_ok(aio=None))
cfg("type_aio", with_ok(aio={"block_size": 262144, "queue_depth": 16, "intra_op_parallelism": 2, "single_submit": True, "overlap_events": False}))
cfg("type_aio_auto", with_ok(aio={"block_size": "auto"}))
cfg("type_aio_thread_count", with_ok(aio={"thread_count": 4}))
cfg("type_dataloader_drop_last", with_ok(dataloader_drop_last=True, sparse_gradients=True, dump_state=False, memory_breakdown=True))
cfg("type_unknown_top_level", with_ok(my_own_key={"a": 1}, vocabulary_size=50304))
cfg("type_dsc_additions", with_ok(fault_tolerance={"comm_timeout_s": 10, "on_failure": "abort"},
                                  checkpoint={"interval_steps": 100, "keep_last": 2}, memory={"defrag_interval_s": 60}))

# ---- rules across keys ----
cfg("rule_fp16_and_bf16", with_ok(fp16={"enabled": True}, bf16={"enabled": True}))
cfg("rule_fp16_and_bf16_strings", with_ok(fp16={"enabled": "true"}, bf16={"enabled": "false"}))
cfg("rule_cpu_offload", with_ok(zero_optimization={"stage": 2, "cpu_offload": True}))
cfg("rule_cpu_offload_param", with_ok(zero_optimization={"stage": 3, "cpu_offload_param": True}))
cfg("rule_cpu_offload_and_section", with_ok(zero_optimization={"stage": 2, "cpu_offload": False, "offload_optimizer": {"device": "cpu"}}))
cfg("rule_cpu_offload_null_and_section", with_ok(zero_optimization={"stage": 2, "cpu_offload": None, "offload_optimizer": {"device": "cpu"}}))
cfg("rule_cpu_offload_auto_and_section", with_ok(zero_optimization={"stage": 2, "cpu_offload": "auto", "offload_optimizer": {"device": "cpu"}}))
cfg("rule_cpu_offload_pin_memory", with_ok(zero_optimization={"stage": 2, "cpu_offload": True, "cpu_offload_use_pin_memory": True}))
cfg("rule_offload_ratio_stage2", with_ok(zero_optimization={"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}))
cfg("rule_offload_ratio_stage3", with_ok(zero_optimization={"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}))
cfg("rule_prefetch_both_spellings", with_ok(zero_optimization={"stage": 3, "prefetch_bucket_size": 5, "stage3_prefetch_bucket_size": 7}))
cfg("rule_prefetch_short_spelling", with_ok(zero_optimization={"stage": 3, "prefetch_bucket_size": 5, "max_live_parameters": 1000, "param_persistence_threshold": 10}))
cfg("rule_gather_fp16_deprecated", with_ok(zero_optimization={"stage": 3, "stage3_gather_fp16_weights_on_model_save": True}))
cfg("rule_gather_fp16_and_16bit", with_ok(zero_optimization={"stage": 3, "stage3_gather_fp16_weights_on_model_save": True, "stage3_gather_16bit_weights_on_model_save": False}))
cfg("rule_fp16_master_stage0", with_ok(fp16={"enabled": True, "fp16_master_weights_and_grads": True}))
cfg("rule_fp16_master_stage2", with_ok(fp16={"enabled": True, "fp16_master_weights_and_grads": True}, zero_optimization={"stage": 2}))
cfg("rule_bf16_master_stage0", with_ok(bf16={"enabled": True, "bf16_master_weights_and_grads": True}))
cfg("rule_bf16_master_stage1", with_ok(bf16={"enabled": True, "bf16_master_weights_and_grads": True, "bf16_optimizer_states": True}, zero_optimization={"stage": 1}))
cfg("rule_bf16_states_without_master", with_ok(bf16={"enabled": True, "bf16_optimizer_states": True}, zero_optimization={"stage": 1}))
cfg("rule_flops_sets_wall_clock", with_ok(flops_profiler={"enabled": True}, wall_clock_breakdown=False))
add("rule_duplicate_top.json", '{"train_batch_size": 8, "train_batch_size": 8}\n')
add("rule_duplicate_nested.json", '{"train_batch_size": 8, "fp16": {"enabled": true, "enabled": false}}\n')
add("rule_duplicate_in_unknown.json", '{"train_batch_size": 8, "mine": {"a": 1, "a": 2}}\n')

# ---- elasticity ----
EL = {"enabled": True, "max_train_batch_size": 2000, "micro_batch_sizes": [2, 4, 6], "min_gpus": 1,
      "max_gpus": 10000, "min_time": 20, "version": 0.1}
cfg("elastic_v01", {"elasticity": EL})
cfg("elastic_v01_small", {"elasticity": dict(EL, max_train_batch_size=100, micro_batch_sizes=[1, 3], max_gpus=16)})
cfg("elastic_v01_prefer_smaller", {"elasticity": dict(EL, prefer_larger_batch=False)})
cfg("elastic_v02", {"elasticity": dict(EL, version=0.2)})
cfg("elastic_v02_nodes", {"elasticity": dict(EL, version=0.2, num_gpus_per_node=2, model_parallel_size=1)})
cfg("elastic_v02_mp2", {"elasticity": dict(EL, version=0.2, num_gpus_per_node=4, model_parallel_size=2)})
cfg("elastic_v02_odd", {"elasticity": dict(EL, version=0.2, max_train_batch_size=90, micro_batch_sizes=[5, 7], max_gpus=9)})
cfg("elastic_v01_mp2", {"elasticity": dict(EL, model_parallel_size=2)})
cfg("elastic_v03", {"elasticity": dict(EL, version=0.3)})
cfg("elastic_batch_keys", {"train_batch_size": 8, "elasticity": EL})
cfg("elastic_batch_keys_ignored", {"train_batch_size": 8, "elasticity": dict(EL, ignore_non_elastic_batch_info=True)})
cfg("elastic_missing_micro", {"elasticity": {"enabled": True, "max_train_batch_size": 100}})
cfg("elastic_min_over_max", {"elasticity": dict(EL, min_gpus=8, max_gpus=4)})
cfg("elastic_micro_too_big", {"elasticity": dict(EL, max_train_batch_size=4, micro_batch_sizes=[8])})
cfg("elastic_disabled", {"train_batch_size": 8, "elasticity": {"enabled": False, "max_train_batch_size": 100}})
cfg("elastic_null", {"train_batch_size": 8, "elasticity": None})

# ---- sections dsc does not implement ----
cfg("unimpl_amp_enabled", with_ok(amp={"enabled": False, "opt_level": "O1"}))
cfg("unimpl_amp_without_enabled", with_ok(amp={"opt_level": "O1"}))
cfg("unimpl_compile_ok", with_ok(compile={"deepcompile": False}))
cfg("unimpl_compile_unknown_key", with_ok(compile={"bogus": True}))
cfg("unimpl_eigenvalue", with_ok(eigenvalue={"enabled": True, "max_iter": 50}))
cfg("unimpl_pld_without_enabled", with_ok(progressive_layer_drop={"theta": 0.5}))
cfg("unimpl_pipeline", with_ok(pipeline={"stages": "auto", "partition": "best"}))
cfg("unimpl_data_types", with_ok(data_types={"grad_accum_dtype": "fp32"}))

# ---- syntax: what DeepSpeed's loader (hjson) takes ----
add("syntax_comments.json", """// a comment
{
  # hash comment
  "train_batch_size": 16, /* block */
  "fp16": {"enabled": true} // trailing
}
""")
add("syntax_unquoted_keys.hjson", """{
  train_batch_size: 16
  gradient_accumulation_steps: 2
  zero_optimization: { stage: 2 }
}
""")
add("syntax_no_braces.hjson", """train_micro_batch_size_per_gpu: 2
optimizer: {
  type: AdamW
  params: { lr: 3e-4, weight_decay: 0.01 }
}
""")
add("syntax_trailing_commas.json", '{"train_batch_size": 16, "fp16": {"enabled": true,}, "optimizer": {"type": "Adam", "params": {"betas": [0.9, 0.99,],},},}\n')
add("syntax_no_commas.json", '{"train_batch_size": 16 "fp16": {"enabled": true} "steps_per_print": 3}\n')
add("syntax_quoteless_strings.hjson", """{
  train_batch_size: 16
  optimizer: { type: Adam }
  scheduler: { type: WarmupLR, params: { warmup_type: linear } }
  communication_data_type: bf16
  tensorboard: { enabled: true, output_path: runs/with spaces/, job_name: my job # not a comment }
}
""")
add("syntax_quoteless_with_comment.hjson", """{
  train_batch_size: 16 # a number, then a comment
  steps_per_print: 5 // also
  fp16: { enabled: true /* block */ }
}
""")
add("syntax_quoteless_number_text.hjson", """{
  train_batch_size: 16 samples
}
""")
add("syntax_single_quotes.json", "{'train_batch_size': 16, 'optimizer': {'type': 'Adam', 'params': {'lr': 0.001}}}\n")
add("syntax_multiline_string.hjson", """{
  train_batch_size: 16
  tensorboard: {
    output_path:
      '''
      runs/
      '''
  }
}
""")
add("syntax_crlf.json", '{\r\n  "train_batch_size": 16,\r\n  "fp16": {"enabled": true}\r\n}\r\n')
add("syntax_cr_only.json", '{\r  "train_batch_size": 16,\r  "steps_per_print": 2\r}\r')
add("syntax_bom.json", '\ufeff{"train_batch_size": 16}\n')
add("syntax_numbers.json", '{"train_batch_size": 1.6e1, "gradient_clipping": 1E0, "fp16": {"enabled": true, "loss_scale": -0.0, "initial_scale_power": 1.2e1}, "zero_optimization": {"reduce_bucket_size": 5E+8}}\n')
add("syntax_escapes.json", '{"train_batch_size": 16, "optimizer": {"type": "\\u0041dam"}, "tensorboard": {"output_path": "a\\/b\\tc"}}\n')
add("syntax_keyword_then_text.hjson", "{\n  train_batch_size: 16\n  fp16: { enabled: true story }\n}\n")
add("syntax_stage_comment.hjson", "{\n  train_batch_size: 16\n  zero_optimization: { stage: 2 # two\n  }\n}\n")
add("syntax_empty_object.json", "{}\n")
add("syntax_empty_file.json", "")
add("syntax_comment_only.hjson", "# nothing but a comment\n")
add("syntax_key_colon_next_line.hjson", "{\n  train_batch_size\n  : 16\n}\n")
add("syntax_nested_unknown_list.hjson", "{\n  train_batch_size: 16\n  extra: [1, two, {three: 3}, [4,],]\n}\n")

# ---- files both must reject ----
add("bad_unterminated_string.json", '{"train_batch_size": 16, "fp16": {"enabled: true}}\n')
add("bad_unterminated_comment.json", '{"train_batch_size": 16} /* never closed\n')
add("bad_missing_brace.json", '{"train_batch_size": 16, "fp16": {"enabled": true}\n')
add("bad_extra_data.json", '{"train_batch_size": 16} {"fp16": {}}\n')
add("bad_list_root.json", '[{"train_batch_size": 16}]\n')
add("bad_scalar_root.json", '16\n')
add("bad_number_overflow.json", '{"train_batch_size": 16, "gradient_clipping": 1e400}\n')
add("bad_key_with_space.hjson", "{\n  train batch size: 16\n}\n")
add("bad_control_char.json", '{"train_batch_size": 16, "tensorboard": {"output_path": "a\tb"}}\n')
add("bad_escape.json", '{"train_batch_size": 16, "optimizer": {"type": "\\q"}}\n')
add("bad_invalid_utf8.json", b'{"train_batch_size": 16, "tensorboard": {"job_name": "\xff"}}\n')
add("bad_colon_missing.hjson", "{\n  train_batch_size 16\n}\n")
add("bad_punctuator_value.json", '{"train_batch_size": ,}\n')


# ---- more corners (numbers DeepSpeed keeps exact, odd spellings, values that only fail later) ----
cfg("type_offload_buffer_exp_string", with_ok(zero_optimization={"stage": 3, "offload_param": {"device": "cpu", "buffer_size": "1e8"}}))
add("batch_bigint.json", '{"train_batch_size": 99999999999999999999, "gradient_accumulation_steps": 1}\n')
add("batch_escaped_key.json", '{"train_\\u0062atch_size": 16}\n')
cfg("type_fp16_loss_scale_inf", with_ok(fp16={"enabled": True, "loss_scale": "inf"}))
cfg("type_fp16_power_negative", with_ok(fp16={"enabled": True, "initial_scale_power": -2}))
cfg("type_fp16_hysteresis_zero", with_ok(fp16={"enabled": True, "hysteresis": 0}))
cfg("type_vocabulary_size_unaligned", with_ok(vocabulary_size=50257))
cfg("type_vocabulary_size_string", with_ok(vocabulary_size="big"))
cfg("type_vocabulary_size_null", with_ok(vocabulary_size=None))
cfg("unimpl_sparse_attention_bad_mode", with_ok(sparse_attention={"mode": "bogus"}))
add("syntax_no_commas_after_quotes.json", '{"optimizer": {"type": "Adam"} "train_batch_size": 16\n'
    ' "fp16": {"enabled": true} "communication_data_type": "fp16" "steps_per_print": 3\n}\n')
add("syntax_newline_separated.hjson", """{
  train_batch_size: 16
  optimizer: {
    type: AdamW
    params: {
      lr: 0.0003
      betas: [
        0.9
        0.95
      ]
    }
  }
  scheduler: {
    type: WarmupLR
    params: {
      warmup_type: linear
      warmup_num_steps: 10
    }
  }
  communication_data_type: bf16
  bf16: {
    enabled: true
  }
  tensorboard: {
    enabled: true
    output_path: runs/with spaces/
    job_name: my job # part of the string
  }
}
""")
add("syntax_quoteless_values_strings.hjson", """{
  train_batch_size: 16
  zero_optimization: {
    stage: 2
    overlap_comm: true
    reduce_bucket_size: 5e8
    offload_optimizer: {
      device: cpu
      pin_memory: yes
    }
  }
  fp16: {
    enabled: on
  }
}
""")
add("syntax_keyword_then_text_newline.hjson", "{\n  train_batch_size: 16\n  fp16: {\n    enabled: true story\n  }\n}\n")
add("syntax_multiline_job_name.hjson", "{\n  train_batch_size: 16\n  csv_monitor: {\n    job_name: '''\n"
    "      two\n        lines\n      '''\n  }\n}\n")
add("syntax_quoted_key_escapes.json", '{"train_batch_size": 16, "zero_\\u006fptimization": {"stage": 1}}\n')
add("syntax_single_quote_inside_double.json",
    '{"train_batch_size": 16, "tensorboard": {"job_name": "it\'s", "output_path": \'say "hi"\'}}\n')

cfg("type_hybrid_engine_unknown_key", with_ok(hybrid_engine={"enabled": False, "bogus": 1}))
cfg("type_comms_logger_unknown_key", with_ok(comms_logger={"enabled": False, "bogus": 1}))
cfg("type_tensorboard_unknown_key", with_ok(tensorboard={"enabled": False, "bogus": 1}))
cfg("unimpl_checkpoint_parallel_write_bad", with_ok(checkpoint={"parallel_write": {"pipeline_stage": 2}}))
cfg("type_scheduler_params_int", with_ok(scheduler={"type": "WarmupLR", "params": 5}))
cfg("type_optimizer_params_list", with_ok(optimizer={"type": "Adam", "params": [1]}))
cfg("type_comm_dtype_mixed_case", with_ok(communication_data_type="Fp32"))
cfg("type_elasticity_enabled_int", {"elasticity": dict(EL, enabled=1)})
add("rule_duplicate_escaped.json", '{"train_batch_size": 8, "a": 1, "\\u0061": 2}\n')
cfg("hf_zero3_template", {
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "pin_memory": True},
                          "offload_param": {"device": "cpu", "pin_memory": True}, "overlap_comm": True,
                          "contiguous_gradients": True, "sub_group_size": 1e9, "reduce_bucket_size": "auto",
                          "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                          "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": True},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": False})
cfg("hf_filled_in", {
    "fp16": {"enabled": True, "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
             "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 5e-5,
                                                      "warmup_num_steps": 100, "total_num_steps": 1000}},
    "zero_optimization": {"stage": 2, "allgather_partitions": True, "allgather_bucket_size": 2e8,
                          "overlap_comm": True, "reduce_scatter": True, "reduce_bucket_size": 2e8,
                          "contiguous_gradients": True},
    "gradient_accumulation_steps": 4, "gradient_clipping": 1.0, "steps_per_print": 2000,
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "wall_clock_breakdown": False})

cfg("elastic_micro_empty", {"elasticity": dict(EL, micro_batch_sizes=[], version=0.2, num_gpus_per_node=4, max_gpus=2)})
add("batch_overflow.json", '{"train_micro_batch_size_per_gpu": 1e18, "gradient_accumulation_steps": 1e18}\n')


def main():
    os.makedirs(OUT, exist_ok=True)
    for old in os.listdir(OUT):
        os.remove(os.path.join(OUT, old))
    for name, text in CASES.items():
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
    print(f"{len(CASES)} files in {OUT}")


if __name__ == "__main__":
    main()
