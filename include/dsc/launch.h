// dsc/launch.h - the launcher of `dsc launch`: decide where ranks run (one host, a hostfile
// through pdsh or ssh, SLURM's srun, Open MPI's mpirun), start them with the torch-style
// environment, supervise them, and restart the group after a failure (--max_restarts).
//
// The same entry point also serves two internal roles of the launcher itself: the node agent
// that pdsh/ssh start on each host (`world_info` set), and the per-task shim that srun/mpirun
// start (`task_env` set), which maps SLURM_* / OMPI_COMM_WORLD_* to RANK etc. and execs the
// program.
//
// A program that starts a training job of its own (a scheduler, a test harness) calls
// dsc_launch_run as `dsc launch` does; docs/launch.md describes the launchers, the environment
// each rank gets and the restart policies.
#ifndef DSC_LAUNCH_H
#define DSC_LAUNCH_H

#include <stdbool.h> // bool

#include "dsc/status.h" // dsc_status

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_LAUNCH_DEFAULT_PORT 29500
#define DSC_LAUNCH_DEFAULT_HOSTFILE "/job/hostfile"
#define DSC_LAUNCH_EXIT_RESTART 75 // a rank asking for a restart (fault tolerance's policy)
#define DSC_LAUNCH_EXIT_STARTUP 78 // a rank that could not start: stop all, never restart

typedef struct dsc_launch_opts {
    int num_nodes;             // hosts to use (first N of the hostfile); -1: all
    int num_gpus;              // slots per host; on a machine without GPUs: processes; -1: unset
    int num_procs;             // processes in total; -1: unset
    const char *hostfile;      // NULL: /job/hostfile when it exists
    const char *include;       // "host1:0,1@host2" or NULL
    const char *exclude;       // same syntax, or NULL
    const char *master_addr;   // NULL: 127.0.0.1 locally, else the first host
    int master_port;           // 29500
    const char *launcher;      // local|pdsh|ssh|slurm|openmpi; NULL: local on one host, pdsh else
    int max_restarts;          // restarts of the whole group after a failure
    int min_procs;             // restart only while at least this many slots remain
    bool no_local_rank;        // do not append --local_rank=N to the program's arguments
    bool force_multi;          // use the multi-node launcher even for one host
    const char *launcher_args; // extra arguments for pdsh/ssh/srun/mpirun, split like a shell
    const char *log_dir;       // per-rank logs rankN.log; NULL: none
    const char *on_failure;    // degrade|restart|abort; NULL: from the program's training config
    // internal roles (see above)
    const char *world_info;    // node agent: every host of the job with its slots
    const char *node_host;     // node agent: which host of world_info this is
    int node_rank;             // node agent: or its index; -1: unset
    const char *task_env;      // "slurm" or "ompi": the per-task shim
    char **argv;               // PROGRAM [ARGS...], borrowed
    int argc;
} dsc_launch_opts;

// Defaults: -1 counts, port 29500, min_procs 1, everything else off/NULL.
void dsc_launch_opts_init(dsc_launch_opts *o);

// Run the job to completion. *exit_code: 0 when every rank exited 0; else the failing rank's code
// (128+signal when a signal killed it), or 128+signal when the launcher was stopped by a signal.
// Under the fault-tolerance policies degrade and restart (on_failure, or the program's config;
// local launcher only) a failing rank leaves the others running: 0 when the survivors finish.
// One line saying why is printed on stderr ("dsc launch: rank 2 (pid 1234) was killed by signal
// 9; stopped the other 3 ranks"). Returns non-OK (with dsc_last_error) when nothing could be
// started: bad flags or hostfile (DSC_ERR_INVALID_ARG / DSC_ERR_CONFIG), a missing program, or
// a system error. Installs signal handlers for the duration of the call. In the per-task role it
// does not return on success (the process becomes the program).
dsc_status dsc_launch_run(const dsc_launch_opts *o, int *exit_code);

#ifdef __cplusplus
}
#endif
#endif
