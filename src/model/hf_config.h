// model/hf_config.h - a Hugging Face model folder's config.json: which family and which shape.
//
// One struct for every family dsc trains (GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM,
// MistralForCausalLM, Qwen3ForCausalLM), with the fields under the names dsc uses; each family
// reads the fields it needs and refuses values it does not implement. The reader fills in the defaults that
// transformers' config classes apply to a field the file leaves out, so that a folder means the
// same model here as there.
//
// Two spellings are read: transformers 4.x (top-level "rope_theta" and "rope_scaling",
// "torch_dtype") and 5.x ("rope_parameters" holding rope_theta, rope_type and its factors,
// "dtype", "layer_types"). A file may carry both; where they disagree the reader refuses, naming
// both fields, since transformers 4 and 5 would then build different models from it. The writer
// makes the config.json an export puts beside the weights, in both spellings at once so that
// transformers 4.44 and 5.x load it alike.
#ifndef DSC_MODEL_HF_CONFIG_H
#define DSC_MODEL_HF_CONFIG_H

#include <stdbool.h> // bool

#include "dsc/status.h" // dsc_status

typedef enum dsc_hf_arch {
    DSC_HF_GPT2 = 0, // GPT2LMHeadModel
    DSC_HF_LLAMA,    // LlamaForCausalLM
    DSC_HF_QWEN2,    // Qwen2ForCausalLM
    DSC_HF_MISTRAL,  // MistralForCausalLM
    DSC_HF_QWEN3,    // Qwen3ForCausalLM (dense)
} dsc_hf_arch;

#define DSC_HF_MAX_EOS 8

typedef struct dsc_hf_config {
    dsc_hf_arch arch;
    char architecture[64]; // as written: "LlamaForCausalLM"
    char model_type[32];   // "llama", "qwen2", "mistral", "qwen3", "gpt2"
    int vocab_size;
    int n_layer;           // num_hidden_layers / n_layer
    int hidden;            // hidden_size / n_embd
    int n_head;            // num_attention_heads / n_head
    int n_kv_head;         // num_key_value_heads (default n_head); GPT-2: n_head
    int head_dim;          // head_dim (default hidden / n_head; Qwen3: 128)
    int intermediate;      // intermediate_size / n_inner (GPT-2 default 4 * hidden)
    int max_positions;     // max_position_embeddings / n_positions
    double norm_eps;       // rms_norm_eps / layer_norm_epsilon
    char act[32];          // hidden_act / activation_function
    bool tied;             // tie_word_embeddings
    bool qkv_bias;         // q/k/v projections carry biases (Qwen2 always, Llama and Qwen3
                           // attention_bias)
    bool o_bias;           // o_proj carries a bias (Llama and Qwen3 attention_bias)
    bool mlp_bias;         // Llama mlp_bias
    // Rotary embeddings (Llama family).
    double rope_theta;
    char rope_type[16];     // "default" (none), "linear", "llama3", or what the file says
    double rope_factor;     // linear and llama3
    double rope_low_freq;   // llama3 low_freq_factor
    double rope_high_freq;  // llama3 high_freq_factor
    int rope_orig_max;      // llama3 original_max_position_embeddings
    double rope_partial;    // partial_rotary_factor: the share of a head that rotates (1: all)
    // Sliding-window attention. sliding_window is the family's window (0: none: Mistral's null,
    // Qwen2's use_sliding_window false); n_sliding_layers how many layers use it (Mistral: all;
    // Qwen2: those layer_types marks "sliding_attention", else those from max_window_layers on).
    int sliding_window;
    int n_sliding_layers;
    int max_window_layers;  // Qwen2's: layers from this index on slide when the window is on
    double attention_dropout; // Llama family: dropout on the attention weights while training
    // GPT-2's switches that change its arithmetic (transformers' defaults: false).
    bool scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn;
    bool scale_attn_weights; // default true
    int bos_id;             // -1 when absent
    int eos_ids[DSC_HF_MAX_EOS], n_eos;
    char torch_dtype[16];   // torch_dtype / dtype: "float32", "bfloat16", "float16" or ""
} dsc_hf_config;

// The architecture names dsc trains, comma-separated, for messages.
const char *dsc_hf_supported(void);

// Read DIR/config.json (dir may also name the config.json file itself). Errors name the file, the
// field and the value, and say what is supported: an unknown architecture, a missing or
// non-positive size, a field of the wrong type.
dsc_status dsc_hf_config_read(const char *dir, dsc_hf_config *out);

// Parse a config.json text (path is only for messages).
dsc_status dsc_hf_config_parse(const char *text, const char *path, dsc_hf_config *out);

// Write DIR/config.json for c, in transformers' field names for its family (atomically: a
// temporary file renamed into place). DIR must exist.
dsc_status dsc_hf_config_write(const char *dir, const dsc_hf_config *c);

// Write DIR/generation_config.json (bos, eos) as transformers' save_pretrained does.
dsc_status dsc_hf_generation_config_write(const char *dir, const dsc_hf_config *c);

// DIR/config.json's text in both spellings: every field as written, plus the rope and dtype
// fields of the spelling it lacks, made from what the reader understood (so that transformers
// 4.44 and 5.x both load a folder exported from it). *out is malloc'd; the caller frees it. The
// same refusals as dsc_hf_config_read.
dsc_status dsc_hf_config_respell(const char *dir, char **out);

// The two files' texts (malloc'd, caller frees both; NULL both on failure).
dsc_status dsc_hf_config_render(const dsc_hf_config *c, char **config, char **generation);

#endif
