// dsc/engine.h - the training engine: a config and a parameter table in, optimizer steps out.
//
// The engine does not know the model. The caller registers its parameters (name, shape, layer
// group), then for every micro-batch: runs forward, calling dsc_gather(g) before it uses group g's
// weights and dsc_release(g) after; runs backward scaled by dsc_backward_scale(), accumulating into
// dsc_param_grad(), calling dsc_grads_ready(g) when group g's gradients are complete; then calls
// dsc_step(). Every gradient_accumulation_steps micro-steps, dsc_step reduces the gradients,
// unscales them, checks for overflow, clips, runs the optimizer and the LR schedule, and reports
// what it did. The same calls serve one rank or many, ZeRO stages 0-3. dsc_step is also the step
// of training on a device: with a device trainer on the engine (dsc/device.h) it runs that
// trainer's step, under the same contract.
#ifndef DSC_ENGINE_H
#define DSC_ENGINE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t

#include "dsc/config.h" // dsc_config
#include "dsc/memory.h" // dsc_mem_pool
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_engine dsc_engine;

#define DSC_PARAM_NAME_MAX 96
#define DSC_PARAM_MAX_DIMS 4

typedef struct dsc_param_desc {
    const char *name; // copied
    int ndim;
    int64_t shape[DSC_PARAM_MAX_DIMS];
    int group;        // layer group, 0 .. ngroups-1, in the order forward uses them
    // Not trained (LoRA's frozen base): the engine keeps only its values (dsc_param_data,
    // dsc_param_master; fp32, rounded to the 16-bit type of fp16/bf16 training by
    // dsc_params_updated), full on every rank; no gradient (dsc_param_grad is NULL), no master
    // copy, no optimizer state, not in checkpoints.
    bool frozen;
} dsc_param_desc;

typedef struct dsc_engine_opts {
    // The configuration: exactly one of a parsed config, a file path, or a JSON text.
    const dsc_config *config;
    const char *config_path;
    const char *config_json;
    const dsc_param_desc *params; // copied
    int nparams;
    int rank, world_size;          // world_size 0: read RANK / WORLD_SIZE from the environment
    dsc_config_warn_fn warn;       // config warnings (NULL: dsc's log)
    void *warn_user;
    // The host pool that holds the engine's buffers (borrowed; it must outlive the engine, be
    // created with opts.no_defrag_on_oom = true, and serve no other engine). NULL: the engine
    // makes its own. Giving one lets the caller put its own buffers (the model's activations)
    // under the same accounting and compaction.
    dsc_mem_pool *pool;
    // The model computes somewhere else (a GPU holds its own 16-bit weights): the engine keeps no
    // host compute copy of the weights (4 bytes per parameter less; fp32 training keeps it where
    // the master lives in it). dsc_param_data then returns NULL, and at stage 3 dsc_gather of a
    // group fails; masters, gradients, optimizer state and checkpoints are unchanged.
    bool no_compute_copy;
    // With no_compute_copy, one rank and the optimizer not offloaded: the device trainer
    // (dsc/device.h) keeps the gradients on the device and runs the optimizer there, so the
    // engine keeps no gradient buffers (4 bytes per parameter less on the host); a host backward
    // (dsc_backward_begin) is then refused, and --dump-grads style observers get the device's
    // gradients through a temporary copy.
    bool device_grads;
    // With device_grads: the device trainer keeps the master weights and the optimizer's moments
    // too, and the engine holds no host copy of them (12 bytes per parameter less with fp32
    // Adam). Takes effect where device_grads keeps no gradients on one GPU with the optimizer on
    // it, unless DSC_DEVICE_STATE=0 (dsc_engine_state_on_device says whether it did). Then the
    // trainer is created before the weights are set (it holds them), dsc_params_init is the way
    // to set them (dsc_param_master returns NULL), and everything that reads or writes the state
    // (checkpoints, dsc_engine_full_param) moves it between host and device in bounded pieces.
    bool device_state;
    // The caller initialises the parameters with dsc_params_init (slice by slice, straight into
    // this rank's partition) instead of dsc_param_master: the engine then keeps no full staging
    // copy of the model (at ZeRO stages 1-3 in fp16/bf16 and at stage 3, a copy of 4 bytes per
    // parameter of the whole model on every rank), and dsc_param_master returns NULL.
    bool init_in_place;
} dsc_engine_opts;

dsc_status dsc_engine_create(dsc_engine **out, const dsc_engine_opts *opts);
void dsc_engine_destroy(dsc_engine *eng); // NULL ok

const dsc_config *dsc_engine_config(const dsc_engine *eng); // resolved (batch triple filled in)
int dsc_engine_rank(const dsc_engine *eng);
int dsc_engine_world_size(const dsc_engine *eng);
int dsc_engine_num_params(const dsc_engine *eng);
int64_t dsc_engine_num_elements(const dsc_engine *eng); // elements of the trainable tensors

// Parameter i as the model computes with it (borrowed; fp32 values, rounded to the 16-bit type
// under fp16/bf16). Valid between dsc_gather and dsc_release of its group.
float *dsc_param_data(dsc_engine *eng, int i);
// Gradient accumulator of parameter i (borrowed): backward adds into it.
float *dsc_param_grad(dsc_engine *eng, int i);
// The full fp32 value of parameter i (borrowed), to initialise or load weights: valid from
// dsc_engine_create until dsc_params_updated (at ZeRO stages 1-3 the master copy is then
// partitioned across ranks and this returns NULL). Every rank must write the same values.
float *dsc_param_master(dsc_engine *eng, int i);
bool dsc_param_frozen(const dsc_engine *eng, int i); // registered with dsc_param_desc.frozen
// dsc_engine_opts.device_state took effect: master weights and moments live with the device
// trainer, which must exist before dsc_params_init or a checkpoint load.
bool dsc_engine_state_on_device(const dsc_engine *eng);
dsc_status dsc_params_updated(dsc_engine *eng);

// The other way to set the initial weights, without a full copy: the engine calls
// fill(user, i, begin, count, dst) for the elements [begin, begin + count) of tensor i that this
// rank keeps (at ZeRO stages 1-3 its partition of the master weights; at stage 0 everything),
// in tensor order, and fill writes them as fp32 into dst. Every rank must give the same value for
// the same element (a counter-based initialiser, or a file of weights read by slices). Then it
// does what dsc_params_updated does. The result is bit for bit that of writing the same values
// through dsc_param_master. A fill failure is returned.
typedef dsc_status (*dsc_param_fill_fn)(void *user, int i, int64_t begin, int64_t count,
                                        float *dst);
dsc_status dsc_params_init(dsc_engine *eng, dsc_param_fill_fn fill, void *user);

// Call before each micro-batch's backward: from here until dsc_step, dsc_gather also provides
// the group's gradient buffers (dsc_param_grad), which ZeRO stages 2-3 only keep while needed.
dsc_status dsc_backward_begin(dsc_engine *eng);

// dsc_param_data / dsc_param_grad of a group's tensors are valid from dsc_gather(group) until
// dsc_release(group) (parameters) or dsc_grads_ready(group) (gradients); re-read the pointers
// after each dsc_gather, because ZeRO-3 gathers into fresh buffers.
dsc_status dsc_gather(dsc_engine *eng, int group);
dsc_status dsc_release(dsc_engine *eng, int group);
dsc_status dsc_grads_ready(dsc_engine *eng, int group);

// What backward must multiply the mean loss by: loss scale / gradient_accumulation_steps.
double dsc_backward_scale(const dsc_engine *eng);

typedef struct dsc_step_info {
    bool boundary;     // an optimizer step happened (false on the other micro-steps)
    int64_t step;      // optimizer steps so far, this one included (DeepSpeed's global_steps)
    bool skipped;      // fp16 overflow: nothing was applied
    double lr;         // the learning rate this step used
    double grad_norm;  // global norm of the unscaled gradient, before clipping
    double loss_scale; // the loss scale this step's gradients carried
    int64_t skipped_total;
} dsc_step_info;

dsc_status dsc_step(dsc_engine *eng, dsc_step_info *info);

// Mean over ranks of n values (e.g. the loss), the same on every rank; every rank must call it.
dsc_status dsc_engine_mean(dsc_engine *eng, double *values, int n);

// ---- memory (docs/memory.md) ----
//
// Every large buffer of the engine (parameter, gradient and optimizer partitions, gathered
// groups, reduction buffers, fault-tolerance snapshots) is a block of one host pool,
// dsc_engine_mem_pool(). Blocks move (compaction) only inside dsc_engine_create,
// dsc_engine_maintain and dsc_engine_recover; afterwards every pointer obtained before
// (dsc_param_data, dsc_param_grad, and the caller's own blocks of a shared pool) must be read
// again. Inside a step nothing moves: an allocation that does not fit there is an out-of-memory
// error naming the pool's largest users.

// Call between optimizer steps (after dsc_step's boundary and before the next step's first
// dsc_gather; after dsc_params_updated), on every rank or on some: it is not a collective. Waits
// for a background checkpoint snapshot (dsc_checkpoint_fence), then compacts the pool when
// `force`, when memory.defrag_interval_s passed since the last compaction and the fragmentation
// exceeds memory.defrag_threshold, or when the next step's largest request would find no free
// block in a pool with a capacity. *moved (may be NULL): blocks moved, so the caller must re-read
// its pointers.
dsc_status dsc_engine_maintain(dsc_engine *eng, bool force, bool *moved);
// The engine's pool (borrowed): statistics (dsc_mem_pool_stats), or a place for the model's
// buffers so that they move with the engine's in dsc_engine_maintain.
dsc_mem_pool *dsc_engine_mem_pool(dsc_engine *eng);

// Bytes of this rank's model states (as the ZeRO paper counts them) and transient buffers. The
// model states are the pool's own accounting of the blocks tagged zero.params, zero.grads and
// zero.optim / zero.master (each block counted at its rounded size).
typedef struct dsc_engine_memory {
    size_t params, grads, optimizer; // persistent, per rank
    size_t buffers_peak;             // gathered groups, micro-step gradients (stages 2-3)
    uint64_t comm_bytes;             // payload handed to collectives so far
} dsc_engine_memory;
void dsc_engine_memory_get(const dsc_engine *eng, dsc_engine_memory *out);

// Look at the gradients of the next optimizer step: at that step's boundary, after the
// reduction and before overflow handling, clipping and the update, fn is called on every rank;
// inside it dsc_engine_full_grad gives each tensor's reduced, accumulated gradient divided by
// the loss scale. Called once, then forgotten. Set it before the step's last micro-step: a GPU
// trainer that streams the step (ZeRO-Offload with offload_param at one micro-step) hands the
// layers' gradients to the optimizer during that micro-step's backward and keeps them for fn
// only when it knows.
typedef dsc_status (*dsc_grad_observer)(void *user, dsc_engine *eng);
void dsc_engine_observe_grads(dsc_engine *eng, dsc_grad_observer fn, void *user);
// Only inside an observer. A collective at ZeRO stages 2-3: every rank calls it with the same i.
// out: (numel of tensor i), caller-owned.
dsc_status dsc_engine_full_grad(dsc_engine *eng, int i, float *out);

// The learning rate the next optimizer step will use.
double dsc_engine_next_lr(const dsc_engine *eng);
int64_t dsc_engine_global_steps(const dsc_engine *eng);

// The full fp32 master value of parameter i (numel values into out, caller-owned), e.g. to dump
// the final weights. A collective at ZeRO stages 1-3: every rank calls it with the same i.
dsc_status dsc_engine_full_param(dsc_engine *eng, int i, float *out);

// ---- fault tolerance (docs/fault-tolerance.md) ----

// The exit code with which a rank asks `dsc launch --max_restarts` to restart the job.
#define DSC_FT_EXIT_RESTART 75
// The exit code of a rank of several that could not start (an error before its first step:
// config, output paths, ports, data, model files), and of the ranks it stopped: `dsc launch`
// stops every rank at once and restarts nothing, whatever fault_tolerance.on_failure says (BSD's
// EX_CONFIG). `dsc train` alone (one process) exits 1 as for any other error.
#define DSC_EXIT_STARTUP 78

// This rank stops for good with an error of its own that no recovery can mend, such as one in
// its set-up before the first step. The engine's communicator is aborted with DSC_ERR_ABORTED
// and "rank R stopped: <reason>", so that the other ranks' operations fail at once (shm: within
// about 10 ms) and their dsc_engine_recover stops them (DSC_FT_ABORT, that message) instead of
// waiting comm_timeout_s for this rank and continuing without it. Call it before
// dsc_engine_destroy; a no-op for NULL or one rank.
void dsc_engine_abort(dsc_engine *eng, const char *reason);

// Call at the start of every optimizer step, before its first micro-step (data loading
// included). Arms the step deadline (fault_tolerance.step_timeout_s) that a watchdog thread
// enforces until dsc_step's boundary: past it the communicator is aborted, so that a call blocked
// in a collective returns DSC_ERR_TIMEOUT. Fails at once when the communicator is already broken
// (a peer failed meanwhile), so the caller goes to dsc_engine_recover without computing first.
dsc_status dsc_step_begin(dsc_engine *eng);

typedef enum dsc_ft_action {
    DSC_FT_CONTINUE = 0, // recovered: run step resume_step again from its first micro-step
    DSC_FT_RESTART,      // save what can be saved and exit with DSC_FT_EXIT_RESTART
    DSC_FT_ABORT,        // stop with the error
} dsc_ft_action;

typedef struct dsc_ft_report {
    dsc_ft_action action;
    bool transient;        // every rank was alive: the step is retried on a fresh communicator
    int old_world, world;  // ranks before and after
    int generation;        // recoveries of this engine so far
    int64_t restored_step; // the step boundary the state was restored from (optimizer steps)
    int64_t resume_step;   // the step to run next: restored_step + 1
    bool consistent;       // the engine holds the complete state of restored_step (also with
                           // DSC_FT_RESTART: a checkpoint saved now loses nothing)
    double seconds;        // from the call until the engine was ready again
} dsc_ft_report;

// After a call of the training step failed with `failure` (dsc_step_begin, the micro-steps,
// dsc_step, dsc_engine_mean, ...): apply fault_tolerance.on_failure. Every surviving rank calls
// it. DSC_OK with action DSC_FT_CONTINUE: the engine now runs on the survivors (or, after a
// transient fault, on a fresh communicator) with the state of step restored_step, which every
// survivor restored; the caller re-reads dsc_engine_rank / dsc_engine_world_size /
// dsc_engine_config (the micro batch and gradient accumulation may change: the global batch does
// not) and its parameter pointers, and runs step resume_step. Otherwise an error whose message
// names the failed or hung ranks, and action DSC_FT_RESTART or DSC_FT_ABORT. With RESTART and
// consistent, the survivors restored the last complete step together (policy restart, or a
// world the global batch does not split over): save a checkpoint (dsc_save_checkpoint) before
// exiting with DSC_FT_EXIT_RESTART. A failure that did not come from the communication layer
// (I/O, bad arguments, ...) comes back unchanged (ABORT).
dsc_status dsc_engine_recover(dsc_engine *eng, dsc_status failure, dsc_ft_report *out);

// Fault events so far (communication failures, expired step deadlines), for metrics.
int64_t dsc_engine_fault_events(const dsc_engine *eng);

#ifdef __cplusplus
}
#endif
#endif
