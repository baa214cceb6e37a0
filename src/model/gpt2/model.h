// model/gpt2/model.h - GPT-2 behind the model interface (ops.c): the family's table, and the
// configuration of a GPT-2 model handle for the code that still drives GPT-2 directly (the
// CUDA model, the GPU trainer) until the device passes go through the table too.
#ifndef DSC_MODEL_GPT2_MODEL_H
#define DSC_MODEL_GPT2_MODEL_H

#include "dsc/model.h"       // dsc_model, struct dsc_model_ops
#include "model/gpt2/gpt2.h" // dsc_gpt2_config

extern const struct dsc_model_ops dsc__gpt2_model_ops;

// m's configuration (borrowed from m), or NULL when m is not a GPT-2.
const dsc_gpt2_config *dsc__model_gpt2_config(const dsc_model *m);
// A model handle of any GPT-2 shape c (copied; checked as dsc_gpt2_create does), for tests and
// benchmarks whose shapes no spec names. Caller owns *out (dsc_model_destroy).
dsc_status dsc__model_gpt2_create(dsc_model **out, const dsc_gpt2_config *c);

#endif
