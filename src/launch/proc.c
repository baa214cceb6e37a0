// launch/proc.c - child groups: spawn, relay output, stop on the first failure, forward signals
// (the process-wide signal pipe and the guardian are launch/guard.c).
#define _GNU_SOURCE // execvpe, pipe2, vasprintf

#include "launch/proc.h"

#include <errno.h>     // errno, EINTR, EAGAIN
#include <fcntl.h>     // open, fcntl, O_*
#include <poll.h>      // poll
#include <signal.h>    // sigaction, kill
#include <stdio.h>     // snprintf, dprintf
#include <stdlib.h>    // calloc, realloc, free
#include <string.h>    // strerror, memchr, memmove, strncmp
#include <sys/prctl.h> // prctl, PR_SET_PDEATHSIG
#include <sys/stat.h>  // mode constants
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, pipe2, dup2, read, write, close

#include "base/status.h"  // dsc__fail
#include "base/time.h"    // dsc_now
#include "launch/guard.h" // dsc__launch_signal_fd, dsc__launch_guard, ...

#define LINE_CAP 65536  // longest line relayed whole; longer ones are cut into pieces
#define DRAIN_S 1.0     // after the last child exits, how long leftovers may still write
#define POLL_MAX_MS 500 // wake at least this often (a lost SIGCHLD cannot hang us)
#define DSC__EXIT_RESTART 75 // a rank asking for a restart (DSC_LAUNCH_EXIT_RESTART)
#define DSC__EXIT_STARTUP 78 // a rank that could not start (DSC_LAUNCH_EXIT_STARTUP)
#define RESTART_WAIT_S 10.0  // tolerating: how long the others may finish after an exit 75
#define STOPPED_CHECK_S 0.5  // tolerating: how often to look for children left stopped

// ---- groups ----

typedef struct child {
    pid_t pid;
    char what[64];
    int rank;
    dsc__out_mode out;
    int stop_signal;
    bool running;
    bool lost_noted;      // reported as lost before it was reaped (killed while stopped)
    int fd[2];            // read ends of its stdout and stderr; -1 once closed
    char *buf[2];         // partial lines, LINE_CAP bytes each
    size_t nbuf[2];
} child;

struct dsc__group {
    child *c;
    int n, cap;
    char noun[16];
    char *log_dir;
    int attempt;
    int *log_fd; // by rank, -1 = not open yet; grown on demand
    int nlog;
    bool log_broken;
    bool watch_stdout;
    bool stopping, killed, swept;
    int stopped; // children running when a launcher signal stopped the group
    double kill_at;
    bool output_gone;
    // dsc__group_tolerate: failures leave the others running
    bool tolerate;
    char policy[160];
    // the first failure an error exit: when, and the others then running (a kill found next
    // may have caused it; see note_exit)
    double failed_at;
    int failed_others;
    int finished, lost, last_code; // children that exited 0; lost ones; the last loss's code
    char lost_text[256];           // "rank 2 (was killed by signal 9), ..."
    double stop_at;                // > 0: begin the stop then (after an exit 75)
    double next_stopped_check;
    struct pollfd *pfd;
    dsc__group_result *r; // while dsc__group_wait runs
    char scratch[LINE_CAP + 128];
};

dsc_status dsc__group_create(const char *noun, const char *log_dir, int attempt,
                             bool watch_stdout, dsc__group **out) {
    dsc__group *g = calloc(1, sizeof *g);
    if (!g) return dsc__fail(DSC_ERR_OOM, "launcher: out of memory");
    snprintf(g->noun, sizeof g->noun, "%s", noun);
    g->attempt = attempt;
    g->watch_stdout = watch_stdout;
    if (log_dir && !(g->log_dir = strdup(log_dir))) {
        free(g);
        return dsc__fail(DSC_ERR_OOM, "launcher: out of memory");
    }
    *out = g;
    return DSC_OK;
}

void dsc__group_tolerate(dsc__group *g, const char *policy) {
    g->tolerate = true;
    snprintf(g->policy, sizeof g->policy, "%s", policy);
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

// In the child, between fork and exec: only async-signal-safe calls.
static void child_exec(const dsc__child_spec *s, int out_fd, int err_fd) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != dsc__launch_pid()) _exit(128 + SIGKILL); // the launcher died before prctl
    dsc__launch_child_signals(); // the launcher's handlers back to the defaults
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGQUIT, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    int null = open("/dev/null", O_RDONLY);
    if (null >= 0) dup2(null, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    execvpe(s->argv[0], s->argv, s->envp);
    dprintf(2, "dsc launch: cannot run '%s': %s; check the program name and PATH\n", s->argv[0],
            strerror(errno));
    _exit(127);
}

static dsc_status child_slot(dsc__group *g, child **out) {
    if (g->n == g->cap) {
        int cap = g->cap ? g->cap * 2 : 8;
        child *c = realloc(g->c, (size_t)cap * sizeof *c);
        struct pollfd *p = realloc(g->pfd, (size_t)(2 * cap + 2) * sizeof *p);
        if (c) g->c = c;
        if (p) g->pfd = p;
        if (!c || !p) return dsc__fail(DSC_ERR_OOM, "launcher: out of memory");
        g->cap = cap;
    }
    child *c = &g->c[g->n];
    *c = (child){.pid = -1, .fd = {-1, -1}};
    c->buf[0] = malloc(LINE_CAP);
    c->buf[1] = malloc(LINE_CAP);
    if (!c->buf[0] || !c->buf[1]) {
        free(c->buf[0]);
        free(c->buf[1]);
        return dsc__fail(DSC_ERR_OOM, "launcher: out of memory");
    }
    *out = c;
    return DSC_OK;
}

dsc_status dsc__group_spawn(dsc__group *g, const dsc__child_spec *s) {
    if (!dsc__launch_began())
        return dsc__fail(DSC_ERR_INTERNAL, "launcher: dsc__launch_begin was not called");
    child *c = NULL;
    DSC_TRY(child_slot(g, &c));
    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0) {
        int e = errno;
        close_fd(&out[0]), close_fd(&out[1]);
        free(c->buf[0]), free(c->buf[1]);
        return dsc__fail(DSC_ERR_SYSTEM, "launcher: pipe for %s: %s", s->what, strerror(e));
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) child_exec(s, out[1], err[1]);
    int e = errno;
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]), close(err[0]);
        free(c->buf[0]), free(c->buf[1]);
        return dsc__fail(DSC_ERR_SYSTEM, "launcher: fork for %s: %s", s->what, strerror(e));
    }
    setpgid(pid, pid); // also done by the child; whichever runs first wins the race
    dsc__launch_guard(pid, true);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    c->pid = pid;
    c->running = true;
    c->fd[0] = out[0];
    c->fd[1] = err[0];
    c->rank = s->rank;
    c->out = s->out;
    c->stop_signal = s->stop_signal;
    snprintf(c->what, sizeof c->what, "%s", s->what);
    g->n++;
    return DSC_OK;
}

// ---- output ----

int dsc__launch_parse_label(dsc__out_mode mode, const char *line, const char **text) {
    const char *p = line;
    if (mode == DSC__OUT_SRUN) {
        while (*p == ' ') p++;
    } else if (mode == DSC__OUT_OMPI) {
        if (*p++ != '[') return -1;
        while (*p >= '0' && *p <= '9') p++;
        if (*p++ != ',') return -1;
    } else {
        return -1;
    }
    if (*p < '0' || *p > '9') return -1;
    long rank = 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if ((rank = rank * 10 + (*p - '0')) > 1000000000) return -1;
    if (mode == DSC__OUT_SRUN) {
        if (*p++ != ':') return -1;
        if (*p == ' ') p++;
    } else {
        if (strncmp(p, "]<stdout>:", 10) && strncmp(p, "]<stderr>:", 10)) return -1;
        p += 10;
    }
    *text = p;
    return (int)rank;
}

int dsc__launch_parse_pdsh_exit(const char *line, char *host, int cap) {
    static const char tail[] = " exited with exit code ";
    if (strncmp(line, "pdsh@", 5)) return -1;
    const char *h = strstr(line, ": ");
    if (!h) return -1;
    h += 2;
    const char *he = strstr(h, ": ");
    const char *t = strstr(h, tail);
    if (!he || !t || he > t) return -1;
    const char *num = t + sizeof tail - 1;
    char *end = NULL;
    long code = strtol(num, &end, 10);
    if (end == num || *end || code < 0 || code > 255) return -1;
    snprintf(host, (size_t)cap, "%.*s", (int)(he - h), h);
    return (int)code;
}

int dsc__launch_parse_srun_exit(const char *line, int *task) {
    static const char tail[] = "Exited with exit code ";
    if (strncmp(line, "srun: error: ", 13)) return -1;
    const char *p = strstr(line, ": task");
    const char *t = strstr(line, tail);
    if (!p || !t || t < p) return -1;
    p += 6;
    if (*p == 's') p++; // "tasks 0-1,3: ..." names the first of several
    char *end = NULL;
    long id = strtol(p, &end, 10);
    long code = strtol(t + sizeof tail - 1, NULL, 10);
    if (end == p || id < 0 || code < 1 || code > 255) return -1;
    *task = (int)id;
    return (int)code;
}

static void write_all(dsc__group *g, int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) {
            struct pollfd pf = {.fd = fd, .events = POLLOUT};
            poll(&pf, 1, 100);
            continue;
        }
        if (w < 0) {
            if (errno == EPIPE) g->output_gone = true;
            return;
        }
        p += w;
        n -= (size_t)w;
    }
}

static int log_fd_for(dsc__group *g, int rank) {
    if (!g->log_dir || g->log_broken || rank < 0) return -1;
    if (rank >= g->nlog) {
        int n = rank + 16;
        int *l = realloc(g->log_fd, (size_t)n * sizeof *l);
        if (!l) return -1;
        for (int i = g->nlog; i < n; i++) l[i] = -1;
        g->log_fd = l;
        g->nlog = n;
    }
    if (g->log_fd[rank] >= 0) return g->log_fd[rank];
    char path[4096];
    snprintf(path, sizeof path, "%s/rank%d.log", g->log_dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        dprintf(2, "dsc launch: cannot write %s: %s; per-rank logs are off\n", path,
                strerror(errno));
        g->log_broken = true;
        return -1;
    }
    if (g->attempt > 0) dprintf(fd, "---- dsc launch: restart %d ----\n", g->attempt);
    g->log_fd[rank] = fd;
    return fd;
}

static void note_failure(dsc__group *g, int i, int code, int sig, const char *what,
                         bool reported);

static void describe_end(int code, int sig, char *how, size_t cap) {
    if (sig) snprintf(how, cap, "was killed by signal %d", sig);
    else if (code == DSC__EXIT_RESTART)
        snprintf(how, cap, "asked for a restart (exit code %d)", code);
    else if (code == DSC__EXIT_STARTUP)
        snprintf(how, cap, "could not start (exit code %d: an error before the first step)", code);
    else snprintf(how, cap, "exited with code %d", code);
}

// One complete line (without its newline) from child c's stream k (0 stdout, 1 stderr).
static void emit(dsc__group *g, int i, int k, const char *line, size_t len) {
    child *c = &g->c[i];
    char *s = g->scratch;
    // Room for "[rank N] " in front; the line is copied so that it can be parsed as a string.
    char *body = s + 64;
    memcpy(body, line, len);
    body[len] = '\0';
    const char *text = body;
    int rank = -1;
    if (c->out == DSC__OUT_RANK) rank = c->rank;
    else if (c->out == DSC__OUT_SRUN || c->out == DSC__OUT_OMPI)
        rank = dsc__launch_parse_label(c->out, body, &text);
    if (k == 1 && rank < 0) { // pdsh and srun say on stderr which node or task failed first
        char host[64], what[80];
        int code = -1, task = 0;
        if (c->out == DSC__OUT_PDSH) code = dsc__launch_parse_pdsh_exit(body, host, sizeof host);
        if (c->out == DSC__OUT_SRUN) code = dsc__launch_parse_srun_exit(body, &task);
        if (code > 0) {
            if (c->out == DSC__OUT_PDSH) snprintf(what, sizeof what, "node %s", host);
            else snprintf(what, sizeof what, "rank %d", task);
            note_failure(g, i, code, 0, what, true);
        }
    }
    size_t tlen = len - (size_t)(text - body);
    char *start = (char *)text;
    if (rank >= 0) {
        char pre[32];
        int plen = snprintf(pre, sizeof pre, "[rank %d] ", rank);
        start -= plen;
        memcpy(start, pre, (size_t)plen);
        int lfd = log_fd_for(g, rank);
        body[len] = '\n';
        if (lfd >= 0) write_all(g, lfd, text, tlen + 1);
        tlen += (size_t)plen;
    }
    start[tlen] = '\n';
    write_all(g, k == 0 ? 1 : 2, start, tlen + 1);
}

// Read what child i has written on stream k; emit complete lines; close on end of file.
static void on_data(dsc__group *g, int i, int k) {
    child *c = &g->c[i];
    for (int rounds = 0; rounds < 16 && c->fd[k] >= 0; rounds++) {
        ssize_t r = read(c->fd[k], c->buf[k] + c->nbuf[k], LINE_CAP - c->nbuf[k]);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return; // EAGAIN: nothing more for now
        if (r == 0) {
            if (c->nbuf[k]) emit(g, i, k, c->buf[k], c->nbuf[k]);
            c->nbuf[k] = 0;
            close_fd(&c->fd[k]);
            return;
        }
        c->nbuf[k] += (size_t)r;
        char *b = c->buf[k];
        size_t start = 0;
        for (char *nl; (nl = memchr(b + start, '\n', c->nbuf[k] - start));) {
            emit(g, i, k, b + start, (size_t)(nl - (b + start)));
            start = (size_t)(nl - b) + 1;
        }
        if (start == 0 && c->nbuf[k] == LINE_CAP) { // no newline in a full buffer: cut here
            emit(g, i, k, b, LINE_CAP);
            start = LINE_CAP;
        }
        memmove(b, b + start, c->nbuf[k] - start);
        c->nbuf[k] -= start;
    }
}

// ---- stopping ----

static int count_running(const dsc__group *g) {
    int n = 0;
    for (int i = 0; i < g->n; i++) n += g->c[i].running;
    return n;
}

static void signal_all(dsc__group *g, int sig) {
    for (int i = 0; i < g->n; i++)
        if (g->c[i].running) kill(-g->c[i].pid, sig);
}

// Ask every running child to stop with `sig` (or its own stop signal); SIGKILL follows later.
static void begin_stop(dsc__group *g, int sig) {
    if (g->stopping) return;
    g->stopping = true;
    g->kill_at = dsc_now() + dsc__launch_grace();
    for (int i = 0; i < g->n; i++)
        if (g->c[i].running) kill(-g->c[i].pid, g->c[i].stop_signal ? g->c[i].stop_signal : sig);
}

static void others_phrase(const dsc__group *g, int others, char *out, size_t cap) {
    if (g->n == 1) out[0] = '\0';
    else if (others == 0) snprintf(out, cap, "; no other %s was still running", g->noun);
    else if (others == 1) snprintf(out, cap, "; stopped the other %s", g->noun);
    else snprintf(out, cap, "; stopped the other %d %ss", others, g->noun);
}

// Child i as the group's failure: its exit code and the one-line reason (`others`: what became
// of the rest). `sig`: the signal that killed it (0: it exited with `code`). `reported`: a
// failure that pdsh or srun reported about a node or task behind it, rather than its own exit.
static void name_failure(dsc__group *g, int i, int code, int sig, const char *what,
                         bool reported, const char *others) {
    dsc__group_result *r = g->r;
    char how[64];
    describe_end(code, sig, how, sizeof how);
    r->failed = i;
    r->failed_code = sig ? 128 + sig : code;
    snprintf(r->failed_what, sizeof r->failed_what, "%s", what);
    if (reported)
        snprintf(r->reason, sizeof r->reason, "%s %s (reported by %s)%s", what, how, g->c[i].what,
                 others);
    else
        snprintf(r->reason, sizeof r->reason, "%s (pid %d) %s%s", what, (int)g->c[i].pid, how,
                 others);
}

// The first failure of the group: remember it, say why, stop the rest.
static void note_failure(dsc__group *g, int i, int code, int sig, const char *what,
                         bool reported) {
    dsc__group_result *r = g->r;
    if (!r || r->failed >= 0 || r->signal) return;
    char others[96];
    int running = count_running(g) - (g->c[i].running ? 1 : 0);
    // The others save an emergency checkpoint together and exit 75 too: give them the time.
    bool wait = g->tolerate && code == DSC__EXIT_RESTART && running > 0;
    others_phrase(g, running, others, sizeof others);
    if (wait)
        snprintf(others, sizeof others, "; gave the other %d %s%s up to %.0f s to exit", running,
                 g->noun, running == 1 ? "" : "s", RESTART_WAIT_S);
    name_failure(g, i, code, sig, what, reported, others);
    g->failed_at = !sig && !reported && !wait ? dsc_now() : 0;
    g->failed_others = running;
    if (wait) g->stop_at = dsc_now() + RESTART_WAIT_S;
    else begin_stop(g, SIGTERM);
}

// Tolerating: a failure while another child still runs, or after one finished, is one rank
// lost, not the end of the group. A restart request (75) is never tolerated: it ends the group;
// nor is a start-up error (78): degrading is for faults during training, and the others would
// only train on without what the failed rank could not set up.
static bool tolerated(const dsc__group *g, int code) {
    const dsc__group_result *r = g->r;
    return g->tolerate && r && !r->signal && r->failed < 0 && !g->stopping &&
           code != DSC__EXIT_RESTART && code != DSC__EXIT_STARTUP &&
           (count_running(g) > 0 || g->finished > 0);
}

// Remember and report a lost child at once; `others` children go on.
static void note_lost(dsc__group *g, int i, const char *how, int others) {
    child *c = &g->c[i];
    size_t n = strlen(g->lost_text);
    if (n + 8 < sizeof g->lost_text)
        snprintf(g->lost_text + n, sizeof g->lost_text - n, "%s%s (%s)", n ? ", " : "", c->what,
                 how);
    g->lost++;
    char rest[64] = "";
    if (others == 1) snprintf(rest, sizeof rest, "; the other %s keeps running", g->noun);
    if (others > 1) snprintf(rest, sizeof rest, "; the other %d %ss keep running", others, g->noun);
    fprintf(stderr, "dsc launch: %s (pid %d) %s%s (%s)\n", c->what, (int)c->pid, how, rest,
            g->policy);
}

// A rank killed by a signal (one we did not send: ours are each child's stop signal, then SIGKILL
// once the grace is over) makes its peers fail within milliseconds, and a peer's error exit can
// be reaped first while the killed process is still being torn down. Found within KILL_CAUSE_S of
// that error exit, the kill is named as the failure (and gives the launcher's exit code).
#define KILL_CAUSE_S 2.0
static bool kill_caused(const dsc__group *g, int i, int sig) {
    const dsc__group_result *r = g->r;
    int ours = g->c[i].stop_signal ? g->c[i].stop_signal : SIGTERM;
    return r && r->failed >= 0 && r->failed != i && !r->signal && g->failed_at > 0 && sig &&
           sig != ours && !g->killed && dsc_now() - g->failed_at < KILL_CAUSE_S;
}

static void note_exit(dsc__group *g, int i, int status) {
    child *c = &g->c[i];
    c->running = false;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    if (c->lost_noted) return; // killed while stopped: reported then
    if (kill_caused(g, i, sig)) { // the cause of the failure noted first: named instead
        char others[96];
        others_phrase(g, g->failed_others, others, sizeof others); // (the first one among them)
        name_failure(g, i, code, sig, c->what, false, others);
        g->failed_at = 0;
        return;
    }
    if (!code && !sig) {
        g->finished++;
        return;
    }
    if (!tolerated(g, code)) {
        note_failure(g, i, code, sig, c->what, false);
        return;
    }
    char how[64];
    describe_end(code, sig, how, sizeof how);
    g->last_code = sig ? 128 + sig : code;
    note_lost(g, i, how, count_running(g));
}

static bool is_stopped(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t r = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (r <= 0) return false;
    buf[r] = '\0';
    const char *p = strrchr(buf, ')'); // "pid (comm) state ...": comm may hold spaces
    return p && (p[2] == 'T' || p[2] == 't');
}

// Tolerating: children still stopped (SIGSTOP) once every other child has exited would wait
// forever (the survivors went on without them): kill them.
static void end_stopped(dsc__group *g) {
    for (int i = 0; i < g->n; i++)
        if (g->c[i].running && !is_stopped(g->c[i].pid)) return;
    for (int i = 0; i < g->n; i++) {
        child *c = &g->c[i];
        if (!c->running || c->lost_noted) continue;
        kill(-c->pid, SIGKILL);
        kill(-c->pid, SIGCONT);
        c->lost_noted = true;
        g->last_code = 128 + SIGKILL;
        note_lost(g, i, "was stopped (SIGSTOP) when every other rank had exited; killed it", 0);
    }
}

// Has child pid ended by a signal? Looked at without reaping it (WNOWAIT).
static bool killed_by_signal(pid_t pid) {
    siginfo_t si;
    memset(&si, 0, sizeof si);
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
    return si.si_pid == pid && (si.si_code == CLD_KILLED || si.si_code == CLD_DUMPED);
}

// Children that ended since the last look. Those killed by a signal are noted first: when a rank
// is killed its peers fail on it within milliseconds, and when one look finds both, the kill is
// the cause, which names the failure and the launcher's exit code.
static void reap(dsc__group *g) {
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < g->n; i++) {
            if (!g->c[i].running || (pass == 0 && !killed_by_signal(g->c[i].pid))) continue;
            int st;
            pid_t w = waitpid(g->c[i].pid, &st, WNOHANG);
            if (w == g->c[i].pid) note_exit(g, i, st);
            else if (w < 0 && errno == ECHILD) g->c[i].running = false; // reaped elsewhere
        }
}

static void on_launcher_signal(void *arg, int s) {
    dsc__group *g = arg;
    dsc__group_result *r = g->r;
    if (s == SIGUSR1 || s == SIGUSR2) {
        // E.g. SLURM's preemption warning: the ranks checkpoint. Only the rank's own process gets
        // it; its helpers (data loader workers) would die of it.
        for (int i = 0; i < g->n; i++)
            if (g->c[i].running) kill(g->c[i].pid, s);
        return;
    }
    if (!dsc__launch_is_stop_signal(s)) return;
    if (g->stopping && !g->killed && r->signal) { // a second Ctrl-C: no more waiting
        signal_all(g, SIGKILL);
        g->killed = true;
        return;
    }
    if (!r->signal && r->failed < 0) {
        r->signal = s;
        g->stopped = count_running(g);
    }
    begin_stop(g, s);
}

static void on_output_gone(dsc__group *g) {
    dsc__group_result *r = g->r;
    g->watch_stdout = false;
    if (r->signal || r->failed >= 0) return;
    r->signal = SIGPIPE;
    g->stopped = count_running(g);
    begin_stop(g, SIGTERM);
}

// After the last child exited: leftovers in its process group get SIGTERM now, SIGKILL when the
// drain time is up, so that nothing a rank started outlives the launcher.
static void sweep(dsc__group *g, int sig) {
    for (int i = 0; i < g->n; i++) kill(-g->c[i].pid, sig);
}

static int open_fds(const dsc__group *g) {
    int n = 0;
    for (int i = 0; i < g->n; i++) n += (g->c[i].fd[0] >= 0) + (g->c[i].fd[1] >= 0);
    return n;
}

// pfd[0] is the signal pipe, pfd[*watch] our stdout (when watched; else *watch = -1), the rest
// children's pipes: map[j] = 2 * child + stream.
static int build_poll(dsc__group *g, int *map, int *watch) {
    int n = 0;
    g->pfd[n++] = (struct pollfd){.fd = dsc__launch_signal_fd(), .events = POLLIN};
    *watch = -1;
    if (g->watch_stdout) {
        *watch = n;
        g->pfd[n++] = (struct pollfd){.fd = 1, .events = 0}; // POLLERR/POLLHUP come regardless
    }
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < 2; k++)
            if (g->c[i].fd[k] >= 0) {
                map[n] = 2 * i + k;
                g->pfd[n++] = (struct pollfd){.fd = g->c[i].fd[k], .events = POLLIN};
            }
    return n;
}

static int poll_timeout(const dsc__group *g, double drain_until) {
    double now = dsc_now(), t = POLL_MAX_MS / 1000.0;
    if (g->stopping && !g->killed && g->kill_at - now < t) t = g->kill_at - now;
    if (drain_until > 0 && drain_until - now < t) t = drain_until - now;
    if (g->stop_at > 0 && !g->stopping && g->stop_at - now < t) t = g->stop_at - now;
    return t < 0 ? 0 : (int)(t * 1000) + 1;
}

static void finish_result(dsc__group *g, dsc__group_result *r) {
    if (r->failed >= 0) r->exit_code = r->failed_code;
    else if (r->signal) r->exit_code = 128 + r->signal;
    else if (g->lost && !g->finished) r->exit_code = g->last_code;
    else r->exit_code = 0;
    r->lost = g->lost;
    if (g->lost && r->failed < 0 && !r->signal)
        snprintf(r->reason, sizeof r->reason, "%d of %d %ss finished; lost: %s", g->finished,
                 g->n, g->noun, g->lost_text);
    if (r->signal && r->failed < 0) {
        const char *abbrev = sigabbrev_np(r->signal);
        const char *why = r->signal == SIGPIPE ? "our output was closed (whoever started us is "
                                                 "gone)"
                                               : "received SIG";
        const char *sig = r->signal == SIGPIPE ? "" : abbrev ? abbrev : "?";
        if (g->n == 1) // "stopped srun", "stopped rank 0"
            snprintf(r->reason, sizeof r->reason, "%s%s; stopped %s", why, sig, g->c[0].what);
        else
            snprintf(r->reason, sizeof r->reason, "%s%s; stopped %d %s%s", why, sig, g->stopped,
                     g->noun, g->stopped == 1 ? "" : "s");
    }
    for (int i = 0; i < g->n; i++) dsc__launch_guard(g->c[i].pid, false);
}

dsc_status dsc__group_wait(dsc__group *g, dsc__group_result *r) {
    *r = (dsc__group_result){.failed = -1};
    g->r = r;
    int *map = calloc((size_t)(2 * g->n + 2), sizeof *map);
    if (!map) return dsc__fail(DSC_ERR_OOM, "launcher: out of memory");
    double drain_until = 0;
    int pending = dsc__launch_pending_stop(); // arrived while the group was being started
    if (pending) on_launcher_signal(g, pending);
    for (;;) {
        reap(g);
        int live = count_running(g);
        double now = dsc_now();
        if (!live && !g->swept) {
            sweep(g, SIGTERM);
            g->swept = true;
            drain_until = now + DRAIN_S;
        }
        if (!live && (!open_fds(g) || now >= drain_until)) break;
        if (g->stopping && !g->killed && now >= g->kill_at) {
            signal_all(g, SIGKILL);
            g->killed = true;
        }
        if (g->stop_at > 0 && !g->stopping && now >= g->stop_at) begin_stop(g, SIGTERM);
        if (g->tolerate && live && !g->stopping && (g->lost || g->finished) &&
            now >= g->next_stopped_check) {
            g->next_stopped_check = now + STOPPED_CHECK_S;
            end_stopped(g);
        }
        int watch;
        int n = build_poll(g, map, &watch);
        int rc = poll(g->pfd, (nfds_t)n, poll_timeout(g, drain_until));
        if (rc < 0 && errno != EINTR) {
            free(map);
            return dsc__fail(DSC_ERR_SYSTEM, "launcher: poll: %s", strerror(errno));
        }
        if (rc <= 0) continue;
        if (g->pfd[0].revents) dsc__launch_drain_signals(on_launcher_signal, g);
        if (watch > 0 && (g->pfd[watch].revents & (POLLERR | POLLHUP))) on_output_gone(g);
        for (int j = watch > 0 ? 2 : 1; j < n; j++)
            if (g->pfd[j].revents) on_data(g, map[j] / 2, map[j] % 2);
        if (g->output_gone) on_output_gone(g);
    }
    sweep(g, SIGKILL);
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < 2; k++) {
            if (g->c[i].nbuf[k]) emit(g, i, k, g->c[i].buf[k], g->c[i].nbuf[k]);
            g->c[i].nbuf[k] = 0;
            close_fd(&g->c[i].fd[k]);
        }
    finish_result(g, r);
    g->r = NULL;
    free(map);
    return DSC_OK;
}

void dsc__group_destroy(dsc__group *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        child *c = &g->c[i];
        if (c->running) {
            kill(-c->pid, SIGKILL);
            int st;
            while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR) {
            }
            dsc__launch_guard(c->pid, false);
        }
        close_fd(&c->fd[0]);
        close_fd(&c->fd[1]);
        free(c->buf[0]);
        free(c->buf[1]);
    }
    for (int i = 0; i < g->nlog; i++) close_fd(&g->log_fd[i]);
    free(g->log_fd);
    free(g->log_dir);
    free(g->pfd);
    free(g->c);
    free(g);
}
