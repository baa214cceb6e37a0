// engine/optim/loss_scaler.c - DeepSpeed's DynamicLossScaler.update_scale
// (deepspeed/runtime/fp16/loss_scaler.py, 0.18.4), rule for rule:
//   overflow: if hysteresis is used up (delayed_shift == 1 or cur_hysteresis == 1) the scale is
//     divided by scale_factor, floored at min_scale (and an overflow already at min_scale is an
//     error), otherwise cur_hysteresis drops by one; either way last_overflow_iter = cur_iter.
//     cur_hysteresis is not refilled by the drop: after the first drop every overflow halves.
//   clean step: with consecutive_hysteresis, cur_hysteresis is refilled at once; the scale grows
//     by scale_factor when the steps since the last overflow, minus one, are a positive multiple of
//     scale_window, refilling cur_hysteresis then (without consecutive_hysteresis).
//   cur_iter counts every update.
#include "engine/optim/loss_scaler.h"

#include <math.h> // ldexp, fmax

#include "base/log.h"    // DSC_DEBUG
#include "base/status.h" // dsc__fail

void dsc_loss_scaler_init(dsc_loss_scaler *s, double static_scale, int initial_scale_power,
                          int scale_window, int hysteresis, bool consecutive_hysteresis,
                          double min_scale) {
    *s = (dsc_loss_scaler){
        .dynamic = !(static_scale > 0),
        .cur_scale = static_scale > 0 ? static_scale : ldexp(1.0, initial_scale_power),
        .scale_factor = 2.0,
        .min_scale = min_scale,
        .scale_window = scale_window,
        .cur_iter = 0,
        .last_overflow_iter = -1,
        .delayed_shift = hysteresis,
        .cur_hysteresis = hysteresis,
        .consecutive_hysteresis = consecutive_hysteresis,
        .raise_error_at_min_scale = true,
    };
}

double dsc_loss_scaler_scale(const dsc_loss_scaler *s) { return s->cur_scale; }

static dsc_status on_overflow(dsc_loss_scaler *s) {
    if (s->delayed_shift == 1 || s->cur_hysteresis == 1) {
        if (s->cur_scale == s->min_scale && s->raise_error_at_min_scale)
            return dsc__fail(DSC_ERR_CONFIG,
                             "fp16 loss scale overflowed at the minimum fp16.min_loss_scale = %g "
                             "and cannot decrease further; the gradients are not finite even "
                             "unscaled: lower the learning rate, use bf16, or lower "
                             "fp16.min_loss_scale",
                             s->min_scale);
        double next = fmax(s->cur_scale / s->scale_factor, s->min_scale);
        DSC_DEBUG("loss_scaler", "overflow: skipping step, loss scale %g -> %g", s->cur_scale,
                  next);
        s->cur_scale = next;
    } else {
        DSC_DEBUG("loss_scaler", "overflow: skipping step, loss scale %g kept, hysteresis %d -> %d",
                  s->cur_scale, s->cur_hysteresis, s->cur_hysteresis - 1);
        s->cur_hysteresis -= 1;
    }
    s->last_overflow_iter = s->cur_iter;
    return DSC_OK;
}

static dsc_status on_clean(dsc_loss_scaler *s) {
    int64_t stable_interval = (s->cur_iter - s->last_overflow_iter) - 1;
    bool grow_due = stable_interval > 0;
    if (grow_due && s->scale_window == 0)
        return dsc__fail(DSC_ERR_CONFIG, "fp16.loss_scale_window is 0; it must be positive");
    if (s->consecutive_hysteresis) s->cur_hysteresis = s->delayed_shift;
    if (grow_due && stable_interval % s->scale_window == 0) {
        if (!s->consecutive_hysteresis) s->cur_hysteresis = s->delayed_shift;
        s->cur_scale *= s->scale_factor;
    }
    return DSC_OK;
}

dsc_status dsc_loss_scaler_update(dsc_loss_scaler *s, bool overflow) {
    if (!s->dynamic) return DSC_OK; // DeepSpeed's static LossScaler.update_scale does nothing
    DSC_TRY(overflow ? on_overflow(s) : on_clean(s));
    s->cur_iter += 1;
    return DSC_OK;
}
