// monitor/actions.h - the config's monitor_actions list and the actions it may name.
#ifndef DSC_MONITOR_ACTIONS_H
#define DSC_MONITOR_ACTIONS_H

#include <stddef.h> // size_t

#include "dsc/status.h" // dsc_status

typedef enum dsc__action_kind {
    DSC__ACTION_LOG,            // a warning line naming the metric, value and threshold
    DSC__ACTION_DEFRAG,         // compact the default host pool, then return its empty arenas
    DSC__ACTION_RELEASE_CACHES, // return the default host pool's empty arenas to the system
    DSC__ACTION_COUNT,
} dsc__action_kind;

typedef struct dsc__cfg_action {
    char metric[128];
    double above;
    dsc__action_kind kind;
} dsc__cfg_action;

// "log", "defrag", "release_caches".
const char *dsc__action_name(dsc__action_kind k);
// Parse the JSON list (config monitor_actions; "" = none) into out[0 .. *n). DSC_ERR_CONFIG
// naming the entry and the field on bad input.
dsc_status dsc__actions_parse(const char *text, dsc__cfg_action *out, int cap, int *n);
// Run a memory action on the default host pool; *bytes: moved (defrag) or released.
dsc_status dsc__action_run(dsc__action_kind kind, size_t *bytes);

#endif
