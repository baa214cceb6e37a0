// model/gpt2/model.h - GPT-2 behind the model interface (ops.c): the family's table, a handle
// around a configuration of its own, and the configuration of a GPT-2 model handle (tests use it
// to see which family made a handle; the GPU code goes through the table's device passes).
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
