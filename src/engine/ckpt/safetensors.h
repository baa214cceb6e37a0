// ckpt/safetensors.h - read and write the safetensors format (Hugging Face's tensor files).
//
// The calls (dsc_st_*) are public API, declared and documented in include/dsc/safetensors.h;
// safetensors.c implements them. The library's own files keep including this header.
#ifndef DSC_CKPT_SAFETENSORS_H
#define DSC_CKPT_SAFETENSORS_H

#include "dsc/safetensors.h" // dsc_st_*

#endif
