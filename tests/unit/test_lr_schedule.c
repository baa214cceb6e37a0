// tests/unit/test_lr_schedule.c - DeepSpeed's LR schedules against a step-by-step simulation of
// DeepSpeed's scheduler objects (the constructor with scheduler.params' last_batch_iteration,
// then one step() - last_batch_iteration += 1 - after each applied optimizer step), transcribed
// here from lr_schedules.py, plus hand-computed values that pin down the first steps (those of
// last_batch_iteration != -1 and of fractional and negative step sizes checked against DeepSpeed
// 0.18.4 itself), the places where DeepSpeed fails, and scheduler.params read from a config.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>   // log, cos, floor, fabs, isnan, M_PI
#include <string.h> // strstr

#include "dsc/config.h"                // dsc_config_load_string
#include "engine/optim/lr_schedule.h" // dsc_sched_*
#include "engine/sched_config.h"      // dsc__sched_params_from_config

#define STEPS 300
#define REL 1e-12

// ---- the simulation: a DeepSpeed scheduler object, field for field ----

typedef struct {
    dsc_sched_params p;
    double org_lr;            // the optimizer's lr when the scheduler was built
    double last_batch_iteration;
    double lr, mom;           // what the optimizer's param_group holds now
    bool sets_mom;            // OneCycle cycles the momentum
    bool mom_written;         // ... and has written it into the param group
} sim;

static double sim_warmup_steps(const sim *s) {
    return s->p.warmup_num_steps > 2 ? s->p.warmup_num_steps : 2;
}

static double sim_warmup_part(const sim *s) { // gamma / ratio while warming up
    double n = sim_warmup_steps(s), it = s->last_batch_iteration;
    if (s->p.warmup_type == DSC_WARMUP_LINEAR) return it / n;
    double inverse_log_warm_up = 1.0 / log(n);
    return inverse_log_warm_up * log(it + 1);
}

static double sim_warmup_lr(const sim *s) {
    double min_lr = s->p.warmup_min_lr;
    double max_lr = isnan(s->p.warmup_max_lr) ? s->org_lr : s->p.warmup_max_lr;
    if (s->last_batch_iteration < 0) return min_lr;
    double it = s->last_batch_iteration, gamma = 1.0, n = sim_warmup_steps(s);
    if (it < n) {
        gamma = sim_warmup_part(s);
    } else if (s->p.kind == DSC_SCHED_WARMUP_DECAY_LR) {
        double den = s->p.total_num_steps - n;
        if (den < 1.0) den = 1.0;
        gamma = (s->p.total_num_steps - it) / den;
        if (gamma < 0.0) gamma = 0.0;
    }
    return min_lr + (max_lr - min_lr) * gamma;
}

static double sim_cosine_lr(const sim *s) {
    if (s->last_batch_iteration < 0) return 0.0;
    double it = s->last_batch_iteration, n = sim_warmup_steps(s), ratio;
    if (it < n) {
        ratio = s->p.warmup_min_ratio + sim_warmup_part(s) * (1. - s->p.warmup_min_ratio);
    } else {
        double real_last_step = it - n + 1;
        double real_total_steps = s->p.total_num_steps - n;
        ratio = (1 + cos(M_PI * real_last_step / real_total_steps)) / 2;
        ratio = s->p.cos_min_ratio + (1. - s->p.cos_min_ratio) * ratio;
        if (ratio < 0.0) ratio = 0.0;
    }
    return s->org_lr * ratio;
}

static void sim_one_cycle(sim *s) {
    const dsc_sched_params *p = &s->p;
    double first = p->cycle_first_step_size;
    double second = isnan(p->cycle_second_step_size) ? first : p->cycle_second_step_size;
    double total_size = first + second, step_ratio = first / total_size;
    bool skip_lr_decay = p->decay_step_size == 0 || p->decay_lr_rate == 0;
    bool skip_mom_decay = p->decay_step_size == 0 || p->decay_mom_rate == 0;
    double it = s->last_batch_iteration;
    if (it < total_size) {
        double batch_iteration = it + 1;
        double cycle = floor(1 + batch_iteration / total_size);
        double x = 1. + batch_iteration / total_size - cycle;
        double scale = x <= step_ratio ? x / step_ratio : (x - 1) / (step_ratio - 1);
        s->lr = p->cycle_min_lr + (p->cycle_max_lr - p->cycle_min_lr) * scale;
        s->mom = p->cycle_max_mom - (p->cycle_max_mom - p->cycle_min_mom) * scale;
        return;
    }
    double decay_interval = (it - total_size + 1) / p->decay_step_size;
    s->lr = skip_lr_decay ? p->cycle_min_lr
                          : p->cycle_min_lr / (1 + p->decay_lr_rate * decay_interval);
    s->mom = skip_mom_decay ? p->cycle_max_mom
                            : p->cycle_max_mom * (1 + p->decay_mom_rate * decay_interval);
}


static double sim_range_test_lr(const sim *s) {
    double interval = (s->last_batch_iteration + 1) / s->p.lr_range_test_step_size;
    if (s->p.lr_range_test_staircase) interval = floor(interval);
    return s->p.lr_range_test_min_lr * (1 + s->p.lr_range_test_step_rate * interval);
}

// scheduler.step(): advance, then write the new values into the param group.
static void sim_step(sim *s) {
    s->last_batch_iteration += 1;
    switch (s->p.kind) {
    case DSC_SCHED_NONE: break;
    case DSC_SCHED_WARMUP_LR:
    case DSC_SCHED_WARMUP_DECAY_LR: s->lr = sim_warmup_lr(s); break;
    case DSC_SCHED_WARMUP_COSINE_LR: s->lr = sim_cosine_lr(s); break;
    case DSC_SCHED_ONE_CYCLE:
        sim_one_cycle(s);
        s->mom_written = s->sets_mom;
        break;
    case DSC_SCHED_LR_RANGE_TEST: s->lr = sim_range_test_lr(s); break;
    }
}

// The constructor: it writes into the optimizer only when last_batch_iteration == -1.
static void sim_init(sim *s, const dsc_sched_params *p, double optimizer_lr) {
    *s = (sim){.p = *p, .org_lr = optimizer_lr, .last_batch_iteration = p->last_batch_iteration,
               .lr = optimizer_lr, .sets_mom = p->kind == DSC_SCHED_ONE_CYCLE && p->cycle_momentum};
    if (p->last_batch_iteration != -1) return;
    switch (p->kind) {
    case DSC_SCHED_NONE: break;
    case DSC_SCHED_WARMUP_LR:
    case DSC_SCHED_WARMUP_DECAY_LR: s->lr = sim_warmup_lr(s); break;
    case DSC_SCHED_WARMUP_COSINE_LR: s->lr = sim_cosine_lr(s); break;
    case DSC_SCHED_ONE_CYCLE: // _initialize_lr and _initialize_momentum
        s->lr = p->cycle_min_lr;
        s->mom = p->cycle_min_mom;
        s->mom_written = s->sets_mom;
        break;
    case DSC_SCHED_LR_RANGE_TEST: s->lr = p->lr_range_test_min_lr; break;
    }
}

// ---- comparison ----

static void close_or_fail(const char *what, const char *label, int64_t step, double got,
                          double want) {
    if (got == want || fabs(got - want) <= REL * fabs(want)) return;
    print_error("%s %s step %lld: got %.17g want %.17g\n", label, what, (long long)step, got, want);
    fail();
}

static void compare(const char *label, const dsc_sched_params *p, double optimizer_lr) {
    assert_int_equal(dsc_sched_validate(p), DSC_OK);
    sim s;
    sim_init(&s, p, optimizer_lr);
    for (int64_t step = 1; step <= STEPS; step++) {
        double lr = -1, mom = -12345;
        assert_int_equal(dsc_sched_lr_at(p, optimizer_lr, step, &lr, &mom), DSC_OK);
        close_or_fail("lr", label, step, lr, s.lr);
        if (s.mom_written) close_or_fail("momentum", label, step, mom, s.mom);
        else assert_true(mom == -12345); // untouched: the optimizer's own betas
        sim_step(&s); // the engine steps the scheduler after the optimizer step
    }
}

static dsc_sched_params defaults(dsc_sched_kind kind) {
    dsc_sched_params p;
    dsc_sched_params_defaults(kind, &p);
    return p;
}

// ---- tests ----

static void test_warmup_lr(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_LR);
    compare("WarmupLR defaults", &p, 0.01); // max = optimizer lr, 1000 log steps
    p.warmup_min_lr = 1e-5, p.warmup_max_lr = 3e-3, p.warmup_num_steps = 50;
    p.warmup_type = DSC_WARMUP_LINEAR;
    compare("WarmupLR linear 50", &p, 0.1);
    p.warmup_type = DSC_WARMUP_LOG, p.warmup_num_steps = 1; // becomes 2
    compare("WarmupLR log 1", &p, 0.1);
    p = defaults(DSC_SCHED_WARMUP_LR);
    p.warmup_num_steps = 100, p.warmup_type = DSC_WARMUP_OTHER, p.warmup_min_lr = 1e-6;
    compare("WarmupLR unknown type", &p, 6e-4);
}

static void test_warmup_decay_lr(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_DECAY_LR);
    p.total_num_steps = 250, p.warmup_num_steps = 50;
    compare("WarmupDecayLR log", &p, 1.0); // default max 0.001, not the optimizer's lr
    p.total_num_steps = 300, p.warmup_num_steps = 100, p.warmup_type = DSC_WARMUP_LINEAR;
    p.warmup_min_lr = 1e-4, p.warmup_max_lr = 1e-2;
    compare("WarmupDecayLR linear", &p, 1.0);
    p.total_num_steps = 30; // below the warmup: DeepSpeed warns, then lr drops to min
    compare("WarmupDecayLR short", &p, 1.0);
    p.total_num_steps = 100;
    compare("WarmupDecayLR equal", &p, 1.0);
    p.total_num_steps = 1e5, p.warmup_num_steps = 2000;
    compare("WarmupDecayLR long", &p, 1.0);
}

static void test_warmup_cosine_lr(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_COSINE_LR);
    p.total_num_steps = 200, p.warmup_num_steps = 20;
    compare("WarmupCosineLR log", &p, 3e-4); // past 200 the cosine climbs again
    p.total_num_steps = 300, p.warmup_num_steps = 50, p.warmup_type = DSC_WARMUP_LINEAR;
    p.warmup_min_ratio = 0.1, p.cos_min_ratio = 0.05;
    compare("WarmupCosineLR linear", &p, 1e-3);
    p.warmup_num_steps = 0; // becomes 2
    compare("WarmupCosineLR no warmup", &p, 1e-3);
    p.total_num_steps = 100, p.warmup_num_steps = 150; // DeepSpeed only warns
    compare("WarmupCosineLR short", &p, 1e-3);
    p.total_num_steps = 120, p.warmup_num_steps = 10, p.cos_min_ratio = -2; // clamps at 0
    compare("WarmupCosineLR negative floor", &p, 1e-3);
}

static void test_one_cycle(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_ONE_CYCLE);
    p.cycle_min_lr = 1e-4, p.cycle_max_lr = 1e-2, p.cycle_first_step_size = 50;
    compare("OneCycle symmetric, no decay", &p, 0.5);
    p.cycle_first_step_size = 40, p.cycle_second_step_size = 80, p.decay_lr_rate = 0.1;
    p.decay_step_size = 10, p.decay_mom_rate = 0.05;
    compare("OneCycle decay", &p, 0.5);
    p.cycle_momentum = false, p.decay_lr_rate = 0.5, p.decay_step_size = 0; // 0 disables decay
    compare("OneCycle no momentum", &p, 0.5);
    p.cycle_momentum = true, p.cycle_first_step_size = 100, p.cycle_second_step_size = 0;
    p.decay_step_size = 25, p.decay_mom_rate = 0; // lr decays, momentum stays at max
    compare("OneCycle no second half", &p, 0.5);
    p.cycle_first_step_size = 7, p.cycle_second_step_size = 3, p.cycle_first_stair_count = 4;
    p.cycle_min_mom = 0.85, p.cycle_max_mom = 0.95, p.decay_mom_rate = 0.01;
    compare("OneCycle short", &p, 0.5);
}

static void test_lr_range_test(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_LR_RANGE_TEST);
    compare("LRRangeTest defaults", &p, 0.5);
    p.lr_range_test_min_lr = 1e-4, p.lr_range_test_step_size = 10;
    p.lr_range_test_step_rate = 2, p.lr_range_test_staircase = true;
    compare("LRRangeTest staircase", &p, 0.5);
    p.lr_range_test_step_size = 7, p.lr_range_test_step_rate = 0.5;
    p.lr_range_test_staircase = false;
    compare("LRRangeTest continuous", &p, 0.5);
}

static void test_no_schedule(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_NONE);
    compare("none", &p, 0.25);
}

static double lr_at(const dsc_sched_params *p, double base, int64_t step) {
    double lr = -1;
    dsc_sched_lr_at(p, base, step, &lr, NULL);
    return lr;
}

// Values worked out by hand from DeepSpeed's code, independent of both implementations above.
static void test_first_steps_by_hand(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_LR);
    p.warmup_max_lr = 1.0, p.warmup_num_steps = 10, p.warmup_type = DSC_WARMUP_LINEAR;
    assert_true(lr_at(&p, 9, 1) == 0.0); // constructor: min
    assert_true(lr_at(&p, 9, 2) == 0.0); // last_batch_iteration 0: 0/10
    assert_true(lr_at(&p, 9, 3) == 0.1);
    assert_true(lr_at(&p, 9, 11) == 0.9);
    assert_true(lr_at(&p, 9, 12) == 1.0);
    assert_true(lr_at(&p, 9, 0) == 0.0 && lr_at(&p, 9, -5) == 0.0); // counted as step 1

    p = defaults(DSC_SCHED_WARMUP_COSINE_LR);
    p.total_num_steps = 20, p.warmup_num_steps = 10, p.warmup_type = DSC_WARMUP_LINEAR;
    p.cos_min_ratio = 0;
    assert_true(lr_at(&p, 2.0, 1) == 0.0); // get_lr() before the start is 0, not the min ratio
    assert_true(lr_at(&p, 2.0, 3) == 0.2); // ratio 1/10
    // it = 14: real_last 5 of 10 -> (1 + cos(pi/2)) / 2 = 0.5
    assert_true(fabs(lr_at(&p, 2.0, 16) - 1.0) < 1e-15);

    p = defaults(DSC_SCHED_ONE_CYCLE);
    p.cycle_min_lr = 1, p.cycle_max_lr = 3, p.cycle_first_step_size = 4;
    double lr, mom = 0;
    dsc_sched_lr_at(&p, 0.1, 1, &lr, &mom);
    assert_true(lr == 1 && mom == 0.8); // constructor: min lr, min momentum
    dsc_sched_lr_at(&p, 0.1, 2, &lr, &mom);
    assert_true(lr == 1.5 && fabs(mom - 0.875) < 1e-15); // batch 1 of 8: a quarter up
    dsc_sched_lr_at(&p, 0.1, 5, &lr, &mom);
    assert_true(lr == 3 && fabs(mom - 0.8) < 1e-15); // peak
    dsc_sched_lr_at(&p, 0.1, 9, &lr, &mom);
    assert_true(lr == 1 && fabs(mom - 0.9) < 1e-15); // cycle done
    dsc_sched_lr_at(&p, 0.1, 100, &lr, &mom);
    assert_true(lr == 1 && fabs(mom - 0.9) < 1e-15); // no decay by default

    p = defaults(DSC_SCHED_LR_RANGE_TEST);
    p.lr_range_test_step_size = 4;
    assert_true(lr_at(&p, 9, 1) == 1e-3);
    assert_true(fabs(lr_at(&p, 9, 2) - 1.25e-3) < 1e-18); // (0 + 1) / 4
    p.lr_range_test_staircase = true;
    assert_true(lr_at(&p, 9, 4) == 1e-3 && lr_at(&p, 9, 5) == 2e-3);
}

static void test_defaults(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_LR);
    assert_true(p.warmup_min_lr == 0 && isnan(p.warmup_max_lr) && p.warmup_num_steps == 1000);
    assert_int_equal(p.warmup_type, DSC_WARMUP_LOG);
    p = defaults(DSC_SCHED_WARMUP_DECAY_LR);
    assert_true(p.warmup_max_lr == 0.001 && isnan(p.total_num_steps));
    p = defaults(DSC_SCHED_WARMUP_COSINE_LR);
    assert_true(p.warmup_min_ratio == 0 && p.cos_min_ratio == 0.0001);
    p = defaults(DSC_SCHED_ONE_CYCLE);
    assert_true(isnan(p.cycle_min_lr) && isnan(p.cycle_max_lr) && p.decay_lr_rate == 0);
    assert_true(p.cycle_first_step_size == 2000 && isnan(p.cycle_second_step_size));
    assert_true(p.decay_step_size == 0 && p.cycle_momentum);
    assert_true(p.cycle_min_mom == 0.8 && p.cycle_max_mom == 0.9 && p.decay_mom_rate == 0);
    p = defaults(DSC_SCHED_LR_RANGE_TEST);
    assert_true(p.lr_range_test_min_lr == 1e-3 && p.lr_range_test_step_size == 2000);
    assert_true(p.lr_range_test_step_rate == 1.0 && !p.lr_range_test_staircase);
    assert_true(p.last_batch_iteration == -1);
}

static void expect_config_error(const dsc_sched_params *p, const char *key) {
    assert_int_equal(dsc_sched_validate(p), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), key));
}

static void test_parse_and_validate(void **state) {
    static const char *const names[] = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                        "OneCycle", "LRRangeTest"};
    for (int k = 0; k < 5; k++) {
        dsc_sched_kind kind;
        assert_int_equal(dsc_sched_kind_parse(names[k], &kind), DSC_OK);
        assert_string_equal(dsc_sched_kind_name(kind), names[k]);
    }
    dsc_sched_kind kind;
    assert_int_equal(dsc_sched_kind_parse("CosineAnnealingLR", &kind), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "WarmupCosineLR"));
    assert_int_equal(dsc_sched_warmup_type_parse("log"), DSC_WARMUP_LOG);
    assert_int_equal(dsc_sched_warmup_type_parse("linear"), DSC_WARMUP_LINEAR);
    assert_int_equal(dsc_sched_warmup_type_parse("cosine"), DSC_WARMUP_OTHER);

    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_DECAY_LR);
    expect_config_error(&p, "scheduler.params.total_num_steps");
    p = defaults(DSC_SCHED_WARMUP_COSINE_LR);
    expect_config_error(&p, "scheduler.params.total_num_steps");
    p.total_num_steps = 1000; // equals the warmup: DeepSpeed divides by zero
    expect_config_error(&p, "scheduler.params.total_num_steps");
    p.total_num_steps = 5000, p.warmup_type = DSC_WARMUP_OTHER;
    expect_config_error(&p, "scheduler.params.warmup_type");
    p = defaults(DSC_SCHED_WARMUP_LR);
    p.warmup_type = DSC_WARMUP_OTHER; // a warning only
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    p = defaults(DSC_SCHED_ONE_CYCLE);
    expect_config_error(&p, "scheduler.params.cycle_min_lr");
    p.cycle_min_lr = 1e-3;
    expect_config_error(&p, "scheduler.params.cycle_max_lr");
    p.cycle_max_lr = 1e-2, p.cycle_first_step_size = 0;
    expect_config_error(&p, "scheduler.params.cycle_first_step_size");
    p = defaults(DSC_SCHED_LR_RANGE_TEST);
    p.lr_range_test_step_size = 0;
    expect_config_error(&p, "scheduler.params.lr_range_test_step_size");
}

// last_batch_iteration: resumed, negative, fractional; every kind against the simulation.
static void test_resumed(void **state) {
    static const double starts[] = {0, 3, 99, -3, -1.5, 0.1, -7.3, 10.5, 1e6};
    for (size_t k = 0; k < sizeof starts / sizeof starts[0]; k++) {
        double L = starts[k];
        dsc_sched_params p = defaults(DSC_SCHED_WARMUP_LR);
        p.warmup_min_lr = 1e-5, p.warmup_num_steps = 40, p.last_batch_iteration = L;
        compare("WarmupLR resumed", &p, 0.1);
        p.warmup_type = DSC_WARMUP_LINEAR;
        compare("WarmupLR linear resumed", &p, 0.1);
        p = defaults(DSC_SCHED_WARMUP_DECAY_LR);
        p.total_num_steps = 250, p.warmup_num_steps = 30, p.last_batch_iteration = L;
        compare("WarmupDecayLR resumed", &p, 0.1);
        p = defaults(DSC_SCHED_WARMUP_COSINE_LR);
        p.total_num_steps = 200, p.warmup_num_steps = 20, p.last_batch_iteration = L;
        compare("WarmupCosineLR resumed", &p, 0.1);
        p = defaults(DSC_SCHED_ONE_CYCLE);
        p.cycle_min_lr = 1e-4, p.cycle_max_lr = 1e-3, p.cycle_first_step_size = 30;
        p.cycle_second_step_size = 50, p.decay_step_size = 7, p.decay_lr_rate = 0.3;
        p.decay_mom_rate = 0.01, p.last_batch_iteration = L;
        compare("OneCycle resumed", &p, 0.1);
        p = defaults(DSC_SCHED_LR_RANGE_TEST);
        p.lr_range_test_step_size = 9, p.last_batch_iteration = L;
        compare("LRRangeTest resumed", &p, 0.1);
        p.lr_range_test_staircase = true;
        compare("LRRangeTest staircase resumed", &p, 0.1);
    }
}

// Values printed by DeepSpeed 0.18.4 itself (the optimizer's lr 0.001, betas (0.9, 0.999)).
static void test_resumed_by_hand(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_LR);
    p.warmup_max_lr = 1.0, p.warmup_num_steps = 10, p.warmup_type = DSC_WARMUP_LINEAR;
    p.last_batch_iteration = 3; // step 1 keeps the optimizer's lr, step 2 uses iteration 4
    assert_true(lr_at(&p, 0.001, 1) == 0.001 && lr_at(&p, 0.001, 2) == 0.4);
    assert_true(lr_at(&p, 0.001, 6) == 0.8);
    p.last_batch_iteration = -3; // -2, -1 are "before the start": the min; then 0, 1, ...
    assert_true(lr_at(&p, 0.001, 1) == 0.001 && lr_at(&p, 0.001, 2) == 0.0);
    assert_true(lr_at(&p, 0.001, 4) == 0.0 && lr_at(&p, 0.001, 5) == 0.1);
    p.last_batch_iteration = 0.5;
    assert_true(lr_at(&p, 0.001, 2) == 0.15 && lr_at(&p, 0.001, 6) == 0.55);

    p = defaults(DSC_SCHED_ONE_CYCLE);
    p.cycle_min_lr = 0.1, p.cycle_max_lr = 1, p.cycle_first_step_size = 2;
    p.last_batch_iteration = -3;
    double lr, mom = -7;
    assert_int_equal(dsc_sched_lr_at(&p, 0.001, 1, &lr, &mom), DSC_OK);
    assert_true(lr == 0.001 && mom == -7); // the optimizer's lr and betas, untouched
    dsc_sched_lr_at(&p, 0.001, 2, &lr, &mom); // iteration -2
    assert_true(fabs(lr - 0.55) < 1e-15 && fabs(mom - 0.85) < 1e-15);
    dsc_sched_lr_at(&p, 0.001, 3, &lr, &mom); // iteration -1: a cycle's start, max momentum
    assert_true(lr == 0.1 && mom == 0.9);
    dsc_sched_lr_at(&p, 0.001, 5, &lr, &mom); // the peak
    assert_true(lr == 1.0 && mom == 0.8);

    p = defaults(DSC_SCHED_LR_RANGE_TEST);
    p.lr_range_test_step_size = 2, p.lr_range_test_step_rate = -1, p.last_batch_iteration = -5;
    assert_true(lr_at(&p, 0.001, 1) == 0.001 && lr_at(&p, 0.001, 2) == 0.0025);
    assert_true(lr_at(&p, 0.001, 6) == 0.0005);
}

// Fractional, zero and negative step counts: DeepSpeed computes with them.
static void test_fractional_and_negative(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_LR);
    p.warmup_max_lr = 1.0, p.warmup_num_steps = 2.5, p.warmup_type = DSC_WARMUP_LINEAR;
    assert_true(lr_at(&p, 0.001, 3) == 0.4 && lr_at(&p, 0.001, 4) == 0.8); // DeepSpeed's values
    assert_true(lr_at(&p, 0.001, 5) == 1.0);
    compare("WarmupLR 2.5", &p, 0.1);
    p.warmup_num_steps = -5; // counts as 2
    compare("WarmupLR -5", &p, 0.1);
    p = defaults(DSC_SCHED_WARMUP_DECAY_LR);
    p.total_num_steps = 250.75, p.warmup_num_steps = 12.5;
    compare("WarmupDecayLR fractional", &p, 0.1);
    p.total_num_steps = -10;
    compare("WarmupDecayLR negative total", &p, 0.1);
    p = defaults(DSC_SCHED_WARMUP_COSINE_LR);
    p.total_num_steps = 4.5, p.warmup_num_steps = 2.5, p.warmup_type = DSC_WARMUP_LINEAR;
    assert_true(lr_at(&p, 0.001, 3) == 0.0004 && lr_at(&p, 0.001, 5) == 0.0001465319647457856);
    compare("WarmupCosineLR fractional", &p, 0.1);
    p.total_num_steps = -50;
    compare("WarmupCosineLR negative total", &p, 0.1);
    p = defaults(DSC_SCHED_ONE_CYCLE);
    p.cycle_min_lr = 0.1, p.cycle_max_lr = 1, p.cycle_first_step_size = 0;
    p.cycle_second_step_size = 2.5; // never at a cycle's start: no division by zero
    double lr, mom;
    dsc_sched_lr_at(&p, 0.001, 4, &lr, &mom);
    assert_true(lr == 0.8199999999999998 && mom == 0.8200000000000001);
    compare("OneCycle 0 + 2.5", &p, 0.1);
    p.cycle_first_step_size = -2, p.cycle_second_step_size = 5;
    dsc_sched_lr_at(&p, 0.001, 4, &lr, &mom);
    assert_true(lr == 0.6400000000000001 && mom == 0.8400000000000001);
    compare("OneCycle -2 + 5", &p, 0.1);
    p.cycle_first_step_size = 20.5, p.cycle_second_step_size = 30.25, p.decay_step_size = 2.5;
    p.decay_lr_rate = 0.05, p.decay_mom_rate = 0.001;
    compare("OneCycle fractional", &p, 0.1);
    p.decay_step_size = -3, p.decay_lr_rate = 0.01; // 1 - 0.01 * n / 3 stays away from 0 here
    compare("OneCycle negative decay steps", &p, 0.1);
    p = defaults(DSC_SCHED_LR_RANGE_TEST);
    p.lr_range_test_step_size = -2; // the lr falls, and turns negative
    assert_true(lr_at(&p, 0.001, 4) == -0.0005);
    compare("LRRangeTest -2", &p, 0.1);
    p.lr_range_test_step_size = 12.5, p.lr_range_test_staircase = true;
    compare("LRRangeTest 12.5 staircase", &p, 0.1);
}

// Python's last_batch_iteration += 1, one sum at a time, against the closed form.
static void test_iteration_after(void **state) {
    static const double starts[] = {-1, 0, 99, -7.3, 0.1, 0.3, 10.5, -0.9, -1e-17, 1e-300,
                                    4503599627370495.5, 9007199254740991, 9007199254740994,
                                    -9007199254740996.0, -9007199254740994.0, 1e15 + 0.3, -1e18};
    for (size_t k = 0; k < sizeof starts / sizeof starts[0]; k++) {
        double x = starts[k];
        for (int64_t n = 0; n <= 3000; n++) {
            double got = dsc_sched_iteration_after(starts[k], n);
            if (!(got == x)) {
                print_error("from %.17g after %lld: got %.17g want %.17g\n", starts[k],
                            (long long)n, got, x);
                fail();
            }
            x += 1;
        }
    }
    double x = 0.1;
    for (int64_t n = 1; n <= 3000000; n++) x += 1;
    assert_true(dsc_sched_iteration_after(0.1, 3000000) == x);
    assert_true(dsc_sched_iteration_after(-1, 300) == 299); // the usual case: exact
    assert_true(dsc_sched_iteration_after(0x1p60, 1000000) == 0x1p60); // stuck, as in Python
}

// Steps 1..ok_until succeed; step ok_until + 1 fails with `text` (unless text is "").
static void expect_step_error(const dsc_sched_params *p, int64_t ok_until, const char *text) {
    double lr, mom;
    for (int64_t step = 1; step <= ok_until; step++)
        assert_int_equal(dsc_sched_lr_at(p, 0.001, step, &lr, &mom), DSC_OK);
    if (!text[0]) return; // no error expected
    assert_int_equal(dsc_sched_lr_at(p, 0.001, ok_until + 1, &lr, &mom), DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), text));
}

// Where DeepSpeed's step() raises at one step, dsc fails at that step (DeepSpeed completes the
// steps before it: tests/parity/ds_schedules.py checks the counts against DeepSpeed).
static void test_fails_where_deepspeed_does(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_ONE_CYCLE);
    p.cycle_min_lr = 0.1, p.cycle_max_lr = 1, p.cycle_first_step_size = 0;
    p.cycle_second_step_size = 3; // the cycle restarts at batch iteration 3: step 4's lr
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    expect_step_error(&p, 3, "cycle_first_step_size is 0");
    p.last_batch_iteration = -6; // iterations -5, -4: batch iteration -3, a cycle's start
    expect_step_error(&p, 2, "optimizer step 3 (last_batch_iteration -4)");
    p.last_batch_iteration = 10; // only the decay after the cycle: no division
    expect_step_error(&p, 300, "");
    p.last_batch_iteration = -1, p.cycle_second_step_size = 37.5; // never at a cycle's start
    expect_step_error(&p, 300, "");
    p = defaults(DSC_SCHED_ONE_CYCLE);
    p.cycle_min_lr = 0.1, p.cycle_max_lr = 1, p.cycle_first_step_size = 2;
    p.decay_step_size = 1, p.decay_lr_rate = -0.5; // 1 - 0.5 * 2 = 0 at the 2nd decay iteration
    expect_step_error(&p, 6, "decay_lr_rate");
}

// null is None: refused where DeepSpeed computes with it in every long enough run, accepted where
// the run never reaches the code that would.
static void test_none(void **state) {
    dsc_sched_params p = defaults(DSC_SCHED_WARMUP_COSINE_LR);
    p.total_num_steps = 100, p.warmup_num_steps = 4, p.warmup_type = DSC_WARMUP_OTHER;
    p.last_batch_iteration = 2; // step 2 uses iteration 3: in the warm-up
    expect_config_error(&p, "scheduler.params.warmup_type");
    p.last_batch_iteration = 3; // iteration 4 on: past it (DeepSpeed runs this one)
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    p.warmup_type = DSC_WARMUP_LOG, p.warmup_min_ratio = DSC_SCHED_UNSET;
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    p.last_batch_iteration = -1;
    expect_config_error(&p, "scheduler.params.warmup_min_ratio");
    p.warmup_min_ratio = 0, p.cos_min_ratio = DSC_SCHED_UNSET;
    expect_config_error(&p, "scheduler.params.cos_min_ratio");
    p.cos_min_ratio = 0, p.total_num_steps = 4; // equal to the warm-up: a division by zero
    expect_config_error(&p, "scheduler.params.total_num_steps");
    p.last_batch_iteration = DSC_SCHED_UNSET;
    p.total_num_steps = 100;
    expect_config_error(&p, "scheduler.params.last_batch_iteration");

    p = defaults(DSC_SCHED_WARMUP_LR);
    p.warmup_min_lr = DSC_SCHED_UNSET;
    expect_config_error(&p, "scheduler.params.warmup_min_lr");
    p = defaults(DSC_SCHED_WARMUP_DECAY_LR);
    p.total_num_steps = 100, p.warmup_max_lr = DSC_SCHED_UNSET; // the optimizer's lr
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    p.warmup_num_steps = 4, p.warmup_type = DSC_WARMUP_LINEAR;
    assert_true(lr_at(&p, 0.002, 4) == 0.001);

    p = defaults(DSC_SCHED_ONE_CYCLE);
    p.cycle_min_lr = 0.1, p.cycle_first_step_size = 50; // cycle_max_lr None: used in the cycle
    expect_config_error(&p, "scheduler.params.cycle_max_lr");
    p.last_batch_iteration = 99; // past the cycle (100 steps): only the decay is computed
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    p.cycle_max_lr = 1, p.cycle_min_mom = DSC_SCHED_UNSET; // not used past the cycle either
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    p.last_batch_iteration = -1; // but the constructor writes it into the optimizer
    expect_config_error(&p, "scheduler.params.cycle_min_mom");
    p.cycle_momentum = false; // e.g. SGD: the momentum is not used at all
    assert_int_equal(dsc_sched_validate(&p), DSC_OK);
    p.cycle_momentum = true, p.cycle_min_mom = 0.8, p.decay_mom_rate = DSC_SCHED_UNSET;
    expect_config_error(&p, "scheduler.params.decay_mom_rate");
    p.decay_mom_rate = 0, p.decay_step_size = DSC_SCHED_UNSET;
    expect_config_error(&p, "scheduler.params.decay_step_size");

    p = defaults(DSC_SCHED_LR_RANGE_TEST);
    p.lr_range_test_step_rate = DSC_SCHED_UNSET;
    expect_config_error(&p, "scheduler.params.lr_range_test_step_rate");
}

// scheduler.params as DeepSpeed passes it to the constructor.
static dsc_status from_config(const char *json, dsc_sched_params *p) {
    dsc_config c;
    assert_int_equal(dsc_config_load_string(&c, json, 1, NULL, NULL), DSC_OK);
    dsc_sched_kind kind;
    assert_int_equal(dsc_sched_kind_parse(c.scheduler.type, &kind), DSC_OK);
    dsc_sched_params_defaults(kind, p);
    dsc_status st = dsc__sched_params_from_config(p, &c);
    return st == DSC_OK ? dsc_sched_validate(p) : st;
}

#define SCHED(type, params)                                                                    \
    "{\"train_batch_size\": 1, \"scheduler\": {\"type\": \"" type "\", \"params\": " params "}}"

static void expect_refused(const char *json, const char *text) {
    dsc_sched_params p;
    assert_int_equal(from_config(json, &p), DSC_ERR_CONFIG);
    if (!strstr(dsc_last_error(), text)) {
        print_error("error '%s' lacks '%s'\n", dsc_last_error(), text);
        fail();
    }
}

static void test_from_config(void **state) {
    dsc_sched_params p;
    assert_int_equal(from_config(SCHED("OneCycle", "{\"cycle_min_lr\": 1e-4, \"cycle_max_lr\": "
                                 "1e-3, \"cycle_first_step_size\": 37.5, \"decay_step_size\": "
                                 "-2.5, \"last_batch_iteration\": 9.5, \"cycle_momentum\": 0}"),
                                 &p),
                     DSC_OK);
    assert_true(p.cycle_first_step_size == 37.5 && p.decay_step_size == -2.5);
    assert_true(p.last_batch_iteration == 9.5 && !p.cycle_momentum);
    assert_true(isnan(p.cycle_second_step_size)); // the first's
    // null: the meaning None has there
    assert_int_equal(from_config(SCHED("WarmupDecayLR", "{\"total_num_steps\": 10, "
                                 "\"warmup_max_lr\": null, \"warmup_type\": null}"), &p),
                     DSC_OK);
    assert_true(isnan(p.warmup_max_lr) && p.warmup_type == DSC_WARMUP_OTHER);
    assert_int_equal(from_config(SCHED("LRRangeTest", "{\"lr_range_test_staircase\": null, "
                                 "\"lr_range_test_step_size\": 1e-3}"), &p),
                     DSC_OK);
    assert_true(!p.lr_range_test_staircase && p.lr_range_test_step_size == 1e-3);
    assert_int_equal(from_config(SCHED("WarmupLR", "{\"warmup_type\": \"exp\"}"), &p), DSC_OK);
    assert_int_equal(p.warmup_type, DSC_WARMUP_OTHER); // DeepSpeed warns and uses log
    assert_int_equal(from_config(SCHED("WarmupLR", "{}"), &p), DSC_OK);

    expect_refused(SCHED("WarmupLR", "{\"total_num_steps\": 100}"),
                   "scheduler.params.total_num_steps is not a parameter of WarmupLR");
    expect_refused(SCHED("WarmupCosineLR", "{\"total_num_steps\": 100, \"warmup_max_lr\": null}"),
                   "scheduler.params.warmup_max_lr is not a parameter of WarmupCosineLR");
    expect_refused(SCHED("OneCycle", "{\"cycle_min_lr\": 0, \"cycle_max_lr\": 1, \"bogus\": 1}"),
                   "scheduler.params.bogus is no parameter of OneCycle");
    expect_refused(SCHED("WarmupCosineLR", "{}"), "scheduler.params.total_num_steps is required");
    expect_refused(SCHED("OneCycle", "{\"cycle_min_lr\": 0}"),
                   "scheduler.params.cycle_max_lr is required");
    expect_refused(SCHED("WarmupLR", "null"), "scheduler.params is null");
    expect_refused("{\"train_batch_size\": 1, \"scheduler\": {\"type\": \"LRRangeTest\"}}",
                   "scheduler.params is missing");
    expect_refused(SCHED("WarmupLR", "{\"warmup_num_steps\": null}"),
                   "scheduler.params.warmup_num_steps must be a number");
    expect_refused(SCHED("WarmupLR", "{\"last_batch_iteration\": null}"),
                   "scheduler.params.last_batch_iteration must be a number");
    expect_refused(SCHED("OneCycle", "{\"cycle_min_lr\": 0, \"cycle_max_lr\": 1, "
                         "\"cycle_first_step_size\": 3, \"cycle_second_step_size\": -3}"),
                   "cycle_second_step_size is 0");
    // "auto" stays an error at load time (the Hugging Face placeholder nobody filled in).
    dsc_config c;
    assert_int_equal(dsc_config_load_string(&c, SCHED("WarmupLR", "{\"warmup_num_steps\": "
                                            "\"auto\"}"), 1, NULL, NULL),
                     DSC_ERR_CONFIG);
    assert_non_null(strstr(dsc_last_error(), "\"scheduler.params.warmup_num_steps\" is \"auto\""));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_warmup_lr),        cmocka_unit_test(test_warmup_decay_lr),
        cmocka_unit_test(test_warmup_cosine_lr), cmocka_unit_test(test_one_cycle),
        cmocka_unit_test(test_lr_range_test),    cmocka_unit_test(test_no_schedule),
        cmocka_unit_test(test_first_steps_by_hand), cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_parse_and_validate), cmocka_unit_test(test_resumed),
        cmocka_unit_test(test_resumed_by_hand),   cmocka_unit_test(test_fractional_and_negative),
        cmocka_unit_test(test_iteration_after),   cmocka_unit_test(test_fails_where_deepspeed_does),
        cmocka_unit_test(test_none),              cmocka_unit_test(test_from_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
