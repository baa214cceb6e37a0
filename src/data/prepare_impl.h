// data/prepare_impl.h - what prepare.c (text -> plain shards) and prepare_sft.c (examples with
// loss-mask flags -> flagged shards) share. Internal to data/.
#ifndef DSC_DATA_PREPARE_IMPL_H
#define DSC_DATA_PREPARE_IMPL_H

#include <jansson.h> // json_t
#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "data/prepare.h" // dsc_prepare_opts

// A whole file, NUL-terminated (*text caller-owned); errors name the path.
dsc_status dsc__prepare_read_file(const char *path, char **text, size_t *len);
// mkdir -p.
dsc_status dsc__prepare_make_dirs(const char *dir);
// out_dir/dataset.json, written atomically.
dsc_status dsc__prepare_write_json(const char *out_dir, json_t *j);

// Whether o asks for examples (a JSONL input, or seq_len > 0) rather than plain text shards.
bool dsc__prepare_is_examples(const dsc_prepare_opts *o);
// dsc_data_prepare for examples (see prepare.h).
dsc_status dsc__prepare_examples(const dsc_prepare_opts *o);

#endif
