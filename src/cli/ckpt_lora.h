// cli/ckpt_lora.h - `dsc ckpt export` of a LoRA run's checkpoint (cli/ckpt_lora.c).
#ifndef DSC_CLI_CKPT_LORA_H
#define DSC_CLI_CKPT_LORA_H

#include <stdbool.h> // bool
#include <stdint.h>  // uint64_t

#include "dsc/checkpoint.h" // dsc_ckpt
#include "dsc/model.h"      // dsc_model
#include "dsc/status.h"     // dsc_status

// Whether the checkpoint dir/tag (tag NULL: latest) is of a LoRA run (carries adapter_config.json).
bool cli_ckpt_is_lora(const char *dir, const char *tag);
// adapter_config.json and adapter_model.safetensors in out_dir, as PEFT's save_pretrained
// writes them (fp32, PEFT's tensor names).
dsc_status cli_export_peft(const char *dir, const char *tag, const char *out_dir);
// A Hugging Face folder of the base model (adapter_config.json's base_model_name_or_path) with
// every adapter merged into its weight (W + scale B A, as PEFT's merge_and_unload) and the
// modules_to_save replaced by their trained values; dtype "fp32" or "bf16".
dsc_status cli_export_merged(const char *dir, const char *tag, const char *out_dir,
                             const char *dtype, uint64_t shard_bytes);

// Merge adapters into a model's full fp32 weights in memory (full[k]: tensor k), as PEFT's
// merge_and_unload: from a PEFT folder (adapter_config.json, adapter_model.safetensors), or from a
// LoRA checkpoint and its attached adapter_config.json. Tensors of modules_to_save replace the
// model's.
dsc_status cli_merge_peft(const dsc_model *m, float *const *full, const char *dir);
dsc_status cli_merge_ckpt(const dsc_model *m, float *const *full, const dsc_ckpt *ck,
                          const char *adapter_config_path);
// The adapters of a PEFT folder beside the model's weights, unmerged: the model gets the folder's
// LoRA adapters (dsc_model_set_lora from its adapter_config.json; training mode off), *full (*nt
// tensors) grows by their A and B tensors read from adapter_model.safetensors, and tensors of
// modules_to_save replace the model's. The host decoder then applies each adapter beside its
// product (one rank; dsc_model_infer).
dsc_status cli_attach_peft(dsc_model *m, float ***full, int *nt, const char *dir);
// The same from a LoRA checkpoint's tensors and its attached adapter_config.json.
dsc_status cli_attach_ckpt(dsc_model *m, float ***full, int *nt, const dsc_ckpt *ck,
                           const char *adapter_config_path);

#endif
