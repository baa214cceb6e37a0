// cli/lora.h - the config's `lora` section and PEFT's adapter folders (cli/lora.c).
#ifndef DSC_CLI_LORA_H
#define DSC_CLI_LORA_H

#include <jansson.h> // json_t
#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint64_t

#include "dsc/config.h" // dsc_config
#include "dsc/model.h"  // dsc_model

// LoRA on m as the config's lora section and/or the PEFT folder init_adapter (NULL: none) ask;
// nothing when neither is given. Errors name the key or file and what works.
// seed: of the dropout masks (this rank's).
dsc_status cli_lora(dsc_model *m, const dsc_config *cfg, bool cuda, const char *init_adapter,
                    uint64_t seed);
// The name PEFT's adapter_model.safetensors gives tensor i of m
// ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").
void cli_peft_name(const dsc_model *m, int i, char *out, size_t cap);
// DIR/adapter_config.json, parsed (*out: the caller's); an error names flag and the folder.
dsc_status cli_adapter_config_read(const char *dir, const char *flag, json_t **out);
// adapter_config.json for m's adapters (malloc'd text); base: base_model_name_or_path or NULL.
dsc_status cli_adapter_config(const dsc_model *m, const char *base, char **out);

#endif
