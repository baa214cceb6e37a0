// config/table.h - the key table (keys.def) as data: one row per key dsc reads.
#ifndef DSC_CONFIG_TABLE_H
#define DSC_CONFIG_TABLE_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/config.h" // dsc_config

typedef enum dsc__key_kind {
    K_SECTION,
    K_BOOL,
    K_INT,
    K_WHOLE, // an integer to DeepSpeed, stored in a double field
    K_FLOAT,
    K_STR,
    K_PAIR,
    K_LIST,
    K_JSON, // any JSON value, kept as compact text (its user checks it)
    K_INTLIST,
    K_ALIAS,
    K_UNIMPL,
} dsc__key_kind;

// How DeepSpeed reads a section (keys.def explains each).
enum {
    DS_DICT = 0,
    DS_MODEL = 1,
    DS_OWN = 2,
    DS_READER = 3, // mask of the three above
    DS_NULL_OK = 8,
    DS_AUTO_OK = 16,
};

// Bits of dsc_config.given[row].
enum {
    GIVEN_VALUE = 1,  // a value from the file is in the field (dsc_config_given)
    GIVEN_NAMED = 2,  // the key appeared under this row's own name (null included; "auto" not)
    GIVEN_ALIAS = 4,  // ... under an alias of this row
    GIVEN_DEPRECATED = 8, // the value stands for a deprecated key (cpu_offload -> device "cpu")
};

typedef struct dsc__key_row {
    const char *path;
    dsc__key_kind kind;
    size_t off;          // offset of the field in dsc_config
    size_t size;         // size of the field (strings: buffer size; INTLIST: the array)
    double def, lo, hi;  // numeric default and range; PAIR: def, lo = the two defaults
    const char *sdef;    // string default; ALIAS: target path
    const char *choices; // "a|b|c" (exact) or "~a|b|c" (any case) or NULL
    const char *doc;
    int how;             // SECTION: DS_* flags
    size_t count_off;    // INTLIST: offset of the element count
} dsc__key_row;

extern const dsc__key_row dsc__rows[];
extern const int dsc__nrows;

// Row index of a key path, or -1.
int dsc__row_find(const char *path);

// How DeepSpeed reads row `idx`: DS_DICT, DS_MODEL or DS_OWN (from its innermost section).
int dsc__row_reader(int idx);

// Whether null is accepted for leaf row `idx` (meaning its default), by DeepSpeed's rules.
bool dsc__row_nullable(int idx);

// Whether dsc parses row `idx` but does not act on it (keys.def's DSC_NO_EFFECT rows).
bool dsc__row_no_effect(int idx);

// The shortest decimal text that reads back as exactly x ("0.9"), ".0" added to whole numbers
// (config/print.c).
void dsc__format_real(double x, char *buf, size_t cap);

void *dsc__field(dsc_config *cfg, const dsc__key_row *r);

#endif
