// model/gpt2/hf.h - GPT-2's shape to and from a Hugging Face config.json (GPT2LMHeadModel).
#ifndef DSC_MODEL_GPT2_HF_H
#define DSC_MODEL_GPT2_HF_H

#include "dsc/status.h"       // dsc_status
#include "model/gpt2/gpt2.h"  // dsc_gpt2_config
#include "model/hf_config.h"  // dsc_hf_config

// The shape of a GPT2LMHeadModel config (path names the file in messages). What dsc's GPT-2 does
// not compute is refused with the field, its value and what is supported: another activation than
// the tanh GELU (gelu_new, gelu_pytorch_tanh, gelu_fast), a layer_norm_epsilon other than 1e-5,
// n_inner other than 4 n_embd, untied embeddings, scale_attn_by_inverse_layer_idx, or attention
// without the 1/sqrt(head_dim) scale. max_seq_len is n_positions (a run may use shorter
// sequences).
dsc_status dsc_gpt2_config_from_hf(const dsc_hf_config *h, const char *path, dsc_gpt2_config *out);

// The config.json of a dsc GPT-2 (bos = eos = vocab 50256 when the vocabulary has it, else none).
void dsc_gpt2_config_to_hf(const dsc_gpt2_config *c, dsc_hf_config *out);

#endif
