// launch/remote.c - ranks started by someone else: pdsh or ssh start a node agent (`dsc launch`
// again) on each host, srun and mpirun start a task shim per rank.
#define _GNU_SOURCE // execvp

#include <errno.h>  // errno
#include <signal.h> // SIGTERM
#include <stdio.h>  // snprintf, fprintf
#include <stdlib.h> // getenv, setenv, strtol
#include <string.h> // strcmp, strlen, strerror
#include <unistd.h> // geteuid, execvp, sysconf

#include "base/env.h"           // dsc__env, DSC_ENV_*
#include "base/status.h"        // dsc__fail, DSC_TRY
#include "dsc/comm.h"           // dsc_slurm_tasks_on_node
#include "launch/launch_impl.h" // dsc__launch_job

// ---- the node agent's command line ----

// Append word, shell-quoted; with pdsh_escape every '%' doubled.
static dsc_status add_word(dsc__sbuf *b, const char *word, bool pdsh_escape) {
    dsc__sbuf q = {0};
    dsc_status st = dsc__launch_shell_quote(&q, word);
    for (size_t i = 0; st == DSC_OK && i < q.n; i++) {
        bool pct = q.p[i] == '%' && pdsh_escape;
        st = dsc__sbuf_add(b, pct ? "%%" : q.p + i, pct ? 2 : 1);
    }
    dsc__sbuf_free(&q);
    return st;
}

// " --name=VALUE" with VALUE quoted.
static dsc_status add_flag(dsc__sbuf *b, const char *name, const char *value, bool esc) {
    DSC_TRY(dsc__sbuf_addf(b, " --%s=", name));
    return add_word(b, value, esc);
}

static dsc_status agent_tail(const dsc__launch_job *job, const char *host_expr, bool esc,
                             dsc__sbuf *b) {
    const dsc_launch_opts *o = job->o;
    char *world = NULL;
    DSC_TRY(dsc__launch_pool_format(&job->pool, &world));
    dsc_status st = dsc__sbuf_add(b, " launch", 7);
    if (st == DSC_OK) st = add_flag(b, "world_info", world, esc);
    free(world);
    DSC_TRY(st);
    DSC_TRY(dsc__sbuf_addf(b, " --node_host=%s", host_expr)); // "%h" stays for pdsh to fill in
    DSC_TRY(add_flag(b, "master_addr", job->master_addr, esc));
    DSC_TRY(dsc__sbuf_addf(b, " --master_port=%d", job->master_port));
    if (o->no_local_rank) DSC_TRY(dsc__sbuf_addf(b, " --no_local_rank"));
    if (o->log_dir) DSC_TRY(add_flag(b, "log_dir", o->log_dir, esc));
    DSC_TRY(dsc__sbuf_addf(b, " --"));
    for (int i = 0; i < o->argc; i++) {
        DSC_TRY(dsc__sbuf_add(b, " ", 1));
        DSC_TRY(add_word(b, o->argv[i], esc));
    }
    return DSC_OK;
}

dsc_status dsc__launch_agent_cmd(const dsc__launch_job *job, const char *host_expr,
                                 bool pdsh_escape, char **out) {
    dsc__sbuf b = {0};
    dsc__strv exp = {0};
    dsc_status st;
    DSC_TRY_GOTO(dsc__sbuf_addf(&b, "cd "), st, fail);
    DSC_TRY_GOTO(add_word(&b, job->cwd, pdsh_escape), st, fail);
    DSC_TRY_GOTO(dsc__launch_exported_env(job, &exp), st, fail);
    DSC_TRY_GOTO(dsc__sbuf_addf(&b, " && export"), st, fail);
    for (int i = 0; i < exp.n; i++) {
        DSC_TRY_GOTO(dsc__sbuf_add(&b, " ", 1), st, fail);
        DSC_TRY_GOTO(add_word(&b, exp.v[i], pdsh_escape), st, fail);
    }
    DSC_TRY_GOTO(dsc__sbuf_addf(&b, " && exec "), st, fail);
    DSC_TRY_GOTO(add_word(&b, job->exe, pdsh_escape), st, fail);
    DSC_TRY_GOTO(agent_tail(job, host_expr, pdsh_escape, &b), st, fail);
    dsc__strv_free(&exp);
    *out = b.p;
    return DSC_OK;
fail:
    dsc__strv_free(&exp);
    dsc__sbuf_free(&b);
    return st;
}

// ---- helpers started in the group ----

static dsc_status spawn_helper(const dsc__launch_job *job, dsc__group *g, const dsc__strv *argv,
                               const char *what, dsc__out_mode out, int stop_signal) {
    dsc__strv env = {0};
    dsc_status st = dsc__launch_base_env(job, &env);
    if (st == DSC_OK) {
        dsc__child_spec spec = {.argv = argv->v, .envp = env.v, .what = what, .rank = -1,
                                .out = out, .stop_signal = stop_signal};
        st = dsc__group_spawn(g, &spec);
    }
    dsc__strv_free(&env);
    return st;
}

// Whether pdsh will use its exec module (commands run locally, one argv each).
static bool pdsh_exec_module(const dsc__strv *args) {
    for (int i = 0; i < args->n; i++) {
        if (!strcmp(args->v[i], "-Rexec")) return true;
        if (!strcmp(args->v[i], "-R") && i + 1 < args->n) return !strcmp(args->v[i + 1], "exec");
    }
    const char *t = getenv("PDSH_RCMD_TYPE");
    return t && !strcmp(t, "exec");
}

dsc_status dsc__launch_start_pdsh(const dsc__launch_job *job, dsc__group *g) {
    dsc__strv argv = {0};
    dsc__sbuf hosts = {0};
    char *cmd = NULL;
    dsc_status st;
    // -S: exit with the largest remote exit code; -N: no "host: " prefix (agents prefix ranks).
    const char *fixed[] = {"pdsh", "-S", "-N", "-f", "1024"};
    DSC_TRY_GOTO(dsc__strv_extend(&argv, (char *const *)fixed, 5), st, done);
    DSC_TRY_GOTO(dsc__strv_extend(&argv, job->launcher_args.v, job->launcher_args.n), st, done);
    for (int i = 0; i < job->pool.nhosts; i++)
        DSC_TRY_GOTO(dsc__sbuf_addf(&hosts, "%s%s", i ? "," : "", job->pool.hosts[i].name), st,
                     done);
    DSC_TRY_GOTO(dsc__strv_push(&argv, "-w"), st, done);
    DSC_TRY_GOTO(dsc__strv_push(&argv, hosts.p), st, done);
    DSC_TRY_GOTO(dsc__launch_agent_cmd(job, "%h", true, &cmd), st, done);
    if (pdsh_exec_module(&job->launcher_args)) { // exec runs argv directly: give it a shell
        DSC_TRY_GOTO(dsc__strv_push(&argv, "sh"), st, done);
        DSC_TRY_GOTO(dsc__strv_push(&argv, "-c"), st, done);
    }
    DSC_TRY_GOTO(dsc__strv_push(&argv, cmd), st, done);
    st = spawn_helper(job, g, &argv, "pdsh", DSC__OUT_PDSH, SIGTERM);
done:
    free(cmd);
    dsc__sbuf_free(&hosts);
    dsc__strv_free(&argv);
    return st;
}

static dsc_status spawn_ssh(const dsc__launch_job *job, dsc__group *g, const char *host) {
    dsc__strv argv = {0};
    char *cmd = NULL;
    dsc_status st;
    // DSC_SSH replaces the ssh command (e.g. "ssh -p 2222" or a wrapper); words split as a shell.
    const char *ssh = dsc__env(DSC_ENV_SSH);
    DSC_TRY_GOTO(dsc__launch_split_words(ssh && *ssh ? ssh : "ssh", &argv), st, done);
    DSC_TRY_GOTO(dsc__strv_extend(&argv, job->launcher_args.v, job->launcher_args.n), st, done);
    DSC_TRY_GOTO(dsc__strv_push(&argv, host), st, done);
    DSC_TRY_GOTO(dsc__launch_agent_cmd(job, host, false, &cmd), st, done);
    DSC_TRY_GOTO(dsc__strv_push(&argv, cmd), st, done);
    char what[300];
    snprintf(what, sizeof what, "node %s", host);
    st = spawn_helper(job, g, &argv, what, DSC__OUT_PLAIN, SIGTERM);
done:
    free(cmd);
    dsc__strv_free(&argv);
    return st;
}

dsc_status dsc__launch_start_ssh(const dsc__launch_job *job, dsc__group *g) {
    for (int i = 0; i < job->pool.nhosts; i++) DSC_TRY(spawn_ssh(job, g, job->pool.hosts[i].name));
    return DSC_OK;
}

// `dsc launch --task_env=KIND ... -- PROGRAM ARGS`: what srun / mpirun start for each rank.
static dsc_status shim_args(const dsc__launch_job *job, const char *kind, dsc__strv *argv) {
    const dsc_launch_opts *o = job->o;
    DSC_TRY(dsc__strv_push(argv, job->exe));
    DSC_TRY(dsc__strv_push(argv, "launch"));
    DSC_TRY(dsc__strv_pushf(argv, "--task_env=%s", kind));
    DSC_TRY(dsc__strv_pushf(argv, "--master_addr=%s", job->master_addr));
    DSC_TRY(dsc__strv_pushf(argv, "--master_port=%d", job->master_port));
    if (o->no_local_rank) DSC_TRY(dsc__strv_push(argv, "--no_local_rank"));
    DSC_TRY(dsc__strv_push(argv, "--"));
    return dsc__strv_extend(argv, o->argv, o->argc);
}

dsc_status dsc__launch_start_srun(const dsc__launch_job *job, dsc__group *g) {
    const dsc_launch_opts *o = job->o;
    dsc__strv argv = {0};
    dsc_status st;
    // --label lets us tell ranks apart; --kill-on-bad-exit stops the step when one task fails.
    const char *fixed[] = {"srun", "--label", "--kill-on-bad-exit=1", "--export=ALL"};
    DSC_TRY_GOTO(dsc__strv_extend(&argv, (char *const *)fixed, 4), st, done);
    if (o->num_nodes > 0)
        DSC_TRY_GOTO(dsc__strv_pushf(&argv, "--nodes=%d", o->num_nodes), st, done);
    if (o->num_procs > 0)
        DSC_TRY_GOTO(dsc__strv_pushf(&argv, "--ntasks=%d", o->num_procs), st, done);
    if (o->num_gpus > 0)
        DSC_TRY_GOTO(dsc__strv_pushf(&argv, "--ntasks-per-node=%d", o->num_gpus), st, done);
    DSC_TRY_GOTO(dsc__strv_extend(&argv, job->launcher_args.v, job->launcher_args.n), st, done);
    DSC_TRY_GOTO(shim_args(job, "slurm", &argv), st, done);
    st = spawn_helper(job, g, &argv, "srun", DSC__OUT_SRUN, SIGTERM);
done:
    dsc__strv_free(&argv);
    return st;
}

// mpirun's placement: -H host:slots,... for several hosts; one host may be oversubscribed.
static dsc_status mpirun_hosts(const dsc__launch_job *job, dsc__strv *argv) {
    if (job->pool.nhosts <= 1) return dsc__strv_push(argv, "--oversubscribe");
    dsc__sbuf h = {0};
    dsc_status st = DSC_OK;
    for (int i = 0; i < job->pool.nhosts && st == DSC_OK; i++)
        st = dsc__sbuf_addf(&h, "%s%s:%d", i ? "," : "", job->pool.hosts[i].name,
                            job->pool.hosts[i].nslots);
    if (st == DSC_OK) st = dsc__strv_push(argv, "-H");
    if (st == DSC_OK) st = dsc__strv_push(argv, h.p);
    dsc__sbuf_free(&h);
    return st;
}

dsc_status dsc__launch_start_mpirun(const dsc__launch_job *job, dsc__group *g) {
    dsc__strv argv = {0}, exp = {0};
    dsc_status st;
    DSC_TRY_GOTO(dsc__strv_push(&argv, "mpirun"), st, done);
    if (geteuid() == 0) DSC_TRY_GOTO(dsc__strv_push(&argv, "--allow-run-as-root"), st, done);
    DSC_TRY_GOTO(dsc__strv_push(&argv, "--tag-output"), st, done);
    DSC_TRY_GOTO(dsc__strv_push(&argv, "-n"), st, done);
    DSC_TRY_GOTO(dsc__strv_pushf(&argv, "%d", dsc__launch_pool_size(&job->pool)), st, done);
    DSC_TRY_GOTO(mpirun_hosts(job, &argv), st, done);
    DSC_TRY_GOTO(dsc__launch_exported_env(job, &exp), st, done);
    if (!dsc__strv_getenv(&exp, "PYTHONUNBUFFERED"))
        DSC_TRY_GOTO(dsc__strv_setenv(&exp, "PYTHONUNBUFFERED", "1"), st, done);
    for (int i = 0; i < exp.n; i++) { // -x carries each variable to every host
        DSC_TRY_GOTO(dsc__strv_push(&argv, "-x"), st, done);
        DSC_TRY_GOTO(dsc__strv_push(&argv, exp.v[i]), st, done);
    }
    DSC_TRY_GOTO(dsc__strv_extend(&argv, job->launcher_args.v, job->launcher_args.n), st, done);
    DSC_TRY_GOTO(shim_args(job, "ompi", &argv), st, done);
    st = spawn_helper(job, g, &argv, "mpirun", DSC__OUT_OMPI, SIGTERM);
done:
    dsc__strv_free(&exp);
    dsc__strv_free(&argv);
    return st;
}

// ---- the per-task shim ----

// An integer variable that must be set; lo..hi.
static dsc_status need_int(const char *kind, const char *name, long lo, long hi, int *out) {
    const char *v = getenv(name);
    char *end = NULL;
    long x = v && *v ? strtol(v, &end, 10) : 0;
    if (!v || !*v)
        return dsc__fail(DSC_ERR_CONFIG,
                         "--task_env %s: %s is not set; this mode runs under %s, started by "
                         "dsc launch --launcher %s",
                         kind, name, strcmp(kind, "slurm") ? "mpirun" : "srun",
                         strcmp(kind, "slurm") ? "openmpi" : "slurm");
    if (*end || x < lo || x > hi)
        return dsc__fail(DSC_ERR_CONFIG, "--task_env %s: %s=\"%s\" is not an integer in %ld..%ld",
                         kind, name, v, lo, hi);
    *out = (int)x;
    return DSC_OK;
}

static const char *first_set(const char *a, const char *b) {
    const char *v = getenv(a);
    return v && *v ? a : b;
}

static dsc_status slurm_ranks(int *rank, int *world, int *local, int *lws) {
    const char *k = "slurm";
    DSC_TRY(need_int(k, "SLURM_PROCID", 0, 1 << 30, rank));
    DSC_TRY(need_int(k, first_set("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), 1, 1 << 30, world));
    DSC_TRY(need_int(k, "SLURM_LOCALID", 0, 1 << 30, local));
    int node = 0;
    if (getenv("SLURM_NODEID")) DSC_TRY(need_int(k, "SLURM_NODEID", 0, 1 << 30, &node));
    const char *tpn = getenv(first_set("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"));
    *lws = dsc_slurm_tasks_on_node(tpn, node);
    if (*lws < 1) *lws = *world; // one node unless SLURM says otherwise
    return DSC_OK;
}

static dsc_status ompi_ranks(int *rank, int *world, int *local, int *lws) {
    const char *k = "ompi";
    DSC_TRY(need_int(k, "OMPI_COMM_WORLD_RANK", 0, 1 << 30, rank));
    DSC_TRY(need_int(k, "OMPI_COMM_WORLD_SIZE", 1, 1 << 30, world));
    DSC_TRY(need_int(k, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 30, local));
    return need_int(k, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1 << 30, lws);
}

static void set_int_env(const char *name, int v) {
    char s[16];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

// The local launcher's thread counts for a task of srun or mpirun: a task they bound to some cores
// gets as many threads as it has cores; an unbound one its share of the host. Said by rank 0.
static dsc_status task_threads(int rank, int lws) {
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int mine = dsc__launch_cores();
    bool bound = online > 0 && mine < online;
    dsc__strv env = {0};
    char said[256];
    const char *names[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"};
    dsc_status st = DSC_OK;
    for (int k = 0; k < 2 && st == DSC_OK; k++)
        if (getenv(names[k])) st = dsc__strv_setenv(&env, names[k], getenv(names[k]));
    if (st == DSC_OK)
        st = dsc__launch_thread_env(lws, bound ? mine * lws : mine, &env, said, sizeof said);
    for (int k = 0; k < 2 && st == DSC_OK; k++) {
        const char *v = dsc__strv_getenv(&env, names[k]);
        if (v && !getenv(names[k]) && setenv(names[k], v, 1) != 0)
            st = dsc__fail(DSC_ERR_SYSTEM, "setenv %s: %s", names[k], strerror(errno));
    }
    if (st == DSC_OK && rank == 0 && said[0]) fprintf(stderr, "dsc launch: %s\n", said);
    dsc__strv_free(&env);
    return st;
}

dsc_status dsc__launch_task_exec(const dsc_launch_opts *o) {
    int rank, world, local, lws;
    if (!strcmp(o->task_env, "slurm")) DSC_TRY(slurm_ranks(&rank, &world, &local, &lws));
    else if (!strcmp(o->task_env, "ompi")) DSC_TRY(ompi_ranks(&rank, &world, &local, &lws));
    else
        return dsc__fail(DSC_ERR_INVALID_ARG, "--task_env '%s' is not slurm or ompi", o->task_env);
    set_int_env("RANK", rank);
    set_int_env("WORLD_SIZE", world);
    set_int_env("LOCAL_RANK", local);
    set_int_env("LOCAL_WORLD_SIZE", lws);
    setenv("MASTER_ADDR", o->master_addr ? o->master_addr : "127.0.0.1", 1);
    set_int_env("MASTER_PORT", o->master_port);
    if (!getenv("PYTHONUNBUFFERED")) setenv("PYTHONUNBUFFERED", "1", 1);
    DSC_TRY(task_threads(rank, lws));
    dsc__strv argv = {0};
    DSC_TRY(dsc__launch_program_argv(o, local, &argv));
    execvp(argv.v[0], argv.v);
    dsc_status st = dsc__fail(DSC_ERR_INVALID_ARG, "rank %d: cannot run '%s': %s", rank,
                              argv.v[0], strerror(errno));
    dsc__strv_free(&argv);
    return st;
}
