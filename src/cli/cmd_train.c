// cli/cmd_train.c - `dsc train`: flags -> train_opts -> the trainer.
#include <stdio.h> // fprintf

#include "cli/args.h"     // cli_parse, cli_int
#include "cli/commands.h" // cmd_train
#include "cli/train.h"    // dsc__train_run

int cmd_train(int argc, char **argv) {
    const char *steps = NULL, *seq = NULL, *seed = NULL, *every = NULL, *batches = NULL,
               *sample = NULL, *threads = NULL;
    train_opts o = {.model = "d4", .seq_len = 64, .max_steps = 200, .seed = 1337,
                    .eval_every = 50, .eval_batches = 8, .sample_tokens = 120, .prompt = "The "};
    const cli_flag flags[] = {
        {"--config", "FILE", "DeepSpeed config (default: a built-in AdamW + cosine config)", &o.config, NULL},
        {"--model", "SPEC", "d<N>, gpt2-124M, gpt2-350M, gpt2-774M, gpt2-1558M, llama-d<N>, smollm2-135M, smollm2-360M, llama-3.2-1B, llama-3.2-3B, qwen2.5-0.5B, llama-3.1-8B, qwen2.5-7B, mistral-7B, qwen3-0.6B, qwen3-1.7B, qwen3-4B, qwen3-8B, qwen3-d<N>, or hf:DIR (a Hugging Face model folder: its config.json and weights) (default d4)", &o.model, NULL},
        {"--data", "DIR", "token shards: folder with train*.bin/val*.bin (default: built-in data)", &o.data, NULL},
        {"--seq-len", "T", "tokens per sample (default 64)", &seq, NULL},
        {"--max-steps", "N", "optimizer steps to run (default 200)", &steps, NULL},
        {"--seed", "N", "seed of weights and data order (default 1337)", &seed, NULL},
        {"--out", "RUN_DIR", "where metrics.jsonl goes (default runs/<time>)", &o.out, NULL},
        {"--eval-every", "N", "validation loss every N steps, 0 = only at the end (default 50)", &every, NULL},
        {"--eval-batches", "N", "micro-batches per validation, at least 1 (default 8)", &batches, NULL},
        {"--init-adapter", "DIR", "LoRA: start the adapters from a folder PEFT's save_pretrained wrote (adapter_config.json, adapter_model.safetensors); without a lora section in the config its adapter_config.json gives r, lora_alpha and target_modules", &o.init_adapter, NULL},
        {"--init-weights", "PATH", "start from these weights: a safetensors file, a Hugging Face folder or its model.safetensors.index.json (Hugging Face names), a DeepSpeed checkpoint directory (its fp32 master weights), or none (default: the folder of --model hf:DIR, else the model's initialiser)", &o.init_weights, NULL},
        {"--dump-grads", "FILE", "write the first step's gradients, inputs, targets and loss (safetensors)", &o.dump_grads, NULL},
        {"--dump-weights", "FILE", "write the final fp32 weights (safetensors, Hugging Face names)", &o.dump_weights, NULL},
        {"--sample-tokens", "N", "tokens of the closing sample, 0 = none (default 120)", &sample, NULL},
        {"--prompt", "TEXT", "start of the closing sample (default \"The \")", &o.prompt, NULL},
        {"--device", "DEV", "cuda (one GPU), cpu, or auto: cuda when a GPU is usable and the run has one rank (default auto)", &o.device, NULL},
        {"--threads", "N", "CPU threads (default: OMP_NUM_THREADS or all cores)", &threads, NULL},
        {"--save-dir", "DIR", "save checkpoints here, as the config's checkpoint section says (SIGUSR1: save and stop); default RUN_DIR/checkpoints when the config asks for saves", &o.save_dir, NULL},
        {"--resume", "[TAG]", "continue from --save-dir's latest checkpoint, or TAG, or DIR/TAG", &o.resume, NULL},
        {"--save-at-end", NULL, "save a checkpoint after the last step (needs --save-dir)", NULL, &o.save_at_end},
        {"--restart-positions", NULL, "position ids restart at 0 at each document of packed data (dsc data prepare --seq-len; on the CPU and the GPU)", NULL, &o.restart_positions},
    };
    const cli_verb v = {"train", "dsc train [--config FILE] [--model SPEC] [--data DIR] [flags]",
                        "Train a model (GPT-2 or the Llama family) through the engine. With no "
                        "flags: a small GPT-2 "
                        "on the built-in default data. Writes RUN_DIR/metrics.jsonl (one "
                        "JSON object per optimizer step) and prints progress every "
                        "steps_per_print steps.",
                        flags, (int)(sizeof flags / sizeof flags[0]), 0, 0};
    char *pos[1];
    int npos;
    int rc = cli_parse(&v, argc, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (seq && !cli_int("--seq-len", seq, 1, 1 << 20, &o.seq_len)) return 2;
    if (steps && !cli_int("--max-steps", steps, 0, 1LL << 40, &o.max_steps)) return 2;
    if (seed && !cli_int("--seed", seed, 0, 1LL << 62, &o.seed)) return 2;
    if (every && !cli_int("--eval-every", every, 0, 1LL << 40, &o.eval_every)) return 2;
    if (batches && !cli_int("--eval-batches", batches, 1, 1 << 20, &o.eval_batches)) return 2;
    if (sample && !cli_int("--sample-tokens", sample, 0, 1 << 20, &o.sample_tokens)) return 2;
    if (threads && !cli_int("--threads", threads, 1, 4096, &o.threads)) return 2;
    return dsc__train_run(&o);
}
