// dsc/monitor.h - training metrics: a registry of named scalars and the sinks that record them.
//
// DeepSpeed's monitor sections drive it: `tensorboard` (TensorBoard event files), `csv_monitor`
// (one CSV file per metric, DeepSpeed's layout), `wandb` / `comet` (need a network service: a
// warning, then ignored) and dsc's `prometheus` (text exposition over HTTP on 127.0.0.1).
// Every logged value also updates a snapshot (dsc_monitor_get_metrics) and may fire threshold
// actions (dsc_monitor_add_action), on every rank.
//
// Rank 0 writes files and serves Prometheus; other ranks keep the registry and actions but write
// nothing, unless DSC_MONITOR_ALL_RANKS=1 is set (then rank N writes under <job_name>_rank<N>/ and
// serves on prometheus.port + N). docs/monitoring.md describes names, layouts and the endpoint.
#ifndef DSC_MONITOR_H
#define DSC_MONITOR_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t
#include <stdint.h>  // int64_t
#include <stdio.h>   // FILE

#include "dsc/config.h" // dsc_config
#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

// ---- metric names ----
// DeepSpeed's names, indexed by samples seen (DeepSpeed's global_samples).
#define DSC_METRIC_TRAIN_LOSS "Train/Samples/train_loss"
#define DSC_METRIC_EVAL_LOSS "Train/Samples/eval_loss"
#define DSC_METRIC_LR "Train/Samples/lr"
#define DSC_METRIC_LOSS_SCALE "Train/Samples/loss_scale"
#define DSC_METRIC_FORWARD_MS "Train/Samples/elapsed_time_ms_forward"
#define DSC_METRIC_BACKWARD_MS "Train/Samples/elapsed_time_ms_backward"
#define DSC_METRIC_BACKWARD_INNER_MS "Train/Samples/elapsed_time_ms_backward_inner"
#define DSC_METRIC_BACKWARD_ALLREDUCE_MS "Train/Samples/elapsed_time_ms_backward_allreduce"
#define DSC_METRIC_STEP_MS "Train/Samples/elapsed_time_ms_step"
// dsc's own, indexed the same way.
#define DSC_METRIC_GRAD_NORM "Train/Samples/grad_norm"
#define DSC_METRIC_TOKENS_PER_S "Train/Samples/tokens_per_s"
#define DSC_METRIC_MFU "Train/Samples/mfu"                   // fraction of peak, 0..1
#define DSC_METRIC_ITER_MS "Train/Samples/iteration_time_ms" // a whole optimizer step
#define DSC_METRIC_GPU_MEM "Memory/gpu_mem_fraction"         // reserved / total, 0..1
#define DSC_METRIC_GPU_ALLOCATED "Memory/gpu_allocated_bytes"
#define DSC_METRIC_GPU_RESERVED "Memory/gpu_reserved_bytes"
#define DSC_METRIC_GPU_FRAGMENTATION "Memory/gpu_fragmentation" // 1 - largest free / free
#define DSC_METRIC_HOST_MEM "Memory/host_mem_fraction" // (MemTotal - MemAvailable) / MemTotal
#define DSC_METRIC_HOST_RSS "Memory/host_rss_bytes"    // this process's resident set
#define DSC_METRIC_COMM_BYTES "Comm/bytes"             // sent by this rank during the step
#define DSC_METRIC_COMM_MS "Comm/time_ms"              // spent in collectives during the step
#define DSC_METRIC_CKPT_SAVE_S "Checkpoint/save_s"
#define DSC_METRIC_CKPT_LOAD_S "Checkpoint/load_s"
#define DSC_METRIC_FAULTS "Fault/events" // faults seen so far (count)

typedef struct dsc_monitor dsc_monitor;

// Latest values. A value never logged is NAN (steps: -1).
typedef struct dsc_metrics {
    int64_t step;          // optimizer step of the latest dsc_monitor_log_step
    int64_t samples;       // index of the latest logged value (samples seen, for Train/Samples/*)
    double loss, val_loss; // DSC_METRIC_TRAIN_LOSS, DSC_METRIC_EVAL_LOSS
    double lr, loss_scale, grad_norm;
    double gpu_mem;          // DSC_METRIC_GPU_MEM, fraction 0..1
    double host_mem;         // fraction 0..1, read from /proc/meminfo by this call
    double host_rss_bytes;   // this process, read from /proc/self/statm by this call
    double tokens_per_s, mfu;
    double step_time_s;      // DSC_METRIC_ITER_MS / 1000
    double comm_bytes;       // DSC_METRIC_COMM_BYTES
    double comm_time_s;      // DSC_METRIC_COMM_MS / 1000
} dsc_metrics;

// One optimizer step's usual values, logged in one call (NAN = not logged this step).
typedef struct dsc_monitor_step {
    int64_t step;    // optimizer step, 1-based
    int64_t samples; // samples seen after this step: DeepSpeed's x axis
    double loss, val_loss, lr, loss_scale, grad_norm, tokens_per_s, mfu, step_time_s;
} dsc_monitor_step;

// Called when a metric crosses its threshold upwards. `metric` is the name given to add_action.
typedef void (*dsc_monitor_action_fn)(void *user, const char *metric, double value);

// ---- public API ----

// Build the sinks the config asks for. rank 0 writes; see the header comment for other ranks.
// An empty output_path means run_dir (NULL: the current directory); files go under
// <output_path>/<job_name>/ as in DeepSpeed. prometheus.port 0 picks a free port (see
// dsc_monitor_prometheus_port). The config is copied; *out is owned by the caller.
dsc_status dsc_monitor_create(dsc_monitor **out, const dsc_config *cfg, const char *run_dir,
                              int rank);

// The same from a DeepSpeed config file, for rank $RANK (default 0) and the current directory.
// Batch sizes are not resolved (the monitor needs none), so a file without them is fine.
dsc_status dsc_monitor_create_from_config(dsc_monitor **out, const char *config_path);

// What can be told of the config's monitor sections before a run, creating nothing (`dsc config
// check`): an output_path (tensorboard, csv_monitor) where some existing part of
// <output_path>/<job_name> is not a directory, or whose first missing part could not be created
// in its parent, is an error naming the key, as dsc_monitor_create's would be; a prometheus.port
// that something listens on now is a warning through warn (it may be free again by the run).
// An empty output_path (the run directory) is not checked.
dsc_status dsc_monitor_check_config(const dsc_config *cfg,
                                    void (*warn)(void *user, const char *message), void *user);

// Flush and close every sink, stop the HTTP server. NULL is a no-op.
void dsc_monitor_destroy(dsc_monitor *m);

// Record one value of a metric at index `step` (DeepSpeed's names take samples seen). Any name
// is accepted; it becomes a TensorBoard tag, a CSV file and a Prometheus gauge. Thread-safe.
// Fails only when a sink cannot write (DSC_ERR_IO); the registry is updated regardless.
dsc_status dsc_monitor_log(dsc_monitor *m, const char *name, double value, int64_t step);

// Log a step's loss, lr, loss scale, grad norm, tokens/s, MFU, step time, validation loss (each
// when not NAN) at index s->samples, plus host memory at most once a second.
dsc_status dsc_monitor_log_step(dsc_monitor *m, const dsc_monitor_step *s);

// Write buffered records to disk now. Sinks also flush by themselves every `every_steps`
// distinct indices or `every_s` seconds, whichever comes first (defaults 100 and 10 s).
dsc_status dsc_monitor_flush(dsc_monitor *m);
void dsc_monitor_set_flush_policy(dsc_monitor *m, int64_t every_steps, double every_s);

// Snapshot of the latest values; also reads host memory and evaluates host_mem actions.
dsc_status dsc_monitor_get_metrics(dsc_monitor *m, dsc_metrics *out);

// Call fn when `metric` rises above `threshold`: once per upward crossing (it must fall to or
// below the threshold before it fires again). `metric` is a logged name or one of the snapshot
// fields: loss, val_loss, lr, loss_scale, grad_norm, gpu_mem, host_mem, tokens_per_s, mfu,
// step_time, comm_bytes, comm_time. fn runs on the logging thread with no monitor lock held.
dsc_status dsc_monitor_add_action(dsc_monitor *m, const char *metric, double threshold,
                                  dsc_monitor_action_fn fn, void *user);

// The config's `monitor_actions` (dsc): [{"metric": NAME, "above": X, "action": A}], registered
// by dsc_monitor_create like dsc_monitor_add_action (once per upward crossing). A is "log" (a
// warning line), "defrag" (compact the default host pool, dsc_mem_defragment, then return its
// empty arenas) or "release_caches" (return the default host pool's empty arenas, dsc_mem_trim).
// The caller's hooks bracket them: `before` runs ahead of a defrag or release_caches (bring the
// process to a point where nothing reads pool memory; a failure skips the action), `after`
// runs after every action (bytes: moved by defrag, released by release_caches; 0 for log), e.g.
// to refresh addresses and to report; without `after` a warning line reports it.
typedef struct dsc_monitor_action_hooks {
    void *user;
    dsc_status (*before)(void *user, const char *action);
    void (*after)(void *user, const char *action, const char *metric, double value,
                  double threshold, size_t bytes);
} dsc_monitor_action_hooks;
void dsc_monitor_set_action_hooks(dsc_monitor *m, const dsc_monitor_action_hooks *h);

// The port Prometheus is served on, or 0 when it is not.
int dsc_monitor_prometheus_port(const dsc_monitor *m);

// Where the TensorBoard events / CSV files of this rank go, or NULL when that sink is off.
// Borrowed until dsc_monitor_destroy.
const char *dsc_monitor_tensorboard_dir(const dsc_monitor *m);
const char *dsc_monitor_csv_dir(const dsc_monitor *m);

// ---- the flops profiler's report ----
// DeepSpeed's flops profiler output (the config's `flops_profiler` section; `dsc train` writes it
// at profile_step): the summary, the aggregated top modules per depth and the detailed module
// tree, from numbers the caller measured (a model's dsc_model_modules tree and its timings).

// One module; the array lists each parent before its children (children have depth + 1 and
// follow it until a module of its depth or less).
typedef struct dsc_prof_module {
    const char *name; // full dotted name; the tree shows its last component
    const char *type;
    int depth;
    int64_t params;
    double fwd_flops;
    double latency_s; // leaves: measured; parents: 0 (the report sums their children)
} dsc_prof_module;

typedef struct dsc_prof_summary {
    int64_t step;
    int world, dp, mp;
    int64_t batch_per_rank;              // samples per rank per optimizer step
    double fwd_s, bwd_s, step_s, iter_s; // measured over the profiled optimizer step
} dsc_prof_summary;

typedef struct dsc_prof_opts {
    int64_t module_depth; // -1: all
    int64_t top_modules;
    bool detailed;
} dsc_prof_opts;

// Write the report. mods[0] is the whole model: its fwd_flops are the per-rank forward FLOPs of
// the step. Parents' latencies are filled in (sums of their children). DSC_ERR_IO on a write error.
dsc_status dsc_flops_profile_write(FILE *f, const dsc_prof_summary *s, dsc_prof_module *mods,
                                   int n, const dsc_prof_opts *o);

#ifdef __cplusplus
}
#endif
#endif
