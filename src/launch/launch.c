// launch/launch.c - the job: resolve hosts and slots, start local ranks with their environment,
// run node agents, restart after failures.
#define _GNU_SOURCE // environ, sigabbrev_np

#include "launch/launch.h"

#include <dirent.h>    // opendir, readdir
#include <sched.h>     // sched_getaffinity, CPU_COUNT
#include <errno.h>     // errno
#include <limits.h>    // PATH_MAX
#include <signal.h>    // SIGTERM
#include <stdio.h>     // fprintf, snprintf
#include <stdlib.h>    // getenv, free
#include <string.h>    // strcmp, strlen, strncmp
#include <sys/prctl.h> // prctl, PR_SET_PDEATHSIG
#include <sys/stat.h>  // stat, mkdir
#include <unistd.h>    // access, getcwd, readlink

#include "base/env.h"           // dsc__env, DSC_ENV_*
#include "base/status.h"        // dsc__fail, DSC_TRY
#include "dsc/comm.h"           // dsc_hostlist_expand
#include "launch/launch_impl.h" // dsc__launch_job, start_*

extern char **environ;

void dsc_launch_opts_init(dsc_launch_opts *o) {
    *o = (dsc_launch_opts){.num_nodes = -1, .num_gpus = -1, .num_procs = -1,
                           .master_port = DSC_LAUNCH_DEFAULT_PORT, .min_procs = 1,
                           .node_rank = -1};
}

int dsc__launch_gpu_count(void) {
    DIR *d = opendir("/dev");
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *s = e->d_name;
        if (strncmp(s, "nvidia", 6) || !s[6]) continue;
        bool digits = true;
        for (const char *p = s + 6; *p; p++) digits = digits && *p >= '0' && *p <= '9';
        n += digits;
    }
    closedir(d);
    return n;
}

bool dsc__launch_which(const char *name, char *out, size_t cap) {
    if (strchr(name, '/')) {
        snprintf(out, cap, "%s", name);
        return access(name, X_OK) == 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        struct stat sb;
        snprintf(out, cap, "%.*s%s%s", (int)len, p, len ? "/" : "", name);
        if (access(out, X_OK) == 0 && stat(out, &sb) == 0 && S_ISREG(sb.st_mode)) return true;
        p += len + (c ? 1 : 0);
    }
    return false;
}

// ---- program and environment ----

static bool is_python_script(const char *prog) {
    size_t n = strlen(prog);
    return n > 3 && !strcmp(prog + n - 3, ".py");
}

dsc_status dsc__launch_program_argv(const dsc_launch_opts *o, int local_rank, dsc__strv *argv) {
    // DeepSpeed's launcher runs `python -u script.py`; a .py program gets the same treatment.
    if (is_python_script(o->argv[0])) {
        DSC_TRY(dsc__strv_push(argv, "python3"));
        DSC_TRY(dsc__strv_push(argv, "-u"));
    }
    DSC_TRY(dsc__strv_extend(argv, o->argv, o->argc));
    if (!o->no_local_rank && local_rank >= 0)
        DSC_TRY(dsc__strv_pushf(argv, "--local_rank=%d", local_rank));
    return DSC_OK;
}

// Read `dir`/NAME (NAME from DS_ENV_FILE, default .deepspeed_env) when it exists.
static dsc_status load_envfile(const char *dir, dsc__strv *kv) {
    const char *name = dsc__env(DSC_ENV_DS_ENV_FILE);
    if (!name || !*name) name = ".deepspeed_env";
    char path[PATH_MAX];
    if (name[0] == '/') snprintf(path, sizeof path, "%s", name);
    else snprintf(path, sizeof path, "%s/%s", dir, name);
    if (access(path, F_OK) != 0) return DSC_OK;
    char *text = NULL;
    DSC_TRY(dsc__launch_read_file(path, 1u << 20, &text));
    dsc_status st = dsc__launch_envfile_parse(text, path, kv);
    free(text);
    return st;
}

// As DeepSpeed: the home directory's file first, then the current directory's (which wins).
static dsc_status load_envfiles(dsc__strv *kv) {
    const char *home = getenv("HOME");
    if (home && *home) DSC_TRY(load_envfile(home, kv));
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return DSC_OK;
    if (home && !strcmp(home, cwd)) return DSC_OK;
    return load_envfile(cwd, kv);
}

static bool exported_name(const char *kv) {
    static const char *prefixes[] = {"NCCL_", "PYTHON", "UCX_", "MV2_", "MLFLOW", "OMP_", "DSC_"};
    for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
        if (!strncmp(kv, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}

dsc_status dsc__launch_exported_env(const dsc__launch_job *job, dsc__strv *out) {
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || !exported_name(*e) || !strncmp(*e, "DSC_RESTART_COUNT=", 18)) continue;
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - *e), *e);
        DSC_TRY(dsc__strv_setenv(out, key, eq + 1));
    }
    for (int i = 0; i < job->envfile.n; i++) {
        const char *kv = job->envfile.v[i], *eq = strchr(kv, '=');
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        DSC_TRY(dsc__strv_setenv(out, key, eq + 1));
    }
    char n[16];
    snprintf(n, sizeof n, "%d", job->attempt);
    return dsc__strv_setenv(out, "DSC_RESTART_COUNT", n);
}

dsc_status dsc__launch_base_env(const dsc__launch_job *job, dsc__strv *env) {
    for (char **e = environ; *e; e++) DSC_TRY(dsc__strv_push(env, *e));
    for (int i = 0; i < job->envfile.n; i++) {
        const char *kv = job->envfile.v[i], *eq = strchr(kv, '=');
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        DSC_TRY(dsc__strv_setenv(env, key, eq + 1));
    }
    char n[16];
    snprintf(n, sizeof n, "%d", job->attempt);
    DSC_TRY(dsc__strv_setenv(env, "DSC_RESTART_COUNT", n));
    // Ranks write into pipes; Python would hold its output in a block buffer until exit.
    if (!dsc__strv_getenv(env, "PYTHONUNBUFFERED"))
        DSC_TRY(dsc__strv_setenv(env, "PYTHONUNBUFFERED", "1"));
    return DSC_OK;
}

static dsc_status mkdir_p(const char *dir) {
    char path[PATH_MAX];
    int n = snprintf(path, sizeof path, "%s", dir);
    if (n <= 0 || n >= (int)sizeof path)
        return dsc__fail(DSC_ERR_INVALID_ARG, "--log_dir '%s': path too long", dir);
    for (char *p = path + 1;; p++) {
        bool end = !*p;
        if (*p != '/' && !end) continue;
        *p = '\0';
        if (mkdir(path, 0755) < 0 && errno != EEXIST)
            return dsc__fail(DSC_ERR_IO, "--log_dir: cannot create %s: %s", path, strerror(errno));
        if (end) break;
        *p = '/';
    }
    return DSC_OK;
}

// ---- local ranks ----

static dsc_status set_int(dsc__strv *env, const char *key, int v) {
    char s[16];
    snprintf(s, sizeof s, "%d", v);
    return dsc__strv_setenv(env, key, s);
}

// The environment of one rank: base plus the torch-style variables.
static dsc_status rank_env(const dsc__launch_job *job, const dsc__strv *base, int node, int rank,
                           int local_rank, dsc__strv *env) {
    const dsc__launch_pool *p = &job->pool;
    DSC_TRY(dsc__strv_extend(env, base->v, base->n));
    DSC_TRY(set_int(env, "RANK", rank));
    DSC_TRY(set_int(env, "LOCAL_RANK", local_rank));
    DSC_TRY(set_int(env, "WORLD_SIZE", dsc__launch_pool_size(p)));
    DSC_TRY(set_int(env, "LOCAL_WORLD_SIZE", p->hosts[node].nslots));
    DSC_TRY(set_int(env, "CROSS_RANK", node)); // DeepSpeed's names for the node index and count
    DSC_TRY(set_int(env, "CROSS_SIZE", p->nhosts));
    DSC_TRY(dsc__strv_setenv(env, "MASTER_ADDR", job->master_addr));
    return set_int(env, "MASTER_PORT", job->master_port);
}

// CUDA_VISIBLE_DEVICES for the node's slots, as DeepSpeed sets it: the same list for every rank
// of the node; each rank picks its device by LOCAL_RANK.
static dsc_status set_visible_devices(const dsc__launch_host *h, dsc__strv *env) {
    dsc__sbuf b = {0};
    dsc_status st = DSC_OK;
    for (int s = 0; s < h->nslots && st == DSC_OK; s++)
        st = dsc__sbuf_addf(&b, "%s%d", s ? "," : "", h->slots[s]);
    if (st == DSC_OK) st = dsc__strv_setenv(env, "CUDA_VISIBLE_DEVICES", b.p ? b.p : "");
    dsc__sbuf_free(&b);
    return st;
}

// Slots name GPUs only on a GPU machine, and only when each slot is a GPU of it; more processes
// than GPUs (--num_procs) leave CUDA_VISIBLE_DEVICES as it is.
static bool slots_are_gpus(const dsc__launch_host *h) {
    int gpus = dsc__launch_gpu_count();
    bool ok = gpus > 0;
    for (int s = 0; s < h->nslots && ok; s++) ok = h->slots[s] < gpus;
    return ok;
}

static dsc_status spawn_rank(const dsc__launch_job *job, const dsc__strv *base, int node, int rank,
                             int local_rank, dsc__group *g) {
    dsc__strv env = {0}, argv = {0};
    dsc_status st;
    DSC_TRY_GOTO(rank_env(job, base, node, rank, local_rank, &env), st, done);
    DSC_TRY_GOTO(dsc__launch_program_argv(job->o, local_rank, &argv), st, done);
    char what[32];
    snprintf(what, sizeof what, "rank %d", rank);
    dsc__child_spec spec = {.argv = argv.v, .envp = env.v, .what = what, .rank = rank,
                            .out = DSC__OUT_RANK};
    st = dsc__group_spawn(g, &spec);
done:
    dsc__strv_free(&env);
    dsc__strv_free(&argv);
    return st;
}

int dsc__launch_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

dsc_status dsc__launch_thread_env(int nlocal, int cores, dsc__strv *env, char *said, size_t cap) {
    if (said && cap) said[0] = '\0';
    if (nlocal < 2) return DSC_OK;
    int per_rank = cores / nlocal > 0 ? cores / nlocal : 1;
    bool omp = dsc__strv_getenv(env, "OMP_NUM_THREADS") != NULL;
    // OpenBLAS follows OMP_NUM_THREADS when its own variable is absent: a user's OMP value rules.
    bool blas = omp || dsc__strv_getenv(env, "OPENBLAS_NUM_THREADS") != NULL;
    if (omp && blas) return DSC_OK;
    char n[16];
    snprintf(n, sizeof n, "%d", per_rank);
    if (!omp) DSC_TRY(dsc__strv_setenv(env, "OMP_NUM_THREADS", n));
    if (!blas) DSC_TRY(dsc__strv_setenv(env, "OPENBLAS_NUM_THREADS", n));
    if (said)
        snprintf(said, cap, "%s%s%s=%d for each of the %d local ranks (%d cores / %d ranks); set "
                 "%s to choose another count", omp ? "" : "OMP_NUM_THREADS",
                 !omp && !blas ? " and " : "", blas ? "" : "OPENBLAS_NUM_THREADS", per_rank,
                 nlocal, cores, nlocal, omp ? "it" : "OMP_NUM_THREADS");
    return DSC_OK;
}

// Start the ranks of host `node` of the job's pool in g.
static dsc_status spawn_local_ranks(const dsc__launch_job *job, int node, dsc__group *g) {
    const dsc__launch_pool *p = &job->pool;
    int base_rank = 0;
    for (int i = 0; i < node; i++) base_rank += p->hosts[i].nslots;
    dsc__strv base = {0};
    dsc_status st;
    DSC_TRY_GOTO(dsc__launch_base_env(job, &base), st, done);
    char said[256];
    DSC_TRY_GOTO(dsc__launch_thread_env(p->hosts[node].nslots, dsc__launch_cores(), &base, said,
                                        sizeof said), st, done);
    if (said[0] && job->attempt == 0) fprintf(stderr, "dsc launch: %s\n", said); // once
    if (slots_are_gpus(&p->hosts[node]))
        DSC_TRY_GOTO(set_visible_devices(&p->hosts[node], &base), st, done);
    for (int i = 0; i < p->hosts[node].nslots; i++)
        DSC_TRY_GOTO(spawn_rank(job, &base, node, base_rank + i, i, g), st, done);
done:
    dsc__strv_free(&base);
    return st;
}

// ---- one attempt ----

static const char *group_noun(const dsc__launch_job *job, bool agent) {
    if (agent || job->kind == DSC__LAUNCHER_LOCAL) return "rank";
    if (job->kind == DSC__LAUNCHER_SSH) return "node";
    return "process";
}

static dsc_status start_attempt(const dsc__launch_job *job, bool agent, int node, dsc__group *g) {
    if (agent) return spawn_local_ranks(job, node, g);
    switch (job->kind) {
    case DSC__LAUNCHER_LOCAL: return spawn_local_ranks(job, 0, g);
    case DSC__LAUNCHER_PDSH: return dsc__launch_start_pdsh(job, g);
    case DSC__LAUNCHER_SSH: return dsc__launch_start_ssh(job, g);
    case DSC__LAUNCHER_SLURM: return dsc__launch_start_srun(job, g);
    case DSC__LAUNCHER_OPENMPI: return dsc__launch_start_mpirun(job, g);
    }
    return dsc__fail(DSC_ERR_INTERNAL, "launcher: unknown kind %d", (int)job->kind);
}

// Start everything of one attempt and supervise it to the end.
static dsc_status run_attempt(const dsc__launch_job *job, bool agent, int node,
                              dsc__group_result *r) {
    dsc__group *g = NULL;
    // Node agents and local ranks write rank logs; under srun/mpirun the head demultiplexes the
    // labelled lines into the same files.
    const char *log_dir = job->kind == DSC__LAUNCHER_PDSH || job->kind == DSC__LAUNCHER_SSH
                              ? (agent ? job->o->log_dir : NULL)
                              : job->o->log_dir;
    DSC_TRY(dsc__group_create(group_noun(job, agent), log_dir, job->attempt, agent, &g));
    // In-place recovery needs the ranks of one node (shm): only the local launcher keeps them.
    if (!agent && job->kind == DSC__LAUNCHER_LOCAL && dsc__launch_policy_tolerates(&job->policy))
        dsc__group_tolerate(g, job->policy.source);
    dsc_status st = start_attempt(job, agent, node, g);
    if (st == DSC_OK) st = dsc__group_wait(g, r);
    dsc__group_destroy(g);
    return st;
}

// ---- node agent ----

static int env_int_or(const char *name, int dflt) {
    const char *v = getenv(name);
    char *end = NULL;
    long x = v && *v ? strtol(v, &end, 10) : dflt;
    return v && *v && (*end || x < 0 || x > 1000000) ? dflt : (int)x;
}

static dsc_status agent_node(const dsc_launch_opts *o, const dsc__launch_pool *p, int *node) {
    if (o->node_host) {
        *node = dsc__launch_pool_find(p, o->node_host);
        if (*node < 0)
            return dsc__fail(DSC_ERR_INVALID_ARG, "--node_host '%s' is not in --world_info",
                             o->node_host);
        return DSC_OK;
    }
    if (o->node_rank < 0 || o->node_rank >= p->nhosts)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--world_info needs --node_host or --node_rank (0..%d)", p->nhosts - 1);
    *node = o->node_rank;
    return DSC_OK;
}

// A node agent: started by pdsh or ssh on one host, runs that host's ranks.
static dsc_status agent_run(const dsc_launch_opts *o, int *exit_code) {
    // When pdsh or the remote shell that started us goes away, so do we (and our ranks).
    prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
    dsc__launch_job job = {.o = o, .kind = DSC__LAUNCHER_LOCAL, .master_port = o->master_port};
    DSC_TRY(dsc__launch_pool_parse(o->world_info, &job.pool));
    int node = 0;
    dsc_status st;
    DSC_TRY_GOTO(agent_node(o, &job.pool, &node), st, done);
    snprintf(job.master_addr, sizeof job.master_addr, "%s",
             o->master_addr ? o->master_addr : job.pool.hosts[0].name);
    job.attempt = env_int_or("DSC_RESTART_COUNT", 0);
    if (o->log_dir) DSC_TRY_GOTO(mkdir_p(o->log_dir), st, done);
    DSC_TRY_GOTO(dsc__launch_begin(), st, done);
    dsc__group_result r;
    st = run_attempt(&job, true, node, &r);
    dsc__launch_end();
    if (st == DSC_OK) {
        if (r.exit_code)
            fprintf(stderr, "dsc launch: node %s: %s\n", job.pool.hosts[node].name, r.reason);
        *exit_code = r.exit_code;
    }
done:
    dsc__launch_pool_free(&job.pool);
    return st;
}

// ---- the head: hosts, launcher, restarts ----

// Keep the first `procs` slots in host order.
static void take_first(dsc__launch_pool *p, int procs) {
    int left = procs, keep = 0;
    for (int i = 0; i < p->nhosts; i++) {
        if (left <= 0) break;
        if (p->hosts[i].nslots > left) p->hosts[i].nslots = left;
        left -= p->hosts[i].nslots;
        keep = i + 1;
    }
    while (p->nhosts > keep) dsc__launch_pool_remove(p, p->hosts[p->nhosts - 1].name);
}

// The pool of a run without a hostfile: as many slots as asked for, else one per GPU, else one.
// On a GPU machine --num_gpus may not exceed the GPUs, and (DeepSpeed's rule) a
// CUDA_VISIBLE_DEVICES that is already set names the GPUs to use, unless --include/--exclude do.
static dsc_status local_pool(const dsc_launch_opts *o, dsc__launch_pool *out) {
    int gpus = dsc__launch_gpu_count();
    if (gpus > 0 && o->num_gpus > gpus)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--num_gpus %d: this machine has %d GPU(s); use --num_procs to start "
                         "more processes than GPUs",
                         o->num_gpus, gpus);
    int n = o->num_procs > 0 ? o->num_procs : o->num_gpus > 0 ? o->num_gpus : gpus ? gpus : 1;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    // --num_procs counts processes, not GPUs: it leaves CUDA_VISIBLE_DEVICES alone.
    if (gpus > 0 && cvd && *cvd && !o->include && !o->exclude && o->num_procs < 0) {
        char spec[512];
        snprintf(spec, sizeof spec, "localhost:%s", cvd);
        // Device numbers only; UUIDs and the like fall through to plain slots.
        if (dsc__launch_pool_parse(spec, out) == DSC_OK) {
            if (o->num_gpus < 0) return DSC_OK;
            if (n <= out->hosts[0].nslots) {
                out->hosts[0].nslots = n;
                return DSC_OK;
            }
            dsc__launch_pool_free(out);
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "--num_gpus %d but CUDA_VISIBLE_DEVICES=%s names fewer GPUs; unset "
                             "it or ask for fewer",
                             n, cvd);
        }
    }
    return dsc__launch_pool_local(n, out);
}

static dsc_status resolve_pool(const dsc_launch_opts *o, dsc__launch_pool *out) {
    const char *hf = o->hostfile;
    if (!hf && access(DSC_LAUNCH_DEFAULT_HOSTFILE, F_OK) == 0) hf = DSC_LAUNCH_DEFAULT_HOSTFILE;
    if (o->num_procs > 0 && o->num_gpus > 0 && !hf && o->num_procs != o->num_gpus)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--num_procs %d and --num_gpus %d disagree; on one host give one of them",
                         o->num_procs, o->num_gpus);
    if (!hf && o->num_nodes > 1)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--num_nodes %d needs a hostfile (--hostfile FILE, lines 'HOST slots=N')",
                         o->num_nodes);
    dsc__launch_pool base = {0};
    if (hf) {
        DSC_TRY(dsc__launch_hostfile_read(hf, &base));
    } else {
        DSC_TRY(local_pool(o, &base));
    }
    dsc_status st = dsc__launch_pool_filter(&base, o->include, o->exclude, out);
    dsc__launch_pool_free(&base);
    DSC_TRY(st);
    if (hf) {
        st = dsc__launch_pool_limit(out, o->num_nodes, o->num_gpus);
        if (st == DSC_OK && o->num_procs > dsc__launch_pool_size(out))
            st = dsc__fail(DSC_ERR_INVALID_ARG, "--num_procs %d: only %d slots are available",
                           o->num_procs, dsc__launch_pool_size(out));
        if (st == DSC_OK && o->num_procs > 0) take_first(out, o->num_procs);
        if (st != DSC_OK) dsc__launch_pool_free(out);
    }
    return st;
}

static dsc_status parse_kind(const dsc_launch_opts *o, int nhosts, dsc__launcher_kind *k) {
    static const struct {
        const char *name;
        dsc__launcher_kind kind;
    } kinds[] = {{"local", DSC__LAUNCHER_LOCAL},
                 {"pdsh", DSC__LAUNCHER_PDSH},
                 {"ssh", DSC__LAUNCHER_SSH},
                 {"slurm", DSC__LAUNCHER_SLURM},
                 {"openmpi", DSC__LAUNCHER_OPENMPI}};
    if (!o->launcher) { // DeepSpeed's choice: one host runs locally, several through pdsh
        *k = nhosts > 1 || o->force_multi ? DSC__LAUNCHER_PDSH : DSC__LAUNCHER_LOCAL;
        return DSC_OK;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(o->launcher, kinds[i].name)) {
            *k = kinds[i].kind;
            return DSC_OK;
        }
    return dsc__fail(DSC_ERR_INVALID_ARG,
                     "--launcher '%s' is not one of local, pdsh, ssh, slurm, openmpi",
                     o->launcher);
}

// Rank 0's address: --master_addr, else SLURM's first node, else the first host when ranks run
// on other hosts (pdsh, ssh, mpirun over several hosts), else loopback.
static dsc_status pick_master(dsc__launch_job *job) {
    const dsc_launch_opts *o = job->o;
    char *addr = job->master_addr;
    size_t cap = sizeof job->master_addr;
    bool remote = job->kind == DSC__LAUNCHER_PDSH || job->kind == DSC__LAUNCHER_SSH ||
                  (job->kind == DSC__LAUNCHER_OPENMPI && job->pool.nhosts > 1);
    snprintf(addr, cap, "127.0.0.1");
    if (o->master_addr) snprintf(addr, cap, "%s", o->master_addr);
    else if (job->kind == DSC__LAUNCHER_SLURM) DSC_TRY(dsc_slurm_first_host(addr, cap));
    else if (remote) snprintf(addr, cap, "%s", job->pool.hosts[0].name);
    job->master_port = o->master_port;
    return DSC_OK;
}

static const char *helper_of(dsc__launcher_kind k) {
    switch (k) {
    case DSC__LAUNCHER_PDSH: return "pdsh";
    case DSC__LAUNCHER_SSH: return dsc__env(DSC_ENV_SSH) && *dsc__env(DSC_ENV_SSH) ? NULL : "ssh";
    case DSC__LAUNCHER_SLURM: return "srun";
    case DSC__LAUNCHER_OPENMPI: return "mpirun";
    default: return NULL;
    }
}

// Everything that can be checked before starting anything.
static dsc_status check_job(const dsc__launch_job *job) {
    const dsc_launch_opts *o = job->o;
    char path[PATH_MAX];
    const char *helper = helper_of(job->kind);
    if (helper && !dsc__launch_which(helper, path, sizeof path))
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--launcher %s needs the '%s' command, which is not in PATH; install it "
                         "or pick another --launcher",
                         o->launcher ? o->launcher : "pdsh", helper);
    if (job->kind == DSC__LAUNCHER_SLURM && !getenv("SLURM_JOB_ID"))
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "--launcher slurm runs inside a SLURM allocation, and SLURM_JOB_ID is "
                         "not set; start dsc launch from an sbatch script or under salloc");
    if (job->kind == DSC__LAUNCHER_LOCAL && job->pool.nhosts > 1)
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "the local launcher runs on one host but %d hosts were selected; use "
                         "--launcher pdsh|ssh|openmpi, or --num_nodes 1 / --include",
                         job->pool.nhosts);
    if (job->kind != DSC__LAUNCHER_SLURM && dsc__launch_pool_size(&job->pool) < o->min_procs)
        return dsc__fail(DSC_ERR_INVALID_ARG, "--min_procs %d is more than the %d slots selected",
                         o->min_procs, dsc__launch_pool_size(&job->pool));
    if (job->kind != DSC__LAUNCHER_LOCAL) return DSC_OK;
    const char *prog = o->argv[0];
    if (is_python_script(prog)) {
        if (access(prog, R_OK) != 0)
            return dsc__fail(DSC_ERR_INVALID_ARG, "cannot read the script %s: %s", prog,
                             strerror(errno));
        prog = "python3";
    }
    if (!dsc__launch_which(prog, path, sizeof path))
        return dsc__fail(DSC_ERR_INVALID_ARG,
                         "program '%s' was not found in PATH or is not executable", prog);
    return DSC_OK;
}

static dsc_status prepare_job(const dsc_launch_opts *o, dsc__launch_job *job) {
    job->o = o;
    if (!getcwd(job->cwd, sizeof job->cwd))
        return dsc__fail(DSC_ERR_SYSTEM, "getcwd: %s", strerror(errno));
    ssize_t n = readlink("/proc/self/exe", job->exe, sizeof job->exe - 1);
    if (n <= 0) return dsc__fail(DSC_ERR_SYSTEM, "readlink /proc/self/exe: %s", strerror(errno));
    job->exe[n] = '\0';
    if (o->launcher_args) DSC_TRY(dsc__launch_split_words(o->launcher_args, &job->launcher_args));
    bool slurm = o->launcher && !strcmp(o->launcher, "slurm");
    if (!slurm) DSC_TRY(resolve_pool(o, &job->pool));
    DSC_TRY(parse_kind(o, job->pool.nhosts, &job->kind));
    DSC_TRY(dsc__launch_policy_resolve(o, &job->policy));
    DSC_TRY(check_job(job));
    DSC_TRY(pick_master(job));
    DSC_TRY(load_envfiles(&job->envfile));
    if (o->log_dir) DSC_TRY(mkdir_p(o->log_dir));
    return DSC_OK;
}

// Before a restart: drop a host whose agent could not be reached (ssh and pdsh report 255), and
// check that enough slots remain. Prints why not and returns false when no restart is possible.
static bool shrink_for_restart(dsc__launch_job *job, const dsc__group_result *r) {
    const dsc_launch_opts *o = job->o;
    bool remote = job->kind == DSC__LAUNCHER_PDSH || job->kind == DSC__LAUNCHER_SSH;
    if (remote && r->failed_code == 255 && !strncmp(r->failed_what, "node ", 5)) {
        fprintf(stderr, "dsc launch: leaving out host %s, which could not be reached\n",
                r->failed_what + 5);
        dsc__launch_pool_remove(&job->pool, r->failed_what + 5);
    }
    int slots = dsc__launch_pool_size(&job->pool);
    if (job->kind != DSC__LAUNCHER_SLURM && slots < o->min_procs) {
        fprintf(stderr,
                "dsc launch: only %d slots left, fewer than --min_procs %d; not restarting\n",
                slots, o->min_procs);
        return false;
    }
    return true;
}

static dsc_status head_loop(dsc__launch_job *job, int *exit_code) {
    const dsc_launch_opts *o = job->o;
    DSC_TRY(dsc__launch_begin());
    dsc_status st = DSC_OK;
    for (job->attempt = 0;; job->attempt++) {
        dsc__group_result r;
        st = run_attempt(job, false, 0, &r);
        if (st != DSC_OK) break;
        *exit_code = r.exit_code;
        if (r.reason[0]) fprintf(stderr, "dsc launch: %s\n", r.reason); // lost ranks, or why
        if (r.exit_code == 0) break;
        if (r.exit_code == DSC_LAUNCH_EXIT_STARTUP && job->attempt < o->max_restarts) {
            fprintf(stderr, "dsc launch: not restarting: a start-up error would stop the restart "
                    "too; fix it and launch again\n");
            break;
        }
        if (r.signal || job->attempt >= o->max_restarts || !shrink_for_restart(job, &r)) break;
        int stop = dsc__launch_pending_stop();
        if (stop) {
            fprintf(stderr, "dsc launch: received signal %d; not restarting\n", stop);
            *exit_code = 128 + stop;
            break;
        }
        fprintf(stderr, "dsc launch: restart %d of %d\n", job->attempt + 1, o->max_restarts);
    }
    dsc__launch_end();
    return st;
}

dsc_status dsc_launch_run(const dsc_launch_opts *o, int *exit_code) {
    *exit_code = 1;
    if (!o || !o->argv || o->argc < 1 || !o->argv[0][0])
        return dsc__fail(DSC_ERR_INVALID_ARG, "no program to launch; usage: dsc launch [flags] "
                                              "PROGRAM [ARGS...]");
    if (o->max_restarts < 0 || o->min_procs < 1 || o->master_port < 1 || o->master_port > 65535)
        return dsc__fail(DSC_ERR_INVALID_ARG, "launcher options out of range");
    if (o->task_env) return dsc__launch_task_exec(o);
    if (o->world_info) return agent_run(o, exit_code);
    dsc__launch_job job = {0};
    dsc_status st = prepare_job(o, &job);
    if (st == DSC_OK) st = head_loop(&job, exit_code);
    dsc__launch_pool_free(&job.pool);
    dsc__strv_free(&job.envfile);
    dsc__strv_free(&job.launcher_args);
    return st;
}
