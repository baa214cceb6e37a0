// config/table.c - keys.def expanded into the row table, and the lookups on it.
#include "config/table.h"

#include <stdio.h>  // snprintf
#include <string.h> // memset, strcmp, strncmp, strlen

#define FIELD(f) offsetof(dsc_config, f), sizeof(((dsc_config *)0)->f)
#define NO_FIELD 0, 0
const dsc__key_row dsc__rows[] = {
#define DSC_SECTION(p, how, d) {p, K_SECTION, NO_FIELD, 0, 0, 0, NULL, NULL, d, how, 0},
#define DSC_BOOL(p, f, def, d) {p, K_BOOL, FIELD(f), def, 0, 1, NULL, NULL, d, 0, 0},
#define DSC_INT(p, f, def, lo, hi, d) {p, K_INT, FIELD(f), def, lo, hi, NULL, NULL, d, 0, 0},
#define DSC_WHOLE(p, f, def, lo, hi, d) {p, K_WHOLE, FIELD(f), def, lo, hi, NULL, NULL, d, 0, 0},
#define DSC_FLOAT(p, f, def, lo, hi, d) {p, K_FLOAT, FIELD(f), def, lo, hi, NULL, NULL, d, 0, 0},
#define DSC_STR(p, f, def, ch, d) {p, K_STR, FIELD(f), 0, 0, 0, def, ch, d, 0, 0},
#define DSC_PAIR(p, f, d0, d1, d) {p, K_PAIR, FIELD(f), d0, d1, 0, NULL, NULL, d, 0, 0},
#define DSC_LIST(p, d) {p, K_LIST, NO_FIELD, 0, 0, 0, NULL, NULL, d, 0, 0},
#define DSC_JSONLIST(p, f, d) {p, K_LIST, FIELD(f), 0, 0, 0, NULL, NULL, d, 0, 0},
#define DSC_JSONVAL(p, f, d) {p, K_JSON, FIELD(f), 0, 0, 0, NULL, NULL, d, 0, 0},
#define DSC_INTLIST(p, f, n, d)                                                                \
    {p, K_INTLIST, FIELD(f), 0, 1, 0, NULL, NULL, d, 0, offsetof(dsc_config, n)},
#define DSC_ALIAS(p, target, d) {p, K_ALIAS, NO_FIELD, 0, 0, 0, target, NULL, d, 0, 0},
#define DSC_UNIMPL(p, d) {p, K_UNIMPL, NO_FIELD, 0, 0, 0, NULL, NULL, d, 0, 0},
#define DSC_NULLABLE(p, why)
#define DSC_NULL_FAILS(p, why)
#define DSC_NO_EFFECT(p)
#include "config/keys.def"
#undef DSC_SECTION
#undef DSC_BOOL
#undef DSC_INT
#undef DSC_WHOLE
#undef DSC_FLOAT
#undef DSC_STR
#undef DSC_PAIR
#undef DSC_LIST
#undef DSC_JSONLIST
#undef DSC_JSONVAL
#undef DSC_INTLIST
#undef DSC_ALIAS
#undef DSC_UNIMPL
#undef DSC_NULLABLE
#undef DSC_NULL_FAILS
#undef DSC_NO_EFFECT
};
#undef FIELD
#undef NO_FIELD
const int dsc__nrows = (int)(sizeof dsc__rows / sizeof dsc__rows[0]);
_Static_assert(sizeof dsc__rows / sizeof dsc__rows[0] <= sizeof(((dsc_config *)0)->given),
               "dsc_config.given is too small for keys.def");

// The same file again, for its null rules only: {path, nullable}.
static const struct null_rule {
    const char *path;
    bool nullable;
} null_rules[] = {
#define DSC_SECTION(...)
#define DSC_BOOL(...)
#define DSC_INT(...)
#define DSC_WHOLE(...)
#define DSC_FLOAT(...)
#define DSC_STR(...)
#define DSC_PAIR(...)
#define DSC_LIST(...)
#define DSC_JSONLIST(...)
#define DSC_JSONVAL(...)
#define DSC_INTLIST(...)
#define DSC_ALIAS(...)
#define DSC_UNIMPL(...)
#define DSC_NULLABLE(p, why) {p, true},
#define DSC_NULL_FAILS(p, why) {p, false},
#define DSC_NO_EFFECT(p)
#include "config/keys.def"
#undef DSC_SECTION
#undef DSC_BOOL
#undef DSC_INT
#undef DSC_WHOLE
#undef DSC_FLOAT
#undef DSC_STR
#undef DSC_PAIR
#undef DSC_LIST
#undef DSC_JSONLIST
#undef DSC_JSONVAL
#undef DSC_INTLIST
#undef DSC_ALIAS
#undef DSC_UNIMPL
#undef DSC_NULLABLE
#undef DSC_NULL_FAILS
#undef DSC_NO_EFFECT
};

// And for the keys dsc does not act on.
static const char *const no_effect[] = {
#define DSC_SECTION(...)
#define DSC_BOOL(...)
#define DSC_INT(...)
#define DSC_WHOLE(...)
#define DSC_FLOAT(...)
#define DSC_STR(...)
#define DSC_PAIR(...)
#define DSC_LIST(...)
#define DSC_JSONLIST(...)
#define DSC_JSONVAL(...)
#define DSC_INTLIST(...)
#define DSC_ALIAS(...)
#define DSC_UNIMPL(...)
#define DSC_NULLABLE(...)
#define DSC_NULL_FAILS(...)
#define DSC_NO_EFFECT(p) p,
#include "config/keys.def"
#undef DSC_SECTION
#undef DSC_BOOL
#undef DSC_INT
#undef DSC_WHOLE
#undef DSC_FLOAT
#undef DSC_STR
#undef DSC_PAIR
#undef DSC_LIST
#undef DSC_JSONLIST
#undef DSC_JSONVAL
#undef DSC_INTLIST
#undef DSC_ALIAS
#undef DSC_UNIMPL
#undef DSC_NULLABLE
#undef DSC_NULL_FAILS
#undef DSC_NO_EFFECT
};

int dsc__row_find(const char *path) {
    for (int i = 0; i < dsc__nrows; i++)
        if (!strcmp(dsc__rows[i].path, path)) return i;
    return -1;
}

// True when `section` is a proper prefix of `path` at a '.' boundary.
static bool inside(const char *path, const char *section) {
    size_t n = strlen(section);
    return !strncmp(path, section, n) && path[n] == '.';
}

int dsc__row_reader(int idx) {
    // Sections precede their keys and nest by path, so the innermost enclosing section is the
    // nearest earlier section row whose path is a prefix.
    for (int i = idx - 1; i >= 0; i--)
        if (dsc__rows[i].kind == K_SECTION && inside(dsc__rows[idx].path, dsc__rows[i].path))
            return dsc__rows[i].how & DS_READER;
    return DS_DICT;
}

bool dsc__row_nullable(int idx) {
    for (size_t k = 0; k < sizeof null_rules / sizeof null_rules[0]; k++)
        if (!strcmp(null_rules[k].path, dsc__rows[idx].path)) return null_rules[k].nullable;
    return dsc__row_reader(idx) != DS_MODEL;
}

bool dsc__row_no_effect(int idx) {
    for (size_t k = 0; k < sizeof no_effect / sizeof no_effect[0]; k++)
        if (!strcmp(no_effect[k], dsc__rows[idx].path)) return true;
    return false;
}

void *dsc__field(dsc_config *cfg, const dsc__key_row *r) { return (char *)cfg + r->off; }
