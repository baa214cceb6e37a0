// data/shard.h - token shards: the `.bin` files that hold a tokenized dataset. Their layout and
// the calls that read and write them are public (dsc/data.h, "token shards"); this header is the
// library's way in to them.
#ifndef DSC_DATA_SHARD_H
#define DSC_DATA_SHARD_H

#include "dsc/data.h" // dsc_shard_*, DSC_SHARD_*, DSC_TOK_*

#endif
