// cli/train.h - the trainer behind `dsc train`: any model the registry makes, on the CPU or a GPU.
#ifndef DSC_CLI_TRAIN_H
#define DSC_CLI_TRAIN_H

#include <stdbool.h> // bool

typedef struct train_opts {
    const char *config;       // DeepSpeed config file; NULL = the built-in default
    const char *model;        // model spec ("d4", "gpt2-124M", ...)
    const char *data;         // data folder or shard; NULL = the built-in default data
    const char *out;          // run directory
    const char *init_weights; // safetensors with the model's Hugging Face names, or NULL
    const char *init_adapter; // --init-adapter: a PEFT adapter folder, or NULL
    const char *dump_grads;   // safetensors to write the first step's gradients to, or NULL
    const char *dump_weights; // safetensors to write the final fp32 weights to, or NULL
    const char *prompt;       // text the closing sample starts from
    const char *save_dir;     // checkpoints go here (--save-dir), or NULL
    const char *device;       // --device: "cuda", "cpu", or NULL / "auto" (see dsc/device.h)
    const char *resume;       // --resume: NULL = no, "" = latest of save_dir, a tag, or DIR/TAG
    bool save_at_end;         // --save-at-end: a checkpoint after the last step
    bool restart_positions;   // --restart-positions: position ids restart at each document
    long long seq_len, max_steps, seed, eval_every, eval_batches, sample_tokens, threads;
} train_opts;

// Run training; returns the process exit code (0 ok, 1 failure with the reason printed).
int dsc__train_run(const train_opts *o);

struct dsc_config;
// The key by which cfg asks for checkpoints (a save interval, or on_failure restart, whose
// restart resumes from one), or NULL: without --save-dir they go to <--out>/checkpoints.
const char *dsc__train_ckpt_key(const struct dsc_config *cfg);

#endif
