// launch/guard.h - the launcher's process-wide state, shared by its child groups
// (launch/proc.c): the signal pipe (the handlers installed by dsc__launch_begin write each signal
// number as one byte; the groups' poll loop reads them) and the guardian, a process that keeps
// the children's process groups and stops them all if the launcher dies without saying goodbye.
// dsc__launch_begin / _end / _pending_stop / _grace are declared in launch/proc.h.
#ifndef DSC_LAUNCH_GUARD_H
#define DSC_LAUNCH_GUARD_H

#include <stdbool.h>   // bool
#include <sys/types.h> // pid_t

// The read end of the signal pipe (-1 before dsc__launch_begin).
int dsc__launch_signal_fd(void);
// Reads every pending signal byte; returns the last stop signal among them (0 if none) and
// reports each through `each` (NULL: none).
int dsc__launch_drain_signals(void (*each)(void *, int), void *arg);
// SIGINT, SIGTERM and SIGHUP stop a group; others (SIGUSR1/2) are forwarded.
bool dsc__launch_is_stop_signal(int s);
// Whether dsc__launch_begin has been called (and not ended); the launcher's pid.
bool dsc__launch_began(void);
pid_t dsc__launch_pid(void);
// Tell the guardian about a child's process group: add it, or (add false) forget it.
void dsc__launch_guard(pid_t pgid, bool add);
// In a forked child before exec: the signals the launcher handles back to their defaults
// (async-signal-safe).
void dsc__launch_child_signals(void);

#endif
