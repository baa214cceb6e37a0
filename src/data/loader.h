// data/loader.h - deterministic (inputs, targets) batches from token shards, with prefetching.
// The loader's calls and the rule that picks each sample are public (dsc/data.h, "the loader");
// this header is the library's way in to them.
#ifndef DSC_DATA_LOADER_H
#define DSC_DATA_LOADER_H

#include "dsc/data.h" // dsc_loader_*

#endif
