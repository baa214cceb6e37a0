// cli/cmd_launch.c - `dsc launch`: DeepSpeed's launcher flags, then PROGRAM [ARGS...].
#include <stdio.h>  // fprintf
#include <string.h> // strcmp, strncmp, strchr

#include "cli/args.h"     // cli_parse, cli_int
#include "cli/commands.h" // cmd_launch
#include "dsc/launch.h"   // dsc_launch_run
#include "dsc/status.h"   // dsc_last_error

int cmd_launch(int argc, char **argv);

typedef struct launch_flags {
    const char *num_nodes, *num_gpus, *num_procs, *hostfile, *include, *exclude, *master_addr,
        *master_port, *launcher, *max_restarts, *min_procs, *launcher_args, *log_dir,
        *on_failure;
    const char *world_info, *node_host, *node_rank, *task_env;
    bool no_local_rank, force_multi;
} launch_flags;

#define NFLAGS 20

static void flag_table(launch_flags *f, cli_flag *t) {
    const cli_flag flags[NFLAGS] = {
        {"--num_nodes", "N", "use the first N hosts of the hostfile (default: all)",
         &f->num_nodes, NULL},
        {"--num_gpus", "G", "slots per host; on a machine without GPUs: processes per host",
         &f->num_gpus, NULL},
        {"--num_procs", "P", "processes in total (default: the GPUs found, or 1)", &f->num_procs,
         NULL},
        {"--hostfile", "FILE", "lines 'HOST slots=N' (default /job/hostfile when present)",
         &f->hostfile, NULL},
        {"--include", "SPEC", "use only these hosts/slots, e.g. host1:0,1@host2", &f->include,
         NULL},
        {"--exclude", "SPEC", "leave out these hosts/slots, e.g. host1:0,1@host2", &f->exclude,
         NULL},
        {"--master_addr", "ADDR", "rank 0's address (default 127.0.0.1, or the first host)",
         &f->master_addr, NULL},
        {"--master_port", "PORT", "rank 0's port (default 29500)", &f->master_port, NULL},
        {"--launcher", "NAME", "local, pdsh, ssh, slurm or openmpi (default: local for one host, "
         "pdsh for several)", &f->launcher, NULL},
        {"--max_restarts", "K", "restart the whole group up to K times after a failure (0)",
         &f->max_restarts, NULL},
        {"--min_procs", "M", "restart only while at least M slots remain (default 1)",
         &f->min_procs, NULL},
        {"--no_local_rank", NULL, "do not append --local_rank=N to the program's arguments", NULL,
         &f->no_local_rank},
        {"--force_multi", NULL, "use the multi-node launcher even for one host", NULL,
         &f->force_multi},
        {"--launcher_args", "ARGS", "extra arguments for pdsh, ssh, srun or mpirun",
         &f->launcher_args, NULL},
        {"--log_dir", "DIR", "also write rank N's output to DIR/rankN.log", &f->log_dir, NULL},
        {"--on_failure", "POLICY", "degrade or restart: leave the survivors of a failed rank "
         "running; abort: stop them (default: the training config's "
         "fault_tolerance.on_failure)", &f->on_failure, NULL},
        {"--world_info", "SPEC", "(internal) node agent: the job's hosts and slots",
         &f->world_info, NULL},
        {"--node_host", "HOST", "(internal) node agent: which host this is", &f->node_host, NULL},
        {"--node_rank", "N", "(internal) node agent: this host's index", &f->node_rank, NULL},
        {"--task_env", "KIND", "(internal) per-task shim under srun (slurm) or mpirun (ompi)",
         &f->task_env, NULL},
    };
    memcpy(t, flags, sizeof flags);
}

static bool takes_value(const cli_flag *t, const char *a) {
    if (strchr(a, '=')) return false; // --flag=VALUE
    for (int k = 0; k < NFLAGS; k++)
        if (!strcmp(a, t[k].name)) return t[k].metavar != NULL;
    return false;
}

// Index of PROGRAM in argv: the first argument that is neither a flag nor a flag's value (a lone
// "--" also ends the flags). What follows PROGRAM belongs to the program, flags included.
// *flags_end: how many arguments are the launcher's.
static int program_index(const cli_flag *t, int argc, char **argv, int *flags_end) {
    int i = 0;
    while (i < argc) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            *flags_end = i;
            return i + 1;
        }
        if (a[0] != '-' || !a[1]) break;
        i += takes_value(t, a) ? 2 : 1;
    }
    *flags_end = i < argc ? i : argc;
    return i;
}

static bool int_flag(const char *name, const char *s, long long lo, long long hi, int *out) {
    if (!s) return true;
    long long v;
    if (!cli_int(name, s, lo, hi, &v)) return false;
    *out = (int)v;
    return true;
}

static bool fill_opts(const launch_flags *f, dsc_launch_opts *o) {
    bool ok = int_flag("--num_nodes", f->num_nodes, 1, 1 << 20, &o->num_nodes) &&
              int_flag("--num_gpus", f->num_gpus, 1, 1 << 16, &o->num_gpus) &&
              int_flag("--num_procs", f->num_procs, 1, 1 << 20, &o->num_procs) &&
              int_flag("--master_port", f->master_port, 1, 65535, &o->master_port) &&
              int_flag("--max_restarts", f->max_restarts, 0, 1000000, &o->max_restarts) &&
              int_flag("--min_procs", f->min_procs, 1, 1 << 20, &o->min_procs) &&
              int_flag("--node_rank", f->node_rank, 0, 1 << 20, &o->node_rank);
    o->hostfile = f->hostfile;
    o->include = f->include;
    o->exclude = f->exclude;
    o->master_addr = f->master_addr;
    o->launcher = f->launcher;
    o->launcher_args = f->launcher_args;
    o->log_dir = f->log_dir;
    o->on_failure = f->on_failure;
    o->world_info = f->world_info;
    o->node_host = f->node_host;
    o->task_env = f->task_env;
    o->no_local_rank = f->no_local_rank;
    o->force_multi = f->force_multi;
    return ok;
}

int cmd_launch(int argc, char **argv) {
    launch_flags f = {0};
    cli_flag table[NFLAGS];
    flag_table(&f, table);
    const cli_verb v = {
        "launch", "dsc launch [flags] PROGRAM [ARGS...]",
        "Start PROGRAM once per rank with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, "
        "MASTER_ADDR and MASTER_PORT set (and --local_rank=N appended), on this host, on the "
        "hosts of a hostfile (pdsh or ssh), under SLURM (srun) or Open MPI (mpirun). Each output "
        "line is prefixed with its rank. When a rank fails the others are stopped and dsc launch "
        "exits with the failing rank's code, unless the training config's "
        "fault_tolerance.on_failure (or --on_failure) is degrade or restart: then the survivors "
        "are left running to recover. A .py PROGRAM runs under python3 -u.",
        table, NFLAGS, 0, 0};
    int flags_end = 0;
    int prog = program_index(table, argc, argv, &flags_end);
    char *pos[1];
    int npos = 0;
    int rc = cli_parse(&v, flags_end, argv, &npos, pos);
    if (rc) return rc == 1 ? 0 : 2;
    if (prog >= argc) {
        fprintf(stderr, "dsc launch: missing PROGRAM; usage: %s\n", v.usage);
        return 2;
    }
    dsc_launch_opts o;
    dsc_launch_opts_init(&o);
    if (!fill_opts(&f, &o)) return 2;
    o.argv = argv + prog;
    o.argc = argc - prog;
    int exit_code = 1;
    dsc_status st = dsc_launch_run(&o, &exit_code);
    if (st != DSC_OK) {
        fprintf(stderr, "dsc launch: %s\n", dsc_last_error());
        return st == DSC_ERR_INVALID_ARG || st == DSC_ERR_CONFIG ? 2 : 1;
    }
    return exit_code;
}
