// ckpt/deepspeed.h - DeepSpeed's checkpoints (0.18's layout), read tensor by tensor.
//
// The calls (dsc_ds_ckpt_*) are public API, declared in include/dsc/checkpoint.h; deepspeed.c
// implements them on top of the torch.save reader (torchfile.h). The layout and how it maps
// onto dsc's is in docs/checkpoint-format.md.
#ifndef DSC_CKPT_DEEPSPEED_H
#define DSC_CKPT_DEEPSPEED_H

#include "dsc/checkpoint.h" // dsc_ds_ckpt

// The model-states file that marks a DeepSpeed tag directory (ZeRO 0-2 / ZeRO-3), or NULL.
const char *dsc__ds_model_file(const char *tag_dir);

#endif
