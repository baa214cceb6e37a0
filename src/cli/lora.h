// cli/lora.h - the config's `lora` section and PEFT's adapter folders (cli/lora.c).
#ifndef DSC_CLI_LORA_H
#define DSC_CLI_LORA_H

#include <jansson.h> // json_t
#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // uint64_t

#include "dsc/config.h" // dsc_config
#include "dsc/model.h"  // dsc_model

// LoRA on m as the config's lora section (cfg NULL: none) and/or the PEFT folder init_adapter
// (NULL: none) ask; nothing when neither is given. Errors name the key or file and what works.
// seed: of the dropout masks (this rank's).
dsc_status cli_lora(dsc_model *m, const dsc_config *cfg, bool cuda, const char *init_adapter,
                    uint64_t seed);
// The name PEFT's adapter_model.safetensors gives tensor i of m
// ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").
void cli_peft_name(const dsc_model *m, int i, char *out, size_t cap);
// The same from a tensor's dsc name (gpt2: GPT2LMHeadModel's "transformer." before all but lm_head).
void cli_peft_tensor_name(bool gpt2, const char *name, char *out, size_t cap);
// DIR/adapter_config.json, parsed (*out: the caller's); an error names flag and the folder.
dsc_status cli_adapter_config_read(const char *dir, const char *flag, json_t **out);
// adapter_config.json for m's adapters (malloc'd text); base: base_model_name_or_path or NULL.
dsc_status cli_adapter_config(const dsc_model *m, const char *base, char **out);

// base_checksums.json of a LoRA run: a digest of each frozen tensor's values (values[i]: tensor
// i as the model computes with it), so that a resume can tell another base from the one the
// adapters were trained on. *out malloc'd. A frozen tensor whose values[i] is NULL (the engine
// keeps the base on the device: dsc_engine_state_on_device) is read from eng, one at a time.
dsc_status cli_base_checksums(const dsc_model *m, float *const *values, dsc_engine *eng,
                              char **out);
// The checkpoint's saved checksums (the file saved_path) against now's: DSC_ERR_INVALID_ARG
// naming the first tensor that differs and what to give.
dsc_status cli_base_check(const char *saved_path, const char *now, const char *ckpt);

// The failure to open a LoRA checkpoint's base model (adapter_config.json's
// base_model_name_or_path `base`), with `why` (the opener's error), as the error of `what`
// ("a LoRA checkpoint", ...): where base is no folder here, what to do instead.
dsc_status cli_base_open_failed(dsc_status st, const char *what, const char *base,
                                const char *why);
// Gives the fp32 values of the base tensor `name` (dsc's name) for cli_base_verify: *values NULL
// when the base has no such tensor; *owned: the caller frees *values.
typedef dsc_status (*cli_base_reader)(void *user, const char *name, float **values,
                                      int64_t *numel, bool *owned);
// Before adapters are merged into a base (dsc ckpt export --hf, dsc generate --checkpoint): every
// tensor of the checkpoint's base_checksums.json (the file sums_path) read from the base through
// read must have the values the adapters were trained on, as they are or as 16-bit training
// rounded them (bf16 or fp16); otherwise DSC_ERR_INVALID_ARG naming the checkpoint, the tensor and
// base_what (where the base came from).
dsc_status cli_base_verify(const char *sums_path, const char *ckpt, const char *base_what,
                           cli_base_reader read, void *user);

#endif
