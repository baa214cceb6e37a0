// launch/policy.c - what the launcher does when one rank fails: stop the group, or leave the
// survivors to recover (the training config's fault_tolerance.on_failure, or --on_failure).
//
// The policy comes from, in this order: --on_failure; the config file of `dsc train` (its
// --config, or its built-in config when none is given); the DeepSpeed config named by the
// program's --deepspeed_config or --config when that file has a fault_tolerance section. Any
// other program keeps the launcher's plain rule (stop the group on the first failure): it does
// not recover on its own, and its other ranks would wait for the dead one.
#include <stdio.h>  // snprintf
#include <stdlib.h> // malloc, free
#include <string.h> // strcmp, strncmp, strrchr, strlen

#include "base/status.h"        // dsc__fail
#include "dsc/config.h"         // dsc_config_load_file
#include "launch/launch_impl.h" // dsc__launch_policy

static int policy_of(const char *s) {
    if (!strcmp(s, "degrade")) return DSC__ON_FAILURE_DEGRADE;
    if (!strcmp(s, "restart")) return DSC__ON_FAILURE_RESTART;
    if (!strcmp(s, "abort")) return DSC__ON_FAILURE_ABORT;
    return -1;
}

// `dsc train ...`: argv[0] is a program named dsc and the verb is train.
static bool is_dsc_train(char *const *argv, int argc) {
    if (argc < 2 || strcmp(argv[1], "train")) return false;
    const char *base = strrchr(argv[0], '/');
    return !strcmp(base ? base + 1 : argv[0], "dsc");
}

// The value of `--name FILE` or `--name=FILE` among the program's arguments, or NULL.
static const char *flag_value(char *const *argv, int argc, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], name) && i + 1 < argc) return argv[i + 1];
        if (!strncmp(argv[i], name, n) && argv[i][n] == '=') return argv[i] + n + 1;
    }
    return NULL;
}

static void quiet(void *user, const char *message) {
    (void)user; // the program reports its config's warnings itself
    (void)message;
}

// The policy in `path`; false when the file cannot be read or names none (a config without a
// fault_tolerance section, unless `any` says that the program is dsc's own trainer).
static bool from_config(const char *path, bool any, dsc__launch_policy *p) {
    dsc_config *c = malloc(sizeof *c);
    if (!c) return false;
    bool ok = dsc_config_load_file(c, path, 0, quiet, NULL) == DSC_OK &&
              (any || dsc_config_given(c, "fault_tolerance"));
    if (ok) {
        p->on_failure = policy_of(c->fault_tolerance.on_failure);
        ok = p->on_failure >= 0;
        if (dsc_config_given(c, "fault_tolerance.on_failure"))
            snprintf(p->source, sizeof p->source, "fault_tolerance.on_failure is %s in %s",
                     c->fault_tolerance.on_failure, path);
        else // the file does not choose: say that the policy is the default, not the file's
            snprintf(p->source, sizeof p->source, "fault_tolerance.on_failure is %s (default)",
                     c->fault_tolerance.on_failure);
    }
    free(c);
    return ok;
}

dsc_status dsc__launch_policy_resolve(const dsc_launch_opts *o, dsc__launch_policy *p) {
    *p = (dsc__launch_policy){.on_failure = DSC__ON_FAILURE_STOP};
    if (o->on_failure) {
        p->on_failure = policy_of(o->on_failure);
        if (p->on_failure < 0)
            return dsc__fail(DSC_ERR_INVALID_ARG,
                             "--on_failure '%s' is not one of degrade, restart, abort",
                             o->on_failure);
        snprintf(p->source, sizeof p->source, "--on_failure %s", o->on_failure);
        return DSC_OK;
    }
    bool train = is_dsc_train(o->argv, o->argc);
    const char *cfg = flag_value(o->argv, o->argc, "--config");
    if (!train && !cfg) cfg = flag_value(o->argv, o->argc, "--deepspeed_config");
    if (train && !cfg) { // the built-in config: every fault_tolerance key at its default
        p->on_failure = DSC__ON_FAILURE_DEGRADE;
        snprintf(p->source, sizeof p->source, "fault_tolerance.on_failure is degrade (default)");
        return DSC_OK;
    }
    // An unreadable config: the program itself will say what is wrong with it.
    if (!cfg || !from_config(cfg, train, p))
        *p = (dsc__launch_policy){.on_failure = DSC__ON_FAILURE_STOP};
    return DSC_OK;
}

bool dsc__launch_policy_tolerates(const dsc__launch_policy *p) {
    return p->on_failure == DSC__ON_FAILURE_DEGRADE || p->on_failure == DSC__ON_FAILURE_RESTART;
}
