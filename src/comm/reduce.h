// comm/reduce.h - deterministic element-wise reductions and dtype conversions for the backends.
#ifndef DSC_COMM_REDUCE_H
#define DSC_COMM_REDUCE_H

#include <stddef.h> // size_t

#include "dsc/comm.h" // dsc_dtype, dsc_red_op

// out[i] = srcs[0][i] (op) srcs[1][i] (op) ... (op) srcs[nsrc-1][i], evaluated left to right in
// fp32 and rounded once to dt. SUM adds; MAX keeps the earlier of equal values and propagates NaN.
// Every array holds n elements of dt. out may be the same array as any srcs[s]; no other overlap.
// Bitwise reproducible: the result depends only on the inputs and their order.
void dsc__reduce(void *out, const void *const *srcs, int nsrc, size_t n, dsc_dtype dt,
                 dsc_red_op op);

// Conversions through fp32 (round to nearest even, as dsc/half.h); F32 copies.
void dsc__to_f32(float *dst, const void *src, size_t n, dsc_dtype dt);
void dsc__from_f32(void *dst, const float *src, size_t n, dsc_dtype dt);

#endif
