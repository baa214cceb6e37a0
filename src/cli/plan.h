// cli/plan.h - the memory plan of a run as `dsc train` and `dsc config check --model` make it
// (dsc/memplan.h): the model's parameter table and activation sizes, the config, the machine.
#ifndef DSC_CLI_PLAN_H
#define DSC_CLI_PLAN_H

#include <stdbool.h> // bool

#include "dsc/config.h"  // dsc_config
#include "dsc/memplan.h" // dsc_memplan
#include "dsc/model.h"   // dsc_model

typedef struct cli_plan_opts {
    const dsc_model *model;
    const dsc_config *cfg; // resolved for world
    int world, seq_len;
    bool device;           // --device cuda
    bool init_in_place;    // each rank initialises its partition (a file's weights, LoRA)
    bool checkpoints;      // a checkpoint writer will run
    bool measure_runtime;  // count this process's resident bytes now as its runtime
} cli_plan_opts;

// What the config asks that the chosen device cannot do yet (bf16 master weights with the
// optimizer offloaded from one GPU, streamed): DSC_ERR_UNSUPPORTED naming the keys and the way
// out. world: the run's ranks.
dsc_status cli_plan_device_ok(const dsc_config *cfg, bool cuda, int world);

// DeepSpeed's activation_checkpointing section, given in cfg, on model m: its layers are
// recomputed in the backward (dsc_model_set_recompute) when the run's passes can (the host's,
// and the device's of a family whose device ops recompute; otherwise warn says that the device
// passes keep every layer's activations). Before the plan,
// which then counts the smaller activations. warn NULL: quiet.
dsc_status cli_activation_checkpointing(dsc_model *m, const dsc_config *cfg, bool cuda,
                                        void (*warn)(void *user, const char *msg));

// The fp8 section: the model's device passes run their layers' products in FP8 (before the plan,
// which then counts their scratch). DSC_ERR_UNSUPPORTED when the run is on the CPU or the
// family's device passes have none; nothing without fp8.enabled.
dsc_status cli_fp8(dsc_model *m, const dsc_config *cfg, bool cuda);

// Compute the plan into *out; with check, DSC_ERR_OOM (the plan's message) when it does not
// fit, unless DSC_MEM_PLAN=warn (then a warning on stderr and DSC_OK).
dsc_status cli_memory_plan(const cli_plan_opts *o, bool check, dsc_memplan *out);

#endif
