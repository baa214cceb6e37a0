// launch/launch.h - the launcher, internal side. Its entry point, dsc_launch_run, and its
// options are public (dsc/launch.h).
#ifndef DSC_LAUNCH_LAUNCH_H
#define DSC_LAUNCH_LAUNCH_H

#include "dsc/launch.h" // dsc_launch_opts, dsc_launch_run, DSC_LAUNCH_*

// How many GPUs this machine has (/dev/nvidiaN device nodes); 0 on CPU machines.
int dsc__launch_gpu_count(void);

#endif
