// launch/proc.h - start a group of child processes (ranks, or the srun / mpirun / pdsh / ssh that
// start them), relay their output line by line, and supervise them: the first failure stops the
// rest (SIGTERM, then SIGKILL after a grace period), signals to the launcher reach every child,
// and no child outlives the launcher.
//
// Orphan safety, in three layers: each child runs in its own process group (so a signal reaches
// whatever it started), asks the kernel for SIGKILL when the launcher dies (PR_SET_PDEATHSIG),
// and a small guardian process, forked before the first child, SIGTERMs and then SIGKILLs every
// registered process group when the launcher vanishes without saying goodbye (SIGKILL).
#ifndef DSC_LAUNCH_PROC_H
#define DSC_LAUNCH_PROC_H

#include <stdbool.h>   // bool
#include <sys/types.h> // pid_t

#include "dsc/status.h" // dsc_status

// How a child's output lines are shown.
typedef enum dsc__out_mode {
    DSC__OUT_RANK,  // a rank: "[rank N] line", and logged to rank N's file
    DSC__OUT_PLAIN, // passed through unchanged (node agents prefix their own ranks)
    DSC__OUT_SRUN,  // srun --label lines "N: line" become "[rank N] line"
    DSC__OUT_OMPI,  // mpirun --tag-output lines "[J,N]<stdout>:line" become "[rank N] line"
    DSC__OUT_PDSH,  // passed through; pdsh's "HOST: ... exited with exit code N" is a failure
} dsc__out_mode;

typedef struct dsc__child_spec {
    char *const *argv;  // argv[0] is looked up in PATH; borrowed for the call
    char *const *envp;  // the child's complete environment; borrowed for the call
    const char *what;   // "rank 3", "srun", "node worker-1": names it in messages (copied)
    int rank;           // DSC__OUT_RANK: the rank shown and logged
    dsc__out_mode out;
    int stop_signal;    // what a stop sends first (0: the signal the launcher received)
} dsc__child_spec;

typedef struct dsc__group_result {
    int exit_code;      // what the launcher exits with: 0, the failing child's code, 128+signal
    int failed;         // index of the first child that failed (exit != 0 or signal), or -1
    char failed_what[64]; // its name ("rank 2", "node b")
    int failed_code;    // its exit code, 128+signal when a signal killed it
    int signal;         // stop signal the launcher received (SIGINT, SIGTERM, SIGHUP, SIGPIPE) or 0
    char reason[384];   // one line without the "dsc launch: " prefix; empty on success
    int lost;           // children that failed while the others went on (dsc__group_tolerate)
} dsc__group_result;

typedef struct dsc__group dsc__group;

// noun: what the children are called in messages ("rank", "node", "process").
// log_dir: where rank N's lines go (rankN.log, appended; NULL: no logs); `attempt` > 0 writes a
// separator line first. watch_stdout: stop (like SIGPIPE) when our stdout's reader goes away -
// how a node agent notices that the launcher which started it is gone.
dsc_status dsc__group_create(const char *noun, const char *log_dir, int attempt,
                             bool watch_stdout, dsc__group **out);
// Leave the others running when a child fails (fault tolerance's degrade and restart policies:
// the survivors recover, or save and ask for a restart, on their own). Each loss is reported at
// once on stderr, naming `policy` (e.g. "fault_tolerance.on_failure is degrade"). The group's
// exit code is then 0 when any child finished with 0, else that of the last child to exit; a
// child asking for a restart (exit code 75) stops the rest only after RESTART_WAIT_S, so that
// they can finish their emergency checkpoint; children left stopped (SIGSTOP) when every other
// child has exited are killed.
void dsc__group_tolerate(dsc__group *g, const char *policy);
// Start one child; its stdin is /dev/null.
dsc_status dsc__group_spawn(dsc__group *g, const dsc__child_spec *spec);
// Supervise until every child has exited; fills r. Returns non-OK only for system errors.
dsc_status dsc__group_wait(dsc__group *g, dsc__group_result *r);
// Kills (SIGKILL) and reaps whatever still runs, closes pipes and logs. NULL is a no-op.
void dsc__group_destroy(dsc__group *g);

// Process-wide launcher state: signal handlers (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2,
// SIGCHLD; SIGPIPE ignored) and the guardian. Call begin once before the first group and end
// after the last (it restores the handlers and lets the guardian go).
dsc_status dsc__launch_begin(void);
void dsc__launch_end(void);
// The last stop signal received between groups (and consume it), or 0.
int dsc__launch_pending_stop(void);
// Seconds between SIGTERM and SIGKILL when stopping children (DSC_LAUNCH_GRACE, default 3).
double dsc__launch_grace(void);

// Parse a labelled line: srun's "  N: text" or Open MPI's "[J,N]<stdout>:text". Returns the rank
// and sets *text to what follows the label, or -1 when the line carries no such label.
int dsc__launch_parse_label(dsc__out_mode mode, const char *line, const char **text);
// Parse pdsh's "pdsh@X: HOST: CMD exited with exit code N": returns N and copies HOST, or -1.
int dsc__launch_parse_pdsh_exit(const char *line, char *host, int cap);
// Parse srun's "srun: error: HOST: task N: Exited with exit code C": returns C, sets *task, or -1.
int dsc__launch_parse_srun_exit(const char *line, int *task);

#endif
