// cli/train_impl.h - the trainer's state, shared by the files of `dsc train` (train.c: setup,
// the loop, checkpoints and recovery; train_out.c: what a run writes - metrics lines, progress,
// the closing sample, --dump-grads and --dump-weights files). Internal to the command.
#ifndef DSC_CLI_TRAIN_IMPL_H
#define DSC_CLI_TRAIN_IMPL_H

#include <stdbool.h> // bool
#include <stdint.h>  // int32_t, int64_t
#include <stdio.h>   // FILE

#include "cli/train.h"     // train_opts
#include "dsc/device.h"    // dsc_device_trainer
#include "cli/train_obs.h" // train_times
#include "dsc/engine.h"    // dsc_engine, dsc_step_info
#include "dsc/model.h"     // dsc_model
#include "dsc/monitor.h"   // dsc_monitor
#include "dsc/data.h"      // dsc_loader, dsc_tokenizer
#include "cli/plan.h"      // dsc_memplan, cli_memory_plan

typedef struct trainer {
    const train_opts *o;
    dsc_engine *eng;
    dsc_model *model; // --model; its host activations only without --device cuda
    dsc_device_trainer *gpu; // --device cuda: the GPU model and state; NULL on the CPU
    dsc_memplan plan;        // the memory plan, made before the engine allocates
    dsc_config cfg;          // the config, read once (a pipe such as <(...) reads only once)
    char *cfg_text;          // its text, attached to checkpoints as ds_config.json
    dsc_loader *train, *val;
    dsc_tokenizer *tok;
    int ntensors, B, T, gas, rank, world;
    float **work, **grads; // per-tensor pointers into the engine's buffers (refreshed on gather)
    int *tgroup;           // layer group of each tensor
    int32_t *in, *tg;      // (gas * B, T): one optimizer step's tokens (kept for --dump-grads)
    int32_t *pos;          // (gas * B, T) position ids with --restart-positions, else NULL
    int64_t target_tokens; // masked data: loss targets (targets not ignored) so far, all ranks;
                           // -1 for unmasked data, where every token is one
    FILE *metrics;
    dsc_monitor *mon;  // TensorBoard / CSV / Prometheus sinks of the config (rank 0 writes)
    double peak_flops; // measured CPU matrix-product throughput, for MFU
    double dump_loss;  // --dump-grads: the mean loss of step 1 over ranks
    char data_dir[4096];
    train_times cur;         // wall_clock_breakdown of the step running (all ranks time it)
    train_times since_print; // summed since the last breakdown line
    double *prof_times;      // flops profiler: per-module forward seconds of the profiled step
    bool ck_stop;            // a stop was requested (SIGUSR1): the state is saved, the loop ends
    int exit_code;           // DSC_FT_EXIT_RESTART when fault tolerance asks for a restart
    const char *save_dir;    // --save-dir, or save_default, or NULL: no checkpoints
    char save_default[4096]; // <--out>/checkpoints when the config asks for saves
    bool mark_resume;        // metrics.jsonl: the next line is the first after a resume/restart
    char (*peft_names)[DSC_PARAM_NAME_MAX + 32]; // LoRA: PEFT's name of each tensor, else NULL
    char *base_sums; // LoRA: base_checksums.json of the frozen base (cli_base_checksums), or NULL
} trainer;

// --dump-grads: the engine's gradient observer (dsc_engine_observe_grads, user: the trainer).
dsc_status train__dump_grads_observer(void *user, dsc_engine *eng);
// Rank 0's account of a finished step (step, its info, mean loss, validation loss or NaN, tokens
// so far, tokens/s, MFU; start: the loop's start time; first_step: the first step run).
void train__report_step(trainer *t, int64_t step, const dsc_step_info *si, double loss, double val,
                        int64_t tokens, double tok_s, double mfu, double start, int64_t first_step);
// The closing text sample (every rank takes part; rank 0 prints). Failures are a note.
void train__sample_text(trainer *t);
// The name files give tensor i: Hugging Face's, or in a LoRA run PEFT's adapter-file name.
const char *train__tensor_name(const trainer *t, int i);
// --dump-weights (a collective at ZeRO 1-3; rank 0 writes).
dsc_status train__dump_weights(trainer *t);

#endif
