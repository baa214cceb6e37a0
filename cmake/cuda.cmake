# cmake/cuda.cmake - the GPU part of libdsc: the .cu files of src/cuda (the shared kernels),
# src/model/<family>/ (a family's device passes and kernels) and src/engine/gpu/ (the trainer's
# device state and optimizer), built with nvcc (CUDA) or, with
# DS_BUILD_HIP=1 in the environment, with hipcc (ROCm). Included by the top-level CMakeLists.txt
# after the library targets (dsc_objects, dsc_static, dsc_shared) exist; a machine without a GPU
# toolchain builds the CPU library exactly as before.
#
# Options and switches:
#   DSC_CUDA         build the CUDA kernels; default ON when nvcc is found. DS_BUILD_OPS=1 forces
#                    it ON and makes a missing nvcc an error.
#   DSC_CUDA_ARCHS   CMAKE_CUDA_ARCHITECTURES for the kernels; default "90a-real;90-virtual"
#                    (Hopper machine code plus PTX that newer GPUs compile at load).
#   DSC_NCCL         build the nccl comm backend (src/comm/nccl.c) when the CUDA kernels are built
#                    and NCCL (nccl.h and libnccl, the toolkit's copy or the system's) is found;
#                    default ON. Without NCCL the build goes on and `dsc report` says so.
#   DS_BUILD_HIP=1   (environment) build the same sources with hipcc instead. The nccl backend is
#                    not part of the HIP build (RCCL would serve it; Debian's ROCm has none).
#   DSC_HIP_ARCH     the AMD target; default $HCC_AMDGPU_TARGET, else gfx90a.
# Results: DSC_WITH_CUDA / DSC_WITH_HIP / DSC_WITH_NCCL (ON/OFF) and, for tests/CMakeLists.txt,
# dsc_cuda_add_tests() that builds tests/cuda/test_*.cu (label "kernels"; exit 77 = skipped).

file(GLOB DSC_GPU_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/cuda/*.cu
     ${CMAKE_SOURCE_DIR}/src/model/*.cu ${CMAKE_SOURCE_DIR}/src/model/*/*.cu
     ${CMAKE_SOURCE_DIR}/src/engine/gpu/*.cu)
file(GLOB DSC_GPU_HEADERS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/cuda/*.h
     ${CMAKE_SOURCE_DIR}/src/cuda/*.cuh ${CMAKE_SOURCE_DIR}/src/model/*_cuda.h ${CMAKE_SOURCE_DIR}/src/model/*/*_cuda.h
     ${CMAKE_SOURCE_DIR}/src/model/*/*_decode.h ${CMAKE_SOURCE_DIR}/src/model/*/*_kernels.h
     ${CMAKE_SOURCE_DIR}/src/engine/gpu/optim.h ${CMAKE_SOURCE_DIR}/src/engine/gpu/train_state.h)
set(DSC_WITH_CUDA OFF)
set(DSC_WITH_HIP OFF)
set(DSC_WITH_NCCL OFF)

# The project's warning flags were added for C with add_compile_options; nvcc and hipcc spell
# them differently, so limit those already set to C and C++ sources (targets made later, in
# tests/, inherit the rewritten list) and give GPU sources their own below.
function(dsc__gpu_limit_compile_options_to_c)
  get_directory_property(_opts COMPILE_OPTIONS)
  set(_limited "")
  foreach(_o IN LISTS _opts)
    if(_o MATCHES "^\\$<")
      list(APPEND _limited "${_o}") # already a generator expression
    else()
      list(APPEND _limited "$<$<COMPILE_LANGUAGE:C,CXX>:${_o}>")
    endif()
  endforeach()
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_limited}")
  set_property(TARGET dsc_objects PROPERTY COMPILE_OPTIONS "${_limited}")
endfunction()

# NCCL for the nccl comm backend (src/comm/nccl.c, C against the CUDA runtime's and NCCL's C
# APIs): the header next to the toolkit's or the system's, the library features.cmake found
# (DSC_NCCL_LIB) or the system's. Defines DSC_WITH_NCCL=1 for the library and its users.
function(dsc__find_nccl)
  option(DSC_NCCL "Build the nccl comm backend (needs NCCL)" ON)
  if(NOT DSC_NCCL)
    message(STATUS "dsc GPU: nccl comm backend off (-DDSC_NCCL=OFF)")
    return()
  endif()
  find_path(DSC_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS}
            ${CUDAToolkit_LIBRARY_ROOT}/include)
  if(NOT DSC_NCCL_LIB)
    find_library(DSC_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR}
                 ${CUDAToolkit_LIBRARY_ROOT}/lib64 ${CUDAToolkit_LIBRARY_ROOT}/lib)
  endif()
  if(NOT DSC_NCCL_INCLUDE OR NOT DSC_NCCL_LIB)
    message(STATUS "dsc GPU: NCCL not found (nccl.h, libnccl): the nccl comm backend is not "
                   "built; install NCCL (libnccl-dev) to get it")
    return()
  endif()
  file(STRINGS ${DSC_NCCL_INCLUDE}/nccl.h _code REGEX "#define NCCL_VERSION_CODE")
  string(REGEX MATCH "[0-9]+" _code "${_code}")
  target_include_directories(dsc_objects PUBLIC ${DSC_NCCL_INCLUDE})
  target_compile_definitions(dsc_objects PUBLIC DSC_WITH_NCCL=1)
  target_link_libraries(dsc_objects PUBLIC ${DSC_NCCL_LIB})
  foreach(_t dsc_static dsc_shared)
    target_link_libraries(${_t} PUBLIC ${DSC_NCCL_LIB})
    target_include_directories(${_t} PUBLIC $<BUILD_INTERFACE:${DSC_NCCL_INCLUDE}>)
    target_compile_definitions(${_t} INTERFACE DSC_WITH_NCCL=1)
  endforeach()
  set(DSC_WITH_NCCL ON PARENT_SCOPE)
  message(STATUS "dsc GPU: nccl comm backend with ${DSC_NCCL_LIB} (NCCL_VERSION_CODE ${_code})")
endfunction()

if("$ENV{DS_BUILD_HIP}" STREQUAL "1")
  # ---- HIP: hipcc compiles each .cu as HIP; the objects join both libraries ----
  find_program(DSC_HIPCC hipcc PATHS /opt/rocm/bin)
  if(NOT DSC_HIPCC)
    message(FATAL_ERROR "DS_BUILD_HIP=1 but hipcc was not found: install ROCm (or Debian's "
                        "hipcc libamdhip64-dev rocm-device-libs) and put hipcc on PATH")
  endif()
  set(_arch "gfx90a")
  if(NOT "$ENV{HCC_AMDGPU_TARGET}" STREQUAL "")
    set(_arch "$ENV{HCC_AMDGPU_TARGET}")
  endif()
  set(DSC_HIP_ARCH "${_arch}" CACHE STRING "AMD GPU target(s) of the HIP build, e.g. gfx90a")
  find_library(DSC_AMDHIP64 amdhip64 PATHS /opt/rocm/lib)
  find_library(DSC_HIPBLASLT hipblaslt PATHS /opt/rocm/lib)
  if(NOT DSC_AMDHIP64)
    message(FATAL_ERROR "DS_BUILD_HIP=1 but libamdhip64 was not found: install libamdhip64-dev")
  endif()
  set(_flags -x hip -std=c++17 -O3 -fPIC -DDSC_BUILD_HIP=1 -Wall -Wextra -Wno-unused-parameter)
  if(DSC_WERROR)
    list(APPEND _flags -Werror)
  endif()
  foreach(_a IN LISTS DSC_HIP_ARCH)
    list(APPEND _flags --offload-arch=${_a})
  endforeach()
  set(_objs "")
  foreach(_src IN LISTS DSC_GPU_SOURCES)
    get_filename_component(_name ${_src} NAME_WE)
    set(_obj ${CMAKE_BINARY_DIR}/hip/${_name}.o)
    add_custom_command(OUTPUT ${_obj}
      COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_BINARY_DIR}/hip
      COMMAND ${DSC_HIPCC} ${_flags} -I${CMAKE_SOURCE_DIR}/include -I${CMAKE_SOURCE_DIR}/src
              -c ${_src} -o ${_obj}
      DEPENDS ${_src} ${DSC_GPU_HEADERS}
      COMMENT "hipcc ${_name}.cu (${DSC_HIP_ARCH})" VERBATIM)
    list(APPEND _objs ${_obj})
  endforeach()
  set_source_files_properties(${_objs} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  # `cmake --build ... --target dsc_gpu_objects` compiles the GPU sources alone (CI's HIP check).
  add_custom_target(dsc_gpu_objects DEPENDS ${_objs})
  set(_libs ${DSC_AMDHIP64})
  if(DSC_HIPBLASLT)
    list(APPEND _libs ${DSC_HIPBLASLT})
  endif()
  foreach(_t dsc_static dsc_shared)
    target_sources(${_t} PRIVATE ${_objs})
    target_link_libraries(${_t} PUBLIC ${_libs} stdc++)
    string(REPLACE ";" " " _archs_text "${DSC_HIP_ARCH}")
    target_compile_definitions(${_t} INTERFACE DSC_WITH_HIP=1 DSC_GPU_TARGETS="HIP, ${_archs_text}")
  endforeach()
  set(DSC_WITH_HIP ON)
  set(_blas "hipBLASLt found")
  if(NOT DSC_HIPBLASLT)
    set(_blas "no hipBLASLt: matrix products report DSC_ERR_UNSUPPORTED")
  endif()
  message(STATUS "dsc GPU: HIP build with ${DSC_HIPCC} for ${DSC_HIP_ARCH} (${_blas}); "
                 "AMD hardware is untested here")
else()
  # ---- CUDA ----
  set(_default OFF)
  if(DSC_NVCC OR CMAKE_CUDA_COMPILER)
    set(_default ON)
  endif()
  if("$ENV{DS_BUILD_OPS}" STREQUAL "1")
    set(_default ON)
  endif()
  option(DSC_CUDA "Build the CUDA kernels (src/cuda, src/model/*, src/engine/gpu)" ${_default})
  if(DSC_CUDA)
    if(NOT CMAKE_CUDA_COMPILER AND NOT DSC_NVCC)
      message(FATAL_ERROR "DSC_CUDA is ON (or DS_BUILD_OPS=1) but nvcc was not found: install "
                          "the CUDA toolkit and put nvcc on PATH (or set CUDACXX), or configure "
                          "with -DDSC_CUDA=OFF")
    endif()
    if(NOT CMAKE_CUDA_COMPILER)
      set(CMAKE_CUDA_COMPILER ${DSC_NVCC})
    endif()
    set(DSC_CUDA_ARCHS "90a-real;90-virtual" CACHE STRING
        "CUDA architectures of the kernels (CMAKE_CUDA_ARCHITECTURES syntax)")
    set(CMAKE_CUDA_ARCHITECTURES ${DSC_CUDA_ARCHS})
    # One CUDA runtime per process: the library links the shared one, so test programs must too.
    set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    dsc__gpu_limit_compile_options_to_c()
    set(DSC_CUDA_FLAGS -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-fno-exceptions)
    if(DSC_WERROR)
      list(APPEND DSC_CUDA_FLAGS --Werror=all-warnings -Xcompiler=-Werror)
    endif()
    # Targets made before this file ran did not see CMAKE_CUDA_ARCHITECTURES.
    set_target_properties(dsc_objects dsc_static dsc_shared PROPERTIES
                          CUDA_ARCHITECTURES "${DSC_CUDA_ARCHS}")
    target_sources(dsc_objects PRIVATE ${DSC_GPU_SOURCES})
    target_compile_options(dsc_objects PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${DSC_CUDA_FLAGS}>)
    string(REPLACE ";" " " _archs_text "${DSC_CUDA_ARCHS}")
    set(_targets_def DSC_GPU_TARGETS="CUDA ${CMAKE_CUDA_COMPILER_VERSION}, ${_archs_text}")
    target_compile_definitions(dsc_objects PUBLIC DSC_WITH_CUDA=1 ${_targets_def})
    target_link_libraries(dsc_objects PUBLIC CUDA::cudart CUDA::cublasLt CUDA::cublas)
    foreach(_t dsc_static dsc_shared)
      target_link_libraries(${_t} PUBLIC CUDA::cudart CUDA::cublasLt CUDA::cublas)
      target_compile_definitions(${_t} INTERFACE DSC_WITH_CUDA=1 ${_targets_def})
    endforeach()
    set(DSC_WITH_CUDA ON)
    message(STATUS "dsc GPU: CUDA ${CMAKE_CUDA_COMPILER_VERSION} for ${DSC_CUDA_ARCHS}")
    dsc__find_nccl()
  endif()
endif()

# tests/cuda/test_*.cu, one program each, label "kernels"; exit code 77 (no GPU) counts as
# skipped. Called from tests/CMakeLists.txt.
function(dsc_cuda_add_tests)
  if(NOT DSC_WITH_CUDA)
    return()
  endif()
  file(GLOB _srcs CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/cuda/test_*.cu)
  foreach(_src IN LISTS _srcs)
    get_filename_component(_name ${_src} NAME_WE)
    add_executable(${_name} ${_src})
    target_link_libraries(${_name} PRIVATE dsc_static CUDA::cudart CUDA::cublasLt)
    target_include_directories(${_name} PRIVATE ${CMAKE_SOURCE_DIR}/tests/cuda)
    target_compile_options(${_name} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${DSC_CUDA_FLAGS}>)
    add_test(NAME kernels.${_name} COMMAND ${_name})
    set_tests_properties(kernels.${_name} PROPERTIES LABELS kernels TIMEOUT 600
                         SKIP_RETURN_CODE 77)
  endforeach()
endfunction()
