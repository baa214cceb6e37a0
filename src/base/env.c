// base/env.c - the environment switches' table and accessors (see env.h; dsc_env: dsc/base.h).
#include "base/env.h"

#include <stdio.h>  // snprintf
#include <stdlib.h> // getenv
#include <string.h> // strcmp

#include "base/status.h" // dsc__fail
#include "dsc/base.h"    // dsc_env

static const dsc__env_row rows[DSC_ENV_COUNT] = {
#define DSC_ENV(id, name, values, dflt, effect) [DSC_ENV_##id] = {name, values, dflt, effect},
#include "base/env.def"
#undef DSC_ENV
};

const char *dsc__env(dsc__env_id id) {
    return (unsigned)id < DSC_ENV_COUNT ? getenv(rows[id].name) : NULL;
}

bool dsc__env_is(dsc__env_id id, const char *value) {
    const char *v = dsc__env(id);
    return v && !strcmp(v, value);
}

const dsc__env_row *dsc__env_row_of(int id) {
    return id >= 0 && id < DSC_ENV_COUNT ? &rows[id] : NULL;
}

void dsc__env_doc_row(int id, char *buf, size_t cap) {
    const dsc__env_row *r = dsc__env_row_of(id);
    if (!r) {
        if (cap) buf[0] = '\0';
        return;
    }
    snprintf(buf, cap, "| `%s` | %s | %s | %s |", r->name, r->values, r->dflt, r->effect);
}

const char *dsc_env(const char *name) {
    for (int id = 0; name && id < DSC_ENV_COUNT; id++)
        if (!strcmp(rows[id].name, name)) return getenv(name);
    dsc__fail(DSC_ERR_INVALID_ARG, "environment switch %s: not one of dsc's switches; "
              "docs/environment.md lists them", name ? name : "(null)");
    return NULL;
}
