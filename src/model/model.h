// model/model.h - library-internal access to a model handle: its family's table and
// configuration, for a family's own private getters (model/<family>/model.h).
#ifndef DSC_MODEL_MODEL_H
#define DSC_MODEL_MODEL_H

#include "dsc/model.h" // dsc_model, struct dsc_model_ops

// The family's table and configuration of m (borrowed from m); NULL for a NULL m.
const struct dsc_model_ops *dsc__model_ops(const dsc_model *m);
const void *dsc__model_config(const dsc_model *m);
// A handle around a configuration a family made: *out owns cfg (freed with ops->config_free, also
// when this fails). spec names the model in messages.
dsc_status dsc__model_wrap(dsc_model **out, const struct dsc_model_ops *ops, void *cfg,
                           const char *spec);

#endif
