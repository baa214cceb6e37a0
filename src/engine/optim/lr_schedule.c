// engine/optim/lr_schedule.c - DeepSpeed's schedules as closed forms of last_batch_iteration.
//
// Every formula follows deepspeed/runtime/lr_schedules.py (0.18.4), including its evaluation order,
// so that the doubles agree with Python's to the last bit or nearly; `it` below is DeepSpeed's
// last_batch_iteration, -1 before the first scheduler.step().
#include "engine/optim/lr_schedule.h"

#include <math.h>   // log, cos, floor, fmax, isnan, M_PI
#include <string.h> // strcmp

#include "base/log.h"    // DSC_WARN
#include "base/status.h" // dsc__fail

// ---- names and defaults ----

static const struct {
    const char *name;
    dsc_sched_kind kind;
} KINDS[] = {
    {"WarmupLR", DSC_SCHED_WARMUP_LR},
    {"WarmupDecayLR", DSC_SCHED_WARMUP_DECAY_LR},
    {"WarmupCosineLR", DSC_SCHED_WARMUP_COSINE_LR},
    {"OneCycle", DSC_SCHED_ONE_CYCLE},
    {"LRRangeTest", DSC_SCHED_LR_RANGE_TEST},
};
#define NKINDS (sizeof KINDS / sizeof KINDS[0])

dsc_status dsc_sched_kind_parse(const char *name, dsc_sched_kind *out) {
    for (size_t k = 0; name != NULL && k < NKINDS; k++) {
        if (strcmp(name, KINDS[k].name) == 0) {
            *out = KINDS[k].kind;
            return DSC_OK;
        }
    }
    return dsc__fail(DSC_ERR_CONFIG,
                     "scheduler.type '%s' is not supported; use one of WarmupLR, WarmupDecayLR, "
                     "WarmupCosineLR, OneCycle, LRRangeTest",
                     name != NULL ? name : "(null)");
}

const char *dsc_sched_kind_name(dsc_sched_kind kind) {
    for (size_t k = 0; k < NKINDS; k++)
        if (KINDS[k].kind == kind) return KINDS[k].name;
    return "none";
}

dsc_warmup_type dsc_sched_warmup_type_parse(const char *name) {
    if (name != NULL && strcmp(name, "log") == 0) return DSC_WARMUP_LOG;
    if (name != NULL && strcmp(name, "linear") == 0) return DSC_WARMUP_LINEAR;
    return DSC_WARMUP_OTHER;
}

void dsc_sched_params_defaults(dsc_sched_kind kind, dsc_sched_params *p) {
    *p = (dsc_sched_params){
        .kind = kind,
        .warmup_min_lr = 0.0,
        // WarmupLR's warmup_max_lr=None means the optimizer's lr; WarmupDecayLR's default is 0.001
        .warmup_max_lr = kind == DSC_SCHED_WARMUP_DECAY_LR ? 0.001 : DSC_SCHED_UNSET,
        .warmup_num_steps = 1000,
        .warmup_type = DSC_WARMUP_LOG,
        .total_num_steps = DSC_SCHED_UNSET,
        .warmup_min_ratio = 0.0,
        .cos_min_ratio = 0.0001,
        .cycle_min_lr = DSC_SCHED_UNSET,
        .cycle_max_lr = DSC_SCHED_UNSET,
        .decay_lr_rate = 0.0,
        .cycle_first_step_size = 2000,
        .cycle_second_step_size = DSC_SCHED_UNSET,
        .cycle_first_stair_count = 0,
        .cycle_second_stair_count = DSC_SCHED_UNSET,
        .decay_step_size = 0,
        .cycle_momentum = true,
        .cycle_min_mom = 0.8,
        .cycle_max_mom = 0.9,
        .decay_mom_rate = 0.0,
        .lr_range_test_min_lr = 1e-3,
        .lr_range_test_step_size = 2000,
        .lr_range_test_step_rate = 1.0,
        .lr_range_test_staircase = false,
    };
}

// ---- validation ----

static dsc_status require(double value, const char *key, const char *kind) {
    if (!isnan(value)) return DSC_OK;
    return dsc__fail(DSC_ERR_CONFIG, "scheduler.params.%s is required by %s (it has no default)",
                     key, kind);
}

static double warmup_steps(const dsc_sched_params *p) { return fmax(2.0, p->warmup_num_steps); }

static dsc_status validate_warmup(const dsc_sched_params *p, const char *kind) {
    bool decays = p->kind != DSC_SCHED_WARMUP_LR;
    if (decays) DSC_TRY(require(p->total_num_steps, "total_num_steps", kind));
    if (p->warmup_type == DSC_WARMUP_OTHER) {
        if (p->kind == DSC_SCHED_WARMUP_COSINE_LR)
            return dsc__fail(DSC_ERR_CONFIG, "scheduler.params.warmup_type must be 'log' or "
                                             "'linear' for WarmupCosineLR");
        DSC_WARN("sched", "scheduler.params.warmup_type is neither 'log' nor 'linear'; using "
                          "'log' as DeepSpeed does");
    }
    if (decays && p->total_num_steps < p->warmup_num_steps)
        DSC_WARN("sched", "scheduler.params.total_num_steps %g is less than warmup_num_steps %g",
                 p->total_num_steps, p->warmup_num_steps);
    // DeepSpeed divides by total - max(2, warmup) once warmup ends; WarmupDecayLR guards it.
    if (p->kind == DSC_SCHED_WARMUP_COSINE_LR && p->total_num_steps == warmup_steps(p))
        return dsc__fail(DSC_ERR_CONFIG,
                         "scheduler.params.total_num_steps (%g) equals the warmup length; "
                         "WarmupCosineLR needs total_num_steps > warmup_num_steps",
                         p->total_num_steps);
    return DSC_OK;
}

static double one_cycle_second(const dsc_sched_params *p) {
    return isnan(p->cycle_second_step_size) ? p->cycle_first_step_size
                                            : p->cycle_second_step_size;
}

static dsc_status validate_one_cycle(const dsc_sched_params *p) {
    DSC_TRY(require(p->cycle_min_lr, "cycle_min_lr", "OneCycle"));
    DSC_TRY(require(p->cycle_max_lr, "cycle_max_lr", "OneCycle"));
    if (p->cycle_first_step_size == 0 || p->cycle_first_step_size + one_cycle_second(p) == 0)
        return dsc__fail(DSC_ERR_CONFIG,
                         "scheduler.params.cycle_first_step_size must be non-zero and the cycle "
                         "(cycle_first_step_size + cycle_second_step_size) longer than 0");
    return DSC_OK;
}

dsc_status dsc_sched_validate(const dsc_sched_params *p) {
    switch (p->kind) {
    case DSC_SCHED_NONE: return DSC_OK;
    case DSC_SCHED_WARMUP_LR:
    case DSC_SCHED_WARMUP_DECAY_LR:
    case DSC_SCHED_WARMUP_COSINE_LR: return validate_warmup(p, dsc_sched_kind_name(p->kind));
    case DSC_SCHED_ONE_CYCLE: return validate_one_cycle(p);
    case DSC_SCHED_LR_RANGE_TEST:
        if (p->lr_range_test_step_size == 0)
            return dsc__fail(DSC_ERR_CONFIG,
                             "scheduler.params.lr_range_test_step_size must be non-zero");
        return DSC_OK;
    }
    return dsc__fail(DSC_ERR_INVALID_ARG, "unknown scheduler kind %d", (int)p->kind);
}

// ---- the schedules; `it` >= 0 unless said ----

// WarmupLR._get_gamma during warmup (it < max(2, warmup_num_steps)).
static double warmup_gamma(const dsc_sched_params *p, double it) {
    double w = warmup_steps(p);
    if (p->warmup_type == DSC_WARMUP_LINEAR) return it / w;
    return (1.0 / log(w)) * log(it + 1); // log, and DeepSpeed's fallback for unknown types
}

// WarmupLR / WarmupDecayLR.get_lr: min + (max - min) * gamma.
static double warmup_lr(const dsc_sched_params *p, double base_lr, double it) {
    double max_lr = isnan(p->warmup_max_lr) ? base_lr : p->warmup_max_lr;
    if (it < 0) return p->warmup_min_lr; // "before it has started": the min lrs
    double gamma = 1.0;
    if (it < warmup_steps(p)) gamma = warmup_gamma(p, it);
    else if (p->kind == DSC_SCHED_WARMUP_DECAY_LR)
        gamma = fmax(0.0, (p->total_num_steps - it) /
                              fmax(1.0, p->total_num_steps - warmup_steps(p)));
    return p->warmup_min_lr + (max_lr - p->warmup_min_lr) * gamma;
}

// WarmupCosineLR.get_lr_ratio; its cosine is periodic, so past total_num_steps the ratio climbs.
static double warmup_cosine_ratio(const dsc_sched_params *p, double it) {
    double w = warmup_steps(p);
    if (it < w) {
        double ratio = warmup_gamma(p, it);
        return p->warmup_min_ratio + ratio * (1.0 - p->warmup_min_ratio);
    }
    double real_last = it - w + 1, real_total = p->total_num_steps - w;
    double ratio = (1 + cos(M_PI * real_last / real_total)) / 2;
    return fmax(0.0, p->cos_min_ratio + (1.0 - p->cos_min_ratio) * ratio);
}

// OneCycle._get_scale_factor: position in the triangle, 0 at the ends, 1 at the peak.
static double one_cycle_scale(const dsc_sched_params *p, double it) {
    double total = p->cycle_first_step_size + one_cycle_second(p);
    double step_ratio = p->cycle_first_step_size / total;
    double bi = it + 1;
    double cycle = floor(1 + bi / total);
    double x = 1. + bi / total - cycle;
    return x <= step_ratio ? x / step_ratio : (x - 1) / (step_ratio - 1);
}

// OneCycle.get_lr and get_mom. DeepSpeed skips a decay when decay_step_size or its rate is 0
// (math.isclose(x, 0) is true only for x == 0).
static void one_cycle(const dsc_sched_params *p, double it, double *lr, double *mom) {
    if (it < 0) { // the constructor's values
        *lr = p->cycle_min_lr;
        *mom = p->cycle_min_mom;
        return;
    }
    double total = p->cycle_first_step_size + one_cycle_second(p);
    if (it < total) {
        double sf = one_cycle_scale(p, it);
        *lr = p->cycle_min_lr + (p->cycle_max_lr - p->cycle_min_lr) * sf;
        *mom = p->cycle_max_mom - (p->cycle_max_mom - p->cycle_min_mom) * sf;
        return;
    }
    double decay_it = it - total + 1;
    bool no_decay = p->decay_step_size == 0;
    *lr = p->cycle_min_lr;
    if (!no_decay && p->decay_lr_rate != 0)
        *lr = p->cycle_min_lr / (1 + p->decay_lr_rate * (decay_it / p->decay_step_size));
    *mom = p->cycle_max_mom;
    if (!no_decay && p->decay_mom_rate != 0)
        *mom = p->cycle_max_mom * (1 + p->decay_mom_rate * (decay_it / p->decay_step_size));
}

// LRRangeTest: the constructor sets min_lr; then min_lr * (1 + rate * interval).
static double range_test_lr(const dsc_sched_params *p, double it) {
    if (it < 0) return p->lr_range_test_min_lr;
    double interval = (it + 1) / p->lr_range_test_step_size;
    if (p->lr_range_test_staircase) interval = floor(interval);
    return p->lr_range_test_min_lr * (1 + p->lr_range_test_step_rate * interval);
}

void dsc_sched_lr_at(const dsc_sched_params *p, double base_lr, int64_t step, double *lr,
                     double *mom) {
    double it = (double)(step < 1 ? 1 : step) - 2; // DeepSpeed's last_batch_iteration
    switch (p->kind) {
    case DSC_SCHED_NONE: *lr = base_lr; return;
    case DSC_SCHED_WARMUP_LR:
    case DSC_SCHED_WARMUP_DECAY_LR: *lr = warmup_lr(p, base_lr, it); return;
    case DSC_SCHED_WARMUP_COSINE_LR:
        *lr = it < 0 ? 0.0 : base_lr * warmup_cosine_ratio(p, it);
        return;
    case DSC_SCHED_ONE_CYCLE: {
        double m;
        one_cycle(p, it, lr, &m);
        if (p->cycle_momentum && mom != NULL) *mom = m;
        return;
    }
    case DSC_SCHED_LR_RANGE_TEST: *lr = range_test_lr(p, it); return;
    }
    *lr = base_lr;
}
