// Unit tests of a Hugging Face model folder's parts: config.json (model/hf_config.c) and the
// weights, one file or sharded with an index (engine/ckpt/hf_weights.c).
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>  // FILE, fopen, snprintf
#include <stdlib.h> // mkdtemp, system
#include <string.h> // strstr
#include <unistd.h> // unlink

#include "dsc/half.h"                // dsc_fp32_to_bf16
#include "dsc/status.h"              // dsc_last_error
#include "engine/ckpt/hf_weights.h"  // dsc_hf_weights_*
#include "engine/ckpt/safetensors.h" // dsc_st_write
#include "model/gpt2/hf.h"           // dsc_gpt2_config_from_hf, dsc_gpt2_config_to_hf
#include "model/hf_config.h"         // dsc_hf_config_*

static char dir[64];

static int setup(void **state) {
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/dsc-hf-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_text(const char *name, const char *text) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void expect_error(dsc_status st, const char *needle) {
    assert_int_not_equal(st, DSC_OK);
    if (!strstr(dsc_last_error(), needle)) fail_msg("error \"%s\" lacks \"%s\"", dsc_last_error(), needle);
}

// ---- config.json ----

static void test_gpt2_config(void **state) {
    (void)state;
    dsc_hf_config c;
    const char *text = "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_layer\": 3, \"n_embd\": 96, "
                       "\"n_head\": 4, \"n_positions\": 128, \"vocab_size\": 300}";
    assert_int_equal(dsc_hf_config_parse(text, "config.json", &c), DSC_OK);
    assert_int_equal(c.arch, DSC_HF_GPT2);
    assert_int_equal(c.n_layer, 3);
    assert_int_equal(c.hidden, 96);
    assert_int_equal(c.n_head, 4);
    assert_int_equal(c.n_kv_head, 4);
    assert_int_equal(c.head_dim, 24);
    assert_int_equal(c.intermediate, 384); // n_inner null: 4 n_embd
    assert_int_equal(c.max_positions, 128);
    assert_int_equal(c.vocab_size, 300);
    assert_true(c.tied);
    assert_string_equal(c.act, "gelu_new");
    assert_true(c.norm_eps == 1e-5);
    assert_int_equal(c.eos_ids[0], 50256); // transformers' GPT2Config default
}

static void test_llama_config(void **state) {
    (void)state;
    dsc_hf_config c;
    const char *text =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, \"intermediate_size\": "
        "90, \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 2, "
        "\"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5, \"rope_theta\": 500000.0, "
        "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0, \"low_freq_factor\": 1.0, "
        "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}, "
        "\"tie_word_embeddings\": true, \"vocab_size\": 500, \"bos_token_id\": 1, "
        "\"eos_token_id\": [2, 3]}";
    assert_int_equal(dsc_hf_config_parse(text, "config.json", &c), DSC_OK);
    assert_int_equal(c.arch, DSC_HF_LLAMA);
    assert_int_equal(c.n_kv_head, 2);
    assert_int_equal(c.head_dim, 8);
    assert_string_equal(c.rope_type, "llama3");
    assert_true(c.rope_factor == 32.0 && c.rope_high_freq == 4.0 && c.rope_low_freq == 1.0);
    assert_int_equal(c.rope_orig_max, 8192);
    assert_true(c.rope_theta == 500000.0);
    assert_true(c.tied);
    assert_false(c.qkv_bias);
    assert_int_equal(c.n_eos, 2);
    assert_int_equal(c.eos_ids[1], 3);
}

static void test_qwen_mistral_defaults(void **state) {
    (void)state;
    dsc_hf_config c;
    const char *qwen = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 32, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"num_hidden_layers\": 1, "
                       "\"intermediate_size\": 40, \"vocab_size\": 77}";
    assert_int_equal(dsc_hf_config_parse(qwen, "config.json", &c), DSC_OK);
    assert_true(c.qkv_bias);  // Qwen2's q/k/v always carry biases
    assert_false(c.o_bias);
    assert_false(c.tied);     // Qwen2Config's default
    assert_int_equal(c.sliding_window, 0); // use_sliding_window false
    assert_true(c.rope_theta == 10000.0);
    const char *mistral = "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 32, "
                          "\"num_attention_heads\": 32, \"num_hidden_layers\": 1, \"sliding_window\": null, "
                          "\"intermediate_size\": 40, \"vocab_size\": 77, \"head_dim\": 16}";
    assert_int_equal(dsc_hf_config_parse(mistral, "config.json", &c), DSC_OK);
    assert_int_equal(c.sliding_window, 0);
    assert_int_equal(c.n_kv_head, 8); // absent: MistralConfig's default
    assert_int_equal(c.head_dim, 16); // given, not hidden / heads
}

// Qwen3Config's defaults: head_dim 128 whatever hidden / heads is, no biases, no sliding window;
// the writer names head_dim always and attention_bias, and the text reads back the same.
static void test_qwen3_config(void **state) {
    (void)state;
    dsc_hf_config c, back;
    const char *qwen3 = "{\"architectures\": [\"Qwen3ForCausalLM\"], \"hidden_size\": 64, "
                        "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                        "\"num_hidden_layers\": 1, \"intermediate_size\": 40, \"vocab_size\": 77, "
                        "\"tie_word_embeddings\": true, \"use_sliding_window\": false, "
                        "\"sliding_window\": null}";
    assert_int_equal(dsc_hf_config_parse(qwen3, "config.json", &c), DSC_OK);
    assert_int_equal(c.arch, DSC_HF_QWEN3);
    assert_string_equal(c.architecture, "Qwen3ForCausalLM");
    assert_int_equal(c.head_dim, 128); // not 64 / 4
    assert_false(c.qkv_bias);
    assert_false(c.o_bias);
    assert_int_equal(c.sliding_window, 0);
    assert_true(c.norm_eps == 1e-6 && c.rope_theta == 10000.0 && c.tied);
    char *text = NULL, *gen = NULL;
    assert_int_equal(dsc_hf_config_render(&c, &text, &gen), DSC_OK);
    assert_non_null(strstr(text, "\"head_dim\": 128"));
    assert_non_null(strstr(text, "\"attention_bias\": false"));
    assert_int_equal(dsc_hf_config_parse(text, "config.json", &back), DSC_OK);
    assert_int_equal(back.arch, DSC_HF_QWEN3);
    assert_int_equal(back.head_dim, 128);
    free(text), free(gen);
    const char *bias = "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"num_attention_heads\": "
                       "4, \"num_hidden_layers\": 1, \"intermediate_size\": 40, \"vocab_size\": "
                       "77, \"attention_bias\": true}";
    assert_int_equal(dsc_hf_config_parse(bias, "config.json", &c), DSC_OK);
    assert_int_equal(c.arch, DSC_HF_QWEN3);
    assert_true(c.qkv_bias && c.o_bias); // Qwen3's attention_bias biases o_proj too
}

static void test_config_errors(void **state) {
    (void)state;
    dsc_hf_config c;
    expect_error(dsc_hf_config_parse("{\"architectures\": [\"BertModel\"]}", "x/config.json", &c),
                 "BertModel");
    expect_error(dsc_hf_config_parse("{\"architectures\": [\"BertModel\"]}", "x/config.json", &c),
                 "LlamaForCausalLM");
    expect_error(dsc_hf_config_parse("{\"model_type\": \"bert\"}", "x/config.json", &c),
                 "model_type \"bert\"");
    expect_error(dsc_hf_config_parse("{\"hidden_size\": 4}", "x/config.json", &c),
                 "architectures");
    // A config saved without its model has no architectures: model_type decides.
    assert_int_equal(dsc_hf_config_parse("{\"model_type\": \"qwen2\"}", "x/config.json", &c),
                     DSC_OK);
    assert_int_equal(c.arch, DSC_HF_QWEN2);
    assert_string_equal(c.architecture, "Qwen2ForCausalLM");
    expect_error(dsc_hf_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], "
                                     "\"num_attention_heads\": 6, \"num_key_value_heads\": 4}",
                                     "x/config.json", &c), "not a multiple");
    expect_error(dsc_hf_config_parse("{\"architectures\": [\"LlamaForCausalLM\"], "
                                     "\"hidden_size\": \"big\"}", "x/config.json", &c),
                 "hidden_size");
    expect_error(dsc_hf_config_parse("{\"architectures\": [\"GPT2LMHeadModel\"], \"n_layer\": 0}",
                                     "x/config.json", &c), "number of layers");
    expect_error(dsc_hf_config_parse("[1, 2", "x/config.json", &c), "x/config.json");
    expect_error(dsc_hf_config_read("/nonexistent-dir", &c), "/nonexistent-dir");
}

// ---- the transformers 4 and 5 spellings ----

#define LLAMA_SHAPE "\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64, " \
    "\"intermediate_size\": 90, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, " \
    "\"max_position_embeddings\": 256, \"vocab_size\": 300, "

// The same model in each spelling reads the same, field for field.
static void spellings_equal(const char *v4, const char *v5) {
    dsc_hf_config a, b;
    assert_int_equal(dsc_hf_config_parse(v4, "v4/config.json", &a), DSC_OK);
    if (dsc_hf_config_parse(v5, "v5/config.json", &b) != DSC_OK) fail_msg("%s", dsc_last_error());
    assert_memory_equal(&a, &b, sizeof a);
}

static void test_spellings(void **state) {
    (void)state;
    spellings_equal("{" LLAMA_SHAPE "\"rope_theta\": 1000000.0, \"torch_dtype\": \"bfloat16\"}",
                    "{" LLAMA_SHAPE "\"rope_parameters\": {\"rope_theta\": 1000000.0, "
                    "\"rope_type\": \"default\"}, \"dtype\": \"bfloat16\", \"layer_types\": "
                    "[\"full_attention\", \"full_attention\"]}");
    spellings_equal("{" LLAMA_SHAPE "\"rope_theta\": 500000.0, \"rope_scaling\": {\"type\": "
                    "\"linear\", \"factor\": 4.0}}",
                    "{" LLAMA_SHAPE "\"rope_parameters\": {\"rope_theta\": 500000.0, "
                    "\"rope_type\": \"linear\", \"factor\": 4.0}}");
    const char *llama3 = "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                         "\"original_max_position_embeddings\": 64";
    char v4[1024], v5[1024], both[1024];
    snprintf(v4, sizeof v4, "{" LLAMA_SHAPE "\"rope_theta\": 500000.0, \"rope_scaling\": "
             "{\"rope_type\": \"llama3\", %s}}", llama3);
    snprintf(v5, sizeof v5, "{" LLAMA_SHAPE "\"rope_parameters\": {\"rope_type\": \"llama3\", "
             "\"rope_theta\": 500000.0, %s}}", llama3);
    spellings_equal(v4, v5);
    // Both spellings at once, agreeing (what dsc's writer puts out).
    snprintf(both, sizeof both, "{" LLAMA_SHAPE "\"rope_theta\": 500000.0, \"rope_scaling\": "
             "{\"rope_type\": \"llama3\", %s}, \"rope_parameters\": {\"rope_type\": \"llama3\", "
             "\"rope_theta\": 500000.0, %s}, \"torch_dtype\": \"float32\", \"dtype\": "
             "\"float32\"}", llama3, llama3);
    dsc_hf_config c;
    assert_int_equal(dsc_hf_config_parse(both, "both", &c), DSC_OK);
    assert_string_equal(c.rope_type, "llama3");
    assert_int_equal(c.rope_orig_max, 64);
    // One rope object per kind of layer, alike.
    spellings_equal("{" LLAMA_SHAPE "\"rope_theta\": 20000.0}",
                    "{" LLAMA_SHAPE "\"rope_parameters\": {\"full_attention\": {\"rope_type\": "
                    "\"default\", \"rope_theta\": 20000.0}}}");
    // The Qwen2 folder: RoPE base 1e6 only inside rope_parameters.
    const char *qwen = "\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 32, "
                       "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                       "\"num_hidden_layers\": 2, \"intermediate_size\": 40, \"vocab_size\": 77, "
                       "\"max_window_layers\": 28, \"use_sliding_window\": false, ";
    snprintf(v4, sizeof v4, "{%s\"rope_theta\": 1000000.0, \"sliding_window\": 4096}", qwen);
    snprintf(v5, sizeof v5, "{%s\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": "
             "\"default\"}, \"sliding_window\": null, \"layer_types\": [\"full_attention\", "
             "\"full_attention\"], \"transformers_version\": \"5.17.0\"}", qwen);
    spellings_equal(v4, v5);
    assert_int_equal(dsc_hf_config_parse(v5, "v5", &c), DSC_OK);
    assert_true(c.rope_theta == 1e6);
}

static void test_spelling_conflicts(void **state) {
    (void)state;
    dsc_hf_config c;
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"rope_theta\": 10000.0, "
                                     "\"rope_parameters\": {\"rope_theta\": 1000000.0}}", "x",
                                     &c),
                 "rope_parameters.rope_theta is 1e+06");
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"rope_scaling\": {\"rope_type\": "
                                     "\"linear\", \"factor\": 2.0}, \"rope_parameters\": "
                                     "{\"rope_type\": \"linear\", \"factor\": 4.0}}", "x", &c),
                 "rope_parameters says rope_type \"linear\" factor 4");
    // rope_scaling null says "default" as plainly as an object would.
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"rope_scaling\": null, \"rope_parameters\": "
                                     "{\"rope_type\": \"linear\", \"factor\": 4.0}}", "x", &c),
                 "rope_scaling says rope_type \"default\"");
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"torch_dtype\": \"float32\", \"dtype\": "
                                     "\"bfloat16\"}", "x", &c), "torch_dtype is \"float32\"");
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"rope_parameters\": {\"rope_type\": "
                                     "\"llama3\", \"factor\": 8.0}}", "x", &c),
                 "no \"low_freq_factor\"");
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"rope_scaling\": {\"rope_type\": "
                                     "\"linear\"}}", "x", &c), "no \"factor\"");
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"rope_parameters\": {\"full_attention\": "
                                     "{\"rope_theta\": 1e4}, \"sliding_attention\": "
                                     "{\"rope_theta\": 1e6}}}", "x", &c), "every layer alike");
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"layer_types\": [\"full_attention\"]}",
                                     "x", &c), "one entry per layer (2)");
    expect_error(dsc_hf_config_parse("{" LLAMA_SHAPE "\"layer_types\": [\"full_attention\", "
                                     "\"chunked_attention\"]}", "x", &c),
                 "layer_types[1] is \"chunked_attention\"");
    // Qwen2: max_window_layers 1 makes layer 1 slide; layer_types says it does not.
    expect_error(dsc_hf_config_parse("{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": "
                                     "32, \"num_attention_heads\": 4, \"num_hidden_layers\": 2, "
                                     "\"use_sliding_window\": true, \"sliding_window\": 8, "
                                     "\"max_window_layers\": 1, \"layer_types\": "
                                     "[\"full_attention\", \"full_attention\"]}", "x", &c),
                 "max_window_layers 1 makes layer 1 slide");
}

static void test_windows(void **state) {
    (void)state;
    dsc_hf_config c;
    const char *q = "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 32, "
                    "\"num_attention_heads\": 4, \"num_hidden_layers\": 4, \"use_sliding_window\": "
                    "true, \"sliding_window\": 8, \"max_window_layers\": 3%s}";
    char t[512];
    snprintf(t, sizeof t, q, "");
    assert_int_equal(dsc_hf_config_parse(t, "x", &c), DSC_OK);
    assert_int_equal(c.sliding_window, 8);
    assert_int_equal(c.n_sliding_layers, 1); // layer 3 only
    snprintf(t, sizeof t, q, ", \"layer_types\": [\"full_attention\", \"full_attention\", "
             "\"full_attention\", \"sliding_attention\"]");
    assert_int_equal(dsc_hf_config_parse(t, "x", &c), DSC_OK);
    assert_int_equal(c.n_sliding_layers, 1);
    const char *m = "{\"architectures\": [\"MistralForCausalLM\"], \"hidden_size\": 32, "
                    "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, "
                    "\"num_hidden_layers\": 3, \"sliding_window\": 16}";
    assert_int_equal(dsc_hf_config_parse(m, "x", &c), DSC_OK);
    assert_int_equal(c.n_sliding_layers, 3);
    assert_int_equal(c.sliding_window, 16);
}

// The writer puts out both spellings, and each alone reads as the whole does.
static void test_writer_spellings(void **state) {
    (void)state;
    dsc_hf_config a;
    assert_int_equal(dsc_hf_config_parse("{" LLAMA_SHAPE "\"rope_theta\": 500000.0, "
                                         "\"rope_scaling\": {\"rope_type\": \"linear\", "
                                         "\"factor\": 4.0}, \"torch_dtype\": \"bfloat16\"}", "in",
                                         &a), DSC_OK);
    char *cfg, *gen;
    assert_int_equal(dsc_hf_config_render(&a, &cfg, &gen), DSC_OK);
    const char *want[] = {"\"rope_scaling\": {", "\"rope_parameters\": {", "\"rope_theta\": 500000",
                          "\"torch_dtype\": \"bfloat16\"", "\"dtype\": \"bfloat16\""};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(cfg, want[i])) fail_msg("the written config.json lacks %s:\n%s", want[i], cfg);
    free(cfg);
    free(gen);
}

static void test_config_round_trip(void **state) {
    (void)state;
    const char *texts[] = {
        "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 2, "
        "\"n_positions\": 64, \"vocab_size\": 99}",
        "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 48, \"head_dim\": 16, "
        "\"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"num_hidden_layers\": 3, "
        "\"intermediate_size\": 70, \"vocab_size\": 99, \"rope_scaling\": {\"type\": \"linear\", "
        "\"factor\": 2.0}, \"attention_bias\": true}",
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 32, \"num_attention_heads\": 4, "
        "\"num_key_value_heads\": 2, \"num_hidden_layers\": 1, \"intermediate_size\": 40, "
        "\"vocab_size\": 77, \"tie_word_embeddings\": true}",
    };
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        dsc_hf_config a, b;
        assert_int_equal(dsc_hf_config_parse(texts[i], "in", &a), DSC_OK);
        assert_int_equal(dsc_hf_config_write(dir, &a), DSC_OK);
        assert_int_equal(dsc_hf_config_read(dir, &b), DSC_OK);
        assert_memory_equal(&a, &b, sizeof a);
    }
}

static void test_gpt2_shape(void **state) {
    (void)state;
    dsc_hf_config h;
    dsc_gpt2_config g;
    const char *ok = "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_layer\": 3, \"n_embd\": 96, "
                     "\"n_head\": 4, \"n_positions\": 128, \"vocab_size\": 300, "
                     "\"activation_function\": \"gelu_pytorch_tanh\"}";
    assert_int_equal(dsc_hf_config_parse(ok, "c", &h), DSC_OK);
    assert_int_equal(dsc_gpt2_config_from_hf(&h, "c", &g), DSC_OK);
    assert_int_equal(g.n_layer, 3);
    assert_int_equal(g.n_embd, 96);
    assert_int_equal(g.max_seq_len, 128);
    assert_int_equal(g.vocab_size, 300);
    // What dsc's GPT-2 does not compute is refused, naming the field.
    const char *bad[][2] = {
        {"\"activation_function\": \"relu\"", "activation_function"},
        {"\"layer_norm_epsilon\": 1e-6", "layer_norm_epsilon"},
        {"\"n_inner\": 100", "n_inner"},
        {"\"tie_word_embeddings\": false", "tie_word_embeddings"},
        {"\"scale_attn_by_inverse_layer_idx\": true", "scale_attn_by_inverse_layer_idx"},
        {"\"n_head\": 5", "n_head 5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        // n_head left at its default (12) unless the case sets it
        snprintf(text, sizeof text, "{\"architectures\": [\"GPT2LMHeadModel\"], \"n_embd\": 96, "
                 "%s}", bad[i][0]);
        assert_int_equal(dsc_hf_config_parse(text, "c", &h), DSC_OK);
        expect_error(dsc_gpt2_config_from_hf(&h, "c", &g), bad[i][1]);
    }
    // dsc's shape -> config.json -> the same shape.
    dsc_gpt2_config d = {.n_layer = 2, .n_head = 2, .n_embd = 128, .vocab_size = 50257,
                         .max_seq_len = 64}, back;
    dsc_gpt2_config_to_hf(&d, &h);
    assert_int_equal(h.eos_ids[0], 50256);
    assert_int_equal(dsc_hf_config_write(dir, &h), DSC_OK);
    dsc_hf_config r;
    assert_int_equal(dsc_hf_config_read(dir, &r), DSC_OK);
    assert_int_equal(dsc_gpt2_config_from_hf(&r, "c", &back), DSC_OK);
    assert_memory_equal(&d, &back, sizeof d);
}

// ---- weights ----

static float w1[6] = {1, 2, 3, 4, 5, 6};
static float w2[4] = {-1.5f, 0.25f, 8, 1e-3f};

static void write_shards(void) {
    char p[256];
    uint16_t h[4];
    for (int i = 0; i < 4; i++) h[i] = dsc_fp32_to_bf16(w2[i]);
    dsc_st_tensor a[] = {{"model.embed_tokens.weight", "F32", 2, {2, 3}, w1, sizeof w1}};
    dsc_st_tensor b[] = {{"model.norm.weight", "BF16", 1, {4}, h, sizeof h},
                         {"lm_head.weight", "F32", 1, {4}, w2, sizeof w2}};
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(dsc_st_write(p, a, 1, NULL, 0), DSC_OK);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(dsc_st_write(p, b, 2, NULL, 0), DSC_OK);
    write_text("model.safetensors.index.json",
               "{\"metadata\": {\"total_size\": 48}, \"weight_map\": {"
               "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\", "
               "\"model.norm.weight\": \"model-00002-of-00002.safetensors\", "
               "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"}}");
}

static void test_sharded(void **state) {
    (void)state;
    write_shards();
    dsc_hf_weights *w;
    assert_int_equal(dsc_hf_weights_open(&w, dir), DSC_OK);
    assert_int_equal(dsc_hf_weights_count(w), 3);
    assert_true(dsc_hf_weights_has(w, "model.norm.weight"));
    assert_false(dsc_hf_weights_has(w, "model.layers.0.mlp.up_proj.weight"));
    assert_int_equal(dsc_hf_weights_maps(w), 0); // nothing mapped until a tensor is read
    dsc_hf_tensor t;
    assert_int_equal(dsc_hf_weights_info(w, "model.embed_tokens.weight", &t), DSC_OK);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[1], 3);
    assert_int_equal(t.numel, 6);
    float out[6];
    assert_int_equal(dsc_hf_weights_read(w, "model.embed_tokens.weight", 2, 3, out), DSC_OK);
    assert_true(out[0] == 3 && out[1] == 4 && out[2] == 5);
    assert_int_equal(dsc_hf_weights_read(w, "model.norm.weight", 0, 4, out), DSC_OK);
    for (int i = 0; i < 4; i++) assert_true(out[i] == dsc_bf16_to_fp32(dsc_fp32_to_bf16(w2[i])));
    assert_int_equal(dsc_hf_weights_read(w, "lm_head.weight", 1, 3, out), DSC_OK);
    assert_true(out[0] == w2[1] && out[2] == w2[3]);
    assert_int_equal(dsc_hf_weights_maps(w), 2); // each shard mapped once, one at a time
    expect_error(dsc_hf_weights_read(w, "lm_head.weight", 2, 3, out), "4 elements");
    expect_error(dsc_hf_weights_read(w, "model.layers.0.mlp.up_proj.weight", 0, 1, out),
                 "model.layers.0.mlp.up_proj.weight");
    dsc_hf_weights_close(w);

    // The index file itself, and one shard on its own.
    char p[256];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(dsc_hf_weights_open(&w, p), DSC_OK);
    assert_int_equal(dsc_hf_weights_count(w), 3);
    dsc_hf_weights_close(w);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(dsc_hf_weights_open(&w, p), DSC_OK);
    assert_int_equal(dsc_hf_weights_count(w), 2);
    assert_int_equal(dsc_hf_weights_read(w, "lm_head.weight", 0, 4, out), DSC_OK);
    assert_true(out[3] == w2[3]);
    dsc_hf_weights_close(w);
}

static void test_weights_errors(void **state) {
    (void)state;
    dsc_hf_weights *w;
    expect_error(dsc_hf_weights_open(&w, dir), "model.safetensors");
    write_text("pytorch_model.bin", "x");
    expect_error(dsc_hf_weights_open(&w, dir), "safe_serialization");
    write_shards();
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(dsc_hf_weights_open(&w, dir), DSC_OK);
    float x;
    expect_error(dsc_hf_weights_read(w, "a", 0, 1, &x), "does not hold it");
    dsc_hf_weights_close(w);
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../etc/passwd\"}}");
    expect_error(dsc_hf_weights_open(&w, dir), "not a file name");
    write_text("model.safetensors.index.json", "{\"weights\": {}}");
    expect_error(dsc_hf_weights_open(&w, dir), "weight_map");
}

// Tensor i of the write test: element k is 100 i + k.
static dsc_status fill_counting(void *user, int i, void *dst, size_t nbytes) {
    int *calls = user;
    calls[i]++;
    float *f = dst;
    for (size_t k = 0; k < nbytes / 4; k++) f[k] = (float)(100 * i + (int)k);
    return DSC_OK;
}

static void check_written(int n, const int64_t *numel) {
    dsc_hf_weights *w;
    assert_int_equal(dsc_hf_weights_open(&w, dir), DSC_OK);
    assert_int_equal(dsc_hf_weights_count(w), n);
    for (int i = 0; i < n; i++) {
        char name[32];
        float got[64];
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(dsc_hf_weights_read(w, name, 0, numel[i], got), DSC_OK);
        for (int64_t k = 0; k < numel[i]; k++) assert_true(got[k] == (float)(100 * i + k));
    }
    dsc_hf_weights_close(w);
}

static void test_write_shards(void **state) {
    (void)state;
    enum { N = 5 };
    const int64_t numel[N] = {4, 4, 40, 2, 3}; // bytes 16, 16, 160, 8, 12
    char names[N][8];
    dsc_st_tensor t[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "t%d", i);
        t[i] = (dsc_st_tensor){.name = names[i], .dtype = "F32", .ndim = 1,
                               .shape = {numel[i]}, .nbytes = (size_t)numel[i] * 4};
    }
    const char *meta[] = {"format", "pt"};
    int calls[N] = {0};
    // 40 bytes a shard: {t0, t1}, {t2} (larger than a shard, alone), {t3, t4}.
    assert_int_equal(dsc_hf_weights_write(dir, t, N, 40, meta, 1, fill_counting, calls), DSC_OK);
    for (int i = 0; i < N; i++) assert_int_equal(calls[i], 1);
    char p[256];
    snprintf(p, sizeof p, "%s/model-00003-of-00003.safetensors", dir);
    dsc_st_file *f;
    assert_int_equal(dsc_st_open(&f, p), DSC_OK);
    assert_int_equal(dsc_st_count(f), 2);
    assert_string_equal(dsc_st_meta(f, "format"), "pt");
    dsc_st_close(f);
    check_written(N, numel);
    // All in one: model.safetensors alone (the index left from above is removed first).
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    assert_int_equal(unlink(p), 0);
    assert_int_equal(dsc_hf_weights_write(dir, t, N, 1u << 20, meta, 1, fill_counting, calls),
                     DSC_OK);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    assert_int_equal(dsc_st_open(&f, p), DSC_OK);
    assert_int_equal(dsc_st_count(f), N);
    dsc_st_close(f);
    check_written(N, numel);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_config),
        cmocka_unit_test(test_llama_config),
        cmocka_unit_test(test_qwen_mistral_defaults),
        cmocka_unit_test(test_qwen3_config),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_spellings),
        cmocka_unit_test(test_spelling_conflicts),
        cmocka_unit_test(test_windows),
        cmocka_unit_test(test_writer_spellings),
        cmocka_unit_test_setup_teardown(test_config_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpt2_shape, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_weights_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_shards, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
