// engine/optim/lr_schedule.c - DeepSpeed's schedules as closed forms of last_batch_iteration.
//
// Every formula follows deepspeed/runtime/lr_schedules.py (0.18.4), including its evaluation order,
// so that the doubles agree with Python's to the last bit; `it` below is DeepSpeed's
// last_batch_iteration as step() leaves it (lr_schedule.h says which one each optimizer step uses).
#include "engine/optim/lr_schedule.h"

#include <math.h>   // log, cos, floor, ceil, fabs, fmax, isnan, ldexp, ilogb, M_PI
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
        .last_batch_iteration = -1,
    };
}

// ---- iterations ----

double dsc_sched_iteration_after(double x, int64_t n) {
    while (n > 0) {
        double ax = fabs(x);
        if (x == floor(x) && ax < 0x1p53 && (double)n <= 0x1p53 - ax) return x + (double)n; // exact
        if (x <= -1 && ax < 0x1p53) { // towards 0: every sum up to 0 is exact
            double k = fmin(floor(ax), (double)n);
            x += k, n -= (int64_t)k;
            continue;
        }
        if (x >= 1 && x < 0x1p53) { // within x's binade [2^e, 2^(e+1)) every sum is exact
            double k = fmin(ceil(ldexp(1.0, ilogb(x) + 1) - x) - 1, (double)n);
            if (k >= 1) {
                x += k, n -= (int64_t)k;
                continue;
            }
        }
        double y = x + 1; // one rounded sum: into the next binade, or |x| < 1
        if (y == x) break; // 1 is below half an ulp: Python's sum stays there too
        x = y, n--;
    }
    return x;
}

// The iteration of the first scheduler.step(): the one optimizer step 2 uses.
static double first_iteration(const dsc_sched_params *p) {
    return dsc_sched_iteration_after(p->last_batch_iteration, 1);
}

// Whether the iterations from `it` on (it, it + 1, ...) ever reach `target` (they do unless they
// stop moving, far beyond 2^53).
static bool reaches(double it, double target) {
    if (it >= target) return true;
    double gap = fmin(ceil(target - it) + 1, 0x1p62);
    return dsc_sched_iteration_after(it, (int64_t)gap) >= target;
}

// ---- validation ----

// A parameter that is None (null, or a required one missing) where DeepSpeed computes with it.
static dsc_status none_error(const char *key, const char *kind, const char *when) {
    return dsc__fail(DSC_ERR_CONFIG, "scheduler.params.%s must be a number: DeepSpeed's %s "
                     "fails on None (null)%s", key, kind, when);
}

static dsc_status require(double value, const char *key, const char *kind) {
    return isnan(value) ? none_error(key, kind, "") : DSC_OK;
}

static double warmup_steps(const dsc_sched_params *p) { return fmax(2.0, p->warmup_num_steps); }

static dsc_status validate_warmup(const dsc_sched_params *p, const char *kind) {
    bool cosine = p->kind == DSC_SCHED_WARMUP_COSINE_LR;
    if (p->kind != DSC_SCHED_WARMUP_LR)
        DSC_TRY(require(p->total_num_steps, "total_num_steps", kind));
    DSC_TRY(require(p->warmup_num_steps, "warmup_num_steps", kind));
    if (!cosine) DSC_TRY(require(p->warmup_min_lr, "warmup_min_lr", kind));
    double w = warmup_steps(p), it = first_iteration(p);
    // WarmupCosineLR computes the warm-up ratio at iterations 0 <= it < w and the cosine from w on.
    bool warms = it < w && reaches(it, 0), decays = reaches(it, w);
    if (cosine && warms && p->warmup_type == DSC_WARMUP_OTHER)
        return dsc__fail(DSC_ERR_CONFIG, "scheduler.params.warmup_type must be 'log' or 'linear' "
                         "for WarmupCosineLR (DeepSpeed fails on any other value, null included, "
                         "during the warm-up)");
    if (cosine && warms && isnan(p->warmup_min_ratio))
        return none_error("warmup_min_ratio", kind, " during the warm-up");
    if (cosine && decays && isnan(p->cos_min_ratio))
        return none_error("cos_min_ratio", kind, " after the warm-up");
    if (!cosine && p->warmup_type == DSC_WARMUP_OTHER)
        DSC_WARN("sched", "scheduler.params.warmup_type is neither 'log' nor 'linear'; using "
                          "'log' as DeepSpeed does");
    if (p->kind != DSC_SCHED_WARMUP_LR && p->total_num_steps < w)
        DSC_WARN("sched", "scheduler.params.total_num_steps %g is less than warmup_num_steps %g",
                 p->total_num_steps, p->warmup_num_steps);
    // DeepSpeed divides by total - max(2, warmup) once warmup ends; WarmupDecayLR guards it.
    if (cosine && decays && p->total_num_steps == w)
        return dsc__fail(DSC_ERR_CONFIG,
                         "scheduler.params.total_num_steps (%g) equals the warmup length; "
                         "WarmupCosineLR needs total_num_steps != max(2, warmup_num_steps) "
                         "(DeepSpeed divides by their difference after the warm-up)",
                         p->total_num_steps);
    return DSC_OK;
}

static double one_cycle_second(const dsc_sched_params *p) {
    return isnan(p->cycle_second_step_size) ? p->cycle_first_step_size
                                            : p->cycle_second_step_size;
}

static dsc_status validate_one_cycle(const dsc_sched_params *p) {
    DSC_TRY(require(p->cycle_min_lr, "cycle_min_lr", "OneCycle"));
    DSC_TRY(require(p->cycle_first_step_size, "cycle_first_step_size", "OneCycle"));
    DSC_TRY(require(p->decay_step_size, "decay_step_size", "OneCycle"));
    DSC_TRY(require(p->decay_lr_rate, "decay_lr_rate", "OneCycle"));
    double total = p->cycle_first_step_size + one_cycle_second(p);
    if (total == 0) // its constructor divides by the cycle length
        return dsc__fail(DSC_ERR_CONFIG,
                         "scheduler.params.cycle_first_step_size + cycle_second_step_size is 0; "
                         "DeepSpeed's OneCycle divides by the cycle length");
    bool cycles = first_iteration(p) < total; // else only the decay after the cycle is computed
    if (cycles && isnan(p->cycle_max_lr))
        return none_error("cycle_max_lr", "OneCycle", " within the cycle");
    if (!p->cycle_momentum) return DSC_OK;
    DSC_TRY(require(p->decay_mom_rate, "decay_mom_rate", "OneCycle"));
    DSC_TRY(require(p->cycle_max_mom, "cycle_max_mom", "OneCycle"));
    if ((cycles || p->last_batch_iteration == -1) && isnan(p->cycle_min_mom))
        return none_error("cycle_min_mom", "OneCycle", " within the cycle");
    return DSC_OK;
}

dsc_status dsc_sched_validate(const dsc_sched_params *p) {
    if (p->kind != DSC_SCHED_NONE)
        DSC_TRY(require(p->last_batch_iteration, "last_batch_iteration",
                        dsc_sched_kind_name(p->kind)));
    switch (p->kind) {
    case DSC_SCHED_NONE: return DSC_OK;
    case DSC_SCHED_WARMUP_LR:
    case DSC_SCHED_WARMUP_DECAY_LR:
    case DSC_SCHED_WARMUP_COSINE_LR: return validate_warmup(p, dsc_sched_kind_name(p->kind));
    case DSC_SCHED_ONE_CYCLE: return validate_one_cycle(p);
    case DSC_SCHED_LR_RANGE_TEST:
        DSC_TRY(require(p->lr_range_test_min_lr, "lr_range_test_min_lr", "LRRangeTest"));
        DSC_TRY(require(p->lr_range_test_step_size, "lr_range_test_step_size", "LRRangeTest"));
        DSC_TRY(require(p->lr_range_test_step_rate, "lr_range_test_step_rate", "LRRangeTest"));
        if (p->lr_range_test_step_size == 0) // every step() divides by it
            return dsc__fail(DSC_ERR_CONFIG,
                             "scheduler.params.lr_range_test_step_size must be non-zero "
                             "(DeepSpeed's LRRangeTest divides by it)");
        return DSC_OK;
    }
    return dsc__fail(DSC_ERR_INVALID_ARG, "unknown scheduler kind %d", (int)p->kind);
}

// ---- the schedules at iteration `it` (any value; step() has run at least once) ----

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

// WarmupCosineLR.get_lr_ratio (it >= 0); its cosine is periodic, so past total_num_steps the ratio
// climbs again.
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

static dsc_status one_cycle_raises(int64_t step, double it, const char *why) {
    return dsc__fail(DSC_ERR_CONFIG, "scheduler OneCycle divides by zero computing the lr of "
                     "optimizer step %lld (last_batch_iteration %.17g): %s. DeepSpeed fails "
                     "there, and so does dsc", (long long)step, it, why);
}

// OneCycle.get_lr and get_mom. DeepSpeed skips a decay when decay_step_size or its rate is 0
// (math.isclose(x, 0) is true only for x == 0).
static dsc_status one_cycle(const dsc_sched_params *p, int64_t step, double it, double *lr,
                            double *mom) {
    double total = p->cycle_first_step_size + one_cycle_second(p);
    if (it < total) { // _get_scale_factor: position in the triangle, 0 at the ends, 1 at the peak
        double step_ratio = p->cycle_first_step_size / total;
        double bi = it + 1;
        double cycle = floor(1 + bi / total);
        double x = 1. + bi / total - cycle;
        if (x <= step_ratio && step_ratio == 0)
            return one_cycle_raises(step, it, "a cycle starts there and "
                                              "scheduler.params.cycle_first_step_size is 0");
        double sf = x <= step_ratio ? x / step_ratio : (x - 1) / (step_ratio - 1);
        *lr = p->cycle_min_lr + (p->cycle_max_lr - p->cycle_min_lr) * sf;
        *mom = p->cycle_max_mom - (p->cycle_max_mom - p->cycle_min_mom) * sf;
        return DSC_OK;
    }
    double decay_it = it - total + 1;
    bool no_decay = p->decay_step_size == 0;
    *lr = p->cycle_min_lr;
    if (!no_decay && p->decay_lr_rate != 0) {
        double factor = 1 + p->decay_lr_rate * (decay_it / p->decay_step_size);
        if (factor == 0)
            return one_cycle_raises(step, it, "its lr decay factor 1 + decay_lr_rate * "
                                              "(iterations / decay_step_size) is 0 there");
        *lr = p->cycle_min_lr / factor;
    }
    *mom = p->cycle_max_mom;
    if (!no_decay && p->decay_mom_rate != 0)
        *mom = p->cycle_max_mom * (1 + p->decay_mom_rate * (decay_it / p->decay_step_size));
    return DSC_OK;
}

// LRRangeTest.get_lr: min_lr * (1 + rate * interval).
static double range_test_lr(const dsc_sched_params *p, double it) {
    double interval = (it + 1) / p->lr_range_test_step_size;
    if (p->lr_range_test_staircase) interval = floor(interval);
    return p->lr_range_test_min_lr * (1 + p->lr_range_test_step_rate * interval);
}

// What the constructor writes into the optimizer when last_batch_iteration == -1.
static void constructed(const dsc_sched_params *p, double base_lr, double *lr, double *mom) {
    switch (p->kind) {
    case DSC_SCHED_NONE: *lr = base_lr; return;
    case DSC_SCHED_WARMUP_LR:
    case DSC_SCHED_WARMUP_DECAY_LR: *lr = p->warmup_min_lr; return;
    case DSC_SCHED_WARMUP_COSINE_LR: *lr = 0.0; return;
    case DSC_SCHED_ONE_CYCLE:
        *lr = p->cycle_min_lr;
        if (p->cycle_momentum && mom != NULL) *mom = p->cycle_min_mom;
        return;
    case DSC_SCHED_LR_RANGE_TEST: *lr = p->lr_range_test_min_lr; return;
    }
    *lr = base_lr;
}

dsc_status dsc_sched_lr_at(const dsc_sched_params *p, double base_lr, int64_t step, double *lr,
                           double *mom) {
    if (step < 1) step = 1;
    if (step == 1) {
        // The constructor sets the optimizer's values only when starting from scratch.
        if (p->last_batch_iteration == -1) constructed(p, base_lr, lr, mom);
        else *lr = base_lr;
        return DSC_OK;
    }
    double it = dsc_sched_iteration_after(p->last_batch_iteration, step - 1);
    switch (p->kind) {
    case DSC_SCHED_NONE: *lr = base_lr; return DSC_OK;
    case DSC_SCHED_WARMUP_LR:
    case DSC_SCHED_WARMUP_DECAY_LR: *lr = warmup_lr(p, base_lr, it); return DSC_OK;
    case DSC_SCHED_WARMUP_COSINE_LR:
        *lr = it < 0 ? 0.0 : base_lr * warmup_cosine_ratio(p, it);
        return DSC_OK;
    case DSC_SCHED_ONE_CYCLE: {
        double m = NAN;
        DSC_TRY(one_cycle(p, step, it, lr, &m));
        if (p->cycle_momentum && mom != NULL) *mom = m;
        return DSC_OK;
    }
    case DSC_SCHED_LR_RANGE_TEST: *lr = range_test_lr(p, it); return DSC_OK;
    }
    *lr = base_lr;
    return DSC_OK;
}
