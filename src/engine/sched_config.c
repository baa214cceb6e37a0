// engine/sched_config.c - scheduler.params (config) -> dsc_sched_params.
#include "engine/sched_config.h"

void dsc__sched_params_from_config(dsc_sched_params *p, const dsc_config *c) {
#define SET(key, field, value)                                                                 \
    if (dsc_config_given(c, "scheduler.params." key)) p->field = (value)
    SET("warmup_min_lr", warmup_min_lr, c->scheduler.warmup_min_lr);
    SET("warmup_max_lr", warmup_max_lr, c->scheduler.warmup_max_lr);
    SET("warmup_num_steps", warmup_num_steps, (double)c->scheduler.warmup_num_steps);
    SET("warmup_type", warmup_type, dsc_sched_warmup_type_parse(c->scheduler.warmup_type));
    SET("total_num_steps", total_num_steps, (double)c->scheduler.total_num_steps);
    SET("warmup_min_ratio", warmup_min_ratio, c->scheduler.warmup_min_ratio);
    SET("cos_min_ratio", cos_min_ratio, c->scheduler.cos_min_ratio);
    SET("cycle_min_lr", cycle_min_lr, c->scheduler.cycle_min_lr);
    SET("cycle_max_lr", cycle_max_lr, c->scheduler.cycle_max_lr);
    SET("decay_lr_rate", decay_lr_rate, c->scheduler.decay_lr_rate);
    SET("cycle_first_step_size", cycle_first_step_size, (double)c->scheduler.cycle_first_step_size);
    SET("cycle_second_step_size", cycle_second_step_size, (double)c->scheduler.cycle_second_step_size);
    SET("cycle_first_stair_count", cycle_first_stair_count, (double)c->scheduler.cycle_first_stair_count);
    SET("cycle_second_stair_count", cycle_second_stair_count, (double)c->scheduler.cycle_second_stair_count);
    SET("decay_step_size", decay_step_size, (double)c->scheduler.decay_step_size);
    SET("cycle_momentum", cycle_momentum, c->scheduler.cycle_momentum);
    SET("cycle_min_mom", cycle_min_mom, c->scheduler.cycle_min_mom);
    SET("cycle_max_mom", cycle_max_mom, c->scheduler.cycle_max_mom);
    SET("decay_mom_rate", decay_mom_rate, c->scheduler.decay_mom_rate);
    SET("lr_range_test_min_lr", lr_range_test_min_lr, c->scheduler.lr_range_test_min_lr);
    SET("lr_range_test_step_size", lr_range_test_step_size, (double)c->scheduler.lr_range_test_step_size);
    SET("lr_range_test_step_rate", lr_range_test_step_rate, c->scheduler.lr_range_test_step_rate);
    SET("lr_range_test_staircase", lr_range_test_staircase, c->scheduler.lr_range_test_staircase);
#undef SET
}
