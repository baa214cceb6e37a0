// launch/guard.c - the launcher's process-wide state (see guard.h): its signal handlers, which
// turn signals into bytes on a pipe that the group's poll loop reads, and the guardian process
// that stops every child's process group when the launcher dies without cleaning up.
#define _GNU_SOURCE // pipe2, close_range

#include "launch/guard.h"

#include <dirent.h>    // opendir, readdir
#include <errno.h>     // errno, EINTR
#include <fcntl.h>     // open, O_*
#include <signal.h>    // sigaction, kill
#include <stdio.h>     // snprintf, sscanf, fflush
#include <stdlib.h>    // realloc, getenv, strtod
#include <string.h>    // strerror, strrchr
#include <sys/prctl.h> // prctl, PR_SET_NAME
#include <sys/wait.h>  // waitpid
#include <time.h>      // nanosleep
#include <unistd.h>    // fork, pipe2, dup2, read, write, close

#include "base/env.h"      // dsc__env, DSC_ENV_*
#include "base/status.h"   // dsc__fail
#include "launch/proc.h"   // dsc__launch_begin, dsc__launch_end, dsc__launch_grace

static const int handled[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2, SIGCHLD};
#define NHANDLED ((int)(sizeof handled / sizeof handled[0]))
static struct sigaction saved_act[NHANDLED], saved_pipe;
static int sig_pipe[2] = {-1, -1}; // the handler writes each signal number as one byte
static int guard_fd = -1;          // write end of the pipe to the guardian
static pid_t guard_pid = -1;
static pid_t launcher_pid = -1;
static int began = 0;

static void on_signal(int s) {
    int saved = errno;
    unsigned char b = (unsigned char)s;
    ssize_t w = write(sig_pipe[1], &b, 1); // a full pipe drops the byte; the poll cap covers it
    (void)w;
    errno = saved;
}

bool dsc__launch_is_stop_signal(int s) { return s == SIGINT || s == SIGTERM || s == SIGHUP; }

double dsc__launch_grace(void) {
    const char *v = dsc__env(DSC_ENV_LAUNCH_GRACE);
    char *end = NULL;
    double x = v && *v ? strtod(v, &end) : 3.0;
    if (v && *v && (*end || x < 0.1 || x > 60)) x = 3.0;
    return x;
}

static void guard_send(int32_t msg) {
    if (guard_fd < 0) return;
    ssize_t w;
    do w = write(guard_fd, &msg, sizeof msg);
    while (w < 0 && errno == EINTR);
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

// Whether a process that is not a zombie is left in one of the groups. kill(-pg, 0) would also
// count zombies, and orphaned zombies may wait long for a busy init to reap them.
static bool any_group_alive(const int32_t *pg, int n) {
    DIR *d = opendir("/proc");
    if (!d) return false;
    bool alive = false;
    for (struct dirent *e; !alive && (e = readdir(d));) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0) continue;
        buf[r] = '\0';
        // "pid (comm) state ppid pgrp ...": comm may hold spaces, so parse after the last ')'.
        const char *p = strrchr(buf, ')');
        char state;
        int ppid, pgrp;
        if (!p || sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) != 3 || state == 'Z') continue;
        for (int i = 0; i < n && !alive; i++) alive = pgrp == pg[i];
    }
    closedir(d);
    return alive;
}

// The guardian: keeps the list of children's process groups; when its pipe reaches end of file
// without the goodbye message (the launcher died), it stops them all, politely and then not.
static void guardian_main(int rfd, double grace) {
    setpgid(0, 0); // out of the launcher's group: a signal meant for the launcher misses us
    for (int i = 0; i < NHANDLED; i++) signal(handled[i], SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    prctl(PR_SET_NAME, "dsc-guardian", 0, 0, 0);
    int null = open("/dev/null", O_RDWR);
    // Hold nothing of the launcher's: a reader of its stdout must not wait for us.
    if (null >= 0)
        for (int fd = 0; fd < 3; fd++) dup2(null, fd);
    if (rfd != 3) {
        dup2(rfd, 3);
        rfd = 3;
    }
    close_range(4, ~0u, 0);
    int32_t *pg = NULL;
    int n = 0, cap = 0;
    for (;;) {
        int32_t msg;
        ssize_t r = read(rfd, &msg, sizeof msg);
        if (r < 0 && errno == EINTR) continue;
        if (r != (ssize_t)sizeof msg) break; // launcher gone
        if (msg == 0) _exit(0);              // goodbye: the launcher cleaned up itself
        if (msg > 0 && n == cap) {
            cap = cap ? cap * 2 : 64;
            int32_t *g = realloc(pg, (size_t)cap * sizeof *g);
            if (!g) continue;
            pg = g;
        }
        if (msg > 0 && n < cap) pg[n++] = msg;
        for (int i = 0; msg < 0 && i < n; i++)
            if (pg[i] == -msg) pg[i--] = pg[--n];
    }
    for (int i = 0; i < n; i++) kill(-pg[i], SIGTERM);
    for (double t = 0; t < grace && any_group_alive(pg, n); t += 0.05) sleep_s(0.05);
    for (int i = 0; i < n; i++) kill(-pg[i], SIGKILL);
    _exit(0);
}

static dsc_status guardian_start(void) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return dsc__fail(DSC_ERR_SYSTEM, "launcher: pipe: %s", strerror(errno));
    double grace = dsc__launch_grace();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        return dsc__fail(DSC_ERR_SYSTEM, "launcher: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(p[1]);
        guardian_main(p[0], grace);
    }
    close(p[0]);
    guard_fd = p[1];
    guard_pid = pid;
    return DSC_OK;
}

dsc_status dsc__launch_begin(void) {
    if (began++) return DSC_OK;
    launcher_pid = getpid();
    if (pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
        return dsc__fail(DSC_ERR_SYSTEM, "launcher: pipe: %s", strerror(errno));
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    // Installed even where the shell started us with SIGINT ignored (a background job): the
    // launcher must still pass Ctrl-C or kill -INT on to the ranks.
    for (int i = 0; i < NHANDLED; i++) sigaction(handled[i], &sa, &saved_act[i]);
    struct sigaction ign = {0};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &saved_pipe); // a vanished reader is seen as EPIPE instead
    return guardian_start();
}

void dsc__launch_end(void) {
    if (!began || --began) return;
    if (guard_fd >= 0) {
        guard_send(0);
        close(guard_fd);
        guard_fd = -1;
        int st;
        while (waitpid(guard_pid, &st, 0) < 0 && errno == EINTR) {
        }
    }
    for (int i = 0; i < NHANDLED; i++) sigaction(handled[i], &saved_act[i], NULL);
    sigaction(SIGPIPE, &saved_pipe, NULL);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
    sig_pipe[0] = sig_pipe[1] = -1;
}

int dsc__launch_drain_signals(void (*each)(void *, int), void *arg) {
    int stop = 0;
    unsigned char b[64];
    ssize_t r;
    while ((r = read(sig_pipe[0], b, sizeof b)) > 0)
        for (ssize_t i = 0; i < r; i++) {
            if (dsc__launch_is_stop_signal(b[i])) stop = b[i];
            if (each) each(arg, b[i]);
        }
    return stop;
}

int dsc__launch_pending_stop(void) {
    return sig_pipe[0] < 0 ? 0 : dsc__launch_drain_signals(NULL, NULL);
}

int dsc__launch_signal_fd(void) { return sig_pipe[0]; }

bool dsc__launch_began(void) { return began > 0; }

pid_t dsc__launch_pid(void) { return launcher_pid; }

void dsc__launch_guard(pid_t pgid, bool add) { guard_send(add ? (int32_t)pgid : -(int32_t)pgid); }

void dsc__launch_child_signals(void) {
    struct sigaction dfl = {0};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int i = 0; i < NHANDLED; i++) sigaction(handled[i], &dfl, NULL);
    sigaction(SIGPIPE, &dfl, NULL);
}
