// config/elastic.h - DeepSpeed's elastic batch sizes (the `elasticity` section, versions 0.1/0.2).
//
// With elasticity enabled DeepSpeed ignores the batch keys and picks a global batch size that
// divides well over many GPU counts (scaled highly composite numbers), then the largest listed
// micro batch that fits the world size, and gradient accumulation from those.
#ifndef DSC_CONFIG_ELASTIC_H
#define DSC_CONFIG_ELASTIC_H

#include <stdint.h> // int64_t

#include "dsc/config.h" // dsc_config

// Check the elasticity section as DeepSpeed does when it is enabled (required keys, ranges, the
// batch keys that it overrides). `source` names the file in messages.
dsc_status dsc__elastic_check(const dsc_config *cfg, const char *source);

// The batch triple DeepSpeed's elasticity gives for a data-parallel world size.
dsc_status dsc__elastic_batch(const dsc_config *cfg, int world, int64_t *train, int64_t *micro,
                              int64_t *gas);

#endif
