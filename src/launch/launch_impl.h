// launch/launch_impl.h - what launch.c (the job, local ranks, restarts) and remote.c (pdsh, ssh,
// srun, mpirun and the per-task shim) share.
#ifndef DSC_LAUNCH_LAUNCH_IMPL_H
#define DSC_LAUNCH_LAUNCH_IMPL_H

#include "launch/hosts.h"  // dsc__launch_pool
#include "launch/launch.h" // dsc_launch_opts
#include "launch/proc.h"   // dsc__group
#include "launch/strv.h"   // dsc__strv

typedef enum dsc__launcher_kind {
    DSC__LAUNCHER_LOCAL,
    DSC__LAUNCHER_PDSH,
    DSC__LAUNCHER_SSH,
    DSC__LAUNCHER_SLURM,
    DSC__LAUNCHER_OPENMPI,
} dsc__launcher_kind;

// What the local launcher does when a rank fails (launch/policy.c).
typedef enum dsc__on_failure {
    DSC__ON_FAILURE_STOP,    // stop the others (any program that does not recover by itself)
    DSC__ON_FAILURE_DEGRADE, // leave the survivors running: they continue without the rank
    DSC__ON_FAILURE_RESTART, // leave them to save an emergency checkpoint and exit 75
    DSC__ON_FAILURE_ABORT,   // stop the others (they would exit 1 anyway)
} dsc__on_failure;

typedef struct dsc__launch_policy {
    int on_failure;   // dsc__on_failure
    char source[640]; // where it came from, for messages: "fault_tolerance.on_failure is ..."
} dsc__launch_policy;

// --on_failure, else the program's training config (`dsc train --config FILE`, the built-in one
// of `dsc train`, or a --deepspeed_config/--config file with a fault_tolerance section), else
// STOP. DSC_ERR_INVALID_ARG for a bad --on_failure value.
dsc_status dsc__launch_policy_resolve(const dsc_launch_opts *o, dsc__launch_policy *p);
// Whether the survivors of a failed rank are left running (degrade, restart).
bool dsc__launch_policy_tolerates(const dsc__launch_policy *p);

// One job as resolved by the launcher that the user started (the "head").
typedef struct dsc__launch_job {
    const dsc_launch_opts *o;
    dsc__launcher_kind kind;
    dsc__launch_pool pool;   // hosts and slots (empty for SLURM, which decides itself)
    char master_addr[256];
    int master_port;
    dsc__strv envfile;       // "KEY=VALUE" from .deepspeed_env files, applied to every rank
    dsc__strv launcher_args; // o->launcher_args split into words
    int attempt;             // 0 on the first start, then the restart number
    dsc__launch_policy policy; // when a rank fails (local launcher only)
    char exe[4096];          // this dsc binary, started again as node agent or task shim
    char cwd[4096];
} dsc__launch_job;

// The program's argv for one rank: "python3 -u" in front of a .py script, --local_rank=N at the
// end unless --no_local_rank (local_rank < 0: leave it to the task shim). Appends to argv.
dsc_status dsc__launch_program_argv(const dsc_launch_opts *o, int local_rank, dsc__strv *argv);

// The environment variables a remote node or mpirun must be given explicitly: NCCL_*, PYTHON*,
// UCX_*, MV2_*, MLFLOW*, OMP_*, DSC_* from ours, then the .deepspeed_env entries, then
// DSC_RESTART_COUNT. Appends "KEY=VALUE" strings to out.
dsc_status dsc__launch_exported_env(const dsc__launch_job *job, dsc__strv *out);

// Our environment plus the .deepspeed_env entries and DSC_RESTART_COUNT (for local children).
dsc_status dsc__launch_base_env(const dsc__launch_job *job, dsc__strv *env);

// Each rank's CPU thread count when several share a host (nlocal >= 2): OMP_NUM_THREADS and
// OPENBLAS_NUM_THREADS = cores / nlocal (at least 1) in env, each unless env has it already
// (OPENBLAS_NUM_THREADS also not when OMP_NUM_THREADS is there, which OpenBLAS then follows);
// without this every rank starts one thread per core and they fight over the cores, as torchrun
// and DeepSpeed's launcher know. `said` (cap bytes, may be NULL) gets the sentence to print, or
// "" when nothing was set.
dsc_status dsc__launch_thread_env(int nlocal, int cores, dsc__strv *env, char *said, size_t cap);

// Cores this process may run on (its affinity mask, as taskset, cgroups, srun or mpirun's binding
// set it), at least 1.
int dsc__launch_cores(void);

// Start the helpers of one attempt in g: one pdsh, one ssh per host, one srun, or one mpirun.
dsc_status dsc__launch_start_pdsh(const dsc__launch_job *job, dsc__group *g);
dsc_status dsc__launch_start_ssh(const dsc__launch_job *job, dsc__group *g);
dsc_status dsc__launch_start_srun(const dsc__launch_job *job, dsc__group *g);
dsc_status dsc__launch_start_mpirun(const dsc__launch_job *job, dsc__group *g);

// The shell command a node agent runs on host `host_expr` ("%h" for pdsh): cd to our directory,
// export the variables, exec `dsc launch` as that host's agent. pdsh_escape doubles every '%'
// that is not ours, since pdsh substitutes %h/%n/%u in the command. Caller frees *out.
dsc_status dsc__launch_agent_cmd(const dsc__launch_job *job, const char *host_expr,
                                 bool pdsh_escape, char **out);

// The per-task shim: RANK etc. from the scheduler's variables, then exec. Returns only on error.
dsc_status dsc__launch_task_exec(const dsc_launch_opts *o);

// Full path of an executable found through PATH (or `name` itself when it has a '/'); false when
// there is none.
bool dsc__launch_which(const char *name, char *out, size_t cap);

#endif
