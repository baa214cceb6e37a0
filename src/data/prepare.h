// data/prepare.h - building a dataset folder: train.bin, val.bin and dataset.json. The calls and
// the folder's layout are public (dsc/data.h, "dataset folders"); this header is the library's
// way in to them.
#ifndef DSC_DATA_PREPARE_H
#define DSC_DATA_PREPARE_H

#include "dsc/data.h" // dsc_data_prepare, dsc_data_default, dsc_prepare_opts

#endif
