# cmake/pkgconfig.cmake - dsc.pc, for programs built against an installed dsc:
#   cc prog.c $(pkg-config --cflags --libs dsc)             (the shared library)
#   pkg-config --static --libs dsc                          (what the static library needs too)
# Included by the top-level CMakeLists.txt after features.cmake and cuda.cmake.
#
# The file finds the install from its own place: prefix=${pcfiledir}/../.. (as many ../ as
# CMAKE_INSTALL_LIBDIR/pkgconfig is deep), so `cmake --install build --prefix DIR` gives right
# paths whatever DIR is, and the installed tree may be moved. An absolute CMAKE_INSTALL_LIBDIR or
# CMAKE_INSTALL_INCLUDEDIR is kept as it is.

# A library given by its path (/usr/lib/x/libmpi.so) as linker flags (-L/usr/lib/x -lmpi).
function(dsc__pc_lib_flags path out)
  get_filename_component(_dir "${path}" DIRECTORY)
  get_filename_component(_name "${path}" NAME_WE)
  string(REGEX REPLACE "^lib" "" _name "${_name}")
  set(${out} "-L${_dir} -l${_name}" PARENT_SCOPE)
endfunction()

# Libs.private: features.cmake collected the system libraries; add the optional ones the
# library was linked with here (MPI, the CUDA or HIP libraries, NCCL).
if(DSC_HAVE_MPI)
  foreach(_lib IN LISTS MPI_C_LIBRARIES)
    dsc__pc_lib_flags("${_lib}" _flags)
    string(APPEND DSC_PC_LIBS_PRIVATE " ${_flags}")
  endforeach()
endif()
if(DSC_WITH_CUDA) # the kernels' objects are C++: their runtime comes too
  string(APPEND DSC_PC_LIBS_PRIVATE
         " -L${CUDAToolkit_LIBRARY_DIR} -lcudart -lcublasLt -lcublas -lstdc++")
endif()
if(DSC_WITH_HIP)
  foreach(_lib IN ITEMS ${DSC_AMDHIP64} ${DSC_HIPBLASLT})
    if(_lib) # hipBLASLt is optional (a -NOTFOUND value when absent)
      dsc__pc_lib_flags("${_lib}" _flags)
      string(APPEND DSC_PC_LIBS_PRIVATE " ${_flags}")
    endif()
  endforeach()
  string(APPEND DSC_PC_LIBS_PRIVATE " -lstdc++")
endif()
if(DSC_WITH_NCCL)
  dsc__pc_lib_flags("${DSC_NCCL_LIB}" _flags)
  string(APPEND DSC_PC_LIBS_PRIVATE " ${_flags}")
endif()

# prefix: the pkgconfig directory's way back to the install prefix.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(DSC_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _up "/dsc-root/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/dsc-root")
  string(REGEX REPLACE "/$" "" _up "${_up}")
  set(DSC_PC_PREFIX "\${pcfiledir}/${_up}")
endif()
foreach(_d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_d}}")
    set(DSC_PC_${_d} "${CMAKE_INSTALL_${_d}}")
  else()
    set(DSC_PC_${_d} "\${prefix}/${CMAKE_INSTALL_${_d}}")
  endif()
endforeach()

string(STRIP "${DSC_PC_LIBS_PRIVATE}" DSC_PC_LIBS_PRIVATE)
configure_file(${CMAKE_CURRENT_LIST_DIR}/dsc.pc.in ${CMAKE_BINARY_DIR}/dsc.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/dsc.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
