// engine/sched_config.c - scheduler.params (config) -> dsc_sched_params, as DeepSpeed passes them.
//
// DeepSpeed calls the schedule's constructor with scheduler.params as keyword arguments, so:
//   - scheduler.params must be there (an object, {} for all defaults): `**None` fails;
//   - a key the constructor does not take fails ("unexpected keyword argument"), a key no schedule
//     takes included, and so does a required one left out (WarmupDecayLR's and WarmupCosineLR's
//     total_num_steps, OneCycle's cycle_min_lr and cycle_max_lr);
//   - null is Python's None: the parameter's meaning for None where it has one (warmup_max_lr: the
//     optimizer's lr; cycle_second_step_size and cycle_second_stair_count: the first's; flags:
//     false; warmup_type: an unknown type), else DSC_SCHED_UNSET, which dsc_sched_validate
//     refuses where DeepSpeed would compute with it.
#include "engine/sched_config.h"

#include <stddef.h> // offsetof
#include <stdio.h>  // snprintf

#include "base/status.h"  // dsc__fail
#include "config/table.h" // dsc__row_find, GIVEN_*

enum {
    WL = 1u << DSC_SCHED_WARMUP_LR,
    WD = 1u << DSC_SCHED_WARMUP_DECAY_LR,
    WC = 1u << DSC_SCHED_WARMUP_COSINE_LR,
    OC = 1u << DSC_SCHED_ONE_CYCLE,
    RT = 1u << DSC_SCHED_LR_RANGE_TEST,
    ALL = WL | WD | WC | OC | RT,
};

typedef enum { NUM, FLAG, WARMUP_TYPE } key_type;

// Every keyword argument of the five constructors (DeepSpeed 0.18.4), with the schedules that take
// it and those that require it.
static const struct sched_key {
    const char *name;
    size_t param_off, config_off; // in dsc_sched_params, in dsc_config
    key_type type;
    unsigned takes, requires;
} KEYS[] = {
#define K(f, type, takes, requires)                                                             \
    {#f, offsetof(dsc_sched_params, f), offsetof(dsc_config, scheduler.f), type, takes, requires}
    K(warmup_min_lr, NUM, WL | WD, 0),
    K(warmup_max_lr, NUM, WL | WD, 0),
    K(warmup_num_steps, NUM, WL | WD | WC, 0),
    K(warmup_type, WARMUP_TYPE, WL | WD | WC, 0),
    K(total_num_steps, NUM, WD | WC, WD | WC),
    K(warmup_min_ratio, NUM, WC, 0),
    K(cos_min_ratio, NUM, WC, 0),
    K(cycle_min_lr, NUM, OC, OC),
    K(cycle_max_lr, NUM, OC, OC),
    K(decay_lr_rate, NUM, OC, 0),
    K(cycle_first_step_size, NUM, OC, 0),
    K(cycle_second_step_size, NUM, OC, 0),
    K(cycle_first_stair_count, NUM, OC, 0),
    K(cycle_second_stair_count, NUM, OC, 0),
    K(decay_step_size, NUM, OC, 0),
    K(cycle_momentum, FLAG, OC, 0),
    K(cycle_min_mom, NUM, OC, 0),
    K(cycle_max_mom, NUM, OC, 0),
    K(decay_mom_rate, NUM, OC, 0),
    K(lr_range_test_min_lr, NUM, RT, 0),
    K(lr_range_test_step_size, NUM, RT, 0),
    K(lr_range_test_step_rate, NUM, RT, 0),
    K(lr_range_test_staircase, FLAG, RT, 0),
    K(last_batch_iteration, NUM, ALL, 0),
#undef K
};
#define NKEYS (sizeof KEYS / sizeof KEYS[0])

// GIVEN_* bits of the row `path` (0 for a path the table lacks).
static unsigned given(const dsc_config *c, const char *path) {
    int idx = dsc__row_find(path);
    return idx >= 0 ? c->given[idx] : 0;
}

dsc_status dsc__sched_params_from_config(dsc_sched_params *p, const dsc_config *c) {
    const char *kind = dsc_sched_kind_name(p->kind);
    unsigned bit = 1u << p->kind;
    if (!(given(c, "scheduler.params") & GIVEN_VALUE))
        return dsc__fail(DSC_ERR_CONFIG, "scheduler.params is %s; DeepSpeed builds the %s "
                         "schedule with scheduler.params as keyword arguments and fails without "
                         "them. Give an object ({} for all defaults)",
                         given(c, "scheduler.params") & GIVEN_NAMED ? "null" : "missing", kind);
    if (c->scheduler.unknown_param[0])
        return dsc__fail(DSC_ERR_CONFIG, "scheduler.params.%s is no parameter of %s (nor of any "
                         "DeepSpeed schedule); DeepSpeed fails on it (an unexpected keyword "
                         "argument). Remove it", c->scheduler.unknown_param, kind);
    for (size_t k = 0; k < NKEYS; k++) {
        const struct sched_key *key = &KEYS[k];
        char path[96];
        snprintf(path, sizeof path, "scheduler.params.%s", key->name);
        unsigned g = given(c, path);
        if ((g & GIVEN_NAMED) && !(key->takes & bit))
            return dsc__fail(DSC_ERR_CONFIG, "%s is not a parameter of %s; DeepSpeed fails on it "
                             "(an unexpected keyword argument). Remove it", path, kind);
        if (!(g & GIVEN_NAMED) && (key->requires & bit))
            return dsc__fail(DSC_ERR_CONFIG, "%s is required by %s (it has no default)", path,
                             kind);
        if (!(g & GIVEN_NAMED)) continue; // DeepSpeed's default, already in *p
        const char *from = (const char *)c + key->config_off;
        char *to = (char *)p + key->param_off;
        bool null = !(g & GIVEN_VALUE);
        switch (key->type) {
        case NUM: *(double *)to = null ? DSC_SCHED_UNSET : *(const double *)from; break;
        case FLAG: *(bool *)to = null ? false : *(const bool *)from; break; // None is falsy
        case WARMUP_TYPE:
            *(dsc_warmup_type *)to = dsc_sched_warmup_type_parse(null ? NULL : from);
            break;
        }
    }
    return DSC_OK;
}
