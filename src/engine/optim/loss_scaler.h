// engine/optim/loss_scaler.h - DeepSpeed's fp16 loss scaler (static, or DynamicLossScaler as ZeRO
// stages 1-3 build it from the `fp16` config section).
//
// Config mapping (deepspeed/runtime/precision_config.py, dynamic_loss_scale_args):
//   fp16.loss_scale > 0 -> static scale, never updated; 0 (default) -> dynamic:
//   init_scale = 2^fp16.initial_scale_power (16), scale_window = fp16.loss_scale_window (1000),
//   delayed_shift = fp16.hysteresis (2), consecutive_hysteresis = fp16.consecutive_hysteresis
//   (false), min_scale = fp16.min_loss_scale (1), scale_factor 2, raise_error_at_min_scale true.
// The ZeRO optimizer calls update once per optimizer step, after the overflow check and before
// deciding whether to skip the step; the scale it leaves is the one the next backward uses.
#ifndef DSC_ENGINE_OPTIM_LOSS_SCALER_H
#define DSC_ENGINE_OPTIM_LOSS_SCALER_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t

#include "dsc/status.h" // dsc_status

// All of the state, in DeepSpeed's terms, so that a checkpoint can save and restore it field by
// field (DeepSpeed pickles the scaler object whole).
typedef struct dsc_loss_scaler {
    bool dynamic;                  // false: static scale, update does nothing
    double cur_scale;
    double scale_factor;           // 2
    double min_scale;
    int64_t scale_window;
    int64_t cur_iter;              // updates so far
    int64_t last_overflow_iter;    // -1 before the first overflow
    int delayed_shift;             // hysteresis: overflows tolerated before the scale drops
    int cur_hysteresis;
    bool consecutive_hysteresis;   // refill hysteresis after every clean step
    bool raise_error_at_min_scale; // true, as the ZeRO optimizers construct it
} dsc_loss_scaler;

// static_scale > 0: a static scaler of that value. Otherwise dynamic, starting at
// 2^initial_scale_power. raise_error_at_min_scale starts true; clear the field to get DeepSpeed's
// raise_error_at_min_scale=False behaviour (stay at min_scale).
void dsc_loss_scaler_init(dsc_loss_scaler *s, double static_scale, int initial_scale_power,
                          int scale_window, int hysteresis, bool consecutive_hysteresis,
                          double min_scale);

double dsc_loss_scaler_scale(const dsc_loss_scaler *s);

// Report whether this step overflowed; updates the scale exactly as DeepSpeed's
// DynamicLossScaler.update_scale. Returns DSC_ERR_CONFIG, leaving the state unchanged, where
// DeepSpeed raises: an overflow that would lower the scale while it already equals min_scale
// (with raise_error_at_min_scale), or a clean step reaching `% scale_window` with a window of 0.
// The remedy is in the config (fp16.min_loss_scale, bf16, a lower lr), hence the category.
dsc_status dsc_loss_scaler_update(dsc_loss_scaler *s, bool overflow);

#endif
