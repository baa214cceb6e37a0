// cuda/vendor.h - the one portability header of dsc's GPU code.
//
// Kernels are written once, in CUDA spelling. A CUDA build (nvcc) includes the CUDA runtime,
// cuBLASLt and NCCL as they are; a HIP build (hipcc, DSC_BUILD_HIP=1 defined by CMake) maps the
// same names onto the HIP runtime, hipBLASLt and RCCL with the flat list of #defines below, so no
// kernel file says which vendor it runs on.
//
// Warps: an NVIDIA warp has 32 lanes, an AMD CDNA wavefront 64 (RDNA can run 32). Device code uses
// DSC_WARP_SIZE (a compile-time constant of the device pass); host code that sizes launches asks
// dsc__host_warp_size() (common.cuh). Shuffles and warp barriers go through the dsc_* helpers at
// the end of this file, which pick the full-warp mask of the vendor. Nothing in src/cuda may write
// 32 for the warp size.
#ifndef DSC_CUDA_VENDOR_H
#define DSC_CUDA_VENDOR_H

#if defined(DSC_BUILD_HIP) && DSC_BUILD_HIP

// ---- HIP (ROCm) ----
#include <hip/hip_runtime.h> // hip* runtime, __shfl_xor, warpSize

#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorMemoryAllocation hipErrorOutOfMemory
#define cudaStream_t hipStream_t
#define cudaEvent_t hipEvent_t
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetDevice hipGetDevice
#define cudaSetDevice hipSetDevice
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaDeviceProp hipDeviceProp_t
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrWarpSize hipDeviceAttributeWarpSize
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaDevAttrMaxSharedMemoryPerBlockOptin hipDeviceAttributeSharedMemPerBlockOptin
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaDeviceGetPCIBusId hipDeviceGetPCIBusId
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMallocHost hipHostMalloc
#define cudaFreeHost hipHostFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaMemGetInfo hipMemGetInfo
#define cudaMemcpyKind hipMemcpyKind
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaStreamCreate hipStreamCreate
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaHostRegister hipHostRegister
#define cudaHostUnregister hipHostUnregister
#define cudaHostRegisterDefault hipHostRegisterDefault
#define cudaStreamDestroy hipStreamDestroy
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaEventCreate hipEventCreate
#define cudaEventDestroy hipEventDestroy
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaStreamWaitEvent hipStreamWaitEvent
#define cudaErrorUnknown hipErrorUnknown
#define cudaGraph_t hipGraph_t
#define cudaGraphExec_t hipGraphExec_t
#define cudaStreamBeginCapture hipStreamBeginCapture
#define cudaStreamEndCapture hipStreamEndCapture
#define cudaStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define cudaGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define cudaGraphLaunch hipGraphLaunch
#define cudaGraphExecDestroy hipGraphExecDestroy
#define cudaGraphDestroy hipGraphDestroy
#define cudaFuncSetAttribute(f, a, v) hipFuncSetAttribute((const void *)(f), a, v)
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize

// Matrix products: hipBLASLt speaks cuBLASLt's API with hip prefixes (ROCm 6 spelling). A ROCm
// without it (Debian's 5.2 packages, for one) still compiles every kernel; the product entry
// points then report DSC_ERR_UNSUPPORTED.
#if defined(__has_include)
#if __has_include(<hipblaslt/hipblaslt.h>)
#include <hipblaslt/hipblaslt.h> // hipblasLt*
#define DSC_HAVE_BLASLT 1
#endif
#endif
#ifndef DSC_HAVE_BLASLT
#define DSC_HAVE_BLASLT 0
#endif
#if DSC_HAVE_BLASLT
#define cublasStatus_t hipblasStatus_t
#define CUBLAS_STATUS_SUCCESS HIPBLAS_STATUS_SUCCESS
#define cublasLtHandle_t hipblasLtHandle_t
#define cublasLtCreate hipblasLtCreate
#define cublasLtDestroy hipblasLtDestroy
#define cublasLtMatmul hipblasLtMatmul
#define cublasLtMatmulDesc_t hipblasLtMatmulDesc_t
#define cublasLtMatmulDescCreate hipblasLtMatmulDescCreate
#define cublasLtMatmulDescDestroy hipblasLtMatmulDescDestroy
#define cublasLtMatmulDescSetAttribute hipblasLtMatmulDescSetAttribute
#define cublasLtMatrixLayout_t hipblasLtMatrixLayout_t
#define cublasLtMatrixLayoutCreate hipblasLtMatrixLayoutCreate
#define cublasLtMatrixLayoutDestroy hipblasLtMatrixLayoutDestroy
#define cublasLtMatmulPreference_t hipblasLtMatmulPreference_t
#define cublasLtMatmulPreferenceCreate hipblasLtMatmulPreferenceCreate
#define cublasLtMatmulPreferenceDestroy hipblasLtMatmulPreferenceDestroy
#define cublasLtMatmulPreferenceSetAttribute hipblasLtMatmulPreferenceSetAttribute
#define cublasLtMatmulHeuristicResult_t hipblasLtMatmulHeuristicResult_t
#define cublasLtMatmulAlgoGetHeuristic hipblasLtMatmulAlgoGetHeuristic
#define cublasLtEpilogue_t hipblasLtEpilogue_t
#define cublasOperation_t hipblasOperation_t
#define CUBLAS_OP_N HIPBLAS_OP_N
#define CUBLAS_OP_T HIPBLAS_OP_T
#define CUBLAS_COMPUTE_32F HIPBLAS_COMPUTE_32F
#define CUDA_R_32F HIP_R_32F
#define CUDA_R_16BF HIP_R_16BF
#define CUDA_R_16F HIP_R_16F
#define cudaDataType_t hipDataType
#define CUBLASLT_MATMUL_DESC_TRANSA HIPBLASLT_MATMUL_DESC_TRANSA
#define CUBLASLT_MATMUL_DESC_TRANSB HIPBLASLT_MATMUL_DESC_TRANSB
#define CUBLASLT_MATMUL_DESC_EPILOGUE HIPBLASLT_MATMUL_DESC_EPILOGUE
#define CUBLASLT_MATMUL_DESC_BIAS_POINTER HIPBLASLT_MATMUL_DESC_BIAS_POINTER
#define CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE
#define CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER
#define CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD
#define CUBLASLT_EPILOGUE_DEFAULT HIPBLASLT_EPILOGUE_DEFAULT
#define CUBLASLT_EPILOGUE_BIAS HIPBLASLT_EPILOGUE_BIAS
#define CUBLASLT_EPILOGUE_GELU_AUX_BIAS HIPBLASLT_EPILOGUE_GELU_AUX_BIAS
#define CUBLASLT_EPILOGUE_DGELU HIPBLASLT_EPILOGUE_DGELU
#define CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES
#endif

// Collectives: RCCL keeps NCCL's names, only the header moves.
#if defined(__has_include)
#if __has_include(<rccl/rccl.h>)
#include <rccl/rccl.h> // nccl*
#define DSC_HAVE_NCCL_HEADER 1
#endif
#endif

// Lanes of a wavefront: the device pass knows it exactly; the host pass (which must not use it
// for sizing) sees the CDNA value.
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define DSC_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define DSC_WARP_SIZE 64
#endif
typedef unsigned long long dsc_lane_mask;
#define DSC_LANE_MASK_FULL (~0ull)

__device__ static inline float dsc_shfl_xor(float v, int lane_mask) {
    return __shfl_xor(v, lane_mask);
}
__device__ static inline double dsc_shfl_xor_d(double v, int lane_mask) {
    return __shfl_xor(v, lane_mask);
}
__device__ static inline void dsc_syncwarp(void) { __builtin_amdgcn_wave_barrier(); }
#define DSC_HIP 1

#else

// ---- CUDA ----
#include <cublasLt.h>         // cublasLt*
#include <cuda_runtime_api.h> // cuda*

#define DSC_HAVE_BLASLT 1
#define DSC_WARP_SIZE 32 // every NVIDIA architecture so far; host code asks the device anyway
typedef unsigned int dsc_lane_mask;
#define DSC_LANE_MASK_FULL 0xffffffffu

#ifdef __CUDACC__
__device__ static inline float dsc_shfl_xor(float v, int lane_mask) {
    return __shfl_xor_sync(DSC_LANE_MASK_FULL, v, lane_mask);
}
__device__ static inline double dsc_shfl_xor_d(double v, int lane_mask) {
    return __shfl_xor_sync(DSC_LANE_MASK_FULL, v, lane_mask);
}
__device__ static inline void dsc_syncwarp(void) { __syncwarp(DSC_LANE_MASK_FULL); }
#endif
#define DSC_HIP 0

#endif

#endif
