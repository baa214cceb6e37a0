// monitor/actions.c - the config's monitor_actions: parsing the list, and the memory actions
// they run on the default host pool.
#include "monitor/actions.h"

#include <jansson.h> // json_*
#include <math.h>    // isfinite
#include <stdio.h>   // snprintf
#include <string.h>  // strcmp

#include "base/status.h" // dsc__fail
#include "dsc/memory.h"  // dsc_mem_*

static const char *const kind_names[] = {"log", "defrag", "release_caches"};

const char *dsc__action_name(dsc__action_kind k) {
    return (unsigned)k < sizeof kind_names / sizeof kind_names[0] ? kind_names[k] : "?";
}

static dsc_status bad(int i, const char *what) {
    return dsc__fail(DSC_ERR_CONFIG, "config key \"monitor_actions\"[%d]: %s; each entry is "
                     "{\"metric\": NAME, \"above\": NUMBER, \"action\": \"log\", \"defrag\" or "
                     "\"release_caches\"}", i, what);
}

static dsc_status parse_one(const json_t *e, int i, dsc__cfg_action *out) {
    if (!json_is_object(e)) return bad(i, "not an object");
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)e, key, v) {
        if (strcmp(key, "metric") && strcmp(key, "above") && strcmp(key, "action")) {
            char why[160];
            snprintf(why, sizeof why, "unknown field \"%.64s\"", key);
            return bad(i, why);
        }
    }
    const char *metric = json_string_value(json_object_get(e, "metric"));
    const char *action = json_string_value(json_object_get(e, "action"));
    const json_t *above = json_object_get(e, "above");
    if (!metric || !*metric) return bad(i, "\"metric\" is missing or not a string");
    if (strlen(metric) >= sizeof out->metric) return bad(i, "\"metric\" is too long");
    if (!json_is_number(above) || !isfinite(json_number_value(above)))
        return bad(i, "\"above\" is missing or not a finite number");
    if (!action) return bad(i, "\"action\" is missing or not a string");
    int k = 0;
    while (k < DSC__ACTION_COUNT && strcmp(action, kind_names[k])) k++;
    if (k == DSC__ACTION_COUNT) {
        char why[160];
        snprintf(why, sizeof why, "\"action\" \"%.64s\" is unknown", action);
        return bad(i, why);
    }
    snprintf(out->metric, sizeof out->metric, "%s", metric);
    out->above = json_number_value(above);
    out->kind = (dsc__action_kind)k;
    return DSC_OK;
}

dsc_status dsc__actions_parse(const char *text, dsc__cfg_action *out, int cap, int *n) {
    *n = 0;
    if (!text || !*text) return DSC_OK;
    json_error_t err;
    json_t *root = json_loads(text, 0, &err);
    if (!json_is_array(root)) {
        json_decref(root);
        return dsc__fail(DSC_ERR_CONFIG, "config key \"monitor_actions\" must be a list of "
                         "{\"metric\", \"above\", \"action\"} objects");
    }
    dsc_status st = DSC_OK;
    if ((int)json_array_size(root) > cap)
        st = dsc__fail(DSC_ERR_CONFIG, "config key \"monitor_actions\": %zu entries; at most %d",
                       json_array_size(root), cap);
    for (int i = 0; st == DSC_OK && i < (int)json_array_size(root); i++)
        st = parse_one(json_array_get(root, (size_t)i), i, &out[i]);
    if (st == DSC_OK) *n = (int)json_array_size(root);
    json_decref(root);
    return st;
}

dsc_status dsc__action_run(dsc__action_kind kind, size_t *bytes) {
    *bytes = 0;
    if (kind == DSC__ACTION_LOG) return DSC_OK;
    dsc_mem_pool *pool;
    DSC_TRY(dsc_mem_default_pool(DSC_MEM_HOST, &pool));
    if (kind == DSC__ACTION_DEFRAG) {
        DSC_TRY(dsc_mem_defragment(pool, bytes));
        dsc_mem_trim(pool); // the packed pool's empty arenas go back as well
        return DSC_OK;
    }
    *bytes = dsc_mem_trim(pool);
    return DSC_OK;
}
