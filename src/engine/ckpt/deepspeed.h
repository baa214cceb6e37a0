// ckpt/deepspeed.h - DeepSpeed's checkpoints (0.18's layout), read tensor by tensor.
//
// The calls (dsc_ds_ckpt_*) are public API, declared in include/dsc/checkpoint.h; deepspeed.c
// implements them on top of the torch.save reader (torchfile.h). The layout and how it maps
// onto dsc's is in docs/checkpoint-format.md.
#ifndef DSC_CKPT_DEEPSPEED_H
#define DSC_CKPT_DEEPSPEED_H

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

#include "dsc/checkpoint.h" // dsc_ds_ckpt
#include "dsc/engine.h"     // dsc_engine

// The model-states file that marks a DeepSpeed tag directory (ZeRO 0-2 / ZeRO-3), or NULL.
const char *dsc__ds_model_file(const char *tag_dir);

// Load the DeepSpeed checkpoint <dir>/<tag> (tag NULL: the one `latest` names, or dir itself)
// into the engine, on every rank (ds_load.c): fp32 master weights, Adam's moments, the step
// counts and, fp16 to fp16, the loss scaler. *loaded: the tag.
dsc_status dsc__ds_load(dsc_engine *eng, const char *dir, const char *tag, char *loaded,
                        size_t cap);

// The ranks agree that each of them opened tag (ok) or failed (load.c); a collective.
dsc_status dsc__ckpt_agree_on_tag(dsc_engine *eng, const char *tag, bool ok);

#endif
