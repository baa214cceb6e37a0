// infer/sample.h - choosing the next token from logits: greedy, temperature, top-k, top-p, with
// a seeded random stream per sequence.
#ifndef DSC_INFER_SAMPLE_H
#define DSC_INFER_SAMPLE_H

#include <stdint.h> // int32_t, uint64_t

#include "dsc/generate.h" // dsc_gen_opts

// The random stream of sequence `index` under `seed`.
uint64_t dsc__sample_stream(uint64_t seed, int index);

// A uniform double in [0, 1) from the stream (advances it).
double dsc__sample_uniform(uint64_t *state);

// The next token from logits (V) under o's temperature / top_k / top_p. scratch: 2 V floats,
// idx: V ints (the caller's, so that nothing is allocated per token). Deterministic: equal inputs
// and stream give the same token; ties go to the lower id.
int32_t dsc__sample(const float *logits, int V, const dsc_gen_opts *o, uint64_t *state,
                    float *scratch, int32_t *idx);

#endif
