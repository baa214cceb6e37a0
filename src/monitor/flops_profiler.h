// monitor/flops_profiler.h - the flops profiler's report: DeepSpeed's summary, aggregated
// top modules per depth and the detailed module tree, from numbers the caller measured.
#ifndef DSC_MONITOR_FLOPS_PROFILER_H
#define DSC_MONITOR_FLOPS_PROFILER_H

#include <stdbool.h> // bool
#include <stdint.h>  // int64_t
#include <stdio.h>   // FILE

#include "dsc/status.h" // dsc_status

// One module; the array lists each parent before its children (children have depth + 1 and
// follow it until a module of its depth or less).
typedef struct dsc__prof_module {
    const char *name; // full dotted name; the tree shows its last component
    const char *type;
    int depth;
    int64_t params;
    double fwd_flops;
    double latency_s; // leaves: measured; parents: 0 (the report sums their children)
} dsc__prof_module;

typedef struct dsc__prof_summary {
    int64_t step;
    int world, dp, mp;
    int64_t batch_per_rank;              // samples per rank per optimizer step
    double fwd_s, bwd_s, step_s, iter_s; // measured over the profiled optimizer step
} dsc__prof_summary;

typedef struct dsc__prof_opts {
    int64_t module_depth; // -1: all
    int64_t top_modules;
    bool detailed;
} dsc__prof_opts;

// Write the report. mods[0] is the whole model: its fwd_flops are the per-rank forward FLOPs of
// the step. Parents' latencies are filled in (sums of their children). DSC_ERR_IO on a write error.
dsc_status dsc__flops_profile_write(FILE *f, const dsc__prof_summary *s, dsc__prof_module *mods,
                                    int n, const dsc__prof_opts *o);

#endif
