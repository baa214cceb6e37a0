// dsc/memplan.h - the memory plan of a training run, made before anything is allocated: from the
// model's parameter table and activation sizes, the config (stage, offload, precision, micro
// batch, accumulation, fault tolerance, checkpoints), the sequence length, the ranks and the
// machine, the bytes each rank will hold on its device and on the host, by category. `dsc train`
// prints it and refuses a run that does not fit, naming both numbers and the settings that
// would fit; `dsc config check --model SPEC` prints the same plan (docs/memory.md).
//
// The plan predicts what the runtime allocates today, host mirrors of a GPU run included: each
// mode's accounting is one function of src/engine/memplan.c, which changes with the runtime.
#ifndef DSC_MEMPLAN_H
#define DSC_MEMPLAN_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t

#include "dsc/config.h" // dsc_config
#include "dsc/engine.h" // dsc_param_desc
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// What the bytes hold. Weights: the copy the model computes with (16-bit on a GPU; fp32 on the
// CPU, where it is also the master at stages 0 and 3 in fp32). Master: a separate fp32 copy.
// Moments: the optimizer's. Gradients: accumulators and per-group reduction buffers. Activations:
// the model's for one micro-batch. Staging: bus and communication buffers, the initial weights'
// staging copy. Snapshots: fault tolerance's slots and the checkpoint writer's copy. Runtime:
// the process itself (code, libraries, threads, data loader).
typedef enum dsc_plan_cat {
    DSC_PLAN_WEIGHTS,
    DSC_PLAN_MASTER,
    DSC_PLAN_MOMENTS,
    DSC_PLAN_GRADS,
    DSC_PLAN_ACTIVATIONS,
    DSC_PLAN_STAGING,
    DSC_PLAN_SNAPSHOTS,
    DSC_PLAN_RUNTIME,
    DSC_PLAN_NCAT
} dsc_plan_cat;

const char *dsc_plan_cat_name(int cat); // "weights", ..., "runtime"

// The model's activations for a micro-batch of B sequences (of the input's seq_len) on the
// device (device true) or the host: dsc_model_activation_bytes through a small adapter.
typedef size_t (*dsc_plan_act_fn)(void *user, int B, bool device);

typedef struct dsc_memplan_input {
    const dsc_config *config;      // resolved for world (borrowed)
    const dsc_param_desc *params;  // the engine's parameter table (borrowed)
    int nparams;
    int n_layer;                   // layers (groups 1 .. n_layer; parameter offload's slots)
    int world;                     // ranks
    int local_ranks;               // ranks on this node, sharing its host memory (0: world)
    int node_gpus;                 // GPUs a node of this kind holds, for the advice to use more
                                   // (0: unknown, taken as 8)
    int seq_len;                   // T
    bool device;                   // trains on a GPU (--device cuda)
    bool nccl;                     // several GPUs reduce through nccl (DSC_COMM_BACKEND=nccl)
    bool init_in_place;            // initial weights read from a file into each partition
    bool checkpoints;              // a checkpoint writer runs (--save-dir or a checkpoint key)
    bool device_state;             // plan as if DSC_DEVICE_STATE=1 were set (the advice tries it)
    dsc_plan_act_fn act;           // NULL: no activations counted
    void *act_user;
    dsc_plan_act_fn act_host;      // a GPU run's activations kept on the host (cpu_checkpointing;
                                   // the same user, device true); NULL: none
    int64_t host_runtime;  // bytes of the process before the run allocates; 0: a fixed estimate
    int64_t host_avail;    // bytes of host memory this process may use; < 0: unknown
    int64_t device_avail;  // bytes free on its device; < 0: unknown (or no device)
} dsc_memplan_input;

typedef struct dsc_memplan {
    int64_t host[DSC_PLAN_NCAT], device[DSC_PLAN_NCAT]; // per rank, by category
    int64_t host_bytes, device_bytes;                   // per rank: the peaks the run reaches
    int64_t host_avail, device_avail;                   // per rank; -1 unknown
    int64_t params;                                     // parameter elements (unpadded)
    char mode[160];                                     // the accounting used, in words
    bool fits;                                          // both within what is available
} dsc_memplan;

// Compute the plan. DSC_ERR_INVALID_ARG on a missing table or bad sizes.
dsc_status dsc_memplan_compute(const dsc_memplan_input *in, dsc_memplan *out);

// DSC_OK when the plan fits; else DSC_ERR_OOM with a message naming the bytes needed and
// available (host, device or both) and the settings that would fit, tried in the plan:
// offload_optimizer, offload_param at stage 3, a smaller micro batch, more ranks.
dsc_status dsc_memplan_check(const dsc_memplan_input *in, const dsc_memplan *plan);

// The plan as lines of text ("memory plan per rank: ...") into out (a FILE *), each prefixed.
void dsc_memplan_print(const dsc_memplan *plan, void *out, const char *prefix);
// The plan as one JSON object (malloc'd text, caller frees; NULL when out of memory):
// device_bytes, host_bytes, host_available, device_available, fits, mode, and per category.
char *dsc_memplan_json(const dsc_memplan *plan);

// Host memory this process may use: the smallest of MemAvailable (/proc/meminfo), the cgroup's
// limit less its usage (v2 memory.max, v1 memory.limit_in_bytes), the address-space limit
// (ulimit -v) and DSC_HOST_MEM_LIMIT; src receives which one (e.g. "MemAvailable"). -1 when none
// can be read.
int64_t dsc_host_mem_available(char *src, size_t cap);

#ifdef __cplusplus
}
#endif

#endif // DSC_MEMPLAN_H
