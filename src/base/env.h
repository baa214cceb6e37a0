// base/env.h - dsc's environment switches in one place: one row per switch in base/env.def (name,
// values, default, effect), one key per row (DSC_ENV_<ID>), one accessor. Every read of a switch
// goes through dsc__env, which asks the environment at each call, with getenv's result (NULL when
// unset): tests set switches in-process between scenarios, so nothing is cached here; a caller
// that wants a value for the run reads it once itself. docs/environment.md is the rows' table.
#ifndef DSC_BASE_ENV_H
#define DSC_BASE_ENV_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc__env_id {
#define DSC_ENV(id, name, values, dflt, effect) DSC_ENV_##id,
#include "base/env.def"
#undef DSC_ENV
    DSC_ENV_COUNT
} dsc__env_id;

typedef struct dsc__env_row {
    const char *name, *values, *dflt, *effect;
} dsc__env_row;

// The switch's value now (getenv's, borrowed until the environment changes), NULL when unset.
const char *dsc__env(dsc__env_id id);
// Whether the switch is set to exactly `value`.
bool dsc__env_is(dsc__env_id id, const char *value);
// The switch's row of base/env.def (static); NULL for an id out of range.
const dsc__env_row *dsc__env_row_of(int id);
// The row as a line of docs/environment.md's table: "| `NAME` | values | default | effect |".
void dsc__env_doc_row(int id, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
