// mem/cuda.h - CUDA helpers of the memory layer (CUDA builds only).
#ifndef DSC_MEM_CUDA_H
#define DSC_MEM_CUDA_H
#ifdef DSC_WITH_CUDA

#include <stdbool.h> // bool
#include <stddef.h>  // size_t

// Registers host memory with the driver (page-locked, usable by every device); on failure writes
// the driver's reason into `reason` and returns false.
bool dsc__mem_cuda_host_register(void *ptr, size_t bytes, char *reason, size_t reason_len);
void dsc__mem_cuda_host_unregister(void *ptr); // ignores memory that was not registered

#endif
#endif
